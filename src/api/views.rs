//! The JSON views of replica status (`/v1/node`, `/v1/cluster`, the
//! membership answers, `/v1/wait`), which the CLI and operators read.
//!
//! They are built from the peer wire types (`node::messages`, version 1,
//! pinned by `tests/fixtures/codec/*.v1.hex`) and from local state, and
//! never cross the raft port: a view may gain, rename or drop a field
//! freely, while a wire type changes only by a new version that every
//! member can read.

use crate::node::{NodeStatus, WaitReport};
use crate::replica::{ClusterStatus, MemberStatus};
use crate::store::types::NodeInfo;
use serde::Serialize;

/// One replica's view of itself.
#[derive(Debug, Serialize)]
pub struct NodeStatusView {
    pub id: u64,
    pub state: String,
    pub term: u64,
    pub leader: Option<u64>,
    pub applied_index: u64,
    pub revision: u64,
    /// Connected xDS streams (the spread of Envoys over replicas).
    pub xds_streams: u64,
    /// Ready to serve (see `ha`): current with the leader, recently.
    pub ready: bool,
}

impl From<&NodeStatus> for NodeStatusView {
    fn from(s: &NodeStatus) -> Self {
        NodeStatusView {
            id: s.id,
            state: s.state.clone(),
            term: s.term,
            leader: s.leader,
            applied_index: s.applied_index,
            revision: s.revision,
            xds_streams: s.xds_streams,
            ready: s.ready,
        }
    }
}

/// Where a member serves.
#[derive(Debug, Serialize)]
pub struct NodeInfoView {
    pub raft_addr: String,
    pub api_addr: String,
    pub xds_addr: String,
}

impl From<&NodeInfo> for NodeInfoView {
    fn from(i: &NodeInfo) -> Self {
        NodeInfoView { raft_addr: i.raft_addr.clone(), api_addr: i.api_addr.clone(), xds_addr: i.xds_addr.clone() }
    }
}

#[derive(Debug, Serialize)]
pub struct MemberStatusView {
    pub id: u64,
    pub info: NodeInfoView,
    /// voter | learner
    pub role: String,
    /// None when the member did not answer.
    pub status: Option<NodeStatusView>,
    pub error: Option<String>,
    /// The wire versions it supports (`node::version`), as last heard;
    /// None when never heard from (counted as version 1).
    pub versions: Option<VersionsView>,
}

/// A member's wire versions.
#[derive(Debug, Serialize)]
pub struct VersionsView {
    pub min: u32,
    pub max: u32,
    /// Whether it answered the last time it was asked.
    pub current: bool,
}

impl From<&MemberStatus> for MemberStatusView {
    fn from(m: &MemberStatus) -> Self {
        MemberStatusView {
            id: m.id,
            info: (&m.info).into(),
            role: m.role.clone(),
            status: m.status.as_ref().map(Into::into),
            error: m.error.clone(),
            versions: m.versions.map(|k| VersionsView { min: k.min, max: k.max, current: k.current }),
        }
    }
}

/// `cluster status`: the leader, the term, every member as it answered.
#[derive(Debug, Serialize)]
pub struct ClusterStatusView {
    pub leader: Option<u64>,
    pub term: u64,
    pub members: Vec<MemberStatusView>,
    /// The cluster version (the newest every voter supports, never lower
    /// than it has been), as the answering replica sees it.
    pub cluster_version: u32,
    /// Voters whose newest version is below the answering replica's.
    pub behind: Vec<u64>,
    /// Voters that cannot run at the cluster version, and why.
    pub incompatible: Vec<String>,
}

impl From<&ClusterStatus> for ClusterStatusView {
    fn from(c: &ClusterStatus) -> Self {
        ClusterStatusView {
            leader: c.leader,
            term: c.term,
            members: c.members.iter().map(Into::into).collect(),
            cluster_version: c.version.version,
            behind: c.version.behind.iter().map(|(id, _)| *id).collect(),
            incompatible: c.version.incompatible.iter().map(|(id, why)| format!("replica {id}: {why}")).collect(),
        }
    }
}

/// The outcome of waiting for the proxies to converge on a revision.
#[derive(Debug, Serialize)]
pub struct WaitReportView {
    pub revision: u64,
    pub converged: bool,
    /// Connected proxies counted, across every replica that answered.
    pub proxies: usize,
    pub synced: usize,
    pub pending: Vec<String>,
    pub nacked: Vec<String>,
    pub unreachable: Vec<String>,
}

impl From<WaitReport> for WaitReportView {
    fn from(r: WaitReport) -> Self {
        WaitReportView {
            revision: r.revision,
            converged: r.converged,
            proxies: r.proxies,
            synced: r.synced,
            pending: r.pending,
            nacked: r.nacked,
            unreachable: r.unreachable,
        }
    }
}
