//! Real HTTP traffic through real Envoys configured by Lodestar: Istio
//! YAML is applied to replica processes, Envoys bootstrapped with
//! `lodestar bootstrap` receive the translation over ADS, and requests go
//! through a sidecar's listener (`PROXY_IP:SERVICE_PORT`, routed by Host)
//! to upstream helpers that answer with their identity.
//!
//! Each test has its own replica(s), Envoy(s) and loopback prefix. It
//! applies its config, waits until the proxy ACKed that revision for every
//! type (`/debug/syncz`), then sends traffic; it ends by asserting that
//! Envoy rejected nothing. Waits are bounded polls, never sleeps; every
//! load loop is bounded in count and time.

use crate::kit;

use kit::envoy::{EnvoyOptions, Upstream};
use kit::mesh::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Config.

/// reviews (v1, v2, v3 by label) as a mesh-internal ServiceEntry on port
/// 9080, with a DestinationRule naming the subsets.
const REVIEWS_SE: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: ${v1.ip}, ports: {http: ${v1.port}}, labels: {app: reviews, version: v1}}
  - {address: ${v2.ip}, ports: {http: ${v2.port}}, labels: {app: reviews, version: v2}}
  - {address: ${v3.ip}, ports: {http: ${v3.port}}, labels: {app: reviews, version: v3}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
"#;

/// reviews as registry instances of a declared registry Service.
const REVIEWS_REGISTRY: &str = r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: reviews, namespace: default}
spec:
  ports: [{name: http, number: 9080, protocol: HTTP}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-v1, namespace: default, labels: {app: reviews, version: v1}}
spec: {service: reviews, address: ${v1.ip}, ports: {http: ${v1.port}}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-v2, namespace: default, labels: {app: reviews, version: v2}}
spec: {service: reviews, address: ${v2.ip}, port: ${v2.port}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-v3, namespace: default, labels: {app: reviews, version: v3}}
spec: {service: reviews, address: ${v3.ip}, port: ${v3.port}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews.default.svc.cluster.local
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
"#;

/// Three reviews upstreams on `.11`, `.12`, `.13`.
async fn reviews_upstreams(fx: &Fixture) -> (Upstream, Upstream, Upstream) {
    (fx.upstream(11, "reviews-v1").await, fx.upstream(12, "reviews-v2").await, fx.upstream(13, "reviews-v3").await)
}

fn reviews_config(template: &str, v1: &Upstream, v2: &Upstream, v3: &Upstream, vs: &str) -> String {
    format!("{}---{vs}", render(template, &[("v1", v1), ("v2", v2), ("v3", v3)]))
}

// ---------------------------------------------------------------------------
// 1, 13: header-match routing, SotW and delta.

const JASON_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews]
  http:
  - match:
    - headers:
        end-user: {exact: jason}
    route:
    - destination: {host: reviews, subset: v2}
  - route:
    - destination: {host: reviews, subset: v1}
"#;

async fn header_match_routing(delta: bool) {
    let fx = Fixture::start(1).await;
    let (v1, v2, v3) = reviews_upstreams(&fx).await;
    let rev = fx.apply(&reviews_config(REVIEWS_SE, &v1, &v2, &v3, JASON_VS)).await;
    let p = fx.sidecar("productpage", 2, 1, delta, rev).await;
    let url = p.url(9080, "/reviews/1");
    wait_for(&fx.client, &url, "reviews", &[("end-user", "jason")], "jason reaches v2", |r| r.body == "reviews-v2").await;

    // Every name the service answers to from its own namespace.
    for host in ["reviews", "reviews:9080", "reviews.default", "reviews.default.svc.cluster.local", "reviews.default.svc.cluster.local:9080"] {
        let jason = load(&fx.client, &url, host, &[("end-user", "jason")], 20, 4).await;
        assert_eq!(tally(&jason), BTreeMap::from([("200 reviews-v2".to_string(), 20)]), "jason via Host {host}");
        let anonymous = load(&fx.client, &url, host, &[], 20, 4).await;
        assert_eq!(tally(&anonymous), BTreeMap::from([("200 reviews-v1".to_string(), 20)]), "no end-user via Host {host}");
        let bob = load(&fx.client, &url, host, &[("end-user", "bob")], 20, 4).await;
        assert_eq!(tally(&bob), BTreeMap::from([("200 reviews-v1".to_string(), 20)]), "end-user bob via Host {host}");
    }
    // exact means exact.
    let jasons = load(&fx.client, &url, "reviews", &[("end-user", "jason2")], 10, 2).await;
    assert_eq!(tally(&jasons), BTreeMap::from([("200 reviews-v1".to_string(), 10)]));
    assert!(v3.requests().is_empty(), "nothing routes to v3");
    // An unknown host is not routed.
    assert_eq!(get(&fx.client, &url, "ratings", &[]).await.status, 404);
    assert_eq!(syncz_protocol(&p).await, if delta { "delta" } else { "sotw" });
    p.envoy.assert_no_rejections().await;
}

async fn syncz_protocol(p: &Proxy) -> String {
    let s = syncz(&p.client, &p.api).await;
    let entry = s["proxies"].as_array().unwrap().iter().find(|x| x["id"] == p.id.as_str()).cloned().unwrap_or(Value::Null);
    entry["protocol"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_match_routing_sotw() {
    header_match_routing(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_match_routing_delta() {
    header_match_routing(true).await;
}

// ---------------------------------------------------------------------------
// 2, 13: weighted split, SotW and delta.

const SPLIT_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: default}
spec:
  hosts: [reviews.default.svc.cluster.local]
  http:
  - route:
    - destination: {host: reviews, subset: v1}
      weight: 80
    - destination: {host: reviews, subset: v3}
      weight: 20
"#;

async fn weighted_split(delta: bool) {
    const N: usize = 1200;
    let fx = Fixture::start(1).await;
    let (v1, v2, v3) = reviews_upstreams(&fx).await;
    let rev = fx.apply(&reviews_config(REVIEWS_REGISTRY, &v1, &v2, &v3, SPLIT_VS)).await;
    let p = fx.sidecar("productpage", 2, 1, delta, rev).await;
    let url = p.url(9080, "/reviews/2");
    wait_for(&fx.client, &url, "reviews", &[], "first answer", |r| r.status == 200).await;

    let replies = load(&fx.client, &url, "reviews", &[], N, 8).await;
    let t = tally(&replies);
    let v1n = t.get("200 reviews-v1").copied().unwrap_or(0);
    let v3n = t.get("200 reviews-v3").copied().unwrap_or(0);
    assert_eq!(v1n + v3n, N, "only v1 and v3, all 200: {t:?}");
    let share = v1n as f64 / N as f64;
    eprintln!("weighted split ({}): v1 {v1n}, v3 {v3n} of {N} ({:.1}% v1)", if delta { "delta" } else { "sotw" }, share * 100.0);
    assert!((0.75..=0.85).contains(&share), "v1 share {share:.3} not 80±5%: {t:?}");
    assert!(v2.requests().is_empty(), "nothing routes to v2");
    assert_eq!(syncz_protocol(&p).await, if delta { "delta" } else { "sotw" });
    p.envoy.assert_no_rejections().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_split_sotw() {
    weighted_split(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_split_delta() {
    weighted_split(true).await;
}

// ---------------------------------------------------------------------------
// A single-upstream service for the per-route feature tests.

/// `name` on port `port`, one registry instance (the upstream `u`).
fn single_service(name: &str, port: u16, u: &Upstream) -> String {
    format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: {name}, namespace: default}}
spec:
  ports: [{{name: http, number: {port}}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: {name}-1, namespace: default, labels: {{app: {name}}}}}
spec: {{service: {name}, address: {ip}, port: {uport}}}
"#,
        ip = u.addr.ip(),
        uport = u.addr.port()
    )
}

// ---------------------------------------------------------------------------
// 3: retries.

const RETRY_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - match: [{uri: {prefix: /five}}]
    retries: {attempts: 3, retryOn: 5xx}
    route: [{destination: {host: ratings}}]
  - match: [{uri: {prefix: /code}}]
    retries: {attempts: 3, retryOn: "503"}
    route: [{destination: {host: ratings}}]
  - match: [{uri: {prefix: /none}}]
    retries: {attempts: 0}
    route: [{destination: {host: ratings}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_recover_from_failing_attempts() {
    let fx = Fixture::start(1).await;
    let u = fx.upstream(11, "ratings-v1").await;
    let rev = fx.apply(&format!("{}---{RETRY_VS}", single_service("ratings", 9080, &u))).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    wait_for(&fx.client, &p.url(9080, "/five/warm"), "ratings", &[], "first answer", |r| r.status == 200).await;
    let seen = |path: &str| u.requests().iter().filter(|q| q.path == path).count();

    // Two failures, then success: the client sees only the success.
    for path in ["/five/a", "/code/a"] {
        u.fail_next(2);
        let r = get(&fx.client, &p.url(9080, path), "ratings", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ratings-v1"), "{path}");
        assert_eq!(seen(path), 3, "{path}: two failed attempts and the one that succeeded");
    }
    // 1 + 3 attempts, then the failure reaches the client.
    u.fail_next(5);
    let r = get(&fx.client, &p.url(9080, "/five/b"), "ratings", &[]).await;
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(seen("/five/b"), 4, "one try and three retries");
    u.fail_next(0);
    // Without retries the first failure is the answer.
    u.fail_next(1);
    let r = get(&fx.client, &p.url(9080, "/none/a"), "ratings", &[]).await;
    assert_eq!((r.status, r.header("x-upstream")), (503, Some("ratings-v1")));
    assert_eq!(seen("/none/a"), 1);
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 4: timeout.

const TIMEOUT_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - match: [{uri: {prefix: /fast}}]
    timeout: 300ms
    route: [{destination: {host: ratings}}]
  - route: [{destination: {host: ratings}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_timeout_answers_504() {
    let fx = Fixture::start(1).await;
    let u = fx.upstream(11, "ratings-v1").await;
    let rev = fx.apply(&format!("{}---{TIMEOUT_VS}", single_service("ratings", 9080, &u))).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    wait_for(&fx.client, &p.url(9080, "/fast/warm"), "ratings", &[], "first answer", |r| r.status == 200).await;

    u.set_delay(Duration::from_secs(2));
    let r = get(&fx.client, &p.url(9080, "/fast/1"), "ratings", &[]).await;
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(r.body, "upstream request timeout");
    // Cut short: the upstream would have answered after 2 s.
    assert!(r.elapsed < Duration::from_secs(2), "504 after {:?}", r.elapsed);
    assert_eq!(u.requests().iter().filter(|q| q.path == "/fast/1").count(), 1, "a timeout is not retried");
    // Without a timeout the same upstream answers.
    let r = get(&fx.client, &p.url(9080, "/patient"), "ratings", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ratings-v1"));
    assert!(r.elapsed >= Duration::from_secs(2));
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 5: fault injection.

const FAULT_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - match: [{uri: {prefix: /half}}]
    fault:
      abort: {httpStatus: 418, percentage: {value: 50}}
    route: [{destination: {host: ratings}}]
  - match: [{uri: {prefix: /all}}]
    fault:
      abort: {httpStatus: 429, percentage: {value: 100}}
    route: [{destination: {host: ratings}}]
  - match: [{uri: {prefix: /grpc}}]
    fault:
      abort: {grpcStatus: UNAVAILABLE, percentage: {value: 100}}
    route: [{destination: {host: ratings}}]
  - match: [{uri: {prefix: /slow}}]
    fault:
      delay: {fixedDelay: 500ms, percentage: {value: 100}}
    route: [{destination: {host: ratings}}]
  - route: [{destination: {host: ratings}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_abort_and_delay() {
    const N: usize = 400;
    let fx = Fixture::start(1).await;
    let u = fx.upstream(11, "ratings-v1").await;
    let rev = fx.apply(&format!("{}---{FAULT_VS}", single_service("ratings", 9080, &u))).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    wait_for(&fx.client, &p.url(9080, "/ok"), "ratings", &[], "first answer", |r| r.status == 200).await;

    let half = load(&fx.client, &p.url(9080, "/half"), "ratings", &[], N, 8).await;
    let t = tally(&half);
    let aborted = half.iter().filter(|r| r.status == 418).count();
    let passed = t.get("200 ratings-v1").copied().unwrap_or(0);
    eprintln!("abort 50%: {aborted} of {N} aborted ({t:?})");
    assert_eq!(aborted + passed, N, "only 418 or the upstream's 200: {t:?}");
    assert!((N * 35 / 100..=N * 65 / 100).contains(&aborted), "{aborted} of {N} aborted, expected about half");
    assert_eq!(u.requests().iter().filter(|q| q.path == "/half").count(), passed, "aborted requests never reach the upstream");

    let all = load(&fx.client, &p.url(9080, "/all"), "ratings", &[], 50, 4).await;
    assert!(all.iter().all(|r| r.status == 429), "{:?}", tally(&all));
    assert!(u.requests().iter().all(|q| q.path != "/all"));

    // A gRPC status abort: Envoy answers a gRPC request as a gRPC server
    // would (HTTP 200, grpc-status 14, UNAVAILABLE), and the upstream sees
    // nothing.
    let r = get(&fx.client, &p.url(9080, "/grpc"), "ratings", &[("content-type", "application/grpc")]).await;
    assert_eq!((r.status, r.header("grpc-status")), (200, Some("14")), "{:?}", r.headers);
    assert!(u.requests().iter().all(|q| q.path != "/grpc"));

    for i in 0..3 {
        let r = get(&fx.client, &p.url(9080, &format!("/slow/{i}")), "ratings", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ratings-v1"));
        // 500 ms, less the slack of Envoy's timers (they count from the
        // event loop's cached clock); unfaulted answers take a millisecond.
        assert!(r.elapsed >= Duration::from_millis(480), "delayed by the fault: {:?}", r.elapsed);
    }
    let prefix = format!("http.{}_9080.fault", p.ip);
    assert_eq!(p.stat(&format!("{prefix}.aborts_injected")).await, (aborted + 51) as u64);
    assert_eq!(p.stat(&format!("{prefix}.delays_injected")).await, 3);
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 6: redirects.

const REDIRECT_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - match: [{uri: {exact: /old}}]
    redirect: {uri: /new, authority: new.example.test, redirectCode: 308}
  - match: [{uri: {prefix: /moved}}]
    redirect: {uri: /here}
  - match: [{uri: {prefix: /elsewhere}}]
    redirect: {authority: other.example.test, port: 8443, scheme: https, redirectCode: 302}
  - route: [{destination: {host: ratings}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects() {
    let fx = Fixture::start(1).await;
    let u = fx.upstream(11, "ratings-v1").await;
    let rev = fx.apply(&format!("{}---{REDIRECT_VS}", single_service("ratings", 9080, &u))).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    wait_for(&fx.client, &p.url(9080, "/ok"), "ratings", &[], "first answer", |r| r.status == 200).await;

    let r = get(&fx.client, &p.url(9080, "/old"), "ratings", &[]).await;
    assert_eq!((r.status, r.header("location")), (308, Some("http://new.example.test/new")), "{r:?}");
    let r = get(&fx.client, &p.url(9080, "/moved/x"), "ratings", &[]).await;
    assert_eq!((r.status, r.header("location")), (301, Some("http://ratings/here")), "{r:?}");
    let r = get(&fx.client, &p.url(9080, "/elsewhere/y"), "ratings", &[]).await;
    assert_eq!((r.status, r.header("location")), (302, Some("https://other.example.test:8443/elsewhere/y")), "{r:?}");
    // exact: /old/ is not /old.
    let r = get(&fx.client, &p.url(9080, "/old/"), "ratings", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ratings-v1"));
    assert_eq!(u.requests().iter().map(|q| q.path.as_str()).filter(|p| *p != "/ok").collect::<Vec<_>>(), vec!["/old/"], "redirects never reach the upstream");
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 7: header manipulation.

const HEADERS_VS: &str = r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - headers:
      request:
        set: {x-env: prod}
        add: {x-trace: abc}
        remove: [x-internal]
      response:
        set: {x-served-by: lodestar}
        remove: [x-upstream]
    route:
    - destination: {host: ratings}
      headers:
        request: {set: {x-dest: ratings}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_and_response_headers() {
    let fx = Fixture::start(1).await;
    let u = fx.upstream(11, "ratings-v1").await;
    let rev = fx.apply(&format!("{}---{HEADERS_VS}", single_service("ratings", 9080, &u))).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    let url = p.url(9080, "/headers/echo");
    let client_headers = [("x-env", "dev"), ("x-internal", "secret"), ("x-keep", "yes")];
    let r = wait_for(&fx.client, &url, "ratings", &client_headers, "first answer", |r| r.status == 200).await;

    let echo: Value = serde_json::from_str(&r.body).expect("echo JSON");
    let seen = &echo["headers"];
    assert_eq!(echo["identity"], "ratings-v1");
    assert_eq!(seen["x-env"], "prod", "set overwrites the client's value: {seen:#}");
    assert_eq!(seen["x-trace"], "abc", "{seen:#}");
    assert_eq!(seen["x-dest"], "ratings", "destination-level set: {seen:#}");
    assert_eq!(seen["x-keep"], "yes", "{seen:#}");
    assert!(seen.get("x-internal").is_none(), "removed: {seen:#}");
    // The request the upstream recorded agrees.
    let last = u.requests().into_iter().last().unwrap();
    assert!(!last.headers.contains_key("x-internal"));
    assert_eq!(r.header("x-served-by"), Some("lodestar"));
    assert_eq!(r.header("x-upstream"), None, "the upstream's header is removed from the response");
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 8: mirroring.

const MIRROR: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: shadow, namespace: default}
spec:
  hosts: [shadow.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: ${shadow.ip}, ports: {http: ${shadow.port}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: ratings, namespace: default}
spec:
  hosts: [ratings]
  http:
  - route: [{destination: {host: ratings}}]
    mirror: {host: shadow}
    mirrorPercentage: {value: 100}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrored_requests_reach_the_mirror() {
    const N: usize = 20;
    let fx = Fixture::start(1).await;
    let primary = fx.upstream(11, "ratings-v1").await;
    let shadow = fx.upstream(12, "shadow").await;
    // The mirror's answers are ignored: it fails every request.
    shadow.fail_next(usize::MAX);
    let rev = fx.apply(&format!("{}---{}", single_service("ratings", 9080, &primary), render(MIRROR, &[("shadow", &shadow)]))).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    wait_for(&fx.client, &p.url(9080, "/warm"), "ratings", &[], "first answer", |r| r.status == 200).await;

    for i in 0..N {
        let r = get(&fx.client, &p.url(9080, &format!("/mirror/{i}")), "ratings", &[]).await;
        assert_eq!((r.status, r.body.as_str()), (200, "ratings-v1"), "the primary answers");
    }
    let mirrored = |u: &Upstream| u.requests().into_iter().filter(|q| q.path.starts_with("/mirror/")).collect::<Vec<_>>();
    assert_eq!(mirrored(&primary).len(), N);
    // Mirrors are fire-and-forget: wait for the copies.
    kit::eventually_or(&format!("the mirror sees {N}"), BOUND, || async {
        let seen = mirrored(&shadow).len();
        if seen >= N {
            Ok(())
        } else {
            Err(format!("{seen} of {N}"))
        }
    })
    .await;
    let copies = mirrored(&shadow);
    let mut paths: Vec<&str> = copies.iter().map(|q| q.path.as_str()).collect();
    paths.sort();
    let mut want: Vec<String> = (0..N).map(|i| format!("/mirror/{i}")).collect();
    want.sort();
    assert_eq!(paths, want);
    // Envoy marks shadowed requests by suffixing the authority.
    assert!(copies.iter().all(|q| q.headers.get("host").is_some_and(|h| h == "ratings-shadow")), "{:?}", copies[0].headers);
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 9: consistent hashing.

const HASH: &str = r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: ratings, namespace: default}
spec:
  ports: [{name: http, number: 9080}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ratings-a, namespace: default}
spec: {service: ratings, address: ${a.ip}, port: ${a.port}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ratings-b, namespace: default}
spec: {service: ratings, address: ${b.ip}, port: ${b.port}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ratings-c, namespace: default}
spec: {service: ratings, address: ${c.ip}, port: ${c.port}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: ratings, namespace: default}
spec:
  host: ratings
  trafficPolicy:
    loadBalancer:
      consistentHash: {httpHeaderName: x-user}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistent_hash_pins_a_header_value() {
    const USERS: usize = 12;
    const PER_USER: usize = 50;
    let fx = Fixture::start(1).await;
    let (a, b, c) = (fx.upstream(11, "ratings-a").await, fx.upstream(12, "ratings-b").await, fx.upstream(13, "ratings-c").await);
    let rev = fx.apply(&render(HASH, &[("a", &a), ("b", &b), ("c", &c)])).await;
    let p = fx.sidecar("reviews", 2, 1, false, rev).await;
    let url = p.url(9080, "/ratings");
    wait_for(&fx.client, &url, "ratings", &[], "first answer", |r| r.status == 200).await;

    // No VirtualService: the default route carries the hash policy.
    let mut placement: BTreeMap<String, String> = BTreeMap::new();
    for i in 0..USERS {
        let user = format!("user-{i}");
        let replies = load(&fx.client, &url, "ratings", &[("x-user", &user)], PER_USER, 4).await;
        let t = tally(&replies);
        assert_eq!(t.len(), 1, "{user} went to more than one upstream: {t:?}");
        let (k, n) = t.into_iter().next().unwrap();
        assert!(k.starts_with("200 ") && n == PER_USER, "{user}: {k} x{n}");
        placement.insert(user, k[4..].to_string());
    }
    let distinct: std::collections::BTreeSet<&String> = placement.values().collect();
    eprintln!("consistent hash placement: {placement:?}");
    assert!(distinct.len() >= 2, "{USERS} users all on one upstream: {placement:?}");
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 10: outlier detection.

const OUTLIER: &str = r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: details, namespace: default}
spec:
  ports: [{name: http, number: 9080}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: details-good, namespace: default}
spec: {service: details, address: ${good.ip}, port: ${good.port}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: details-bad, namespace: default}
spec: {service: details, address: ${bad.ip}, port: ${bad.port}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: details, namespace: default}
spec:
  host: details
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    outlierDetection: {consecutive5xxErrors: 1, interval: 1s, baseEjectionTime: 30s, maxEjectionPercent: 100}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: details, namespace: default}
spec:
  hosts: [details]
  http:
  - route: [{destination: {host: details}}]
    retries: {attempts: 0}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outlier_detection_ejects_a_failing_upstream() {
    let fx = Fixture::start(1).await;
    let good = fx.upstream(11, "details-good").await;
    let bad = fx.upstream(12, "details-bad").await;
    bad.fail_next(usize::MAX);
    let rev = fx.apply(&render(OUTLIER, &[("good", &good), ("bad", &bad)])).await;
    let p = fx.sidecar("productpage", 2, 1, false, rev).await;
    let url = p.url(9080, "/details");
    let cluster = "outbound|9080||details.default.svc.cluster.local";
    let ejected = format!("cluster.{cluster}.outlier_detection.ejections_enforced_total");

    // Warm-up: round robin reaches the bad upstream, whose 503 (no retry)
    // reaches the client and ejects it.
    let deadline = Instant::now() + BOUND;
    let mut failures = 0;
    for i in 0.. {
        let r = get(&fx.client, &url, "details", &[]).await;
        if r.status == 503 {
            assert_eq!(r.header("x-upstream"), Some("details-bad"), "{r:?}");
            failures += 1;
        } else {
            assert_eq!((r.status, r.body.as_str()), (200, "details-good"));
        }
        if failures > 0 && p.stat(&ejected).await >= 1 {
            break;
        }
        assert!(i < 200 && Instant::now() < deadline, "no ejection after {i} requests ({failures} failures)");
    }
    assert_eq!(p.stat(&format!("cluster.{cluster}.outlier_detection.ejections_active")).await, 1);
    let bad_before = bad.requests().len();

    let replies = load(&fx.client, &url, "details", &[], 100, 4).await;
    assert_eq!(tally(&replies), BTreeMap::from([("200 details-good".to_string(), 100)]));
    assert_eq!(bad.requests().len(), bad_before, "the ejected upstream gets nothing");
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 11: external services.

const EXTERNAL: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-static, namespace: default}
spec:
  hosts: [api.external.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8081, name: http, protocol: HTTP}]
  endpoints:
  - {address: ${static.ip}, ports: {http: ${static.port}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external-dns, namespace: default}
spec:
  hosts: [dns.external.test]
  location: MESH_EXTERNAL
  resolution: DNS
  ports: [{number: 8081, name: http, protocol: HTTP}]
  endpoints:
  - {address: ${dns.ip}, ports: {http: ${dns.port}}}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_service_entries() {
    let fx = Fixture::start(1).await;
    let stat = fx.upstream(11, "external-static").await;
    let dns = fx.upstream(12, "external-dns").await;
    let rev = fx.apply(&render(EXTERNAL, &[("static", &stat), ("dns", &dns)])).await;
    let p = fx.sidecar("productpage", 2, 1, false, rev).await;
    let url = p.url(8081, "/v1/things");

    for (host, identity) in [("api.external.test", "external-static"), ("dns.external.test", "external-dns"), ("dns.external.test:8081", "external-dns")] {
        wait_for(&fx.client, &url, host, &[], &format!("{host} answers"), |r| r.status == 200).await;
        let replies = load(&fx.client, &url, host, &[], 20, 4).await;
        assert_eq!(tally(&replies), BTreeMap::from([(format!("200 {identity}"), 20)]), "Host {host}");
    }
    // The upstream sees the external host name.
    assert!(stat.requests().iter().all(|q| q.headers.get("host").is_some_and(|h| h == "api.external.test")));
    assert_eq!(get(&fx.client, &url, "unknown.external.test", &[]).await.status, 404);
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 12: an ingress gateway.

const GATEWAY: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bookinfo-gateway, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: [bookinfo.example.test]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bookinfo, namespace: default}
spec:
  hosts: [bookinfo.example.test]
  gateways: [bookinfo-gateway]
  http:
  - match: [{uri: {prefix: /productpage}}]
    route: [{destination: {host: productpage, port: {number: 9080}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: not-admitted, namespace: default}
spec:
  hosts: [internal.example.test]
  gateways: [bookinfo-gateway]
  http:
  - route: [{destination: {host: productpage}}]
"#;

/// An ingress gateway (router, `istio: ingressgateway`) at `.2`, in sync
/// at `revision`.
async fn ingress_gateway(fx: &Fixture, revision: u64) -> Proxy {
    fx.proxy(ingress_gateway_options(fx), 1, revision).await
}

fn ingress_gateway_options(fx: &Fixture) -> EnvoyOptions {
    let mut o = EnvoyOptions::new("ingressgateway", &fx.ip(2));
    o.namespace = "istio-system".into();
    o.node_type = "router".into();
    o.labels = vec![("istio".into(), "ingressgateway".into())];
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingress_gateway_routes_to_a_mesh_service() {
    let fx = Fixture::start(1).await;
    let u = fx.upstream(11, "productpage-v1").await;
    let yaml = format!("{}---{GATEWAY}", single_service("productpage", 9080, &u));
    // Applied with the CLI this time.
    let file = fx.tmp.path().join("gateway.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let out = kit::cli_command().args(["--server", &fx.api(1), "apply", "-f"]).arg(&file).env_remove("LODESTAR_SERVER").output().expect("lodestar apply");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "lodestar apply: {stderr}");
    let rev: u64 = stderr.lines().find_map(|l| l.strip_prefix("revision ")).and_then(|v| v.trim().parse().ok()).expect("revision in the CLI output");

    let p = ingress_gateway(&fx, rev).await;
    let url = p.url(8080, "/productpage");
    wait_for(&fx.client, &url, "bookinfo.example.test", &[], "ingress answers", |r| r.status == 200).await;

    let replies = load(&fx.client, &url, "bookinfo.example.test", &[], 40, 4).await;
    assert_eq!(tally(&replies), BTreeMap::from([("200 productpage-v1".to_string(), 40)]));
    let r = get(&fx.client, &p.url(8080, "/productpage"), "bookinfo.example.test:8080", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "productpage-v1"));
    // Only the VirtualService's paths, only admitted hosts.
    assert_eq!(get(&fx.client, &p.url(8080, "/admin"), "bookinfo.example.test", &[]).await.status, 404);
    assert_eq!(get(&fx.client, &url, "internal.example.test", &[]).await.status, 404);
    assert_eq!(get(&fx.client, &url, "productpage", &[]).await.status, 404);
    assert!(u.requests().iter().all(|q| q.path == "/productpage"));
    // A router gets gateway listeners only: nothing on the service port.
    assert!(send(&fx.client, &p.url(9080, "/productpage"), "productpage", &[]).await.is_err());
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// 13: gateway TLS: HTTPS terminated with certificate files, never plaintext.

/// Istio's secure ingress with files: `shop` over SIMPLE TLS, `partners`
/// over MUTUAL TLS (client certificates from the test CA, with the
/// partner's SPIFFE name), both on 8443 (a filter chain each, chosen by
/// SNI), and plain HTTP on 8080 redirecting to HTTPS. On 9443,
/// `partners` over OPTIONAL_MUTUAL, pinned to TLS 1.2 and one cipher.
const GATEWAY_TLS: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: shop-gateway, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: [shop.example.test]
    tls: {httpsRedirect: true}
  - port: {number: 8443, name: https, protocol: HTTPS}
    hosts: [shop.example.test]
    tls: {mode: SIMPLE, serverCertificate: CERTS/gateway.pem, privateKey: CERTS/gateway-key.pem}
  - port: {number: 8443, name: https-partners, protocol: HTTPS}
    hosts: [partners.example.test]
    tls:
      mode: MUTUAL
      serverCertificate: CERTS/gateway.pem
      privateKey: CERTS/gateway-key.pem
      caCertificates: CERTS/ca.pem
      subjectAltNames: [spiffe://partners.example.test/client]
  - port: {number: 9443, name: https-optional, protocol: HTTPS}
    hosts: [partners.example.test]
    tls:
      mode: OPTIONAL_MUTUAL
      serverCertificate: CERTS/gateway.pem
      privateKey: CERTS/gateway-key.pem
      caCertificates: CERTS/ca.pem
      minProtocolVersion: TLSV1_2
      maxProtocolVersion: TLSV1_2
      cipherSuites: [ECDHE-ECDSA-AES128-GCM-SHA256]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: shop, namespace: default}
spec:
  hosts: [shop.example.test]
  gateways: [shop-gateway]
  http:
  - route: [{destination: {host: shop, port: {number: 9080}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: partners, namespace: default}
spec:
  hosts: [partners.example.test]
  gateways: [shop-gateway]
  http:
  - route: [{destination: {host: partner-api, port: {number: 9080}}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_terminates_tls_simple_and_mutual() {
    use kit::tls::{Ca, TlsClient};
    let fx = Fixture::start(1).await;
    let shop = fx.upstream(11, "shop").await;
    let partner_api = fx.upstream(12, "partner-api").await;

    // The gateway's certificate and the partner's client certificate come
    // from the test CA; a stranger has one from the same CA under another
    // name, an impostor one from another CA under the partner's name.
    let certs = fx.tmp.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let ca = Ca::new("lodestar test CA");
    ca.write(&certs, "ca");
    ca.server(&["shop.example.test", "partners.example.test"]).write(&certs, "gateway");
    let partner = ca.client("spiffe://partners.example.test/client");
    let stranger = ca.client("spiffe://elsewhere.example.test/client");
    let other_ca = Ca::new("another CA");
    let impostor = other_ca.client("spiffe://partners.example.test/client");

    let gateway = GATEWAY_TLS.replace("CERTS", certs.to_str().unwrap());
    let yaml = format!("{}---{}---{gateway}", single_service("shop", 9080, &shop), single_service("partner-api", 9080, &partner_api));
    let rev = fx.apply(&yaml).await;
    // In sync at `rev`, nothing NACKed.
    let p = ingress_gateway(&fx, rev).await;
    let tls_port: std::net::SocketAddr = format!("{}:8443", p.ip).parse().unwrap();

    // SIMPLE: the gateway's certificate, verified against the test CA.
    let shop_client = TlsClient { ca: &ca, server_name: "shop.example.test", certificate: None, alpn: &["http/1.1"] };
    let reply = kit::eventually_or("shop over TLS", BOUND, || async {
        match shop_client.get(tls_port, "shop.example.test", "/products").await {
            Ok(r) if r.status == 200 => Ok(r),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!((reply.body.as_str(), reply.alpn.as_deref()), ("shop", Some("http/1.1")));
    assert_eq!(shop.requests().last().map(|q| q.path.clone()).as_deref(), Some("/products"));
    // HTTP/2 is offered too.
    let h2 = TlsClient { alpn: &["h2", "http/1.1"], ..shop_client };
    assert_eq!(h2.handshake(tls_port).await.unwrap().as_deref(), Some("h2"));
    // A client trusting another CA rejects the gateway's certificate.
    let doubting = TlsClient { ca: &other_ca, server_name: "shop.example.test", certificate: None, alpn: &[] };
    let e = doubting.get(tls_port, "shop.example.test", "/").await.expect_err("certificate from an untrusted CA");
    assert!(e.contains("certificate"), "{e}");

    // Plaintext to the TLS port gets no answer.
    let plain = send(&fx.client, &format!("http://{tls_port}/products"), "shop.example.test", &[]).await;
    assert!(plain.is_err(), "plaintext HTTP to the TLS port was answered: {plain:?}");

    // MUTUAL (chosen by SNI): no client certificate, a certificate with
    // another name, or one from another CA are refused; the partner's is
    // accepted, and its identity goes upstream.
    let partners = |certificate| TlsClient { ca: &ca, server_name: "partners.example.test", certificate, alpn: &["http/1.1"] };
    for (who, cert) in [("no certificate", None), ("another name", Some(&stranger)), ("another CA", Some(&impostor))] {
        let r = partners(cert).get(tls_port, "partners.example.test", "/orders").await;
        assert!(r.is_err(), "client with {who} was let in: {r:?}");
    }
    assert!(partner_api.requests().is_empty(), "a refused client reached the upstream");
    let reply = partners(Some(&partner)).get(tls_port, "partners.example.test", "/orders").await.expect("partner with its certificate");
    assert_eq!((reply.status, reply.body.as_str()), (200, "partner-api"));
    let xfcc = partner_api.requests().last().and_then(|q| q.headers.get("x-forwarded-client-cert").cloned()).unwrap_or_default();
    assert!(xfcc.contains("URI=spiffe://partners.example.test/client"), "x-forwarded-client-cert: {xfcc:?}");
    // Envoy refused each for the reason meant.
    let stats = p.envoy.stats().await;
    let ssl = |stat: &str| stats.iter().filter(|(k, _)| k.starts_with("listener.") && k.ends_with(&format!(".ssl.{stat}"))).map(|(_, v)| v).sum::<u64>();
    assert!(ssl("fail_verify_no_cert") >= 1 && ssl("fail_verify_san") >= 1 && ssl("fail_verify_error") >= 1, "ssl stats: {stats:?}");

    // OPTIONAL_MUTUAL: a client certificate is validated if given, not
    // required; TLS 1.2 only, as configured.
    let optional_port: std::net::SocketAddr = format!("{}:9443", p.ip).parse().unwrap();
    let before = partner_api.requests().len();
    for (who, cert) in [("no certificate", None), ("the partner's", Some(&partner))] {
        let r = partners(cert).get(optional_port, "partners.example.test", "/orders").await.unwrap_or_else(|e| panic!("optional mutual, {who}: {e}"));
        assert_eq!((r.status, r.body.as_str(), r.version.as_deref()), (200, "partner-api", Some("TLSv1_2")), "{who}");
    }
    let seen = partner_api.requests();
    assert_eq!(seen.len(), before + 2);
    assert!(!seen[before].headers.contains_key("x-forwarded-client-cert") && seen[before + 1].headers.contains_key("x-forwarded-client-cert"), "{seen:?}");
    let r = partners(Some(&impostor)).get(optional_port, "partners.example.test", "/orders").await;
    assert!(r.is_err(), "optional mutual let in a certificate from another CA: {r:?}");

    // Plain HTTP on 8080 redirects to HTTPS.
    let r = get(&fx.client, &p.url(8080, "/products"), "shop.example.test", &[]).await;
    assert_eq!((r.status, r.header("location")), (301, Some("https://shop.example.test/products")));
    p.envoy.assert_no_rejections().await;

    // What Lodestar cannot serve as asked is refused at apply time, naming
    // the field: a gateway terminating with the mesh certificate.
    // (`credentialName` is served: tests/e2e/credentials.rs.)
    let refused = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: mesh-gateway, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 15443, name: tls, protocol: TLS}
    hosts: [shop.example.test]
    tls: {mode: ISTIO_MUTUAL}
"#;
    let (status, body) = kit::apply(&fx.client, &fx.api(1), refused).await;
    assert_eq!(status, 400, "{body:#}");
    let fields = body["error"]["fields"].as_array().cloned().unwrap_or_default();
    let field = "spec.servers[0].tls.mode";
    let named =
        fields.iter().any(|f| f["field"].as_str().is_some_and(|x| x.ends_with(field)) && f["reason"].as_str().is_some_and(|x| x.contains("not supported yet")));
    assert!(named, "{field} not named as not supported: {body:#}");
}

// ---------------------------------------------------------------------------
// 14: a three-replica cluster, a VirtualService change under traffic.

fn reviews_to(subset: &str) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: default}}
spec:
  hosts: [reviews]
  http:
  - route: [{{destination: {{host: reviews, subset: {subset}}}}}]
"#
    )
}

/// What one traffic loop saw, in order: the body of a 200, or the failure.
type Seen = Arc<Mutex<Vec<Result<String, String>>>>;

/// Sequential requests until `stop`, at most `max` of them and for at most
/// 60 s.
fn traffic_loop(client: reqwest::Client, url: String, stop: Arc<AtomicBool>, seen: Seen, max: usize) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(60);
        for _ in 0..max {
            if stop.load(Ordering::SeqCst) || Instant::now() > deadline {
                break;
            }
            let r = match send(&client, &url, "reviews", &[]).await {
                Ok(r) if r.status == 200 => Ok(r.body),
                Ok(r) => Err(format!("{} {}", r.status, r.body)),
                Err(e) => Err(e),
            };
            seen.lock().unwrap().push(r);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

async fn wait_seen(seen: &Seen, what: &str, pred: impl Fn(&[Result<String, String>]) -> bool) {
    let deadline = Instant::now() + BOUND;
    loop {
        {
            let s = seen.lock().unwrap();
            if pred(&s) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: not within {BOUND:?}; {} requests, last {:?}", s.len(), s.last());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_shift_traffic_without_errors() {
    const MAX: usize = 4000;
    const AFTER: usize = 30;
    let fx = Fixture::start(3).await;
    let (v1, v2, v3) = reviews_upstreams(&fx).await;
    let rev = fx.apply(&reviews_config(REVIEWS_SE, &v1, &v2, &v3, &reviews_to("v1"))).await;
    fx.cluster.wait_for_revision(rev, BOUND).await;

    // One Envoy per replica; the second speaks delta.
    let mut proxies = Vec::new();
    for replica in 1..=3u64 {
        let mut o = EnvoyOptions::new(&format!("productpage-{replica}"), &fx.ip(1 + replica as u8));
        o.delta = replica == 2;
        proxies.push(fx.proxy(o, replica, rev).await);
    }
    for p in &proxies {
        wait_for(&fx.client, &p.url(9080, "/r"), "reviews", &[], "v1 answers", |r| r.body == "reviews-v1").await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Seen> = proxies.iter().map(|_| Seen::default()).collect();
    let tasks: Vec<_> = proxies.iter().zip(&seen).map(|(p, s)| traffic_loop(fx.client.clone(), p.url(9080, "/r"), stop.clone(), s.clone(), MAX)).collect();
    for s in &seen {
        wait_seen(s, "steady traffic", |s| s.len() >= 20).await;
    }

    // The change, through a follower's API (forwarded to the leader).
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let via = (1..=3).find(|r| *r != leader).unwrap();
    let mut before = Vec::new();
    for p in &proxies {
        before.push(p.route_version("9080").await.expect("route config 9080"));
    }
    let rev2 = fx.apply_via(via, &reviews_to("v2")).await;
    for (p, before) in proxies.iter().zip(&before) {
        let status = p.wait_synced(rev2).await;
        assert_eq!(status["types"]["RDS"]["acked_version"], rev2.to_string().as_str(), "{}", p.id);
        // Envoy's own view: SotW versions are store revisions; delta ones
        // are per-resource hashes, so the route's version has changed.
        let now = p.route_version("9080").await.expect("route config 9080");
        if p.envoy.options.delta {
            assert_ne!(&now, before, "{}: Envoy's route config", p.id);
        } else {
            assert_eq!(now, rev2.to_string(), "{}: Envoy's route config", p.id);
        }
    }
    let mut shifted_at = Vec::new();
    for s in &seen {
        wait_seen(s, "traffic shifts to v2", |s| s.last().is_some_and(|r| r.as_deref() == Ok("reviews-v2"))).await;
        let at = s.lock().unwrap().len();
        wait_seen(s, "traffic after the shift", |s| s.len() >= at + AFTER).await;
        shifted_at.push(at);
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    for ((p, s), at) in proxies.iter().zip(&seen).zip(&shifted_at) {
        let s = s.lock().unwrap();
        let failures: Vec<&String> = s.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(failures.is_empty(), "{}: {} of {} requests failed during the change: {failures:?}", p.id, failures.len(), s.len());
        let bodies: Vec<&str> = s.iter().map(|r| r.as_deref().unwrap()).collect();
        assert!(bodies.iter().all(|b| *b == "reviews-v1" || *b == "reviews-v2"), "{}: {bodies:?}", p.id);
        let first_v2 = bodies.iter().position(|b| *b == "reviews-v2").unwrap();
        assert!(first_v2 >= 20, "{}: v2 before the change", p.id);
        assert!(bodies[*at..].iter().all(|b| *b == "reviews-v2"), "{}: v1 after the shift", p.id);
        let v1_after = bodies[first_v2..].iter().filter(|b| **b == "reviews-v1").count();
        eprintln!("{}: {} requests, first v2 at #{first_v2}, v1 after that: {v1_after}", p.id, bodies.len());
    }
    assert!(v3.requests().is_empty());
    for p in &proxies {
        p.envoy.assert_no_rejections().await;
    }
}

// ---------------------------------------------------------------------------
// A cluster-only change (DestinationRule traffic policy) under traffic.

const REVIEWS_DR_TUNED: &str = r#"
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: default}
spec:
  host: reviews
  trafficPolicy:
    loadBalancer: {simple: ROUND_ROBIN}
    connectionPool: {tcp: {connectTimeout: 2s}}
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
  - {name: v3, labels: {version: v3}}
"#;

/// The active cluster `name` in Envoy's config dump.
async fn active_cluster(p: &Proxy, name: &str) -> Value {
    let dump = p.envoy.config_dump().await;
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["dynamic_active_clusters"].as_array().into_iter().flatten())
        .find(|c| c["cluster"]["name"] == name)
        .map(|c| c["cluster"].clone())
        .unwrap_or_else(|| panic!("{}: no active cluster {name}", p.id))
}

/// Changing a DestinationRule's policy rebuilds the clusters but not their
/// endpoints. Envoy warms a rebuilt EDS cluster until its endpoints arrive
/// again; they must be sent with it (SotW and delta), not left to Envoy's
/// initial fetch timeout (15 s, after which it falls back to a cached copy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_rule_change_under_traffic() {
    let fx = Fixture::start(1).await;
    let (v1, v2, v3) = reviews_upstreams(&fx).await;
    let rev = fx.apply(&reviews_config(REVIEWS_SE, &v1, &v2, &v3, &reviews_to("v1"))).await;
    let proxies = [fx.sidecar("productpage", 2, 1, false, rev).await, fx.sidecar("details", 3, 1, true, rev).await];
    let cluster = "outbound|9080|v1|reviews.default.svc.cluster.local";
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Vec<Seen> = proxies.iter().map(|_| Seen::default()).collect();
    let mut tasks = Vec::new();
    for (p, s) in proxies.iter().zip(&seen) {
        wait_for(&fx.client, &p.url(9080, "/r"), "reviews", &[], "v1 answers", |r| r.body == "reviews-v1").await;
        assert_eq!(active_cluster(p, cluster).await["lb_policy"], "LEAST_REQUEST");
        tasks.push(traffic_loop(fx.client.clone(), p.url(9080, "/r"), stop.clone(), s.clone(), 4000));
    }
    for s in &seen {
        wait_seen(s, "steady traffic", |s| s.len() >= 20).await;
    }

    let rev2 = fx.apply(REVIEWS_DR_TUNED).await;
    for (p, s) in proxies.iter().zip(&seen) {
        let status = p.wait_synced(rev2).await;
        assert_eq!(status["types"]["CDS"]["acked_version"], rev2.to_string().as_str(), "{}", p.id);
        let c = active_cluster(p, cluster).await;
        // ROUND_ROBIN is the proto default: the dump leaves it out.
        assert_eq!((c["lb_policy"].as_str().unwrap_or("ROUND_ROBIN"), c["connect_timeout"].as_str()), ("ROUND_ROBIN", Some("2s")), "{}: {c:#}", p.id);
        let stats = p.envoy.stats().await;
        let timeouts: Vec<_> = stats.iter().filter(|(k, v)| k.ends_with(".init_fetch_timeout") && **v > 0).collect();
        assert!(timeouts.is_empty(), "{}: Envoy waited out an initial fetch: {timeouts:?}", p.id);
        assert_eq!(stats.get("cluster_manager.warming_clusters"), Some(&0), "{}", p.id);
        let at = s.lock().unwrap().len();
        wait_seen(s, "traffic after the change", |s| s.len() >= at + 30).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    for (p, s) in proxies.iter().zip(&seen) {
        let s = s.lock().unwrap().clone();
        let bad: Vec<_> = s.iter().filter(|r| r.as_deref() != Ok("reviews-v1")).collect();
        assert!(bad.is_empty(), "{}: {} of {} requests not answered by v1: {bad:?}", p.id, bad.len(), s.len());
        p.envoy.assert_no_rejections().await;
    }
}

// ---------------------------------------------------------------------------
// Istio config as people write it, which Lodestar used to refuse: a port
// with `protocol: ""`, a ServiceEntry without ports, a host in upper case,
// a Sidecar ingress without defaultEndpoint, and a file applying the same
// object twice (the last wins). It applies and is served.

const AS_WRITTEN: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: default}
spec:
  hosts: [Legacy.External.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8081, name: http, protocol: ""}]
  endpoints:
  - {address: ${legacy.ip}, ports: {http: ${legacy.port}}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: names-only, namespace: default}
spec:
  hosts: [names.external.test]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: legacy, namespace: default}
spec:
  hosts: [Legacy.External.test]
  http:
  - fault: {abort: {httpStatus: 418, percentage: {value: 100}}}
    route: [{destination: {host: Legacy.External.test}}]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: default}
spec:
  ingress:
  - port: {number: ${app.port}, protocol: HTTP, name: http}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: legacy, namespace: default}
spec:
  hosts: [Legacy.External.test]
  http:
  - route: [{destination: {host: Legacy.External.test}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_config_as_written_applies_and_is_served() {
    let fx = Fixture::start(1).await;
    let legacy = fx.upstream(11, "legacy").await;
    // The application the sidecar's ingress forwards to, on loopback at
    // the listener's own port (no defaultEndpoint).
    let app = Upstream::start("127.0.0.1", "productpage-app").await;
    let rev = fx.apply(&render(AS_WRITTEN, &[("legacy", &legacy), ("app", &app)])).await;
    let p = fx.sidecar("productpage", 2, 1, false, rev).await;

    // The upper-case host, its port sniffed as HTTP from the name, routed
    // by the second VirtualService (the first, aborting with 418, lost).
    let url = p.url(8081, "/v1/things");
    for host in ["Legacy.External.test", "legacy.external.test", "LEGACY.EXTERNAL.TEST:8081"] {
        wait_for(&fx.client, &url, host, &[], &format!("{host} answers"), |r| r.status == 200).await;
        let replies = load(&fx.client, &url, host, &[], 10, 2).await;
        assert_eq!(tally(&replies), BTreeMap::from([("200 legacy".to_string(), 10)]), "Host {host}");
    }
    // The ingress listener forwards to the application.
    let inbound = p.url(app.addr.port(), "/inbound");
    let reply = wait_for(&fx.client, &inbound, "productpage", &[], "ingress answers", |r| r.status == 200).await;
    assert_eq!(reply.body, "productpage-app");
    assert_eq!(app.requests().last().map(|q| q.path.clone()).as_deref(), Some("/inbound"));
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// TLS routing by SNI: backends terminate TLS themselves; Envoy only reads
// the SNI name (tls_inspector) and passes the connection through.

/// `${name.ip}` and `${name.port}` of TLS backends.
fn render_tls(template: &str, upstreams: &[(&str, &kit::tls::TlsUpstream)]) -> String {
    let mut out = template.to_string();
    for (name, u) in upstreams {
        out = out.replace(&format!("${{{name}.ip}}"), &u.addr.ip().to_string()).replace(&format!("${{{name}.port}}"), &u.addr.port().to_string());
    }
    out
}

/// `n` GETs over new TLS connections (SNI `client.server_name`) to `addr`,
/// `concurrency` at a time: answers by body, failures by "error".
pub(crate) async fn tls_load(client: &kit::tls::TlsClient<'_>, addr: std::net::SocketAddr, n: usize, concurrency: usize) -> BTreeMap<String, usize> {
    use futures::StreamExt;
    let replies: Vec<String> = futures::stream::iter(0..n)
        .map(|_| async move {
            match client.get(addr, client.server_name, "/").await {
                Ok(r) if r.status == 200 => r.body,
                Ok(r) => format!("status {}", r.status),
                Err(e) => format!("error: {e}"),
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let mut t = BTreeMap::new();
    for r in replies {
        *t.entry(r).or_insert(0) += 1;
    }
    t
}

/// Until a TLS GET with this SNI answers 200; the body.
pub(crate) async fn wait_tls(client: &kit::tls::TlsClient<'_>, addr: std::net::SocketAddr) -> String {
    kit::eventually_or(&format!("{} via {addr}", client.server_name), BOUND, || async {
        match client.get(addr, client.server_name, "/").await {
            Ok(r) if r.status == 200 => Ok(r.body),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// alpha (HTTP on 8080, TLS on 8443; v1 and v2) and beta (TLS on 8443):
/// two TLS services on one sidecar port, told apart by SNI. alpha's
/// VirtualService has an `http` and a `tls` section, as canary tools write
/// them: HTTP all to v2, TLS split 75/25.
const SNI_SIDECAR: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: alpha, namespace: default}
spec:
  hosts: [alpha.tls.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP}, {number: 8443, name: tls, protocol: TLS}]
  endpoints:
  - {address: ${a1.ip}, ports: {http: ${a1http.port}, tls: ${a1.port}}, labels: {version: v1}}
  - {address: ${a2.ip}, ports: {http: ${a2http.port}, tls: ${a2.port}}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: alpha, namespace: default}
spec:
  host: alpha.tls.test
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: beta, namespace: default}
spec:
  hosts: [beta.tls.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8443, name: tls, protocol: TLS}]
  endpoints:
  - {address: ${b.ip}, ports: {tls: ${b.port}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: alpha, namespace: default}
spec:
  hosts: [alpha.tls.test]
  http:
  - route:
    - {destination: {host: alpha.tls.test, subset: v2, port: {number: 8080}}}
  tls:
  - match:
    - {port: 8443, sniHosts: [alpha.tls.test]}
    route:
    - {destination: {host: alpha.tls.test, subset: v1, port: {number: 8443}}, weight: 75}
    - {destination: {host: alpha.tls.test, subset: v2, port: {number: 8443}}, weight: 25}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_routed_by_sni_through_a_sidecar_with_a_weighted_canary_sotw() {
    tls_routed_by_sni(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_routed_by_sni_through_a_sidecar_with_a_weighted_canary_delta() {
    tls_routed_by_sni(true).await;
}

async fn tls_routed_by_sni(delta: bool) {
    use kit::tls::{Ca, TlsClient, TlsUpstream};
    const N: usize = 400;
    let fx = Fixture::start(1).await;
    let ca = Ca::new("backends CA");
    let alpha_cert = ca.server(&["alpha.tls.test"]);
    let a1 = TlsUpstream::start(&fx.ip(11), "alpha-v1", &alpha_cert).await;
    let a2 = TlsUpstream::start(&fx.ip(12), "alpha-v2", &alpha_cert).await;
    let b = TlsUpstream::start(&fx.ip(13), "beta", &ca.server(&["beta.tls.test"])).await;
    let (a1http, a2http) = (fx.upstream(11, "alpha-v1-http").await, fx.upstream(12, "alpha-v2-http").await);
    let yaml = render(&render_tls(SNI_SIDECAR, &[("a1", &a1), ("a2", &a2), ("b", &b)]), &[("a1http", &a1http), ("a2http", &a2http)]);
    let rev = fx.apply(&yaml).await;
    let p = fx.sidecar("productpage", 2, 1, delta, rev).await;
    let port: std::net::SocketAddr = format!("{}:8443", p.ip).parse().unwrap();

    // By SNI, each name to its own backends; the backend terminates TLS
    // with its own certificate and sees the client's SNI.
    let beta = TlsClient { ca: &ca, server_name: "beta.tls.test", certificate: None, alpn: &["http/1.1"] };
    assert_eq!(wait_tls(&beta, port).await, "beta");
    assert_eq!(tls_load(&beta, port, 20, 4).await, BTreeMap::from([("beta".to_string(), 20)]));
    assert!(b.sni().iter().all(|s| s.as_deref() == Some("beta.tls.test")), "{:?}", b.sni());

    // alpha: 75/25 between v1 and v2, per connection.
    let alpha = TlsClient { server_name: "alpha.tls.test", ..beta };
    wait_tls(&alpha, port).await;
    let t = tls_load(&alpha, port, N, 8).await;
    let v1 = t.get("alpha-v1").copied().unwrap_or(0);
    let v2 = t.get("alpha-v2").copied().unwrap_or(0);
    assert_eq!(v1 + v2, N, "only alpha-v1 and alpha-v2: {t:?}");
    let share = v1 as f64 / N as f64;
    eprintln!("TLS canary by SNI: v1 {v1}, v2 {v2} of {N} ({:.1}% v1)", share * 100.0);
    assert!((0.68..=0.82).contains(&share), "v1 share {share:.3} not 75±7%: {t:?}");
    assert!(a1.sni().iter().chain(a2.sni().iter()).all(|s| s.as_deref() == Some("alpha.tls.test")));

    // An SNI name no service has: no chain matches, the connection is closed.
    let stranger = TlsClient { server_name: "gamma.tls.test", ..beta };
    assert!(stranger.get(port, "gamma.tls.test", "/").await.is_err(), "an unknown SNI name was passed through");

    // The same VirtualService's http section routes HTTP on 8080.
    let replies = load(&fx.client, &p.url(8080, "/"), "alpha.tls.test", &[], 20, 4).await;
    assert_eq!(tally(&replies), BTreeMap::from([("200 alpha-v2-http".to_string(), 20)]));
    assert!(a1http.requests().is_empty());
    assert_eq!(syncz_protocol(&p).await, if delta { "delta" } else { "sotw" });
    p.envoy.assert_no_rejections().await;
}

/// An ingress gateway passing TLS through by SNI to two backends that
/// terminate it (Istio's "ingress gateway without TLS termination" task).
const PASSTHROUGH_GATEWAY: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: passthrough, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8443, name: tls, protocol: TLS}
    tls: {mode: PASSTHROUGH}
    hosts: [a.passthrough.test, b.passthrough.test]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: passthrough, namespace: default}
spec:
  hosts: [a.passthrough.test, b.passthrough.test]
  gateways: [passthrough]
  tls:
  - match: [{port: 8443, sniHosts: [a.passthrough.test]}]
    route: [{destination: {host: backend-a.default.svc.cluster.local, port: {number: 9443}}}]
  - match: [{port: 8443, sniHosts: [b.passthrough.test]}]
    route: [{destination: {host: backend-b.default.svc.cluster.local}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend-a, namespace: default}
spec:
  hosts: [backend-a.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9443, name: tls, protocol: TLS}]
  endpoints: [{address: ${a.ip}, ports: {tls: ${a.port}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: backend-b, namespace: default}
spec:
  hosts: [backend-b.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9443, name: tls, protocol: TLS}]
  endpoints: [{address: ${b.ip}, ports: {tls: ${b.port}}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_passes_tls_through_by_sni() {
    use kit::tls::{Ca, TlsClient, TlsUpstream};
    let fx = Fixture::start(1).await;
    let ca = Ca::new("backends CA");
    let a = TlsUpstream::start(&fx.ip(11), "backend-a", &ca.server(&["a.passthrough.test"])).await;
    let b = TlsUpstream::start(&fx.ip(12), "backend-b", &ca.server(&["b.passthrough.test"])).await;
    let rev = fx.apply(&render_tls(PASSTHROUGH_GATEWAY, &[("a", &a), ("b", &b)])).await;
    // No HTTP server, so no RDS: in sync (nothing NACKed) for the rest.
    let p = fx.proxy_of_types(ingress_gateway_options(&fx), 1, rev, &["CDS", "EDS", "LDS"]).await;
    let port: std::net::SocketAddr = format!("{}:8443", p.ip).parse().unwrap();

    // Each SNI name lands on its backend, which presents its own
    // certificate (the client verifies it for that name).
    for (name, identity, backend) in [("a.passthrough.test", "backend-a", &a), ("b.passthrough.test", "backend-b", &b)] {
        let client = TlsClient { ca: &ca, server_name: name, certificate: None, alpn: &["http/1.1"] };
        assert_eq!(wait_tls(&client, port).await, identity);
        assert_eq!(tls_load(&client, port, 20, 4).await, BTreeMap::from([(identity.to_string(), 20)]), "{name}");
        assert!(backend.sni().iter().all(|s| s.as_deref() == Some(name)), "{:?}", backend.sni());
    }
    // A name the gateway does not pass through is closed.
    let other = TlsClient { ca: &ca, server_name: "c.passthrough.test", certificate: None, alpn: &[] };
    assert!(other.get(port, "c.passthrough.test", "/").await.is_err());
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// Delegation: a root VirtualService on the gateway hands /reviews to a
// child owned by another team; a change to the child alone moves traffic.

const DELEGATION: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bookinfo-gateway, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: [bookinfo.example.test]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: bookinfo, namespace: default}
spec:
  hosts: [bookinfo.example.test]
  gateways: [bookinfo-gateway]
  http:
  - match: [{uri: {prefix: /reviews}}]
    delegate: {name: reviews, namespace: team-reviews}
  - route: [{destination: {host: productpage.default.svc.cluster.local}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: team-reviews}
spec:
  hosts: [reviews.team-reviews.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: ${v1.ip}, ports: {http: ${v1.port}}, labels: {version: v1}}
  - {address: ${v2.ip}, ports: {http: ${v2.port}}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: team-reviews}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: productpage, namespace: default}
spec:
  hosts: [productpage.default.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints: [{address: ${pp.ip}, ports: {http: ${pp.port}}}]
"#;

fn reviews_child(subset: &str) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: team-reviews}}
spec:
  http:
  - match: [{{uri: {{prefix: /reviews/beta}}}}]
    route: [{{destination: {{host: reviews, subset: v2}}}}]
  - route: [{{destination: {{host: reviews, subset: {subset}}}}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegated_routes_follow_the_child() {
    let fx = Fixture::start(1).await;
    let (v1, v2, pp) = (fx.upstream(11, "reviews-v1").await, fx.upstream(12, "reviews-v2").await, fx.upstream(13, "productpage").await);
    let base = render(DELEGATION, &[("v1", &v1), ("v2", &v2), ("pp", &pp)]);
    let rev = fx.apply(&format!("{base}---{}", reviews_child("v1"))).await;
    let p = ingress_gateway(&fx, rev).await;
    let host = "bookinfo.example.test";
    let at = |path: &str| p.url(8080, path);

    // The child's routes under the root's /reviews, in the child's order.
    wait_for(&fx.client, &at("/reviews/1"), host, &[], "reviews via the child", |r| r.status == 200).await;
    assert_eq!(tally(&load(&fx.client, &at("/reviews/1"), host, &[], 20, 4).await), BTreeMap::from([("200 reviews-v1".to_string(), 20)]));
    assert_eq!(tally(&load(&fx.client, &at("/reviews/beta/1"), host, &[], 10, 2).await), BTreeMap::from([("200 reviews-v2".to_string(), 10)]));
    assert_eq!(get(&fx.client, &at("/other"), host, &[]).await.body, "productpage");

    // Only the child changes: traffic moves.
    let rev = fx.apply(&reviews_child("v2")).await;
    p.wait_synced(rev).await;
    assert_eq!(tally(&load(&fx.client, &at("/reviews/1"), host, &[], 20, 4).await), BTreeMap::from([("200 reviews-v2".to_string(), 20)]));

    // The child goes: the delegating route goes with it, so /reviews falls
    // through to the root's next route.
    let r = fx.client.delete(format!("{}/v1/resources/vs/team-reviews/reviews", fx.api(1))).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().await.unwrap();
    p.wait_synced(body["revision"].as_u64().expect("revision")).await;
    assert_eq!(tally(&load(&fx.client, &at("/reviews/1"), host, &[], 10, 2).await), BTreeMap::from([("200 productpage".to_string(), 10)]));
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// TCP split by weight: each connection goes to one subset (tcp_proxy
// weighted clusters).

const TCP_SPLIT: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: db, namespace: default}
spec:
  hosts: [db.tcp.test]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 5433, name: tcp-db, protocol: TCP}]
  endpoints:
  - {address: ${v1.ip}, ports: {tcp-db: ${v1.port}}, labels: {version: v1}}
  - {address: ${v2.ip}, ports: {tcp-db: ${v2.port}}, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: db, namespace: default}
spec:
  host: db.tcp.test
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: db, namespace: default}
spec:
  hosts: [db.tcp.test]
  tcp:
  - match: [{port: 5433}]
    route:
    - {destination: {host: db.tcp.test, subset: v1}, weight: 80}
    - {destination: {host: db.tcp.test, subset: v2}, weight: 20}
"#;

/// One HTTP/1.1 exchange on a new TCP connection: the body, or why not.
async fn over_new_connection(addr: std::net::SocketAddr) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: db.tcp.test\r\nconnection: close\r\n\r\n").await.map_err(|e| format!("send: {e}"))?;
        let mut raw = Vec::new();
        tcp.read_to_end(&mut raw).await.map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).ok_or_else(|| format!("no answer: {text:?}"))
    };
    tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| "timed out".to_string())?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_split_by_weight_over_connections() {
    use futures::StreamExt;
    const N: usize = 1000;
    let fx = Fixture::start(1).await;
    let (v1, v2) = (fx.upstream(11, "db-v1").await, fx.upstream(12, "db-v2").await);
    let rev = fx.apply(&render(TCP_SPLIT, &[("v1", &v1), ("v2", &v2)])).await;
    // Only a TCP port, so no RDS.
    let p = fx.proxy_of_types(EnvoyOptions::new("app", &fx.ip(2)), 1, rev, &["CDS", "EDS", "LDS"]).await;
    let addr: std::net::SocketAddr = format!("{}:5433", p.ip).parse().unwrap();
    kit::until(&format!("an answer on {addr}"), BOUND, || async { over_new_connection(addr).await.is_ok() }).await;
    let replies: Vec<String> = futures::stream::iter(0..N)
        .map(|_| async move { over_new_connection(addr).await.unwrap_or_else(|e| format!("error: {e}")) })
        .buffer_unordered(8)
        .collect()
        .await;
    let mut t: BTreeMap<String, usize> = BTreeMap::new();
    for r in replies {
        *t.entry(r).or_insert(0) += 1;
    }
    let n1 = t.get("db-v1").copied().unwrap_or(0);
    let n2 = t.get("db-v2").copied().unwrap_or(0);
    assert_eq!(n1 + n2, N, "only db-v1 and db-v2: {t:?}");
    let share = n1 as f64 / N as f64;
    eprintln!("TCP split: v1 {n1}, v2 {n2} of {N} connections ({:.1}% v1)", share * 100.0);
    assert!((0.75..=0.85).contains(&share), "v1 share {share:.3} not 80±5%: {t:?}");
    p.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// Egress through an egress gateway, as in Istio's egress task with TLS
// passed through: the app's sidecar sends TLS for the external host (by
// SNI) to the egress gateway, which passes it on, by SNI, to the external
// server. One VirtualService, bound to `mesh` and to the gateway, with a
// `tls` route for each.

const EGRESS: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: external, namespace: default}
spec:
  hosts: [external.example.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8443, name: tls, protocol: TLS}]
  endpoints: [{address: ${ext.ip}, ports: {tls: ${ext.port}}}]
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: egressgateway, namespace: default}
spec:
  ports: [{name: tls, number: 8443, protocol: TLS}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: egressgateway-1, namespace: default}
spec: {service: egressgateway, address: ${gw.ip}, port: 8443}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: egressgateway, namespace: default}
spec:
  selector: {istio: egressgateway}
  servers:
  - port: {number: 8443, name: tls, protocol: TLS}
    tls: {mode: PASSTHROUGH}
    hosts: [external.example.test]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: external-through-egress, namespace: default}
spec:
  hosts: [external.example.test]
  gateways: [mesh, egressgateway]
  tls:
  - match: [{gateways: [mesh], port: 8443, sniHosts: [external.example.test]}]
    route: [{destination: {host: egressgateway.default.svc.cluster.local, port: {number: 8443}}}]
  - match: [{gateways: [egressgateway], port: 8443, sniHosts: [external.example.test]}]
    route: [{destination: {host: external.example.test, port: {number: 8443}}}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_gateway_passes_tls_by_sni() {
    use kit::tls::{Ca, TlsClient, TlsUpstream};
    let fx = Fixture::start(1).await;
    let ca = Ca::new("external CA");
    let ext = TlsUpstream::start(&fx.ip(11), "external", &ca.server(&["external.example.test"])).await;
    // The gateway listens on `.3`, port 8443 (its registry instance).
    let yaml = render_tls(EGRESS, &[("ext", &ext)]).replace("${gw.ip}", &fx.ip(3));
    let rev = fx.apply(&yaml).await;
    let mut o = EnvoyOptions::new("egressgateway", &fx.ip(3));
    o.node_type = "router".into();
    o.labels = vec![("istio".into(), "egressgateway".into())];
    let gateway = fx.proxy_of_types(o, 1, rev, &["CDS", "EDS", "LDS"]).await;
    let app = fx.proxy_of_types(EnvoyOptions::new("app", &fx.ip(2)), 1, rev, &["CDS", "EDS", "LDS"]).await;

    let client = TlsClient { ca: &ca, server_name: "external.example.test", certificate: None, alpn: &["http/1.1"] };
    let port: std::net::SocketAddr = format!("{}:8443", app.ip).parse().unwrap();
    assert_eq!(wait_tls(&client, port).await, "external");
    assert_eq!(tls_load(&client, port, 20, 4).await, BTreeMap::from([("external".to_string(), 20)]));
    assert!(ext.sni().iter().all(|s| s.as_deref() == Some("external.example.test")), "{:?}", ext.sni());
    // Every connection went through the gateway: the sidecar's cluster is
    // the gateway's, the gateway's is the external host's.
    let through_gateway = app.stat("cluster.outbound|8443||egressgateway.default.svc.cluster.local.upstream_cx_total").await;
    let to_external = gateway.stat("cluster.outbound|8443||external.example.test.upstream_cx_total").await;
    assert!(through_gateway >= 21 && to_external >= 21, "sidecar → gateway {through_gateway}, gateway → external {to_external}");
    app.envoy.assert_no_rejections().await;
    gateway.envoy.assert_no_rejections().await;
}

// ---------------------------------------------------------------------------
// TLS origination by a DestinationRule (Istio's "egress TLS origination"
// task): the application speaks plain HTTP to the sidecar, the sidecar
// opens TLS to the external host, verifying it against the CA file and the
// names the rule gives.

const ORIGINATE: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: secure-external, namespace: default}
spec:
  hosts: [secure.external.test]
  location: MESH_EXTERNAL
  resolution: STATIC
  ports: [{number: 8080, name: http, protocol: HTTP, targetPort: ${ext.port}}]
  endpoints: [{address: ${ext.ip}}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: originate-tls, namespace: default}
spec:
  host: secure.external.test
  trafficPolicy:
    portLevelSettings:
    - port: {number: 8080}
      tls: {mode: SIMPLE, caCertificates: ${ca}, sni: secure.external.test, subjectAltNames: [${san}]}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destination_rule_originates_tls_to_an_external_host() {
    use kit::tls::{Ca, TlsUpstream};
    let fx = Fixture::start(1).await;
    let ca = Ca::new("external CA");
    let ext = TlsUpstream::start(&fx.ip(11), "secure-external", &ca.server(&["secure.external.test"])).await;
    let ca_file = ca.write(fx.tmp.path(), "external-ca");
    let config = |san: &str| render_tls(ORIGINATE, &[("ext", &ext)]).replace("${ca}", &ca_file.display().to_string()).replace("${san}", san);
    let rev = fx.apply(&config("secure.external.test")).await;
    let p = fx.proxy_of_types(EnvoyOptions::new("app", &fx.ip(2)), 1, rev, &["CDS", "EDS", "LDS"]).await;
    let url = p.url(8080, "/status");
    let cluster = "outbound|8080||secure.external.test";

    // Plain HTTP in, TLS out: the answer comes from the TLS server, which
    // saw the SNI the rule names.
    wait_for(&fx.client, &url, "secure.external.test", &[], "TLS origination answers", |r| r.status == 200).await;
    let replies = load(&fx.client, &url, "secure.external.test", &[], 20, 4).await;
    assert_eq!(tally(&replies), BTreeMap::from([("200 secure-external".to_string(), 20)]));
    assert!(ext.sni().iter().all(|s| s.as_deref() == Some("secure.external.test")), "{:?}", ext.sni());
    assert!(p.stat(&format!("cluster.{cluster}.ssl.handshake")).await >= 1);

    // A name the server's certificate does not carry fails verification:
    // the sidecar refuses the connection rather than send in the clear or
    // unverified, and says so in its SAN-verification counter.
    let rev = fx.apply(&config("other.external.test")).await;
    p.wait_synced_types(rev, &["CDS", "EDS", "LDS"]).await;
    wait_for(&fx.client, &url, "secure.external.test", &[], "a wrong SAN is refused", |r| r.status == 503).await;
    assert!(p.stat(&format!("cluster.{cluster}.ssl.fail_verify_san")).await >= 1);
    p.envoy.assert_no_rejections().await;
}
