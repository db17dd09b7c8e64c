//! Transactions: what a write asks of the state and what it answers.
//! Persisted inside raft log entries and sent between peers, so enum
//! variant order is part of the format: append, never reorder.

use crate::error::Error;
use crate::model::ResourceKey;
use serde::{Deserialize, Serialize};
use std::fmt;

/// A replica's id in the cluster (raft's node id).
pub type NodeId = u64;

/// Names one group of writes: the replica that first sent it and a number
/// that replica never uses twice (a random start, then counting up, so a
/// restart does not reuse numbers either).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RequestId {
    pub origin: NodeId,
    pub seq: u64,
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:x}", self.origin, self.seq)
    }
}

/// An atomic multi-resource write: all ops apply at one revision, or none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Txn {
    pub ops: Vec<Op>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Op {
    Put {
        key: ResourceKey,
        /// The normalised body as JSON text (bincode cannot carry
        /// `serde_json::Value`, and text keeps the log self-describing).
        /// Shared: encoded exactly as a `String`, and cloning an entry (the
        /// log's cache, a batch kept for a retry) copies no body.
        body: std::sync::Arc<str>,
        expected_revision: Option<u64>,
    },
    Delete {
        key: ResourceKey,
        expected_revision: Option<u64>,
        /// Deleting a missing object succeeds instead of failing the txn.
        ignore_missing: bool,
    },
    /// Replace an object's `status` (JSON text), leaving its spec alone:
    /// how replicas record health. Fails if the object is gone.
    SetStatus { key: ResourceKey, status: String, expected_revision: Option<u64> },
    /// Since wire version 2 (`node::version::Feature::Author`): who made
    /// the change, recorded with the revision the transaction makes (if
    /// it makes one) for `history`. Touches no object. A replica of
    /// version 1 cannot decode it: the API adds it only once the cluster
    /// runs version 2.
    Author(Author),
    /// Since wire version 2 (`node::version::Feature::StatusOnly`): as
    /// `SetStatus`, but the object keeps its `version` (its generation):
    /// status is not spec. What a controller writes (the Gateway API
    /// status, `gateway_status`); translation never reads such a status,
    /// so a change of this op alone is no change to the mesh
    /// (`model::StoredObject::status_only_change`).
    Status { key: ResourceKey, status: String, expected_revision: Option<u64> },
}

/// Who made a change: the token's name (never its secret), and the
/// message the client gave, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Author {
    pub name: String,
    pub message: Option<String>,
}

/// The longest change message (bytes).
pub const MAX_MESSAGE_BYTES: usize = 256;

impl Op {
    /// The object the op writes (None: `Author`, which writes none).
    pub fn key(&self) -> Option<&ResourceKey> {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } | Op::SetStatus { key, .. } | Op::Status { key, .. } => Some(key),
            Op::Author(_) => None,
        }
    }

    pub fn expected_revision(&self) -> Option<u64> {
        match self {
            Op::Put { expected_revision, .. }
            | Op::Delete { expected_revision, .. }
            | Op::SetStatus { expected_revision, .. }
            | Op::Status { expected_revision, .. } => *expected_revision,
            Op::Author(_) => None,
        }
    }
}

impl Txn {
    /// Who made this transaction's change, if it says.
    pub fn author(&self) -> Option<&Author> {
        self.ops.iter().find_map(|op| match op {
            Op::Author(a) => Some(a),
            _ => None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    Created,
    Configured,
    Unchanged,
    Deleted,
    /// A delete with `ignore_missing` of an object that was not there.
    NotFound,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Created => "created",
            Action::Configured => "configured",
            Action::Unchanged => "unchanged",
            Action::Deleted => "deleted",
            Action::NotFound => "not-found",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemResult {
    pub key: ResourceKey,
    pub action: Action,
    /// The object's modRevision after the write (0 once deleted).
    pub mod_revision: u64,
}

/// A committed transaction: the revision it produced (or the current one,
/// when nothing changed) and what happened to each resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TxnOk {
    pub revision: u64,
    pub items: Vec<ItemResult>,
}

pub type TxnResult = Result<TxnOk, Error>;
