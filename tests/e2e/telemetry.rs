//! Telemetry API access logging at real Envoys: a client sidecar (`client`,
//! outbound, delta xDS) calling the workload `web` through its sidecar
//! (inbound, SotW), under Istio's corpus Telemetry applied unchanged, then
//! namespace and workload Telemetries that override it. Every request is a
//! real one; the log lines are read from the files Envoy writes.

use crate::kit;

use kit::envoy::{EnvoyOptions, Upstream};
use kit::mesh::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const MESH: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web, namespace: default}
spec:
  workloadSelector: {labels: {app: web}}
  ingress:
  - port: {number: 8000, protocol: HTTP, name: http}
    defaultEndpoint: ${app}
  egress:
  - hosts: ["istio-system/*"]
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  ports: [{name: http, number: 8000, protocol: HTTP}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: web-1, namespace: default}
spec: {service: web, address: ${web_ip}, port: 8000}
"#;

/// Istio's built-in `envoy` provider logs to /dev/stdout, which the test
/// kit discards: a provider of the same name replaces it (Istio's merge of
/// `extensionProviders` by name), logging to a file; `errors` is a second
/// file logger.
fn mesh_config(dir: &std::path::Path) -> String {
    format!(
        r#"
apiVersion: mesh.lodestar.io/v1
kind: MeshConfig
metadata: {{name: default}}
spec:
  extensionProviders:
  - name: envoy
    envoyFileAccessLog: {{path: {}}}
  - name: errors
    envoyFileAccessLog: {{path: {}}}
"#,
        dir.join("access.log").display(),
        dir.join("errors.log").display()
    )
}

fn lines(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap_or_default().lines().map(String::from).collect()
}

/// Until `path` has a line containing every one of `parts`; that line.
/// (The kit runs Envoy with a 100 ms file flush interval.)
async fn logged(path: &std::path::Path, parts: &[&str]) -> String {
    kit::eventually_or(&format!("a line with {parts:?} in {}", path.display()), BOUND, || {
        let l = lines(path).into_iter().find(|l| parts.iter().all(|p| l.contains(p)));
        let all = lines(path);
        async move { l.ok_or_else(|| format!("not yet: {all:?}")) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_logs_follow_telemetry_precedence() {
    let fx = Fixture::start(1).await;
    let app = Upstream::start("127.0.0.1", "web-app").await;
    let (web_ip, client_ip) = (fx.ip(41), fx.ip(42));
    fx.apply(&MESH.replace("${app}", &app.addr.to_string()).replace("${web_ip}", &web_ip)).await;
    let dir = fx.tmp.path().join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    let (access, errors) = (dir.join("access.log"), dir.join("errors.log"));
    fx.apply(&mesh_config(&dir)).await;
    // Istio's access-log task, unchanged: mesh-wide, provider `envoy`.
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/istio/corpus-38/telemetry-access-logging.yaml")).unwrap();
    let rev = fx.apply(&corpus).await;

    let mut o = EnvoyOptions::new("web", &web_ip);
    o.labels = vec![("app".into(), "web".into())];
    let web = fx.proxy_of_types(o, 1, rev, &["CDS", "LDS"]).await;
    let mut o = EnvoyOptions::new("client", &client_ip);
    o.labels = vec![("app".into(), "client".into())];
    o.delta = true;
    let client = fx.proxy(o, 1, rev).await;
    let host = "web.default.svc.cluster.local";
    let get = |path: &'static str| {
        let (http, url) = (fx.client.clone(), client.url(8000, path));
        async move { kit::mesh::get(&http, &url, host, &[("user-agent", "telemetry-test")]).await }
    };

    // One line per request on each side, in Istio's default format.
    assert_eq!(get("/logged").await.status, 200);
    let inbound = logged(&access, &["\"GET /logged HTTP/1.1\" 200", "inbound|8000||"]).await;
    let outbound = logged(&access, &["\"GET /logged HTTP/1.1\" 200", "outbound|8000||web.default.svc.cluster.local"]).await;
    for line in [&inbound, &outbound] {
        // [START_TIME] "METHOD PATH PROTOCOL" CODE FLAGS DETAILS ... "UA" "ID" "AUTHORITY" ...
        assert!(line.starts_with("[20") && line.contains("Z] \"GET /logged HTTP/1.1\" 200 - via_upstream - \"-\" 0 "), "{line}");
        assert!(line.contains("\"telemetry-test\"") && line.contains(&format!("\"{host}\"")), "{line}");
    }
    assert!(outbound.ends_with(" - default"), "route name last: {outbound}");
    assert_eq!(lines(&access).iter().filter(|l| l.contains("/logged")).count(), 2, "one line per request per side");

    // Namespace `default` adds the `errors` provider for responses >= 500
    // (a CEL filter); the root's `envoy` stays on.
    let rev = fx
        .apply(
            r#"
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {name: errors-only, namespace: default}
spec:
  accessLogging:
  - providers: [{name: errors}]
    filter: {expression: "response.code >= 500"}
"#,
        )
        .await;
    web.wait_synced_types(rev, &["CDS", "LDS"]).await;
    client.wait_synced(rev).await;
    // Envoy applies an ACKed listener update just after the ACK: probe
    // until a failing request shows up in `errors`.
    let mut n = 0;
    kit::eventually_or("a 503 logged by the `errors` provider", BOUND, || {
        n += 1;
        let path = format!("/broken-{n}");
        let (http, url, errors, app) = (fx.client.clone(), client.url(8000, &path), errors.clone(), &app);
        async move {
            app.fail_next(1);
            assert_eq!(kit::mesh::get(&http, &url, host, &[]).await.status, 503);
            tokio::time::sleep(Duration::from_millis(300)).await;
            let found = lines(&errors).iter().any(|l| l.contains(&format!("\"GET {path} HTTP/1.1\" 503")) && l.contains("inbound|8000||"));
            if found {
                Ok(())
            } else {
                Err(format!("{path} not in errors.log"))
            }
        }
    })
    .await;
    assert_eq!(get("/fine").await.status, 200);
    logged(&access, &["\"GET /fine HTTP/1.1\" 200", "outbound|8000||"]).await;
    logged(&access, &["\"GET /fine HTTP/1.1\" 200", "inbound|8000||"]).await;
    assert!(!lines(&errors).iter().any(|l| l.contains("/fine")), "the filter keeps 2xx out: {:?}", lines(&errors));

    // The workload `web` turns `envoy` off on its inbound (SERVER) side.
    let rev = fx
        .apply(
            r#"
apiVersion: telemetry.istio.io/v1alpha1
kind: Telemetry
metadata: {name: quiet-web, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  accessLogging:
  - providers: [{name: envoy}]
    match: {mode: SERVER}
    disabled: true
"#,
        )
        .await;
    web.wait_synced_types(rev, &["CDS", "LDS"]).await;
    // (`client` is not selected: its config does not change.)
    // Envoy applies an ACKed listener update just after the ACK: probe
    // until a request logged by the client (outbound) has, a few flush
    // intervals later, no inbound line.
    let mut n = 0;
    kit::eventually_or("web's inbound stops logging to `envoy`", BOUND, || {
        n += 1;
        let path = format!("/after-{n}");
        let (http, url) = (fx.client.clone(), client.url(8000, &path));
        let access = access.clone();
        async move {
            assert_eq!(kit::mesh::get(&http, &url, host, &[]).await.status, 200);
            logged(&access, &[&format!("\"GET {path} HTTP/1.1\" 200"), "outbound|8000||"]).await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            match lines(&access).iter().any(|l| l.contains(&format!("{path} ")) && l.contains("inbound|8000||")) {
                true => Err(format!("{path} still logged inbound")),
                false => Ok(()),
            }
        }
    })
    .await;

    web.envoy.assert_no_rejections().await;
    client.envoy.assert_no_rejections().await;
}

/// A Zipkin-compatible collector of the test's own: counts the spans
/// POSTed to `/api/v2/spans` (a JSON array) and keeps their tags.
async fn zipkin(ip: &str) -> (std::net::SocketAddr, Arc<Mutex<Vec<serde_json::Value>>>, tokio::task::JoinHandle<()>) {
    let spans: Arc<Mutex<Vec<serde_json::Value>>> = Default::default();
    let s = spans.clone();
    let app = axum::Router::new().route(
        "/api/v2/spans",
        axum::routing::post(move |body: axum::body::Bytes| {
            let s = s.clone();
            async move {
                if let Ok(serde_json::Value::Array(list)) = serde_json::from_slice::<serde_json::Value>(&body) {
                    s.lock().unwrap().extend(list);
                }
                axum::http::StatusCode::ACCEPTED
            }
        }),
    );
    let l = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (addr, spans, task)
}

/// Istio's tracing task's Telemetry (100 % sampling, literal, environment
/// and header tags), applied unchanged, with a Zipkin provider: spans from
/// both sides reach the collector with the tags; a namespace Telemetry
/// that samples 0 % stops them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_a_zipkin_collector() {
    let fx = Fixture::start(1).await;
    let app = Upstream::start("127.0.0.1", "web-app").await;
    let (web_ip, client_ip) = (fx.ip(41), fx.ip(42));
    let (collector, spans, _z) = zipkin(&fx.ip(60)).await;
    fx.apply(&MESH.replace("${app}", &app.addr.to_string()).replace("${web_ip}", &web_ip)).await;
    fx.apply(&format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: zipkin, namespace: istio-system}}
spec:
  ports: [{{name: http, number: 9411, protocol: HTTP}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: zipkin-1, namespace: istio-system}}
spec: {{service: zipkin, address: {}, port: {}}}
---
apiVersion: mesh.lodestar.io/v1
kind: MeshConfig
metadata: {{name: default}}
spec:
  enableTracing: true
  defaultConfig:
    tracing: {{}}
  extensionProviders:
  - name: zipkin
    zipkin:
      service: zipkin.istio-system.svc.cluster.local
      port: 9411
"#,
        collector.ip(),
        collector.port()
    ))
    .await;
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/istio/corpus-38/telemetry-tracing.yaml")).unwrap();
    let rev = fx.apply(&corpus).await;
    let mut o = EnvoyOptions::new("web", &web_ip);
    o.labels = vec![("app".into(), "web".into())];
    let web = fx.proxy_of_types(o, 1, rev, &["CDS", "LDS"]).await;
    let mut o = EnvoyOptions::new("client", &client_ip);
    o.labels = vec![("app".into(), "client".into())];
    o.delta = true;
    let client = fx.proxy(o, 1, rev).await;
    let host = "web.default.svc.cluster.local";
    let burst = |tag: &'static str| {
        let (http, url) = (fx.client.clone(), client.url(8000, "/traced"));
        async move {
            for _ in 0..5 {
                assert_eq!(kit::mesh::get(&http, &url, host, &[("x-client-id", tag)]).await.status, 200);
            }
        }
    };
    // Envoy's Zipkin tracer sends a batch every 5 spans (or 5 s).
    burst("first").await;
    kit::eventually_or("spans of both sides at the collector", BOUND, || {
        let list = spans.lock().unwrap().clone();
        async move {
            let tagged =
                |kind: &str| list.iter().filter(|s| s["kind"] == kind && s["tags"]["my_tag_header"] == "first" && s["tags"]["provider"] == "zipkin").count();
            match (tagged("CLIENT"), tagged("SERVER")) {
                (c, s) if c >= 1 && s >= 1 => Ok(()),
                (c, s) => Err(format!("{c} client and {s} server spans: {list:?}")),
            }
        }
    })
    .await;
    let list = spans.lock().unwrap().clone();
    assert!(list.iter().all(|s| s["tags"]["cluster_id"] == "Kubernetes"), "environment tag's default: {list:?}");

    // Namespace `default` samples nothing.
    let rev = fx.apply("apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: no-sampling, namespace: default}\nspec:\n  tracing: [{randomSamplingPercentage: 0}]\n").await;
    web.wait_synced_types(rev, &["CDS", "LDS"]).await;
    client.wait_synced(rev).await;
    // Listener updates apply just after the ACK: wait until a burst is no
    // longer traced (10 spans would be sent at once).
    kit::eventually_or("sampling 0 stops the spans", BOUND, || {
        let before = spans.lock().unwrap().len();
        let (spans, burst) = (spans.clone(), burst("second"));
        async move {
            burst.await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let after = spans.lock().unwrap().len();
            if after == before {
                Ok(())
            } else {
                Err(format!("{} new spans", after - before))
            }
        }
    })
    .await;
    web.envoy.assert_no_rejections().await;
    client.envoy.assert_no_rejections().await;
}

/// Refusals name the field: metrics overrides (Lodestar's Envoys do not
/// emit Istio's standard metrics).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn telemetry_refusals_name_the_field() {
    let fx = Fixture::start(1).await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/istio/corpus-38/");
    for (file, field, why) in
        [("telemetry-metrics-disable.yaml", "spec.metrics", "istio.stats filter"), ("telemetry-metrics-remove-tag.yaml", "spec.metrics", "istio.stats filter")]
    {
        let (status, body) = kit::apply(&fx.client, &fx.api(1), std::fs::read_to_string(format!("{dir}{file}")).unwrap().as_str()).await;
        assert_eq!(status, 400, "{file}: {body}");
        let text = body.to_string();
        assert!(text.contains(field) && text.contains(why), "{file}: {text}");
    }
}
