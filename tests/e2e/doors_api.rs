//! The API's front door and data at rest, as an attacker finds them
//! (issue 32): anonymous ACL bootstrap (refused whenever a management
//! credential exists; one-shot, reset only through a file on the replica),
//! requests refused from their headers before their body is read or
//! decoded, YAML alias bombs, a kubectl-shaped Secret whose annotation
//! carries its key, symbolic-link loops in a watched directory, the CLI's
//! token over plaintext, file modes, and the mesh CA reloaded from its
//! files. Real replicas, real TLS, the real CLI.

use crate::kit;

use kit::*;
use lodestar::proto::api::{AclBootstrapRequest, ApplyItem, ApplyRequest, GetRequest};
use lodestar::proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use lodestar::proto::istio_ca::IstioCertificateRequest;
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).permissions().mode() & 0o777
}

/// An anonymous `POST /v1/acl/bootstrap` (what the README's curl sends).
async fn anonymous_bootstrap(api: &str) -> (u16, Value) {
    call(token_client(None).post(format!("{api}/v1/acl/bootstrap"))).await
}

/// The number after `reset index: ` in a refusal.
fn reset_index(body: &Value) -> u64 {
    let msg = body["error"]["message"].as_str().unwrap_or_default();
    let rest = msg.split("reset index: ").nth(1).unwrap_or_else(|| panic!("no reset index in {body}"));
    rest.split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

/// A replica's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()).unwrap()
}

/// An HTTP/1.1 `POST` over TLS that declares a `declared`-byte body and
/// sends only `sent` of it: the status, if an answer comes within `wait`
/// while the rest of the body never does (None: the server is waiting for
/// the body, as it must for a caller allowed to send one).
async fn post_with_stalled_body(addr: &str, path: &str, token: &str, declared: usize, sent: &[u8], wait: Duration) -> Option<u16> {
    let roots = lodestar::tls::roots_from_pem(&test_ca().ca_file).unwrap();
    let mut config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let ip: std::net::IpAddr = addr.rsplit_once(':').unwrap().0.parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector.connect(rustls::pki_types::ServerName::IpAddress(ip.into()), tcp).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\ncontent-type: application/yaml\r\ncontent-length: {declared}\r\n\r\n"
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    tls.write_all(sent).await.unwrap();
    tls.flush().await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match tls.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(wait, read).await.ok()?;
    String::from_utf8_lossy(&got).split(' ').nth(1).and_then(|s| s.parse().ok())
}

/// The "billion laughs" of YAML: every level aliases the one before ten
/// times; 9 levels in about a kilobyte expand to 10^9 strings.
fn alias_bomb() -> String {
    let mut s = String::from(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: lol, namespace: default}\nspec:\n  hosts: [lol]\n  l0: &l0 [\"lol\"]\n",
    );
    for i in 1..10 {
        s.push_str(&format!("  l{i}: &l{i} [{}]\n", vec![format!("*l{}", i - 1); 10].join(", ")));
    }
    s
}

/// The bomb of issue 32: one anchored list of 2,000 scalars, aliased
/// 3,000 times. About 18 KB, few enough alias jumps for yaml_serde's limit
/// (which counts jumps, not what they expand to), and 6 million values
/// once expanded.
fn wide_alias_bomb() -> String {
    let base = vec!["x"; 2000].join(", ");
    let refs = vec!["*a"; 3000].join(", ");
    format!("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: wide, namespace: default}}\nspec:\n  hosts: [wide]\n  a: &a [{base}]\n  b: [{refs}]\n")
}

/// A single node started as `lodestar server` starts with no flags: no
/// management token file, so it generates `management.token`; a watched
/// directory and an audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_default_single_node() {
    let watched = tempfile::tempdir().unwrap();
    let mut c = Cluster::prepare(1, "");
    let audit = c.replicas[0].dir.join("audit.log");
    c.replicas[0].management_token = false;
    c.replicas[0].extra_toml = format!("audit_log = {audit:?}\nwatch_dir = {:?}\nwatch_dir_poll_ms = 100\n", watched.path());
    // Two links to the watched directory itself (a walk that followed
    // them would double at every level) and one to itself, before the
    // replica ever scans it; then the real files.
    std::os::unix::fs::symlink(".", watched.path().join("loop-a")).unwrap();
    std::os::unix::fs::symlink(watched.path(), watched.path().join("loop-b")).unwrap();
    std::os::unix::fs::symlink("self.yaml", watched.path().join("self.yaml")).unwrap();
    std::fs::create_dir(watched.path().join("team")).unwrap();
    std::os::unix::fs::symlink("..", watched.path().join("team/up")).unwrap();
    std::fs::write(watched.path().join("web.yaml"), yaml_serde::to_string(&vs("web", "default", "v1")).unwrap()).unwrap();
    std::fs::write(watched.path().join("team/api.yaml"), yaml_serde::to_string(&vs("api", "team", "v1")).unwrap()).unwrap();
    c.spawn_all();
    let r = c.replica(1);
    let token_file = r.data_dir().join("management.token");
    until("management.token written", Duration::from_secs(20), || async { token_file.exists() }).await;
    let token = std::fs::read_to_string(&token_file).unwrap().trim().to_string();
    c.http = token_client(Some(&token));
    c.wait_for_leader(Duration::from_secs(20)).await;
    let api = c.replica(1).api();

    // Item 14: the data directory and the token are the owner's only.
    assert_eq!(mode(&c.replica(1).data_dir()), 0o700, "the data directory");
    assert_eq!(mode(&token_file), 0o600, "management.token");

    // Item 1: the README's `curl --cacert ca.pem -X POST .../v1/acl/bootstrap`
    // is refused, and audited as a denied anonymous request.
    let (status, body) = anonymous_bootstrap(&api).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("this replica has a management token"), "{body}");
    assert!(body.get("secret").is_none() && !body.to_string().contains(&token), "{body}");
    let line = audit_line(&audit, |l| l["op"] == "POST /v1/acl/bootstrap").await;
    assert_eq!((line["who"].as_str(), line["outcome"].as_str()), (Some("anonymous"), Some("denied")), "{line}");
    let e = grpc_api_as(&api, None).acl_bootstrap(AclBootstrapRequest {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    // ... and nothing was created.
    let (status, tokens) = call(c.http.get(format!("{api}/v1/resources/tokens"))).await;
    assert_eq!((status, tokens["items"].as_array().map(Vec::len)), (200, Some(0)), "{tokens}");

    // Item 9: the watched directory syncs its real files while the
    // replica answers its probes at once; the links are logged, not followed.
    let started = Instant::now();
    loop {
        let probe = Instant::now();
        let (status, _) = call(token_client(None).get(format!("{api}/healthz")).timeout(Duration::from_secs(1))).await;
        assert!(status == 200 && probe.elapsed() < Duration::from_secs(1), "/healthz: {status} in {:?}", probe.elapsed());
        let (_, web) = get_json(&c.http, &format!("{api}/v1/resources/vs/default/web")).await;
        let (_, api_vs) = get_json(&c.http, &format!("{api}/v1/resources/vs/team/api")).await;
        if web["metadata"]["name"] == "web" && api_vs["metadata"]["name"] == "api" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(15), "the watched directory did not sync: {}", c.replica(1).log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(c.replica(1).log().contains("symbolic links in the watched directory are not followed"), "{}", c.replica(1).log());
    // Item 3 in the adapter: a file with an alias stops the round, named.
    std::fs::write(watched.path().join("bomb.yaml"), alias_bomb()).unwrap();
    std::fs::write(watched.path().join("web.yaml"), yaml_serde::to_string(&vs("web", "default", "v2")).unwrap()).unwrap();
    until("the alias error logged", Duration::from_secs(10), || async { c.replica(1).log().contains("anchors and aliases are not accepted") }).await;
    assert!(c.replica(1).log().contains("bomb.yaml[0]"), "the error names the file");
    let (_, web) = get_json(&c.http, &format!("{api}/v1/resources/vs/default/web")).await;
    assert_eq!(web["metadata"]["labels"]["tag"], "v1", "nothing applied from a directory with a bad file");

    // Item 14: a backup is its owner's only.
    let backup = c.tmp.path().join("b.snapshot");
    let out = cli_command().env("LODESTAR_TOKEN", &token).args(["--server", &api, "snapshot", "save"]).arg(&backup).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode(&backup), 0o600, "the backup file");

    // Item 13: the CLI does not send its token over plaintext http.
    let plain = format!("http://{}:7009", c.replica(1).ip);
    let out = cli_command().env("LODESTAR_TOKEN", &token).args(["--server", &plain, "get", "vs"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("refusing to send the token") && err.contains("--insecure"), "{err}");
    assert!(!err.contains(&token), "{err}");
    let out = cli_command().env("LODESTAR_TOKEN", &token).args(["--server", &plain, "--insecure", "get", "vs"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot reach http://"), "with --insecure it tries: {err}");
    // A bare HOST:PORT is https: it works with the CA and the token.
    let out = cli_command().env("LODESTAR_TOKEN", &token).args(["--server", &c.replica(1).api_addr(), "get", "vs", "-A"]).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("web"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A cluster of three with no management token at all (no file; several
/// members generate none): the one legitimate anonymous bootstrap, then
/// refusals, and the deliberate reset through a file on the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_once_then_only_a_deliberate_reset() {
    let mut c = Cluster::prepare(3, "");
    for r in &mut c.replicas {
        r.management_token = false;
    }
    c.spawn_all();
    // Nobody can read the cluster's status yet: wait for readiness.
    for r in &c.replicas {
        let ready = || async { token_client(None).get(format!("{}/readyz", r.api())).send().await.map(|r| r.status().as_u16()).ok() == Some(200) };
        until(&format!("replica {} ready", r.id), Duration::from_secs(30), ready).await;
    }
    let (api1, api2, api3) = (c.replica(1).api(), c.replica(2).api(), c.replica(3).api());

    // Once, with no credentials, through the CLI.
    let out = cli_command().env("LODESTAR_CONFIG", &test_ca().anonymous_client_config).args(["--server", &api1, "acl", "bootstrap"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let boot = stdout.lines().find_map(|l| l.strip_prefix("SecretID:")).unwrap().trim().to_string();
    let admin = token_client(Some(&boot));
    // Another replica knows the token once it has applied its commit.
    until("the bootstrap token works on replica 2", Duration::from_secs(10), || async { call(admin.get(format!("{api2}/v1/cluster"))).await.0 == 200 }).await;

    // Then never again, on any replica, REST or gRPC: the refusal names
    // the reset index.
    let (status, body) = anonymous_bootstrap(&api2).await;
    assert_eq!(status, 409, "{body}");
    let index = reset_index(&body);
    assert!(body["error"]["message"].as_str().unwrap().contains("acl-bootstrap-reset"), "{body}");
    let e = grpc_api_as(&api3, None).acl_bootstrap(AclBootstrapRequest {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    // Deleting the record of it is refused, even to the admin.
    let (status, body) = call(admin.delete(format!("{api1}/v1/resources/policies/lodestar-system/global-management"))).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("cannot be deleted"), "{body}");

    // The reset: the operator writes the index into the file on the
    // replica that receives the request. Another number does nothing.
    let reset_file = |id: u64| c.replica(id).data_dir().join("acl-bootstrap-reset");
    std::fs::write(reset_file(2), format!("{}\n", index + 1)).unwrap();
    assert_eq!(anonymous_bootstrap(&api2).await.0, 409);
    // The right number on another replica's disk does nothing here.
    std::fs::write(reset_file(1), format!("{index}\n")).unwrap();
    assert_eq!(anonymous_bootstrap(&api3).await.0, 409);
    std::fs::write(reset_file(2), format!("{index}\n")).unwrap();
    let (status, body) = anonymous_bootstrap(&api2).await;
    assert_eq!(status, 200, "{body}");
    let second = body["secret"].as_str().unwrap().to_string();
    assert!(!reset_file(2).exists(), "the reset file is consumed");
    // (replica 3 knows it once it has applied the commit, as above)
    let new_admin = token_client(Some(&second));
    until("the new token manages the cluster, on replica 3", Duration::from_secs(10), || async {
        call(new_admin.get(format!("{api3}/v1/cluster"))).await.0 == 200
    })
    .await;
    assert_eq!(call(admin.get(format!("{api3}/v1/cluster"))).await.0, 200, "the first token still works");
    // One file, one bootstrap: the index moved, so the stale file on
    // replica 1 (and the same number again) opens nothing.
    let (status, body) = anonymous_bootstrap(&api1).await;
    assert_eq!(status, 409, "{body}");
    assert!(reset_index(&body) > index, "{body}");
    std::fs::write(reset_file(2), format!("{index}\n")).unwrap();
    assert_eq!(anonymous_bootstrap(&api2).await.0, 409);
}

/// Three members sharing the harness's management token file and a mesh
/// CA directory, each with an audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_sharing_a_management_token() {
    let mesh_ca = tempfile::tempdir().unwrap();
    lodestar::ca::create_dir(mesh_ca.path(), "cluster.local").unwrap();
    let mut c = Cluster::prepare(3, "");
    for r in &mut c.replicas {
        r.extra_toml = format!("audit_log = {:?}\nmesh_ca_dir = {:?}\n", r.dir.join("audit.log"), mesh_ca.path());
    }
    c.launch().await;
    let api = c.replica(1).api();
    let audit = c.replica(1).dir.join("audit.log");

    // Item 1: refused on every member, REST and gRPC.
    for r in &c.replicas {
        let (status, body) = anonymous_bootstrap(&r.api()).await;
        assert_eq!(status, 409, "replica {}: {body}", r.id);
        let e = grpc_api_as(&r.api(), None).acl_bootstrap(AclBootstrapRequest {}).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted, "{e:?}");
    }

    // Item 3: callers who may write nothing are refused before the body.
    let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "reader"},
                        "spec": {"rules": [{"verbs": ["read", "watch"], "kinds": ["*"], "namespaces": ["*"]}]}});
    assert_eq!(apply(&c.http, &api, vec![policy]).await.0, 200);
    let reader = token_create(&api, &["--policy", "reader"])["secret"].as_str().unwrap().to_string();
    let proxy = token_create(&api, &["--proxy", "shop"])["secret"].as_str().unwrap().to_string();
    let addr = c.replica(1).api_addr();
    // A 4 MiB body of which 1 KiB ever arrives: answered 403 at once.
    for (who, token) in [("a reader", &reader), ("an Envoy's proxy token", &proxy)] {
        for path in ["/v1/apply", "/v1/validate", "/v1/delete"] {
            let status = post_with_stalled_body(&addr, path, token, 4 * 1024 * 1024 - 1, &[b'#'; 1024], Duration::from_secs(5)).await;
            assert_eq!(status, Some(403), "{who} {path}: answered before the body (which never comes)");
        }
        // A body that does not even parse: 403, not 400.
        let (status, body) = call(token_client(Some(token)).post(format!("{api}/v1/apply")).header("content-type", "application/yaml").body("{{{ [")).await;
        assert_eq!(status, 403, "{who}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains("before its body was read"), "{body}");
    }
    // A writer's request waits for its body, as it should.
    assert_eq!(post_with_stalled_body(&addr, "/v1/apply", management_token(), 4096, b"kind: A\n", Duration::from_secs(1)).await, None);
    let line = audit_line(&audit, |l| l["outcome"] == "denied" && l["op"] == "POST /v1/apply").await;
    assert!(line["reason"].as_str().unwrap().contains("lacks write on any kind in any namespace"), "{line}");
    // gRPC: refused before tonic decodes the message: a 5 MiB message
    // (over the 4 MiB decoding limit) is PERMISSION_DENIED, not a decoding error.
    let big = ApplyRequest { items: vec![ApplyItem { resource_json: "x".repeat(5 * 1024 * 1024), expected_revision: None }], ..Default::default() };
    for token in [&reader, &proxy] {
        let e = grpc_api_as(&api, Some(token)).apply(big.clone()).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    }
    let e =
        grpc_api_as(&api, Some(&proxy)).get(GetRequest { kind: "vs".into(), namespace: "shop".into(), name: "x".into(), consistency: 0 }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "a proxy token reads nothing either: {e:?}");
    let e = grpc_api_as(&api, Some(management_token())).apply(big).await.unwrap_err();
    assert_ne!(e.code(), tonic::Code::PermissionDenied, "the management token's message is decoded (and is too large): {e:?}");
    let got = grpc_api_as(&api, Some(&reader)).get(GetRequest { kind: "vs".into(), namespace: "shop".into(), name: "x".into(), consistency: 0 }).await;
    assert_eq!(got.unwrap_err().code(), tonic::Code::NotFound, "a reader reads");

    // Item 3: an alias bomb is refused before it expands, naming the line;
    // the replica's memory does not move.
    let pid = c.replica(1).pid().unwrap();
    let before = rss_kib(pid);
    let admin = token_client(Some(management_token()));
    let started = Instant::now();
    for (bomb, anchor) in [(alias_bomb(), "&l0"), (wide_alias_bomb(), "&a")] {
        let (status, body) = call(admin.post(format!("{api}/v1/apply")).header("content-type", "application/yaml").body(bomb)).await;
        assert_eq!(status, 400, "{body}");
        let field = &body["error"]["fields"][0];
        assert_eq!(field["field"], "body[0]", "{body}");
        assert!(field["reason"].as_str().unwrap().starts_with(&format!("line 6: YAML anchor {anchor}")), "{body}");
    }
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    let grown = rss_kib(pid).saturating_sub(before);
    println!("replica RSS: {before} KiB before the alias bomb, +{grown} KiB after");
    assert!(grown < 50 * 1024, "the replica grew by {grown} KiB");
    let (status, _) = call(token_client(Some(&proxy)).post(format!("{api}/v1/apply")).header("content-type", "application/yaml").body(alias_bomb())).await;
    assert_eq!(status, 403, "the proxy token's bomb is not even read");

    // Item 16: the CSR service reads `bearer` as the API does, and signs
    // with a replaced mesh CA without a restart.
    let join = token_create(&api, &["--workload", "shop/cart", "--uses", "200"])["secret"].as_str().unwrap().to_string();
    let old_root = std::fs::read_to_string(mesh_ca.path().join("root-cert.pem")).unwrap();
    let chain = csr(c.replica(1).id, &c.replica(1).xds_addr(), &format!("bearer {join}")).await.expect("a lowercase scheme is accepted");
    assert_eq!(chain.last().unwrap().trim(), old_root.trim());
    let e = csr(1, &c.replica(1).xds_addr(), &format!("Basic {join}")).await.unwrap_err();
    assert!(e.code() == tonic::Code::Unauthenticated && e.message().contains("malformed"), "{e:?}");
    // No credential at all: refused before the request is decoded (a 5 MiB
    // one, over the decoding limit, is UNAUTHENTICATED, not a decoding error).
    let anonymous = IstioCertificateRequest { csr: "x".repeat(5 * 1024 * 1024), validity_duration: 0, metadata: None };
    let e = IstioCertificateServiceClient::new(grpc_channel(1, &c.replica(1).xds_addr())).create_certificate(anonymous).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let new_ca = tempfile::tempdir().unwrap();
    lodestar::ca::create_dir(new_ca.path(), "cluster.local").unwrap();
    for f in ["ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem"] {
        std::fs::copy(new_ca.path().join(f), mesh_ca.path().join(f)).unwrap();
    }
    let new_root = std::fs::read_to_string(new_ca.path().join("root-cert.pem")).unwrap();
    for r in &c.replicas {
        let signs_new = || async { csr(r.id, &r.xds_addr(), &format!("Bearer {join}")).await.unwrap().last().unwrap().trim() == new_root.trim() };
        until(&format!("replica {} signs with the new mesh CA", r.id), Duration::from_secs(10), signs_new).await;
    }

    // Item 6: a Secret as kubectl prints it; its key reaches no store,
    // output, backup or raft log.
    let leaf = kit::tls::Ca::new("shop CA").server(&["shop.example.com"]);
    let (crt, key) = (b64(&leaf.cert_pem), b64(&leaf.key_pem));
    let last_applied = json!({"apiVersion": "v1", "data": {"tls.crt": crt, "tls.key": key}, "kind": "Secret",
        "metadata": {"annotations": {}, "name": "shop-credential", "namespace": "istio-system"}, "type": "kubernetes.io/tls"})
    .to_string();
    let fixture = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kubectl/secret.yaml")).unwrap();
    let file = c.tmp.path().join("secret.yaml");
    std::fs::write(&file, fixture.replace("@CRT@", &crt).replace("@KEY@", &key).replace("@LAST_APPLIED@", &last_applied)).unwrap();
    let (ok, out, err) = cli(&api, &["apply", "-f", file.to_str().unwrap()]);
    assert!(ok && out.contains("secret/shop-credential created"), "{out}{err}");
    let warning = err;
    let (ok, yaml, err) = cli(&api, &["get", "secret", "shop-credential", "-n", "istio-system", "-o", "yaml"]);
    assert!(ok && yaml.contains(&crt), "{yaml}{err}");
    assert!(!yaml.contains("last-applied-configuration") && !yaml.contains("managedFields"), "{yaml}");
    let backup = c.tmp.path().join("b.snapshot");
    let (ok, _, err) = cli(&api, &["snapshot", "save", backup.to_str().unwrap()]);
    assert!(ok, "{err}");
    let mut surfaces: Vec<(String, Vec<u8>)> = vec![("get -o yaml".into(), yaml.into_bytes()), ("backup".into(), std::fs::read(&backup).unwrap())];
    // Stopped, so that everything is on disk: every file of every data dir.
    for id in 1..=3 {
        c.stop(id);
        for f in files_under(&c.replica(id).data_dir()) {
            surfaces.push((f.display().to_string(), std::fs::read(&f).unwrap()));
        }
    }
    let forms: Vec<String> =
        std::iter::once(key.clone()).chain(leaf.key_pem.lines().filter(|l| l.len() >= 40 && !l.starts_with("-----")).map(str::to_string)).collect();
    assert!(surfaces.len() > 5);
    for (what, bytes) in &surfaces {
        let text = String::from_utf8_lossy(bytes);
        for form in &forms {
            assert!(!text.contains(form.as_str()), "{what} holds the Secret's private key");
        }
    }
    assert!(warning.contains("last-applied-configuration: dropped"), "apply says what it dropped: {warning}");
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let kind = e.file_type().unwrap();
            if kind.is_dir() {
                pending.push(e.path());
            } else if kind.is_file() {
                out.push(e.path());
            }
        }
    }
    out
}

/// A certificate request to member `id`'s xDS port with `authorization`
/// as given: the chain, leaf first.
async fn csr(id: u64, xds: &str, authorization: &str) -> Result<Vec<String>, tonic::Status> {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::default().serialize_request(&key).unwrap().pem().unwrap();
    let mut req = tonic::Request::new(IstioCertificateRequest { csr, validity_duration: 0, metadata: None });
    req.metadata_mut().insert("authorization", authorization.parse().unwrap());
    IstioCertificateServiceClient::new(grpc_channel(id, xds)).create_certificate(req).await.map(|r| r.into_inner().cert_chain)
}
