//! `lodestar-bench write`: concurrent ~1 KiB writes against a running
//! cluster, at several client counts, each level bounded in time and count.
//! Every write is checked: it must be acknowledged with a revision and
//! report a change. Prints writes/s and latency percentiles.
//!
//! `--target etcd` runs the same load against an etcd v3 cluster (KV.Put
//! over gRPC, the value being the same ~1 KiB document) for comparison: a
//! Put counts as acknowledged when its response header carries a revision.
//! A secured etcd is spoken to as etcd's own clients do: `https://` URLs
//! are checked against the cluster CA (`--ca-file` / `LODESTAR_CACERT`),
//! with a client certificate (`--etcd-cert`, `--etcd-key`) for an etcd
//! started with `--client-cert-auth`; with `--etcd-user`, each client
//! connection calls `Auth.Authenticate` once (before the level's clock
//! starts) and sends the token it gets as metadata `token` on every Put.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use etcd::auth_client::AuthClient;
use etcd::kv_client::KvClient;
use etcd::{AuthenticateRequest, PutRequest};
use lodestar::cli::client::ApiClient;
use lodestar::proto::api::lodestar_client::LodestarClient;
use lodestar::proto::api::{ApplyItem, ApplyRequest};
use serde_json::json;
use std::time::{Duration, Instant};
use tonic::metadata::{AsciiMetadataValue, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// The slice of etcd's v3 API (`KV.Put`, `Auth.Authenticate`) that
/// `--target etcd` uses, compiled by build.rs from `proto/bench/etcd_kv.proto`
/// and `proto/bench/etcd_auth.proto`. Client only.
mod etcd {
    tonic::include_proto!("etcdserverpb");
}

/// `write`'s flags (its servers are `--servers`, not the global `--server`).
#[derive(Args)]
pub struct WriteArgs {
    /// API URLs of the replicas; clients are spread across them.
    #[arg(long, value_delimiter = ',', default_value = lodestar::config::DEFAULT_SERVER_URL)]
    servers: Vec<String>,
    /// Concurrency levels to run, one after another.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Seconds per level.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Stop a level after this many writes even if time is left.
    #[arg(long, default_value_t = 1_000_000)]
    max_writes: u64,
    /// Approximate size of each resource in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Lodestar's client API to use (ignored for etcd, which is gRPC).
    #[arg(long, value_enum, default_value_t = Api::Grpc)]
    api: Api,
    /// What `--servers` are: Lodestar API URLs, or etcd client URLs
    /// (e.g. http://127.0.0.1:2379).
    #[arg(long, value_enum, default_value_t = Target::Lodestar)]
    target: Target,
    #[command(flatten)]
    etcd: EtcdAccess,
}

/// How to reach an etcd with TLS and auth enabled (`--target etcd`).
#[derive(Args, Clone, Debug, Default)]
pub struct EtcdAccess {
    /// Client certificate (PEM) for an etcd with `--client-cert-auth`.
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    etcd_cert: Option<std::path::PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    etcd_key: Option<std::path::PathBuf>,
    /// etcd user to authenticate as (`etcdctl auth enable`d clusters).
    #[arg(long, value_name = "NAME", requires = "etcd_password")]
    etcd_user: Option<String>,
    /// That user's password.
    #[arg(long, value_name = "PASSWORD", env = "LODESTAR_BENCH_ETCD_PASSWORD", hide_env_values = true)]
    etcd_password: Option<String>,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Target {
    Lodestar,
    Etcd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
pub enum Api {
    Grpc,
    Rest,
}

pub async fn run(args: WriteArgs) -> Result<()> {
    let WriteArgs { servers, clients, seconds, max_writes, size, api, target, etcd } = args;
    if servers.is_empty() || clients.is_empty() {
        bail!("need at least one server and one concurrency level");
    }
    let proto = match target {
        Target::Lodestar => format!("api={api:?}"),
        Target::Etcd => format!(
            "api=etcd-v3-grpc, tls={}, client-cert={}, auth={}",
            yes(servers.iter().all(|s| s.starts_with("https://"))),
            yes(etcd.etcd_cert.is_some()),
            etcd.etcd_user.as_deref().map_or("no".to_string(), |u| format!("user {u}"))
        ),
    };
    println!("# lodestar-bench write: target={target:?}, {size}-byte resources, {seconds}s per level, {proto}, servers={}", servers.join(","));
    println!("{:>8} {:>9} {:>10} {:>9} {:>9} {:>9} {:>7}", "clients", "writes", "writes/s", "p50_ms", "p99_ms", "max_ms", "errors");
    let mut failed = 0;
    for (level, &n) in clients.iter().enumerate() {
        let r = run_level(&servers, n, Duration::from_secs(seconds), max_writes, size, api, target, &etcd, level).await?;
        println!(
            "{:>8} {:>9} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>7}",
            n,
            r.writes,
            r.writes as f64 / r.elapsed.as_secs_f64(),
            r.pct(0.50),
            r.pct(0.99),
            r.pct(1.0),
            r.errors
        );
        if r.errors > 0 {
            eprintln!("first error: {}", r.first_error.unwrap_or_default());
        }
        failed += r.errors;
    }
    if failed > 0 {
        bail!("{failed} writes were not acknowledged");
    }
    Ok(())
}

struct LevelResult {
    writes: u64,
    errors: u64,
    elapsed: Duration,
    latencies_us: Vec<u64>,
    first_error: Option<String>,
}

impl LevelResult {
    fn pct(&self, p: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies_us.len() as f64 - 1.0) * p).round() as usize;
        self.latencies_us[i] as f64 / 1000.0
    }
}

/// The document a client writes: one of its 64 names, rotating. `run`
/// tells runs apart, so that a rerun against the same cluster still
/// changes every object (an unchanged write is not acknowledged as one).
fn resource(client: usize, seq: u64, level: usize, size: usize, run: u64) -> serde_json::Value {
    let mut r = json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": format!("bench-{level}-{client}-{}", seq % 64), "namespace": "bench",
                     "annotations": {"bench.lodestar.io/seq": format!("{run}-{seq}"), "bench.lodestar.io/pad": ""}},
        "spec": {"hosts": [format!("svc-{client}.bench.svc.cluster.local")],
                 "http": [{"route": [{"destination": {"host": format!("svc-{client}"), "subset": "v1"}}]}]}
    });
    let pad = size.saturating_sub(r.to_string().len());
    r["metadata"]["annotations"]["bench.lodestar.io/pad"] = json!("x".repeat(pad));
    r
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

enum Conn {
    Grpc(ApiClient),
    Rest(reqwest::Client, String),
    Etcd(KvClient<InterceptedService<Channel, EtcdToken>>),
}

/// Sends an etcd auth token, if there is one, as metadata `token` (what
/// etcd's clientv3 does after `Authenticate`).
#[derive(Clone)]
pub struct EtcdToken(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for EtcdToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("token", t.clone());
        }
        Ok(req)
    }
}

/// A gRPC channel to an etcd member: `https://` with the cluster CA and,
/// if given, the client certificate.
async fn etcd_channel(base: &str, access: &EtcdAccess) -> Result<Channel> {
    let tls = match crate::ACCESS.get().and_then(|a| a.ca_pem.as_deref()) {
        Some(pem) => {
            let roots = lodestar::tls::roots_from_pem_text(pem)?;
            let identity = access.etcd_cert.as_deref().zip(access.etcd_key.as_deref());
            Some(std::sync::Arc::new(lodestar::tls::client_config(roots, identity)?))
        }
        None if base.starts_with("https://") => bail!("{base}: https needs the cluster CA (--ca-file or LODESTAR_CACERT)"),
        None => None,
    };
    let (endpoint, connector) = lodestar::tls::dial(base, tls)?;
    Ok(endpoint.connect_timeout(Duration::from_secs(10)).connect_with_connector(connector).await?)
}

/// `Auth.Authenticate` on `channel`: the token for later calls.
async fn etcd_authenticate(channel: Channel, access: &EtcdAccess) -> Result<Option<AsciiMetadataValue>> {
    let Some(name) = access.etcd_user.clone() else { return Ok(None) };
    let password = access.etcd_password.clone().unwrap_or_default();
    let r = AuthClient::new(channel)
        .authenticate(AuthenticateRequest { name: name.clone(), password })
        .await
        .map_err(|s| anyhow!("etcd Authenticate as {name}: {}: {}", s.code(), s.message()))?
        .into_inner();
    if r.token.is_empty() {
        bail!("etcd Authenticate as {name}: no token in the answer (is auth enabled?)");
    }
    Ok(Some(MetadataValue::try_from(r.token.as_str()).context("etcd's token is not valid metadata")?))
}

impl Conn {
    /// Write `doc`, named `key` for targets that need one. Ok only when the
    /// target acknowledged the write as committed, with its revision.
    async fn write(&mut self, key: String, doc: serde_json::Value) -> Result<u64> {
        match self {
            Conn::Etcd(c) => {
                let req = PutRequest { key: key.into_bytes(), value: doc.to_string().into_bytes(), ..Default::default() };
                let r = c.put(req).await.map_err(|s| anyhow!("{}: {}", s.code(), s.message()))?.into_inner();
                match r.header.map(|h| h.revision) {
                    Some(rev) if rev > 0 => Ok(rev as u64),
                    other => bail!("put not acknowledged: response revision {other:?}"),
                }
            }
            Conn::Grpc(c) => {
                let req = ApplyRequest { items: vec![ApplyItem { resource_json: doc.to_string(), expected_revision: None }], ..Default::default() };
                let r = c.apply(req).await.map_err(|s| anyhow!("{}: {}", s.code(), s.message()))?.into_inner();
                match r.items.first().map(|i| i.action.as_str()) {
                    Some("created" | "configured") if r.revision > 0 => Ok(r.revision),
                    other => bail!("write not acknowledged as a change: {other:?} at revision {}", r.revision),
                }
            }
            Conn::Rest(c, base) => {
                let resp = c.post(format!("{base}/v1/apply")).json(&json!({"resources": [doc]})).send().await?;
                let status = resp.status();
                let body: serde_json::Value = resp.json().await?;
                if !status.is_success() {
                    bail!("{status}: {body}");
                }
                match (body["revision"].as_u64(), body["items"][0]["action"].as_str()) {
                    (Some(rev), Some("created" | "configured")) if rev > 0 => Ok(rev),
                    _ => bail!("write not acknowledged as a change: {body}"),
                }
            }
        }
    }
}

/// One connection per client: a gRPC channel is one HTTP/2 connection.
async fn connect(server: &str, api: Api, target: Target, etcd: &EtcdAccess) -> Result<Conn> {
    let base = match target {
        // etcd as benches/write.sh runs it: its own URL, as given.
        Target::Etcd if !server.contains("://") => format!("http://{server}"),
        _ => crate::base_url(server),
    };
    let grpc = || crate::grpc(&base, Duration::from_secs(10));
    Ok(match (target, api) {
        (Target::Etcd, _) => {
            let channel = etcd_channel(&base, etcd).await.with_context(|| format!("connecting to etcd at {base}"))?;
            let token = etcd_authenticate(channel.clone(), etcd).await?;
            Conn::Etcd(KvClient::with_interceptor(channel, EtcdToken(token)))
        }
        (Target::Lodestar, Api::Grpc) => {
            Conn::Grpc(LodestarClient::with_interceptor(grpc().await.with_context(|| format!("connecting to {base}"))?, crate::bearer()?))
        }
        (Target::Lodestar, Api::Rest) => Conn::Rest(crate::http()?, base),
    })
}

#[allow(clippy::too_many_arguments)]
async fn run_level(
    servers: &[String],
    n: usize,
    duration: Duration,
    max_writes: u64,
    size: usize,
    api: Api,
    target: Target,
    etcd: &EtcdAccess,
    level: usize,
) -> Result<LevelResult> {
    let mut conns = Vec::with_capacity(n);
    for i in 0..n {
        conns.push(connect(&servers[i % servers.len()], api, target, etcd).await?);
    }
    let budget = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(max_writes));
    let run = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    let start = Instant::now();
    let deadline = start + duration;
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut conn)| {
            let budget = budget.clone();
            tokio::spawn(async move {
                let (mut lat, mut errors, mut first_error, mut seq) = (Vec::new(), 0u64, None, 0u64);
                while Instant::now() < deadline
                    && budget.fetch_update(std::sync::atomic::Ordering::Relaxed, std::sync::atomic::Ordering::Relaxed, |b| b.checked_sub(1)).is_ok()
                {
                    let t = Instant::now();
                    // Same key pattern for both targets: 64 keys per client, rotating.
                    let key = format!("/bench/{level}/{i}/{}", seq % 64);
                    match conn.write(key, resource(i, seq, level, size, run)).await {
                        Ok(_) => lat.push(t.elapsed().as_micros() as u64),
                        Err(e) => {
                            errors += 1;
                            first_error.get_or_insert(e.to_string());
                        }
                    }
                    seq += 1;
                }
                (lat, errors, first_error)
            })
        })
        .collect();
    let mut result = LevelResult { writes: 0, errors: 0, elapsed: Duration::ZERO, latencies_us: Vec::new(), first_error: None };
    for t in tasks {
        let (lat, errors, first_error) = t.await?;
        result.latencies_us.extend(lat);
        result.errors += errors;
        if result.first_error.is_none() {
            result.first_error = first_error;
        }
    }
    result.elapsed = start.elapsed();
    result.writes = result.latencies_us.len() as u64;
    result.latencies_us.sort_unstable();
    Ok(result)
}
