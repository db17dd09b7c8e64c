//! What replicas say to each other over the raft port (besides raft's own
//! RPCs): the peer wire types, format version 1. Plain serde data encoded
//! with `store::codec` (a version byte, then bincode): the fields' and
//! variants' order is the wire format, and bincode carries no field names
//! and no defaults, so a field added to one of these breaks a mixed-version
//! cluster. Their bytes are pinned by `tests/fixtures/codec/*.v1.hex`
//! (`fixtures` below): a change is a new type or variant (a new version
//! that every member can read), never an edit. The API's JSON views are
//! separate types (`api::views`), built from these.
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
    /// Since wire version 2: the sender's versions; the answer is the
    /// receiver's (`node::version`). A replica of version 1 cannot decode
    /// this variant and answers INVALID_ARGUMENT "undecodable peer
    /// payload", which is how the sender learns it speaks version 1.
    Version(PeerVersion),
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
    /// Since wire version 2: the answer to `ForwardRequest::Version`.
    Version(PeerVersion),
}

/// What a replica says of its versions (wire version 2; its view:
/// `api::views::MemberStatusView`'s version fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerVersion {
    pub id: NodeId,
    /// The wire versions this build reads and writes: `min..=max`.
    pub min: u32,
    pub max: u32,
    /// The cluster version as the sender sees it (0: it does not know yet).
    pub cluster: u32,
}

/// The outcome of waiting for the proxies to converge on a revision (its
/// view: `api::views::WaitReportView`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// One replica's view of itself, as its peers ask for it (its view:
/// `api::views::NodeStatusView`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: NodeId,
    pub state: String,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub applied_index: u64,
    pub revision: u64,
    /// Connected xDS streams (the spread of Envoys over replicas).
    pub xds_streams: u64,
    /// Ready to serve (see `ha`): current with the leader, recently.
    pub ready: bool,
}

/// Golden bytes of every peer message, format version 1. If this fails
/// after a change, the change broke a mixed-version cluster: add a new
/// version instead of re-blessing. `LODESTAR_BLESS=1` writes the fixtures
/// of new types only.
#[cfg(test)]
mod fixtures {
    use super::*;
    use crate::model::Kind;
    use crate::store::codec::{check_fixture, check_fixture_at};
    use crate::store::types::{Op, Txn, TxnOk};

    fn status() -> NodeStatus {
        NodeStatus { id: 2, state: "Follower".into(), term: 5, leader: Some(1), applied_index: 42, revision: 17, xds_streams: 300, ready: true }
    }

    fn report() -> WaitReport {
        WaitReport {
            revision: 17,
            converged: false,
            proxies: 3,
            synced: 1,
            pending: vec!["reviews-v1.default".into()],
            nacked: vec!["ratings.default (lds: bad listener)".into()],
            unreachable: vec!["replica 3".into()],
        }
    }

    #[test]
    fn peer_messages_v1_are_stable() {
        check_fixture("node_status", &status());
        check_fixture("wait_report", &report());
        let key = ResourceKey::new(Kind::VirtualService, "default", "reviews");
        let txn = Txn { ops: vec![Op::Put { key: key.clone(), body: r#"{"kind":"VirtualService"}"#.into(), expected_revision: Some(3) }] };
        let info = NodeInfo { raft_addr: "127.0.0.1:1".into(), api_addr: "127.0.0.1:2".into(), xds_addr: "127.0.0.1:3".into() };
        let requests = vec![
            ForwardRequest::Write(Command::Batch(vec![txn])),
            ForwardRequest::ReadIndex,
            ForwardRequest::AddNode { id: 4, info },
            ForwardRequest::RemoveNode { id: 4 },
            ForwardRequest::Heartbeat(key),
            ForwardRequest::Convergence(17),
        ];
        check_fixture("forward_requests", &requests);
        let replies = vec![
            ForwardReply::Write(vec![Ok(TxnOk { revision: 18, items: Vec::new() })]),
            ForwardReply::ReadIndex(42),
            ForwardReply::Done,
            ForwardReply::NotLeader(Some(1)),
            ForwardReply::Heartbeat { ttl_ms: 10_000 },
            ForwardReply::Convergence(report()),
        ];
        check_fixture("forward_replies", &replies);
    }

    fn hello() -> PeerVersion {
        PeerVersion { id: 3, min: 1, max: 2, cluster: 1 }
    }

    /// Wire version 2 added `Version` at the end of both enums: a v1
    /// message encodes as before (above), and each new one is pinned here.
    #[test]
    fn peer_messages_v2_are_stable() {
        check_fixture_at("peer_version", 2, &hello());
        check_fixture_at("forward_request_version", 2, &ForwardRequest::Version(hello()));
        check_fixture_at("forward_reply_version", 2, &ForwardReply::Version(hello()));
        // The new variants' tags follow the v1 ones (6 and 6): a build of
        // version 1 reads them as an unknown variant, never as another.
        let tag = |bytes: Vec<u8>| u32::from_le_bytes(bytes[1..5].try_into().unwrap());
        assert_eq!(tag(crate::store::codec::encode(&ForwardRequest::Version(hello()))), 6);
        assert_eq!(tag(crate::store::codec::encode(&ForwardReply::Version(hello()))), 6);
    }
}
