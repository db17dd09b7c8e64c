//! Registry health at run time: TTLs, leases and probes.
//!
//! Decisions are writes: every change of an Instance's health, every
//! expiry, is committed through raft like any other write, so every replica
//! agrees on it and Envoys see it at one revision.
//!
//! - **TTLs and leases** ([`reaper`]): heartbeats (Instance TTL checks) and
//!   keepalives (Leases) go to the leader, through any replica, and live in
//!   the leader's memory only ([`Heartbeats`]), not in the log. Only the
//!   leader expires. The rule that keeps expiry safe across elections
//!   (etcd's, for its leases): a leader counts every TTL as renewed at the
//!   moment it became leader, so a heartbeat that went to the old leader is
//!   never needed. An instance that keeps heartbeating within its TTL is
//!   therefore never expired by an election; one that stopped is expired at
//!   most one TTL later than it would have been. Registration (creation)
//!   counts as a heartbeat.
//! - **Probes** ([`prober`]): HTTP and TCP checks run on the replicas,
//!   spread by rendezvous hashing of the instance over the voters that
//!   answer their peers (each replica computes the same assignment from the
//!   same membership and liveness, with no coordination; a replica that
//!   stops answering has its checks taken over within seconds). A replica
//!   writes only transitions, and records itself in `status.checkedBy`.
//!   `GET /debug/checks` shows what this replica probes.
//! - **Deregistration** (`healthCheck.deregisterAfter`) is the leader's: an
//!   instance unhealthy that long (counted, like TTLs, from no earlier than
//!   the leader's election) is deleted.

pub mod probe;

use crate::error::{Error, Result};
use crate::model::registry::{HealthState, InstanceStatus};
use crate::model::{Kind, ResourceKey, StoredObject, TypedSpec};
use crate::node::{Consistency, ForwardReply, ForwardRequest, Node, Routed};
use crate::store::types::{Op, Txn};
use openraft::ServerState;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// How often the leader looks for expired TTLs and leases.
const REAP_EVERY: Duration = Duration::from_millis(200);

/// When each Instance / Lease was last renewed on this node (as leader).
#[derive(Default)]
pub struct Heartbeats {
    last: Mutex<HashMap<ResourceKey, Instant>>,
}

impl Heartbeats {
    pub fn record(&self, key: ResourceKey) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Instant::now());
    }

    fn get(&self, key: &ResourceKey) -> Option<Instant> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).get(key).copied()
    }

    fn retain(&self, keep: impl Fn(&ResourceKey) -> bool) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).retain(|k, _| keep(k));
    }
}

/// Renew an Instance's TTL or a Lease: recorded by the leader, which alone
/// decides expiry ([`reaper`]), through any replica. Returns the TTL renewed.
pub async fn heartbeat(node: &Node, heartbeats: &Heartbeats, key: ResourceKey) -> Result<Duration> {
    let deadline = Instant::now() + node.write_timeout();
    let req = ForwardRequest::Heartbeat(key.clone());
    loop {
        if Instant::now() >= deadline {
            return Err(Error::unavailable("no leader within the timeout"));
        }
        match node.route(&req, deadline).await? {
            Routed::Here => return leader_heartbeat(node, heartbeats, &key).await,
            Routed::Reply(ForwardReply::Heartbeat { ttl_ms }) => return Ok(Duration::from_millis(ttl_ms)),
            Routed::Reply(_) | Routed::Retry => node.wait_for_change(deadline).await,
        }
    }
}

/// The leader's side of [`heartbeat`], also for heartbeats a follower
/// forwarded (the caller checks that this node leads).
pub async fn leader_heartbeat(node: &Node, heartbeats: &Heartbeats, key: &ResourceKey) -> Result<Duration> {
    let mut applied = node.reader().current();
    if applied.state.get(key).is_none() {
        // A new leader may not have applied everything committed yet.
        applied = node.read(Consistency::Linearizable).await?;
    }
    let obj = applied.state.get(key).ok_or_else(|| Error::not_found(format!("{key} not found")))?;
    let ttl = ttl_of(obj).ok_or_else(|| Error::invalid(format!("{key} has no TTL health check: nothing to heartbeat")))?;
    heartbeats.record(key.clone());
    Ok(ttl)
}

/// The TTL a heartbeat renews: a Lease's, or an Instance's TTL check's.
pub fn ttl_of(obj: &StoredObject) -> Option<Duration> {
    match obj.typed().ok()?.as_ref() {
        TypedSpec::Lease(l) => Some(l.ttl()),
        TypedSpec::Instance(i) => i.health_check.as_ref()?.ttl(),
        _ => None,
    }
}

pub fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub fn status_json(health: HealthState, reason: impl Into<String>, checked_by: u64) -> String {
    let status = InstanceStatus { health, reason: reason.into(), checked_by: Some(checked_by), since_unix_ms: now_unix_ms() };
    serde_json::to_string(&status).expect("status serialises")
}

/// The leader's expiry loop. Runs on every replica; acts only while leader.
pub async fn reaper(node: Arc<Node>, heartbeats: Arc<Heartbeats>, mut shutdown: watch::Receiver<bool>) {
    let mut reaper = Reaper::default();
    let mut tick = tokio::time::interval(REAP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let ops = reaper.due(&node, &heartbeats, Instant::now());
        if ops.is_empty() {
            continue;
        }
        // One transaction each, so that one that lost a race (the object
        // changed meanwhile) does not hold back the others; the batcher
        // still commits them in one raft entry.
        let writes = ops.into_iter().map(|(why, op)| {
            let node = node.clone();
            async move {
                let key = op.key().map_or_else(String::new, |k| k.to_string());
                match node.write(Txn { ops: vec![op] }).await {
                    Ok(ok) => tracing::info!(%key, revision = ok.revision, why, "registry: expiry committed"),
                    Err(e) => tracing::debug!(%key, error = %e, why, "registry: expiry not committed"),
                }
            }
        });
        let stop = shutdown.clone();
        tokio::select! {
            _ = futures::future::join_all(writes) => {}
            _ = async move { let mut s = stop; let _ = s.wait_for(|s| *s).await; } => return,
        }
    }
}

#[derive(Default)]
struct Reaper {
    /// The term this node leads in, and since when.
    leading: Option<(u64, Instant)>,
    /// When this leader first saw each object (by create revision): creation
    /// counts as a heartbeat.
    first_seen: HashMap<ResourceKey, (u64, Instant)>,
    /// When this leader first saw each instance unhealthy.
    unhealthy_seen: HashMap<ResourceKey, Instant>,
}

impl Reaper {
    /// The writes due now: expired leases (deleting their instances with
    /// them), TTL transitions, deregistrations.
    fn due(&mut self, node: &Node, heartbeats: &Heartbeats, now: Instant) -> Vec<(&'static str, Op)> {
        let m = node.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            self.leading = None;
            self.first_seen.clear();
            self.unhealthy_seen.clear();
            return Vec::new();
        }
        let since = match self.leading {
            Some((term, since)) if term == m.current_term => since,
            _ => {
                tracing::info!(term = m.current_term, "registry: leading; every TTL and lease counts as renewed now");
                self.leading = Some((m.current_term, now));
                self.unhealthy_seen.clear();
                now
            }
        };
        let applied = node.reader().current();
        let objects = &applied.state.objects;
        let mut ops = Vec::new();
        let mut present = std::collections::HashSet::new();
        let range = |kind: Kind| objects.range(ResourceKey::new(kind, "", "")..).take_while(move |(k, _)| k.kind == kind);
        for (key, obj) in range(Kind::Lease).chain(range(Kind::Instance)) {
            present.insert(key.clone());
            let first = match self.first_seen.get(key) {
                Some((create, at)) if *create == obj.create_revision => *at,
                _ => {
                    self.first_seen.insert(key.clone(), (obj.create_revision, now));
                    now
                }
            };
            let renewed = [Some(since), Some(first), heartbeats.get(key)].into_iter().flatten().max().unwrap_or(now);
            let expired = ttl_of(obj).map(|ttl| now.duration_since(renewed) > ttl);
            if key.kind == Kind::Lease {
                if expired == Some(true) {
                    ops.push(("lease expired", Op::Delete { key: key.clone(), expected_revision: Some(obj.mod_revision), ignore_missing: true }));
                }
                continue;
            }
            let status = InstanceStatus::of(obj.body());
            let unhealthy = status.as_ref().is_some_and(|s| s.health == HealthState::Unhealthy);
            match expired {
                Some(true) if !unhealthy => {
                    let ttl = ttl_of(obj).unwrap_or_default();
                    let status = status_json(HealthState::Unhealthy, format!("TTL of {ttl:?} expired: no heartbeat"), node.id);
                    ops.push(("ttl expired", Op::SetStatus { key: key.clone(), status, expected_revision: Some(obj.mod_revision) }));
                }
                Some(false) if unhealthy => {
                    let status = status_json(HealthState::Healthy, "heartbeat", node.id);
                    ops.push(("heartbeat resumed", Op::SetStatus { key: key.clone(), status, expected_revision: Some(obj.mod_revision) }));
                }
                _ => {}
            }
            if !unhealthy {
                self.unhealthy_seen.remove(key);
                continue;
            }
            let after = match obj.typed().ok().map(|t| t.as_ref()) {
                Some(TypedSpec::Instance(i)) => i.health_check.as_ref().and_then(|c| c.deregister_after()),
                _ => None,
            };
            let Some(after) = after else { continue };
            let seen = *self.unhealthy_seen.entry(key.clone()).or_insert(now);
            if now.duration_since(seen.max(since)) > after {
                ops.push(("deregister after unhealthy", Op::Delete { key: key.clone(), expected_revision: Some(obj.mod_revision), ignore_missing: true }));
            }
        }
        self.first_seen.retain(|k, _| present.contains(k));
        self.unhealthy_seen.retain(|k, _| present.contains(k));
        heartbeats.retain(|k| present.contains(k));
        ops
    }
}

/// What one replica probes, as `/debug/checks` shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckStatus {
    pub instance: String,
    pub target: String,
    pub interval_ms: u64,
    pub last_result: Option<String>,
    pub last_probe_unix_ms: Option<u64>,
    pub consecutive_failures: u32,
    pub consecutive_successes: u32,
}

/// The replica's probe assignments and their last results.
#[derive(Clone, Default)]
pub struct Checks {
    inner: Arc<Mutex<ChecksInner>>,
}

#[derive(Default)]
struct ChecksInner {
    live_voters: Vec<u64>,
    checks: BTreeMap<ResourceKey, CheckStatus>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChecksView {
    pub node: u64,
    /// The voters this replica counts as alive (the probing is spread over them).
    pub live_voters: Vec<u64>,
    pub checks: Vec<CheckStatus>,
}

impl Checks {
    fn lock(&self) -> std::sync::MutexGuard<'_, ChecksInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn view(&self, node: u64) -> ChecksView {
        let g = self.lock();
        ChecksView { node, live_voters: g.live_voters.clone(), checks: g.checks.values().cloned().collect() }
    }
}

pub use probe::prober;
