//! EnvoyFilter end to end: real Envoys (one SotW, one delta) patched by
//! EnvoyFilters applied to a replica, and real requests through them.
//!
//! - `productpage` (SotW): a Sidecar ingress on 8000 (Istio's inbound
//!   virtual host `inbound|http|8000`) to an app; Istio's local-rate-limit
//!   sample from the corpus, applied unchanged (root namespace, selector
//!   `app: productpage`).
//! - `a` (delta): outbound to `reviews:9080`; a Lua filter inserted before
//!   the router, a cluster MERGE, a REMOVE at a higher priority.
//!
//! Every phase waits until the proxies ACKed the revision (a NACK fails at
//! once) and ends with no rejected update in either Envoy.

use crate::kit;

use kit::envoy::{EnvoyOptions, Upstream};
use kit::mesh::*;
use serde_json::Value;
use std::path::Path;

const MESH: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: productpage, namespace: default}
spec:
  workloadSelector: {labels: {app: productpage}}
  ingress:
  - port: {number: 8000, protocol: HTTP, name: http}
    defaultEndpoint: ${app.ip}:${app.port}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: reviews, namespace: default}
spec:
  ports: [{name: http, number: 9080, protocol: HTTP}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-1, namespace: default, labels: {app: reviews}}
spec: {service: reviews, address: ${reviews.ip}, port: ${reviews.port}}
"#;

const LUA: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: lua-response, namespace: default}
spec:
  workloadSelector: {labels: {app: a}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.router}
    patch:
      operation: INSERT_BEFORE
      value:
        name: envoy.filters.http.lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code:
            inline_string: |
              function envoy_on_request(h) h:headers():add("x-lua-request", "hello") end
              function envoy_on_response(h) h:headers():add("x-lua", "hello world") end
  - applyTo: CLUSTER
    match:
      context: SIDECAR_OUTBOUND
      cluster: {service: reviews.default.svc.cluster.local, portNumber: 9080}
    patch:
      operation: MERGE
      value: {connect_timeout: 7s}
"#;

/// Runs after `lua-response` (higher priority): removes the filter it added.
const REMOVE_LUA: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: drop-lua, namespace: default}
spec:
  priority: 10
  workloadSelector: {labels: {app: a}}
  configPatches:
  - applyTo: HTTP_FILTER
    match:
      context: SIDECAR_OUTBOUND
      listener:
        filterChain:
          filter:
            name: envoy.filters.network.http_connection_manager
            subFilter: {name: envoy.filters.http.lua}
    patch: {operation: REMOVE}
"#;

const TYPES: &[&str] = &["CDS", "EDS", "LDS", "RDS"];
const INBOUND_TYPES: &[&str] = &["CDS", "EDS", "LDS", "RDS"];

fn corpus(file: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/istio/corpus-38").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The HTTP filter names of the first HCM of listener `name` in a config dump.
fn http_filters(dump: &Value, name: &str) -> Vec<String> {
    let listeners = dump["configs"].as_array().into_iter().flatten().flat_map(|c| c["dynamic_listeners"].as_array().into_iter().flatten());
    let l = listeners.into_iter().find(|l| l["name"] == name).unwrap_or_else(|| panic!("no listener {name}"));
    let chains = l["active_state"]["listener"]["filter_chains"].as_array().cloned().unwrap_or_default();
    chains
        .iter()
        .flat_map(|c| c["filters"].as_array().cloned().unwrap_or_default())
        .find(|f| f["name"] == "envoy.filters.network.http_connection_manager")
        .map(|f| {
            f["typed_config"]["http_filters"].as_array().cloned().unwrap_or_default().iter().map(|h| h["name"].as_str().unwrap_or("").to_string()).collect()
        })
        .unwrap_or_default()
}

fn cluster<'a>(dump: &'a Value, name: &str) -> Option<&'a Value> {
    dump["configs"]
        .as_array()?
        .iter()
        .flat_map(|c| c["dynamic_active_clusters"].as_array().into_iter().flatten())
        .find(|c| c["cluster"]["name"] == name)
        .map(|c| &c["cluster"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoyfilters_patch_real_envoys() {
    let fx = Fixture::start(1).await;
    let app = Upstream::start("127.0.0.1", "productpage-app").await;
    let reviews = fx.upstream(20, "reviews-v1").await;
    let rev = fx.apply(&render(MESH, &[("app", &app), ("reviews", &reviews)])).await;

    let mut o = EnvoyOptions::new("productpage", &fx.ip(41));
    o.labels = vec![("app".into(), "productpage".into())];
    let pp = fx.proxy_of_types(o, 1, rev, INBOUND_TYPES).await;
    let mut o = EnvoyOptions::new("a", &fx.ip(42));
    o.labels = vec![("app".into(), "a".into())];
    o.delta = true;
    let a = fx.proxy_of_types(o, 1, rev, TYPES).await;
    let to_reviews = a.url(9080, "/");
    let host = "reviews.default.svc.cluster.local";
    assert_eq!(get(&fx.client, &to_reviews, host, &[]).await.status, 200);

    // Phase 1: Istio's local rate limit sample, unchanged. Its route patch
    // names the inbound virtual host `inbound|http|8000`: 10 requests a
    // minute to /productpage, then 429 with the sample's header.
    let sample = corpus("envoyfilter-local-ratelimit-sample.yaml");
    // The dry run shows the proxy the filter would change.
    let file = fx.tmp.path().join("ratelimit.yaml");
    std::fs::write(&file, &sample).unwrap();
    let (ok, out, err) = kit::cli(&fx.api(1), &["apply", "-f", file.to_str().unwrap(), "--dry-run"]);
    assert!(ok, "dry run: {out}{err}");
    assert!(out.contains("1 connected proxy would change"), "the dry run names the patched proxy:\n{out}");
    assert!(out.contains("productpage.default") || out.contains(&pp.id), "the dry run names productpage:\n{out}");
    let rev = fx.apply(&sample).await;
    pp.wait_synced_types(rev, INBOUND_TYPES).await;
    let inbound = pp.url(8000, "/productpage");
    let first = wait_for(&fx.client, &inbound, "productpage", &[], "the rate limit headers", |r| r.header("x-ratelimit-limit").is_some()).await;
    assert_eq!(first.status, 200);
    let mut statuses = vec![first.status];
    for _ in 0..12 {
        let r = get(&fx.client, &inbound, "productpage", &[]).await;
        if r.status == 429 {
            assert_eq!(r.header("x-local-rate-limit"), Some("true"), "the sample's response header");
        }
        statuses.push(r.status);
    }
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 10, "10 a minute for /productpage: {statuses:?}");
    assert!(statuses[10..].iter().all(|s| *s == 429), "then 429: {statuses:?}");
    let limited = pp.envoy.stats().await.iter().filter(|(k, _)| k.ends_with("http_local_rate_limit.rate_limited")).map(|(_, v)| *v).sum::<u64>();
    assert!(limited >= 3, "Envoy counts the limited requests: {limited}");
    // Another path is charged to the route's 100-a-minute bucket only.
    assert_eq!(get(&fx.client, &pp.url(8000, "/other"), "productpage", &[]).await.status, 200);

    // Phase 2: a Lua filter before the router (response header) and a
    // cluster MERGE on the delta proxy.
    let rev = fx.apply(LUA).await;
    a.wait_synced_types(rev, TYPES).await;
    let r = wait_for(&fx.client, &to_reviews, host, &[], "the Lua response header", |r| r.header("x-lua").is_some()).await;
    assert_eq!((r.status, r.header("x-lua")), (200, Some("hello world")));
    assert!(reviews.requests().iter().any(|s| s.headers.get("x-lua-request").is_some_and(|v| v == "hello")), "the upstream saw the Lua request header");
    let dump = a.envoy.config_dump().await;
    let filters = http_filters(&dump, &format!("{}_9080", fx.ip(42)));
    let lua = filters.iter().position(|f| f == "envoy.filters.http.lua").expect("lua filter");
    assert_eq!(filters.get(lua + 1).map(String::as_str), Some("envoy.filters.http.router"), "Lua right before the router: {filters:?}");
    let c = cluster(&dump, "outbound|9080||reviews.default.svc.cluster.local").expect("reviews cluster");
    assert_eq!(c["connect_timeout"], "7s", "cluster MERGE: {c:#}");
    // The productpage proxy is not selected: its config has no Lua.
    let pp_filters = http_filters(&pp.envoy.config_dump().await, &format!("{}_9080", fx.ip(41)));
    assert!(pp_filters.contains(&"envoy.filters.http.router".to_string()) && !pp_filters.iter().any(|f| f == "envoy.filters.http.lua"), "{pp_filters:?}");

    // Phase 3: REMOVE at a higher priority drops the filter again.
    let rev = fx.apply(REMOVE_LUA).await;
    a.wait_synced_types(rev, TYPES).await;
    wait_for(&fx.client, &to_reviews, host, &[], "no Lua header", |r| r.status == 200 && r.header("x-lua").is_none()).await;
    let filters = http_filters(&a.envoy.config_dump().await, &format!("{}_9080", fx.ip(42)));
    assert!(!filters.iter().any(|f| f == "envoy.filters.http.lua"), "removed: {filters:?}");

    // Phase 4: deleting the filters restores the generated config.
    for name in ["drop-lua", "lua-response"] {
        let r = fx.client.delete(format!("{}/v1/resources/envoyfilters/default/{name}", fx.api(1))).send().await.unwrap();
        assert!(r.status().is_success(), "delete {name}: {}", r.status());
    }
    let (_, listed) = kit::get_json(&fx.client, &format!("{}/v1/resources/envoyfilters", fx.api(1))).await;
    let names: Vec<&str> = listed["items"].as_array().into_iter().flatten().filter_map(|o| o["metadata"]["name"].as_str()).collect();
    assert_eq!(names, vec!["filter-local-ratelimit-svc"], "list: {listed:#}");
    let rev = fx.apply(LUA.replace("7s", "3s").as_str()).await;
    a.wait_synced_types(rev, TYPES).await;
    let c = cluster(&a.envoy.config_dump().await, "outbound|9080||reviews.default.svc.cluster.local").cloned().expect("reviews cluster");
    assert_eq!(c["connect_timeout"], "3s");

    // Bad input is refused at apply, naming the field; nothing is stored.
    let bad_type = LUA.replace("envoy.extensions.filters.http.lua.v3.Lua", "envoy.extensions.filters.http.nosuch.v3.Lua").replace("lua-response", "bad-type");
    let (status, body) = kit::apply(&fx.client, &fx.api(1), bad_type.as_str()).await;
    assert_eq!(status, 400, "{body:#}");
    assert!(body.to_string().contains("spec.configPatches[0].patch.value.typed_config.@type"), "names the field: {body:#}");
    assert!(body.to_string().contains("unknown type URL"), "{body:#}");
    let bad_field = LUA.replace("default_source_code", "default_source_cod").replace("lua-response", "bad-field");
    let file = fx.tmp.path().join("bad-field.yaml");
    std::fs::write(&file, &bad_field).unwrap();
    let (ok, out, err) = kit::cli(&fx.api(1), &["apply", "-f", file.to_str().unwrap()]);
    assert!(!ok, "refused: {out}");
    assert!(err.contains("spec.configPatches[0].patch.value.typed_config.default_source_cod"), "names the field: {err}");
    let bad_cluster = LUA.replace("connect_timeout: 7s", "connect_timeout: 7s, no_such_field: 1").replace("lua-response", "bad-cluster");
    let (status, body) = kit::apply(&fx.client, &fx.api(1), bad_cluster.as_str()).await;
    assert_eq!(status, 400, "{body:#}");
    assert!(body.to_string().contains("spec.configPatches[1].patch.value.no_such_field"), "{body:#}");
    for name in ["bad-type", "bad-field", "bad-cluster"] {
        let (status, _) = kit::get_json(&fx.client, &format!("{}/v1/resources/envoyfilters/default/{name}", fx.api(1))).await;
        assert_eq!(status, 404, "{name} was not stored");
    }

    pp.envoy.assert_no_rejections().await;
    a.envoy.assert_no_rejections().await;
}
