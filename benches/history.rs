//! History's disk cost (issue 35): 10,000 revisions, each one 1 KiB
//! VirtualService change (100 objects written in turn), applied to a real
//! state machine on sled as raft applies them (stamped entries of 10
//! revisions), then checkpointed. Reports the bytes the history keeps in
//! the state tree (`g/` chunks, `a/` authors, `t/` marks), per revision, and
//! sled's size on disk with the whole history kept and with only the last
//! 10 revisions kept.
//!
//! cargo bench --profile dev --bench history   (no timing: sizes only, so
//! an unoptimised build gives the same figures; LODESTAR_BENCH_REVISIONS=N)

use lodestar::model::{Kind, ResourceKey};
use lodestar::store::retention::Retention;
use lodestar::store::state_machine::StateMachine;
use lodestar::store::types::{Author, Command, Entry, Group, LogId, Op, Txn};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, EntryPayload};

fn revisions() -> u64 {
    std::env::var("LODESTAR_BENCH_REVISIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

/// A ~1 KiB VirtualService, as `lodestar-bench write` sends.
fn put(i: u64) -> Txn {
    let name = format!("bench-{}", i % 100);
    let key = ResourceKey::new(Kind::VirtualService, "bench", name.clone());
    let body = serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": "bench", "annotations": {"seq": i.to_string(), "pad": "x".repeat(900)}},
        "spec": {"hosts": [format!("svc-{}", i % 100)], "http": [{"route": [{"destination": {"host": format!("svc-{}", i % 100)}}]}]}});
    let author = Op::Author(Author { name: "token:0f3c9a2e".into(), message: None });
    Txn { ops: vec![Op::Put { key, body: body.to_string().into(), expected_revision: None }, author] }
}

struct Sizes {
    history_bytes: u64,
    on_disk: u64,
    body_bytes: u64,
}

async fn run(retention: Retention) -> Sizes {
    let tmp = tempfile::tempdir().unwrap();
    let db = sled::Config::new().path(tmp.path()).open().unwrap();
    let (mut sm, reader) = StateMachine::open(&db, retention).unwrap();
    let (n, per_entry) = (revisions(), 10);
    let mut body_bytes = 0;
    let start_ms = 1_790_000_000_000;
    for e in 0..n / per_entry {
        let txns: Vec<Txn> = (0..per_entry).map(|j| put(e * per_entry + j)).collect();
        body_bytes += txns.iter().map(|t| if let Op::Put { body, .. } = &t.ops[0] { body.len() as u64 } else { 0 }).sum::<u64>();
        let groups = vec![Group { id: None, txns }];
        // One entry a second: 10,000 revisions over ~17 minutes.
        let payload = EntryPayload::Normal(Command::Stamped { unix_ms: start_ms + e * 1000, groups });
        sm.apply([Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), e + 1), payload }]).await.unwrap();
    }
    reader.checkpoint().unwrap();
    // Once more, so that the compaction the last checkpoint allowed is done.
    sm.apply([Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), n + 1), payload: EntryPayload::Blank }]).await.unwrap();
    reader.checkpoint().unwrap();
    drop((sm, reader));
    db.flush().unwrap();
    let tree = db.open_tree("state").unwrap();
    let history_bytes =
        [&b"g/"[..], b"a/", b"t/"].iter().flat_map(|p| tree.scan_prefix(p)).map(|kv| kv.map(|(k, v)| (k.len() + v.len()) as u64).unwrap()).sum();
    Sizes { history_bytes, on_disk: db.size_on_disk().unwrap(), body_bytes }
}

#[tokio::main]
async fn main() {
    let n = revisions();
    let all = run(Retention { revisions: n * 10, max_age_ms: 0 }).await;
    let last = run(Retention::from(10)).await;
    println!("revisions: {n} of ~{} B bodies ({} B of bodies in all)", all.body_bytes / n, all.body_bytes);
    println!(
        "history kept whole: {} B in the state tree ({} B a revision, {:.2}x the bodies); sled on disk {:.1} MiB",
        all.history_bytes,
        all.history_bytes / n,
        all.history_bytes as f64 / all.body_bytes as f64,
        all.on_disk as f64 / 1048576.0
    );
    println!("history_revisions = 10: {} B in the state tree; sled on disk {:.1} MiB", last.history_bytes, last.on_disk as f64 / 1048576.0);
    // sled is log-structured: space freed by compaction is reused, not
    // returned at once, so its size on disk is not the history's cost.
    println!("=> per 10,000 revisions of these changes: {:.1} MiB of history records", all.history_bytes as f64 * 10_000.0 / n as f64 / 1048576.0);
}
