//! High availability for xDS: readiness, fencing, and spreading Envoys over
//! the replicas.
//!
//! - **Readiness** (`GET /readyz`, and admission of new xDS streams): a
//!   replica is ready when it has confirmed, within the last
//!   `ready_max_lag_ms`, that it is current: it obtained the leader's commit
//!   index (a read-index, which the leader confirms with a quorum) and has
//!   applied up to it. [`freshness`] does that every 250 ms. A replica that
//!   is starting, or cut off from the quorum, stops being ready within the
//!   bound; it opens no new xDS stream, and its existing streams keep the
//!   config they have (nothing newer reaches it to push).
//! - **Fencing** (`Fence` for `Replica`, from [`confirm_current`]): a reconnecting Envoy (SotW
//!   `version_info` or delta `initial_resource_versions` set) is answered
//!   only after a barrier, a read-index taken when it connects and applied
//!   here, so nothing it receives is older than what it ACKed, from any
//!   replica. If the barrier cannot complete within `xds_fence_timeout_ms`,
//!   the stream is refused (UNAVAILABLE) and the Envoy, which keeps its
//!   config, reconnects elsewhere.
//! - **Spread** ([`gossip`], [`rebalance`]): every replica asks every
//!   member for its status (which carries its xDS stream count and
//!   readiness) each second, over the raft port: no writes. A replica with
//!   more than its fair share (`ceil(total / ready replicas)`) sheds the
//!   excess, at most `max(1, fair / 20)` streams per second, oldest first;
//!   the Envoys reconnect, round robin over the replicas in their bootstrap.
//!   `xds_max_stream_age_s` (± 10% jitter) is the backstop.

use crate::node::{Consistency, Node, NodeStatus};
use crate::store::types::NodeId;
use openraft::ServerState;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

const FRESHNESS_EVERY: Duration = Duration::from_millis(250);
const GOSSIP_EVERY: Duration = Duration::from_secs(1);
/// A peer not heard from for this long is counted as gone.
const PEER_STALE: Duration = Duration::from_secs(3);

#[derive(Default)]
pub struct HaState {
    /// When the newest read-index that is now applied here was requested.
    confirmed_at: Mutex<Option<Instant>>,
    last_error: Mutex<Option<String>>,
    /// The last status each peer answered, and when.
    peers: Mutex<BTreeMap<NodeId, (NodeStatus, Instant)>>,
    /// Whether one round of asking the peers has completed.
    gossiped: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HaState {
    /// How long ago this replica last confirmed it was current.
    pub fn confirmed_ago(&self) -> Option<Duration> {
        lock(&self.confirmed_at).map(|t| t.elapsed())
    }

    pub fn last_error(&self) -> Option<String> {
        lock(&self.last_error).clone()
    }

    /// Until the first round of gossip, this replica does not know who is
    /// alive (work spread over the live voters waits for it).
    pub fn gossiped(&self) -> bool {
        self.gossiped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Peers heard from recently, with their last status.
    pub fn live_peers(&self) -> Vec<NodeStatus> {
        lock(&self.peers).values().filter(|(_, at)| at.elapsed() < PEER_STALE).map(|(s, _)| s.clone()).collect()
    }

    /// Ready to serve: a leader is known, and within the last
    /// `ready_max_lag_ms` this replica applied a commit index it obtained
    /// from the leader (confirmed by a quorum).
    pub fn readiness(&self, node: &Node, bound: Duration) -> Result<(), String> {
        let m = node.metrics().borrow().clone();
        if m.current_leader.is_none() {
            return Err("no known leader".into());
        }
        if !matches!(m.state, ServerState::Leader | ServerState::Follower | ServerState::Learner) {
            return Err(format!("raft state is {:?}", m.state));
        }
        let why = || self.last_error().map(|e| format!(": {e}")).unwrap_or_default();
        match self.confirmed_ago() {
            Some(ago) if ago <= bound => Ok(()),
            Some(ago) => Err(format!("last confirmed current {} ms ago (bound {} ms){}", ago.as_millis(), bound.as_millis(), why())),
            None => Err(format!("not yet confirmed current with the leader{}", why())),
        }
    }

    /// This node plus the voters heard from recently; empty until the
    /// first round of gossip completes.
    pub fn live_voters(&self, node: &Node) -> Vec<NodeId> {
        if !self.gossiped() {
            return Vec::new();
        }
        let voters: BTreeSet<NodeId> = node.members().into_iter().filter(|(_, _, voter)| *voter).map(|(id, _, _)| id).collect();
        let mut live: Vec<NodeId> = self.live_peers().iter().map(|p| p.id).filter(|id| voters.contains(id)).collect();
        if voters.contains(&node.id) {
            live.push(node.id);
        }
        live.sort();
        live
    }
}

/// Keep confirming that this replica is current (see the module docs).
/// `bound`: `ready_max_lag_ms`.
pub async fn freshness(node: Arc<Node>, ha: Arc<HaState>, bound: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(FRESHNESS_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let asked = Instant::now();
        match confirm_current(&node, bound).await {
            Ok(()) => {
                *lock(&ha.confirmed_at) = Some(asked);
                *lock(&ha.last_error) = None;
            }
            Err(e) => *lock(&ha.last_error) = Some(e),
        }
    }
}

/// Ask every other member for its status each second.
pub async fn gossip(node: Arc<Node>, ha: Arc<HaState>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(GOSSIP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let m = node.metrics().borrow().clone();
        let membership = m.membership_config.membership().clone();
        let asks = membership.nodes().filter(|(id, _)| **id != node.id).map(|(id, info)| {
            let (peers, addr, id) = (node.peers(), info.raft_addr.clone(), *id);
            async move { (id, peers.status(id, &addr, Duration::from_millis(500)).await.ok()) }
        });
        let answers = futures::future::join_all(asks).await;
        let now = Instant::now();
        let mut peers = lock(&ha.peers);
        for (id, status) in answers {
            if let Some(s) = status {
                peers.insert(id, (s, now));
            }
        }
        peers.retain(|id, _| membership.get_node(id).is_some());
        ha.gossiped.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// How many streams this replica should shed now: its excess over the fair
/// share among ready replicas, at most `max(1, fair / 20)` at a time.
pub fn excess(mine: usize, ready_peer_streams: &[usize]) -> usize {
    let total: usize = mine + ready_peer_streams.iter().sum::<usize>();
    let replicas = ready_peer_streams.len() + 1;
    let fair = total.div_ceil(replicas);
    mine.saturating_sub(fair).min((fair / 20).max(1))
}

/// Shed streams above the fair share, once a second.
/// `every`: `xds_rebalance_interval_ms`; `bound`: `ready_max_lag_ms`.
pub async fn rebalance(
    node: Arc<Node>,
    ha: Arc<HaState>,
    sync: crate::xds::SyncRegistry,
    every: Duration,
    bound: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        if ha.readiness(&node, bound).is_err() {
            continue;
        }
        let peers: Vec<usize> = ha.live_peers().iter().filter(|p| p.ready).map(|p| p.xds_streams as usize).collect();
        let n = excess(sync.len(), &peers);
        if n > 0 {
            let shed = sync.shed(n);
            tracing::info!(mine = sync.len(), peers = %crate::logging::list(&peers), shed = shed.len(), "xDS: shedding streams above the fair share");
        }
    }
}

/// Within `bound`, obtain the leader's commit index (a read-index the
/// leader confirms with a quorum) and apply up to it here.
pub async fn confirm_current(node: &Node, bound: Duration) -> Result<(), String> {
    match tokio::time::timeout(bound, node.read(Consistency::Linearizable)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("not confirmed current within {bound:?}")),
    }
}

/// Raft's state as metrics, and leader changes counted.
pub async fn raft_metrics(node: Arc<Node>, mut shutdown: watch::Receiver<bool>) {
    let mut rx = node.metrics();
    let mut leader = None;
    let m = crate::metrics::metrics();
    loop {
        {
            let r = rx.borrow_and_update().clone();
            m.raft_term.set(r.current_term as i64);
            m.raft_last_log_index.set(r.last_log_index.unwrap_or(0) as i64);
            let applied = r.last_applied.map_or(0, |l| l.index);
            m.raft_applied_index.set(applied as i64);
            m.raft_commit_index.set(commit_index(&r).unwrap_or(applied) as i64);
            m.raft_is_leader.set((r.current_leader == Some(node.id)) as i64);
            if r.current_leader.is_some() && r.current_leader != leader {
                if leader.is_some() {
                    m.raft_leader_changes.inc();
                }
                leader = r.current_leader;
            }
            m.store_revision.set(node.reader().current().revision() as i64);
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
    }
}

/// On the leader, the highest log index a quorum of voters has: the
/// leader's own last index counts as matched (it replicates only what it
/// has appended). None elsewhere: a follower's metrics carry no commit index.
fn commit_index(r: &openraft::RaftMetrics<crate::store::NodeId, crate::store::NodeInfo>) -> Option<u64> {
    let replication = r.replication.as_ref()?;
    let mut matched: Vec<u64> = r
        .membership_config
        .membership()
        .voter_ids()
        .map(|id| if id == r.id { r.last_log_index.unwrap_or(0) } else { replication.get(&id).copied().flatten().map_or(0, |l| l.index) })
        .collect();
    if matched.is_empty() {
        return None;
    }
    matched.sort_unstable_by(|a, b| b.cmp(a));
    Some(matched[matched.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::excess;

    #[test]
    fn sheds_only_above_the_fair_share_and_at_a_bounded_rate() {
        assert_eq!(excess(3, &[3, 0]), 1); // 6 over 3: fair 2
        assert_eq!(excess(2, &[2, 2]), 0);
        assert_eq!(excess(3, &[2, 2]), 0); // 7 over 3: fair 3
        assert_eq!(excess(0, &[3, 3]), 0);
        assert_eq!(excess(5, &[]), 0); // alone
        assert_eq!(excess(6000, &[3000, 0]), 150); // fair 3000: 150 a tick
    }
}
