//! Jepsen's method on this machine: three (or five) replicas, each in its
//! own network namespace (its own address, 198.18.0.N, on a bridge in a
//! hub namespace; nothing routes out), clients on every replica doing
//! blind writes, compare-and-set, deletes and linearizable reads on a few
//! keys, while a nemesis injects one fault at a time and heals it: the
//! leader cut off (iptables inside its namespace), the leader paused
//! (SIGSTOP/SIGCONT), a replica killed (-9, then restarted), a bridge
//! partition (two sides that do not see each other, one replica seeing
//! both), a one-way partition (the leader hears its peers, they do not
//! hear it), a minority with the leader split from the majority, and 20%
//! packet loss between all replicas.
//! Every operation is recorded with its invocation and completion time;
//! one without an answer is indeterminate, never a failure. Then:
//! - every key's history is linearizable (`support/linearizability.rs`), which the
//!   final reads through every replica make a check that no acknowledged
//!   write was lost;
//! - every replica ends with the same revision and the same objects, at
//!   least the highest revision acknowledged.
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

#[path = "support/linearizability.rs"]
mod checker;
mod common;

use checker::{Call, Op, Outcome};
use common::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEYS: [&str; 3] = ["k0", "k1", "k2"];
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
    id: u64,
    ns: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl NsReplica {
    fn ip(&self) -> String {
        format!("198.18.0.{}", self.id)
    }
    fn api(&self) -> String {
        format!("https://{}:7000", self.ip())
    }
    fn member_flag(&self) -> String {
        let ip = self.ip();
        format!("{}={ip}:7001,{ip}:7000,{ip}:7002", self.id)
    }

    fn spawn(&mut self, members: &[String]) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let config = self.dir.join("lodestar.toml");
        let token = format!("initial_management_token_file = {:?}\n", test_ca().token_file);
        std::fs::write(&config, format!("heartbeat_ms = 100\nelection_timeout_min_ms = 600\nelection_timeout_max_ms = 1200\n{}{token}", tls_toml())).unwrap();
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("replica.log")).unwrap();
        let ip = self.ip();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, BIN, "server", "--config"])
            .arg(&config)
            .args(["--id", &self.id.to_string(), "--data-dir"])
            .arg(self.dir.join("data"))
            .args(["--api-addr", &format!("{ip}:7000"), "--raft-addr", &format!("{ip}:7001"), "--xds-addr", &format!("{ip}:7002")]);
        for m in members {
            cmd.arg("--initial-member").arg(m);
        }
        // `ip netns exec` execs the replica: the child's pid is the replica's.
        cmd.env("RUST_LOG", "info,openraft=warn").stdout(Stdio::null()).stderr(log);
        self.child = Some(cmd.spawn().expect("spawn lodestar in its namespace"));
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            sh(&["kill", sig, &c.id().to_string()]);
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
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

/// The leader, as a live replica that says it leads.
async fn leader(http: &reqwest::Client, replicas: &[NsReplica]) -> Option<u64> {
    for r in replicas.iter().filter(|r| r.child.is_some()) {
        let Ok(resp) = http.get(format!("{}/v1/node", r.api())).timeout(Duration::from_secs(1)).send().await else { continue };
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

fn heal(net: &Net, replicas: &mut [NsReplica], members: &[String]) {
    for r in replicas.iter_mut() {
        ns_exec(&net.node(r.id), &["iptables", "-F"]);
        if r.child.is_some() {
            r.signal("-CONT");
        } else {
            r.spawn(members);
        }
    }
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
        Ok(summary) => println!("{summary}"),
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
    let mut replicas: Vec<NsReplica> = nodes.into_iter().map(|(id, ns)| NsReplica { id, ns, dir: dir.join(format!("r{id}")), child: None }).collect();
    let members: Vec<String> = replicas.iter().map(|r| r.member_flag()).collect();
    for r in &mut replicas {
        r.spawn(&members);
    }
    let http = http_builder().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while leader(&http, &replicas).await.is_none() {
        assert!(Instant::now() < deadline, "no leader within 30s in the namespaces");
        tokio::time::sleep(Duration::from_millis(100)).await;
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

    // The nemesis: one fault at a time, each healed before the next.
    let mut faults = Vec::new();
    let end = Instant::now() + Duration::from_secs(secs);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut round = 0;
    while Instant::now() < end {
        let Some(l) = leader(&http, &replicas).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let at = run.started.elapsed();
        let ids: Vec<u64> = replicas.iter().map(|r| r.id).collect();
        let others: Vec<u64> = ids.iter().copied().filter(|&id| id != l).collect();
        let what = match round % 7 {
            0 => {
                for &o in &others {
                    cut(&net, l, o);
                }
                format!("partition: leader {l} cut off from its peers")
            }
            1 => {
                replicas[l as usize - 1].signal("-STOP");
                format!("pause: leader {l} SIGSTOPped")
            }
            2 => {
                let victim = 1 + rand::random::<u64>() % ids.len() as u64;
                replicas[victim as usize - 1].kill();
                format!("kill -9: replica {victim}{}", if victim == l { " (the leader)" } else { "" })
            }
            3 => {
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
            4 => {
                for &o in &others {
                    ns_exec(&net.node(l), &["iptables", "-A", "OUTPUT", "-d", &format!("198.18.0.{o}"), "-j", "DROP"]);
                }
                format!("one-way: leader {l} hears its peers, they do not hear it")
            }
            5 => {
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
            _ => {
                for &x in &ids {
                    for &y in ids.iter().filter(|&&y| y != x) {
                        let ip = format!("198.18.0.{y}");
                        ns_exec(
                            &net.node(x),
                            &["iptables", "-A", "INPUT", "-s", &ip, "-m", "statistic", "--mode", "random", "--probability", "0.2", "-j", "DROP"],
                        );
                    }
                }
                "loss: 20% of packets between replicas dropped".to_string()
            }
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        heal(&net, &mut replicas, &members);
        faults.push(format!("{:>6.1}s {what}; healed after 5 s", at.as_secs_f64()));
        tokio::time::sleep(Duration::from_secs(4)).await;
        round += 1;
    }
    let _ = stop_tx.send(true);
    for c in clients {
        c.await.unwrap();
    }
    heal(&net, &mut replicas, &members);

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
            return Err(format!("replicas did not converge within 60 s after healing: {revisions:?}"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Final linearizable reads through every replica join the history.
    for (n, r) in replicas.iter().enumerate() {
        for key in KEYS {
            if run.read(&r.api(), key, 1000 + n).await.is_none() {
                return Err(format!("the final read of {key} through replica {} got no answer", r.id));
            }
        }
    }

    let mut anomalies = Vec::new();
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
    for r in &mut replicas {
        r.kill();
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
    let summary = format!(
        "result: replicas={} secs={secs} faults={} operations={checked} answered={} indeterminate={} final_revision={} max_write_gap_ms={max_gap_ms} anomalies={}\n{}",
        replicas.len(),
        faults.len(),
        h.ok,
        h.unknown,
        first.0.unwrap_or(0),
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
        Err(format!("{summary}\nANOMALIES:\n{}", anomalies.join("\n")))
    }
}
