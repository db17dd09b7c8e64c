//! The Gateway API status, written by the leader as a Kubernetes
//! controller writes it: `Accepted`, `ResolvedRefs`, `Programmed`,
//! `attachedRoutes`, per parentRef for routes (`translate::gateway_api`
//! computes it, a pure function of the specs).
//!
//! After an applied revision whose specs changed, the leader computes the
//! status of every Gateway API object from that snapshot and writes, as
//! `Op::Status`, only those that differ from the stored ones, authored
//! `replica:<id>/gateway-status`. The apply only stores it; every replica
//! then answers get, list and watch from the store. `Op::Status` keeps the
//! object's generation, so `observedGeneration` is the generation of the
//! spec the status was computed from, and translation skips such changes
//! (`state::Objects::spec_diff`): a status write neither translates nor
//! pushes.
//!
//! Bounded: rounds are at most one per [`ROUND`] (a burst of writes costs
//! one computation, from the newest snapshot); a round whose only changes
//! since the last one are statuses computes nothing (so a status write
//! cannot cause another), and a write that fails (a spec changed under
//! it: a conflict) is retried by the next round.

use crate::model::{Kind, StoredObject};
use crate::node::Node;
use crate::state::access::Who;
use crate::state::Objects;
use crate::store::types::{Op, Txn};
use crate::translate::mesh::MeshConfig;
use crate::translate::Translator;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// At most one round per this long.
pub const ROUND: Duration = Duration::from_millis(50);
/// A round with nothing new runs anyway this often while leading (the
/// first round of a new leader, a retry after a failed write).
const TICK: Duration = Duration::from_secs(1);
/// Status writes per transaction.
const OPS_PER_TXN: usize = 256;

/// The leader's status loop. Runs on every replica; acts only while leader.
pub async fn run(node: Arc<Node>, mesh: MeshConfig, mut shutdown: watch::Receiver<bool>) {
    let mut applied = node.reader().subscribe_applied();
    let mut writer = Writer { translator: Translator::new(mesh), done: None };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            changed = applied.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        if !node.is_leader() {
            writer.done = None;
            continue;
        }
        let (_, since) = crate::node::version::feature_since(crate::node::version::Feature::StatusOnly);
        if node.cluster_version().version < since {
            continue; // an older member could not apply `Op::Status`
        }
        // Coalesce a burst: the newest snapshot after a short pause.
        tokio::time::sleep(ROUND).await;
        let snapshot = applied.borrow_and_update().clone();
        writer.round(&node, &snapshot.state).await;
    }
}

struct Writer {
    /// Builds the mesh incrementally (route changes re-translate only
    /// their slots, `Mesh::update_gateway_routes`), as the xDS server's.
    translator: Translator,
    /// The objects of the last round that wrote all it had to.
    done: Option<Objects>,
}

impl Writer {
    async fn round(&mut self, node: &Node, state: &crate::state::State) {
        if self.done.as_ref().is_some_and(|d| d.spec_diff(&state.objects).next().is_none()) {
            return; // only statuses changed since (our own writes among them)
        }
        let ops = changes(&self.translator, state);
        let mut ok = true;
        for chunk in ops.chunks(OPS_PER_TXN) {
            let mut txn = Txn { ops: chunk.to_vec() };
            txn.ops.push(Op::Author(crate::store::types::Author { name: Who::Replica { id: node.id, task: "gateway-status" }.audit_name(), message: None }));
            match node.write(txn).await {
                Ok(r) => tracing::debug!(revision = r.revision, objects = chunk.len(), "gateway status written"),
                Err(e) => {
                    // A conflict: a spec changed meanwhile; the next round
                    // (that change's) computes again.
                    tracing::debug!(error = %e, "gateway status not written; the next round retries");
                    ok = false;
                }
            }
        }
        self.done = ok.then(|| state.objects.clone());
    }
}

/// `Op::Status` for every Gateway API object whose computed status differs
/// from its stored one, in key order.
fn changes(translator: &Translator, state: &crate::state::State) -> Vec<Op> {
    if !has_gateway_api(&state.objects) {
        return Vec::new();
    }
    let mesh = translator.mesh(state);
    mesh.gateway_api_status
        .iter()
        .filter_map(|(key, status)| {
            let obj = state.get(key)?;
            (stored_status(obj) != Some(status)).then(|| Op::Status { key: key.clone(), status: status.to_string(), expected_revision: Some(obj.mod_revision) })
        })
        .collect()
}

fn stored_status(obj: &StoredObject) -> Option<&serde_json::Value> {
    obj.has_status().then(|| obj.body().get("status")).flatten()
}

fn has_gateway_api(objects: &Objects) -> bool {
    [Kind::GatewayClass, Kind::KubeGateway, Kind::HttpRoute, Kind::GrpcRoute, Kind::TcpRoute, Kind::TlsRoute]
        .iter()
        .any(|k| objects.range(crate::model::ResourceKey::new(*k, "", "")..).next().is_some_and(|(key, _)| key.kind == *k))
}
