//! The Gateway API status stored with the objects (issue 39): the leader
//! computes it and writes only what changed (`gateway_status`, `Op::Status`);
//! every replica answers get and watch from the store; a status write keeps
//! the generation and is no push (`xds::push::debounce` skips it). Three
//! real replicas, a real gateway Envoy on a follower.

use crate::gateway_api::with_status;
use crate::kit;
use kit::envoy::EnvoyOptions;
use kit::mesh::*;
use serde_json::Value;
use std::time::Duration;

const SETUP: &str = r#"apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: lodestar}
spec: {controllerName: lodestar.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: web, namespace: shop}
spec:
  gatewayClassName: lodestar
  listeners:
  - {name: http, port: 8080, protocol: HTTP}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, number: 80, protocol: HTTP}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: shop}
spec:
  parentRefs: [{name: web}]
  rules:
  - matches: [{path: {type: PathPrefix, value: /new}}]
    backendRefs: [{name: later, port: 80}]
  - backendRefs: [{name: web, port: 80}]
"#;

/// The route's condition `kind` for its first parent.
fn condition(route: &Value, kind: &str) -> Value {
    route["status"]["parents"][0]["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == kind).cloned().unwrap_or_default()
}

/// The stream of `id` on `api`'s replica, as `/debug/syncz` shows it.
async fn stream(fx: &Fixture, api: &str, id: &str) -> Value {
    let s = syncz(&fx.client, api).await;
    s["proxies"].as_array().and_then(|ps| ps.iter().find(|p| p["id"] == id).cloned()).unwrap_or_default()
}

/// The next NDJSON event of a watch.
async fn next_event(resp: &mut reqwest::Response, buf: &mut String) -> Value {
    loop {
        if let Some(i) = buf.find('\n') {
            let line: Value = serde_json::from_str(&buf[..i]).unwrap();
            buf.drain(..=i);
            return line;
        }
        let chunk = tokio::time::timeout(BOUND, resp.chunk()).await.expect("a watch event in time").unwrap().expect("the watch is open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

/// A route with a backend that does not exist: its stored status says
/// BackendNotFound on a follower's get, `lodestar get -o yaml` and a
/// follower's watch; creating the backend flips it to True without
/// bumping the route's generation; the status-only revision pushes
/// nothing to the gateway Envoy (its stream stays at the backend's
/// revision) and `wait` for it is answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_is_stored_watched_everywhere_and_pushes_nothing() {
    let fx = Fixture::start(3).await;
    let leader = fx.cluster.wait_for_leader(BOUND).await;
    let follower = (1..=3).find(|&i| i != leader).unwrap();
    let api = fx.api(follower);
    let up = fx.upstream(10, "web-1").await;
    let rev = fx
        .apply(&format!(
            "{SETUP}---\napiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: web-1, namespace: shop}}\nspec: {{service: web, address: \"{}\", ports: {{http: {}}}}}\n",
            up.addr.ip(),
            up.addr.port()
        ))
        .await;
    let mut watch = fx.client.get(format!("{api}/v1/watch?fromRevision={rev}&namespace=shop")).send().await.unwrap();
    assert_eq!(watch.status(), 200);
    let mut o = EnvoyOptions::new("web", &fx.ip(2));
    o.node_type = "router".into();
    o.namespace = "shop".into();
    o.labels = vec![(lodestar::translate::gateway_api::NAME_LABEL.into(), "web".into())];
    let p = fx.proxy(o, follower, rev).await;

    // The follower answers with the status the leader wrote.
    let url = format!("{api}/v1/resources/httproutes/shop/web");
    let route = with_status(&fx.client, &url, |r| condition(r, "ResolvedRefs")["reason"] == "BackendNotFound").await;
    assert_eq!(condition(&route, "ResolvedRefs")["status"], "False", "{route}");
    assert_eq!(condition(&route, "Accepted")["status"], "True", "{route}");
    assert_eq!((route["metadata"]["generation"].as_u64(), condition(&route, "ResolvedRefs")["observedGeneration"].as_u64()), (Some(1), Some(1)), "{route}");
    let gtw = with_status(&fx.client, &format!("{api}/v1/resources/gtw/shop/web"), |_| true).await;
    assert_eq!(gtw["status"]["listeners"][0]["attachedRoutes"], 1, "{gtw}");
    assert_eq!(gtw["metadata"]["generation"], 1, "{gtw}");
    let (ok, out, err) = kit::cli(&api, &["get", "httproute", "web", "-n", "shop", "-o", "yaml"]);
    assert!(ok && out.contains("reason: BackendNotFound"), "{out}{err}");
    // Written by the leader, as itself.
    let (_, history) = kit::get_json(&fx.client, &format!("{api}/v1/history?namespace=shop")).await;
    assert!(history.to_string().contains(&format!("replica:{leader}/gateway-status")), "{history:#}");

    // The backend appears: a spec change (pushed), then a status-only
    // revision (not pushed).
    let backend = fx.apply("apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: later, namespace: shop}\nspec: {ports: [{name: http, number: 80, protocol: HTTP}]}\n").await;
    let route = with_status(&fx.client, &url, |r| condition(r, "ResolvedRefs")["status"] == "True").await;
    let status_revision = route["metadata"]["modRevision"].as_u64().unwrap();
    assert!(status_revision > backend, "{route}");
    assert_eq!((route["metadata"]["generation"].as_u64(), condition(&route, "ResolvedRefs")["observedGeneration"].as_u64()), (Some(1), Some(1)), "{route}");
    assert_eq!(condition(&route, "ResolvedRefs")["reason"], "ResolvedRefs", "{route}");
    p.wait_synced(backend).await;
    // `wait` for the status revision: answered by the ACKs of `backend`.
    let (code, w) = kit::get_json(&fx.client, &format!("{api}/v1/wait?revision={status_revision}&timeout=5s")).await;
    assert!(code == 200 && w["converged"] == true, "{w}");
    // The Envoy's stream was never woken for it: still at the backend's
    // revision, with no response since (let a debounce window pass).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let s = stream(&fx, &api, &p.id).await;
    let pushes = |s: &Value| TYPES.map(|t| s["types"][t]["pushes"].as_u64().unwrap_or(0));
    assert_eq!((s["revision"].as_u64(), s["pushed_revision"].as_u64()), (Some(backend), Some(backend)), "a status-only revision reached the stream: {s:#}");
    let before = pushes(&s);
    // Nothing else happens until a spec changes.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(pushes(&stream(&fx, &api, &p.id).await), before);
    p.envoy.assert_no_rejections().await;

    // The follower's watch delivered both statuses, in order.
    let mut buf = String::new();
    let mut seen = Vec::new();
    while !seen.contains(&"True".to_string()) {
        let e = next_event(&mut watch, &mut buf).await;
        if e["object"]["kind"] == "HTTPRoute" {
            let c = condition(&e["object"], "ResolvedRefs");
            seen.push(c["status"].as_str().unwrap_or("none").to_string());
            assert_eq!(e["object"]["metadata"]["generation"], 1, "{e}");
        }
    }
    assert_eq!(seen.iter().filter(|s| *s != "none").cloned().collect::<Vec<_>>(), ["False", "True"], "route events: {seen:?}");
}
