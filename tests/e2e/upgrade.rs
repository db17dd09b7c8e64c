//! Rolling upgrades (issue 40): a cluster of the previous release (commit
//! [`PREVIOUS`], wire version 1, built once into `.cache/upgrade/` by
//! `tests/support/build-previous.sh`, which `tests/run` calls) upgraded one
//! replica at a time to this build under a steady write and request load,
//! a replica rolled back to the previous release before the cluster
//! version was raised, and replicas of the wrong version refusing to
//! serve. Real replica processes of both builds, a real Envoy, real
//! traffic. Figures (the upgrade's length, the longest write gap) are
//! printed, never asserted: the measured ones are in benches/RESULTS.md.

use crate::kit;

use kit::agent::{AgentBuilder, Workload};
use kit::envoy::{versions_at, Envoy, EnvoyOptions, Upstream};
use kit::mesh::*;
use kit::Cluster;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The previous release: the commit every replica starts on.
pub const PREVIOUS: &str = "7a825a0";

/// The previous release's `lodestar`, built by
/// `tests/support/build-previous.sh` (or `LODESTAR_PREVIOUS`).
fn previous_binary() -> PathBuf {
    let path = std::env::var_os("LODESTAR_PREVIOUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/upgrade").join(PREVIOUS).join("lodestar"));
    assert!(
        path.is_file(),
        "the previous release's binary is missing at {}: build it with `tests/support/build-previous.sh` (tests/run does; it builds commit {PREVIOUS} \
         into .cache/upgrade/ once, about 4 minutes), or point LODESTAR_PREVIOUS at one",
        path.display()
    );
    path
}

const WEB: &str =
    "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  ports: [{name: http, number: 8080}]\n";

fn web_instance(u: &Upstream) -> String {
    format!(
        "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: web-1, namespace: default}}\nspec: {{service: web, address: {}, ports: {{http: {}}}}}\n",
        u.addr.ip(),
        u.addr.port()
    )
}

/// Three replicas of the previous release, a web upstream, and an Envoy
/// bootstrapped to every replica, routing to it.
async fn previous_cluster() -> (Fixture, Upstream, Envoy) {
    let old = previous_binary();
    let mut cluster = Cluster::prepare(3, "");
    // A mesh CA made by the previous release, for the agents' certificates.
    let ca = cluster.tmp.path().join("mesh-ca");
    let out = std::process::Command::new(&old).args(["tls", "ca", "create", "--mesh", "--dir"]).arg(&ca).output().unwrap();
    assert!(out.status.success(), "the previous release's `tls ca create --mesh`: {}", String::from_utf8_lossy(&out.stderr));
    for r in &mut cluster.replicas {
        r.binary = Some(old.clone());
        r.extra_toml = format!("mesh_ca_dir = {ca:?}\n");
    }
    cluster.launch().await;
    let fx = Fixture::around(cluster);
    let u = fx.upstream(100, "web-1").await;
    fx.apply(&format!("{WEB}---\n{}", web_instance(&u))).await;
    let mut o = EnvoyOptions::new("client", &fx.ip(10));
    o.xds_servers = fx.cluster.replicas.iter().map(|r| r.xds_addr()).collect();
    let mut e = Envoy::start(&fx.tmp.path().join("client"), o);
    e.wait_ready(BOUND).await;
    let url = format!("http://{}:8080/", e.options.ip);
    wait_for(&fx.client, &url, "web", &[], "web-1 serves through the Envoy", |r| r.body == "web-1").await;
    (fx, u, e)
}

/// Two sidecar workloads in namespace `shop`, each a `lodestar agent` with
/// the Envoy it bootstraps and 10 s certificates (renewed about every 5 s,
/// so through whichever replicas run then): `web`, the client, run by the
/// previous release's agent, and `reviews`, the server in front of an
/// upstream, by this build's. The client's Envoy reaches the server's over
/// mutual TLS (STRICT), so every request needs both agents' certificates
/// served over SDS.
struct Mesh {
    web: Workload,
    reviews: Workload,
    _app: Upstream,
}

impl Mesh {
    async fn start(fx: &Fixture) -> Mesh {
        let app = Upstream::start("127.0.0.1", "reviews-mesh").await;
        let (web_ip, reviews_ip, p) = (fx.ip(20), fx.ip(21), &fx.prefix);
        fx.apply(&format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  workloadSelector: {{labels: {{app: reviews}}}}\n  \
             ingress: [{{port: {{number: 9080, protocol: HTTP, name: http}}, defaultEndpoint: '{app}'}}]\n  egress: [{{bind: {p}.29, hosts: ['./*']}}]\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: reviews, namespace: shop}}\nspec: {{ports: [{{name: http, number: 9080}}]}}\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: web, namespace: shop}}\nspec: {{ports: [{{name: http, number: 8080}}]}}\n---\n\
             apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: default, namespace: shop}}\nspec: {{mtls: {{mode: STRICT}}}}\n",
            app = app.addr
        ))
        .await;
        let xds = fx.cluster.replicas.iter().map(|r| r.xds_addr()).collect::<Vec<_>>().join(",");
        // Each registers itself (an Instance bound to a lease of 6 s, kept
        // alive every 2 s through the API of replica 1: writes that go on
        // across the upgrade).
        let agent = |name: &str, ip: &str, port: &str| {
            AgentBuilder::new("shop", name, &xds, &fx.tmp.path().join(name))
                .server(&fx.api(1))
                .args(["--label", &format!("app={name}"), "--ip", ip, "--admin-port", "15000", "--ttl", "10s", "-o", "json"])
                .args(["--register", name, "--port", port, "--lease-ttl", "6s"])
                .join_token(&fx.api(1), &format!("shop/{name}"))
        };
        let serving = |admin: String| async move { kit::envoy::serving_serial(&admin).await.is_some() };
        let web = Workload::start(agent("web", &web_ip, "http=8080").binary(&previous_binary()), &web_ip, serving).await;
        let reviews = Workload::start(agent("reviews", &reviews_ip, "http=9080"), &reviews_ip, serving).await;
        let mesh = Mesh { web, reviews, _app: app };
        wait_for(&fx.client, &mesh.url(), HOST, &[], "the web Envoy reaches reviews over mutual TLS", |r| r.body == "reviews-mesh").await;
        mesh
    }

    fn url(&self) -> String {
        format!("http://{}:9080/", self.web.ip)
    }

    /// The Instances the two agents registered, read through replica
    /// `id`: (name, the revision it was created at); each bound to its
    /// lease, with the service account of its agent's certificate.
    async fn registered(&self, fx: &Fixture, id: u64) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for (name, ip) in [("web", &self.web.ip), ("reviews", &self.reviews.ip)] {
            let instance = format!("{name}-{}", ip.replace('.', "-"));
            let (code, body) = kit::get_json(&fx.client, &format!("{}/v1/resources/instances/shop/{instance}", fx.api(id))).await;
            assert_eq!(code, 200, "{instance} registered: {body:#}\n{}", self.web.logs());
            assert_eq!((&body["spec"]["lease"], &body["spec"]["serviceAccount"]), (&json!(instance), &json!(name)), "{body:#}");
            out.push((instance, body["metadata"]["creationRevision"].as_u64().unwrap()));
        }
        out
    }

    /// Until both Envoys serve a certificate other than the one each served
    /// when called: both agents renewed through the replicas running now,
    /// and pushed the new certificate over SDS.
    async fn renewed(&self, when: &str) {
        let before = (self.web.serving_serial().await, self.reviews.serving_serial().await);
        kit::until(&format!("both workload certificates renewed {when}"), Duration::from_secs(30), || async {
            let now = (self.web.serving_serial().await, self.reviews.serving_serial().await);
            now.0.is_some() && now.1.is_some() && now.0 != before.0 && now.1 != before.1
        })
        .await;
    }

    /// Neither workload's Envoy rejected a configuration, and both are
    /// connected to a replica.
    async fn assert_no_rejections(&self) {
        for w in [&self.web, &self.reviews] {
            let stats = w.stats().await;
            let rejected: Vec<(&String, &u64)> = stats.iter().filter(|(k, v)| k.ends_with("update_rejected") && **v > 0).collect();
            assert!(rejected.is_empty(), "the Envoy at {} rejected updates: {rejected:?}\n{}", w.ip, w.logs());
            assert_eq!(stats.get("control_plane.connected_state"), Some(&1), "the Envoy at {} is connected\n{}", w.ip, w.logs());
        }
    }
}

const HOST: &str = "reviews.shop.svc.cluster.local";

/// `POST /v1/apply` of one VirtualService at `api`, with a change message
/// if given: (status, body); status 0 when no answer came.
async fn write(client: &reqwest::Client, api: &str, name: &str, tag: &str, message: Option<&str>) -> (u16, Value) {
    let mut req = client.post(format!("{api}/v1/apply")).timeout(Duration::from_secs(10)).json(&json!({"resources": [kit::vs(name, "default", tag)]}));
    if let Some(m) = message {
        req = req.header("x-lodestar-message", m);
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.json().await.unwrap_or(Value::Null))
        }
        Err(e) => (0, Value::String(e.to_string())),
    }
}

/// `Apply` of one VirtualService through the gRPC API at `api` (a tonic
/// client), with `message` in the request: the revision, or the status.
async fn grpc_write(api: &str, name: &str, message: &str) -> Result<u64, tonic::Status> {
    let item = lodestar::proto::api::ApplyItem { resource_json: kit::vs(name, "default", "g").to_string(), expected_revision: None };
    let req = lodestar::proto::api::ApplyRequest { items: vec![item], message: message.to_string(), ..Default::default() };
    kit::grpc_api(api).apply(req).await.map(|r| r.into_inner().revision)
}

/// The load during an upgrade, each part bounded and stopped by `stop`:
/// writes (one at a time, to each replica in turn, the next replica when
/// one does not answer), requests through the Envoy, and the versions the
/// Envoy holds, which must never go down.
struct Load {
    stop: Arc<AtomicBool>,
    /// Acknowledged writes: name → tag.
    acked: Arc<Mutex<BTreeMap<String, String>>>,
    /// The longest time between two acknowledged writes, and their count.
    gap: Arc<Mutex<(Duration, usize)>>,
    requests: Arc<Mutex<(usize, Vec<String>)>>,
    backwards: Arc<Mutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// With `mesh`, requests through its client's Envoy too, and the
    /// versions both its Envoys hold.
    fn start(fx: &Fixture, e: &Envoy, mesh: Option<&Mesh>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let (acked, gap, requests, backwards) = Default::default();
        let mut load = Load { stop, acked, gap, requests, backwards, tasks: Vec::new() };
        let apis: Vec<String> = fx.cluster.replicas.iter().map(|r| r.api()).collect();
        let (stop, acked, gap, client) = (load.stop.clone(), load.acked.clone(), load.gap.clone(), fx.client.clone());
        load.tasks.push(tokio::spawn(async move {
            let mut last = Instant::now();
            for i in 0..5_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let (name, tag) = (format!("w-{}", i % 40), format!("t{i}"));
                for k in 0..apis.len() {
                    let (status, _) = write(&client, &apis[(i + k) % apis.len()], &name, &tag, None).await;
                    if status == 200 {
                        acked.lock().unwrap().insert(name.clone(), tag.clone());
                        let mut g = gap.lock().unwrap();
                        *g = (g.0.max(last.elapsed()), g.1 + 1);
                        last = Instant::now();
                        break;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
        let (stop, requests, client) = (load.stop.clone(), load.requests.clone(), fx.client.clone());
        let mut targets = vec![(format!("http://{}:8080/", e.options.ip), "web".to_string(), "web-1".to_string())];
        targets.extend(mesh.map(|m| (m.url(), HOST.to_string(), "reviews-mesh".to_string())));
        load.tasks.push(tokio::spawn(async move {
            for _ in 0..20_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for (url, host, want) in &targets {
                    let r =
                        send(&client, url, host, &[]).await.and_then(|r| if &r.body == want { Ok(()) } else { Err(format!("{url} {} {}", r.status, r.body)) });
                    let mut q = requests.lock().unwrap();
                    q.0 += 1;
                    q.1.extend(r.err());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
        let mut admins = vec![e.admin()];
        admins.extend(mesh.into_iter().flat_map(|m| [m.web.admin(), m.reviews.admin()]));
        let (stop, backwards) = (load.stop.clone(), load.backwards.clone());
        load.tasks.push(tokio::spawn(async move {
            let mut seen: BTreeMap<String, u64> = BTreeMap::new();
            for _ in 0..10_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for admin in &admins {
                    for (k, v) in versions_at(admin).await {
                        let k = format!("{admin} {k}");
                        let before = seen.insert(k.clone(), v).unwrap_or(0);
                        if v < before {
                            backwards.lock().unwrap().push(format!("{k}: {before} -> {v}"));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
        load
    }

    /// Stop, and check: no request failed, the proxy never went back. The
    /// acknowledged writes, and the longest gap between two.
    async fn finish(self) -> (BTreeMap<String, String>, (Duration, usize)) {
        // At least this much load across the test, however slow the machine.
        kit::until("100 requests and 20 writes", BOUND, || async { self.requests.lock().unwrap().0 >= 100 && self.gap.lock().unwrap().1 >= 20 }).await;
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.unwrap();
        }
        let (sent, failed) = self.requests.lock().unwrap().clone();
        eprintln!("{sent} requests through the Envoy, {} failed; {} objects written", failed.len(), self.acked.lock().unwrap().len());
        assert!(failed.is_empty(), "{} of {sent} requests failed: {:?}", failed.len(), &failed[..failed.len().min(5)]);
        let backwards = self.backwards.lock().unwrap().clone();
        assert!(backwards.is_empty(), "the Envoy saw versions go back: {backwards:?}");
        let acked = self.acked.lock().unwrap().clone();
        let gap = *self.gap.lock().unwrap();
        (acked, gap)
    }
}

/// `/v1/cluster` at replica `id`.
async fn status(fx: &Fixture, id: u64) -> Value {
    fx.cluster.status(id).await.unwrap_or_else(|| panic!("replica {id} answers /v1/cluster"))
}

/// Stop replica `id`, switch its binary (None: this build), start it on
/// the same data directory, and wait until it has caught up.
async fn replace(fx: &mut Fixture, id: u64, binary: Option<PathBuf>) {
    fx.cluster.stop(id);
    fx.cluster.replica_mut(id).binary = binary;
    fx.cluster.restart(id);
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let target = fx.cluster.local_revision(leader).await.unwrap_or(0);
    fx.cluster.wait_for_revision(target, BOUND).await;
}

/// Every replica at the same revision with the same objects (each one's
/// own applied state), every acknowledged write among them.
async fn identical(fx: &Fixture, acked: &BTreeMap<String, String>) {
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let revision = fx.cluster.local_revision(leader).await.unwrap();
    fx.cluster.wait_for_revision(revision, BOUND).await;
    let mut lists = Vec::new();
    for r in &fx.cluster.replicas {
        let (code, list) = kit::get_json(&fx.client, &format!("{}/v1/resources/vs?consistency=stale&namespace=default", r.api())).await;
        assert_eq!(code, 200, "{list}");
        lists.push((r.id, list));
    }
    for (id, list) in &lists[1..] {
        assert_eq!(list, &lists[0].1, "replica {id} differs from replica {}", lists[0].0);
    }
    let items = lists[0].1["items"].as_array().unwrap();
    for (name, tag) in acked {
        let item = items.iter().find(|i| i["metadata"]["name"] == name.as_str()).unwrap_or_else(|| panic!("acknowledged write {name} is missing"));
        // Later writes of the same name may have been applied and not
        // acknowledged (a timeout): the tag is at least the acknowledged one.
        let stored: u64 = item["metadata"]["labels"]["tag"].as_str().unwrap()[1..].parse().unwrap();
        assert!(stored >= tag[1..].parse::<u64>().unwrap(), "{name}: stored t{stored}, acknowledged {tag}");
    }
}

/// The test the issue asks for. Three replicas of the previous release
/// under load; followers replaced first, then the leader; between steps,
/// the change message (a wire version 2 feature) is refused, naming the
/// members behind. After the last one the cluster runs version 2 and
/// records authors and messages. No request through the Envoy fails,
/// every acknowledged write is there, the replicas are identical, and the
/// Envoy never sees an older version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_upgrade_under_load() {
    let (mut fx, _u, e) = previous_cluster().await;
    // The previous release reports no versions.
    assert!(status(&fx, 1).await["cluster_version"].is_null());
    // The workloads: the previous release's agent and this build's, both
    // against replicas of the previous release, each renewing once.
    let mesh = Mesh::start(&fx).await;
    mesh.renewed("against the previous release's replicas").await;
    let registered = mesh.registered(&fx, 1).await;
    // A change message sent to a replica of the previous release is not
    // known there, and dropped (ops/upgrade.md).
    let dropped = grpc_write(&fx.api(1), "dropped", "lost").await.expect("the previous release takes the write");
    let load = Load::start(&fx, &e, Some(&mesh));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let started = Instant::now();
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let followers: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != leader).collect();
    for &id in &followers {
        replace(&mut fx, id, None).await;
        eprintln!("replica {id} (follower) upgraded after {:?}", started.elapsed());
        // The new replica learns the old ones are of version 1 (they answer
        // its Version request "undecodable"), so the cluster stays at 1 and
        // a version 2 feature is refused, naming who is behind.
        let s = kit::eventually_or("the upgraded replica sees the old ones as version 1", BOUND, || async {
            let s = status(&fx, id).await;
            let old = s["members"].as_array().unwrap().iter().find(|m| m["id"] == leader).cloned().unwrap_or_default();
            if s["cluster_version"] == 1 && old["versions"]["max"] == 1 && old["versions"]["current"] == true {
                Ok(s)
            } else {
                Err(format!("{s:#}"))
            }
        })
        .await;
        assert!(s["behind"].as_array().unwrap().contains(&json!(leader)), "{s:#}");
        // The CLI's table: the cluster version and each member's versions.
        let (ok, out, err) = kit::cli(&fx.api(id), &["cluster", "status"]);
        assert!(ok, "{err}");
        assert!(out.contains("cluster version: 1") && out.contains("1..2") && out.contains("VERSIONS"), "{out}");
        let (code, body) = write(&fx.client, &fx.api(id), "gated", "t0", Some("canary")).await;
        assert_eq!(code, 412, "{body:#}");
        assert_eq!(body["error"]["code"], "FailedPrecondition", "{body:#}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains("a change message needs cluster version 2, and the cluster runs version 1"), "{msg}");
        assert!(msg.contains(&format!("replica {leader} (version 1)")), "{msg}");
        // The same through gRPC (`ApplyRequest.message`).
        let status = grpc_write(&fx.api(id), "gated", "canary").await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert!(status.message().contains("a change message needs cluster version 2"), "{status:?}");
    }
    replace(&mut fx, leader, None).await;
    let took = started.elapsed();
    eprintln!("replica {leader} (the leader) upgraded: the rolling upgrade of 3 replicas took {took:?}");

    // Every replica sees the cluster at version 2.
    for id in [1, 2, 3] {
        kit::until(&format!("replica {id} sees cluster version 2"), BOUND, || async { status(&fx, id).await["cluster_version"] == 2 }).await;
    }
    // Both agents renew through the upgraded replicas while the load runs.
    mesh.renewed("against this build's replicas").await;
    // The registrations lived through it: kept alive, never re-created.
    assert_eq!(mesh.registered(&fx, 2).await, registered);
    let (acked, gap) = load.finish().await;
    // The figures benches/upgrade.sh collects (benches/RESULTS.md).
    eprintln!("result: upgrade_ms={} longest_write_gap_ms={} acknowledged_writes={}", took.as_millis(), gap.0.as_millis(), gap.1);
    identical(&fx, &acked).await;

    // Before the raise, no author; after, the author and the message.
    let (code, body) = write(&fx.client, &fx.api(1), "gated", "t1", Some("canary 10%")).await;
    assert_eq!(code, 200, "{body:#}");
    let revision = body["revision"].as_u64().unwrap();
    let (_, history) = kit::get_json(&fx.client, &format!("{}/v1/history?limit=500", fx.api(2))).await;
    let revisions = history["revisions"].as_array().unwrap();
    let newest = &revisions[0];
    assert_eq!(newest["revision"], revision, "{newest:#}");
    assert_eq!(newest["message"], "canary 10%", "{newest:#}");
    assert!(newest["author"].as_str().is_some_and(|a| !a.is_empty() && !a.contains(kit::management_token())), "{newest:#}");
    let lost = revisions.iter().find(|r| r["revision"] == dropped).unwrap_or_else(|| panic!("revision {dropped} in {history:#}"));
    assert!(lost["message"].is_null() && lost["author"].is_null(), "{lost:#}");
    let oldest = revisions.last().unwrap();
    assert!(oldest["author"].is_null(), "written by the previous release: no author: {oldest:#}");
    // A message is bounded: too long is refused, naming the header.
    let (code, body) = write(&fx.client, &fx.api(1), "gated", "t2", Some(&"x".repeat(300))).await;
    assert_eq!(code, 400, "{body:#}");
    assert_eq!(body["error"]["fields"][0]["field"], "X-Lodestar-Message", "{body:#}");
    // gRPC: the message is recorded the same way, and bounded the same way.
    let revision = grpc_write(&fx.api(3), "gated-grpc", "canary 20% via gRPC").await.unwrap();
    let (_, history) = kit::get_json(&fx.client, &format!("{}/v1/history?limit=1", fx.api(1))).await;
    assert_eq!((&history["revisions"][0]["revision"], &history["revisions"][0]["message"]), (&json!(revision), &json!("canary 20% via gRPC")), "{history:#}");
    let status = grpc_write(&fx.api(3), "gated-grpc", &"x".repeat(300)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("message") && status.message().contains("at most 256 bytes"), "{status:?}");
    e.assert_no_rejections().await;
    mesh.assert_no_rejections().await;
    // A backup of the upgraded cluster (authors recorded) is readable by
    // the previous release: authors are history, not in backups.
    backup_restores(&fx, None, Some(previous_binary())).await;
}

/// A replica upgraded by mistake, rolled back to the previous release
/// before the cluster version was raised: it starts on the same data
/// directory, catches up, and serves writes; the replicas stay identical.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_rolled_back_before_the_raise() {
    let (mut fx, _u, e) = previous_cluster().await;
    let load = Load::start(&fx, &e, None);
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let id = if leader == 3 { 2 } else { 3 };
    replace(&mut fx, id, None).await;
    kit::until("the upgraded replica sees cluster version 1", BOUND, || async { status(&fx, id).await["cluster_version"] == 1 }).await;
    let (code, _) = write(&fx.client, &fx.api(id), "on-new", "t0", None).await;
    assert_eq!(code, 200);
    replace(&mut fx, id, Some(previous_binary())).await;
    let (code, body) = write(&fx.client, &fx.api(id), "on-old-again", "t0", None).await;
    assert_eq!(code, 200, "{body:#}");
    let (acked, _) = load.finish().await;
    identical(&fx, &acked).await;
    e.assert_no_rejections().await;
    // Backups are readable by the next release.
    backup_restores(&fx, Some(previous_binary()), None).await;
}

/// `lodestar ARGS` of `binary` (None: this build), with the test client
/// config: (success, stdout, stderr).
fn lodestar_of(binary: Option<&PathBuf>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = match binary {
        Some(b) => std::process::Command::new(b),
        None => kit::cli_command(),
    };
    let out = cmd.env("LODESTAR_CONFIG", &kit::test_ca().client_config).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A backup taken from `fx`'s cluster by `taken_by`'s `snapshot save`
/// restores with `restored_by`'s `snapshot restore` (None: this build)
/// into a new single-node cluster of that release, which serves the same
/// objects at the same revision and takes writes after it.
async fn backup_restores(fx: &Fixture, taken_by: Option<PathBuf>, restored_by: Option<PathBuf>) {
    let what = format!(
        "a backup taken by {} restored by {}",
        if taken_by.is_some() { PREVIOUS } else { "this build" },
        if restored_by.is_some() { PREVIOUS } else { "this build" }
    );
    let file = fx.tmp.path().join(format!("backup-{}-{}.snapshot", taken_by.is_some(), restored_by.is_some()));
    let (ok, _, err) = lodestar_of(taken_by.as_ref(), &["--server", &fx.api(2), "snapshot", "save", file.to_str().unwrap()]);
    assert!(ok, "{what}: snapshot save: {err}");
    let (revision, before) = crate::backup::everything(&fx.cluster, &fx.api(1)).await;
    assert!(before.len() > 10, "a backup of something: {}", before.len());
    let mut dst = Cluster::prepare(1, "");
    dst.replicas[0].binary = restored_by.clone();
    let r = dst.replica(1);
    let dir = r.data_dir();
    let (api, raft, xds) = (r.api_addr(), r.raft_addr(), r.xds_addr());
    let args =
        ["snapshot", "restore", file.to_str().unwrap(), "--data-dir", dir.to_str().unwrap(), "--api-addr", &api, "--raft-addr", &raft, "--xds-addr", &xds];
    let (ok, out, err) = lodestar_of(restored_by.as_ref(), &args);
    assert!(ok, "{what}: snapshot restore: {err}");
    assert!(out.contains(&format!("restored revision {revision} ")), "{what}: {out}");
    dst.launch().await;
    let api = dst.replica(1).api();
    let (rev, after) = crate::backup::everything(&dst, &api).await;
    assert_eq!((rev, &after), (revision, &before), "{what}: the restored cluster serves what was backed up");
    let (status, body) = write(&dst.http, &api, "after-restore", "t0", None).await;
    assert_eq!((status, body["revision"].as_u64()), (200, Some(revision + 1)), "{what}: {body:#}");
}

/// A replica whose versions do not include the cluster version refuses to
/// serve: one two versions ahead (a build of versions 3..4, simulated with
/// LODESTAR_TEST_WIRE_VERSIONS), and one older than the cluster (1..1 in a
/// cluster at 2). Each says why in its log and exits 78; `cluster status`
/// on the others shows it. Back on this build's versions it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_of_the_wrong_version_refuse_to_serve() {
    let mut cluster = Cluster::start(3, "").await;
    kit::until("cluster version 2", BOUND, || async { cluster.status(1).await.is_some_and(|s| s["cluster_version"] == 2) }).await;
    for (versions, why) in [("3-4", "newer than the cluster version 2"), ("1-1", "older than the cluster version 2")] {
        cluster.stop(3);
        cluster.replica_mut(3).env = vec![("LODESTAR_TEST_WIRE_VERSIONS".into(), versions.into())];
        cluster.restart(3);
        let code = cluster.replica_mut(3).child.as_mut().unwrap().wait_exit(BOUND).code();
        cluster.replica_mut(3).child = None;
        assert_eq!(code, Some(78), "versions {versions}: exit code");
        assert!(
            cluster.replica(3).log().contains(why),
            "versions {versions}: the log says why:\n{}",
            kit::process::tail(&cluster.replica(3).dir.join("replica.log"), 20)
        );
        let s = cluster.status(1).await.unwrap();
        assert_eq!(s["cluster_version"], 2, "{s:#}");
        let (min, max) = versions.split_once('-').unwrap();
        let three = s["members"].as_array().unwrap().iter().find(|m| m["id"] == 3).unwrap();
        assert_eq!((three["versions"]["min"].to_string(), three["versions"]["max"].to_string()), (min.to_string(), max.to_string()), "{s:#}");
        assert!(s["incompatible"].to_string().contains("replica 3"), "{s:#}");
    }
    cluster.replica_mut(3).env.clear();
    cluster.restart(3);
    kit::until("replica 3 serves again", BOUND, || async {
        cluster.status(1).await.is_some_and(|s| s["incompatible"].as_array().is_some_and(Vec::is_empty) && s["members"][2]["status"]["ready"] == true)
    })
    .await;

    // A replica of the previous release asking to join (as a learner first)
    // a cluster at version 2 is refused before it is added: it could not
    // decode the log it would be sent. The members stay as they were, and
    // the cluster version still counts only them.
    let joiner = cluster.spawn_joiner_of(4, "", Some(previous_binary()));
    let (raft, api, xds) = (joiner.raft_addr(), joiner.api_addr(), joiner.xds_addr());
    let args = ["cluster", "add-node", "--id", "4", "--raft-addr", &raft, "--api-addr", &api, "--xds-addr", &xds];
    let (ok, out, err) = kit::eventually_or("the old joiner answers, and is refused", BOUND, || async {
        let (ok, out, err) = kit::cli(&cluster.replica(2).api(), &args);
        if !ok && err.contains("older than the cluster version 2") {
            Ok((ok, out, err))
        } else {
            Err(format!("ok {ok}: {out} {err}"))
        }
    })
    .await;
    assert!(!ok, "{out}");
    assert!(err.contains("replica 4 cannot join: it supports wire versions 1..1, older than the cluster version 2"), "{err}");
    let s = cluster.status(1).await.unwrap();
    let ids: Vec<u64> = s["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!((ids, &s["cluster_version"]), (vec![1, 2, 3], &json!(2)), "{s:#}");
    // A joiner of this build is let in, and counted at its versions.
    cluster.kill(4);
    let joiner = cluster.spawn_joiner(5, "");
    let (raft, api, xds) = (joiner.raft_addr(), joiner.api_addr(), joiner.xds_addr());
    let (ok, _, err) = kit::cli(&cluster.replica(2).api(), &["cluster", "add-node", "--id", "5", "--raft-addr", &raft, "--api-addr", &api, "--xds-addr", &xds]);
    assert!(ok, "{err}");
    // The leader asked it before adding it (the others learn within a second).
    let leader = cluster.wait_for_leader(BOUND).await;
    let s = cluster.status(leader).await.unwrap();
    let five = s["members"].as_array().unwrap().iter().find(|m| m["id"] == 5).cloned().unwrap_or_default();
    assert_eq!((&five["versions"]["max"], &s["cluster_version"], &s["incompatible"]), (&json!(2), &json!(2), &json!([])), "{s:#}");
}
