//! Proxyless gRPC: real gRPC applications (Python `grpcio`, installed by
//! `tests/support/install-grpc-python.sh`) dial `xds:///HOST:PORT` with a
//! bootstrap written by `lodestar agent --grpc` (TLS to the replicas, the
//! mesh-CA workload certificate as the proxy credential), and call loopback
//! gRPC servers (`tests/support/grpc/server.py`) with no Envoy anywhere.
//!
//! Each test applies Istio config, then drives one client process
//! (`tests/support/grpc/client.py`, a JSON command a line) and counts which
//! server answered. Every load loop is bounded; waits are bounded polls.
//! Every test ends by checking `/debug/syncz`: the client's stream NACKed
//! nothing.

use crate::kit;

use kit::agent::{Agent, AgentBuilder};
use kit::{cli, cli_command, Cluster, Proc};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

const TARGET: &str = "echo.shop.svc.cluster.local:50051";
const CALL: &str = "v1 /lodestar.test.Echo/Call";

/// The Python with grpcio (`tests/support/install-grpc-python.sh`).
pub(crate) fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("LODESTAR_GRPC_PYTHON") {
        return p.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/install-grpc-python.sh");
    let out = Command::new(&script).output().expect("running install-grpc-python.sh");
    assert!(out.status.success(), "install-grpc-python.sh: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

/// The Node client's modules (`@grpc/grpc-js-xds`, pinned).
fn node_modules() -> PathBuf {
    if let Some(p) = std::env::var_os("LODESTAR_GRPC_NODE") {
        return p.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/install-grpc-node.sh");
    let out = Command::new(&script).output().expect("running install-grpc-node.sh");
    assert!(out.status.success(), "install-grpc-node.sh: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn support(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/grpc").join(file)
}

/// A loopback gRPC server answering with `identity`.
pub(crate) fn server(ip: &str, identity: &str) -> Proc {
    server_with(ip, identity, &[])
}

/// The same, with more arguments (`flaky`: every other call fails).
fn server_with(ip: &str, identity: &str, extra: &[&str]) -> Proc {
    let mut child = Command::new(python())
        .arg(support("server.py"))
        .args([ip, "50051", identity])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting server.py");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "server.py {identity} at {ip} did not start");
    Proc::new("server.py", child)
}

/// The proxyless client: one process, its channels kept across commands.
pub(crate) struct Client {
    _proc: Proc,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    log: PathBuf,
}

#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub replies: BTreeMap<String, u64>,
    pub errors: BTreeMap<String, u64>,
}

impl Client {
    fn start(bootstrap: &Path, log: PathBuf) -> Client {
        let mut cmd = Command::new(python());
        cmd.arg(support("client.py"));
        Client::spawn(cmd, bootstrap, log)
    }

    /// The Node client (`@grpc/grpc-js-xds`, client.js).
    fn start_node(bootstrap: &Path, log: PathBuf) -> Client {
        let mut cmd = Command::new("node");
        cmd.arg(support("client.js")).env("NODE_PATH", node_modules());
        Client::spawn(cmd, bootstrap, log)
    }

    fn spawn(mut cmd: Command, bootstrap: &Path, log: PathBuf) -> Client {
        let err = std::fs::File::create(&log).unwrap();
        let mut child = cmd
            .env("GRPC_XDS_BOOTSTRAP", bootstrap)
            .env("GRPC_VERBOSITY", "ERROR")
            // c-ares, which takes the DNS server a `dns://` target names.
            .env("GRPC_DNS_RESOLVER", "ares")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .expect("starting the gRPC client");
        let (stdin, stdout) = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
        kit::process::register_log("gRPC client", &log);
        Client { _proc: Proc::new("gRPC client", child), stdin, stdout, log }
    }

    /// A client of plain channels only (`call_at`), no xDS.
    pub(crate) fn plain(log: PathBuf) -> Client {
        let mut cmd = Command::new(python());
        cmd.arg(support("client.py"));
        Client::spawn(cmd, Path::new("/nonexistent"), log)
    }

    /// `calls` calls (bounded), with `metadata`, tallied.
    fn call(&mut self, target: &str, method: &str, metadata: &[(&str, &str)], calls: u32) -> Tally {
        self.call_via(None, target, method, metadata, calls)
    }

    /// The same through `address` (an Envoy), `target` as the authority.
    pub(crate) fn call_at(&mut self, address: &str, target: &str, method: &str, metadata: &[(&str, &str)], calls: u32) -> Tally {
        self.call_via(Some(address), target, method, metadata, calls)
    }

    fn call_via(&mut self, address: Option<&str>, target: &str, method: &str, metadata: &[(&str, &str)], calls: u32) -> Tally {
        let md: serde_json::Map<String, Value> = metadata.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
        let mut cmd = json!({"target": target, "method": method, "metadata": md, "calls": calls, "timeout": 5});
        if let Some(a) = address {
            cmd["address"] = json!(a);
        }
        writeln!(self.stdin, "{cmd}").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("client.py answered {line:?} ({e}); its log:\n{}", self.log()));
        assert!(v["fatal"].is_null(), "client.py: {v}; its log:\n{}", self.log());
        let map = |k: &str| v[k].as_object().map(|m| m.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect()).unwrap_or_default();
        Tally { replies: map("replies"), errors: map("errors") }
    }

    /// Call until every reply of a batch satisfies `ok` (bounded: 60 batches).
    fn wait_for(&mut self, target: &str, metadata: &[(&str, &str)], what: &str, ok: impl Fn(&Tally) -> bool) -> Tally {
        let mut last = Tally::default();
        for _ in 0..60 {
            last = self.call(target, "/lodestar.test.Echo/Call", metadata, 20);
            if ok(&last) {
                return last;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!("{what}: not reached; last batch {last:?}; client log:\n{}", self.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `lodestar agent --grpc`: a mesh-CA workload certificate for shop/client
/// (joined with a join token) in `dir`, and the gRPC bootstrap using it.
async fn agent(api: &str, xds_servers: &str, dir: &Path) -> (Agent, PathBuf) {
    agent_with(api, xds_servers, dir, &[]).await
}

/// The same, with more arguments for the agent.
async fn agent_with(api: &str, xds_servers: &str, dir: &Path, extra: &[&str]) -> (Agent, PathBuf) {
    let bootstrap = dir.join("grpc-bootstrap.json");
    let agent = AgentBuilder::new("shop", "client", xds_servers, dir)
        .identity_dir(&dir.join("certs"))
        .join_token(api, "shop/client")
        .args(["--grpc", "--bootstrap"])
        .args([&bootstrap])
        .args(extra)
        .start();
    agent.wait_for_files(&[&bootstrap]).await;
    (agent, bootstrap)
}

/// The config: echo (v1 at .11, v2 at .12 and .13) with subsets; `x-canary: yes`
/// goes to v2; `x-fault: abort` is aborted with UNAVAILABLE, `x-fault:
/// delay` delayed 10 s under a 300 ms timeout; the rest is split
/// `v1_weight`/`100 - v1_weight`. LB policies (least request → gRPC's
/// round robin, ring hash), outlier detection and retries are there so a
/// NACK of any of them would fail the test.
fn config(ip: &dyn Fn(u8) -> String, v1_weight: u32) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: echo, namespace: shop}}
spec:
  hosts: [echo.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 50051, name: grpc, protocol: GRPC}}]
  endpoints:
  - {{address: {v1}, labels: {{version: v1}}}}
  - {{address: {v2}, labels: {{version: v2}}}}
  - {{address: {v2b}, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: echo, namespace: shop}}
spec:
  host: echo.shop.svc.cluster.local
  trafficPolicy:
    loadBalancer: {{simple: LEAST_REQUEST}}
    outlierDetection: {{consecutive5xxErrors: 5, interval: 10s, baseEjectionTime: 30s}}
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - name: v2
    labels: {{version: v2}}
    trafficPolicy: {{loadBalancer: {{consistentHash: {{httpHeaderName: x-user}}}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: echo, namespace: shop}}
spec:
  hosts: [echo]
  http:
  - name: canary
    match: [{{headers: {{x-canary: {{exact: "yes"}}}}}}]
    route: [{{destination: {{host: echo, subset: v2}}}}]
    retries: {{attempts: 2, retryOn: "unavailable,cancelled"}}
  - name: faulty
    match: [{{headers: {{x-fault: {{exact: abort}}}}}}]
    fault: {{abort: {{grpcStatus: UNAVAILABLE, percentage: {{value: 100}}}}}}
    route: [{{destination: {{host: echo, subset: v1}}}}]
  - name: slow
    match: [{{headers: {{x-fault: {{exact: delay}}}}}}]
    fault: {{delay: {{fixedDelay: 10s, percentage: {{value: 100}}}}}}
    timeout: 300ms
    route: [{{destination: {{host: echo, subset: v1}}}}]
  - name: split
    route:
    - {{destination: {{host: echo, subset: v1}}, weight: {w1}}}
    - {{destination: {{host: echo, subset: v2}}, weight: {w2}}}
"#,
        v1 = ip(11),
        v2 = ip(12),
        v2b = ip(13),
        w1 = v1_weight,
        w2 = 100 - v1_weight
    )
}

/// `flaky` (one server at .14) with `attempts` retries on `unavailable`.
fn flaky_config(ip: &dyn Fn(u8) -> String, attempts: u32) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: flaky, namespace: shop}}
spec:
  hosts: [flaky.shop.svc.cluster.local]
  location: MESH_INTERNAL
  resolution: STATIC
  ports: [{{number: 50051, name: grpc, protocol: GRPC}}]
  endpoints: [{{address: {addr}}}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: flaky, namespace: shop}}
spec:
  hosts: [flaky]
  http:
  - route: [{{destination: {{host: flaky}}}}]
    retries: {retries}
"#,
        addr = ip(14),
        // Istio refuses retryOn with no attempts.
        retries = if attempts == 0 { "{attempts: 0}".to_string() } else { format!("{{attempts: {attempts}, retryOn: unavailable}}") }
    )
}

/// The client's streams on every live replica: (replica id, its status).
async fn grpc_streams(c: &Cluster, live: &[u64]) -> Vec<(u64, Value)> {
    let mut out = Vec::new();
    for id in live {
        let s = kit::mesh::syncz(&c.http, &c.replica(*id).api()).await;
        for p in s["proxies"].as_array().into_iter().flatten().filter(|p| p["kind"] == "grpc") {
            out.push((*id, p.clone()));
        }
    }
    out
}

/// Every stream of the client ACKed every type, NACKed nothing, and
/// generated without error.
async fn assert_no_nacks(c: &Cluster, live: &[u64]) {
    let streams = grpc_streams(c, live).await;
    assert!(!streams.is_empty(), "no gRPC client stream on replicas {live:?}");
    for (id, p) in streams {
        assert!(p["generate_error"].is_null(), "replica {id}: {p:#}");
        for t in ["LDS", "RDS", "CDS", "EDS"] {
            assert!(p["types"][t]["acked_version"].is_string(), "replica {id}: the gRPC client never ACKed {t}: {p:#}");
        }
        for (t, s) in p["types"].as_object().unwrap() {
            assert!(s["last_nack"].is_null(), "replica {id}: the gRPC client NACKed {t}: {:#}", s["last_nack"]);
        }
    }
}

fn prefix(c: &Cluster) -> String {
    let ip = &c.replica(1).ip;
    ip[..ip.rfind('.').unwrap()].to_string()
}

/// A weighted split observed over 1,000 calls, a header-match route, fault
/// injection and a route timeout, a change of weights picked up by the
/// running client; zero NACKs. Then a client claiming another namespace
/// with the same certificate is refused.
#[tokio::test(flavor = "multi_thread")]
async fn weighted_split_and_header_route_through_lodestar() {
    let c = Cluster::start(1, "").await;
    let p = prefix(&c);
    let ip = |n: u8| format!("{p}.{n}");
    let _servers = [server(&ip(11), "v1"), server(&ip(12), "v2"), server(&ip(13), "v2-b")];
    kit::applied(&c.http, &c.replica(1).api(), &config(&ip, 75)).await;
    let dir = tempfile::tempdir().unwrap();
    let (_agent, bootstrap) = agent(&c.replica(1).api(), &c.replica(1).xds_addr(), dir.path()).await;
    let mut client = Client::start(&bootstrap, dir.path().join("client.log"));

    // 75/25 over 1,000 calls: v1 within 75% ± 5 points (more than 3.6
    // standard deviations of a fair 75/25 draw).
    client.wait_for(TARGET, &[], "the first call", |t| t.errors.is_empty() && t.replies.values().sum::<u64>() == 20);
    let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[], 1000);
    assert!(t.errors.is_empty(), "{t:?}");
    let v1 = t.replies.get(CALL).copied().unwrap_or(0);
    let v2: u64 = t.replies.iter().filter(|(k, _)| k.starts_with("v2")).map(|(_, n)| n).sum();
    println!("75/25 split over 1000 calls: v1 {v1}, v2 {v2}");
    assert_eq!(v1 + v2, 1000, "{t:?}");
    assert!((700..=800).contains(&v1), "v1 answered {v1} of 1000 (want 750 ± 50): {t:?}");

    // The header route: all to v2 (either of its two servers), on any method.
    let t = client.call(TARGET, "/lodestar.test.Echo/Other", &[("x-canary", "yes")], 200);
    assert!(t.errors.is_empty() && t.replies.keys().all(|k| k.starts_with("v2") && k.ends_with(" /lodestar.test.Echo/Other")), "{t:?}");
    assert_eq!(t.replies.values().sum::<u64>(), 200, "{t:?}");
    // Ring hash on x-user (the v2 subset's consistentHash, gRFC A42): each
    // user sticks to one of the two v2 servers, and the users together use
    // both.
    let mut used = std::collections::BTreeSet::new();
    // (Sixteen users on one server by chance: one run in 30,000.)
    for i in 0..16 {
        let user = format!("user-{i}");
        let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[("x-canary", "yes"), ("x-user", &user)], 10);
        assert!(t.errors.is_empty() && t.replies.len() == 1, "{user} went to more than one server: {t:?}");
        used.extend(t.replies.keys().cloned());
    }
    assert_eq!(used.len(), 2, "sixteen users all hashed to one server: {used:?}");
    // A short name the client's namespace may dial resolves too.
    let t = client.call("echo.shop:50051", "/lodestar.test.Echo/Call", &[("x-canary", "yes")], 10);
    assert!(t.errors.is_empty() && t.replies.keys().all(|k| k.starts_with("v2")) && t.replies.values().sum::<u64>() == 10, "{t:?}");

    // Fault injection (gRFC A33) and the route timeout (A31, as
    // max_stream_duration): the client sees the injected status, and the
    // deadline the route sets.
    let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[("x-fault", "abort")], 10);
    assert!(t.replies.is_empty() && t.errors.keys().all(|e| e.starts_with("UNAVAILABLE")) && t.errors.values().sum::<u64>() == 10, "{t:?}");
    let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[("x-fault", "delay")], 3);
    assert!(t.replies.is_empty() && t.errors.keys().all(|e| e.starts_with("DEADLINE_EXCEEDED")) && t.errors.values().sum::<u64>() == 3, "{t:?}");

    // Retries (gRFC A44): a server failing every other call with
    // UNAVAILABLE; no retries, and half the calls fail; three attempts on
    // `unavailable`, and none does.
    let _flaky = server_with(&ip(14), "flaky", &["flaky"]);
    kit::applied(&c.http, &c.replica(1).api(), &flaky_config(&ip, 0)).await;
    let flaky = "flaky.shop.svc.cluster.local:50051";
    let t = client.wait_for(flaky, &[], "the flaky service", |t| !t.replies.is_empty());
    assert!(!t.errors.is_empty() && t.errors.keys().all(|e| e.starts_with("UNAVAILABLE")), "{t:?}");
    let t = client.call(flaky, "/lodestar.test.Echo/Call", &[], 40);
    assert_eq!((t.replies.values().sum::<u64>(), t.errors.values().sum::<u64>()), (20, 20), "{t:?}");
    kit::applied(&c.http, &c.replica(1).api(), &flaky_config(&ip, 3)).await;
    client.wait_for(flaky, &[], "retried", |t| t.errors.is_empty());
    let t = client.call(flaky, "/lodestar.test.Echo/Call", &[], 100);
    assert_eq!(t.replies.get("flaky /lodestar.test.Echo/Call"), Some(&100), "{t:?}");

    // New weights reach the running client.
    kit::applied(&c.http, &c.replica(1).api(), &config(&ip, 0)).await;
    client.wait_for(TARGET, &[], "all to v2", |t| t.errors.is_empty() && t.replies.keys().all(|k| k.starts_with("v2")));
    assert_no_nacks(&c, &[1]).await;
    drop(client);

    // The workload certificate of shop/client is no credential for a client
    // claiming namespace bank: its stream is refused (PERMISSION_DENIED),
    // so it gets no config and its calls fail.
    let certs = dir.path().join("certs");
    let (ok, out, err) = cli(
        &c.replica(1).api(),
        &["bootstrap", "--grpc", "--name", "client", "--namespace", "bank", "--xds-servers", &c.replica(1).xds_addr(), "--cert-dir", certs.to_str().unwrap()],
    );
    assert!(ok, "bootstrap --grpc: {err}");
    let other = dir.path().join("bank-bootstrap.json");
    std::fs::write(&other, out).unwrap();
    let mut intruder = Client::start(&other, dir.path().join("intruder.log"));
    let t = intruder.call(TARGET, "/lodestar.test.Echo/Call", &[], 3);
    assert!(t.replies.is_empty() && t.errors.values().sum::<u64>() == 3, "{t:?}");
    let syncz = kit::mesh::syncz(&c.http, &c.replica(1).api()).await;
    let refused =
        syncz["refused"].as_array().unwrap().iter().any(|x| x["code"] == "permission_denied" && x["proxy"].as_str().is_some_and(|id| id.contains(".bank~")));
    assert!(refused, "{syncz:#}");
}

/// A DNS server on loopback (UDP) that answers A queries for `name` with
/// `ips`, in order, and anything else with no answers: what a deployment's
/// DNS does for a name that lists every replica. gRPC's c-ares resolver
/// asks it when the bootstrap's server is `dns://IP:PORT/NAME:PORT`.
async fn dns_server(bind: &str, name: &'static str, ips: Vec<std::net::Ipv4Addr>) -> (String, tokio::task::JoinHandle<()>) {
    let sock = tokio::net::UdpSocket::bind(format!("{bind}:0")).await.unwrap();
    let addr = sock.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut buf = [0u8; 512];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else { return };
            let q = &buf[..n];
            if n < 12 {
                continue;
            }
            // The question: labels up to a zero byte, then type and class.
            let (mut i, mut labels) = (12, Vec::new());
            while i < n && q[i] != 0 {
                let len = q[i] as usize;
                if i + 1 + len > n {
                    break;
                }
                labels.push(String::from_utf8_lossy(&q[i + 1..i + 1 + len]).to_lowercase());
                i += 1 + len;
            }
            if i + 5 > n {
                continue;
            }
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            let question = &q[12..i + 5];
            let answers: &[std::net::Ipv4Addr] = if qtype == 1 && labels.join(".") == name { &ips } else { &[] };
            let mut r = Vec::with_capacity(512);
            r.extend_from_slice(&q[0..2]); // id
            r.extend_from_slice(&[0x81, 0x80]); // response, recursion desired and available, NOERROR
            r.extend_from_slice(&[0, 1]);
            r.extend_from_slice(&(answers.len() as u16).to_be_bytes());
            r.extend_from_slice(&[0, 0, 0, 0]);
            r.extend_from_slice(question);
            for ip in answers {
                // The question's name (pointer), A, IN, TTL 1 s, 4 bytes.
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
                r.extend_from_slice(&ip.octets());
            }
            let _ = sock.send_to(&r, from).await;
        }
    });
    (addr, task)
}

/// The replica serving the client is killed: calls go on, the client
/// reconnects to another replica and a change applied afterwards reaches
/// it. The replicas are one name in the bootstrap (`dns://.../NAME:PORT`,
/// a name with every replica's address, as a deployment's DNS would have
/// it, and in every replica's certificate: `tls_hosts`): gRPC's channel to
/// its xDS server then moves to the next address when its replica goes.
/// (With one `xds_servers` entry per replica, gRPC falls back to the next
/// entry only for resources it has not received yet, A71: a running
/// channel keeps waiting for the first replica.)
#[tokio::test(flavor = "multi_thread")]
async fn the_client_survives_the_loss_of_its_replica() {
    const NAME: &str = "xds.lodestar.test";
    // Several members share one mesh CA (it signs the client's certificate).
    let mesh_ca = tempfile::tempdir().unwrap();
    let out = cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(mesh_ca.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut c = Cluster::start(3, &format!("mesh_ca_dir = {:?}\ntls_hosts = [{NAME:?}]\n", mesh_ca.path())).await;
    let p = prefix(&c);
    let ip = |n: u8| format!("{p}.{n}");
    let _servers = [server(&ip(11), "v1"), server(&ip(12), "v2"), server(&ip(13), "v2-b")];
    kit::applied(&c.http, &c.replica(1).api(), &config(&ip, 100)).await;
    let ips = c.replicas.iter().map(|r| r.ip.parse().unwrap()).collect();
    let (dns, _dns_task) = dns_server(&ip(53), NAME, ips).await;

    // The workload certificate from an agent; the bootstrap from
    // `lodestar bootstrap --grpc` naming the replicas by that name.
    let dir = tempfile::tempdir().unwrap();
    let (_agent, _) = agent(&c.replica(1).api(), &c.replica(1).xds_addr(), dir.path()).await;
    let port = c.replica(1).xds_addr().rsplit_once(':').unwrap().1.to_string();
    let target = format!("dns://{dns}/{NAME}:{port}");
    let (ok, out, err) = cli(
        &c.replica(1).api(),
        &["bootstrap", "--grpc", "--name", "client", "--namespace", "shop", "--xds-servers", &target, "--cert-dir", dir.path().join("certs").to_str().unwrap()],
    );
    assert!(ok, "bootstrap --grpc: {err}");
    let bootstrap = dir.path().join("dns-bootstrap.json");
    std::fs::write(&bootstrap, &out).unwrap();
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["xds_servers"][0]["server_uri"], target.as_str());

    let mut client = Client::start(&bootstrap, dir.path().join("client.log"));
    client.wait_for(TARGET, &[], "v1", |t| t.replies.get(CALL) == Some(&20));
    // One replica serves it (one of the name's addresses).
    let streams = grpc_streams(&c, &[1, 2, 3]).await;
    assert_eq!(streams.len(), 1, "{streams:?}");
    let serving = streams[0].0;
    assert_no_nacks(&c, &[1, 2, 3]).await;

    c.kill(serving);
    let live: Vec<u64> = [1, 2, 3].into_iter().filter(|id| *id != serving).collect();
    // Calls go on while its replica is gone (the client keeps its config).
    let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[], 100);
    assert_eq!(t.replies.get(CALL), Some(&100), "{t:?}");
    // A change through a surviving replica (once the two have a leader)
    // reaches the running client.
    c.wait_for_leader(Duration::from_secs(20)).await;
    kit::applied(&c.http, &c.replica(live[0]).api(), &config(&ip, 0)).await;
    client.wait_for(TARGET, &[], "the change, from another replica", |t| t.errors.is_empty() && t.replies.keys().all(|k| k.starts_with("v2")));
    let streams = grpc_streams(&c, &live).await;
    assert_eq!(streams.len(), 1, "one replica of {live:?} serves the client now: {streams:?}");
    assert_no_nacks(&c, &live).await;
}

/// Node's `@grpc/grpc-js-xds` speaks only plaintext to its xDS server, so
/// it dials the agent's local xDS socket (`lodestar agent --xds-socket`),
/// which forwards over mutual TLS with the workload certificate: a 75/25
/// split over 1,000 calls, the header route, zero NACKs; then the replica
/// the agent forwards to is killed, and the client, reconnecting through
/// the socket, gets a change made through another replica.
#[tokio::test(flavor = "multi_thread")]
async fn node_client_through_the_agents_xds_socket() {
    let mesh_ca = tempfile::tempdir().unwrap();
    let out = cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(mesh_ca.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut c = Cluster::start(3, &format!("mesh_ca_dir = {:?}\n", mesh_ca.path())).await;
    let p = prefix(&c);
    let ip = |n: u8| format!("{p}.{n}");
    let _servers = [server(&ip(11), "v1"), server(&ip(12), "v2"), server(&ip(13), "v2-b")];
    kit::applied(&c.http, &c.replica(1).api(), &config(&ip, 75)).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("xds.sock");
    let servers: Vec<String> = (1..=3).map(|id| c.replica(id).xds_addr()).collect();
    let (_agent, bootstrap) = agent_with(&c.replica(1).api(), &servers.join(","), dir.path(), &["--xds-socket", socket.to_str().unwrap()]).await;
    // The bootstrap names the socket, in the clear: a local hop only.
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(&bootstrap).unwrap()).unwrap();
    assert_eq!(doc["xds_servers"][0]["server_uri"], format!("unix://{}", socket.display()).as_str(), "{doc:#}");
    assert_eq!(doc["xds_servers"][0]["channel_creds"][0]["type"], "insecure", "{doc:#}");
    use std::os::unix::fs::PermissionsExt;
    kit::until("the agent's xDS socket", Duration::from_secs(30), || async { socket.exists() }).await;
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);

    let mut client = Client::start_node(&bootstrap, dir.path().join("client.log"));
    client.wait_for(TARGET, &[], "the first call", |t| t.errors.is_empty() && t.replies.values().sum::<u64>() == 20);
    let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[], 1000);
    assert!(t.errors.is_empty(), "{t:?}");
    let v1 = t.replies.get(CALL).copied().unwrap_or(0);
    let v2: u64 = t.replies.iter().filter(|(k, _)| k.starts_with("v2")).map(|(_, n)| n).sum();
    println!("node: 75/25 split over 1000 calls: v1 {v1}, v2 {v2}");
    assert_eq!(v1 + v2, 1000, "{t:?}");
    assert!((700..=800).contains(&v1), "v1 answered {v1} of 1000 (want 750 ± 50): {t:?}");
    let t = client.call(TARGET, "/lodestar.test.Echo/Other", &[("x-canary", "yes")], 100);
    assert!(t.errors.is_empty() && t.replies.keys().all(|k| k.starts_with("v2") && k.ends_with(" /lodestar.test.Echo/Other")), "{t:?}");
    assert_eq!(t.replies.values().sum::<u64>(), 100, "{t:?}");

    // The replica sees the agent's certificate: the stream is the
    // client's (shop/client), on replica 1 (the agent's first server).
    let streams = grpc_streams(&c, &[1, 2, 3]).await;
    assert_eq!(streams.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [1], "{streams:?}");
    assert_no_nacks(&c, &[1]).await;

    c.kill(1);
    let t = client.call(TARGET, "/lodestar.test.Echo/Call", &[], 50);
    assert_eq!(t.replies.values().sum::<u64>(), 50, "calls go on while the replica is gone: {t:?}");
    c.wait_for_leader(Duration::from_secs(20)).await;
    kit::applied(&c.http, &c.replica(2).api(), &config(&ip, 0)).await;
    client.wait_for(TARGET, &[], "the change, through another replica", |t| t.errors.is_empty() && t.replies.keys().all(|k| k.starts_with("v2")));
    let streams = grpc_streams(&c, &[2, 3]).await;
    assert_eq!(streams.len(), 1, "{streams:?}");
    assert_no_nacks(&c, &[2, 3]).await;
}
