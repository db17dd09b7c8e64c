//! The push engine: Sidecar scoping, debouncing, a slow client, `wait`,
//! metrics and debug endpoints. Real replica processes, real Envoys, and
//! hand-rolled ADS streams where a test needs one that misbehaves.

use crate::kit;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use kit::envoy::EnvoyOptions;
use kit::mesh::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

async fn proxy_entry(fx: &Fixture, replica: u64, id: &str) -> Value {
    let v = syncz(&fx.client, &fx.api(replica)).await;
    v["proxies"].as_array().and_then(|ps| ps.iter().find(|p| p["id"] == id).cloned()).unwrap_or(Value::Null)
}

fn pushes(p: &Value) -> Vec<u64> {
    TYPES.iter().map(|t| p["types"][t]["pushes"].as_u64().unwrap_or(0)).collect()
}

/// A proxy scoped by a Sidecar to its own namespace gets no push when a
/// service outside its scope changes; an unscoped proxy does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_outside_a_sidecars_scope_pushes_nothing_to_it() {
    let fx = Fixture::start(1).await;
    let up = fx.upstream(100, "api-1").await;
    let rev = fx
        .apply(&format!(
            "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {{name: scoped, namespace: team-a}}\nspec:\n  egress:\n  - hosts: [./*]\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: api, namespace: team-a}}\nspec:\n  ports: [{{name: http, number: 8080}}]\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: api-1, namespace: team-a}}\nspec: {{service: api, address: {}, ports: {{http: {}}}}}\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: other, namespace: team-b}}\nspec:\n  ports: [{{name: http, number: 9090}}]\n",
            up.addr.ip(),
            up.addr.port()
        ))
        .await;
    let mut scoped = EnvoyOptions::new("client", &fx.ip(1));
    scoped.namespace = "team-a".into();
    let scoped = fx.proxy(scoped, 1, rev).await;
    let open = fx.sidecar("open", 2, 1, false, rev).await;
    // Moved to `rev` with every type ACKed (an unaffected proxy moves
    // without a push).
    let moved = |id: String, rev: u64| {
        let fx = &fx;
        async move {
            kit::eventually_or(&format!("{id} moves to {rev}"), BOUND, || async {
                let p = proxy_entry(fx, 1, &id).await;
                if p["pushed_revision"].as_u64().is_some_and(|r| r >= rev) && TYPES.iter().all(|t| p["types"][t]["in_sync"] == true) {
                    Ok(())
                } else {
                    Err(format!("{p:#}"))
                }
            })
            .await
        }
    };
    let (scoped_before, open_before) = (pushes(&proxy_entry(&fx, 1, &scoped.id).await), pushes(&proxy_entry(&fx, 1, &open.id).await));

    // team-b's service gets an instance: outside team-a's Sidecar.
    let rev = fx.apply("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: other-1, namespace: team-b}\nspec: {service: other, address: 127.0.0.9, port: 9090}\n").await;
    open.wait_synced(rev).await;
    moved(scoped.id.clone(), rev).await;
    let (scoped_after, open_after) = (pushes(&proxy_entry(&fx, 1, &scoped.id).await), pushes(&proxy_entry(&fx, 1, &open.id).await));
    assert_eq!(scoped_after, scoped_before, "the scoped proxy got a push (CDS, EDS, LDS, RDS counts)");
    assert_ne!(open_after, open_before, "the unscoped proxy sees team-b: it must get the endpoint");
    // And a change inside its scope does reach it.
    let rev = fx.apply("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: api, namespace: team-a}\nspec:\n  hosts: [api]\n  http:\n  - route:\n    - destination: {host: api}\n    timeout: 2s\n").await;
    scoped.wait_synced(rev).await;
    assert_ne!(pushes(&proxy_entry(&fx, 1, &scoped.id).await), scoped_after);
    scoped.envoy.assert_no_rejections().await;
}

/// A burst of 100 writes costs far fewer pushes than writes, and the last
/// write wins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_writes_is_coalesced_and_the_last_wins() {
    // A wide window makes the coalescing visible on any machine speed.
    let mut fx = Fixture::start(1).await;
    fx.cluster.stop(1);
    fx.cluster.replicas[0].extra_toml = "push_debounce_ms = 300\n".into();
    fx.cluster.restart(1);
    fx.cluster.wait_for_leader(BOUND).await;
    let up = fx.upstream(100, "web").await;
    let rev = fx.apply(&web(&up, 0)).await;
    let p = fx.sidecar("client", 1, 1, false, rev).await;
    let before = proxy_entry(&fx, 1, &p.id).await["types"]["RDS"]["pushes"].as_u64().unwrap();
    let mut last = 0;
    for i in 1..=100 {
        last = fx.apply(&vs(i)).await;
    }
    p.wait_synced(last).await;
    let after = proxy_entry(&fx, 1, &p.id).await;
    let rds = after["types"]["RDS"]["pushes"].as_u64().unwrap() - before;
    eprintln!("100 writes, {rds} route pushes");
    assert!((1..=25).contains(&rds), "{rds} route pushes for 100 writes");
    // The last write's route is what Envoy serves.
    let r = wait_for(&fx.client, &p.url(8080, "/"), "web", &[], "the last write", |r| r.header("x-write").is_some()).await;
    assert_eq!(r.header("x-write"), Some("100"));
}

fn web(up: &kit::envoy::Upstream, _: u32) -> String {
    format!(
        "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: web, namespace: default}}\nspec:\n  ports: [{{name: http, number: 8080}}]\n---\n\
         apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: web-1, namespace: default}}\nspec: {{service: web, address: {}, ports: {{http: {}}}}}\n",
        up.addr.ip(),
        up.addr.port()
    )
}

fn vs(i: u32) -> String {
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: web, namespace: default}}\nspec:\n  hosts: [web]\n  http:\n  - route:\n    - destination: {{host: web}}\n    headers: {{response: {{set: {{x-write: \"{i}\"}}}}}}\n"
    )
}

fn node(id: &str) -> Node {
    Node { id: id.into(), cluster: "test".into(), ..Default::default() }
}

/// A stream that subscribes to everything and then never reads: it must
/// not hold back the others, and the replica's memory stays bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_does_not_hold_back_the_others() {
    let fx = Fixture::start(1).await;
    let up = fx.upstream(100, "web").await;
    // A mesh with a sizeable config: 300 services.
    let mut yaml = web(&up, 0);
    for i in 0..300 {
        yaml.push_str(&format!("---\napiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: svc-{i}, namespace: default}}\nspec:\n  ports: [{{name: http, number: {}}}]\n", 10000 + i));
    }
    let rev = fx.apply(&yaml).await;
    let good = fx.sidecar("good", 1, 1, false, rev).await;

    // The stalled stream: one request, never a read.
    let mut client = kit::ads_client(1, &fx.cluster.replica(1).xds_addr());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(DiscoveryRequest {
        node: Some(node("sidecar~127.0.0.77~stalled.default~default.svc.cluster.local")),
        type_url: CLUSTER_TYPE.into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let _stalled = client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap();

    let pid = fx.cluster.replicas[0].pid().unwrap();
    let rss_before = rss_kib(pid);
    // 40 revisions that each change every cluster (a mesh-wide policy).
    for i in 0..40 {
        let dr = format!(
            "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {{name: all, namespace: istio-system}}\nspec:\n  host: \"*.local\"\n  trafficPolicy: {{connectionPool: {{tcp: {{maxConnections: {}}}}}}}\n",
            100 + i
        );
        let rev = fx.apply(&dr).await;
        // The good proxy keeps up, revision after revision.
        good.wait_synced(rev).await;
    }
    let rss_after = rss_kib(pid);
    eprintln!("replica RSS {rss_before} KiB -> {rss_after} KiB with a stalled stream over 40 full pushes");
    assert!(rss_after < rss_before + 100 * 1024, "RSS grew from {rss_before} KiB to {rss_after} KiB");
    good.envoy.assert_no_rejections().await;
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()).unwrap()
}

/// `apply --wait` returns once every proxy has ACKed the write; `wait`
/// reports a proxy that rejected it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_returns_when_every_proxy_acked_and_reports_nacks() {
    let fx = Fixture::start(3).await;
    let up = fx.upstream(100, "web").await;
    let rev = fx.apply(&web(&up, 0)).await;
    let mut envoys: Vec<kit::envoy::Envoy> = Vec::new();
    let mut ids = Vec::new();
    for (i, replica) in [1u64, 2, 3].into_iter().enumerate() {
        let p = fx.sidecar(&format!("client-{i}"), 10 + i as u8, replica, i == 1, rev).await;
        ids.push(p.id.clone());
        envoys.push(p.envoy);
    }
    let file = fx.tmp.path().join("vs.yaml");
    std::fs::write(&file, vs(7)).unwrap();
    let (ok, out, err) = kit::cli(&fx.api(2), &["apply", "-f", file.to_str().unwrap(), "--wait", "--timeout", "20s"]);
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("3 of 3 proxies in sync"), "{out}");
    let revision: u64 = err.lines().find_map(|l| l.strip_prefix("revision ")).unwrap().trim().parse().unwrap();
    // Right after, every Envoy has ACKed that revision's routes.
    for (i, id) in ids.iter().enumerate() {
        let p = proxy_entry(&fx, 1 + i as u64, id).await;
        let acked: u64 = p["types"]["RDS"]["acked_version"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!(acked >= revision && p["types"]["RDS"]["in_sync"] == true, "{id}: {p:#}");
    }

    // A proxy that rejects what it is sent.
    let mut client = kit::ads_client(3, &fx.cluster.replica(3).xds_addr());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let bad_id = "sidecar~127.0.0.78~rejecter.default~default.svc.cluster.local";
    tx.send(DiscoveryRequest { node: Some(node(bad_id)), type_url: CLUSTER_TYPE.into(), ..Default::default() }).await.unwrap();
    let mut inbound = client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let first = inbound.message().await.unwrap().unwrap();
    tx.send(DiscoveryRequest {
        type_url: CLUSTER_TYPE.into(),
        version_info: String::new(),
        response_nonce: first.nonce.clone(),
        error_detail: Some(RpcStatus { code: 3, message: "cluster rejected on purpose".into(), details: vec![] }),
        ..Default::default()
    })
    .await
    .unwrap();
    let deadline = Instant::now() + BOUND;
    let (status, report) = loop {
        let r = fx.client.get(format!("{}/v1/wait?revision={revision}&timeout=2s", fx.api(1))).send().await.unwrap();
        let status = r.status().as_u16();
        let report: Value = r.json().await.unwrap();
        if status == 409 || Instant::now() > deadline {
            break (status, report);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(status, 409, "{report:#}");
    let nacked = report["nacked"].as_array().unwrap();
    assert!(nacked.len() == 1 && nacked[0].as_str().unwrap().contains("rejecter") && nacked[0].as_str().unwrap().contains("on purpose"), "{report:#}");
    let (ok, _, err) = kit::cli(&fx.api(1), &["wait", "--revision", &revision.to_string(), "--timeout", "2s"]);
    assert!(!ok && err.contains("rejecter"), "{err}");
    drop(tx);
    drop(envoys);
}

/// `/metrics` speaks Prometheus with Istio's names; the debug endpoints
/// and `proxy-status` / `proxy-config` show who is where.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_debug_endpoints_and_proxy_commands() {
    let fx = Fixture::start(1).await;
    let up = fx.upstream(100, "web").await;
    let rev = fx.apply(&web(&up, 0)).await;
    let p = fx.sidecar("client", 1, 1, true, rev).await;
    let api = fx.api(1);
    let text = fx.client.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    for name in [
        "pilot_xds 1",
        "pilot_xds_pushes{type=\"cds\"}",
        "pilot_proxy_convergence_time_count",
        "pilot_debounce_time_bucket",
        "lodestar_raft_term",
        "lodestar_write_duration_seconds_count",
        "lodestar_api_requests_total{method=\"POST\",route=\"/v1/apply\",code=\"200\"} 1",
    ] {
        assert!(text.contains(name), "/metrics lacks {name}:\n{text}");
    }
    // Raft's gauges are live: a single node leads, in a term, with its
    // writes committed and applied, at the store revision the write got.
    let value = |name: &str| -> f64 {
        let line = text.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_else(|| panic!("/metrics lacks {name}:\n{text}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(value("lodestar_raft_is_leader"), 1.0, "{text}");
    assert!(value("lodestar_raft_term") >= 1.0, "{text}");
    assert!(value("lodestar_raft_applied_index") >= 2.0, "{text}");
    assert!(value("lodestar_raft_commit_index") >= value("lodestar_raft_applied_index"), "{text}");
    assert_eq!(value("lodestar_store_revision"), rev as f64, "{text}");
    assert!(value("lodestar_raft_apply_duration_seconds_count") >= 1.0, "{text}");
    let dump: Value = fx.client.get(format!("{api}/debug/config_dump?proxyID={}&type=endpoint", p.id)).send().await.unwrap().json().await.unwrap();
    assert_eq!(dump["revision"], rev);
    assert!(dump["endpoints"].to_string().contains(&up.addr.port().to_string()), "{dump:#}");
    for path in ["/debug/registryz", "/debug/configz", "/debug/push_status"] {
        let r = fx.client.get(format!("{api}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
    }
    let (ok, out, err) = kit::cli(&api, &["proxy-status"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.contains("client.default")).unwrap_or_else(|| panic!("{out}"));
    assert!(line.contains("SYNCED") && !line.contains("STALE"), "{out}");
    let (ok, out, err) = kit::cli(&api, &["proxy-config", "endpoint", "client.default"]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("{}:{}", up.addr.ip(), up.addr.port())), "{out}");
}
