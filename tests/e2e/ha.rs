//! Envoys across three replicas: spread and rebalance, failover under load,
//! never going back in time, and the whole cluster down and up. Real
//! replica processes, real Envoys bootstrapped by `lodestar bootstrap`, real
//! HTTP traffic. Waits are bounded polls; measured times are printed, never
//! asserted (the figures go in the closing note).

use crate::kit;

use kit::envoy::{versions_at, Envoy, EnvoyOptions, Upstream};
use kit::forward::Forwarder;
use kit::mesh::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WEB: &str =
    "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  ports: [{name: http, number: 8080}]\n";

fn web_instance(name: &str, u: &Upstream) -> String {
    format!(
        "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: {name}, namespace: default}}\nspec: {{service: web, address: {}, ports: {{http: {}}}}}\n",
        u.addr.ip(),
        u.addr.port()
    )
}

/// Start an Envoy (sidecar `name` at `127.A.B.n`) bootstrapped with `xds`.
async fn envoy(fx: &Fixture, name: &str, n: u8, xds: Vec<String>) -> Envoy {
    envoy_with(fx, name, n, xds, false).await
}

async fn envoy_with(fx: &Fixture, name: &str, n: u8, xds: Vec<String>, delta: bool) -> Envoy {
    let mut o = EnvoyOptions::new(name, &fx.ip(n));
    o.xds_servers = xds;
    o.delta = delta;
    let mut e = Envoy::start(&fx.tmp.path().join(name), o);
    e.wait_ready(BOUND).await;
    e
}

fn all_xds(fx: &Fixture) -> Vec<String> {
    fx.cluster.replicas.iter().map(|r| r.xds_addr()).collect()
}

/// Which replica serves each proxy (node id → replica id), asking every
/// running replica's `/debug/syncz`; streams being closed are left out.
async fn placement(fx: &Fixture, running: &[u64]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for &id in running {
        let Ok(r) = fx.client.get(format!("{}/debug/syncz", fx.api(id))).timeout(Duration::from_secs(2)).send().await else { continue };
        let Ok(v) = r.json::<Value>().await else { continue };
        for p in v["proxies"].as_array().into_iter().flatten().filter(|p| p["closing"].is_null()) {
            out.insert(p["id"].as_str().unwrap().to_string(), id);
        }
    }
    out
}

fn counts(placement: &BTreeMap<String, u64>, replicas: &[u64]) -> Vec<usize> {
    replicas.iter().map(|id| placement.values().filter(|r| *r == id).count()).collect()
}

/// Until all six Envoys are placed and `ok` holds for the per-replica counts.
async fn wait_counts(fx: &Fixture, what: &str, ok: fn(&[usize]) -> bool) -> Vec<usize> {
    let running = [1, 2, 3];
    kit::eventually_or(what, Duration::from_secs(60), || async {
        let p = placement(fx, &running).await;
        let c = counts(&p, &running);
        if p.len() == 6 && ok(&c) {
            Ok(c)
        } else {
            Err(format!("placement {p:?}"))
        }
    })
    .await
}

async fn ok_through(fx: &Fixture, e: &Envoy) -> bool {
    let url = format!("http://{}:8080/", e.options.ip);
    send(&fx.client, &url, "web", &[]).await.is_ok_and(|r| r.status == 200)
}

/// Test 1. Six Envoys over three replicas: no replica serves more than half.
/// Restart one: the streams rebalance to two each, and no Envoy loses its
/// config meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_spread_and_rebalance_after_a_restart() {
    let mut fx = Fixture::start(3).await;
    let u = fx.upstream(100, "web-1").await;
    fx.apply(&format!("{WEB}---\n{}", web_instance("web-1", &u))).await;
    let mut envoys = Vec::new();
    for i in 0..6u8 {
        envoys.push(envoy(&fx, &format!("client-{i}"), 10 + i, all_xds(&fx)).await);
    }
    let c = wait_counts(&fx, "converged", |c| c.iter().all(|n| *n <= 3)).await;
    eprintln!("initial spread: {c:?}");
    for e in &envoys {
        assert!(ok_through(&fx, e).await, "{} does not route", e.options.name);
    }

    // Restart replica 3: its Envoys move to 1 and 2, then come back.
    fx.cluster.stop(3);
    let p = {
        kit::eventually_or("Envoys move off replica 3", BOUND, || async {
            let p = placement(&fx, &[1, 2]).await;
            if p.len() == 6 {
                Ok(p)
            } else {
                Err(format!("{p:?}"))
            }
        })
        .await
    };
    eprintln!("with replica 3 down: {:?}", counts(&p, &[1, 2]));
    fx.cluster.restart(3);
    let restarted = Instant::now();
    // Traffic keeps flowing through every Envoy while they move.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicUsize::new(0));
    let sent = Arc::new(AtomicUsize::new(0));
    let load = {
        let urls: Vec<String> = envoys.iter().map(|e| format!("http://{}:8080/", e.options.ip)).collect();
        let (stop, failures, sent, client) = (stop.clone(), failures.clone(), sent.clone(), fx.client.clone());
        tokio::spawn(async move {
            for i in 0..20_000usize {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let ok = send(&client, &urls[i % urls.len()], "web", &[]).await.is_ok_and(|r| r.status == 200);
                sent.fetch_add(1, Ordering::SeqCst);
                if !ok {
                    failures.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let c = wait_counts(&fx, "rebalanced", |c| c == [2, 2, 2]).await;
    eprintln!("rebalanced to {c:?} {:?} after the restart", restarted.elapsed());
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    assert_eq!(failures.load(Ordering::SeqCst), 0, "failed requests while rebalancing (of {})", sent.load(Ordering::SeqCst));
    for e in &envoys {
        assert_eq!(e.stat("control_plane.connected_state").await, Some(1), "{}", e.options.name);
        e.assert_no_rejections().await;
    }
}

/// Test 2. Steady load through an Envoy; kill -9 the replica serving it:
/// no request fails, the Envoy reconnects to a survivor, and a change
/// applied right after reaches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_under_load_drops_no_request() {
    let mut fx = Fixture::start(3).await;
    let (u1, u2) = (fx.upstream(100, "web-1").await, fx.upstream(101, "web-2").await);
    fx.apply(&format!("{WEB}---\n{}", web_instance("web-1", &u1))).await;
    let e = envoy(&fx, "client", 10, all_xds(&fx)).await;
    let id = e.options.node_id();
    let url = format!("http://{}:8080/", e.options.ip);
    wait_for(&fx.client, &url, "web", &[], "web-1 serves", |r| r.body == "web-1").await;
    let serving = placement(&fx, &[1, 2, 3]).await[&id];

    let stop = Arc::new(AtomicBool::new(false));
    let results = Arc::new(std::sync::Mutex::new(Vec::<Result<String, String>>::new()));
    let load = {
        let (stop, results, client, url) = (stop.clone(), results.clone(), fx.client.clone(), url.clone());
        tokio::spawn(async move {
            for _ in 0..20_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let r = send(&client, &url, "web", &[]).await.and_then(|r| if r.status == 200 { Ok(r.body) } else { Err(format!("{} {}", r.status, r.body)) });
                results.lock().unwrap().push(r);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    fx.cluster.kill(serving);
    let killed = Instant::now();
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|r| *r != serving).collect();
    let reconnect = loop {
        if placement(&fx, &survivors).await.contains_key(&id) {
            break killed.elapsed();
        }
        assert!(killed.elapsed() < BOUND, "no reconnect to a survivor");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("reconnected to a survivor {reconnect:?} after kill -9 of replica {serving}");

    // A change right after: web-2 replaces web-1.
    let api = fx.api(survivors[0]);
    let (status, _) = kit::apply(&fx.client, &api, &web_instance("web-2", &u2)).await;
    assert_eq!(status, 200);
    let r = fx.client.delete(format!("{api}/v1/resources/instances/default/web-1")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    wait_for(&fx.client, &url, "web", &[], "the change reaches the Envoy", |r| r.body == "web-2").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    load.await.unwrap();
    let results = results.lock().unwrap().clone();
    let failed: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    eprintln!("{} requests, {} failed", results.len(), failed.len());
    assert!(failed.is_empty(), "{} of {} requests failed: {:?}", failed.len(), results.len(), &failed[..failed.len().min(5)]);
    e.assert_no_rejections().await;
}

/// Test 3. An Envoy that ACKed revision N is forced onto a replica held
/// behind N: it must never receive older config. The lagging replica first
/// has no quorum (it refuses the stream; the Envoy keeps its config), then
/// catches up and serves N or newer. Checked from the versions Envoy holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_never_sends_older_config_sotw() {
    lagging_replica(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_never_sends_older_config_delta() {
    lagging_replica(true).await
}

async fn lagging_replica(delta: bool) {
    let mut fx = Fixture::start(3).await;
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let others: Vec<u64> = [1, 2, 3].into_iter().filter(|r| *r != leader).collect();
    let (lagging, follower) = (others[0], others[1]);
    let u = fx.upstream(100, "web-1").await;
    let rev0 = fx.apply_via(leader, &format!("{WEB}---\n{}", web_instance("web-1", &u))).await;
    let fwd = Forwarder::start(&fx.ip(200), &fx.cluster.replica(leader).xds_addr()).await;
    let e = envoy_with(&fx, "client", 10, vec![fwd.addr.to_string()], delta).await;
    let id = e.options.node_id();
    wait_acked(&fx, leader, &id, rev0).await;

    // Hold `lagging` behind, and move the Envoy to revision N on the leader:
    // every revision changes clusters, endpoints, listeners and routes.
    fx.cluster.pause(lagging);
    let mut n = rev0;
    for i in 0..3 {
        let yaml = format!(
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: extra-{i}, namespace: default}}\nspec:\n  ports: [{{name: http, number: {}}}]\n---\n{}",
            9100 + i,
            web_instance(&format!("web-x{i}"), &u)
        );
        n = fx.apply_via(leader, &yaml).await;
    }
    wait_acked(&fx, leader, &id, n).await;
    let held = envoy_versions(&e).await;
    assert_eq!((held.get("CDS"), held.get("LDS")), (Some(&n), Some(&n)), "{held:?}");

    // Watch the versions Envoy holds from now on: none may ever go down.
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (stop, admin) = (stop.clone(), e.admin());
        tokio::spawn(async move {
            let mut last: BTreeMap<String, u64> = BTreeMap::new();
            let mut regressions = Vec::new();
            for _ in 0..2000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                for (k, v) in versions_at(&admin).await {
                    if let Some(prev) = last.insert(k.clone(), v) {
                        if v < prev {
                            regressions.push(format!("{k}: {prev} -> {v}"));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (last, regressions)
        })
    };

    // The leader dies, the other follower hangs: the lagging replica is
    // alone, without a quorum, and the Envoy can only reach it.
    fx.cluster.pause(follower);
    fx.cluster.kill(leader);
    fx.cluster.resume(lagging);
    fwd.switch(&fx.cluster.replica(lagging).xds_addr());
    let cut_off = Instant::now();
    // For a while it can neither catch up nor serve: it refuses.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (s, ready) = kit::get_json(&fx.client, &format!("{}/readyz", fx.api(lagging))).await;
    assert_eq!(s, 503, "a replica without a quorum is not ready: {ready}");
    // It may have accepted the stream before it knew it was cut off, but it
    // sent nothing older than what the Envoy holds.
    let (_, syncz) = kit::get_json(&fx.client, &format!("{}/debug/syncz", fx.api(lagging))).await;
    for p in syncz["proxies"].as_array().into_iter().flatten() {
        for t in TYPES {
            if let Some(v) = p["types"][t]["sent_version"].as_str() {
                assert!(v.parse::<u64>().unwrap() >= n, "the lagging replica sent {t} at {v} < {n}: {p:#}");
            }
        }
    }
    assert!(ok_through(&fx, &e).await, "the Envoy keeps routing with its config");

    // The follower comes back: a quorum again; the lagging replica catches
    // up and serves the Envoy N or newer.
    fx.cluster.resume(follower);
    let acked = wait_acked(&fx, lagging, &id, n).await;
    eprintln!("the Envoy is served by the caught-up replica {:?} after being cut off (acked {acked})", cut_off.elapsed());
    stop.store(true, Ordering::SeqCst);
    let (last, regressions) = monitor.await.unwrap();
    assert!(regressions.is_empty(), "Envoy went back in time: {regressions:?}");
    assert!(last["CDS"] >= n && last["LDS"] >= n, "{last:?}");
    // And a write through the caught-up replica reaches it (an endpoint
    // change: EDS only).
    let next = fx.apply_via(lagging, &web_instance("web-late", &u)).await;
    wait_acked_types(&fx, lagging, &id, next, &["EDS"]).await;
    e.assert_no_rejections().await;
}

/// Until `replica`'s `/debug/syncz` shows the proxy ACKed `revision` or
/// newer for every type; returns the lowest ACKed version.
async fn wait_acked(fx: &Fixture, replica: u64, id: &str, revision: u64) -> u64 {
    wait_acked_types(fx, replica, id, revision, &TYPES).await
}

async fn wait_acked_types(fx: &Fixture, replica: u64, id: &str, revision: u64, types: &[&str]) -> u64 {
    kit::eventually(&format!("proxy {id} ACKs {revision} on replica {replica}"), Duration::from_secs(30), || async {
        let r = fx.client.get(format!("{}/debug/syncz", fx.api(replica))).timeout(Duration::from_secs(2)).send().await.ok()?;
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let p = v["proxies"].as_array().and_then(|ps| ps.iter().find(|p| p["id"] == id))?;
        let acked: Vec<u64> = types.iter().filter_map(|t| p["types"][t]["acked_version"].as_str()?.parse().ok()).collect();
        (acked.len() == types.len() && acked.iter().all(|a| *a >= revision)).then(|| *acked.iter().min().unwrap())
    })
    .await
}

async fn envoy_versions(e: &Envoy) -> BTreeMap<String, u64> {
    versions_at(&e.admin()).await
}

/// Test 4. Every replica down: the Envoys keep routing with their last
/// config. Every replica back: they reconnect, and every acknowledged write
/// is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whole_cluster_down_then_up() {
    let mut fx = Fixture::start(3).await;
    let u = fx.upstream(100, "web-1").await;
    fx.apply(&format!("{WEB}---\n{}", web_instance("web-1", &u))).await;
    let e = envoy(&fx, "client", 10, all_xds(&fx)).await;
    let url = format!("http://{}:8080/", e.options.ip);
    wait_for(&fx.client, &url, "web", &[], "web-1 serves", |r| r.body == "web-1").await;
    // Acknowledged writes, each its own revision.
    let mut acked = Vec::new();
    for i in 0..20 {
        let (s, body) = kit::apply(&fx.client, &fx.api(1 + (i % 3)), vec![kit::vs(&format!("vs-{i}"), "default", "a")]).await;
        assert_eq!(s, 200, "{body}");
        acked.push(body["revision"].as_u64().unwrap());
    }
    for id in 1..=3 {
        fx.cluster.kill(id);
    }
    for _ in 0..50 {
        let r = send(&fx.client, &url, "web", &[]).await.expect("Envoy routes with its last config");
        assert_eq!((r.status, r.body.as_str()), (200, "web-1"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for id in 1..=3 {
        fx.cluster.restart(id);
    }
    fx.cluster.wait_for_leader(BOUND).await;
    let id = e.options.node_id();
    kit::until("the Envoy reconnects", Duration::from_secs(30), || async { placement(&fx, &[1, 2, 3]).await.contains_key(&id) }).await;
    let (_, list) = kit::get_json(&fx.client, &format!("{}/v1/resources/vs", fx.api(2))).await;
    let names: Vec<&str> = list["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 20, "{names:?} at revision {}; acknowledged: {acked:?}", list["revision"]);
    assert!(list["revision"].as_u64().unwrap() >= *acked.last().unwrap());
    // And new config flows again.
    let (s, _) = kit::apply(
        &fx.client,
        &fx.api(3),
        vec![json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"hosts": ["web"], "http": [{"route": [{"destination": {"host": "web"}}], "headers": {"response": {"set": {"x-after": "restart"}}}}]}})],
    )
    .await;
    assert_eq!(s, 200);
    wait_for(&fx.client, &url, "web", &[], "a change after the restart", |r| r.header("x-after") == Some("restart")).await;
    e.assert_no_rejections().await;
}
