//! Dry-run applies and `expectedRevision` (issue 35), on a real
//! three-replica cluster: a preview through a follower names the fields
//! that would change and writes nothing; a namespace token previews its
//! namespace only and sees no Secret value; gRPC and the CLI give the same
//! preview; a stale preview's revision refuses the real apply.

use crate::kit;
use kit::*;
use serde_json::{json, Value};
use std::time::Duration;

async fn post(http: &reqwest::Client, url: &str, body: Value) -> (u16, Value) {
    kit::call(http.post(url).json(&body)).await
}

fn split(weight: u32) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "reviews", "namespace": "team-a"},
           "spec": {"hosts": ["reviews"], "http": [{"route": [
               {"destination": {"host": "reviews", "subset": "v1"}, "weight": weight},
               {"destination": {"host": "reviews", "subset": "v2"}, "weight": 100 - weight}]}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn previews_write_nothing_show_only_what_the_caller_may_read_and_pin_the_revision() {
    let c = Cluster::start(3, "").await;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|i| *i != leader).unwrap();
    let api = c.replica(follower).api();
    use base64::Engine as _;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let (ca_one, ca_two) = (b64(&test_ca().ca_pem), b64(&rcgen::generate_simple_self_signed(vec!["two.example".into()]).unwrap().cert.pem()));
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tls", "namespace": "team-a"},
                        "data": {"ca.crt": ca_one}});
    let (status, body) = apply(&c.http, &api, vec![split(80), secret.clone(), vs("other", "team-b", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let base = body["revision"].as_u64().unwrap();
    c.wait_for_revision(base, Duration::from_secs(10)).await;

    // The preview, through a follower: the weights' fields, the base
    // revision, the revision it would commit at; nothing written.
    let (status, p) = post(&c.http, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [split(70)]})).await;
    assert_eq!(status, 200, "{p}");
    assert_eq!((p["dryRun"].as_bool(), p["baseRevision"].as_u64(), p["revision"].as_u64()), (Some(true), Some(base), Some(base + 1)), "{p}");
    let changes = p["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{p}");
    assert_eq!((changes[0]["kind"].as_str(), changes[0]["action"].as_str()), (Some("VirtualService"), Some("configured")));
    let diff: Vec<(String, Value, Value)> =
        changes[0]["diff"].as_array().unwrap().iter().map(|f| (f["path"].as_str().unwrap().to_string(), f["before"].clone(), f["after"].clone())).collect();
    assert_eq!(
        diff,
        vec![("spec.http[0].route[0].weight".to_string(), json!(80), json!(70)), ("spec.http[0].route[1].weight".to_string(), json!(20), json!(30)),]
    );
    let (_, now) = get_json(&c.http, &format!("{api}/v1/resources/vs/team-a/reviews")).await;
    assert_eq!(now["spec"]["http"][0]["route"][0]["weight"], 80, "a dry run writes nothing");
    // The same file again is no change at all.
    let (_, same) = post(&c.http, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [split(80)]})).await;
    assert_eq!((same["changes"].as_array().map(Vec::len), same["revision"].as_u64()), (Some(0), Some(base)), "{same}");
    // A bad file: exactly the real apply's error.
    let mut bad = split(70);
    bad["spec"]["http"][0]["route"][0]["weight"] = json!(-1);
    let (real_status, real) = apply(&c.http, &api, vec![bad.clone()]).await;
    let (status, dry) = post(&c.http, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [bad]})).await;
    assert_eq!((status, &dry), (real_status, &real), "a dry run refuses as the write does");
    assert_eq!(status, 400);

    // A token that may read and write team-a only: its previews, never
    // team-b's; a Secret's change named, its values not shown.
    let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "team-a"},
                        "spec": {"rules": [{"verbs": ["read", "write"], "kinds": ["*"], "namespaces": ["team-a"]}]}});
    let (status, body) = apply(&c.http, &api, vec![policy]).await;
    assert_eq!(status, 200, "{body}");
    let (status, t) = post(&c.http, &format!("{api}/v1/acl/tokens"), json!({"policies": ["team-a"]})).await;
    assert_eq!(status, 200, "{t}");
    // The follower answers once the leader committed it; it applies it
    // a moment later.
    c.wait_for_revision(t["revision"].as_u64().unwrap(), Duration::from_secs(10)).await;
    let team_a = token_client(Some(t["secret"].as_str().unwrap()));
    let mut rotated = secret.clone();
    rotated["data"]["ca.crt"] = json!(ca_two);
    let (status, p) = post(&team_a, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [split(60), rotated]})).await;
    assert_eq!(status, 200, "{p}");
    let text = p.to_string();
    assert!(!text.contains(&ca_one[..40]) && !text.contains(&ca_two[..40]) && text.contains("\"redacted\":true"), "no Secret value in a preview: {text}");
    // Proxies' configs are for those who may read the cluster (as
    // proxy-config): a namespace's token is told, and shown none.
    assert!(p["proxies"]["hidden"].as_str().is_some_and(|h| h.contains("read the cluster")), "{p:#}");
    assert_eq!(p["proxies"]["changed"], json!([]), "{p:#}");
    let (status, refused) = post(&team_a, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [vs("other", "team-b", "v2")]})).await;
    assert_eq!(status, 403, "another namespace's preview: {refused}");
    assert!(!refused.to_string().contains("\"v1\""), "nothing of team-b's object in the refusal: {refused}");
    // A token that may write but not read may not preview (the diff shows
    // the current object).
    let writer = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "team-a-writer"},
                        "spec": {"rules": [{"verbs": ["write"], "kinds": ["*"], "namespaces": ["team-a"]}]}});
    assert_eq!(apply(&c.http, &api, vec![writer]).await.0, 200);
    let (_, w) = post(&c.http, &format!("{api}/v1/acl/tokens"), json!({"policies": ["team-a-writer"]})).await;
    c.wait_for_revision(w["revision"].as_u64().unwrap(), Duration::from_secs(10)).await;
    let (status, body) =
        post(&token_client(Some(w["secret"].as_str().unwrap())), &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [split(60)]})).await;
    assert_eq!(status, 403, "{body}");

    // gRPC: the same preview.
    let mut grpc = grpc_api(&api);
    let answer = grpc
        .apply(lodestar::proto::api::ApplyRequest {
            items: vec![lodestar::proto::api::ApplyItem { resource_json: split(70).to_string(), expected_revision: None }],
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let grpc_preview: Value = serde_json::from_str(&answer.preview_json).unwrap();
    let rest_now = post(&c.http, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [split(70)]})).await.1;
    assert_eq!(grpc_preview["changes"], rest_now["changes"]);
    assert_eq!(answer.revision, rest_now["baseRevision"].as_u64().unwrap());

    // The CLI: a summary, and -o json.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("split.yaml");
    std::fs::write(&file, serde_json::to_string(&split(70)).unwrap()).unwrap();
    let (ok, out, err) = cli(&api, &["apply", "-f", file.to_str().unwrap(), "--dry-run"]);
    assert!(ok, "{err}");
    assert!(out.contains("1 resource(s) would change") && out.contains("~ spec.http[0].route[0].weight: 80 -> 70"), "{out}");
    let (ok, out, err) = cli(&api, &["apply", "-f", file.to_str().unwrap(), "--dry-run", "-o", "json"]);
    assert!(ok, "{err}");
    let cli_preview: Value = serde_json::from_str(&out).unwrap();
    let previewed = cli_preview["baseRevision"].as_u64().unwrap();

    // What was previewed is what is applied: a change to the object after
    // the preview's revision refuses the apply, naming it, writing nothing.
    let (status, body) = apply(&c.http, &api, vec![split(50)]).await;
    assert_eq!(status, 200, "{body}");
    let (ok, _, err) = cli(&api, &["apply", "-f", file.to_str().unwrap(), "--expected-revision", &previewed.to_string()]);
    assert!(!ok && err.contains("VirtualService team-a/reviews changed at revision"), "{err}");
    let (_, now) = get_json(&c.http, &format!("{api}/v1/resources/vs/team-a/reviews")).await;
    assert_eq!(now["spec"]["http"][0]["route"][0]["weight"], 50, "the stale apply wrote nothing");
    // A fresh preview's revision lets it through.
    let (_, fresh) = post(&c.http, &format!("{api}/v1/apply?dryRun=true"), json!({"resources": [split(70)]})).await;
    let (ok, _, err) = cli(&api, &["apply", "-f", file.to_str().unwrap(), "--expected-revision", &fresh["baseRevision"].to_string()]);
    assert!(ok, "{err}");
    let (_, now) = get_json(&c.http, &format!("{api}/v1/resources/vs/team-a/reviews")).await;
    assert_eq!(now["spec"]["http"][0]["route"][0]["weight"], 70);
}
