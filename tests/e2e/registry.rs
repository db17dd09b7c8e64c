//! The service registry end to end: instances registered through the API
//! with health checks, TTLs and leases, on real replica processes; real
//! Envoys routing to real upstreams; a watched directory feeding the store.
//! Every wait is a bounded poll; no timing is asserted.

use crate::kit;

use kit::mesh::*;
use kit::Cluster;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn instance(name: &str, service: &str, addr: &std::net::SocketAddr, check: Value) -> Value {
    let mut spec = json!({"service": service, "address": addr.ip().to_string(), "ports": {"http": addr.port()}});
    if !check.is_null() {
        spec["healthCheck"] = check;
    }
    json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

const REVIEWS_SERVICE: &str =
    "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: reviews, namespace: default}\nspec:\n  ports: [{name: http, number: 9080}]\n";

async fn get_instance(client: &reqwest::Client, api: &str, name: &str) -> (u16, Value) {
    kit::get_json(client, &format!("{api}/v1/resources/instances/default/{name}")).await
}

/// Poll until `pred` holds for the instance (status code, body).
async fn wait_instance(client: &reqwest::Client, api: &str, name: &str, what: &str, pred: impl Fn(u16, &Value) -> bool) -> Value {
    kit::eventually_or(&format!("{name}: {what}"), BOUND, || async {
        let (status, body) = get_instance(client, api, name).await;
        if pred(status, &body) {
            Ok(body)
        } else {
            Err(format!("{status} {body:#}"))
        }
    })
    .await
}

fn health(body: &Value) -> Option<&str> {
    body["status"]["health"].as_str()
}

/// Test 1: three instances with HTTP checks serve through Envoy; one
/// upstream dies, its check fails on whichever replica probes it, the
/// instance turns unhealthy and Envoy stops sending it traffic. The probes
/// are spread: each check runs on exactly one replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_http_check_takes_an_instance_out_of_traffic() {
    let fx = Fixture::start(3).await;
    let ups = [fx.upstream(11, "reviews-1").await, fx.upstream(12, "reviews-2").await, fx.upstream(13, "reviews-3").await];
    fx.apply(REVIEWS_SERVICE).await;
    let instances: Vec<Value> = ups
        .iter()
        .enumerate()
        .map(|(i, u)| instance(&format!("reviews-{}", i + 1), "reviews", &u.addr, json!({"http": format!("http://{}/healthz", u.addr), "interval": "300ms"})))
        .collect();
    kit::applied(&fx.client, &fx.api(1), instances).await;
    for i in 1..=3 {
        wait_instance(&fx.client, &fx.api(1), &format!("reviews-{i}"), "healthy", |_, b| health(b) == Some("Healthy")).await;
    }
    let revision = fx.cluster.local_revision(1).await.unwrap();
    let proxy = fx.sidecar("productpage", 1, 2, false, revision).await;
    let url = proxy.url(9080, "/");
    let replies = load(&fx.client, &url, "reviews", &[], 60, 6).await;
    let seen: BTreeSet<String> = replies.iter().map(|r| r.body.clone()).collect();
    assert_eq!(seen, ["reviews-1", "reviews-2", "reviews-3"].map(String::from).into(), "{:?}", tally(&replies));

    // Once the replicas know each other (gossip, each second), each check
    // is probed by exactly one of them.
    let deadline = Instant::now() + BOUND;
    let probed = loop {
        let mut probed: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        let mut all_live = true;
        for id in 1..=3u64 {
            let (_, v) = kit::get_json(&fx.client, &format!("{}/debug/checks", fx.api(id))).await;
            all_live &= v["liveVoters"] == json!([1, 2, 3]);
            for c in v["checks"].as_array().unwrap() {
                probed.entry(c["instance"].as_str().unwrap().to_string()).or_default().push(id);
            }
        }
        if all_live && probed.len() == 3 && probed.values().all(|ids| ids.len() == 1) {
            break probed;
        }
        assert!(Instant::now() < deadline, "checks not spread one per replica: {probed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Kill reviews-2's upstream.
    let [u1, u2, u3] = ups;
    drop(u2);
    let b = wait_instance(&fx.client, &fx.api(3), "reviews-2", "unhealthy", |_, b| health(b) == Some("Unhealthy")).await;
    assert!(b["status"]["reason"].as_str().unwrap().contains("/healthz"), "{b:#}");
    // The replica that probes it recorded the transition.
    assert_eq!(json!(probed["instances/default/reviews-2"]), json!([b["status"]["checkedBy"]]), "{b:#}");
    let rev = b["metadata"]["modRevision"].as_u64().unwrap();
    proxy.wait_synced(rev).await;
    // Envoy no longer sends it traffic: every request succeeds, from 1 and 3.
    let replies = load(&fx.client, &url, "reviews", &[], 60, 6).await;
    assert_eq!(
        tally(&replies),
        BTreeMap::from([("200 reviews-1".to_string(), tally_count(&replies, "reviews-1")), ("200 reviews-3".into(), tally_count(&replies, "reviews-3"))])
    );
    assert!(tally_count(&replies, "reviews-1") > 0 && tally_count(&replies, "reviews-3") > 0);

    // `lodestar get instances -s reviews` shows it.
    let (ok, out, err) = kit::cli(&fx.api(2), &["get", "instances", "-s", "reviews"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.contains("reviews-2")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("Unhealthy"), "{out}");
    proxy.envoy.assert_no_rejections().await;

    // initialDelay (WorkloadGroup's initialDelaySeconds): no probe before
    // it has passed; the instance stays unknown, then the first failed
    // probe (a closed port, every 300 ms) takes it out.
    let closed: std::net::SocketAddr = format!("{}:1", fx.ip(14)).parse().unwrap();
    let written = Instant::now();
    let delayed = instance("reviews-4", "reviews", &closed, json!({"tcp": closed.to_string(), "interval": "300ms", "initialDelay": "2s"}));
    kit::applied(&fx.client, &fx.api(1), vec![delayed]).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let (_, b) = get_instance(&fx.client, &fx.api(1), "reviews-4").await;
    assert_eq!(health(&b), None, "not probed during its initial delay: {b:#}");
    wait_instance(&fx.client, &fx.api(1), "reviews-4", "unhealthy", |_, b| health(b) == Some("Unhealthy")).await;
    assert!(written.elapsed() >= Duration::from_secs(2), "probed before its initial delay: after {:?}", written.elapsed());
    drop((u1, u3));
}

fn tally_count(replies: &[Reply], body: &str) -> usize {
    replies.iter().filter(|r| r.status == 200 && r.body == body).count()
}

/// Test 2: an instance that stops heartbeating turns unhealthy after its
/// TTL, then is deregistered after `deregisterAfter`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lapsed_ttl_turns_unhealthy_then_deregisters() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let (status, body) = kit::apply(&c.http, &api, vec![instance("ttl-1", "ttl-svc", &addr, json!({"ttl": "1s", "deregisterAfter": "1s"}))]).await;
    assert_eq!(status, 200, "{body:#}");
    // Heartbeats keep it healthy for well over its TTL.
    for _ in 0..12 {
        let r = c.http.post(format!("{api}/v1/resources/instances/default/ttl-1/heartbeat")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["ttlSeconds"], 1.0);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, b) = get_instance(&c.http, &api, "ttl-1").await;
    assert!(health(&b).is_none(), "still as registered while heartbeating: {b:#}");
    // Stop: unhealthy, then gone.
    let b = wait_instance(&c.http, &api, "ttl-1", "unhealthy", |_, b| health(b) == Some("Unhealthy")).await;
    assert!(b["status"]["reason"].as_str().unwrap().contains("TTL"), "{b:#}");
    wait_instance(&c.http, &api, "ttl-1", "deregistered", |s, _| s == 404).await;
    // A heartbeat for it now is NOT_FOUND.
    let r = c.http.post(format!("{api}/v1/resources/instances/default/ttl-1/heartbeat")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// Test 3: revoking a lease deletes it and every instance it owns in one
/// revision; an instance it does not own stays. A lease left without
/// keepalives expires the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revocation_and_expiry_remove_owned_instances_in_one_revision() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let lease = |name: &str, ttl: &str| json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Lease", "metadata": {"name": name}, "spec": {"ttl": ttl}});
    let owned = |name: &str, lease: &str, port: u16| {
        let mut i = instance(name, "leased", &format!("127.0.0.1:{port}").parse().unwrap(), Value::Null);
        i["spec"]["lease"] = json!(lease);
        i
    };
    let mut docs = vec![lease("agent-a", "30s"), lease("agent-b", "1s")];
    docs.extend((0..3).map(|i| owned(&format!("a-{i}"), "agent-a", 9000 + i)));
    docs.extend((0..2).map(|i| owned(&format!("b-{i}"), "agent-b", 9100 + i)));
    docs.push(instance("free", "leased", &"127.0.0.1:9200".parse().unwrap(), Value::Null));
    let (status, body) = kit::apply(&c.http, &api, docs).await;
    assert_eq!(status, 200, "{body:#}");

    let r = c.http.delete(format!("{api}/v1/resources/leases/default/agent-a")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let revision = v["revision"].as_u64().unwrap();
    let deleted: BTreeSet<String> =
        v["items"].as_array().unwrap().iter().filter(|i| i["action"] == "deleted").map(|i| i["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(deleted, ["agent-a", "a-0", "a-1", "a-2"].map(String::from).into(), "{v:#}");
    // The watch history agrees: four deletes, one revision.
    let events = watch_events(&c.http, &api, revision - 1, revision).await;
    assert_eq!(events.len(), 4, "{events:#?}");
    assert!(events.iter().all(|e| e["type"] == "DELETE" && e["revision"] == revision), "{events:#?}");

    // agent-b gets no keepalive: it expires with its instances.
    for name in ["b-0", "b-1"] {
        wait_instance(&c.http, &api, name, "expired with its lease", |s, _| s == 404).await;
    }
    let (s, _) = kit::get_json(&c.http, &format!("{api}/v1/resources/leases/default/agent-b")).await;
    assert_eq!(s, 404);
    let (s, _) = get_instance(&c.http, &api, "free").await;
    assert_eq!(s, 200, "an instance without a lease stays");
}

/// Events of the NDJSON watch after `from`, up to and including `to`.
async fn watch_events(http: &reqwest::Client, api: &str, from: u64, to: u64) -> Vec<Value> {
    let mut r = http.get(format!("{api}/v1/watch?fromRevision={from}")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let mut buf = String::new();
    let mut out: Vec<Value> = Vec::new();
    let deadline = Instant::now() + BOUND;
    while Instant::now() < deadline {
        // Stop after a quiet moment once `to` was reached.
        let wait = if out.last().and_then(|e| e["revision"].as_u64()) == Some(to) { 300 } else { 5000 };
        let Ok(Ok(Some(chunk))) = tokio::time::timeout(Duration::from_millis(wait), r.chunk()).await else { break };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(i) = buf.find('\n') {
            let line: String = buf.drain(..=i).collect();
            let v: Value = serde_json::from_str(line.trim()).unwrap();
            if v["revision"].as_u64().is_some_and(|r| r > to) {
                return out;
            }
            if v.get("type").is_some() {
                out.push(v);
            }
        }
    }
    out
}

/// Test 4: heartbeats flow (through every replica) while the leader is
/// killed: the new leader expires nothing, during or after the election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_failover_expires_no_heartbeating_instance() {
    let mut c = Cluster::start(3, "").await;
    let api1 = c.replica(1).api();
    let names: Vec<String> = (0..5).map(|i| format!("hb-{i}")).collect();
    let docs: Vec<Value> =
        names.iter().enumerate().map(|(i, n)| instance(n, "hb", &format!("127.0.0.1:{}", 9300 + i).parse().unwrap(), json!({"ttl": "2s"}))).collect();
    let (status, body) = kit::apply(&c.http, &api1, docs).await;
    assert_eq!(status, 200, "{body:#}");
    let registered = body["revision"].as_u64().unwrap();

    // Heartbeats every 300 ms for every instance, spread over the replicas
    // (a failed one is retried through the next replica). Bounded.
    let stop = Arc::new(AtomicBool::new(false));
    let apis: Vec<String> = (1..=3).map(|id| c.replica(id).api()).collect();
    let hb = {
        let (stop, names, http) = (stop.clone(), names.clone(), c.http.clone());
        tokio::spawn(async move {
            let mut n = 0usize;
            for _ in 0..200 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for name in &names {
                    for attempt in 0..3 {
                        let api = &apis[(n + attempt) % apis.len()];
                        let url = format!("{api}/v1/resources/instances/default/{name}/heartbeat");
                        let ok = http.post(url).timeout(Duration::from_millis(700)).send().await.is_ok_and(|r| r.status() == 200);
                        if ok {
                            break;
                        }
                    }
                    n += 1;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let old = c.wait_for_leader(BOUND).await;
    c.kill(old);
    let new = kit::eventually("a new leader", BOUND, || async { c.leader().await.filter(|l| *l != old) }).await;
    // Two TTLs past the election, heartbeats still flowing.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let api = c.replica(new).api();
    for name in &names {
        let (s, b) = get_instance(&c.http, &api, name).await;
        assert_eq!(s, 200, "{name}: {b:#}");
        assert!(health(&b).is_none(), "{name} was marked: {b:#}");
        assert_eq!(b["metadata"]["modRevision"].as_u64(), Some(registered), "{name} changed after registration: {b:#}");
    }
    // And stopping the heartbeats does expire them, on the new leader.
    stop.store(true, Ordering::SeqCst);
    hb.await.unwrap();
    wait_instance(&c.http, &api, &names[0], "unhealthy once heartbeats stop", |_, b| health(b) == Some("Unhealthy")).await;
}

/// Test 5: an endpoint change reaches Envoy as EDS only: the server's push
/// record (`/debug/syncz`) shows pushes of EDS alone, and Envoy's own stats
/// agree (`cluster_manager.cds.update_success` unchanged, the cluster's EDS
/// updates up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_change_pushes_only_eds() {
    for delta in [false, true] {
        let fx = Fixture::start(1).await;
        let u1 = fx.upstream(11, "reviews-1").await;
        let u2 = fx.upstream(12, "reviews-2").await;
        fx.apply(REVIEWS_SERVICE).await;
        let rev = kit::applied(&fx.client, &fx.api(1), vec![instance("reviews-1", "reviews", &u1.addr, Value::Null)]).await;
        let proxy = fx.sidecar("productpage", 1, 1, delta, rev).await;
        let url = proxy.url(9080, "/");
        wait_for(&fx.client, &url, "reviews", &[], "reviews-1 serves", |r| r.body == "reviews-1").await;
        let cluster = "outbound|9080||reviews.default.svc.cluster.local";
        let before_stats = proxy.envoy.stats().await;
        let before = proxy.wait_synced(rev).await;

        let rev = kit::applied(&fx.client, &fx.api(1), vec![instance("reviews-2", "reviews", &u2.addr, Value::Null)]).await;
        let after = proxy.wait_synced(rev).await;
        wait_for(&fx.client, &url, "reviews", &[], "reviews-2 serves", |r| r.body == "reviews-2").await;
        for t in ["CDS", "LDS", "RDS"] {
            assert_eq!(after["types"][t]["pushes"], before["types"][t]["pushes"], "delta={delta}: {t} pushed: {after:#}");
        }
        assert_eq!(after["types"]["EDS"]["pushes"].as_u64(), before["types"]["EDS"]["pushes"].as_u64().map(|p| p + 1), "delta={delta}: {after:#}");
        assert_eq!(after["types"]["EDS"]["acked_version"], rev.to_string());

        let stats = proxy.envoy.stats().await;
        let eds_key = format!("cluster.{cluster}.update_success");
        for s in ["cluster_manager.cds.update_success", "listener_manager.lds.update_success"] {
            assert_eq!(stats.get(s), before_stats.get(s), "delta={delta}: {s}");
        }
        assert!(stats.get(&eds_key) > before_stats.get(&eds_key), "delta={delta}: {eds_key}: {:?} -> {:?}", before_stats.get(&eds_key), stats.get(&eds_key));
        proxy.envoy.assert_no_rejections().await;
    }
}

/// Test 6: a watched directory drives config and static instances: files
/// added, edited and removed are followed; what the API wrote is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_directory_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!("watch_dir = {:?}\nwatch_dir_poll_ms = 100\n", dir.path().display().to_string());
    let c = Cluster::start(3, &toml).await;
    let api = c.replica(2).api();
    // Written through the API: never touched by the adapter.
    let (s, _) = kit::apply(&c.http, &api, vec![instance("manual", "web", &"127.0.0.1:8000".parse().unwrap(), Value::Null)]).await;
    assert_eq!(s, 200);

    std::fs::create_dir(dir.path().join("web")).unwrap();
    let write = |file: &str, text: &str| {
        let tmp = dir.path().join(format!(".{}.tmp", file.replace('/', "_")));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, dir.path().join(file)).unwrap();
    };
    write("web/service.yaml", "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports: [{name: http, number: 80}]\n");
    write(
        "web/instances.yaml",
        "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: web-1}\nspec: {service: web, address: 127.0.0.11, port: 8080}\n---\napiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: web-2}\nspec: {service: web, address: 127.0.0.12, port: 8080}\n",
    );
    write("vs.yaml", "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: web}\nspec:\n  hosts: [web]\n  http:\n  - route:\n    - destination: {host: web}\n");
    let b = wait_instance(&c.http, &api, "web-2", "applied from the directory", |s, _| s == 200).await;
    assert_eq!(b["metadata"]["annotations"]["lodestar.io/source"], "directory");
    let (s, _) = kit::get_json(&c.http, &format!("{api}/v1/resources/virtualservices/default/web")).await;
    assert_eq!(s, 200);

    // Edit: the address follows.
    write(
        "web/instances.yaml",
        "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: web-1}\nspec: {service: web, address: 127.0.0.21, port: 8080}\n",
    );
    wait_instance(&c.http, &api, "web-1", "edited", |_, b| b["spec"]["address"] == "127.0.0.21").await;
    wait_instance(&c.http, &api, "web-2", "removed from its file", |s, _| s == 404).await;

    // A broken file changes nothing.
    write("broken.yaml", "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: bad}\nspec: {address: 127.0.0.9}\n");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (s, _) = get_instance(&c.http, &api, "web-1").await;
    assert_eq!(s, 200, "a broken file must not remove anything");
    std::fs::remove_file(dir.path().join("broken.yaml")).unwrap();

    // Delete files: their resources go; the API's stay.
    std::fs::remove_file(dir.path().join("vs.yaml")).unwrap();
    std::fs::remove_dir_all(dir.path().join("web")).unwrap();
    wait_instance(&c.http, &api, "web-1", "deleted with its file", |s, _| s == 404).await;
    let (s, _) = kit::get_json(&c.http, &format!("{api}/v1/resources/virtualservices/default/web")).await;
    assert_eq!(s, 404);
    let (s, _) = get_instance(&c.http, &api, "manual").await;
    assert_eq!(s, 200);
}

/// Bad registrations are rejected with the field and the reason, and store
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_registrations_name_the_field() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let base = || json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": "x"}, "spec": {"service": "s", "address": "127.0.0.1", "port": 80}});
    let mut no_service = base();
    no_service["spec"].as_object_mut().unwrap().remove("service");
    let mut bad_port = base();
    bad_port["spec"]["port"] = json!(70000);
    let mut ttl0 = base();
    ttl0["spec"]["healthCheck"] = json!({"ttl": "0s"});
    let mut unknown_lease = base();
    unknown_lease["spec"]["lease"] = json!("nope");
    let mut two_checks = base();
    two_checks["spec"]["healthCheck"] = json!({"ttl": "5s", "tcp": "127.0.0.1:80"});
    let lease0 = json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"ttl": "0s"}});
    for (doc, field, reason) in [
        (no_service, "resources[0].spec", "service"),
        (bad_port, "resources[0].spec.port", "65535"),
        (ttl0, "resources[0].spec.healthCheck.ttl", "greater than 0"),
        (unknown_lease, "resources[0].spec.lease", "not found"),
        (two_checks, "resources[0].spec.healthCheck", "exactly one"),
        (lease0, "resources[0].spec.ttl", "greater than 0"),
    ] {
        let (status, body) = kit::apply(&c.http, &api, vec![doc]).await;
        assert_eq!(status, 400, "{body:#}");
        let fields = body["error"]["fields"].as_array().unwrap();
        assert!(fields.iter().any(|f| f["field"] == field && f["reason"].as_str().unwrap().contains(reason)), "want {field}: {reason}; got {body:#}");
    }
    let (_, list) = kit::get_json(&c.http, &format!("{api}/v1/resources/instances")).await;
    assert_eq!(list["items"], json!([]));
    // Heartbeats for what does not exist, or has no TTL.
    let r = c.http.post(format!("{api}/v1/resources/leases/default/nope/heartbeat")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let (s, _) = kit::apply(&c.http, &api, vec![base()]).await;
    assert_eq!(s, 200);
    let r = c.http.post(format!("{api}/v1/resources/instances/default/x/heartbeat")).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let r = c.http.post(format!("{api}/v1/resources/virtualservices/default/x/heartbeat")).send().await.unwrap();
    assert_eq!(r.status(), 400);
}
