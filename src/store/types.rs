//! The raft type configuration and the commands carried in the log.
//!
//! Everything here is persisted (inside log entries) or sent between peers,
//! so enum variant order is part of the format: append, never reorder.

use crate::error::Error;
use crate::model::ResourceKey;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

pub type NodeId = u64;

/// What a replica advertises to its peers. Stored in the raft membership, so
/// every replica knows where every other serves its API and xDS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub raft_addr: String,
    pub api_addr: String,
    pub xds_addr: String,
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "raft={} api={} xds={}", self.raft_addr, self.api_addr, self.xds_addr)
    }
}

openraft::declare_raft_types!(
    /// Lodestar's raft types: commands in, per-entry responses out.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = NodeId,
        Node = NodeInfo,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeInfo>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeInfo>;
pub type StorageError = openraft::StorageError<NodeId>;

/// One raft log entry's payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// Independent client transactions coalesced into one entry (one fsync).
    /// Each is atomic on its own and gets its own revision.
    Batch(Vec<Txn>),
    /// As `Batch`, in groups that may carry a request id: a group whose id
    /// the state machine has already applied is not applied again, and
    /// answers with the results it had then (`store::dedup`). How a replica
    /// can send a write again when it cannot tell whether the first attempt
    /// got into the log (a leader lost mid-forward) without applying it
    /// twice.
    Groups(Vec<Group>),
}

/// Transactions that a replica sends (or proposes) together, under one id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub id: Option<RequestId>,
    pub txns: Vec<Txn>,
}

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
}

impl Op {
    pub fn key(&self) -> &ResourceKey {
        match self {
            Op::Put { key, .. } | Op::Delete { key, .. } | Op::SetStatus { key, .. } => key,
        }
    }

    pub fn expected_revision(&self) -> Option<u64> {
        match self {
            Op::Put { expected_revision, .. } | Op::Delete { expected_revision, .. } | Op::SetStatus { expected_revision, .. } => *expected_revision,
        }
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

/// Per-entry result of applying the log.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum Response {
    /// Blank and membership entries.
    #[default]
    None,
    Batch(Vec<TxnResult>),
}
