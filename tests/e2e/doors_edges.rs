//! Issue 32, the network edges: what an attacker who can only reach the
//! ports (or holds a certificate of the cluster CA that names no member)
//! can no longer do, against real replica processes.
//!
//! - The abuse client (`lodestar-bench abuse`) finds the doors of items 8
//!   and 10 closed: metric labels from bogus paths, idle-connection floods
//!   (a flood from one address does not lock out another, even when the
//!   replica is short of descriptors), silent connections, slowloris.
//! - An xDS stream that stays quiet longer than the idle timeout is kept
//!   (Envoys' streams are long-lived); a node id carrying a newline and an
//!   ANSI sequence is logged on one line, escaped (item 12).
//! - The raft port refuses a non-member certificate before reading its
//!   message (item 15).

use crate::kit;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use kit::{results, Cluster};
use lodestar::proto::peer::raft_peer_client::RaftPeerClient;
use lodestar::proto::peer::Payload;
use lodestar::xds::resources::ResourceType;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Short timeouts, so that every door shows in seconds.
const TIMEOUTS_TOML: &str = "conn_idle_timeout_ms = 4000\nhttp_header_read_timeout_ms = 2000\ntls_handshake_timeout_ms = 2000\n";
/// Small per-source caps, and an idle timeout longer than a flood takes
/// (a flood slower than it would lose its connections to it anyway).
const CAPS_TOML: &str = "api_max_connections_per_source = 40\nxds_max_connections_per_source = 40\nconn_idle_timeout_ms = 60000\n";

/// `lodestar-bench abuse ARGS` against `api`: its `result:` line.
async fn abuse(api: &str, args: &[&str]) -> std::collections::BTreeMap<String, String> {
    let args: Vec<String> = std::iter::once("abuse").chain(args.iter().copied()).map(String::from).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kit::bench(api, &args).await;
    results(&out).pop().unwrap_or_else(|| panic!("no result line in\n{out}"))
}

fn held(r: &std::collections::BTreeMap<String, String>) {
    assert_eq!(r.get("held").map(String::as_str), Some("true"), "{r:?}");
}

/// The replica's open-file limit, set from outside (as `prlimit` does).
fn limit_open_files(pid: u32, n: u64) {
    let limit = libc::rlimit { rlim_cur: n, rlim_max: n };
    // SAFETY: prlimit(2) on our own child; reads only `limit`.
    let rc = unsafe { libc::prlimit(pid as libc::pid_t, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// Item 8, and item 10's caps, through the abuse client. The replica may
/// hold 120 files: without per-source caps, 200 idle connections from one
/// address take them all, and no one else gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metric_labels_and_connection_floods_from_one_address_are_bounded() {
    let c = Cluster::start(1, CAPS_TOML).await;
    let r = c.replica(1);
    let api = r.api();
    let prefix = r.ip.rsplit_once('.').unwrap().0.to_string();
    let (flood, other) = (format!("{prefix}.100"), format!("{prefix}.101"));

    // Item 10: floods of idle connections from one address, the replica
    // short of descriptors: another address is still served. (First: a
    // client of the test closing its connection meanwhile would free a
    // descriptor.)
    limit_open_files(r.pid().unwrap(), 120);
    for port in ["api", "xds"] {
        let r = abuse(&api, &["--scenario", "idle-flood", "--port", port, "--count", "200", "--source", &flood, "--other-source", &other]).await;
        held(&r);
        assert_eq!(kit::number(&r, "flood_open"), 40.0, "{r:?}");
    }
    // Item 8: 4,000 requests on distinct bogus paths and methods, without
    // credentials, add no series.
    held(&abuse(&api, &["--scenario", "metric-labels", "--count", "4000"]).await);
    let metrics = c.http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(!metrics.contains("abuse") && !metrics.contains("Bogus"), "a client's path or method is a label value:\n{metrics}");
    // A gRPC method the API has is still labelled by its name.
    kit::grpc_api(&api).cluster_status(lodestar::proto::api::ClusterStatusRequest {}).await.unwrap();
    let metrics = c.http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("route=\"/lodestar.api.v1.Lodestar/ClusterStatus\""), "{metrics}");
    for port in ["api", "xds"] {
        let series = format!("lodestar_connections_refused_total{{port=\"{port}\",reason=\"source_limit\"}} ");
        let refused: f64 = metrics.lines().find_map(|l| l.strip_prefix(&series)?.parse().ok()).unwrap_or(0.0);
        assert!(refused >= 160.0, "{series}{refused}:\n{metrics}");
    }
}

/// Item 10's timeouts through the abuse client: a connection that never
/// starts TLS, one that never sends a request (both ports), and a
/// slowloris, at once; each closed by the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_and_slowloris_are_closed() {
    let c = Cluster::start(1, TIMEOUTS_TOML).await;
    let r = c.replica(1);
    let api = r.api();
    let silent_api = ["--scenario", "silent-connections", "--port", "api", "--close-within-s", "10"];
    let silent_xds = ["--scenario", "silent-connections", "--port", "xds", "--close-within-s", "10"];
    let slowloris = ["--scenario", "slowloris", "--close-within-s", "10"];
    let (silent_api, silent_xds, slowloris) = tokio::join!(abuse(&api, &silent_api), abuse(&api, &silent_xds), abuse(&api, &slowloris));
    for r in [&silent_api, &silent_xds, &slowloris] {
        held(r);
    }
    // The slowloris was cut by the header timeout (2 s), not the idle one (4 s).
    assert!(kit::number(&slowloris, "closed_after_s") < 3.9, "{slowloris:?}");
    let metrics = c.http.get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    for series in [
        "lodestar_connections_closed_total{port=\"api\",reason=\"idle\"}",
        "lodestar_connections_closed_total{port=\"xds\",reason=\"idle\"}",
        "lodestar_connections_closed_total{port=\"api\",reason=\"header_timeout\"}",
        "lodestar_connections_closed_total{port=\"api\",reason=\"handshake_timeout\"}",
        "lodestar_connections_closed_total{port=\"xds\",reason=\"handshake_timeout\"}",
    ] {
        assert!(metrics.lines().any(|l| l.starts_with(series)), "no {series} in\n{metrics}");
    }
}

/// A node id with a newline and ANSI codes: one log line, escaped. And an
/// xDS stream quiet for longer than the idle timeout is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_streams_are_kept_and_node_ids_cannot_forge_log_lines() {
    let c = Cluster::start(1, TIMEOUTS_TOML).await;
    let r = c.replica(1);
    let forged = "2026-01-01T00:00:00Z  INFO lodestar::xds::server: forged";
    let id = format!("sidecar~127.0.0.9~evil\n{forged}\x1b[31m.default~default.svc.cluster.local");
    let first = DiscoveryRequest { type_url: ResourceType::Cluster.type_url(), node: Some(Node { id, ..Default::default() }), ..Default::default() };
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let mut stream = kit::ads_client(1, &r.xds_addr()).stream_aggregated_resources(ReceiverStream::new(rx)).await.expect("the stream opens").into_inner();
    stream.message().await.expect("a first response").expect("a first response");

    // Quiet for twice the idle timeout: still open.
    let quiet = tokio::time::timeout(Duration::from_millis(8000), stream.message()).await;
    assert!(quiet.is_err(), "the quiet stream ended: {quiet:?}");
    drop(tx);

    let deadline = Instant::now() + Duration::from_secs(10);
    let log = loop {
        let log = r.log();
        if log.contains("xDS stream opened") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!log.lines().any(|l| l.starts_with(forged)), "a forged log line:\n{log}");
    assert!(!log.contains('\x1b'), "an escape character reached the log:\n{log}");
    let line = log.lines().find(|l| l.contains("evil")).unwrap_or_else(|| panic!("the node id is not in the log:\n{log}"));
    assert!(line.contains(&format!(r"evil\n{forged}\u{{1b}}[31m")), "{line}");
}

/// A certificate of the cluster CA that names no member sends a 48 MiB
/// message to the raft port: refused before it is read, so the replica's
/// peak memory does not grow by the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raft_port_refuses_a_non_member_before_reading_its_message() {
    let c = Cluster::start(1, "").await;
    let r = c.replica(1);
    let pid = r.pid().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = kit::client_cert(dir.path(), "someone.example");
    let channel = kit::tls_channel(&r.raft_addr(), &lodestar::tls::pki::member_name(1), Some((&cert, &key)));
    let mut raft = RaftPeerClient::new(channel).max_encoding_message_size(64 << 20);
    let (_, hwm_before) = kit::memory_kib(pid);
    let started = Instant::now();
    let err = raft.append_entries(Payload { data: vec![7; 48 << 20] }).await.expect_err("a non-member's message");
    let took = started.elapsed();
    let (_, hwm_after) = kit::memory_kib(pid);
    let grew = hwm_after.saturating_sub(hwm_before);
    println!("raft: refused a 48 MiB message in {took:?}; the replica's peak memory grew {grew} KiB");
    assert!(grew < 16 * 1024, "the replica took in the message: its peak memory grew {grew} KiB ({err:?})");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("names none"), "{err:?}");
    // And the replica carries on.
    let (status, body) = kit::apply(&c.http, &r.api(), vec![kit::vs("after", "default", "v1")]).await;
    assert_eq!(status, 200, "{body}");
}
