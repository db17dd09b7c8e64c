//! RequestAuthentication through a real Envoy: JWTs signed in the test
//! (ES256, ring) against a workload's inbound listener (Sidecar ingress)
//! forwarding to an echo upstream, and keys from a `jwksUri` served by a
//! loopback HTTP server that fails, then serves a key, then rotates it.
//! Every request goes on a new connection: a listener updated with new
//! keys serves new connections, while open ones finish on the old config
//! (Envoy's listener drain).

use crate::kit;

use kit::envoy::{loopback_prefix, EnvoyOptions, Upstream};
use kit::mesh::*;
use kit::Cluster;
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const B64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// base64url without padding (RFC 7515).
fn b64url(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..=chunk.len() {
            out.push(B64URL[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// An ES256 signing key made for the test; its public half as a JWK.
struct Signer {
    kid: String,
    key: EcdsaKeyPair,
}

impl Signer {
    fn new(kid: &str) -> Signer {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
        Signer { kid: kid.to_string(), key }
    }

    fn jwk(&self) -> Value {
        let p = self.key.public_key().as_ref(); // 0x04 || X || Y
        json!({"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": self.kid, "x": b64url(&p[1..33]), "y": b64url(&p[33..65])})
    }

    fn token(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT", "kid": self.kid});
        let input = format!("{}.{}", b64url(header.to_string().as_bytes()), b64url(claims.to_string().as_bytes()));
        let sig = self.key.sign(&SystemRandom::new(), input.as_bytes()).unwrap();
        format!("{input}.{}", b64url(sig.as_ref()))
    }
}

fn jwks(keys: &[&Signer]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>()}).to_string()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn claims(iss: &str, aud: &str, exp: u64) -> Value {
    json!({"iss": iss, "sub": "alice", "aud": aud, "iat": now() - 10, "exp": exp})
}

/// A loopback JWKS server: answers 503 until given a key set, then that.
struct JwksServer {
    addr: std::net::SocketAddr,
    body: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    async fn start(ip: &str) -> JwksServer {
        use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
        let body: Arc<Mutex<Option<String>>> = Arc::default();
        async fn serve(State(body): State<Arc<Mutex<Option<String>>>>) -> axum::response::Response {
            match body.lock().unwrap().clone() {
                Some(b) => ([("content-type", "application/json")], b).into_response(),
                None => (StatusCode::SERVICE_UNAVAILABLE, "not yet").into_response(),
            }
        }
        let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/jwks.json", get(serve)).with_state(body.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        JwksServer { addr, body, task }
    }

    fn set(&self, body: String) {
        *self.body.lock().unwrap() = Some(body);
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request on a fresh connection; the status and, for 200, the headers
/// the echo upstream saw.
async fn call(url: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let client = reqwest::Client::builder().no_proxy().pool_max_idle_per_host(0).build().unwrap();
    let mut req = client.get(url).timeout(Duration::from_secs(10));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let r = req.send().await.expect("request through the proxy");
    let status = r.status().as_u16();
    let body: Value = if status == 200 { r.json().await.expect("echo JSON") } else { Value::Null };
    (status, body["headers"].clone())
}

/// Poll (bounded) until `url` answers `want` with these headers; how long
/// it took (reported, not asserted).
async fn until_status(url: &str, headers: &[(&str, &str)], want: u16, what: &str) -> Duration {
    let start = Instant::now();
    kit::eventually_or(&format!("{what}: {want}"), BOUND, || async {
        let (status, _) = call(url, headers).await;
        if status == want {
            Ok(start.elapsed())
        } else {
            Err(format!("still {status}"))
        }
    })
    .await
}

/// A Sidecar for workloads labelled `app`: inbound HTTP on 8000 to `echo`.
fn sidecar(app: &str, echo: std::net::SocketAddr) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: {app}, namespace: default}}
spec:
  workloadSelector: {{labels: {{app: {app}}}}}
  ingress:
  - port: {{number: 8000, protocol: HTTP, name: http}}
    defaultEndpoint: {echo}
    captureMode: NONE
  egress:
  - hosts: [./*]
    captureMode: NONE
"#
    )
}

async fn metric(fx: &Fixture, name: &str) -> u64 {
    let text = fx.client.get(format!("{}/metrics", fx.api(1))).send().await.unwrap().text().await.unwrap();
    text.lines().find(|l| l.split_whitespace().next() == Some(name)).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0) as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_authn_on_a_real_envoy_sotw() {
    jwt_authn_on_a_real_envoy(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_authn_on_a_real_envoy_delta() {
    jwt_authn_on_a_real_envoy(true).await;
}

async fn jwt_authn_on_a_real_envoy(delta: bool) {
    kit::envoy::envoy_binary();
    // Fetch jwksUris every second, so the test sees a rotation quickly.
    let cluster = Cluster::start(1, "jwks_refresh_interval_s = 1\n").await;
    let client = kit::http_builder().no_proxy().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let fx = Fixture { cluster, prefix: loopback_prefix(), tmp: tempfile::tempdir().unwrap(), client };
    // Istio's defaultEndpoint is the workload on 127.0.0.1.
    let echo = Upstream::start("127.0.0.1", "httpbin").await;
    let issuer_server = JwksServer::start(&fx.ip(12)).await;
    let (inline, other, remote_a, remote_b) = (Signer::new("inline"), Signer::new("stranger"), Signer::new("remote-a"), Signer::new("remote-b"));

    // Phase 1: the policy. The remote issuer's server answers 503 for now.
    let yaml = format!(
        r#"{httpbin}---
{sleep}---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: httpbin, namespace: default}}
spec:
  selector:
    matchLabels: {{app: httpbin}}
  jwtRules:
  - issuer: inline-issuer
    jwks: '{inline_jwks}'
    audiences: [httpbin.test]
    outputPayloadToHeader: x-jwt-payload
    outputClaimToHeaders: [{{header: x-jwt-sub, claim: sub}}]
  - issuer: prefixed-issuer
    jwks: '{inline_jwks}'
    fromHeaders: [{{name: x-token, prefix: "Token "}}]
  - issuer: remote-issuer
    jwksUri: http://{jwks_addr}/jwks.json
"#,
        httpbin = sidecar("httpbin", echo.addr),
        sleep = sidecar("sleep", echo.addr),
        inline_jwks = jwks(&[&inline]),
        jwks_addr = issuer_server.addr,
    );
    let rev = fx.apply(&yaml).await;
    let mut o = EnvoyOptions::new("httpbin", &fx.ip(2));
    o.labels = vec![("app".into(), "httpbin".into())];
    o.delta = delta;
    let p = fx.proxy_of_types(o, 1, rev, &["CDS", "LDS"]).await;
    let url = p.url(8000, "/echo");
    // A workload no policy selects: new keys are never pushed to it.
    let mut o = EnvoyOptions::new("sleep", &fx.ip(3));
    o.labels = vec![("app".into(), "sleep".into())];
    o.delta = delta;
    let sleep = fx.proxy_of_types(o, 1, rev, &["CDS", "LDS"]).await;
    assert_eq!(call(&sleep.url(8000, "/echo"), &[("authorization", "Bearer not-a-jwt")]).await.0, 200, "no jwt_authn where no policy selects");
    const LDS_UPDATES: &str = "listener_manager.lds.update_success";
    let sleep_updates = sleep.stat(LDS_UPDATES).await;

    // No token: passes, and a client's own copies of the headers the
    // filter writes never reach the upstream.
    let (status, seen) = call(&url, &[("x-jwt-payload", "forged"), ("x-jwt-sub", "mallory")]).await;
    assert_eq!(status, 200, "a request without a token passes");
    assert!(seen.get("x-jwt-payload").is_none() && seen.get("x-jwt-sub").is_none(), "client-supplied copies reached the upstream: {seen:#}");

    // A valid token: 200, the payload and claim arrive upstream (the
    // client's forged copy does not), the token itself is removed.
    let good_claims = claims("inline-issuer", "httpbin.test", now() + 3600);
    let good = inline.token(&good_claims);
    let bearer = format!("Bearer {good}");
    let (status, seen) = call(&url, &[("authorization", &bearer), ("x-jwt-payload", "forged")]).await;
    assert_eq!(status, 200);
    let payload = seen["x-jwt-payload"].as_str().unwrap_or_else(|| panic!("no x-jwt-payload upstream: {seen:#}"));
    assert!(!payload.contains("forged"), "the client's copy was passed on: {payload}");
    assert_eq!(payload.trim_end_matches('='), b64url(good_claims.to_string().as_bytes()), "the verified payload, base64url");
    assert_eq!(seen["x-jwt-sub"], "alice");
    assert!(seen.get("authorization").is_none(), "forwardOriginalToken is false: the token stays at the proxy");

    // Invalid tokens: 401; a valid token for another audience: 403
    // (Envoy's `JwtAudienceNotAllowed`, so Istio's answer too).
    let bad_sig = other.token(&good_claims);
    let forged = {
        // The inline issuer's header and claims with another key's signature.
        let real = inline.token(&good_claims);
        let (input, _) = real.rsplit_once('.').unwrap();
        let stranger = other.token(&good_claims);
        format!("{input}.{}", stranger.rsplit_once('.').unwrap().1)
    };
    for (what, token) in [
        ("bad signature", forged),
        ("signed by an unknown key", bad_sig),
        ("expired", inline.token(&claims("inline-issuer", "httpbin.test", now() - 3600))),
        ("unknown issuer", inline.token(&claims("nobody", "httpbin.test", now() + 3600))),
    ] {
        let (status, _) = call(&url, &[("authorization", &format!("Bearer {token}"))]).await;
        assert_eq!(status, 401, "{what}");
    }
    let wrong_audience = inline.token(&claims("inline-issuer", "someone-else", now() + 3600));
    assert_eq!(call(&url, &[("authorization", &format!("Bearer {wrong_audience}"))]).await.0, 403, "wrong audience");

    // fromHeaders with a prefix: only that header, only with the prefix.
    let prefixed = inline.token(&claims("prefixed-issuer", "any", now() + 3600));
    assert_eq!(call(&url, &[("x-token", &format!("Token {prefixed}"))]).await.0, 200);
    let bad_prefixed = inline.token(&claims("prefixed-issuer", "any", now() - 3600));
    assert_eq!(call(&url, &[("x-token", &format!("Token {bad_prefixed}"))]).await.0, 401, "an expired token in the custom header");

    // jwksUri, never fetched (the server answers 503): fail closed.
    let remote_token_a = remote_a.token(&claims("remote-issuer", "any", now() + 3600));
    let remote_a_header = format!("Bearer {remote_token_a}");
    assert_eq!(call(&url, &[("authorization", &remote_a_header)]).await.0, 401, "keys never fetched verify nothing");
    kit::until("a failed fetch counted", BOUND, || async { metric(&fx, "pilot_jwks_resolver_network_fetch_fail_total").await > 0 }).await;

    // The issuer serves key A: fetched, pushed (at the same revision),
    // accepted.
    let updates = p.stat(LDS_UPDATES).await;
    issuer_server.set(jwks(&[&remote_a]));
    let took = until_status(&url, &[("authorization", &remote_a_header)], 200, "a token of the fetched key").await;
    eprintln!("first key set served by the issuer → accepted by Envoy: {took:?} (refresh interval 1 s)");
    assert!(p.stat(LDS_UPDATES).await > updates, "the new keys came as a listener update");
    assert!(metric(&fx, "pilot_jwks_resolver_network_fetch_success_total").await >= 1);

    // Rotation to key B: picked up at the next refresh; A's tokens no
    // longer verify.
    let remote_token_b = remote_b.token(&claims("remote-issuer", "any", now() + 3600));
    let remote_b_header = format!("Bearer {remote_token_b}");
    assert_eq!(call(&url, &[("authorization", &remote_b_header)]).await.0, 401, "B is not served yet");
    issuer_server.set(jwks(&[&remote_b]));
    let took = until_status(&url, &[("authorization", &remote_b_header)], 200, "a token of the rotated key").await;
    eprintln!("key rotated at the issuer → new key accepted by Envoy: {took:?} (refresh interval 1 s)");
    assert_eq!(call(&url, &[("authorization", &remote_a_header)]).await.0, 401, "the old key is gone");

    // The issuer fails again: the last good set is kept.
    *issuer_server.body.lock().unwrap() = None;
    let fails = metric(&fx, "pilot_jwks_resolver_network_fetch_fail_total").await;
    kit::until("another failed fetch counted", BOUND, || async { metric(&fx, "pilot_jwks_resolver_network_fetch_fail_total").await > fails }).await;
    assert_eq!(call(&url, &[("authorization", &remote_b_header)]).await.0, 200, "the last good key set is kept");

    // Every config was accepted; the workload without a policy got none of
    // these pushes.
    p.wait_synced_types(rev, &["CDS", "LDS"]).await;
    p.envoy.assert_no_rejections().await;
    assert_eq!(sleep.stat(LDS_UPDATES).await, sleep_updates, "key changes were pushed to a proxy that holds no keys");
    sleep.envoy.assert_no_rejections().await;
}

/// The same filter on an ingress gateway: a policy in the root namespace
/// selecting the gateway by label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_authn_on_an_ingress_gateway() {
    let fx = Fixture::start(1).await;
    let echo = fx.upstream(11, "productpage").await;
    let signer = Signer::new("gw");
    let yaml = format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: productpage, namespace: default}}
spec:
  ports: [{{name: http, number: 9080}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: productpage-1, namespace: default}}
spec: {{service: productpage, address: {ip}, port: {port}}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: gw, namespace: default}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 8080, name: http, protocol: HTTP}}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: productpage, namespace: default}}
spec:
  hosts: ["*"]
  gateways: [gw]
  http:
  - route: [{{destination: {{host: productpage, port: {{number: 9080}}}}}}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: ingress, namespace: istio-system}}
spec:
  selector:
    matchLabels: {{istio: ingressgateway}}
  jwtRules:
  - issuer: gw-issuer
    jwks: '{jwks}'
"#,
        ip = echo.addr.ip(),
        port = echo.addr.port(),
        jwks = jwks(&[&signer]),
    );
    let rev = fx.apply(&yaml).await;
    let mut o = EnvoyOptions::new("ingressgateway", &fx.ip(2));
    o.namespace = "istio-system".into();
    o.node_type = "router".into();
    o.labels = vec![("istio".into(), "ingressgateway".into())];
    let p = fx.proxy(o, 1, rev).await;
    let url = p.url(8080, "/echo");
    let _ = until_status(&url, &[], 200, "the gateway routes").await;
    let good = format!("Bearer {}", signer.token(&claims("gw-issuer", "any", now() + 3600)));
    assert_eq!(call(&url, &[("authorization", &good)]).await.0, 200, "valid token");
    let expired = format!("Bearer {}", signer.token(&claims("gw-issuer", "any", now() - 3600)));
    assert_eq!(call(&url, &[("authorization", &expired)]).await.0, 401, "expired token");
    let stranger = format!("Bearer {}", Signer::new("gw").token(&claims("gw-issuer", "any", now() + 3600)));
    assert_eq!(call(&url, &[("authorization", &stranger)]).await.0, 401, "another key, same kid");

    // With an AuthorizationPolicy requiring a request principal (Istio's
    // way to make a token mandatory): a missing token is 403, alice's
    // passes, bob's does not; a claim condition reads the verified payload.
    let policy = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: require-jwt, namespace: istio-system}
spec:
  selector: {matchLabels: {istio: ingressgateway}}
  action: ALLOW
  rules:
  - from: [{source: {requestPrincipals: ["gw-issuer/alice"]}}]
  - when: [{key: "request.auth.claims[groups]", values: [admins]}]
"#;
    let rev = fx.apply(policy).await;
    p.wait_synced(rev).await;
    let _ = until_status(&url, &[], 403, "a missing token is denied").await;
    assert_eq!(call(&url, &[("authorization", &good)]).await.0, 200, "alice");
    let bob = json!({"iss": "gw-issuer", "sub": "bob", "iat": now() - 10, "exp": now() + 3600});
    let bob_token = format!("Bearer {}", signer.token(&bob));
    assert_eq!(call(&url, &[("authorization", &bob_token)]).await.0, 403, "bob");
    let mut admin = bob.clone();
    admin["groups"] = json!(["staff", "admins"]);
    assert_eq!(call(&url, &[("authorization", &format!("Bearer {}", signer.token(&admin)))]).await.0, 200, "bob in admins (a list claim)");
    // `lodestar authz check` says the same, from the claims.
    let api = fx.api(1);
    let check = |claims: Value| {
        let c = claims.to_string();
        kit::cli(&api, &["authz", "check", "--proxy", "ingressgateway.istio-system", "--path", "/echo", "--jwt-claims", &c]).1
    };
    assert!(check(json!({"iss": "gw-issuer", "sub": "alice"})).starts_with("ALLOWED: allowed by ns[istio-system]-policy[require-jwt]-rule[0]"));
    let out = check(json!({"iss": "gw-issuer", "sub": "bob"}));
    assert!(out.starts_with("DENIED") && out.contains("JWT claim sub = \"bob\" does not match"), "{out}");
    let out = kit::cli(&api, &["authz", "check", "--proxy", "ingressgateway.istio-system", "--path", "/echo"]).1;
    assert!(out.starts_with("DENIED") && out.contains("no verified JWT"), "{out}");
    p.envoy.assert_no_rejections().await;
}
