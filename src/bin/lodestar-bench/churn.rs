//! `lodestar-bench churn`: endpoint churn under simulated Envoys.
//!
//! Setup: S registry Services (`churn-0` ..), I Instances each, all
//! labelled `bench.lodestar.io/churn=true` (leftovers of an earlier run are
//! deleted first); then P simulated proxies ([`crate::adsclient`]) connect,
//! spread over the xDS addresses, and the bench waits until every proxy has
//! every initial endpoint.
//!
//! Churn: changes alternate between registering an Instance (a new, unique
//! address) and deleting one of the same service, so counts stay bounded,
//! paced by a token bucket shared by the writers, for the duration. A
//! delete takes the oldest instance that every proxy already has (the
//! oldest acknowledged one if none has reached every proxy yet, keeping at
//! least one per service). Every write is checked: a register must come back
//! `created` (it is sent with expectedRevision 0), a delete `deleted`.
//!
//! Convergence, per change, is the time from the write call's start until
//! every proxy has received and ACKed an EDS update that reflects it:
//! - a register: the address is in the proxy's endpoints of its cluster;
//! - a delete: the address is gone from them, and the proxy's EDS state is
//!   at a revision at or after the delete's (a proxy that never saw the
//!   address must still have received EDS from a revision that includes the
//!   delete: before the register it was absent too);
//! - a register whose address was deleted before every proxy saw it (the
//!   server may coalesce both into one push, or none) is "superseded": it
//!   counts as reflected once its delete is, which bounds its time from
//!   above; the report counts them.
//!
//! The proxies report to one [`Tracker`], which keeps, per address, how many
//! proxies saw it appear and go and when the last one did, and per revision
//! since the churn began, how many proxies' EDS state reached it and when
//! the last one did: memory per address and per revision, not per proxy.
//! Changes not reflected everywhere by the end of the drain are reported as
//! not converged.
//!
//! Finally the proxies' endpoints are compared with the store's instances.

use crate::adsclient::{self, Counts, Observer, Protocol, Proxy, ProxySpec, Update};
use anyhow::{anyhow, bail, Context, Result};
use clap::{value_parser, Args};
use lodestar::cli::client::ApiClient;
use lodestar::proto::api::lodestar_client::LodestarClient;
use lodestar::proto::api::{ApplyItem, ApplyRequest, ClusterStatusRequest, DeleteRequest, ListRequest, ResourceRef};
use lodestar::xds::resources::ResourceType;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every resource the bench writes carries this label (value `true`).
pub const LABEL: &str = "bench.lodestar.io/churn";
const NAMESPACE: &str = "default";
/// The one service port, named `http`; instances listen on the same port.
pub const PORT: u16 = 8080;
/// Each write call, setup writes included.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// rate × duration is capped: every change is kept in memory.
const MAX_CHANGES: u64 = 1_000_000;
/// Resources per setup request.
const SETUP_CHUNK: usize = 500;
/// Simultaneous connection attempts while the proxies connect.
const CONNECT_PARALLEL: usize = 64;
/// Revisions tracked past the churn's start, at most.
const MAX_TRACKED_REVISIONS: u64 = 10 * MAX_CHANGES;

#[derive(Args, Debug, Clone)]
pub struct ChurnArgs {
    /// API URLs that writes go to, round-robin: the global `--server`,
    /// repeated (default http://127.0.0.1:8470).
    #[arg(skip)]
    pub servers: Vec<String>,
    /// xDS address (HOST:PORT) of a replica, repeatable; proxies are spread
    /// round-robin. Default: every cluster member's, asked from --server.
    #[arg(long = "xds", value_name = "HOST:PORT")]
    pub xds: Vec<String>,
    /// Simulated proxies, one ADS stream (and connection) each.
    #[arg(long, default_value_t = 100, value_parser = value_parser!(u32).range(1..=20_000))]
    pub proxies: u32,
    /// Registry services whose instances churn.
    #[arg(long, default_value_t = 20, value_parser = value_parser!(u32).range(1..=1_000))]
    pub services: u32,
    /// Instances per service at the start.
    #[arg(long, default_value_t = 3, value_parser = value_parser!(u32).range(1..=100))]
    pub instances: u32,
    /// Target instance changes per second (registers and deletes).
    #[arg(long, default_value_t = 1000, value_parser = value_parser!(u32).range(1..=100_000))]
    pub rate: u32,
    /// Seconds of churn (no change starts after it).
    #[arg(long, default_value_t = 10, value_parser = value_parser!(u64).range(1..=600))]
    pub duration: u64,
    /// Concurrent writer tasks (one API connection each).
    #[arg(long, default_value_t = 32, value_parser = value_parser!(u32).range(1..=1_024))]
    pub concurrency: u32,
    /// ADS variant the proxies speak.
    #[arg(long, value_enum, default_value_t = Protocol::Delta)]
    pub protocol: Protocol,
    /// A replica's process id, repeatable: its CPU (utime+stime from
    /// /proc/PID/stat) is reported as % of one core.
    #[arg(long = "pid")]
    pub pids: Vec<u32>,
    /// Seconds to wait after the churn for changes to reach every proxy.
    #[arg(long, default_value_t = 10, value_parser = value_parser!(u64).range(1..=600))]
    pub drain: u64,
}

// ---------------------------------------------------------------------------
// Naming.

fn service_name(s: u32) -> String {
    format!("churn-{s}")
}

/// Instance n's address: 127.64.0.0 + n (n < 2^22, see MAX_CHANGES).
fn address(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 64, 0, 0)) + n)
}

fn instance_name(s: u32, n: u32) -> String {
    format!("churn-{s}-{n}")
}

/// The service index of a churned cluster (`outbound|8080||churn-N.default.svc.DOMAIN`).
fn service_of(cluster: &str, services: u32) -> Option<u32> {
    let rest = cluster.strip_prefix(&format!("outbound|{PORT}||churn-"))?;
    let (index, rest) = rest.split_once('.')?;
    let s: u32 = index.parse().ok()?;
    (rest.starts_with(&format!("{NAMESPACE}.svc.")) && s < services).then_some(s)
}

fn service_doc(s: u32) -> Value {
    json!({
        "apiVersion": "registry.lodestar.io/v1", "kind": "Service",
        "metadata": {"name": service_name(s), "namespace": NAMESPACE, "labels": {LABEL: "true"}},
        "spec": {"ports": [{"name": "http", "number": PORT}]}
    })
}

fn instance_doc(s: u32, n: u32) -> Value {
    json!({
        "apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
        "metadata": {"name": instance_name(s, n), "namespace": NAMESPACE, "labels": {LABEL: "true"}},
        "spec": {"service": service_name(s), "address": address(n).to_string(), "port": PORT}
    })
}

// ---------------------------------------------------------------------------
// The tracker: what the proxies saw.

#[derive(Default, Clone, Copy)]
struct Seen {
    /// Proxies that saw the address appear, and when the last one did.
    present: u32,
    present_at: Option<Instant>,
    /// Proxies that saw it go, and when the last one did.
    gone: u32,
    gone_at: Option<Instant>,
}

struct Watermark {
    /// The revision the churn started from.
    base: u64,
    start: Instant,
    /// Index r - base - 1: proxies whose EDS state reached revision r, and
    /// when the last one did.
    reached: Vec<(u32, Option<Instant>)>,
}

struct TrackerState {
    addrs: HashMap<IpAddr, Seen>,
    /// Per proxy: the newest EDS version received.
    eds_version: Vec<u64>,
    watermark: Option<Watermark>,
}

/// Aggregates every proxy's EDS updates; see the module documentation.
pub struct Tracker {
    proxies: u32,
    services: u32,
    state: Mutex<TrackerState>,
}

fn later(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.max(b)))
}

impl Tracker {
    fn new(proxies: u32, services: u32) -> Tracker {
        Tracker { proxies, services, state: Mutex::new(TrackerState { addrs: HashMap::new(), eds_version: vec![0; proxies as usize], watermark: None }) }
    }

    /// From now on, track which revisions each proxy's EDS state reaches.
    fn start(&self, base: u64, start: Instant) {
        self.state.lock().unwrap().watermark = Some(Watermark { base, start, reached: Vec::new() });
    }

    fn seen(&self, ip: IpAddr) -> Seen {
        self.state.lock().unwrap().addrs.get(&ip).copied().unwrap_or_default()
    }

    /// Whether every proxy has this address.
    fn everywhere(&self, ip: IpAddr) -> bool {
        let s = self.seen(ip);
        s.present >= self.proxies && s.gone == 0
    }

    fn count_everywhere(&self, ips: &[IpAddr]) -> usize {
        let st = self.state.lock().unwrap();
        ips.iter().filter(|ip| st.addrs.get(ip).is_some_and(|s| s.present >= self.proxies)).count()
    }

    /// When every proxy's EDS state had reached revision r, if it has.
    fn reached(st: &TrackerState, proxies: u32, r: u64) -> Option<Instant> {
        let w = st.watermark.as_ref()?;
        if r <= w.base {
            return Some(w.start);
        }
        match w.reached.get((r - w.base - 1) as usize) {
            Some((n, at)) if *n >= proxies => *at,
            _ => None,
        }
    }

    /// When the change was reflected at every proxy, and whether it was a
    /// superseded register. `deleted_at`: the revision of the address's
    /// acknowledged delete, if any.
    fn converged(&self, c: &Change, deleted_at: Option<u64>) -> Option<(Instant, bool)> {
        let st = self.state.lock().unwrap();
        let seen = st.addrs.get(&IpAddr::V4(address(c.n))).copied().unwrap_or_default();
        let p = self.proxies;
        // Gone from everyone who had it, and every proxy's EDS state at or
        // after the delete.
        let delete_done = |r_del: u64| -> Option<Instant> {
            if seen.gone < seen.present {
                return None;
            }
            let all = if seen.present >= p { seen.gone_at? } else { Self::reached(&st, p, r_del)? };
            Some(seen.gone_at.map_or(all, |g| g.max(all)))
        };
        match c.op {
            Op::Register if seen.present >= p => Some((seen.present_at?, false)),
            Op::Register => deleted_at.and_then(delete_done).map(|t| (t, true)),
            Op::Delete => delete_done(c.revision).map(|t| (t, false)),
        }
    }
}

impl Observer for Tracker {
    fn update(&self, u: &Update<'_>) {
        if u.kind != ResourceType::Endpoint && u.endpoints.is_empty() {
            return;
        }
        let mut st = self.state.lock().unwrap();
        for ch in u.endpoints.iter().filter(|c| service_of(&c.cluster, self.services).is_some()) {
            for a in &ch.added {
                let s = st.addrs.entry(a.ip()).or_default();
                s.present += 1;
                s.present_at = later(s.present_at, u.acked);
            }
            for a in &ch.removed {
                let s = st.addrs.entry(a.ip()).or_default();
                s.gone += 1;
                s.gone_at = later(s.gone_at, u.acked);
            }
        }
        if u.kind != ResourceType::Endpoint {
            return;
        }
        let (Ok(v), Some(prev)) = (u.version.parse::<u64>(), st.eds_version.get(u.proxy).copied()) else { return };
        if v <= prev {
            return;
        }
        st.eds_version[u.proxy] = v;
        let Some(w) = st.watermark.as_mut() else { return };
        let from = prev.max(w.base);
        if v <= from || v - w.base > MAX_TRACKED_REVISIONS {
            return;
        }
        let need = (v - w.base) as usize;
        if w.reached.len() < need {
            w.reached.resize(need, (0, None));
        }
        for r in from + 1..=v {
            let e = &mut w.reached[(r - w.base - 1) as usize];
            e.0 += 1;
            e.1 = later(e.1, u.acked);
        }
    }
}

// ---------------------------------------------------------------------------
// Changes and writers.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Register,
    Delete,
}

#[derive(Clone, Debug)]
struct Change {
    op: Op,
    n: u32,
    start: Instant,
    end: Instant,
    /// The revision it committed at (0 when it failed).
    revision: u64,
    ok: bool,
}

/// A token bucket (GCRA): one token per interval, at most `burst` of
/// unused time banked, so writers that fell behind catch up by at most
/// `capacity` changes at once.
struct Pacer {
    interval: Duration,
    burst: Duration,
    next: Mutex<Instant>,
}

impl Pacer {
    fn new(rate: u32, capacity: u32, start: Instant) -> Pacer {
        let interval = Duration::from_secs_f64(1.0 / rate as f64);
        Pacer { interval, burst: interval * capacity, next: Mutex::new(start) }
    }

    /// Wait for the next token; false once it would come at or after `deadline`.
    async fn take(&self, deadline: Instant) -> bool {
        let at = {
            let mut next = self.next.lock().unwrap();
            let now = Instant::now();
            let at = (*next).max(now.checked_sub(self.burst).unwrap_or(now));
            if at >= deadline {
                return false;
            }
            *next = at + self.interval;
            at
        };
        tokio::time::sleep_until(at.into()).await;
        true
    }
}

struct Churn {
    pacer: Pacer,
    deadline: Instant,
    seq: AtomicU64,
    max_changes: u64,
    next_n: AtomicU32,
    services: u32,
    /// Per service: acknowledged live instances (their n), oldest first.
    live: Vec<Mutex<VecDeque<u32>>>,
    tracker: Arc<Tracker>,
}

/// One writer's results.
#[derive(Default)]
struct Written {
    changes: Vec<Change>,
    failed: u64,
    first_error: Option<String>,
}

pub(crate) fn status_text(s: tonic::Status) -> anyhow::Error {
    anyhow!("{}: {}", s.code(), s.message())
}

async fn register(client: &mut ApiClient, s: u32, n: u32) -> Result<u64> {
    // expectedRevision 0: it must not exist yet.
    let item = ApplyItem { resource_json: instance_doc(s, n).to_string(), expected_revision: Some(0) };
    let r = client.apply(ApplyRequest { items: vec![item], ..Default::default() }).await.map_err(status_text)?.into_inner();
    match r.items.first().map(|i| i.action.as_str()) {
        Some("created") if r.revision > 0 => Ok(r.revision),
        other => bail!("register of {} not acknowledged as created: {other:?} at revision {}", instance_name(s, n), r.revision),
    }
}

async fn delete(client: &mut ApiClient, s: u32, n: u32) -> Result<u64> {
    let item = ResourceRef { kind: "Instance".into(), namespace: NAMESPACE.into(), name: instance_name(s, n), expected_revision: None };
    let r = client.delete(DeleteRequest { items: vec![item] }).await.map_err(status_text)?.into_inner();
    match r.items.first().map(|i| i.action.as_str()) {
        Some("deleted") if r.revision > 0 => Ok(r.revision),
        other => bail!("delete of {} not acknowledged: {other:?} at revision {}", instance_name(s, n), r.revision),
    }
}

impl Churn {
    /// What change k is: registers and deletes alternate, services in turn.
    /// A delete takes the oldest instance every proxy has, else the oldest,
    /// and leaves at least one; with only one, it registers instead.
    fn pick(&self, k: u64) -> (Op, u32, u32) {
        let s = ((k / 2) % self.services as u64) as u32;
        if k % 2 == 1 {
            let mut q = self.live[s as usize].lock().unwrap();
            if q.len() > 1 {
                let i = q.iter().position(|&n| self.tracker.everywhere(IpAddr::V4(address(n)))).unwrap_or(0);
                if let Some(n) = q.remove(i) {
                    return (Op::Delete, s, n);
                }
            }
        }
        (Op::Register, s, self.next_n.fetch_add(1, Ordering::Relaxed))
    }

    async fn writer(self: Arc<Self>, mut client: ApiClient) -> Written {
        let mut out = Written::default();
        while self.pacer.take(self.deadline).await {
            let k = self.seq.fetch_add(1, Ordering::Relaxed);
            if k >= self.max_changes {
                break;
            }
            let (op, s, n) = self.pick(k);
            let start = Instant::now();
            let result = match op {
                Op::Register => tokio::time::timeout(WRITE_TIMEOUT, register(&mut client, s, n)).await,
                Op::Delete => tokio::time::timeout(WRITE_TIMEOUT, delete(&mut client, s, n)).await,
            };
            let end = Instant::now();
            let result = result.unwrap_or_else(|_| Err(anyhow!("no answer within {WRITE_TIMEOUT:?}")));
            let (ok, revision) = match result {
                Ok(rev) => {
                    if op == Op::Register {
                        self.live[s as usize].lock().unwrap().push_back(n);
                    }
                    (true, rev)
                }
                Err(e) => {
                    out.failed += 1;
                    out.first_error.get_or_insert_with(|| e.to_string());
                    (false, 0)
                }
            };
            out.changes.push(Change { op, n, start, end, revision, ok });
        }
        out
    }
}

// ---------------------------------------------------------------------------
// API helpers.

pub(crate) async fn api_client(server: &str) -> Result<ApiClient> {
    let base = crate::base_url(server);
    let ch = crate::grpc(&base, WRITE_TIMEOUT).await.with_context(|| format!("connecting to {base}"))?;
    Ok(LodestarClient::with_interceptor(ch, crate::bearer()?).max_decoding_message_size(256 * 1024 * 1024))
}

/// Names of the bench's resources of `kind` in the store.
async fn list_labelled(client: &mut ApiClient, kind: &str) -> Result<Vec<Value>> {
    let req = ListRequest { kind: kind.into(), namespace: NAMESPACE.into(), label_selector: format!("{LABEL}=true"), consistency: 0 };
    let r = tokio::time::timeout(WRITE_TIMEOUT, client.list(req)).await.map_err(|_| anyhow!("list {kind}: no answer"))?.map_err(status_text)?.into_inner();
    r.resources_json.iter().map(|j| serde_json::from_str(j).context("a listed resource is not JSON")).collect()
}

/// Apply `docs`, SETUP_CHUNK per request; the highest revision answered.
pub(crate) async fn apply_all(client: &mut ApiClient, docs: &[Value]) -> Result<u64> {
    let mut revision = 0;
    for chunk in docs.chunks(SETUP_CHUNK) {
        let items = chunk.iter().map(|d| ApplyItem { resource_json: d.to_string(), expected_revision: None }).collect();
        let r = tokio::time::timeout(WRITE_TIMEOUT, client.apply(ApplyRequest { items, ..Default::default() }))
            .await
            .map_err(|_| anyhow!("apply: no answer"))?
            .map_err(status_text)?;
        revision = revision.max(r.into_inner().revision);
    }
    Ok(revision)
}

async fn delete_all(client: &mut ApiClient, kind: &str, names: Vec<String>) -> Result<u64> {
    let mut revision = 0;
    for chunk in names.chunks(SETUP_CHUNK) {
        let items = chunk.iter().map(|n| ResourceRef { kind: kind.into(), namespace: NAMESPACE.into(), name: n.clone(), expected_revision: None }).collect();
        let r = tokio::time::timeout(WRITE_TIMEOUT, client.delete(DeleteRequest { items }))
            .await
            .map_err(|_| anyhow!("delete: no answer"))?
            .map_err(status_text)?;
        revision = revision.max(r.into_inner().revision);
    }
    Ok(revision)
}

fn name_of(doc: &Value) -> String {
    doc["metadata"]["name"].as_str().unwrap_or_default().to_string()
}

/// The store's bench instances: churned cluster → endpoint addresses.
async fn store_endpoints(client: &mut ApiClient, services: u32) -> Result<BTreeMap<u32, BTreeSet<SocketAddr>>> {
    let mut out: BTreeMap<u32, BTreeSet<SocketAddr>> = (0..services).map(|s| (s, BTreeSet::new())).collect();
    for doc in list_labelled(client, "Instance").await? {
        let svc = doc["spec"]["service"].as_str().unwrap_or_default();
        let Some(s) = svc.strip_prefix("churn-").and_then(|i| i.parse::<u32>().ok()).filter(|s| *s < services) else { continue };
        let ip: IpAddr = doc["spec"]["address"].as_str().unwrap_or_default().parse().context("an instance address")?;
        out.entry(s).or_default().insert(SocketAddr::new(ip, PORT));
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// CPU.

/// utime + stime of a process, in clock ticks.
pub(crate) fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold anything.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or_else(|| anyhow!("/proc/{pid}/stat: unexpected format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state): utime is field 14, stime field 15.
    let get = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).ok_or_else(|| anyhow!("/proc/{pid}/stat: no field {}", i + 3));
    Ok(get(11)? + get(12)?)
}

/// Clock ticks per second (AT_CLKTCK from the auxiliary vector; 100 if unreadable).
pub(crate) fn clock_ticks() -> u64 {
    const AT_CLKTCK: u64 = 17;
    let Ok(auxv) = std::fs::read("/proc/self/auxv") else { return 100 };
    auxv.chunks_exact(16)
        .map(|c| (u64::from_ne_bytes(c[..8].try_into().unwrap()), u64::from_ne_bytes(c[8..].try_into().unwrap())))
        .find(|(k, _)| *k == AT_CLKTCK)
        .map_or(100, |(_, v)| v.max(1))
}

/// CPU of one process over the churn, as % of one core.
#[derive(Debug, Clone)]
pub struct CpuUsage {
    /// None: the bench itself.
    pub pid: Option<u32>,
    /// While the writes ran.
    pub churn_pct: Option<f64>,
    /// From the churn's start to the end of the drain.
    pub with_drain_pct: Option<f64>,
    pub error: Option<String>,
}

struct CpuProbe {
    pid: Option<u32>,
    samples: Vec<Result<u64, String>>,
}

impl CpuProbe {
    fn sample(&mut self) {
        let pid = self.pid.unwrap_or_else(std::process::id);
        self.samples.push(cpu_ticks(pid).map_err(|e| e.to_string()));
    }

    fn usage(&self, hz: u64, churn: Duration, with_drain: Duration) -> CpuUsage {
        let pct = |a: usize, b: usize, wall: Duration| match (&self.samples[a], &self.samples[b]) {
            (Ok(x), Ok(y)) if wall > Duration::ZERO => Some(100.0 * y.saturating_sub(*x) as f64 / hz as f64 / wall.as_secs_f64()),
            _ => None,
        };
        let error = self.samples.iter().find_map(|s| s.as_ref().err().cloned());
        CpuUsage { pid: self.pid, churn_pct: pct(0, 1, churn), with_drain_pct: pct(0, 2, with_drain), error }
    }
}

// ---------------------------------------------------------------------------
// The run.

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub(crate) fn of(mut us: Vec<u64>) -> Percentiles {
        us.sort_unstable();
        let at = |p: f64| if us.is_empty() { 0.0 } else { us[((us.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0 };
        let mean = if us.is_empty() { 0.0 } else { us.iter().sum::<u64>() as f64 / us.len() as f64 / 1000.0 };
        Percentiles { count: us.len(), mean, p50: at(0.5), p99: at(0.99), max: at(1.0) }
    }
}

/// Everything a run measured.
#[derive(Debug, Clone)]
pub struct ChurnReport {
    pub proxies: u32,
    pub protocol: Protocol,
    pub services: u32,
    pub instances: u32,
    pub rate: u32,
    pub duration: Duration,
    pub concurrency: u32,
    pub servers: Vec<String>,
    pub xds: Vec<String>,
    /// Revision after setup, and how long the proxies took to connect and
    /// receive every initial endpoint.
    pub setup_revision: u64,
    pub setup_sync: Duration,
    pub attempted: u64,
    pub acknowledged: u64,
    pub failed: u64,
    pub first_error: Option<String>,
    pub registers: u64,
    pub deletes: u64,
    /// Acknowledged changes not reflected at every proxy by the end of the drain.
    pub not_converged: u64,
    /// Registers deleted before every proxy had seen them (see the module docs).
    pub superseded: u64,
    /// From the churn's start to the last write's answer.
    pub elapsed: Duration,
    /// From the churn's start to the end of the drain.
    pub elapsed_with_drain: Duration,
    pub write_latency: Percentiles,
    pub propagation: Percentiles,
    pub propagation_register: Percentiles,
    pub propagation_delete: Percentiles,
    /// Summed over proxies, from the churn's start to the end of the drain.
    pub received: Counts,
    pub cpu: Vec<CpuUsage>,
    /// Proxies whose stream ended on its own, and the first reason.
    pub proxy_errors: usize,
    pub first_proxy_error: Option<String>,
    /// Per proxy at the end: EDS cluster → endpoint addresses.
    pub final_endpoints: Vec<BTreeMap<String, Vec<SocketAddr>>>,
    /// The store's bench instances at the end: service index → addresses.
    pub store_endpoints: BTreeMap<u32, BTreeSet<SocketAddr>>,
    /// Proxies whose churned clusters differ from the store at the end.
    pub mismatched_proxies: usize,
    pub first_mismatch: Option<String>,
}

pub async fn run(args: ChurnArgs) -> Result<ChurnReport> {
    let ChurnArgs { servers, xds, proxies, services, instances, rate, duration, concurrency, protocol, pids, drain } = args;
    let servers = if servers.is_empty() { vec![lodestar::config::DEFAULT_SERVER_URL.to_string()] } else { servers };
    let duration = Duration::from_secs(duration);
    let max_changes = rate as u64 * duration.as_secs();
    if max_changes > MAX_CHANGES {
        bail!("--rate × --duration is {max_changes} changes; at most {MAX_CHANGES}");
    }

    // Writers' connections, round-robin over the servers.
    let mut clients = Vec::with_capacity(concurrency as usize);
    for i in 0..concurrency as usize {
        clients.push(api_client(&servers[i % servers.len()]).await?);
    }
    let mut admin = clients[0].clone();
    let xds = if xds.is_empty() { member_xds(&mut admin).await? } else { xds };

    // Setup: leftovers out, services and initial instances in.
    let stale: Vec<String> = list_labelled(&mut admin, "Instance").await?.iter().map(name_of).collect();
    let mut setup_revision = delete_all(&mut admin, "Instance", stale).await.context("deleting the instances of an earlier run")?;
    setup_revision = setup_revision.max(apply_all(&mut admin, &(0..services).map(service_doc).collect::<Vec<_>>()).await.context("applying the services")?);
    let wanted: BTreeSet<String> = (0..services).map(service_name).collect();
    let extra: Vec<String> = list_labelled(&mut admin, "Service").await?.iter().map(name_of).filter(|n| !wanted.contains(n)).collect();
    setup_revision = setup_revision.max(delete_all(&mut admin, "Service", extra).await.context("deleting the services of an earlier run")?);
    let next_n = AtomicU32::new(1);
    let mut live: Vec<VecDeque<u32>> = vec![VecDeque::new(); services as usize];
    let mut docs = Vec::new();
    for s in 0..services {
        for _ in 0..instances {
            let n = next_n.fetch_add(1, Ordering::Relaxed);
            live[s as usize].push_back(n);
            docs.push(instance_doc(s, n));
        }
    }
    setup_revision = setup_revision.max(apply_all(&mut admin, &docs).await.context("applying the initial instances")?);

    // Proxies: connect, then wait until each has every initial endpoint.
    let tracker = Arc::new(Tracker::new(proxies, services));
    let sync_start = Instant::now();
    let specs = (0..proxies as usize).map(|i| ProxySpec::new(i, xds[i % xds.len()].clone(), protocol)).collect();
    let fleet = adsclient::connect_all(specs, tracker.clone(), CONNECT_PARALLEL).await?;
    let initial: Vec<IpAddr> = live.iter().flatten().map(|&n| IpAddr::V4(address(n))).collect();
    let sync_limit = Duration::from_secs(60) + Duration::from_millis(10) * proxies;
    loop {
        let have = tracker.count_everywhere(&initial);
        if have == initial.len() {
            break;
        }
        let dead = fleet.iter().find_map(|p| p.error());
        if dead.is_some() || sync_start.elapsed() > sync_limit {
            let why = dead.map_or(format!("not within {sync_limit:?}"), |e| format!("a proxy's stream ended: {e}"));
            stop_all(fleet).await;
            bail!("setup: {have} of {} initial endpoints reached every proxy; {why}", initial.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let setup_sync = sync_start.elapsed();

    // Churn.
    let hz = clock_ticks();
    let mut probes: Vec<CpuProbe> = pids.iter().map(|&p| CpuProbe { pid: Some(p), samples: Vec::new() }).collect();
    probes.push(CpuProbe { pid: None, samples: Vec::new() });
    let received_before = total_counts(&fleet);
    probes.iter_mut().for_each(CpuProbe::sample);
    let start = Instant::now();
    tracker.start(setup_revision, start);
    let churn = Arc::new(Churn {
        pacer: Pacer::new(rate, concurrency, start),
        deadline: start + duration,
        seq: AtomicU64::new(0),
        max_changes,
        next_n,
        services,
        live: live.into_iter().map(Mutex::new).collect(),
        tracker: tracker.clone(),
    });
    let writers: Vec<_> = clients.into_iter().map(|c| tokio::spawn(churn.clone().writer(c))).collect();
    let (mut changes, mut failed, mut first_error) = (Vec::new(), 0, None);
    for w in writers {
        let w = w.await.context("a writer task failed")?;
        changes.extend(w.changes);
        failed += w.failed;
        if first_error.is_none() {
            first_error = w.first_error;
        }
    }
    let writes_done = Instant::now();
    probes.iter_mut().for_each(CpuProbe::sample);
    let elapsed = changes.iter().map(|c| c.end).max().unwrap_or(start).saturating_duration_since(start);

    // Drain: until every acknowledged change reached every proxy, or the limit.
    let deleted_at: HashMap<u32, u64> = changes.iter().filter(|c| c.ok && c.op == Op::Delete).map(|c| (c.n, c.revision)).collect();
    let mut pending: Vec<usize> = (0..changes.len()).filter(|&i| changes[i].ok).collect();
    let drain_deadline = writes_done + Duration::from_secs(drain);
    loop {
        pending.retain(|&i| tracker.converged(&changes[i], deleted_at.get(&changes[i].n).copied()).is_none());
        if pending.is_empty() || Instant::now() >= drain_deadline || fleet.iter().all(|p| p.error().is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let drained = Instant::now();
    probes.iter_mut().for_each(CpuProbe::sample);
    let received = total_counts(&fleet).since(&received_before);

    // Results.
    let (mut all, mut reg, mut del, mut writes_us) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut not_converged, mut superseded) = (0, 0);
    for c in changes.iter().filter(|c| c.ok) {
        writes_us.push(c.end.saturating_duration_since(c.start).as_micros() as u64);
        match tracker.converged(c, deleted_at.get(&c.n).copied()) {
            Some((at, sup)) => {
                let us = at.saturating_duration_since(c.start).as_micros() as u64;
                all.push(us);
                (if c.op == Op::Register { &mut reg } else { &mut del }).push(us);
                superseded += sup as u64;
            }
            None => not_converged += 1,
        }
    }
    let cpu = probes.iter().map(|p| p.usage(hz, writes_done - start, drained - start)).collect();

    let finals = stop_all(fleet).await;
    let proxy_errors = finals.iter().filter(|f| f.error.is_some()).count();
    let first_proxy_error = finals.iter().find_map(|f| f.error.clone().map(|e| format!("bench-{}: {e}", f.index)));
    let store = store_endpoints(&mut admin, services).await.context("listing the store's instances")?;
    let (mut mismatched_proxies, mut first_mismatch) = (0, None);
    for f in &finals {
        if let Some(m) = mismatch(&f.endpoints, &store, services) {
            mismatched_proxies += 1;
            first_mismatch.get_or_insert(format!("bench-{}: {m}", f.index));
        }
    }

    Ok(ChurnReport {
        proxies,
        protocol,
        services,
        instances,
        rate,
        duration,
        concurrency,
        servers,
        xds,
        setup_revision,
        setup_sync,
        attempted: changes.len() as u64,
        acknowledged: changes.iter().filter(|c| c.ok).count() as u64,
        failed,
        first_error,
        registers: changes.iter().filter(|c| c.op == Op::Register).count() as u64,
        deletes: changes.iter().filter(|c| c.op == Op::Delete).count() as u64,
        not_converged,
        superseded,
        elapsed,
        elapsed_with_drain: drained - start,
        write_latency: Percentiles::of(writes_us),
        propagation: Percentiles::of(all),
        propagation_register: Percentiles::of(reg),
        propagation_delete: Percentiles::of(del),
        received,
        cpu,
        proxy_errors,
        first_proxy_error,
        final_endpoints: finals.into_iter().map(|f| f.endpoints).collect(),
        store_endpoints: store,
        mismatched_proxies,
        first_mismatch,
    })
}

/// Every member's xDS address, from the cluster status.
pub(crate) async fn member_xds(client: &mut ApiClient) -> Result<Vec<String>> {
    let r = tokio::time::timeout(WRITE_TIMEOUT, client.cluster_status(ClusterStatusRequest {}))
        .await
        .map_err(|_| anyhow!("cluster status: no answer"))?
        .map_err(status_text)
        .context("asking the cluster for its members' xDS addresses (or pass --xds)")?;
    let addrs: Vec<String> = r.into_inner().members.into_iter().map(|m| m.xds_addr).filter(|a| !a.is_empty()).collect();
    if addrs.is_empty() {
        bail!("the cluster lists no member with an xDS address; pass --xds HOST:PORT");
    }
    Ok(addrs)
}

fn total_counts(fleet: &[Proxy]) -> Counts {
    let mut c = Counts::default();
    for p in fleet {
        c.add(&p.counts());
    }
    c
}

async fn stop_all(fleet: Vec<Proxy>) -> Vec<adsclient::Final> {
    futures::future::join_all(fleet.into_iter().map(Proxy::stop)).await
}

/// How a proxy's churned clusters differ from the store, if they do.
fn mismatch(view: &BTreeMap<String, Vec<SocketAddr>>, store: &BTreeMap<u32, BTreeSet<SocketAddr>>, services: u32) -> Option<String> {
    let mut have: BTreeMap<u32, BTreeSet<SocketAddr>> = (0..services).map(|s| (s, BTreeSet::new())).collect();
    for (cluster, addrs) in view {
        if let Some(s) = service_of(cluster, services) {
            have.entry(s).or_default().extend(addrs.iter().copied());
        }
    }
    let s = (0..services).find(|s| have.get(s) != store.get(s))?;
    let (h, w) = (have.get(&s).cloned().unwrap_or_default(), store.get(&s).cloned().unwrap_or_default());
    Some(format!(
        "{}: {} endpoints, store {}; missing {:?}, extra {:?}",
        service_name(s),
        h.len(),
        w.len(),
        w.difference(&h).collect::<Vec<_>>(),
        h.difference(&w).collect::<Vec<_>>()
    ))
}

// ---------------------------------------------------------------------------
// Output.

pub(crate) fn mib(bytes: f64) -> String {
    format!("{:.2} MiB", bytes / (1024.0 * 1024.0))
}

impl ChurnReport {
    pub fn print(&self) {
        let proto = match self.protocol {
            Protocol::Delta => "delta",
            Protocol::Sotw => "sotw",
        };
        println!(
            "# lodestar-bench churn: {} proxies ({proto}) over xDS {}; {} services x {} instances; target {}/s for {}s, {} writers (gRPC) to {}",
            self.proxies,
            self.xds.join(","),
            self.services,
            self.instances,
            self.rate,
            self.duration.as_secs(),
            self.concurrency,
            self.servers.join(",")
        );
        println!("command: {}", crate::command_line());
        println!("setup: revision {}, every proxy had every initial endpoint after {:.2}s", self.setup_revision, self.setup_sync.as_secs_f64());
        println!(
            "changes: attempted {} ({} registers, {} deletes), acknowledged {}, failed {}, not converged {}, superseded registers {}",
            self.attempted, self.registers, self.deletes, self.acknowledged, self.failed, self.not_converged, self.superseded
        );
        let sustained = self.sustained();
        println!("sustained: {sustained:.0} changes/s ({} acknowledged in {:.2}s)", self.acknowledged, self.elapsed.as_secs_f64());
        if sustained < 0.9 * self.rate as f64 && self.write_latency.mean > 0.0 {
            println!(
                "  below the target: {} writers at a mean write latency of {:.1} ms allow ~{:.0} changes/s (raise --concurrency, unless the cluster is the limit)",
                self.concurrency,
                self.write_latency.mean,
                self.concurrency as f64 * 1000.0 / self.write_latency.mean
            );
        }
        println!("{:<34} {:>8} {:>10} {:>10} {:>10}", "latency (ms)", "count", "p50", "p99", "max");
        for (name, p) in [
            ("write ack", &self.write_latency),
            ("write start -> all proxies ACKed", &self.propagation),
            ("  registers", &self.propagation_register),
            ("  deletes", &self.propagation_delete),
        ] {
            println!("{name:<34} {:>8} {:>10.2} {:>10.2} {:>10.2}", p.count, p.p50, p.p99, p.max);
        }
        let n = self.proxies.max(1) as f64;
        let (eds, eds_bytes) = self.received.of(ResourceType::Endpoint);
        println!(
            "received during churn+drain ({:.2}s): per proxy (mean) {:.1} EDS responses, {}; all proxies: EDS {eds}, CDS {}, LDS {}, RDS {}",
            self.elapsed_with_drain.as_secs_f64(),
            eds as f64 / n,
            mib(eds_bytes as f64 / n),
            self.received.of(ResourceType::Cluster).0,
            self.received.of(ResourceType::Listener).0,
            self.received.of(ResourceType::Route).0,
        );
        let total_bytes: u64 = self.received.bytes.iter().sum();
        println!(
            "bytes, all proxies: EDS {}, CDS {}, LDS {}, RDS {} (total {})",
            mib(eds_bytes as f64),
            mib(self.received.of(ResourceType::Cluster).1 as f64),
            mib(self.received.of(ResourceType::Listener).1 as f64),
            mib(self.received.of(ResourceType::Route).1 as f64),
            mib(total_bytes as f64)
        );
        let pct = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.0}%"));
        for c in &self.cpu {
            let who = c.pid.map_or("bench client (this process)".to_string(), |p| format!("replica pid {p}"));
            let err = c.error.as_ref().map(|e| format!("  ({e})")).unwrap_or_default();
            println!("cpu, % of one core: {who:<28} churn {:>6}   churn+drain {:>6}{err}", pct(c.churn_pct), pct(c.with_drain_pct));
        }
        println!("final: {} of {} proxies' endpoints match the store's {} instances", self.matching_proxies(), self.proxies, self.store_instances());
        if let Some(e) = &self.first_error {
            println!("first write error: {e}");
        }
        if let Some(e) = &self.first_proxy_error {
            println!("proxy streams ended: {} (first: {e})", self.proxy_errors);
        }
        if let Some(m) = &self.first_mismatch {
            println!("first mismatch: {m}");
        }
        println!("result: {}", self.result().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "));
    }

    /// Acknowledged changes per second of churn.
    fn sustained(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.acknowledged as f64 / secs
        } else {
            0.0
        }
    }

    /// Proxies whose endpoints matched the store's at the end.
    fn matching_proxies(&self) -> usize {
        self.final_endpoints.len() - self.mismatched_proxies.min(self.final_endpoints.len())
    }

    fn store_instances(&self) -> usize {
        self.store_endpoints.values().map(BTreeSet::len).sum()
    }

    /// The `result:` line's key=value pairs, for scripts: the figures above
    /// (CPU: % of one core during the churn, replicas in `--pid` order, `?` when
    /// unreadable, `-` when none).
    fn result(&self) -> Vec<(&'static str, String)> {
        let ms = |v: f64| format!("{v:.2}");
        let cpu = |c: &CpuUsage| c.churn_pct.map_or("?".to_string(), |v| format!("{v:.0}"));
        let list = |cs: Vec<&CpuUsage>| if cs.is_empty() { "-".to_string() } else { cs.into_iter().map(cpu).collect::<Vec<_>>().join(",") };
        let (replicas, client): (Vec<&CpuUsage>, Vec<&CpuUsage>) = self.cpu.iter().partition(|c| c.pid.is_some());
        vec![
            ("proxies", self.proxies.to_string()),
            ("attempted", self.attempted.to_string()),
            ("registers", self.registers.to_string()),
            ("deletes", self.deletes.to_string()),
            ("acknowledged", self.acknowledged.to_string()),
            ("failed", self.failed.to_string()),
            ("not_converged", self.not_converged.to_string()),
            ("superseded", self.superseded.to_string()),
            ("changes_per_s", format!("{:.0}", self.sustained())),
            ("write_p50_ms", ms(self.write_latency.p50)),
            ("write_p99_ms", ms(self.write_latency.p99)),
            ("propagated", self.propagation.count.to_string()),
            ("propagation_p50_ms", ms(self.propagation.p50)),
            ("propagation_p99_ms", ms(self.propagation.p99)),
            ("propagation_max_ms", ms(self.propagation.max)),
            ("eds_responses", self.received.of(ResourceType::Endpoint).0.to_string()),
            (
                "other_responses",
                [ResourceType::Cluster, ResourceType::Listener, ResourceType::Route].map(|t| self.received.of(t).0).iter().sum::<u64>().to_string(),
            ),
            ("proxy_errors", self.proxy_errors.to_string()),
            ("matching_proxies", self.matching_proxies().to_string()),
            ("store_instances", self.store_instances().to_string()),
            ("replica_cpu_pct", list(replicas)),
            ("client_cpu_pct", list(client)),
        ]
    }

    /// Ok when every change was acknowledged and reached every proxy and
    /// the proxies ended in agreement with the store.
    pub fn verdict(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.failed > 0 {
            problems.push(format!("{} writes not acknowledged", self.failed));
        }
        if self.not_converged > 0 {
            problems.push(format!("{} changes not converged", self.not_converged));
        }
        if self.proxy_errors > 0 {
            problems.push(format!("{} proxy streams ended", self.proxy_errors));
        }
        if self.mismatched_proxies > 0 {
            problems.push(format!("{} proxies disagree with the store", self.mismatched_proxies));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            bail!("{}", problems.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses() {
        assert_eq!(address(1).to_string(), "127.64.0.1");
        assert_eq!(address(256).to_string(), "127.64.1.0");
        assert_eq!(service_of("outbound|8080||churn-7.default.svc.cluster.local", 20), Some(7));
        assert_eq!(service_of("outbound|8080||churn-7.default.svc.cluster.local", 5), None);
        assert_eq!(service_of("outbound|8080|v1|churn-7.default.svc.cluster.local", 20), None);
        assert_eq!(service_of("outbound|8080||churn-7.other.svc.cluster.local", 20), None);
    }

    #[test]
    fn args_have_defaults_and_bounds() {
        let Ok(crate::Command::Churn(a)) = crate::parse(["churn", "--server", "http://127.0.0.1:1", "--server", "127.0.0.1:2"]) else { panic!("churn flags") };
        assert_eq!((a.proxies, a.services, a.instances, a.rate, a.duration, a.concurrency, a.drain), (100, 20, 3, 1000, 10, 32, 10));
        assert_eq!((a.servers.len(), a.protocol), (2, Protocol::Delta));
        assert!(crate::parse(["churn", "--proxies", "0"]).is_err());
        assert!(crate::parse(["churn", "--duration", "100000"]).is_err());
    }

    #[test]
    fn final_endpoints_are_compared_per_churned_service() {
        let sa = |n: u32| SocketAddr::new(IpAddr::V4(address(n)), PORT);
        let store: BTreeMap<u32, BTreeSet<SocketAddr>> = [(0, BTreeSet::from([sa(1), sa(2)])), (1, BTreeSet::from([sa(3)]))].into();
        let view = |per_service: &[&[u32]]| -> BTreeMap<String, Vec<SocketAddr>> {
            let cluster = |s: usize| format!("outbound|{PORT}||{}.{NAMESPACE}.svc.cluster.local", service_name(s as u32));
            per_service.iter().enumerate().map(|(s, ns)| (cluster(s), ns.iter().copied().map(sa).collect())).collect()
        };
        assert_eq!(mismatch(&view(&[&[2, 1], &[3]]), &store, 2), None);
        let mut other = view(&[&[1, 2], &[3]]);
        other.insert(format!("outbound|{PORT}||other.{NAMESPACE}.svc.cluster.local"), vec![sa(9)]);
        assert_eq!(mismatch(&other, &store, 2), None, "clusters of other services do not count");
        let m = mismatch(&view(&[&[1], &[3]]), &store, 2).expect("an endpoint missing");
        assert!(m.starts_with("churn-0: 1 endpoints, store 2; missing [127.64.0.2:8080]"), "{m}");
        let m = mismatch(&view(&[&[1, 2], &[3, 4]]), &store, 2).expect("an endpoint too many");
        assert!(m.starts_with("churn-1:") && m.ends_with("extra [127.64.0.4:8080]"), "{m}");
        assert!(mismatch(&view(&[&[1, 2]]), &store, 2).is_some(), "a service's cluster missing");
    }

    fn change(op: Op, n: u32, revision: u64, start: Instant) -> Change {
        Change { op, n, start, end: start, revision, ok: true }
    }

    fn eds(t: &Tracker, proxy: usize, version: u64, at: Instant, added: &[u32], removed: &[u32]) {
        let sa = |n: &u32| SocketAddr::new(IpAddr::V4(address(*n)), PORT);
        let ch = adsclient::EndpointChange {
            cluster: "outbound|8080||churn-0.default.svc.cluster.local".into(),
            added: added.iter().map(sa).collect(),
            removed: removed.iter().map(sa).collect(),
        };
        let v = version.to_string();
        t.update(&Update { proxy, kind: ResourceType::Endpoint, acked: at, version: &v, resources: &[], endpoints: &[ch] });
    }

    #[test]
    fn convergence_needs_every_proxy() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let t = Tracker::new(2, 1);
        t.start(10, t0);
        let (reg, del) = (change(Op::Register, 5, 11, t0), change(Op::Delete, 5, 12, t0));
        eds(&t, 0, 11, ms(1), &[5], &[]);
        assert!(t.converged(&reg, Some(12)).is_none(), "one proxy of two");
        eds(&t, 1, 11, ms(3), &[5], &[]);
        assert_eq!(t.converged(&reg, Some(12)), Some((ms(3), false)));
        eds(&t, 0, 12, ms(4), &[], &[5]);
        assert!(t.converged(&del, None).is_none());
        eds(&t, 1, 12, ms(6), &[], &[5]);
        assert_eq!(t.converged(&del, None), Some((ms(6), false)));

        // Registered and deleted before proxy 1 saw it: both are reflected
        // once proxy 1's EDS state is at the delete's revision.
        let (reg, del) = (change(Op::Register, 6, 13, t0), change(Op::Delete, 6, 14, t0));
        eds(&t, 0, 13, ms(7), &[6], &[]);
        eds(&t, 0, 14, ms(8), &[], &[6]);
        assert!(t.converged(&del, None).is_none());
        eds(&t, 1, 13, ms(9), &[], &[]);
        assert!(t.converged(&del, None).is_none(), "proxy 1 is not at revision 14 yet");
        eds(&t, 1, 15, ms(10), &[], &[]);
        assert_eq!(t.converged(&del, None), Some((ms(10), false)));
        assert_eq!(t.converged(&reg, Some(14)), Some((ms(10), true)));
    }
}
