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
//! The per-proxy effect (every connected proxy whose Envoy config would
//! change) is not computed yet: see the README's "Preview a change".

use super::Caller;
use crate::auth::{Target, Verb};
use crate::error::{Error, Result};
use crate::model::{Kind, ResourceKey, StoredObject};
use crate::store::state::State;
use crate::store::types::{Action, Op, Txn};
use crate::store::EventType;
use serde::Serialize;
use serde_json::Value;

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

/// One field that differs: a value added (no `before`), removed (no
/// `after`) or replaced. Paths as validation errors name fields
/// (`spec.http[1].route[0].weight`).
#[derive(Debug, Serialize, PartialEq)]
pub struct FieldChange {
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<Value>,
    /// A Secret's value: the field changes, its values are not shown.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
}

/// What the write `txn` would do to `state`; the caller's read permission
/// on every resource checked first (the diff shows their contents).
pub fn preview(caller: &Caller, state: &State, txn: &Txn, warnings: Vec<String>) -> Result<Preview> {
    caller.authorize(Verb::Read, txn.ops.iter().map(|op| Target::key(op.key())))?;
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
        let current = state.get(op.key());
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
        }
    }
    Ok(())
}

/// The fields that differ between two JSON documents. Objects are
/// compared key by key; lists of the same length element by element, and
/// as a whole otherwise (a route added or removed replaces the list).
pub fn diff(before: &Value, after: &Value, redact: bool) -> Vec<FieldChange> {
    let mut out = Vec::new();
    walk(String::new(), Some(before), Some(after), redact, &mut out);
    out
}

fn walk(path: String, before: Option<&Value>, after: Option<&Value>, redact: bool, out: &mut Vec<FieldChange>) {
    match (before, after) {
        (Some(a), Some(b)) if a == b => {}
        (Some(Value::Object(a)), Some(Value::Object(b))) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                walk(p, a.get(k), b.get(k), redact, out);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                walk(format!("{path}[{i}]"), Some(x), Some(y), redact, out);
            }
        }
        (a, b) => {
            let hide = redact && !path.starts_with("metadata.") && path != "metadata" && path != "apiVersion" && path != "kind";
            out.push(FieldChange { path, before: if hide { None } else { a.cloned() }, after: if hide { None } else { b.cloned() }, redacted: hide });
        }
    }
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
    for w in p["warnings"].as_array().map(Vec::as_slice).unwrap_or_default() {
        out.push_str(&format!("Warning: {}\n", w.as_str().unwrap_or("")));
    }
    out.push_str(&format!("apply it as previewed: lodestar apply ... --expected-revision {}\n", p["baseRevision"]));
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
    use serde_json::json;

    #[test]
    fn diffs_name_the_fields_that_change() {
        let a = json!({"spec": {"hosts": ["r"], "http": [{"route": [{"weight": 80}, {"weight": 20}]}]}, "metadata": {"labels": {"a": "1"}}});
        let b = json!({"spec": {"hosts": ["r"], "http": [{"route": [{"weight": 70}, {"weight": 30}]}]}, "metadata": {"labels": {"b": "2"}}});
        let d = diff(&a, &b, false);
        let paths: Vec<(&str, Option<Value>, Option<Value>)> = d.iter().map(|f| (f.path.as_str(), f.before.clone(), f.after.clone())).collect();
        assert_eq!(
            paths,
            vec![
                ("metadata.labels.a", Some(json!("1")), None),
                ("metadata.labels.b", None, Some(json!("2"))),
                ("spec.http[0].route[0].weight", Some(json!(80)), Some(json!(70))),
                ("spec.http[0].route[1].weight", Some(json!(20)), Some(json!(30))),
            ]
        );
        // A list that grows is replaced whole.
        let d = diff(&json!({"l": [1]}), &json!({"l": [1, 2]}), false);
        assert_eq!((d.len(), d[0].path.as_str()), (1, "l"));
        assert!(diff(&a, &a, false).is_empty());
    }

    #[test]
    fn secret_values_never_appear() {
        let a = json!({"metadata": {"name": "s"}, "data": {"key": "c2VjcmV0MQ=="}});
        let b = json!({"metadata": {"name": "s", "labels": {"x": "y"}}, "data": {"key": "c2VjcmV0Mg==", "new": "bmV3"}});
        let d = diff(&a, &b, true);
        let text = serde_json::to_string(&d).unwrap();
        assert!(!text.contains("c2Vj") && !text.contains("bmV3"), "{text}");
        assert_eq!(d.iter().filter(|f| f.redacted).count(), 2, "{text}");
        assert!(d.iter().any(|f| f.path == "metadata.labels" && f.after == Some(json!({"x": "y"}))), "{text}");
    }
}
