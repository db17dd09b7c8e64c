//! `lodestar-bench xds`: the push engine, measured with simulated Envoys
//! ([`crate::adsclient`]: one real ADS stream per proxy, ACKing everything).
//!
//! The mesh (every scenario): `--services` registry Services `svc-N` plus
//! one shared service `web`, in namespace `xdsbench`, each with one port
//! `http` 8080 and 1-2 Instances (web: 2). Proxies live in `--namespaces`
//! namespaces `xdsbench-pK` (proxy i in namespace i mod K, at its own
//! address 127.200.x.y); each namespace has a selector-less `Sidecar` whose
//! egress hosts name `--sidecar-hosts` services (namespace K: services
//! K·H .. K·H+H-1, modulo the count) plus `web` (in the first
//! `--web-percent` % of the namespaces: 100 by default, so every proxy sees
//! web). `web` has a VirtualService whose route sets a response header
//! carrying a mark. Every resource carries the label
//! `bench.lodestar.io/xds=true`; leftovers of an earlier run are deleted,
//! and the setup waits until every replica has applied it before a proxy
//! connects. Proxies are spread round-robin over the xDS addresses
//! (`--xds`, else every member's).
//!
//! Scenarios (each bounded in time and count; every write, stream and
//! proxy is checked, and any failure makes the run fail):
//! - **convergence**: `--repeat` writes of web's VirtualService, each with
//!   a new mark. Per write and affected proxy (one whose Sidecar names
//!   web): the time from the write's acknowledgement until the proxy
//!   ACKed an RDS response whose route configuration carries the new mark
//!   (0 when it did before the client had the acknowledgement; counted).
//!   Also: which proxies received any push in the round (the write until
//!   `--settle-ms` after the last affected proxy converged), by type.
//!   With `--rollback`, each write is a 20-resource change (web's
//!   VirtualService with a new mark and 19 VirtualServices of other
//!   services, not measured) followed by `lodestar rollback` to the
//!   revision before it (one write restoring the 20): measured from the
//!   rollback's acknowledgement until every affected proxy ACKed RDS with
//!   web's previous mark.
//! - **fanout**: for each count in `--proxies` (ascending; the fleet
//!   grows), `--repeat` endpoint changes of web (an Instance registered,
//!   then deleted, alternately): the time from the acknowledgement until
//!   the last affected proxy ACKed EDS with the change, and the bytes of
//!   the EDS responses the proxies received in the round.
//! - **idle**: `--proxies` streams to ONE replica (`--xds`, else the first
//!   member), `--streams-per-connection` (default 1, as Envoys) per
//!   HTTP/2 connection; the replica's RSS (`--pid`, VmRSS) before connecting
//!   (mesh applied) and after every proxy has its initial config and the
//!   streams sat idle for `--hold` seconds; RSS per stream = delta / N.
//! - **memory**: `--proxies` streams over every replica; each `--pid`'s RSS
//!   before and after, as for idle.
//! - **failover**: a reconnect storm. `--proxies` (default 2000) streams
//!   over the `--xds` replicas, round-robin, every one with its initial
//!   config; then the bench kill -9s the replica `--kill PID` (whose xDS
//!   address is `--kill-xds`, one of the `--xds`), and every proxy that was
//!   on it reconnects as an Envoy with a static xDS cluster of the
//!   replicas would: when its stream ends, after a random delay in
//!   [0, `--reconnect-jitter-ms`) (Envoy's first xDS retry: a jittered
//!   backoff with a 500 ms base), to a survivor (proxy i: survivor i mod
//!   the count; on failure the next one, with doubling backoff), opening a
//!   fresh stream that subscribes as at the start. Per moved proxy: from
//!   the kill until it has its whole config again from the survivor
//!   (p50/p99/max, target p99 <= 2 s), and the server's share, from its
//!   reconnect to that config. Proxies on the survivors must keep their
//!   streams.
//!
//! The last lines of every scenario are `result:` lines of `key=value`
//! pairs (numbers, or yes/no), for scripts.

use crate::adsclient::{self, Counts, Observer, Protocol, Proxy, ProxySpec, Update};
use crate::churn::{api_client, apply_all, clock_ticks, cpu_ticks, member_xds, mib, status_text, Percentiles};
use anyhow::{anyhow, bail, Context, Result};
use clap::{value_parser, Args};
use lodestar::cli::client::ApiClient;
use lodestar::proto::api::{ApplyItem, ApplyRequest, ClusterStatusRequest, DeleteRequest, ListRequest, ResourceRef};
use lodestar::xds::resources::ResourceType;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Every resource the bench writes carries this label (value `true`).
pub const LABEL: &str = "bench.lodestar.io/xds";
/// The services' namespace.
const MESH_NS: &str = "xdsbench";
/// Proxy namespaces are this plus their number.
const PROXY_NS: &str = "xdsbench-p";
const PORT: u16 = 8080;
const WEB: &str = "web";
/// The response header web's route sets; its value is the write's mark.
const MARK_HEADER: &str = "x-lodestar-bench-mark";
/// Each write call, setup writes included.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// Resources per setup request.
const SETUP_CHUNK: usize = 500;
/// Simultaneous connection attempts while the proxies connect.
const CONNECT_PARALLEL: usize = 64;
/// How long every replica may take to apply the setup.
const APPLY_WAIT: Duration = Duration::from_secs(60);
/// Before each write: no response for this long at any proxy (at most QUIET_MAX).
const QUIET: Duration = Duration::from_millis(300);
const QUIET_MAX: Duration = Duration::from_secs(10);

/// The targets the figures are reported against (not pass/fail).
pub const TARGET_P99_MS: f64 = 50.0;
/// Per idle stream, every stream over TLS (issue 20; it was 32 KiB for
/// plaintext streams).
pub const TARGET_STREAM_KIB: f64 = 40.0;
/// From the kill until the last-but-1% moved proxy has its config again.
pub const TARGET_FAILOVER_P99_MS: f64 = 2000.0;
pub const TARGET_REPLICA_MIB: f64 = 300.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// One VirtualService write at a time: ack → every affected proxy ACKed RDS with it.
    Convergence,
    /// One endpoint change at a time, to each fleet size: ack → last proxy ACKed EDS; EDS bytes.
    Fanout,
    /// Streams held idle on one replica: its RSS per stream.
    Idle,
    /// Streams over every replica with the whole mesh: each replica's RSS.
    Memory,
    /// Kill -9 one replica: the time until its proxies have their config
    /// again from the survivors.
    Failover,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Convergence => "convergence",
            Scenario::Fanout => "fanout",
            Scenario::Idle => "idle",
            Scenario::Memory => "memory",
            Scenario::Failover => "failover",
        }
    }

    fn default_proxies(self) -> Vec<u32> {
        match self {
            Scenario::Convergence => vec![1000],
            Scenario::Fanout => vec![1000, 5000],
            Scenario::Idle => vec![10_000],
            Scenario::Memory => vec![2000],
            Scenario::Failover => vec![2000],
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct XdsArgs {
    /// API URLs that writes go to, round-robin: the global `--server`,
    /// repeated (default http://127.0.0.1:8470).
    #[arg(skip)]
    pub servers: Vec<String>,
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// xDS address (HOST:PORT) of a replica, repeatable; proxies are spread
    /// round-robin. Default: every cluster member's (idle: the first).
    #[arg(long = "xds", value_name = "HOST:PORT")]
    pub xds: Vec<String>,
    /// Simulated proxies (fanout: a comma-separated list of fleet sizes).
    /// Default: convergence 1000, fanout 1000,5000, idle 10000, memory 2000.
    #[arg(long, value_delimiter = ',', value_parser = value_parser!(u32).range(1..=20_000))]
    pub proxies: Vec<u32>,
    /// Registry services besides `web`.
    #[arg(long, default_value_t = 1000, value_parser = value_parser!(u32).range(1..=20_000))]
    pub services: u32,
    /// Services each proxy namespace's Sidecar names (besides `web`).
    #[arg(long, default_value_t = 20, value_parser = value_parser!(u32).range(1..=1_000))]
    pub sidecar_hosts: u32,
    /// Proxy namespaces, each with its Sidecar (at most one per proxy).
    #[arg(long, default_value_t = 100, value_parser = value_parser!(u32).range(1..=20_000))]
    pub namespaces: u32,
    /// Share of the proxy namespaces whose Sidecar names `web`: only their
    /// proxies are affected by web's changes.
    #[arg(long, default_value_t = 100, value_parser = value_parser!(u32).range(0..=100))]
    pub web_percent: u32,
    /// Writes per scenario (convergence) or per fleet size (fanout).
    #[arg(long, default_value_t = 5, value_parser = value_parser!(u32).range(1..=1_000))]
    pub repeat: u32,
    /// convergence: measure rollbacks of 20-resource changes instead of
    /// single writes.
    #[arg(long)]
    pub rollback: bool,
    /// ADS variant the proxies speak.
    #[arg(long, value_enum, default_value_t = Protocol::Delta)]
    pub protocol: Protocol,
    /// ADS streams per HTTP/2 connection. Default: 1 (as Envoys).
    #[arg(long, value_parser = value_parser!(u32).range(1..=1_000))]
    pub streams_per_connection: Option<u32>,
    /// A replica's process id, repeatable: its RSS (idle: exactly one;
    /// memory: at least one) and CPU (convergence, fanout).
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Seconds a write may take to reach every affected proxy.
    #[arg(long, default_value_t = 30, value_parser = value_parser!(u64).range(1..=600))]
    pub timeout: u64,
    /// Milliseconds pushes are still counted after the last affected proxy
    /// converged (a push to an unaffected proxy may come later).
    #[arg(long, default_value_t = 500, value_parser = value_parser!(u64).range(0..=60_000))]
    pub settle_ms: u64,
    /// Seconds the streams stay idle before RSS is read (idle, memory).
    #[arg(long, default_value_t = 3, value_parser = value_parser!(u64).range(0..=600))]
    pub hold: u64,
    /// failover: the process id of the replica to kill -9.
    #[arg(long, value_name = "PID")]
    pub kill: Option<u32>,
    /// failover: that replica's xDS address (one of the `--xds`).
    #[arg(long, value_name = "HOST:PORT")]
    pub kill_xds: Option<String>,
    /// failover: a moved proxy reconnects after a random delay below this
    /// many milliseconds (Envoy's first retry: below 500 ms); 0: at once.
    #[arg(long, default_value_t = 500, value_parser = value_parser!(u64).range(0..=30_000))]
    pub reconnect_jitter_ms: u64,
}

// ---------------------------------------------------------------------------
// The mesh.

struct Plan {
    services: u32,
    hosts: u32,
    /// Proxy namespaces actually used: at most one per proxy.
    namespaces: u32,
    web_percent: u32,
}

fn labels() -> Value {
    json!({ LABEL: "true" })
}

fn hostname(service: &str) -> String {
    format!("{service}.{MESH_NS}.svc.cluster.local")
}

fn svc_name(s: u32) -> String {
    format!("svc-{s}")
}

/// Instance n's address: 127.128.0.0 + n.
fn instance_addr(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 128, 0, 0)) + n)
}

/// The address of fanout instance k: 127.160.0.0 + k.
fn fanout_addr(k: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 160, 0, 0)) + k)
}

/// Proxy i's own address: 127.200.0.0 + i + 1.
fn proxy_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 200, 0, 0)) + i as u32 + 1)
}

fn service_doc(name: &str) -> Value {
    json!({
        "apiVersion": "registry.lodestar.io/v1", "kind": "Service",
        "metadata": {"name": name, "namespace": MESH_NS, "labels": labels()},
        "spec": {"hostname": hostname(name), "ports": [{"name": "http", "number": PORT, "protocol": "HTTP"}]}
    })
}

fn instance_doc(name: &str, service: &str, addr: Ipv4Addr) -> Value {
    json!({
        "apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
        "metadata": {"name": name, "namespace": MESH_NS, "labels": labels()},
        "spec": {"service": service, "address": addr.to_string(), "port": PORT}
    })
}

fn fanout_name(k: u32) -> String {
    format!("{WEB}-fanout-{k}")
}

fn web_vs(mark: &str) -> Value {
    let host = hostname(WEB);
    json!({
        "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": WEB, "namespace": MESH_NS, "labels": labels()},
        "spec": {"hosts": [host], "http": [{
            "route": [{"destination": {"host": host, "port": {"number": PORT}}}],
            "headers": {"response": {"set": {MARK_HEADER: mark}}}
        }]}
    })
}

impl Plan {
    fn new(args: &XdsArgs, max_proxies: u32) -> Plan {
        Plan {
            services: args.services,
            hosts: args.sidecar_hosts.min(args.services),
            namespaces: args.namespaces.min(max_proxies),
            web_percent: args.web_percent,
        }
    }

    fn namespace(k: u32) -> String {
        format!("{PROXY_NS}{k}")
    }

    fn namespace_of(&self, proxy: usize) -> u32 {
        (proxy % self.namespaces as usize) as u32
    }

    fn sees_web(&self, namespace: u32) -> bool {
        (namespace as u64) * 100 < self.web_percent as u64 * self.namespaces as u64
    }

    fn affected(&self, proxy: usize) -> bool {
        self.sees_web(self.namespace_of(proxy))
    }

    fn spec(&self, i: usize, xds: &[String], protocol: Protocol) -> ProxySpec {
        let mut s = ProxySpec::new(i, xds[i % xds.len()].clone(), protocol);
        s.namespace = Self::namespace(self.namespace_of(i));
        s.ip = proxy_ip(i);
        s
    }

    fn sidecar_doc(&self, k: u32) -> Value {
        let mut hosts: Vec<String> = (0..self.hosts)
            .map(|i| format!("{MESH_NS}/{}", hostname(&svc_name(((k as u64 * self.hosts as u64 + i as u64) % self.services as u64) as u32))))
            .collect();
        if self.sees_web(k) {
            hosts.push(format!("{MESH_NS}/{}", hostname(WEB)));
        }
        json!({
            "apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
            "metadata": {"name": "default", "namespace": Self::namespace(k), "labels": labels()},
            "spec": {"egress": [{"hosts": hosts}]}
        })
    }

    /// Every resource of the mesh, in apply order; VirtualService last.
    fn docs(&self, mark: &str) -> Vec<Value> {
        let mut docs: Vec<Value> = (0..self.services).map(|s| service_doc(&svc_name(s))).collect();
        docs.push(service_doc(WEB));
        let mut n = 0;
        for s in 0..self.services {
            for j in 0..1 + s % 2 {
                n += 1;
                docs.push(instance_doc(&format!("{}-{j}", svc_name(s)), &svc_name(s), instance_addr(n)));
            }
        }
        for j in 0..2 {
            n += 1;
            docs.push(instance_doc(&format!("{WEB}-{j}"), WEB, instance_addr(n)));
        }
        docs.extend((0..self.namespaces).map(|k| self.sidecar_doc(k)));
        docs.push(web_vs(mark));
        docs
    }

    fn describe(&self) -> String {
        format!(
            "{} services + {WEB} (port http {PORT}, 1-2 instances each); {} proxy namespaces, each with a Sidecar naming {} services{}",
            self.services,
            self.namespaces,
            self.hosts,
            if self.web_percent == 100 { format!(" + {WEB}") } else { format!(" (+ {WEB} in {}% of them)", self.web_percent) }
        )
    }
}

// ---------------------------------------------------------------------------
// API helpers.

/// The bench's resources of `kind` in every namespace: (namespace, name).
async fn list_labelled(client: &mut ApiClient, kind: &str) -> Result<Vec<(String, String)>> {
    let req = ListRequest { kind: kind.into(), namespace: String::new(), label_selector: format!("{LABEL}=true"), consistency: 0 };
    let r = tokio::time::timeout(WRITE_TIMEOUT, client.list(req)).await.map_err(|_| anyhow!("list {kind}: no answer"))?.map_err(status_text)?.into_inner();
    r.resources_json
        .iter()
        .map(|j| {
            let v: Value = serde_json::from_str(j).context("a listed resource is not JSON")?;
            let s = |k: &str| v["metadata"][k].as_str().unwrap_or_default().to_string();
            Ok((s("namespace"), s("name")))
        })
        .collect()
}

async fn delete_refs(client: &mut ApiClient, kind: &str, refs: &[(String, String)]) -> Result<u64> {
    let mut revision = 0;
    for chunk in refs.chunks(SETUP_CHUNK) {
        let items = chunk.iter().map(|(ns, n)| ResourceRef { kind: kind.into(), namespace: ns.clone(), name: n.clone(), expected_revision: None }).collect();
        let r = tokio::time::timeout(WRITE_TIMEOUT, client.delete(DeleteRequest { items }))
            .await
            .map_err(|_| anyhow!("delete: no answer"))?
            .map_err(status_text)?;
        revision = revision.max(r.into_inner().revision);
    }
    Ok(revision)
}

/// Apply the mesh and delete the bench's other resources; the revision after.
async fn setup(client: &mut ApiClient, plan: &Plan, mark: &str) -> Result<u64> {
    let docs = plan.docs(mark);
    let key = |d: &Value| {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        (s(&d["kind"]), s(&d["metadata"]["namespace"]), s(&d["metadata"]["name"]))
    };
    let wanted: BTreeSet<(String, String, String)> = docs.iter().map(key).collect();
    let mut revision = apply_all(client, &docs).await.context("applying the mesh")?;
    for kind in ["VirtualService", "Sidecar", "Instance", "Service"] {
        let extra: Vec<(String, String)> =
            list_labelled(client, kind).await?.into_iter().filter(|(ns, n)| !wanted.contains(&(kind.to_string(), ns.clone(), n.clone()))).collect();
        revision = revision.max(delete_refs(client, kind, &extra).await.with_context(|| format!("deleting the {kind}s of an earlier run"))?);
    }
    Ok(revision)
}

/// Wait until every member has applied `revision`.
async fn wait_applied(client: &mut ApiClient, revision: u64) -> Result<()> {
    let start = Instant::now();
    loop {
        let r = tokio::time::timeout(WRITE_TIMEOUT, client.cluster_status(ClusterStatusRequest {})).await;
        let behind = match r {
            Ok(Ok(s)) => {
                let s = s.into_inner();
                let behind: Vec<String> = s.nodes.iter().filter(|n| n.revision < revision).map(|n| format!("node {} at {}", n.id, n.revision)).collect();
                if behind.is_empty() && !s.nodes.is_empty() {
                    return Ok(());
                }
                behind.join(", ")
            }
            Ok(Err(e)) => e.message().to_string(),
            Err(_) => "cluster status: no answer".to_string(),
        };
        if start.elapsed() > APPLY_WAIT {
            bail!("the replicas did not all apply revision {revision} within {APPLY_WAIT:?}: {behind}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------
// What the proxies saw.

enum Target {
    None,
    /// A route configuration carrying this mark (a literal: the search is
    /// a SIMD substring search, cheap next to receiving the response).
    Route(regex::bytes::Regex),
    /// web's cluster gaining (true) or losing this endpoint.
    Endpoint(SocketAddr, bool),
}

/// Per proxy, when it ACKed a response reflecting the current target.
struct Tracker {
    base: Instant,
    target: RwLock<Target>,
    /// web's EDS cluster, up to the domain: `outbound|8080||web.xdsbench.svc.`
    web_cluster: String,
    /// Nanoseconds since `base` + 1; 0: not yet.
    at: Vec<AtomicU64>,
    /// The version of that response (u64::MAX if not a number).
    version: Vec<AtomicU64>,
}

impl Target {
    fn route(mark: &str) -> Target {
        Target::Route(regex::bytes::Regex::new(&regex::escape(mark)).expect("an escaped literal is a regex"))
    }
}

impl Tracker {
    fn new(proxies: usize) -> Tracker {
        Tracker {
            base: Instant::now(),
            target: RwLock::new(Target::None),
            web_cluster: format!("outbound|{PORT}||{WEB}.{MESH_NS}.svc."),
            at: (0..proxies).map(|_| AtomicU64::new(0)).collect(),
            version: (0..proxies).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn arm(&self, target: Target) {
        let mut t = self.target.write().unwrap();
        for (a, v) in self.at.iter().zip(&self.version) {
            a.store(0, Ordering::Relaxed);
            v.store(0, Ordering::Relaxed);
        }
        *t = target;
    }

    fn at(&self, proxy: usize) -> Option<Instant> {
        match self.at[proxy].load(Ordering::Relaxed) {
            0 => None,
            n => Some(self.base + Duration::from_nanos(n - 1)),
        }
    }

    fn record(&self, u: &Update<'_>) {
        let n = u.acked.saturating_duration_since(self.base).as_nanos() as u64 + 1;
        if self.at[u.proxy].compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            // Not a number: not checked (u64::MAX is never below a revision).
            self.version[u.proxy].store(u.version.parse().unwrap_or(u64::MAX), Ordering::Relaxed);
        }
    }
}

impl Observer for Tracker {
    fn update(&self, u: &Update<'_>) {
        if u.proxy >= self.at.len() || self.at[u.proxy].load(Ordering::Relaxed) != 0 {
            return;
        }
        let hit = match &*self.target.read().unwrap() {
            Target::None => false,
            Target::Route(mark) => u.kind == ResourceType::Route && u.resources.iter().any(|r| mark.is_match(r)),
            Target::Endpoint(addr, present) => u.endpoints.iter().filter(|c| c.cluster.starts_with(&self.web_cluster)).any(|c| {
                if *present {
                    c.added.contains(addr)
                } else {
                    c.removed.contains(addr)
                }
            }),
        };
        if hit {
            self.record(u);
        }
    }
}

// ---------------------------------------------------------------------------
// Fleet helpers.

fn counts(fleet: &[Proxy]) -> Vec<Counts> {
    fleet.iter().map(Proxy::counts).collect()
}

fn total(counts: &[Counts]) -> Counts {
    let mut c = Counts::default();
    counts.iter().for_each(|x| c.add(x));
    c
}

fn first_error(fleet: &[Proxy]) -> Option<String> {
    fleet.iter().find_map(|p| p.error().map(|e| format!("bench-{}: {e}", p.index)))
}

async fn stop_all(fleet: Vec<Proxy>) -> Vec<adsclient::Final> {
    futures::future::join_all(fleet.into_iter().map(Proxy::stop)).await
}

/// What every scenario works with.
struct Bench<'a> {
    args: &'a XdsArgs,
    plan: Plan,
    xds: Vec<String>,
    /// One API client per `--server`: writes go round-robin.
    clients: Vec<ApiClient>,
    tracker: Arc<Tracker>,
    per_connection: u32,
    /// Unique to the run, so that the first write is a change whatever an
    /// earlier run left.
    run_id: String,
}

impl Bench<'_> {
    fn mark(&self, k: u32) -> String {
        format!("{}-{k}", self.run_id)
    }

    fn client(&self, k: u32) -> ApiClient {
        self.clients[k as usize % self.clients.len()].clone()
    }
}

/// Connect proxies up to `to` and wait until every proxy of the fleet has
/// its initial config; how long that took.
async fn grow(b: &Bench<'_>, fleet: &mut Vec<Proxy>, to: usize) -> Result<Duration> {
    let start = Instant::now();
    let specs = (fleet.len()..to).map(|i| b.plan.spec(i, &b.xds, b.args.protocol)).collect();
    let more = adsclient::connect_all_shared(specs, b.tracker.clone(), CONNECT_PARALLEL, b.per_connection as usize).await?;
    fleet.extend(more);
    let limit = Duration::from_secs(60) + Duration::from_millis(10) * to as u32;
    loop {
        if fleet.iter().all(Proxy::synced) {
            return Ok(start.elapsed());
        }
        if let Some(e) = first_error(fleet) {
            bail!("a proxy's stream ended before it had its initial config: {e}");
        }
        if start.elapsed() > limit {
            let n = fleet.iter().filter(|p| p.synced()).count();
            bail!("{n} of {} proxies had their initial config after {limit:?}", fleet.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until no proxy has received anything for QUIET (at most QUIET_MAX).
async fn quiet(fleet: &[Proxy]) -> bool {
    let start = Instant::now();
    let mut last = total(&counts(fleet));
    let mut since = Instant::now();
    while start.elapsed() < QUIET_MAX {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = total(&counts(fleet));
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() >= QUIET {
            return true;
        }
    }
    false
}

fn rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("reading /proc/{pid}/status"))?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).ok_or_else(|| anyhow!("/proc/{pid}/status has no VmRSS"))?;
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).ok_or_else(|| anyhow!("/proc/{pid}/status: unexpected VmRSS line {line:?}"))
}

/// Mean initial config per proxy, by type, as received.
fn config_line(fleet: &[Proxy]) -> String {
    let t = total(&counts(fleet));
    let n = fleet.len().max(1) as f64;
    let kib = |ty: ResourceType| t.of(ty).1 as f64 / n / 1024.0;
    format!(
        "initial config received per proxy (mean): {:.1} KiB (CDS {:.1}, EDS {:.1}, LDS {:.1}, RDS {:.1})",
        t.bytes.iter().sum::<u64>() as f64 / n / 1024.0,
        kib(ResourceType::Cluster),
        kib(ResourceType::Endpoint),
        kib(ResourceType::Listener),
        kib(ResourceType::Route)
    )
}

/// CPU clock ticks so far of each replica (`pids`), then of this process.
fn cpu_now(pids: &[u32]) -> Vec<Option<u64>> {
    pids.iter().copied().chain([std::process::id()]).map(|p| cpu_ticks(p).ok()).collect()
}

/// CPU the processes used during the rounds (each from its write to the
/// end of its settle time, so not the quiet waits between them).
fn cpu_lines(pids: &[u32], rounds: &[Round]) -> Vec<String> {
    let hz = clock_ticks() as f64;
    let wall: f64 = rounds.iter().map(|r| r.window.as_secs_f64()).sum();
    let n = rounds.len().max(1) as f64;
    let names = pids.iter().map(|p| format!("replica pid {p}")).chain(["bench client (this process)".to_string()]);
    names
        .enumerate()
        .map(|(i, who)| {
            let ticks: Option<u64> = rounds.iter().map(|r| r.cpu_ticks.get(i).copied().flatten()).sum();
            match ticks {
                Some(t) if wall > 0.0 => format!(
                    "cpu during the writes ({wall:.2}s, each write to the end of its settle time): {who:<28} {:>6.0} ms per write, {:>4.0}% of one core",
                    t as f64 / hz * 1000.0 / n,
                    100.0 * t as f64 / hz / wall
                ),
                _ => format!("cpu: {who}: not readable from /proc"),
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------
// One measured write.

struct Round {
    label: String,
    revision: u64,
    ack: Duration,
    affected: usize,
    converged: usize,
    /// Converged before the client had the write's acknowledgement.
    before_ack: usize,
    /// Per converged affected proxy: from the ack (0 if before), from the write's start.
    from_ack_us: Vec<u64>,
    from_start_us: Vec<u64>,
    /// Proxies that received anything in the round; of them, not affected.
    pushed: usize,
    pushed_unaffected: usize,
    received: Counts,
    /// From the write's start to the end of the settle time, and the CPU
    /// ticks each process (see `cpu_now`) used meanwhile.
    window: Duration,
    cpu_ticks: Vec<Option<u64>>,
    /// Reflecting responses whose version is below the write's revision.
    stale_versions: usize,
    quiet_before: bool,
}

impl Round {
    fn last_ms(&self) -> f64 {
        self.from_ack_us.iter().max().map_or(0.0, |&u| u as f64 / 1000.0)
    }

    fn line(&self) -> String {
        let p = Percentiles::of(self.from_ack_us.clone());
        let r = &self.received;
        format!(
            "{}: revision {}, ack {:.1} ms; affected {}, converged {} ({} before the ack); ack -> ACK p50 {:.2} p99 {:.2} max {:.2} ms; pushed {} proxies ({} unaffected): CDS {} LDS {} EDS {} ({}) RDS {} ({}){}",
            self.label,
            self.revision,
            self.ack.as_secs_f64() * 1000.0,
            self.affected,
            self.converged,
            self.before_ack,
            p.p50,
            p.p99,
            p.max,
            self.pushed,
            self.pushed_unaffected,
            r.of(ResourceType::Cluster).0,
            r.of(ResourceType::Listener).0,
            r.of(ResourceType::Endpoint).0,
            size(r.of(ResourceType::Endpoint).1 as f64),
            r.of(ResourceType::Route).0,
            size(r.of(ResourceType::Route).1 as f64),
            if self.quiet_before { "" } else { " [pushes were still arriving before the write]" }
        )
    }
}

/// Arm the tracker, run the write, wait until every affected proxy
/// reflects it (or the timeout, or its stream ended), let it settle.
async fn round<F>(b: &Bench<'_>, fleet: &[Proxy], target: Target, label: String, write: F) -> Result<Round>
where
    F: std::future::Future<Output = Result<u64>>,
{
    let (plan, tracker) = (&b.plan, &b.tracker);
    let (timeout, settle) = (Duration::from_secs(b.args.timeout), Duration::from_millis(b.args.settle_ms));
    let quiet_before = quiet(fleet).await;
    let before = counts(fleet);
    tracker.arm(target);
    let cpu_before = cpu_now(&b.args.pids);
    let start = Instant::now();
    let revision = tokio::time::timeout(WRITE_TIMEOUT, write).await.map_err(|_| anyhow!("no answer within {WRITE_TIMEOUT:?}")).and_then(|r| r)?;
    let acked = Instant::now();
    let affected: Vec<usize> = (0..fleet.len()).filter(|&i| plan.affected(i)).collect();
    let deadline = acked + timeout;
    loop {
        let pending = affected.iter().any(|&i| tracker.at(i).is_none() && fleet[i].error().is_none());
        if !pending || Instant::now() >= deadline {
            break;
        }
        // Only when to stop waiting: the times are the proxies' own.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(settle).await;
    let window = start.elapsed();
    let cpu_ticks = cpu_now(&b.args.pids).iter().zip(&cpu_before).map(|(now, then)| Some(now.as_ref()?.saturating_sub(*then.as_ref()?))).collect();
    let after = counts(fleet);
    let mut r = Round {
        label,
        revision,
        ack: acked - start,
        affected: affected.len(),
        converged: 0,
        before_ack: 0,
        from_ack_us: Vec::new(),
        from_start_us: Vec::new(),
        pushed: 0,
        pushed_unaffected: 0,
        received: Counts::default(),
        window,
        cpu_ticks,
        stale_versions: 0,
        quiet_before,
    };
    for &i in &affected {
        let Some(at) = tracker.at(i) else { continue };
        r.converged += 1;
        r.before_ack += (at < acked) as usize;
        r.from_ack_us.push(at.saturating_duration_since(acked).as_micros() as u64);
        r.from_start_us.push(at.saturating_duration_since(start).as_micros() as u64);
        r.stale_versions += (tracker.version[i].load(Ordering::Relaxed) < revision) as usize;
    }
    for (i, (a, b)) in after.iter().zip(&before).enumerate() {
        let d = a.since(b);
        if d.responses.iter().any(|&n| n > 0) {
            r.pushed += 1;
            r.pushed_unaffected += !plan.affected(i) as usize;
        }
        r.received.add(&d);
    }
    Ok(r)
}

/// A 20-resource change: web's VirtualService with `mark` and 19
/// VirtualServices of services 1..=19 (their own route, a header carrying
/// `mark`). Its revision.
async fn write_change(mut client: ApiClient, mark: String) -> Result<u64> {
    let mut docs = vec![web_vs(&mark)];
    for s in 1..=19 {
        let host = hostname(&svc_name(s));
        docs.push(json!({
            "apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": format!("rb-{s}"), "namespace": MESH_NS, "labels": labels()},
            "spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": host, "port": {"number": PORT}}}],
                     "headers": {"response": {"set": {MARK_HEADER: mark}}}}]}
        }));
    }
    let items = docs.into_iter().map(|d| ApplyItem { resource_json: d.to_string(), expected_revision: None }).collect();
    let r = client.apply(ApplyRequest { items, ..Default::default() }).await.map_err(status_text)?.into_inner();
    if r.items.len() != 20 || r.revision == 0 {
        bail!("the 20-resource change was not acknowledged whole: {} items at revision {}", r.items.len(), r.revision);
    }
    Ok(r.revision)
}

/// `lodestar rollback REV`: every object changed after `revision` back.
async fn write_rollback(mut client: ApiClient, revision: u64) -> Result<u64> {
    let req = lodestar::proto::api::RollbackRequest { revision, resources: Vec::new(), dry_run: false };
    let r = client.rollback(req).await.map_err(status_text)?.into_inner();
    if r.items.len() != 20 || r.revision <= revision + 1 {
        bail!("the rollback to revision {revision} restored {} objects at revision {}", r.items.len(), r.revision);
    }
    Ok(r.revision)
}

async fn write_vs(mut client: ApiClient, mark: String) -> Result<u64> {
    let item = ApplyItem { resource_json: web_vs(&mark).to_string(), expected_revision: None };
    let r = client.apply(ApplyRequest { items: vec![item], ..Default::default() }).await.map_err(status_text)?.into_inner();
    match r.items.first().map(|i| i.action.as_str()) {
        Some("configured" | "created") if r.revision > 0 => Ok(r.revision),
        other => bail!("VirtualService write not acknowledged as a change: {other:?} at revision {}", r.revision),
    }
}

async fn write_endpoint(mut client: ApiClient, k: u32, register: bool) -> Result<u64> {
    let (revision, action, want) = if register {
        // expectedRevision 0: it must not exist yet.
        let item = ApplyItem { resource_json: instance_doc(&fanout_name(k), WEB, fanout_addr(k)).to_string(), expected_revision: Some(0) };
        let r = client.apply(ApplyRequest { items: vec![item], ..Default::default() }).await.map_err(status_text)?.into_inner();
        (r.revision, r.items.first().map(|i| i.action.clone()), "created")
    } else {
        let item = ResourceRef { kind: "Instance".into(), namespace: MESH_NS.into(), name: fanout_name(k), expected_revision: None };
        let r = client.delete(DeleteRequest { items: vec![item] }).await.map_err(status_text)?.into_inner();
        (r.revision, r.items.first().map(|i| i.action.clone()), "deleted")
    };
    match action {
        Some(a) if a == want && revision > 0 => Ok(revision),
        other => bail!("{} of {} not acknowledged as {want}: {other:?} at revision {revision}", if register { "register" } else { "delete" }, fanout_name(k)),
    }
}

// ---------------------------------------------------------------------------
// The report.

/// What a run printed and found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub header: Vec<String>,
    pub lines: Vec<String>,
    /// `result:` lines: key=value pairs.
    pub results: Vec<Vec<(String, String)>>,
    /// Failures: any makes the run fail.
    pub problems: Vec<String>,
}

fn kv(k: &str, v: impl ToString) -> (String, String) {
    (k.to_string(), v.to_string())
}

/// A byte count for people: B, KiB or MiB.
fn size(bytes: f64) -> String {
    if bytes < 1024.0 {
        format!("{bytes:.0} B")
    } else if bytes < 1024.0 * 1024.0 {
        format!("{:.1} KiB", bytes / 1024.0)
    } else {
        mib(bytes)
    }
}

fn ms(v: f64) -> String {
    format!("{v:.2}")
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

impl Report {
    pub fn print(&self) {
        for l in self.header.iter().chain(&self.lines) {
            println!("{l}");
        }
        for r in &self.results {
            println!("result: {}", r.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
        }
        for p in &self.problems {
            println!("FAILED: {p}");
        }
    }

    /// Ok when nothing failed (targets are reported, not enforced).
    pub fn verdict(&self) -> Result<()> {
        if self.problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", self.problems.join("; "))
        }
    }
}

fn latency_table(lines: &mut Vec<String>, rows: &[(&str, Percentiles)]) {
    lines.push(format!("{:<40} {:>8} {:>10} {:>10} {:>10}", "latency (ms)", "count", "p50", "p99", "max"));
    for (name, p) in rows {
        lines.push(format!("{name:<40} {:>8} {:>10.2} {:>10.2} {:>10.2}", p.count, p.p50, p.p99, p.max));
    }
}

// ---------------------------------------------------------------------------
// The run.

pub async fn run(args: XdsArgs) -> Result<Report> {
    let servers = if args.servers.is_empty() { vec![lodestar::config::DEFAULT_SERVER_URL.to_string()] } else { args.servers.clone() };
    let proxies = if args.proxies.is_empty() { args.scenario.default_proxies() } else { args.proxies.clone() };
    if args.scenario != Scenario::Fanout && proxies.len() != 1 {
        bail!("--proxies: {} takes one number", args.scenario.name());
    }
    let per_connection = args.streams_per_connection.unwrap_or(1);
    match args.scenario {
        Scenario::Idle if args.pids.len() != 1 => bail!("idle: give the replica's process id, once (--pid)"),
        Scenario::Idle if args.xds.len() > 1 => bail!("idle: the streams go to one replica: give at most one --xds"),
        Scenario::Memory if args.pids.is_empty() => bail!("memory: give the replicas' process ids (--pid, repeatable)"),
        Scenario::Failover => match (&args.kill, &args.kill_xds) {
            (Some(_), Some(victim)) if args.xds.len() >= 2 && args.xds.contains(victim) => {}
            _ => bail!(
                "failover: give the replicas' xDS addresses (--xds, at least two), and the one to kill: --kill PID --kill-xds HOST:PORT (one of the --xds)"
            ),
        },
        _ => {}
    }
    let mut clients = Vec::with_capacity(servers.len());
    for s in &servers {
        clients.push(api_client(s).await?);
    }
    let mut admin = clients[0].clone();
    let mut xds = if args.xds.is_empty() { member_xds(&mut admin).await? } else { args.xds.clone() };
    if args.scenario == Scenario::Idle {
        xds.truncate(1);
    }
    let max = *proxies.iter().max().unwrap_or(&1);
    let plan = Plan::new(&args, max);
    let run_id = format!("{:x}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    let tracker = Arc::new(Tracker::new(max as usize));

    let mut report = Report::default();
    let proto = match args.protocol {
        Protocol::Delta => "delta",
        Protocol::Sotw => "sotw",
    };
    let counts_text = proxies.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    report.header.push(format!(
        "# lodestar-bench xds: scenario {}; {counts_text} proxies ({proto}, {per_connection} {} per HTTP/2 connection) over xDS {}; writes via {}",
        args.scenario.name(),
        if per_connection == 1 { "stream" } else { "streams" },
        xds.join(","),
        servers.join(",")
    ));
    report.header.push(format!("# mesh: {}", plan.describe()));
    report.header.push(format!("command: {}", crate::command_line()));
    let b = Bench { args: &args, plan, xds, clients, tracker, per_connection, run_id };

    let setup_start = Instant::now();
    let revision = setup(&mut admin, &b.plan, &b.mark(0)).await?;
    wait_applied(&mut admin, revision).await?;
    report.lines.push(format!("setup: revision {revision}, applied by every replica after {:.2}s", setup_start.elapsed().as_secs_f64()));

    let mut fleet = Vec::new();
    let outcome = match args.scenario {
        Scenario::Convergence => convergence(&b, &mut fleet, max, &mut report).await,
        Scenario::Fanout => fanout(&b, &mut fleet, &proxies, &mut report).await,
        Scenario::Idle | Scenario::Memory => memory(&b, &mut fleet, max, &mut report).await,
        Scenario::Failover => failover(&b, &mut fleet, max, &mut report).await,
    };
    if let Err(e) = outcome {
        report.problems.push(format!("{e:#}"));
    }
    let finals = stop_all(fleet).await;
    let ended: Vec<String> = finals.iter().filter_map(|f| f.error.as_ref().map(|e| format!("bench-{}: {e}", f.index))).collect();
    if let Some(first) = ended.first() {
        report.problems.push(format!("{} proxy streams ended or failed to stop (first: {first})", ended.len()));
    }
    if args.scenario == Scenario::Fanout {
        // Not measured: leave no fanout instance behind.
        let cleanup = async {
            let left: Vec<(String, String)> =
                list_labelled(&mut admin, "Instance").await?.into_iter().filter(|(_, n)| n.starts_with(&format!("{WEB}-fanout-"))).collect();
            delete_refs(&mut admin, "Instance", &left).await
        };
        if let Err(e) = cleanup.await {
            report.problems.push(format!("deleting the fanout instances: {e:#}"));
        }
    }
    Ok(report)
}

async fn convergence(b: &Bench<'_>, fleet: &mut Vec<Proxy>, n: u32, report: &mut Report) -> Result<()> {
    let (args, n) = (b.args, n as usize);
    let sync = grow(b, fleet, n).await?;
    report.lines.push(format!("{n} proxies connected and had their initial config after {:.2}s", sync.as_secs_f64()));
    report.lines.push(config_line(fleet));
    let mut rounds = Vec::new();
    for k in 1..=args.repeat {
        let m = b.mark(k);
        let target = Target::route(&m);
        let label = format!("write {k}/{}", args.repeat);
        let measured = if args.rollback {
            // The change (not counted), then its rollback to web's mark before.
            let changed = round(b, fleet, target, format!("change {k}/{}", args.repeat), write_change(b.client(k), m)).await;
            let revision = match changed {
                Ok(r) => r.revision,
                Err(e) => {
                    report.problems.push(format!("change {k}: {e:#}"));
                    break;
                }
            };
            let back = Target::route(&b.mark(0));
            round(b, fleet, back, format!("rollback {k}/{}", args.repeat), write_rollback(b.client(k), revision - 1)).await
        } else {
            round(b, fleet, target, label, write_vs(b.client(k), m)).await
        };
        match measured {
            Ok(r) => {
                report.lines.push(r.line());
                rounds.push(r);
            }
            Err(e) => {
                report.problems.push(format!("write {k}: {e:#}"));
                break;
            }
        }
    }
    report.lines.extend(cpu_lines(&args.pids, &rounds));
    let all = |f: fn(&Round) -> &Vec<u64>| Percentiles::of(rounds.iter().flat_map(|r| f(r).iter().copied()).collect());
    let (from_ack, from_start) = (all(|r| &r.from_ack_us), all(|r| &r.from_start_us));
    let acks = Percentiles::of(rounds.iter().map(|r| r.ack.as_micros() as u64).collect());
    latency_table(
        &mut report.lines,
        &[("write ack", acks), ("ack -> affected proxy ACKed RDS", from_ack), ("write start -> affected proxy ACKed RDS", from_start)],
    );
    let pairs: usize = rounds.iter().map(|r| r.affected).sum();
    let converged: usize = rounds.iter().map(|r| r.converged).sum();
    let pushed: Vec<usize> = rounds.iter().map(|r| r.pushed).collect();
    let unaffected_pushed: usize = rounds.iter().map(|r| r.pushed_unaffected).sum();
    let stale: usize = rounds.iter().map(|r| r.stale_versions).sum();
    let before_ack: usize = rounds.iter().map(|r| r.before_ack).sum();
    let affected = rounds.first().map_or(0, |r| r.affected);
    let met = from_ack.count > 0 && converged == pairs && from_ack.p99 <= TARGET_P99_MS;
    report.lines.push(format!(
        "over {} writes x {affected} affected proxies: {converged} of {pairs} (write, proxy) pairs converged ({before_ack} before the ack); proxies pushed per write: {:?} ({unaffected_pushed} pushes to unaffected proxies in all)",
        rounds.len(),
        pushed
    ));
    report.lines.push(format!("target: p99 ack -> ACK <= {TARGET_P99_MS} ms: {}", if met { "met" } else { "NOT met" }));
    if stale > 0 {
        report.problems.push(format!("{stale} route updates carried the new mark under a version older than the write's revision"));
    }
    if converged < pairs {
        report.problems.push(format!("{} (write, proxy) pairs not converged within {}s", pairs - converged, args.timeout));
    }
    report.results.push(vec![
        kv("scenario", "convergence"),
        kv("proxies", n),
        kv("affected", affected),
        kv("writes", rounds.len()),
        kv("pairs", pairs),
        kv("converged", converged),
        kv("p50_ms", ms(from_ack.p50)),
        kv("p99_ms", ms(from_ack.p99)),
        kv("max_ms", ms(from_ack.max)),
        kv("start_p99_ms", ms(from_start.p99)),
        kv("ack_p50_ms", ms(acks.p50)),
        kv("pushed_min", pushed.iter().min().copied().unwrap_or(0)),
        kv("pushed_max", pushed.iter().max().copied().unwrap_or(0)),
        kv("unaffected_pushed", unaffected_pushed),
        kv("target_p99_ms", TARGET_P99_MS),
        kv("target_met", yes(met)),
    ]);
    Ok(())
}

async fn fanout(b: &Bench<'_>, fleet: &mut Vec<Proxy>, sizes: &[u32], report: &mut Report) -> Result<()> {
    let args = b.args;
    let mut sizes = sizes.to_vec();
    sizes.sort_unstable();
    sizes.dedup();
    let mut k = 0u32;
    for &n in &sizes {
        let sync = grow(b, fleet, n as usize).await?;
        report.lines.push(format!("{n} proxies connected and had their initial config after {:.2}s", sync.as_secs_f64()));
        report.lines.push(config_line(fleet));
        let mut rounds = Vec::new();
        for w in 1..=args.repeat {
            // Odd writes register instance k+1, even ones delete it.
            let register = k.is_multiple_of(2);
            let inst = k / 2 + 1;
            k += 1;
            let target = Target::Endpoint(SocketAddr::new(IpAddr::V4(fanout_addr(inst)), PORT), register);
            let label = format!("{n} proxies, write {w}/{} ({} {})", args.repeat, if register { "register" } else { "delete" }, fanout_name(inst));
            match round(b, fleet, target, label, write_endpoint(b.client(k), inst, register)).await {
                Ok(r) => {
                    report.lines.push(r.line());
                    rounds.push(r);
                }
                Err(e) => {
                    report.problems.push(format!("{n} proxies, write {w}: {e:#}"));
                    break;
                }
            }
        }
        report.lines.extend(cpu_lines(&args.pids, &rounds));
        let last = Percentiles::of(rounds.iter().map(|r| (r.last_ms() * 1000.0) as u64).collect());
        let per_proxy = Percentiles::of(rounds.iter().flat_map(|r| r.from_ack_us.iter().copied()).collect());
        latency_table(&mut report.lines, &[("ack -> last affected proxy ACKed EDS", last), ("ack -> each affected proxy ACKed EDS", per_proxy)]);
        let writes = rounds.len().max(1) as f64;
        let eds_bytes: u64 = rounds.iter().map(|r| r.received.of(ResourceType::Endpoint).1).sum();
        let eds_responses: u64 = rounds.iter().map(|r| r.received.of(ResourceType::Endpoint).0).sum();
        let other: u64 = rounds
            .iter()
            .map(|r| r.received.of(ResourceType::Cluster).0 + r.received.of(ResourceType::Listener).0 + r.received.of(ResourceType::Route).0)
            .sum();
        let pairs: usize = rounds.iter().map(|r| r.affected).sum();
        let converged: usize = rounds.iter().map(|r| r.converged).sum();
        let affected = rounds.first().map_or(0, |r| r.affected);
        report.lines.push(format!(
            "{n} proxies: EDS bytes received per write {} ({:.0} bytes per affected proxy), {:.0} EDS responses per write; other types pushed: {other}; {converged} of {pairs} (write, proxy) pairs converged",
            size(eds_bytes as f64 / writes),
            eds_bytes as f64 / writes / affected.max(1) as f64,
            eds_responses as f64 / writes
        ));
        if converged < pairs {
            report.problems.push(format!("{n} proxies: {} (write, proxy) pairs not converged within {}s", pairs - converged, args.timeout));
        }
        report.results.push(vec![
            kv("scenario", "fanout"),
            kv("proxies", n),
            kv("affected", affected),
            kv("writes", rounds.len()),
            kv("converged", converged),
            kv("pairs", pairs),
            kv("last_p50_ms", ms(last.p50)),
            kv("last_max_ms", ms(last.max)),
            kv("proxy_p99_ms", ms(per_proxy.p99)),
            kv("eds_bytes_per_write", (eds_bytes as f64 / writes).round()),
            kv("eds_responses_per_write", (eds_responses as f64 / writes).round()),
            kv("other_pushes", other),
        ]);
    }
    Ok(())
}

/// idle and memory: RSS before and after the streams.
async fn memory(b: &Bench<'_>, fleet: &mut Vec<Proxy>, n: u32, report: &mut Report) -> Result<()> {
    let (args, xds, per_connection) = (b.args, &b.xds, b.per_connection);
    // Let the replicas settle after the setup writes.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = args.pids.iter().map(|&p| rss_kib(p)).collect::<Result<_>>()?;
    let client_before = rss_kib(std::process::id())?;
    let sync = grow(b, fleet, n as usize).await?;
    report.lines.push(format!("{n} proxies connected and had their initial config after {:.2}s", sync.as_secs_f64()));
    report.lines.push(config_line(fleet));
    tokio::time::sleep(Duration::from_secs(args.hold)).await;
    if let Some(e) = first_error(fleet) {
        bail!("a proxy's stream ended while idle: {e}");
    }
    let after: Vec<u64> = args.pids.iter().map(|&p| rss_kib(p)).collect::<Result<_>>()?;
    let client_after = rss_kib(std::process::id())?;
    let mib_of = |kib: u64| kib as f64 / 1024.0;
    for ((pid, b), a) in args.pids.iter().zip(&before).zip(&after) {
        report.lines.push(format!(
            "replica pid {pid}: RSS {:.1} MiB before the streams, {:.1} MiB with them (+{:.1} MiB)",
            mib_of(*b),
            mib_of(*a),
            (*a as f64 - *b as f64) / 1024.0
        ));
    }
    report.lines.push(format!(
        "bench client: RSS {:.1} MiB before, {:.1} MiB with {n} proxies ({:.1} KiB per proxy)",
        mib_of(client_before),
        mib_of(client_after),
        (client_after as f64 - client_before as f64) / n as f64
    ));
    if args.scenario == Scenario::Idle {
        let per = (after[0] as f64 - before[0] as f64) / n as f64;
        let met = per <= TARGET_STREAM_KIB;
        report.lines.push(format!(
            "RSS per stream: {per:.1} KiB ({n} streams on {} over {} connections); target <= {TARGET_STREAM_KIB} KiB: {}",
            xds[0],
            (n as usize).div_ceil(per_connection as usize),
            if met { "met" } else { "NOT met" }
        ));
        report.results.push(vec![
            kv("scenario", "idle"),
            kv("proxies", n),
            kv("streams_per_connection", per_connection),
            kv("rss_before_kib", before[0]),
            kv("rss_after_kib", after[0]),
            kv("per_stream_kib", format!("{per:.1}")),
            kv("client_per_proxy_kib", format!("{:.1}", (client_after as f64 - client_before as f64) / n as f64)),
            kv("target_kib", TARGET_STREAM_KIB),
            kv("target_met", yes(met)),
        ]);
    } else {
        let worst = after.iter().copied().max().unwrap_or(0);
        let met = mib_of(worst) <= TARGET_REPLICA_MIB;
        report.lines.push(format!(
            "largest replica RSS: {:.1} MiB; target <= {TARGET_REPLICA_MIB} MiB: {}",
            mib_of(worst),
            if met { "met" } else { "NOT met" }
        ));
        for ((pid, b), a) in args.pids.iter().zip(&before).zip(&after) {
            report.results.push(vec![
                kv("scenario", "memory"),
                kv("proxies", n),
                kv("pid", pid),
                kv("rss_before_mib", format!("{:.1}", mib_of(*b))),
                kv("rss_mib", format!("{:.1}", mib_of(*a))),
                kv("target_mib", TARGET_REPLICA_MIB),
                kv("target_met", yes(mib_of(*a) <= TARGET_REPLICA_MIB)),
            ]);
        }
    }
    Ok(())
}

/// One moved proxy's failover.
struct Moved {
    /// The replacement, on a survivor.
    proxy: Proxy,
    /// Kill -> its old stream ended; -> its new stream was open; -> it had
    /// its whole config again.
    ended: Duration,
    reconnected: Duration,
    synced: Duration,
    /// Connection attempts it took (1: the first survivor took it).
    attempts: u32,
}

/// How a moved proxy finds a survivor: after the jitter, survivor
/// `index mod n`, then the next ones, with doubling backoff (100 ms, at
/// most 2 s), until `deadline`.
async fn reconnect(specs: Vec<ProxySpec>, observer: Arc<dyn Observer>, jitter: Duration, deadline: Instant) -> Result<(Proxy, u32)> {
    if !jitter.is_zero() {
        let d = Duration::from_micros(rand::random::<u64>() % jitter.as_micros().max(1) as u64);
        tokio::time::sleep(d).await;
    }
    let mut backoff = Duration::from_millis(100);
    for attempt in 1.. {
        let spec = specs[(attempt as usize - 1) % specs.len()].clone();
        let xds = spec.xds.clone();
        match tokio::time::timeout_at(deadline.into(), Proxy::connect(spec, observer.clone())).await {
            Ok(Ok(p)) => return Ok((p, attempt)),
            Ok(Err(e)) if Instant::now() + backoff < deadline => {
                tracing::debug!("reconnect attempt {attempt} to {xds}: {e:#}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
            Ok(Err(e)) => return Err(e.context(format!("attempt {attempt}, the last before the deadline"))),
            Err(_) => bail!("no stream to a survivor by the deadline (attempt {attempt}, to {xds})"),
        }
    }
    unreachable!("the loop returns")
}

/// failover: kill -9 one replica under `n` synced proxies; the time until
/// each of its proxies has its config again from a survivor.
async fn failover(b: &Bench<'_>, fleet: &mut Vec<Proxy>, n: u32, report: &mut Report) -> Result<()> {
    let args = b.args;
    let (pid, victim) = (args.kill.expect("checked in run"), args.kill_xds.clone().expect("checked in run"));
    let survivors: Vec<String> = b.xds.iter().filter(|x| **x != victim).cloned().collect();
    let sync = grow(b, fleet, n as usize).await?;
    report.lines.push(format!("{n} proxies connected and had their initial config after {:.2}s", sync.as_secs_f64()));
    report.lines.push(config_line(fleet));
    tokio::time::sleep(Duration::from_secs(args.hold)).await;
    if let Some(e) = first_error(fleet) {
        bail!("a proxy's stream ended before the kill: {e}");
    }
    // The proxies on the victim leave the fleet; their replacements join it.
    let (on_victim, stay): (Vec<Proxy>, Vec<Proxy>) = std::mem::take(fleet).into_iter().partition(|p| b.xds[p.index % b.xds.len()] == victim);
    *fleet = stay;
    let moved_count = on_victim.len();
    if moved_count == 0 {
        bail!("no proxy was on {victim}");
    }
    let timeout = Duration::from_secs(args.timeout);
    let jitter = Duration::from_millis(args.reconnect_jitter_ms);
    let observer: Arc<dyn Observer> = b.tracker.clone();
    // Each moved proxy's candidate specs, survivors in its order.
    let plans: Vec<Vec<ProxySpec>> = on_victim
        .iter()
        .map(|p| {
            (0..survivors.len())
                .map(|k| {
                    let mut s = b.plan.spec(p.index, &b.xds, args.protocol);
                    s.xds = survivors[(p.index + k) % survivors.len()].clone();
                    s
                })
                .collect()
        })
        .collect();

    let killed = Instant::now();
    let deadline = killed + timeout;
    let status = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().context("running kill")?;
    if !status.success() {
        bail!("kill -KILL {pid} failed ({status})");
    }
    let tasks: Vec<_> = on_victim
        .into_iter()
        .zip(plans)
        .map(|(old, specs)| {
            let observer = observer.clone();
            tokio::spawn(async move {
                let index = old.index;
                let what = |e: anyhow::Error| e.context(format!("bench-{index}"));
                tokio::time::timeout_at(deadline.into(), old.ended())
                    .await
                    .map_err(|_| anyhow!("bench-{index}: its stream to the killed replica did not end"))?;
                let ended = killed.elapsed();
                // Its end is the point: not a problem to report.
                let _ = old.stop().await;
                let (proxy, attempts) = reconnect(specs, observer, jitter, deadline).await.map_err(what)?;
                let reconnected = killed.elapsed();
                let synced = tokio::select! {
                    t = proxy.synced_at() => t,
                    _ = proxy.ended() => bail!("bench-{index}: its new stream ended before it had its config: {}", proxy.error().unwrap_or_default()),
                    _ = tokio::time::sleep_until(deadline.into()) => bail!("bench-{index}: no whole config from the survivor within {timeout:?} of the kill"),
                };
                Ok(Moved { proxy, ended, reconnected, synced: synced.saturating_duration_since(killed), attempts })
            })
        })
        .collect();
    let mut moved = Vec::with_capacity(moved_count);
    let mut failures = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(m)) => moved.push(m),
            Ok(Err(e)) => failures.push(format!("{e:#}")),
            Err(e) => failures.push(format!("a reconnect task failed: {e}")),
        }
    }
    let all = killed.elapsed();
    // Proxies on the survivors must not have noticed.
    let disturbed = fleet.iter().filter(|p| p.error().is_some()).count();
    let first_disturbed = first_error(fleet);
    let us = |f: fn(&Moved) -> Duration| Percentiles::of(moved.iter().map(|m| f(m).as_micros() as u64).collect());
    let total = us(|m| m.synced);
    let server = Percentiles::of(moved.iter().map(|m| (m.synced - m.reconnected.min(m.synced)).as_micros() as u64).collect());
    let ended = us(|m| m.ended);
    let reconnected = us(|m| m.reconnected);
    let retried = moved.iter().filter(|m| m.attempts > 1).count();
    fleet.extend(moved.into_iter().map(|m| m.proxy));
    report.lines.push(format!(
        "killed pid {pid} (xDS {victim}) under {moved_count} of {n} proxies; they reconnected to {} after a random delay below {} ms; {} had their config again after {:.2}s, {retried} needed more than one attempt",
        survivors.join(" / "),
        args.reconnect_jitter_ms,
        moved_count - failures.len(),
        all.as_secs_f64()
    ));
    latency_table(
        &mut report.lines,
        &[
            ("kill -> old stream ended", ended),
            ("kill -> new stream open (jitter incl.)", reconnected),
            ("new stream open -> whole config", server),
            ("kill -> whole config again", total),
        ],
    );
    let met = failures.is_empty() && total.p99 <= TARGET_FAILOVER_P99_MS;
    report.lines.push(format!(
        "kill -> every moved proxy has its config again: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; target p99 <= {TARGET_FAILOVER_P99_MS:.0} ms: {}",
        total.p50,
        total.p99,
        total.max,
        if met { "met" } else { "NOT met" }
    ));
    report.results.push(vec![
        kv("scenario", "failover"),
        kv("proxies", n),
        kv("moved", moved_count),
        kv("recovered", moved_count - failures.len()),
        kv("jitter_ms", args.reconnect_jitter_ms),
        kv("p50_ms", ms(total.p50)),
        kv("p99_ms", ms(total.p99)),
        kv("max_ms", ms(total.max)),
        kv("server_p50_ms", ms(server.p50)),
        kv("server_p99_ms", ms(server.p99)),
        kv("server_max_ms", ms(server.max)),
        kv("retried", retried),
        kv("survivor_streams_ended", disturbed),
        kv("target_ms", TARGET_FAILOVER_P99_MS),
        kv("target_met", yes(met)),
    ]);
    if let Some(first) = failures.first() {
        report.problems.push(format!("{} of {moved_count} moved proxies did not get their config again (first: {first})", failures.len()));
    }
    if let Some(e) = first_disturbed {
        report.problems.push(format!("{disturbed} streams to the survivors ended after the kill (first: {e})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_have_defaults_and_bounds() {
        let Ok(crate::Command::Xds(a)) = crate::parse(["xds", "--scenario", "convergence", "--server", "http://127.0.0.1:1"]) else { panic!("xds flags") };
        assert_eq!(a.servers, ["http://127.0.0.1:1"]);
        assert_eq!((a.services, a.sidecar_hosts, a.namespaces, a.web_percent, a.repeat), (1000, 20, 100, 100, 5));
        assert!(a.proxies.is_empty() && a.streams_per_connection.is_none());
        let Ok(crate::Command::Xds(a)) = crate::parse(["xds", "--scenario", "fanout", "--proxies", "1000,5000"]) else { panic!("xds flags") };
        assert_eq!(a.proxies, vec![1000, 5000]);
        assert!(crate::parse(["xds", "--scenario", "idle", "--proxies", "0"]).is_err());
        assert!(crate::parse(["xds", "--proxies", "10"]).is_err(), "the scenario is required");
        assert!(crate::parse(["xds", "--scenario", "memory", "--web-percent", "101"]).is_err());
    }

    fn plan(services: u32, hosts: u32, namespaces: u32, web_percent: u32) -> Plan {
        Plan { services, hosts, namespaces, web_percent }
    }

    #[test]
    fn mesh_scoping() {
        let p = plan(10, 3, 4, 50);
        assert_eq!((0..4).filter(|&k| p.sees_web(k)).count(), 2);
        assert!(p.affected(0) && p.affected(5) && !p.affected(2) && !p.affected(7));
        let s = p.sidecar_doc(3);
        let hosts: Vec<&str> = s["spec"]["egress"][0]["hosts"].as_array().unwrap().iter().map(|h| h.as_str().unwrap()).collect();
        assert_eq!(
            hosts,
            ["xdsbench/svc-9.xdsbench.svc.cluster.local", "xdsbench/svc-0.xdsbench.svc.cluster.local", "xdsbench/svc-1.xdsbench.svc.cluster.local"]
        );
        assert!(plan(10, 3, 4, 100).sidecar_doc(3)["spec"]["egress"][0]["hosts"].as_array().unwrap().len() == 4);
        let docs = p.docs("m");
        // 10 services + web, 15 + 2 instances, 4 sidecars, 1 vs.
        assert_eq!(docs.len(), 11 + 17 + 4 + 1);
        for d in docs {
            let what = d.to_string();
            let r = lodestar::model::parse_resource(d, "default").unwrap_or_else(|e| panic!("{what}: {e:?}"));
            lodestar::model::validate_spec(&r).unwrap_or_else(|e| panic!("{what}: {e:?}"));
        }
        let spec = p.spec(6, &["a:1".into(), "b:2".into()], Protocol::Delta);
        assert_eq!((spec.xds.as_str(), spec.namespace.as_str(), spec.ip.to_string()), ("a:1", "xdsbench-p2", "127.200.0.7".into()));
    }

    #[test]
    fn marks_and_endpoints_are_tracked_per_proxy() {
        let t = Tracker::new(2);
        t.arm(Target::route("run-1"));
        let at = Instant::now();
        let up = |proxy, kind, resources: &[&[u8]], endpoints: &[adsclient::EndpointChange]| {
            t.update(&Update { proxy, kind, acked: at, version: "7", resources, endpoints });
        };
        up(0, ResourceType::Route, &[b"xx run-0 yy"], &[]);
        assert!(t.at(0).is_none());
        up(0, ResourceType::Route, &[b"a", b"xx run-1 yy"], &[]);
        up(1, ResourceType::Cluster, &[b"run-1"], &[]);
        assert!(t.at(0).is_some() && t.at(1).is_none(), "only RDS counts");
        assert_eq!(t.version[0].load(Ordering::Relaxed), 7);

        let addr: SocketAddr = "127.160.0.1:8080".parse().unwrap();
        t.arm(Target::Endpoint(addr, true));
        assert!(t.at(0).is_none(), "armed afresh");
        let change = |cluster: &str| adsclient::EndpointChange { cluster: cluster.into(), added: vec![addr], removed: vec![] };
        up(0, ResourceType::Endpoint, &[], &[change("outbound|8080||svc-1.xdsbench.svc.cluster.local")]);
        assert!(t.at(0).is_none(), "another cluster");
        up(0, ResourceType::Endpoint, &[], &[change("outbound|8080||web.xdsbench.svc.cluster.local")]);
        assert!(t.at(0).is_some());
    }
}
