//! Backup and restore with real processes: `snapshot save` from a running
//! cluster, `snapshot restore` into the data dirs of a new cluster on other
//! addresses, and the refusals (corrupt or foreign file, used data dir).

use crate::kit;

use kit::*;
use lodestar::proto::api::SnapshotRequest;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

/// Every kind a backup must carry: Istio's and the registry's.
const KINDS: &[&str] = &["vs", "dr", "se", "gw", "sidecar", "we", "svc", "instance"];

const MESH: &str = r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: reviews, namespace: shop}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{number: 9080, name: http, protocol: HTTP}]
  endpoints:
  - {address: 127.0.10.1, labels: {version: v1}}
  - {address: 127.0.10.2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: reviews, namespace: shop}
spec:
  host: reviews
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: shop-gateway, namespace: shop}
spec:
  selector: {istio: ingressgateway}
  servers:
  - port: {number: 8080, name: http, protocol: HTTP}
    hosts: ["*"]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: shop}
spec:
  egress:
  - hosts: ["./*", "istio-system/*"]
---
apiVersion: networking.istio.io/v1
kind: WorkloadEntry
metadata: {name: details-vm, namespace: shop}
spec:
  address: 127.0.12.1
  labels: {app: details}
  ports: {http: 8080}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: productpage, namespace: shop}
spec:
  ports: [{name: http, number: 9080}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: productpage-1, namespace: shop, labels: {version: v1}}
spec: {service: productpage, address: 127.0.11.1, port: 19080}
"#;

pub(crate) fn lodestar(args: &[&str]) -> (bool, String, String) {
    let out = kit::cli_command().args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Every object of every kind (all namespaces), by kind/namespace/name,
/// exactly as a linearizable read returns it, and the list revision.
pub(crate) async fn everything(c: &Cluster, api: &str) -> (u64, BTreeMap<String, Value>) {
    let mut out = BTreeMap::new();
    let mut revision = None;
    for kind in KINDS {
        let (status, list) = get_json(&c.http, &format!("{api}/v1/resources/{kind}")).await;
        assert_eq!(status, 200, "{list}");
        let rev = list["revision"].as_u64().unwrap();
        assert!(revision.is_none_or(|r| r == rev), "revision moved while reading");
        revision = Some(rev);
        for o in list["items"].as_array().unwrap() {
            out.insert(
                format!("{}/{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["namespace"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()),
                o.clone(),
            );
        }
    }
    (revision.unwrap(), out)
}

async fn follower_of(c: &Cluster) -> u64 {
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    c.replicas.iter().map(|r| r.id).find(|&id| id != leader).unwrap()
}

fn restore_args<'a>(file: &'a str, dir: &'a str, id: &'a str, members: &'a [String]) -> Vec<&'a str> {
    let mut args = vec!["snapshot", "restore", file, "--data-dir", dir, "--id", id];
    for m in members {
        args.extend(["--initial-member", m.as_str()]);
    }
    args
}

/// Phase 1: data of every kind (created, updated, deleted) on a 3-node
/// cluster; `snapshot save` through a follower. Phase 2: restore the file
/// into three fresh data dirs of a new cluster on other addresses; every
/// object comes back with the same metadata at the same revision, and
/// writes continue from it. Phase 3: a replica added later gets it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_restores_into_a_new_cluster() {
    let src = Cluster::start(3, "").await;
    let follower = follower_of(&src).await;
    let api = src.replica(follower).api();
    applied(&src.http, &api, MESH).await;
    let (status, _) = apply(&src.http, &api, vec![vs("reviews", "shop", "v1"), vs("ratings", "shop", "v1"), vs("gone", "shop", "v1")]).await;
    assert_eq!(status, 200);
    let (status, _) = apply(&src.http, &api, vec![vs("reviews", "shop", "v2")]).await; // generation 2
    assert_eq!(status, 200);
    let (status, body) = apply(&src.http, &api, vec![vs("other", "team-b", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let r = src.http.delete(format!("{api}/v1/resources/vs/shop/gone")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (revision, before) = everything(&src, &api).await;
    assert_eq!(before.len(), 10, "{:?}", before.keys());

    // Save through a follower, with the CLI.
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("backup.snapshot");
    let file_s = file.to_str().unwrap();
    let (ok, out, err) = lodestar(&["--server", &api, "snapshot", "save", file_s]);
    assert!(ok, "snapshot save: {err}");
    assert!(out.contains(&format!("saved revision {revision} (10 objects")), "{out}");
    let (ok, out, err) = lodestar(&["snapshot", "status", file_s]);
    assert!(ok, "{err}");
    assert!(out.contains(&format!("revision:  {revision}")) && out.contains("checksum ok") && out.contains("Instance"), "{out}");

    // The gRPC equivalent serves the same state.
    let mut grpc = kit::grpc_api(&api);
    let mut stream = grpc.snapshot(SnapshotRequest { consistency: 0 }).await.unwrap().into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(chunk.revision, revision);
        bytes.extend(chunk.data);
    }
    let b = lodestar::store::backup::decode(&bytes).unwrap();
    assert_eq!((b.revision, b.objects.len()), (revision, 10));

    // Written after the backup: must not come back.
    let (status, _) = apply(&src.http, &api, vec![vs("later", "shop", "v1")]).await;
    assert_eq!(status, 200);

    // Phase 2: a new cluster on other addresses, each member restored from the file.
    let mut dst = Cluster::prepare(3, "");
    let members = dst.member_flags().to_vec();
    for r in &dst.replicas {
        let (dir, id) = (r.data_dir().to_str().unwrap().to_string(), r.id.to_string());
        let (ok, out, err) = lodestar(&restore_args(file_s, &dir, &id, &members));
        assert!(ok, "restore {id}: {err}");
        assert!(out.contains(&format!("restored revision {revision} (10 objects)")), "{out}");
    }
    dst.launch().await;
    for r in &dst.replicas {
        let (rev, after) = everything(&dst, &r.api()).await;
        assert_eq!(rev, revision, "replica {}", r.id);
        assert_eq!(after, before, "replica {} differs from the backup", r.id);
    }
    let s = dst.status(1).await.unwrap();
    let ids: Vec<u64> = s["members"].as_array().unwrap().iter().filter(|m| m["role"] == "voter").map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2, 3], "{s}");
    assert_eq!(s["members"][0]["info"]["api_addr"], dst.replica(1).api_addr());

    // Writes continue from the restored revision, through a follower too.
    let dst_follower = follower_of(&dst).await;
    let (status, body) = apply(&dst.http, &dst.replica(dst_follower).api(), vec![vs("new", "shop", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["revision"].as_u64(), Some(revision + 1));
    let (status, body) = apply(&dst.http, &dst.replica(dst_follower).api(), vec![vs("reviews", "shop", "v3")]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["revision"].as_u64(), Some(revision + 2));
    let (_, obj) = get_json(&dst.http, &format!("{}/v1/resources/vs/shop/reviews", dst.replica(1).api())).await;
    assert_eq!(obj["metadata"]["generation"], 3);
    assert_eq!(obj["metadata"]["creationRevision"], before["VirtualService/shop/reviews"]["metadata"]["creationRevision"]);

    // Phase 3: a replica added later catches up through the restored
    // snapshot: same objects, same revision.
    let joiner = dst.spawn_joiner(4, "");
    let (raft, apia, xds) = (joiner.raft_addr(), joiner.api_addr(), joiner.xds_addr());
    let (ok, _, err) =
        lodestar(&["--server", &dst.replica(1).api(), "cluster", "add-node", "--id", "4", "--raft-addr", &raft, "--api-addr", &apia, "--xds-addr", &xds]);
    assert!(ok, "add-node: {err}");
    dst.wait_for_revision(revision + 2, Duration::from_secs(20)).await;
    let (rev4, on4) = everything(&dst, &dst.replica(4).api()).await;
    let (rev1, on1) = everything(&dst, &dst.replica(1).api()).await;
    assert_eq!((rev4, rev1), (revision + 2, revision + 2));
    assert_eq!(on4, on1, "the added replica differs");
    assert!(on4.contains_key("VirtualService/shop/ratings") && !on4.contains_key("VirtualService/shop/later"));
    // Not by replaying the new cluster's log, which does not hold the objects.
    assert!(dst.replica(4).log().contains("installed snapshot"), "node 4 did not install the restored snapshot");
}

/// Restore checks the file and the target, and says what is wrong; a
/// restore without members makes a single-node cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_bad_input_and_makes_single_node_clusters() {
    let src = Cluster::start(1, "").await;
    let api = src.replica(1).api();
    applied(&src.http, &api, MESH).await;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("b.snapshot");
    let file_s = file.to_str().unwrap();
    let (ok, _, err) = lodestar(&["--server", &api, "snapshot", "save", file_s]);
    assert!(ok, "{err}");
    let good = std::fs::read(&file).unwrap();
    let revision = lodestar::store::backup::peek_revision(&good).unwrap();
    let target = tmp.path().join("restored");
    let target_s = target.to_str().unwrap();

    let refused = |name: &str, bytes: &[u8], expect: &str| {
        let path = tmp.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let (ok, _, err) = lodestar(&["snapshot", "restore", path.to_str().unwrap(), "--data-dir", target_s]);
        assert!(!ok, "{name}: restore succeeded");
        assert!(err.contains(expect), "{name}: {err}");
        assert!(!target.exists(), "{name}: left a data dir behind");
        let (ok, _, err) = lodestar(&["snapshot", "status", path.to_str().unwrap()]);
        assert!(!ok && err.contains(expect), "{name}: status: {err}");
    };
    let mut corrupt = good.clone();
    let mid = corrupt.len() / 2;
    corrupt[mid] ^= 0x01;
    refused("corrupt.snapshot", &corrupt, "checksum mismatch");
    refused("mesh.yaml", MESH.as_bytes(), "not a Lodestar snapshot file");
    refused("short.snapshot", &good[..good.len() - 10], "truncated");
    let mut future = good.clone();
    future[8] = 9;
    refused("future.snapshot", &future, "format 9 is not supported");

    // A used data dir is left alone.
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), "x").unwrap();
    let (ok, _, err) = lodestar(&["snapshot", "restore", file_s, "--data-dir", target_s]);
    assert!(!ok && err.contains("is not empty"), "{err}");
    assert_eq!(std::fs::read_dir(&target).unwrap().count(), 1);
    // And the id must be one of the members.
    let other = tmp.path().join("other");
    let (ok, _, err) = lodestar(&[
        "snapshot",
        "restore",
        file_s,
        "--data-dir",
        other.to_str().unwrap(),
        "--id",
        "2",
        "--initial-member",
        "1=127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
    ]);
    assert!(!ok && err.contains("does not include this node's id 2"), "{err}");
    assert!(!other.exists());

    // No members: a single-node cluster at the given addresses.
    let (_, before) = everything(&src, &api).await;
    let mut dst = Cluster::prepare(1, "");
    let r = dst.replica(1);
    let dir = r.data_dir();
    let (ok, out, err) = lodestar(&[
        "snapshot",
        "restore",
        file_s,
        "--data-dir",
        dir.to_str().unwrap(),
        "--api-addr",
        &r.api_addr(),
        "--raft-addr",
        &r.raft_addr(),
        "--xds-addr",
        &r.xds_addr(),
    ]);
    assert!(ok, "{err}");
    assert!(out.contains("members 1:"), "{out}");
    dst.launch().await;
    let dst_api = dst.replica(1).api();
    let (rev, after) = everything(&dst, &dst_api).await;
    assert_eq!((rev, &after), (revision, &before));
    let s = dst.status(1).await.unwrap();
    assert_eq!(s["members"][0]["info"]["xds_addr"], json!(dst.replica(1).xds_addr()), "{s}");
    let (status, body) = apply(&dst.http, &dst_api, vec![vs("new", "shop", "v1")]).await;
    assert_eq!((status, body["revision"].as_u64()), (200, Some(revision + 1)), "{body}");
    assert!(!dst.replica(1).log().contains("differ from its configuration"));
    assert!(Path::new(&dir).join("db").exists());
}

/// An operator error: two members restored, the third started on an empty
/// data dir with the same member list. It initialises its own log, which
/// cannot match the restored snapshot's log id, so the leader (a restored
/// member: the pristine one's log is behind) sends it the snapshot instead
/// of appending to an empty state; revisions agree everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_started_without_restore_gets_the_snapshot() {
    let src = Cluster::start(1, "").await;
    let api = src.replica(1).api();
    applied(&src.http, &api, MESH).await;
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("b.snapshot");
    let (ok, _, err) = lodestar(&["--server", &api, "snapshot", "save", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    let (revision, before) = everything(&src, &api).await;

    let mut dst = Cluster::prepare(3, "");
    let members = dst.member_flags().to_vec();
    for r in dst.replicas.iter().filter(|r| r.id != 3) {
        let (dir, id) = (r.data_dir().to_str().unwrap().to_string(), r.id.to_string());
        let (ok, _, err) = lodestar(&restore_args(file.to_str().unwrap(), &dir, &id, &members));
        assert!(ok, "{err}");
    }
    dst.launch().await;
    let leader = dst.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(leader, 3);
    let (status, body) = apply(&dst.http, &dst.replica(leader).api(), vec![vs("new", "shop", "v1")]).await;
    assert_eq!((status, body["revision"].as_u64()), (200, Some(revision + 1)), "{body}");
    dst.wait_for_revision(revision + 1, Duration::from_secs(20)).await;
    let (rev3, mut on3) = everything(&dst, &dst.replica(3).api()).await;
    assert_eq!(rev3, revision + 1);
    assert!(on3.remove("VirtualService/shop/new").is_some());
    assert_eq!(on3, before);
    assert!(dst.replica(3).log().contains("installed snapshot"));
}
