//! The Gateway API status, written by the leader as a Kubernetes
//! controller writes it: `Accepted`, `ResolvedRefs`, `Programmed`,
//! `attachedRoutes`, per parentRef for routes (`translate::gateway_api`
//! computes it, a pure function of the specs).
//!
//! After an applied revision that changed a spec the status reads (a
//! Gateway API object, a service, a Namespace, a Secret: not an Istio
//! rule: `status_input`), the leader computes the
//! status of every Gateway API object from that snapshot and writes, as
//! `Op::Status`, only those that differ from the stored ones, authored
//! `replica:<id>/gateway-status`. The apply only stores it; every replica
//! then answers get, list and watch from the store. `Op::Status` keeps the
//! object's generation, so `observedGeneration` is the generation of the
//! spec the status was computed from, and translation skips such changes
//! (`state::Objects::spec_diff`): a status write neither translates nor
//! pushes.
//!
//! It reads the status from the mesh the xDS server builds for the
//! streams (`xds::Generator::mesh`: the same translation, once per pushed
//! revision), so the leader keeps one mesh, not two; it follows the
//! revisions the debouncer pushes (`xds::push`), the ones the streams
//! translate. Only a generator that builds no mesh (a test's) makes it
//! build its own.
//!
//! Bounded: a round waits until no new revision was pushed for [`QUIET`],
//! and at most [`HOLD`] (a burst of writes costs one computation, and one
//! status write, from the newest snapshot; its status lags by at most
//! `HOLD`); a round whose only changes since the last one are statuses
//! computes nothing (so a status write cannot cause another), and a write
//! that fails (a spec changed under it: a conflict) is retried by the next
//! round (at most a second later).

use crate::model::{Kind, ResourceKey};
use crate::node::Node;
use crate::state::access::Who;
use crate::state::Objects;
use crate::store::types::{Op, Txn};
use crate::store::Applied;
use crate::translate::mesh::{Mesh, MeshConfig};
use crate::translate::Translator;
use crate::xds::resources::Generator;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;

/// A round starts once no revision was pushed for this long...
pub const QUIET: Duration = Duration::from_millis(50);
/// ...or this long after the revision that started it, whichever is first:
/// a steady stream of writes (one every few ms) gets its status this often,
/// and each status write is one more raft write the next spec write may
/// wait behind.
pub const HOLD: Duration = Duration::from_millis(500);
/// A round with nothing new runs anyway this often while leading (the
/// first round of a new leader, a retry after a failed write).
const TICK: Duration = Duration::from_secs(1);
/// Pushes a round waits for the newest specs to be pushed, at most.
const PUSHES_WAITED: usize = 16;
/// Status writes per transaction.
const OPS_PER_TXN: usize = 256;

/// The leader's status loop. Runs on every replica; acts only while leader.
/// `pushed`: the revisions the xDS streams are given (`xds::push::debounce`);
/// `generator`: theirs, whose mesh it reads (at the newest revision when
/// that differs from the pushed one by statuses only: the same mesh).
pub async fn run(
    node: Arc<Node>,
    generator: Arc<dyn Generator>,
    mesh: MeshConfig,
    mut pushed: watch::Receiver<Arc<Applied>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let latest = node.reader().subscribe_applied();
    let mut writer = Writer { meshes: Meshes::new(generator, mesh), done: None };
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            changed = pushed.changed() => if changed.is_err() { return },
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
        // Coalesce a burst: the newest snapshot once the pushes pause.
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            open = settle(&mut pushed, QUIET, HOLD) => if !open { return },
        }
        // The newest state, if its specs are the pushed ones (it may be
        // newer by status writes, which are never pushed): a status is
        // written over the stored one it was compared with. Else a push
        // of the newer specs is on its way: the round waits for it (not
        // for another hold, which a steady stream of writes could put at
        // the same point of the debouncer's cycle every time).
        match pushed_snapshot(&mut pushed, &latest, &mut shutdown).await {
            Ok(Some(snapshot)) => writer.round(&node, snapshot).await,
            Ok(None) => {}
            Err(()) => return,
        }
    }
}

/// The snapshot a round computes from ([`round_snapshot`]), waiting for the
/// pushes of newer specs, at most [`PUSHES_WAITED`] of them. `Ok(None)`:
/// none came; `Err`: shutdown.
async fn pushed_snapshot(
    pushed: &mut watch::Receiver<Arc<Applied>>,
    latest: &watch::Receiver<Arc<Applied>>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Arc<Applied>>, ()> {
    for _ in 0..PUSHES_WAITED {
        let at = pushed.borrow_and_update().clone();
        let snapshot = round_snapshot(&at, &latest.borrow());
        if snapshot.is_some() {
            return Ok(snapshot);
        }
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return Err(()),
            changed = pushed.changed() => if changed.is_err() { return Err(()) },
            _ = tokio::time::sleep(TICK) => {}
        }
    }
    Ok(None)
}

/// The snapshot a round computes from: the newest applied one, if its
/// specs are those of the pushed one `at` (it is newer by status writes
/// only, which are never pushed): its statuses and mod revisions are the
/// stored ones, which a status write must expect. `None`: newer specs are
/// still to be pushed (their push starts the next round).
fn round_snapshot(at: &Arc<Applied>, newest: &Arc<Applied>) -> Option<Arc<Applied>> {
    at.state.objects.spec_diff(&newest.state.objects).next().is_none().then(|| newest.clone())
}

/// Wait until `rx` has seen no new value for `quiet`, or `hold` has passed,
/// whichever is first. False: the sender is gone.
async fn settle<T>(rx: &mut watch::Receiver<T>, quiet: Duration, hold: Duration) -> bool {
    let end = tokio::time::Instant::now() + hold;
    loop {
        let wait = quiet.min(end.saturating_duration_since(tokio::time::Instant::now()));
        if wait.is_zero() {
            return true;
        }
        match tokio::time::timeout(wait, rx.changed()).await {
            Err(_) => return true, // quiet, or the hold is over
            Ok(Err(_)) => return false,
            Ok(Ok(())) => {}
        }
    }
}

/// Where a round's mesh comes from: the xDS generator's, or (a generator
/// that builds none) a translator of its own, made when first needed.
#[derive(Clone)]
struct Meshes {
    generator: Arc<dyn Generator>,
    own: Arc<(MeshConfig, OnceLock<Translator>)>,
}

impl Meshes {
    fn new(generator: Arc<dyn Generator>, config: MeshConfig) -> Meshes {
        Meshes { generator, own: Arc::new((config, OnceLock::new())) }
    }

    /// The mesh of `applied` (it may translate: not on the async threads).
    fn mesh(&self, applied: &Applied) -> Arc<Mesh> {
        self.generator.mesh(applied).unwrap_or_else(|| self.own.1.get_or_init(|| Translator::new(self.own.0.clone())).mesh(&applied.state))
    }
}

struct Writer {
    meshes: Meshes,
    /// The objects of the last round that wrote all it had to.
    done: Option<Objects>,
}

impl Writer {
    async fn round(&mut self, node: &Node, snapshot: Arc<Applied>) {
        let state = &snapshot.state;
        // Only statuses changed since (our own writes among them), or
        // objects the status is no function of: nothing to compute.
        if self.done.as_ref().is_some_and(|d| d.spec_diff(&state.objects).all(|c| !status_input(c.key().kind))) {
            self.done = Some(state.objects.clone());
            return;
        }
        let (meshes, computed) = (self.meshes.clone(), snapshot.clone());
        let Ok(ops) = tokio::task::spawn_blocking(move || changes(&meshes.mesh(&computed), &computed.state)).await else {
            return; // the computation panicked: the next round tries again
        };
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
/// from its stored one, in key order; an object that has a status but
/// no longer gets one (its class is no longer ours, say) is given an empty
/// one, as its controller gives up a status it no longer owns.
fn changes(mesh: &Mesh, state: &crate::state::State) -> Vec<Op> {
    let statuses = STATUS_KINDS.iter().flat_map(|k| state.objects.range(ResourceKey::new(*k, "", "")..).take_while(move |(key, _)| key.kind == *k));
    let mut objects = statuses.peekable();
    if objects.peek().is_none() {
        return Vec::new();
    }
    let none = serde_json::Value::Object(Default::default());
    objects
        .filter_map(|(key, obj)| {
            let want = mesh.gateway_api_status.get(key).unwrap_or(&none);
            let have = obj.has_status().then(|| obj.body().get("status")).flatten().unwrap_or(&none);
            (want != have).then(|| Op::Status { key: key.clone(), status: want.to_string(), expected_revision: Some(obj.mod_revision) })
        })
        .collect()
}

/// Whether objects of `kind` can change a Gateway API status: every kind
/// but the Istio rules and the registry's and ACLs' own objects, which
/// `translate::gateway_api` does not read (a kind added later counts
/// until it is listed here).
fn status_input(kind: Kind) -> bool {
    use Kind::*;
    !(kind.is_acl()
        || matches!(
            kind,
            VirtualService
                | DestinationRule
                | Gateway
                | Sidecar
                | AuthorizationPolicy
                | RequestAuthentication
                | PeerAuthentication
                | EnvoyFilter
                | Telemetry
                | Lease
                | WorkloadGroup
        ))
}

/// The kinds `translate::gateway_api` gives a status.
const STATUS_KINDS: [Kind; 8] =
    [Kind::GatewayClass, Kind::KubeGateway, Kind::HttpRoute, Kind::GrpcRoute, Kind::TcpRoute, Kind::TlsRoute, Kind::BackendTlsPolicy, Kind::ListenerSet];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::documents::parse_documents;
    use crate::model::parse_resource;
    use crate::state::State;

    fn apply(state: &mut State, yaml: &str) {
        let ops = parse_documents(yaml, "test")
            .unwrap()
            .into_iter()
            .map(|d| {
                let r = parse_resource(d, "default").unwrap();
                Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
            })
            .collect();
        state.apply_txn(&Txn { ops }).0.unwrap();
    }

    fn class(controller: &str) -> String {
        format!("apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: lodestar}}\nspec: {{controllerName: {controller}}}\n")
    }

    /// What one round writes, applied: the next round writes nothing (no
    /// write loop), a backend appearing changes the route's status only,
    /// and a class no longer ours has its statuses emptied, once.
    #[test]
    fn only_changed_status_is_written_and_a_round_after_a_write_writes_nothing() {
        let (translator, mut state) = (Translator::new(MeshConfig::default()), State::default());
        let gateway = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: shop}\nspec:\n  gatewayClassName: lodestar\n  listeners: [{name: http, port: 8080, protocol: HTTP}]\n---\n\
            apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: web, namespace: shop}\nspec:\n  parentRefs: [{name: web}]\n  rules: [{backendRefs: [{name: later, port: 80}]}]\n";
        apply(&mut state, &format!("{}---\n{gateway}", class("lodestar.dev/gateway-controller")));
        let round = |state: &mut State| -> Vec<String> {
            let ops = changes(&translator.mesh(state), state);
            let keys = ops.iter().filter_map(Op::key).map(|k| k.to_string()).collect();
            if !ops.is_empty() {
                state.apply_txn(&Txn { ops }).0.unwrap();
            }
            keys
        };
        assert_eq!(round(&mut state).len(), 3, "class, gateway and route");
        assert!(round(&mut state).is_empty(), "a second round wrote again");
        let route = state.get(&ResourceKey::new(Kind::HttpRoute, "shop", "web")).unwrap().clone();
        assert!(route.body()["status"].to_string().contains("BackendNotFound"), "{}", route.body());
        assert_eq!(route.version, 1);

        apply(
            &mut state,
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: later, namespace: shop}\nspec: {ports: [{name: http, number: 80}]}\n",
        );
        assert_eq!(round(&mut state), [ResourceKey::new(Kind::HttpRoute, "shop", "web").to_string()]);
        assert!(round(&mut state).is_empty());

        // A round after an unrelated write computes nothing.
        let done = state.objects.clone();
        apply(&mut state, "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: other, namespace: shop}\nspec: {hosts: [other], http: [{route: [{destination: {host: other}}]}]}\n");
        assert!(done.spec_diff(&state.objects).all(|c| !status_input(c.key().kind)));
        assert!(status_input(Kind::Service) && status_input(Kind::HttpRoute) && status_input(Kind::Namespace));

        apply(&mut state, &class("example.com/someone-else"));
        let cleared = round(&mut state);
        assert!(cleared.len() >= 2, "{cleared:?}");
        let gtw = state.get(&ResourceKey::new(Kind::KubeGateway, "shop", "web")).unwrap();
        assert_eq!(gtw.body()["status"], serde_json::json!({}));
        assert!(round(&mut state).is_empty(), "an emptied status was written again");
    }

    /// A round's mesh is the xDS generator's own (the one its streams were
    /// translated from: no second mesh on the leader), and a generator
    /// that builds none gets one built here.
    #[test]
    fn the_status_is_read_from_the_streams_mesh() {
        let mut state = State::default();
        apply(&mut state, &class("lodestar.dev/gateway-controller"));
        let applied = crate::store::Applied { state, ..Default::default() };
        let xds: Arc<dyn Generator> = Arc::new(Translator::new(MeshConfig::default()));
        let meshes = Meshes::new(xds.clone(), MeshConfig::default());
        let streams = xds.mesh(&applied).unwrap();
        assert!(Arc::ptr_eq(&meshes.mesh(&applied), &streams), "the status writer built a mesh of its own");
        assert!(meshes.own.1.get().is_none());

        struct Fixed;
        impl crate::translate::resources::Generator for Fixed {
            fn generate(&self, _: &crate::model::proxy::ProxyIdentity, _: &State) -> Result<crate::translate::resources::ProxyConfig, String> {
                Ok(Default::default())
            }
        }
        let meshes = Meshes::new(Arc::new(Fixed), MeshConfig::default());
        let own = meshes.mesh(&applied);
        assert!(own.gateway_api_status.keys().any(|k| k.kind == Kind::GatewayClass), "{:?}", own.gateway_api_status.keys().collect::<Vec<_>>());
        assert!(Arc::ptr_eq(&meshes.mesh(&applied), &own), "built once per revision");
    }

    /// A round waits for the pushes to pause, at most the hold: an
    /// isolated push waits `quiet`; a steady stream of pushes (every 10 ms
    /// for 1.5 s) waits the hold, not until it ends.
    #[tokio::test]
    async fn a_round_waits_for_a_pause_at_most_the_hold() {
        let (quiet, hold) = (Duration::from_millis(40), Duration::from_millis(300));
        let (tx, mut rx) = watch::channel(0u64);
        let start = std::time::Instant::now();
        assert!(settle(&mut rx, quiet, hold).await);
        assert!(start.elapsed() >= quiet && start.elapsed() < hold, "an isolated change: {:?}", start.elapsed());

        let burst = tokio::spawn(async move {
            for i in 1..=150 {
                tokio::time::sleep(Duration::from_millis(10)).await;
                tx.send_replace(i);
            }
            tx
        });
        let start = std::time::Instant::now();
        assert!(settle(&mut rx, quiet, hold).await);
        let took = start.elapsed();
        assert!(took >= hold && took < Duration::from_millis(1200), "a steady stream of pushes: {took:?}");
        assert!(!burst.is_finished(), "the burst ended first: {took:?}");
        drop(burst.await.unwrap());
        assert!(!settle(&mut rx, quiet, hold).await, "the sender is gone");
    }

    /// A round after a status write (never pushed) computes from the
    /// newest state, with the statuses and revisions now stored: a round
    /// on the pushed snapshot would write stale statuses, expecting old
    /// revisions, and fail the same way at every retry. A spec not yet
    /// pushed waits for its push.
    #[test]
    fn a_round_reads_the_status_writes_since_the_push() {
        let mut state = State::default();
        apply(&mut state, &class("lodestar.dev/gateway-controller"));
        let pushed = Arc::new(crate::store::Applied { state: state.clone(), ..Default::default() });
        let translator = Translator::new(MeshConfig::default());
        let ops = changes(&translator.mesh(&state), &state);
        assert_eq!(ops.len(), 1);
        state.apply_txn(&Txn { ops }).0.unwrap();
        let newest = Arc::new(crate::store::Applied { state: state.clone(), ..Default::default() });
        let snapshot = round_snapshot(&pushed, &newest).expect("statuses only since the push");
        assert_eq!(snapshot.revision(), newest.revision());
        assert!(changes(&translator.mesh(&snapshot.state), &snapshot.state).is_empty(), "the status written is written again");

        apply(
            &mut state,
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: later, namespace: shop}\nspec: {ports: [{name: http, number: 80}]}\n",
        );
        assert!(round_snapshot(&pushed, &Arc::new(crate::store::Applied { state, ..Default::default() })).is_none(), "a spec not pushed yet");
    }

    /// A round whose newest specs are not pushed yet waits for their push
    /// and computes from it (it does not skip to another hold).
    #[tokio::test]
    async fn a_round_waits_for_the_push_of_the_newest_specs() {
        let mut state = State::default();
        apply(&mut state, &class("lodestar.dev/gateway-controller"));
        let at = Arc::new(crate::store::Applied { state: state.clone(), ..Default::default() });
        apply(
            &mut state,
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: later, namespace: shop}\nspec: {ports: [{name: http, number: 80}]}\n",
        );
        let newest = Arc::new(crate::store::Applied { state, ..Default::default() });
        let (push, mut pushed) = watch::channel(at);
        let (_applied, latest) = watch::channel(newest.clone());
        let (_stop, mut shutdown) = watch::channel(false);
        let later = newest.clone();
        let pusher = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(30)).await;
            push.send_replace(later);
            push
        });
        let got = pushed_snapshot(&mut pushed, &latest, &mut shutdown).await.unwrap().expect("the round waited for the push");
        assert_eq!(got.revision(), newest.revision());
        drop(pusher.await.unwrap());
        assert!(pushed_snapshot(&mut pushed, &latest, &mut shutdown).await.unwrap().is_some(), "pushed already");
    }
}
