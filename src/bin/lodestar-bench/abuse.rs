//! `abuse`: the attacks of issue 32 that exhaust a replica or walk through
//! an open door, replayed against a running replica, so that a change that
//! reopens one shows. Each scenario is one attack; it ends with a `result:`
//! line saying whether the door held (`held=true|false`) and, given
//! `--pid`, the replica's memory before and after (VmRSS: resident now;
//! VmHWM: the peak so far; KiB).
//!
//! | scenario | the attack | held when |
//! |---|---|---|
//! | `bootstrap` | `POST /v1/acl/bootstrap` and gRPC `AclBootstrap` without credentials (where the door is open, this uses up the cluster's one bootstrap; the token it mints is revoked) | both refused |
//! | `yaml-aliases` | a YAML alias bomb (~5 KB expanding to `--bytes`, 128 MiB) applied with a proxy token | refused, and the replica's peak memory grew less than `--max-growth-kib` |
//! | `reader-apply` | a 4 MiB apply from a read-only token, sent slowly | refused (401/403) before the body was all sent |
//! | `metric-labels` | `--count` (20,000) requests without credentials on distinct bogus paths, gRPC methods and HTTP methods | `/metrics` grew less than 64 KiB |
//! | `idle-flood` | `--count` (1,100) idle TLS connections from `--source`, then one request from `--other-source` | the other client is served and the flood was cut off at a limit |
//! | `silent-connections` | a TCP connection that never starts TLS, and a TLS connection that never sends a request | both closed by the replica within `--close-within-s` |
//! | `slowloris` | an HTTP/1.1 request whose headers come one line a second | closed by the replica within `--close-within-s` |
//! | `xds-stream-flood` | `--count` (5,000) xDS streams with one proxy token, then one with another namespace's | the other is served and the first credential was held to a quota |
//! | `nack-texts` | `--count` (100) streams each NACKing with a `--bytes` (3 MB) error text, 8 at a time (within `xds_max_buffered_request_bytes`); memory read once the replica counted every NACK | memory grew less than `--max-growth-kib` |
//! | `node-metadata` | `--count` (100) streams each with `--bytes` (3 MB) of node metadata, in labels of `--label-bytes` (1 KiB) | refused, or memory grew less than `--max-growth-kib` |
//! | `delta-subscriptions` | `--count` (50) delta streams each subscribing `--bytes` (6 MB) of resource names of 100 bytes, 10,000 a request, each answered before the next | memory grew less than `--max-growth-kib` |
//!
//! The xDS scenarios hold their streams open while the replica's memory is
//! read: once it is under `--max-growth-kib`, or after `--settle-s` (30 s;
//! the replica's allocator gives freed buffers back after a while, so the
//! megabyte requests' decoding shows for some seconds: `peak_growth_kib`). With `--count` and `--bytes` they also measure what a client may
//! hold within the limits (`benches/abuse.sh`: `nack-texts-1000`,
//! `node-metadata-at-caps`, `delta-subscriptions-in-budget`).
//!
//! The replica is the one of the first `--server` (its xDS address from
//! `/v1/cluster` unless `--xds`). The scenarios that need a low-privilege
//! credential create it with the client config's (management) token: proxy
//! tokens of namespaces `abuse-a` and `abuse-b`, and a token of a read-only
//! policy `abuse-reader`, all with a one-hour TTL, revoked (and the policy
//! deleted) at the end.
//!
//! Every loop is bounded: by `--count`, and each wait by a timeout.

use anyhow::{anyhow, bail, Context as _, Result};
use clap::{Args, ValueEnum};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use futures::StreamExt;
use lodestar::cli::client::{Bearer, Client};
use lodestar::xds::resources::ResourceType;
use serde_json::{json, Value};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    Bootstrap,
    YamlAliases,
    ReaderApply,
    MetricLabels,
    IdleFlood,
    SilentConnections,
    Slowloris,
    XdsStreamFlood,
    NackTexts,
    NodeMetadata,
    DeltaSubscriptions,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum PortArg {
    Api,
    Xds,
}

#[derive(Args, Clone)]
pub struct AbuseArgs {
    /// The API URLs (the global --server); the first is attacked.
    #[arg(skip)]
    pub servers: Vec<String>,
    /// The attack (see `lodestar-bench abuse --help` and benches/abuse.sh).
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// The replica's xDS address, HOST:PORT (default: from /v1/cluster).
    #[arg(long)]
    xds: Option<String>,
    /// The replica's process id: its memory before and after. The memory
    /// scenarios (yaml-aliases, nack-texts, node-metadata,
    /// delta-subscriptions) need it.
    #[arg(long)]
    pid: Option<u32>,
    /// Requests, connections or streams (default: per scenario).
    #[arg(long)]
    count: Option<usize>,
    /// Bytes per attack item (default: per scenario).
    #[arg(long)]
    bytes: Option<usize>,
    /// node-metadata: the bytes of one label, name and value (default
    /// 1,024): `--bytes` / `--label-bytes` labels.
    #[arg(long)]
    label_bytes: Option<usize>,
    /// The address the attack comes from (idle-flood): a local address to
    /// bind, e.g. 127.0.0.50 (all of 127/8 is loopback on Linux).
    #[arg(long)]
    source: Option<IpAddr>,
    /// Another client's address (idle-flood), which must still be served.
    #[arg(long)]
    other_source: Option<IpAddr>,
    /// The port of idle-flood and silent-connections.
    #[arg(long, value_enum, default_value = "api")]
    port: PortArg,
    /// How long the replica may take to close what it should close
    /// (silent-connections, slowloris), seconds; the defaults of
    /// conn_idle_timeout_ms (120 s) and http_header_read_timeout_ms (10 s)
    /// need 135.
    #[arg(long, default_value_t = 135)]
    close_within_s: u64,
    /// Memory growth (KiB) at or above which a memory scenario did not hold.
    #[arg(long, default_value_t = 64 * 1024)]
    max_growth_kib: u64,
    /// The xDS memory scenarios: how long (seconds) the replica may take to
    /// give back what it freed (its allocator keeps freed buffers a while)
    /// before its memory is held against `--max-growth-kib`; the streams
    /// stay open meanwhile.
    #[arg(long, default_value_t = 30)]
    settle_s: u64,
}

/// How one scenario went.
struct Outcome {
    held: bool,
    facts: Vec<(&'static str, String)>,
}

impl Outcome {
    fn new(held: bool) -> Outcome {
        Outcome { held, facts: Vec::new() }
    }
    fn fact(mut self, key: &'static str, value: impl ToString) -> Outcome {
        self.facts.push((key, value.to_string()));
        self
    }
}

/// Resident and peak memory of a process, KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse().ok()).unwrap_or(0);
    (field("VmRSS:"), field("VmHWM:"))
}

pub async fn run(args: AbuseArgs) -> Result<()> {
    println!("command: {}", super::command_line());
    let server = args.servers.first().cloned().unwrap_or_else(|| lodestar::config::DEFAULT_SERVER_URL.to_string());
    let a = Attack::new(&args, &server).await?;
    println!("# lodestar-bench abuse: scenario {:?} against {}", args.scenario, a.api);
    raise_open_file_limit();
    let before = args.pid.map(memory_kib);
    let outcome = match args.scenario {
        Scenario::Bootstrap => a.bootstrap().await,
        Scenario::YamlAliases => a.yaml_aliases().await,
        Scenario::ReaderApply => a.reader_apply().await,
        Scenario::MetricLabels => a.metric_labels().await,
        Scenario::IdleFlood => a.idle_flood().await,
        Scenario::SilentConnections => a.silent_connections().await,
        Scenario::Slowloris => a.slowloris().await,
        Scenario::XdsStreamFlood => a.xds_stream_flood().await,
        Scenario::NackTexts => a.hold_streams(Hold::Nack).await,
        Scenario::NodeMetadata => a.hold_streams(Hold::Metadata).await,
        Scenario::DeltaSubscriptions => a.hold_streams(Hold::Subscriptions).await,
    };
    a.revoke_tokens().await;
    let mut outcome = outcome?;
    let mut line = format!(
        "result: held={} scenario={}",
        outcome.held,
        Scenario::to_possible_value(&args.scenario).map_or_else(String::new, |v| v.get_name().to_string())
    );
    if let (Some(pid), Some((rss0, hwm0))) = (args.pid, before) {
        let (rss1, hwm1) = a.memory_after.lock().unwrap().take().unwrap_or_else(|| memory_kib(pid));
        outcome = outcome.fact("rss_before_kib", rss0).fact("rss_after_kib", rss1).fact("hwm_before_kib", hwm0).fact("hwm_after_kib", hwm1);
    }
    for (k, v) in &outcome.facts {
        line.push_str(&format!(" {k}={v}"));
    }
    println!("{line}");
    Ok(())
}

/// The bench, like a replica, needs a descriptor per connection.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit read or write only the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// What the attacks reach the replica with.
struct Attack {
    args: AbuseArgs,
    /// The API, `https://HOST:PORT`.
    api: String,
    /// HOST:PORT of the API.
    api_addr: String,
    /// The admin's client (the client config's token).
    admin: Client,
    ca_pem: String,
    /// What the attack created (tokens, then a policy): API paths
    /// deleted at the end, in order.
    created: std::sync::Mutex<Vec<String>>,
    /// The replica's memory while the attack still holds what it opened
    /// (streams), when the scenario measures it itself.
    memory_after: std::sync::Mutex<Option<(u64, u64)>>,
}

/// Tokens made for an attack expire on their own if the bench dies.
const TOKEN_TTL: &str = "1h";
/// How long one step of an attack may wait for the replica.
const STEP: Duration = Duration::from_secs(20);

impl Attack {
    async fn new(args: &AbuseArgs, server: &str) -> Result<Attack> {
        let access = super::ACCESS.get().cloned().unwrap_or_default();
        let Some(ca_pem) = access.ca_pem.clone() else { bail!("abuse needs the cluster's CA (a client config, --ca-file)") };
        let api = super::base_url(server);
        let api_addr = api.split("://").nth(1).unwrap_or(&api).trim_end_matches('/').to_string();
        let admin = lodestar::cli::client::Access { servers: vec![api.clone()], ..access }.client()?;
        Ok(Attack { args: args.clone(), api, api_addr, admin, ca_pem, created: Default::default(), memory_after: Default::default() })
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        let roots = lodestar::tls::roots_from_pem_text(&self.ca_pem)?;
        Ok(Arc::new(lodestar::tls::client_config(roots, None)?))
    }

    /// An HTTP/1.1 client trusting the CA, sending `token` if given.
    fn http1(&self, token: Option<&str>) -> Result<reqwest::Client> {
        let mut b = reqwest::Client::builder().http1_only().timeout(STEP);
        for cert in reqwest::Certificate::from_pem_bundle(self.ca_pem.as_bytes())? {
            b = b.add_root_certificate(cert);
        }
        if let Some(t) = token {
            let mut h = reqwest::header::HeaderMap::new();
            h.insert(reqwest::header::AUTHORIZATION, format!("Bearer {t}").parse()?);
            b = b.default_headers(h);
        }
        Ok(b.build()?)
    }

    /// A token of the attack's own (revoked at the end): its secret.
    async fn token(&self, request: Value) -> Result<String> {
        let mut request = request;
        request["ttl"] = json!(TOKEN_TTL);
        request["description"] = json!("lodestar-bench abuse");
        let t = self.admin.post("/v1/acl/tokens", &request).await.context("creating the attack's token with the admin's")?;
        let (Some(accessor), Some(secret)) = (t["accessorId"].as_str(), t["secret"].as_str()) else { bail!("no token in {t}") };
        self.created_token(accessor);
        Ok(secret.to_string())
    }

    async fn proxy_token(&self, namespace: &str) -> Result<String> {
        self.token(json!({"proxy": namespace})).await
    }

    fn created_token(&self, accessor: &str) {
        // Tokens first: a policy a token holds may not be deleted.
        self.created.lock().unwrap().insert(0, format!("/v1/resources/tokens/lodestar-system/{accessor}"));
    }

    /// Revoke the attack's tokens and delete its policy.
    async fn revoke_tokens(&self) {
        let paths = std::mem::take(&mut *self.created.lock().unwrap());
        for path in paths {
            if let Err(e) = self.admin.delete(&path).await {
                eprintln!("# deleting what the attack created, {path}: {e}");
            }
        }
    }

    /// The replica's xDS address: `--xds`, or its member entry.
    async fn xds_addr(&self) -> Result<String> {
        if let Some(x) = &self.args.xds {
            return Ok(x.clone());
        }
        let cluster = self.admin.get("/v1/cluster").await?;
        let members = cluster["members"].as_array().cloned().unwrap_or_default();
        let mine = members.iter().find(|m| m["info"]["api_addr"].as_str() == Some(&self.api_addr));
        let member = mine.or(if members.len() == 1 { members.first() } else { None });
        member
            .and_then(|m| m["info"]["xds_addr"].as_str())
            .map(String::from)
            .ok_or_else(|| anyhow!("no member with API address {} in /v1/cluster; give --xds", self.api_addr))
    }

    // ---- scenarios ---------------------------------------------------

    /// Without credentials: REST and gRPC.
    async fn bootstrap(&self) -> Result<Outcome> {
        let anonymous = self.http1(None)?;
        let resp = anonymous.post(format!("{}/v1/acl/bootstrap", self.api)).send().await?;
        let rest = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if let Some(a) = body["accessorId"].as_str() {
            // The door was open: the minted admin token is revoked with itself.
            self.created_token(a);
        }
        let channel = super::grpc(&self.api, STEP).await?;
        let mut grpc = lodestar::proto::api::lodestar_client::LodestarClient::new(channel);
        let answer = grpc.acl_bootstrap(lodestar::proto::api::AclBootstrapRequest {}).await;
        let grpc_code = match &answer {
            Ok(r) => {
                self.created_token(&r.get_ref().accessor_id);
                "OK".to_string()
            }
            Err(s) => format!("{:?}", s.code()),
        };
        Ok(Outcome::new(!(200..300).contains(&rest) && answer.is_err()).fact("rest_status", rest).fact("grpc_code", grpc_code))
    }

    /// A YAML alias bomb from a proxy token (a credential every Envoy holds).
    async fn yaml_aliases(&self) -> Result<Outcome> {
        let pid = self.args.pid.ok_or_else(|| anyhow!("yaml-aliases measures the replica's memory: give --pid"))?;
        let token = self.proxy_token("abuse-a").await?;
        let body = alias_bomb(self.args.bytes.unwrap_or(128 << 20));
        let (rss0, _) = memory_kib(pid);
        let started = Instant::now();
        let peak = Arc::new(std::sync::atomic::AtomicU64::new(rss0));
        let sampler = tokio::spawn(sample_peak(pid, peak.clone()));
        let resp = self.http1(Some(&token))?.post(format!("{}/v1/apply", self.api)).header("content-type", "application/yaml").body(body.clone()).send().await;
        let status = match resp {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) => format!("error:{}", e.without_url()).replace(' ', "_"),
        };
        sampler.abort();
        let grew = peak.load(Ordering::Relaxed).max(memory_kib(pid).0).saturating_sub(rss0);
        let refused = status.starts_with('4');
        Ok(Outcome::new(refused && grew < self.args.max_growth_kib)
            .fact("status", status)
            .fact("body_bytes", body.len())
            .fact("peak_growth_kib", grew)
            .fact("answered_ms", started.elapsed().as_millis()))
    }

    /// A 4 MiB apply from a read-only token, sent over ~2 s: refused before
    /// the body is read, the answer comes while it is still being sent.
    async fn reader_apply(&self) -> Result<Outcome> {
        let policy = json!({"apiVersion": "acl.lodestar.io/v1", "kind": "Policy", "metadata": {"name": "abuse-reader"},
            "spec": {"description": "lodestar-bench abuse", "rules": [{"verbs": ["read", "watch"], "kinds": ["*"], "namespaces": ["*"]}]}});
        self.admin.post("/v1/apply", &json!({"resources": [{"resource": policy}]})).await.context("applying the policy abuse-reader")?;
        self.created.lock().unwrap().push("/v1/resources/policies/lodestar-system/abuse-reader".to_string());
        let token = self.token(json!({"policies": ["abuse-reader"]})).await?;
        const CHUNKS: usize = 64;
        const CHUNK: usize = 64 * 1024;
        let sent = Arc::new(AtomicUsize::new(0));
        let body = SlowBody { chunks: CHUNKS, chunk: CHUNK, sent: sent.clone(), pause: None };
        let started = Instant::now();
        let resp = self
            .http1(Some(&token))?
            .post(format!("{}/v1/apply", self.api))
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap(body))
            .send()
            .await;
        let chunks_sent = sent.load(Ordering::SeqCst);
        let status = match resp {
            Ok(r) => r.status().as_u16().to_string(),
            Err(e) => format!("error:{}", e.without_url()).replace(' ', "_"),
        };
        let refused = status == "403" || status == "401";
        Ok(Outcome::new(refused && chunks_sent < CHUNKS)
            .fact("status", status)
            .fact("chunks_sent_before_answer", format!("{chunks_sent}/{CHUNKS}"))
            .fact("answered_ms", started.elapsed().as_millis()))
    }

    /// Distinct bogus paths, gRPC methods and HTTP methods, without
    /// credentials: each must not become a new series in /metrics.
    async fn metric_labels(&self) -> Result<Outcome> {
        let count = self.args.count.unwrap_or(20_000);
        let size = || async { self.admin.get_bytes("/metrics").await.map(|b| b.len()) };
        let before = size().await?;
        let anonymous = {
            let mut b = reqwest::Client::builder().timeout(STEP);
            for cert in reqwest::Certificate::from_pem_bundle(self.ca_pem.as_bytes())? {
                b = b.add_root_certificate(cert);
            }
            b.build()?
        };
        let started = Instant::now();
        let answered = AtomicUsize::new(0);
        futures::stream::iter(0..count)
            .for_each_concurrent(32, |i| {
                let (client, answered) = (&anonymous, &answered);
                async move {
                    let req = match i % 4 {
                        0 => client.post(format!("{}/lodestar.abuse{i}.Svc/Method", self.api)).header("content-type", "application/grpc"),
                        1 => client.post(format!("{}/lodestar.api.v1.Lodestar/Bogus{i}", self.api)).header("content-type", "application/grpc"),
                        2 => client.request(
                            reqwest::Method::from_bytes(format!("ABUSE{i}").as_bytes()).unwrap_or(reqwest::Method::GET),
                            format!("{}/v1/apply", self.api),
                        ),
                        _ => client.get(format!("{}/no/such/path/{i}", self.api)),
                    };
                    if req.send().await.is_ok() {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
            .await;
        let after = size().await?;
        let grew = after.saturating_sub(before);
        Ok(Outcome::new(grew < 64 * 1024)
            .fact("requests", count)
            .fact("answered", answered.into_inner())
            .fact("seconds", format!("{:.1}", started.elapsed().as_secs_f64()))
            .fact("metrics_bytes_before", before)
            .fact("metrics_bytes_after", after))
    }

    /// The address and server name of `--port`.
    async fn port_addr(&self) -> Result<String> {
        match self.args.port {
            PortArg::Api => Ok(self.api_addr.clone()),
            PortArg::Xds => self.xds_addr().await,
        }
    }

    /// A TLS connection to `addr`, from `source` if given.
    async fn tls_connect(&self, addr: &str, source: Option<IpAddr>) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        self.tls_connect_within(addr, source, STEP).await
    }

    /// The same, given up after `within` (connection and handshake each).
    async fn tls_connect_within(&self, addr: &str, source: Option<IpAddr>, within: Duration) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = tokio::time::timeout(within, lodestar::tls::connect_tcp(addr, source)).await.map_err(|_| anyhow!("connect: timed out"))??;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']').to_string();
        let name = rustls::pki_types::ServerName::try_from(host)?;
        let tls = tokio_rustls::TlsConnector::from(self.tls_config()?);
        Ok(tokio::time::timeout(within, tls.connect(name, tcp)).await.map_err(|_| anyhow!("TLS handshake: timed out"))??)
    }

    /// Idle TLS connections from one address, then a request from another.
    async fn idle_flood(&self) -> Result<Outcome> {
        let count = self.args.count.unwrap_or(1100);
        let addr = self.port_addr().await?;
        let started = Instant::now();
        // One at a time, as fast as the replica takes them, until it takes
        // no more: a handshake not completed in 3 s means the replica
        // accepts nothing now (out of descriptors); the flood stops there,
        // holding what it has. A connection refused at a limit is closed at
        // once and the flood goes on.
        let mut open = Vec::new();
        let mut stalled = false;
        for _ in 0..count {
            match self.tls_connect_within(&addr, self.args.source, Duration::from_secs(3)).await {
                Ok(c) => open.push(c),
                Err(e) if format!("{e:#}").contains("timed out") => {
                    stalled = true;
                    break;
                }
                Err(_) => {}
            }
        }
        // A connection refused at accept may have finished its handshake
        // first on the client's side: it is closed right after.
        let checked = futures::future::join_all(open.into_iter().map(|mut c| async move { still_open(&mut c).await.then_some(c) })).await;
        let held_open: Vec<_> = checked.into_iter().flatten().collect();
        let flood_open = held_open.len();
        let other = self.served(&addr, self.args.other_source).await;
        drop(held_open);
        let outcome = Outcome::new(other.is_ok() && flood_open < count)
            .fact("port", format!("{:?}", self.args.port).to_lowercase())
            .fact("connections", count)
            .fact("flood_open", flood_open)
            .fact("flood_refused", count - flood_open)
            .fact("flood_stalled", stalled)
            .fact("other_served", other.is_ok())
            .fact("seconds", format!("{:.1}", started.elapsed().as_secs_f64()));
        Ok(match other {
            Err(e) => outcome.fact("other_error", format!("{e:#}").replace(' ', "_")),
            Ok(()) => outcome,
        })
    }

    /// Whether a client from `source` is served on `addr`: the API answers
    /// /readyz (any status); the xDS port completes a handshake and keeps
    /// the connection.
    /// Within 5 s: a replica with a descriptor to spare serves at once; one
    /// that has none may let a client in now and then, as another
    /// connection times out, which is not being served.
    async fn served(&self, addr: &str, source: Option<IpAddr>) -> Result<()> {
        let mut c = self.tls_connect_within(addr, source, Duration::from_secs(5)).await?;
        if self.args.port == PortArg::Xds {
            return if still_open(&mut c).await { Ok(()) } else { Err(anyhow!("closed after the handshake")) };
        }
        c.write_all(format!("GET /readyz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes()).await?;
        let mut head = [0u8; 12];
        tokio::time::timeout(STEP, c.read_exact(&mut head)).await.map_err(|_| anyhow!("no answer"))??;
        if head.starts_with(b"HTTP/1.1 ") {
            Ok(())
        } else {
            Err(anyhow!("answered {:?}", String::from_utf8_lossy(&head)))
        }
    }

    /// A TCP connection that never starts TLS, and a TLS connection that
    /// never sends a request: how long until the replica closes each.
    async fn silent_connections(&self) -> Result<Outcome> {
        let addr = self.port_addr().await?;
        let within = Duration::from_secs(self.args.close_within_s);
        let tcp = async {
            let mut s = lodestar::tls::connect_tcp(&addr, self.args.source).await?;
            anyhow::Ok(closed_within(&mut s, within).await)
        };
        let tls = async {
            let mut s = self.tls_connect(&addr, self.args.source).await?;
            anyhow::Ok(closed_within(&mut s, within).await)
        };
        let (tcp, tls) = tokio::join!(tcp, tls);
        let (tcp, tls) = (tcp?, tls?);
        let secs = |c: Option<Duration>| c.map_or("never".to_string(), |d| format!("{:.1}", d.as_secs_f64()));
        Ok(Outcome::new(tcp.is_some() && tls.is_some())
            .fact("port", format!("{:?}", self.args.port).to_lowercase())
            .fact("tcp_closed_after_s", secs(tcp))
            .fact("tls_closed_after_s", secs(tls))
            .fact("within_s", within.as_secs()))
    }

    /// Headers one line a second, on the API port (HTTP/1.1).
    async fn slowloris(&self) -> Result<Outcome> {
        let within = Duration::from_secs(self.args.close_within_s);
        let mut c = self.tls_connect(&self.api_addr, self.args.source).await?;
        let started = Instant::now();
        c.write_all(format!("GET /readyz HTTP/1.1\r\nhost: {}\r\n", self.api_addr).as_bytes()).await?;
        let mut lines = 0;
        let closed = loop {
            if started.elapsed() > within {
                break None;
            }
            if c.write_all(format!("x-abuse-{lines}: y\r\n").as_bytes()).await.is_err() {
                break Some(started.elapsed());
            }
            lines += 1;
            let mut buf = [0u8; 256];
            match tokio::time::timeout(Duration::from_secs(1), c.read(&mut buf)).await {
                Err(_) => continue,
                // Closed, or an answer (408 and the like) then closed.
                Ok(_) => break Some(started.elapsed()),
            }
        };
        Ok(Outcome::new(closed.is_some())
            .fact("header_lines_sent", lines)
            .fact("closed_after_s", closed.map_or("never".to_string(), |d| format!("{:.1}", d.as_secs_f64())))
            .fact("within_s", within.as_secs()))
    }

    /// ADS clients of the replica's xDS port sending `token`, `n` of them
    /// (each its own HTTP/2 connection, at most 500 streams on one).
    async fn ads_clients(&self, token: &str, streams: usize) -> Result<Vec<AdsClient>> {
        let xds = self.xds_addr().await?;
        let mut clients = Vec::new();
        for _ in 0..streams.div_ceil(500).max(1) {
            let channel = super::grpc(&xds, STEP).await?;
            clients.push(AggregatedDiscoveryServiceClient::with_interceptor(channel, Bearer::new(Some(token))?).max_encoding_message_size(64 << 20));
        }
        Ok(clients)
    }

    /// One credential opens `--count` streams; then another namespace's
    /// proxy must still get one.
    async fn xds_stream_flood(&self) -> Result<Outcome> {
        let count = self.args.count.unwrap_or(5000);
        let (a, b) = (self.proxy_token("abuse-a").await?, self.proxy_token("abuse-b").await?);
        let clients = self.ads_clients(&a, count).await?;
        let started = Instant::now();
        let results: Vec<Result<Stream, tonic::Status>> = futures::stream::iter(0..count)
            .map(|i| open_sotw(clients[i % clients.len()].clone(), first_request(&node("abuse-a", i, None))))
            .buffer_unordered(256)
            .collect()
            .await;
        let opened: Vec<Stream> = results.iter().filter_map(|r| r.as_ref().ok()).cloned().collect();
        let refused: Vec<&tonic::Status> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        let flood_seconds = started.elapsed().as_secs_f64();
        let codes: std::collections::BTreeMap<String, usize> = refused.iter().fold(Default::default(), |mut m, s| {
            *m.entry(format!("{:?}", s.code())).or_default() += 1;
            m
        });
        let other_clients = self.ads_clients(&b, 1).await?;
        let other = open_sotw(other_clients[0].clone(), first_request(&node("abuse-b", 0, None))).await;
        let held = other.is_ok() && !refused.is_empty();
        let outcome = Outcome::new(held)
            .fact("streams", count)
            .fact("opened", opened.len())
            .fact("refused", refused.len())
            .fact("refusals", codes.iter().map(|(c, n)| format!("{c}:{n}")).collect::<Vec<_>>().join(","))
            .fact("flood_seconds", format!("{flood_seconds:.1}"))
            .fact("other_namespace_served", other.is_ok());
        // The replica's memory with the flood's streams still open.
        if let Some(pid) = self.args.pid {
            *self.memory_after.lock().unwrap() = Some(memory_kib(pid));
        }
        drop(opened);
        Ok(match other {
            Err(s) => outcome.fact("other_error", format!("{:?}:{}", s.code(), s.message()).replace(' ', "_")),
            Ok(_) => outcome,
        })
    }

    /// Streams that each make the replica hold `--bytes`: measured while
    /// they are all still open.
    async fn hold_streams(&self, what: Hold) -> Result<Outcome> {
        let pid = self.args.pid.ok_or_else(|| anyhow!("this scenario measures the replica's memory: give --pid"))?;
        let (count, bytes) = match what {
            Hold::Nack | Hold::Metadata => (self.args.count.unwrap_or(100), self.args.bytes.unwrap_or(3_000_000)),
            Hold::Subscriptions => (self.args.count.unwrap_or(50), self.args.bytes.unwrap_or(6_000_000)),
        };
        let label_bytes = self.args.label_bytes.unwrap_or(1024).max(16);
        let token = self.proxy_token("abuse-a").await?;
        let clients = self.ads_clients(&token, count).await?;
        let rejects_before = if matches!(what, Hold::Nack) { self.cds_rejects().await? } else { 0 };
        let (rss0, _) = memory_kib(pid);
        let started = Instant::now();
        // NACKs of megabytes a few at a time, within the replica's budget
        // for requests in progress (xds_max_buffered_request_bytes,
        // 64 MiB), so that each is taken in rather than its stream ended.
        let concurrency = if matches!(what, Hold::Nack) { 8 } else { 16 };
        let outcomes: Vec<Result<Stream, tonic::Status>> = futures::stream::iter(0..count)
            .map(|i| what.attack(clients[i % clients.len()].clone(), i, bytes, label_bytes))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        let open: Vec<&Stream> = outcomes.iter().filter_map(|o| o.as_ref().ok()).collect();
        let mut outcome = Outcome::new(true);
        if matches!(what, Hold::Nack) {
            // The memory once the replica has taken in every NACK sent (a
            // NACK is counted after its text is cut and logged).
            let want = rejects_before + open.len() as u64;
            let deadline = Instant::now() + 3 * STEP;
            let mut counted = self.cds_rejects().await?;
            while counted < want && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                counted = self.cds_rejects().await?;
            }
            outcome = outcome.fact("nacks_counted", format!("{}/{}", counted.saturating_sub(rejects_before), open.len()));
        }
        let attack_seconds = started.elapsed().as_secs_f64();
        // What the replica holds for the streams, which stay open: its
        // allocator keeps the buffers of what it took in and freed (the
        // megabyte requests' decoding) for a while before it gives them
        // back, so memory is read until it is under the bound or
        // `--settle-s` passed. What a replica keeps per stream stays.
        let settle = Instant::now();
        let (after, grew) = loop {
            let after = memory_kib(pid);
            let grew = after.0.saturating_sub(rss0);
            if grew < self.args.max_growth_kib || settle.elapsed() >= Duration::from_secs(self.args.settle_s) {
                break (after, grew);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        *self.memory_after.lock().unwrap() = Some(after);
        let ended = open.iter().filter(|s| s.ended()).count();
        let refused = outcomes.len() - open.len();
        outcome.held = grew < self.args.max_growth_kib;
        Ok(outcome
            .fact("streams", count)
            .fact("bytes_each", bytes)
            .fact("refused", refused)
            .fact("ended_by_server", ended)
            .fact("rss_growth_kib", grew)
            .fact("peak_growth_kib", after.1.saturating_sub(rss0))
            .fact("seconds", format!("{attack_seconds:.1}"))
            .fact("settled_after_s", format!("{:.1}", settle.elapsed().as_secs_f64())))
    }

    /// The replica's `pilot_total_xds_rejects{type="cds"}`: the CDS NACKs
    /// it has counted.
    async fn cds_rejects(&self) -> Result<u64> {
        let text = String::from_utf8(self.admin.get_bytes("/metrics").await?)?;
        Ok(text.lines().find_map(|l| l.strip_prefix("pilot_total_xds_rejects{type=\"cds\"} ")?.trim().parse::<f64>().ok()).unwrap_or(0.0) as u64)
    }
}

/// A request body of `chunks` chunks (spaces, after an opening
/// `{"resources":[`), one every 30 ms; counts those sent.
struct SlowBody {
    chunks: usize,
    chunk: usize,
    sent: Arc<AtomicUsize>,
    pause: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl http_body::Body for SlowBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>> {
        let n = self.sent.load(Ordering::SeqCst);
        if n == self.chunks {
            return std::task::Poll::Ready(None);
        }
        let pause = self.pause.get_or_insert_with(|| Box::pin(tokio::time::sleep(Duration::from_millis(30))));
        std::task::ready!(pause.as_mut().poll(cx));
        self.pause = None;
        let mut chunk = vec![b' '; self.chunk];
        if n == 0 {
            chunk[..14].copy_from_slice(b"{\"resources\":[");
        }
        self.sent.fetch_add(1, Ordering::SeqCst);
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(chunk.into()))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact((self.chunks * self.chunk) as u64)
    }
}

/// What [`Attack::hold_streams`] makes each stream carry.
#[derive(Clone, Copy)]
enum Hold {
    /// A NACK whose error text is `bytes` long.
    Nack,
    /// Node metadata labels adding up to `bytes`, of `label_bytes` each.
    Metadata,
    /// Delta subscriptions: `bytes` of resource names of 100 bytes, 10,000
    /// (1 MB) a request, each answered before the next is sent.
    Subscriptions,
}

/// Resource names per delta request, and each name's length.
const NAMES_PER_REQUEST: usize = 10_000;
const NAME_BYTES: usize = 100;

impl Hold {
    async fn attack(self, client: AdsClient, i: usize, bytes: usize, label_bytes: usize) -> Result<Stream, tonic::Status> {
        match self {
            Hold::Nack => {
                let s = open_sotw(client, first_request(&node("abuse-a", i, None))).await?;
                let nonce = s.first_nonce.clone();
                let error = RpcStatus { code: 3, message: "n".repeat(bytes), details: Vec::new() };
                let nack =
                    DiscoveryRequest { type_url: ResourceType::Cluster.type_url(), response_nonce: nonce, error_detail: Some(error), ..Default::default() };
                s.send(Request::Sotw(nack)).await;
                Ok(s)
            }
            Hold::Metadata => {
                let name = |k: usize| format!("abuse-{k:0>8}");
                let value = "v".repeat(label_bytes.saturating_sub(name(0).len()));
                let labels: Struct = Struct { fields: (0..bytes / label_bytes).map(|k| (name(k), string_value(value.clone()))).collect() };
                let node = node("abuse-a", i, Some(labels));
                open_sotw(client, first_request(&node)).await
            }
            Hold::Subscriptions => {
                let total = bytes / NAME_BYTES;
                let prefix = format!("abuse-{i}-");
                let names = |from: usize| {
                    (from..total.min(from + NAMES_PER_REQUEST)).map(|k| format!("{prefix}{k:0>w$}", w = NAME_BYTES - prefix.len())).collect::<Vec<_>>()
                };
                let first = DeltaDiscoveryRequest {
                    type_url: ResourceType::Endpoint.type_url(),
                    node: Some(node("abuse-a", i, None)),
                    resource_names_subscribe: names(0),
                    ..Default::default()
                };
                let s = open_delta(client, first).await?;
                // The replica answers each request (with the names it does
                // not have as removed): the next goes once it has.
                for (answered, from) in (NAMES_PER_REQUEST..total).step_by(NAMES_PER_REQUEST).enumerate() {
                    if !s.answered(answered + 1).await {
                        break;
                    }
                    let more =
                        DeltaDiscoveryRequest { type_url: ResourceType::Endpoint.type_url(), resource_names_subscribe: names(from), ..Default::default() };
                    s.send(Request::Delta(more)).await;
                }
                s.answered(total.div_ceil(NAMES_PER_REQUEST)).await;
                Ok(s)
            }
        }
    }
}

type AdsClient = AggregatedDiscoveryServiceClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>>;

enum Request {
    Sotw(DiscoveryRequest),
    Delta(DeltaDiscoveryRequest),
}

/// An open ADS stream: requests go in, responses are drained (and
/// dropped) by a task that notes when the server ends it.
#[derive(Clone)]
struct Stream {
    tx: mpsc::Sender<Request>,
    first_nonce: String,
    ended: Arc<std::sync::atomic::AtomicBool>,
    /// Responses received so far (after the first, for a SotW stream).
    responses: tokio::sync::watch::Receiver<usize>,
}

impl Stream {
    async fn send(&self, r: Request) {
        let _ = self.tx.send(r).await;
    }
    fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
    /// Whether `n` responses came (within a step) before the stream ended.
    async fn answered(&self, n: usize) -> bool {
        let mut responses = self.responses.clone();
        let answered = matches!(tokio::time::timeout(STEP, responses.wait_for(|r| *r >= n)).await, Ok(Ok(_)));
        answered
    }
}

fn string_value(s: String) -> PbValue {
    PbValue { kind: Some(Kind::StringValue(s)) }
}

/// A sidecar of `namespace` (a proxy token of that namespace may speak
/// for it), with `labels` as its metadata's LABELS if given.
fn node(namespace: &str, i: usize, labels: Option<Struct>) -> Node {
    let mut fields: std::collections::HashMap<String, PbValue> = [("NAMESPACE".to_string(), string_value(namespace.to_string()))].into();
    if let Some(l) = labels {
        fields.insert("LABELS".to_string(), PbValue { kind: Some(Kind::StructValue(l)) });
    }
    Node { id: format!("sidecar~127.0.0.1~abuse-{i}.{namespace}~{namespace}.svc.cluster.local"), metadata: Some(Struct { fields }), ..Default::default() }
}

fn first_request(node: &Node) -> DiscoveryRequest {
    DiscoveryRequest { type_url: ResourceType::Cluster.type_url(), node: Some(node.clone()), ..Default::default() }
}

/// Open a SotW stream with `first` and wait for its first response.
async fn open_sotw(mut client: AdsClient, first: DiscoveryRequest) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel::<Request>(4);
    let requests = ReceiverStream::new(rx).filter_map(|r| async move {
        match r {
            Request::Sotw(r) => Some(r),
            Request::Delta(_) => None,
        }
    });
    let requests = futures::stream::iter([first]).chain(requests);
    let call = tokio::time::timeout(STEP, client.stream_aggregated_resources(requests)).await.map_err(|_| tonic::Status::deadline_exceeded("no answer"))?;
    let mut responses = call?.into_inner();
    let first = tokio::time::timeout(STEP, responses.message()).await.map_err(|_| tonic::Status::deadline_exceeded("no first response"))??;
    let first = first.ok_or_else(|| tonic::Status::aborted("the stream ended before a response"))?;
    Ok(drain(tx, first.nonce, responses))
}

/// Open a delta stream with `first`; its responses are counted
/// ([`Stream::answered`]), not awaited here.
async fn open_delta(mut client: AdsClient, first: DeltaDiscoveryRequest) -> Result<Stream, tonic::Status> {
    let (tx, rx) = mpsc::channel::<Request>(4);
    let requests = ReceiverStream::new(rx).filter_map(|r| async move {
        match r {
            Request::Delta(r) => Some(r),
            Request::Sotw(_) => None,
        }
    });
    let requests = futures::stream::iter([first]).chain(requests);
    let call = tokio::time::timeout(STEP, client.delta_aggregated_resources(requests)).await.map_err(|_| tonic::Status::deadline_exceeded("no answer"))?;
    Ok(drain(tx, String::new(), call?.into_inner()))
}

/// Responses are read (and counted) until the stream ends: by the server,
/// or by the client, whose request side ends once every handle of the
/// [`Stream`] is dropped. (Not on the request side's receiver going away:
/// tonic drops it as soon as the server ends the call, before the status
/// is read.)
fn drain<T: Send + 'static>(tx: mpsc::Sender<Request>, first_nonce: String, mut responses: tonic::Streaming<T>) -> Stream {
    let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = ended.clone();
    let (count, counted) = tokio::sync::watch::channel(0usize);
    tokio::spawn(async move {
        while let Ok(Some(_)) = responses.message().await {
            count.send_modify(|n| *n += 1);
        }
        flag.store(true, Ordering::Relaxed);
        // Ended: whoever waits for a response stops waiting (`count` is
        // dropped here).
    });
    Stream { tx, first_nonce, ended, responses: counted }
}

/// The highest resident memory of `pid` seen (KiB) into `peak`, sampled
/// every 5 ms until aborted: the peak of one request, whatever came before
/// (VmHWM holds the process's peak since it started).
async fn sample_peak(pid: u32, peak: Arc<std::sync::atomic::AtomicU64>) {
    loop {
        peak.fetch_max(memory_kib(pid).0, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A YAML document of about 5 KB whose anchors and aliases expand to about
/// `bytes`: one string leaf, 190 aliases to it, 190 aliases to those (a
/// parser that allows 100 alias jumps per event, as yaml_serde does, takes
/// this in full).
fn alias_bomb(bytes: usize) -> String {
    const FAN: usize = 190;
    let leaf = "x".repeat((bytes / (FAN * FAN)).max(1));
    let aliases = |name: &str| vec![format!("*{name}"); FAN].join(",");
    format!(
        "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {{name: abuse, namespace: abuse-a}}\nspec:\n  l0: &l0 \"{leaf}\"\n  l1: &l1 [{}]\n  l2: [{}]\n",
        aliases("l0"),
        aliases("l1")
    )
}

/// Whether the other side still holds the connection half a second on
/// (what it sends meanwhile, e.g. HTTP/2 settings, is read and dropped).
async fn still_open<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> bool {
    closed_within(s, Duration::from_millis(500)).await.is_none()
}

/// How long until the other side closes the connection, if it does
/// within `within` (what it sends meanwhile is read and dropped).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(s: &mut S, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    let closed = async {
        // Ok(0): the end of the stream; an error: reset.
        while matches!(s.read(&mut buf).await, Ok(1..)) {}
    };
    tokio::time::timeout(within, closed).await.ok().map(|_| started.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_alias_bomb_is_small_and_expands_as_asked() {
        let bomb = alias_bomb(128 << 20);
        assert!(bomb.len() < 8 * 1024, "{}", bomb.len());
        let leaf = bomb.split('"').nth(1).unwrap().len();
        assert!(leaf * 190 * 190 > 120 << 20);
    }
}
