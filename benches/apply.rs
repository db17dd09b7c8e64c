//! The in-memory write path, per write, without IO or the network:
//!
//! - `validate`: what the replica a client talks to does with one ~1 KiB
//!   VirtualService as `lodestar-bench write` sends it over gRPC: parse the
//!   JSON text, then `api::apply_txn` (structure, typed validation,
//!   canonical text).
//! - `apply_publish`: what every replica's state machine does with it:
//!   `State::apply_txn` on a copy of the published state (a store of 4,096
//!   objects, the bench's key space at 64 clients), 32 writes per raft
//!   entry, then the new state replaces the published one (the old one is
//!   dropped, as readers let go of it).
//!
//! cargo bench --bench apply   (LODESTAR_BENCH_OBJECTS=N for another store size)

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lodestar::api::{apply_txn, ApplyItem};
use lodestar::store::state::State;
use lodestar::store::types::Txn;
use serde_json::{json, Value};

const PER_ENTRY: usize = 32;

fn objects() -> usize {
    std::env::var("LODESTAR_BENCH_OBJECTS").ok().and_then(|v| v.parse().ok()).unwrap_or(4096)
}

/// The document `lodestar-bench write` sends (1 KiB of padding).
fn doc(i: usize, seq: u64) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": format!("bench-64-{}-{}", i / 64, i % 64), "namespace": "bench",
                     "annotations": {"bench.lodestar.io/seq": format!("1-{seq}"), "bench.lodestar.io/pad": "x".repeat(1024)}},
        "spec": {"hosts": [format!("svc-{}.bench.svc.cluster.local", i / 64)],
                 "http": [{"route": [{"destination": {"host": format!("svc-{}", i / 64), "subset": "v1"}}]}]}})
}

fn txn(i: usize, seq: u64) -> Txn {
    apply_txn(vec![ApplyItem { resource: doc(i, seq), expected_revision: None }], Default::default()).expect("valid").0
}

fn bench(c: &mut Criterion) {
    let n = objects();
    let mut g = c.benchmark_group("write");
    g.throughput(Throughput::Elements(1));
    let texts: Vec<String> = (0..256).map(|i| doc(i * 13 % n, i as u64).to_string()).collect();
    let mut i = 0;
    g.bench_function("validate", |b| {
        b.iter(|| {
            i += 1;
            let resource = serde_json::from_str(&texts[i % texts.len()]).expect("JSON");
            apply_txn(vec![ApplyItem { resource, expected_revision: None }], Default::default()).expect("valid")
        })
    });

    let mut published = State::default();
    for i in 0..n {
        published.apply_txn(&txn(i, 0)).0.expect("applied");
    }
    // Txns made ahead (the log carries them), keys spread like the bench's.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let entries: Vec<Vec<Txn>> = (0..64)
        .map(|e| {
            (0..PER_ENTRY)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    txn(rng as usize % n, e + 1)
                })
                .collect()
        })
        .collect();
    g.throughput(Throughput::Elements(PER_ENTRY as u64));
    let mut e = 0;
    g.bench_function("apply_publish", |b| {
        b.iter(|| {
            let mut next = published.clone();
            for t in &entries[e % entries.len()] {
                next.apply_txn(t).0.expect("applied");
            }
            e += 1;
            published = next;
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(5));
    targets = bench
}
criterion_main!(benches);
