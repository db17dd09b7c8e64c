//! Transparent capture (`lodestar agent --capture`) end to end, on "VMs"
//! made of network namespaces: VM A (198.18.X.2) runs the agent in capture
//! mode with a real Envoy and unmodified clients (`curl`, a Python socket
//! client) that dial service addresses; VM B (198.18.X.66, a veth to A)
//! runs the applications (two HTTP servers, two TCP servers). The replica
//! runs in the root namespace on the root end of A's veth (198.18.X.1):
//! loopback does not cross namespaces.
//!
//! Checked: the rules `--dry-run` prints are the ones installed; HTTP to a
//! service VIP follows its VirtualService (a 75/25 split, a response
//! header only the route sets) through Envoy (its stats); two TCP services
//! on one port are told apart by address; a destination outside the mesh
//! passes through, and is refused under REGISTRY_ONLY; mutual TLS between
//! the VMs (VM B captured inbound, its AuthorizationPolicy applied); no
//! NACK; SIGTERM removes every rule (`iptables-save`
//! before and after, another tool's rules kept); a SIGKILLed agent's
//! leftovers are removed by the next start; another tool's REDIRECT and a
//! missing CAP_NET_ADMIN are refused with nothing installed.

use crate::kit;

use kit::agent::AgentBuilder;
use kit::{eventually, Cluster};
use std::process::Command;
use std::time::Duration;

const NS: &str = "shop";
const BOUND: Duration = Duration::from_secs(60);

/// Two network namespaces (VM A, VM B) and their veths, deleted (with
/// every process in them) when dropped, also when the test fails.
struct Topology {
    a: String,
    b: String,
    /// The third octet of this test's 198.18.X.0/24.
    x: u32,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("the `ip` tool (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl Topology {
    fn create() -> Topology {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates network namespaces: run it as root");
        // One /24 per test process (nextest runs each test in its own).
        let x = 100 + std::process::id() % 150;
        let t = Topology { a: format!("lsc{x}a"), b: format!("lsc{x}b"), x };
        for ns in [&t.a, &t.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            ip(&["netns", "add", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        let root_end = format!("lsc{x}r");
        let _ = Command::new("ip").args(["link", "del", &root_end]).output();
        // Root <-> A: the replica's side.
        ip(&["link", "add", &root_end, "type", "veth", "peer", "name", "eth0", "netns", &t.a]);
        ip(&["addr", "add", &format!("198.18.{x}.1/26"), "dev", &root_end]);
        ip(&["link", "set", &root_end, "up"]);
        ip(&["-n", &t.a, "addr", "add", &format!("198.18.{x}.2/26"), "dev", "eth0"]);
        ip(&["-n", &t.a, "link", "set", "eth0", "up"]);
        // A's default route: service VIPs (198.19.X.0/24) need a route to
        // be dialled at all; the capture rules then take them to Envoy.
        ip(&["-n", &t.a, "route", "add", "default", "via", &format!("198.18.{x}.1")]);
        // A <-> B.
        ip(&["-n", &t.a, "link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", &t.b]);
        ip(&["-n", &t.a, "addr", "add", &format!("198.18.{x}.65/26"), "dev", "eth1"]);
        ip(&["-n", &t.a, "link", "set", "eth1", "up"]);
        ip(&["-n", &t.b, "addr", "add", &format!("198.18.{x}.66/26"), "dev", "eth0"]);
        ip(&["-n", &t.b, "link", "set", "eth0", "up"]);
        // Root <-> B: B's agent reaches the replica (198.18.X.1, a local
        // address of the root namespace) over it.
        let root_b = format!("lsc{x}s");
        let _ = Command::new("ip").args(["link", "del", &root_b]).output();
        ip(&["link", "add", &root_b, "type", "veth", "peer", "name", "eth1", "netns", &t.b]);
        ip(&["addr", "add", &format!("198.18.{x}.129/26"), "dev", &root_b]);
        ip(&["link", "set", &root_b, "up"]);
        ip(&["-n", &t.b, "addr", "add", &format!("198.18.{x}.130/26"), "dev", "eth1"]);
        ip(&["-n", &t.b, "link", "set", "eth1", "up"]);
        ip(&["-n", &t.b, "route", "add", &format!("198.18.{x}.1/32"), "via", &format!("198.18.{x}.129")]);
        t
    }

    fn addr(&self, host: u32) -> String {
        format!("198.18.{}.{host}", self.x)
    }

    /// Files `ip netns exec` mounts over /etc in `ns` (its resolv.conf,
    /// nsswitch.conf): removed with the namespace.
    fn netns_etc(&self, ns: &str, files: &[(&str, &str)]) {
        let dir = std::path::PathBuf::from(format!("/etc/netns/{ns}"));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    fn vip(&self, host: u32) -> String {
        format!("198.19.{}.{host}", self.x)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            }
            // The veths go with their namespace.
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
            // Files `ip netns exec` mounts over /etc (`netns_etc`).
            let _ = std::fs::remove_dir_all(format!("/etc/netns/{ns}"));
        }
    }
}

/// Run `args` in the namespace `ns`: (success, stdout, stderr).
fn exec(ns: &str, args: &[&str]) -> (bool, String, String) {
    let out = Command::new("ip").args(["netns", "exec", ns]).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `iptables-save` in `ns`, without its comments and counters: what an
/// agent's exit must restore.
fn rules(ns: &str) -> String {
    let (ok, out, err) = exec(ns, &["iptables-save"]);
    assert!(ok, "iptables-save: {err}");
    let counters = regex_lite_counters(&out);
    counters.lines().filter(|l| !l.starts_with('#')).map(|l| format!("{l}\n")).collect()
}

/// `[12:345]` counters replaced by `[_]`.
fn regex_lite_counters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('[') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        match tail.find(']') {
            Some(j) if tail[1..j].split(':').all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) => {
                out.push_str("[_]");
                rest = &tail[j + 1..];
            }
            _ => {
                out.push('[');
                rest = &tail[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The `-A` lines of an iptables dump, normalized as `iptables-save`
/// prints them (`-p tcp --dport` gains `-m tcp`).
fn appended(text: &str) -> Vec<String> {
    text.lines().filter(|l| l.starts_with("-A ")).map(|l| l.replace("-p tcp --dport", "-p tcp -m tcp --dport")).collect()
}

/// The applications on VM B: HTTP servers answering their name (v1 on
/// 8081, v2 on 8082) and TCP servers greeting with theirs (orders-db on
/// 15432, users-db on 25432).
const APPS: &str = r#"
import socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
def http(port, name):
    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (name + "\n").encode()
            self.send_response(200)
            self.send_header("x-client-cert", self.headers.get("x-forwarded-client-cert", "none"))
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *a):
            pass
    ThreadingHTTPServer(("0.0.0.0", port), H).serve_forever()
def tcp(port, name):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port))
    s.listen(64)
    while True:
        c, _ = s.accept()
        c.sendall((name + "\n").encode())
        c.close()
for f, port, name in [(http, 8081, "v1"), (http, 8082, "v2"), (tcp, 15432, "orders-db"), (tcp, 25432, "users-db")]:
    threading.Thread(target=f, args=(port, name), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// An unmodified gRPC client: one unary call to TARGET (a name the
/// system resolver answers), printing the reply (tests/support/grpc's
/// server answers with its identity and the method).
const GRPC_CALL: &str = "import grpc,sys; ch=grpc.insecure_channel(sys.argv[1]); print(ch.unary_unary('/lodestar.test.Echo/Call')(b'', timeout=5).decode())";

/// An unmodified TCP client: connect to ADDR:PORT, print what it reads.
const TCP_CLIENT: &str = "import socket,sys; s=socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5); print(s.recv(100).decode().strip())";

fn mesh_yaml(t: &Topology) -> String {
    let b = t.addr(66);
    format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: reviews, namespace: shop}}
spec:
  addresses: [{reviews}]
  ports: [{{name: http, number: 9080}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: reviews-v1, namespace: shop, labels: {{version: v1}}}}
spec: {{service: reviews, address: {b}, port: 8081, serviceAccount: reviews}}
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: reviews-v2, namespace: shop, labels: {{version: v2}}}}
spec: {{service: reviews, address: {b}, port: 8082, serviceAccount: reviews}}
---
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {{name: reviews, namespace: shop}}
spec:
  host: reviews
  subsets:
  - {{name: v1, labels: {{version: v1}}}}
  - {{name: v2, labels: {{version: v2}}}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: reviews, namespace: shop}}
spec:
  hosts: [reviews]
  http:
  - headers: {{response: {{set: {{x-routed-by: lodestar}}}}}}
    route:
    - {{destination: {{host: reviews, subset: v1}}, weight: 75}}
    - {{destination: {{host: reviews, subset: v2}}, weight: 25}}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: orders-db, namespace: shop}}
spec:
  addresses: [{orders}]
  ports: [{{name: tcp-pg, number: 5432}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: orders-db-1, namespace: shop}}
spec: {{service: orders-db, address: {b}, port: 15432, serviceAccount: reviews}}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: users-db, namespace: shop}}
spec:
  addresses: [{users}]
  ports: [{{name: tcp-pg, number: 5432}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: users-db-1, namespace: shop}}
spec: {{service: users-db, address: {b}, port: 25432, serviceAccount: reviews}}
"#,
        reviews = t.vip(10),
        orders = t.vip(20),
        users = t.vip(21),
    )
}

/// The counters of the Envoy in `ns` (its admin is on the VM's loopback).
fn stats(ns: &str) -> std::collections::BTreeMap<String, u64> {
    let (ok, out, err) = exec(ns, &["curl", "-s", "--max-time", "5", "http://127.0.0.1:15000/stats"]);
    assert!(ok, "stats: {err}");
    out.lines().filter_map(|l| l.split_once(": ")).filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?))).collect()
}

fn stat(s: &std::collections::BTreeMap<String, u64>, key: &str) -> u64 {
    s.get(key).copied().unwrap_or(0)
}

/// The agent for shop/web in VM A, in capture mode, running Envoy.
fn agent(t: &Topology, root: &std::path::Path, xds: &str, extra: &[&str]) -> AgentBuilder {
    vm_agent(&t.a, "web", &t.addr(2), root, xds).args(extra)
}

/// The agent for shop/NAME in the VM `ns` at `ip`, in capture mode,
/// running Envoy.
fn vm_agent(ns: &str, name: &str, ip: &str, root: &std::path::Path, xds: &str) -> AgentBuilder {
    AgentBuilder::new(NS, name, xds, &root.join(name))
        .netns(ns)
        .args(["--ip", ip, "--label", &format!("app={name}"), "--admin-port", "15000", "-o", "json", "--run-envoy", "--drain-time", "1s", "--capture"])
        .env("LODESTAR_ENVOY", kit::envoy::envoy_binary())
}

/// Until the Envoy of shop/NAME in the VM `ns` is ready and its proxy has
/// ACKed everything with no NACK (the replica's sync status).
async fn wait_served(ns: &str, name: &str, api: &str) {
    let ns = ns.to_string();
    eventually(&format!("Envoy in {ns} ready"), BOUND, || {
        let ns = ns.clone();
        async move { exec(&ns, &["curl", "-sf", "--max-time", "2", "http://127.0.0.1:15000/ready"]).0.then_some(()) }
    })
    .await;
    let http = kit::http();
    let id_part = format!("~{name}.{NS}~");
    eventually("the captured proxy in sync, no NACK", BOUND, || async {
        let s = kit::mesh::syncz(&http, api).await;
        let p = s["proxies"].as_array()?.iter().find(|p| p["id"].as_str().is_some_and(|id| id.contains(&id_part)))?.clone();
        for (ty, v) in p["types"].as_object()? {
            assert!(v["last_nack"].is_null(), "the captured proxy NACKed {ty}: {}", v["last_nack"]);
        }
        assert!(p["generate_error"].is_null(), "{}", p["generate_error"]);
        p["types"].as_object()?.values().all(|v| v["in_sync"] == true && !v["acked_version"].is_null()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_redirects_an_unmodified_client_through_envoy() {
    let t = Topology::create();
    let mut cluster = Cluster::prepare_on(1, "", &format!("198.18.{}", t.x));
    cluster.launch().await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    // Envoy runs as uid 1337: it must traverse to the agent's directory.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (status, body) = kit::apply(&kit::http(), &api, mesh_yaml(&t).as_str()).await;
    assert_eq!(status, 200, "{body}");
    let mut apps = Command::new("ip");
    apps.args(["netns", "exec", &t.b, "python3", "-c", APPS]);
    let _apps = kit::Proc::spawn("apps in VM B", apps, &tmp.path().join("apps.log"));
    let b_addr = t.addr(66);
    let a = t.a.clone();
    eventually("the apps in VM B", BOUND, || {
        let (a, b) = (a.clone(), b_addr.clone());
        async move { exec(&a, &["python3", "-c", TCP_CLIENT, &b, "15432"]).1.contains("orders-db").then_some(()) }
    })
    .await;

    // Another tool's rules that do not capture: kept as they are.
    let (ok, _, err) = exec(&t.a, &["iptables", "-t", "nat", "-A", "POSTROUTING", "-o", "eth1", "-j", "MASQUERADE"]);
    assert!(ok, "{err}");
    let (ok, _, err) = exec(&t.a, &["iptables", "-A", "INPUT", "-p", "tcp", "--dport", "9", "-j", "ACCEPT"]);
    assert!(ok, "{err}");
    let before = rules(&t.a);
    assert!(!before.contains("LODESTAR"), "{before}");

    // 1. --dry-run prints the rules (the replica excluded) and installs none.
    let (ok, dry, err) = exec(&t.a, &[kit::BIN, "agent", "--dir", "/nonexistent", "--name", "web", "--xds-servers", &xds, "--capture", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(dry.contains(&format!("-A LODESTAR_OUTPUT -d {}/32 -j RETURN", r.ip)), "{dry}");
    assert!(dry.contains("-A LODESTAR_OUTPUT -m owner --uid-owner 1337 -j RETURN"), "{dry}");
    assert_eq!(rules(&t.a), before, "--dry-run installed rules");

    // 2. The agents install exactly those rules, and Envoy takes the
    // traffic: VM A's outbound, VM B's inbound (all ports).
    let _reviews = vm_agent(&t.b, "reviews", &t.addr(66), tmp.path(), &xds).join_token(&api, "shop/reviews").start();
    let mut web = agent(&t, tmp.path(), &xds, &[]).join_token(&api, "shop/web").start();
    wait_served(&t.a, "web", &api).await;
    wait_served(&t.b, "reviews", &api).await;
    let installed = appended(&rules(&t.a));
    for line in appended(&dry) {
        assert!(installed.contains(&line), "{line} is not installed:\n{installed:#?}");
    }
    assert_eq!(installed.len(), appended(&dry).len() + 2, "ours, the MASQUERADE and the filter rule: {installed:#?}");

    // 3. HTTP to the service's VIP follows its VirtualService: the header
    // only the route sets, and the 75/25 split over 1,000 requests.
    let url = format!("http://{}:9080/", t.vip(10));
    let (ok, head, err) = exec(&t.a, &["curl", "-si", "--max-time", "5", &url]);
    assert!(ok, "curl {url}: {err}\n{}", web.proc.tail(60));
    assert!(head.starts_with("HTTP/1.1 200") && head.to_ascii_lowercase().contains("x-routed-by: lodestar"), "{head}");
    assert!(head.to_ascii_lowercase().contains("server: envoy"), "{head}");
    // Mutual TLS between the VMs (auto-mTLS: the instances have an
    // identity): VM B's Envoy took it on 15006 (virtualInbound) and the app
    // sees the client's SPIFFE id.
    assert!(head.contains("URI=spiffe://cluster.local/ns/shop/sa/web"), "{head}");
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 1000).collect();
    let mut args = vec!["curl", "-s", "--max-time", "30"];
    args.extend(urls);
    let (ok, bodies, err) = exec(&t.a, &args);
    assert!(ok, "{err}");
    let v1 = bodies.lines().filter(|l| *l == "v1").count();
    let v2 = bodies.lines().filter(|l| *l == "v2").count();
    assert_eq!(v1 + v2, 1000, "{bodies}");
    // 750 expected; the band is 5.5 standard deviations (13.7) each way.
    assert!((675..=825).contains(&v1), "75/25 split: v1 {v1}, v2 {v2}");
    let s = stats(&t.a);
    let cluster_rq = |subset: &str| stat(&s, &format!("cluster.outbound|9080|{subset}|reviews.shop.svc.cluster.local.upstream_rq_total"));
    // The 1,000 and the first request, each counted by its subset's cluster.
    let (c1, c2) = (cluster_rq("v1"), cluster_rq("v2"));
    assert!(c1 + c2 == 1001 && c1 >= v1 as u64 && c2 >= v2 as u64, "v1 {c1}, v2 {c2}: {s:?}");
    assert!(stat(&s, "http.0.0.0.0_9080.downstream_rq_total") >= 1001, "through the unbound 0.0.0.0_9080 listener");
    // Accepted on 15001 and handed to 0.0.0.0_9080 (which binds nothing):
    // Envoy counts the connections there, one per curl.
    assert_eq!(stat(&s, "listener.0.0.0.0_9080.downstream_cx_total"), 2, "{s:?}");

    let b_stats = stats(&t.b);
    let inbound_rq = stat(&b_stats, "cluster.inbound|8081||.upstream_rq_total") + stat(&b_stats, "cluster.inbound|8082||.upstream_rq_total");
    assert_eq!(inbound_rq, 1001, "VM B's inbound clusters: {b_stats:?}");
    assert!(stat(&b_stats, "listener.0.0.0.0_15006.downstream_cx_total") >= 2, "{b_stats:?}");

    // 4. Two TCP services on one port, told apart by address.
    for (vip, want) in [(t.vip(20), "orders-db"), (t.vip(21), "users-db"), (t.vip(20), "orders-db")] {
        let (ok, out, err) = exec(&t.a, &["python3", "-c", TCP_CLIENT, &vip, "5432"]);
        assert!(ok && out.trim() == want, "{vip}:5432: {out} {err}");
    }
    let s = stats(&t.a);
    assert_eq!(stat(&s, "cluster.outbound|5432||orders-db.shop.svc.cluster.local.upstream_cx_total"), 2, "{s:?}");
    assert_eq!(stat(&s, "cluster.outbound|5432||users-db.shop.svc.cluster.local.upstream_cx_total"), 1);

    // 5. A destination outside the mesh passes through (ALLOW_ANY).
    let (ok, out, err) = exec(&t.a, &["curl", "-s", "--max-time", "5", &format!("http://{}:8082/", t.addr(66))]);
    assert!(ok && out.trim() == "v2", "{out} {err}");
    assert!(stat(&stats(&t.a), "cluster.PassthroughCluster.upstream_cx_total") >= 1);

    // 6. An AuthorizationPolicy on VM B's workload applies to what its
    // virtualInbound takes: /admin denied, the rest served.
    let deny = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: reviews-admin, namespace: shop}\nspec:\n  selector: {matchLabels: {app: reviews}}\n  action: DENY\n  rules:\n  - to: [{operation: {paths: [/admin]}}]\n";
    let (status, body) = kit::apply(&kit::http(), &api, deny).await;
    assert_eq!(status, 200, "{body}");
    let admin = format!("http://{}:9080/admin", t.vip(10));
    let code = |ns: &str, url: &str| exec(ns, &["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "5", url]).1;
    let a = t.a.clone();
    eventually("/admin denied by VM B's RBAC", BOUND, || {
        let (a, admin) = (a.clone(), admin.clone());
        async move { (code(&a, &admin) == "403").then_some(()) }
    })
    .await;
    assert_eq!(code(&t.a, &url), "200");

    // 7. REGISTRY_ONLY (a Sidecar for web): a destination outside the mesh
    // is refused (BlackHoleCluster); the services still answer.
    let registry_only = "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: web, namespace: shop}\nspec:\n  workloadSelector: {labels: {app: web}}\n  outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n";
    let (status, body) = kit::apply(&kit::http(), &api, registry_only).await;
    assert_eq!(status, 200, "{body}");
    let outside = format!("http://{}:8082/", t.addr(66));
    let a = t.a.clone();
    eventually("an unknown destination refused", BOUND, || {
        let (a, outside) = (a.clone(), outside.clone());
        async move { (!exec(&a, &["curl", "-s", "--max-time", "5", &outside]).0).then_some(()) }
    })
    .await;
    assert_eq!(code(&t.a, &url), "200");
    assert!(stat(&stats(&t.a), "cluster.BlackHoleCluster.upstream_cx_none_healthy") >= 1);

    // 8. SIGTERM: every rule the agent added is gone, the others kept.
    web.proc.stop(Duration::from_secs(20));
    assert_eq!(rules(&t.a), before, "the agent's exit left rules\n{}", web.proc.tail(40));

    // 9. A SIGKILLed agent leaves its rules (and no Envoy); the next start
    // removes them before installing its own, and its exit cleans up.
    let mut crashed = agent(&t, tmp.path(), &xds, &[]).start();
    wait_served(&t.a, "web", &api).await;
    crashed.proc.kill();
    let left = rules(&t.a);
    assert!(left.contains(":LODESTAR_OUTPUT"), "{left}");
    let mut next = agent(&t, tmp.path(), &xds, &[]).start();
    wait_served(&t.a, "web", &api).await;
    assert!(next.log().contains("removed the capture rules a previous agent left"), "{}", next.proc.tail(40));
    assert_eq!(appended(&rules(&t.a)), installed, "the rules after a leftover cleanup");
    let (ok, out, _) = exec(&t.a, &["curl", "-s", "--max-time", "5", &url]);
    assert!(ok && (out.trim() == "v1" || out.trim() == "v2"), "{out}");
    next.proc.stop(Duration::from_secs(20));
    assert_eq!(rules(&t.a), before);

    // The legacy backend (x_tables) works the same way; and Envoy on delta
    // xDS takes the captured proxy's config with no NACK either.
    let mut legacy = agent(&t, tmp.path(), &xds, &["--iptables-backend", "legacy", "--delta"]).start();
    wait_served(&t.a, "web", &api).await;
    let s = kit::mesh::syncz(&kit::http(), &api).await;
    let web_stream = s["proxies"].as_array().and_then(|ps| ps.iter().find(|p| p["id"].as_str().is_some_and(|id| id.contains("~web.shop~")))).cloned();
    assert_eq!(web_stream.as_ref().map(|p| p["protocol"].clone()), Some(serde_json::json!("delta")), "{s:#}");
    let (ok, saved, err) = exec(&t.a, &["iptables-legacy-save", "-t", "nat"]);
    assert!(ok && saved.contains("-A OUTPUT -p tcp -j LODESTAR_OUTPUT"), "{saved}{err}");
    let (ok, out, _) = exec(&t.a, &["curl", "-s", "--max-time", "5", &url]);
    assert!(ok && (out.trim() == "v1" || out.trim() == "v2"), "{out}");
    legacy.proc.stop(Duration::from_secs(20));
    let (_, saved, _) = exec(&t.a, &["iptables-legacy-save", "-t", "nat"]);
    assert!(!saved.contains("LODESTAR"), "{saved}");
    assert_eq!(rules(&t.a), before);

    // 10. Another tool's REDIRECT in the way: refused, naming it; nothing
    // installed.
    let foreign = ["-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-d", "198.19.0.0/16", "-j", "REDIRECT", "--to-ports", "9"];
    let (ok, _, err) = exec(&t.a, &[&["iptables"][..], &foreign[..]].concat());
    assert!(ok, "{err}");
    let with_foreign = rules(&t.a);
    let (ok, err) = agent(&t, tmp.path(), &xds, &[]).run();
    assert!(!ok && err.contains("another tool's rules") && err.contains("REDIRECT --to-ports 9"), "{err}");
    assert_eq!(rules(&t.a), with_foreign);

    // 11. Without CAP_NET_ADMIN: refused, saying so.
    let out = Command::new("ip")
        .args(["netns", "exec", &t.a, "setpriv", "--inh-caps=-all", "--bounding-set=-net_admin", kit::BIN, "agent", "--dir"])
        .arg(tmp.path().join("web/identity"))
        .args(["--xds-servers", &xds, "--name", "web", "--namespace", NS, "--capture"])
        .env("LODESTAR_CONFIG", &kit::test_ca().client_config)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("CAP_NET_ADMIN"), "{err}");
}

/// An upstream resolver on VM B (UDP and TCP 53): `external.example.test`
/// and the names under it are 198.18.X.66, anything else NXDOMAIN; every question it is asked is
/// printed to stderr, its log (`asked NAME TYPE`).
const RESOLVER: &str = r#"
import socket, struct, sys, threading
ip = bytes(int(p) for p in sys.argv[1].split("."))
def answer(q):
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
    name, qtype = ".".join(labels).lower(), struct.unpack(">H", q[i + 1:i + 3])[0]
    print("asked", name, qtype, file=sys.stderr, flush=True)
    question = q[12:i + 5]
    if (name == "external.example.test" or name.endswith(".external.example.test")) and qtype == 1:
        rr = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + ip
        return q[:2] + b"\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00" + question + rr
    return q[:2] + b"\x81\x83\x00\x01\x00\x00\x00\x00\x00\x00" + question
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 53))
    while True:
        q, a = s.recvfrom(4096); s.sendto(answer(q), a)
def tcp():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", 53)); s.listen(16)
    while True:
        c, _ = s.accept(); n = struct.unpack(">H", c.recv(2))[0]; q = c.recv(n); r = answer(q)
        c.sendall(struct.pack(">H", len(r)) + r); c.close()
threading.Thread(target=udp, daemon=True).start()
threading.Thread(target=tcp, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"#;

/// An unmodified resolver call: the IPv4 addresses of a name
/// (getaddrinfo, as any application), one per line; exit 2 when unknown.
const RESOLVE: &str = "import socket,sys\ntry: print('\\n'.join(sorted({a[4][0] for a in socket.getaddrinfo(sys.argv[1], 80, socket.AF_INET)})))\nexcept socket.gaierror as e: print(e); sys.exit(2)";

/// A raw DNS query to the nameserver ARGV[1] over `udp` or `tcp` for
/// ARGV[3] of type ARGV[4]: prints the rcode and the A and AAAA records.
const RAW_QUERY: &str = r#"
import socket, struct, sys
server, proto, name, qtype = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00" + b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\x00" + struct.pack(">HH", qtype, 1)
if proto == "udp":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); s.sendto(q, (server, 53)); r = s.recv(4096)
else:
    s = socket.create_connection((server, 53), timeout=5); s.sendall(struct.pack(">H", len(q)) + q)
    n = struct.unpack(">H", s.recv(2))[0]; r = b""
    while len(r) < n: r += s.recv(n - len(r))
an, i = struct.unpack(">H", r[6:8])[0], 12
while r[i]: i += 1 + r[i]
i += 5
out = ["rcode=%d" % (r[3] & 15)]
for _ in range(an):
    i += 2 if r[i] & 0xc0 == 0xc0 else 0
    t, ln = struct.unpack(">H", r[i:i+2])[0], struct.unpack(">H", r[i+8:i+10])[0]
    if t == 1: out.append(".".join(str(b) for b in r[i+10:i+14]))
    if t == 28: out.append(socket.inet_ntop(socket.AF_INET6, r[i+10:i+26]))
    i += 10 + ln
print(" ".join(out))
"#;

fn dns_mesh_yaml(t: &Topology) -> String {
    let b = t.addr(66);
    format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: reviews, namespace: shop}}
spec:
  addresses: [{reviews}]
  ports: [{{name: http, number: 9080}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: reviews-v1, namespace: shop}}
spec: {{service: reviews, address: {b}, port: 8081}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: orders-db, namespace: shop}}
spec:
  hosts: [orders.db.internal]
  ports: [{{name: tcp-pg, number: 5432, protocol: TCP, targetPort: 15432}}]
  resolution: STATIC
  endpoints: [{{address: {b}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: users-db, namespace: shop}}
spec:
  hosts: [users.db.internal]
  ports: [{{name: tcp-pg, number: 5432, protocol: TCP, targetPort: 25432}}]
  resolution: STATIC
  endpoints: [{{address: {b}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: partner, namespace: shop}}
spec:
  hosts: [partner.example.test]
  ports: [{{name: tcp, number: 15432, protocol: TCP}}]
  resolution: NONE
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: apps, namespace: shop}}
spec:
  hosts: ["*.apps.example.test"]
  addresses: [{b}]
  ports: [{{name: http, number: 8081, protocol: HTTP}}]
  resolution: NONE
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: external, namespace: shop}}
spec:
  hosts: ["*.external.example.test"]
  ports: [{{name: http, number: 8082, protocol: HTTP}}]
  resolution: NONE
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: legacy-db, namespace: shop}}
spec:
  hosts: [legacy.db.internal]
  addresses: [{subnet}/26]
  ports: [{{name: tcp, number: 25432, protocol: TCP}}]
  resolution: NONE
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: mainframe, namespace: shop}}
spec:
  hosts: [mainframe.internal]
  addresses: [{subnet}/27]
  ports: [{{name: tcp, number: 9080, protocol: TCP}}]
  resolution: NONE
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: greeter, namespace: shop}}
spec:
  ports: [{{name: grpc, number: 50051}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: greeter-1, namespace: shop}}
spec: {{service: greeter, address: {b}, port: 50061}}
"#,
        reviews = t.vip(10),
        subnet = t.addr(64),
    )
}

/// `--capture-dns`: an unmodified client on VM A resolves mesh names
/// (short, namespaced, full; ServiceEntry hosts by their auto-allocated
/// addresses) through the agent's DNS proxy and reaches them through
/// Envoy (curl, and a gRPC client dialling `greeter:50051`); other names
/// go to the upstream resolver of VM A's resolv.conf
/// (on VM B); an unknown name under `svc.cluster.local` is NXDOMAIN without
/// asking upstream; two TCP ServiceEntries on one port without addresses
/// get distinct addresses, each reaching its own backend; a
/// `resolution: NONE` one passes to the original destination; a new
/// ServiceEntry resolves soon after its write; a Sidecar's egress limits
/// the names (and REGISTRY_ONLY does not stop the proxy's own forwarded
/// TCP queries); the agent's exit removes every rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_dns_answers_mesh_names_and_forwards_the_rest() {
    let t = Topology::create();
    let resolver = t.addr(66);
    // VM A's resolver is VM B's, and names go to DNS only (no mDNS).
    t.netns_etc(&t.a, &[("resolv.conf", &format!("nameserver {resolver}\n")), ("nsswitch.conf", "hosts: files dns\n")]);
    let mut cluster = Cluster::prepare_on(1, "", &format!("198.18.{}", t.x));
    cluster.launch().await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (status, body) = kit::apply(&kit::http(), &api, dns_mesh_yaml(&t).as_str()).await;
    assert_eq!(status, 200, "{body}");
    let mut apps = Command::new("ip");
    apps.args(["netns", "exec", &t.b, "python3", "-c", APPS]);
    let _apps = kit::Proc::spawn("apps in VM B", apps, &tmp.path().join("apps.log"));
    let mut upstream = Command::new("ip");
    upstream.args(["netns", "exec", &t.b, "python3", "-c", RESOLVER, &resolver]);
    let resolver_log = tmp.path().join("resolver.log");
    let _resolver = kit::Proc::spawn("the resolver in VM B", upstream, &resolver_log);
    let (a, b_addr) = (t.a.clone(), t.addr(66));
    eventually("the resolver in VM B, asked directly", BOUND, || {
        let (a, b_addr) = (a.clone(), b_addr.clone());
        async move { exec(&a, &["python3", "-c", RESOLVE, "external.example.test"]).1.contains(&b_addr).then_some(()) }
    })
    .await;
    // The nat table exists (empty), as the agent's exit leaves it.
    for op in ["-N", "-X"] {
        assert!(exec(&t.a, &["iptables", "-t", "nat", op, "SCRATCH"]).0);
    }
    let before = rules(&t.a);
    assert!(before.contains("*nat") && !before.contains("-A "), "{before}");

    // --dry-run prints the DNS rules for resolv.conf's nameserver.
    let (ok, dry, err) =
        exec(&t.a, &[kit::BIN, "agent", "--dir", "/nonexistent", "--name", "web", "--xds-servers", &xds, "--capture", "--capture-dns", "--dry-run"]);
    assert!(ok, "{err}");
    assert!(dry.contains(&format!("-A LODESTAR_DNS -d {resolver}/32 -p udp --dport 53 -j REDIRECT --to-ports 15053")), "{dry}");

    let mut web = agent(&t, tmp.path(), &xds, &["--capture-dns"]).join_token(&api, "shop/web").start();
    wait_served(&t.a, "web", &api).await;
    // The agent's name table stream: its own node (NAME.dns), in sync.
    let http = kit::http();
    eventually("the DNS proxy's name table stream in sync", BOUND, || async {
        let s = kit::mesh::syncz(&http, &api).await;
        let p = s["proxies"].as_array()?.iter().find(|p| p["id"].as_str().is_some_and(|id| id.contains("~web.dns.shop~")))?.clone();
        (p["types"]["NDS"]["in_sync"] == true).then_some(())
    })
    .await;

    // 1. Mesh names, short and long, answered by the agent: the service's
    // address; an unmodified curl reaches it by name through Envoy.
    let want = t.vip(10);
    let a = t.a.clone();
    eventually("reviews resolves to its address", BOUND, || {
        let (a, want) = (a.clone(), want.clone());
        async move { (exec(&a, &["python3", "-c", RESOLVE, "reviews"]).1.trim() == want).then_some(()) }
    })
    .await;
    for name in ["reviews.shop", "reviews.shop.svc", "reviews.shop.svc.cluster.local"] {
        let (ok, out, err) = exec(&t.a, &["python3", "-c", RESOLVE, name]);
        assert!(ok && out.trim() == want, "{name}: {out} {err}");
    }
    for url in ["http://reviews:9080/", "http://reviews.shop.svc.cluster.local:9080/"] {
        let (ok, out, err) = exec(&t.a, &["curl", "-si", "--max-time", "5", url]);
        assert!(ok && out.starts_with("HTTP/1.1 200") && out.trim_end().ends_with("v1"), "{url}: {out} {err}\n{}", web.proc.tail(40));
        assert!(out.to_ascii_lowercase().contains("server: envoy"), "{out}");
    }
    // An unmodified gRPC client (grpcio, the system resolver) dialling
    // `greeter:50051` by name: the agent's address, through Envoy (an
    // HTTP/2 route), to the server on VM B.
    let mut greeter = Command::new("ip");
    greeter.args(["netns", "exec", &t.b]).arg(crate::grpc::python()).arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/grpc/server.py"));
    greeter.args(["0.0.0.0", "50061", "greeter-1"]);
    let _greeter = kit::Proc::spawn("the gRPC server in VM B", greeter, &tmp.path().join("greeter.log"));
    let python = crate::grpc::python();
    let a = t.a.clone();
    let reply = eventually("a gRPC call to greeter:50051 by name", BOUND, || {
        let (a, python) = (a.clone(), python.clone());
        async move {
            let (ok, out, _) = exec(&a, &["env", "GRPC_DNS_RESOLVER=native", python.to_str()?, "-c", GRPC_CALL, "greeter:50051"]);
            ok.then(|| out.trim().to_string())
        }
    })
    .await;
    assert_eq!(reply, "greeter-1 /lodestar.test.Echo/Call");
    assert!(resolve_one(&t.a, "greeter").starts_with("240.240."), "an auto-allocated address");
    let s = stats(&t.a);
    assert!(stat(&s, "cluster.outbound|50051||greeter.shop.svc.cluster.local.upstream_rq_total") >= 1, "through Envoy: {s:?}");

    // Over TCP too; AAAA for a mesh name: no error, no records.
    let raw = |proto: &str, name: &str, qtype: &str| exec(&t.a, &["python3", "-c", RAW_QUERY, &resolver, proto, name, qtype]).1.trim().to_string();
    assert_eq!(raw("tcp", "reviews.shop", "1"), format!("rcode=0 {want}"));
    assert_eq!(raw("udp", "reviews", "28"), "rcode=0");

    // 2. A name outside the mesh: forwarded to the upstream resolver.
    let (ok, out, err) = exec(&t.a, &["python3", "-c", RESOLVE, "external.example.test"]);
    assert!(ok && out.trim() == t.addr(66), "{out} {err}");
    assert_eq!(raw("tcp", "external.example.test", "1"), format!("rcode=0 {}", t.addr(66)));
    let asked = std::fs::read_to_string(&resolver_log).unwrap();
    assert!(asked.matches("asked external.example.test 1").count() >= 3, "{asked}");
    assert!(!asked.contains("reviews"), "a mesh name went upstream: {asked}");

    // 3. An unknown name under the service domain: NXDOMAIN, from the
    // agent (upstream never asked).
    let (ok, out, _) = exec(&t.a, &["python3", "-c", RESOLVE, "ratings.shop.svc.cluster.local"]);
    assert!(!ok, "{out}");
    assert_eq!(raw("udp", "ratings.shop.svc.cluster.local", "1"), "rcode=3");
    assert!(!std::fs::read_to_string(&resolver_log).unwrap().contains("ratings"));

    // 4. Two TCP ServiceEntries on one port, no addresses: distinct
    // auto-allocated addresses (240.240.0.0/16), each to its backend.
    let orders = resolve_one(&t.a, "orders.db.internal");
    let users = resolve_one(&t.a, "users.db.internal");
    assert!(orders.starts_with("240.240.") && users.starts_with("240.240.") && orders != users, "{orders} {users}");
    for (name, want) in [("orders.db.internal", "orders-db"), ("users.db.internal", "users-db"), ("orders.db.internal", "orders-db")] {
        let (ok, out, err) = exec(&t.a, &["python3", "-c", TCP_CLIENT, name, "5432"]);
        assert!(ok && out.trim() == want, "{name}:5432: {out} {err}\n{}", web.proc.tail(40));
    }
    let s = stats(&t.a);
    assert_eq!(stat(&s, "cluster.outbound|5432||orders.db.internal.upstream_cx_total"), 2, "{s:?}");
    assert_eq!(stat(&s, "cluster.outbound|5432||users.db.internal.upstream_cx_total"), 1);

    // `resolution: NONE`: no address, no name; a connection on its port
    // goes where it was dialled, through its cluster (ORIGINAL_DST).
    assert!(resolve_one_opt(&t.a, "partner.example.test").is_none());
    let (ok, out, err) = exec(&t.a, &["python3", "-c", TCP_CLIENT, &t.addr(66), "15432"]);
    assert!(ok && out.trim() == "orders-db", "{out} {err}");
    assert_eq!(stat(&stats(&t.a), "cluster.outbound|15432||partner.example.test.upstream_cx_total"), 1);

    // Wildcard hosts, as Istio's agent: a name under one with an address
    // is answered with it by the agent (upstream never asked) and reached
    // through its route; a name under one without is the upstream's, and
    // the connection to that address goes through the wildcard's route
    // too (the port's 0.0.0.0 listener, by Host).
    assert_eq!(resolve_one(&t.a, "v1.apps.example.test"), t.addr(66));
    assert_eq!(raw("udp", "a.b.apps.example.test", "1"), format!("rcode=0 {}", t.addr(66)));
    assert_eq!(raw("udp", "apps.example.test", "1"), "rcode=3", "the wildcard's own domain is not under it");
    assert_eq!(resolve_one(&t.a, "shop.external.example.test"), t.addr(66));
    let asked = std::fs::read_to_string(&resolver_log).unwrap();
    assert!(!asked.contains(".apps.example.test") && asked.contains("asked shop.external.example.test 1"), "{asked}");
    for (url, want) in [("http://v1.apps.example.test:8081/", "v1"), ("http://shop.external.example.test:8082/", "v2")] {
        let (ok, out, err) = exec(&t.a, &["curl", "-s", "--max-time", "5", url]);
        assert!(ok && out.trim() == want, "{url}: {out} {err}");
    }
    let s = stats(&t.a);
    assert_eq!(stat(&s, "cluster.outbound|8081||*.apps.example.test.upstream_rq_total"), 1, "{s:?}");
    assert_eq!(stat(&s, "cluster.outbound|8082||*.external.example.test.upstream_rq_total"), 1);

    // CIDR addresses: a connection into the subnet goes through the
    // ServiceEntry's cluster (to its original destination), on a port of
    // its own and on a port with HTTP services (reviews' 9080: nothing
    // listens there on VM B, so only the attempt is counted).
    let (ok, out, err) = exec(&t.a, &["python3", "-c", TCP_CLIENT, &t.addr(66), "25432"]);
    assert!(ok && out.trim() == "users-db", "{out} {err}");
    let _ = exec(&t.a, &["python3", "-c", TCP_CLIENT, &t.addr(66), "9080"]);
    let s = stats(&t.a);
    assert_eq!(stat(&s, "cluster.outbound|25432||legacy.db.internal.upstream_cx_total"), 1, "{s:?}");
    assert_eq!(stat(&s, "cluster.outbound|9080||mainframe.internal.upstream_cx_total"), 1, "{s:?}");
    assert_eq!(stat(&s, "cluster.PassthroughCluster.upstream_cx_total"), 0, "{s:?}");

    // 5. A new ServiceEntry's host resolves soon after the write.
    let se = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: cache, namespace: shop}\nspec:\n  hosts: [cache.db.internal]\n  ports: [{name: tcp, number: 6379, protocol: TCP}]\n  resolution: STATIC\n  endpoints: [{address: 198.18.0.99}]\n";
    assert!(resolve_one_opt(&t.a, "cache.db.internal").is_none());
    let (status, body) = kit::apply(&kit::http(), &api, se).await;
    assert_eq!(status, 200, "{body}");
    let written = std::time::Instant::now();
    let a = t.a.clone();
    eventually("the new ServiceEntry's name", BOUND, || {
        let a = a.clone();
        async move { resolve_one_opt(&a, "cache.db.internal").filter(|ip| ip.starts_with("240.240.")) }
    })
    .await;
    eprintln!("a new ServiceEntry resolved {:?} after its write", written.elapsed());

    // 6. The table holds only what the proxy's Sidecar lets it reach: with
    // egress to its own namespace's registry services, the ServiceEntry
    // hosts are no longer mesh names (forwarded: the upstream does not
    // know them); reviews still is.
    // REGISTRY_ONLY too: the proxy's own forwarded TCP queries (marked)
    // still bypass Envoy.
    let scoped = "apiVersion: networking.istio.io/v1\nkind: Sidecar\nmetadata: {name: web, namespace: shop}\nspec:\n  workloadSelector: {labels: {app: web}}\n  egress: [{hosts: [./reviews.shop.svc.cluster.local]}]\n  outboundTrafficPolicy: {mode: REGISTRY_ONLY}\n";
    let (status, body) = kit::apply(&kit::http(), &api, scoped).await;
    assert_eq!(status, 200, "{body}");
    let a = t.a.clone();
    eventually("the ServiceEntry hosts out of the proxy's table", BOUND, || {
        let a = a.clone();
        async move { resolve_one_opt(&a, "orders.db.internal").is_none().then_some(()) }
    })
    .await;
    assert!(std::fs::read_to_string(&resolver_log).unwrap().contains("asked orders.db.internal 1"));
    assert_eq!(resolve_one(&t.a, "reviews"), want);
    assert_eq!(raw("tcp", "external.example.test", "1"), format!("rcode=0 {}", t.addr(66)));

    // 7. SIGTERM: every rule gone, DNS included.
    web.proc.stop(Duration::from_secs(20));
    assert_eq!(rules(&t.a), before, "the agent's exit left rules\n{}", web.proc.tail(40));
}

/// AAAA through the agent's DNS proxy (hickory-proto's codec), over UDP
/// and TCP, as Istio's agent answers it: a ServiceEntry's IPv6 addresses
/// for AAAA and its IPv4 ones for A; a mesh name without an address of
/// the family asked is NODATA (no records, NOERROR), answered by the agent,
/// never forwarded; a name outside the mesh is forwarded whatever the type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_dns_answers_aaaa_from_ipv6_addresses() {
    let t = Topology::create();
    let resolver = t.addr(66);
    t.netns_etc(&t.a, &[("resolv.conf", &format!("nameserver {resolver}\n")), ("nsswitch.conf", "hosts: files dns\n")]);
    let mut cluster = Cluster::prepare_on(1, "", &format!("198.18.{}", t.x));
    cluster.launch().await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (b, x) = (t.addr(66), t.x);
    let (reviews, dual4) = (t.vip(10), t.vip(20));
    let (dual6, only6) = (format!("fd00:{x}::20"), format!("fd00:{x}::30"));
    let yaml = format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: reviews, namespace: shop}}
spec:
  addresses: [{reviews}]
  ports: [{{name: http, number: 9080}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: reviews-v1, namespace: shop}}
spec: {{service: reviews, address: {b}, port: 8081}}
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: dual, namespace: shop}}
spec:
  hosts: [dual.db.internal]
  addresses: [{dual4}, "{dual6}"]
  ports: [{{name: tcp-pg, number: 5432, protocol: TCP}}]
  resolution: STATIC
  endpoints: [{{address: {b}}}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {{name: only6, namespace: shop}}
spec:
  hosts: [v6.db.internal]
  addresses: ["{only6}"]
  ports: [{{name: tcp-pg, number: 5433, protocol: TCP}}]
  resolution: STATIC
  endpoints: [{{address: {b}}}]
"#
    );
    let (status, body) = kit::apply(&kit::http(), &api, yaml.as_str()).await;
    assert_eq!(status, 200, "{body}");
    let mut upstream = Command::new("ip");
    upstream.args(["netns", "exec", &t.b, "python3", "-c", RESOLVER, &resolver]);
    let resolver_log = tmp.path().join("resolver.log");
    let _resolver = kit::Proc::spawn("the resolver in VM B", upstream, &resolver_log);
    let mut web = agent(&t, tmp.path(), &xds, &["--capture-dns"]).join_token(&api, "shop/web").start();
    // Envoy takes the IPv6 addresses' listeners too: no NACK.
    wait_served(&t.a, "web", &api).await;
    let raw = |proto: &str, name: &str, qtype: &str| exec(&t.a, &["python3", "-c", RAW_QUERY, &resolver, proto, name, qtype]).1.trim().to_string();
    let a = t.a.clone();
    let want = format!("rcode=0 {dual4}");
    eventually("the name table in the agent", BOUND, || {
        let (a, resolver, want) = (a.clone(), resolver.clone(), want.clone());
        async move { (exec(&a, &["python3", "-c", RAW_QUERY, &resolver, "udp", "dual.db.internal", "1"]).1.trim() == want).then_some(()) }
    })
    .await;
    for proto in ["udp", "tcp"] {
        assert_eq!(raw(proto, "dual.db.internal", "1"), format!("rcode=0 {dual4}"), "{proto}");
        assert_eq!(raw(proto, "Dual.DB.internal", "28"), format!("rcode=0 {dual6}"), "{proto}");
        assert_eq!(raw(proto, "v6.db.internal", "28"), format!("rcode=0 {only6}"), "{proto}");
        // IPv6 only: A is NODATA; IPv4 only: AAAA is NODATA.
        assert_eq!(raw(proto, "v6.db.internal", "1"), "rcode=0", "{proto}");
        assert_eq!(raw(proto, "reviews", "1"), format!("rcode=0 {reviews}"), "{proto}");
        assert_eq!(raw(proto, "reviews.shop.svc.cluster.local", "28"), "rcode=0", "{proto}");
        // Unknown under the service domain: NXDOMAIN for AAAA too.
        assert_eq!(raw(proto, "ratings.shop.svc.cluster.local", "28"), "rcode=3", "{proto}");
        // Outside the mesh: forwarded (the upstream knows no AAAA).
        assert_eq!(raw(proto, "external.example.test", "28"), "rcode=3", "{proto}");
    }
    let asked = std::fs::read_to_string(&resolver_log).unwrap();
    assert_eq!(asked.matches("asked external.example.test 28").count(), 2, "{asked}");
    for name in ["db.internal", "reviews", "ratings"] {
        assert!(!asked.contains(name), "a mesh name went upstream: {asked}");
    }
    web.proc.stop(Duration::from_secs(20));
}

fn resolve_one_opt(ns: &str, name: &str) -> Option<String> {
    let (ok, out, _) = exec(ns, &["python3", "-c", RESOLVE, name]);
    ok.then(|| out.trim().to_string()).filter(|s| !s.is_empty() && !s.contains('\n'))
}

fn resolve_one(ns: &str, name: &str) -> String {
    resolve_one_opt(ns, name).unwrap_or_else(|| panic!("{name} does not resolve"))
}
