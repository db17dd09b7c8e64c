//! What replicas say to each other over the raft port (besides raft's own
//! RPCs), and the status views the API shows. Plain serde data, encoded with
//! `store::codec`: the variants' order is the wire format, so new ones go
//! last.
//!
//! `Node` answers the core requests (writes, read-index, membership). It
//! only routes `Heartbeat` and `Convergence` to the leader or a member;
//! the replica's helpers answer them (`replica::Replica::handle_peer`).

use crate::model::ResourceKey;
use crate::store::types::{Command, NodeId, NodeInfo, TxnResult};
use serde::{Deserialize, Serialize};

/// Requests a follower sends to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardRequest {
    Write(Command),
    ReadIndex,
    AddNode {
        id: NodeId,
        info: NodeInfo,
    },
    RemoveNode {
        id: NodeId,
    },
    /// A heartbeat (Instance TTL) or keepalive (Lease), for the leader.
    Heartbeat(ResourceKey),
    /// How this replica's proxies stand against a revision (any replica
    /// answers).
    Convergence(u64),
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardReply {
    Write(Vec<TxnResult>),
    ReadIndex(u64),
    Done,
    /// The receiver is not the leader (any more): ask again.
    NotLeader(Option<NodeId>),
    /// Heartbeat recorded; the TTL it renews, in milliseconds.
    Heartbeat {
        ttl_ms: u64,
    },
    /// The answering replica's proxies, against a revision.
    Convergence(WaitReport),
}

/// The outcome of waiting for the proxies to converge on a revision.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitReport {
    pub revision: u64,
    pub converged: bool,
    /// Connected proxies counted, across every replica that answered.
    pub proxies: usize,
    pub synced: usize,
    pub pending: Vec<String>,
    pub nacked: Vec<String>,
    pub unreachable: Vec<String>,
}

/// One replica's view of itself, as `cluster status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: NodeId,
    pub state: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub applied_index: u64,
    pub revision: u64,
    /// Connected xDS streams (the spread of Envoys over replicas).
    #[serde(default)]
    pub xds_streams: u64,
    /// Ready to serve (see `ha`): current with the leader, recently.
    #[serde(default)]
    pub ready: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub info: NodeInfo,
    /// voter | learner
    pub role: String,
    /// None when the member did not answer.
    pub status: Option<NodeStatus>,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub leader: Option<NodeId>,
    pub term: u64,
    pub members: Vec<MemberStatus>,
}
