//! Real Envoy processes and a small upstream HTTP server, for end-to-end
//! tests.
//!
//! Envoy comes from `LODESTAR_ENVOY` (set by `tests/run`, which installs it
//! with `tests/support/install-envoy.sh`). A test that needs Envoy and does
//! not find it fails: it is never skipped.
//!
//! Each Envoy gets a bootstrap written by our own `lodestar bootstrap`, its
//! own loopback address (listeners and admin bind there), a distinct base id
//! (`--use-dynamic-base-id`: Envoy picks a free one, so parallel tests never
//! share hot-restart shared memory), and a log file printed when a test
//! panics.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The Envoy binary, from `LODESTAR_ENVOY`. Panics when it is not there.
pub fn envoy_binary() -> PathBuf {
    let hint = "run the tests with tests/run, or: export LODESTAR_ENVOY=\"$(tests/support/install-envoy.sh)\"";
    let path = match std::env::var_os("LODESTAR_ENVOY") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => panic!("LODESTAR_ENVOY is not set: this test needs a real Envoy; {hint}"),
    };
    assert!(path.is_file(), "LODESTAR_ENVOY={} does not exist; {hint}", path.display());
    path
}

pub use super::loopback_prefix;

/// What `lodestar bootstrap` is asked for.
#[derive(Debug, Clone)]
pub struct EnvoyOptions {
    pub name: String,
    pub namespace: String,
    /// The proxy's address; its admin port binds here too.
    pub ip: String,
    pub admin_port: u16,
    /// `sidecar` or `router`.
    pub node_type: String,
    pub labels: Vec<(String, String)>,
    pub delta: bool,
    /// `--xds-servers`; empty: ask `server_api` for the members.
    pub xds_servers: Vec<String>,
    /// `--server`, for the member lookup.
    pub server_api: Option<String>,
    /// `--proxy-token-file`: the proxy's credential on the xDS port. By
    /// default the harness's management token (which may be any proxy);
    /// tests of proxy tokens set their own.
    pub proxy_token_file: Option<PathBuf>,
}

impl EnvoyOptions {
    pub fn new(name: &str, ip: &str) -> EnvoyOptions {
        EnvoyOptions {
            name: name.to_string(),
            namespace: "default".to_string(),
            ip: ip.to_string(),
            admin_port: 15000,
            node_type: "sidecar".to_string(),
            labels: Vec::new(),
            delta: false,
            xds_servers: Vec::new(),
            server_api: None,
            proxy_token_file: Some(super::test_ca().token_file.clone()),
        }
    }

    /// The node id our bootstrap gives this Envoy.
    pub fn node_id(&self) -> String {
        format!("{}~{}~{}.{}~{}.svc.cluster.local", self.node_type, self.ip, self.name, self.namespace, self.namespace)
    }
}

/// Run `lodestar bootstrap` and return its YAML.
pub fn bootstrap_yaml(o: &EnvoyOptions) -> String {
    let mut cmd = super::cli_command();
    cmd.arg("bootstrap")
        .args(["--name", &o.name, "--namespace", &o.namespace, "--ip", &o.ip, "--node-type", &o.node_type])
        .args(["--admin-port", &o.admin_port.to_string()]);
    for (k, v) in &o.labels {
        cmd.arg("--label").arg(format!("{k}={v}"));
    }
    if o.delta {
        cmd.arg("--delta");
    }
    if !o.xds_servers.is_empty() {
        cmd.arg("--xds-servers").arg(o.xds_servers.join(","));
    }
    if let Some(api) = &o.server_api {
        cmd.arg("--server").arg(api);
    }
    match &o.proxy_token_file {
        Some(f) => cmd.arg("--proxy-token-file").arg(f),
        None => cmd.arg("--no-proxy-token"),
    };
    let out = cmd.output().expect("run lodestar bootstrap");
    assert!(out.status.success(), "lodestar bootstrap failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("bootstrap is UTF-8")
}

pub struct Envoy {
    pub options: EnvoyOptions,
    pub dir: PathBuf,
    proc: super::Proc,
    http: reqwest::Client,
}

impl Envoy {
    /// Write the bootstrap into `dir` and start Envoy. Does not wait.
    pub fn start(dir: &Path, options: EnvoyOptions) -> Envoy {
        let bin = envoy_binary();
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("bootstrap.yaml");
        std::fs::write(&config, bootstrap_yaml(&options)).unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg("-c")
            .arg(&config)
            .arg("--use-dynamic-base-id")
            .args(["--log-level", "info", "--component-log-level", "upstream:debug,config:debug"])
            // Quick stops: tests do not need connection draining.
            .args(["--drain-time-s", "1", "--parent-shutdown-time-s", "2"])
            // Access log files written within a poll's step (default 10 s).
            .args(["--file-flush-interval-msec", "100"]);
        let proc = super::Proc::spawn(&format!("envoy {}", options.name), cmd, &dir.join("envoy.log"));
        Envoy { options, dir: dir.to_path_buf(), proc, http: reqwest::Client::new() }
    }

    pub fn admin(&self) -> String {
        format!("http://{}:{}", self.options.ip, self.options.admin_port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("envoy.log")).unwrap_or_default()
    }

    pub fn dump_log(&self) {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        eprintln!("----- envoy {} log (last 80 of {} lines) -----", self.options.name, lines.len());
        for l in &lines[lines.len().saturating_sub(80)..] {
            eprintln!("{l}");
        }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.proc.try_exit() {
            self.dump_log();
            panic!("envoy {} exited: {status}", self.options.name);
        }
    }

    async fn admin_get(&self, path: &str) -> Option<(u16, String)> {
        let r = self.http.get(format!("{}{path}", self.admin())).timeout(Duration::from_secs(5)).send().await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.ok()?))
    }

    /// Poll `check` every 100ms until it returns Some, or panic after `timeout`.
    async fn wait<T, F, Fut>(&mut self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut(reqwest::Client, String) -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + timeout;
        let http = self.http.clone();
        loop {
            self.assert_running();
            if let Some(v) = check(http.clone(), self.admin()).await {
                return v;
            }
            if Instant::now() > deadline {
                self.dump_log();
                panic!("envoy {}: {what} not within {timeout:?}", self.options.name);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Until the admin `/ready` says LIVE (initial CDS and LDS done).
    pub async fn wait_ready(&mut self, timeout: Duration) {
        self.wait("ready", timeout, |http, admin| async move {
            let r = http.get(format!("{admin}/ready")).timeout(Duration::from_secs(2)).send().await.ok()?;
            r.status().is_success().then_some(())
        })
        .await
    }

    /// Until a cluster named `name` exists (active, any health).
    pub async fn wait_for_cluster(&mut self, name: &str, timeout: Duration) {
        let name = name.to_string();
        self.wait(&format!("cluster {name}"), timeout, |http, admin| {
            let name = name.clone();
            async move {
                let v: Value = http.get(format!("{admin}/clusters?format=json")).send().await.ok()?.json().await.ok()?;
                v["cluster_statuses"].as_array()?.iter().any(|c| c["name"] == name.as_str()).then_some(())
            }
        })
        .await
    }

    /// Until a listener named `name` is active.
    pub async fn wait_for_listener(&mut self, name: &str, timeout: Duration) {
        let name = name.to_string();
        self.wait(&format!("listener {name}"), timeout, |http, admin| {
            let name = name.clone();
            async move {
                let v: Value = http.get(format!("{admin}/listeners?format=json")).send().await.ok()?.json().await.ok()?;
                v["listener_statuses"].as_array()?.iter().any(|l| l["name"] == name.as_str()).then_some(())
            }
        })
        .await
    }

    /// Until `pred` holds for the stats.
    pub async fn wait_for_stats(&mut self, what: &str, timeout: Duration, pred: impl Fn(&BTreeMap<String, u64>) -> bool) {
        let pred = &pred;
        self.wait(what, timeout, |http, admin| async move {
            let stats = fetch_stats(&http, &admin).await?;
            pred(&stats).then_some(())
        })
        .await
    }

    /// `/config_dump` with endpoints, as JSON.
    pub async fn config_dump(&self) -> Value {
        let (status, body) = self.admin_get("/config_dump?include_eds").await.expect("config_dump");
        assert_eq!(status, 200, "config_dump: {body}");
        serde_json::from_str(&body).expect("config_dump JSON")
    }

    /// Counters and gauges by name.
    pub async fn stats(&self) -> BTreeMap<String, u64> {
        fetch_stats(&self.http, &self.admin()).await.expect("envoy stats")
    }

    pub async fn stat(&self, name: &str) -> Option<u64> {
        self.stats().await.get(name).copied()
    }

    /// No xDS update was rejected: every `*.update_rejected` counter is 0
    /// and no resource in the config dump carries an `error_state`.
    pub async fn assert_no_rejections(&self) {
        let rejected: Vec<(String, u64)> = self.stats().await.into_iter().filter(|(k, v)| k.ends_with(".update_rejected") && *v > 0).collect();
        let dump = self.config_dump().await;
        let mut errors = Vec::new();
        find_key(&dump, "error_state", &mut errors);
        if !rejected.is_empty() || !errors.is_empty() {
            self.dump_log();
            panic!("envoy {} rejected config: stats {rejected:?}; error states {errors:#?}", self.options.name);
        }
    }

    /// SIGKILL.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// SIGTERM, then SIGKILL after 10s.
    pub fn stop(&mut self) {
        self.proc.stop(Duration::from_secs(10));
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_log();
        }
        self.kill();
    }
}

// Envoy admin readers, by admin URL (`http://IP:PORT`): for any Envoy a
// test runs, whoever started it (the kit, an agent, a test).

async fn fetch_stats(http: &reqwest::Client, admin: &str) -> Option<BTreeMap<String, u64>> {
    let v: Value = http.get(format!("{admin}/stats?format=json")).timeout(Duration::from_secs(5)).send().await.ok()?.json().await.ok()?;
    Some(v["stats"].as_array()?.iter().filter_map(|s| Some((s["name"].as_str()?.to_string(), s["value"].as_u64()?))).collect())
}

/// Counters and gauges by name (`/stats?format=json`).
pub async fn admin_stats(admin: &str) -> Option<BTreeMap<String, u64>> {
    fetch_stats(&reqwest::Client::new(), admin).await
}

/// An admin page as JSON (`/config_dump?...`, `/clusters?format=json`, `/certs`).
pub async fn admin_json(admin: &str, path: &str) -> Option<Value> {
    reqwest::Client::new().get(format!("{admin}{path}")).timeout(Duration::from_secs(5)).send().await.ok()?.json().await.ok()
}

/// The serial of the SPIFFE workload certificate Envoy serves (`/certs`).
pub async fn serving_serial(admin: &str) -> Option<String> {
    let v = admin_json(admin, "/certs").await?;
    v["certificates"]
        .as_array()?
        .iter()
        .flat_map(|c| c["cert_chain"].as_array().cloned().unwrap_or_default())
        .find(|c| c["subject_alt_names"].as_array().is_some_and(|s| s.iter().any(|n| n["uri"].as_str().is_some_and(|u| u.starts_with("spiffe://")))))
        .and_then(|c| c["serial_number"].as_str().map(String::from))
}

fn find_key(v: &Value, key: &str, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            for (k, child) in m {
                if k == key {
                    out.push(child.clone());
                }
                find_key(child, key, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|c| find_key(c, key, out)),
        _ => {}
    }
}

/// One request an upstream saw.
#[derive(Debug, Clone)]
pub struct SeenRequest {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
}

#[derive(Default)]
struct UpstreamState {
    identity: String,
    seen: Mutex<Vec<SeenRequest>>,
    fail_next: AtomicUsize,
    delay_ms: AtomicU64,
}

/// A tiny HTTP upstream: answers with its identity (body `reviews-v2`,
/// header `x-upstream`), or, for a request with `x-echo: 1` or a path
/// ending in `/echo`, with JSON `{"identity", "method", "path", "headers"}`.
/// Records every request (mirror tests look there), and can fail the next
/// N requests (503) or delay answers.
pub struct Upstream {
    pub addr: SocketAddr,
    state: Arc<UpstreamState>,
    task: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Listen on `ip` (any free port).
    pub async fn start(ip: &str, identity: &str) -> Upstream {
        let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await.expect("bind upstream");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(UpstreamState { identity: identity.to_string(), ..Default::default() });
        let app = Router::new().fallback(answer).with_state(state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Upstream { addr, state, task }
    }

    /// Answer the next `n` requests with 503.
    pub fn fail_next(&self, n: usize) {
        self.state.fail_next.store(n, Ordering::SeqCst);
    }

    /// Delay every answer by `d`.
    pub fn set_delay(&self, d: Duration) {
        self.state.delay_ms.store(d.as_millis() as u64, Ordering::SeqCst);
    }

    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().unwrap().clone()
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn answer(State(state): State<Arc<UpstreamState>>, headers: HeaderMap, req: Request<Body>) -> Response {
    let headers: BTreeMap<String, String> = headers.iter().map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect();
    let seen = SeenRequest { method: req.method().to_string(), path: req.uri().path().to_string(), headers };
    state.seen.lock().unwrap().push(seen.clone());
    let delay = state.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(Duration::from_millis(delay)).await;
    }
    let id = state.identity.clone();
    let failing = state.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
    if failing {
        return (StatusCode::SERVICE_UNAVAILABLE, [("x-upstream", id.clone())], format!("{id} failing\n")).into_response();
    }
    if seen.headers.get("x-echo").is_some_and(|v| v == "1") || seen.path.ends_with("/echo") {
        let body = json!({"identity": id, "method": seen.method, "path": seen.path, "headers": seen.headers});
        return ([("x-upstream", id), ("content-type", "application/json".to_string())], body.to_string()).into_response();
    }
    ([("x-upstream", id.clone())], id).into_response()
}

/// The versions Envoy holds: `CDS` and `LDS` (the last response it
/// applied), and per route table and per cluster's endpoints (`RDS:name`,
/// `EDS:name`: the response that last changed each).
pub async fn versions_at(admin: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(r) = reqwest::Client::new().get(format!("{admin}/config_dump?include_eds")).timeout(Duration::from_secs(2)).send().await else { return out };
    let Ok(dump) = r.json::<Value>().await else { return out };
    let num = |v: &Value| v.as_str().and_then(|s| s.parse::<u64>().ok());
    for c in dump["configs"].as_array().into_iter().flatten() {
        let t = c["@type"].as_str().unwrap_or("");
        if t.ends_with("ClustersConfigDump") {
            out.extend(num(&c["version_info"]).map(|v| ("CDS".to_string(), v)));
        } else if t.ends_with("ListenersConfigDump") {
            out.extend(num(&c["version_info"]).map(|v| ("LDS".to_string(), v)));
        } else if t.ends_with("RoutesConfigDump") {
            for r in c["dynamic_route_configs"].as_array().into_iter().flatten() {
                out.extend(num(&r["version_info"]).map(|v| (format!("RDS:{}", r["route_config"]["name"].as_str().unwrap_or("")), v)));
            }
        } else if t.ends_with("EndpointsConfigDump") {
            for e in c["dynamic_endpoint_configs"].as_array().into_iter().flatten() {
                out.extend(num(&e["version_info"]).map(|v| (format!("EDS:{}", e["endpoint_config"]["cluster_name"].as_str().unwrap_or("")), v)));
            }
        }
    }
    out
}
