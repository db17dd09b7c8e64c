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
use crate::translate::effect::{proxy_effect, DiffCache, ProxyEffect};
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

    /// Every listed proxy's change between two states. One scratch
    /// translator translates every proxy at `before` (sharing clusters
    /// across proxies, as the xDS server does), then at `after` from
    /// there, incrementally where it can: a proxy the change cannot reach
    /// costs a lookup. The server's own translator is never touched (its
    /// caches know revision numbers, and `after` is hypothetical).
    pub fn effect(&self, before: &State, after: &State) -> Proxies {
        let proxies = match &self.proxies {
            Err(why) => return Proxies { replicas: vec![self.replica], unchanged: 0, changed: Vec::new(), failed: Vec::new(), hidden: Some(why.clone()) },
            Ok(p) => p,
        };
        let scratch: Box<dyn Generator> = self.generator.as_ref().and_then(|g| g.fork()).unwrap_or_else(|| Box::new(Translator::new((*self.mesh).clone())));
        let (mut changed, mut failed, mut diffs) = (Vec::new(), Vec::new(), DiffCache::new());
        // Every proxy at `before` first, then every one at `after`: the
        // translator keeps one mesh, and alternating revisions would
        // rebuild it for every proxy. At `before` a served proxy's config
        // is the one it is served (shared, not copied).
        let befores: Vec<_> = proxies.iter().map(|p| scratch.generate(p, before)).collect();
        for (p, b) in proxies.iter().zip(befores) {
            match (b, scratch.generate(p, after)) {
                (Ok(b), Ok(a)) => changed.extend(proxy_effect(p, &b, &a, &mut diffs).map(|effect| OnReplica { replica: self.replica, effect })),
                (_, Err(e)) | (Err(e), _) => failed.push(json!({"proxy": p.id, "replica": self.replica, "error": e})),
            }
            scratch.forget(&p.id);
        }
        let unchanged = proxies.len() - changed.len() - failed.len();
        Proxies { replicas: vec![self.replica], unchanged, changed: sorted(changed), failed, hidden: None }
    }
}

/// Proxies that would lose a cluster first, then by node id.
fn sorted(mut changed: Vec<OnReplica>) -> Vec<OnReplica> {
    changed.sort_by(|a, b| (a.effect.lost_clusters.is_empty(), &a.effect.proxy).cmp(&(b.effect.lost_clusters.is_empty(), &b.effect.proxy)));
    changed
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
            Op::Put { expected_revision, .. } | Op::Delete { expected_revision, .. } | Op::SetStatus { expected_revision, .. } => {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::resources::Generator as _;
    use serde_json::Value;

    fn doc(doc: Value) -> Op {
        let r = crate::model::parse_resource(doc, "default").unwrap();
        crate::model::validate_spec(&r).unwrap();
        Op::Put { body: crate::model::json_text(&r.body).into(), key: r.key, expected_revision: None }
    }

    fn apply(state: &State, ops: Vec<Op>) -> State {
        let mut s = state.clone();
        s.apply_txn(&Txn { ops }).0.expect("applied");
        s
    }

    fn put(state: &State, docs: Vec<Value>) -> State {
        apply(state, docs.into_iter().map(doc).collect())
    }

    fn service(name: &str, ns: &str) -> Value {
        json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
               "spec": {"ports": [{"name": "http", "number": 80, "targetPort": 8080}]}})
    }

    fn instance(name: &str, svc: &str, ns: &str, addr: &str, version: &str) -> Value {
        json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
               "metadata": {"name": name, "namespace": ns, "labels": {"version": version}},
               "spec": {"service": svc, "address": addr, "port": 8080}})
    }

    fn split(host: &str, ns: &str, weight: u32) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": host, "namespace": ns},
               "spec": {"hosts": [host], "http": [{"route": [
                   {"destination": {"host": host, "subset": "v1"}, "weight": weight},
                   {"destination": {"host": host, "subset": "v2"}, "weight": 100 - weight}]}]}})
    }

    fn subsets(host: &str, ns: &str, names: &[&str]) -> Value {
        let subsets: Vec<Value> = names.iter().map(|n| json!({"name": n, "labels": {"version": n}})).collect();
        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": {"name": host, "namespace": ns},
               "spec": {"host": host, "subsets": subsets}})
    }

    fn sidecar(ns: &str, hosts: &[&str]) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "default", "namespace": ns},
               "spec": {"egress": [{"hosts": hosts}]}})
    }

    /// Services reviews, ratings, details in `shop` (lonely in `far`, seen
    /// by no one); proxies in `a` see reviews, in `b` all of shop, in `c`
    /// details; a gateway routes to reviews.
    fn mesh() -> State {
        let mut docs = Vec::new();
        for (i, svc) in ["reviews", "ratings", "details"].iter().enumerate() {
            docs.push(service(svc, "shop"));
            for v in ["v1", "v2"] {
                docs.push(instance(&format!("{svc}-{v}"), svc, "shop", &format!("10.0.{i}.{}", v.len() + i), v));
            }
            docs.push(subsets(svc, "shop", &["v1", "v2"]));
        }
        docs.push(split("reviews", "shop", 80));
        docs.push(service("lonely", "far"));
        docs.push(instance("lonely-1", "lonely", "far", "10.0.9.1", "v1"));
        docs.push(sidecar("a", &["shop/reviews.shop.svc.cluster.local"]));
        docs.push(sidecar("b", &["shop/*"]));
        docs.push(sidecar("c", &["shop/details.shop.svc.cluster.local"]));
        docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "gw"},
            "spec": {"selector": {"istio": "ingress"}, "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"}, "hosts": ["*/shop.example"]}]}}));
        docs.push(gateway_vs("v1"));
        put(&State::default(), docs)
    }

    fn gateway_vs(subset: &str) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "front", "namespace": "gw"},
               "spec": {"hosts": ["shop.example"], "gateways": ["gw/gw"], "http": [{"route": [
                   {"destination": {"host": "reviews.shop.svc.cluster.local", "subset": subset}}]}]}})
    }

    fn proxies() -> Vec<ProxyIdentity> {
        let mut out = Vec::new();
        for (ns, n) in [("a", 3), ("b", 3), ("c", 2)] {
            for i in 0..n {
                let id = format!("sidecar~127.0.{}.{}~app-{i}.{ns}~{ns}.svc.cluster.local", ns.as_bytes()[0], i + 1);
                out.push(ProxyIdentity::parse(&id, &json!({"LABELS": {"app": format!("app-{i}")}})).unwrap());
            }
        }
        out.push(ProxyIdentity::parse("router~127.0.0.9~ingress.gw~gw.svc.cluster.local", &json!({"LABELS": {"istio": "ingress"}})).unwrap());
        out
    }

    /// The reference the preview must agree with: every proxy translated in
    /// full at both states by fresh translators, every resource compared.
    fn effect_in_full(scope: &ProxyScope, before: &State, after: &State) -> Proxies {
        let mut changed = Vec::new();
        let mut diffs = DiffCache::new();
        let proxies = scope.proxies.as_ref().unwrap();
        for p in proxies {
            let b = Translator::new((*scope.mesh).clone()).generate(p, before).unwrap();
            let a = Translator::new((*scope.mesh).clone()).generate(p, after).unwrap();
            changed.extend(proxy_effect(p, &b, &a, &mut diffs).map(|effect| OnReplica { replica: scope.replica, effect }));
        }
        Proxies { replicas: vec![scope.replica], unchanged: proxies.len() - changed.len(), changed: sorted(changed), failed: Vec::new(), hidden: None }
    }

    fn names(p: &Proxies) -> Vec<&str> {
        p.changed.iter().map(|c| c.effect.proxy.as_str()).collect()
    }

    #[test]
    fn a_dry_run_lists_the_proxies_and_diffs_that_translating_every_proxy_in_full_gives() {
        let base = mesh();
        let proxies = proxies();
        let id = |prefix: &str, ns: &str| -> Vec<String> {
            let mut v: Vec<String> = proxies.iter().filter(|p| p.id.starts_with(prefix) && p.namespace == ns).map(|p| p.id.clone()).collect();
            v.sort();
            v
        };
        let (a, b, c) = (id("sidecar", "a"), id("sidecar", "b"), id("sidecar", "c"));
        let all_sidecars: Vec<String> = {
            let mut v = [a.clone(), b.clone(), c.clone()].concat();
            v.sort();
            v
        };
        let delete = |kind: Kind, ns: &str, name: &str| Op::Delete { key: ResourceKey::new(kind, ns, name), expected_revision: None, ignore_missing: false };
        // Each change, and the proxies it must change (sorted, as listed).
        let changes: Vec<(&str, State, Vec<String>)> = vec![
            ("a route weight of reviews", put(&base, vec![split("reviews", "shop", 60)]), [a.clone(), b.clone()].concat()),
            ("a subset of ratings", put(&base, vec![subsets("ratings", "shop", &["v1", "v2", "v3"])]), b.clone()),
            ("an endpoint of details", put(&base, vec![instance("details-v3", "details", "shop", "10.0.2.9", "v3")]), [b.clone(), c.clone()].concat()),
            ("a host no proxy sees", put(&base, vec![split("lonely.far.svc.cluster.local", "far", 50), subsets("lonely", "far", &["v1", "v2"])]), vec![]),
            ("a new service no Sidecar admits", put(&base, vec![service("new", "far")]), vec![]),
            ("the gateway's route", put(&base, vec![gateway_vs("v2")]), vec!["router~127.0.0.9~ingress.gw~gw.svc.cluster.local".to_string()]),
            ("a Sidecar's scope", put(&base, vec![sidecar("c", &["shop/details.shop.svc.cluster.local", "shop/ratings.shop.svc.cluster.local"])]), c.clone()),
            ("every sidecar's hosts at once", put(&base, vec![split("reviews", "shop", 10), subsets("details", "shop", &["v1"])]), all_sidecars.clone()),
            ("reviews' route deleted", apply(&base, vec![delete(Kind::VirtualService, "shop", "reviews")]), [a.clone(), b.clone()].concat()),
        ];
        // The server has served every proxy at `base`; a preview forks it.
        let served = Translator::new(MeshConfig::default());
        for p in &proxies {
            served.generate(p, &base).unwrap();
        }
        let served: Arc<dyn crate::xds::resources::Generator> = Arc::new(served);
        let scope = ProxyScope { replica: 7, mesh: Arc::new(MeshConfig::default()), generator: Some(served.clone()), proxies: Ok(proxies.clone()) };
        let cold = ProxyScope { replica: 7, mesh: scope.mesh.clone(), generator: None, proxies: Ok(proxies.clone()) };
        for (what, after, want) in &changes {
            let reference = effect_in_full(&scope, &base, after);
            let mut listed: Vec<String> = names(&reference).into_iter().map(String::from).collect();
            listed.sort();
            assert_eq!(&listed, want, "{what}: the reference lists the proxies the change reaches");
            let reference = serde_json::to_value(&reference).unwrap();
            for (how, s) in [("served", &scope), ("cold", &cold)] {
                let got = serde_json::to_value(s.effect(&base, after)).unwrap();
                assert_eq!(got, reference, "{what} ({how} translator): the preview differs from translating in full");
            }
        }
        // A preview from a revision the proxies were not served at yet
        // (their streams lag): the same again.
        let (_, lagging, _) = &changes[0];
        let after = put(lagging, vec![subsets("ratings", "shop", &["v1"])]);
        let reference = serde_json::to_value(effect_in_full(&scope, lagging, &after)).unwrap();
        assert_eq!(serde_json::to_value(scope.effect(lagging, &after)).unwrap(), reference, "a preview from a revision not yet served");
        // The server's translator is untouched: its proxies still get the
        // config of `base`.
        let p = &proxies[0];
        let again = served.generate(p, &base).unwrap();
        let fresh = Translator::new(MeshConfig::default()).generate(p, &base).unwrap();
        assert!(proxy_effect(p, &fresh, &again, &mut DiffCache::new()).is_none());
    }
}
