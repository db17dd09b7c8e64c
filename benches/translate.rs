//! Translation cost for one proxy in a mesh of 1,000 services, each with a
//! VirtualService (header match + 80/20 split), a DestinationRule (two
//! subsets) and two registry instances.
//!
//! - `full`: a cold translator builds the mesh and translates everything.
//! - `incremental_one_vs`: a warm translator after one VirtualService
//!   changed (a new store revision): what a push costs.
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

fn mesh_docs() -> Vec<Value> {
    let mut docs = Vec::new();
    for i in 0..services() {
        docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "namespace": "default"},
            "spec": {"ports": [{"name": "http", "number": 80, "targetPort": 8080}]}}));
        for v in 1..=2 {
            docs.push(json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
                "metadata": {"name": format!("svc-{i}-v{v}"), "namespace": "default", "labels": {"version": format!("v{v}")}},
                "spec": {"service": format!("svc-{i}"), "address": format!("10.{}.{}.{v}", i / 250, i % 250), "port": 8080}}));
        }
        docs.push(vs(i, 80));
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

fn bench(c: &mut Criterion) {
    let mut state = State::default();
    for d in mesh_docs() {
        put(&mut state, d);
    }
    let base = Applied { state, ..Default::default() };
    let proxy = ProxyIdentity::parse("sidecar~127.0.0.2~client.default~default.svc.cluster.local", &json!({})).unwrap();

    let cfg = Translator::new(MeshConfig::default()).generate(&proxy, &base).unwrap();
    eprintln!(
        "mesh: {} services; proxy gets {} clusters, {} endpoints, {} listeners, {} routes",
        services(),
        cfg.of(ResourceType::Cluster).map_or(0, |m| m.len()),
        cfg.of(ResourceType::Endpoint).map_or(0, |m| m.len()),
        cfg.of(ResourceType::Listener).map_or(0, |m| m.len()),
        cfg.of(ResourceType::Route).map_or(0, |m| m.len()),
    );

    c.bench_function("mesh_build", |b| b.iter(|| lodestar::mesh::Mesh::build(&base, std::sync::Arc::new(MeshConfig::default()))));

    c.bench_function("full", |b| b.iter(|| Translator::new(MeshConfig::default()).generate(&proxy, &base).unwrap()));

    let translator = Translator::new(MeshConfig::default());
    translator.generate(&proxy, &base).unwrap();
    let mut current = base.state.clone();
    let mut split = 80;
    c.bench_function("incremental_one_vs", |b| {
        b.iter_batched(
            || {
                // One VirtualService changes: the next store revision.
                split = if split == 80 { 70 } else { 80 };
                put(&mut current, vs(services() / 2, split));
                Applied { state: current.clone(), ..Default::default() }
            },
            |next| translator.generate(&proxy, &next).unwrap(),
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
