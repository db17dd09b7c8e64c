//! A leader that stops answering (SIGSTOP: alive, silent, its connections
//! open) must not stall the majority side: writes and linearizable reads
//! sent to the other replicas right after the pause succeed once they
//! elect a new leader, without the client retrying. And a forward that is
//! sent again (as a follower does when it cannot tell whether the first
//! one arrived) is applied once.

use crate::kit;

use kit::*;
use lodestar::model::{Kind, ResourceKey};
use lodestar::node::{ForwardReply, ForwardRequest};
use lodestar::proto::peer::raft_peer_client::RaftPeerClient;
use lodestar::proto::peer::Payload;
use lodestar::store::codec;
use lodestar::store::types::{Command, Group, Op, RequestId, Txn};
use serde_json::Value;
use std::time::{Duration, Instant};

/// The leader is SIGSTOPped with a write and a read in flight to it from
/// the followers: both are answered (not timed out) through the new leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_reads_through_followers_survive_a_paused_leader() {
    let mut c = Cluster::start(3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let followers: Vec<u64> = c.replicas.iter().map(|r| r.id).filter(|&id| id != leader).collect();
    let (writer, reader) = (followers[0], followers[1]);

    // Phase 1: the forwarding path is warm (connections to the leader open).
    let (status, body) = apply(&c.http, &c.replica(writer).api(), vec![vs("before", "failover", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = get_json(&c.http, &format!("{}/v1/resources/vs/failover/before", c.replica(reader).api())).await;
    assert_eq!(status, 200, "{body}");

    // Phase 2: pause the leader, then at once write through one follower
    // and read through the other. One attempt each: no client retry.
    c.pause(leader);
    let paused = Instant::now();
    let http = c.http.clone();
    let write_api = c.replica(writer).api();
    let write = tokio::spawn(async move {
        let r = http
            .post(format!("{write_api}/v1/apply"))
            .json(&serde_json::json!({"resources": [vs("after", "failover", "v2")]}))
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .expect("write request");
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap_or(Value::Null), paused.elapsed())
    });
    let http = c.http.clone();
    let read_url = format!("{}/v1/resources/vs/failover/before", c.replica(reader).api());
    let read = tokio::spawn(async move {
        let r = http.get(read_url).timeout(Duration::from_secs(30)).send().await.expect("read request");
        (r.status().as_u16(), paused.elapsed())
    });

    // When the majority side has a new leader (as the writer sees it: its
    // own status, which asks no other replica).
    let node_url = format!("{}/v1/node", c.replica(writer).api());
    let elected = loop {
        let s = c.http.get(&node_url).timeout(Duration::from_secs(2)).send().await.ok();
        let s = match s {
            Some(r) => r.json::<Value>().await.ok(),
            None => None,
        };
        if let Some(l) = s.as_ref().and_then(|s| s["leader"].as_u64()).filter(|&l| l != leader) {
            break (l, paused.elapsed());
        }
        assert!(paused.elapsed() < Duration::from_secs(30), "no new leader within 30s of pausing {leader}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (write_status, write_body, write_took) = write.await.unwrap();
    let (read_status, read_took) = read.await.unwrap();
    println!(
        "figure: leader {leader} paused; new leader {} elected after {:?}; write via follower {writer} answered after {write_took:?} ({write_status}); linearizable read via follower {reader} after {read_took:?} ({read_status})",
        elected.0, elected.1
    );
    assert_eq!(write_status, 200, "the write through follower {writer} failed after the leader was paused: {write_body}");
    assert_eq!(read_status, 200, "the linearizable read through follower {reader} failed after the leader was paused");
    let revision = write_body["revision"].as_u64().unwrap();

    // Phase 3: the old leader comes back, catches up, and every replica
    // holds the write once (the revision advanced by one for it).
    c.resume(leader);
    c.wait_for_revision(revision, Duration::from_secs(20)).await;
    for r in &c.replicas {
        let (status, obj) = get_json(&c.http, &format!("{}/v1/resources/vs/failover/after?consistency=stale", r.api())).await;
        assert_eq!(status, 200, "replica {}: {obj}", r.id);
        assert_eq!(obj["metadata"]["resourceVersion"], revision.to_string(), "replica {}", r.id);
    }
}

/// Sent on the raft port as a follower sends it: member `from`'s
/// certificate, to the leader.
async fn forward_as(c: &Cluster, from: u64, to: u64, req: &ForwardRequest) -> Result<ForwardReply, lodestar::error::Error> {
    forward_call_as(c, from, to, req).await.expect("forward call")
}

/// As `forward_as`, with the call's own status.
async fn forward_call_as(c: &Cluster, from: u64, to: u64, req: &ForwardRequest) -> Result<Result<ForwardReply, lodestar::error::Error>, tonic::Status> {
    let ca = test_ca();
    let ip = c.replica(from).ip.clone();
    let (cert, key) = lodestar::tls::pki::issue_member(&ca.ca_pem, &std::fs::read_to_string(&ca.ca_key_file).unwrap(), from, &[ip]).unwrap();
    let dir = c.tmp.path().join(format!("member-{from}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_file, key_file) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let channel = tls_channel(&c.replica(to).raft_addr(), &lodestar::tls::pki::member_name(to), Some((&cert_file, &key_file)));
    let mut raft = RaftPeerClient::new(channel);
    let reply = raft.forward(Payload { data: codec::encode(req) }).await?.into_inner();
    Ok(codec::decode(&reply.data).expect("a forward reply"))
}

/// A forwarded write sent twice with the same request id (what a follower
/// does when the leader it sent to is replaced before answering) is
/// applied once: the second answer is the first's, the revision advances
/// once. The write is a create-if-absent, so applying it twice would show
/// as a conflict; under a new id it does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_sent_twice_is_applied_once() {
    let c = Cluster::start(3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let follower = c.replicas.iter().map(|r| r.id).find(|&id| id != leader).unwrap();
    let key = ResourceKey::new(Kind::VirtualService, "failover", "twice");
    let body = vs("twice", "failover", "v1").to_string();
    let create = Txn { ops: vec![Op::Put { key, body: body.into(), expected_revision: Some(0) }] };
    let write = |seq: u64| ForwardRequest::Write(Command::Groups(vec![Group { id: Some(RequestId { origin: follower, seq }), txns: vec![create.clone()] }]));

    let first = forward_as(&c, follower, leader, &write(41)).await;
    let Ok(ForwardReply::Write(first)) = first else { panic!("the first forward: {first:?}") };
    let revision = first[0].as_ref().expect("created").revision;
    c.wait_for_revision(revision, Duration::from_secs(10)).await;

    let again = forward_as(&c, follower, leader, &write(41)).await;
    let Ok(ForwardReply::Write(again)) = again else { panic!("the forward sent again: {again:?}") };
    assert_eq!(again, first, "the retry answers with the first attempt's results");

    // A write after it shows where the revision is: one past the create.
    let (status, next) = apply(&c.http, &c.replica(follower).api(), vec![vs("after-twice", "failover", "v1")]).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["revision"].as_u64(), Some(revision + 1), "the repeated forward changed nothing");

    // The same transaction under a new id is a new write: it conflicts.
    let other = forward_as(&c, follower, leader, &write(42)).await;
    let Ok(ForwardReply::Write(other)) = other else { panic!("the forward with a new id: {other:?}") };
    let err = other[0].as_ref().expect_err("a second create of the same object conflicts");
    assert_eq!(err.code, lodestar::error::Code::Conflict, "{err}");
}

/// A member cannot forward a write under another member's request ids
/// (which the leader deduplicates on): the raft port checks each id's
/// origin against the caller's certificate, and refuses the forward
/// before anything is proposed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_with_another_members_request_id_is_refused() {
    let c = Cluster::start(3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let mut followers = c.replicas.iter().map(|r| r.id).filter(|&id| id != leader);
    let (forger, victim) = (followers.next().unwrap(), followers.next().unwrap());
    let key = ResourceKey::new(Kind::VirtualService, "failover", "forged");
    let create = Txn { ops: vec![Op::Put { key, body: vs("forged", "failover", "v1").to_string().into(), expected_revision: Some(0) }] };
    let write = |origin: u64| ForwardRequest::Write(Command::Groups(vec![Group { id: Some(RequestId { origin, seq: 77 }), txns: vec![create.clone()] }]));

    let refused = forward_call_as(&c, forger, leader, &write(victim)).await.expect_err("a forged origin is refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains(&format!("names member {forger}, a forwarded write's request id names member {victim}")), "{}", refused.message());
    let (status, obj) = get_json(&c.http, &format!("{}/v1/resources/vs/failover/forged", c.replica(leader).api())).await;
    assert_eq!(status, 404, "the forged write was applied: {obj}");

    // Under its own origin the same write goes through.
    let own = forward_as(&c, forger, leader, &write(forger)).await;
    let Ok(ForwardReply::Write(own)) = own else { panic!("the forward under its own id: {own:?}") };
    assert!(own[0].is_ok(), "{own:?}");
}
