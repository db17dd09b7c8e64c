//! Three-replica behaviour with real processes: forwarding, linearizable
//! reads, leader failure under load, snapshot catch-up, membership changes.

use crate::kit;

use kit::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

async fn follower_of(c: &Cluster) -> (u64, u64) {
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let follower = c.replicas.iter().map(|r| r.id).find(|&id| id != leader).unwrap();
    (leader, follower)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_follower_reads_everywhere() {
    let c = Cluster::start(3, "").await;
    let (_leader, follower) = follower_of(&c).await;

    // Phase 1: a write sent to a follower is forwarded and acknowledged.
    let (status, body) = apply(&c.http, &c.replica(follower).api(), vec![vs("reviews", "default", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let revision = body["revision"].as_u64().unwrap();
    assert!(revision >= 1);
    assert_eq!(body["items"][0]["action"], "created");

    // Phase 2: a linearizable read on every replica sees it, right away.
    for r in &c.replicas {
        let (status, obj) = get_json(&c.http, &format!("{}/v1/resources/vs/default/reviews", r.api())).await;
        assert_eq!(status, 200, "replica {}: {obj}", r.id);
        assert_eq!(obj["spec"]["http"][0]["route"][0]["destination"]["subset"], "v1");
        assert_eq!(obj["metadata"]["resourceVersion"], revision.to_string());
    }

    // Phase 3: every replica reports the same revision for the same state.
    c.wait_for_revision(revision, Duration::from_secs(10)).await;
    let mut revs = Vec::new();
    for r in &c.replicas {
        revs.push(c.local_revision(r.id).await.unwrap());
    }
    assert!(revs.iter().all(|&v| v == revision), "revisions differ: {revs:?}");

    // Phase 4: cluster status lists three voters and one leader.
    let s = c.status(follower).await.unwrap();
    let members = s["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    assert!(members.iter().all(|m| m["role"] == "voter"));
    assert_eq!(members.iter().filter(|m| m["status"]["state"] == "leader").count(), 1, "{s}");
    assert!(members.iter().all(|m| m["status"]["revision"].as_u64() == Some(revision)), "{s}");
}

/// Writes keep flowing (round-robin over replicas, skipping dead ones) while
/// the leader is SIGKILLed; every acknowledged write survives on every node,
/// including the restarted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_kill_loses_no_acknowledged_write() {
    let mut c = Cluster::start(3, "").await;
    let apis: Vec<String> = c.replicas.iter().map(|r| r.api()).collect();
    let http = c.http.clone();

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(async move {
        // Bounded: at most 600 attempts or 60 s.
        let mut acked: BTreeMap<String, u64> = BTreeMap::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut i = 0usize;
        while i < 600 && Instant::now() < deadline && !*stop_rx.borrow() {
            let name = format!("w{i}");
            let api = &apis[i % apis.len()];
            let resp = http
                .post(format!("{api}/v1/apply"))
                .json(&serde_json::json!({"resources": [vs(&name, "load", "v1")]}))
                .timeout(Duration::from_secs(12))
                .send()
                .await;
            if let Ok(r) = resp {
                if r.status().as_u16() == 200 {
                    let body: Value = r.json().await.unwrap();
                    acked.insert(name, body["revision"].as_u64().unwrap());
                }
            }
            i += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        acked
    });

    // Let some writes land, then kill the leader mid-stream.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let old_leader = c.wait_for_leader(Duration::from_secs(10)).await;
    c.kill(old_leader);
    let t = Instant::now();
    let new_leader = c.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, old_leader);
    eprintln!("new leader {new_leader} after {:?}", t.elapsed());

    // Writes continue under the new leader.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    c.restart(old_leader);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _ = stop_tx.send(true);
    let acked = writer.await.unwrap();
    assert!(acked.len() > 20, "too few acknowledged writes: {}", acked.len());
    let max_rev = *acked.values().max().unwrap();
    let after_kill = acked.values().filter(|&&r| r > 0).count();
    eprintln!("{} acknowledged writes, max revision {max_rev}, {after_kill}", acked.len());

    // Every acknowledged write is on every replica, the restarted one included.
    c.wait_for_revision(max_rev, Duration::from_secs(30)).await;
    for r in &c.replicas {
        let (status, list) = get_json(&c.http, &format!("{}/v1/resources/vs?namespace=load&consistency=stale", r.api())).await;
        assert_eq!(status, 200);
        let names: std::collections::BTreeSet<String> =
            list["items"].as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_string()).collect();
        let missing: Vec<&String> = acked.keys().filter(|n| !names.contains(*n)).collect();
        assert!(missing.is_empty(), "replica {} lost acknowledged writes: {missing:?}", r.id);
    }
}

/// A replica that misses enough writes to force a snapshot and log purge
/// catches up through the snapshot when it comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lagging_replica_catches_up_by_snapshot() {
    let mut c = Cluster::start(3, "snapshot_logs = 40\nlogs_to_keep = 5\n").await;
    let (leader, follower) = follower_of(&c).await;
    c.stop(follower);

    // 150 single-resource writes: several snapshots, log purged behind them.
    let api = c.replica(leader).api();
    let mut last = 0;
    for i in 0..150 {
        let (status, body) = apply(&c.http, &api, vec![vs(&format!("s{i}"), "snap", "v1")]).await;
        assert_eq!(status, 200, "{body}");
        last = body["revision"].as_u64().unwrap();
    }
    // The leader purged its log: a snapshot is the only way to catch up.
    until("the leader builds a snapshot", Duration::from_secs(10), || async { c.replica(leader).log().contains("built snapshot") }).await;

    c.restart(follower);
    c.wait_for_revision(last, Duration::from_secs(30)).await;
    assert!(c.replica(follower).log().contains("installed snapshot"), "follower did not install a snapshot");
    let (status, list) = get_json(&c.http, &format!("{}/v1/resources/vs?namespace=snap&consistency=stale", c.replica(follower).api())).await;
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 150);
    assert_eq!(list["revision"].as_u64(), Some(last));

    // And it takes part in new writes afterwards.
    let (status, body) = apply(&c.http, &c.replica(follower).api(), vec![vs("after", "snap", "v2")]).await;
    assert_eq!(status, 200, "{body}");
}

/// Add a fourth replica (learner, then voter), then remove one, with writes
/// before, during and after; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_and_remove_members() {
    let mut c = Cluster::start(3, "").await;
    let api1 = c.replica(1).api();
    for i in 0..20 {
        let (status, body) = apply(&c.http, &api1, vec![vs(&format!("m{i}"), "members", "v1")]).await;
        assert_eq!(status, 200, "{body}");
    }

    // Phase 1: add node 4 through the CLI, against a replica that may be a follower.
    let joiner = c.spawn_joiner(4, "");
    let (raft, apia, xds) = (joiner.raft_addr(), joiner.api_addr(), joiner.xds_addr());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let out = kit::cli_command()
        .args(["--server", &api1, "cluster", "add-node", "--id", "4", "--raft-addr", &raft, "--api-addr", &apia, "--xds-addr", &xds])
        .output()
        .unwrap();
    assert!(out.status.success(), "add-node: {}", String::from_utf8_lossy(&out.stderr));
    let s = c.status(1).await.unwrap();
    let m4 = s["members"].as_array().unwrap().iter().find(|m| m["id"] == 4).cloned().expect("node 4 listed");
    assert_eq!(m4["role"], "voter", "{s}");

    // Node 4 has the old data and serves linearizable reads.
    let (status, list) = get_json(&c.http, &format!("{}/v1/resources/vs?namespace=members", c.replica(4).api())).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["items"].as_array().unwrap().len(), 20);

    // Phase 2: remove node 2 (whatever its role) and stop it.
    let out = kit::cli_command().args(["--server", &api1, "cluster", "remove-node", "2"]).output().unwrap();
    assert!(out.status.success(), "remove-node: {}", String::from_utf8_lossy(&out.stderr));
    c.stop(2);
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(leader, 2);
    let s = c.status(leader).await.unwrap();
    let ids: Vec<u64> = s["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 3, 4]);

    // Phase 3: writes still commit with the new membership, and nothing is lost.
    let (status, body) = apply(&c.http, &c.replica(4).api(), vec![vs("after", "members", "v2")]).await;
    assert_eq!(status, 200, "{body}");
    for id in [1, 3, 4] {
        let (status, list) = get_json(&c.http, &format!("{}/v1/resources/vs?namespace=members", c.replica(id).api())).await;
        assert_eq!(status, 200);
        assert_eq!(list["items"].as_array().unwrap().len(), 21, "replica {id}");
    }
}
