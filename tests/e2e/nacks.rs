//! The NACK guard rail (issue 35): a proxy's NACK reaches `lodestar nacks`
//! (every replica's `GET /v1/nacks`, merged) within a second, with the
//! proxy, the type, the rejected revision and Envoy's error; `apply --wait
//! --revert-on-nack` rolls a rejected write back as one new revision that
//! the proxy then accepts, and fails naming the NACK.
//!
//! The proxy is a real ADS client (tonic) that rejects on purpose: a
//! config that passes validation and that a real Envoy refuses is not
//! something this control plane knowingly serves.

use crate::kit;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use kit::*;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ID: &str = "sidecar~127.0.0.79~rejecter.default~default.svc.cluster.local";

fn service(name: &str, port: u16) -> serde_json::Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry", "metadata": {"name": name, "namespace": "default"},
           "spec": {"hosts": [format!("{name}.example.com")], "ports": [{"number": port, "name": "http", "protocol": "HTTP"}],
                    "resolution": "STATIC", "endpoints": [{"address": "127.0.0.1"}]}})
}

struct Proxy {
    tx: tokio::sync::mpsc::Sender<DiscoveryRequest>,
    inbound: tonic::Streaming<DiscoveryResponse>,
}

impl Proxy {
    async fn connect(addr: &str) -> Proxy {
        let mut client = ads_client(1, addr);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let node = Node { id: ID.into(), cluster: "test".into(), ..Default::default() };
        tx.send(DiscoveryRequest { node: Some(node), type_url: CLUSTER_TYPE.into(), ..Default::default() }).await.unwrap();
        let inbound = client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
        Proxy { tx, inbound }
    }

    async fn next(&mut self, what: &str) -> DiscoveryResponse {
        tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
            .await
            .unwrap_or_else(|_| panic!("{what}: no response within 10 s"))
            .unwrap()
            .unwrap()
    }

    async fn answer(&self, r: &DiscoveryResponse, nack: Option<&str>) {
        let req = DiscoveryRequest {
            type_url: CLUSTER_TYPE.into(),
            version_info: if nack.is_some() { String::new() } else { r.version_info.clone() },
            response_nonce: r.nonce.clone(),
            error_detail: nack.map(|m| RpcStatus { code: 3, message: m.into(), details: vec![] }),
            ..Default::default()
        };
        self.tx.send(req).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nacks_are_reported_at_once_and_revert_on_nack_rolls_back() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    applied(&c.http, &api, vec![service("good", 8080)]).await;
    let mut proxy = Proxy::connect(&c.replica(1).xds_addr()).await;
    let first = proxy.next("the first clusters").await;
    proxy.answer(&first, None).await;

    // Who the NACKs are shown to: those who may read the cluster.
    let (status, _) = kit::call(token_client(None).get(format!("{api}/v1/nacks"))).await;
    assert_eq!(status, 401);
    applied(
        &c.http,
        &api,
        vec![json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "ns-reader"},
                                      "spec": {"rules": [{"verbs": ["read"], "kinds": ["*"], "namespaces": ["default"]}]}})],
    )
    .await;
    let t = token_create(&api, &["--policy", "ns-reader"]);
    let (status, body) = kit::call(token_client(Some(t["secret"].as_str().unwrap())).get(format!("{api}/v1/nacks"))).await;
    assert_eq!(status, 403, "a namespace's reader: {body}");

    // `lodestar nacks`, watching every member, until one NACK.
    let mut watch =
        cli_command().args(["--server", &api, "nacks", "--count", "1", "--timeout", "30s"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let stderr = watch.stderr.take().unwrap();
    let ready = std::thread::spawn(move || {
        let mut lines = BufReader::new(stderr).lines();
        lines.find(|l| l.as_ref().is_ok_and(|l| l.contains("watching NACKs on 1 replica(s)"))).is_some()
    });
    assert!(ready.join().unwrap(), "the watch started");

    let revision = applied(&c.http, &api, vec![service("bad", 8081)]).await;
    let pushed = proxy.next("the clusters with bad").await;
    assert_eq!(pushed.version_info, revision.to_string());
    let sent = Instant::now();
    proxy.answer(&pushed, Some("cluster bad.example.com: rejected on purpose")).await;
    let out = tokio::task::spawn_blocking(move || watch.wait_with_output().unwrap()).await.unwrap();
    let took = sent.elapsed();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert_eq!(text.trim(), format!("replica 1: rejecter.default rejected CDS version {revision}: cluster bad.example.com: rejected on purpose"));
    assert!(took < Duration::from_secs(1), "reported {took:?} after the NACK");

    // The same rejection of an apply with --revert-on-nack: rolled back as
    // one new revision, which the proxy accepts; the CLI fails naming it.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("worse.yaml");
    std::fs::write(&file, serde_json::to_string(&service("good", 9090)).unwrap()).unwrap();
    let mut apply = cli_command()
        .args(["--server", &api, "apply", "-f", file.to_str().unwrap(), "--wait", "--timeout", "20s", "--revert-on-nack"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pushed = proxy.next("the clusters of the apply to revert").await;
    let worse: u64 = pushed.version_info.parse().unwrap();
    assert_eq!(worse, revision + 1);
    proxy.answer(&pushed, Some("cluster good.example.com: port 9090 rejected on purpose")).await;
    // The revert arrives: the good port again, at a new revision.
    let reverted = proxy.next("the reverted clusters").await;
    assert_eq!(reverted.version_info, (worse + 1).to_string());
    proxy.answer(&reverted, None).await;
    let out = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while apply.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = apply.kill();
        apply.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("port 9090 rejected on purpose"), "{err}");
    assert!(err.contains(&format!("rolled back (--revert-on-nack): revision {} restores", worse + 1)), "{err}");
    let (_, se) = get_json(&c.http, &format!("{api}/v1/resources/se/default/good")).await;
    assert_eq!(se["spec"]["ports"][0]["number"], 8080, "the store holds the ServiceEntry as before the rejected write");
    until("the audit line naming the revert", Duration::from_secs(5), || async {
        c.replica(1).log().lines().any(|l| l.contains("\"op\":\"POST /v1/rollback\"") && l.contains("\"outcome\":\"ok\""))
    })
    .await;
}
