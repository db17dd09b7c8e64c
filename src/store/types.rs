//! The raft type configuration and the commands carried in the log.
//!
//! Everything here is persisted (inside log entries) or sent between peers,
//! so enum variant order is part of the format: append, never reorder.

pub use crate::state::txn::{Action, Author, ItemResult, NodeId, Op, RequestId, Txn, TxnOk, TxnResult};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::io::Cursor;

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
    /// Since wire version 2 (`node::version::Feature::Stamp`): `Groups`
    /// with the time the leader proposed them (Unix milliseconds), which
    /// history retention by age reads (`store::retention`), so that no
    /// replica reads a clock to apply it. Proposed by the leader only
    /// (followers forward `Groups`).
    Stamped { unix_ms: u64, groups: Vec<Group> },
}

/// Transactions that a replica sends (or proposes) together, under one id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub id: Option<RequestId>,
    pub txns: Vec<Txn>,
}

/// Per-entry result of applying the log.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum Response {
    /// Blank and membership entries.
    #[default]
    None,
    Batch(Vec<TxnResult>),
}
