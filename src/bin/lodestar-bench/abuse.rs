//! `xds-abuse`: what one low-privilege credential can make a replica hold
//! on its xDS port (issue 32), as an attacker holding one namespace's proxy
//! token would try it. Every scenario opens `--streams` ADS streams to ONE
//! replica (`--xds`) with `--token`, as proxies of `--namespace`, holds them
//! open for `--hold` seconds and reports the replica's RSS (`--pid`,
//! VmRSS) before and after, and how many streams were served or refused:
//!
//! - **nack**: each stream NACKs its first response with a `--nack-bytes`
//!   error text (default 3 MiB);
//! - **labels**: each stream's node carries `--labels` labels of
//!   `--label-bytes` bytes each (default 256 of 240: at the caps);
//! - **subscriptions**: delta streams, each subscribing `--names` EDS names
//!   of 60 bytes, 2,000 per request (default 8,000: just under the
//!   per-stream budget);
//! - **streams**: as many streams as open, up to `--streams` (give 20,000),
//!   as fast as they open; then one stream with `--other-token` as a proxy of
//!   `--other-namespace`, which must still be served.
//!
//! Ends with one `result:` line. Refusals (and streams the server ends
//! while they are held, `ended`) are counted, not failures: a bounded
//! replica refuses the abuse it cannot bound otherwise.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use lodestar::cli::client::Bearer;
use lodestar::xds::resources::ResourceType;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    Nack,
    Labels,
    Subscriptions,
    Streams,
}

#[derive(Args, Clone)]
pub struct AbuseArgs {
    #[arg(long, value_enum)]
    scenario: Scenario,
    /// The replica's xDS address, HOST:PORT.
    #[arg(long)]
    xds: String,
    /// The replica's pid, for its RSS.
    #[arg(long)]
    pid: u32,
    /// The proxy token the streams send.
    #[arg(long, env = "ABUSE_TOKEN", hide_env_values = true)]
    token: String,
    /// The namespace the token is bound to.
    #[arg(long)]
    namespace: String,
    /// streams: another namespace's proxy token, which must still connect.
    #[arg(long, env = "ABUSE_OTHER_TOKEN", hide_env_values = true)]
    other_token: Option<String>,
    #[arg(long)]
    other_namespace: Option<String>,
    #[arg(long, default_value_t = 100)]
    streams: usize,
    #[arg(long, default_value_t = 3 * 1024 * 1024)]
    nack_bytes: usize,
    #[arg(long, default_value_t = 256)]
    labels: usize,
    #[arg(long, default_value_t = 240)]
    label_bytes: usize,
    #[arg(long, default_value_t = 8000)]
    names: usize,
    /// The replica's API URL: nack waits (at most a minute) until the
    /// replica has counted every NACK (`pilot_total_xds_rejects`) before
    /// the RSS is read.
    #[arg(long)]
    api: Option<String>,
    /// Seconds the streams are held open before the RSS is read.
    #[arg(long, default_value_t = 2)]
    hold: u64,
}

/// Every step waits at most this long.
const STEP: Duration = Duration::from_secs(20);
/// Streams per HTTP/2 connection (the server allows 1,024).
const PER_CONNECTION: usize = 1000;

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}/status"))?;
    status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse().ok()).ok_or_else(|| anyhow!("/proc/{pid}/status has no VmRSS"))
}

type Client = AggregatedDiscoveryServiceClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, Bearer>>;

async fn client(xds: &str, token: &str) -> Result<Client> {
    let channel = crate::grpc(xds, STEP).await.with_context(|| format!("connecting to {xds}"))?;
    Ok(AggregatedDiscoveryServiceClient::with_interceptor(channel, Bearer::new(Some(token))?))
}

fn node(i: usize, namespace: &str) -> Node {
    Node { id: format!("sidecar~127.0.0.5~abuse-{i}.{namespace}~{namespace}.svc.cluster.local"), ..Default::default() }
}

/// The request a stream sends after its first response, from that
/// response's version and nonce.
type Then = Box<dyn FnOnce(&str, &str) -> DiscoveryRequest + Send>;

/// What one stream did: served (and kept open until `gone`), or refused.
enum Outcome {
    Served,
    Refused(tonic::Code),
}

/// One SotW stream whose first request is `first`; after its first
/// response, `then` (if any) is sent; the stream is then held until `gone`.
async fn sotw(mut c: Client, first: DiscoveryRequest, then: Option<Then>, gone: watch::Receiver<bool>) -> Outcome {
    let (tx, rx) = mpsc::channel(2);
    let _ = tx.send(first).await;
    let mut rx = match tokio::time::timeout(STEP, c.stream_aggregated_resources(ReceiverStream::new(rx))).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => return Outcome::Refused(s.code()),
        Err(_) => return Outcome::Refused(tonic::Code::DeadlineExceeded),
    };
    let resp = match tokio::time::timeout(STEP, rx.message()).await {
        Ok(Ok(Some(r))) => r,
        Ok(Err(s)) => return Outcome::Refused(s.code()),
        _ => return Outcome::Refused(tonic::Code::Unknown),
    };
    if let Some(then) = then {
        let _ = tx.send(then(&resp.version_info, &resp.nonce)).await;
    }
    hold(rx, tx, gone);
    Outcome::Served
}

/// Streams the server ended while they were held (reported as `ended`).
static ENDED: AtomicUsize = AtomicUsize::new(0);

/// Keep a stream open (its request side too) until `gone`, reading what
/// comes; a stream the server ends is let go, and counted in [`ENDED`].
fn hold<T: Send + 'static, R: Send + 'static>(mut rx: tonic::Streaming<R>, tx: mpsc::Sender<T>, mut gone: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let _tx = tx;
        let done = gone.clone();
        loop {
            tokio::select! {
                _ = gone.wait_for(|g| *g) => return,
                m = rx.message() => if !matches!(m, Ok(Some(_))) {
                    if !*done.borrow() {
                        ENDED.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                },
            }
        }
    });
}

pub async fn run(args: AbuseArgs) -> Result<()> {
    println!("command: {}", crate::command_line());
    let before = rss_kib(args.pid)?;
    // The NACKs the replica counted before this run.
    let rejects0 = match (&args.api, args.scenario) {
        (Some(api), Scenario::Nack) => rejects(api).await?,
        _ => 0.0,
    };
    let (gone_tx, gone) = watch::channel(false);
    let clients: Vec<Client> = {
        let mut v = Vec::new();
        for _ in 0..args.streams.div_ceil(PER_CONNECTION).max(1) {
            v.push(client(&args.xds, &args.token).await?);
        }
        v
    };
    let served = AtomicUsize::new(0);
    let refused = std::sync::Mutex::new(std::collections::BTreeMap::<String, usize>::new());
    let started = Instant::now();
    let ns = args.namespace.clone();
    let text = "x".repeat(args.nack_bytes);
    let one = |i: usize| {
        let (c, gone, ns, text) = (clients[i % clients.len()].clone(), gone.clone(), ns.clone(), text.clone());
        let args = args.clone();
        async move {
            match args.scenario {
                Scenario::Nack => {
                    let first = DiscoveryRequest { type_url: ResourceType::Cluster.type_url(), node: Some(node(i, &ns)), ..Default::default() };
                    let nack = move |version: &str, nonce: &str| DiscoveryRequest {
                        type_url: ResourceType::Cluster.type_url(),
                        version_info: version.to_string(),
                        response_nonce: nonce.to_string(),
                        error_detail: Some(RpcStatus { code: 3, message: text, details: vec![] }),
                        ..Default::default()
                    };
                    sotw(c, first, Some(Box::new(nack)), gone).await
                }
                Scenario::Labels | Scenario::Streams => {
                    let mut n = node(i, &ns);
                    if args.scenario == Scenario::Labels {
                        let value = |s: String| Value { kind: Some(Kind::StringValue(s)) };
                        let half = args.label_bytes / 2;
                        let labels = (0..args.labels).map(|l| (format!("{l:0>w$}", w = half.max(8)), value("v".repeat(half)))).collect();
                        n.metadata =
                            Some(Struct { fields: [("LABELS".to_string(), Value { kind: Some(Kind::StructValue(Struct { fields: labels })) })].into() });
                    }
                    let first = DiscoveryRequest { type_url: ResourceType::Cluster.type_url(), node: Some(n), ..Default::default() };
                    sotw(c, first, None, gone).await
                }
                Scenario::Subscriptions => subscribe(c, i, &ns, args.names, gone).await,
            }
        }
    };
    // NACKs of megabytes: few at a time, within the replica's budget for
    // incomplete requests (xds_max_buffered_request_bytes, 64 MiB), so
    // that every one is taken rather than its stream ended.
    let concurrency = match args.scenario {
        Scenario::Streams => 512,
        Scenario::Nack => 8,
        _ => 32,
    };
    futures::StreamExt::for_each_concurrent(futures::stream::iter(0..args.streams), concurrency, |i| {
        let f = one(i);
        let (served, refused) = (&served, &refused);
        async move {
            match f.await {
                Outcome::Served => {
                    served.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Refused(code) => *refused.lock().unwrap().entry(format!("{code:?}")).or_default() += 1,
            }
        }
    })
    .await;
    let opening = started.elapsed();
    // Another namespace's proxy, after the flood.
    let other = match (&args.other_token, &args.other_namespace) {
        (Some(t), Some(other_ns)) => {
            let first = DiscoveryRequest { type_url: ResourceType::Cluster.type_url(), node: Some(node(0, other_ns)), ..Default::default() };
            match sotw(client(&args.xds, t).await?, first, None, gone.clone()).await {
                Outcome::Served => "served",
                Outcome::Refused(_) => "refused",
            }
        }
        _ => "-",
    };
    let mut counted = "-".to_string();
    if let (Scenario::Nack, Some(api)) = (args.scenario, &args.api) {
        let want = rejects0 + served.load(Ordering::Relaxed) as f64;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let n = rejects(api).await?;
            counted = format!("{n}");
            if n >= want || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    tokio::time::sleep(Duration::from_secs(args.hold)).await;
    let after = rss_kib(args.pid)?;
    let _ = gone_tx.send(true);
    let served = served.into_inner();
    let refused = refused.into_inner().unwrap();
    let refused_total: usize = refused.values().sum();
    let codes = if refused.is_empty() { "-".to_string() } else { refused.iter().map(|(c, n)| format!("{c}:{n}")).collect::<Vec<_>>().join(",") };
    let delta = after as i64 - before as i64;
    println!(
        "result: scenario={} streams={} served={served} refused={refused_total} refused_codes={codes} ended={} other_namespace={other} nacks_counted={counted} open_secs={:.1} rss_before_kib={before} rss_after_kib={after} delta_kib={delta} per_stream_kib={:.1}",
        format!("{:?}", args.scenario).to_lowercase(),
        args.streams,
        ENDED.load(Ordering::Relaxed),
        opening.as_secs_f64(),
        delta as f64 / args.streams.max(1) as f64,
    );
    if args.other_namespace.is_some() && other != "served" {
        bail!("another namespace's proxy was refused after the flood");
    }
    Ok(())
}

/// The replica's `pilot_total_xds_rejects{type="cds"}`.
async fn rejects(api: &str) -> Result<f64> {
    let text = crate::http()?.get(format!("{}/metrics", crate::base_url(api))).timeout(STEP).send().await?.text().await?;
    Ok(text.lines().find_map(|l| l.strip_prefix("pilot_total_xds_rejects{type=\"cds\"} ")?.trim().parse().ok()).unwrap_or(0.0))
}

/// A delta stream subscribing `names` EDS names of 60 bytes, 2,000 per
/// request, then held.
async fn subscribe(mut c: Client, i: usize, ns: &str, names: usize, gone: watch::Receiver<bool>) -> Outcome {
    let name = |n: usize| {
        let s = format!("outbound|8080||abuse-{i}-{n:08}.{ns}.svc.cluster.local");
        format!("{s}{}", "x".repeat(60usize.saturating_sub(s.len())))
    };
    let batch = |from: usize| DeltaDiscoveryRequest {
        type_url: ResourceType::Endpoint.type_url(),
        resource_names_subscribe: (from..(from + 2000).min(names)).map(name).collect(),
        ..Default::default()
    };
    let (tx, rx) = mpsc::channel(2);
    let mut first = batch(0);
    first.node = Some(node(i, ns));
    let _ = tx.send(first).await;
    let mut rx = match tokio::time::timeout(STEP, c.delta_aggregated_resources(ReceiverStream::new(rx))).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => return Outcome::Refused(s.code()),
        Err(_) => return Outcome::Refused(tonic::Code::DeadlineExceeded),
    };
    let mut from = 2000;
    loop {
        match tokio::time::timeout(STEP, rx.message()).await {
            Ok(Ok(Some(_))) => {}
            Ok(Err(s)) => return Outcome::Refused(s.code()),
            _ => return Outcome::Refused(tonic::Code::Unknown),
        }
        if from >= names {
            break;
        }
        let _ = tx.send(batch(from)).await;
        from += 2000;
    }
    hold(rx, tx, gone);
    Outcome::Served
}
