//! The replicated state as a pure value, and how a transaction changes it.
//!
//! `State` is an immutable-friendly map ([`Objects`], imbl's persistent
//! ordered set): cloning it is O(1) and shares structure, so every applied
//! revision can be handed to readers (API, xDS) as its own snapshot while
//! the state machine moves on.
//! Nothing here does IO; the state machine persists what `apply_txn` returns.
//! A crate of its own: no tokio, tonic, axum, sled or openraft in its
//! dependency tree.
//!
//! # Layout
//! - `objects`: every stored object by key (a persistent ordered set).
//! - `txn`: transactions, their ops and results, request ids.
//! - `dedup`: applied request ids, so that a write sent twice applies once.
//! - `history`: the objects at an earlier revision, from the watch history.
//! - `access`: ACLs, the pure part: principals, permissions, the index of
//!   one revision's ACL objects, tokens.

// The model crate under the name the sources use (`crate::model::Kind`).
use lodestar_model::{self as model, error};

use error::{Error, FieldError};
use model::{Kind, ResourceKey, StoredObject};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use txn::{Action, ItemResult, Op, Txn, TxnOk, TxnResult};

pub mod access;
pub mod dedup;
pub mod history;
pub mod objects;
pub mod txn;

pub use objects::Objects;

#[derive(Debug, Clone, Default)]
pub struct State {
    /// Cluster-wide store revision: +1 for each transaction that changes
    /// something. Identical on every replica for the same applied log.
    pub revision: u64,
    pub objects: Objects,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Put,
    Delete,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Put => "PUT",
            EventType::Delete => "DELETE",
        }
    }
}

/// One change, as watchers see it. For a delete, `object` is the last state.
#[derive(Debug, Clone)]
pub struct Event {
    pub revision: u64,
    pub kind: EventType,
    pub object: Arc<StoredObject>,
}

impl State {
    /// The revision this state is at (as `Applied::revision`).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn get(&self, key: &ResourceKey) -> Option<&Arc<StoredObject>> {
        self.objects.get(key)
    }

    /// Apply one atomic transaction. On any failed precondition nothing
    /// changes and the revision does not move. A transaction in which every
    /// op is a no-op commits without a new revision.
    pub fn apply_txn(&mut self, txn: &Txn) -> (TxnResult, Vec<Event>) {
        match self.plan(txn) {
            Err(e) => (Err(e), Vec::new()),
            Ok(plan) => {
                let changed = plan.iter().any(|p| !matches!(p.action, Action::Unchanged | Action::NotFound));
                let revision = if changed { self.revision + 1 } else { self.revision };
                let mut items = Vec::with_capacity(plan.len());
                let mut events = Vec::new();
                for p in plan {
                    let mod_revision = match p.action {
                        Action::Created | Action::Configured => {
                            let (create_revision, version) = match &p.current {
                                // Status is not spec: the generation stays.
                                Some(cur) if p.keeps_version => (cur.create_revision, cur.version),
                                Some(cur) => (cur.create_revision, cur.version + 1),
                                None => (revision, 1),
                            };
                            let obj = Arc::new(match (p.body, &p.current) {
                                (Some(NewBody::Value(body)), Some(cur)) if p.keeps_version => cur.with_status(revision, body),
                                (Some(NewBody::Text(text)), _) => StoredObject::from_text(p.key.clone(), create_revision, revision, version, text),
                                (Some(NewBody::Value(body)), _) => StoredObject::new(p.key.clone(), create_revision, revision, version, body),
                                (None, _) => StoredObject::new(p.key.clone(), create_revision, revision, version, Value::Null),
                            });
                            self.objects.insert(obj.clone());
                            events.push(Event { revision, kind: EventType::Put, object: obj });
                            revision
                        }
                        Action::Deleted => {
                            if let Some(old) = self.objects.remove(&p.key) {
                                events.push(Event { revision, kind: EventType::Delete, object: old });
                            }
                            0
                        }
                        Action::Unchanged => p.current.as_ref().map_or(0, |c| c.mod_revision),
                        Action::NotFound => 0,
                    };
                    items.push(ItemResult { key: p.key, action: p.action, mod_revision });
                }
                self.revision = revision;
                (Ok(TxnOk { revision, items }), events)
            }
        }
    }

    /// Check every precondition against the state before the transaction.
    ///
    /// Registry rules, applied here so that every replica applies them the
    /// same way and in the same write:
    /// - a Put keeps the stored `status` (apply never carries one);
    /// - an Instance naming `spec.lease` needs that Lease to exist (or to be
    ///   created by the same transaction);
    /// - deleting a Lease deletes every Instance it owns.
    fn plan(&self, txn: &Txn) -> Result<Vec<Planned>, Error> {
        let mut seen = BTreeSet::new();
        let mut plan = Vec::with_capacity(txn.ops.len());
        for (i, op) in txn.ops.iter().enumerate() {
            // `Author` writes no object: the state machine records it.
            let Some(key) = op.key() else { continue };
            if !seen.insert(key) {
                return Err(Error::invalid(format!("{key} appears more than once in one transaction")));
            }
            let current = self.objects.get(key).cloned();
            if let Some(expected) = op.expected_revision() {
                let actual = current.as_ref().map_or(0, |c| c.mod_revision);
                if actual != expected {
                    let what = if actual == 0 { "does not exist".to_string() } else { format!("is at revision {actual}") };
                    return Err(Error::conflict(format!("{key} {what}, but the write expected revision {expected}")));
                }
            }
            let planned = match op {
                // The common case: the op's text is the new body as it is
                // (canonical JSON without status, from `apply`), compared and
                // stored as text, parsed only when something reads it.
                Op::Put { body, .. } if key.kind != Kind::Instance && !current.as_ref().is_some_and(|c| c.has_status()) => {
                    let action = match &current {
                        None => Action::Created,
                        Some(cur) if **cur.text() == **body => Action::Unchanged,
                        Some(_) => Action::Configured,
                    };
                    Planned { key: key.clone(), action, body: Some(NewBody::Text(body.clone())), current, keeps_version: false }
                }
                Op::Put { body, .. } => {
                    let mut body: Value = serde_json::from_str(body).map_err(|e| Error::internal(format!("stored body of {key} is not JSON: {e}")))?;
                    if let (Some(status), Some(obj)) = (current.as_ref().and_then(|c| c.body().get("status")), body.as_object_mut()) {
                        obj.insert("status".into(), status.clone());
                    }
                    if key.kind == Kind::Instance {
                        if let Some(lease) = body.pointer("/spec/lease").and_then(Value::as_str) {
                            let lease_key = ResourceKey::new(Kind::Lease, key.namespace.clone(), lease);
                            let in_txn = txn.ops.iter().any(|o| matches!(o, Op::Put { key, .. } if *key == lease_key));
                            if !in_txn && !self.objects.contains_key(&lease_key) {
                                return Err(Error::invalid_fields(vec![FieldError::new(
                                    format!("resources[{i}].spec.lease"),
                                    format!("lease {lease:?} not found in namespace {}", key.namespace),
                                )]));
                            }
                        }
                    }
                    let action = match &current {
                        None => Action::Created,
                        Some(cur) if *cur.body() == body => Action::Unchanged,
                        Some(_) => Action::Configured,
                    };
                    Planned { key: key.clone(), action, body: Some(NewBody::Value(body)), current, keeps_version: false }
                }
                Op::SetStatus { status, .. } | Op::Status { status, .. } => {
                    let Some(cur) = &current else { return Err(Error::not_found(format!("{key} not found"))) };
                    let status: Value = serde_json::from_str(status).map_err(|e| Error::invalid(format!("status of {key} is not JSON: {e}")))?;
                    let mut body = cur.body().clone();
                    if let Some(obj) = body.as_object_mut() {
                        obj.insert("status".into(), status);
                    }
                    let action = if body == *cur.body() { Action::Unchanged } else { Action::Configured };
                    let keeps_version = matches!(op, Op::Status { .. });
                    Planned { key: key.clone(), action, body: Some(NewBody::Value(body)), current, keeps_version }
                }
                Op::Delete { ignore_missing, .. } => {
                    let action = match (&current, ignore_missing) {
                        (Some(_), _) => Action::Deleted,
                        (None, true) => Action::NotFound,
                        (None, false) => return Err(Error::not_found(format!("{key} not found"))),
                    };
                    Planned { key: key.clone(), action, body: None, current, keeps_version: false }
                }
                Op::Author(_) => continue,
            };
            plan.push(planned);
        }
        // Leases take their instances with them.
        let deleted_leases: Vec<ResourceKey> =
            plan.iter().filter(|p| p.key.kind == Kind::Lease && p.action == Action::Deleted).map(|p| p.key.clone()).collect();
        for lease in &deleted_leases {
            for (k, obj) in self.owned_by(lease) {
                if seen.insert(k) {
                    plan.push(Planned { key: k.clone(), action: Action::Deleted, body: None, current: Some(obj.clone()), keeps_version: false });
                }
            }
        }
        Ok(plan)
    }

    /// The Instances a Lease owns (same namespace, `spec.lease` = its name).
    pub fn owned_by<'a>(&'a self, lease: &'a ResourceKey) -> impl Iterator<Item = (&'a ResourceKey, &'a Arc<StoredObject>)> + 'a {
        let lo = ResourceKey::new(Kind::Instance, lease.namespace.clone(), "");
        self.objects
            .range(lo..)
            .take_while(move |(k, _)| k.kind == Kind::Instance && k.namespace == lease.namespace)
            .filter(move |(_, o)| o.body().pointer("/spec/lease").and_then(Value::as_str) == Some(lease.name.as_str()))
    }
}

struct Planned {
    key: ResourceKey,
    action: Action,
    body: Option<NewBody>,
    current: Option<Arc<StoredObject>>,
    /// `Op::Status`: the object keeps its version (generation).
    keeps_version: bool,
}

enum NewBody {
    Text(Arc<str>),
    Value(Value),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Code;
    use serde_json::json;

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new(Kind::VirtualService, "default", name)
    }
    fn put(name: &str, host: &str, expected: Option<u64>) -> Op {
        let body = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                          "metadata": {"name": name, "namespace": "default"}, "spec": {"hosts": [host]}});
        Op::Put { key: key(name), body: body.to_string().into(), expected_revision: expected }
    }

    #[test]
    fn revisions_and_actions() {
        let mut s = State::default();
        let (r, ev) = s.apply_txn(&Txn { ops: vec![put("a", "a", None), put("b", "b", None)] });
        let ok = r.unwrap();
        assert_eq!(ok.revision, 1);
        assert_eq!(ev.len(), 2);
        assert!(ok.items.iter().all(|i| i.action == Action::Created && i.mod_revision == 1));

        // Re-applying the same content changes nothing and keeps the revision.
        let (r, ev) = s.apply_txn(&Txn { ops: vec![put("a", "a", None)] });
        assert_eq!(r.unwrap().revision, 1);
        assert!(ev.is_empty());

        let (r, _) = s.apply_txn(&Txn { ops: vec![put("a", "a2", Some(1))] });
        let ok = r.unwrap();
        assert_eq!((ok.revision, ok.items[0].action), (2, Action::Configured));
        let a = s.get(&key("a")).unwrap();
        assert_eq!((a.create_revision, a.mod_revision, a.version), (1, 2, 2));
    }

    #[test]
    fn conflict_changes_nothing() {
        let mut s = State::default();
        s.apply_txn(&Txn { ops: vec![put("a", "a", None)] }).0.unwrap();
        let before = s.clone();
        // The second op's precondition fails: the first must not apply either.
        let (r, ev) = s.apply_txn(&Txn { ops: vec![put("b", "b", None), put("a", "x", Some(7))] });
        assert_eq!(r.unwrap_err().code, Code::Conflict);
        assert!(ev.is_empty());
        assert_eq!(s.revision, before.revision);
        assert!(s.get(&key("b")).is_none());
        // expected 0 means "must not exist".
        let (r, _) = s.apply_txn(&Txn { ops: vec![put("a", "x", Some(0))] });
        assert_eq!(r.unwrap_err().code, Code::Conflict);
    }

    #[test]
    fn deletes() {
        let mut s = State::default();
        s.apply_txn(&Txn { ops: vec![put("a", "a", None)] }).0.unwrap();
        let del = |ignore| Op::Delete { key: key("a"), expected_revision: None, ignore_missing: ignore };
        let (r, ev) = s.apply_txn(&Txn { ops: vec![del(false)] });
        assert_eq!(r.unwrap().revision, 2);
        assert_eq!(ev[0].kind, EventType::Delete);
        assert_eq!(s.apply_txn(&Txn { ops: vec![del(false)] }).0.unwrap_err().code, Code::NotFound);
        assert_eq!(s.apply_txn(&Txn { ops: vec![del(true)] }).0.unwrap().items[0].action, Action::NotFound);
        assert_eq!(s.revision, 2);
    }
    #[test]
    fn status_keeps_the_generation_and_is_no_spec_change() {
        let mut s = State::default();
        let body = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "a", "namespace": "default"},
                          "spec": {"hosts": ["a"], "http": [{"route": [{"destination": {"host": "a"}}]}]}});
        s.apply_txn(&Txn { ops: vec![Op::Put { key: key("a"), body: body.to_string().into(), expected_revision: None }] }).0.unwrap();
        let set = |status: &str, keep: bool| {
            let (key, status, expected_revision) = (key("a"), status.to_string(), None);
            if keep {
                Op::Status { key, status, expected_revision }
            } else {
                Op::SetStatus { key, status, expected_revision }
            }
        };
        let before = s.objects.clone();
        let typed = s.get(&key("a")).unwrap().typed().unwrap().clone();
        let ok = s.apply_txn(&Txn { ops: vec![set(r#"{"x":1}"#, true)] }).0.unwrap();
        let a = s.get(&key("a")).unwrap().clone();
        assert!(Arc::ptr_eq(&typed, a.typed().unwrap()), "the spec was parsed again");
        assert_eq!((ok.revision, a.mod_revision, a.version, &a.body()["status"]), (2, 2, 1, &json!({"x": 1})));
        // Watchers see it; translation does not.
        assert_eq!(before.diff(&s.objects).count(), 1);
        assert_eq!(before.spec_diff(&s.objects).count(), 0);
        // The same status again is no revision.
        assert_eq!(s.apply_txn(&Txn { ops: vec![set(r#"{"x":1}"#, true)] }).0.unwrap().revision, 2);
        // `SetStatus` (health, which translation reads) is a change.
        let before = s.objects.clone();
        s.apply_txn(&Txn { ops: vec![set(r#"{"x":2}"#, false)] }).0.unwrap();
        assert_eq!(s.get(&key("a")).unwrap().version, 2);
        assert_eq!(before.spec_diff(&s.objects).count(), 1);
        // A spec write keeps the status and bumps the generation.
        s.apply_txn(&Txn { ops: vec![put("a", "a2", None)] }).0.unwrap();
        let a = s.get(&key("a")).unwrap();
        assert_eq!((a.version, &a.body()["status"]), (3, &json!({"x": 2})));
        // On a missing object, NOT_FOUND.
        let missing = Op::Status { key: key("b"), status: "{}".into(), expected_revision: None };
        assert_eq!(s.apply_txn(&Txn { ops: vec![missing] }).0.unwrap_err().code, Code::NotFound);
    }
}
