//! Jepsen's method on this machine: three (or five) replicas, each in its
//! own network namespace (its own address, 198.18.0.N, on a bridge in a
//! hub namespace; nothing routes out), clients on every replica doing
//! blind writes, compare-and-set, deletes and linearizable reads on a few
//! keys, while a nemesis injects one fault at a time and heals it: the
//! leader cut off (iptables inside its namespace), the leader paused
//! (SIGSTOP/SIGCONT), a replica killed (-9, then restarted), a bridge
//! partition (two sides that do not see each other, one replica seeing
//! both), a one-way partition (the leader hears its peers, they do not
//! hear it), a minority with the leader split from the majority, 20%
//! packet loss between all replicas, a member removed (the leader too)
//! under that loss and added back, with its data or replaced by an empty
//! replica under a new id, and a full disk (each replica's data is on a
//! tmpfs of its own; one is filled until its replica stops, then freed and
//! the replica restarted).
//! Every operation is recorded with its invocation and completion time;
//! one without an answer is indeterminate, never a failure. Then:
//! - every key's history is linearizable (`support/linearizability.rs`), which the
//!   final reads through every replica make a check that no acknowledged
//!   write was lost;
//! - every replica ends with the same revision and the same objects, at
//!   least the highest revision acknowledged;
//! - watches: a watcher on every replica follows the namespace from
//!   revision 0 through the whole run, re-watching from the last revision
//!   it saw whenever its stream breaks (kill -9, partition). What all its
//!   streams delivered, joined, must be exactly the history (every change
//!   once, in revision order, none missing up to the final revision), or
//!   end with `Compacted`; revisions never go backwards on a stream;
//! - revisions are one history: after the run, a fresh watch from 0
//!   through every replica must return the same changes at the same
//!   revisions (strictly increasing: one object per transaction here);
//! - registry health: an Instance (`ttl` 15 s) heartbeated every 500 ms
//!   through whichever replica answers was never expired: its modRevision
//!   is its registration's and it has no health status.
//!
//! - membership: after healing, every replica is a voter under its
//!   current id; no replica exited by itself except one whose disk filled.
//!
//! `LODESTAR_FAULTS=membership,disk` runs only the faults named (see
//! `FAULTS`); `LODESTAR_FAULT_KEEP=1` keeps a passing run's history and
//! logs too.
//!
//! To see that it can fail: `LODESTAR_FAULT_PLANT=stale-reads` makes the
//! clients read with `consistency=stale` (a replica's own applied state)
//! while the checker still expects linearizable reads.
//!
//! The suite runs a short run (`LODESTAR_FAULT_SECS`, 25 s of faults by
//! default); `benches/faults.sh` runs long ones. Needs root (namespaces,
//! iptables); without it the test says so and passes without checking
//! anything. A failing run keeps its history and the replicas' logs
//! (printed path) and prints the anomaly.

#[path = "../support/linearizability.rs"]
mod checker;
use crate::kit;

use checker::{Call, Op, Outcome};
use kit::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
/// The nemesis's faults, in the order it takes them.
const FAULTS: [&str; 9] = ["partition", "pause", "kill", "bridge", "one-way", "split", "loss", "membership", "disk"];
const NAMESPACE: &str = "faults";
/// Replicas in the run: `LODESTAR_FAULT_REPLICAS`, 3 by default (up to 9).
fn replica_count() -> u64 {
    std::env::var("LODESTAR_FAULT_REPLICAS").ok().and_then(|s| s.parse().ok()).filter(|n| (1..=9).contains(n)).unwrap_or(3)
}
const CLIENTS_PER_REPLICA: usize = 2;
/// A client gives up on an operation after this: indeterminate.
const OP_TIMEOUT: Duration = Duration::from_secs(5);

/// Run a command; its stdout. Panics with its stderr on failure.
fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn ns_exec(ns: &str, args: &[&str]) -> String {
    let mut all = vec!["ip", "netns", "exec", ns];
    all.extend_from_slice(args);
    sh(&all)
}

/// Why namespaces cannot be used here, if they cannot.
fn netns_unavailable() -> Option<String> {
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: network namespaces and iptables need root".into());
    }
    for tool in [["ip", "-V"], ["iptables", "--version"]] {
        if Command::new(tool[0]).arg(tool[1]).output().map(|o| !o.status.success()).unwrap_or(true) {
            return Some(format!("`{}` is not installed (tests/run installs iproute2 and iptables)", tool[0]));
        }
    }
    let probe = format!("lsf{:x}-probe", std::process::id());
    let ok = Command::new("ip").args(["netns", "add", &probe]).status().map(|s| s.success()).unwrap_or(false);
    let _ = Command::new("ip").args(["netns", "del", &probe]).status();
    (!ok).then(|| "`ip netns add` failed: no network namespaces here".into())
}

/// The namespaces of one run: `lsf<pid>-h` (the hub with the bridge),
/// `lsf<pid>-n<i>` (replica i at 198.18.0.i), `lsf<pid>-c` (the clients,
/// 198.18.0.100). Dropped: every process inside is killed and the
/// namespaces deleted (their veths go with them). Namespaces left by a run
/// whose process is gone are removed first.
struct Net {
    prefix: String,
    names: Vec<String>,
}

impl Net {
    fn create() -> Net {
        remove_stale();
        let prefix = format!("lsf{:x}", std::process::id());
        let mut net = Net { prefix: prefix.clone(), names: Vec::new() };
        let hub = net.add("h");
        ns_exec(&hub, &["ip", "link", "add", "br0", "type", "bridge"]);
        ns_exec(&hub, &["ip", "link", "set", "br0", "up"]);
        let mut attach = |role: String, host: u32| {
            let ns = net.add(&role);
            let (inner, outer) = (format!("v{}{role}", &prefix[3..]), format!("h{}{role}", &prefix[3..]));
            sh(&["ip", "link", "add", &inner, "netns", &ns, "type", "veth", "peer", "name", &outer, "netns", &hub]);
            ns_exec(&ns, &["ip", "addr", "add", &format!("198.18.0.{host}/24"), "dev", &inner]);
            ns_exec(&ns, &["ip", "link", "set", &inner, "up"]);
            ns_exec(&hub, &["ip", "link", "set", &outer, "master", "br0", "up"]);
        };
        for i in 1..=replica_count() {
            attach(format!("n{i}"), i as u32);
        }
        attach("c".into(), 100);
        net
    }

    fn add(&mut self, role: &str) -> String {
        let name = format!("{}-{role}", self.prefix);
        sh(&["ip", "netns", "add", &name]);
        self.names.push(name.clone());
        ns_exec(&name, &["ip", "link", "set", "lo", "up"]);
        name
    }

    fn node(&self, id: u64) -> String {
        format!("{}-n{id}", self.prefix)
    }

    fn client(&self) -> String {
        format!("{}-c", self.prefix)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in self.names.iter().rev() {
            delete_namespace(ns);
        }
    }
}

fn delete_namespace(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
}

fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(pid) = name.strip_prefix("lsf").and_then(|rest| rest.split('-').next()).and_then(|p| u32::from_str_radix(p, 16).ok()) else { continue };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            delete_namespace(name);
        }
    }
}

/// Run `f` on a thread whose network namespace is `ns` (sockets it opens
/// live there), on a runtime of its own.
fn in_netns<T: Send + 'static, F: std::future::Future<Output = T>>(ns: &str, f: impl FnOnce() -> F + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    let handle = std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f())
    });
    match handle.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

struct NsReplica {
    /// Its namespace and address (198.18.0.id).
    id: u64,
    /// Its id in the cluster: `id` until it is replaced (removed, wiped,
    /// added back empty under a new id, as etcd's runbook replaces a
    /// member).
    raft_id: u64,
    /// Started with `--join` (a replacement), not as a founding member.
    join: bool,
    /// Removed from the cluster by the nemesis, not yet added back.
    removed: bool,
    ns: String,
    dir: PathBuf,
    child: Option<Proc>,
}

/// The file that fills a replica's filesystem (the disk-full fault).
const FILL: &str = "fill";

impl NsReplica {
    /// Its data directory: a tmpfs of its own (see [`Disks`]).
    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }
    fn ip(&self) -> String {
        format!("198.18.0.{}", self.id)
    }
    fn api(&self) -> String {
        format!("https://{}:7000", self.ip())
    }
    fn member_flag(&self) -> String {
        let ip = self.ip();
        format!("{}={ip}:7001,{ip}:7000,{ip}:7002", self.raft_id)
    }

    /// The body that adds it to the cluster (`POST /v1/cluster/members`).
    fn member_body(&self) -> Value {
        let ip = self.ip();
        json!({"id": self.raft_id, "raftAddr": format!("{ip}:7001"), "apiAddr": format!("{ip}:7000"), "xdsAddr": format!("{ip}:7002")})
    }

    fn spawn(&mut self, members: &[String]) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let config = self.dir.join("lodestar.toml");
        let token = format!("initial_management_token_file = {:?}\n", test_ca().token_file);
        // The whole run's history is kept (the default keeps the last
        // 10,000 revisions, which a long run exceeds): the final watch from
        // revision 0 is the history every other check is made against.
        std::fs::write(
            &config,
            format!("heartbeat_ms = 100\nelection_timeout_min_ms = 600\nelection_timeout_max_ms = 1200\nhistory_revisions = 100000000\n{}{token}", tls_toml()),
        )
        .unwrap();
        let ip = self.ip();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, BIN, "server", "--config"])
            .arg(&config)
            .args(["--id", &self.raft_id.to_string(), "--data-dir"])
            .arg(self.data())
            .args(["--api-addr", &format!("{ip}:7000"), "--raft-addr", &format!("{ip}:7001"), "--xds-addr", &format!("{ip}:7002")]);
        if self.join {
            cmd.arg("--join");
        } else {
            for m in members {
                cmd.arg("--initial-member").arg(m);
            }
        }
        // `ip netns exec` execs the replica: the child's pid is the replica's.
        cmd.env("RUST_LOG", "info,openraft=warn");
        self.child = Some(Proc::spawn(&format!("replica {} ({})", self.raft_id, self.ns), cmd, &self.dir.join("replica.log")));
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            sh(&["kill", sig, &c.id().to_string()]);
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// Whether its process has exited by itself.
    fn has_exited(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| c.try_exit().is_some())
    }

    /// How its process exited, if it exited by itself (then it is reaped).
    fn reap(&mut self) -> Option<String> {
        let status = self.child.as_mut()?.try_exit()?;
        self.child = None;
        Some(status.to_string())
    }
}

/// Fill the filesystem of `dir`: what is left goes to one file, [`FILL`].
/// The bytes that were free.
fn fill_disk(dir: &Path) -> u64 {
    let free = sh(&["stat", "-f", "-c", "%a %S", &dir.to_string_lossy()]);
    let free: u64 = free.split_whitespace().filter_map(|n| n.parse::<u64>().ok()).product();
    let fill = dir.join(FILL);
    let allocated = Command::new("fallocate").arg("-l").arg(free.to_string()).arg(&fill).status().is_ok_and(|s| s.success());
    if !allocated && free > 0 {
        // Written instead, until the filesystem refuses (dd then fails).
        let _ = Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", fill.display())).arg("bs=64k").stderr(Stdio::null()).status();
    }
    free
}

/// Every replica's data directory on a tmpfs of its own (64 MiB at most,
/// memory only as used; a 180 s run writes under 10 MiB), so the nemesis can fill one. Dropped: unmounted;
/// after a failed run the data is copied beside it first (`data.kept`).
struct Disks {
    paths: Vec<PathBuf>,
    keep: bool,
}

impl Disks {
    fn mount(paths: impl IntoIterator<Item = PathBuf>) -> Disks {
        let mut disks = Disks { paths: Vec::new(), keep: false };
        for path in paths {
            std::fs::create_dir_all(&path).unwrap();
            sh(&["mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs", &path.to_string_lossy()]);
            disks.paths.push(path);
        }
        disks
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for path in &self.paths {
            if self.keep {
                let _ = Command::new("cp").arg("-a").arg(path).arg(path.with_extension("kept")).status();
            }
            let _ = Command::new("umount").arg("-l").arg(path).status();
        }
    }
}

/// The history: every call, per key.
#[derive(Default)]
struct History {
    calls: BTreeMap<&'static str, Vec<Call>>,
    acked_revision: u64,
    ok: usize,
    unknown: usize,
}

struct Run {
    started: Instant,
    /// `LODESTAR_FAULT_PLANT=stale-reads`: the clients' reads ask for
    /// `consistency=stale` but are checked as linearizable, a planted bug
    /// the checker must find (a partitioned old leader serves old values).
    stale_reads: bool,
    http: reqwest::Client,
    history: Mutex<History>,
}

impl Run {
    fn micros(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    fn record(&self, key: &'static str, client: usize, start: u64, op: Op) {
        let end = Some(self.micros());
        let mut h = self.history.lock().unwrap();
        let unknown = matches!(&op, Op::Write(_, Outcome::Unknown) | Op::Cas { outcome: Outcome::Unknown, .. } | Op::Delete(Outcome::Unknown));
        let acked = match &op {
            Op::Write(_, Outcome::Ok(r)) | Op::Cas { outcome: Outcome::Ok(r), .. } => Some(*r),
            _ => None,
        };
        if unknown {
            h.unknown += 1;
        } else {
            h.ok += 1;
        }
        if let Some(r) = acked {
            h.acked_revision = h.acked_revision.max(r);
        }
        h.calls.entry(key).or_default().push(Call { op, client, start, end: if unknown { None } else { end } });
    }

    /// One linearizable read: None when it got no answer (a read without
    /// one constrains nothing and is not recorded).
    async fn read(&self, api: &str, key: &'static str, client: usize) -> Option<Option<(String, u64)>> {
        let start = self.micros();
        let consistency = if self.stale_reads { "stale" } else { "linearizable" };
        let url = format!("{api}/v1/resources/vs/{NAMESPACE}/{key}?consistency={consistency}");
        let r = self.http.get(url).timeout(OP_TIMEOUT).send().await.ok()?;
        let seen = match r.status().as_u16() {
            200 => {
                let obj: Value = r.json().await.ok()?;
                let value = obj["metadata"]["labels"]["tag"].as_str()?.to_string();
                let revision = obj["metadata"]["resourceVersion"].as_str()?.parse().ok()?;
                Some((value, revision))
            }
            404 => None,
            _ => return None,
        };
        self.record(key, client, start, Op::Read(seen.clone()));
        Some(seen)
    }

    /// A write: Ok(revision), Refused (409/404), or Unknown. A request
    /// that could not connect was never sent: not recorded.
    async fn write(&self, req: reqwest::RequestBuilder) -> Option<Outcome<u64>> {
        match req.timeout(OP_TIMEOUT).send().await {
            Err(e) if e.is_connect() => None,
            Err(_) => Some(Outcome::Unknown),
            Ok(r) => match r.status().as_u16() {
                200 => Some(r.json::<Value>().await.ok().and_then(|b| b["revision"].as_u64()).map_or(Outcome::Unknown, Outcome::Ok)),
                404 | 409 => Some(Outcome::Refused),
                _ => Some(Outcome::Unknown),
            },
        }
    }
}

/// One client: random operations on random keys through one replica,
/// until `stop`.
async fn client(run: Arc<Run>, api: String, client: usize, stop: tokio::sync::watch::Receiver<bool>) {
    use rand::Rng;
    let mut seq = 0u64;
    let mut last_seen: BTreeMap<&'static str, u64> = BTreeMap::new();
    while !*stop.borrow() {
        let key = KEYS[rand::thread_rng().gen_range(0..KEYS.len())];
        let dice = rand::thread_rng().gen_range(0..10);
        seq += 1;
        let value = format!("c{client}-{seq}");
        let start = run.micros();
        match dice {
            0..=3 => {
                if let Some(seen) = run.read(&api, key, client).await {
                    last_seen.insert(key, seen.map_or(0, |s| s.1));
                }
            }
            4..=5 => {
                let body = json!({"resources": [vs(key, NAMESPACE, &value)]});
                if let Some(outcome) = run.write(run.http.post(format!("{api}/v1/apply")).json(&body)).await {
                    run.record(key, client, start, Op::Write(value, outcome));
                }
            }
            6..=8 => {
                let expect = last_seen.get(key).copied().unwrap_or(0);
                let body = json!({"resources": [{"resource": vs(key, NAMESPACE, &value), "expectedRevision": expect}]});
                if let Some(outcome) = run.write(run.http.post(format!("{api}/v1/apply")).json(&body)).await {
                    run.record(key, client, start, Op::Cas { expect, value, outcome });
                }
            }
            _ => {
                let req = run.http.delete(format!("{api}/v1/resources/vs/{NAMESPACE}/{key}"));
                if let Some(outcome) = run.write(req).await {
                    run.record(key, client, start, Op::Delete(outcome.map(|_| ())));
                }
            }
        }
        let pause = rand::thread_rng().gen_range(5..30);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

impl<T> Outcome<T> {
    fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Outcome::Ok(v) => Outcome::Ok(f(v)),
            Outcome::Refused => Outcome::Refused,
            Outcome::Unknown => Outcome::Unknown,
        }
    }
}

/// One change as a watch shows it: (revision, type, kind/name, tag).
type Change = (u64, String, String, String);

/// What one watcher saw: its streams, each from the revision it asked for,
/// and whether the last one ended with `Compacted`.
#[derive(Default, Debug)]
struct Watched {
    streams: Vec<(u64, Vec<Change>)>,
    compacted: bool,
}

impl Watched {
    fn last(&self) -> u64 {
        self.streams.last().map_or(0, |(from, events)| events.last().map_or(*from, |e| e.0))
    }
}

fn change(line: &Value) -> Option<Change> {
    let o = &line["object"];
    Some((
        line["revision"].as_u64()?,
        line["type"].as_str()?.to_string(),
        format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str()?),
        o["metadata"]["labels"]["tag"].as_str().unwrap_or("").to_string(),
    ))
}

/// One watch stream of the namespace from `from`, until it ends, `stop`,
/// or (with `idle`) no event for that long. Err: compacted, with the
/// oldest revision a watch can start from when the answer names it.
async fn watch_once(
    http: &reqwest::Client,
    api: &str,
    from: u64,
    events: &mut Vec<Change>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    idle: Option<Duration>,
) -> Result<(), Option<u64>> {
    let url = format!("{api}/v1/watch?fromRevision={from}&namespace={NAMESPACE}");
    let Ok(mut resp) = http.get(url).timeout(Duration::from_secs(3600)).send().await else { return Ok(()) };
    if resp.status().as_u16() == 410 {
        let body: Value = resp.json().await.unwrap_or_default();
        let oldest = body["error"]["message"].as_str().and_then(|m| m.rsplit("oldest available is ").next()).and_then(|n| n.trim().parse().ok());
        return Err(oldest);
    }
    if !resp.status().is_success() {
        return Ok(());
    }
    let mut buf = Vec::new();
    loop {
        let chunk = tokio::select! {
            c = resp.chunk() => c,
            _ = stop.wait_for(|s| *s) => return Ok(()),
            _ = tokio::time::sleep(idle.unwrap_or(Duration::from_secs(3600))) => return Ok(()),
        };
        let Ok(Some(chunk)) = chunk else { return Ok(()) };
        buf.extend_from_slice(&chunk);
        while let Some(n) = buf.iter().position(|&b| b == b'\n') {
            let line: Value = serde_json::from_slice(&buf[..n]).unwrap_or(Value::Null);
            buf.drain(..=n);
            if line["error"]["code"] == "Compacted" {
                return Err(None);
            }
            match change(&line) {
                Some(c) => events.push(c),
                None => return Ok(()),
            }
        }
    }
}

/// A watcher on one replica: from revision 0, re-watching from the last
/// revision seen whenever a stream breaks, until `stop`.
async fn watcher(http: reqwest::Client, api: String, seen: Arc<Mutex<Watched>>, mut stop: tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow() {
        let from = seen.lock().unwrap().last();
        let mut events = Vec::new();
        let outcome = watch_once(&http, &api, from, &mut events, &mut stop, None).await;
        {
            let mut w = seen.lock().unwrap();
            w.streams.push((from, events));
            if outcome.is_err() {
                w.compacted = true;
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    }
}

/// The watch checks: `seen` (one replica's watcher) against `history`.
fn check_watch(id: u64, seen: &Watched, history: &[Change]) -> Vec<String> {
    let mut anomalies = Vec::new();
    let mut joined: Vec<&Change> = Vec::new();
    for (from, events) in &seen.streams {
        if let Some(bad) = events.windows(2).find(|w| w[1].0 <= w[0].0) {
            anomalies.push(format!("watch on replica {id} (from {from}): revision {} after {}", bad[1].0, bad[0].0));
        }
        if let Some(first) = events.first().filter(|e| e.0 <= *from) {
            anomalies.push(format!("watch on replica {id} from {from} delivered revision {}", first.0));
        }
        joined.extend(events);
    }
    let last = seen.last();
    let expected: Vec<&Change> = history.iter().filter(|c| c.0 <= last).collect();
    if joined != expected {
        let at = joined.iter().zip(&expected).position(|(a, b)| a != b).unwrap_or(joined.len().min(expected.len()));
        anomalies.push(format!(
            "watch on replica {id}: its {} streams delivered {} changes, the history has {} up to revision {last}; first difference at #{at}: saw {:?}, history {:?}",
            seen.streams.len(),
            joined.len(),
            expected.len(),
            joined.get(at),
            expected.get(at)
        ));
    }
    let end = history.last().map_or(0, |c| c.0);
    if !seen.compacted && last < end {
        anomalies.push(format!("watch on replica {id} stopped at revision {last}; the history goes to {end}"));
    }
    anomalies
}

const HEARTBEAT_INSTANCE: &str = "hb-0";

/// Heartbeat the registry instance every 500 ms through the first replica
/// that answers, until `stop`. Counts heartbeats acknowledged.
async fn heartbeats(http: reqwest::Client, apis: Vec<String>, stop: tokio::sync::watch::Receiver<bool>) -> usize {
    let mut acked = 0;
    let mut n = 0;
    while !*stop.borrow() {
        for attempt in 0..apis.len() {
            let api = &apis[(n + attempt) % apis.len()];
            let url = format!("{api}/v1/resources/instances/{NAMESPACE}/{HEARTBEAT_INSTANCE}/heartbeat");
            if http.post(url).timeout(Duration::from_secs(1)).send().await.is_ok_and(|r| r.status() == 200) {
                acked += 1;
                break;
            }
        }
        n += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    acked
}

/// A replica other than `old` that says it is the leader (asked briefly:
/// a paused or cut-off replica must not hold up the nemesis).
async fn leader_other_than(http: &reqwest::Client, replicas: &[NsReplica], old: u64) -> Option<u64> {
    leader_among(http, replicas.iter().filter(|r| r.id != old), Duration::from_millis(300)).await
}

/// The leader, as a live replica that says it leads.
async fn leader(http: &reqwest::Client, replicas: &[NsReplica]) -> Option<u64> {
    leader_among(http, replicas.iter(), Duration::from_secs(1)).await
}

/// The first running replica of `candidates` that says it is the leader,
/// each asked with `timeout`.
async fn leader_among(http: &reqwest::Client, candidates: impl Iterator<Item = &NsReplica>, timeout: Duration) -> Option<u64> {
    for r in candidates.filter(|r| r.child.is_some()) {
        let Ok(resp) = http.get(format!("{}/v1/node", r.api())).timeout(timeout).send().await else { continue };
        let Ok(s) = resp.json::<Value>().await else { continue };
        if s["state"] == "leader" {
            return Some(r.id);
        }
    }
    None
}

/// Replica `a` and replica `b` no longer reach each other (both ways,
/// set in `a`'s namespace).
fn cut(net: &Net, a: u64, b: u64) {
    let ip = format!("198.18.0.{b}");
    ns_exec(&net.node(a), &["iptables", "-A", "INPUT", "-s", &ip, "-j", "DROP"]);
    ns_exec(&net.node(a), &["iptables", "-A", "OUTPUT", "-d", &ip, "-j", "DROP"]);
}

/// 20% of the packets between replicas dropped (on arrival).
fn lossy(net: &Net, ids: &[u64]) {
    for &x in ids {
        for &y in ids.iter().filter(|&&y| y != x) {
            let ip = format!("198.18.0.{y}");
            ns_exec(&net.node(x), &["iptables", "-A", "INPUT", "-s", &ip, "-m", "statistic", "--mode", "random", "--probability", "0.2", "-j", "DROP"]);
        }
    }
}

/// A membership change through any replica but `not` (the victim).
/// Ok: how long it took.
async fn membership(http: &reqwest::Client, replicas: &[NsReplica], not: u64, add: Option<Value>, remove: u64) -> Result<f64, String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(60) {
        for r in replicas.iter().filter(|r| r.id != not && r.child.is_some() && !r.removed) {
            let req = match &add {
                Some(body) => http.post(format!("{}/v1/cluster/members", r.api())).json(body),
                None => http.delete(format!("{}/v1/cluster/members/{remove}", r.api())),
            };
            match req.timeout(Duration::from_secs(20)).send().await {
                Ok(resp) if resp.status() == 200 => return Ok(started.elapsed().as_secs_f64()),
                // Removed already (an earlier try that timed out but took).
                Ok(resp) if resp.status() == 404 && add.is_none() => return Ok(started.elapsed().as_secs_f64()),
                Ok(resp) => last = format!("replica {}: {} {}", r.id, resp.status(), resp.text().await.unwrap_or_default()),
                Err(e) => last = format!("replica {}: {e}", r.id),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Err(format!("not done within 60 s; last answer: {last}"))
}

/// Heal every fault: the network, a filled disk (its replica restarted if
/// it stopped), paused and killed replicas, removed members added back.
/// What it did that is worth telling, and replicas that exited by
/// themselves though their disk was not filled (`filled`: in this fault or
/// the one before, as a replica may fail its write just as the disk is
/// freed).
async fn heal(net: &Net, http: &reqwest::Client, replicas: &mut [NsReplica], members: &[String], filled: &[u64]) -> (String, Vec<String>) {
    let (mut notes, mut unexpected) = (Vec::new(), Vec::new());
    for r in replicas.iter_mut() {
        ns_exec(&net.node(r.id), &["iptables", "-F"]);
        let _ = std::fs::remove_file(r.data().join(FILL));
        if let Some(status) = r.reap() {
            notes.push(format!("replica {} had stopped ({status})", r.id));
            if !filled.contains(&r.id) {
                unexpected.push(format!("replica {} exited ({status}) though its disk was not filled", r.id));
            }
        }
        if r.child.is_some() {
            r.signal("-CONT");
        } else {
            r.spawn(members);
        }
    }
    for i in 0..replicas.len() {
        if !replicas[i].removed {
            continue;
        }
        let (id, raft_id, body) = (replicas[i].id, replicas[i].raft_id, replicas[i].member_body());
        match membership(http, replicas, id, Some(body), 0).await {
            Ok(took) => {
                replicas[i].removed = false;
                notes.push(format!("replica {id} added back as node {raft_id} in {took:.1} s"));
            }
            Err(e) => notes.push(format!("replica {id} could not be added back: {e}")),
        }
    }
    (notes.join("; "), unexpected)
}

#[test]
fn faults_three_replicas_in_namespaces() {
    if let Some(why) = netns_unavailable() {
        println!("SKIPPED: the fault-injection run needs network namespaces: {why}");
        return;
    }
    let secs: u64 = std::env::var("LODESTAR_FAULT_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(25);
    let net = Net::create();
    let tmp = tempfile::Builder::new().prefix("lodestar-faults").tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let nodes: Vec<(u64, String)> = (1..=replica_count()).map(|id| (id, net.node(id))).collect();
    let client_ns = net.client();
    let prefix = net.prefix.clone();
    let outcome = in_netns(&client_ns, move || async move { run(nodes, dir, secs, prefix).await });
    match outcome {
        Ok(summary) => {
            println!("{summary}");
            // `LODESTAR_FAULT_KEEP=1`: keep a passing run's history and logs too.
            if std::env::var_os("LODESTAR_FAULT_KEEP").is_some() {
                println!("history and replica logs kept in {}", tmp.keep().display());
            }
        }
        Err(report) => {
            let kept = tmp.keep();
            panic!("{report}\nhistory and replica logs kept in {}", kept.display());
        }
    }
    drop(net);
}

/// The run, inside the clients' namespace. Err: the anomalies found.
async fn run(nodes: Vec<(u64, String)>, dir: PathBuf, secs: u64, prefix: String) -> Result<String, String> {
    let net = Net { prefix, names: Vec::new() }; // names only: the caller owns and deletes them
    let mut replicas: Vec<NsReplica> = nodes
        .into_iter()
        .map(|(id, ns)| NsReplica { id, raft_id: id, join: false, removed: false, ns, dir: dir.join(format!("r{id}")), child: None })
        .collect();
    let members: Vec<String> = replicas.iter().map(|r| r.member_flag()).collect();
    let mut disks = Disks::mount(replicas.iter().map(|r| r.data()));
    for r in &mut replicas {
        r.spawn(&members);
    }
    let http = http_builder().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while leader(&http, &replicas).await.is_none() {
        assert!(Instant::now() < deadline, "no leader within 30s in the namespaces");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The heartbeated instance (registry health check), and its service.
    let service = json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": "hb", "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "http", "number": 80}]}});
    let instance = json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": HEARTBEAT_INSTANCE, "namespace": NAMESPACE},
        "spec": {"service": "hb", "address": "198.18.0.200", "ports": {"http": 80}, "healthCheck": {"ttl": "15s"}}});
    // Two applies: one object per transaction in the whole run, so every
    // watch's revisions must strictly increase.
    let mut registered = 0;
    for doc in [service, instance] {
        registered = loop {
            let resp = http.post(format!("{}/v1/apply", replicas[0].api())).json(&json!({"resources": [doc]})).timeout(OP_TIMEOUT).send().await;
            if let Ok(r) = resp {
                if r.status() == 200 {
                    break r.json::<Value>().await.ok().and_then(|b| b["revision"].as_u64()).expect("an apply's revision");
                }
                assert!(r.status().as_u16() >= 500, "registering the heartbeated instance: {}", r.text().await.unwrap_or_default());
            }
            assert!(Instant::now() < deadline + Duration::from_secs(30), "could not register the heartbeated instance");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
    }

    let stale_reads = std::env::var("LODESTAR_FAULT_PLANT").is_ok_and(|p| p == "stale-reads");
    let run = Arc::new(Run { started: Instant::now(), stale_reads, http: http.clone(), history: Mutex::default() });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut clients = Vec::new();
    for (n, r) in replicas.iter().enumerate() {
        for k in 0..CLIENTS_PER_REPLICA {
            clients.push(tokio::spawn(client(run.clone(), r.api(), n * CLIENTS_PER_REPLICA + k, stop_rx.clone())));
        }
    }

    let (watch_stop_tx, watch_stop_rx) = tokio::sync::watch::channel(false);
    let watched: Vec<Arc<Mutex<Watched>>> = replicas.iter().map(|_| Arc::default()).collect();
    let watchers: Vec<_> = replicas.iter().zip(&watched).map(|(r, w)| tokio::spawn(watcher(http.clone(), r.api(), w.clone(), watch_stop_rx.clone()))).collect();
    let heartbeater = tokio::spawn(heartbeats(http.clone(), replicas.iter().map(|r| r.api()).collect(), watch_stop_rx.clone()));

    // The nemesis: one fault at a time, each healed before the next, in
    // the order of FAULTS from a random one (`LODESTAR_FAULTS`: only these).
    let kinds: Vec<&str> = match std::env::var("LODESTAR_FAULTS") {
        Ok(only) => FAULTS.iter().copied().filter(|f| only.split(',').any(|o| o.trim() == *f)).collect(),
        Err(_) => FAULTS.to_vec(),
    };
    assert!(!kinds.is_empty(), "LODESTAR_FAULTS names none of {FAULTS:?}");
    let mut faults = Vec::new();
    let mut unexpected_exits = Vec::new();
    let mut replaced = 0;
    // The replica whose disk the previous fault filled.
    let mut filled_before: Option<u64> = None;
    let end = Instant::now() + Duration::from_secs(secs);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut round = rand::random::<usize>() % kinds.len();
    while Instant::now() < end {
        let Some(l) = leader(&http, &replicas).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let at = run.started.elapsed();
        let ids: Vec<u64> = replicas.iter().map(|r| r.id).collect();
        let others: Vec<u64> = ids.iter().copied().filter(|&id| id != l).collect();
        let kind = kinds[round % kinds.len()];
        let mut filled = None;
        let what = match kind {
            "partition" => {
                for &o in &others {
                    cut(&net, l, o);
                }
                format!("partition: leader {l} cut off from its peers")
            }
            "pause" => {
                replicas[l as usize - 1].signal("-STOP");
                format!("pause: leader {l} SIGSTOPped")
            }
            "kill" => {
                let victim = 1 + rand::random::<u64>() % ids.len() as u64;
                replicas[victim as usize - 1].kill();
                format!("kill -9: replica {victim}{}", if victim == l { " (the leader)" } else { "" })
            }
            "bridge" => {
                // A bridge: one replica sees both sides, the sides do not
                // see each other.
                let bridge = ids[rand::random::<usize>() % ids.len()];
                let rest: Vec<u64> = ids.iter().copied().filter(|&id| id != bridge).collect();
                let (a, b) = rest.split_at(rest.len() / 2);
                for &x in a {
                    for &y in b {
                        cut(&net, x, y);
                    }
                }
                format!("bridge: {a:?} | {b:?}, replica {bridge} sees both")
            }
            "one-way" => {
                for &o in &others {
                    ns_exec(&net.node(l), &["iptables", "-A", "OUTPUT", "-d", &format!("198.18.0.{o}"), "-j", "DROP"]);
                }
                format!("one-way: leader {l} hears its peers, they do not hear it")
            }
            "split" => {
                // The leader with a minority (just itself with three).
                let size = ((ids.len() - 1) / 2).max(1);
                let minority: Vec<u64> = std::iter::once(l).chain(others.iter().copied().take(size - 1)).collect();
                for &x in &minority {
                    for y in ids.iter().copied().filter(|y| !minority.contains(y)) {
                        cut(&net, x, y);
                    }
                }
                format!("split: minority {minority:?} with the leader | the rest")
            }
            "loss" => {
                lossy(&net, &ids);
                "loss: 20% of packets between replicas dropped".to_string()
            }
            "membership" => {
                // A member removed while 20% of packets are lost (the
                // leader, sometimes), then added back when healed: every
                // other time it keeps running with its data, else it is
                // replaced (wiped, started empty, added under a new id).
                let victim = ids[rand::random::<usize>() % ids.len()];
                let v = victim as usize - 1;
                let is_leader = if victim == l { " (the leader)" } else { "" };
                lossy(&net, &ids);
                let raft_id = replicas[v].raft_id;
                let outcome = membership(&http, &replicas, victim, None, raft_id).await;
                replaced += 1;
                // Replaced only while another replica was never replaced:
                // one keeps the whole watch history (a replacement has it
                // from its snapshot on).
                let replace = replaced % 2 == 0 && outcome.is_ok() && replicas.iter().any(|r| r.id != victim && r.raft_id == r.id);
                if outcome.is_ok() {
                    replicas[v].removed = true;
                }
                if replace {
                    let r = &mut replicas[v];
                    r.kill();
                    for entry in std::fs::read_dir(r.data()).unwrap().flatten() {
                        let _ = std::fs::remove_dir_all(entry.path()).or_else(|_| std::fs::remove_file(entry.path()));
                    }
                    r.raft_id += 10;
                    r.join = true;
                    r.spawn(&members);
                }
                match outcome {
                    Ok(took) if replace => format!(
                        "membership: replica {victim}{is_leader} (node {raft_id}) removed in {took:.1} s under 20% loss, wiped, restarted empty as node {}",
                        raft_id + 10
                    ),
                    Ok(took) => format!("membership: replica {victim}{is_leader} (node {raft_id}) removed in {took:.1} s under 20% loss, left running"),
                    Err(e) => format!("membership: removing replica {victim}{is_leader} (node {raft_id}) under 20% loss failed: {e}"),
                }
            }
            _ => {
                let victim = ids[rand::random::<usize>() % ids.len()];
                filled = Some(victim);
                let free = fill_disk(&replicas[victim as usize - 1].data());
                format!("disk full: replica {victim}{}'s filesystem filled ({} KiB were free)", if victim == l { " (the leader)" } else { "" }, free / 1024)
            }
        };
        // While the fault lasts: when another replica is first seen to be
        // the leader (an election; none if the leader keeps its place).
        // A full disk lasts until its replica stops (it must, fail-stop),
        // for at most 15 s.
        let fault_end = Instant::now() + Duration::from_secs(if filled.is_some() { 15 } else { 5 });
        let mut elected = None;
        while Instant::now() < fault_end {
            if elected.is_none() && leader_other_than(&http, &replicas, l).await.is_some() {
                elected = Some(run.micros());
            }
            if filled.is_some_and(|v| replicas[v as usize - 1].has_exited()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100).min(fault_end.saturating_duration_since(Instant::now()))).await;
        }
        let lasted = run.started.elapsed() - at;
        let recently_filled: Vec<u64> = filled.into_iter().chain(filled_before).collect();
        filled_before = filled;
        let (healed, unexpected) = heal(&net, &http, &mut replicas, &members, &recently_filled).await;
        unexpected_exits.extend(unexpected);
        let what = format!("{what}; healed after {:.1} s{}{healed}", lasted.as_secs_f64(), if healed.is_empty() { "" } else { ": " });
        faults.push((at.as_micros() as u64, what, elected));
        tokio::time::sleep(Duration::from_secs(4)).await;
        round += 1;
    }
    let _ = stop_tx.send(true);
    for c in clients {
        c.await.unwrap();
    }
    let (_, unexpected) = heal(&net, &http, &mut replicas, &members, &Vec::from_iter(filled_before)).await;
    unexpected_exits.extend(unexpected);

    // Everyone caught up: the same revision on every replica, stable.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut finals: Vec<(u64, Value)> = Vec::new();
    loop {
        finals.clear();
        for r in &replicas {
            let url = format!("{}/v1/resources/vs?namespace={NAMESPACE}&consistency=stale", r.api());
            if let Ok(resp) = http.get(url).timeout(Duration::from_secs(2)).send().await {
                if let Ok(v) = resp.json::<Value>().await {
                    finals.push((r.id, v));
                }
            }
        }
        let revisions: Vec<Option<u64>> = finals.iter().map(|(_, v)| v["revision"].as_u64()).collect();
        if finals.len() == replicas.len() && revisions.windows(2).all(|w| w[0] == w[1]) && leader(&http, &replicas).await.is_some() {
            break;
        }
        if Instant::now() > deadline {
            disks.keep = true;
            return Err(format!("replicas did not converge within 60 s after healing: {revisions:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Final linearizable reads through every replica join the history.
    for (n, r) in replicas.iter().enumerate() {
        for key in KEYS {
            if run.read(&r.api(), key, 1000 + n).await.is_none() {
                disks.keep = true;
                return Err(format!("the final read of {key} through replica {} got no answer", r.id));
            }
        }
    }

    let mut anomalies = Vec::new();
    // The history of changes, through every replica: the same on each.
    // A replica that caught up from a snapshot (a replacement) holds the
    // history from the snapshot's revision on, and says so (Compacted, with
    // the oldest revision it has): its history is compared from there. At
    // least one replica holds the whole of it (the nemesis leaves one
    // never replaced).
    let mut histories = Vec::new();
    for r in &replicas {
        let (_never_tx, mut never) = tokio::sync::watch::channel(false);
        let mut events = Vec::new();
        let mut from = 0;
        if let Err(oldest) = watch_once(&http, &r.api(), 0, &mut events, &mut never, Some(Duration::from_secs(2))).await {
            events.clear();
            from = oldest.unwrap_or(u64::MAX);
            if oldest.is_none() || watch_once(&http, &r.api(), from, &mut events, &mut never, Some(Duration::from_secs(2))).await.is_err() {
                anomalies.push(format!("replica {}: a watch from 0 was compacted, and from the oldest revision it named ({oldest:?}) too", r.id));
            }
        }
        if let Some(bad) = events.windows(2).find(|w| w[1].0 <= w[0].0) {
            anomalies.push(format!("replica {}: revision {} after {} in its history", r.id, bad[1].0, bad[0].0));
        }
        histories.push((r.id, from, events));
    }
    histories.sort_by_key(|h| h.1);
    if histories[0].1 != 0 {
        anomalies.push(format!("no replica holds the whole history: theirs start at {:?}", histories.iter().map(|h| (h.0, h.1)).collect::<Vec<_>>()));
    }
    let (first_id, _, history) = &histories[0];
    for (id, from, events) in &histories[1..] {
        let expected: Vec<&Change> = history.iter().filter(|c| c.0 > *from).collect();
        if events.iter().collect::<Vec<_>>() != expected {
            let at = events.iter().zip(&expected).position(|(a, b)| a != *b).unwrap_or(events.len().min(expected.len()));
            anomalies.push(format!(
                "replica {id}'s history (from revision {from}) differs from replica {first_id}'s at #{at}: {:?} vs {:?}",
                events.get(at),
                expected.get(at)
            ));
        }
    }
    // The watchers catch up (bounded), then stop.
    let end = history.last().map_or(0, |c| c.0);
    let deadline = Instant::now() + Duration::from_secs(30);
    while watched.iter().any(|w| {
        let w = w.lock().unwrap();
        !w.compacted && w.last() < end && w.streams.iter().map(|s| s.1.len()).sum::<usize>() < history.len()
    }) && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = watch_stop_tx.send(true);
    for w in watchers {
        w.await.unwrap();
    }
    let beats = heartbeater.await.unwrap();
    let mut watch_streams = 0;
    for (r, w) in replicas.iter().zip(&watched) {
        let w = w.lock().unwrap();
        watch_streams += w.streams.len();
        anomalies.extend(check_watch(r.id, &w, history));
    }
    // Registry health: the heartbeated instance was never expired.
    let url = format!("{}/v1/resources/instances/{NAMESPACE}/{HEARTBEAT_INSTANCE}", replicas[0].api());
    match http.get(url).timeout(OP_TIMEOUT).send().await {
        Ok(resp) if resp.status() == 200 => {
            let b: Value = resp.json().await.unwrap_or_default();
            if b["metadata"]["modRevision"].as_u64() != Some(registered) || !b["status"]["health"].is_null() {
                anomalies.push(format!("the instance heartbeated through the run ({beats} heartbeats) was marked: {b}"));
            }
        }
        other => anomalies.push(format!("the instance heartbeated through the run is gone: {:?}", other.map(|r| r.status()))),
    }

    // The registry's objects too (written once, at the start: a replica that
    // lost one on a restart shows here), the same on every replica.
    for kind in ["services", "instances"] {
        let mut seen: Vec<(u64, Vec<(String, String)>)> = Vec::new();
        for r in &replicas {
            let url = format!("{}/v1/resources/{kind}?namespace={NAMESPACE}&consistency=stale", r.api());
            let list: Value = match http.get(url).timeout(OP_TIMEOUT).send().await {
                Ok(resp) => resp.json().await.unwrap_or_default(),
                Err(_) => Value::Null,
            };
            let names = list["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|o| (o["metadata"]["name"].to_string(), o["metadata"]["resourceVersion"].to_string()))
                .collect();
            seen.push((r.id, names));
        }
        for (id, names) in &seen[1..] {
            if *names != seen[0].1 || names.is_empty() {
                anomalies.push(format!("{kind}: replica {id} has {names:?}, replica {} {:?}", seen[0].0, seen[0].1));
            }
        }
    }
    // Every replica is a voter again, under its current id, and nothing else is.
    let want: Vec<(u64, bool)> = replicas.iter().map(|r| (r.raft_id, true)).collect();
    let cluster = http.get(format!("{}/v1/cluster", replicas[0].api())).timeout(OP_TIMEOUT).send().await;
    let cluster: Value = match cluster {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => Value::Null,
    };
    let mut have: Vec<(u64, bool)> =
        cluster["members"].as_array().into_iter().flatten().map(|m| (m["id"].as_u64().unwrap_or(0), m["role"] == "voter")).collect();
    have.sort_unstable();
    let mut want_sorted = want.clone();
    want_sorted.sort_unstable();
    if have != want_sorted {
        anomalies.push(format!("the cluster's members after healing are {have:?} (id, voter), not {want_sorted:?}"));
    }
    let h = run.history.lock().unwrap();
    let mut checked = 0;
    for (key, calls) in &h.calls {
        checked += calls.len();
        if let Err(e) = checker::check(None, calls) {
            anomalies.push(format!("key {key}: {e}"));
        }
    }
    // Identical state, and at least every acknowledged revision.
    let view = |v: &Value| -> (Option<u64>, Vec<(String, String, String)>) {
        let items = v["items"].as_array().cloned().unwrap_or_default();
        let objs = items
            .iter()
            .map(|o| {
                let m = &o["metadata"];
                (m["name"].as_str().unwrap_or("").to_string(), m["labels"]["tag"].as_str().unwrap_or("").to_string(), m["resourceVersion"].to_string())
            })
            .collect();
        (v["revision"].as_u64(), objs)
    };
    let first = view(&finals[0].1);
    for (id, v) in &finals[1..] {
        if view(v) != first {
            anomalies.push(format!("replica {id} ended with {:?}, replica {} with {first:?}", view(v), finals[0].0));
        }
    }
    if first.0.unwrap_or(0) < h.acked_revision {
        anomalies.push(format!("final revision {:?} is below the highest acknowledged revision {}", first.0, h.acked_revision));
    }
    anomalies.extend(unexpected_exits);
    for r in &mut replicas {
        r.kill();
    }
    // A panic in a replica (a raft invariant's assertion, say) is an
    // anomaly even when the others carried the run.
    for r in &replicas {
        let log = std::fs::read_to_string(r.dir.join("replica.log")).unwrap_or_default();
        let mut lines = log.lines();
        while let Some(line) = lines.next() {
            if line.contains("panicked at") {
                anomalies.push(format!("replica {} panicked: {line} {}", r.id, lines.next().unwrap_or_default()));
            }
        }
    }
    // Availability, as the clients saw it: the longest time without an
    // acknowledged write anywhere (during the faults).
    let mut acked: Vec<u64> = h
        .calls
        .values()
        .flatten()
        .filter(|c| matches!(c.op, Op::Write(_, Outcome::Ok(_)) | Op::Cas { outcome: Outcome::Ok(_), .. } | Op::Delete(Outcome::Ok(_))))
        .filter_map(|c| c.end)
        .collect();
    acked.sort_unstable();
    let max_gap_ms = acked.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) / 1000;
    // Per fault: the longest stretch without an acknowledged write that
    // overlaps the fault's window (5 s of fault, 4 s of healing).
    // And after an election: how long until each replica's clients had a
    // write, and a (linearizable) read, answered.
    let first_after = |replica: usize, from: u64, to: u64, writes: bool| -> Option<u64> {
        h.calls
            .values()
            .flatten()
            .filter(|c| c.client / CLIENTS_PER_REPLICA == replica)
            .filter(|c| match &c.op {
                Op::Read(_) => !writes,
                Op::Write(_, Outcome::Ok(_)) | Op::Cas { outcome: Outcome::Ok(_), .. } | Op::Delete(Outcome::Ok(_)) => writes,
                _ => false,
            })
            .filter_map(|c| c.end)
            .filter(|&e| e >= from && e < to)
            .min()
            .map(|e| e - from)
    };
    let s1 = |v: Option<u64>| v.map_or("-".to_string(), |v| format!("{:.1}", v as f64 / 1e6));
    let faults: Vec<String> = faults
        .iter()
        .map(|(at, what, elected)| {
            let window_end = at + 9_000_000;
            let gap = acked.windows(2).filter(|w| w[1] > *at && w[0] < window_end).map(|w| w[1] - w[0]).max().unwrap_or(0);
            let after = match elected {
                None => "; no new leader".to_string(),
                Some(e) => {
                    let per: Vec<String> = (0..replicas.len())
                        .map(|i| format!("r{} {}/{}", i + 1, s1(first_after(i, *e, at + 5_000_000, true)), s1(first_after(i, *e, at + 5_000_000, false))))
                        .collect();
                    format!("; new leader seen at +{:.1} s, then first write/read answered: {} s", (e - at) as f64 / 1e6, per.join(", "))
                }
            };
            format!("{:>6.1}s {what}; longest write gap {:.1} s{after}", *at as f64 / 1e6, gap as f64 / 1e6)
        })
        .collect();
    let summary = format!(
        "result: replicas={} secs={secs} faults={} operations={checked} answered={} indeterminate={} final_revision={} max_write_gap_ms={max_gap_ms} watch_streams={watch_streams} watched_changes={} heartbeats={beats} anomalies={}\n{}",
        replicas.len(),
        faults.len(),
        h.ok,
        h.unknown,
        first.0.unwrap_or(0),
        history.len(),
        anomalies.len(),
        faults.join("\n")
    );
    let mut text = String::new();
    for (key, calls) in &h.calls {
        for c in calls {
            text.push_str(&format!("{key} client={} start_us={} end_us={:?} {:?}\n", c.client, c.start, c.end, c.op));
        }
    }
    std::fs::write(dir.join("history.txt"), text).unwrap();
    if anomalies.is_empty() {
        Ok(summary)
    } else {
        disks.keep = true;
        Err(format!("{summary}\nANOMALIES:\n{}", anomalies.join("\n")))
    }
}

/// A replica whose disk fills stops (fail-stop: it exits non-zero, saying
/// why) instead of answering on as a replica whose raft core has quit; the
/// others go on; restarted once there is room, it has every acknowledged
/// write. Here the leader's disk fills, under writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_disk_fills_stops_and_comes_back_whole() {
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: mounting a small filesystem needs root");
        return;
    }
    let mut c = Cluster::prepare(3, "");
    let disks = Disks::mount(c.replicas.iter().map(|r| r.data_dir()));
    c.launch().await;
    let leader = c.wait_for_leader(Duration::from_secs(20)).await;
    let other = if leader == 1 { 2 } else { 1 };
    let mut acked = Vec::new();
    let (http, api) = (c.http.clone(), c.replica(other).api());
    let write = |n: usize| {
        let (http, api) = (http.clone(), api.clone());
        async move { (n, apply(&http, &api, vec![vs(&format!("w{n}"), "disk", "v1")]).await) }
    };
    for n in 0..20 {
        let (n, (status, body)) = write(n).await;
        assert_eq!(status, 200, "{body}");
        acked.push(n);
    }
    let free = fill_disk(&c.replica(leader).data_dir());
    assert!(free > 0);
    // Writes go on through another replica until the leader stops.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut n = 20;
    let status = loop {
        if let Some(status) = c.replicas.iter_mut().find(|r| r.id == leader).unwrap().child.as_mut().unwrap().try_exit() {
            break status;
        }
        assert!(Instant::now() < deadline, "the leader, its disk full, did not stop within 60 s: {}", c.replica(leader).log());
        let (m, (status, _)) = write(n).await;
        if status == 200 {
            acked.push(m);
        }
        n += 1;
    };
    assert!(!status.success(), "a replica that cannot write must exit non-zero: {status}");
    let log = c.replica(leader).log();
    assert!(log.contains("fail-stop") && log.contains("No space left on device"), "the log says why: {log}");
    c.replicas.iter_mut().find(|r| r.id == leader).unwrap().child = None;
    // The others elect a leader and take writes.
    let (m, (status, body)) = write(n).await;
    assert_eq!(status, 200, "a write after the leader stopped: {body}");
    acked.push(m);
    let revision = body["revision"].as_u64().unwrap();
    // Room again: restarted, it catches up, with every acknowledged write.
    std::fs::remove_file(c.replica(leader).data_dir().join(FILL)).unwrap();
    c.restart(leader);
    c.wait_for_revision(revision, Duration::from_secs(30)).await;
    let (status, list) = get_json(&c.http, &format!("{}/v1/resources/vs?namespace=disk&consistency=stale", c.replica(leader).api())).await;
    assert_eq!(status, 200, "{list}");
    let names: std::collections::BTreeSet<String> =
        list["items"].as_array().unwrap().iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_string()).collect();
    for n in &acked {
        assert!(names.contains(&format!("w{n}")), "acknowledged write w{n} missing on the restarted replica");
    }
    for id in [1, 2, 3] {
        c.kill(id);
    }
    drop(disks);
}

/// The watch checker on made-up watches: it passes the history itself
/// (across a reconnect), and flags a change missed, one delivered twice,
/// one out of order, a stream that went backwards, and a watcher that
/// stopped short; a watch told it was compacted may stop short.
#[test]
fn the_watch_checker_catches_gaps_duplicates_order_and_stopping_short() {
    let c = |rev: u64, tag: &str| -> Change { (rev, "PUT".into(), "VirtualService/k0".into(), tag.into()) };
    let history = vec![c(1, "a"), c(2, "b"), c(3, "c"), c(4, "d")];
    let watched = |streams: Vec<(u64, Vec<Change>)>, compacted: bool| Watched { streams, compacted };
    let good = watched(vec![(0, vec![c(1, "a"), c(2, "b")]), (2, vec![]), (2, vec![c(3, "c"), c(4, "d")])], false);
    assert_eq!(check_watch(1, &good, &history), Vec::<String>::new());
    let cases = [
        ("a change missed across a reconnect", watched(vec![(0, vec![c(1, "a"), c(2, "b")]), (3, vec![c(4, "d")])], false)),
        ("a change delivered twice", watched(vec![(0, vec![c(1, "a"), c(2, "b")]), (1, vec![c(2, "b"), c(3, "c"), c(4, "d")])], false)),
        ("changes out of order", watched(vec![(0, vec![c(1, "a"), c(3, "c"), c(2, "b"), c(4, "d")])], false)),
        ("a different value at a revision", watched(vec![(0, vec![c(1, "a"), c(2, "x"), c(3, "c"), c(4, "d")])], false)),
        ("stopped short", watched(vec![(0, vec![c(1, "a"), c(2, "b")])], false)),
    ];
    for (what, w) in cases {
        assert!(!check_watch(1, &w, &history).is_empty(), "{what} was not caught: {w:?}");
    }
    let compacted = watched(vec![(0, vec![c(1, "a"), c(2, "b")])], true);
    assert_eq!(check_watch(1, &compacted, &history), Vec::<String>::new());
}
