//! AuthorizationPolicy enforced by a real Envoy: a workload's Sidecar
//! ingress (an HTTP and a TCP port) behind the policies applied to a
//! replica, and requests from distinct loopback source addresses
//! (`127.A.B.50`, `.51`) through it. Every case of the matrix is a real
//! request; the expected status is what Istio documents for it.

use crate::kit;

use kit::envoy::{EnvoyOptions, Upstream};
use kit::mesh::*;
use std::collections::BTreeMap;
use std::time::Duration;

/// The workload: `web` in `default`, HTTP on 8000 and TCP on 9000, both
/// forwarding to the application.
const WORKLOAD: &str = r#"
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web, namespace: default}
spec:
  workloadSelector: {labels: {app: web}}
  ingress:
  - port: {number: 8000, protocol: HTTP, name: http}
    defaultEndpoint: ${app.ip}:${app.port}
  - port: {number: 9000, protocol: TCP, name: tcp}
    defaultEndpoint: ${app.ip}:${app.port}
"#;

const INBOUND_TYPES: &[&str] = &["CDS", "LDS"];

/// One request of the matrix.
struct Case {
    from: u8,
    method: &'static str,
    path: &'static str,
    headers: &'static [(&'static str, &'static str)],
    want: u16,
}

const fn case(from: u8, method: &'static str, path: &'static str, headers: &'static [(&'static str, &'static str)], want: u16) -> Case {
    Case { from, method, path, headers, want }
}

/// A client whose connections come from `ip`.
fn client_from(ip: &str) -> reqwest::Client {
    reqwest::Client::builder().no_proxy().local_address(ip.parse::<std::net::IpAddr>().unwrap()).pool_max_idle_per_host(0).build().unwrap()
}

/// Status of one request (0: the connection was refused or closed).
async fn status(client: &reqwest::Client, method: &str, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut req = client.request(method.parse().unwrap(), url).header("host", "web.default.svc.cluster.local").timeout(Duration::from_secs(10));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    match req.send().await {
        Ok(r) => {
            let s = r.status().as_u16();
            (s, r.text().await.unwrap_or_default())
        }
        Err(_) => (0, String::new()),
    }
}

struct Bench {
    fx: Fixture,
    proxy: Proxy,
    _app: Upstream,
}

impl Bench {
    async fn start() -> Bench {
        let fx = Fixture::start(1).await;
        // Istio: an inbound endpoint is the workload on 127.0.0.1.
        let app = Upstream::start("127.0.0.1", "web-app").await;
        let rev = fx.apply(&render(WORKLOAD, &[("app", &app)])).await;
        let mut o = EnvoyOptions::new("web", &fx.ip(41));
        o.labels = vec![("app".into(), "web".into())];
        // Inbound only: no outbound services, so no EDS or RDS.
        let proxy = fx.proxy_of_types(o, 1, rev, INBOUND_TYPES).await;
        Bench { fx, proxy, _app: app }
    }

    fn url(&self, port: u16, path: &str) -> String {
        self.proxy.url(port, path)
    }

    /// Apply `yaml` and wait until the proxy has it.
    async fn apply(&self, yaml: &str) {
        let yaml = yaml.replace("${ip50}", &self.fx.ip(50)).replace("${ip51}", &self.fx.ip(51));
        let rev = self.fx.apply(&yaml).await;
        self.proxy.wait_synced_types(rev, INBOUND_TYPES).await;
    }

    async fn delete(&self, kind: &str, ns: &str, name: &str) {
        let r = self.fx.client.delete(format!("{}/v1/resources/{kind}/{ns}/{name}", self.fx.api(1))).send().await.unwrap();
        assert!(r.status().is_success(), "delete {kind} {ns}/{name}: {}", r.status());
        let rev: serde_json::Value = r.json().await.unwrap();
        self.proxy.wait_synced_types(rev["revision"].as_u64().unwrap(), INBOUND_TYPES).await;
    }

    /// `lodestar authz check` for one case: allowed?, and what it printed.
    fn explain(&self, port: u16, c: &Case) -> (bool, String) {
        let source = self.fx.ip(c.from);
        let port_s = port.to_string();
        let mut args = vec!["authz", "check", "--proxy", "web.default", "--port", &port_s, "--source", &source, "--method", c.method, "--path", c.path];
        args.extend(["--host", "web.default.svc.cluster.local"]);
        let headers: Vec<String> = c.headers.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for h in &headers {
            args.extend(["--header", h.as_str()]);
        }
        let (ok, stdout, stderr) = kit::cli(&self.fx.api(1), &args);
        assert!(ok || stdout.starts_with("DENIED"), "authz check failed: {stdout}{stderr}");
        (ok, stdout)
    }

    /// Every case gets its expected status. Envoy applies an ACKed listener
    /// update on its workers just after the ACK: the first case is polled
    /// until it holds, then every case must hold at once.
    async fn check(&self, what: &str, port: u16, cases: &[Case]) {
        let first = &cases[0];
        kit::eventually_or(&format!("{what}: the first case gets {}", first.want), BOUND, || async {
            let (s, _) = status(&client_from(&self.fx.ip(first.from)), first.method, &self.url(port, first.path), first.headers).await;
            if s == first.want {
                Ok(())
            } else {
                Err(format!("{s}"))
            }
        })
        .await;
        let mut wrong = Vec::new();
        for c in cases {
            let (s, body) = status(&client_from(&self.fx.ip(c.from)), c.method, &self.url(port, c.path), c.headers).await;
            if s != c.want {
                wrong.push(format!("from .{} {} {} {:?}: got {s} {body:?}, want {}", c.from, c.method, c.path, c.headers, c.want));
            }
            if s == 403 {
                assert_eq!(body, "RBAC: access denied", "{what}: Envoy's RBAC denial");
            }
            // `lodestar authz check` agrees with what Envoy did.
            let (allowed, out) = self.explain(port, c);
            if allowed != (s == 200) {
                wrong.push(format!("from .{} {} {} {:?}: Envoy said {s}, authz check said:\n{out}", c.from, c.method, c.path, c.headers));
            }
        }
        assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
    }
}

const POLICIES: &str = r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-web, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  action: ALLOW
  rules:
  - from: [{source: {ipBlocks: ["${ip50}"]}}]
    to: [{operation: {methods: [GET], paths: ["/public/*", /exact, "*.css"]}}]
  - to: [{operation: {methods: [POST], paths: [/submit]}}]
    when: [{key: "request.headers[x-tenant]", values: [acme]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-secrets, namespace: default}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: ["/public/secret*"], ports: ["8000"]}}]}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_policies_decide_at_a_real_envoy() {
    let b = Bench::start().await;
    // No policy: everything passes, on both ports.
    b.check("no policy", 8000, &[case(51, "GET", "/anything", &[], 200), case(50, "DELETE", "/x", &[], 200)]).await;
    b.check("no policy, TCP", 9000, &[case(51, "GET", "/anything", &[], 200)]).await;

    // A policy that selects no known workload is applied, with a warning.
    let typo = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: typo, namespace: default}\nspec: {selector: {matchLabels: {app: wbe}}, rules: [{}]}\n";
    let (_, body) = kit::apply(&b.fx.client, &b.fx.api(1), typo).await;
    assert!(body["warnings"].to_string().contains("selects nothing yet: no workload labelled app=wbe in namespace default"), "{body}");
    // It selects no one: no proxy is sent anything for it (nor for its
    // deletion), so there is nothing to wait for.
    let r = b.fx.client.delete(format!("{}/v1/resources/authorizationpolicies/default/typo", b.fx.api(1))).send().await.unwrap();
    assert!(r.status().is_success());

    b.apply(POLICIES).await;
    b.check(
        "ALLOW and DENY",
        8000,
        &[
            case(50, "GET", "/public/a", &[], 200),
            case(51, "GET", "/public/a", &[], 403),  // ipBlocks
            case(50, "POST", "/public/a", &[], 403), // method
            case(50, "GET", "/exact", &[], 200),
            case(50, "GET", "/exact/more", &[], 403),                  // exact path
            case(50, "GET", "/styles/site.css", &[], 200),             // suffix
            case(50, "GET", "/public/secret-plans", &[], 403),         // DENY beats ALLOW
            case(51, "POST", "/submit", &[("x-tenant", "acme")], 200), // header condition
            case(51, "POST", "/submit", &[("x-tenant", "other")], 403),
            case(51, "POST", "/submit", &[], 403),
            case(50, "GET", "/private", &[], 403), // an ALLOW exists: the rest is denied
        ],
    )
    .await;
    // The explanation names the deciding rule, and why the others missed.
    let (_, out) = b.explain(8000, &case(50, "GET", "/public/secret-plans", &[], 403));
    assert!(out.starts_with("DENIED: denied by ns[default]-policy[deny-secrets]-rule[0]"), "{out}");
    let (_, out) = b.explain(8000, &case(51, "GET", "/public/a", &[], 403));
    assert!(out.contains(&format!("source {} is not in {}/32", b.fx.ip(51), b.fx.ip(50))), "{out}");
    assert!(out.contains("method \"GET\" is not \"POST\""), "{out}");
    // The TCP port: both ALLOW rules use HTTP-only fields, so on TCP they
    // match nothing (and an ALLOW selects the workload): refused. The DENY
    // rule's port does not match 9000 either way.
    b.check("HTTP-only ALLOW rules on TCP", 9000, &[case(50, "GET", "/public/a", &[], 0)]).await;
    // Envoy names the deciding policy in its per-rule stats.
    let stats = b.proxy.envoy.stats().await;
    let denied_by = |policy: &str| stats.iter().filter(|(k, v)| k.contains(policy) && k.ends_with(".denied") && **v > 0).count();
    assert!(denied_by("ns[default]-policy[deny-secrets]-rule[0]") > 0, "{:?}", stats.keys().filter(|k| k.contains("rbac")).collect::<Vec<_>>());

    // An ALLOW with no rules denies everything; `rules: [{}]` allows all.
    b.apply("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-web, namespace: default}\nspec: {selector: {matchLabels: {app: web}}}\n").await;
    b.delete("authorizationpolicies", "default", "deny-secrets").await;
    b.check("empty ALLOW", 8000, &[case(50, "GET", "/public/a", &[], 403), case(51, "GET", "/", &[], 403)]).await;
    b.check("empty ALLOW, TCP", 9000, &[case(50, "GET", "/", &[], 0)]).await;
    b.apply("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: allow-web, namespace: default}\nspec: {rules: [{}]}\n").await;
    b.check("rules: [{}]", 8000, &[case(51, "DELETE", "/whatever", &[], 200), case(50, "GET", "/", &[], 200)]).await;
    b.check("rules: [{}], TCP", 9000, &[case(51, "GET", "/", &[], 200)]).await;

    // A mesh-wide DENY in the root namespace; TCP honours its source
    // field, and a DENY rule's HTTP-only field is dropped on TCP (it
    // matches more).
    b.apply(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-51, namespace: istio-system}
spec:
  action: DENY
  rules: [{from: [{source: {ipBlocks: ["${ip51}"]}}]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-delete, namespace: default}
spec:
  action: DENY
  rules: [{to: [{operation: {methods: [DELETE]}}], from: [{source: {ipBlocks: ["${ip50}"]}}]}]
"#,
    )
    .await;
    b.check(
        "mesh-wide DENY",
        8000,
        &[case(51, "GET", "/", &[], 403), case(50, "GET", "/", &[], 200), case(50, "DELETE", "/", &[], 403), case(51, "DELETE", "/", &[], 403)],
    )
    .await;
    b.check("DENY on TCP", 9000, &[case(51, "GET", "/", &[], 0), case(50, "GET", "/", &[], 0)]).await;
    b.delete("authorizationpolicies", "istio-system", "no-51").await;
    b.delete("authorizationpolicies", "default", "no-delete").await;
    b.check("DENYs gone", 9000, &[case(51, "GET", "/", &[], 200), case(50, "GET", "/", &[], 200)]).await;

    // Dry run: counted, not enforced.
    b.apply(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata:
  name: try-deny
  namespace: default
  annotations: {istio.io/dry-run: "true"}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: [/maybe]}}]}]
"#,
    )
    .await;
    b.check("dry-run DENY", 8000, &[case(50, "GET", "/maybe", &[], 200)]).await;
    let stats = b.proxy.envoy.stats().await;
    let shadow: BTreeMap<&String, &u64> = stats.iter().filter(|(k, v)| k.contains("istio_dry_run_deny_") && k.ends_with("shadow_denied") && **v > 0).collect();
    assert!(!shadow.is_empty(), "the dry-run denial is counted: {:?}", stats.keys().filter(|k| k.contains("rbac")).collect::<Vec<_>>());
    b.proxy.envoy.assert_no_rejections().await;
}

/// `lodestar-bench http` (benches/rbac.sh's client) through the Envoy:
/// every request is counted under its status, and a policy's denials show
/// as 403s, not as errors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_http_counts_statuses_through_envoy() {
    let b = Bench::start().await;
    b.apply(
        r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-denied, namespace: default}
spec:
  action: DENY
  rules: [{to: [{operation: {paths: ["/denied/*"]}}]}]
"#,
    )
    .await;
    b.check("DENY /denied/*", 8000, &[case(51, "GET", "/denied/x", &[], 403), case(51, "GET", "/ok", &[], 200)]).await;
    let api = b.fx.api(1);
    for (path, want) in [("/ok", "200:30"), ("/denied/x", "403:30")] {
        let url = b.url(8000, path);
        let out = kit::bench(&api, &["http", "--url", &url, "--requests", "30", "--concurrency", "3", "--header", "host=web.default.svc.cluster.local"]).await;
        let r = &kit::results(&out)[0];
        assert_eq!(kit::number(r, "requests"), 30.0, "{path}");
        assert_eq!(kit::number(r, "errors"), 0.0, "{path}");
        assert_eq!(r["statuses"], want, "{path}");
        assert!(kit::number(r, "p50_ms") > 0.0 && kit::number(r, "p50_ms") <= kit::number(r, "max_ms"), "{path}: {r:?}");
    }
}
