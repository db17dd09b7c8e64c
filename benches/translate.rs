//! Translation cost for one proxy in a mesh of 1,000 services, each with a
//! VirtualService (header match + 80/20 split), a DestinationRule (two
//! subsets) and two registry instances.
//!
//! - `full`: a cold translator builds the mesh and translates everything.
//! - `incremental_one_vs`: a warm translator after one VirtualService
//!   changed (a new store revision): what a push costs.
//!
//! - `*_captured`: the same proxy with its traffic captured
//!   (`INTERCEPTION_MODE: REDIRECT`: virtual listeners); a VirtualService
//!   change translates it in full.
//!
//! - `*_half_tls`: the same mesh where every other service is a TLS
//!   service on port 443 (no HTTP port) whose VirtualService has a `tls`
//!   route split 80/20 by SNI: SNI filter chains instead of virtual hosts.
//!   `incremental_one_vs_half_tls` changes an HTTP service's VirtualService
//!   (the incremental path); `tls_vs_change_half_tls` a TLS one (the
//!   incremental path rebuilds the 443 listener's SNI chains).
//!
//! - `authz_*`: the same 1,000-service mesh (HTTP) plus 1,000
//!   AuthorizationPolicies (three rules each; 10 select the proxy, which
//!   has a Sidecar ingress port, the others one service's workload each):
//!   `authz_full` from cold, `authz_one_policy_selecting` after one of the
//!   proxy's own policies changed (its inbound listener is rebuilt),
//!   `authz_one_policy_other` after another workload's changed (nothing to
//!   translate).
//!
//! - `analyze_store`: `lodestar analyze` on the whole store (the HTTP
//!   mesh: 5 resources per service); `analyze_one_write`: the analysis an
//!   apply of one VirtualService adds to its answer (`analyze::on_write`).
//!   Issue 35's target is 10,000 resources in 200 ms:
//!   `LODESTAR_BENCH_SERVICES=2000 cargo bench --bench translate -- analyze`.
//!
//! - `dryrun_one_vs`: the per-proxy part of `apply --dry-run` for one
//!   VirtualService change with 1,000 connected sidecars (ten apps, one
//!   address each; LODESTAR_BENCH_PROXIES for another count), forking a
//!   translator that serves them all: every proxy sees the changed host.
//!   `dryrun_one_vs_scoped`: the same with a Sidecar per app naming a
//!   tenth of the services, so the change reaches 100 of the 1,000.
//!   Each also prints p50/p99 over 20 previews; LODESTAR_BENCH_COLD=1
//!   adds one preview without the served translator.
//!
//! - `envoyfilter_*`: the HTTP mesh plus 50 EnvoyFilters of mixed
//!   operations (Lua INSERT_BEFORE the router, cluster MERGE, vhost MERGE,
//!   route INSERT_FIRST, HTTP filter REMOVE; 10 select the proxy, the rest
//!   other apps): `envoyfilter_full` from cold, `envoyfilter_one_vs` after
//!   one VirtualService changed (incremental routes, then the patches),
//!   `envoyfilter_one_filter` after one of the proxy's filters changed.
//!
//! - `gwapi_*`: one Gateway (one HTTP listener) with LODESTAR_BENCH_ROUTES
//!   (3,000) HTTPRoutes, each its own hostname (`benches/gateway-api.sh`'s
//!   attach scenario): `gwapi_mesh_build` builds the mesh (the whole
//!   Gateway API translation); `gwapi_mesh_step_one_route` steps it after
//!   one route's backend changed (`Mesh::update_gateway_routes`);
//!   `gwapi_gateway_one_route` is what a warm translator does for the
//!   gateway proxy after that write (mesh step and the gateway's config).
//!
//! cargo bench --bench translate   (LODESTAR_BENCH_SERVICES=2000 for another size)

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use lodestar::mesh::MeshConfig;
use lodestar::model::proxy::ProxyIdentity;
use lodestar::model::{parse_resource, validate_spec};
use lodestar::store::state::State;
use lodestar::store::types::{Op, Txn};
use lodestar::store::Applied;
use lodestar::translate::Translator;
use lodestar::xds::resources::{Generator, ResourceType};
use serde_json::{json, Value};

/// LODESTAR_BENCH_SERVICES overrides the mesh size (default 1000).
fn services() -> usize {
    std::env::var("LODESTAR_BENCH_SERVICES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
}

fn vs(i: usize, split: u32) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
        "spec": {"hosts": [format!("svc-{i}")], "http": [
            {"match": [{"headers": {"end-user": {"exact": "jason"}}}], "route": [{"destination": {"host": format!("svc-{i}"), "subset": "v2"}}]},
            {"route": [{"destination": {"host": format!("svc-{i}"), "subset": "v1"}, "weight": split},
                       {"destination": {"host": format!("svc-{i}"), "subset": "v2"}, "weight": 100 - split}]}]}})
}

/// A TLS service's VirtualService: SNI `svc-i` split between the subsets.
fn tls_vs(i: usize, split: u32) -> Value {
    let host = format!("svc-{i}.default.svc.cluster.local");
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
        "spec": {"hosts": [host], "tls": [
            {"match": [{"sniHosts": [host]}],
             "route": [{"destination": {"host": host, "subset": "v1"}, "weight": split},
                       {"destination": {"host": host, "subset": "v2"}, "weight": 100 - split}]}]}})
}

fn is_tls(i: usize, half_tls: bool) -> bool {
    half_tls && i % 2 == 1
}

fn mesh_docs(half_tls: bool) -> Vec<Value> {
    let mut docs = Vec::new();
    for i in 0..services() {
        let port = if is_tls(i, half_tls) {
            json!({"name": "tls", "number": 443, "protocol": "TLS", "targetPort": 8443})
        } else {
            json!({"name": "http", "number": 80, "targetPort": 8080})
        };
        docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
            "spec": {"ports": [port]}}));
        for v in 1..=2 {
            docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
                "metadata": {"name": format!("svc-{i}-v{v}"), "namespace": "default", "labels": {"version": format!("v{v}")}},
                "spec": {"service": format!("svc-{i}"), "address": format!("10.{}.{}.{v}", i / 250, i % 250), "port": 8080}}));
        }
        docs.push(if is_tls(i, half_tls) { tls_vs(i, 80) } else { vs(i, 80) });
        docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
            "spec": {"host": format!("svc-{i}"), "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}}));
    }
    docs
}

fn put(state: &mut State, doc: Value) {
    let r = parse_resource(doc, "default").expect("valid");
    validate_spec(&r).expect("valid");
    state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.expect("applied");
}

/// A VirtualService for a weight split.
type Change = Box<dyn Fn(u32) -> Value>;

fn bench(c: &mut Criterion) {
    bench_gateway_api(c);
    bench_mesh(c, false);
    bench_mesh(c, true);
    bench_authz(c);
    bench_envoyfilter(c);
}

/// EnvoyFilter `i` (operations by `i % 5`); the first ten select the proxy
/// (`app: client`), the others `app: svc-i`. `timeout` varies the cluster
/// MERGE (a change).
fn envoy_filter(i: usize, timeout: u32) -> Value {
    let app = if i < 10 { "client".to_string() } else { format!("svc-{i}") };
    let hcm = json!({"filter": {"name": "envoy.filters.network.http_connection_manager", "subFilter": {"name": "envoy.filters.http.router"}}});
    let patch = match i % 5 {
        0 => json!({"applyTo": "HTTP_FILTER", "match": {"context": "SIDECAR_OUTBOUND", "listener": {"filterChain": hcm}},
            "patch": {"operation": "INSERT_BEFORE", "value": {"name": format!("lua-{i}"), "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua", "default_source_code": {"inline_string": "function envoy_on_request(h) end"}}}}}),
        1 => json!({"applyTo": "CLUSTER", "match": {"context": "SIDECAR_OUTBOUND", "cluster": {"portNumber": 80}},
            "patch": {"operation": "MERGE", "value": {"connect_timeout": format!("{timeout}s")}}}),
        2 => json!({"applyTo": "VIRTUAL_HOST", "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"vhost": {}}},
            "patch": {"operation": "MERGE", "value": {"request_headers_to_add": [{"header": {"key": format!("x-{i}"), "value": "1"}}]}}}),
        3 => {
            json!({"applyTo": "HTTP_ROUTE", "match": {"context": "SIDECAR_OUTBOUND", "routeConfiguration": {"vhost": {"name": "svc-1.default.svc.cluster.local:80"}}},
            "patch": {"operation": "INSERT_FIRST", "value": {"name": format!("health-{i}"), "match": {"path": "/healthz"}, "direct_response": {"status": 200}}}})
        }
        _ => json!({"applyTo": "HTTP_FILTER", "match": {"context": "SIDECAR_OUTBOUND", "listener": {"filterChain": {"filter": {
            "name": "envoy.filters.network.http_connection_manager", "subFilter": {"name": "envoy.filters.http.cors"}}}}}, "patch": {"operation": "REMOVE"}}),
    };
    json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter", "metadata": {"name": format!("ef-{i}"), "namespace": "default"},
        "spec": {"workloadSelector": {"labels": {"app": app}}, "priority": (i % 3) as i32, "configPatches": [patch]}})
}

fn bench_envoyfilter(c: &mut Criterion) {
    let mut state = State::default();
    for d in mesh_docs(false) {
        put(&mut state, d);
    }
    for i in 0..50 {
        put(&mut state, envoy_filter(i, 5));
    }
    let proxy = ProxyIdentity::parse("sidecar~127.0.0.2~client.default~default.svc.cluster.local", &json!({"LABELS": {"app": "client"}})).unwrap();
    let base = Applied { state, ..Default::default() };
    c.bench_function("envoyfilter_full", |b| b.iter(|| Translator::new(MeshConfig::default()).generate(&proxy, &base).unwrap()));
    let changes: [(&str, Change); 2] =
        [("envoyfilter_one_vs", Box::new(|n| vs(7, 50 + n % 40))), ("envoyfilter_one_filter", Box::new(|n| envoy_filter(1, 1 + n % 9)))];
    for (name, change) in changes {
        let translator = Translator::new(MeshConfig::default());
        translator.generate(&proxy, &base).unwrap();
        let mut current = base.state.clone();
        let mut n = 0;
        c.bench_function(name, |b| {
            b.iter_batched(
                || {
                    n += 1;
                    put(&mut current, change(n));
                    Applied { state: current.clone(), ..Default::default() }
                },
                |next| translator.generate(&proxy, &next).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
}

/// Policy `i`: selects `app: svc-i` (or the proxy, `app: client`, for the
/// first ten), three rules (sources, operations, a header condition).
fn policy(i: usize, method: &str) -> Value {
    let app = if i < 10 { "client".to_string() } else { format!("svc-{i}") };
    json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
        "metadata": {"name": format!("policy-{i}"), "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}, "rules": [
            {"from": [{"source": {"principals": [format!("cluster.local/ns/default/sa/caller-{i}")], "ipBlocks": ["10.0.0.0/8"]}}],
             "to": [{"operation": {"methods": [method], "paths": [format!("/api/{i}/*")]}}]},
            {"from": [{"source": {"namespaces": ["ops"]}}], "to": [{"operation": {"ports": ["8080"]}}]},
            {"when": [{"key": "request.headers[x-tenant]", "values": [format!("tenant-{i}")]}]}]}})
}

fn bench_authz(c: &mut Criterion) {
    let mut state = State::default();
    for d in mesh_docs(false) {
        put(&mut state, d);
    }
    put(
        &mut state,
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "client", "namespace": "default"},
        "spec": {"workloadSelector": {"labels": {"app": "client"}}, "ingress": [{"port": {"number": 8080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:18080"}]}}),
    );
    let proxy = ProxyIdentity::parse("sidecar~127.0.0.2~client.default~default.svc.cluster.local", &json!({"LABELS": {"app": "client"}})).unwrap();
    // The same mesh and Sidecar without the policies: what they add.
    let without = Applied { state: state.clone(), ..Default::default() };
    c.bench_function("authz_full_without_policies", |b| b.iter(|| Translator::new(MeshConfig::default()).generate(&proxy, &without).unwrap()));
    for i in 0..services() {
        put(&mut state, policy(i, "GET"));
    }
    let base = Applied { state, ..Default::default() };
    c.bench_function("authz_mesh_build", |b| b.iter(|| lodestar::mesh::Mesh::build(&base, std::sync::Arc::new(MeshConfig::default()))));
    c.bench_function("authz_full", |b| b.iter(|| Translator::new(MeshConfig::default()).generate(&proxy, &base).unwrap()));
    for (name, which) in [("authz_one_policy_selecting", 3), ("authz_one_policy_other", services() / 2)] {
        let translator = Translator::new(MeshConfig::default());
        translator.generate(&proxy, &base).unwrap();
        let mut current = base.state.clone();
        let mut post = false;
        c.bench_function(name, |b| {
            b.iter_batched(
                || {
                    post = !post;
                    put(&mut current, policy(which, if post { "POST" } else { "GET" }));
                    Applied { state: current.clone(), ..Default::default() }
                },
                |next| translator.generate(&proxy, &next).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
}

fn bench_mesh(c: &mut Criterion, half_tls: bool) {
    let suffix = if half_tls { "_half_tls" } else { "" };
    let mut state = State::default();
    for d in mesh_docs(half_tls) {
        put(&mut state, d);
    }
    let base = Applied { state, ..Default::default() };
    let proxy = ProxyIdentity::parse("sidecar~127.0.0.2~client.default~default.svc.cluster.local", &json!({})).unwrap();

    let cfg = Translator::new(MeshConfig::default()).generate(&proxy, &base).unwrap();
    eprintln!(
        "mesh{suffix}: {} services; proxy gets {} clusters, {} endpoints, {} listeners, {} routes",
        services(),
        cfg.of(ResourceType::Cluster).map_or(0, |m| m.len()),
        cfg.of(ResourceType::Endpoint).map_or(0, |m| m.len()),
        cfg.of(ResourceType::Listener).map_or(0, |m| m.len()),
        cfg.of(ResourceType::Route).map_or(0, |m| m.len()),
    );

    if !half_tls {
        bench_analyze(c, &base.state);
        bench_dryrun(c, &base.state);
    }

    c.bench_function(&format!("mesh_build{suffix}"), |b| b.iter(|| lodestar::mesh::Mesh::build(&base, std::sync::Arc::new(MeshConfig::default()))));

    // The same proxy with its traffic captured (virtual listeners).
    let captured = ProxyIdentity::parse(&proxy.id, &json!({"INTERCEPTION_MODE": "REDIRECT"})).unwrap();
    let mut proxies = vec![("", &proxy)];
    if !half_tls {
        proxies.push(("_captured", &captured));
    }
    for (kind, proxy) in &proxies {
        c.bench_function(&format!("full{suffix}{kind}"), |b| b.iter(|| Translator::new(MeshConfig::default()).generate(proxy, &base).unwrap()));
    }

    // One VirtualService changes (the next store revision): an HTTP
    // service's (svc-N/2 is even, so HTTP in both meshes), then, in the
    // half-TLS mesh, a TLS service's.
    let mut changes: Vec<(String, &ProxyIdentity, Change)> = Vec::new();
    for (kind, proxy) in &proxies {
        changes.push((format!("incremental_one_vs{suffix}{kind}"), proxy, Box::new(|split| vs(services() / 2 / 2 * 2, split))));
    }
    if half_tls {
        changes.push(("tls_vs_change_half_tls".to_string(), &proxy, Box::new(|split| tls_vs(services() / 2 / 2 * 2 + 1, split))));
    }
    for (name, proxy, change) in changes {
        let translator = Translator::new(MeshConfig::default());
        translator.generate(proxy, &base).unwrap();
        let mut current = base.state.clone();
        let mut split = 80;
        c.bench_function(&name, |b| {
            b.iter_batched(
                || {
                    split = if split == 80 { 70 } else { 80 };
                    put(&mut current, change(split));
                    Applied { state: current.clone(), ..Default::default() }
                },
                |next| translator.generate(proxy, &next).unwrap(),
                BatchSize::LargeInput,
            )
        });
    }
}

/// `lodestar analyze` on the store, and on one write of a VirtualService.
fn bench_analyze(c: &mut Criterion, state: &State) {
    use lodestar::analyze::{analyze, on_write, Options};
    let opts = Options::new(MeshConfig::default());
    eprintln!("analyze: {} resources, {} findings", services() * 5, analyze(state, &opts).len());
    c.bench_function("analyze_store", |b| b.iter(|| analyze(state, &opts)));
    let r = parse_resource(vs(services() / 2, 70), "default").expect("valid");
    let created = state.get(&r.key).expect("stored").create_revision;
    let obj = std::sync::Arc::new(lodestar::model::StoredObject::from_text(r.key.clone(), created, state.revision + 1, 2, r.body.to_string().into()));
    let writes = [(r.key, Some(obj))];
    c.bench_function("analyze_one_write", |b| b.iter(|| on_write(state, &writes, &opts)));
}

/// The per-proxy preview of one VirtualService change, at
/// LODESTAR_BENCH_PROXIES connected sidecars (default 1,000; ten apps):
/// `dryrun_one_vs` in the mesh as it is (every proxy sees every service,
/// so every one changes), `dryrun_one_vs_scoped` with a Sidecar per app
/// whose egress names a tenth of the services (app k: svc-j, j mod 10 =
/// k), so the change reaches one app's proxies (100 of 1,000).
/// Besides criterion's estimate, each prints p50/p99 over
/// LODESTAR_BENCH_DRYRUN_RUNS previews (default 20).
fn bench_dryrun(c: &mut Criterion, state: &State) {
    let n: usize = std::env::var("LODESTAR_BENCH_PROXIES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000);
    dryrun_case(c, "dryrun_one_vs", state, n);
    let mut scoped = state.clone();
    for k in 0..10 {
        let hosts: Vec<String> = (0..services()).filter(|j| j % 10 == k).map(|j| format!("./svc-{j}.default.svc.cluster.local")).collect();
        put(
            &mut scoped,
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": format!("client-{k}"), "namespace": "default"},
                "spec": {"workloadSelector": {"labels": {"app": format!("client-{k}")}}, "egress": [{"hosts": hosts}]}}),
        );
    }
    dryrun_case(c, "dryrun_one_vs_scoped", &scoped, n);
}

/// `n` sidecars served at `state`, then previews of svc-N/2's
/// VirtualService changing its split.
fn dryrun_case(c: &mut Criterion, name: &str, state: &State, n: usize) {
    use lodestar::api::dryrun::ProxyScope;
    let proxies = (0..n)
        .map(|i| {
            let id = format!("sidecar~127.1.{}.{}~client-{i}.default~default.svc.cluster.local", i / 250, i % 250 + 1);
            ProxyIdentity::parse(&id, &json!({"LABELS": {"app": format!("client-{}", i % 10)}})).unwrap()
        })
        .collect();
    // The server's translator, every proxy translated at `state` (as
    // their streams have it): the preview forks it.
    let served = Translator::new(MeshConfig::default());
    for p in &proxies {
        lodestar::translate::resources::Generator::generate(&served, p, state).unwrap();
    }
    let generator: std::sync::Arc<dyn Generator> = std::sync::Arc::new(served);
    let scope = ProxyScope { replica: 1, mesh: std::sync::Arc::new(MeshConfig::default()), generator: Some(generator), proxies: Ok(proxies) };
    let mut after = state.clone();
    put(&mut after, vs(services() / 2, 70));
    if std::env::var("LODESTAR_BENCH_COLD").is_ok() {
        // Once, for comparison: without the server's translator.
        let cold = ProxyScope { replica: 1, mesh: scope.mesh.clone(), generator: None, proxies: scope.proxies.clone() };
        let t = std::time::Instant::now();
        cold.effect(state, &after);
        eprintln!("{name} without a served translator (once): {:?}", t.elapsed());
    }
    let p = scope.effect(state, &after);
    eprintln!(
        "{name}: {n} proxies, {} change ({} resources each), {} unchanged",
        p.changed.len(),
        p.changed.first().map_or(0, |c| c.effect.changes.len()),
        p.unchanged
    );
    let runs: usize = std::env::var("LODESTAR_BENCH_DRYRUN_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(20).max(1);
    let mut times: Vec<std::time::Duration> = (0..runs)
        .map(|_| {
            let t = std::time::Instant::now();
            std::hint::black_box(scope.effect(state, &after));
            t.elapsed()
        })
        .collect();
    times.sort();
    let at = |q: f64| times[((runs as f64 * q).ceil() as usize).clamp(1, runs) - 1];
    eprintln!("{name}: {runs} previews: p50 {:?}, p99 {:?}, max {:?}", at(0.5), at(0.99), times[runs - 1]);
    c.bench_function(name, |b| b.iter(|| scope.effect(state, &after)));
}

/// The attach scenario of `benches/gateway-api.sh`, in process.
fn bench_gateway_api(c: &mut Criterion) {
    let n: usize = std::env::var("LODESTAR_BENCH_ROUTES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let route = |i: usize, backend: &str| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": format!("attach-{i}"), "namespace": "default"},
            "spec": {"parentRefs": [{"name": "web"}], "hostnames": [format!("r{i}.attach.example.com")], "rules": [{"backendRefs": [{"name": backend, "port": 80}]}]}})
    };
    let mut state = State::default();
    put(
        &mut state,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "lodestar"}, "spec": {"controllerName": "lodestar.dev/gateway-controller"}}),
    );
    put(
        &mut state,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": "web", "namespace": "default"},
        "spec": {"gatewayClassName": "lodestar", "listeners": [{"name": "http", "port": 8080, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "All"}}}]}}),
    );
    for v in ["v1", "v2"] {
        put(
            &mut state,
            json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": v, "namespace": "default"}, "spec": {"ports": [{"name": "http", "number": 80, "protocol": "HTTP"}]}}),
        );
        put(
            &mut state,
            json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": format!("{v}-0"), "namespace": "default"}, "spec": {"service": v, "address": "127.0.0.1", "ports": {"http": 8000}}}),
        );
    }
    for i in 0..n {
        put(&mut state, route(i, "v1"));
    }
    let config = std::sync::Arc::new(MeshConfig::default());
    let gateway = ProxyIdentity::parse(
        "router~127.0.0.3~web-gateway.default~default.svc.cluster.local",
        &json!({"LABELS": {"gateway.networking.k8s.io/gateway-name": "web"}}),
    )
    .unwrap();
    c.bench_function("gwapi_mesh_build", |b| b.iter(|| lodestar::mesh::Mesh::build(&state, config.clone())));
    let mesh = lodestar::mesh::Mesh::build(&state, config.clone());
    let mut next = state.clone();
    put(&mut next, route(n / 2, "v2"));
    c.bench_function("gwapi_mesh_step_one_route", |b| b.iter(|| mesh.update_gateway_routes(&state.objects, &next).expect("a route-only step")));
    let translator = Translator::new(MeshConfig::default());
    translator.generate(&gateway, &Applied { state: state.clone(), ..Default::default() }).unwrap();
    let mut current = state.clone();
    let mut flip = false;
    c.bench_function("gwapi_gateway_one_route", |b| {
        b.iter_batched(
            || {
                flip = !flip;
                put(&mut current, route(n / 2, if flip { "v2" } else { "v1" }));
                Applied { state: current.clone(), ..Default::default() }
            },
            |next| translator.generate(&gateway, &next).unwrap(),
            BatchSize::LargeInput,
        )
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10).measurement_time(std::time::Duration::from_secs(10));
    targets = bench
}
criterion_main!(benches);
