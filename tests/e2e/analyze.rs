//! `lodestar analyze` against a real replica (issue 35): the same findings
//! offline on files and live on the same objects applied; files laid over
//! the live store (`--live`), nothing written; gRPC `Analyze` as REST; a
//! namespace's token sees its namespace's findings and nothing that names
//! another's; the apply answer warns about what a write breaks; istioctl's
//! exit codes.
//!
//! One replica for the whole file (the analysis is the same on any replica:
//! the store's state at one revision).

use crate::kit;

use kit::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn mesh_yaml() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/analyze/mesh.yaml")
}

/// `lodestar ARGS...`, the client config trusting the test CA:
/// (exit code, stdout, stderr).
fn run(server: Option<&str>, args: &[&str]) -> (i32, String, String) {
    let mut cmd: Command = cli_command();
    if let Some(s) = server {
        cmd.arg("--server").arg(s);
    }
    let out = cmd.args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `-o json` output without istioctl's `reference` (file:line), which only
/// file input has.
fn without_references(json: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let mut m = m.clone();
            m.as_object_mut().unwrap().remove("reference");
            m
        })
        .collect()
}

fn codes(messages: &[Value]) -> Vec<String> {
    let mut c: Vec<String> = messages.iter().map(|m| m["code"].as_str().unwrap().to_string()).collect();
    c.dedup();
    c
}

fn has(messages: &[Value], code: &str, origin: &str, text: &str) -> bool {
    messages.iter().any(|m| m["code"] == code && m["origin"] == origin && m["message"].as_str().unwrap().contains(text))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_equals_live_and_the_api_shows_what_the_caller_may_read() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let mesh = mesh_yaml();
    let mesh = mesh.to_str().unwrap();

    // Offline: no server, no credentials (a server that does not exist is
    // never asked).
    let (code, offline_json, err) = run(Some("https://127.0.0.1:1"), &["analyze", "-A", "-o", "json", mesh]);
    assert_eq!(code, 0, "json output exits 0 whatever it finds (as istioctl): {err}");
    let offline = without_references(&offline_json);
    let refs: Vec<String> =
        serde_json::from_str::<Vec<Value>>(&offline_json).unwrap().iter().filter_map(|m| m["reference"].as_str().map(str::to_string)).collect();
    assert_eq!(refs.len(), offline.len(), "every offline message has a file:line: {offline_json}");
    assert!(refs.iter().all(|r| r.starts_with(mesh) && r.rsplit(':').next().unwrap().parse::<u32>().is_ok()), "{refs:?}");
    for code in ["IST0101", "IST0109", "IST0112", "IST0127", "IST0130", "IST0131", "IST0132", "IST0134", "IST0161", "IST0173", "IST0174", "LST0002", "LST0005"]
    {
        assert!(codes(&offline).iter().any(|c| c == code), "{code} missing offline: {offline_json}");
    }
    let (code, log, err) = run(None, &["analyze", "-A", "--color=false", mesh]);
    assert_eq!(code, 79, "errors found, log output: istioctl's exit 79\n{log}\n{err}");
    assert!(err.contains("Error: Analyzers found issues when analyzing"), "{err}");
    assert!(log.contains(&format!("Error [IST0101] (VirtualService team-a/ratings {mesh}:54) Referenced host not found: \"ratings-typo\"")), "{log}");

    // Live: the same objects applied, analyzed by the replica.
    let (code, out, err) = run(Some(&api), &["apply", "-f", mesh]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, live_json, err) = run(Some(&api), &["analyze", "-A", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let live = without_references(&live_json);
    assert_eq!(live, offline, "live:\n{live_json}\noffline:\n{offline_json}");
    let (code, _, err) = run(Some(&api), &["analyze", "-A", "--failure-threshold", "Error"]);
    assert_eq!(code, 79, "{err}");
    // Only Info and up suppressed away: nothing at Error remains.
    let (code, log, _) = run(Some(&api), &["analyze", "-A", "-S", "IST0101=*", "-S", "IST0109=*", "-S", "IST0112=*", "-S", "IST0161=*", "-S", "IST0173=*"]);
    assert_eq!(code, 0, "{log}");
    assert!(!log.contains("Error ["), "{log}");

    // Files over the live store: the file's DestinationRule replaces the
    // live one (defining v2, dropping v3), nothing is written.
    let dir = tempfile::tempdir().unwrap();
    let fix = dir.path().join("fix.yaml");
    std::fs::write(
        &fix,
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: team-a}\nspec:\n  host: reviews\n  subsets:\n  - {name: v1, labels: {version: v1}}\n  - {name: v2, labels: {version: v1}}\n",
    )
    .unwrap();
    let fix = fix.to_str().unwrap();
    let (code, over_json, err) = run(Some(&api), &["analyze", "-A", "-o", "json", "--live", fix]);
    assert_eq!(code, 0, "{err}");
    let over: Vec<Value> = serde_json::from_str(&over_json).unwrap();
    assert!(!has(&over, "IST0101", "VirtualService team-a/reviews", "reviews+v2"), "the file defines v2: {over_json}");
    assert!(!has(&over, "IST0173", "DestinationRule team-a/reviews", "v3"), "the file drops v3: {over_json}");
    assert!(has(&over, "IST0101", "VirtualService team-a/ratings", "ratings-typo"), "live findings stay: {over_json}");
    let lst = over.iter().find(|m| m["code"] == "LST0002" && m["origin"] == "DestinationRule team-a/reviews").expect("LST0002 on the file's rule");
    assert_eq!(lst["reference"], format!("{fix}:5"), "the file's object is named by its file and line");
    assert!(over.iter().filter(|m| m["origin"] != "DestinationRule team-a/reviews").all(|m| m.get("reference").is_none()), "{over_json}");
    let (_, still) = get_json(&c.http, &format!("{api}/v1/resources/dr/team-a/reviews")).await;
    assert_eq!(still["spec"]["subsets"][1]["name"], "v3", "nothing was written");

    // gRPC Analyze: the same findings as REST.
    let (_, rest) = get_json(&c.http, &format!("{api}/v1/analyze")).await;
    let rest = rest["messages"].as_array().unwrap().clone();
    let mut grpc = grpc_api(&api);
    let answer = grpc.analyze(lodestar::proto::api::AnalyzeRequest::default()).await.unwrap().into_inner();
    let as_rest: Vec<(String, String, String)> = rest
        .iter()
        .map(|m| {
            (
                m["code"].as_str().unwrap().into(),
                format!("{}/{}", m["resource"]["namespace"].as_str().unwrap(), m["resource"]["name"].as_str().unwrap()),
                m["message"].as_str().unwrap().into(),
            )
        })
        .collect();
    let as_grpc: Vec<(String, String, String)> =
        answer.messages.iter().map(|m| (m.code.clone(), format!("{}/{}", m.namespace, m.name), m.message.clone())).collect();
    assert_eq!(as_grpc, as_rest);
    assert_eq!(as_rest.len(), live.len());

    // A token that may read team-a only: team-a's findings, and none that
    // names team-b's objects (the conflict with team-b/api).
    let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "team-a-reader"},
                        "spec": {"rules": [{"verbs": ["read"], "kinds": ["*"], "namespaces": ["team-a"]}]}});
    let (status, body) = apply(&c.http, &api, vec![policy]).await;
    assert_eq!(status, 200, "{body}");
    let (status, t) = kit::call(c.http.post(format!("{api}/v1/acl/tokens")).json(&json!({"policies": ["team-a-reader"]}))).await;
    assert_eq!(status, 200, "{t}");
    let reader = token_client(Some(t["secret"].as_str().unwrap()));
    let (status, seen) = get_json(&reader, &format!("{api}/v1/analyze")).await;
    assert_eq!(status, 200, "{seen}");
    let seen = seen["messages"].as_array().unwrap();
    assert!(!seen.is_empty());
    assert!(seen.iter().all(|m| m["resource"]["namespace"] == "team-a"), "{seen:?}");
    assert!(seen.iter().all(|m| !m.to_string().contains("team-b")), "nothing names team-b: {seen:?}");
    assert!(seen.iter().any(|m| m["code"] == "IST0101" && m["resource"]["name"] == "ratings"), "{seen:?}");
    assert!(rest.iter().any(|m| m["code"] == "IST0109" && m["resource"]["namespace"] == "team-a"), "the management token sees the conflict");
    let (status, other) = get_json(&reader, &format!("{api}/v1/analyze?namespace=team-b")).await;
    assert_eq!((status, other["messages"].as_array().map(Vec::len)), (200, Some(0)), "{other}");
    let mut grpc = grpc_api_as(&api, Some(t["secret"].as_str().unwrap()));
    let answer = grpc.analyze(lodestar::proto::api::AnalyzeRequest::default()).await.unwrap().into_inner();
    assert_eq!(answer.messages.len(), seen.len());
    // Who may read nothing at all is refused before anything is analyzed.
    let (status, body) = get_json(&token_client(Some("not-a-token")), &format!("{api}/v1/analyze")).await;
    assert_eq!(status, 401, "{body}");

    // On every write: the apply answer names what the write breaks (the
    // VirtualService's subset v1 is gone) and what is wrong with it.
    let dr = json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": {"name": "reviews", "namespace": "team-a"},
                    "spec": {"host": "reviews", "subsets": [{"name": "v3", "labels": {"version": "v3"}}]}});
    let (status, answer) = apply(&c.http, &api, vec![dr]).await;
    assert_eq!(status, 200, "{answer}");
    let warnings: Vec<&str> = answer["warnings"].as_array().unwrap().iter().map(|w| w.as_str().unwrap()).collect();
    assert!(
        warnings.contains(&"Error [IST0101] (VirtualService team-a/reviews) Referenced host+subset in destinationrule not found: \"reviews+v1\""),
        "{warnings:?}"
    );
    assert!(
        warnings.contains(&"Error [IST0173] (DestinationRule team-a/reviews) The Subset v3 defined in the DestinationRule does not select any pods. Which may lead to 503 UH (NoHealthyUpstream)."),
        "{warnings:?}"
    );
    assert!(!warnings.iter().any(|w| w.contains("ratings-typo")), "findings the write did not cause are not repeated: {warnings:?}");
}

/// Usage errors are istioctl's 64; a file that does not parse, 65.
#[test]
fn exit_codes() {
    let (code, _, err) = run(None, &["analyze", "-o", "xml", mesh_yaml().to_str().unwrap()]);
    assert_eq!(code, 64, "{err}");
    let (code, _, err) = run(None, &["analyze", "--failure-threshold", "fatal", mesh_yaml().to_str().unwrap()]);
    assert_eq!((code, err.contains("invalid level option")), (64, true), "{err}");
    let (code, _, err) = run(None, &["analyze", "-S", "IST0101", mesh_yaml().to_str().unwrap()]);
    assert_eq!((code, err.contains("is not a valid suppression value")), (1, true), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "kind: [unclosed\n").unwrap();
    let (code, _, err) = run(None, &["analyze", bad.to_str().unwrap()]);
    assert_eq!(code, 65, "{err}");
    let (code, _, err) = run(None, &["analyze", "--ignore-unknown", bad.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    // Nothing found: exit 0, and istioctl's closing line on stderr.
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: reviews}\nspec: {ports: [{name: http, number: 9080}]}\n")
        .unwrap();
    let (code, out, err) = run(None, &["analyze", good.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    assert!(err.contains("No validation issues found when analyzing"), "{err}");
    let (code, out, _) = run(None, &["analyze", "-o", "yaml", good.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (0, "[]\n"));
}
