//! `lodestar history`, `diff` and `rollback` over the store's own watch
//! history (`state::history`): the revisions that touched the mesh or one
//! object, the resource-level diff between two revisions, and a rollback
//! as one forward write that restores the mesh, or the named objects, to
//! their state at a revision.
//!
//! What a caller sees: only the objects it may read. A rollback is a write
//! like any other (`api::apply_authorized`): write (or delete) on every
//! object it touches, previewed with `dryRun`, each object guarded by its
//! current revision so that a change made meanwhile refuses it.

use super::dryrun::{change, Change};
use super::Caller;
use crate::error::{Error, Result};
use crate::model::{Kind, ResourceKey};
use crate::node::Node;
use crate::state::history::{AtRevision, History};
use crate::state::txn::{Op, Txn};
use crate::state::{Event, EventType};
use crate::store::Applied;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Every event the history keeps, up to `applied`'s revision (read off the
/// runtime: the history is on disk).
pub async fn events(node: &Node, applied: &Applied) -> Result<Vec<Event>> {
    let (reader, from, to) = (node.reader().clone(), applied.compacted + 1, applied.revision());
    tokio::task::spawn_blocking(move || {
        let mut out = Vec::new();
        let mut next = from;
        while next <= to {
            let (events, covered) = reader.history_from(next).map_err(|e| Error::internal(format!("reading the history: {e}")))?;
            out.extend(events.into_iter().filter(|e| e.revision <= to));
            next = covered.max(next) + 1;
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::internal(e.to_string()))?
}

/// A resource filter: a kind, and optionally a namespace and a name.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Filter {
    pub kind: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Filter {
    fn kind(&self) -> Result<Option<Kind>> {
        self.kind.as_deref().filter(|k| !k.is_empty()).map(super::parse_kind).transpose()
    }
}

/// `GET /v1/history`: one revision and what it changed.
#[derive(Debug, Serialize)]
pub struct Revision {
    pub revision: u64,
    /// Who made it (a token's accessor, a certificate identity): recorded
    /// once the cluster runs wire version 2; absent before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The change message its writer gave, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub changes: Vec<Touched>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Touched {
    /// PUT or DELETE.
    pub action: &'static str,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// The object's version after the change (0 once deleted).
    pub version: u64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryAnswer {
    pub revision: u64,
    /// The oldest revision the history holds.
    pub oldest: u64,
    pub revisions: Vec<Revision>,
}

/// The revisions that touched objects the filter and the caller's read
/// permission let through, newest first, at most `limit`.
pub fn history(caller: &Caller, applied: &Applied, events: &[Event], authors: &Authors, f: &Filter, limit: usize) -> Result<HistoryAnswer> {
    let kind = f.kind()?;
    let h = History { compacted: applied.compacted, events };
    let matches = |k: &ResourceKey| {
        kind.is_none_or(|kd| k.kind == kd)
            && f.namespace.as_deref().is_none_or(|n| n.is_empty() || *k.namespace == *n)
            && f.name.as_deref().is_none_or(|n| n.is_empty() || *k.name == *n)
            && caller.may_read(k)
    };
    let revisions = h
        .revisions(applied.compacted, matches, limit)
        .into_iter()
        .map(|(revision, evs)| Revision {
            revision,
            author: authors.get(&revision).map(|a| a.name.clone()),
            message: authors.get(&revision).and_then(|a| a.message.clone()),
            changes: evs
                .into_iter()
                .filter(|e| caller.may_read(&e.object.key))
                .map(|e| Touched {
                    action: e.kind.as_str(),
                    kind: e.object.key.kind.name().to_string(),
                    namespace: e.object.key.namespace.to_string(),
                    name: e.object.key.name.to_string(),
                    version: if e.kind == EventType::Delete { 0 } else { e.object.version },
                })
                .collect(),
        })
        .collect();
    Ok(HistoryAnswer { revision: applied.revision(), oldest: applied.compacted + 1, revisions })
}

/// `GET /v1/diff?from=R1&to=R2`: the objects that differ between two
/// revisions, as a dry run lists its changes (from R1's state to R2's).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiffAnswer {
    pub from: u64,
    pub to: u64,
    pub changes: Vec<Change>,
}

/// The state at `rev` of every object that changed after it, and the
/// current object of every other one.
fn at(applied: &Applied, events: &[Event], rev: u64) -> Result<AtRevision> {
    History { compacted: applied.compacted, events }.changed_since(&applied.state, rev)
}

pub fn diff_revisions(caller: &Caller, applied: &Applied, events: &[Event], from: u64, to: Option<u64>) -> Result<DiffAnswer> {
    let to = to.unwrap_or(applied.revision());
    let (a, b) = (at(applied, events, from)?, at(applied, events, to)?);
    let now = |k: &ResourceKey| applied.state.get(k).cloned();
    let mut keys: Vec<&ResourceKey> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut changes = Vec::new();
    for key in keys.into_iter().filter(|k| caller.may_read(k)) {
        let before = a.get(key).cloned().unwrap_or_else(|| now(key));
        let after = b.get(key).cloned().unwrap_or_else(|| now(key));
        if let Some(c) = change(key, before.as_deref(), after.as_deref()) {
            changes.push(c);
        }
    }
    Ok(DiffAnswer { from, to, changes })
}

/// `POST /v1/rollback`: the revision, and optionally the objects, to
/// restore (none: every object that changed after it).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackRequest {
    pub revision: u64,
    #[serde(default)]
    pub resources: Vec<Filter>,
}

/// The write that restores the objects to their state at `req.revision`:
/// a put of the old object (as it was stored: spec, labels, annotations),
/// or a delete of one created since, each guarded by its current revision.
/// An object the ACL objects or an agent own is left out (their own
/// lifecycles), with a warning.
pub fn rollback_txn(applied: &Applied, events: &[Event], req: &RollbackRequest) -> Result<(Txn, Vec<String>)> {
    let changed = at(applied, events, req.revision)?;
    let mut wanted: Vec<(Kind, Option<&str>, Option<&str>)> = Vec::new();
    for (i, f) in req.resources.iter().enumerate() {
        let kind = f.kind()?.ok_or_else(|| Error::field(format!("resources[{i}].kind"), "required"))?;
        wanted.push((kind, f.namespace.as_deref().filter(|n| !n.is_empty()), f.name.as_deref().filter(|n| !n.is_empty())));
    }
    let (mut ops, mut warnings, mut restored, mut names) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (key, then) in &changed {
        if !wanted.is_empty()
            && !wanted.iter().any(|(k, ns, n)| *k == key.kind && ns.is_none_or(|ns| *key.namespace == *ns) && n.is_none_or(|n| *key.name == *n))
        {
            continue;
        }
        if key.kind.is_acl() || matches!(key.kind, Kind::Instance | Kind::Lease | Kind::CertificateRevocation) {
            warnings.push(format!("{} {}/{}: not rolled back ({} have their own lifecycle)", key.kind.name(), key.namespace, key.name, key.kind.plural()));
            continue;
        }
        let current = applied.state.get(key).map_or(0, |o| o.mod_revision);
        match then {
            Some(obj) => {
                if key.kind == Kind::Secret && obj.body().get(crate::model::secret::SEALED_FIELD).is_some() {
                    return Err(Error::field(
                        format!("{}/{}/{}", key.kind.plural(), key.namespace, key.name),
                        "a Secret holding a private key is not rolled back (its key is sealed): apply it again from its file",
                    ));
                }
                restored.push(super::ApplyItem { resource: obj.body().clone(), expected_revision: Some(current) });
                names.push(key.clone());
            }
            None => ops.push(Op::Delete { key: key.clone(), expected_revision: Some(current), ignore_missing: false }),
        }
    }
    if ops.is_empty() && restored.is_empty() {
        warnings.push(format!("nothing to roll back: no object{} changed after revision {}", if wanted.is_empty() { "" } else { " named" }, req.revision));
        return Ok((Txn { ops }, warnings));
    }
    // What is restored is validated as today's apply validates it: an old
    // object today's schema refuses is named, and nothing is written.
    if !restored.is_empty() {
        let (puts, w) = super::apply_txn(restored, crate::model::FieldValidation::Strict).map_err(|e| {
            let mut e = e;
            for f in &mut e.fields {
                if let Some(i) = f.field.strip_prefix("resources[").and_then(|r| r.split(']').next()).and_then(|i| i.parse::<usize>().ok()) {
                    let k = &names[i];
                    f.field =
                        format!("{} {}/{} at revision {}{}", k.kind.name(), k.namespace, k.name, req.revision, &f.field[format!("resources[{i}]").len()..]);
                }
            }
            e.message = format!("the state at revision {} does not validate today: {}", req.revision, e.message);
            e
        })?;
        warnings.extend(w);
        ops.splice(0..0, puts.ops);
    }
    Ok((Txn { ops }, warnings))
}

/// Shared by the handlers: the events, read once per request.
/// Who made each revision (`Op::Author`), by revision.
pub type Authors = std::collections::BTreeMap<u64, crate::store::types::Author>;

/// Who made each revision the history holds up to `applied`'s.
pub async fn authors(node: &Node, applied: &Applied) -> Result<Authors> {
    let (reader, from, to) = (node.reader().clone(), applied.compacted + 1, applied.revision());
    tokio::task::spawn_blocking(move || reader.authors(from, to).map_err(|e| Error::internal(format!("reading the history's authors: {e}"))))
        .await
        .map_err(|e| Error::internal(e.to_string()))?
}

pub async fn read(node: &Node) -> Result<(Arc<Applied>, Vec<Event>)> {
    let applied = node.read(crate::node::Consistency::Linearizable).await?;
    let events = events(node, &applied).await?;
    Ok((applied, events))
}
