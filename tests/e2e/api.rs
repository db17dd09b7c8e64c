//! The client API on a real single-replica server: atomic apply, optimistic
//! concurrency, bad input, watch, gRPC, and the CLI round trip.

use crate::kit;

use futures::StreamExt;
use kit::*;
use lodestar::proto::api::{ApplyItem, ApplyRequest, GetRequest, WatchRequest};
use serde_json::{json, Value};
use std::time::Duration;

async fn list_names(c: &Cluster, ns: &str) -> (u64, Vec<String>) {
    let (status, list) = get_json(&c.http, &format!("{}/v1/resources/vs?namespace={ns}", c.replica(1).api())).await;
    assert_eq!(status, 200, "{list}");
    let names = list["items"].as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_string()).collect();
    (list["revision"].as_u64().unwrap(), names)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_is_atomic_and_revisioned() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();

    // Three resources, one revision.
    let (status, body) = apply(&c.http, &api, vec![vs("a", "atomic", "v1"), vs("b", "atomic", "v1"), vs("c", "atomic", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let rev = body["revision"].as_u64().unwrap();
    assert!(body["items"].as_array().unwrap().iter().all(|i| i["modRevision"].as_u64() == Some(rev) && i["action"] == "created"));

    // A batch with one invalid resource stores nothing, and says which field.
    let mut bad = vs("e", "atomic", "v1");
    bad["metadata"]["name"] = json!("Not_A_Name");
    let (status, body) = apply(&c.http, &api, vec![vs("d", "atomic", "v2"), bad]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "InvalidArgument");
    assert_eq!(body["error"]["fields"][0]["field"], "resources[1].metadata.name");
    let (rev_after, names) = list_names(&c, "atomic").await;
    assert_eq!(names, vec!["a", "b", "c"]);
    assert_eq!(rev_after, rev);

    // Re-applying identical content is "unchanged" and does not move the revision.
    let (status, body) = apply(&c.http, &api, vec![vs("a", "atomic", "v1")]).await;
    assert_eq!(status, 200);
    assert_eq!(body["items"][0]["action"], "unchanged");
    assert_eq!(body["revision"].as_u64(), Some(rev));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expected_revision_conflicts() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let (_, body) = apply(&c.http, &api, vec![vs("x", "occ", "v1")]).await;
    let rev1 = body["revision"].as_u64().unwrap();

    let wrapped = |tag: &str, expected: u64| json!({"resource": vs("x", "occ", tag), "expectedRevision": expected});
    // Right revision: applies.
    let (status, body) = apply(&c.http, &api, vec![wrapped("v2", rev1)]).await;
    assert_eq!(status, 200, "{body}");
    let rev2 = body["revision"].as_u64().unwrap();
    // Stale revision: 409, and nothing changes, not even the other resource in the batch.
    let (status, body) = apply(&c.http, &api, vec![vs("y", "occ", "v1"), wrapped("v3", rev1)]).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "Conflict");
    let (_, obj) = get_json(&c.http, &format!("{api}/v1/resources/vs/occ/x")).await;
    assert_eq!(obj["metadata"]["labels"]["tag"], "v2");
    assert_eq!(obj["metadata"]["resourceVersion"], rev2.to_string());
    let (_, names) = list_names(&c, "occ").await;
    assert_eq!(names, vec!["x"]);
    // expectedRevision 0 means "create only".
    let (status, _) = apply(&c.http, &api, vec![json!({"resource": vs("x", "occ", "v9"), "expectedRevision": 0})]).await;
    assert_eq!(status, 409);
    // Delete with a stale precondition is refused too.
    let r = c.http.delete(format!("{api}/v1/resources/vs/occ/x?expectedRevision={rev1}")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 409);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_400_naming_the_field() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let post = |body: String, ct: &'static str| {
        // A fresh connection each: the server closes one whose body it refused unread.
        let http = kit::http();
        let url = format!("{api}/v1/apply");
        async move {
            let r = http.post(url).header("content-type", ct).body(body).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };
    let cases = vec![
        ("kind: VirtualService\nmetadata: {name: [unclosed\n".to_string(), "application/yaml", "body[0]", "malformed YAML"),
        ("{\"resources\": [".to_string(), "application/json", "body", "malformed JSON"),
        (
            json!({"resources": [{"apiVersion": "networking.istio.io/v1", "kind": "Deployment", "metadata": {"name": "a"}, "spec": {}}]}).to_string(),
            "application/json",
            "resources[0].kind",
            "unknown kind",
        ),
        (
            json!({"resources": [{"apiVersion": "apps/v1", "kind": "VirtualService", "metadata": {"name": "a"}, "spec": {}}]}).to_string(),
            "application/json",
            "resources[0].apiVersion",
            "group",
        ),
        (
            json!({"resources": [{"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": 5}, "spec": {}}]}).to_string(),
            "application/json",
            "resources[0].metadata.name",
            "expected a string",
        ),
        (
            json!({"resources": [{"apiVersion": "networking.istio.io/v1", "metadata": {"name": "a"}, "spec": {}}]}).to_string(),
            "application/json",
            "resources[0].kind",
            "required",
        ),
        (
            json!({"resources": [{"resource": vs("a", "d", "v1"), "expectedRevision": "x"}]}).to_string(),
            "application/json",
            "resources[0].expectedRevision",
            "integer",
        ),
        (format!("{{\"resources\": [], \"pad\": \"{}\"}}", "x".repeat(5 * 1024 * 1024)), "application/json", "body", "larger than the limit"),
    ];
    for (body, ct, field, reason) in cases {
        let (status, resp) = post(body, ct).await;
        assert_eq!(status, 400, "{field}: {resp}");
        let fields = resp["error"]["fields"].as_array().unwrap();
        assert!(fields.iter().any(|f| f["field"] == field && f["reason"].as_str().unwrap().contains(reason)), "expected {field}: {reason} in {resp}");
    }
    // Nothing was stored by any of them.
    let (rev, _) = list_names(&c, "d").await;
    assert_eq!(rev, 0);
    // Unknown kind in a path is a 400 as well.
    let (status, body) = get_json(&c.http, &format!("{api}/v1/resources/pods")).await;
    assert_eq!((status, body["error"]["fields"][0]["field"].as_str()), (400, Some("kind")));
    // A path nobody serves is a 404 in the same vocabulary (it was a 200
    // carrying gRPC's UNIMPLEMENTED), and still UNIMPLEMENTED to gRPC.
    let (status, body) = get_json(&c.http, &format!("{api}/v1/resourcez/default")).await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("NotFound")), "{body}");
    let r = c.http.post(format!("{api}/lodestar.api.v1.Lodestar/NoSuchMethod")).header("content-type", "application/grpc").send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers().get("grpc-status").and_then(|v| v.to_str().ok())), (200, Some("12")));
}

/// The next NDJSON line of a streaming response.
async fn next_line(resp: &mut reqwest::Response, buf: &mut String, deadline: tokio::time::Instant) -> Value {
    loop {
        if let Some(i) = buf.find('\n') {
            let line: Value = serde_json::from_str(&buf[..i]).unwrap();
            buf.drain(..=i);
            return line;
        }
        let chunk = tokio::time::timeout_at(deadline, resp.chunk()).await.expect("watch event in time").unwrap().expect("stream open");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_replays_then_follows() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let mut revs = Vec::new();
    for i in 0..5 {
        let (_, body) = apply(&c.http, &api, vec![vs(&format!("w{i}"), "watch", "v1")]).await;
        revs.push(body["revision"].as_u64().unwrap());
    }
    let r = c.http.delete(format!("{api}/v1/resources/vs/watch/w0")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);

    // REST: replay everything after the first write, in order.
    let resp = c.http.get(format!("{api}/v1/watch?fromRevision={}&namespace=watch", revs[0])).send().await.unwrap();
    let mut resp = resp;
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // w1..w4 puts and the w0 delete.
    let mut events = Vec::new();
    for _ in 0..5 {
        events.push(next_line(&mut resp, &mut buf, deadline).await);
    }
    let got: Vec<(u64, String, String)> = events
        .iter()
        .map(|e| (e["revision"].as_u64().unwrap(), e["type"].as_str().unwrap().into(), e["object"]["metadata"]["name"].as_str().unwrap().into()))
        .collect();
    let mut expect: Vec<(u64, String, String)> = (1..5).map(|i| (revs[i], "PUT".to_string(), format!("w{i}"))).collect();
    expect.push((revs[4] + 1, "DELETE".into(), "w0".into()));
    assert_eq!(got, expect);

    // Then live: a new write arrives on the same stream.
    let (_, body) = apply(&c.http, &api, vec![vs("live", "watch", "v1")]).await;
    let live_rev = body["revision"].as_u64().unwrap();
    let e = next_line(&mut resp, &mut buf, deadline).await;
    assert_eq!((e["revision"].as_u64(), e["object"]["metadata"]["name"].as_str()), (Some(live_rev), Some("live")));

    // gRPC: same replay from revision 0 (everything), filtered by kind.
    let mut grpc = kit::grpc_api(&api);
    let mut stream = grpc.watch(WatchRequest { from_revision: Some(0), kind: "vs".into(), namespace: "watch".into() }).await.unwrap().into_inner();
    let mut seen = Vec::new();
    while seen.len() < 7 {
        let e = tokio::time::timeout_at(deadline, stream.next()).await.expect("grpc watch in time").unwrap().unwrap();
        seen.push((e.revision, e.r#type, e.name));
    }
    assert_eq!(seen[0], (revs[0], "PUT".to_string(), "w0".to_string()));
    assert_eq!(seen[6], (live_rev, "PUT".to_string(), "live".to_string()));
    assert!(seen.windows(2).all(|w| w[0].0 < w[1].0), "in revision order: {seen:?}");
}

/// A watch from a revision whose history was compacted is told so, as
/// etcd's ErrCompacted: REST 410 with code `Compacted`, gRPC OUT_OF_RANGE,
/// both naming the oldest revision a watch can start from; one from there
/// replays every change after it. Compaction here is `history_revisions`
/// alone (each applied revision compacts what is older than that many;
/// `history_max_age_s = 0` keeps nothing for its age).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_from_a_compacted_revision_is_told_so() {
    const KEPT: u64 = 5;
    let c = Cluster::start(1, &format!("history_revisions = {KEPT}\nhistory_max_age_s = 0")).await;
    let api = c.replica(1).api();
    let mut last = 0;
    for i in 0..12 {
        let (status, body) = apply(&c.http, &api, vec![vs(&format!("c{i}"), "compact", "v1")]).await;
        assert_eq!(status, 200, "{body}");
        last = body["revision"].as_u64().unwrap();
    }
    let oldest = last - KEPT;

    let (status, body) = get_json(&c.http, &format!("{api}/v1/watch?fromRevision=1&namespace=compact")).await;
    assert_eq!(status, 410, "{body}");
    assert_eq!(body["error"]["code"], "Compacted", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("oldest available is {oldest}")), "{message}");

    let mut grpc = kit::grpc_api(&api);
    let Err(status) = grpc.watch(WatchRequest { from_revision: Some(1), kind: String::new(), namespace: "compact".into() }).await else {
        panic!("a watch from a compacted revision was served")
    };
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(status.message().contains(&format!("oldest available is {oldest}")), "{}", status.message());

    // From the oldest available revision: every change after it, in order.
    let mut stream = grpc.watch(WatchRequest { from_revision: Some(oldest), kind: String::new(), namespace: "compact".into() }).await.unwrap().into_inner();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.len() < KEPT as usize {
        let e = tokio::time::timeout_at(deadline, stream.next()).await.expect("grpc watch in time").unwrap().unwrap();
        seen.push(e.revision);
    }
    assert_eq!(seen, (oldest + 1..=last).collect::<Vec<_>>());
    let mut resp = c.http.get(format!("{api}/v1/watch?fromRevision={oldest}&namespace=compact")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut buf = String::new();
    let e = next_line(&mut resp, &mut buf, deadline).await;
    assert_eq!(e["revision"].as_u64(), Some(oldest + 1), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_api_and_errors() {
    let c = Cluster::start(1, "").await;
    let mut grpc = kit::grpc_api(&c.replica(1).api());
    let ok = grpc
        .apply(ApplyRequest { items: vec![ApplyItem { resource_json: vs("g", "grpc", "v1").to_string(), expected_revision: None }], ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.items[0].action, "created");
    let got = grpc.get(GetRequest { kind: "VirtualService".into(), namespace: "grpc".into(), name: "g".into(), consistency: 0 }).await.unwrap().into_inner();
    let obj: Value = serde_json::from_str(&got.resource_json).unwrap();
    assert_eq!(obj["metadata"]["modRevision"].as_u64(), Some(ok.revision));

    let err = grpc
        .apply(ApplyRequest { items: vec![ApplyItem { resource_json: "{not json".into(), expected_revision: None }], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("items[0].resource_json"), "{}", err.message());
    let mut bad = vs("h", "grpc", "v1");
    bad["kind"] = json!("Nope");
    let err = grpc
        .apply(ApplyRequest { items: vec![ApplyItem { resource_json: bad.to_string(), expected_revision: None }], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("resources[0].kind"), "{}", err.message());
    let err = grpc
        .apply(ApplyRequest { items: vec![ApplyItem { resource_json: vs("g", "grpc", "v2").to_string(), expected_revision: Some(999) }], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Aborted);
    let err = grpc.get(GetRequest { kind: "vs".into(), namespace: "grpc".into(), name: "missing".into(), consistency: 0 }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

const BOOKINFO: &str = r#"
apiVersion: networking.istio.io/v1beta1
kind: VirtualService
metadata:
  name: reviews
  namespace: bookinfo
spec:
  hosts:
  - reviews
  http:
  - match:
    - headers:
        end-user:
          exact: jason
    route:
    - destination:
        host: reviews
        subset: v2
  - route:
    - destination:
        host: reviews
        subset: v1
      weight: 80
    - destination:
        host: reviews
        subset: v3
      weight: 20
---
apiVersion: networking.istio.io/v1beta1
kind: DestinationRule
metadata:
  name: reviews
  namespace: bookinfo
spec:
  host: reviews
  trafficPolicy:
    loadBalancer:
      simple: LEAST_REQUEST
  subsets:
  - name: v1
    labels:
      version: v1
  - name: v2
    labels:
      version: v2
  - name: v3
    labels:
      version: v3
---
apiVersion: networking.istio.io/v1alpha3
kind: ServiceEntry
metadata:
  name: external-api
  namespace: bookinfo
spec:
  hosts:
  - api.example.com
  ports:
  - number: 443
    name: https
    protocol: TLS
  location: MESH_EXTERNAL
  resolution: DNS
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_round_trip() {
    let c = Cluster::start(1, "").await;
    let server = c.replica(1).api();
    let dir = c.tmp.path().join("manifests/nested");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bookinfo.yaml");
    std::fs::write(&file, BOOKINFO).unwrap();

    // apply -f on a directory (recursively).
    let (ok, out, err) = cli(&server, &["apply", "-f", c.tmp.path().join("manifests").to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("virtualservice/reviews created"), "{out}");
    assert!(out.contains("serviceentry/external-api created"), "{out}");

    // get -o yaml returns the same specs for every document.
    let originals: Vec<Value> = lodestar::model::documents::parse_documents(BOOKINFO, "f").unwrap();
    for doc in &originals {
        let kind = doc["kind"].as_str().unwrap();
        let name = doc["metadata"]["name"].as_str().unwrap();
        let (ok, out, err) = cli(&server, &["get", kind, name, "-n", "bookinfo", "-o", "yaml"]);
        assert!(ok, "{err}");
        let back: Value = yaml_serde::from_str(&out).unwrap();
        assert_eq!(back["spec"], doc["spec"], "{kind}/{name}");
        assert_eq!(back["apiVersion"], doc["apiVersion"]);
    }

    // Aliases and tables.
    let (ok, out, _) = cli(&server, &["get", "dr", "-n", "bookinfo"]);
    assert!(ok && out.contains("reviews") && out.contains("HOST"), "{out}");
    let (ok, out, _) = cli(&server, &["get", "VirtualServices", "-A", "-o", "json"]);
    assert!(ok);
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);

    // A list from `get -o yaml` can be applied back unchanged.
    let (_, out, _) = cli(&server, &["get", "se", "-n", "bookinfo", "-o", "yaml"]);
    let exported = c.tmp.path().join("exported.yaml");
    std::fs::write(&exported, out).unwrap();
    let (ok, out, err) = cli(&server, &["apply", "-f", exported.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("serviceentry/external-api unchanged"), "{out}");

    // delete -f removes all of them; errors are readable.
    let (ok, out, err) = cli(&server, &["delete", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert_eq!(out.matches("deleted").count(), 3, "{out}");
    let (ok, _, err) = cli(&server, &["get", "vs", "reviews", "-n", "bookinfo"]);
    assert!(!ok && err.contains("NotFound"), "{err}");
    let (ok, _, err) = cli(&server, &["get", "pods"]);
    assert!(!ok && err.contains("unknown kind"), "{err}");
}

/// Kind-specific validation reaches the API: Istio's rules, with field paths
/// under `resources[i].spec`, over REST and gRPC; nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_validation_names_spec_fields() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let bad = json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "split", "namespace": "deep"},
        "spec": {"hosts": ["reviews"], "http": [{"route": [
            {"destination": {"host": "reviews", "subset": "v1"}, "weight": 70},
            {"destination": {"host": "reviews", "subset": "v2"}, "weight": 20}]},
            {"match": [{"uri": {"regex": "(unclosed"}}], "route": [{"destination": {"host": "reviews"}}]}]}});
    let (status, body) = apply(&c.http, &api, vec![vs("ok", "deep", "v1"), bad.clone()]).await;
    assert_eq!(status, 400, "{body}");
    let fields: Vec<&str> = body["error"]["fields"].as_array().unwrap().iter().map(|f| f["field"].as_str().unwrap()).collect();
    assert!(fields.iter().any(|f| f.starts_with("resources[1].spec.http[0]")), "{fields:?}");
    assert!(fields.iter().any(|f| f.starts_with("resources[1].spec.http[1].match[0].uri")), "{fields:?}");
    let (rev, names) = list_names(&c, "deep").await;
    assert_eq!((rev, names.len()), (0, 0));

    // A misspelled field is never dropped silently: an error when strict,
    // else dropped with a warning naming it (Kubernetes' default).
    let mut typo = vs("typo", "deep", "v1");
    typo["spec"]["htpp"] = json!([]);
    let (status, body) = call(c.http.post(format!("{api}/v1/apply?fieldValidation=Strict")).json(&json!({"resources": [typo.clone()]}))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("htpp"), "{body}");
    let (status, body) = apply(&c.http, &api, vec![typo]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["warnings"][0].as_str().unwrap().contains("unknown field spec.htpp dropped"), "{body}");

    let mut grpc = kit::grpc_api(&api);
    let err = grpc
        .apply(ApplyRequest { items: vec![ApplyItem { resource_json: bad.to_string(), expected_revision: None }], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("resources[0].spec.http"), "{}", err.message());
}

/// Istio config as people write it: what Istio accepts applies, what it
/// (and Kubernetes) refuses is refused naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn istio_parity_of_what_applies_and_what_is_refused() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let post_yaml = |yaml: &'static str| {
        let http = c.http.clone();
        let url = format!("{api}/v1/apply");
        async move {
            let r = http.post(url).header("content-type", "application/yaml").body(yaml).send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap())
        }
    };

    // One file applying the same object twice: applied in order, as
    // kubectl does, so the last one wins; the answer warns.
    let (status, body) = post_yaml(
        r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: parity}
spec:
  hosts: [reviews]
  http: [{route: [{destination: {host: reviews, subset: v1}}]}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: legacy, namespace: parity}
spec:
  hosts: [Legacy.Example.com]
  ports: [{number: 5432, name: postgres, protocol: ""}]
  resolution: DNS
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: names-only, namespace: parity}
spec:
  hosts: [names.example.com]
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: parity}
spec:
  ingress:
  - port: {number: 9080, protocol: HTTP, name: http}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: parity}
spec:
  hosts: [reviews]
  http: [{route: [{destination: {host: reviews, subset: v2}}]}]
"#,
    )
    .await;
    assert_eq!(status, 200, "{body:#}");
    let items = body["items"].as_array().unwrap();
    assert_eq!(items.len(), 4, "one result per object: {body:#}");
    let warnings = body["warnings"].to_string();
    assert!(warnings.contains("resources[4]") && warnings.contains("replaces resources[0]"), "{body:#}");
    assert!(warnings.contains("no ports"), "{body:#}");
    let (_, vs) = get_json(&c.http, &format!("{api}/v1/resources/vs/parity/reviews")).await;
    assert_eq!(vs["spec"]["http"][0]["route"][0]["destination"]["subset"], "v2", "{vs:#}");
    let (_, se) = get_json(&c.http, &format!("{api}/v1/resources/se/parity/legacy")).await;
    assert_eq!(se["spec"]["ports"][0]["protocol"], "", "stored as written: {se:#}");

    // Correct refusals stay: upper-case namespaces and names (Kubernetes
    // refuses them), host labels with '_' (Istio refuses them), each with
    // its field; nothing of the request is stored.
    let (status, body) = post_yaml(
        r#"
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: backend, namespace: nsA}
spec:
  hosts: [backend]
  http: [{route: [{destination: {host: backend}}]}]
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: BACKEND, namespace: parity}
spec:
  host: backend
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: oauth2-proxy, namespace: parity}
spec:
  hosts: [OAUTH2_PROXY_SERVICE.parity.svc.cluster.local]
  http: [{route: [{destination: {host: OAuth2-Proxy.parity.svc.cluster.local}}]}]
"#,
    )
    .await;
    assert_eq!(status, 400, "{body:#}");
    let fields = body["error"]["fields"].as_array().unwrap();
    for (field, reason) in [
        ("resources[0].metadata.namespace", "lower case"),
        ("resources[1].metadata.name", "lower case"),
        ("resources[2].spec.hosts[0]", "label \"OAUTH2_PROXY_SERVICE\" invalid"),
    ] {
        assert!(fields.iter().any(|f| f["field"] == field && f["reason"].as_str().unwrap().contains(reason)), "expected {field}: {reason} in {body:#}");
    }
    // Upper case in a host label is fine (DNS is case-insensitive, Istio accepts it).
    assert!(!fields.iter().any(|f| f["field"].as_str().unwrap().contains("destination.host")), "{body:#}");
    let (_, dr) = get_json(&c.http, &format!("{api}/v1/resources/dr/parity/BACKEND")).await;
    assert!(dr["error"].is_object(), "{dr:#}");
}

/// Fields a kind does not have (Istio's old `websocketUpgrade`, say): as a
/// Kubernetes API server with field validation `Warn` (its default), the
/// apply succeeds, drops them and names each in a warning; `Strict` (REST
/// `fieldValidation`, gRPC `field_validation`, `lodestar apply
/// --validate=strict`) refuses, naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_dropped_with_a_warning_or_refused_when_strict() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let mut doc = vs("ws", "old", "v1");
    doc["spec"]["http"][0]["websocketUpgrade"] = json!(true);
    let (status, body) = call(c.http.post(format!("{api}/v1/apply?fieldValidation=Strict")).json(&json!({"resources": [doc.clone()]}))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["fields"][0]["field"], "resources[0].spec.http[0].websocketUpgrade", "{body}");
    let (status, body) = call(c.http.post(format!("{api}/v1/apply?fieldValidation=Sloppy")).json(&json!({"resources": [doc.clone()]}))).await;
    assert_eq!((status, body["error"]["fields"][0]["field"].as_str()), (400, Some("fieldValidation")), "{body}");

    let (status, body) = apply(&c.http, &api, vec![doc.clone()]).await;
    assert_eq!(status, 200, "{body}");
    let warning = body["warnings"].to_string();
    assert!(warning.contains("unknown field spec.http[0].websocketUpgrade dropped"), "{body}");
    let (_, stored) = get_json(&c.http, &format!("{api}/v1/resources/vs/old/ws")).await;
    assert!(stored["spec"]["http"][0].get("websocketUpgrade").is_none(), "dropped from what is stored: {stored}");
    assert!(stored["spec"]["http"][0].get("route").is_some(), "{stored}");

    // gRPC, both ways.
    let mut grpc = kit::grpc_api(&api);
    let item = || vec![ApplyItem { resource_json: doc.to_string(), expected_revision: None }];
    let err = grpc.apply(ApplyRequest { items: item(), field_validation: "Strict".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("websocketUpgrade"), "{}", err.message());
    let ok = grpc.apply(ApplyRequest { items: item(), ..Default::default() }).await.unwrap().into_inner();
    assert!(ok.warnings.iter().any(|w| w.contains("websocketUpgrade")), "{:?}", ok.warnings);

    // The CLI, both ways.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ws.yaml");
    std::fs::write(&file, serde_json::to_string(&doc).unwrap()).unwrap();
    let (ok, _, err) = cli(&api, &["apply", "-f", file.to_str().unwrap(), "--validate=strict"]);
    assert!(!ok && err.contains("spec.http[0].websocketUpgrade"), "{err}");
    let (ok, out, err) = cli(&api, &["apply", "-f", file.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(format!("{out}{err}").contains("unknown field spec.http[0].websocketUpgrade dropped"), "{out}{err}");
}
