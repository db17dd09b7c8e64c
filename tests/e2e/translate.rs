//! Golden tests of translation: `tests/fixtures/translate/CASE/input.yaml`
//! (the store's contents) and `proxy.json` (node id and metadata) in,
//! `expected.json` (every resource the proxy gets, as proto-JSON) out; a
//! case may have more proxies (`proxy-NAME.json`, `expected-NAME.json`).
//! `LODESTAR_BLESS=1 cargo nextest run translate::` rewrites the
//! expected files; review the diff before committing it.

use lodestar::mesh::{Mesh, MeshConfig};
use lodestar::model::proxy::ProxyIdentity;
use lodestar::model::{documents::parse_documents, parse_resource, validate_spec};
use lodestar::store::state::State;
use lodestar::store::types::{Op, Txn};
use lodestar::store::Applied;
use lodestar::translate::translate;
use lodestar::xds::json::any_to_json;
use lodestar::xds::resources::{ProxyConfig, ResourceType};
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn applied_from(yaml: &str) -> Applied {
    let mut state = State::default();
    for doc in parse_documents(yaml, "input.yaml").unwrap() {
        let r = parse_resource(doc, "default").unwrap_or_else(|e| panic!("{e:?}"));
        validate_spec(&r).unwrap_or_else(|e| panic!("{}: {e:?}", r.key));
        let (res, _) = state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] });
        res.unwrap();
    }
    Applied { state, ..Default::default() }
}

fn render(cfg: &ProxyConfig) -> Value {
    let mut out = Map::new();
    // Translation names secrets and never produces them (`xds::secrets` does).
    assert!(cfg.of(ResourceType::Secret).is_none(), "translation produced SDS resources");
    for t in ResourceType::PUSH_ORDER.into_iter().filter(|t| *t != ResourceType::Secret) {
        let mut by_name = Map::new();
        for (name, r) in cfg.of(t).into_iter().flatten() {
            by_name.insert(name.clone(), any_to_json(&r.any).unwrap());
        }
        // Only proxies whose agent captures DNS have a name table, only
        // those an EXTENSION_CONFIG patch selects extension configs.
        if matches!(t, ResourceType::NameTable | ResourceType::ExtensionConfig) && by_name.is_empty() {
            continue;
        }
        out.insert(t.short().to_string(), Value::Object(by_name));
    }
    Value::Object(out)
}

/// One case: `input.yaml` and, for each `proxy[-NAME].json` in it, the
/// expected output `expected[-NAME].json` (one input seen by proxies of
/// several namespaces). Objects the mesh leaves out are listed, by key, in
/// `skipped.json` (none if absent).
fn run_case(dir: &Path) {
    let input = std::fs::read_to_string(dir.join("input.yaml")).unwrap();
    let applied = applied_from(&input);
    let mesh = Mesh::build(&applied, Arc::new(MeshConfig::default()));
    let skipped: Vec<String> = mesh.skipped.iter().map(|(k, _)| k.to_string()).collect();
    let want_skipped: Vec<String> =
        std::fs::read_to_string(dir.join("skipped.json")).map_or_else(|_| Vec::new(), |t| serde_json::from_str(&t).expect("skipped.json: a list of keys"));
    assert_eq!(skipped, want_skipped, "{}: skipped objects {:?}", dir.display(), mesh.skipped);
    if !mesh.gateway_api_status.is_empty() {
        compare(dir, &gateway_api_view(&mesh), &dir.join("istio.json"));
    }
    let mut proxies: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("proxy") && n.ends_with(".json")))
        .collect();
    proxies.sort();
    assert!(!proxies.is_empty(), "{}: no proxy.json", dir.display());
    for proxy_path in proxies {
        let proxy: Value = serde_json::from_str(&std::fs::read_to_string(&proxy_path).unwrap()).unwrap();
        let proxy = ProxyIdentity::parse(proxy["id"].as_str().unwrap(), &proxy["metadata"]).unwrap();
        let name = proxy_path.file_name().and_then(|n| n.to_str()).unwrap_or_default().replacen("proxy", "expected", 1);
        check_output(dir, &applied, &mesh, &proxy, &dir.join(name));
    }
}

fn check_output(dir: &Path, applied: &Applied, mesh: &Mesh, proxy: &ProxyIdentity, expected_path: &Path) {
    let cfg = translate(mesh, proxy);
    // Deterministic: the same snapshot gives the same bytes.
    let again = translate(&Mesh::build(applied, Arc::new(MeshConfig::default())), proxy);
    for t in ResourceType::PUSH_ORDER {
        let a: Vec<_> = cfg.of(t).into_iter().flatten().map(|(n, r)| (n.clone(), r.version.clone(), r.any.value.clone())).collect();
        let b: Vec<_> = again.of(t).into_iter().flatten().map(|(n, r)| (n.clone(), r.version.clone(), r.any.value.clone())).collect();
        assert_eq!(a, b, "{}: translation is not deterministic", dir.display());
    }
    compare(dir, &render(&cfg), expected_path);
}

/// What the Gateway API translation generated (Istio Gateways and
/// VirtualServices, as if stored) and the status it computed.
fn gateway_api_view(mesh: &Mesh) -> Value {
    let generated = |labels: &std::collections::BTreeMap<String, String>| labels.contains_key(lodestar::translate::gateway_api::CLASS_LABEL);
    let gateways: Map<String, Value> = mesh
        .gateways
        .iter()
        .filter(|g| generated(&g.labels))
        .map(|g| (format!("{}/{}", g.key.namespace, g.key.name), serde_json::to_value(&g.spec).unwrap()))
        .collect();
    let vs: Map<String, Value> = mesh
        .virtual_services
        .iter()
        .filter(|v| generated(&v.labels))
        .map(|v| (format!("{}/{}", v.key.namespace, v.key.name), serde_json::to_value(&v.spec).unwrap()))
        .collect();
    let status: Map<String, Value> = mesh.gateway_api_status.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let mut view = json!({"gateways": gateways, "virtualServices": vs, "status": status});
    // BackendTLSPolicies' DestinationRules, and the CA bundles they name.
    let backend_tls = |labels: &std::collections::BTreeMap<String, String>| labels.contains_key(lodestar::translate::backend_tls::POLICY_LABEL);
    let dr: Map<String, Value> = mesh
        .destination_rules
        .iter()
        .filter(|d| backend_tls(&d.labels))
        .map(|d| (format!("{}/{}", d.key.namespace, d.key.name), serde_json::to_value(&d.spec).unwrap()))
        .collect();
    if !dr.is_empty() {
        view["destinationRules"] = Value::Object(dr);
        view["caBundles"] = json!(mesh.backend_cas.bundles.keys().collect::<Vec<_>>());
    }
    view
}

fn compare(dir: &Path, got: &Value, expected_path: &Path) {
    let got = got.clone();
    if std::env::var("LODESTAR_BLESS").is_ok() {
        std::fs::write(expected_path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
    }
    let expected: Value =
        serde_json::from_str(&std::fs::read_to_string(expected_path).unwrap_or_else(|_| panic!("missing {}", expected_path.display()))).unwrap();
    if got != expected {
        let g = serde_json::to_string_pretty(&got).unwrap();
        let e = serde_json::to_string_pretty(&expected).unwrap();
        let first = g.lines().zip(e.lines()).position(|(a, b)| a != b).unwrap_or(0);
        panic!(
            "{}: output differs from {} at line {}:\n  got:      {}\n  expected: {}\n(LODESTAR_BLESS=1 to accept)",
            dir.display(),
            expected_path.display(),
            first + 1,
            g.lines().nth(first).unwrap_or(""),
            e.lines().nth(first).unwrap_or("")
        );
    }
}

fn cases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    dirs
}

#[test]
fn golden() {
    let cases = cases();
    assert!(cases.len() >= 5);
    for dir in cases {
        run_case(&dir);
    }
}

#[test]
fn names_follow_istio_conventions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/bookinfo-sidecar");
    let applied = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let mesh = Mesh::build(&applied, Arc::new(MeshConfig::default()));
    let proxy = ProxyIdentity::parse("sidecar~127.0.20.1~productpage-v1.default~default.svc.cluster.local", &json!({})).unwrap();
    let cfg = translate(&mesh, &proxy);
    let clusters: Vec<&String> = cfg.of(ResourceType::Cluster).unwrap().keys().collect();
    assert!(clusters.contains(&&"outbound|9080|v2|reviews.default.svc.cluster.local".to_string()), "{clusters:?}");
    assert!(cfg.of(ResourceType::Route).unwrap().contains_key("9080"));
    assert!(cfg.of(ResourceType::Listener).unwrap().contains_key("127.0.20.1_9080"));
    // Every EDS cluster has its endpoints.
    for name in cfg.of(ResourceType::Cluster).unwrap().keys() {
        assert!(cfg.of(ResourceType::Endpoint).unwrap().contains_key(name), "{name} has no ClusterLoadAssignment");
    }
}

/// The translator's incremental path must give exactly what a full
/// translation gives, for every kind of change (VirtualService-only changes
/// take the incremental path; others fall back to full translation).
#[test]
fn incremental_equals_full() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/bookinfo-sidecar");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    // Two proxies that see the mesh the same way (they share a rebuilt
    // route table) and one whose labels differ (sourceLabels below).
    let mut proxies: Vec<ProxyIdentity> = [("127.0.20.1", "productpage"), ("127.0.20.2", "productpage"), ("127.0.20.3", "details")]
        .iter()
        .map(|(ip, app)| ProxyIdentity::parse(&format!("sidecar~{ip}~{app}-v1.default~default.svc.cluster.local"), &json!({"LABELS": {"app": app}})).unwrap())
        .collect();
    // And a proxyless gRPC client (its endpoint-only changes take the
    // incremental EDS path too).
    proxies.push(ProxyIdentity::parse("sidecar~127.0.20.4~grpc-client.default~default.svc.cluster.local", &json!({"GENERATOR": "grpc"})).unwrap());
    // And the gateway proxy of a Gateway API Gateway (applied below).
    proxies.push(
        ProxyIdentity::parse("router~127.0.20.5~web.default~default.svc.cluster.local", &json!({"LABELS": {"gateway.networking.k8s.io/gateway-name": "web"}}))
            .unwrap(),
    );
    let translator = Translator::new(MeshConfig::default());
    for proxy in &proxies {
        translator.generate(proxy, &base).unwrap();
    }

    let changes = [
        // Per-source routing: the same step gives the proxies different tables.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{sourceLabels: {app: productpage}}]\n    route:\n    - destination: {host: reviews, subset: v2}\n  - route:\n    - destination: {host: reviews, subset: v1}\n",
        // VirtualService edits: the incremental path.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews, subset: v3}\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: pp, namespace: default}\nspec:\n  hosts: [productpage]\n  http:\n  - fault: {abort: {httpStatus: 503, percentage: {value: 50}}}\n    route:\n    - destination: {host: productpage}\n",
        // Other kinds: the full path.
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: default}\nspec:\n  host: reviews\n  trafficPolicy: {loadBalancer: {consistentHash: {httpHeaderName: x-user}}}\n  subsets:\n  - {name: v3, labels: {version: v3}}\n",
        "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: productpage-2, namespace: default}\nspec: {service: productpage, address: 127.0.11.2, port: 19080}\n",
        // Back to a VirtualService change after those.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews, subset: v3}\n      weight: 50\n    - destination: {host: reviews, subset: v1}\n      weight: 50\n",
        // Delegation: the root names a child not there yet (no route), then
        // the child arrives, then only the child changes.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: default}\nspec:\n  hosts: [reviews]\n  http:\n  - match: [{uri: {prefix: /reviews}}]\n    delegate: {name: reviews-team, namespace: team}\n  - route:\n    - destination: {host: reviews, subset: v1}\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews-team, namespace: team}\nspec:\n  http:\n  - match: [{uri: {prefix: /reviews/2}}]\n    route:\n    - destination: {host: reviews.default.svc.cluster.local, subset: v2}\n  - route:\n    - destination: {host: reviews.default.svc.cluster.local, subset: v3}\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews-team, namespace: team}\nspec:\n  http:\n  - route:\n    - destination: {host: reviews.default.svc.cluster.local, subset: v2}\n",
        // Gateway API objects: sidecars are out of their scope (what they
        // generate binds to gateways only).
        "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: lodestar}\nspec: {controllerName: lodestar.dev/gateway-controller}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: default}\nspec:\n  gatewayClassName: lodestar\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: reviews, namespace: default}\nspec:\n  parentRefs: [{name: web}]\n  hostnames: [reviews.example.com]\n  rules:\n  - backendRefs: [{name: reviews, port: 9080}]\n",
        // TLS routes on a VirtualService: its hosts' TLS/TCP listeners too.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: pp, namespace: default}\nspec:\n  hosts: [productpage]\n  tls:\n  - match: [{sniHosts: [productpage]}]\n    route:\n    - destination: {host: productpage}\n",
    ];
    let mut state = base.state.clone();
    for (i, yaml) in changes.iter().enumerate() {
        for doc in parse_documents(yaml, "change").unwrap() {
            let r = parse_resource(doc, "default").unwrap();
            validate_spec(&r).unwrap();
            state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        }
        let applied = Applied { state: state.clone(), ..Default::default() };
        for proxy in &proxies {
            let got = translator.generate(proxy, &applied).unwrap();
            let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), proxy);
            assert_eq!(render(&got), render(&want), "change {i}, proxy {}", proxy.id);
            assert_eq!(got.revision, applied.revision());
        }
    }
}

/// A captured proxy (the `capture` case) through the translator's
/// incremental paths: an instance registered at its address (an endpoint
/// change, but a new `virtualInbound` port), a VirtualService (HTTP: the
/// incremental route path; TCP: its VIP listener), an
/// AuthorizationPolicy selecting it: each gives what a full translation
/// gives.
#[test]
fn captured_incremental_equals_full() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/capture");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxies: Vec<ProxyIdentity> = ["proxy.json", "proxy-locked.json", "proxy-dns.json"]
        .iter()
        .map(|f| {
            let p: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap();
            ProxyIdentity::parse(p["id"].as_str().unwrap(), &p["metadata"]).unwrap()
        })
        .collect();
    let translator = Translator::new(MeshConfig::default());
    for proxy in &proxies {
        translator.generate(proxy, &base).unwrap();
    }
    let changes = [
        "apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: reviews-3, namespace: shop, labels: {version: v1}}\nspec: {service: reviews, address: 198.18.1.1, port: 9080}\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - route:\n    - destination: {host: reviews, subset: v2}\n",
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: orders-db, namespace: shop}\nspec:\n  hosts: [orders-db]\n  tcp:\n  - route:\n    - destination: {host: users-db}\n",
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {matchLabels: {app: web}}\n  action: DENY\n  rules:\n  - to: [{operation: {ports: [\"8080\"]}}]\n",
        // A new host without addresses: its name and allocated address.
        "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: ledger, namespace: shop}\nspec:\n  hosts: [ledger.db.internal]\n  ports: [{name: tcp-pg, number: 5432, protocol: TCP}]\n  resolution: STATIC\n  endpoints: [{address: 198.18.1.41}]\n",
    ];
    let mut state = base.state.clone();
    for (i, yaml) in changes.iter().enumerate() {
        for doc in parse_documents(yaml, "change").unwrap() {
            let r = parse_resource(doc, "default").unwrap();
            validate_spec(&r).unwrap();
            state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        }
        let applied = Applied { state: state.clone(), ..Default::default() };
        for proxy in &proxies {
            let got = translator.generate(proxy, &applied).unwrap();
            let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), proxy);
            assert_eq!(render(&got), render(&want), "change {i}, proxy {}", proxy.id);
            if proxy.dns_capture && i >= 4 {
                let names = render(&got)["NDS"][""]["table"]["ledger.db.internal"]["ips"][0].as_str().map(str::to_string);
                assert!(names.is_some_and(|ip| ip.starts_with("240.240.")), "change {i}: {:#}", render(&got)["NDS"]);
            }
        }
    }
}

/// A hostname several namespaces claim (the `duplicate-host` case): every
/// path of the translator (EDS only, VirtualService only, out of scope,
/// full) gives each namespace's proxy what a full translation gives, as
/// claims come and go and the oldest changes.
#[test]
fn duplicate_hosts_incremental_equals_full() {
    use lodestar::model::{Kind, ResourceKey};
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/duplicate-host");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxies: Vec<ProxyIdentity> = ["team-a", "team-b", "team-c", "team-e"]
        .iter()
        .enumerate()
        .map(|(i, ns)| ProxyIdentity::parse(&format!("sidecar~127.0.41.{}~client.{ns}~{ns}.svc.cluster.local", i + 1), &json!({})).unwrap())
        .collect();
    let translator = Translator::new(MeshConfig::default());
    for proxy in &proxies {
        translator.generate(proxy, &base).unwrap();
    }
    let put = |yaml: &str| {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
    };
    let se = |ns: &str, addr: &str| {
        put(&format!("apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {{name: payments, namespace: {ns}}}\nspec:\n  hosts: [payments.example.com]\n  location: MESH_EXTERNAL\n  resolution: STATIC\n  ports: [{{number: 8080, name: http, protocol: HTTP}}]\n  endpoints: [{{address: {addr}}}]\n"))
    };
    let steps: Vec<Op> = vec![
        // An endpoint of team-b's service (EDS only).
        put("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: reviews-2, namespace: team-b}\nspec: {service: reviews, address: 127.0.40.12, port: 19080, serviceAccount: reviews}\n"),
        // team-e claims the host: its proxy switches to its own.
        se("team-e", "127.0.40.5"),
        // The oldest claim goes: team-c's proxy keeps its own, the others
        // fall back to the next oldest (team-a's).
        Op::Delete { key: ResourceKey::new(Kind::ServiceEntry, "team-b", "payments"), expected_revision: None, ignore_missing: false },
        // team-b's VirtualService for its own service (VirtualService only).
        put("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: team-b}\nspec:\n  hosts: [reviews]\n  http:\n  - route: [{destination: {host: payments.example.com, port: {number: 8080}}}]\n"),
        // Back: team-b's is now the newest.
        se("team-b", "127.0.40.22"),
        // team-e's claim goes: its proxy falls back to the oldest, team-a's.
        Op::Delete { key: ResourceKey::new(Kind::ServiceEntry, "team-e", "payments"), expected_revision: None, ignore_missing: false },
    ];
    let mut state = base.state.clone();
    for (i, op) in steps.into_iter().enumerate() {
        state.apply_txn(&Txn { ops: vec![op] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        let mesh = Mesh::build(&applied, Arc::new(MeshConfig::default()));
        for proxy in &proxies {
            let got = translator.generate(proxy, &applied).unwrap();
            assert_eq!(render(&got), render(&translate(&mesh, proxy)), "step {i}, proxy {}", proxy.id);
        }
    }
    // Where it ended: team-e's proxy has team-a's payments (the oldest left
    // exported to it), team-b's its own.
    let applied = Applied { state, ..Default::default() };
    let mesh = Mesh::build(&applied, Arc::new(MeshConfig::default()));
    let addrs = |proxy: &ProxyIdentity| -> Value { render(&translate(&mesh, proxy))["EDS"]["outbound|8080||payments.example.com"]["endpoints"].clone() };
    assert!(addrs(&proxies[3]).to_string().contains("127.0.40.1\""), "{}", addrs(&proxies[3]));
    assert!(addrs(&proxies[1]).to_string().contains("127.0.40.22\""), "{}", addrs(&proxies[1]));
}

/// Instance changes (register, health, deregister) of services that keep
/// their shape re-translate endpoints only: every other type is shared with
/// the previous config as is, and the result equals a full translation.
/// Changes that alter a service's shape (a new implied service) fall back.
#[test]
fn endpoint_changes_are_eds_only() {
    use lodestar::model::{Kind, ResourceKey};
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/bookinfo-sidecar");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxy =
        ProxyIdentity::parse("sidecar~127.0.20.1~productpage-v1.default~default.svc.cluster.local", &json!({"LABELS": {"app": "productpage"}})).unwrap();
    let translator = Translator::new(MeshConfig::default());
    let mut prev = translator.generate(&proxy, &base).unwrap();
    let put = |yaml: &str| {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
    };
    let key = |name: &str| ResourceKey::new(Kind::Instance, "default", name);
    let unhealthy = json!({"health": "Unhealthy", "reason": "test", "sinceUnixMs": 1}).to_string();
    let steps: Vec<(Op, bool)> = vec![
        (put("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: productpage-2, namespace: default}\nspec: {service: productpage, address: 127.0.11.2, port: 19080, healthCheck: {ttl: 5s}}\n"), true),
        (Op::SetStatus { key: key("productpage-2"), status: unhealthy, expected_revision: None }, true),
        (Op::Delete { key: key("productpage-1"), expected_revision: None, ignore_missing: false }, true),
        // A service implied by its first instance: a new cluster, full path.
        (put("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: ratings-1, namespace: default}\nspec: {service: ratings, address: 127.0.11.9, ports: {http: 9080}}\n"), false),
        (put("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: ratings-2, namespace: default}\nspec: {service: ratings, address: 127.0.11.10, ports: {http: 9080}}\n"), true),
    ];
    let mut state = base.state.clone();
    for (i, (op, eds_only)) in steps.into_iter().enumerate() {
        state.apply_txn(&Txn { ops: vec![op] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        let got = translator.generate(&proxy, &applied).unwrap();
        let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), &proxy);
        assert_eq!(render(&got), render(&want), "step {i}");
        assert_ne!(got.of(ResourceType::Endpoint), prev.of(ResourceType::Endpoint), "step {i}: endpoints must change");
        if eds_only {
            for t in [ResourceType::Cluster, ResourceType::Listener, ResourceType::Route] {
                assert!(Arc::ptr_eq(&got.resources[&t], &prev.resources[&t]), "step {i}: {t:?} not shared with the previous config");
            }
        } else {
            // The full path: clusters were rebuilt (a type that came out the
            // same may still be shared: equal maps are interned).
            assert_ne!(got.of(ResourceType::Cluster), prev.of(ResourceType::Cluster), "step {i}: clusters must change");
        }
        prev = got;
    }
    // The unhealthy instance is left out of its cluster's endpoints.
    let eds = render(&prev);
    let text = eds.to_string();
    assert!(!text.contains("127.0.11.2"), "unhealthy instance still in EDS");
    assert!(text.contains("127.0.11.10"));
}

/// Sidecar scoping: changes to services outside a proxy's scope (its
/// instances, rules naming it) cost that proxy no translation at all (its
/// resources are shared as they are) and still equal a full translation;
/// a change inside its scope is translated.
#[test]
fn changes_outside_a_proxys_scope_are_not_translated() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/sidecar-scoping");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxy = ProxyIdentity::parse("sidecar~127.0.21.1~client-1.team-a~team-a.svc.cluster.local", &json!({"LABELS": {"app": "client"}})).unwrap();
    let translator = Translator::new(MeshConfig::default());
    let mut prev = translator.generate(&proxy, &base).unwrap();
    let steps: Vec<(&str, bool)> = vec![
        // team-b's service is outside the Sidecar's `./*` egress.
        ("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: other-1, namespace: team-b}\nspec: {service: other, address: 127.0.13.9, port: 8080}\n", false),
        ("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: other, namespace: team-b}\nspec:\n  hosts: [other]\n  http:\n  - route:\n    - destination: {host: other}\n    timeout: 3s\n", false),
        ("apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: other, namespace: team-b}\nspec:\n  host: other\n  trafficPolicy: {loadBalancer: {simple: RANDOM}}\n", false),
        // In scope: translated.
        ("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: api-2, namespace: team-a}\nspec: {service: api, address: 127.0.13.2, ports: {http: 8081}}\n", true),
        ("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: api, namespace: team-a}\nspec:\n  hosts: [api]\n  http:\n  - route:\n    - destination: {host: api}\n    timeout: 3s\n", true),
    ];
    let mut state = base.state.clone();
    for (i, (yaml, in_scope)) in steps.into_iter().enumerate() {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        let got = translator.generate(&proxy, &applied).unwrap();
        let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), &proxy);
        assert_eq!(render(&got), render(&want), "step {i}");
        assert_eq!(got.revision, applied.revision());
        let all_shared = got.resources.iter().all(|(t, m)| Arc::ptr_eq(m, &prev.resources[t]));
        assert_eq!(all_shared, !in_scope, "step {i}: every resource shared with the previous config");
        prev = got;
    }
}

/// Clusters and load assignments are translated once and shared by every
/// proxy that gets the same ones.
#[test]
fn proxies_share_translated_clusters() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/bookinfo-sidecar");
    let applied = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let translator = Translator::new(MeshConfig::default());
    let a = ProxyIdentity::parse("sidecar~127.0.20.1~a.default~default.svc.cluster.local", &json!({})).unwrap();
    let b = ProxyIdentity::parse("sidecar~127.0.20.2~b.default~default.svc.cluster.local", &json!({})).unwrap();
    let (ca, cb) = (translator.generate(&a, &applied).unwrap(), translator.generate(&b, &applied).unwrap());
    for t in [ResourceType::Cluster, ResourceType::Endpoint] {
        let (ma, mb) = (ca.of(t).unwrap(), cb.of(t).unwrap());
        assert!(!ma.is_empty());
        for (name, r) in ma {
            assert!(Arc::ptr_eq(r, &mb[name]), "{t:?} {name} translated twice");
        }
    }
    assert_eq!(render(&ca)["clusters"], render(&translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), &a))["clusters"]);
}

/// Proxies with the same inputs share their translated output: the same
/// route tables and cluster/endpoint maps (one copy in memory, however many
/// proxies hold it); only what differs (listeners bind each proxy's IP)
/// is their own.
#[test]
fn identical_output_is_shared_across_proxies() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/bookinfo-sidecar");
    let applied = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxy = |ip: &str| {
        ProxyIdentity::parse(&format!("sidecar~{ip}~productpage-v1.default~default.svc.cluster.local"), &json!({"LABELS": {"app": "productpage"}})).unwrap()
    };
    let translator = Translator::new(MeshConfig::default());
    let a = translator.generate(&proxy("127.0.20.1"), &applied).unwrap();
    let b = translator.generate(&proxy("127.0.20.2"), &applied).unwrap();
    for t in [ResourceType::Cluster, ResourceType::Endpoint, ResourceType::Route] {
        assert!(Arc::ptr_eq(&a.resources[&t], &b.resources[&t]), "{t:?} not shared");
    }
    assert_ne!(a.of(ResourceType::Listener), b.of(ResourceType::Listener), "listeners bind each proxy's own IP");
}

/// Mutual TLS through the translator's incremental paths and caches: an
/// instance gaining an identity changes its cluster (the expected SANs),
/// not only EDS; a PeerAuthentication change re-marks the endpoints; the
/// same mesh gives a proxy without SDS no mTLS at all (the cluster cache
/// keeps them apart). Each step equals a full translation.
#[test]
fn mutual_tls_follows_identities_and_policies() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/mtls");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let with_sds =
        ProxyIdentity::parse("sidecar~127.0.30.1~web-1.shop~shop.svc.cluster.local", &json!({"LABELS": {"app": "web"}, "LODESTAR_SDS": "true"})).unwrap();
    let without = ProxyIdentity::parse("sidecar~127.0.30.7~web-2.shop~shop.svc.cluster.local", &json!({"LABELS": {"app": "web"}})).unwrap();
    let translator = Translator::new(MeshConfig::default());
    let put = |yaml: &str| {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
    };
    let reviews = "outbound|9080||reviews.shop.svc.cluster.local";
    let sans_of = |cfg: &ProxyConfig| -> String {
        let c = render(cfg)["CDS"][reviews].clone();
        c["transportSocketMatches"].to_string()
    };
    let eds_of = |cfg: &ProxyConfig| render(cfg)["EDS"][reviews].to_string();
    let check = |applied: &Applied, proxy: &ProxyIdentity, step: &str| -> ProxyConfig {
        let got = translator.generate(proxy, applied).unwrap();
        let want = translate(&Mesh::build(applied, Arc::new(MeshConfig::default())), proxy);
        assert_eq!(render(&got), render(&want), "{step}");
        got
    };
    let first = check(&base, &with_sds, "base");
    assert!(sans_of(&first).contains("sa/reviews") && !sans_of(&first).contains("sa/legacy"), "{}", sans_of(&first));
    let plain = check(&base, &without, "base without SDS");
    assert!(!render(&plain).to_string().contains("sds-grpc"), "a proxy without SDS gets no SDS reference");

    // The legacy instance gets an identity: a cluster change (new SAN), and
    // its endpoint is marked for mutual TLS.
    let mut state = base.state.clone();
    state.apply_txn(&Txn { ops: vec![put("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: reviews-legacy, namespace: shop}\nspec: {service: reviews, address: 127.0.30.3, port: 9080, serviceAccount: legacy}\n")] }).0.unwrap();
    let applied = Applied { state: state.clone(), ..Default::default() };
    let second = check(&applied, &with_sds, "identity added");
    assert!(sans_of(&second).contains("sa/legacy"), "the new identity is expected: {}", sans_of(&second));
    assert_eq!(eds_of(&second).matches("tlsMode").count(), 2, "{}", eds_of(&second));
    check(&applied, &without, "identity added, without SDS");

    // Its namespace DISABLEs mTLS: plaintext to every reviews endpoint.
    state.apply_txn(&Txn { ops: vec![put("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: reviews, namespace: shop}\nspec:\n  selector: {matchLabels: {app: none}}\n  mtls: {mode: STRICT}\n")] }).0.unwrap();
    let applied = Applied { state: state.clone(), ..Default::default() };
    check(&applied, &with_sds, "an unrelated workload policy");
    state
        .apply_txn(&Txn {
            ops: vec![put(
                "apiVersion: security.istio.io/v1beta1\nkind: PeerAuthentication\nmetadata: {name: default, namespace: shop}\nspec:\n  mtls: {mode: DISABLE}\n",
            )],
        })
        .0
        .unwrap();
    let applied = Applied { state, ..Default::default() };
    let third = check(&applied, &with_sds, "namespace DISABLE");
    assert_eq!(eds_of(&third).matches("tlsMode").count(), 0, "DISABLE servers get plaintext: {}", eds_of(&third));
    let l = render(&third)["LDS"]["127.0.30.1_9080"].to_string();
    assert!(!l.contains("DownstreamTlsContext"), "the proxy's own inbound is plaintext under DISABLE");
}

/// AuthorizationPolicy changes: a policy selecting the proxy rebuilds its
/// inbound listeners only (clusters, endpoints and routes are shared with
/// the previous config as they are); one selecting another workload costs
/// it nothing. Both equal a full translation.
#[test]
fn policy_changes_rebuild_inbound_listeners_only() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/authz-sidecar");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxy = ProxyIdentity::parse("sidecar~127.0.31.1~httpbin-1.foo~foo.svc.cluster.local", &json!({"LABELS": {"app": "httpbin"}})).unwrap();
    let translator = Translator::new(MeshConfig::default());
    let mut prev = translator.generate(&proxy, &base).unwrap();
    let steps: Vec<(&str, bool)> = vec![
        // Selects the proxy: its listeners change.
        ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-reads, namespace: foo}\nspec:\n  rules: [{to: [{operation: {methods: [GET]}}]}]\n", true),
        // Another workload's: nothing changes.
        ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: other-workload, namespace: foo}\nspec:\n  selector: {matchLabels: {app: other}}\n  rules: [{}]\n", false),
        // A dry run of the proxy's own.
        ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-reads, namespace: foo, annotations: {istio.io/dry-run: \"true\"}}\nspec:\n  rules: [{to: [{operation: {methods: [GET]}}]}]\n", true),
    ];
    let mut state = base.state.clone();
    for (i, (yaml, selects)) in steps.into_iter().enumerate() {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        let got = translator.generate(&proxy, &applied).unwrap();
        let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), &proxy);
        assert_eq!(render(&got), render(&want), "step {i}");
        assert!(Arc::ptr_eq(&got.resources[&ResourceType::Cluster], &prev.resources[&ResourceType::Cluster]), "step {i}: clusters not shared");
        if selects {
            assert_ne!(render(&got)["LDS"], render(&prev)["LDS"], "step {i}: the listeners must change");
        } else {
            assert!(Arc::ptr_eq(&got.resources[&ResourceType::Listener], &prev.resources[&ResourceType::Listener]), "step {i}: listeners rebuilt");
        }
        prev = got;
    }
}

/// A change to VirtualServices with `tls` or `tcp` routes rebuilds the
/// virtual hosts and the TLS/TCP listeners of the hosts they name, nothing
/// else: clusters and endpoints are shared with the previous config, and
/// the listeners of untouched ports keep their resources. The result equals
/// a full translation, for a proxy whose labels the routes match and one
/// whose labels they don't.
#[test]
fn tls_and_tcp_route_changes_rebuild_their_listeners_only() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/tls-routing");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxies: Vec<ProxyIdentity> = [("127.0.24.1", "checkout"), ("127.0.24.2", "someone-else")]
        .iter()
        .map(|(ip, app)| ProxyIdentity::parse(&format!("sidecar~{ip}~{app}.default~default.svc.cluster.local"), &json!({"LABELS": {"app": app}})).unwrap())
        .collect();
    let translator = Translator::new(MeshConfig::default());
    let mut prev: Vec<ProxyConfig> = proxies.iter().map(|p| translator.generate(p, &base).unwrap()).collect();
    let steps = [
        // The canary moves: 75/25 becomes 50/50; the 443 listener changes.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: payments, namespace: default}\nspec:\n  hosts: [payments.example.com]\n  tls:\n  - match:\n    - sniHosts: [payments.example.com]\n      sourceLabels: {app: checkout}\n    route:\n    - {destination: {host: payments.example.com, subset: v1}, weight: 50}\n    - {destination: {host: payments.example.com, subset: v2}, weight: 50}\n",
        // A mixed VirtualService: its tcp split and its http split change.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: shop, namespace: default}\nspec:\n  hosts: [shop.example.com]\n  http:\n  - route:\n    - {destination: {host: shop.example.com, subset: v2}}\n  tcp:\n  - match:\n    - port: 5432\n    route:\n    - {destination: {host: shop.example.com, subset: v1, port: {number: 5432}}, weight: 50}\n    - {destination: {host: shop.example.com, subset: v2, port: {number: 5432}}, weight: 50}\n",
        // The tls routes go: the default SNI chain is back.
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: payments, namespace: default}\nspec:\n  hosts: [payments.example.com]\n  http:\n  - route:\n    - destination: {host: payments.example.com}\n",
    ];
    let mut state = base.state.clone();
    for (i, yaml) in steps.iter().enumerate() {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        for (proxy, before) in proxies.iter().zip(prev.iter_mut()) {
            let got = translator.generate(proxy, &applied).unwrap();
            let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), proxy);
            assert_eq!(render(&got), render(&want), "step {i}, proxy {}", proxy.id);
            for t in [ResourceType::Cluster, ResourceType::Endpoint] {
                assert!(Arc::ptr_eq(&got.resources[&t], &before.resources[&t]), "step {i}, {}: {t:?} not shared", proxy.id);
            }
            // The HTTP port's listener (RDS) is the same resource.
            let http = format!("{}_80", proxy.ip);
            assert!(Arc::ptr_eq(&got.of(ResourceType::Listener).unwrap()[&http], &before.of(ResourceType::Listener).unwrap()[&http]), "step {i}");
            *before = got;
        }
    }
    // The first step did change the checkout proxy's TLS listener.
    let l = |c: &ProxyConfig| any_to_json(&c.of(ResourceType::Listener).unwrap()["127.0.24.1_443"].any).unwrap().to_string();
    assert!(!l(&prev[0]).contains("\"weight\":75"), "{}", l(&prev[0]));
}

/// Key sets fetched from a `jwksUri` are an input of translation: served
/// inline once fetched (the fail-closed set before), and a change of keys
/// re-translates only proxies whose config holds that URI's keys.
#[test]
fn fetched_jwks_are_served_inline_and_change_only_their_proxies() {
    use lodestar::translate::jwt::{FetchedKeys, UNFETCHED_JWKS};
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/jwt-sidecar");
    let applied = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxy: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("proxy.json")).unwrap()).unwrap();
    let httpbin = ProxyIdentity::parse(proxy["id"].as_str().unwrap(), &proxy["metadata"]).unwrap();
    let uri = "https://raw.githubusercontent.com/istio/istio/release-1.24/security/tools/jwt/samples/jwks.json";
    let fetched = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"fetched-1","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU","y":"x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"}]}"#;
    let inbound = |cfg: &ProxyConfig| -> String {
        let l = cfg.of(ResourceType::Listener).and_then(|m| m.get("127.0.30.1_8000")).expect("the inbound listener");
        any_to_json(&l.any).unwrap().to_string()
    };

    let t = Translator::new(MeshConfig::default());
    let cell = t.key_cell().expect("the translator reads fetched keys");
    let before = t.generate(&httpbin, &applied).unwrap();
    assert!(inbound(&before).contains("lodestar-unfetched"), "not fetched yet: the key set that verifies nothing");
    assert!(!UNFETCHED_JWKS.contains("fetched-1"));

    cell.set(FetchedKeys { sets: [(uri.to_string(), fetched.into())].into() });
    let after = t.generate(&httpbin, &applied).unwrap();
    assert!(inbound(&after).contains("fetched-1") && !inbound(&after).contains("lodestar-unfetched"), "{}", inbound(&after));
    assert_eq!(after.revision, before.revision, "same store revision");
    let version = |c: &ProxyConfig| c.of(ResourceType::Listener).unwrap()["127.0.30.1_8000"].version.clone();
    assert_ne!(version(&after), version(&before));

    // Keys of a URI this proxy does not use (another namespace's policy):
    // its config is the one it had, not even re-translated.
    cell.set(FetchedKeys { sets: [(uri.to_string(), fetched.into()), ("https://bar.example.com/jwks.json".to_string(), fetched.into())].into() });
    let unrelated = t.generate(&httpbin, &applied).unwrap();
    for ty in ResourceType::PUSH_ORDER {
        match (after.resources.get(&ty), unrelated.resources.get(&ty)) {
            (Some(a), Some(b)) => assert!(Arc::ptr_eq(a, b), "{ty:?} was rebuilt"),
            (a, b) => assert_eq!(a.is_some(), b.is_some()),
        }
    }
    // And a fresh translation of the same inputs gives the same bytes.
    let fresh = Translator::new(MeshConfig::default());
    fresh.key_cell().unwrap().set(FetchedKeys { sets: [(uri.to_string(), fetched.into())].into() });
    assert_eq!(version(&fresh.generate(&httpbin, &applied).unwrap()), version(&after));
}

/// A DestinationRule's `credentialName` names Secrets only gateway proxies
/// are served: one Translator (one cluster cache) gives the gateway the
/// SDS-backed cluster and a sidecar of the same namespace a closed one (no
/// endpoints: never plaintext where the rule asked for TLS), whichever
/// asks first.
#[test]
fn credential_clusters_are_the_gateways_and_closed_for_sidecars() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/dr-credential");
    let applied = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let translator = Translator::new(MeshConfig::default());
    let name = "outbound|443||my-nginx.mesh-external.svc.cluster.local";
    let sidecar = ProxyIdentity::parse("sidecar~127.0.23.2~app.istio-system~istio-system.svc.cluster.local", &json!({})).unwrap();
    let gateway =
        ProxyIdentity::parse("router~127.0.23.1~egress.istio-system~istio-system.svc.cluster.local", &json!({"LABELS": {"istio": "egressgateway"}})).unwrap();
    let s = render(&translator.generate(&sidecar, &applied).unwrap());
    let g = render(&translator.generate(&gateway, &applied).unwrap());
    assert_eq!(s["CDS"][name]["type"], "STATIC", "{:#}", s["CDS"][name]);
    assert!(s["CDS"][name]["loadAssignment"]["endpoints"].as_array().is_none_or(Vec::is_empty), "{:#}", s["CDS"][name]);
    assert!(s["CDS"][name].get("transportSocket").is_none());
    let tls = &g["CDS"][name]["transportSocket"]["typedConfig"]["commonTlsContext"];
    assert_eq!(tls["tlsCertificateSdsSecretConfigs"][0]["name"], "client-credential", "{:#}", g["CDS"][name]);
    assert_eq!(tls["combinedValidationContext"]["validationContextSdsSecretConfig"]["name"], "client-credential-cacert");
}

/// EnvoyFilter patches through the translator's incremental paths: each
/// step (a VirtualService: incremental routes; an AuthorizationPolicy:
/// inbound listeners only; an endpoint: EDS only; an EnvoyFilter edited;
/// one another namespace's) gives what a full translation gives, so no
/// patch is lost or applied twice (a MERGE appends to repeated fields).
#[test]
fn envoyfilter_incremental_equals_full() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/envoyfilter-sidecar");
    let base = applied_from(&std::fs::read_to_string(dir.join("input.yaml")).unwrap());
    let proxy =
        ProxyIdentity::parse("sidecar~127.0.32.1~web-1.shop~shop.svc.cluster.local", &json!({"LABELS": {"app": "web"}, "ISTIO_VERSION": "1.30.3"})).unwrap();
    let translator = Translator::new(MeshConfig::default());
    let mut prev = translator.generate(&proxy, &base).unwrap();
    let steps: &[(&str, bool)] = &[
        ("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: reviews, namespace: shop}\nspec:\n  hosts: [reviews]\n  http:\n  - timeout: 3s\n    route:\n    - destination: {host: reviews}\n", true),
        ("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-get, namespace: shop}\nspec:\n  rules: [{to: [{operation: {methods: [GET]}}]}]\n", true),
        ("apiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {name: reviews-2, namespace: shop}\nspec: {service: reviews, address: 127.0.32.12, port: 19080}\n", true),
        ("apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: late, namespace: shop}\nspec:\n  configPatches:\n  - applyTo: CLUSTER\n    match: {context: SIDECAR_OUTBOUND, cluster: {service: db.shop.svc.cluster.local}}\n    patch: {operation: REMOVE}\n", true),
        // Not this proxy's: nothing is translated again.
        ("apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: theirs, namespace: other}\nspec:\n  configPatches:\n  - applyTo: CLUSTER\n    match: {cluster: {}}\n    patch: {operation: REMOVE}\n", false),
    ];
    let mut state = base.state.clone();
    for (i, (yaml, changes)) in steps.iter().enumerate() {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        let got = translator.generate(&proxy, &applied).unwrap();
        let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), &proxy);
        assert_eq!(render(&got), render(&want), "step {i}");
        // Generating again at the same revision serves the same patched config.
        assert_eq!(render(&translator.generate(&proxy, &applied).unwrap()), render(&want), "step {i}, again");
        assert_eq!(render(&got) != render(&prev), *changes, "step {i}: changed?");
        if i == 0 {
            // Only routes were rebuilt: the patched clusters and listeners are reused.
            for t in [ResourceType::Cluster, ResourceType::Listener] {
                assert!(Arc::ptr_eq(&got.resources[&t], &prev.resources[&t]), "step {i}: {t:?} patched again");
            }
        }
        prev = got;
    }
    let rds = render(&prev)["RDS"]["9080"].to_string();
    assert_eq!(rds.matches("x-vhost").count(), 1, "the vhost MERGE applied once: {rds}");
}

/// BackendTLSPolicies through the translator's incremental paths: a
/// sidecar that holds the targeted clusters gets, after each change (the
/// policy's hostname; the Secret its CA is missing from, written; one
/// Secret no policy names), what a full translation gives: a policy or a
/// CA Secret is no "unaffected" change.
#[test]
fn backend_tls_incremental_equals_full() {
    use lodestar::translate::Translator;
    use lodestar::xds::resources::Generator;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/translate/gateway-api-backend-tls");
    let input = std::fs::read_to_string(dir.join("input.yaml")).unwrap();
    let base = applied_from(&input);
    let ca: Value = yaml_serde::from_str(input.split("---").find(|d| d.contains("kind: Secret")).unwrap()).unwrap();
    let ca = ca["data"]["ca.crt"].as_str().unwrap().to_string();
    let proxy = ProxyIdentity::parse("sidecar~127.0.24.2~client.shop~shop.svc.cluster.local", &json!({})).unwrap();
    let translator = Translator::new(MeshConfig::default());
    let mut prev = translator.generate(&proxy, &base).unwrap();
    let steps = [
        "apiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {name: secure-tls, namespace: shop}\nspec:\n  targetRefs: [{group: \"\", kind: Service, name: secure, sectionName: https}]\n  validation:\n    caCertificateRefs: [{group: \"\", kind: Secret, name: secure-ca}]\n    hostname: other.shop.example\n".to_string(),
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: not-there, namespace: shop}}\ndata: {{ca.crt: {ca}}}\n"),
        format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: unrelated, namespace: shop}}\ndata: {{ca.crt: {ca}}}\n"),
    ];
    let mut state = base.state.clone();
    for (i, yaml) in steps.iter().enumerate() {
        let r = parse_resource(parse_documents(yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        let applied = Applied { state: state.clone(), ..Default::default() };
        let got = translator.generate(&proxy, &applied).unwrap();
        let want = translate(&Mesh::build(&applied, Arc::new(MeshConfig::default())), &proxy);
        assert_eq!(render(&got), render(&want), "step {i}");
        assert_eq!(render(&got)["CDS"] != render(&prev)["CDS"], i < 2, "step {i}: clusters changed?");
        prev = got;
    }
    let legacy = &render(&prev)["CDS"]["outbound|8080||legacy.shop.svc.cluster.local"];
    assert!(legacy["transportSocket"]["typedConfig"]["commonTlsContext"]["validationContext"]["trustedCa"]["inlineString"].is_string(), "{legacy:#}");
}
