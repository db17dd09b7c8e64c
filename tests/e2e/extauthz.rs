//! AuthorizationPolicy `action: CUSTOM` at a real Envoy: a workload's
//! Sidecar ingress behind CUSTOM policies naming ext_authz providers of the
//! MeshConfig, with an HTTP and a gRPC external authorizer of the test's own
//! (both allow a request carrying `x-ext-authz: allow`, deny others, as
//! Istio's sample authorizer). The paths are those of Istio's authz-custom
//! task: `/headers` goes through the authorizer, `/ip` does not.

use crate::kit;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::auth::v3::authorization_server::{Authorization, AuthorizationServer};
use envoy_types::pb::envoy::service::auth::v3::{check_response, CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use kit::envoy::{EnvoyOptions, Upstream};
use kit::mesh::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const DENIED_BODY: &str = "denied by ext_authz for not found header `x-ext-authz: allow` in the request";

/// What each authorizer saw: the headers of every check.
type Seen = Arc<Mutex<Vec<BTreeMap<String, String>>>>;

/// Istio's sample authorizer over HTTP: 200 with `x-ext-authz-check-result:
/// allowed`, or 403 with `denied` and the sample's body.
async fn http_authorizer(ip: &str) -> (std::net::SocketAddr, Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Default::default();
    let s = seen.clone();
    let app = axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
        let s = s.clone();
        async move {
            let h: BTreeMap<String, String> = headers.iter().map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
            let allow = h.get("x-ext-authz").is_some_and(|v| v == "allow");
            s.lock().unwrap().push(h);
            if allow {
                (axum::http::StatusCode::OK, [("x-ext-authz-check-result", "allowed"), ("x-authorizer", "http")], String::new())
            } else {
                (axum::http::StatusCode::FORBIDDEN, [("x-ext-authz-check-result", "denied"), ("x-authorizer", "http")], DENIED_BODY.to_string())
            }
        }
    });
    let l = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (addr, seen, task)
}

/// The same authorizer over Envoy's gRPC `Authorization/Check`.
struct GrpcAuthorizer(Seen);

#[tonic::async_trait]
impl Authorization for GrpcAuthorizer {
    async fn check(&self, req: tonic::Request<CheckRequest>) -> Result<tonic::Response<CheckResponse>, tonic::Status> {
        let http = req.into_inner().attributes.and_then(|a| a.request).and_then(|r| r.http).unwrap_or_default();
        let headers: BTreeMap<String, String> = http.headers.into_iter().collect();
        let allow = headers.get("x-ext-authz").is_some_and(|v| v == "allow");
        self.0.lock().unwrap().push(headers);
        let header = |v: &str| HeaderValueOption {
            header: Some(HeaderValue { key: "x-ext-authz-check-result".into(), value: v.into(), ..Default::default() }),
            ..Default::default()
        };
        let resp = if allow {
            CheckResponse {
                status: Some(RpcStatus { code: 0, ..Default::default() }),
                http_response: Some(check_response::HttpResponse::OkResponse(OkHttpResponse { headers: vec![header("allowed")], ..Default::default() })),
                ..Default::default()
            }
        } else {
            CheckResponse {
                status: Some(RpcStatus { code: 7, ..Default::default() }),
                http_response: Some(check_response::HttpResponse::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus { code: 403 }),
                    headers: vec![
                        header("denied"),
                        HeaderValueOption {
                            header: Some(HeaderValue { key: "x-authorizer".into(), value: "grpc".into(), ..Default::default() }),
                            ..Default::default()
                        },
                    ],
                    body: DENIED_BODY.into(),
                })),
                ..Default::default()
            }
        };
        Ok(tonic::Response::new(resp))
    }
}

async fn grpc_authorizer(ip: &str) -> (std::net::SocketAddr, Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Default::default();
    let l = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = l.local_addr().unwrap();
    let svc = AuthorizationServer::new(GrpcAuthorizer(seen.clone()));
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder().add_service(svc).serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(l)).await;
    });
    (addr, seen, task)
}

/// The workload `web` (HTTP on 8000); its Sidecar's egress sees only
/// `istio-system`, so the authorizers' service (in `foo`) is outside its
/// scope: its cluster is there for the ext_authz filter only.
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
metadata: {name: ext-authz, namespace: foo}
spec:
  ports:
  - {name: http, number: 8000, protocol: HTTP}
  - {name: grpc, number: 9000, protocol: GRPC}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ext-authz-1, namespace: foo}
spec: {service: ext-authz, address: ${authz_ip}, ports: {http: ${http_port}, grpc: ${grpc_port}}}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: dead, namespace: foo}
spec:
  ports: [{name: grpc, number: 9000, protocol: GRPC}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: dead-1, namespace: foo}
spec: {service: dead, address: ${authz_ip}, port: ${dead_port}}
"#;

/// The providers, as Istio's task declares them (the HTTP one also passes
/// the check result upstream on allow and to the client on deny), and one
/// whose service listens nowhere.
fn mesh_config(dead_fail_open: bool) -> String {
    format!(
        r#"
apiVersion: mesh.lodestar.io/v1
kind: MeshConfig
metadata: {{name: default}}
spec:
  rootNamespace: istio-system
  extensionProviders:
  - name: sample-ext-authz-grpc
    envoyExtAuthzGrpc:
      service: ext-authz.foo.svc.cluster.local
      port: "9000"
  - name: sample-ext-authz-http
    envoyExtAuthzHttp:
      service: ext-authz.foo.svc.cluster.local
      port: "8000"
      includeRequestHeadersInCheck: ["x-ext-authz"]
      headersToUpstreamOnAllow: ["x-ext-authz-check-*"]
      headersToDownstreamOnDeny: ["x-ext-authz-check-result", "x-authorizer"]
  - name: dead
    envoyExtAuthzGrpc:
      service: foo/dead.foo.svc.cluster.local
      port: 9000
      timeout: 2s
      failOpen: {dead_fail_open}
      statusOnError: "503"
"#
    )
}

fn custom(provider: &str) -> String {
    format!(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: ext-authz, namespace: default}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  action: CUSTOM
  provider: {{name: {provider}}}
  rules:
  - to: [{{operation: {{paths: ["/headers"]}}}}]
"#
    )
}

const TYPES: &[&str] = &["CDS", "LDS"];

struct Bench {
    fx: Fixture,
    proxy: Proxy,
    app: Upstream,
}

impl Bench {
    async fn apply(&self, yaml: &str) {
        let rev = self.fx.apply(yaml).await;
        self.proxy.wait_synced_types(rev, TYPES).await;
    }

    fn url(&self, path: &str) -> String {
        self.proxy.url(8000, path)
    }

    /// Poll until `path` with `headers` gets `want`, then return the reply.
    async fn expect(&self, what: &str, path: &str, headers: &[(&str, &str)], want: u16) -> Reply {
        self.expect_from(what, path, headers, want, None).await
    }

    /// As `expect`, the answer also from authorizer `by` (`x-authorizer`).
    async fn expect_from(&self, what: &str, path: &str, headers: &[(&str, &str)], want: u16, by: Option<&str>) -> Reply {
        wait_for(&self.fx.client, &self.url(path), "web.default.svc.cluster.local", headers, what, |r| {
            r.status == want && (by.is_none() || r.header("x-authorizer") == by)
        })
        .await
    }

    fn authz_check(&self, path: &str) -> String {
        let (_, out, err) = kit::cli(&self.fx.api(1), &["authz", "check", "--proxy", "web.default", "--port", "8000", "--path", path, "--method", "GET"]);
        format!("{out}{err}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_policies_delegate_to_http_and_grpc_authorizers() {
    let fx = Fixture::start(1).await;
    let app = Upstream::start("127.0.0.1", "web-app").await;
    let authz_ip = fx.ip(60);
    let (http_addr, http_seen, _h) = http_authorizer(&authz_ip).await;
    let (grpc_addr, grpc_seen, _g) = grpc_authorizer(&authz_ip).await;
    // A port nothing listens on: bound, then closed.
    let dead_port = std::net::TcpListener::bind(format!("{authz_ip}:0")).unwrap().local_addr().unwrap().port();
    let yaml = MESH
        .replace("${app}", &app.addr.to_string())
        .replace("${authz_ip}", &authz_ip)
        .replace("${http_port}", &http_addr.port().to_string())
        .replace("${grpc_port}", &grpc_addr.port().to_string())
        .replace("${dead_port}", &dead_port.to_string());
    fx.apply(&yaml).await;
    let rev = fx.apply(&mesh_config(false)).await;
    let mut o = EnvoyOptions::new("web", &fx.ip(41));
    o.labels = vec![("app".into(), "web".into())];
    let proxy = fx.proxy_of_types(o, 1, rev, TYPES).await;
    let b = Bench { fx, proxy, app };

    // `lodestar get meshconfig` shows the stored mesh config.
    let (ok, out, err) = kit::cli(&b.fx.api(1), &["get", "meshconfig"]);
    assert!(ok && out.contains("default"), "{out}{err}");

    // HTTP provider, the task's paths.
    b.apply(&custom("sample-ext-authz-http")).await;
    let denied = b.expect_from("HTTP authorizer denies /headers", "/headers", &[("x-ext-authz", "deny")], 403, Some("http")).await;
    assert_eq!(denied.body, DENIED_BODY);
    assert_eq!(denied.header("x-ext-authz-check-result"), Some("denied"), "headersToDownstreamOnDeny");
    let before = b.app.requests().len();
    let ok = kit::mesh::get(&b.fx.client, &b.url("/headers"), "web.default.svc.cluster.local", &[("x-ext-authz", "allow"), ("x-other", "1")]).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    let upstream = b.app.requests().into_iter().skip(before).last().expect("the app got the request");
    assert_eq!(upstream.headers.get("x-ext-authz-check-result").map(String::as_str), Some("allowed"), "headersToUpstreamOnAllow");
    let checks = http_seen.lock().unwrap().clone();
    let last = checks.last().expect("the HTTP authorizer was asked");
    assert_eq!(last.get("x-ext-authz").map(String::as_str), Some("allow"));
    assert!(!last.contains_key("x-other"), "only includeRequestHeadersInCheck goes to the authorizer: {last:?}");
    let n = http_seen.lock().unwrap().len();
    let ip = kit::mesh::get(&b.fx.client, &b.url("/ip"), "web.default.svc.cluster.local", &[]).await;
    assert_eq!(ip.status, 200, "/ip is not checked");
    assert_eq!(http_seen.lock().unwrap().len(), n, "no check for a path the CUSTOM rule does not match");
    let out = b.authz_check("/headers");
    assert!(out.starts_with("DELEGATED: delegated to the external authorizer sample-ext-authz-http"), "{out}");
    assert!(b.authz_check("/ip").starts_with("ALLOWED"), "{}", b.authz_check("/ip"));

    // gRPC provider.
    b.apply(&custom("sample-ext-authz-grpc")).await;
    let denied = b.expect_from("gRPC authorizer denies /headers", "/headers", &[("x-ext-authz", "deny")], 403, Some("grpc")).await;
    assert_eq!(denied.body, DENIED_BODY);
    let before = b.app.requests().len();
    b.expect("gRPC authorizer allows /headers", "/headers", &[("x-ext-authz", "allow")], 200).await;
    let upstream = b.app.requests().into_iter().skip(before).last().expect("the app got the request");
    assert_eq!(upstream.headers.get("x-ext-authz-check-result").map(String::as_str), Some("allowed"));
    assert!(grpc_seen.lock().unwrap().iter().any(|h| h.get("x-ext-authz").is_some_and(|v| v == "allow")), "the gRPC check carries the request's headers");

    // CUSTOM comes before DENY: an allowed request still meets the DENY,
    // a request the authorizer denies never reaches it.
    b.apply(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-flagged, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  action: DENY
  rules: [{when: [{key: "request.headers[x-deny]", values: ["yes"]}]}]
"#,
    )
    .await;
    let r = b.expect("CUSTOM allows, DENY denies", "/headers", &[("x-ext-authz", "allow"), ("x-deny", "yes")], 403).await;
    assert_eq!(r.body, "RBAC: access denied");
    let r = kit::mesh::get(&b.fx.client, &b.url("/headers"), "web.default.svc.cluster.local", &[("x-ext-authz", "deny"), ("x-deny", "yes")]).await;
    assert_eq!((r.status, r.body.as_str(), r.header("x-authorizer")), (403, DENIED_BODY, Some("grpc")), "CUSTOM decides first");
    let r = kit::mesh::get(&b.fx.client, &b.url("/ip"), "web.default.svc.cluster.local", &[("x-deny", "yes")]).await;
    assert_eq!((r.status, r.body.as_str()), (403, "RBAC: access denied"));
    b.apply("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: deny-flagged, namespace: default}\nspec: {selector: {matchLabels: {app: web}}, action: DENY, rules: [{to: [{operation: {paths: [/nothing]}}]}]}\n").await;

    // failOpen, both ways, with an authorizer that is not there.
    b.apply(&custom("dead")).await;
    b.expect("failOpen false: statusOnError", "/headers", &[("x-ext-authz", "allow")], 503).await;
    b.apply(&mesh_config(true)).await;
    b.expect("failOpen true: allowed", "/headers", &[("x-ext-authz", "deny")], 200).await;

    // An unknown provider fails closed for the matched requests only.
    b.apply(&custom("nope")).await;
    let r = b.expect("unknown provider denies /headers", "/headers", &[("x-ext-authz", "allow")], 403).await;
    assert_eq!(r.body, "RBAC: access denied");
    let r = kit::mesh::get(&b.fx.client, &b.url("/ip"), "web.default.svc.cluster.local", &[]).await;
    assert_eq!(r.status, 200, "other requests pass");
    let (_, out, err) = kit::cli(&b.fx.api(1), &["analyze"]);
    assert!(out.contains("LST0006") && out.contains("no extension provider \"nope\""), "{out}{err}");

    b.proxy.envoy.assert_no_rejections().await;
}

/// The MeshConfig is one object, validated field by field; the server's
/// own settings are not changed through it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_config_refusals_name_the_field() {
    let fx = Fixture::start(1).await;
    for (yaml, field, why) in [
        ("metadata: {name: other}\nspec: {}", "metadata.name", "named \\\"default\\\""),
        ("metadata: {name: default}\nspec: {trustDomain: example.org}", "spec.trustDomain", "differs from this server's trust_domain"),
        ("metadata: {name: default}\nspec: {rootNamespace: mesh-root}", "spec.rootNamespace", "differs from this server's root_namespace"),
        ("metadata: {name: default}\nspec: {ingressClass: istio}", "spec.ingressClass", "does not apply to Lodestar"),
        (
            "metadata: {name: default}\nspec: {extensionProviders: [{name: x, envoyExtAuthzGrpc: {service: a.b, port: 70000}}]}",
            "spec.extensionProviders[0].envoyExtAuthzGrpc.port",
            "range",
        ),
    ] {
        let doc = format!("apiVersion: mesh.lodestar.io/v1\nkind: MeshConfig\n{yaml}\n");
        let (status, body) = kit::apply(&fx.client, &fx.api(1), &doc).await;
        assert_eq!(status, 400, "{doc}: {body}");
        let text = body.to_string();
        assert!(text.contains(field) && text.contains(why), "{doc}: want {field} ({why}), got {text}");
    }
}

/// The issue-38 corpus files of this area, applied to a real server as a
/// user would: mesh config files (Istio's `mesh` ConfigMap key) as the spec
/// of the `MeshConfig`, the rest unchanged. Each applies, or is refused
/// with the field named and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_38_custom_and_telemetry_files() {
    let fx = Fixture::start(1).await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/istio/corpus-38/");
    let read = |f: &str| std::fs::read_to_string(format!("{dir}{f}")).unwrap();
    let mesh = |f: &str| {
        let body = read(f).lines().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n");
        format!("apiVersion: mesh.lodestar.io/v1\nkind: MeshConfig\nmetadata: {{name: default}}\nspec:\n{body}\n")
    };
    // (file, document, None: applies; Some((field, why)): refused)
    type Refusal = Option<(&'static str, &'static str)>;
    let cases: Vec<(&str, String, Refusal)> = vec![
        ("meshconfig-extauthz-providers.yaml", mesh("meshconfig-extauthz-providers.yaml"), None),
        ("authz-custom-policy.yaml", read("authz-custom-policy.yaml"), None),
        (
            "meshconfig-telemetry-providers.yaml",
            mesh("meshconfig-telemetry-providers.yaml"),
            Some(("spec.extensionProviders[2].envoyOtelAls", "extension provider kind envoyOtelAls is not supported")),
        ),
        ("telemetry-access-logging.yaml", read("telemetry-access-logging.yaml"), None),
        ("telemetry-access-logging-filter.yaml", read("telemetry-access-logging-filter.yaml"), None),
        ("telemetry-access-logging-filter-5xx.yaml", read("telemetry-access-logging-filter-5xx.yaml"), None),
        ("telemetry-access-logging-filter-envoy.yaml", read("telemetry-access-logging-filter-envoy.yaml"), None),
        ("telemetry-tracing.yaml", read("telemetry-tracing.yaml"), None),
        ("telemetry-tracing-otel.yaml", read("telemetry-tracing-otel.yaml"), None),
        ("telemetry-metrics-disable.yaml", read("telemetry-metrics-disable.yaml"), Some(("spec.metrics", "istio.stats filter"))),
        ("telemetry-metrics-remove-tag.yaml", read("telemetry-metrics-remove-tag.yaml"), Some(("spec.metrics", "istio.stats filter"))),
    ];
    for (file, doc, want) in cases {
        let (status, body) = kit::apply(&fx.client, &fx.api(1), doc.as_str()).await;
        match want {
            None => assert_eq!(status, 200, "{file}: {body}"),
            Some((field, why)) => {
                assert_eq!(status, 400, "{file}: {body}");
                let text = body.to_string();
                assert!(text.contains(field) && text.contains(why), "{file}: want {field} ({why}), got {text}");
            }
        }
    }
    // The applied providers are what CUSTOM and Telemetry name.
    let (ok, out, err) = kit::cli(&fx.api(1), &["get", "meshconfig", "default", "-o", "yaml"]);
    assert!(ok && out.contains("sample-ext-authz-grpc") && out.contains("every-field-http"), "{out}{err}");
}
