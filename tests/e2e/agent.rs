//! `lodestar agent` as pilot-agent and Consul client agent in one: two
//! workloads (client `web`, server `reviews`, namespace `shop`), each one
//! `lodestar agent` process running its own real Envoy as a child
//! (`--run-envoy`, `LODESTAR_ENVOY`) and registering its own Instance
//! (`reviews` with `--register`, `web` from a WorkloadGroup), against a
//! real replica with ACLs: STRICT mutual TLS between them, the Envoy
//! killed and restarted, a lost lease re-created, SIGTERM deregistering
//! and stopping Envoy. (The served certificate's SAN, EKU and lifetime are
//! checked in `tests/e2e/identity.rs`.)

use crate::kit;

use kit::agent::AgentBuilder;
use kit::envoy::Upstream;
use kit::mesh::{plain, via_client};
use kit::{cli, until, Cluster};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const NS: &str = "shop";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";

/// A `lodestar agent` process (and, through it, its Envoy).
struct Agent {
    agent: kit::agent::Agent,
    ip: String,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.agent.proc.id()
    }

    fn admin(&self) -> String {
        format!("http://{}:15000", self.ip)
    }

    fn full_log(&self) -> String {
        self.agent.log()
    }

    fn logs(&self) -> String {
        format!("--- agent {} (with its Envoy)\n{}", self.ip, self.agent.proc.tail(80))
    }

    /// The pid of the agent's Envoy child, if one runs (read from /proc:
    /// the process whose parent is the agent).
    fn envoy_pid(&self) -> Option<u32> {
        children(self.pid()).into_iter().find(|(_, comm)| comm.contains("envoy")).map(|(pid, _)| pid)
    }

    async fn envoy_ready(&self) -> bool {
        plain().get(format!("{}/ready", self.admin())).send().await.is_ok_and(|r| r.status().is_success())
    }
}

/// (pid, command name) of every process whose parent is `parent`.
fn children(parent: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = stat[open + 1..close].to_string();
        let ppid = stat[close + 1..].split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(parent) {
            out.push((pid, comm));
        }
    }
    out
}

fn alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; its state is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rfind(')').is_some_and(|i| !s[i + 1..].trim_start().starts_with('Z')))
}

/// `lodestar token create ARGS...`: the new token's secret.
fn secret(api: &str, args: &[&str]) -> String {
    kit::token_create(api, args)["secret"].as_str().unwrap().to_string()
}

/// Start `lodestar agent` for `shop/NAME` at `ip` with Envoy as its child
/// and the given registration flags.
fn start_agent(root: &Path, api: &str, xds: &str, name: &str, ip: &str, registration: &[&str]) -> Agent {
    let agent = AgentBuilder::new(NS, name, xds, &root.join(name))
        .server(api)
        .args(["--ip", ip, "--admin-port", "15000", "-o", "json"])
        .join_token(api, &format!("{NS}/{name}"))
        .args(["--run-envoy", "--drain-time", "2s", "--lease-ttl", "3s"])
        .args(registration)
        .env("LODESTAR_ENVOY", kit::envoy::envoy_binary())
        .start();
    Agent { agent, ip: ip.to_string() }
}

async fn get(api: &str, path: &str) -> (u16, Value) {
    kit::get_json(&kit::http(), &format!("{api}{path}")).await
}

fn mesh_yaml(p: &str, app: &Upstream) -> String {
    format!(
        r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {{name: reviews, namespace: shop}}
spec:
  workloadSelector: {{labels: {{app: reviews}}}}
  ingress:
  - port: {{number: 9080, protocol: HTTP2, name: http2}}
    defaultEndpoint: {app}
  egress:
  - bind: {p}.29
    hosts: ["./*"]
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: reviews, namespace: shop}}
spec:
  ports: [{{name: http2, number: 9080}}]
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec:
  ports: [{{name: http, number: 8080}}]
---
apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {{name: web, namespace: shop}}
spec:
  metadata:
    labels: {{app: web}}
    annotations: {{owner: team-web}}
  template:
    labels: {{version: v1}}
    serviceAccount: web
    ports: {{http: 8080}}
    weight: 2
    locality: eu/west
  probe:
    periodSeconds: 1
    initialDelaySeconds: 1
    tcpSocket: {{port: 15000}}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: default, namespace: shop}}
spec:
  mtls: {{mode: STRICT}}
"#,
        app = app.addr,
    )
}

fn dashed(ip: &str) -> String {
    ip.replace('.', "-")
}

#[tokio::test]
async fn agent_runs_envoy_registers_and_deregisters_on_sigterm() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let p = kit::loopback_prefix();
    let (client_ip, server_ip) = (format!("{p}.20"), format!("{p}.21"));
    let app = Upstream::start("127.0.0.1", "reviews-app").await;

    // A WorkloadGroup whose probe the replicas cannot run is refused,
    // naming the field; the mesh (with a valid group) is accepted.
    let (status, body) = kit::apply(&kit::http(), &api, "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: bad, namespace: shop}\nspec:\n  template: {}\n  probe: {exec: {command: [\"true\"]}}\n").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("spec.probe.exec") && body.to_string().contains("not supported"), "{body}");
    let (status, body) = kit::apply(&kit::http(), &api, &mesh_yaml(&p, &app)).await;
    assert_eq!(status, 200, "{body}");

    // The agents' API token: what registration needs, and no more.
    let (ok, _, err) =
        cli(&api, &["policy", "create", "agent-shop", "--rule", "read,write,delete:instances,leases:shop", "--rule", "read:workloadgroups:shop"]);
    assert!(ok, "policy create: {err}");
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("agent.token");
    std::fs::write(&token_file, secret(&api, &["--policy", "agent-shop"])).unwrap();
    let token_file = token_file.to_str().unwrap();

    let health = format!("http://{}/health", app.addr);
    let mut server = start_agent(
        tmp.path(),
        &api,
        &xds,
        "reviews",
        &server_ip,
        &[
            "--label",
            "app=reviews",
            "--register",
            "reviews",
            "--port",
            "http2=9080",
            "--check-http",
            &health,
            "--check-interval",
            "1s",
            "--token-file",
            token_file,
        ],
    );
    let mut client = start_agent(tmp.path(), &api, &xds, "web", &client_ip, &["--workload-group", "shop/web", "--token-file", token_file]);
    let dump = |a: &Agent, b: &Agent| format!("{}\n{}", a.logs(), b.logs());

    // 1. Both Envoys run as the agents' children, ready.
    for a in [&server, &client] {
        until("Envoy ready", Duration::from_secs(60), || a.envoy_ready()).await;
        assert!(a.envoy_pid().is_some(), "Envoy is the agent's child\n{}", a.logs());
    }
    // Its admin answers on loopback only (the workload's IP is loopback here).
    let v: Value = plain().get(format!("{}/server_info", server.admin())).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["command_line_options"]["drain_time"], "2s", "{}", v["command_line_options"]);

    // 2. The instances: registered with the certificate's service account,
    // bound to their leases, healthy (the HTTP check; the group's probe).
    let reviews_path = format!("/v1/resources/instances/shop/reviews-{}", dashed(&server_ip));
    let web_path = format!("/v1/resources/instances/shop/web-{}", dashed(&client_ip));
    for path in [&reviews_path, &web_path] {
        until(&format!("{path} healthy"), Duration::from_secs(30), || async { get(&api, path).await.1["status"]["health"] == "Healthy" }).await;
    }
    let (_, reviews) = get(&api, &reviews_path).await;
    assert_eq!(reviews["spec"]["serviceAccount"], "reviews", "{reviews}");
    assert_eq!(reviews["spec"]["lease"], format!("reviews-{}", dashed(&server_ip)));
    assert_eq!(reviews["spec"]["address"], server_ip);
    assert_eq!(reviews["spec"]["ports"]["http2"], 9080);
    assert_eq!(reviews["spec"]["healthCheck"]["http"], health);
    assert_eq!(reviews["metadata"]["labels"]["app"], "reviews");
    // From the WorkloadGroup: labels (group's and template's), service
    // account, ports, weight, locality, the probe as a TCP check at the
    // workload's address, the group's annotations.
    let (_, web) = get(&api, &web_path).await;
    assert_eq!(web["spec"]["service"], "web", "{web}");
    assert_eq!(web["spec"]["serviceAccount"], "web");
    assert_eq!(web["metadata"]["labels"]["app"], "web");
    assert_eq!(web["metadata"]["labels"]["version"], "v1");
    assert_eq!(web["metadata"]["annotations"]["owner"], "team-web");
    assert_eq!(web["spec"]["ports"]["http"], 8080);
    assert_eq!(web["spec"]["weight"], 2);
    assert_eq!(web["spec"]["locality"], "eu/west");
    assert_eq!(web["spec"]["healthCheck"]["tcp"], format!("{client_ip}:15000"));
    assert_eq!(web["spec"]["healthCheck"]["interval"], "1s");
    assert_eq!(web["spec"]["healthCheck"]["initialDelay"], "1s");
    let (status, lease) = get(&api, &format!("/v1/resources/leases/shop/web-{}", dashed(&client_ip))).await;
    assert_eq!((status, lease["spec"]["ttl"].as_str()), (200, Some("3s")), "{lease}");
    // The group's labels reached the proxy too: the client's node claims them.
    let v: Value = plain().get(format!("{}/server_info", client.admin())).send().await.unwrap().json().await.unwrap();
    assert_eq!(v["node"]["metadata"]["LABELS"]["version"], "v1", "{}", v["node"]);
    assert_eq!(v["node"]["metadata"]["LABELS"]["app"], "web");

    // 3. Mutual TLS (STRICT): the server's app sees the client's SPIFFE id;
    // plaintext to the server's Envoy is refused.
    until("traffic through both Envoys", Duration::from_secs(30), || async { matches!(via_client(&client_ip, "/warm/echo").await, Ok((200, _))) }).await;
    for i in 0..10 {
        let (status, body) = via_client(&client_ip, "/mtls/echo").await.unwrap();
        assert_eq!(status, 200, "request {i}: {body}");
    }
    let seen: Vec<Option<String>> =
        app.requests().into_iter().filter(|r| r.path == "/mtls/echo").map(|r| r.headers.get("x-forwarded-client-cert").cloned()).collect();
    assert_eq!(seen.len(), 10);
    for h in &seen {
        let h = h.as_deref().unwrap_or_else(|| panic!("the server saw no client certificate\n{}", dump(&server, &client)));
        assert!(h.contains(&format!("URI={CLIENT_ID}")), "x-forwarded-client-cert {h:?} names the client's SPIFFE id");
    }
    assert!(plain().get(format!("http://{server_ip}:9080/plain")).send().await.is_err(), "STRICT refuses plaintext");

    // 4. kill -9 the server's Envoy: the agent starts another, traffic resumes.
    let first = server.envoy_pid().unwrap();
    // SAFETY: kill(2) on the Envoy's pid, a live process.
    assert_eq!(unsafe { libc::kill(first as libc::pid_t, libc::SIGKILL) }, 0);
    until("a new Envoy", Duration::from_secs(30), || async { server.envoy_pid().is_some_and(|p| p != first) && server.envoy_ready().await }).await;
    assert!(server.agent.proc.try_exit().is_none(), "the agent kept running");
    until("traffic after the restart", Duration::from_secs(30), || async { matches!(via_client(&client_ip, "/after-restart/echo").await, Ok((200, _))) }).await;
    assert!(server.full_log().contains("Envoy exited; starting it again"), "{}", server.logs());

    // 5. The lease lost (revoked behind the agent's back, as an expiry
    // after a partition would): the agent registers again.
    let web_lease = format!("/v1/resources/leases/shop/web-{}", dashed(&client_ip));
    let r = kit::http().delete(format!("{api}{web_lease}")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let deleted_at = r.json::<Value>().await.unwrap()["revision"].as_u64().expect("the delete's revision");
    // Gone with its lease: absent, or (the agent may be that quick on a
    // loaded machine) already created again after the delete.
    let (status, instance) = get(&api, &web_path).await;
    let created = instance["metadata"]["creationRevision"].as_u64().unwrap_or(0);
    assert!(status == 404 || created > deleted_at, "the instance went with its lease: {status}, created at {created}, the lease deleted at {deleted_at}");
    until("the instance registered again", Duration::from_secs(20), || async { get(&api, &web_path).await.0 == 200 }).await;
    assert_eq!(get(&api, &web_lease).await.0, 200);

    // 6. SIGTERM the server's agent: its instance is deregistered (the
    // lease revoked), its Envoy drained and stopped, then the agent exits.
    let envoy = server.envoy_pid().unwrap();
    server.agent.proc.signal(libc::SIGTERM);
    let status = server.agent.proc.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "the agent exited cleanly: {status:?}\n{}", server.logs());
    assert!(!alive(envoy), "Envoy is gone with the agent");
    assert_eq!(get(&api, &reviews_path).await.0, 404, "the instance is deregistered");
    assert_eq!(get(&api, &format!("/v1/resources/leases/shop/reviews-{}", dashed(&server_ip))).await.0, 404);
    let logs = server.full_log();
    let (revoked, drained) = (logs.find("revoked the lease"), logs.find("draining Envoy's listeners"));
    assert!(revoked.is_some() && drained.is_some() && revoked < drained, "deregistered, then drained:\n{}", server.logs());
    // No endpoint left for reviews: the client's Envoy answers 503.
    until("no endpoint for reviews", Duration::from_secs(20), || async { matches!(via_client(&client_ip, "/gone").await, Ok((503, _))) }).await;

    // 7. SIGINT the client's agent: the same.
    let envoy = client.envoy_pid().unwrap();
    client.agent.proc.signal(libc::SIGINT);
    assert!(client.agent.proc.wait_exit(Duration::from_secs(30)).success(), "{}", client.logs());
    assert!(!alive(envoy));
    assert_eq!(get(&api, &web_path).await.0, 404);
}

/// Registration mistakes fail the agent at start, naming the problem,
/// before it runs anything.
#[tokio::test]
async fn agent_refuses_a_registration_it_cannot_make() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let p = kit::loopback_prefix();
    let (status, body) = kit::apply(&kit::http(), &api,
        "apiVersion: networking.istio.io/v1\nkind: WorkloadGroup\nmetadata: {name: db, namespace: shop}\nspec:\n  template: {serviceAccount: db, ports: {tcp: 5432}}\n",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let tmp = tempfile::tempdir().unwrap();
    let run = |name: &str, args: &[&str]| {
        AgentBuilder::new(NS, name, &xds, &tmp.path().join(name))
            .server(&api)
            .args(["--ip", &format!("{p}.30")])
            .join_token(&api, &format!("{NS}/{name}"))
            .args(args)
            .run()
    };
    // The group's service account is not the certificate's.
    let (ok, err) = run("cart", &["--workload-group", "shop/db"]);
    assert!(!ok && err.contains("template.serviceAccount") && err.contains("shop/cart"), "{err}");
    // No such group.
    let (ok, err) = run("cart", &["--workload-group", "shop/nope"]);
    assert!(!ok && err.contains("shop/nope"), "{err}");
    // No ports.
    let (ok, err) = run("cart", &["--register", "cart"]);
    assert!(!ok && err.contains("--port"), "{err}");
    // A bad health check URL names the field.
    let (ok, err) = run("cart", &["--register", "cart", "--port", "http=80", "--check-http", "https://x/"]);
    assert!(!ok && err.contains("spec.healthCheck.http"), "{err}");
}
