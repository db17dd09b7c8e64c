//! Test harness: real `lodestar` replicas as child processes on loopback.
//!
//! Each cluster gets its own random 127.A.B.0/24 (all of 127/8 is loopback
//! on Linux), so tests run in parallel without port clashes: replica N
//! listens on 127.A.B.N, API :7000, raft :7001, xDS :7002.

pub mod agent;
pub mod envoy;
pub mod forward;
pub mod mesh;
pub mod process;
pub mod tls;

pub use process::{eventually, eventually_blocking, eventually_or, until, Proc};

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_lodestar");
/// The load generators' binary (`src/bin/lodestar-bench`).
pub const BENCH_BIN: &str = env!("CARGO_BIN_EXE_lodestar-bench");

/// The cluster CA of this test process: every replica a test starts gets
/// its certificate from it (`tls_ca_file`, `tls_ca_key_file`), and every
/// client trusts it. Also a client config holding it, for the CLI.
pub struct TestCa {
    #[allow(dead_code)] // where the files are, for a post-mortem
    pub dir: PathBuf,
    pub ca_file: PathBuf,
    pub ca_key_file: PathBuf,
    pub client_config: PathBuf,
    pub ca_pem: String,
    /// The management token every replica is given
    /// (`initial_management_token_file`): ACLs are on by default, and the
    /// harness's clients, the CLI's client config, lodestar-bench and the
    /// Envoys (as their proxy credential) send it.
    pub token: String,
    pub token_file: PathBuf,
    /// A client config with the CA and no token.
    pub anonymous_client_config: PathBuf,
}

pub fn test_ca() -> &'static TestCa {
    static CA: std::sync::OnceLock<TestCa> = std::sync::OnceLock::new();
    CA.get_or_init(|| {
        let dir = tempfile::Builder::new().prefix("lodestar-test-ca").tempdir().unwrap().keep();
        lodestar::tls::pki::create_ca_dir(&dir, "Lodestar test CA").unwrap();
        let ca_file = dir.join(lodestar::tls::pki::CA_CERT);
        let ca_pem = std::fs::read_to_string(&ca_file).unwrap();
        let token: String = (0..4).map(|_| format!("{:016x}", rand_u64())).collect();
        let token_file = dir.join("management.token");
        lodestar::tls::pki::write_file(&token_file, &format!("{token}\n"), true).unwrap();
        let client_config = dir.join("client.toml");
        let config = lodestar::config::ClientConfig { ca_pem: ca_pem.clone(), token: Some(token.clone()), ..Default::default() };
        std::fs::write(&client_config, config.to_toml()).unwrap();
        let anonymous_client_config = dir.join("anonymous-client.toml");
        std::fs::write(&anonymous_client_config, lodestar::config::ClientConfig { token: None, ..config }.to_toml()).unwrap();
        TestCa { ca_key_file: dir.join(lodestar::tls::pki::CA_KEY), ca_file, client_config, ca_pem, dir, token, token_file, anonymous_client_config }
    })
}

/// The settings that put a replica on the test CA (and keep it from
/// writing a client config into the home directory).
pub fn tls_toml() -> String {
    let ca = test_ca();
    format!("tls_ca_file = {:?}\ntls_ca_key_file = {:?}\nuser_client_config = \"\"\n", ca.ca_file, ca.ca_key_file)
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos());
    h.finish()
}

/// The management token (see [`TestCa`]).
pub fn management_token() -> &'static str {
    &test_ca().token
}

/// An HTTP client that trusts the test CA (and only it) and sends the
/// management token.
pub fn http() -> reqwest::Client {
    http_builder().build().unwrap()
}

/// [`http`]'s builder.
pub fn http_builder() -> reqwest::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {}", management_token()).parse().unwrap());
    anonymous_http_builder().default_headers(headers)
}

/// A client that trusts the test CA and sends `token` (none: no
/// credential), with a 15 s timeout.
pub fn token_client(token: Option<&str>) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {t}").parse().unwrap());
    }
    anonymous_http_builder().default_headers(headers).timeout(Duration::from_secs(15)).build().unwrap()
}

/// Send `req`: (status, the body as JSON, or as a JSON string when it is
/// not JSON).
pub async fn call(req: reqwest::RequestBuilder) -> (u16, Value) {
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

/// The audit log's lines (JSON, one per line): every complete line must
/// parse; a last line still being written is left for the next read.
pub fn audit_lines(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("an audit line that is not JSON: {l}: {e}"))).collect()
}

/// The first audit line matching `pred`, waiting 5 s at most (the log is
/// written off the request path).
pub async fn audit_line(path: &std::path::Path, pred: impl Fn(&Value) -> bool) -> Value {
    let what = format!("an audit line in {}", path.display());
    eventually_or(&what, Duration::from_secs(5), || async {
        audit_lines(path).into_iter().find(|l| pred(l)).ok_or_else(|| std::fs::read_to_string(path).unwrap_or_default())
    })
    .await
}

/// A client that trusts the test CA and sends no credential.
pub fn anonymous_http_builder() -> reqwest::ClientBuilder {
    let mut b = reqwest::Client::builder();
    for cert in reqwest::Certificate::from_pem_bundle(test_ca().ca_pem.as_bytes()).unwrap() {
        b = b.add_root_certificate(cert);
    }
    b
}

/// The `lodestar` CLI, set up to trust the test CA.
pub fn cli_command() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.env("LODESTAR_CONFIG", &test_ca().client_config);
    cmd
}

/// The gRPC client API of the replica whose REST API is `api_url`
/// (`https://127.A.B.N:PORT`: member N), sending the management token.
pub fn grpc_api(api_url: &str) -> lodestar::cli::client::ApiClient {
    grpc_api_as(api_url, Some(management_token()))
}

/// The same, sending `token` on requests that carry no `authorization`.
pub fn grpc_api_as(api_url: &str, token: Option<&str>) -> lodestar::cli::client::ApiClient {
    let addr = api_url.trim_start_matches("https://");
    let id = addr.split(':').next().and_then(|ip| ip.rsplit('.').next()).and_then(|n| n.parse().ok()).expect("a test replica's API URL");
    let bearer = lodestar::cli::client::Bearer::new(token).unwrap();
    lodestar::proto::api::lodestar_client::LodestarClient::with_interceptor(grpc_channel(id, addr), bearer)
}

/// An ADS client of member `id`'s xDS port at `addr`, sending the
/// management token (which may open a stream as any proxy).
pub type AdsClient = envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, lodestar::cli::client::Bearer>,
>;

pub fn ads_client(id: u64, addr: &str) -> AdsClient {
    ads_client_as(id, addr, Some(management_token()))
}

/// One ADS stream of a test: requests go in through `tx`, responses come
/// out of `rx`, each awaited within [`STREAM_BOUND`].
pub struct AdsStream<Req, Resp> {
    pub tx: tokio::sync::mpsc::Sender<Req>,
    pub rx: tonic::Streaming<Resp>,
}

/// How long an [`AdsStream`] waits for a response or its end.
pub const STREAM_BOUND: Duration = Duration::from_secs(20);

impl<Req, Resp> AdsStream<Req, Resp> {
    pub async fn send(&self, r: Req) {
        assert!(self.tx.send(r).await.is_ok(), "the request stream is closed");
    }

    pub async fn recv(&mut self) -> Resp {
        match tokio::time::timeout(STREAM_BOUND, self.rx.message()).await {
            Ok(Ok(Some(r))) => r,
            Ok(other) => panic!("stream ended: {:?}", other.err()),
            Err(_) => panic!("no response within {STREAM_BOUND:?}"),
        }
    }

    /// The status the stream ends with (responses before it are skipped).
    pub async fn end(&mut self) -> tonic::Status {
        loop {
            match tokio::time::timeout(STREAM_BOUND, self.rx.message()).await.expect("the stream ends in time") {
                Ok(Some(_)) => continue,
                Ok(None) => return tonic::Status::ok("ended"),
                Err(s) => return s,
            }
        }
    }
}

/// The same, sending `token` (none: no credential).
pub fn ads_client_as(id: u64, addr: &str, token: Option<&str>) -> AdsClient {
    let bearer = lodestar::cli::client::Bearer::new(token).unwrap();
    envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient::with_interceptor(
        grpc_channel(id, addr),
        bearer,
    )
}

/// A gRPC channel to member `id`'s xDS or API port at `addr`, over TLS
/// checked against the test CA (the certificate must name that member).
pub fn grpc_channel(id: u64, addr: &str) -> tonic::transport::Channel {
    tls_channel(addr, &lodestar::tls::pki::member_name(id), None)
}

/// A channel over TLS trusting the test CA, presenting `identity` (cert,
/// key files) if given, expecting the server to be `server_name`.
pub fn tls_channel(addr: &str, server_name: &str, identity: Option<(&std::path::Path, &std::path::Path)>) -> tonic::transport::Channel {
    let roots = lodestar::tls::roots_from_pem(&test_ca().ca_file).unwrap();
    let config = std::sync::Arc::new(lodestar::tls::client_config(roots, identity).unwrap());
    let source = std::sync::Arc::new(lodestar::tls::ClientTlsSource::Fixed(config));
    let connector = lodestar::tls::PeerConnector::new(Some(source), server_name).unwrap();
    tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_with_connector_lazy(connector)
}

pub struct Replica {
    pub id: u64,
    pub ip: String,
    pub dir: PathBuf,
    pub child: Option<Proc>,
    /// Appended to the replica's config file (takes effect on restart).
    pub extra_toml: String,
    /// Give it the harness's management token file (default true).
    pub management_token: bool,
    join: bool,
    /// The `lodestar` binary it runs (None: this build's); e.g. the
    /// previous release's, for upgrade tests (takes effect on restart).
    pub binary: Option<PathBuf>,
    /// Extra environment for its process (takes effect on restart).
    pub env: Vec<(String, String)>,
}

impl Replica {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn api(&self) -> String {
        format!("https://{}:7000", self.ip)
    }
    pub fn api_addr(&self) -> String {
        format!("{}:7000", self.ip)
    }
    pub fn raft_addr(&self) -> String {
        format!("{}:7001", self.ip)
    }
    pub fn xds_addr(&self) -> String {
        format!("{}:7002", self.ip)
    }
    pub fn member_flag(&self) -> String {
        format!("{}={},{},{}", self.id, self.raft_addr(), self.api_addr(), self.xds_addr())
    }
    /// Where the replica keeps its data (`--data-dir`).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("replica.log")).unwrap_or_default()
    }
}

pub struct Cluster {
    pub tmp: tempfile::TempDir,
    pub replicas: Vec<Replica>,
    pub http: reqwest::Client,
    prefix: String,
    members: Vec<String>,
}

/// A 127.A.B prefix (all of 127/8 is loopback on Linux) that no other
/// running test holds, so that parallel tests never share an address:
/// picked at random and reserved by creating a file named after it, holding
/// this process's id, in the temp dir. A file whose process is gone is
/// taken over. (A random pick alone collided now and then: one test's
/// replica answered at another test's address.)
pub fn loopback_prefix() -> String {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join("lodestar-test-prefixes");
    std::fs::create_dir_all(&dir).unwrap();
    let me = std::process::id();
    loop {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
        let x = (nanos ^ (me as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_add(SEQ.fetch_add(1, Ordering::Relaxed) * 0x1_0001);
        let prefix = format!("127.{}.{}", 1 + (x % 250), (x >> 8) % 250);
        let path = dir.join(&prefix);
        match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(mut f) => {
                write!(f, "{me}").unwrap();
                return prefix;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // Held, unless its owner is gone. A file still being
                // written (no pid yet) counts as held for a minute.
                let owner = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u32>().ok());
                let fresh = std::fs::metadata(&path).and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|age| age < Duration::from_secs(60)));
                let held = match owner {
                    Some(pid) => std::path::Path::new(&format!("/proc/{pid}")).exists(),
                    None => fresh,
                };
                if !held {
                    let _ = std::fs::remove_file(&path);
                }
            }
            Err(e) => panic!("reserving a loopback prefix in {}: {e}", dir.display()),
        }
    }
}

impl Cluster {
    /// Start `n` founding replicas; `extra_toml` is appended to every
    /// replica's config file (e.g. `snapshot_logs = 50`).
    pub async fn start(n: u64, extra_toml: &str) -> Cluster {
        let mut c = Cluster::prepare(n, extra_toml);
        c.launch().await;
        c
    }

    /// The addresses and directories of `n` founding replicas, none started
    /// yet (e.g. to restore a backup into their data dirs first).
    pub fn prepare(n: u64, extra_toml: &str) -> Cluster {
        Cluster::prepare_on(n, extra_toml, &loopback_prefix())
    }

    /// The same on `prefix` (replica N at `PREFIX.N`): an address the test
    /// holds, e.g. the root side of a veth pair, reachable from network
    /// namespaces where loopback is not.
    pub fn prepare_on(n: u64, extra_toml: &str, prefix: &str) -> Cluster {
        // LODESTAR_TEST_KEEP=1 keeps data dirs and replica logs for a post-mortem.
        let tmp = tempfile::Builder::new().prefix("lodestar-test").disable_cleanup(std::env::var_os("LODESTAR_TEST_KEEP").is_some()).tempdir().unwrap();
        let prefix = prefix.to_string();
        let replicas: Vec<Replica> = (1..=n)
            .map(|id| Replica {
                id,
                ip: format!("{prefix}.{id}"),
                dir: tmp.path().join(format!("r{id}")),
                child: None,
                extra_toml: extra_toml.to_string(),
                management_token: true,
                join: false,
                binary: None,
                env: Vec::new(),
            })
            .collect();
        let members: Vec<String> = replicas.iter().map(|r| r.member_flag()).collect();
        Cluster { tmp, replicas, http: http(), prefix, members }
    }

    /// The `--initial-member` flags of the founding replicas.
    pub fn member_flags(&self) -> &[String] {
        &self.members
    }

    /// Start every replica that is not running and wait for a leader.
    pub async fn launch(&mut self) {
        self.spawn_all();
        self.wait_for_leader(Duration::from_secs(20)).await;
    }

    /// Start every replica that is not running; do not wait.
    pub fn spawn_all(&mut self) {
        let members = self.members.clone();
        for r in self.replicas.iter_mut().filter(|r| r.child.is_none()) {
            spawn(r, if r.join { &[] } else { &members });
        }
    }

    pub fn replica(&self, id: u64) -> &Replica {
        self.replicas.iter().find(|r| r.id == id).expect("replica id")
    }
    pub fn replica_mut(&mut self, id: u64) -> &mut Replica {
        self.replicas.iter_mut().find(|r| r.id == id).expect("replica id")
    }

    /// Add a not-yet-member replica process in join mode (not added to the
    /// raft membership: that is `cluster add-node`'s job).
    pub fn spawn_joiner(&mut self, id: u64, extra_toml: &str) -> &Replica {
        self.spawn_joiner_of(id, extra_toml, None)
    }

    /// The same, running `binary` (another release's `lodestar`).
    pub fn spawn_joiner_of(&mut self, id: u64, extra_toml: &str, binary: Option<PathBuf>) -> &Replica {
        let mut r = Replica {
            id,
            ip: format!("{}.{id}", self.prefix),
            dir: self.tmp.path().join(format!("r{id}")),
            child: None,
            extra_toml: extra_toml.to_string(),
            management_token: true,
            join: true,
            binary,
            env: Vec::new(),
        };
        spawn(&mut r, &[]);
        self.replicas.push(r);
        self.replicas.last().unwrap()
    }

    pub fn kill(&mut self, id: u64) {
        let r = self.replica_mut(id);
        if let Some(mut c) = r.child.take() {
            c.kill(); // SIGKILL
        }
    }

    pub fn stop(&mut self, id: u64) {
        let r = self.replica_mut(id);
        if let Some(mut c) = r.child.take() {
            c.stop(Duration::from_secs(10));
        }
    }

    /// SIGSTOP: the process stays, but answers nothing (a hung replica).
    pub fn pause(&mut self, id: u64) {
        self.signal(id, libc::SIGSTOP);
    }

    /// SIGCONT after `pause`.
    pub fn resume(&mut self, id: u64) {
        self.signal(id, libc::SIGCONT);
    }

    fn signal(&mut self, id: u64, sig: i32) {
        self.replica_mut(id).child.as_ref().expect("replica is running").signal(sig);
    }

    pub fn restart(&mut self, id: u64) {
        let members = self.members.clone();
        let r = self.replica_mut(id);
        assert!(r.child.is_none(), "replica {id} is running");
        let members = if r.join { Vec::new() } else { members };
        spawn(r, &members);
    }

    pub async fn status(&self, id: u64) -> Option<Value> {
        let r = self.http.get(format!("{}/v1/cluster", self.replica(id).api())).timeout(Duration::from_secs(3)).send().await.ok()?;
        r.json().await.ok()
    }

    /// The leader id, as seen by any live replica.
    pub async fn leader(&self) -> Option<u64> {
        for r in self.replicas.iter().filter(|r| r.child.is_some()) {
            if let Some(s) = self.status(r.id).await {
                if let Some(l) = s["leader"].as_u64() {
                    // Only trust a leader that is itself alive and says so.
                    if let Some(ls) = self.status(l).await {
                        if ls["leader"].as_u64() == Some(l) {
                            return Some(l);
                        }
                    }
                }
            }
        }
        None
    }

    pub async fn wait_for_leader(&self, timeout: Duration) -> u64 {
        eventually("a leader", timeout, || self.leader()).await
    }

    /// Wait until every running replica has applied `revision` (stale reads).
    pub async fn wait_for_revision(&self, revision: u64, timeout: Duration) {
        eventually_or(&format!("every running replica at revision {revision}"), timeout, || async {
            for r in self.replicas.iter().filter(|r| r.child.is_some()) {
                let rev = self.local_revision(r.id).await;
                if rev.is_none_or(|v| v < revision) {
                    return Err(format!("replica {} at {rev:?}", r.id));
                }
            }
            Ok(())
        })
        .await
    }

    /// A replica's own applied revision (a stale list read).
    pub async fn local_revision(&self, id: u64) -> Option<u64> {
        let url = format!("{}/v1/resources/vs?consistency=stale&namespace=none-such", self.replica(id).api());
        let r = self.http.get(url).timeout(Duration::from_secs(2)).send().await.ok()?;
        r.json::<Value>().await.ok()?["revision"].as_u64()
    }

    pub fn dump_logs(&self) {
        for r in &self.replicas {
            let log = r.log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            eprintln!("----- replica {} log (last 40 lines) -----", r.id);
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for r in &mut self.replicas {
            r.child.take(); // killed on drop
        }
    }
}

fn spawn(r: &mut Replica, members: &[String]) {
    std::fs::create_dir_all(&r.dir).unwrap();
    let config = r.dir.join("lodestar.toml");
    let token = if r.management_token { format!("initial_management_token_file = {:?}\n", test_ca().token_file) } else { String::new() };
    std::fs::write(
        &config,
        format!("heartbeat_ms = 100\nelection_timeout_min_ms = 600\nelection_timeout_max_ms = 1200\n{}{token}{}\n", tls_toml(), r.extra_toml),
    )
    .unwrap();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(r.dir.join("replica.log")).unwrap();
    process::register_log(&format!("replica {}", r.id), &r.dir.join("replica.log"));
    let mut cmd = Command::new(r.binary.as_deref().unwrap_or(std::path::Path::new(BIN)));
    cmd.envs(r.env.iter().map(|(k, v)| (k, v)));
    cmd.arg("server")
        .arg("--config")
        .arg(&config)
        .arg("--id")
        .arg(r.id.to_string())
        .arg("--data-dir")
        .arg(r.data_dir())
        .arg("--api-addr")
        .arg(r.api_addr())
        .arg("--raft-addr")
        .arg(r.raft_addr())
        .arg("--xds-addr")
        .arg(r.xds_addr());
    for m in members {
        cmd.arg("--initial-member").arg(m);
    }
    if r.join {
        cmd.arg("--join");
    }
    cmd.env("RUST_LOG", "info,openraft=warn").stdout(Stdio::null()).stderr(log);
    r.child = Some(Proc::new(&format!("replica {}", r.id), cmd.spawn().expect("spawn lodestar")));
}

/// A VirtualService document with a payload that identifies the write.
pub fn vs(name: &str, namespace: &str, tag: &str) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": name, "namespace": namespace, "labels": {"tag": tag}},
        "spec": {"hosts": [format!("{name}.{namespace}.svc.cluster.local")],
                 "http": [{"route": [{"destination": {"host": name, "subset": tag}}]}]}
    })
}

/// What `POST /v1/apply` takes: a YAML stream (`kubectl`'s form) or JSON
/// documents (`{"resources": [...]}`).
#[derive(Debug)]
pub enum Docs {
    Yaml(String),
    Json(Vec<Value>),
}

impl From<&str> for Docs {
    fn from(yaml: &str) -> Docs {
        Docs::Yaml(yaml.to_string())
    }
}

impl From<&String> for Docs {
    fn from(yaml: &String) -> Docs {
        Docs::Yaml(yaml.clone())
    }
}

impl From<Vec<Value>> for Docs {
    fn from(docs: Vec<Value>) -> Docs {
        Docs::Json(docs)
    }
}

/// `POST /v1/apply` at the replica whose API is `api`: (status, body).
pub async fn apply(http: &reqwest::Client, api: &str, docs: impl Into<Docs>) -> (u16, Value) {
    let request = http.post(format!("{api}/v1/apply")).timeout(Duration::from_secs(15));
    let request = match docs.into() {
        Docs::Yaml(yaml) => request.header("content-type", "application/yaml").body(yaml),
        Docs::Json(resources) => request.json(&json!({ "resources": resources })),
    };
    let r = request.send().await.expect("apply request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// [`apply`] that must succeed: the revision it produced.
pub async fn applied(http: &reqwest::Client, api: &str, docs: impl Into<Docs>) -> u64 {
    let docs = docs.into();
    let shown = format!("{docs:?}");
    let (status, body) = apply(http, api, docs).await;
    assert_eq!(status, 200, "apply: {body:#}\n{shown}");
    body["revision"].as_u64().expect("revision")
}

pub async fn get_json(http: &reqwest::Client, url: &str) -> (u16, Value) {
    let r = http.get(url).timeout(Duration::from_secs(15)).send().await.expect("get request");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Run the `lodestar` CLI against `server`: (success, stdout, stderr).
pub fn cli(server: &str, args: &[&str]) -> (bool, String, String) {
    let out = cli_command().arg("--server").arg(server).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `lodestar token create -o json ARGS...` through the CLI: the created
/// token's JSON (`accessorId`, `secret`, ...).
pub fn token_create(server: &str, args: &[&str]) -> Value {
    let mut all = vec!["token", "create", "-o", "json"];
    all.extend_from_slice(args);
    let (ok, out, err) = cli(server, &all);
    assert!(ok, "token create {args:?}: {err}");
    serde_json::from_str(&out).unwrap()
}

/// Run `lodestar-bench --server SERVER ARGS...` and return its stdout
/// (echoed for the test's log), after checking that it succeeded and
/// printed its command line.
pub async fn bench(server: &str, args: &[&str]) -> String {
    let out =
        tokio::process::Command::new(BENCH_BIN).env("LODESTAR_CONFIG", &test_ca().client_config).arg("--server").arg(server).args(args).output().await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    println!("{stdout}");
    let what = format!("lodestar-bench {}", args.first().copied().unwrap_or_default());
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    let command = format!(" {}", args.join(" "));
    assert!(
        stdout.lines().any(|l| l.starts_with("command: ") && l.contains("lodestar-bench") && l.contains(&command)),
        "{what} prints its command line:\n{stdout}"
    );
    stdout
}

/// The `result:` lines of a bench's output, as key → value maps.
pub fn results(out: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    out.lines()
        .filter_map(|l| l.strip_prefix("result: "))
        .map(|l| l.split_whitespace().map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).expect("key=value")).collect())
        .collect()
}

/// A `result:` value that must be a number.
pub fn number(r: &std::collections::BTreeMap<String, String>, key: &str) -> f64 {
    let v = r.get(key).unwrap_or_else(|| panic!("no {key} in {r:?}"));
    v.parse().unwrap_or_else(|_| panic!("{key}={v} is not a number"))
}

/// A client certificate from the test CA naming `dns` (written into `dir`).
pub fn client_cert(dir: &std::path::Path, dns: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let ca = test_ca();
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&ca.ca_key_file).unwrap()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.ca_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![dns.to_string()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (c, k) = (dir.join(format!("{dns}.pem")), dir.join(format!("{dns}-key.pem")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

/// VmRSS and VmHWM of a process, in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0);
    (field("VmRSS:"), field("VmHWM:"))
}
