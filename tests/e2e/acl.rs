//! ACLs on real replicas (`acl_enabled = true`): 401 without a token on
//! every replica, 403 naming the missing permission, namespace-scoped
//! tokens and atomic applies, writes through a follower, revocation on
//! three replicas within the stated bound, expiry, bootstrap, the CLI, the
//! audit log, and no secret in logs, debug output, metrics or backups.

use crate::kit;

use kit::*;
use lodestar::proto::api::{AddNodeRequest, ApplyItem, ApplyRequest, ClusterStatusRequest, CreateTokenRequest, DeleteRequest, ListRequest, ResourceRef};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// `n` replicas as every test gets them (ACLs on by default, the
/// harness's management token file), with an audit log each
/// (`<replica dir>/audit.log`); `c.http` sends the management token.
async fn secure_cluster(n: u64) -> Cluster {
    let mut c = Cluster::prepare(n, "");
    for r in &mut c.replicas {
        r.extra_toml = format!("audit_log = {:?}\n", r.dir.join("audit.log"));
    }
    c.http = token_client(Some(management_token()));
    c.launch().await;
    c
}

/// Apply `policies` (name → rules) and create a token holding them.
async fn token_for(c: &Cluster, api: &str, name: &str, rules: Value, ttl: Option<&str>) -> (String, String) {
    let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": name}, "spec": {"rules": rules}});
    let (status, body) = apply(&c.http, api, vec![policy]).await;
    assert_eq!(status, 200, "{body}");
    let (status, t) = call(c.http.post(format!("{api}/v1/acl/tokens")).json(&json!({"policies": [name], "ttl": ttl, "description": name}))).await;
    assert_eq!(status, 200, "{t}");
    (t["accessorId"].as_str().unwrap().to_string(), t["secret"].as_str().unwrap().to_string())
}

fn grpc_req<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

fn apply_req(resources: &[Value]) -> ApplyRequest {
    ApplyRequest { items: resources.iter().map(|r| ApplyItem { resource_json: r.to_string(), expected_revision: None }).collect(), ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_every_replica_answers_401() {
    let c = secure_cluster(3).await;
    let anon = token_client(None);
    for r in &c.replicas {
        let api = r.api();
        for (method, path) in [
            ("GET", "/v1/resources/vs"),
            ("GET", "/v1/resources/vs/default/x"),
            ("POST", "/v1/apply"),
            ("POST", "/v1/delete"),
            ("DELETE", "/v1/resources/vs/default/x"),
            ("GET", "/v1/watch"),
            ("GET", "/v1/cluster"),
            ("GET", "/v1/node"),
            ("POST", "/v1/cluster/members"),
            ("DELETE", "/v1/cluster/members/3"),
            ("GET", "/v1/snapshot"),
            ("GET", "/v1/wait?revision=1"),
            ("GET", "/v1/registry/services"),
            ("POST", "/v1/resources/instances/default/i/heartbeat"),
            ("POST", "/v1/acl/tokens"),
            ("GET", "/metrics"),
            ("GET", "/debug/configz"),
            ("GET", "/debug/registryz"),
            ("GET", "/debug/syncz"),
            ("GET", "/debug/checks"),
            ("GET", "/debug/push_status"),
            ("GET", "/debug/config_dump?proxyID=x"),
        ] {
            let url = format!("{api}{path}");
            let req = match method {
                "GET" => anon.get(&url),
                "POST" => anon.post(&url).json(&json!({"resources": [vs("x", "default", "v1")]})),
                _ => anon.delete(&url),
            };
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status().as_u16(), 401, "replica {} {method} {path}", r.id);
            assert_eq!(resp.headers().get("www-authenticate").map(|v| v.to_str().unwrap()), Some("Bearer"));
            let body: Value = resp.json().await.unwrap();
            assert_eq!(body["error"]["code"], "Unauthenticated", "{body}");
        }
        // A token nobody issued, and a malformed header, are refused the same way.
        let (status, body) = call(token_client(Some("not-a-real-token")).get(format!("{api}/v1/resources/vs"))).await;
        assert_eq!(status, 401, "{body}");
        assert!(!body.to_string().contains("not-a-real-token"), "the error echoes the token: {body}");
        let (status, _) = call(anon.get(format!("{api}/v1/resources/vs")).header("authorization", "Basic eDp5")).await;
        assert_eq!(status, 401);
        // Probes stay open.
        assert_eq!(call(anon.get(format!("{api}/healthz"))).await.0, 200);
        let ready = anon.get(format!("{api}/readyz")).send().await.unwrap().status().as_u16();
        assert!(ready == 200 || ready == 503, "readyz answers without a token: {ready}");
        // gRPC: UNAUTHENTICATED without metadata.
        let mut grpc = grpc_api_as(&api, None);
        let e = grpc.apply(grpc_req(apply_req(&[vs("x", "default", "v1")]), None)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let e = grpc.list(grpc_req(ListRequest { kind: "vs".into(), ..Default::default() }, Some("nope"))).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        let e = grpc.cluster_status(grpc_req(ClusterStatusRequest {}, None)).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        // With the management token from the file, every replica answers.
        let (status, body) = call(c.http.get(format!("{api}/v1/resources/vs"))).await;
        assert_eq!(status, 200, "{body}");
        grpc.list(grpc_req(ListRequest { kind: "vs".into(), ..Default::default() }, Some(management_token()))).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_token_cannot_apply_delete_or_change_membership() {
    let c = secure_cluster(1).await;
    let api = c.replica(1).api();
    let (status, body) = apply(&c.http, &api, vec![vs("x", "ro", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let (_, secret) = token_for(&c, &api, "read-only", json!([{"verbs": ["read", "watch"], "kinds": ["*"], "namespaces": ["*"]}]), None).await;
    let ro = token_client(Some(&secret));

    // Reads work, across namespaces too; so do metrics and cluster status.
    let (status, body) = call(ro.get(format!("{api}/v1/resources/vs/ro/x"))).await;
    assert_eq!((status, body["metadata"]["name"].as_str()), (200, Some("x")), "{body}");
    assert_eq!(call(ro.get(format!("{api}/v1/resources/vs"))).await.0, 200);
    assert_eq!(call(ro.get(format!("{api}/metrics"))).await.0, 200);
    assert_eq!(call(ro.get(format!("{api}/v1/cluster"))).await.0, 200);

    let denied = |status: u16, body: &Value, missing: &str| {
        assert_eq!(status, 403, "{body}");
        assert_eq!(body["error"]["code"], "PermissionDenied", "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(missing), "{msg:?} should name {missing:?}");
    };
    // A body it may not send at all is refused before it is read
    // (tests/e2e/doors_api.rs shows that it is never read).
    let (status, body) = apply(&ro, &api, vec![vs("y", "ro", "v1")]).await;
    denied(status, &body, "lacks write on any kind in any namespace");
    let (status, body) = call(ro.delete(format!("{api}/v1/resources/vs/ro/x"))).await;
    denied(status, &body, "lacks delete on virtualservices in namespace ro");
    let (status, body) = call(ro.post(format!("{api}/v1/delete")).json(&json!({"resources": [{"kind": "vs", "namespace": "ro", "name": "x"}]}))).await;
    denied(status, &body, "lacks delete on any kind in any namespace");
    let member = json!({"id": 9, "raftAddr": "127.0.0.1:1", "apiAddr": "127.0.0.1:2", "xdsAddr": "127.0.0.1:3"});
    let (status, body) = call(ro.post(format!("{api}/v1/cluster/members")).json(&member)).await;
    denied(status, &body, "lacks admin on the cluster");
    let (status, body) = call(ro.delete(format!("{api}/v1/cluster/members/1"))).await;
    denied(status, &body, "lacks admin on the cluster");
    let (status, body) = call(ro.get(format!("{api}/v1/snapshot"))).await;
    denied(status, &body, "lacks admin on the cluster");
    // ACL objects are not in "*": a reader cannot list tokens or mint one.
    let (status, body) = call(ro.get(format!("{api}/v1/resources/tokens"))).await;
    denied(status, &body, "lacks admin on the cluster");
    let (status, body) = call(ro.post(format!("{api}/v1/acl/tokens")).json(&json!({"policies": ["read-only"]}))).await;
    denied(status, &body, "lacks admin on the cluster");

    // The same over gRPC.
    let mut grpc = grpc_api_as(&api, None);
    let e = grpc.apply(grpc_req(apply_req(&[vs("y", "ro", "v1")]), Some(&secret))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    assert!(e.message().contains("lacks write on any kind in any namespace"), "{}", e.message());
    let del = DeleteRequest { items: vec![ResourceRef { kind: "vs".into(), namespace: "ro".into(), name: "x".into(), expected_revision: None }] };
    assert_eq!(grpc.delete(grpc_req(del, Some(&secret))).await.unwrap_err().code(), tonic::Code::PermissionDenied);
    let add = AddNodeRequest { id: 9, api_addr: "127.0.0.1:2".into(), raft_addr: "127.0.0.1:1".into(), xds_addr: "127.0.0.1:3".into() };
    assert_eq!(grpc.add_node(grpc_req(add, Some(&secret))).await.unwrap_err().code(), tonic::Code::PermissionDenied);
    let e = grpc.create_token(grpc_req(CreateTokenRequest { policies: vec!["read-only".into()], ..Default::default() }, Some(&secret))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    grpc.list(grpc_req(ListRequest { kind: "vs".into(), namespace: "ro".into(), ..Default::default() }, Some(&secret))).await.unwrap();

    // A watch of every kind is allowed, without the ACL objects it may not see.
    let mut resp = ro.get(format!("{api}/v1/watch?fromRevision=0")).send().await.unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let mut seen = String::new();
    while !seen.contains("\"VirtualService\"") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), resp.chunk()).await.expect("watch events in time").unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    // Replay delivers revisions in order: the policy and token came after the VirtualService.
    let more = tokio::time::timeout(Duration::from_millis(500), resp.chunk()).await;
    if let Ok(Ok(Some(chunk))) = more {
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!seen.contains("\"Policy\"") && !seen.contains("\"Token\""), "{seen}");
    let (status, _) = call(ro.get(format!("{api}/v1/watch?kind=tokens"))).await;
    assert_eq!(status, 403);

    // Nothing changed: still one VirtualService, one member.
    let (_, list) = call(c.http.get(format!("{api}/v1/resources/vs?namespace=ro"))).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (_, cluster) = call(c.http.get(format!("{api}/v1/cluster"))).await;
    assert_eq!(cluster["members"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_token_is_refused_outside_it_and_a_mixed_apply_stores_nothing() {
    let c = secure_cluster(1).await;
    let api = c.replica(1).api();
    let (_, secret) = token_for(&c, &api, "team-a", json!([{"verbs": ["read", "write", "delete"], "kinds": ["*"], "namespaces": ["a"]}]), None).await;
    let a = token_client(Some(&secret));

    let (status, body) = apply(&a, &api, vec![vs("x", "a", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let rev = body["revision"].as_u64().unwrap();
    let (status, body) = apply(&a, &api, vec![vs("x", "b", "v1")]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("write on virtualservices in namespace b"), "{body}");

    // One atomic apply touching a and b: refused whole, nothing stored.
    let (status, body) = apply(&a, &api, vec![vs("y", "a", "v1"), vs("y", "b", "v1")]).await;
    assert_eq!(status, 403, "{body}");
    let (_, list) = call(c.http.get(format!("{api}/v1/resources/vs?namespace=a"))).await;
    let names: Vec<&str> = list["items"].as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["x"]);
    assert_eq!(list["revision"].as_u64(), Some(rev), "the refused apply created no revision");
    let (_, list) = call(c.http.get(format!("{api}/v1/resources/vs?namespace=b"))).await;
    assert!(list["items"].as_array().unwrap().is_empty());

    // Reads outside a, or across every namespace, are refused too.
    assert_eq!(call(a.get(format!("{api}/v1/resources/vs?namespace=b"))).await.0, 403);
    assert_eq!(call(a.get(format!("{api}/v1/resources/vs"))).await.0, 403);
    assert_eq!(call(a.get(format!("{api}/v1/resources/vs?namespace=a"))).await.0, 200);
    assert_eq!(call(a.get(format!("{api}/v1/watch?namespace=b"))).await.0, 403);
    // Over gRPC, the same mixed apply.
    let mut grpc = grpc_api_as(&api, None);
    let e = grpc.apply(grpc_req(apply_req(&[vs("z", "a", "v1"), vs("z", "b", "v1")]), Some(&secret))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied);
    let (_, list) = call(c.http.get(format!("{api}/v1/resources/vs?namespace=a"))).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // Deleting in a works; in b it is refused before anything is looked up.
    assert_eq!(call(a.delete(format!("{api}/v1/resources/vs/b/x"))).await.0, 403);
    assert_eq!(call(a.delete(format!("{api}/v1/resources/vs/a/x"))).await.0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_authorize_writes_and_a_revoked_token_is_refused_everywhere_within_the_bound() {
    let c = secure_cluster(3).await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let follower = c.replicas.iter().map(|r| r.id).find(|id| *id != leader).unwrap();
    let (lapi, fapi) = (c.replica(leader).api(), c.replica(follower).api());
    let (accessor, secret) = token_for(&c, &lapi, "team-a", json!([{"verbs": ["read", "write"], "kinds": ["*"], "namespaces": ["a"]}]), None).await;
    let (_, body) = apply(&c.http, &lapi, vec![vs("marker", "a", "v1")]).await;
    c.wait_for_revision(body["revision"].as_u64().unwrap(), Duration::from_secs(10)).await;
    let a = token_client(Some(&secret));

    // Through a follower: allowed in a (forwarded to the leader), refused in b
    // there, before anything is forwarded.
    let (status, body) = apply(&a, &fapi, vec![vs("via-follower", "a", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = apply(&a, &fapi, vec![vs("via-follower", "a", "v2"), vs("via-follower", "b", "v1")]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("namespace b"), "{body}");
    let (_, obj) = call(c.http.get(format!("{lapi}/v1/resources/vs/a/via-follower"))).await;
    assert_eq!(obj["metadata"]["labels"]["tag"], "v1", "the refused apply changed nothing");
    // The follower refused it (its audit log says so); the leader never saw it.
    audit_line(&c.replica(follower).dir.join("audit.log"), |l| l["outcome"] == "denied" && l["resources"][1] == "virtualservices/b/via-follower").await;
    assert!(audit_lines(&c.replica(leader).dir.join("audit.log")).iter().all(|l| l["outcome"] != "denied"));

    // Every replica accepts the token now.
    for r in &c.replicas {
        assert_eq!(call(a.get(format!("{}/v1/resources/vs?namespace=a&consistency=stale", r.api()))).await.0, 200, "replica {}", r.id);
    }

    // Revoke through a follower; measure how long each replica still accepts it.
    let (status, body) = call(c.http.delete(format!("{fapi}/v1/resources/tokens/lodestar-system/{accessor}"))).await;
    assert_eq!(status, 200, "{body}");
    let revoked = Instant::now();
    let bound = Duration::from_secs(1);
    for r in &c.replicas {
        loop {
            let (status, body) = call(a.get(format!("{}/v1/resources/vs?namespace=a&consistency=stale", r.api()))).await;
            if status == 401 {
                assert!(body["error"]["message"].as_str().unwrap().contains("unknown or revoked"), "{body}");
                break;
            }
            assert_eq!(status, 200, "{body}");
            assert!(revoked.elapsed() < bound, "replica {} still accepts the revoked token after {:?}", r.id, revoked.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        eprintln!("replica {}: the revoked token refused {:?} after the revoke returned", r.id, revoked.elapsed());
    }
    // Writes with it are refused on every replica too.
    for r in &c.replicas {
        assert_eq!(apply(&a, &r.api(), vec![vs("late", "a", "v1")]).await.0, 401, "replica {}", r.id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refused() {
    let c = secure_cluster(1).await;
    let api = c.replica(1).api();
    let (accessor, secret) = token_for(&c, &api, "reader", json!([{"verbs": ["read"], "kinds": ["*"], "namespaces": ["*"]}]), Some("2s")).await;
    let (_, t) = call(c.http.get(format!("{api}/v1/resources/tokens/lodestar-system/{accessor}"))).await;
    let expires = t["spec"]["expiresAt"].as_str().unwrap().to_string();
    let t = token_client(Some(&secret));
    assert_eq!(call(t.get(format!("{api}/v1/resources/vs"))).await.0, 200);
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let (status, body) = call(t.get(format!("{api}/v1/resources/vs"))).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains(&format!("expired at {expires}")), "{body}");
    // A bad ttl is a 400 naming the field.
    let (status, body) = call(c.http.post(format!("{api}/v1/acl/tokens")).json(&json!({"policies": ["reader"], "ttl": "soon"}))).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["fields"][0]["field"], "ttl");
}

fn cli_with(server: &str, token: Option<&str>, args: &[&str]) -> (bool, String, String) {
    let mut cmd = cli_command();
    cmd.arg("--server").arg(server).args(args).env_remove("LODESTAR_TOKEN");
    match token {
        Some(t) => cmd.env("LODESTAR_TOKEN", t),
        None => cmd.env("LODESTAR_CONFIG", &test_ca().anonymous_client_config),
    };
    let out = cmd.output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn field<'a>(out: &'a str, name: &str) -> &'a str {
    out.lines().find_map(|l| l.strip_prefix(name)).map(str::trim).unwrap_or_else(|| panic!("no {name} in {out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_cli_and_token_objects() {
    let c = secure_cluster(1).await;
    let api = c.replica(1).api();

    // Bootstrap: refused, since this replica has a management token (the
    // harness gives every replica its file); the one legitimate bootstrap
    // and its reset are in tests/e2e/doors_api.rs.
    let (ok, out, err) = cli_with(&api, None, &["acl", "bootstrap"]);
    assert!(!ok && err.contains("has a management token"), "{out}{err}");
    let boot = management_token().to_string();

    // The management token manages ACLs through the CLI (LODESTAR_TOKEN).
    let (ok, out, err) = cli_with(&api, Some(&boot), &["policy", "create", "team-a", "--rule", "read,write:vs,dr:a,a-*", "--description", "team a"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli_with(&api, Some(&boot), &["policy", "create", "team-a", "--rule", "read:*:*"]);
    assert!(!ok && err.contains("Conflict"), "create does not overwrite: {out}{err}");
    let (ok, out, err) = cli_with(&api, Some(&boot), &["role", "create", "deployer", "--policy", "team-a", "--identity", "spiffe://example.org/ci"]);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = cli_with(&api, Some(&boot), &["policy", "list"]);
    assert!(ok && out.contains("team-a") && out.contains("read,write:vs,dr:a,a-*"), "{out}");
    let (ok, out, _) = cli_with(&api, Some(&boot), &["role", "read", "deployer"]);
    assert!(ok && out.contains("spiffe://example.org/ci"), "{out}");
    let (ok, out, err) = cli_with(&api, Some(&boot), &["token", "create", "--role", "deployer", "--description", "ci", "--ttl", "1h"]);
    assert!(ok, "{out}{err}");
    let (accessor, secret) = (field(&out, "AccessorID:").to_string(), field(&out, "SecretID:").to_string());
    assert_ne!(field(&out, "Expires:"), "never");
    // The --token flag works as well as the environment.
    let (ok, out, err) = cli_command()
        .args(["--server", &api, "--token", &secret, "apply", "-f", "-"])
        .env_remove("LODESTAR_TOKEN")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut ch| {
            use std::io::Write;
            ch.stdin.take().unwrap().write_all(vs("from-cli", "a", "v1").to_string().as_bytes())?;
            ch.wait_with_output()
        })
        .map(|o| (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned()))
        .unwrap();
    assert!(ok && out.contains("virtualservice/from-cli created"), "{out}{err}");
    let (ok, _, err) = cli_with(&api, Some(&secret), &["get", "vs", "-n", "b"]);
    assert!(!ok && err.contains("PermissionDenied") && err.contains("read on virtualservices in namespace b"), "{err}");
    let (ok, _, err) = cli_with(&api, None, &["get", "vs", "-n", "a"]);
    assert!(!ok && err.contains("Unauthenticated"), "{err}");

    // Listings and reads of tokens show neither the secret nor its hash.
    let (ok, out, _) = cli_with(&api, Some(&boot), &["token", "list"]);
    assert!(ok && out.contains(&accessor) && out.contains("deployer"), "{out}");
    let (ok, out, _) = cli_with(&api, Some(&boot), &["token", "read", &accessor, "-o", "json"]);
    assert!(ok, "{out}");
    let t: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(t["spec"]["roles"][0], "deployer");
    assert!(t["spec"].get("secretHash").is_none(), "{t}");
    let (_, list) = call(c.http.get(format!("{api}/v1/resources/tokens"))).await;
    for item in list["items"].as_array().unwrap() {
        assert!(item["spec"].get("secretHash").is_none(), "{item}");
    }
    let mut grpc = grpc_api_as(&api, None);
    let l = grpc.list(grpc_req(ListRequest { kind: "tokens".into(), ..Default::default() }, Some(&boot))).await.unwrap().into_inner();
    assert!(!l.resources_json.is_empty() && l.resources_json.iter().all(|j| !j.contains("secretHash") && !j.contains("sha256:")));

    // A Token cannot be applied; a bad policy is a 400 naming the field;
    // a token naming a missing policy is a 400 naming it.
    let forged = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Token", "metadata": {"name": "forged"},
                        "spec": {"policies": ["global-management"], "secretHash": format!("sha256:{}", "0".repeat(64))}});
    let (status, body) = apply(&c.http, &api, vec![forged]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["fields"][0]["field"], "resources[0].kind");
    assert!(body["error"]["message"].as_str().unwrap().contains("token create"), "{body}");
    let policy = |ns: Option<&str>, verb: &str| {
        json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "bad", "namespace": ns},
               "spec": {"rules": [{"verbs": [verb], "kinds": ["*"], "namespaces": ["*"]}]}})
    };
    for (doc, field) in [(policy(None, "reed"), "resources[0].spec.rules[0].verbs[0]"), (policy(Some("team"), "read"), "resources[0].metadata.namespace")] {
        let (status, body) = apply(&c.http, &api, vec![doc]).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["fields"][0]["field"], field, "{body}");
    }
    let (status, body) = call(c.http.post(format!("{api}/v1/acl/tokens")).json(&json!({"policies": ["team-a", "nope"], "roles": ["gone"]}))).await;
    assert_eq!(status, 400, "{body}");
    let fields: Vec<&str> = body["error"]["fields"].as_array().unwrap().iter().map(|f| f["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["policies[1]", "roles[0]"]);
    let (status, body) = call(c.http.post(format!("{api}/v1/acl/tokens")).json(&json!({"policies": ["team-a"], "secret": "mine"}))).await;
    assert_eq!(status, 400, "unknown fields are refused: {body}");

    // Revoke: the token stops working; the management token still works.
    let (ok, out, err) = cli_with(&api, Some(&boot), &["token", "revoke", &accessor]);
    assert!(ok && out.contains(&format!("token/{accessor} deleted")), "{out}{err}");
    let (ok, _, err) = cli_with(&api, Some(&secret), &["get", "vs", "-n", "a"]);
    assert!(!ok && err.contains("unknown or revoked"), "{err}");
    let (ok, out, err) = cli_with(&api, Some(&boot), &["role", "delete", "deployer"]);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = cli_with(&api, Some(&boot), &["policy", "delete", "team-a"]);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = cli_with(&api, Some(&boot), &["role", "list"]);
    assert!(ok && !out.contains("deployer"), "{out}");
}

/// Every place a secret could leak to: the replicas' logs, the audit logs,
/// every debug endpoint, the metrics, a backup file.
async fn leak_surfaces(c: &Cluster) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for r in &c.replicas {
        out.push((format!("replica {} log", r.id), r.log().into_bytes()));
        out.push((format!("replica {} audit log", r.id), std::fs::read(r.dir.join("audit.log")).unwrap_or_default()));
        for path in ["/debug/configz", "/debug/registryz", "/debug/syncz", "/debug/checks", "/debug/push_status", "/debug/config_dump?proxyID=x", "/metrics"] {
            let resp = c.http.get(format!("{}{path}", r.api())).send().await.unwrap();
            assert_ne!(resp.status().as_u16(), 401, "{path}");
            out.push((format!("replica {} {path}", r.id), resp.bytes().await.unwrap().to_vec()));
        }
        let resp = c.http.get(format!("{}/v1/resources/tokens", r.api())).send().await.unwrap();
        out.push((format!("replica {} token list", r.id), resp.bytes().await.unwrap().to_vec()));
    }
    let backup = c.tmp.path().join("backup.snapshot");
    let (ok, o, e) = cli_with(&c.replica(1).api(), Some(management_token()), &["snapshot", "save", backup.to_str().unwrap()]);
    assert!(ok, "{o}{e}");
    out.push(("backup file".into(), std::fs::read(&backup).unwrap()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_log_records_writes_and_refusals_and_no_secret_leaks() {
    let c = secure_cluster(1).await;
    let api = c.replica(1).api();
    let audit = c.replica(1).dir.join("audit.log");
    let (accessor, secret) = token_for(&c, &api, "team-a", json!([{"verbs": ["write", "read"], "kinds": ["*"], "namespaces": ["a"]}]), None).await;
    let a = token_client(Some(&secret));

    // An allowed write: who, what, the revision, the outcome.
    let (status, body) = apply(&a, &api, vec![vs("audited", "a", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let rev = body["revision"].as_u64().unwrap();
    let who = format!("token:{accessor}");
    let line = audit_line(&audit, |l| l["outcome"] == "ok" && l["who"] == who.as_str() && l["op"] == "POST /v1/apply").await;
    assert_eq!(line["resources"], json!(["virtualservices/a/audited"]));
    assert_eq!((line["revision"].as_u64(), line["verb"].as_str(), line["replica"].as_u64()), (Some(rev), Some("write"), Some(1)));
    assert!(line["time"].as_str().unwrap().ends_with('Z'));

    // A refused write: no revision, the reason names the missing permission.
    let (status, _) = apply(&a, &api, vec![vs("audited", "b", "v1")]).await;
    assert_eq!(status, 403);
    let line = audit_line(&audit, |l| l["outcome"] == "denied" && l["who"] == who.as_str()).await;
    assert_eq!(line["resources"], json!(["virtualservices/b/audited"]));
    assert!(line["reason"].as_str().unwrap().contains("write on virtualservices in namespace b"), "{line}");
    assert!(line.get("revision").is_none());
    // Refusals without a valid token are audited too, without the token.
    assert_eq!(apply(&token_client(Some("wrong-secret-value")), &api, vec![vs("x", "a", "v1")]).await.0, 401);
    audit_line(&audit, |l| l["outcome"] == "unauthenticated" && l["who"] == "unknown-token").await;

    // A revocation (by the initial management token).
    let (status, body) = call(c.http.delete(format!("{api}/v1/resources/tokens/lodestar-system/{accessor}"))).await;
    assert_eq!(status, 200, "{body}");
    let resource = format!("tokens/lodestar-system/{accessor}");
    let line = audit_line(&audit, |l| l["outcome"] == "ok" && l["verb"] == "delete" && l["resources"][0] == resource.as_str()).await;
    assert_eq!(line["who"], "initial-management");
    assert_eq!(line["revision"].as_u64(), Some(body["revision"].as_u64().unwrap()));

    // The metric counts refusals.
    let (_, metrics) = call(c.http.get(format!("{api}/metrics"))).await;
    let metrics = metrics.as_str().unwrap_or_default().to_string();
    assert!(metrics.contains("lodestar_acl_refusals_total{reason=\"denied\"} 1"), "{metrics}");
    assert!(metrics.contains("lodestar_audit_dropped_total 0"), "{metrics}");

    // No secret anywhere: the created token's, the management token's, the wrong one sent.
    let hash = lodestar::auth::token::hash_text(&secret);
    for (what, bytes) in leak_surfaces(&c).await {
        let text = String::from_utf8_lossy(&bytes);
        for s in [secret.as_str(), management_token(), "wrong-secret-value"] {
            assert!(!text.contains(s), "{what} contains a secret");
        }
        if what != "backup file" {
            assert!(!text.contains(&hash), "{what} contains a secret's hash");
        }
    }
}

/// A client certificate from the test CA naming `uri` (a URI SAN).
fn client_cert(uri: &str) -> reqwest::Identity {
    use rcgen::{CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, SanType};
    let ca = test_ca();
    let ca_key = KeyPair::from_pem(&std::fs::read_to_string(&ca.ca_key_file).unwrap()).unwrap();
    let issuer = Issuer::from_ca_cert_pem(&ca.ca_pem, ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, "acl-test-client");
    params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    reqwest::Identity::from_pem(format!("{}{}", cert.pem(), key.serialize_pem()).as_bytes()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_identity_gets_the_policies_of_its_roles() {
    let c = secure_cluster(1).await;
    let api = c.replica(1).api();
    let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "team-a"},
                        "spec": {"rules": [{"verbs": ["read", "write"], "kinds": ["*"], "namespaces": ["a"]}]}});
    let role = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Role", "metadata": {"name": "ci"},
                      "spec": {"policies": ["team-a"], "identities": ["spiffe://test.lodestar/ci"]}});
    let (status, body) = apply(&c.http, &api, vec![policy, role]).await;
    assert_eq!(status, 200, "{body}");

    let ci = anonymous_http_builder().identity(client_cert("spiffe://test.lodestar/ci")).build().unwrap();
    let (status, body) = apply(&ci, &api, vec![vs("by-cert", "a", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = apply(&ci, &api, vec![vs("by-cert", "b", "v1")]).await;
    assert_eq!(status, 403, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("certificate identity \"spiffe://test.lodestar/ci\" lacks write on virtualservices in namespace b"), "{msg}");
    audit_line(&c.replica(1).dir.join("audit.log"), |l| l["who"] == "identity:spiffe://test.lodestar/ci" && l["outcome"] == "ok").await;

    // An identity no role lists is authenticated, and allowed nothing.
    let other = anonymous_http_builder().identity(client_cert("spiffe://test.lodestar/other")).build().unwrap();
    let (status, body) = apply(&other, &api, vec![vs("x", "a", "v1")]).await;
    assert_eq!(status, 403, "{body}");
    // A bearer token sent with a certificate decides.
    let with_bad_token = anonymous_http_builder()
        .identity(client_cert("spiffe://test.lodestar/ci"))
        .default_headers([(reqwest::header::AUTHORIZATION, "Bearer not-a-token".parse().unwrap())].into_iter().collect())
        .build()
        .unwrap();
    assert_eq!(apply(&with_bad_token, &api, vec![vs("x", "a", "v1")]).await.0, 401);
}
