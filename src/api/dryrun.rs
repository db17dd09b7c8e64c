//! What an apply would do, before it is stored (`POST /v1/apply?dryRun=true`,
//! gRPC `Apply` with `dry_run`, `lodestar apply --dry-run`), and
//! `expectedRevision`: apply only if nothing the file names changed since
//! the revision a preview was computed at.
//!
//! A preview runs the write's own transaction on a copy of the state at the
//! current revision N (read linearizably, so a follower answers as the
//! leader would): the same validation, authorization and preconditions as
//! the real write, the same warnings, and nothing proposed. It answers the
//! revision it was computed at, the resources that would change with a
//! field-level diff of each, and the revision the write would commit at.
//!
//! What a caller sees: a preview needs `write` on every resource (as the
//! write) and `read` on them too, since the diff shows their current
//! contents. A Secret's diff names the fields that change, never a value.
//!
//! The per-proxy effect: every proxy connected to this replica is
//! translated at N and after the write (`translate::effect`); those whose
//! config would change are listed with a resource-level diff of their xDS,
//! the others counted. Proxies are listed only for a caller who may read
//! the cluster (as `proxy-config`); each replica lists its own proxies, and
//! `lodestar apply --dry-run` asks every replica.

use super::Caller;
use crate::auth::{Target, Verb};
use crate::error::{Error, Result};
pub use crate::model::diff::{diff, FieldChange};
use crate::model::proxy::ProxyIdentity;
use crate::model::{Kind, ResourceKey, StoredObject};
use crate::store::state::State;
use crate::store::types::{Action, Op, Txn};
use crate::store::EventType;
use crate::translate::effect::{preview as preview_proxies, ProxyEffect};
use crate::translate::mesh::MeshConfig;
use crate::translate::resources::Generator;
use crate::translate::Translator;
use serde::Serialize;
use serde_json::json;
use serde_json::Value;
use std::sync::Arc;

/// The answer of a dry-run apply.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// Always true: nothing was written.
    pub dry_run: bool,
    /// The store revision the preview was computed at: give it as
    /// `expectedRevision` to apply exactly what was previewed.
    pub base_revision: u64,
    /// The revision the write would commit at (the base one when nothing
    /// would change).
    pub revision: u64,
    /// Every resource of the write, with what would happen to it.
    pub items: Vec<super::WriteItem>,
    /// The resources that would change, with their field-level diffs.
    pub changes: Vec<Change>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The proxies connected to this replica whose config would change.
    pub proxies: Proxies,
}

/// The effect of a write on connected proxies: one replica's answer, or
/// several merged (`merge_proxies`, as the CLI asks every replica).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Proxies {
    /// The replicas whose proxies are counted (node ids).
    pub replicas: Vec<u64>,
    /// Connected proxies whose config would not change.
    pub unchanged: usize,
    /// Those whose config would: proxies that would lose a cluster their
    /// routes still use first, then by node id.
    pub changed: Vec<OnReplica>,
    /// Proxies whose config could not be translated (before or after):
    /// `proxy`, `replica`, `error`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<Value>,
    /// Why no proxy is listed (the caller may not read proxies' config).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<String>,
}

/// A proxy's change, with the replica it is connected to.
#[derive(Debug, Serialize)]
pub struct OnReplica {
    pub replica: u64,
    #[serde(flatten)]
    pub effect: ProxyEffect,
}

/// Whom a preview translates for: the replica's connected proxies, or why
/// they are not shown.
pub struct ProxyScope {
    pub replica: u64,
    pub mesh: Arc<MeshConfig>,
    /// The xDS server's generator, forked for the preview (else a cold
    /// translator: every proxy translated twice in full).
    pub generator: Option<Arc<dyn crate::xds::resources::Generator>>,
    pub proxies: std::result::Result<Vec<ProxyIdentity>, String>,
}

impl ProxyScope {
    /// The proxies connected to `sync`, if `caller` may read their config.
    pub fn of(caller: &Caller, replica: &crate::replica::Replica) -> ProxyScope {
        let sync = &replica.sync;
        let proxies = if caller.authorize(Verb::Read, [Target::Cluster]).is_ok() {
            Ok(sync.identities())
        } else {
            Err("proxies are listed for callers who may read the cluster (as proxy-config)".to_string())
        };
        ProxyScope { replica: replica.config.id, mesh: Arc::new(replica.config.mesh_config()), generator: replica.generator.clone(), proxies }
    }

    /// Every listed proxy's change between two states
    /// (`translate::effect::preview`), with a scratch translator: a fork
    /// of the server's (every proxy at `before` is then the config it is
    /// served, shared, not copied), else a cold one. The server's own
    /// translator is never touched (its caches know revision numbers, and
    /// `after` is hypothetical).
    pub fn effect(&self, before: &State, after: &State) -> Proxies {
        let proxies = match &self.proxies {
            Err(why) => return Proxies { replicas: vec![self.replica], unchanged: 0, changed: Vec::new(), failed: Vec::new(), hidden: Some(why.clone()) },
            Ok(p) => p,
        };
        let scratch: Box<dyn Generator> = self.generator.as_ref().and_then(|g| g.fork()).unwrap_or_else(|| Box::new(Translator::new((*self.mesh).clone())));
        let e = preview_proxies(scratch.as_ref(), proxies, before, after);
        Proxies {
            replicas: vec![self.replica],
            unchanged: e.unchanged,
            changed: e.changed.into_iter().map(|effect| OnReplica { replica: self.replica, effect }).collect(),
            failed: e.failed.into_iter().map(|(proxy, error)| json!({"proxy": proxy, "replica": self.replica, "error": error})).collect(),
            hidden: None,
        }
    }
}

/// One resource that would change.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// created, configured or deleted.
    pub action: String,
    /// The fields that differ, in path order.
    pub diff: Vec<FieldChange>,
}

/// What the write `txn` would do to `state`; the caller's read permission
/// on every resource checked first (the diff shows their contents).
pub fn preview(caller: &Caller, state: &State, txn: &Txn, warnings: Vec<String>, scope: &ProxyScope) -> Result<Preview> {
    caller.authorize(Verb::Read, txn.ops.iter().filter_map(|op| op.key().map(Target::key)))?;
    let mut after = state.clone();
    let (result, events) = after.apply_txn(txn);
    let ok = result?;
    let changes = events
        .iter()
        .filter_map(|e| {
            let after = (e.kind == EventType::Put).then(|| &*e.object);
            change(&e.object.key, state.get(&e.object.key).map(|o| &**o), after)
        })
        .collect();
    Ok(Preview {
        dry_run: true,
        base_revision: state.revision,
        revision: ok.revision,
        items: ok.items.into_iter().map(super::WriteItem::from).collect(),
        proxies: scope.effect(state, &after),
        changes,
        warnings,
    })
}

/// How `key` changed from `before` to `after` (`None`: absent), as a
/// preview, a diff or a rollback lists it; `None` when it did not.
pub fn change(key: &ResourceKey, before: Option<&StoredObject>, after: Option<&StoredObject>) -> Option<Change> {
    let empty = Value::Object(Default::default());
    let secret = key.kind == Kind::Secret;
    let (action, d) = match (before, after) {
        (None, None) => return None,
        (Some(b), Some(a)) if b.mod_revision == a.mod_revision => return None,
        (None, Some(a)) => (Action::Created, diff(&empty, a.body(), secret)),
        (Some(_), None) => (Action::Deleted, Vec::new()),
        (Some(b), Some(a)) => (Action::Configured, diff(b.body(), a.body(), secret)),
    };
    Some(Change { kind: key.kind.name().into(), namespace: key.namespace.to_string(), name: key.name.to_string(), action: action.as_str().into(), diff: d })
}

/// `expectedRevision` on an apply: refused (409, naming the object) if any
/// resource the write names changed after `base`; else every put and
/// delete without a precondition of its own gets the object's current
/// revision as one (0: must not exist), so the store refuses the write if
/// one changes before it commits.
pub fn pin(txn: &mut Txn, state: &State, base: u64) -> Result<()> {
    if base > state.revision {
        return Err(Error::field("expectedRevision", format!("revision {base} is ahead of this replica's {}", state.revision)));
    }
    for op in &mut txn.ops {
        let Some(current) = op.key().map(|k| state.get(k)) else { continue };
        if let Some(obj) = current.filter(|o| o.mod_revision > base) {
            return Err(Error::conflict(format!(
                "{} {}/{} changed at revision {} after the expected revision {base}: preview again",
                obj.key.kind.name(),
                obj.key.namespace,
                obj.key.name,
                obj.mod_revision
            )));
        }
        let now = current.map_or(0, |o| o.mod_revision);
        match op {
            Op::Put { expected_revision, .. }
            | Op::Delete { expected_revision, .. }
            | Op::SetStatus { expected_revision, .. }
            | Op::Status { expected_revision, .. } => {
                expected_revision.get_or_insert(now);
            }
            Op::Author(_) => {}
        }
    }
    Ok(())
}

/// A preview as the CLI prints it: one line per resource, then its fields.
pub fn render(p: &Value) -> String {
    let changes = p["changes"].as_array().map(Vec::as_slice).unwrap_or_default();
    let unchanged = p["items"].as_array().map_or(0, |i| i.len()).saturating_sub(changes.len());
    let mut out = format!(
        "dry run at revision {}: {} resource(s) would change{}, nothing written\n",
        p["baseRevision"],
        changes.len(),
        if unchanged > 0 { format!(", {unchanged} unchanged") } else { String::new() }
    );
    out.push_str(&render_changes(changes));
    out.push_str(&render_proxies(&p["proxies"]));
    for w in p["warnings"].as_array().map(Vec::as_slice).unwrap_or_default() {
        out.push_str(&format!("Warning: {}\n", w.as_str().unwrap_or("")));
    }
    out.push_str(&format!("apply it as previewed: lodestar apply ... --expected-revision {}\n", p["baseRevision"]));
    out
}

/// Fold another replica's preview into `into` (as the CLI asks every
/// replica): its proxies join the list. Answers computed at another base
/// revision are not merged: the caller says so.
pub fn merge_proxies(into: &mut Value, other: &Value) -> std::result::Result<(), String> {
    if other["baseRevision"] != into["baseRevision"] {
        return Err(format!(
            "previewed at revision {} (this preview is at {}): a write came in between; preview again",
            other["baseRevision"], into["baseRevision"]
        ));
    }
    let (Some(p), Some(q)) = (into.get_mut("proxies"), other.get("proxies")) else { return Ok(()) };
    let list = |v: &Value, k: &str| v[k].as_array().cloned().unwrap_or_default();
    let mut replicas = list(p, "replicas");
    replicas.extend(list(q, "replicas"));
    let mut changed = list(p, "changed");
    changed.extend(list(q, "changed"));
    changed.sort_by_key(|c| (c.get("lostClusters").is_none(), c["proxy"].as_str().unwrap_or_default().to_string()));
    let mut failed = list(p, "failed");
    failed.extend(list(q, "failed"));
    if !failed.is_empty() {
        p["failed"] = Value::Array(failed);
    }
    p["replicas"] = Value::Array(replicas);
    p["changed"] = Value::Array(changed);
    p["unchanged"] = (p["unchanged"].as_u64().unwrap_or(0) + q["unchanged"].as_u64().unwrap_or(0)).into();
    Ok(())
}

/// The proxies part of a preview: a count, then one line per proxy that
/// would change (those losing a cluster their routes use first, flagged).
pub fn render_proxies(p: &Value) -> String {
    if p.is_null() {
        return String::new();
    }
    if let Some(why) = p["hidden"].as_str() {
        return format!("proxies: not shown ({why})\n");
    }
    let changed = p["changed"].as_array().map(Vec::as_slice).unwrap_or_default();
    let replicas: Vec<String> = p["replicas"].as_array().into_iter().flatten().map(|r| r.to_string()).collect();
    let noun = if changed.len() == 1 { "proxy" } else { "proxies" };
    let mut out =
        format!("{} connected {noun} would change ({} unchanged; replicas {})\n", changed.len(), p["unchanged"].as_u64().unwrap_or(0), replicas.join(", "));
    for f in p["failed"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  ! {} (replica {}): cannot be translated: {}\n",
            f["proxy"].as_str().unwrap_or(""),
            f["replica"],
            f["error"].as_str().unwrap_or("")
        ));
    }
    for c in changed {
        let lost: Vec<&str> = c["lostClusters"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        if !lost.is_empty() {
            out.push_str(&format!("  ! {} would lose cluster(s) its routes still use: {}\n", c["proxy"].as_str().unwrap_or(""), lost.join(", ")));
        }
        let parts: Vec<String> = c["changes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let sign = match r["action"].as_str() {
                    Some("added") => "+",
                    Some("removed") => "-",
                    _ => "~",
                };
                format!("{sign}{} {}", r["type"].as_str().unwrap_or(""), r["name"].as_str().unwrap_or(""))
            })
            .collect();
        const SHOWN: usize = 8;
        let more = if parts.len() > SHOWN { format!(" and {} more", parts.len() - SHOWN) } else { String::new() };
        out.push_str(&format!("  {} (replica {}): {}{more}\n", c["proxy"].as_str().unwrap_or(""), c["replica"], parts[..parts.len().min(SHOWN)].join(", ")));
    }
    out
}

/// Changes (as [`Change`] serializes): `kind/name (namespace) action`, then
/// each field: `~` replaced, `+` added, `-` removed.
pub fn render_changes(changes: &[Value]) -> String {
    let mut out = String::new();
    for c in changes {
        let plural = c["kind"].as_str().and_then(Kind::from_kind_field).map_or_else(|| c["kind"].to_string(), |k| k.name().to_lowercase());
        out.push_str(&format!(
            "{plural}/{} ({}) {}\n",
            c["name"].as_str().unwrap_or(""),
            c["namespace"].as_str().unwrap_or(""),
            c["action"].as_str().unwrap_or("")
        ));
        if c["action"] == "created" {
            continue;
        }
        for f in c["diff"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let path = f["path"].as_str().unwrap_or("");
            let line = match (f.get("before"), f.get("after")) {
                _ if f.get("redacted").is_some() => format!("  ~ {path}: (secret value changed)"),
                (Some(b), Some(a)) => format!("  ~ {path}: {b} -> {a}"),
                (None, Some(a)) => format!("  + {path}: {a}"),
                (Some(b), None) => format!("  - {path}: {b}"),
                (None, None) => format!("  ~ {path}"),
            };
            out.push_str(&line);
            out.push('\n');
        }
    }
    out
}
