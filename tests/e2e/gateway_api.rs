//! A Gateway API conformance harness without Kubernetes: the upstream
//! suite's base setup and per-test manifests and expectations, kept as data
//! (`tests/fixtures/gateway-api/`, Apache-2.0, from kubernetes-sigs/
//! gateway-api v1.6.1; its README describes the format), run against one
//! replica and ONE gateway Envoy that serves every Gateway of the class
//! (`--gateway-class`), each Gateway at a loopback address of its own
//! (`spec.addresses`, added by the harness), with echo backends registered
//! as registry services. Real requests, status read back as the suite
//! reads it. Prints a table: test, level, pass/fail, why.
//!
//! Deviations from upstream, all forced by the absence of Kubernetes:
//! every Gateway gets `spec.addresses` (an IPAddress on loopback);
//! namespaces are `Namespace` objects (for their labels); the HTTPS
//! listeners' certificate is issued from a CA, for the names the test
//! sends, not self-signed for `*` (rustls takes neither); an object
//! Lodestar refuses to store (a malformed Secret) is checked as refused
//! (`refused`) instead of stored.

use crate::kit::envoy::EnvoyOptions;
use crate::kit::mesh::Fixture;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLASS: &str = "gateway-conformance";
const CONTROLLER: &str = "lodestar.dev/gateway-controller";

/// The tests this slice must pass (HTTPRoute, GRPCRoute and Gateway Core).
const REQUIRED: &[&str] = &[
    "GatewayWithAttachedRoutes",
    "GatewayObservedGenerationBump",
    "GatewayClassObservedGenerationBump",
    "GatewayInvalidRouteKind",
    "GatewayInvalidTLSConfiguration",
    "GatewayListenerUnsupportedProtocol",
    "GatewayInvalidParametersRef",
    "GatewayModifyListeners",
    "GatewaySecretReferenceGrantAllInNamespace",
    "GatewaySecretReferenceGrantSpecific",
    "GatewaySecretMissingReferenceGrant",
    "GatewaySecretInvalidReferenceGrant",
    "HTTPRouteSimpleSameNamespace",
    "HTTPRouteExactPathMatching",
    "HTTPRouteHeaderMatching",
    "HTTPRouteHostnameIntersection",
    "HTTPRouteListenerHostnameMatching",
    "HTTPRouteMatching",
    "HTTPRouteMatchingAcrossRoutes",
    "HTTPRoutePathMatchOrder",
    "HTTPRouteRedirectHostAndStatus",
    "HTTPRouteReferenceGrant",
    "HTTPRouteInvalidCrossNamespaceBackendRef",
    "HTTPRouteInvalidNonExistentBackendRef",
    "HTTPRouteWeight",
    "HTTPRouteServiceTypes",
    "GRPCExactMethodMatching",
    "GRPCRouteHeaderMatching",
    "GRPCRouteListenerHostnameMatching",
    "GRPCRouteWeight",
];

/// Also run and reported (not required to pass yet).
const REPORTED: &[&str] = &[
    "HTTPRouteCrossNamespace",
    "HTTPRouteInvalidBackendRefUnknownKind",
    "HTTPRouteInvalidCrossNamespaceParentRef",
    "HTTPRouteInvalidParentRefNotMatchingSectionName",
    "HTTPRouteInvalidReferenceGrant",
    "HTTPRoutePartiallyInvalidViaInvalidReferenceGrant",
    "HTTPRouteNoBackendRefs",
    "HTTPRouteMultipleGateways",
    "HTTPRouteRequestHeaderModifier",
    "HTTPRouteResponseHeaderModifier",
    "HTTPRouteQueryParamMatching",
    "HTTPRouteMethodMatching",
    "HTTPRouteRewriteHost",
    "HTTPRouteRewritePath",
    "HTTPRouteRedirectPath",
    "HTTPRouteRedirectPort",
    "HTTPRouteRedirectScheme",
    "HTTPRouteRequestMirror",
    "HTTPRouteBackendRequestHeaderModifier",
    "HTTPRouteObservedGenerationBump",
    "HTTPRouteHTTPSListener",
    "HTTPRouteTimeoutRequest",
    "HTTPRouteTimeoutBackendRequest",
    "ListenerSetHTTPRouting",
    "ListenerSetDefaultNotAllowed",
    "ListenerSetProtocolConflict",
    "ListenerSetHostnameConflict",
    "ListenerSetGatewayParentSectionNameNotFound",
    "ListenerSetDualParentRefIndependence",
    "ListenerSetAllowedNamespaceSame",
    "ListenerSetAllowedNamespaceSelector",
    "ListenerSetAllowedNamespaceNone",
    "ListenerSetAllowedRoutesNamespaces",
    "ListenerSetAllowedRoutesSupportedKinds",
    "ListenerSetRouteStatusScopedToParentRef",
    "ListenerSetReferenceGrant",
    "HTTPRouteCORS",
    "HTTPRouteRetry",
    // More Extended HTTPRoute tests (issue 39).
    "HTTPRoute303Redirect",
    "HTTPRoute307Redirect",
    "HTTPRoute308Redirect",
    "HTTPRouteNamedRule",
    "HTTPRouteRequestMultipleMirrors",
    "HTTPRouteListenerPortMatching",
    "HTTPRouteInvalidParentRefNotMatchingListenerPort",
    "HTTPRouteInvalidParentRefSectionNameNotMatchingPort",
    "HTTPRouteRedirectPortAndScheme",
    "HTTPRouteRequestHeaderModifierBackendWeights",
    "HTTPRouteBackendProtocolH2C",
    "HTTPRouteBackendProtocolWebSocket",
    "HTTPRouteRequestPercentageMirror",
    "GatewayHTTPListenerIsolation",
    "GRPCRouteNamedRule",
    "HTTPRouteDisallowedKind",
];

/// Tests not run, with why (they count as failures in a report).
const NOT_RUN: &[(&str, &str)] = &[];

fn data_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gateway-api")
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = text.replace("{GATEWAY_CLASS_NAME}", CLASS).replace("{CONTROLLER_NAME}", CONTROLLER);
    yaml_serde::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------
// The echo backend (echo-basic's HTTP mode, what the checks read).

#[derive(Clone)]
struct Echo {
    pod: String,
    namespace: String,
    /// Where it listens (port 3000).
    ip: String,
    seen: Arc<Mutex<Vec<String>>>,
    /// The `/retry/` simulator's failed tries, by `uuid`.
    tries: Arc<Mutex<BTreeMap<String, i64>>>,
}

/// Resets the connection a request came on (echo-basic's TCP failure).
#[derive(Clone, Default)]
struct ConnReset(Arc<tokio::sync::Notify>);

/// `x-header-set` as Go canonicalises it: `X-Header-Set`.
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|p| {
            let mut c = p.chars();
            c.next().map(|f| f.to_ascii_uppercase().to_string() + &c.as_str().to_ascii_lowercase()).unwrap_or_default()
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// echo-basic's routes: `/health`; `/status/NNN` (the whole request URI)
/// answers NNN, else 400; `/retry/...` fails (a status or a reset) until
/// its `uuid` has failed `succeedAfter` times, then echoes; anything else
/// echoes. Paths with `//` collapsed, as echo-basic routes them.
async fn echo(State(e): State<Echo>, mut req: Request<Body>) -> Response {
    let uri = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
    let path = req.uri().path().replace("//", "/");
    if path == "/health" {
        return "OK".into_response();
    }
    if path == "/ws" {
        return websocket_echo(&mut req);
    }
    if path.starts_with("/status/") {
        let code = uri.strip_prefix("/status/").filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_digit()));
        return code.and_then(|c| axum::http::StatusCode::from_u16(c.parse().ok()?).ok()).unwrap_or(axum::http::StatusCode::BAD_REQUEST).into_response();
    }
    if path.starts_with("/retry/") {
        let reset = req.extensions().get::<ConnReset>().cloned();
        if let Some(failure) = retry_failure(&e, req.uri(), reset).await {
            return failure;
        }
    }
    // `?delay=1s` (a Go duration): wait that long first (the timeout tests).
    let delay = req.uri().query().into_iter().flat_map(|q| q.split('&')).find_map(|kv| kv.strip_prefix("delay="));
    if let Some(d) = delay.and_then(|d| lodestar::model::istio::parse_duration(d).ok()) {
        tokio::time::sleep(d.min(Duration::from_secs(10))).await;
    }
    e.seen.lock().unwrap().push(uri.clone());
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut host = String::new();
    for (k, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        if k == "host" {
            host = v;
            continue;
        }
        headers.entry(canonical(k.as_str())).or_default().push(v);
    }
    let set: Vec<(String, String)> = headers
        .get("X-Echo-Set-Header")
        .map(|vs| {
            vs.join(",")
                .split(',')
                .filter_map(|item| item.trim().split_once(':').map(|(k, v)| (k.trim().to_string(), v.trim().to_string())))
                .filter(|(k, _)| !k.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let body = json!({
        "path": uri, "host": host, "method": req.method().as_str(), "proto": proto(req.version()), "headers": headers,
        "namespace": e.namespace, "ingress": "", "service": "", "pod": e.pod, "httpPort": "3000",
    });
    if req.headers().get("content-type").is_some_and(|v| v.as_bytes().starts_with(b"application/grpc")) {
        // echo-basic's gRPC mode: one message (here the same JSON), then
        // the trailers with grpc-status 0.
        return axum::http::Response::builder()
            .header("content-type", "application/grpc")
            .body(Body::new(GrpcReply { message: Some(body.to_string().into_bytes()), done: false }))
            .unwrap();
    }
    let mut resp =
        (axum::http::StatusCode::OK, [("content-type", "application/json"), ("x-content-type-options", "nosniff")], body.to_string()).into_response();
    let mut merged: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in set {
        merged.entry(k).and_modify(|old| *old = format!("{old},{v}")).or_insert(v);
    }
    for (k, v) in merged {
        if let (Ok(k), Ok(v)) = (axum::http::HeaderName::try_from(k.as_str()), axum::http::HeaderValue::try_from(v.as_str())) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}

/// The retry simulator's answer to a try that fails: 400 without `uuid`
/// or an integer `succeedAfter`; while the `uuid` has failed fewer than
/// `succeedAfter` times, after `delayRetry` if given, the `responseCode`
/// status, or (none given) the connection reset (RST); None: echo.
async fn retry_failure(e: &Echo, uri: &axum::http::Uri, reset: Option<ConnReset>) -> Option<Response> {
    let url = reqwest::Url::parse(&format!("http://echo{uri}")).ok()?;
    let param = |name: &str| url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned());
    let bad = |why: &'static str| Some((axum::http::StatusCode::BAD_REQUEST, why).into_response());
    let Some(uuid) = param("uuid").filter(|u| !u.is_empty()) else { return bad("uuid is required") };
    let Some(succeed_after) = param("succeedAfter").and_then(|n| n.parse::<i64>().ok()) else { return bad("succeedAfter is required") };
    {
        let mut tries = e.tries.lock().unwrap();
        let failed = tries.entry(uuid).or_default();
        if *failed >= succeed_after {
            return None;
        }
        *failed += 1;
    }
    if let Some(d) = param("delayRetry").and_then(|d| lodestar::model::istio::parse_duration(&d).ok()) {
        tokio::time::sleep(d.min(Duration::from_secs(10))).await;
    }
    if let Some(code) = param("responseCode").and_then(|c| c.parse::<u16>().ok()) {
        return Some(axum::http::StatusCode::from_u16(code).unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR).into_response());
    }
    reset?.0.notify_one();
    // The connection is dropped, and this with it.
    std::future::pending::<()>().await;
    None
}

/// The request's protocol as Go's `Request.Proto` names it.
fn proto(v: axum::http::Version) -> &'static str {
    match v {
        axum::http::Version::HTTP_2 => "HTTP/2.0",
        axum::http::Version::HTTP_10 => "HTTP/1.0",
        _ => "HTTP/1.1",
    }
}

/// echo-basic's `H2C_PORT`: HTTP/2 without TLS only (prior knowledge).
const H2C_PORT: u64 = 3001;

/// On the h2c port, anything but HTTP/2 gets 400 (`Expected h2c request`).
async fn echo_h2c(state: State<Echo>, req: Request<Body>) -> Response {
    if req.version() != axum::http::Version::HTTP_2 {
        return (axum::http::StatusCode::BAD_REQUEST, "Expected h2c request").into_response();
    }
    echo(state, req).await
}

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 4.2.2).
fn websocket_accept(key: &[u8]) -> String {
    use base64::Engine;
    let mut input = key.to_vec();
    input.extend_from_slice(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
    base64::engine::general_purpose::STANDARD.encode(ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, &input))
}

/// echo-basic's `/ws`: the WebSocket handshake (101), then every text or
/// binary message is sent back as it came; a ping gets its pong, a close
/// its close. Not an upgrade: 400.
fn websocket_echo(req: &mut Request<Body>) -> Response {
    let upgrade = req.headers().get("upgrade").is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let Some(key) = req.headers().get("sec-websocket-key").filter(|_| upgrade).map(|k| k.as_bytes().to_vec()) else {
        return (axum::http::StatusCode::BAD_REQUEST, "not a WebSocket handshake").into_response();
    };
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else { return };
        let mut io = hyper_util::rt::TokioIo::new(upgraded);
        // Bounded: a connection ends at its close or after 1000 frames.
        for _ in 0..1000 {
            let Ok((opcode, payload)) = ws_read(&mut io).await else { return };
            let reply = match opcode {
                0x1 | 0x2 => opcode,
                0x9 => 0xA,
                0x8 => {
                    let _ = ws_write(&mut io, 0x8, &payload, None).await;
                    return;
                }
                _ => continue,
            };
            if ws_write(&mut io, reply, &payload, None).await.is_err() {
                return;
            }
        }
    });
    axum::http::Response::builder()
        .status(axum::http::StatusCode::SWITCHING_PROTOCOLS)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", websocket_accept(&key))
        .body(Body::empty())
        .unwrap()
}

/// One WebSocket frame (FIN set: echo-basic's messages are unfragmented):
/// its opcode and payload, unmasked.
async fn ws_read(io: &mut (impl tokio::io::AsyncRead + Unpin)) -> std::io::Result<(u8, Vec<u8>)> {
    use tokio::io::AsyncReadExt;
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await?;
    let len = match head[1] & 0x7f {
        126 => u64::from(io.read_u16().await?),
        127 => io.read_u64().await?,
        n => u64::from(n),
    };
    if len > 1 << 20 {
        return Err(std::io::Error::other("WebSocket frame over 1 MiB"));
    }
    let mut mask = [0u8; 4];
    if head[1] & 0x80 != 0 {
        io.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; len as usize];
    io.read_exact(&mut payload).await?;
    for (i, b) in payload.iter_mut().enumerate() {
        *b ^= mask[i % 4];
    }
    Ok((head[0] & 0x0f, payload))
}

/// Write one final frame; `mask` (a client's frames must be masked).
async fn ws_write(io: &mut (impl tokio::io::AsyncWrite + Unpin), opcode: u8, payload: &[u8], mask: Option<[u8; 4]>) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut frame = vec![0x80 | opcode];
    let bit = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => frame.push(bit | n as u8),
        n if n <= 0xffff => {
            frame.push(bit | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(bit | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let m = mask.unwrap_or([0; 4]);
    if mask.is_some() {
        frame.extend_from_slice(&m);
    }
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
    io.write_all(&frame).await?;
    io.flush().await
}

/// A unary gRPC answer: one length-prefixed message, then trailers.
struct GrpcReply {
    message: Option<Vec<u8>>,
    done: bool,
}

impl http_body::Body for GrpcReply {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if let Some(m) = self.message.take() {
            let mut framed = Vec::with_capacity(5 + m.len());
            framed.push(0);
            framed.extend_from_slice(&(m.len() as u32).to_be_bytes());
            framed.extend_from_slice(&m);
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(framed.into()))));
        }
        if std::mem::replace(&mut self.done, true) {
            return std::task::Poll::Ready(None);
        }
        let mut trailers = axum::http::HeaderMap::new();
        trailers.insert("grpc-status", axum::http::HeaderValue::from_static("0"));
        std::task::Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
    }
}

/// An echo server at `ip` on each of `ports` (HTTP/1.1, h2c and gRPC on
/// every one, as the mesh's echo answers HTTP and gRPC; only HTTP/2 on
/// [`H2C_PORT`]).
async fn start_echo(ip: &str, ports: &[u64], pod: &str, namespace: &str) -> (Echo, Vec<tokio::task::JoinHandle<()>>) {
    let e = Echo { pod: pod.to_string(), namespace: namespace.to_string(), ip: ip.to_string(), seen: Default::default(), tries: Default::default() };
    let mut tasks = Vec::new();
    for port in ports {
        let listener = tokio::net::TcpListener::bind(format!("{ip}:{port}")).await.expect("bind echo");
        let app = if *port == H2C_PORT { axum::Router::new().fallback(echo_h2c) } else { axum::Router::new().fallback(echo) };
        let app = app.with_state(e.clone());
        tasks.push(tokio::spawn(serve_echo(listener, app)));
    }
    (e, tasks)
}

/// Serve `app` on `listener`'s connections; each connection can be reset
/// by the request it carries ([`ConnReset`]).
async fn serve_echo(listener: tokio::net::TcpListener, app: axum::Router) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let reset = ConnReset::default();
        let service = hyper_util::service::TowerToHyperService::new(app.clone().layer(axum::Extension(reset.clone())));
        tokio::spawn(async move {
            use std::os::fd::AsRawFd;
            let fd = stream.as_raw_fd();
            let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = reset.0.notified() => {
                    // SO_LINGER 0: the close below (`conn` dropped, the
                    // socket with it) sends a RST.
                    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
                    let size = std::mem::size_of::<libc::linger>() as libc::socklen_t;
                    // SAFETY: `fd` is the socket `conn` owns and keeps open until dropped below.
                    let rc = unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_LINGER, (&raw const linger).cast(), size) };
                    assert_eq!(rc, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
                }
            }
        });
    }
}

// ---------------------------------------------------------------------------
// The harness.

struct Harness {
    fx: Fixture,
    /// The gateway Envoy (`gateway`), or the mesh clients' sidecars (by
    /// `ns/workload`, as a case's `via.mesh_client` names them).
    proxies: BTreeMap<String, crate::kit::mesh::Proxy>,
    /// Gateway `ns/name` → its address.
    addresses: BTreeMap<String, String>,
    next_ip: u8,
    echoes: Vec<Echo>,
    http: reqwest::Client,
    /// `record_generation`'s.
    recorded: Option<u64>,
    /// Issued `tls-validity-checks-certificate` (HTTPS listeners).
    ca: crate::kit::tls::Ca,
}

impl Harness {
    fn new(fx: Fixture) -> Harness {
        Harness {
            fx,
            proxies: BTreeMap::new(),
            addresses: BTreeMap::new(),
            next_ip: 2,
            echoes: Vec::new(),
            recorded: None,
            ca: crate::kit::tls::Ca::new("gateway-conformance"),
            http: reqwest::Client::builder().no_proxy().redirect(reqwest::redirect::Policy::none()).timeout(Duration::from_secs(10)).build().unwrap(),
        }
    }

    /// Every Gateway gets an address of its own (and keeps it).
    fn with_addresses(&mut self, mut doc: Value) -> Value {
        if doc["kind"] == "Gateway" {
            let key = format!("{}/{}", doc["metadata"]["namespace"].as_str().unwrap_or("default"), doc["metadata"]["name"].as_str().unwrap_or(""));
            let ip = match self.addresses.get(&key) {
                Some(ip) => ip.clone(),
                None => {
                    let ip = self.fx.ip(self.next_ip);
                    self.next_ip += 1;
                    self.addresses.insert(key, ip.clone());
                    ip
                }
            };
            doc["spec"]["addresses"] = json!([{"type": "IPAddress", "value": ip}]);
        }
        doc
    }

    async fn apply(&mut self, docs: Vec<Value>) -> Result<u64, String> {
        let docs: Vec<Value> = docs.into_iter().map(|d| self.with_addresses(d)).collect();
        let (status, body) = crate::kit::apply(&self.fx.client, &self.fx.api(1), docs).await;
        if status != 200 {
            return Err(format!("apply answered {status}: {body}"));
        }
        // A write that changed nothing answers the current revision, maybe
        // a status write's, which no proxy is pushed: nothing to wait for.
        if body["items"].as_array().is_some_and(|items| items.iter().all(|i| i["action"] == "unchanged")) {
            return Ok(0);
        }
        Ok(body["revision"].as_u64().unwrap_or(0))
    }

    async fn delete(&self, docs: &[Value]) -> u64 {
        let r = self
            .fx
            .client
            .post(format!("{}/v1/delete", self.fx.api(1)))
            .json(&json!({"resources": docs, "ignoreNotFound": true}))
            .send()
            .await
            .expect("delete");
        let body: Value = r.json().await.unwrap_or(Value::Null);
        body["revision"].as_u64().unwrap_or(0)
    }

    async fn get(&self, plural: &str, ns: &str, name: &str) -> Value {
        // Cluster-scoped kinds (GatewayClass) live in one namespace here.
        let ns = if ns.is_empty() { "lodestar-system" } else { ns };
        let (_, v) = crate::kit::get_json(&self.fx.client, &format!("{}/v1/resources/{plural}/{ns}/{name}", self.fx.api(1))).await;
        v
    }

    /// Until every proxy's config is at `revision` (or newer) and every
    /// type is in sync (a change that leaves its config as it was pushes
    /// nothing, so no newer version is acked).
    async fn synced(&self, revision: u64) {
        for p in self.proxies.values() {
            Self::proxy_synced(p, revision).await;
        }
    }

    async fn proxy_synced(p: &crate::kit::mesh::Proxy, revision: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let s = crate::kit::mesh::syncz(&p.client, &p.api).await;
            let me = s["proxies"].as_array().and_then(|ps| ps.iter().find(|x| x["id"] == p.id.as_str()).cloned()).unwrap_or_default();
            let types = me["types"].as_object().cloned().unwrap_or_default();
            for (t, v) in &types {
                assert!(v["last_nack"].is_null(), "{} NACKed {t}: {}", p.id, v["last_nack"]);
            }
            if me["revision"].as_u64().is_some_and(|r| r >= revision) && types.values().all(|v| v["in_sync"] == true) {
                return;
            }
            assert!(Instant::now() < deadline, "proxy {} is not in sync at {revision}: {me}", p.id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The object at `url` once the leader has written its status
/// (`gateway_status`: a moment after the write that changed its spec) and
/// `ready` holds for it.
pub async fn with_status(http: &reqwest::Client, url: &str, ready: impl Fn(&Value) -> bool) -> Value {
    crate::kit::eventually_or(&format!("the status of {url}"), Duration::from_secs(10), || async {
        let (_, v) = crate::kit::get_json(http, url).await;
        if !v["status"].is_null() && ready(&v) {
            Ok(v)
        } else {
            Err(v.to_string())
        }
    })
    .await
}

/// `conditions` (of an object at `generation`) hold every wanted one (a
/// wanted one without `status` or `reason`: any).
fn conditions_hold(have: &Value, want: &Value, generation: u64) -> bool {
    let have = have.as_array().cloned().unwrap_or_default();
    want.as_array().into_iter().flatten().all(|w| {
        have.iter().any(|c| {
            c["type"] == w["type"]
                && (w["status"].is_null() || c["status"] == w["status"])
                && (w["reason"].is_null() || c["reason"] == w["reason"])
                && c["observedGeneration"].as_u64() == Some(generation)
        })
    })
}

/// An object's `status.conditions` are there and all at its generation.
fn latest_conditions(o: &Value) -> bool {
    let gen = o["metadata"]["generation"].as_u64();
    o["status"]["conditions"].as_array().is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["observedGeneration"].as_u64() == gen))
}

/// The API's plural of an object a check or action names by `kind`
/// (HTTPRoute by default).
fn plural(kind: &Value) -> &'static str {
    match kind.as_str() {
        Some("Gateway") => "gateways.gateway.networking.k8s.io",
        Some("GatewayClass") => "gatewayclasses",
        Some("GRPCRoute") => "grpcroutes",
        _ => "httproutes",
    }
}

async fn check_status(h: &Harness, check: &Value) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last;
    loop {
        last = status_once(h, check).await;
        if last.is_ok() || Instant::now() > deadline {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn split(s: &str) -> (&str, &str) {
    s.split_once('/').unwrap_or(("", s))
}

async fn status_once(h: &Harness, check: &Value) -> Result<(), String> {
    let kind = check["check"].as_str().unwrap_or("");
    let gw_plural = "gateways.gateway.networking.k8s.io";
    match kind {
        "gateway_ready" => {
            let (ns, name) = split(check["gateway"].as_str().unwrap_or(""));
            let g = h.get(gw_plural, ns, name).await;
            let gen = g["metadata"]["generation"].as_u64().unwrap_or(0);
            let s = &g["status"];
            let ok = s["addresses"].as_array().is_some_and(|a| a.iter().any(|a| a["type"].is_string()))
                && conditions_hold(&s["conditions"], &json!([{"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "True"}]), gen)
                && s["listeners"].as_array().is_some_and(|ls| {
                    ls.iter().all(|l| {
                        conditions_hold(
                            &l["conditions"],
                            &json!([{"type": "Accepted", "status": "True"}, {"type": "ResolvedRefs", "status": "True"}, {"type": "Programmed", "status": "True"}]),
                            gen,
                        )
                    })
                });
            ok.then_some(()).ok_or_else(|| format!("gateway {ns}/{name} not ready: {s}"))
        }
        "route_parent" => {
            let route = &check["route"];
            let r = h.get(route_plural(route), route["namespace"].as_str().unwrap_or(""), route["name"].as_str().unwrap_or("")).await;
            let gen = r["metadata"]["generation"].as_u64().unwrap_or(0);
            let parent = &check["parent"];
            let exact = check["match"] == "exact";
            let found = r["status"]["parents"].as_array().into_iter().flatten().any(|p| {
                let pr = &p["parentRef"];
                let ns_ok = pr["namespace"] == parent["namespace"] || (pr["namespace"].is_null() && (!exact || check["namespace_required"] != true));
                let ok = pr["name"] == parent["name"] && ns_ok;
                let ok = ok && (!exact || (p["controllerName"] == CONTROLLER && pr["group"] == parent["group"] && pr["kind"] == parent["kind"]));
                ok && conditions_hold(&p["conditions"], &check["conditions"], gen)
            });
            found.then_some(()).ok_or_else(|| format!("route {} parents {}: want {} {}", route["name"], r["status"], parent["name"], check["conditions"]))
        }
        "route_no_accepted_parents" => {
            let route = &check["route"];
            let r = h.get(route_plural(route), route["namespace"].as_str().unwrap_or(""), route["name"].as_str().unwrap_or("")).await;
            let parents = r["status"]["parents"].as_array().cloned().unwrap_or_default();
            let ok = parents.is_empty()
                || (parents.len() == 1 && parents[0]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Accepted" && c["status"] == "False"));
            ok.then_some(()).ok_or_else(|| format!("route {} has accepted parents: {}", route["name"], r["status"]))
        }
        "gateway_zero_routes" => {
            let (ns, name) = split(check["gateway"].as_str().unwrap_or(""));
            let g = h.get(gw_plural, ns, name).await;
            let ls = g["status"]["listeners"].as_array().cloned().unwrap_or_default();
            let ok = ls.is_empty() || (ls.len() == 1 && ls[0]["attachedRoutes"] == 0);
            ok.then_some(()).ok_or_else(|| format!("gateway {name} has routes: {}", g["status"]))
        }
        // A Gateway's listeners, or a ListenerSet's; `exact: false`: only
        // the listed ones are checked.
        "gateway_listeners" | "listener_set_listeners" => {
            let (plural, object) = if kind == "gateway_listeners" { (gw_plural, "gateway") } else { ("listenersets", "listener_set") };
            let (ns, name) = split(check[object].as_str().unwrap_or(""));
            let g = h.get(plural, ns, name).await;
            let gen = g["metadata"]["generation"].as_u64().unwrap_or(0);
            let have = g["status"]["listeners"].as_array().cloned().unwrap_or_default();
            let want = check["listeners"].as_array().cloned().unwrap_or_default();
            // The whole list (GatewayStatusMustHaveListeners): the Gateway's
            // own conditions current too.
            let exact = check["exact"] != false;
            let ok = (!exact || (have.len() == want.len() && (kind != "gateway_listeners" || latest_conditions(&g))))
                && want.iter().all(|w| {
                    have.iter().any(|l| {
                        l["name"] == w["name"]
                            && (w["attachedRoutes"].is_null() || l["attachedRoutes"] == w["attachedRoutes"])
                            // `supportedKinds: []`: none at all.
                            && (w["supportedKinds"] != json!([]) || l["supportedKinds"].as_array().is_none_or(Vec::is_empty))
                            && w["supportedKinds"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .all(|k| l["supportedKinds"].as_array().into_iter().flatten().any(|s| s["kind"] == k["kind"]))
                            && conditions_hold(&l["conditions"], &w["conditions"], gen)
                    })
                });
            ok.then_some(()).ok_or_else(|| format!("gateway {name} listeners {}: want {}", g["status"]["listeners"], check["listeners"]))
        }
        "gateway_condition" | "listener_set_condition" | "gateway_class_condition" => {
            let (plural, object) = match kind {
                "gateway_condition" => (gw_plural, "gateway"),
                "listener_set_condition" => ("listenersets", "listener_set"),
                _ => ("gatewayclasses", "gateway_class"),
            };
            let (ns, name) = split(check[object].as_str().unwrap_or(""));
            let o = h.get(plural, ns, name).await;
            let gen = o["metadata"]["generation"].as_u64().unwrap_or(0);
            let ok = conditions_hold(&o["status"]["conditions"], &check["conditions"], gen);
            ok.then_some(()).ok_or_else(|| format!("{object} {ns}/{name} conditions {}: want {}", o["status"]["conditions"], check["conditions"]))
        }
        "gateway_attached_listener_sets" => {
            let (ns, name) = split(check["gateway"].as_str().unwrap_or(""));
            let g = h.get(gw_plural, ns, name).await;
            let ok = g["status"]["attachedListenerSets"].as_u64().unwrap_or(0) == check["count"].as_u64().unwrap_or(0);
            ok.then_some(()).ok_or_else(|| format!("gateway {name} attachedListenerSets {}: want {}", g["status"]["attachedListenerSets"], check["count"]))
        }
        "namespace_gateways_ready" => {
            let ns = check["namespace"].as_str().unwrap_or("");
            let (_, list) = crate::kit::get_json(&h.fx.client, &format!("{}/v1/resources/{gw_plural}?namespace={ns}", h.fx.api(1))).await;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let want = json!([{"type": "Accepted", "status": "True"}, {"type": "Programmed", "status": "True"}]);
            // Gateways a test expects not to be ready carry this annotation.
            let skipped = |g: &&Value| g["metadata"]["annotations"]["gateway-api/skip-this-for-readiness"] == "true";
            let ok = !items.is_empty()
                && items
                    .iter()
                    .filter(|g| !skipped(g))
                    .all(|g| latest_conditions(g) && conditions_hold(&g["status"]["conditions"], &want, g["metadata"]["generation"].as_u64().unwrap_or(0)));
            ok.then_some(()).ok_or_else(|| format!("gateways of {ns} not ready: {list}"))
        }
        "route_latest_generation" => {
            let route = &check["route"];
            let r = h.get(route_plural(route), route["namespace"].as_str().unwrap_or(""), route["name"].as_str().unwrap_or("")).await;
            let gen = r["metadata"]["generation"].as_u64();
            let ok = r["status"]["parents"]
                .as_array()
                .is_some_and(|ps| ps.iter().all(|p| p["conditions"].as_array().into_iter().flatten().all(|c| c["observedGeneration"].as_u64() == gen)));
            ok.then_some(()).ok_or_else(|| format!("route {} conditions not at generation {gen:?}: {}", route["name"], r["status"]))
        }
        "gateway_latest_generation" | "gateway_class_latest_generation" => {
            let (plural, object) = if kind == "gateway_latest_generation" { (gw_plural, "gateway") } else { ("gatewayclasses", "gateway_class") };
            let (ns, name) = split(check[object].as_str().unwrap_or(""));
            let o = h.get(plural, ns, name).await;
            latest_conditions(&o)
                .then_some(())
                .ok_or_else(|| format!("{object} {ns}/{name} conditions not at generation {}: {}", o["metadata"]["generation"], o["status"]))
        }
        "generation_changed" => {
            let o = &check["object"];
            let r = h.get(plural(&o["kind"]), o["namespace"].as_str().unwrap_or(""), o["name"].as_str().unwrap_or("")).await;
            let now = r["metadata"]["generation"].as_u64();
            (now != h.recorded).then_some(()).ok_or_else(|| format!("generation still {now:?}"))
        }
        other => Err(format!("status check {other} not implemented by the harness")),
    }
}

/// One HTTP request of a case: (status, headers, echo body if any).
type Answer = (u16, reqwest::header::HeaderMap, Option<Value>);

/// A fresh token for `{UNIQUE}` in a request.
fn unique() -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!("lodestar-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// A request's URI: `path`, then `query` appended, `{UNIQUE}` replaced.
fn request_uri(req: &Value) -> String {
    let mut path = req["path"].as_str().unwrap_or("/").to_string();
    if let Some(q) = req["query"].as_object() {
        let qs: Vec<String> = q.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect();
        path = format!("{path}{}{}", if path.contains('?') { "&" } else { "?" }, qs.join("&"));
    }
    path.replace("{UNIQUE}", &unique())
}

async fn send(h: &Harness, case: &Value, jitter: Option<u32>, uri: &mut String) -> Result<Answer, String> {
    let via = &case["via"];
    if let Some(client) = via["mesh_client"].as_str() {
        return send_mesh(h, client, &case["request"], jitter, uri).await;
    }
    let gw = via["gateway"].as_str().ok_or("case has no gateway")?;
    let ip = h.addresses.get(gw).ok_or_else(|| format!("no address for {gw}"))?;
    let port = via["port"].as_u64().unwrap_or(80);
    let req = &case["request"];
    let path = request_uri(req);
    uri.clone_from(&path);
    if via["protocol"] == "grpc" {
        return send_grpc(&format!("{ip}:{port}"), req, jitter, uri).await;
    }
    let method = reqwest::Method::from_bytes(req["method"].as_str().unwrap_or("GET").as_bytes()).map_err(|e| e.to_string())?;
    let host = req["host"].as_str().map(String::from).unwrap_or_else(|| if port == 80 { ip.clone() } else { format!("{ip}:{port}") });
    if via["protocol"] == "h2c" {
        return send_h2c(&format!("{ip}:{port}"), method, &host, &path, req).await;
    }
    if via["scheme"] == "https" {
        // TLS with the SNI given, trusting only the listener's certificate's CA.
        let sni = via["sni"].as_str().unwrap_or(&host);
        let client = crate::kit::tls::TlsClient { ca: &h.ca, server_name: sni, certificate: None, alpn: &["http/1.1"] };
        let addr: std::net::SocketAddr = format!("{ip}:{port}").parse().map_err(|e| format!("{e}"))?;
        let reply = client.get(addr, &host, &path).await?;
        let mut headers = reqwest::header::HeaderMap::new();
        for line in reply.head.lines().skip(1) {
            if let Some((k, v)) = line.split_once(':') {
                if let (Ok(k), Ok(v)) = (reqwest::header::HeaderName::try_from(k.trim()), reqwest::header::HeaderValue::try_from(v.trim())) {
                    headers.append(k, v);
                }
            }
        }
        let json = headers.get("content-type").is_some_and(|v| v == "application/json");
        return Ok((reply.status, headers, if json { serde_json::from_str(&reply.body).ok() } else { None }));
    }
    // The listener listens on the Gateway's address at the listener's port.
    let mut r = h.http.request(method, format!("http://{ip}:{port}{path}")).header("host", host);
    let set: Vec<String> =
        req["echo_set_response_headers"].as_object().into_iter().flatten().map(|(k, v)| format!("{k}:{}", v.as_str().unwrap_or(""))).collect();
    r = r.header("X-Echo-Set-Header", set.join(","));
    http_answer(r, req, jitter).await
}

/// A request over cleartext HTTP/2 with prior knowledge (no upgrade), as
/// the suite's `H2CPriorKnowledgeProtocol` round tripper sends it.
async fn send_h2c(addr: &str, method: reqwest::Method, host: &str, path: &str, req: &Value) -> Result<Answer, String> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    let exchange = async {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("h2c handshake: {e}"))?;
        tokio::spawn(conn);
        let mut r = axum::http::Request::builder().method(method.as_str()).uri(format!("http://{host}{path}")).header("X-Echo-Set-Header", "");
        for (k, v) in req["headers"].as_object().into_iter().flatten() {
            r = r.header(k.as_str(), v.as_str().unwrap_or(""));
        }
        let resp = sender.send_request(r.body(Body::empty()).map_err(|e| e.to_string())?).await.map_err(|e| format!("h2c request: {e}"))?;
        let status = resp.status().as_u16();
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in resp.headers() {
            if let (Ok(k), Ok(v)) = (reqwest::header::HeaderName::from_bytes(k.as_str().as_bytes()), reqwest::header::HeaderValue::from_bytes(v.as_bytes())) {
                headers.append(k, v);
            }
        }
        let body = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 20).await.map_err(|e| format!("h2c body: {e}"))?;
        let json = headers.get("content-type").is_some_and(|v| v == "application/json");
        Ok((status, headers, if json { serde_json::from_slice(&body).ok() } else { None }))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| "h2c request timed out".to_string())?
}

/// A WebSocket case (`kind: websocket`): the handshake to `via`'s gateway
/// at `request.path`, then each of `expect.messages` (`text` or `binary`,
/// a list of bytes) sent and read back unchanged, as the suite's
/// golang.org/x/net/websocket client does it.
async fn websocket_exchange(h: &Harness, case: &Value) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let via = &case["via"];
    let gw = via["gateway"].as_str().ok_or("case has no gateway")?;
    let ip = h.addresses.get(gw).ok_or_else(|| format!("no address for {gw}"))?;
    let port = via["port"].as_u64().unwrap_or(80);
    let path = case["request"]["path"].as_str().unwrap_or("/");
    let host = if port == 80 { ip.clone() } else { format!("{ip}:{port}") };
    let exchange = async {
        let mut io = tokio::net::TcpStream::connect(format!("{ip}:{port}")).await.map_err(|e| format!("connect: {e}"))?;
        let key = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>())
        };
        let hello = format!(
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nOrigin: ws://gateway/{}\r\n\r\n",
            case["name"].as_str().unwrap_or("").replace(' ', "_")
        );
        io.write_all(hello.as_bytes()).await.map_err(|e| e.to_string())?;
        // The handshake answer, up to its blank line (bounded).
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            if head.len() > 16 << 10 {
                return Err("handshake answer over 16 KiB".to_string());
            }
            let b = io.read_u8().await.map_err(|e| format!("handshake: {e}"))?;
            head.push(b);
        }
        let head = String::from_utf8_lossy(&head).into_owned();
        let status = head.split_whitespace().nth(1).unwrap_or("");
        if status != "101" {
            return Err(format!("handshake answered {status}: {}", head.lines().next().unwrap_or("")));
        }
        let accept = head.lines().find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("sec-websocket-accept")).map(|(_, v)| v.trim()));
        if accept != Some(websocket_accept(key.as_bytes()).as_str()) {
            return Err(format!("Sec-WebSocket-Accept {accept:?} does not answer the key"));
        }
        for m in case["expect"]["messages"].as_array().into_iter().flatten() {
            let (opcode, payload): (u8, Vec<u8>) = match (m["text"].as_str(), m["binary"].as_array()) {
                (Some(t), _) => (0x1, t.as_bytes().to_vec()),
                (None, Some(b)) => (0x2, b.iter().filter_map(Value::as_u64).map(|x| x as u8).collect()),
                _ => return Err(format!("message {m}: neither text nor binary")),
            };
            let mask: [u8; 4] = rand::random();
            ws_write(&mut io, opcode, &payload, Some(mask)).await.map_err(|e| format!("send: {e}"))?;
            let (got_op, got) = ws_read(&mut io).await.map_err(|e| format!("receive: {e}"))?;
            if (got_op, &got) != (opcode, &payload) {
                return Err(format!("sent opcode {opcode} {payload:?}, got opcode {got_op} {got:?}"));
            }
        }
        let _ = ws_write(&mut io, 0x8, &[], Some(rand::random())).await;
        Ok(())
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| "WebSocket exchange timed out".to_string())?
}

/// Send `r` with the request's `headers` (and `X-Jitter`): the answer,
/// with the echo's JSON body if it is one.
async fn http_answer(mut r: reqwest::RequestBuilder, req: &Value, jitter: Option<u32>) -> Result<Answer, String> {
    for (k, v) in req["headers"].as_object().into_iter().flatten() {
        r = r.header(k.as_str(), v.as_str().unwrap_or(""));
    }
    if let Some(j) = jitter {
        r = r.header("X-Jitter", j.to_string());
    }
    let resp = r.send().await.map_err(|e| format!("request failed: {e}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let json = headers.get("content-type").is_some_and(|v| v == "application/json");
    let body = resp.text().await.unwrap_or_default();
    Ok((status, headers, if json { serde_json::from_str(&body).ok() } else { None }))
}

/// A mesh client's request: to its sidecar, at the sidecar's address on
/// the port the client's URL dials (default 80), with the Host header that
/// URL gives, which is what the sidecar sees of an application's
/// connection (the harness's clients are not captured: they dial the
/// sidecar).
async fn send_mesh(h: &Harness, client: &str, req: &Value, jitter: Option<u32>, uri: &mut String) -> Result<Answer, String> {
    let p = h.proxies.get(client).ok_or_else(|| format!("no mesh client {client}"))?;
    let host = req["host"].as_str().unwrap_or("").to_string();
    let port: u16 = match host.rsplit_once(':') {
        Some((_, port)) => port.parse().map_err(|e| format!("host {host}: {e}"))?,
        None => 80,
    };
    let addr = format!("{}:{port}", p.ip);
    if req["protocol"] == "grpc" {
        // Any unary call that names the answering instance will do.
        let mut call = req.clone();
        call["authority"] = json!(host);
        call["grpc"] = json!({"service": "proto.EchoTestService", "method": "Echo"});
        let (status, headers, body) = send_grpc(&addr, &call, jitter, uri).await?;
        return match headers.get("grpc-status").and_then(|v| v.to_str().ok()) {
            Some("OK") => Ok((status, headers, body)),
            other => Err(format!("gRPC status {other:?}")),
        };
    }
    let path = req["path"].as_str().unwrap_or("/").to_string();
    uri.clone_from(&path);
    let method = reqwest::Method::from_bytes(req["method"].as_str().unwrap_or("GET").as_bytes()).map_err(|e| e.to_string())?;
    http_answer(h.http.request(method, format!("http://{addr}{path}")).header("host", host), req, jitter).await
}

/// What a case checks: its `expect`, less what the mesh comparison
/// upstream leaves out for mesh clients (the path, host and method the
/// server saw, and its namespace).
fn expectation(case: &Value) -> Value {
    let mut expect = case["expect"].clone();
    if case["via"]["mesh_client"].is_string() {
        let leave_out = |e: &mut Value| {
            if let Some(br) = e.get_mut("backend_request").and_then(Value::as_object_mut) {
                for f in ["method", "path", "host"] {
                    br.remove(f);
                }
            }
            if let Some(b) = e.get_mut("backend").and_then(Value::as_object_mut) {
                b.remove("namespace");
            }
        };
        leave_out(&mut expect);
        if let Some(first) = expect.get_mut("first") {
            leave_out(first);
        }
    }
    expect
}

/// A unary call of `request.grpc` (`service`, `method`) with a real gRPC
/// client (tonic, h2c) to `addr`, with `request.metadata` and, if given,
/// `request.authority`: the echo's JSON on OK; the call's gRPC status is
/// the answer's `grpc-status` header (its name, as upstream writes it).
async fn send_grpc(addr: &str, req: &Value, jitter: Option<u32>, uri: &mut String) -> Result<Answer, String> {
    let path = format!("/{}/{}", req["grpc"]["service"].as_str().unwrap_or(""), req["grpc"]["method"].as_str().unwrap_or(""));
    uri.clone_from(&path);
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).map_err(|e| e.to_string())?.timeout(Duration::from_secs(10));
    if let Some(a) = req["authority"].as_str() {
        endpoint = endpoint.origin(format!("http://{a}").parse().map_err(|e| format!("authority {a}: {e}"))?);
    }
    let channel = endpoint.connect().await.map_err(|e| format!("connect {addr}: {e}"))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| format!("{e}"))?;
    let mut call = tonic::Request::new(Vec::new());
    for (k, v) in req["metadata"].as_object().into_iter().flatten() {
        let key = tonic::metadata::MetadataKey::from_bytes(k.as_bytes()).map_err(|e| format!("metadata {k}: {e}"))?;
        call.metadata_mut().insert(key, v.as_str().unwrap_or("").parse().map_err(|e| format!("metadata {k}: {e}"))?);
    }
    if let Some(j) = jitter {
        call.metadata_mut().insert("x-jitter", j.to_string().parse().unwrap());
    }
    let method = axum::http::uri::PathAndQuery::try_from(path.as_str()).map_err(|e| e.to_string())?;
    let (code, body) = match grpc.unary(call, method, crate::xds::RawCodec).await {
        Ok(reply) => ("OK".to_string(), serde_json::from_slice(&reply.into_inner()).ok()),
        Err(status) => (format!("{:?}", status.code()), None),
    };
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("grpc-status", code.parse().unwrap());
    Ok((200, headers, body))
}

fn header_of(map: &Value, name: &str) -> Option<String> {
    map.as_object()?.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| match v {
        Value::Array(vs) => vs.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(","),
        v => v.as_str().unwrap_or("").to_string(),
    })
}

/// Check one answer against `expect` (as the suite does).
fn judge(expect: &Value, status: u16, headers: &reqwest::header::HeaderMap, body: Option<&Value>, uri: &str) -> Result<(), String> {
    if let Some(want) = expect["grpc_status"].as_str() {
        return judge_grpc(expect, want, headers, body);
    }
    let statuses: Vec<u64> = expect["status"].as_array().into_iter().flatten().filter_map(Value::as_u64).collect();
    let timeout = |s: u64| s == 504 || s == 408;
    if !statuses.iter().any(|&s| s == u64::from(status) || (timeout(s) && timeout(u64::from(status)))) {
        return Err(format!("status {status}, want {statuses:?}"));
    }
    if (300..400).contains(&status) {
        if let Some(want) = expect["redirect"].as_object() {
            let loc = headers.get("location").and_then(|v| v.to_str().ok()).ok_or("redirect without Location")?;
            let url = reqwest::Url::parse(loc).map_err(|e| format!("Location {loc:?}: {e}"))?;
            let default_port = if url.scheme() == "https" { 443 } else { 80 };
            let port_ok = match want.get("port").and_then(|p| p.as_u64().or_else(|| p.as_str().and_then(|s| s.parse().ok()))) {
                Some(p) => url.port_or_known_default() == Some(p as u16),
                None => url.port().is_none_or(|p| p == default_port),
            };
            let ok = want.get("scheme").and_then(Value::as_str).is_none_or(|s| s == url.scheme())
                && want.get("host").and_then(Value::as_str).is_none_or(|h| url.host_str() == Some(h))
                && want.get("path").and_then(Value::as_str).is_none_or(|p| p == url.path())
                && port_ok;
            return if ok { Ok(()) } else { Err(format!("redirect to {loc}, want {}", expect["redirect"])) };
        }
        return Ok(());
    }
    if status != 200 && status != 204 {
        return Ok(());
    }
    let norm = |s: &str| if expect["ignore_whitespace"] == true { s.replace(' ', "") } else { s.to_string() };
    match expect.get("backend").filter(|b| !b.is_null()) {
        // Answered by the gateway (a CORS preflight), not an echo server.
        Some(b) if b == "none" => {
            if let Some(body) = body {
                return Err(format!("answered by the echo server {}, want the gateway", body["pod"]));
            }
        }
        Some(b) => answered_by(b, body.ok_or("no echo body")?)?,
        None => {}
    }
    if let Some(br) = expect.get("backend_request").filter(|b| !b.is_null()) {
        let Some(body) = body else { return Err("no echo body".into()) };
        for f in ["method", "path", "host"] {
            // The request's own URI where upstream's has a fresh token.
            let want = if br[f].as_str().is_some_and(|w| w.contains("{UNIQUE}")) { json!(uri) } else { br[f].clone() };
            if want.is_string() && body[f] != want {
                return Err(format!("backend saw {f} {}, want {}", body[f], br[f]));
            }
        }
        for (k, v) in br["headers"].as_object().into_iter().flatten() {
            let got = header_of(&body["headers"], k);
            if got.as_deref().map(norm) != v.as_str().map(norm) {
                return Err(format!("backend saw header {k}: {got:?}, want {v}"));
            }
        }
        for k in br["absent_headers"].as_array().into_iter().flatten().filter_map(Value::as_str) {
            if header_of(&body["headers"], k).is_some() {
                return Err(format!("backend saw header {k}, want it absent"));
            }
        }
    }
    for (k, v) in expect["response_headers"].as_object().into_iter().flatten() {
        let got: Vec<&str> = headers.get_all(k.as_str()).iter().filter_map(|v| v.to_str().ok()).collect();
        if norm(&got.join(",")) != norm(v.as_str().unwrap_or("")) {
            return Err(format!("response header {k}: {got:?}, want {v}"));
        }
    }
    for (k, options) in expect["response_headers_one_of"].as_object().into_iter().flatten() {
        let got: Vec<&str> = headers.get_all(k.as_str()).iter().filter_map(|v| v.to_str().ok()).collect();
        let got = norm(&got.join(","));
        if !headers.contains_key(k.as_str()) || !options.as_array().into_iter().flatten().any(|o| norm(o.as_str().unwrap_or("")) == got) {
            return Err(format!("response header {k}: {got:?}, want one of {options}"));
        }
    }
    for k in expect["response_absent_headers"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        if headers.contains_key(k) {
            return Err(format!("response header {k} present, want it absent"));
        }
    }
    Ok(())
}

/// The API's plural for a check's `route` (`kind`: HTTPRoute by default).
fn route_plural(route: &Value) -> &'static str {
    plural(&route["kind"])
}

/// The echo `body` came from the backend `b` names (`name`: its pods are
/// `NAME-...`; `namespace`), each when given.
fn answered_by(b: &Value, body: &Value) -> Result<(), String> {
    if let Some(name) = b["name"].as_str() {
        if !body["pod"].as_str().unwrap_or("").starts_with(&format!("{name}-")) {
            return Err(format!("answered by {}, want {name}", body["pod"]));
        }
    }
    if b["namespace"].is_string() && body["namespace"] != b["namespace"] {
        return Err(format!("answered from namespace {}, want {}", body["namespace"], b["namespace"]));
    }
    Ok(())
}

/// A gRPC answer: its status, then (OK) the backend and the method it saw.
fn judge_grpc(expect: &Value, want: &str, headers: &reqwest::header::HeaderMap, body: Option<&Value>) -> Result<(), String> {
    let got = headers.get("grpc-status").and_then(|v| v.to_str().ok()).unwrap_or("");
    if got != want {
        return Err(format!("gRPC status {got}, want {want}"));
    }
    if want != "OK" {
        return Ok(());
    }
    let Some(body) = body else { return Err("no echo message".into()) };
    answered_by(&expect["backend"], body)?;
    if let Some(m) = expect["fully_qualified_method"].as_str() {
        if body["path"] != m {
            return Err(format!("backend saw method {}, want {m}", body["path"]));
        }
    }
    Ok(())
}

/// A case passes 3 times in a row within 20 s (upstream: 30 s).
async fn run_case(h: &Harness, case: &Value) -> Result<(), String> {
    match case["kind"].as_str() {
        Some("weighted") => return run_weighted(h, case).await,
        Some("repeated") => return run_repeated(h, case).await,
        Some("mirror_percentage") => return run_mirror_percentage(h, case).await,
        _ => {}
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut streak = 0;
    let expect = expectation(case);
    loop {
        let mut uri = String::new();
        let result = if case["kind"] == "websocket" {
            websocket_exchange(h, case).await
        } else {
            match send(h, case, None, &mut uri).await {
                Ok((status, headers, body)) => judge(&expect, status, &headers, body.as_ref(), &uri),
                Err(e) => Err(e),
            }
        };
        if let Some(mirrors) = case["expect"]["mirrored_to"].as_array().filter(|_| result.is_ok()) {
            // A copy of the request reaches each mirror within 10 s.
            let path = uri.as_str();
            for m in mirrors {
                let name = m["name"].as_str().unwrap_or("");
                let until = Instant::now() + Duration::from_secs(10);
                while !h.echoes.iter().filter(|e| e.pod.starts_with(name)).any(|e| e.seen.lock().unwrap().iter().any(|u| u == path)) {
                    if Instant::now() > until {
                        let seen: Vec<Vec<String>> = h.echoes.iter().filter(|e| e.pod.starts_with(name)).map(|e| e.seen.lock().unwrap().clone()).collect();
                        return Err(format!("no mirrored copy of {path} reached {name} (it saw {seen:?})"));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        match result {
            Ok(()) => {
                streak += 1;
                if streak == 3 {
                    return Ok(());
                }
            }
            Err(e) => {
                streak = 0;
                if Instant::now() > deadline {
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// `case` with its `expect` replaced by `expect.first`.
fn first_of(case: &Value) -> Value {
    let mut first = case.clone();
    first["expect"] = case["expect"]["first"].clone();
    first.as_object_mut().unwrap().remove("kind");
    first
}

/// `kind: repeated`: `expect.first` holds (eventually, as a case), then
/// each of `expect.requests` more answers, one after another, is an echo
/// whose pod name starts with the one value of the request header
/// `expect.each.backend_named_by_header` the backend saw.
async fn run_repeated(h: &Harness, case: &Value) -> Result<(), String> {
    Box::pin(run_case(h, &first_of(case))).await?;
    let header = case["expect"]["each"]["backend_named_by_header"].as_str().ok_or("repeated: no expect.each.backend_named_by_header")?;
    for i in 0..case["expect"]["requests"].as_u64().unwrap_or(0) {
        let mut uri = String::new();
        let (status, _, body) = send(h, case, None, &mut uri).await.map_err(|e| format!("request {i}: {e}"))?;
        let body = body.ok_or_else(|| format!("request {i}: status {status}, no echo body"))?;
        let values: Vec<&str> = body["headers"]
            .as_object()
            .and_then(|m| m.iter().find(|(k, _)| k.eq_ignore_ascii_case(header)))
            .and_then(|(_, v)| v.as_array())
            .map(|vs| vs.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let [named] = values[..] else { return Err(format!("request {i}: the backend saw {header}: {values:?}, want exactly one value")) };
        let pod = body["pod"].as_str().unwrap_or("");
        if !pod.starts_with(named) {
            return Err(format!("request {i}: {header} names {named}, answered by {pod}"));
        }
    }
    Ok(())
}

/// `kind: mirror_percentage`: `expect.first` holds (eventually), then per
/// attempt (up to `attempts`) a fresh `{UNIQUE}` shared by all of
/// `requests` requests (`concurrency` in flight, each passing `first`
/// eventually, once), and the copies of that request URI the `mirror`
/// backend received must number `requests * percent / 100` within
/// `tolerance_std_devs` binomial standard deviations.
async fn run_mirror_percentage(h: &Harness, case: &Value) -> Result<(), String> {
    Box::pin(run_case(h, &first_of(case))).await?;
    let d = &case["expect"]["mirror_distribution"];
    let requests = d["requests"].as_u64().unwrap_or(500);
    let concurrency = d["concurrency"].as_u64().unwrap_or(10).max(1) as usize;
    let p = d["percent"].as_f64().ok_or("mirror_percentage: no percent")? / 100.0;
    let (mirror_name, mirror_ns) = (d["mirror"]["name"].as_str().unwrap_or(""), d["mirror"]["namespace"].as_str().unwrap_or(""));
    let (expected, margin) = (requests as f64 * p, d["tolerance_std_devs"].as_f64().unwrap_or(3.0) * (requests as f64 * p * (1.0 - p)).sqrt());
    let mut last = String::new();
    for attempt in 0..d["attempts"].as_u64().unwrap_or(5) {
        // One token for the whole attempt: every request has the same URI.
        let text = serde_json::to_string(&first_of(case)).unwrap().replace("{UNIQUE}", &unique());
        let one: Value = serde_json::from_str(&text).unwrap();
        let uri = request_uri(&one["request"]);
        let copies = || -> usize {
            h.echoes
                .iter()
                .filter(|e| e.pod.starts_with(mirror_name) && e.namespace == mirror_ns)
                .map(|e| e.seen.lock().unwrap().iter().filter(|u| **u == uri).count())
                .sum()
        };
        let before = copies();
        use futures::StreamExt;
        let mut sent = futures::stream::iter(0..requests).map(|_| run_once_eventually(h, &one)).buffer_unordered(concurrency);
        while let Some(r) = sent.next().await {
            r?;
        }
        // Mirrored copies are sent on the side: until their count holds for 1 s (at most 10 s).
        let until = Instant::now() + Duration::from_secs(10);
        let mut seen = copies();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = copies();
            if now == seen || Instant::now() > until {
                break;
            }
            seen = now;
        }
        let mirrored = (seen - before) as f64;
        eprintln!("mirror to {mirror_name}: {mirrored} of {requests} (want {expected} +- {margin:.1}), attempt {}", attempt + 1);
        if (mirrored - expected).abs() <= margin {
            return Ok(());
        }
        last = format!("{mirrored} of {requests} requests mirrored to {mirror_name}, want {expected} +- {margin:.1}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    Err(last)
}

/// One request of `case` that passes, retried (1 s apart) for up to 20 s.
async fn run_once_eventually(h: &Harness, case: &Value) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let expect = expectation(case);
    loop {
        let mut uri = String::new();
        let r = match send(h, case, None, &mut uri).await {
            Ok((status, headers, body)) => judge(&expect, status, &headers, body.as_ref(), &uri),
            Err(e) => Err(e),
        };
        if r.is_ok() || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The traffic split: 500 requests, `concurrency` (10) at a time, each
/// backend's share within the tolerance, no backend of weight 0 seen; up
/// to 10 attempts.
async fn run_weighted(h: &Harness, case: &Value) -> Result<(), String> {
    let expect = expectation(case);
    let d = &expect["distribution"];
    let concurrency = d["concurrency"].as_u64().unwrap_or(10).max(1) as usize;
    let weights: BTreeMap<String, f64> = d["weights"].as_object().into_iter().flatten().map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(0.0))).collect();
    let requests = d["requests"].as_u64().unwrap_or(500) as usize;
    let tolerance = d["tolerance"].as_f64().unwrap_or(0.05);
    let mut seed: u32 = 0x2545_f491;
    let mut last = String::new();
    for _ in 0..d["attempts"].as_u64().unwrap_or(10) {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        let mut failed = None;
        for batch in 0..requests.div_ceil(concurrency) {
            let n = concurrency.min(requests - batch * concurrency);
            let jitters: Vec<Option<u32>> = (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    seed.is_multiple_of(2).then_some(seed % 10_000)
                })
                .collect();
            let answers = futures::future::join_all(jitters.into_iter().map(|j| async move {
                let mut uri = String::new();
                send(h, case, j, &mut uri).await.map(|a| (a, uri))
            }))
            .await;
            for a in answers {
                match a {
                    Ok(((status, headers, body), uri)) => {
                        if let Err(e) = judge(&expect["first"], status, &headers, body.as_ref(), &uri) {
                            failed = Some(e);
                            continue;
                        }
                        let pod = body.as_ref().and_then(|b| b["pod"].as_str()).unwrap_or("").to_string();
                        let parts: Vec<&str> = pod.split('-').collect();
                        let backend = parts[..parts.len().saturating_sub(2)].join("-");
                        *counts.entry(backend).or_default() += 1;
                    }
                    Err(e) => failed = Some(e),
                }
            }
        }
        if let Some(e) = failed {
            last = e;
            continue;
        }
        let expected = weights.values().filter(|w| **w > 0.0).count();
        let shares_ok = counts.keys().all(|b| weights.contains_key(b))
            && counts.len() == expected
            && weights.iter().all(|(b, w)| ((*counts.get(b).unwrap_or(&0) as f64 / requests as f64) - w).abs() <= tolerance);
        if shares_ok {
            eprintln!("traffic split over {requests} requests: {counts:?} (weights {weights:?})");
            return Ok(());
        }
        last = format!("split {counts:?}, want {weights:?}");
    }
    Err(last)
}

async fn run_test(h: &mut Harness, name: &str) -> Result<(), String> {
    let t = load(&data_dir().join(format!("tests/{name}.yaml")));
    if let Some(why) = t["skip_reason"].as_str() {
        return Err(format!("skipped: {}", why.split_whitespace().collect::<Vec<_>>().join(" ")));
    }
    // Objects Lodestar refuses to store (Kubernetes stores them): each
    // write must be refused, naming the field.
    for r in t["refused"].as_array().into_iter().flatten() {
        let field = r["field"].as_str().unwrap_or("");
        match h.apply(vec![r["object"].clone()]).await {
            Err(e) if e.starts_with("apply answered 400") && e.contains(&format!("{field}\"")) => {}
            Err(e) => return Err(format!("refused: want 400 naming {field}: {e}")),
            Ok(_) => return Err(format!("refused: {} {} was stored", r["object"]["kind"], r["object"]["metadata"]["name"])),
        }
    }
    // The registry's stand-ins for the test's Kubernetes-only objects,
    // applied and deleted with its manifests.
    let mut manifests = registry_equivalent(h, &t);
    manifests.extend(t["manifests"].as_array().cloned().unwrap_or_default());
    if !manifests.is_empty() {
        let revision = h.apply(manifests.clone()).await?;
        h.synced(revision).await;
    }
    let mut result = Ok(());
    for check in t["status"].as_array().into_iter().flatten() {
        if let Err(e) = check_status(h, check).await {
            result = Err(e);
            break;
        }
    }
    let mut manifests_now = manifests.clone();
    if result.is_ok() {
        for case in t["cases"].as_array().into_iter().flatten() {
            if case["action"].is_string() {
                if let Err(e) = action(h, case, &mut manifests_now).await {
                    result = Err(format!("action {}: {e}", case["action"]));
                    break;
                }
                continue;
            }
            if let Err(e) = run_case(h, case).await {
                result = Err(format!("{}: {e}", case["name"].as_str().unwrap_or("case")));
                break;
            }
        }
    }
    let docs: Vec<Value> = manifests.iter().map(|d| json!({"apiVersion": d["apiVersion"], "kind": d["kind"], "metadata": d["metadata"]})).collect();
    if !docs.is_empty() {
        let revision = h.delete(&docs).await;
        h.synced(revision).await;
    }
    result
}

/// The registry Service for upstream `ports` (`{name, port, targetPort}`;
/// an unnamed one is `http-N`; no `targetPort`: the port), each of
/// `protocol(port)`, and the ports its Instances take (name -> targetPort).
fn registry_service(name: &str, ns: &str, ports: &Value, protocol: impl Fn(&Value) -> &'static str) -> (Value, serde_json::Map<String, Value>) {
    let ports: Vec<Value> = ports
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, p)| {
            let target = if p["targetPort"].is_null() { &p["port"] } else { &p["targetPort"] };
            json!({"name": p["name"].as_str().map(String::from).unwrap_or_else(|| format!("http-{i}")), "number": p["port"], "targetPort": target, "protocol": protocol(p)})
        })
        .collect();
    let instance_ports = ports.iter().map(|p| (p["name"].as_str().unwrap().to_string(), p["targetPort"].clone())).collect();
    (json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": name, "namespace": ns}, "spec": {"ports": ports}}), instance_ports)
}

/// A test's `registry_equivalent`: for each entry a registry Service with
/// its ports and, as Instances, the echo servers of its `backend` (the
/// pods a Kubernetes Service of that shape would reach).
fn registry_equivalent(h: &Harness, t: &Value) -> Vec<Value> {
    let mut docs = Vec::new();
    for svc in t["registry_equivalent"].as_array().into_iter().flatten() {
        let (name, ns, backend) =
            (svc["name"].as_str().unwrap(), svc["namespace"].as_str().unwrap(), svc["backend"].as_str().expect("registry_equivalent: backend"));
        let (service, instance_ports) = registry_service(name, ns, &svc["ports"], |_| "HTTP");
        docs.push(service);
        let pods: Vec<&Echo> = h.echoes.iter().filter(|e| e.namespace == ns && e.pod.starts_with(&format!("{backend}-lodestar-"))).collect();
        assert!(!pods.is_empty(), "registry_equivalent {name}: no echo server of {backend} in {ns}");
        for (i, e) in pods.into_iter().enumerate() {
            docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": format!("{name}-{i}"), "namespace": ns},
                "spec": {"service": name, "address": e.ip, "ports": instance_ports}}));
        }
    }
    docs
}

/// Set `path` (`spec.rules[0].backendRefs[0].name`) in `doc`.
fn set_path(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let mut at = doc;
    for seg in path.split('.') {
        let (name, index) = match seg.split_once('[') {
            Some((n, i)) => (n, Some(i.trim_end_matches(']').parse::<usize>().map_err(|e| format!("{path}: {e}"))?)),
            None => (seg, None),
        };
        at = at.get_mut(name).ok_or_else(|| format!("{path}: no {name}"))?;
        if let Some(i) = index {
            at = at.get_mut(i).ok_or_else(|| format!("{path}: no [{i}]"))?;
        }
    }
    *at = value;
    Ok(())
}

/// An action between cases: delete, patch (then its checks), record_generation.
async fn action(h: &mut Harness, a: &Value, manifests: &mut [Value]) -> Result<(), String> {
    let o = &a["object"];
    let same = |d: &Value| d["kind"] == o["kind"] && d["metadata"]["name"] == o["name"] && d["metadata"]["namespace"] == o["namespace"];
    match a["action"].as_str().unwrap_or("") {
        "delete" => {
            let doc = manifests.iter().find(|d| same(d)).ok_or("no such manifest")?;
            let revision = h.delete(&[json!({"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": doc["metadata"]})]).await;
            h.synced(revision).await;
        }
        "record_generation" => {
            let r = h.get(plural(&o["kind"]), o["namespace"].as_str().unwrap_or(""), o["name"].as_str().unwrap_or("")).await;
            h.recorded = r["metadata"]["generation"].as_u64();
        }
        "patch" => {
            let doc = manifests.iter_mut().find(|d| same(d)).ok_or("no such manifest")?;
            for s in a["set"].as_array().into_iter().flatten() {
                set_path(doc, s["path"].as_str().unwrap_or(""), s["value"].clone())?;
            }
            let doc = doc.clone();
            let revision = h.apply(vec![doc]).await?;
            h.synced(revision).await;
            for check in a["then"].as_array().into_iter().flatten() {
                check_status(h, check).await?;
            }
        }
        other => return Err(format!("{other} not implemented by the harness")),
    }
    Ok(())
}

/// Run `required` and `reported` (or `GATEWAY_API_TEST` alone), print
/// the table (test, level, pass/fail, why) and fail if a required one did.
async fn run_and_report(h: &mut Harness, required: &[&str], reported: &[&str], not_run: &[(&str, &str)]) {
    let started = Instant::now();
    let mut table = Vec::new();
    // GATEWAY_API_TEST=Name (or Name,Name,...) runs those tests only.
    let only = std::env::var("GATEWAY_API_TEST").ok();
    let chosen = |n: &str| only.as_deref().is_none_or(|o| o.split(',').any(|o| o.trim() == n));
    for name in required.iter().chain(reported).filter(|n| chosen(n)) {
        let t0 = Instant::now();
        let r = run_test(h, name).await;
        table.push((name.to_string(), required.contains(name), r, t0.elapsed()));
    }
    for (name, why) in not_run.iter().filter(|(n, _)| chosen(n)) {
        table.push((name.to_string(), false, Err(format!("not run: {why}")), Duration::ZERO));
    }
    let level = |name: &str| load(&data_dir().join(format!("tests/{name}.yaml")))["profile"]["level"].as_str().unwrap_or("").to_string();
    println!("{:<52} {:<9} {:<5} {:>6}  why", "test", "level", "pass", "secs");
    for (name, _, r, took) in &table {
        let why = r.as_ref().err().map(|e| e.chars().take(160).collect::<String>()).unwrap_or_default();
        let verdict = match r {
            Ok(()) => "pass",
            Err(e) if e.starts_with("not run") || e.starts_with("skipped") => "-",
            Err(_) => "FAIL",
        };
        println!("{name:<52} {:<9} {verdict:<5} {:>6.1}  {why}", level(name), took.as_secs_f64());
    }
    let passed = table.iter().filter(|t| t.2.is_ok()).count();
    println!("{passed}/{} passed in {:.0} s", table.len(), started.elapsed().as_secs_f64());
    for p in h.proxies.values() {
        p.envoy.assert_no_rejections().await;
    }
    if only.is_some() {
        for p in h.proxies.values() {
            let stats = p.envoy.stats().await;
            for (k, v) in stats.iter().filter(|(k, v)| k.starts_with("cluster.outbound") && **v > 0 && (k.contains("rq_") || k.contains("cx_"))) {
                eprintln!("{k} {v}");
            }
            p.envoy.dump_log();
        }
    }
    let failed: Vec<&String> = table.iter().filter(|t| t.1 && t.2.is_err()).map(|t| &t.0).collect();
    assert!(failed.is_empty(), "required conformance tests failed: {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance() {
    let fx = Fixture::start(1).await;
    let base = load(&data_dir().join("base.yaml"));
    let mut h = Harness::new(fx);

    // Backends: registry Services (ports named after their protocol) and
    // one echo process per replica, registered as an Instance.
    let mut docs = vec![base["gateway_class"].clone()];
    let gw = &base["gateway_base"];
    // Namespaces, for their labels (a listener's `from: Selector`).
    for ns in gw["namespaces"].as_array().into_iter().flatten() {
        docs.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns["name"], "labels": ns["labels"]}}));
    }
    let mut tasks = Vec::new();
    let mut next_backend_ip = 100u8;
    for b in gw["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| matches!(b["server"].as_str(), Some("echo-basic-http" | "echo-basic-grpc")) && !b["name"].as_str().unwrap_or("").starts_with("tls"))
    {
        let (name, ns) = (b["name"].as_str().unwrap(), b["namespace"].as_str().unwrap());
        let svc = gw["services"].as_array().into_iter().flatten().find(|s| s["name"] == name && s["namespace"] == ns).expect("service of backend");
        // echo-basic's gRPC servers speak h2c (appProtocol kubernetes.io/h2c);
        // an HTTP server's port with that appProtocol is its h2c port.
        let grpc = b["server"] == "echo-basic-grpc";
        let protocol = |p: &Value| match (grpc, p["appProtocol"].as_str()) {
            (true, _) => "GRPC",
            (false, Some("kubernetes.io/h2c")) => "HTTP2",
            _ => "HTTP",
        };
        let (service, instance_ports) = registry_service(name, ns, &svc["ports"], protocol);
        docs.push(service);
        for i in 0..b["replicas"].as_u64().unwrap_or(1) {
            let pod = format!("{name}-lodestar-{i}");
            let ip = h.fx.ip(next_backend_ip);
            next_backend_ip += 1;
            let ports: &[u64] = if grpc { &[3000] } else { &[3000, H2C_PORT] };
            let (e, task) = start_echo(&ip, ports, &pod, ns).await;
            h.echoes.push(e);
            tasks.extend(task);
            docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": pod, "namespace": ns},
                "spec": {"service": name, "address": ip, "ports": instance_ports}}));
        }
    }
    for g in gw["gateways"].as_array().into_iter().flatten() {
        docs.push(g.clone());
    }
    // The generated certificate of the HTTPS listeners, issued from a CA
    // (rustls takes neither a self-signed leaf as a root nor a `*` SAN):
    // valid for every name the HTTPS test sends.
    let leaf = h.ca.server(&["example.org", "second-example.org", "unknown-example.org", "*.wildcard.org"]);
    // And `certificate` in gateway-conformance-web-backend, which listeners
    // name from another namespace (upstream: self-signed for `*`).
    let web_backend = h.ca.server(&["certificate.example"]);
    for (name, ns, leaf) in
        [("tls-validity-checks-certificate", "gateway-conformance-infra", &leaf), ("certificate", "gateway-conformance-web-backend", &web_backend)]
    {
        use base64::Engine;
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        docs.push(json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": ns},
            "data": {"tls.crt": b64(leaf.cert_pem.as_bytes()), "tls.key": b64(leaf.key_pem.as_bytes())}}));
    }
    let revision = h.apply(docs).await.expect("base setup");

    // One gateway Envoy for every Gateway of the class.
    let mut o = EnvoyOptions::new("conformance-gateway", &h.fx.ip(1));
    o.node_type = "router".into();
    o.namespace = "gateway-conformance-infra".into();
    o.labels = vec![(lodestar::translate::gateway_api::CLASS_LABEL.into(), CLASS.into())];
    // A gateway's proxy token: it is served its namespace's Secrets.
    let token = crate::kit::token_create(&h.fx.api(1), &["--proxy", "gateway-conformance-infra/conformance-gateway", "--gateway"]);
    let token_file = h.fx.tmp.path().join("gateway.token");
    std::fs::write(&token_file, token["secret"].as_str().unwrap()).unwrap();
    o.proxy_token_file = Some(token_file);
    let proxy = h.fx.proxy(o, 1, revision).await;
    h.proxies.insert("gateway".into(), proxy);
    for g in ["same-namespace", "all-namespaces", "same-namespace-with-https-listener"] {
        check_status(&h, &json!({"check": "gateway_ready", "gateway": format!("gateway-conformance-infra/{g}")})).await.expect("base gateways ready");
    }

    run_and_report(&mut h, REQUIRED, REPORTED, NOT_RUN).await;
    for t in tasks {
        t.abort();
    }
}

/// The mesh (GAMMA) Core tests: routes whose parent is a Service steer
/// the mesh client's sidecar.
const MESH_REQUIRED: &[&str] = &[
    "MeshBasic",
    "MeshHTTPRouteSimpleSameNamespace",
    "MeshHTTPRouteMatching",
    "MeshHTTPRouteRedirectHostAndStatus",
    "MeshHTTPRouteRequestHeaderModifier",
    "MeshHTTPRouteWeight",
    "MeshTrafficSplit",
    "MeshGRPCRouteWeight",
];

/// The mesh's Extended tests (in no profile report at v1.6.1 but the
/// first), run and reported.
/// MeshFrontendHostname has a `skip_reason` (reported as not run).
const MESH_REPORTED: &[&str] = &["MeshHTTPRouteBackendRequestHeaderModifier", "MeshPorts", "MeshConsumerRoute", "MeshFrontendHostname"];

const MESH_NOT_RUN: &[(&str, &str)] = &[(
    "MeshFrontend",
    "its second case dials a pod's address, which only a captured client's sidecar sees (its allow_any passthrough); the harness's clients dial their sidecar",
)];

/// The mesh tests' base (`mesh_base`): the echo Services (`echo` selects
/// both versions) with their HTTP and gRPC ports, one echo server per
/// backend answering on every target port, and, as the clients, a sidecar
/// Envoy of the workload `echo-v1` in each namespace a test sends from
/// (the suite's client runs in the first echo-v1 pod). The Services'
/// `https` and `tcp` ports are left out: no test here uses them, and
/// without capture a sidecar cannot tell apart the TCP services that share
/// a port.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_mesh() {
    let fx = Fixture::start(1).await;
    let base = load(&data_dir().join("base.yaml"));
    let mut h = Harness::new(fx);
    let m = &base["mesh_base"];
    let mut docs = Vec::new();
    for ns in m["namespaces"].as_array().into_iter().flatten() {
        docs.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns["name"], "labels": ns["labels"]}}));
    }
    let protocol = |p: &Value| if p["appProtocol"] == "grpc" { "GRPC" } else { "HTTP" };
    let served = |p: &&Value| matches!(p["appProtocol"].as_str(), Some("http" | "grpc"));
    let services: Vec<(&Value, Value, serde_json::Map<String, Value>)> = m["services"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|svc| {
            let ports = json!(svc["ports"].as_array().into_iter().flatten().filter(served).collect::<Vec<_>>());
            let (doc, instance_ports) = registry_service(svc["name"].as_str().unwrap(), svc["namespace"].as_str().unwrap(), &ports, protocol);
            (svc, doc, instance_ports)
        })
        .collect();
    docs.extend(services.iter().map(|s| s.1.clone()));
    let mut tasks = Vec::new();
    for (n, b) in (100u8..).zip(m["backends"].as_array().into_iter().flatten().filter(|b| b["role"].is_null())) {
        let (name, ns) = (b["name"].as_str().unwrap(), b["namespace"].as_str().unwrap());
        let pod = format!("{name}-lodestar-0");
        let ip = h.fx.ip(n);
        // An instance of every Service whose selector its labels match.
        let selecting: Vec<_> = services
            .iter()
            .filter(|(svc, _, _)| svc["namespace"] == ns && svc["selector"].as_object().into_iter().flatten().all(|(k, v)| b["labels"][k] == *v))
            .collect();
        let mut ports: Vec<u64> = selecting.iter().flat_map(|s| s.2.values().filter_map(Value::as_u64)).collect();
        ports.sort();
        ports.dedup();
        let (e, t) = start_echo(&ip, &ports, &pod, ns).await;
        h.echoes.push(e);
        tasks.extend(t);
        for (svc, _, instance_ports) in selecting {
            docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
                "metadata": {"name": format!("{}--{pod}", svc["name"].as_str().unwrap()), "namespace": ns},
                "spec": {"service": svc["name"], "address": ip, "ports": instance_ports}}));
        }
    }
    let revision = h.apply(docs).await.expect("mesh base setup");
    // The clients: a sidecar of echo-v1 (app=echo, version=v1) in each
    // namespace a case sends from.
    let clients: std::collections::BTreeSet<String> = MESH_REQUIRED
        .iter()
        .chain(MESH_REPORTED)
        .chain(MESH_NOT_RUN.iter().map(|(n, _)| n))
        .flat_map(|n| load(&data_dir().join(format!("tests/{n}.yaml")))["cases"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["via"]["mesh_client"].as_str().map(String::from))
        .collect();
    for (i, client) in clients.into_iter().enumerate() {
        let (ns, workload) = split(&client);
        let mut o = EnvoyOptions::new(&format!("{workload}-client-{i}"), &h.fx.ip(2 + i as u8));
        o.namespace = ns.into();
        o.labels = vec![("app".into(), "echo".into()), ("version".into(), "v1".into())];
        let proxy = h.fx.proxy(o, 1, revision).await;
        h.proxies.insert(client, proxy);
    }
    run_and_report(&mut h, MESH_REQUIRED, MESH_REPORTED, MESH_NOT_RUN).await;
    for t in tasks {
        t.abort();
    }
}

/// The kinds through the API: bad input is refused with the field's path
/// (400); `kind: Gateway` is Istio's or the Gateway API's by apiVersion
/// (v1beta1 accepted); status comes back on REST get and list, gRPC get
/// and `lodestar get -o yaml`, says why a route is not attached, and never
/// bumps a generation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_validation_and_status() {
    let c = crate::kit::Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let (status, body) = crate::kit::apply(
        &c.http,
        &api,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: bad, namespace: shop}\nspec:\n  hostnames: [\"Not_A_Host\"]\n  rules:\n  - matches: [{path: {type: Prefix, value: /a}}]\n    backendRefs: [{name: web, port: 80, weight: 1000001}]\n",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let text = body.to_string();
    for field in ["spec.hostnames[0]", "spec.rules[0].matches[0].path.type", "spec.rules[0].backendRefs[0].weight"] {
        assert!(text.contains(field), "{field} not named: {text}");
    }

    let yaml = "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: lodestar}\nspec: {controllerName: lodestar.dev/gateway-controller}\n---\n\
        apiVersion: gateway.networking.k8s.io/v1beta1\nkind: Gateway\nmetadata: {name: web, namespace: shop}\nspec:\n  gatewayClassName: lodestar\n  listeners:\n  - {name: http, port: 8080, protocol: HTTP}\n---\n\
        apiVersion: networking.istio.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {istio: ingress}\n  servers:\n  - port: {number: 80, name: http, protocol: HTTP}\n    hosts: [\"*\"]\n---\n\
        apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: web, namespace: shop}\nspec:\n  ports: [{name: http, number: 80, protocol: HTTP}]\n---\n\
        apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: web, namespace: shop}\nspec:\n  parentRefs: [{name: web}]\n  rules:\n  - backendRefs: [{name: web, port: 80}]\n---\n\
        apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: stranger, namespace: other}\nspec:\n  parentRefs: [{name: web, namespace: shop}]\n  rules:\n  - backendRefs: [{name: web, namespace: shop, port: 80}]\n";
    crate::kit::applied(&c.http, &api, yaml).await;
    let get = |path: String| {
        let http = c.http.clone();
        async move { crate::kit::get_json(&http, &path).await.1 }
    };
    // Both Gateways, side by side.
    let istio = get(format!("{api}/v1/resources/gateways/shop/web")).await;
    assert_eq!(istio["apiVersion"], "networking.istio.io/v1");
    let gw = with_status(&c.http, &format!("{api}/v1/resources/gtw/shop/web"), |_| true).await;
    assert_eq!(gw["apiVersion"], "gateway.networking.k8s.io/v1beta1");
    assert_eq!(gw["status"]["listeners"][0]["attachedRoutes"], 1, "{gw}");
    let route = with_status(&c.http, &format!("{api}/v1/resources/httproutes/shop/web"), |_| true).await;
    let cond = |v: &Value, t: &str| v["status"]["parents"][0]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == t).cloned().unwrap();
    assert_eq!((cond(&route, "Accepted")["status"].as_str(), cond(&route, "ResolvedRefs")["status"].as_str()), (Some("True"), Some("True")), "{route}");
    let stranger = with_status(&c.http, &format!("{api}/v1/resources/httproutes/other/stranger"), |_| true).await;
    assert_eq!(cond(&stranger, "Accepted")["reason"], "NotAllowedByListeners", "{stranger}");
    assert_eq!(cond(&stranger, "ResolvedRefs")["reason"], "RefNotPermitted", "{stranger}");
    // Listed with status too; reading status changes no generation.
    let list = get(format!("{api}/v1/resources/httproutes")).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert!(list["items"].as_array().unwrap().iter().all(|i| i["status"]["parents"].is_array()), "{list}");
    assert_eq!(route["metadata"]["generation"], 1);
    assert_eq!(cond(&route, "Accepted")["observedGeneration"], 1);

    // gRPC get, and the CLI's YAML, say the same.
    let mut grpc = crate::kit::grpc_api(&api);
    let got = grpc
        .get(lodestar::proto::api::GetRequest { kind: "httproutes".into(), namespace: "other".into(), name: "stranger".into(), consistency: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(got.resource_json.contains("NotAllowedByListeners"), "{}", got.resource_json);
    let (ok, out, err) = crate::kit::cli(&api, &["get", "httproute", "stranger", "-n", "other", "-o", "yaml"]);
    assert!(ok, "{err}");
    assert!(out.contains("reason: NotAllowedByListeners") && out.contains("controllerName: lodestar.dev/gateway-controller"), "{out}");
    let (ok, out, err) = crate::kit::cli(&api, &["get", "httproutes", "-A"]);
    assert!(ok && out.contains("web(NotAllowedByListeners)") && out.contains("web(Accepted)"), "{out}{err}");
    for kind in ["httproutes", "gtw", "gatewayclasses", "referencegrants"] {
        let (ok, out, err) = crate::kit::cli(&api, &["get", kind, "-A"]);
        assert!(ok, "get {kind}: {err}");
        assert!(kind == "referencegrants" || out.lines().count() >= 2, "get {kind}: {out}");
    }

    // `lodestar delete -f` of a Gateway API Gateway deletes that one, not
    // Istio's; so does the REST delete of documents.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gtw.yaml");
    std::fs::write(
        &file,
        "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: shop}\nspec: {gatewayClassName: lodestar, listeners: []}\n",
    )
    .unwrap();
    let (ok, _, err) = crate::kit::cli(&api, &["delete", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(crate::kit::get_json(&c.http, &format!("{api}/v1/resources/gtw/shop/web")).await.0, 404);
    assert_eq!(crate::kit::get_json(&c.http, &format!("{api}/v1/resources/gateways/shop/web")).await.0, 200);
    crate::kit::applied(&c.http, &api, yaml).await;
    let r = c
        .http
        .post(format!("{api}/v1/delete"))
        .header("content-type", "application/yaml")
        .body("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: shop}\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(crate::kit::get_json(&c.http, &format!("{api}/v1/resources/gtw/shop/web")).await.0, 404);
    assert_eq!(crate::kit::get_json(&c.http, &format!("{api}/v1/resources/gateways/shop/web")).await.0, 200);
}

/// GRPCRoute, TCPRoute and TLSRoute through one gateway Envoy serving one
/// Gateway with an HTTP, a TCP and a TLS (passthrough) listener: real gRPC
/// calls routed by method and header, a TCP connection forwarded, TLS
/// passed through by SNI to backends that terminate it; status says which
/// kinds each listener takes, and a TLS listener that would terminate is
/// refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_tcp_and_tls_routes_through_a_gateway() {
    use crate::kit::tls::{Ca, TlsClient, TlsUpstream};
    let fx = Fixture::start(1).await;
    let _a = crate::grpc::server(&fx.ip(11), "a");
    let _b = crate::grpc::server(&fx.ip(12), "b");
    let plain = fx.upstream(13, "plain-tcp").await;
    let ca = Ca::new("backends CA");
    let alpha = TlsUpstream::start(&fx.ip(14), "alpha", &ca.server(&["alpha.tls.test"])).await;
    let beta = TlsUpstream::start(&fx.ip(15), "beta", &ca.server(&["beta.tls.test"])).await;
    let service = |name: &str, port_name: &str, number: u16, protocol: &str, ip: String, target: u16| {
        format!(
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{name: {port_name}, number: {number}, protocol: {protocol}}}]}}\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: {name}-0, namespace: shop}}\nspec: {{service: {name}, address: \"{ip}\", ports: {{{port_name}: {target}}}}}\n---\n"
        )
    };
    let mut yaml = String::new();
    yaml += &service("echo-a", "grpc", 50051, "GRPC", fx.ip(11), 50051);
    yaml += &service("echo-b", "grpc", 50051, "GRPC", fx.ip(12), 50051);
    yaml += &service("plain", "tcp", 80, "TCP", fx.ip(13), plain.addr.port());
    yaml += &service("alpha", "tls", 8443, "TLS", fx.ip(14), alpha.addr.port());
    yaml += &service("beta", "tls", 8443, "TLS", fx.ip(15), beta.addr.port());
    yaml += r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: lodestar}
spec: {controllerName: lodestar.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: lodestar
  listeners:
  - {name: web, port: 8080, protocol: HTTP}
  - {name: db, port: 9000, protocol: TCP}
  - {name: tls, port: 8443, protocol: TLS, tls: {mode: Passthrough}}
  - {name: terminate, port: 9443, protocol: TLS, tls: {mode: Terminate, certificateRefs: [{name: edge-cert}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: echo, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: web}]
  hostnames: [grpc.example.com]
  rules:
  - matches: [{method: {service: lodestar.test.Echo, method: Call}, headers: [{name: x-canary, value: "yes"}]}]
    backendRefs: [{name: echo-b, port: 50051}]
  - matches: [{method: {service: lodestar.test.Echo, method: Call}}]
    backendRefs: [{name: echo-a, port: 50051}]
  - matches: [{method: {service: lodestar.test.Echo}}]
    backendRefs: [{name: echo-b, port: 50051}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TCPRoute
metadata: {name: db, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: db}]
  rules: [{backendRefs: [{name: plain, port: 80}]}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: alpha, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: tls}]
  hostnames: [alpha.tls.test]
  rules: [{backendRefs: [{name: alpha, port: 8443}]}]
---
apiVersion: gateway.networking.k8s.io/v1alpha2
kind: TLSRoute
metadata: {name: beta, namespace: shop}
spec:
  parentRefs: [{name: edge, sectionName: tls}]
  hostnames: [beta.tls.test]
  rules: [{backendRefs: [{name: beta, port: 8443}]}]
"#;
    let rev = fx.apply(&yaml).await;
    let mut o = EnvoyOptions::new("edge", &fx.ip(2));
    o.node_type = "router".into();
    o.namespace = "shop".into();
    o.labels = vec![(lodestar::translate::gateway_api::NAME_LABEL.into(), "edge".into())];
    let p = fx.proxy(o, 1, rev).await;

    // gRPC: by method, then by header; a method no rule names is
    // UNIMPLEMENTED (Envoy's 404 for the path).
    let log = fx.tmp.path().join("grpc-client.log");
    let mut client = crate::grpc::Client::plain(log);
    let at = format!("{}:8080", p.ip);
    let call = |c: &mut crate::grpc::Client, method: &str, md: &[(&str, &str)]| c.call_at(&at, "grpc.example.com", method, md, 10);
    let mut t = call(&mut client, "/lodestar.test.Echo/Call", &[]);
    for _ in 0..40 {
        if t.errors.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
        t = call(&mut client, "/lodestar.test.Echo/Call", &[]);
    }
    assert_eq!(t.replies, BTreeMap::from([("a /lodestar.test.Echo/Call".to_string(), 10)]), "{t:?}");
    let t = call(&mut client, "/lodestar.test.Echo/Call", &[("x-canary", "yes")]);
    assert_eq!(t.replies, BTreeMap::from([("b /lodestar.test.Echo/Call".to_string(), 10)]), "{t:?}");
    let t = call(&mut client, "/lodestar.test.Echo/Debug", &[]);
    assert_eq!(t.replies, BTreeMap::from([("b /lodestar.test.Echo/Debug".to_string(), 10)]), "{t:?}");
    let t = call(&mut client, "/lodestar.test.Other/Call", &[]);
    assert!(t.replies.is_empty() && t.errors.keys().all(|e| e.starts_with("UNIMPLEMENTED")), "{t:?}");
    let t = client.call_at(&at, "other.example.com", "/lodestar.test.Echo/Call", &[], 5);
    assert!(t.replies.is_empty(), "a host the route does not name was routed: {t:?}");

    // TCP: the connection reaches the backend whatever it carries.
    let r = crate::kit::mesh::wait_for(&fx.client, &format!("http://{}:9000/", p.ip), "anything", &[], "TCPRoute", |r| r.status == 200).await;
    assert_eq!(r.body.trim(), "plain-tcp");

    // TLS passed through by SNI; a name no TLSRoute has is closed.
    let addr: std::net::SocketAddr = format!("{}:8443", p.ip).parse().unwrap();
    for (name, identity, backend) in [("alpha.tls.test", "alpha", &alpha), ("beta.tls.test", "beta", &beta)] {
        let c = TlsClient { ca: &ca, server_name: name, certificate: None, alpn: &["http/1.1"] };
        assert_eq!(crate::traffic::wait_tls(&c, addr).await, identity);
        assert!(backend.sni().iter().all(|s| s.as_deref() == Some(name)), "{:?}", backend.sni());
    }
    let stranger = TlsClient { ca: &ca, server_name: "gamma.tls.test", certificate: None, alpn: &[] };
    assert!(stranger.get(addr, "gamma.tls.test", "/").await.is_err());

    // Status: the kinds each listener takes and what attached; the
    // terminating TLS listener refused, saying why.
    let gw = with_status(&fx.cluster.http, &format!("{}/v1/resources/gtw/shop/edge", fx.api(1)), |_| true).await;
    let listener = |name: &str| gw["status"]["listeners"].as_array().unwrap().iter().find(|l| l["name"] == name).cloned().unwrap();
    let kinds = |name: &str| listener(name)["supportedKinds"].as_array().unwrap().iter().map(|k| k["kind"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(kinds("web"), ["HTTPRoute", "GRPCRoute"], "{gw}");
    assert_eq!((kinds("db"), listener("db")["attachedRoutes"].as_u64()), (vec!["TCPRoute".to_string()], Some(1)), "{gw}");
    assert_eq!((kinds("tls"), listener("tls")["attachedRoutes"].as_u64()), (vec!["TLSRoute".to_string()], Some(2)), "{gw}");
    let accepted = listener("terminate")["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "Accepted").cloned().unwrap();
    assert!(accepted["status"] == "False" && accepted["message"].as_str().unwrap().contains("Passthrough"), "{gw}");
    p.envoy.assert_no_rejections().await;
}

/// Mesh routes (GAMMA): an HTTPRoute whose parent is a Service routes
/// every sidecar's calls to it (a producer route, in the service's
/// namespace), and one in a client's namespace (a consumer route) routes
/// only that namespace's clients, over the producer's; removing it gives
/// the producer's routing back. Real sidecar Envoys, real requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_routes_with_a_service_parent_steer_sidecars() {
    use crate::kit::mesh::{load, tally, wait_for};
    let fx = Fixture::start(1).await;
    let v1 = fx.upstream(11, "reviews-v1").await;
    let v2 = fx.upstream(12, "reviews-v2").await;
    let yaml = format!(
        r#"apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: reviews, namespace: shop}}
spec: {{ports: [{{name: http, number: 9080, protocol: HTTP}}]}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: reviews-0, namespace: shop}}
spec: {{service: reviews, address: "{}", ports: {{http: {}}}}}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: reviews-v2, namespace: shop}}
spec: {{ports: [{{name: http, number: 9080, protocol: HTTP}}]}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: reviews-v2-0, namespace: shop}}
spec: {{service: reviews-v2, address: "{}", ports: {{http: {}}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: reviews, namespace: shop}}
spec:
  parentRefs: [{{group: "", kind: Service, name: reviews, port: 9080}}]
  rules:
  - matches: [{{headers: [{{name: x-canary, value: "yes"}}]}}]
    backendRefs: [{{name: reviews-v2, port: 9080}}]
  - backendRefs: [{{name: reviews, port: 9080}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: legacy, namespace: shop}}
spec:
  hosts: [legacy.example.test]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 8081, name: http, protocol: HTTP}}]
  endpoints: [{{address: "{}", ports: {{http: {}}}}}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: legacy, namespace: shop}}
spec:
  parentRefs: [{{group: networking.istio.io, kind: ServiceEntry, name: legacy}}]
  rules:
  - matches: [{{path: {{type: PathPrefix, value: /new}}}}]
    backendRefs: [{{name: reviews-v2, port: 9080}}]
  - backendRefs: [{{group: networking.istio.io, kind: ServiceEntry, name: legacy, port: 8081}}]
"#,
        v1.addr.ip(),
        v1.addr.port(),
        v2.addr.ip(),
        v2.addr.port(),
        v1.addr.ip(),
        v1.addr.port()
    );
    let rev = fx.apply(&yaml).await;
    let p = fx.sidecar("productpage", 2, 1, false, rev).await;
    let mut o = EnvoyOptions::new("ratings", &fx.ip(3));
    o.namespace = "elsewhere".into();
    let q = fx.proxy(o, 1, rev).await;
    let host = "reviews.shop.svc.cluster.local";
    for proxy in [&p, &q] {
        let url = proxy.url(9080, "/");
        wait_for(&fx.client, &url, host, &[("x-canary", "yes")], "the producer route's canary", |r| r.body == "reviews-v2").await;
        assert_eq!(tally(&load(&fx.client, &url, host, &[], 10, 2).await), BTreeMap::from([("200 reviews-v1".to_string(), 10)]));
    }
    // A ServiceEntry as the parent: /new moves to reviews-v2.
    wait_for(&fx.client, &p.url(8081, "/new/a"), "legacy.example.test", &[], "a ServiceEntry parent", |r| r.body == "reviews-v2").await;
    assert_eq!(crate::kit::mesh::get(&fx.client, &p.url(8081, "/old"), "legacy.example.test", &[]).await.body, "reviews-v1");
    let route = with_status(&fx.cluster.http, &format!("{}/v1/resources/httproutes/shop/reviews", fx.api(1)), |_| true).await;
    let accepted = &route["status"]["parents"][0]["conditions"][0];
    assert_eq!((accepted["type"].as_str(), accepted["status"].as_str()), (Some("Accepted"), Some("True")), "{route}");

    // A consumer route in default: default's clients all go to v2 (a
    // mesh route's backend in shop needs no ReferenceGrant), elsewhere's
    // keep the producer's routing.
    let consumer = r#"apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: reviews-for-default, namespace: default}
spec:
  parentRefs: [{group: "", kind: Service, name: reviews, namespace: shop}]
  rules:
  - backendRefs: [{name: reviews-v2, namespace: shop, port: 9080}]
"#;
    fx.apply(consumer).await;
    wait_for(&fx.client, &p.url(9080, "/"), host, &[], "the consumer route", |r| r.body == "reviews-v2").await;
    assert_eq!(tally(&load(&fx.client, &p.url(9080, "/"), host, &[], 10, 2).await), BTreeMap::from([("200 reviews-v2".to_string(), 10)]));
    assert_eq!(tally(&load(&fx.client, &q.url(9080, "/"), host, &[], 10, 2).await), BTreeMap::from([("200 reviews-v1".to_string(), 10)]));

    // Gone: the producer's routing is back for default too.
    let (ok, _, err) = crate::kit::cli(&fx.api(1), &["delete", "httproute", "reviews-for-default", "-n", "default"]);
    assert!(ok, "{err}");
    wait_for(&fx.client, &p.url(9080, "/"), host, &[], "the producer route again", |r| r.body == "reviews-v1").await;
    p.envoy.assert_no_rejections().await;
    q.envoy.assert_no_rejections().await;
}

/// BackendTLSPolicy: a gateway and a sidecar originate TLS to a TLS
/// backend, with the policy's SNI, verifying its certificate against the
/// CA in a Secret (inline: sidecars are served no Secrets) and the
/// policy's hostname; a backend whose certificate the CA did not sign is
/// refused (503), never reached in plaintext, until the Secret with its CA
/// exists (a Secret write alone rebuilds the rule). Bad policies are
/// refused naming the field. Real Envoys, a real rustls backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_tls_policy_originates_tls_from_gateway_and_sidecar() {
    use crate::kit::mesh::{get, wait_for};
    use crate::kit::tls::{Ca, TlsUpstream};
    let fx = Fixture::start(1).await;
    let ca = Ca::new("backends CA");
    let other_ca = Ca::new("another CA");
    let secure = TlsUpstream::start(&fx.ip(11), "secure", &ca.server(&["secure.shop.test"])).await;
    let stranger = TlsUpstream::start(&fx.ip(12), "stranger", &other_ca.server(&["stranger.shop.test"])).await;
    let ca_secret = |name: &str, pem: &str| {
        let pem: String = pem.lines().map(|l| format!("    {l}\n")).collect();
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: shop}}\nstringData:\n  ca.crt: |\n{pem}---\n")
    };
    let service = |name: &str, addr: std::net::SocketAddr| {
        format!(
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: {name}, namespace: shop}}\nspec: {{ports: [{{name: http, number: 8080, protocol: HTTP}}]}}\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: {name}-0, namespace: shop}}\nspec: {{service: {name}, address: \"{}\", ports: {{http: {}}}}}\n---\n",
            addr.ip(),
            addr.port()
        )
    };
    let policy = |name: &str, target: &str, secret: &str, hostname: &str| {
        format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  \
             targetRefs: [{{group: \"\", kind: Service, name: {target}, sectionName: http}}]\n  \
             validation: {{caCertificateRefs: [{{group: \"\", kind: Secret, name: {secret}}}], hostname: {hostname}}}\n---\n"
        )
    };
    let mut yaml = ca_secret("backends-ca", &ca.pem);
    yaml += &service("secure", secure.addr);
    yaml += &service("stranger", stranger.addr);
    yaml += &policy("secure-tls", "secure", "backends-ca", "secure.shop.test");
    // The stranger's CA is in a Secret not written yet.
    yaml += &policy("stranger-tls", "stranger", "stranger-ca", "stranger.shop.test");
    yaml += r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: lodestar}
spec: {controllerName: lodestar.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: shop}
spec:
  gatewayClassName: lodestar
  listeners: [{name: web, port: 8080, protocol: HTTP}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: backends, namespace: shop}
spec:
  parentRefs: [{name: edge}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /secure}}]
    backendRefs: [{name: secure, port: 8080}]
  - matches: [{path: {type: PathPrefix, value: /stranger}}]
    backendRefs: [{name: stranger, port: 8080}]
"#;
    let rev = fx.apply(&yaml).await;
    let mut o = EnvoyOptions::new("edge", &fx.ip(2));
    o.node_type = "router".into();
    o.namespace = "shop".into();
    o.labels = vec![(lodestar::translate::gateway_api::NAME_LABEL.into(), "edge".into())];
    let gw = fx.proxy(o, 1, rev).await;
    let sidecar = fx.sidecar("client", 3, 1, false, rev).await;

    // The gateway and the sidecar: TLS with the policy's SNI, verified.
    let r = wait_for(&fx.client, &gw.url(8080, "/secure"), "any.example", &[], "the gateway over TLS", |r| r.status == 200).await;
    assert_eq!(r.body, "secure");
    let host = "secure.shop.svc.cluster.local";
    let r = wait_for(&fx.client, &sidecar.url(8080, "/"), host, &[], "the sidecar over TLS", |r| r.status == 200).await;
    assert_eq!(r.body, "secure");
    let sni = secure.sni();
    assert!(sni.len() >= 2 && sni.iter().all(|s| s.as_deref() == Some("secure.shop.test")), "{sni:?}");

    // No CA for the stranger: refused, the backend never answered.
    let r = get(&fx.client, &gw.url(8080, "/stranger"), "any.example", &[]).await;
    assert_eq!(r.status, 503, "{r:?}");
    let r = get(&fx.client, &sidecar.url(8080, "/"), "stranger.shop.svc.cluster.local", &[]).await;
    assert_eq!(r.status, 503, "{r:?}");
    let status = |name: &str| {
        let url = format!("{}/v1/resources/backendtlspolicies/shop/{name}", fx.api(1));
        let http = fx.cluster.http.clone();
        async move { crate::kit::get_json(&http, &url).await.1["status"]["ancestors"].clone() }
    };
    let ancestors = status("stranger-tls").await;
    assert_eq!(ancestors[0]["ancestorRef"]["name"], "edge", "{ancestors}");
    let conditions = &ancestors[0]["conditions"];
    assert_eq!(
        (conditions[0]["reason"].as_str(), conditions[1]["reason"].as_str()),
        (Some("NoValidCACertificate"), Some("InvalidCACertificateRef")),
        "{ancestors}"
    );
    let ancestors = status("secure-tls").await;
    assert_eq!(
        (ancestors[0]["conditions"][0]["status"].as_str(), ancestors[0]["conditions"][1]["status"].as_str()),
        (Some("True"), Some("True")),
        "{ancestors}"
    );

    let (ok, out, err) = crate::kit::cli(&fx.api(1), &["get", "backendtlspolicies", "-n", "shop"]);
    assert!(ok && out.contains("ANCESTORS (ACCEPTED)") && out.contains("edge(NoValidCACertificate)"), "{out}{err}");

    // The Secret with the stranger's CA, written alone: now it answers.
    fx.apply(&ca_secret("stranger-ca", &other_ca.pem)).await;
    let r = wait_for(&fx.client, &gw.url(8080, "/stranger"), "any.example", &[], "the stranger's CA", |r| r.status == 200).await;
    assert_eq!(r.body, "stranger");
    let stranger_host = "stranger.shop.svc.cluster.local";
    let r = wait_for(&fx.client, &sidecar.url(8080, "/"), stranger_host, &[], "the stranger's CA, sidecar", |r| r.status == 200).await;
    assert_eq!(r.body, "stranger");

    // A policy whose hostname the certificate does not carry: refused.
    fx.apply(&policy("secure-tls", "secure", "backends-ca", "wrong.shop.test")).await;
    wait_for(&fx.client, &gw.url(8080, "/secure"), "any.example", &[], "a hostname the certificate lacks", |r| r.status == 503).await;
    wait_for(&fx.client, &sidecar.url(8080, "/"), host, &[], "a hostname the certificate lacks, sidecar", |r| r.status == 503).await;
    gw.envoy.assert_no_rejections().await;
    sidecar.envoy.assert_no_rejections().await;

    // Bad input, each named by its field.
    let bad = r#"apiVersion: gateway.networking.k8s.io/v1
kind: BackendTLSPolicy
metadata: {name: bad, namespace: shop}
spec:
  targetRefs: [{group: apps, kind: Deployment, name: secure}]
  validation:
    caCertificateRefs: [{group: "", kind: ConfigMap, name: ca}]
    wellKnownCACertificates: System
    hostname: "*.shop.test"
    subjectAltNames: [{type: URI, hostname: a.b}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: forged, namespace: shop}
spec:
  host: secure
  trafficPolicy: {tls: {mode: SIMPLE, credentialName: "backendtlspolicy://shop/secure-tls"}}
"#;
    let (code, body) = crate::kit::apply(&fx.client, &fx.api(1), bad).await;
    assert_eq!(code, 400, "{body:#}");
    let fields: Vec<String> = body["error"]["fields"].as_array().unwrap().iter().map(|f| f["field"].as_str().unwrap_or("").to_string()).collect();
    for want in [
        "spec.targetRefs[0].kind",
        "spec.validation",
        "spec.validation.hostname",
        "spec.validation.caCertificateRefs[0].kind",
        "spec.validation.subjectAltNames[0].uri",
        "spec.trafficPolicy.tls.credentialName",
    ] {
        assert!(fields.iter().any(|f| f.ends_with(want)), "{want} not named: {body:#}");
    }
}

/// A mesh route's CORS filter and `retry` reach sidecars. The client's
/// sidecar answers preflights itself, from an allowed origin (a `*.`
/// wildcard) with the allow headers, from another origin without an
/// allowed origin, and forwards neither; a simple request gets its allowed
/// origin back. Answers with a listed code are retried up to `attempts`,
/// an unlisted code is not, and a reset connection is retried too (the
/// echo's `/retry/` simulator, in its status and its TCP-reset modes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mesh_route_cors_and_retry_through_a_sidecar() {
    use crate::kit::mesh::{get, wait_for};
    let fx = Fixture::start(1).await;
    let (echo, tasks) = start_echo(&fx.ip(13), &[3000], "flaky-0000-0001", "shop").await;
    let yaml = format!(
        r#"apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: flaky, namespace: shop}}
spec: {{ports: [{{name: http, number: 9080, targetPort: 3000, protocol: HTTP}}]}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: flaky-0, namespace: shop}}
spec: {{service: flaky, address: "{}", ports: {{http: 3000}}}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: flaky, namespace: shop}}
spec:
  parentRefs: [{{group: "", kind: Service, name: flaky, port: 9080}}]
  rules:
  - filters:
    - type: CORS
      cors: {{allowOrigins: ["https://*.shop.example"], allowMethods: [PUT], allowCredentials: true, maxAge: 60}}
    retry: {{codes: [503], attempts: 2, backoff: 10ms}}
    backendRefs: [{{name: flaky, port: 9080}}]
"#,
        echo.ip
    );
    let rev = fx.apply(&yaml).await;
    let p = fx.sidecar("productpage", 2, 1, false, rev).await;
    let host = "flaky.shop.svc.cluster.local";
    wait_for(&fx.client, &p.url(9080, "/ready"), host, &[], "the mesh route", |r| r.status == 200 && r.body.contains("flaky-0000-0001")).await;

    // Preflights: answered by the sidecar, never forwarded.
    let preflight = |path: &str, origin: &str| {
        let req = fx.client.request(reqwest::Method::OPTIONS, p.url(9080, path)).header("host", host);
        req.header("origin", origin).header("access-control-request-method", "PUT").send()
    };
    let allowed = preflight("/preflight-allowed", "https://www.shop.example").await.expect("preflight");
    let h = |r: &reqwest::Response, name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).map(String::from);
    assert_eq!(allowed.status(), 200);
    assert_eq!(h(&allowed, "access-control-allow-origin").as_deref(), Some("https://www.shop.example"));
    assert_eq!(h(&allowed, "access-control-allow-methods").as_deref(), Some("PUT"));
    assert_eq!(h(&allowed, "access-control-allow-credentials").as_deref(), Some("true"));
    assert_eq!(h(&allowed, "access-control-max-age").as_deref(), Some("60"));
    let other = preflight("/preflight-other", "https://shop.example.evil").await.expect("preflight");
    assert_eq!((other.status(), h(&other, "access-control-allow-origin")), (reqwest::StatusCode::OK, None));
    let seen = echo.seen.lock().unwrap().clone();
    assert!(!seen.iter().any(|u| u.starts_with("/preflight")), "a preflight was forwarded: {seen:?}");
    let simple = get(&fx.client, &p.url(9080, "/simple"), host, &[("origin", "https://a.b.shop.example")]).await;
    assert_eq!((simple.status, simple.header("access-control-allow-origin")), (200, Some("https://a.b.shop.example")));
    assert!(simple.body.contains("flaky-0000-0001"), "{}", simple.body);

    // Retries: 503 (listed) twice, then the echo; three times is one too
    // many; 500 is not listed; two resets are retried.
    let run = std::process::id();
    let cases = [("responseCode=503&", 2, 200), ("responseCode=503&", 3, 503), ("responseCode=500&", 1, 500), ("", 2, 200)];
    for (i, (mode, succeed_after, want)) in cases.into_iter().enumerate() {
        let uuid = format!("{run}-{i}");
        let path = format!("/retry/x?{mode}succeedAfter={succeed_after}&uuid={uuid}");
        let r = get(&fx.client, &p.url(9080, &path), host, &[]).await;
        assert_eq!(r.status, want, "{path}: {}", r.body);
        let tries = echo.tries.lock().unwrap().get(&uuid).copied();
        assert_eq!(tries, Some(succeed_after.min(3)), "{path}: failed tries");
    }
    // The simulator's failure without a code is a reset (RST), not a close.
    let mut direct = tokio::net::TcpStream::connect(format!("{}:3000", echo.ip)).await.expect("connect to the echo");
    let request = format!("GET /retry/x?succeedAfter=1&uuid={run}-direct HTTP/1.1\r\nhost: echo\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut direct, request.as_bytes()).await.expect("write");
    let read = tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read(&mut direct, &mut [0u8; 64])).await.expect("an answer");
    assert_eq!(read.map_err(|e| e.kind()), Err(std::io::ErrorKind::ConnectionReset));
    p.envoy.assert_no_rejections().await;
    for t in tasks {
        t.abort();
    }
}
