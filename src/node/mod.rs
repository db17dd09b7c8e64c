//! A replica's domain service: every API (REST, gRPC, peer) calls into
//! [`Node`], never into raft or sled directly.
//!
//! Writes: `write(txn)` queues the transaction for the batcher, which
//! coalesces whatever is queued into one `Command::Batch` (one raft entry,
//! one fsync per replica) and submits it: to the local raft when this node
//! leads, else forwarded to the leader over the peer port. At the leader a
//! forwarded batch joins the same queue, so the writes of every replica
//! share entries. Each transaction in a batch stays atomic on its own and
//! gets its own revision.
//!
//! A batch gets a request id (`RequestId`: this replica, a number it never
//! reuses) before its first attempt and keeps it, with the same
//! transactions, through every retry: to the leader that was lost
//! mid-forward, to the next one, or proposed here after this node is
//! elected. The state machine applies an id once (`store::dedup`), so a
//! retry never applies a write twice and gets the first attempt's results.
//! That makes it safe to give up on a leader as soon as it is replaced:
//! a forward (write or read-index) in flight to a leader is abandoned when
//! the raft metrics show another leader or a new term, and sent again to
//! the new one, instead of waiting on a connection to a replica that may
//! never answer (paused, or cut off by a partition).
//!
//! Reads: `read(Linearizable)` confirms leadership with a quorum (read-index)
//! at the leader, then waits until the local applied state has caught up
//! with that index; `read(Stale)` returns the local applied state.

pub mod messages;
pub mod transport;
pub mod version;

pub use messages::{ForwardReply, ForwardRequest, NodeStatus, PeerVersion, WaitReport};
pub use transport::{PeerError, Transport};

use crate::error::{Code, Error, Result};
use crate::store::state_machine::StoreReader;
use crate::store::types::{Command, Group, NodeId, NodeInfo, Raft, RequestId, Response, Txn, TxnOk, TxnResult};
use crate::store::Applied;
use openraft::error::{ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Semaphore};

/// Largest number of transactions, and bytes of bodies, in one raft entry
/// (a forwarded group is never split, so an entry may exceed them by one).
const MAX_BATCH_TXNS: usize = 512;
const MAX_BATCH_BYTES: usize = 1024 * 1024;
/// Batches a replica keeps in flight at once: raft entries at the leader,
/// forward calls at a follower. One: under load the queue fills while a
/// batch is out, so the next one is as big as it can be. Every entry costs a
/// log append, a replication message, a state machine apply and a published
/// state on every replica, whatever its size, and on a small machine that
/// CPU is what limits throughput (measured with `benches/write.sh` on two
/// cores: 1 beat 2, 4 and 8 at 64 clients, and 1 client is unaffected).
const MAX_INFLIGHT_BATCHES: usize = 1;
/// Group commit waits for the writes answered with the previous batch only
/// when that batch had at least this many transactions (see `batcher`).
const GROUP_MIN_TXNS: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Consistency {
    #[default]
    Linearizable,
    Stale,
}

/// An encoded backup file and what it holds.
pub struct Backup {
    pub revision: u64,
    pub objects: usize,
    pub bytes: Vec<u8>,
}

/// A group of transactions queued for the batcher: one client write, or a
/// batch a follower forwarded. A group always lands in a single raft entry.
struct Pending {
    txns: Vec<Txn>,
    bytes: usize,
    /// Forwarded by a follower: propose it here or answer NotLeader, never
    /// forward it again.
    forwarded: bool,
    /// A forwarded group's request id (local groups get their batch's).
    id: Option<RequestId>,
    reply: oneshot::Sender<Outcome>,
}

enum Outcome {
    /// Committed and applied: one result per transaction of the group.
    Committed(Vec<TxnResult>),
    /// Not proposed: this node is not the leader (only for forwarded groups).
    NotLeader,
    Failed(Error),
}

/// What a node takes from the server's settings
/// (`config::ServerConfig::node_options`).
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    pub id: NodeId,
    /// Where this replica serves each port, as peers see it.
    pub info: NodeInfo,
    /// How long the batcher waits to group writes into one entry.
    pub group_commit_wait_us: u64,
    /// How long a write waits for its commit.
    pub write_timeout_ms: u64,
    /// Where the highest cluster version seen is kept (`version`).
    pub data_dir: Option<std::path::PathBuf>,
}

/// Raft, the applied state and the peers are the node's own: helpers reach
/// them through its methods ([`Node::reader`], [`Node::metrics`],
/// [`Node::peers`]; [`Node::raft`] only for the raft network's inbound
/// RPCs), never by field.
pub struct Node {
    pub id: NodeId,
    pub info: NodeInfo,
    raft: Raft,
    reader: StoreReader,
    options: NodeOptions,
    /// The other replicas, by raft address (`peer::PeerClients`).
    peers: Arc<dyn Transport>,
    batcher: mpsc::Sender<Pending>,
    /// The least read index while leading in a term: (term, index). See
    /// `leader_read_index`.
    read_floor: std::sync::Mutex<Option<(u64, u64)>>,
    /// The next request id's number (random start: see `RequestId`).
    next_seq: AtomicU64,
    /// Every member's wire versions, and the cluster version (`version`).
    versions: version::Versions,
}

impl Node {
    pub fn new(options: NodeOptions, raft: Raft, reader: StoreReader, peers: Arc<dyn Transport>) -> Arc<Node> {
        let (tx, rx) = mpsc::channel(16 * 1024);
        let versions = version::Versions::new(options.id, options.data_dir.clone());
        let node = Arc::new(Node {
            id: options.id,
            info: options.info.clone(),
            raft,
            reader,
            options,
            peers,
            batcher: tx,
            read_floor: Default::default(),
            next_seq: AtomicU64::new(rand::random::<u64>() >> 1),
            versions,
        });
        let group_wait = Duration::from_micros(node.options.group_commit_wait_us);
        tokio::spawn(batcher(Arc::downgrade(&node), rx, group_wait));
        node
    }

    /// The applied state: the current snapshot, its changes, history.
    pub fn reader(&self) -> &StoreReader {
        &self.reader
    }

    /// Raft's view of the cluster (leader, term, membership, log indexes).
    pub fn metrics(&self) -> tokio::sync::watch::Receiver<openraft::RaftMetrics<NodeId, NodeInfo>> {
        self.raft.metrics()
    }

    /// Every member's wire versions and the cluster version.
    pub fn versions(&self) -> &version::Versions {
        &self.versions
    }

    /// Every member's id, learners included: the members the cluster
    /// version counts (a learner is sent the log too, so it must read it).
    pub fn member_ids(&self) -> Vec<NodeId> {
        self.members().into_iter().map(|(id, _, _)| id).collect()
    }

    /// The cluster version as this replica sees it (`version`).
    pub fn cluster_version(&self) -> version::ClusterVersion {
        self.versions.cluster(&self.member_ids())
    }

    /// The gate (`version`): refuse, before proposing, a write that needs
    /// a newer cluster version than the cluster runs. A refusal is checked
    /// again after asking the members afresh: the last replica may have
    /// been upgraded since the last refresh.
    async fn gate(&self, txn: &Txn) -> Result<()> {
        if self.versions.check(txn, &self.member_ids()).is_ok() {
            return Ok(());
        }
        version::refresh(self).await;
        self.versions.check(txn, &self.member_ids())
    }

    /// How this node reaches its peers.
    pub fn peers(&self) -> &dyn Transport {
        self.peers.as_ref()
    }

    /// Raft itself, for the raft network's inbound RPCs (`peer`) and the
    /// server's start and shutdown.
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.options.write_timeout_ms)
    }

    /// Commit one atomic transaction through raft. Returns once it is
    /// committed by a quorum and applied on the leader.
    pub async fn write(&self, txn: Txn) -> Result<TxnOk> {
        // Every write passes here: a Secret with its key in the clear never
        // reaches the raft log, whichever path built it.
        unsealed_secrets(&txn)?;
        let started = Instant::now();
        let result = match self.gate(&txn).await {
            Ok(()) => self.write_once(txn).await,
            Err(e) => Err(e),
        };
        let m = crate::metrics::metrics();
        m.write_duration.observe(started.elapsed());
        m.writes.with(&[result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok")]).inc();
        result
    }

    async fn write_once(&self, txn: Txn) -> Result<TxnOk> {
        match self.enqueue(vec![txn], false, None).await {
            Outcome::Committed(mut results) if results.len() == 1 => results.pop().expect("one result"),
            Outcome::Committed(results) => Err(Error::internal(format!("raft returned {} results for one transaction", results.len()))),
            Outcome::NotLeader => Err(Error::unavailable("no leader accepted the write")),
            Outcome::Failed(e) => Err(e),
        }
    }

    /// Queue a group of transactions for the batcher and wait for its outcome.
    async fn enqueue(&self, txns: Vec<Txn>, forwarded: bool, id: Option<RequestId>) -> Outcome {
        let bytes = txns.iter().flat_map(|t| &t.ops).map(op_bytes).sum();
        let (reply, rx) = oneshot::channel();
        if self.batcher.send(Pending { txns, bytes, forwarded, id, reply }).await.is_err() {
            return Outcome::Failed(Error::unavailable("shutting down"));
        }
        rx.await.unwrap_or_else(|_| Outcome::Failed(Error::unavailable("shutting down")))
    }

    pub fn leader(&self) -> Option<(NodeId, NodeInfo)> {
        self.leader_in_term().map(|(id, info, _)| (id, info))
    }

    /// The leader, its address and the term this node knows it in.
    fn leader_in_term(&self) -> Option<(NodeId, NodeInfo, u64)> {
        let m = self.raft.metrics().borrow().clone();
        let id = m.current_leader?;
        let info = m.membership_config.membership().get_node(&id)?.clone();
        Some((id, info, m.current_term))
    }

    /// Resolves once `leader` is no longer this node's leader in `term`:
    /// another leader, none (an election), or a new term. Never, while it
    /// stays (or the raft is gone).
    async fn leader_replaced(&self, leader: NodeId, term: u64) {
        let mut rx = self.raft.metrics();
        if rx.wait_for(|m| m.current_leader != Some(leader) || m.current_term != term).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Forward `req` to the leader, for at most `left`. `None` when the
    /// leader was replaced first: the call is dropped (its answer, if one
    /// ever comes, is not waited for) and the caller asks the new one.
    async fn forward_to_leader(
        &self,
        (leader, info, term): &(NodeId, NodeInfo, u64),
        req: &ForwardRequest,
        left: Duration,
    ) -> Option<std::result::Result<Result<ForwardReply>, PeerError>> {
        tokio::select! {
            r = self.peers.forward(*leader, &info.raft_addr, req, left) => Some(r),
            _ = self.leader_replaced(*leader, *term) => {
                tracing::debug!(leader, term, "the leader was replaced while a request was in flight to it: sending it to the new one");
                None
            }
        }
    }

    /// Wait (bounded by `deadline`) until the metrics change, e.g. a leader
    /// gets elected.
    pub async fn wait_for_change(&self, deadline: Instant) {
        let mut rx = self.raft.metrics();
        rx.borrow_and_update();
        let left = deadline.saturating_duration_since(Instant::now()).min(Duration::from_millis(200));
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }

    /// Commit a batch of queued groups as one raft entry: proposed to the
    /// local raft when this node leads, else forwarded to the leader,
    /// retrying while there is no leader or the leader moves, until the write
    /// timeout. Forwarded groups are only ever proposed here: when this node
    /// does not lead they are answered NotLeader and their follower retries.
    ///
    /// This node's own groups go as one group under one request id, fixed
    /// with its transactions at the first attempt: every retry, wherever it
    /// goes, is the same group, so it applies at most once.
    async fn run_batch(&self, batch: Vec<Pending>) {
        let deadline = Instant::now() + self.write_timeout();
        // A group whose caller is gone (client disconnected, forwarding
        // follower gave up) is not proposed: nobody could learn its fate.
        let (mut local, mut forwarded): (Vec<_>, Vec<_>) = batch.into_iter().filter(|p| !p.reply.is_closed()).partition(|p| !p.forwarded);
        let local_group = (!local.is_empty()).then(|| Group {
            id: Some(RequestId { origin: self.id, seq: self.next_seq.fetch_add(1, Ordering::Relaxed) }),
            txns: local.iter().flat_map(|p| p.txns.iter().cloned()).collect(),
        });
        // Sent, and maybe delivered, at least once: the outcome of a
        // timeout is then unknown.
        let mut maybe_sent = false;
        loop {
            if Instant::now() >= deadline {
                let e = if maybe_sent {
                    "no leader answered within the write timeout: the write may or may not have committed"
                } else {
                    "no leader with a quorum within the write timeout"
                };
                fail(local, Error::unavailable(e));
                return fail(forwarded, Error::unavailable(e));
            }
            let leader = self.leader_in_term();
            if !matches!(leader, Some((id, _, _)) if id == self.id) {
                for p in forwarded.drain(..) {
                    let _ = p.reply.send(Outcome::NotLeader);
                }
            }
            forwarded.retain(|p| !p.reply.is_closed());
            if local_group.is_none() && forwarded.is_empty() {
                return;
            }
            // Cloned: a retry needs them again, and raft takes them by value.
            let groups: Vec<Group> = local_group.iter().cloned().chain(forwarded.iter().map(|p| Group { id: p.id, txns: p.txns.clone() })).collect();
            match leader {
                Some((id, _, _)) if id == self.id => {
                    maybe_sent = true;
                    match self.raft.client_write(self.command(groups)).await {
                        Ok(resp) => {
                            local.append(&mut forwarded);
                            return deliver(local, batch_results(resp.data));
                        }
                        // Not appended, or appended and then lost with the
                        // leadership (it may yet commit): propose again,
                        // here or at the new leader, under the same id.
                        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_))) => self.wait_for_change(deadline).await,
                        Err(e) => {
                            local.append(&mut forwarded);
                            return fail(local, Error::unavailable(format!("raft: {e}")));
                        }
                    }
                }
                Some(leader) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    maybe_sent = true;
                    match self.forward_to_leader(&leader, &ForwardRequest::Write(Command::Groups(groups)), left).await {
                        None => {}
                        Some(Ok(Ok(ForwardReply::Write(results)))) => return deliver(local, Ok(results)),
                        Some(Ok(Ok(_))) => self.wait_for_change(deadline).await,
                        Some(Ok(Err(e))) => return fail(local, e),
                        // Not delivered, or the answer was lost: the same
                        // group again is safe either way.
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "forwarding a write to the leader: trying again");
                            self.wait_for_change(deadline).await
                        }
                    }
                }
                None => self.wait_for_change(deadline).await,
            }
        }
    }

    /// The entry the leader proposes: its groups stamped with its time
    /// (history retention by age reads it, `store::retention`) once every
    /// voting member can read a stamp (`version::Feature::Stamp`).
    fn command(&self, groups: Vec<Group>) -> Command {
        let (_, needs) = version::feature_since(version::Feature::Stamp);
        if self.cluster_version().version < needs {
            return Command::Groups(groups);
        }
        let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Command::Stamped { unix_ms, groups }
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
            match self.route(&ForwardRequest::ReadIndex, deadline).await? {
                Routed::Here => match self.leader_read_index().await? {
                    Some(i) => break i,
                    None => self.wait_for_change(deadline).await,
                },
                Routed::Reply(ForwardReply::ReadIndex(i)) => break i,
                Routed::Reply(_) | Routed::Retry => self.wait_for_change(deadline).await,
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

    pub fn is_leader(&self) -> bool {
        matches!(self.leader(), Some((id, _)) if id == self.id)
    }

    /// One attempt at a request that only the leader answers: `Here` when
    /// this node leads (the caller answers it), else the leader's reply.
    /// `Retry` (after waiting for a change, up to `deadline`) when there is
    /// no leader or it cannot be reached: nothing was delivered. A reply
    /// sent but lost is an error, since its effect is unknown.
    ///
    /// A request in flight to a leader that is replaced meanwhile is
    /// dropped and `Retry` returned: every request routed this way may be
    /// asked twice (read-index, heartbeats).
    pub async fn route(&self, req: &ForwardRequest, deadline: Instant) -> Result<Routed> {
        match self.leader_in_term() {
            Some((id, _, _)) if id == self.id => Ok(Routed::Here),
            Some(leader) => {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.forward_to_leader(&leader, req, left).await {
                    None | Some(Ok(Ok(ForwardReply::NotLeader(_)))) | Some(Err(PeerError::Unreachable { .. })) => Ok(Routed::Retry),
                    Some(Ok(Ok(reply))) => Ok(Routed::Reply(reply)),
                    Some(Ok(Err(e))) => Err(e),
                    Some(Err(e)) => Err(Error::unavailable(e.to_string())),
                }
            }
            None => Ok(Routed::Retry),
        }
    }

    /// A backup file (`store::backup`) of the applied state at one revision:
    /// with `Linearizable`, at least as new as every write acknowledged
    /// before the call.
    pub async fn backup(&self, consistency: Consistency) -> Result<Backup> {
        let applied = self.read(consistency).await?;
        let (revision, objects) = (applied.revision(), applied.state.objects.len());
        let id = self.id;
        let bytes = tokio::task::spawn_blocking(move || crate::store::backup::encode(&applied, id))
            .await
            .map_err(|e| Error::internal(format!("encoding the backup: {e}")))?;
        Ok(Backup { revision, objects, bytes })
    }

    /// Leader side of read-index: confirm leadership with a quorum. `None`
    /// when this node turns out not to be the leader.
    ///
    /// Upstream openraft 0.9 lets a leader that restarts keep its term (its
    /// vote is committed), and then takes the read index from the commit
    /// index it persisted, which may lag what it had acknowledged: a write
    /// answered just before a crash of the whole cluster could be missing
    /// from a linearizable read just after. Ours (`vendor/openraft`) starts a
    /// former leader as a follower instead; the floor stays as a cheap
    /// guard: this leader's log holds every entry proposed in its term, so
    /// the read index is also at least its last log index as this process
    /// first saw it while leading in this term. (A newly elected leader's
    /// own first entry is past that anyway.)
    async fn leader_read_index(&self) -> Result<Option<u64>> {
        let floor = {
            let m = self.raft.metrics().borrow().clone();
            let mut floor = self.read_floor.lock().unwrap_or_else(|p| p.into_inner());
            match *floor {
                Some((term, index)) if term == m.current_term => index,
                _ => {
                    let index = m.last_log_index.unwrap_or(0);
                    *floor = Some((m.current_term, index));
                    index
                }
            }
        };
        match self.raft.ensure_linearizable().await {
            Ok(log_id) => Ok(Some(log_id.map_or(0, |l| l.index).max(floor))),
            Err(RaftError::APIError(_)) => Ok(None),
            Err(e) => Err(Error::unavailable(format!("raft: {e}"))),
        }
    }

    /// Serve a request forwarded by a follower. Never forwards again: a node
    /// that is not the leader says so and the follower retries.
    pub async fn handle_forward(&self, req: ForwardRequest) -> Result<ForwardReply> {
        let not_leader = || ForwardReply::NotLeader(self.raft.metrics().borrow().current_leader);
        match req {
            // Answered at once when this node does not lead: queueing first
            // could wait behind this node's own batch being forwarded, maybe
            // to the very follower that is asking.
            ForwardRequest::Write(_) if !self.is_leader() => Ok(not_leader()),
            // Joins the local queue, so it shares a raft entry with whatever
            // else is waiting, from this node's clients or other followers.
            ForwardRequest::Write(Command::Batch(txns)) => match self.enqueue(txns, true, None).await {
                Outcome::Committed(results) => Ok(ForwardReply::Write(results)),
                Outcome::NotLeader => Ok(not_leader()),
                Outcome::Failed(e) => Err(e),
            },
            // A replica sends one group per forward; several are served
            // side by side, each atomic in its entry, results in order.
            ForwardRequest::Write(Command::Groups(groups)) => {
                let outcomes = futures::future::join_all(groups.into_iter().map(|g| self.enqueue(g.txns, true, g.id))).await;
                let mut results = Vec::new();
                for outcome in outcomes {
                    match outcome {
                        Outcome::Committed(r) => results.extend(r),
                        Outcome::NotLeader => return Ok(not_leader()),
                        Outcome::Failed(e) => return Err(e),
                    }
                }
                Ok(ForwardReply::Write(results))
            }
            // Only a leader stamps entries, when it proposes them.
            ForwardRequest::Write(Command::Stamped { .. }) => Err(Error::invalid("a stamped write is proposed by the leader, never forwarded to it")),
            ForwardRequest::ReadIndex => Ok(match self.leader_read_index().await? {
                Some(i) => ForwardReply::ReadIndex(i),
                None => not_leader(),
            }),
            // The replica's helpers answer these (`Replica::handle_peer`).
            ForwardRequest::Heartbeat(_) | ForwardRequest::Convergence(_) => {
                Err(Error::internal("heartbeats and convergence are answered by the replica, not the node"))
            }
            ForwardRequest::Version(v) => {
                self.versions.heard(&v);
                Ok(ForwardReply::Version(self.versions.hello(&self.member_ids())))
            }
            ForwardRequest::AddNode { id, info } => self.leader_add_node(id, info).await,
            ForwardRequest::RemoveNode { id } => self.leader_remove_node(id).await,
        }
    }

    async fn leader_add_node(&self, id: NodeId, info: NodeInfo) -> Result<ForwardReply> {
        // A joiner that cannot read what the cluster writes is refused
        // before it is a member (`version::admit_joiner`).
        version::admit_joiner(self, id, &info.raft_addr).await?;
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
                Some((leader, info)) => match self.peers.forward(leader, &info.raft_addr, &req, Duration::from_secs(60)).await {
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

    /// This replica's raft and store position; the replica adds its xDS
    /// streams and readiness (`Replica::local_status`).
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
            xds_streams: 0,
            ready: false,
        }
    }

    /// The members as the local membership config has them: (id, address,
    /// voter).
    pub fn members(&self) -> Vec<(NodeId, NodeInfo, bool)> {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership.nodes().map(|(id, n)| (*id, n.clone(), voters.contains(id))).collect()
    }
}

/// Where [`Node::route`] sent a request.
pub enum Routed {
    /// This node leads: answer here.
    Here,
    /// The leader's answer.
    Reply(ForwardReply),
    /// No leader, or unreachable: nothing delivered; ask again.
    Retry,
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

/// Refuse a transaction that would store a Secret's private key in the
/// clear (`model::secret::check_sealed`): the API seals keys first
/// (the root's `secrets::seal_txn`).
fn unsealed_secrets(txn: &Txn) -> Result<()> {
    for op in &txn.ops {
        if let crate::store::Op::Put { key, body, .. } = op {
            if key.kind == crate::model::Kind::Secret {
                let value: serde_json::Value = serde_json::from_str(body).map_err(|e| Error::internal(format!("{key}: the body does not parse: {e}")))?;
                crate::model::secret::check_sealed(&value).map_err(|why| Error::internal(format!("{key}: {why}")))?;
            }
        }
    }
    Ok(())
}

fn op_bytes(op: &crate::store::Op) -> usize {
    match op {
        crate::store::Op::Put { body, .. } => body.len(),
        crate::store::Op::SetStatus { status, .. } | crate::store::Op::Status { status, .. } => status.len() + 64,
        crate::store::Op::Delete { .. } => 64,
        crate::store::Op::Author(a) => a.name.len() + a.message.as_ref().map_or(0, String::len),
    }
}

fn fail(batch: Vec<Pending>, e: Error) {
    for p in batch {
        let _ = p.reply.send(Outcome::Failed(e.clone()));
    }
}

/// Hand each group its slice of the entry's results.
fn deliver(batch: Vec<Pending>, results: Result<Vec<TxnResult>>) {
    let n: usize = batch.iter().map(|p| p.txns.len()).sum();
    match results {
        Ok(results) if results.len() == n => {
            let mut results = results.into_iter();
            for p in batch {
                let mine = results.by_ref().take(p.txns.len()).collect();
                let _ = p.reply.send(Outcome::Committed(mine));
            }
        }
        Ok(results) => fail(batch, Error::internal(format!("raft returned {} results for {n} transactions", results.len()))),
        Err(e) => fail(batch, e),
    }
}

/// Coalesce queued groups into raft entries, a few in flight at once.
/// Under load, requests queue while a permit is awaited, so batches grow
/// exactly when batching pays off; an isolated write goes out alone at once.
///
/// Group commit: when the last batch was answered, its clients send their
/// next writes within a fraction of a millisecond, just after the queue was
/// taken. So a batch that has fewer transactions than the last one waits,
/// at most `wait`, for that many: the returning writes share this entry
/// instead of waiting a whole round for the next. A lone writer (the last
/// batch under [`GROUP_MIN_TXNS`]) never waits; when load drops, the first
/// short batch waits once and sets the smaller target. At 64 clients this
/// took batches from 20 to 32 writes per entry (`lodestar bench write`);
/// a 5 ms bound instead of 2 ms, from 43 to 56 (ARCHITECTURE.md, Decisions).
async fn batcher(node: Weak<Node>, mut rx: mpsc::Receiver<Pending>, wait: Duration) {
    let permits = Arc::new(Semaphore::new(MAX_INFLIGHT_BATCHES));
    let mut last_txns = 0;
    while let Some(first) = rx.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else { return };
        let (mut txns, mut bytes) = (first.txns.len(), first.bytes);
        let mut batch = vec![first];
        while txns < MAX_BATCH_TXNS && bytes < MAX_BATCH_BYTES {
            match rx.try_recv() {
                Ok(p) => {
                    txns += p.txns.len();
                    bytes += p.bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        if !wait.is_zero() && last_txns >= GROUP_MIN_TXNS && txns < last_txns {
            let deadline = tokio::time::Instant::now() + wait;
            while txns < last_txns && txns < MAX_BATCH_TXNS && bytes < MAX_BATCH_BYTES {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(p)) => {
                        txns += p.txns.len();
                        bytes += p.bytes;
                        batch.push(p);
                    }
                    _ => break,
                }
            }
        }
        last_txns = txns;
        let Some(node) = node.upgrade() else { return };
        tokio::spawn(async move {
            let _permit = permit;
            node.run_batch(batch).await;
        });
    }
}
