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
    bursts_add_no_spans("sampling 0 stops the spans", &spans, || burst("second")).await;
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

/// The part of OTLP's `ExportTraceServiceRequest`
/// (opentelemetry/proto/collector/trace/v1/trace_service.proto and the
/// trace, resource and common protos it imports) the tests read, with
/// OTLP's field numbers; prost skips the rest.
mod otlp {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceResponse {}
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
        /// SPAN_KIND_SERVER = 2, SPAN_KIND_CLIENT = 3.
        #[prost(int32, tag = "6")]
        pub kind: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }
    /// `AnyValue.string_value` (field 1 of its oneof).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(string, tag = "1")]
        pub string_value: String,
    }

    /// (service.name, span kind) of every span of `req`.
    pub fn spans(req: &ExportTraceServiceRequest) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for rs in &req.resource_spans {
            let attrs = rs.resource.as_ref().map(|r| r.attributes.as_slice()).unwrap_or_default();
            let service = attrs.iter().find(|a| a.key == "service.name").and_then(|a| a.value.as_ref()).map(|v| v.string_value.clone()).unwrap_or_default();
            for s in rs.scope_spans.iter().flat_map(|s| &s.spans) {
                assert_eq!(s.trace_id.len(), 16, "an OTLP trace id is 16 bytes: {s:?}");
                out.push((service.clone(), s.kind));
            }
        }
        out
    }
}

type Exported = Arc<Mutex<Vec<(String, i32)>>>;

/// An OTLP/gRPC trace collector of the test's own: a real gRPC server
/// (tonic, HTTP/2) answering `TraceService/Export`, keeping each span's
/// service name and kind.
#[derive(Clone)]
struct OtlpGrpc(Exported);

impl tonic::server::NamedService for OtlpGrpc {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

impl tonic::server::UnaryService<otlp::ExportTraceServiceRequest> for OtlpGrpc {
    type Response = otlp::ExportTraceServiceResponse;
    type Future = std::future::Ready<Result<tonic::Response<Self::Response>, tonic::Status>>;
    fn call(&mut self, req: tonic::Request<otlp::ExportTraceServiceRequest>) -> Self::Future {
        self.0.lock().unwrap().extend(otlp::spans(req.get_ref()));
        std::future::ready(Ok(tonic::Response::new(otlp::ExportTraceServiceResponse {})))
    }
}

impl tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>> for OtlpGrpc {
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;
    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        let svc = self.clone();
        Box::pin(async move {
            if req.uri().path() != "/opentelemetry.proto.collector.trace.v1.TraceService/Export" {
                return Ok(tonic::Status::unimplemented(req.uri().path().to_string()).into_http());
            }
            Ok(tonic::server::Grpc::new(tonic_prost::ProstCodec::default()).unary(svc, req).await)
        })
    }
}

async fn otlp_grpc(ip: &str) -> (std::net::SocketAddr, Exported, tokio::task::JoinHandle<()>) {
    let spans: Exported = Default::default();
    let l = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = l.local_addr().unwrap();
    let svc = OtlpGrpc(spans.clone());
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder().add_service(svc).serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)).await;
    });
    (addr, spans, task)
}

/// An OTLP/HTTP trace collector: protobuf `ExportTraceServiceRequest`s
/// POSTed to `/v1/traces`, kept only if the provider's header came along.
async fn otlp_http(ip: &str) -> (std::net::SocketAddr, Exported, tokio::task::JoinHandle<()>) {
    use prost::Message;
    let spans: Exported = Default::default();
    let s = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let s = s.clone();
            async move {
                let Ok(req) = otlp::ExportTraceServiceRequest::decode(body) else { return axum::http::StatusCode::BAD_REQUEST };
                if headers.get("x-tenant").is_none_or(|v| v != "default") {
                    return axum::http::StatusCode::UNAUTHORIZED;
                }
                s.lock().unwrap().extend(otlp::spans(&req));
                axum::http::StatusCode::OK
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

const SPAN_SERVER: i32 = 2;
const SPAN_CLIENT: i32 = 3;

/// Istio's OpenTelemetry sample: the provider `otel-tracing` of the corpus
/// mesh config (OTLP over gRPC to port 4317 of the collector, a service
/// outside both proxies' Sidecar scope), mesh-wide at 100 %: spans of both
/// sides reach a real OTLP/gRPC collector, named by Istio's service
/// cluster. A workload Telemetry then sends `web`'s to an OTLP/HTTP
/// collector with the provider's header; the sample's Telemetry, unchanged
/// (namespace `default`, 0 %), stops the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_reach_an_opentelemetry_collector() {
    let fx = Fixture::start(1).await;
    let app = Upstream::start("127.0.0.1", "web-app").await;
    let (web_ip, client_ip) = (fx.ip(41), fx.ip(42));
    let (grpc, grpc_spans, _g) = otlp_grpc(&fx.ip(61)).await;
    let (http, http_spans, _h) = otlp_http(&fx.ip(61)).await;
    fx.apply(&MESH.replace("${app}", &app.addr.to_string()).replace("${web_ip}", &web_ip)).await;
    let rev = fx
        .apply(&format!(
            r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: opentelemetry-collector, namespace: observability}}
spec:
  ports: [{{name: grpc-otlp, number: 4317, protocol: GRPC}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: collector-1, namespace: observability}}
spec: {{service: opentelemetry-collector, address: {}, port: {}}}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: otlp-http, namespace: observability}}
spec:
  ports: [{{name: http, number: 4318, protocol: HTTP}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: otlp-http-1, namespace: observability}}
spec: {{service: otlp-http, address: {}, port: {}}}
---
apiVersion: mesh.lodestar.io/v1
kind: MeshConfig
metadata: {{name: default}}
spec:
  extensionProviders:
  - name: otel-tracing
    opentelemetry:
      port: 4317
      service: opentelemetry-collector.observability.svc.cluster.local
  - name: otel-http
    opentelemetry:
      port: 4318
      service: otlp-http.observability.svc.cluster.local
      http: {{timeout: 2s, headers: [{{name: x-tenant, value: default}}]}}
---
apiVersion: telemetry.istio.io/v1
kind: Telemetry
metadata: {{name: mesh-default, namespace: istio-system}}
spec:
  tracing: [{{providers: [{{name: otel-tracing}}], randomSamplingPercentage: 100}}]
"#,
            grpc.ip(),
            grpc.port(),
            http.ip(),
            http.port()
        ))
        .await;
    let mut o = EnvoyOptions::new("web", &web_ip);
    o.labels = vec![("app".into(), "web".into())];
    let web = fx.proxy_of_types(o, 1, rev, &["CDS", "LDS"]).await;
    let mut o = EnvoyOptions::new("client", &client_ip);
    o.labels = vec![("app".into(), "client".into())];
    o.delta = true;
    let client = fx.proxy(o, 1, rev).await;
    let host = "web.default.svc.cluster.local";
    let burst = || {
        let (http, url) = (fx.client.clone(), client.url(8000, "/traced"));
        async move {
            for _ in 0..5 {
                assert_eq!(kit::mesh::get(&http, &url, host, &[]).await.status, 200);
            }
        }
    };
    // Envoy's OpenTelemetry tracer exports every 5 spans (or 5 s).
    burst().await;
    kit::eventually_or("spans of both sides at the OTLP/gRPC collector", BOUND, || {
        let list = grpc_spans.lock().unwrap().clone();
        async move {
            let count = |svc: &str, kind: i32| list.iter().filter(|(s, k)| s == svc && *k == kind).count();
            match (count("client.default", SPAN_CLIENT), count("web.default", SPAN_SERVER)) {
                (c, s) if c >= 1 && s >= 1 => Ok(()),
                (c, s) => Err(format!("{c} client and {s} server spans: {list:?}")),
            }
        }
    })
    .await;

    // web's own Telemetry: its spans go over OTLP/HTTP, the client's
    // still over gRPC.
    let rev = fx
        .apply("apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: web-http, namespace: default}\nspec:\n  selector: {matchLabels: {app: web}}\n  tracing: [{providers: [{name: otel-http}], randomSamplingPercentage: 100}]\n")
        .await;
    web.wait_synced_types(rev, &["CDS", "LDS"]).await;
    kit::eventually_or("web's spans at the OTLP/HTTP collector", BOUND, || {
        let (burst, list) = (burst(), http_spans.clone());
        async move {
            burst.await;
            let list = list.lock().unwrap().clone();
            match list.iter().filter(|(s, k)| s == "web.default" && *k == SPAN_SERVER).count() {
                0 => Err(format!("no server span of web: {list:?}")),
                _ => Ok(()),
            }
        }
    })
    .await;
    assert!(http_spans.lock().unwrap().iter().all(|(s, _)| s == "web.default"), "only web uses otel-http");

    // The sample's Telemetry, unchanged: namespace `default` samples 0 %,
    // so the client sends no more spans to the gRPC collector.
    let corpus = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/istio/corpus-38/telemetry-tracing-otel.yaml")).unwrap();
    // (web's own Telemetry overrides it: its config does not change.)
    let rev = fx.apply(&corpus).await;
    client.wait_synced(rev).await;
    // 5 client spans flush at once (the tracer's interval is 5 s).
    bursts_add_no_spans("sampling 0 stops the client's spans", &grpc_spans, burst).await;
    web.envoy.assert_no_rejections().await;
    client.envoy.assert_no_rejections().await;
}

/// Until a burst of requests, and half a second for its spans to be
/// flushed, adds no span to `spans` (a sampling change applies just after
/// the ACK).
async fn bursts_add_no_spans<T, B, F>(what: &str, spans: &Arc<Mutex<Vec<T>>>, burst: B)
where
    T: Send + 'static,
    B: Fn() -> F,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    kit::eventually_or(what, BOUND, || {
        let before = spans.lock().unwrap().len();
        let (spans, burst) = (spans.clone(), burst());
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
}
