//! A newcomer's first ten minutes (issue 33), past what the README run
//! (`tests/e2e/readme.rs`) shows: a cluster started anew, a replica down, a
//! closed pipe, the warnings a user needs, the logs of a healthy start,
//! and the status curl sees over HTTP/2. Real replicas, a real Envoy and
//! real curl; each test on its own loopback addresses.

use crate::kit;

use kit::envoy::envoy_binary;
use kit::{loopback_prefix, test_ca, Cluster, Proc, BIN};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// `lodestar ARGS` as a user on a fresh machine runs it: in `cwd`, with
/// `HOME` as given and none of the test process's `LODESTAR_*` settings.
fn user(home: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(BIN).args(args).current_dir(cwd).env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default()).env("HOME", home).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `lodestar server` as the README starts it (data in ./lodestar-data,
/// the user config in HOME), on `ip`'s ports 7000-7002.
struct Single {
    child: Proc,
    dir: PathBuf,
    ip: String,
}

impl Single {
    fn start(dir: &Path, home: &Path, ip: &str) -> Single {
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("server.log")).unwrap();
        let child = Command::new(BIN)
            .args(["server", "--api-addr", &format!("{ip}:7000"), "--raft-addr", &format!("{ip}:7001"), "--xds-addr", &format!("{ip}:7002")])
            .current_dir(dir)
            .env_clear()
            .env("HOME", home)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        kit::process::register_log("server", &dir.join("server.log"));
        let s = Single { child: Proc::new("server", child), dir: dir.to_path_buf(), ip: ip.to_string() };
        s.wait_ready();
        s
    }

    fn wait_ready(&self) {
        let ca = self.dir.join("lodestar-data/tls/ca.pem");
        let what = format!("the server in {} ready", self.dir.display());
        kit::eventually_blocking(&what, Duration::from_secs(20), || {
            let ready = ca.exists()
                && Command::new("curl")
                    .args(["-fsS", "--max-time", "2", "--cacert"])
                    .arg(&ca)
                    .arg(format!("https://{}:7000/readyz", self.ip))
                    .output()
                    .is_ok_and(|o| o.status.success());
            ready.then_some(())
        });
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    fn stop(mut self) {
        self.child.stop(Duration::from_secs(10));
    }
}

/// Item 3: a user who starts a cluster anew (another data dir, or the same
/// one removed) is never left with a CLI that fails on the old CA; the CLI
/// prefers the config of the directory it runs in; a config a person wrote
/// is left alone, and the error then names it and what to do.
#[test]
fn a_cluster_started_anew_never_strands_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let (home, here, elsewhere) = (tmp.path().join("home"), tmp.path().join("here"), tmp.path().join("elsewhere"));
    for d in [&home, &here, &elsewhere] {
        std::fs::create_dir_all(d).unwrap();
    }
    let ip = format!("{}.1", loopback_prefix());
    let user_config = home.join(".config/lodestar/client.toml");
    let status = |cwd: &Path| user(&home, cwd, &["cluster", "status"]);

    let s = Single::start(&here, &home, &ip);
    let out = status(&elsewhere);
    assert!(out.status.success(), "the user config works from anywhere: {}", text(&out.stderr));
    s.stop();

    // The same directory, started anew: a new CA.
    std::fs::remove_dir_all(here.join("lodestar-data")).unwrap();
    let s = Single::start(&here, &home, &ip);
    let out = status(&elsewhere);
    assert!(out.status.success(), "the server replaced the user config its earlier first start wrote: {}", text(&out.stderr));
    assert!(s.log().contains("replaced the client config an earlier cluster's first start wrote"), "{}", s.log());
    s.stop();

    // A user config a person wrote (no marker line) is left alone.
    let mine = std::fs::read_to_string(&user_config).unwrap();
    std::fs::write(&user_config, mine.lines().skip(1).collect::<Vec<_>>().join("\n")).unwrap();
    std::fs::remove_dir_all(here.join("lodestar-data")).unwrap();
    let s = Single::start(&here, &home, &ip);
    assert!(s.log().contains("left this client config alone"), "{}", s.log());
    let out = status(&here);
    assert!(out.status.success(), "in the server's directory, ./lodestar-data/client.toml comes first: {}", text(&out.stderr));
    let out = status(&elsewhere);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "the person's config trusts the old CA");
    for needle in [user_config.to_str().unwrap(), "not signed by the CA", "--client-config", "--ca-file", &format!("https://{ip}:7000")] {
        assert!(err.contains(needle), "the error names {needle:?}:\n{err}");
    }

    // No config at all: https (a bare address too), checked against the
    // system's roots only, and the error says where it looked.
    let nowhere = tmp.path().join("nowhere");
    std::fs::create_dir_all(nowhere.join("home")).unwrap();
    let out = user(&nowhere.join("home"), &nowhere, &["--server", &format!("{ip}:7000"), "cluster", "status"]);
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("https://{ip}:7000")) && err.contains("no client config at") && err.contains("--ca-file"), "{err}");
    assert!(!err.contains("invalid HTTP version"), "plaintext to a TLS port: {err}");
    // A token the server does not know: the error says where it came from.
    let out = user(&home, &here, &["--token", "not-a-token", "get", "vs"]);
    let err = text(&out.stderr);
    assert!(!out.status.success() && err.contains("Unauthenticated") && err.contains("--token or LODESTAR_TOKEN"), "{err}");
    s.stop();
}

/// Item 3: a client config may list several replicas; the CLI goes on to
/// the next while one cannot be reached, reads and writes alike.
#[tokio::test]
async fn the_cli_fails_over_to_the_next_server() {
    let c = Cluster::start(1, "").await;
    let r = c.replica(1);
    let down = format!("https://{}.9:7000", r.ip.rsplit_once('.').unwrap().0);
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("client.toml");
    let toml = format!("servers = [{down:?}, {:?}]\nca_file = {:?}\ntoken_file = {:?}\n", r.api(), test_ca().ca_file, test_ca().token_file);
    std::fs::write(&config, toml).unwrap();
    let vs = tmp.path().join("vs.json");
    std::fs::write(&vs, kit::vs("failover", "default", "x").to_string()).unwrap();
    for args in [&["apply", "-f", vs.to_str().unwrap()][..], &["get", "vs", "failover"]] {
        let out = Command::new(BIN).arg("--client-config").arg(&config).args(args).env_remove("LODESTAR_SERVER").env_remove("LODESTAR_TOKEN").output().unwrap();
        assert!(out.status.success(), "{args:?} through the second server: {}", text(&out.stderr));
    }
    // Only the first down: the error names each server tried.
    std::fs::write(&config, format!("servers = [{down:?}]\nca_file = {:?}\n", test_ca().ca_file)).unwrap();
    let out = Command::new(BIN).arg("--client-config").arg(&config).args(["get", "vs"]).output().unwrap();
    assert!(!out.status.success() && text(&out.stderr).contains(&down), "{}", text(&out.stderr));
}

/// Items 5, 7, 9 and 4: a closed pipe ends the CLI quietly; repeated
/// renewals say they run; `delete -f` deletes every object it finds and
/// names the others; a registry service for a ServiceEntry's host warns.
#[tokio::test]
async fn pipes_renewals_deletes_and_warnings() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let tmp = tempfile::tempdir().unwrap();

    // 400 VirtualServices: their YAML is far more than a pipe holds.
    let docs: Vec<String> = (0..400).map(|i| kit::vs(&format!("pipe-{i}"), "default", "x").to_string()).collect();
    let many = tmp.path().join("many.yaml");
    std::fs::write(&many, format!("---\n{}", docs.join("\n---\n"))).unwrap();
    let (ok, _, err) = kit::cli(&api, &["apply", "-f", many.to_str().unwrap()]);
    assert!(ok, "{err}");
    let script = format!("{BIN} --server {api} get vs -o yaml | head -1 >/dev/null; echo \"status=${{PIPESTATUS[0]}}\"");
    let out = Command::new("bash").args(["-c", &script]).env("LODESTAR_CONFIG", &test_ca().client_config).output().unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(stderr.is_empty(), "nothing on stderr when the reader goes away: {stderr}");
    assert!(stdout.contains("status=141") || stdout.contains("status=0"), "SIGPIPE's exit, as Unix tools (not a panic's 101): {stdout}");

    // heartbeat --every: says what it does and how it went.
    let (ok, _, err) = kit::cli(&api, &["register", "ttl-svc", "--address", "127.0.0.1", "--port", "http=9080", "--ttl", "10s"]);
    assert!(ok, "{err}");
    let (ok, _, err) = kit::cli(&api, &["heartbeat", "ttl-svc-127-0-0-1-9080", "--every", "100ms", "--count", "3"]);
    assert!(ok && err.contains("renewing instances/ttl-svc-127-0-0-1-9080 every 100ms") && err.contains("renewed 3 of 3 times"), "{err}");

    // delete -f: the found ones go, the missing one is named, exit 1.
    let three = tmp.path().join("three.yaml");
    std::fs::write(&three, format!("---\n{}", ["pipe-1", "pipe-2", "never-applied"].map(|n| kit::vs(n, "default", "x").to_string()).join("\n---\n"))).unwrap();
    let (ok, out, err) = kit::cli(&api, &["delete", "-f", three.to_str().unwrap()]);
    assert!(!ok && out.contains("virtualservice/pipe-1 deleted") && out.contains("virtualservice/pipe-2 deleted"), "{out}{err}");
    assert!(err.contains("(NotFound): virtualservice default/never-applied not found"), "{err}");
    let (ok, _, _) = kit::cli(&api, &["get", "vs", "pipe-2"]);
    assert!(!ok, "pipe-2 was deleted although never-applied was missing");
    let (ok, _, err) = kit::cli(&api, &["delete", "-f", three.to_str().unwrap(), "--ignore-not-found"]);
    assert!(ok, "{err}");

    // A registry Service for a ServiceEntry's host: apply says what wins.
    let se = tmp.path().join("se.yaml");
    std::fs::write(&se, "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: reviews}\nspec:\n  hosts: [reviews.default.svc.cluster.local]\n  location: MESH_INTERNAL\n  resolution: STATIC\n  ports: [{number: 9080, name: http, protocol: HTTP}]\n  endpoints: [{address: 127.0.0.1}]\n").unwrap();
    let svc = tmp.path().join("svc.yaml");
    std::fs::write(&svc, "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {name: reviews}\nspec:\n  ports: [{name: http, number: 9080}]\n")
        .unwrap();
    let (ok, _, err) = kit::cli(&api, &["apply", "-f", se.to_str().unwrap()]);
    assert!(ok && !err.contains("Warning"), "{err}");
    let (ok, _, err) = kit::cli(&api, &["apply", "-f", svc.to_str().unwrap()]);
    assert!(
        ok && err.contains("Warning: services/default/reviews: reviews.default.svc.cluster.local is also the host of ServiceEntry default/reviews"),
        "{err}"
    );
    let (ok, _, err) = kit::cli(&api, &["apply", "-f", se.to_str().unwrap()]);
    assert!(ok && err.contains("is also a registry service's (Service default/reviews)"), "the other way round too: {err}");
}

/// Item 1: `lodestar bootstrap` with the management token makes the proxy
/// its token, in a file its Envoy reads (issue 32 item 5: never in the
/// bootstrap), and its Envoy gets its config; without a credential that may
/// make tokens it warns, its Envoy is refused, and `proxy-status` and
/// `wait --proxy` say why.
#[tokio::test]
async fn bootstrap_makes_the_proxy_token_or_says_why_not() {
    let c = Cluster::start(1, "").await;
    let r = c.replica(1);
    let api = r.api();
    let tmp = tempfile::tempdir().unwrap();
    let ip = |n: u8| format!("{}.{n}", r.ip.rsplit_once('.').unwrap().0);

    // Run where a user keeps the bootstrap: the token goes to a file there.
    let out = kit::cli_command()
        .current_dir(tmp.path())
        .args(["--server", &api, "bootstrap", "--name", "web", "--namespace", "shop", "--ip", &ip(20)])
        .output()
        .unwrap();
    let (ok, yaml, err) = (out.status.success(), text(&out.stdout), text(&out.stderr));
    assert!(ok && err.contains("Made a proxy token for shop/web"), "{err}");
    let file = tmp.path().join("web.shop.proxy-token");
    let secret = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}; {err}", file.display()));
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600, "Envoy's only");
    }
    let file = std::fs::canonicalize(&file).unwrap();
    assert!(err.contains(&file.display().to_string()), "says where: {err}");
    // Envoy reads the file: the bootstrap names it and holds no secret.
    assert!(yaml.contains("authorization") && yaml.contains(&file.display().to_string()), "{yaml}");
    assert!(!secret.is_empty() && !yaml.contains(&secret) && !yaml.contains(kit::management_token()), "a token of its own, read from its file: {yaml}");
    let good = start_envoy(tmp.path(), "good", &yaml);
    // A gateway's bootstrap makes a gateway's token (served its namespace's
    // Secrets), written where --proxy-token-out says.
    let out_file = tmp.path().join("ingress.token");
    let (ok, yaml, err) = kit::cli(
        &api,
        &["bootstrap", "--node-type", "router", "--name", "ingress", "--namespace", "shop", "--ip", &ip(22), "--proxy-token-out", out_file.to_str().unwrap()],
    );
    assert!(ok && err.contains("Made a proxy token for shop/ingress (a gateway's"), "{err}");
    assert!(yaml.contains(out_file.to_str().unwrap()) && !yaml.contains(std::fs::read_to_string(&out_file).unwrap().as_str()), "{yaml}");
    let (ok, tokens, err) = kit::cli(&api, &["token", "list"]);
    assert!(ok && tokens.contains("shop/ingress (gateway)") && tokens.contains("shop/web") && !tokens.contains("shop/web (gateway)"), "{tokens}{err}");
    let (ok, out, err) = kit::cli(&api, &["wait", "--proxy", "web.shop", "--timeout", "20s"]);
    assert!(ok && out.contains("proxies in sync"), "{out}{err}\n{}", envoy_log(tmp.path(), "good"));

    // A reader's token may not make tokens: a warning, and no credential.
    let (ok, _, err) = kit::cli(&api, &["policy", "create", "read-all", "--rule", "read:*:*"]);
    assert!(ok, "{err}");
    let reader = kit::token_create(&api, &["--policy", "read-all"]);
    let out = kit::cli_command()
        .args(["--server", &api, "bootstrap", "--name", "db", "--namespace", "shop", "--ip", &ip(21)])
        .env("LODESTAR_TOKEN", reader["secret"].as_str().unwrap())
        .output()
        .unwrap();
    let (yaml, err) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Warning: this bootstrap has no proxy credential") && err.contains("lodestar token create --proxy shop/db"), "{err}");
    assert!(!yaml.contains("authorization"), "{yaml}");
    let refused = start_envoy(tmp.path(), "refused", &yaml);
    kit::eventually_blocking("proxy-status lists the refused stream", Duration::from_secs(20), || {
        let (ok, out, err) = kit::cli(&api, &["proxy-status"]);
        assert!(ok, "{err}");
        let refused = out.contains("REFUSED") && out.contains("unauthenticated");
        if refused {
            assert!(out.contains("web.shop"), "the connected one is listed too: {out}");
        }
        refused.then_some(())
    });
    let (ok, out, err) = kit::cli(&api, &["wait", "--proxy", "db.shop", "--timeout", "2s"]);
    assert!(!ok && err.contains("did not connect") && err.contains("refused") && err.contains("unauthenticated"), "{out}{err}");
    drop((good, refused));
}

fn start_envoy(dir: &Path, name: &str, bootstrap: &str) -> Proc {
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(&config, bootstrap).unwrap();
    let mut cmd = Command::new(envoy_binary());
    cmd.arg("-c").arg(&config).arg("--use-dynamic-base-id");
    Proc::spawn(&format!("envoy {name}"), cmd, &dir.join(format!("{name}.log")))
}

fn envoy_log(dir: &Path, name: &str) -> String {
    let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    log.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// Item 13: a POST with a body and no token, as curl sends it over HTTP/2
/// (`-d @file`), gets its 401, not a stream reset (curl's exit 92): the
/// server reads (and drops) the unread body before it answers. So does a token
/// that may write nothing, refused from the headers before the body is
/// read (`Caller::precheck`): 403.
#[tokio::test]
async fn curl_over_http2_sees_the_401() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let reader = serde_json::json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "reader"},
                                    "spec": {"rules": [{"verbs": ["read"], "kinds": ["*"], "namespaces": ["*"]}]}});
    assert_eq!(kit::apply(&c.http, &api, vec![reader]).await.0, 200);
    let reader = kit::token_create(&api, &["--policy", "reader"])["secret"].as_str().unwrap().to_string();
    let tmp = tempfile::tempdir().unwrap();
    let body = tmp.path().join("big.json");
    std::fs::write(&body, format!("{{\"resources\": [\"{}\"]}}", "a".repeat(1 << 20))).unwrap();
    let size = std::fs::metadata(&body).unwrap().len();
    // The whole body goes out before the answer comes back (size_upload):
    // answered first, curl ends its upload short of the content-length and
    // h2 resets the stream with PROTOCOL_ERROR, which curl sometimes sees
    // (exit 92) before it has closed the stream.
    for (token, want) in [(None, format!("401 2 {size}")), (Some(&reader), format!("403 2 {size}"))] {
        for i in 0..10 {
            let mut curl = Command::new("curl");
            curl.args(["-sS", "--http2", "-o", "/dev/null", "-w", "%{http_code} %{http_version} %{size_upload}", "--cacert"]).arg(&test_ca().ca_file);
            if let Some(t) = token {
                curl.arg("-H").arg(format!("Authorization: Bearer {t}"));
            }
            let out = curl.arg("-d").arg(format!("@{}", body.display())).arg(format!("{api}/v1/apply")).output().unwrap();
            assert_eq!((out.status.code(), text(&out.stdout)), (Some(0), want.clone()), "attempt {i}: {}", text(&out.stderr));
        }
    }
}

/// Items 6 and 10: three replicas' first start, logging to files as
/// `cluster/local` and systemd do: no ERROR, no WARN (but the open-file
/// limit's, where it is true), no colour escapes, no Rust Debug forms in
/// INFO lines.
#[tokio::test]
async fn a_healthy_first_start_logs_plainly() {
    // As cluster/local sets them up: one mesh CA for the three.
    let mesh = tempfile::tempdir().unwrap();
    let out = Command::new(BIN).args(["tls", "ca", "create", "--mesh", "--dir"]).arg(mesh.path().join("ca")).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut c = Cluster::start(3, &format!("mesh_ca_dir = {:?}", mesh.path().join("ca"))).await;
    let (status, _) = kit::apply(&c.http, &c.replica(1).api(), vec![kit::vs("first", "default", "x")]).await;
    assert_eq!(status, 200);
    // Past an election timeout, so late vote answers have come in.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let logs: Vec<(u64, String)> = c.replicas.iter().map(|r| (r.id, r.log())).collect();
    for id in [1, 2, 3] {
        c.stop(id);
    }
    let debug_forms = ["Some(", "None,", "LogId {", "ExitStatus(", "[1, 2, 3]", "\")"];
    // The one WARN a healthy start may give: a machine whose open-file
    // hard limit (inherited from this test) is below what the default
    // connection caps want (as in a sandbox with 20,000; systemd's is
    // 524,288). It is true there, and says what to do.
    let low_fd_limit = {
        let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit writes only the struct given.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
        let d = lodestar::config::ServerConfig::default();
        ((d.api_max_connections + d.xds_max_connections + d.raft_max_connections) as u64 + 256) > limit.rlim_max
    };
    for (id, log) in logs {
        assert!(log.contains("replica started"), "replica {id}:\n{log}");
        assert!(!log.contains('\u{1b}'), "replica {id}: colour escapes in a file:\n{log}");
        for line in log.lines() {
            if low_fd_limit && line.contains(" WARN lodestar::server: the open-file limit is below the ports' connection limits") {
                continue;
            }
            assert!(!line.contains(" ERROR ") && !line.contains(" WARN "), "replica {id}: {line}");
            if line.contains(" INFO ") {
                assert!(!debug_forms.iter().any(|f| line.contains(f)), "replica {id}, Debug formatting: {line}");
            }
        }
    }
}

/// Item 6: `--log-format json` gives one JSON object per line; under
/// systemd the audit log has its own file, not the journal's stream.
#[test]
fn json_logs_and_the_audit_log_apart_under_systemd() {
    let tmp = tempfile::tempdir().unwrap();
    let ip = format!("{}.1", loopback_prefix());
    let logs = tmp.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let stderr = tmp.path().join("stderr");
    let child = Command::new(BIN)
        .args(["server", "--log-format", "json", "--data-dir"])
        .arg(tmp.path().join("data"))
        .args(["--api-addr", &format!("{ip}:7000"), "--raft-addr", &format!("{ip}:7001"), "--xds-addr", &format!("{ip}:7002")])
        .env("HOME", tmp.path())
        .env("INVOCATION_ID", "0123456789abcdef")
        .env("LOGS_DIRECTORY", &logs)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap();
    // Killed on drop, should an assertion fail first.
    let mut child = Proc::new("server", child);
    // An unauthenticated request: one audit line.
    kit::process::register_log("server", &stderr);
    let audit = logs.join("audit.jsonl");
    kit::eventually_blocking(&format!("an audit line in {}", audit.display()), Duration::from_secs(20), || {
        let _ = Command::new("curl").args(["-s", "-k", "--max-time", "2"]).arg(format!("https://{ip}:7000/v1/cluster")).output();
        std::fs::read_to_string(&audit).is_ok_and(|a| a.contains("unauthenticated")).then_some(())
    });
    child.signal(libc::SIGTERM);
    child.wait_exit(Duration::from_secs(30));
    let text = std::fs::read_to_string(&stderr).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert!(lines.iter().any(|l| l["message"] == "replica started" && l["level"] == "INFO" && l["api"] == format!("{ip}:7000")), "{text}");
    assert!(lines.iter().any(|l| l["message"].as_str().is_some_and(|m| m.starts_with("audit log")) && l["to"] == audit.to_str().unwrap()), "{text}");
    assert!(!lines.iter().any(|l| l.get("outcome").is_some()), "audit lines on stderr: {text}");
}

/// Item 6: colour on a terminal only, and never with NO_COLOR (a real
/// pseudo-terminal from `script`).
#[test]
fn colour_on_a_terminal_unless_no_color() {
    let tmp = tempfile::tempdir().unwrap();
    let ip = format!("{}.1", loopback_prefix());
    let run = |no_color: bool, n: u32| {
        let server = format!(
            "timeout -s TERM 2 {BIN} server --data-dir {} --api-addr {ip}:7000 --raft-addr {ip}:7001 --xds-addr {ip}:7002",
            tmp.path().join(format!("data{n}")).display()
        );
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &server, "/dev/null"]).env("HOME", tmp.path());
        if no_color {
            cmd.env("NO_COLOR", "1");
        } else {
            cmd.env_remove("NO_COLOR");
        }
        let out = cmd.output().expect("script (util-linux) runs a command on a pseudo-terminal");
        text(&out.stdout)
    };
    let coloured = run(false, 1);
    assert!(coloured.contains("replica started") && coloured.contains("\u{1b}["), "a terminal gets colour:\n{coloured}");
    let plain = run(true, 2);
    assert!(plain.contains("replica started") && !plain.contains("\u{1b}["), "NO_COLOR:\n{plain}");
}
