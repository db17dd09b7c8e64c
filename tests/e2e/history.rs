//! History, diff and rollback (issue 35) on a real replica: a 20-resource
//! change is listed by revision and object, diffed field by field, and
//! rolled back as one revision that restores every object byte for byte
//! (spec and labels), audited as a rollback; a namespace's token sees its
//! namespace's history only; the history survives a restart.

use crate::kit;
use kit::*;
use serde_json::{json, Value};
use std::time::Duration;

fn route(i: usize, subset: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
           "metadata": {"name": format!("vs-{i}"), "namespace": "shop", "labels": {"team": "shop", "gen": subset}},
           "spec": {"hosts": [format!("svc-{i}")], "http": [{"route": [{"destination": {"host": format!("svc-{i}"), "subset": subset}}]}]}})
}

async fn get(c: &Cluster, path: &str) -> Value {
    let (status, body) = get_json(&c.http, &format!("{}{path}", c.replica(1).api())).await;
    assert_eq!(status, 200, "{path}: {body}");
    body
}

/// Spec and labels as stored (server-owned metadata aside).
fn stored(v: &Value) -> Value {
    json!({"spec": v["spec"], "labels": v["metadata"]["labels"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_is_listed_diffed_and_rolled_back_as_one_revision() {
    let mut c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let base_docs: Vec<Value> = (0..20).map(|i| route(i, "v1")).collect();
    let base = applied(&c.http, &api, base_docs.clone()).await;
    let before: Vec<Value> = {
        let mut out = Vec::new();
        for i in 0..20 {
            out.push(stored(&get(&c, &format!("/v1/resources/vs/shop/vs-{i}")).await));
        }
        out
    };

    // The change: 18 routes move to v2, one is deleted, one is created.
    let mut change: Vec<Value> = (0..18).map(|i| route(i, "v2")).collect();
    change.push(route(20, "v2"));
    let changed = applied(&c.http, &api, change).await;
    let (status, body) =
        kit::call(c.http.post(format!("{api}/v1/delete")).json(&json!({"resources": [{"kind": "VirtualService", "namespace": "shop", "name": "vs-19"}]})))
            .await;
    assert_eq!(status, 200, "{body}");
    let after_delete = body["revision"].as_u64().unwrap();
    assert_eq!((changed, after_delete), (base + 1, base + 2));

    // History: the object's revisions, newest first; the mesh's.
    let h = get(&c, "/v1/history?kind=vs&namespace=shop&name=vs-3").await;
    let revs: Vec<u64> = h["revisions"].as_array().unwrap().iter().map(|r| r["revision"].as_u64().unwrap()).collect();
    assert_eq!(revs, vec![changed, base], "{h}");
    let h = get(&c, "/v1/history?limit=2").await;
    let revs: Vec<u64> = h["revisions"].as_array().unwrap().iter().map(|r| r["revision"].as_u64().unwrap()).collect();
    assert_eq!(revs, vec![after_delete, changed], "{h}");
    assert_eq!(h["revisions"][0]["changes"][0]["action"], "DELETE");
    assert_eq!(h["revisions"][1]["changes"].as_array().unwrap().len(), 19);

    // Diff: 18 configured (the subset and the label), one created, one deleted.
    let d = get(&c, &format!("/v1/diff?from={base}")).await;
    let changes = d["changes"].as_array().unwrap();
    let count = |a: &str| changes.iter().filter(|c| c["action"] == a).count();
    assert_eq!((count("configured"), count("created"), count("deleted")), (18, 1, 1), "{d}");
    let vs3 = changes.iter().find(|c| c["name"] == "vs-3").unwrap();
    let paths: Vec<&str> = vs3["diff"].as_array().unwrap().iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(paths, vec!["metadata.labels.gen", "spec.http[0].route[0].destination.subset"], "{vs3}");
    let (status, body) = get_json(&c.http, &format!("{api}/v1/diff?from={}", after_delete + 5)).await;
    assert_eq!(status, 400, "a revision after now: {body}");
    // gRPC: the same answers.
    let mut grpc = grpc_api(&api);
    let h = grpc
        .history(lodestar::proto::api::HistoryRequest { kind: "vs".into(), namespace: "shop".into(), name: "vs-3".into(), limit: 0 })
        .await
        .unwrap()
        .into_inner();
    let h: Value = serde_json::from_str(&h.json).unwrap();
    assert_eq!(h, get(&c, "/v1/history?kind=vs&namespace=shop&name=vs-3").await);
    let g = grpc.diff(lodestar::proto::api::DiffRequest { from: base, to: 0 }).await.unwrap().into_inner();
    assert_eq!(serde_json::from_str::<Value>(&g.json).unwrap(), d);
    let err = grpc.diff(lodestar::proto::api::DiffRequest { from: after_delete + 5, to: 0 }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
    let preview = grpc
        .rollback(lodestar::proto::api::RollbackRequest {
            revision: base,
            resources: vec![lodestar::proto::api::ResourceRef { kind: "vs".into(), namespace: "shop".into(), name: "vs-3".into(), expected_revision: None }],
            dry_run: true,
        })
        .await
        .unwrap()
        .into_inner();
    let preview: Value = serde_json::from_str(&preview.preview_json).unwrap();
    assert_eq!(preview["changes"].as_array().map(Vec::len), Some(1), "{preview}");

    // A namespace's token sees its namespace's history only.
    applied(&c.http, &api, vec![vs("other", "elsewhere", "v1")]).await;
    let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "elsewhere"},
                        "spec": {"rules": [{"verbs": ["read"], "kinds": ["*"], "namespaces": ["elsewhere"]}]}});
    applied(&c.http, &api, vec![policy]).await;
    let t = token_create(&api, &["--policy", "elsewhere"]);
    let reader = token_client(Some(t["secret"].as_str().unwrap()));
    let (status, h) = get_json(&reader, &format!("{api}/v1/history?limit=1000")).await;
    assert_eq!(status, 200, "{h}");
    let names: Vec<&str> =
        h["revisions"].as_array().unwrap().iter().flat_map(|r| r["changes"].as_array().unwrap()).map(|c| c["namespace"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["elsewhere"], "{h}");
    let (status, d) = get_json(&reader, &format!("{api}/v1/diff?from={base}")).await;
    assert_eq!((status, d["changes"].as_array().map(Vec::len)), (200, Some(1)), "{d}");
    // A rollback is a write: a reader may not, of its namespace or another.
    for ns in ["elsewhere", "shop"] {
        let body = json!({"revision": base, "resources": [{"kind": "vs", "namespace": ns}]});
        let (status, refused) = kit::call(reader.post(format!("{api}/v1/rollback")).json(&body)).await;
        assert_eq!(status, 403, "{ns}: {refused}");
    }
    let (status, _) = kit::call(token_client(None).post(format!("{api}/v1/rollback")).json(&json!({"revision": base}))).await;
    assert_eq!(status, 401);

    // Rollback of the shop namespace's routes to `base`: previewed (nothing
    // written), then one revision restoring every object as it was.
    let (ok, out, err) = cli(&api, &["rollback", &base.to_string(), "--dry-run", "-o", "json"]);
    assert!(ok, "{err}");
    let preview: Value = serde_json::from_str(&out).unwrap();
    let would = preview["changes"].as_array().unwrap();
    assert!(would.iter().any(|c| c["name"] == "vs-19" && c["action"] == "created"), "{preview}");
    assert!(would.iter().any(|c| c["name"] == "vs-20" && c["action"] == "deleted"), "{preview}");
    assert!(would.iter().any(|c| c["name"] == "other" && c["action"] == "deleted"), "everything after base: {preview}");
    assert_eq!(get(&c, "/v1/resources/vs/shop/vs-3").await["spec"]["http"][0]["route"][0]["destination"]["subset"], "v2", "a dry run writes nothing");
    let now = get(&c, "/v1/node").await["revision"].as_u64().unwrap();
    let args: Vec<String> = vec!["rollback".into(), base.to_string(), "-n".into(), "shop".into()]
        .into_iter()
        .chain((0..21).flat_map(|i| ["vs".to_string(), format!("vs-{i}")]))
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (ok, out, err) = cli(&api, &args);
    assert!(ok, "{err}");
    assert!(err.contains(&format!("revision {}", now + 1)), "one revision: {out}{err}");
    for (i, b) in before.iter().enumerate() {
        assert_eq!(&stored(&get(&c, &format!("/v1/resources/vs/shop/vs-{i}")).await), b, "vs-{i} restored byte for byte");
    }
    let (status, _) = get_json(&c.http, &format!("{api}/v1/resources/vs/shop/vs-20")).await;
    assert_eq!(status, 404, "created after base: gone");
    assert_eq!(get(&c, "/v1/resources/vs/elsewhere/other").await["metadata"]["name"], "other", "not named: left alone");
    let (ok, _, err) = cli(&api, &["wait", "--revision", &(now + 1).to_string(), "--timeout", "10s"]);
    assert!(ok, "{err}");
    until("the audit line naming the rollback", Duration::from_secs(5), || async {
        c.replica(1).log().lines().any(|l| l.contains("\"op\":\"POST /v1/rollback\"") && l.contains("\"outcome\":\"ok\"") && l.contains("vs-19"))
    })
    .await;
    // Nothing left to roll back for those objects.
    let (ok, _, err) = cli(&api, &["rollback", &base.to_string(), "-n", "shop", "vs", "vs-3", "--dry-run"]);
    assert!(ok, "{err}");

    // The history is the store's: it survives a restart.
    c.stop(1);
    c.restart(1);
    c.wait_for_leader(Duration::from_secs(15)).await;
    let h = get(&c, "/v1/history?kind=vs&namespace=shop&name=vs-3").await;
    let revs: Vec<u64> = h["revisions"].as_array().unwrap().iter().map(|r| r["revision"].as_u64().unwrap()).collect();
    assert_eq!(revs, vec![now + 1, changed, base], "{h}");
}
