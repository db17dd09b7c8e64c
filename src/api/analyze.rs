//! `lodestar analyze` on the live store (`GET /v1/analyze`, gRPC
//! `Analyze`), with resources laid over it (`POST /v1/analyze`: files
//! override live objects, as istioctl analyzes files with the cluster), and
//! on every write (the apply answer's warnings).
//!
//! What a caller sees: findings about resources it may `read`, that name
//! no resource it may not (a conflict with another namespace's
//! VirtualService is not shown to who may not read that namespace's). So a
//! namespace token asks for its namespace's findings and gets exactly
//! those; the analysis itself sees the whole store, as every proxy's
//! configuration does.

use super::Caller;
use crate::analyze::{self, files, Message, Options};
use crate::config::ServerConfig;
use crate::model::StoredObject;
use crate::store::types::{Op, Txn};
use crate::store::Applied;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// The answer of `/v1/analyze`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Answer {
    /// The store revision analyzed.
    pub revision: u64,
    pub messages: Vec<Message>,
    /// Laid-over documents skipped (kinds Lodestar does not store).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// The analysis options of a replica: its mesh settings, and now (for
/// certificates' validity).
pub fn options(config: &ServerConfig) -> Options {
    Options { mesh: Arc::new(config.mesh_config()), now: i64::try_from(crate::auth::acl::unix_now()).ok() }
}

/// The findings on `applied`, with `overlay` (resource documents) laid
/// over it, in `namespace` (none or empty: every namespace), that the
/// caller may see.
pub fn analyze(caller: &Caller, applied: &Applied, config: &ServerConfig, namespace: Option<&str>, overlay: Option<Vec<Value>>) -> Answer {
    let namespace = namespace.filter(|n| !n.is_empty());
    let opts = options(config);
    let mut state = applied.state.clone();
    let (mut messages, mut notes) = (Vec::new(), Vec::new());
    if let Some(docs) = overlay {
        let loaded = files::from_values("request", docs, namespace.unwrap_or(crate::model::DEFAULT_NAMESPACE));
        let revision = state.revision + 1;
        for obj in loaded.state.objects.values() {
            // An object the files replace keeps its age, as a write of them would.
            let created = state.get(&obj.key).map_or(revision, |o| o.create_revision);
            state.objects.insert(Arc::new(StoredObject::new(obj.key.clone(), created, revision, 1, obj.body().clone())));
        }
        state.revision = revision;
        (messages, notes) = (loaded.messages, loaded.notes);
    }
    messages.extend(analyze::analyze(&state, &opts));
    analyze::sort(&mut messages);
    messages.retain(|m| namespace.is_none_or(|ns| m.resource.as_ref().is_none_or(|r| r.namespace == ns)) && visible(caller, m));
    Answer { revision: applied.revision(), messages, notes }
}

/// The caller may read the message's resource and every one it names.
fn visible(caller: &Caller, m: &Message) -> bool {
    m.resource.iter().chain(&m.related).all(|r| r.key().is_some_and(|k| caller.may_read(&k)))
}

/// The findings a write causes (`analyze::on_write`) that the writer may
/// see, as istioctl's log lines: for the apply answer's warnings.
pub fn write_warnings(caller: &Caller, txn: &Txn, applied: &Applied, config: &ServerConfig) -> Vec<String> {
    let revision = applied.revision() + 1;
    let writes: Vec<_> = txn
        .ops
        .iter()
        .filter_map(|op| match op {
            Op::Put { key, body, .. } => {
                let created = applied.state.get(key).map_or(revision, |o| o.create_revision);
                Some((key.clone(), Some(Arc::new(StoredObject::from_text(key.clone(), created, revision, 1, body.clone())))))
            }
            Op::Delete { key, .. } => Some((key.clone(), None)),
            Op::SetStatus { .. } | Op::Status { .. } | Op::Author(_) => None,
        })
        .collect();
    analyze::on_write(&applied.state, &writes, &options(config)).into_iter().filter(|m| visible(caller, m)).map(|m| m.log_line(None)).collect()
}
