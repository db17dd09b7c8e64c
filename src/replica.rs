//! A replica: the core [`Node`] with the helpers around it. This is what
//! the API, the xDS server and the peer service are handed.
//!
//! The arrows point one way: `api`, `peer`, `server` → `replica` →
//! {`ha`, `health`, `xds::status`} → `node` → `store`. `Node` (writes,
//! reads, membership) knows nothing of readiness, stream spread, health
//! probes or the peer transport (it reaches peers through
//! `node::Transport`, which `peer` implements); the helpers depend on it,
//! and this module puts them side by side and answers what needs more than
//! one of them: a replica's status, the requests peers send for the
//! helpers (heartbeats, proxy convergence), waiting for proxies.

/// Every member as this replica sees it (`cluster status`; its JSON view:
/// `api::views::ClusterStatusView`).
#[derive(Debug, Clone)]
pub struct ClusterStatus {
    pub leader: Option<crate::store::types::NodeId>,
    pub term: u64,
    pub members: Vec<MemberStatus>,
    /// The cluster version as this replica sees it (`node::version`).
    pub version: crate::node::version::ClusterVersion,
}

#[derive(Debug, Clone)]
pub struct MemberStatus {
    pub id: crate::store::types::NodeId,
    pub info: crate::store::types::NodeInfo,
    /// voter | learner
    pub role: String,
    /// None when the member did not answer.
    pub status: Option<NodeStatus>,
    pub error: Option<String>,
    /// The wire versions it supports, as last heard (None: never heard).
    pub versions: Option<crate::node::version::Known>,
}

use crate::auth::Acl;
use crate::config::ServerConfig;
use crate::error::Result;
use crate::ha::HaState;
use crate::health::{Checks, Heartbeats};
use crate::model::ResourceKey;
use crate::node::{ForwardReply, ForwardRequest, Node, NodeStatus, WaitReport};
use crate::secrets::SecretsKey;
use crate::xds::status::Convergence;
use crate::xds::SyncRegistry;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Replica {
    pub node: Arc<Node>,
    /// Readiness and peers' status (`ha`).
    pub ha: Arc<HaState>,
    /// Leader side of TTLs and leases: when each was last renewed here.
    pub heartbeats: Arc<Heartbeats>,
    /// This replica's probe assignments (`/debug/checks`).
    pub checks: Checks,
    /// Connected xDS streams and their sync state (`/debug/syncz`).
    pub sync: SyncRegistry,
    /// Who may use the API, and the audit log (`auth`).
    pub acl: Arc<Acl>,
    /// The server's settings.
    pub config: Arc<ServerConfig>,
    /// The cluster secrets key, if this replica has one: the API and the
    /// adapters seal Secrets' private keys with it before writing
    /// (`secrets::seal_txn`).
    pub secrets: Option<Arc<SecretsKey>>,
    /// The xDS server's generator: dry runs translate on a fork of it
    /// (`Generator::fork`), from each proxy's served config.
    pub generator: Option<Arc<dyn crate::xds::resources::Generator>>,
}

impl Replica {
    pub fn new(node: Arc<Node>, acl: Arc<Acl>, config: Arc<ServerConfig>, secrets: Option<Arc<SecretsKey>>) -> Arc<Replica> {
        Self::serving(node, acl, config, secrets, None)
    }

    /// As `new`, with the xDS server's generator (for dry runs).
    pub fn serving(
        node: Arc<Node>,
        acl: Arc<Acl>,
        config: Arc<ServerConfig>,
        secrets: Option<Arc<SecretsKey>>,
        generator: Option<Arc<dyn crate::xds::resources::Generator>>,
    ) -> Arc<Replica> {
        let (ha, heartbeats, checks, sync) = Default::default();
        Arc::new(Replica { node, ha, heartbeats, checks, sync, acl, config, secrets, generator })
    }

    /// Ready to serve (see `ha`).
    pub fn readiness(&self) -> std::result::Result<(), String> {
        self.ha.readiness(&self.node, Duration::from_millis(self.config.ready_max_lag_ms))
    }

    /// This replica's view of itself, as peers and `cluster status` see it.
    pub fn local_status(&self) -> NodeStatus {
        NodeStatus { xds_streams: self.sync.len() as u64, ready: self.readiness().is_ok(), ..self.node.local_status() }
    }

    /// Members from the local membership config, each asked for its status.
    pub async fn cluster_status(&self) -> ClusterStatus {
        let m = self.node.metrics().borrow().clone();
        let asks = self.node.members().into_iter().map(|(id, info, voter)| {
            let role = if voter { "voter" } else { "learner" }.to_string();
            let local = (id == self.node.id).then(|| self.local_status());
            async move {
                let (status, error) = match local {
                    Some(s) => (Some(s), None),
                    None => match self.node.peers().status(id, &info.raft_addr, Duration::from_millis(1000)).await {
                        Ok(s) => (Some(s), None),
                        Err(e) => (None, Some(e.to_string())),
                    },
                };
                let versions = self.node.versions().known(id);
                MemberStatus { id, info, role, status, error, versions }
            }
        });
        let members = futures::future::join_all(asks).await;
        ClusterStatus { leader: m.current_leader, term: m.current_term, members, version: self.node.cluster_version() }
    }

    /// Renew an Instance's TTL or a Lease (see `health`).
    pub async fn heartbeat(&self, key: ResourceKey) -> Result<Duration> {
        crate::health::heartbeat(&self.node, &self.heartbeats, key).await
    }

    /// Answer a request from another replica: the node's own, or one for
    /// the helpers.
    pub async fn handle_peer(&self, req: ForwardRequest) -> Result<ForwardReply> {
        match req {
            ForwardRequest::Heartbeat(key) if self.node.is_leader() => {
                let ttl = crate::health::leader_heartbeat(&self.node, &self.heartbeats, &key).await?;
                Ok(ForwardReply::Heartbeat { ttl_ms: ttl.as_millis() as u64 })
            }
            ForwardRequest::Heartbeat(_) => Ok(ForwardReply::NotLeader(self.node.metrics().borrow().current_leader)),
            ForwardRequest::Convergence(revision) => Ok(ForwardReply::Convergence(self.local_convergence(revision))),
            req => self.node.handle_forward(req).await,
        }
    }

    /// How this replica's proxies stand against `revision`.
    pub fn local_convergence(&self, revision: u64) -> WaitReport {
        let id = self.node.id;
        let mut report = WaitReport { revision, ..Default::default() };
        // A status-only revision pushes nothing: its configs are those of
        // the last revision pushed (`xds::push::debounce`).
        let config_revision = self.sync.config_revision(revision);
        for p in self.sync.snapshot().proxies {
            report.proxies += 1;
            match p.convergence(config_revision) {
                Convergence::Synced => report.synced += 1,
                Convergence::Pending => report.pending.push(format!("{} (replica {id})", p.id)),
                Convergence::Nacked(t, e) => report.nacked.push(format!("{} (replica {id}) rejected {t}: {e}", p.id)),
            }
        }
        report.converged = report.pending.is_empty() && report.nacked.is_empty();
        report
    }

    /// Wait (at most `timeout`) until every proxy connected to any replica
    /// has ACKed `revision` or newer (see `ProxyStatus::convergence`), or
    /// one rejected it. A replica that does not answer is reported.
    pub async fn wait_for_proxies(&self, revision: u64, timeout: Duration) -> WaitReport {
        let deadline = Instant::now() + timeout;
        loop {
            let asks = self.node.members().into_iter().map(|(id, info, _)| async move {
                if id == self.node.id {
                    return Ok(self.local_convergence(revision));
                }
                match self.node.peers().forward(id, &info.raft_addr, &ForwardRequest::Convergence(revision), Duration::from_secs(1)).await {
                    Ok(Ok(ForwardReply::Convergence(r))) => Ok(r),
                    Ok(Ok(_)) => Err(format!("replica {id}: unexpected reply")),
                    Ok(Err(e)) => Err(format!("replica {id}: {e}")),
                    Err(e) => Err(format!("replica {id}: {e}")),
                }
            });
            let mut report = WaitReport { revision, ..Default::default() };
            for r in futures::future::join_all(asks).await {
                match r {
                    Ok(r) => {
                        report.proxies += r.proxies;
                        report.synced += r.synced;
                        report.pending.extend(r.pending);
                        report.nacked.extend(r.nacked);
                    }
                    Err(e) => report.unreachable.push(e),
                }
            }
            report.converged = report.pending.is_empty() && report.nacked.is_empty();
            if report.converged || !report.nacked.is_empty() || Instant::now() >= deadline {
                return report;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// New xDS streams open only on a ready replica; a reconnecting Envoy
/// first passes a read-index barrier (see `ha`).
#[tonic::async_trait]
impl crate::xds::server::Fence for Replica {
    fn ready(&self) -> std::result::Result<(), String> {
        self.readiness()
    }

    async fn barrier(&self) -> std::result::Result<(), String> {
        crate::ha::confirm_current(&self.node, Duration::from_millis(self.config.xds_fence_timeout_ms)).await
    }
}
