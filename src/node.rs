//! A replica's domain service: every API (REST, gRPC, peer) calls into
//! [`Node`], never into raft or sled directly.
//!
//! Writes: `write(txn)` queues the transaction for the batcher, which
//! coalesces whatever is queued into one `Command::Batch` (one raft entry,
//! one fsync per replica) and submits it: to the local raft when this node
//! leads, else forwarded to the leader over the peer port. Each transaction
//! in a batch stays atomic on its own and gets its own revision.
//!
//! Reads: `read(Linearizable)` confirms leadership with a quorum (read-index)
//! at the leader, then waits until the local applied state has caught up
//! with that index; `read(Stale)` returns the local applied state.

use crate::config::ServerConfig;
use crate::error::{Code, Error, Result};
use crate::peer::{PeerClients, PeerError};
use crate::store::state_machine::StoreReader;
use crate::store::types::{Command, NodeId, NodeInfo, Raft, Response, Txn, TxnOk, TxnResult};
use crate::store::Applied;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Largest number of transactions, and bytes of bodies, in one raft entry.
const MAX_BATCH_TXNS: usize = 512;
const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// Raft entries a replica keeps in flight at once from its batcher.
const MAX_INFLIGHT_BATCHES: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    #[default]
    Linearizable,
    Stale,
}

/// Requests a follower sends to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardRequest {
    Write(Command),
    ReadIndex,
    AddNode { id: NodeId, info: NodeInfo },
    RemoveNode { id: NodeId },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ForwardReply {
    Write(Vec<TxnResult>),
    ReadIndex(u64),
    Done,
    /// The receiver is not the leader (any more): ask again.
    NotLeader(Option<NodeId>),
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

struct Pending {
    txn: Txn,
    bytes: usize,
    reply: oneshot::Sender<TxnResult>,
}

pub struct Node {
    pub id: NodeId,
    pub info: NodeInfo,
    pub raft: Raft,
    pub reader: StoreReader,
    pub config: Arc<ServerConfig>,
    peers: PeerClients,
    batcher: mpsc::Sender<Pending>,
}

impl Node {
    pub fn new(config: Arc<ServerConfig>, raft: Raft, reader: StoreReader, peers: PeerClients) -> Arc<Node> {
        let (tx, rx) = mpsc::channel(16 * 1024);
        let node = Arc::new(Node { id: config.id, info: config.node_info(), raft, reader, config, peers, batcher: tx });
        tokio::spawn(batcher(Arc::downgrade(&node), rx));
        node
    }

    fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.config.write_timeout_ms)
    }

    /// Commit one atomic transaction through raft. Returns once it is
    /// committed by a quorum and applied on the leader.
    pub async fn write(&self, txn: Txn) -> Result<TxnOk> {
        let bytes = txn
            .ops
            .iter()
            .map(|op| match op {
                crate::store::Op::Put { body, .. } => body.len(),
                crate::store::Op::Delete { .. } => 64,
            })
            .sum();
        let (reply, rx) = oneshot::channel();
        self.batcher.send(Pending { txn, bytes, reply }).await.map_err(|_| Error::unavailable("shutting down"))?;
        rx.await.map_err(|_| Error::unavailable("shutting down"))?
    }

    fn leader(&self) -> Option<(NodeId, NodeInfo)> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        let info = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, info))
    }

    /// Wait (bounded by `deadline`) until the metrics change, e.g. a leader
    /// gets elected.
    async fn wait_for_change(&self, deadline: Instant) {
        let mut rx = self.raft.metrics();
        rx.borrow_and_update();
        let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(200));
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }

    /// Submit a batch to the leader, wherever it is, retrying while there is
    /// no leader or the leader moves, until the write timeout.
    async fn submit(&self, cmd: Command) -> Result<Vec<TxnResult>> {
        let deadline = Instant::now() + self.write_timeout();
        loop {
            if Instant::now() >= deadline {
                return Err(Error::unavailable("no leader with a quorum within the write timeout"));
            }
            match self.leader() {
                Some((id, _)) if id == self.id => match self.raft.client_write(cmd.clone()).await {
                    Ok(resp) => return batch_results(resp.data),
                    Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => self.wait_for_change(deadline).await,
                    Err(e) => return Err(Error::unavailable(format!("raft: {e}"))),
                },
                Some((_, info)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.peers.forward(&info.raft_addr, &ForwardRequest::Write(cmd.clone()), left).await {
                        Ok(Ok(ForwardReply::Write(results))) => return Ok(results),
                        Ok(Ok(_)) => self.wait_for_change(deadline).await,
                        Ok(Err(e)) => return Err(e),
                        Err(PeerError::Unreachable { .. }) => self.wait_for_change(deadline).await,
                        Err(e @ PeerError::Failed { .. }) => {
                            return Err(Error::unavailable(format!("forwarding to the leader failed, the write may or may not have committed: {e}")))
                        }
                    }
                }
                None => self.wait_for_change(deadline).await,
            }
        }
    }

    /// A replica's applied state that reflects every write acknowledged
    /// before this call (Linearizable), or whatever is applied here (Stale).
    pub async fn read(&self, consistency: Consistency) -> Result<Arc<Applied>> {
        if consistency == Consistency::Stale {
            return Ok(self.reader.current());
        }
        let deadline = Instant::now() + self.write_timeout();
        let index = loop {
            if Instant::now() >= deadline {
                return Err(Error::unavailable("no leader with a quorum within the timeout"));
            }
            match self.leader() {
                Some((id, _)) if id == self.id => match self.leader_read_index().await {
                    Ok(Some(i)) => break i,
                    Ok(None) => self.wait_for_change(deadline).await,
                    Err(e) => return Err(e),
                },
                Some((_, info)) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.peers.forward(&info.raft_addr, &ForwardRequest::ReadIndex, left).await {
                        Ok(Ok(ForwardReply::ReadIndex(i))) => break i,
                        Ok(Ok(_)) | Err(PeerError::Unreachable { .. }) => self.wait_for_change(deadline).await,
                        Ok(Err(e)) => return Err(e),
                        Err(e) => return Err(Error::unavailable(e.to_string())),
                    }
                }
                None => self.wait_for_change(deadline).await,
            }
        };
        let mut rx = self.reader.subscribe_applied();
        let left = deadline.saturating_duration_since(Instant::now());
        let waited = tokio::time::timeout(left, async { rx.wait_for(|a| a.applied_index() >= index).await.map(|a| a.clone()) }).await;
        match waited {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(_)) => Err(Error::unavailable("shutting down")),
            Err(_) => Err(Error::unavailable(format!("this replica did not apply index {index} within the timeout"))),
        }
    }

    /// Leader side of read-index: confirm leadership with a quorum. `None`
    /// when this node turns out not to be the leader.
    async fn leader_read_index(&self) -> Result<Option<u64>> {
        match self.raft.ensure_linearizable().await {
            Ok(log_id) => Ok(Some(log_id.map_or(0, |l| l.index))),
            Err(RaftError::APIError(_)) => Ok(None),
            Err(e) => Err(Error::unavailable(format!("raft: {e}"))),
        }
    }

    /// Serve a request forwarded by a follower. Never forwards again: a node
    /// that is not the leader says so and the follower retries.
    pub async fn handle_forward(&self, req: ForwardRequest) -> Result<ForwardReply> {
        let not_leader = || ForwardReply::NotLeader(self.raft.metrics().borrow().current_leader);
        match req {
            ForwardRequest::Write(cmd) => match self.raft.client_write(cmd).await {
                Ok(resp) => Ok(ForwardReply::Write(batch_results(resp.data)?)),
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Ok(not_leader()),
                Err(e) => Err(Error::unavailable(format!("raft: {e}"))),
            },
            ForwardRequest::ReadIndex => Ok(match self.leader_read_index().await? {
                Some(i) => ForwardReply::ReadIndex(i),
                None => not_leader(),
            }),
            ForwardRequest::AddNode { id, info } => self.leader_add_node(id, info).await,
            ForwardRequest::RemoveNode { id } => self.leader_remove_node(id).await,
        }
    }

    async fn leader_add_node(&self, id: NodeId, info: NodeInfo) -> Result<ForwardReply> {
        // Learner first: it catches up (log or snapshot) without counting
        // towards the quorum, then it is promoted to voter.
        match self.raft.add_learner(id, info, true).await {
            Ok(_) => {}
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => return Ok(ForwardReply::NotLeader(None)),
            Err(e) => return Err(membership_error(e)),
        }
        match self.raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false).await {
            Ok(_) => Ok(ForwardReply::Done),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Ok(ForwardReply::NotLeader(None)),
            Err(e) => Err(membership_error(e)),
        }
    }

    async fn leader_remove_node(&self, id: NodeId) -> Result<ForwardReply> {
        let membership = self.raft.metrics().borrow().membership_config.clone();
        let m = membership.membership();
        if m.get_node(&id).is_none() {
            return Err(Error::not_found(format!("node {id} is not a member")));
        }
        let is_voter = m.voter_ids().any(|v| v == id);
        let change = if is_voter { ChangeMembers::RemoveVoters(BTreeSet::from([id])) } else { ChangeMembers::RemoveNodes(BTreeSet::from([id])) };
        match self.raft.change_membership(change, false).await {
            Ok(_) => Ok(ForwardReply::Done),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => Ok(ForwardReply::NotLeader(None)),
            Err(e) => Err(membership_error(e)),
        }
    }

    /// Run a membership change on the leader, wherever it is.
    async fn membership_change(&self, req: ForwardRequest) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if Instant::now() >= deadline {
                return Err(Error::unavailable("membership change did not complete within 60s"));
            }
            let reply = match self.leader() {
                Some((id, _)) if id == self.id => self.handle_forward(req.clone()).await?,
                Some((_, info)) => match self.peers.forward(&info.raft_addr, &req, Duration::from_secs(60)).await {
                    Ok(r) => r?,
                    Err(PeerError::Unreachable { .. }) => ForwardReply::NotLeader(None),
                    Err(e) => return Err(Error::unavailable(e.to_string())),
                },
                None => ForwardReply::NotLeader(None),
            };
            match reply {
                ForwardReply::NotLeader(_) => self.wait_for_change(deadline).await,
                _ => return Ok(()),
            }
        }
    }

    pub async fn add_node(&self, id: NodeId, info: NodeInfo) -> Result<()> {
        if id == 0 {
            return Err(Error::field("id", "must be at least 1"));
        }
        for (field, addr) in [("raftAddr", &info.raft_addr), ("apiAddr", &info.api_addr), ("xdsAddr", &info.xds_addr)] {
            if addr.parse::<std::net::SocketAddr>().is_err() {
                return Err(Error::field(field, format!("{addr:?} is not an IP:PORT address")));
            }
        }
        self.membership_change(ForwardRequest::AddNode { id, info }).await
    }

    pub async fn remove_node(&self, id: NodeId) -> Result<()> {
        self.membership_change(ForwardRequest::RemoveNode { id }).await
    }

    pub fn local_status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow().clone();
        let applied = self.reader.current();
        NodeStatus {
            id: self.id,
            state: state_name(m.state).to_string(),
            term: m.current_term,
            leader: m.current_leader,
            applied_index: applied.applied_index(),
            revision: applied.revision(),
        }
    }

    /// Members from the local membership config, each asked for its status.
    pub async fn cluster_status(&self) -> ClusterStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let nodes: BTreeMap<NodeId, NodeInfo> = membership.nodes().map(|(id, n)| (*id, n.clone())).collect();
        let asks = nodes.into_iter().map(|(id, info)| {
            let peers = self.peers.clone();
            let role = if voters.contains(&id) { "voter" } else { "learner" }.to_string();
            let local = (id == self.id).then(|| self.local_status());
            async move {
                let (status, error) = match local {
                    Some(s) => (Some(s), None),
                    None => match peers.status(&info.raft_addr, Duration::from_millis(1000)).await {
                        Ok(s) => (Some(s), None),
                        Err(e) => (None, Some(e.to_string())),
                    },
                };
                MemberStatus { id, info, role, status, error }
            }
        });
        let members = futures::future::join_all(asks).await;
        ClusterStatus { leader: m.current_leader, term: m.current_term, members }
    }

    /// Ready to serve: a leader is known and this replica has applied
    /// everything it knows to be in its log. Refined in the HA work.
    pub fn readiness(&self) -> std::result::Result<(), String> {
        let m = self.raft.metrics().borrow().clone();
        if m.current_leader.is_none() {
            return Err("no known leader".into());
        }
        if !matches!(m.state, ServerState::Leader | ServerState::Follower | ServerState::Learner) {
            return Err(format!("raft state is {:?}", m.state));
        }
        Ok(())
    }
}

fn state_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

fn membership_error<E: std::fmt::Display>(e: E) -> Error {
    let text = e.to_string();
    // openraft refuses overlapping changes and changes that would leave no
    // voters: those are the caller's to fix.
    if text.contains("InProgress") || text.contains("in progress") {
        Error::unavailable(format!("another membership change is in progress: {text}"))
    } else if text.contains("empty") || text.contains("EmptyMembership") {
        Error::invalid(format!("membership change refused: {text}"))
    } else {
        Error::new(Code::Unavailable, format!("membership change failed: {text}"))
    }
}

fn batch_results(resp: Response) -> Result<Vec<TxnResult>> {
    match resp {
        Response::Batch(r) => Ok(r),
        Response::None => Err(Error::internal("raft returned no result for a write")),
    }
}

/// Coalesce queued transactions into raft entries, several in flight at once.
/// Under load, requests queue while a permit is awaited, so batches grow
/// exactly when batching pays off; an isolated write goes out alone at once.
async fn batcher(node: Weak<Node>, mut rx: mpsc::Receiver<Pending>) {
    let permits = Arc::new(Semaphore::new(MAX_INFLIGHT_BATCHES));
    while let Some(first) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let mut bytes = first.bytes;
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH_TXNS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    bytes += p.bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        let Some(node) = node.upgrade() else { return };
        tokio::spawn(async move {
            let _permit = permit;
            let (txns, replies): (Vec<Txn>, Vec<oneshot::Sender<TxnResult>>) = batch.into_iter().map(|p| (p.txn, p.reply)).unzip();
            let n = txns.len();
            match node.submit(Command::Batch(txns)).await {
                Ok(results) if results.len() == n => {
                    for (reply, result) in replies.into_iter().zip(results) {
                        let _ = reply.send(result);
                    }
                }
                Ok(results) => {
                    let e = Error::internal(format!("raft returned {} results for {n} transactions", results.len()));
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
            }
        });
    }
}
