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
    // only the route sets, and the 75/25 split over 200 requests.
    let url = format!("http://{}:9080/", t.vip(10));
    let (ok, head, err) = exec(&t.a, &["curl", "-si", "--max-time", "5", &url]);
    assert!(ok, "curl {url}: {err}\n{}", web.proc.tail(60));
    assert!(head.starts_with("HTTP/1.1 200") && head.to_ascii_lowercase().contains("x-routed-by: lodestar"), "{head}");
    assert!(head.to_ascii_lowercase().contains("server: envoy"), "{head}");
    // Mutual TLS between the VMs (auto-mTLS: the instances have an
    // identity): VM B's Envoy took it on 15006 (virtualInbound) and the app
    // sees the client's SPIFFE id.
    assert!(head.contains("URI=spiffe://cluster.local/ns/shop/sa/web"), "{head}");
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 200).collect();
    let mut args = vec!["curl", "-s", "--max-time", "30"];
    args.extend(urls);
    let (ok, bodies, err) = exec(&t.a, &args);
    assert!(ok, "{err}");
    let v1 = bodies.lines().filter(|l| *l == "v1").count();
    let v2 = bodies.lines().filter(|l| *l == "v2").count();
    assert_eq!(v1 + v2, 200, "{bodies}");
    assert!((120..=180).contains(&v1), "75/25 split: v1 {v1}, v2 {v2}");
    let s = stats(&t.a);
    let cluster_rq = |subset: &str| stat(&s, &format!("cluster.outbound|9080|{subset}|reviews.shop.svc.cluster.local.upstream_rq_total"));
    // The 200 and the first request, each counted by its subset's cluster.
    let (c1, c2) = (cluster_rq("v1"), cluster_rq("v2"));
    assert!(c1 + c2 == 201 && c1 >= v1 as u64 && c2 >= v2 as u64, "v1 {c1}, v2 {c2}: {s:?}");
    assert!(stat(&s, "http.0.0.0.0_9080.downstream_rq_total") >= 201, "through the unbound 0.0.0.0_9080 listener");
    // Accepted on 15001 and handed to 0.0.0.0_9080 (which binds nothing):
    // Envoy counts the connections there, one per curl.
    assert_eq!(stat(&s, "listener.0.0.0.0_9080.downstream_cx_total"), 2, "{s:?}");

    let b_stats = stats(&t.b);
    let inbound_rq = stat(&b_stats, "cluster.inbound|8081||.upstream_rq_total") + stat(&b_stats, "cluster.inbound|8082||.upstream_rq_total");
    assert_eq!(inbound_rq, 201, "VM B's inbound clusters: {b_stats:?}");
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
