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

// ---------------------------------------------------------------------------
// Istio's global rate limit task at an ingress gateway, against a rate
// limit service of our own (Envoy's `envoy.service.ratelimit.v3` protocol).

const GATEWAY: &str = r#"
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: bookinfo-gateway, namespace: default}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: productpage, namespace: default}
spec:
  ports: [{name: http, number: 9080, protocol: HTTP}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: productpage-1, namespace: default}
spec: {service: productpage, address: ${app.ip}, port: ${app.port}}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: ratelimit, namespace: default}
spec:
  ports: [{name: grpc-port, number: 8081, protocol: GRPC}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ratelimit-1, namespace: default}
spec: {service: ratelimit, address: RL_IP, ports: {grpc-port: RL_PORT}}
"#;

/// The task's descriptor config (`ratelimit-config.yaml`, domain
/// `ratelimit`): `(PATH, /productpage)` 1 a minute, `(PATH, api)` 2, any
/// other PATH 100. Counts never reset (a test is well within a minute).
#[derive(Default)]
struct Limiter {
    counts: std::sync::Mutex<std::collections::BTreeMap<String, u32>>,
    calls: std::sync::atomic::AtomicUsize,
}

/// The gRPC service over a shared [`Limiter`].
struct Rls(std::sync::Arc<Limiter>);

#[tonic::async_trait]
impl envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService for Rls {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest>,
    ) -> Result<tonic::Response<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse>, tonic::Status> {
        use envoy_types::pb::envoy::service::ratelimit::v3::{rate_limit_response::Code, RateLimitResponse};
        self.0.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let r = request.into_inner();
        if r.domain != "ratelimit" {
            return Err(tonic::Status::invalid_argument(format!("domain {:?}", r.domain)));
        }
        let mut over = false;
        let mut counts = self.0.counts.lock().unwrap();
        for e in r.descriptors.iter().flat_map(|d| d.entries.iter()).filter(|e| e.key == "PATH") {
            let limit = match e.value.as_str() {
                "/productpage" => 1,
                "api" => 2,
                _ => 100,
            };
            let n = counts.entry(e.value.clone()).or_insert(0);
            *n += 1;
            over |= *n > limit;
        }
        let code = if over { Code::OverLimit } else { Code::Ok };
        Ok(tonic::Response::new(RateLimitResponse { overall_code: code as i32, ..Default::default() }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_rate_limit_at_the_ingress_gateway() {
    let fx = Fixture::start(1).await;
    let app = Upstream::start(&fx.ip(30), "productpage").await;
    let limiter = std::sync::Arc::new(Limiter::default());
    let listener = tokio::net::TcpListener::bind(format!("{}:0", fx.ip(31))).await.unwrap();
    let rl = listener.local_addr().unwrap();
    let svc = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer::new(Rls(limiter.clone()));
    let server =
        tokio::spawn(tonic::transport::Server::builder().add_service(svc).serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)));
    let mesh = render(GATEWAY, &[("app", &app)]).replace("RL_IP", &rl.ip().to_string()).replace("RL_PORT", &rl.port().to_string());
    // The task's files, unchanged: three EnvoyFilters and the VirtualService.
    let rev = fx.apply(&format!("{mesh}---\n{}", corpus("envoyfilter-global-ratelimit-gateway.yaml"))).await;
    let mut o = EnvoyOptions::new("ingress", &fx.ip(40));
    o.namespace = "istio-system".into();
    o.node_type = "router".into();
    o.labels = vec![("istio".into(), "ingressgateway".into())];
    o.delta = true;
    let gw = fx.proxy_of_types(o, 1, rev, TYPES).await;

    let url = |p: &str| gw.url(8080, p);
    let first = wait_for(&fx.client, &url("/productpage"), "bookinfo.example.com", &[], "the rate limit service is asked", |r| r.status == 200).await;
    assert_eq!(first.body.trim(), "productpage");
    assert!(limiter.calls.load(std::sync::atomic::Ordering::SeqCst) >= 1, "Envoy asked the rate limit service");
    let r = get(&fx.client, &url("/productpage"), "bookinfo.example.com", &[]).await;
    assert_eq!((r.status, r.header("x-envoy-ratelimited")), (429, Some("true")), "(PATH, /productpage): 1 a minute");
    // The route named `api` sends (PATH, api) only (its own rate_limits
    // replace the virtual host's): 2 a minute across product ids.
    let statuses: Vec<u16> = futures::future::join_all((1..=3).map(|i| {
        let (client, u) = (fx.client.clone(), url(&format!("/api/v1/products/{i}")));
        async move { get(&client, &u, "bookinfo.example.com", &[]).await.status }
    }))
    .await;
    let mut sorted = statuses.clone();
    sorted.sort();
    assert_eq!(sorted, vec![200, 200, 429], "{statuses:?}");
    assert_eq!(limiter.counts.lock().unwrap().get("api"), Some(&3));
    assert!(!limiter.counts.lock().unwrap().contains_key("/api/v1/products/1"), "the vhost action is not applied to the api route");
    gw.envoy.assert_no_rejections().await;
    server.abort();
}

// ---------------------------------------------------------------------------
// EXTENSION_CONFIG: a filter config served over ECDS, named by an HTTP
// filter's `config_discovery`, to a SotW and a delta Envoy.

const REVIEWS: &str = r#"
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

/// Every proxy of `default`: a Lua config over ECDS (`VERSION` in its
/// response header), and the HTTP filter that asks for it before the router.
const ECDS_LUA: &str = r#"
apiVersion: networking.istio.io/v1alpha3
kind: EnvoyFilter
metadata: {name: ecds-lua, namespace: default}
spec:
  configPatches:
  - applyTo: EXTENSION_CONFIG
    patch:
      operation: ADD
      value:
        name: lodestar.ecds-lua
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
          default_source_code:
            inline_string: 'function envoy_on_response(h) h:headers():add("x-ecds", "VERSION") end'
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
        name: lodestar.ecds-lua
        config_discovery:
          config_source: {ads: {}, resource_api_version: V3}
          type_urls: [type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua]
"#;

const ECDS_TYPES: &[&str] = &["CDS", "EDS", "LDS", "RDS", "ECDS"];

/// The ECDS filters in a config dump: (name, version_info).
fn ecds_filters(dump: &Value) -> Vec<(String, String)> {
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|c| c["ecds_filters"].as_array().into_iter().flatten())
        .map(|f| (f["ecds_filter"]["name"].as_str().unwrap_or("").to_string(), f["version_info"].as_str().unwrap_or("").to_string()))
        .collect()
}

/// The version_info of listener `name` in a config dump.
fn listener_version(dump: &Value, name: &str) -> String {
    let listeners = dump["configs"].as_array().into_iter().flatten().flat_map(|c| c["dynamic_listeners"].as_array().into_iter().flatten());
    let l = listeners.into_iter().find(|l| l["name"] == name).unwrap_or_else(|| panic!("no listener {name}"));
    l["active_state"]["version_info"].as_str().unwrap_or("").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_config_over_ecds() {
    let fx = Fixture::start(1).await;
    let reviews = fx.upstream(20, "reviews-v1").await;
    let rev = fx.apply(&render(REVIEWS, &[("reviews", &reviews)])).await;
    let sotw = fx.sidecar("e1", 50, 1, false, rev).await;
    let delta = fx.sidecar("e2", 51, 1, true, rev).await;
    let host = "reviews.default.svc.cluster.local";

    // The filter and its config arrive together: Envoy asks for the
    // config by the filter's name while it takes the listener naming it
    // (before it ACKs that), so `apply --wait` returns only once both
    // proxies ACKed the extension config too.
    let file = fx.tmp.path().join("ecds.yaml");
    std::fs::write(&file, ECDS_LUA.replace("VERSION", "v1")).unwrap();
    let (ok, out, err) = kit::cli(&fx.api(1), &["apply", "-f", file.to_str().unwrap(), "--wait"]);
    assert!(ok, "apply --wait: {out}{err}");
    let s = syncz(&fx.client, &fx.api(1)).await;
    for p in [&sotw, &delta] {
        let status = s["proxies"].as_array().and_then(|ps| ps.iter().find(|x| x["id"] == p.id.as_str())).expect("the proxy in syncz");
        let ecds = &status["types"]["ECDS"];
        assert!(ecds["in_sync"] == true && ecds["last_nack"].is_null(), "{}: ECDS ACKed when --wait returns: {status:#}", p.id);
        let r = wait_for(&fx.client, &p.url(9080, "/"), host, &[], "the ECDS Lua header", |r| r.header("x-ecds").is_some()).await;
        assert_eq!((r.status, r.header("x-ecds")), (200, Some("v1")), "{}", p.id);
        let dump = p.envoy.config_dump().await;
        let filters = ecds_filters(&dump);
        assert_eq!(filters.len(), 1, "{}: one ECDS filter: {filters:?}", p.id);
        assert_eq!(filters[0].0, "lodestar.ecds-lua");
        let names = http_filters(&dump, &format!("{}_9080", p.ip));
        let at = names.iter().position(|f| f == "lodestar.ecds-lua").unwrap_or_else(|| panic!("{}: no ECDS filter in {names:?}", p.id));
        assert_eq!(names.get(at + 1).map(String::as_str), Some("envoy.filters.http.router"), "{names:?}");
        assert!(p.envoy.stats().await.iter().any(|(k, v)| k.contains("extension_config_discovery") && k.ends_with("config_reload") && *v >= 1), "{}", p.id);
    }

    // A new config reaches Envoy over ECDS alone: the listeners stay as
    // they were (same version), the traffic changes.
    let listener = |p: &kit::mesh::Proxy| format!("{}_9080", p.ip);
    let before = [listener_version(&sotw.envoy.config_dump().await, &listener(&sotw)), listener_version(&delta.envoy.config_dump().await, &listener(&delta))];
    let ecds_before = ecds_filters(&sotw.envoy.config_dump().await);
    let (status, answer) = kit::apply(&fx.client, &fx.api(1), ECDS_LUA.replace("VERSION", "v2").as_str()).await;
    assert_eq!(status, 200, "{answer:#}");
    let rev = answer["revision"].as_u64().unwrap();
    // The apply answer carries Istio's analysis of the filter: its
    // INSERT_BEFORE without a priority is IST0151.
    let warnings = answer["warnings"].to_string();
    assert!(warnings.contains("Warning [IST0151] (EnvoyFilter default/ecds-lua) This EnvoyFilter does not have a priority"), "{warnings}");
    for (p, lv) in [(&sotw, &before[0]), (&delta, &before[1])] {
        p.wait_synced_types(rev, ECDS_TYPES).await;
        let r = wait_for(&fx.client, &p.url(9080, "/"), host, &[], "the new ECDS Lua header", |r| r.header("x-ecds") == Some("v2")).await;
        assert_eq!(r.status, 200);
        let dump = p.envoy.config_dump().await;
        assert_eq!(&listener_version(&dump, &listener(p)), lv, "{}: the listener was not pushed again", p.id);
        assert_eq!(ecds_filters(&dump).len(), 1);
    }
    assert_ne!(ecds_filters(&sotw.envoy.config_dump().await), ecds_before, "the ECDS resource has a new version");

    // The config dump of the replica shows the served ECDS resource.
    let (status, dump) = kit::get_json(&fx.client, &format!("{}/debug/config_dump?proxyID={}&type=extension_config", fx.api(1), sotw.id)).await;
    assert_eq!(status, 200, "{dump:#}");
    assert_eq!(dump["extensionConfigs"][0]["name"], "lodestar.ecds-lua", "{dump:#}");

    // Deleting the filter drops the HTTP filter and its config.
    let r = fx.client.delete(format!("{}/v1/resources/envoyfilters/default/ecds-lua", fx.api(1))).send().await.unwrap();
    assert!(r.status().is_success(), "delete: {}", r.status());
    for p in [&sotw, &delta] {
        let r = wait_for(&fx.client, &p.url(9080, "/"), host, &[], "no ECDS header", |r| r.header("x-ecds").is_none()).await;
        assert_eq!(r.status, 200, "{}", p.id);
        let names = http_filters(&p.envoy.config_dump().await, &format!("{}_9080", p.ip));
        assert!(!names.iter().any(|f| f == "lodestar.ecds-lua"), "{}: {names:?}", p.id);
    }

    // Bad input: an extension config without the name filters ask for, and
    // BOOTSTRAP, are refused naming the field; nothing is stored.
    let no_name = ECDS_LUA.replace("        name: lodestar.ecds-lua\n        typed_config", "        typed_config").replace("ecds-lua,", "no-name,");
    let (status, body) = kit::apply(&fx.client, &fx.api(1), no_name.as_str()).await;
    assert_eq!(status, 400, "{body:#}");
    assert!(body.to_string().contains("spec.configPatches[0].patch.value.name"), "names the field: {body:#}");
    let bootstrap = "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: boot, namespace: default}\nspec:\n  configPatches:\n  - applyTo: BOOTSTRAP\n    patch: {operation: MERGE, value: {node: {id: x}}}\n";
    let (status, body) = kit::apply(&fx.client, &fx.api(1), bootstrap).await;
    assert_eq!(status, 400, "{body:#}");
    assert!(body.to_string().contains("spec.configPatches[0].applyTo") && body.to_string().contains("BOOTSTRAP"), "{body:#}");
    for name in ["no-name", "boot"] {
        let (status, _) = kit::get_json(&fx.client, &format!("{}/v1/resources/envoyfilters/default/{name}", fx.api(1))).await;
        assert_eq!(status, 404, "{name} was not stored");
    }

    sotw.envoy.assert_no_rejections().await;
    delta.envoy.assert_no_rejections().await;
}
