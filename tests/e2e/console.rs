//! The web console (issue 36): served by every replica at `/ui/` on its
//! API port, locked down by its headers, and driven in a real headless
//! Chromium (playwright-core, `tests/console/console.cjs`) against a
//! three-replica cluster with a real Envoy connected: sign-in (keyboard
//! only; the token in sessionStorage, never in a URL), the Overview's
//! members and proxy, a list that updates live over the watch, errors
//! shown at their line as a VirtualService is typed (`POST /v1/validate`,
//! also checked here through REST and `lodestar validate`), an edit
//! previewed by the dry-run and applied at the previewed revision, History
//! with a diff and a previewed rollback, a namespace's token refused
//! another namespace with the reason shown, Proxies and Security. Every
//! scenario fails on a console error or a failed request it did not
//! provoke. The outcome is then checked through the REST API, and Envoy's.
//! Last, the replica serving the page is killed and the open page carries
//! on with another member (the page's CSP and the API's CORS allow the
//! members' origins, and only those).

use crate::kit;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use kit::mesh::Fixture;
use kit::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// playwright-core's node_modules (`LODESTAR_CONSOLE_NODE`, as `tests/run`
/// sets it), or installed now: fails, never skips, without a browser.
fn node_modules() -> PathBuf {
    if let Some(p) = std::env::var_os("LODESTAR_CONSOLE_NODE") {
        return p.into();
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/install-console.sh");
    let out = std::process::Command::new(&script).output().expect("running install-console.sh");
    assert!(out.status.success(), "the console's browser tests need Chromium, Node and playwright-core: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn chromium() -> PathBuf {
    let path = PathBuf::from(std::env::var_os("LODESTAR_CHROMIUM").unwrap_or_else(|| "/usr/bin/chromium".into()));
    assert!(path.exists(), "no Chromium at {} (tests/support/install-console.sh installs Debian's)", path.display());
    path
}

const SHOP: &str = r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: reviews, namespace: shop}
spec:
  ports: [{name: http, number: 9080}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: reviews-1, namespace: shop}
spec: {service: reviews, address: 127.0.0.1, port: 9080}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: ratings, namespace: shop}
spec:
  ports: [{name: http, number: 9090}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: ratings-1, namespace: shop, labels: {app: ratings}}
spec: {service: ratings, address: 127.0.0.1, port: 9090, serviceAccount: ratings}
---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {name: payments, namespace: billing}
spec:
  ports: [{name: http, number: 7000}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {name: payments-1, namespace: billing, labels: {app: payments}}
spec: {service: payments, address: 127.0.0.1, port: 7000, serviceAccount: payments}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: payments-from-ratings, namespace: billing}
spec:
  selector: {matchLabels: {app: payments}}
  action: ALLOW
  rules: [{from: [{source: {principals: [cluster.local/ns/shop/sa/ratings]}}]}]
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: reviews, namespace: shop, annotations: {note: "l1\nl2: x\n"}}
spec:
  hosts: [reviews.shop.svc.cluster.local]
  http:
  - route:
    - destination: {host: reviews.shop.svc.cluster.local}
    timeout: 2s
    headers:
      request:
        set: {x-flag: "true", x-version: "1.0", x-note: "a: b #c", x-empty: "", x-quoted: "it's \"q\"", x-text: "- é ✓ "}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: payments, namespace: billing}
spec:
  hosts: [payments.billing.svc.cluster.local]
  http:
  - route:
    - destination: {host: payments.billing.svc.cluster.local}
---
apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: web, namespace: default}
spec:
  workloadSelector: {labels: {app: web}}
  ingress:
  - port: {number: 8000, protocol: HTTP, name: http}
    defaultEndpoint: 127.0.0.1:8000
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web-public, namespace: default}
spec:
  selector: {matchLabels: {app: web}}
  action: ALLOW
  rules:
  - to: [{operation: {methods: [GET], paths: [/public/*]}}]
---
apiVersion: acl.lodestar.io/v1
kind: Policy
metadata: {name: shop-reader}
spec:
  rules: [{verbs: [read], kinds: ['*'], namespaces: [shop]}]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_its_headers_and_says_who_signed_in() {
    let c = Cluster::start(1, "").await;
    let api = c.replica(1).api();
    let anonymous = anonymous_http_builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    // `/ui` sends to `/ui/`; loading the console takes no credential.
    let r = anonymous.get(format!("{api}/ui")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["location"].to_str().unwrap()), (308, "/ui/"));
    let dist = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui/dist");
    for (path, file, content_type, cache) in [
        ("/ui/", "index.html", "text/html; charset=utf-8", "no-store"),
        ("/ui/app.js", "app.js", "text/javascript; charset=utf-8", "no-cache"),
        ("/ui/app.css", "app.css", "text/css; charset=utf-8", "no-cache"),
        ("/ui/icon.svg", "icon.svg", "image/svg+xml", "no-cache"),
    ] {
        let r = anonymous.get(format!("{api}{path}")).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers().clone();
        assert_eq!(h["content-type"], content_type, "{path}");
        assert_eq!(h["cache-control"], cache, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'self'") && csp.contains("frame-ancestors 'none'") && !csp.contains("unsafe"), "{path}: {csp}");
        // What is served is what ui/dist holds (embedded at build time).
        assert_eq!(r.bytes().await.unwrap(), std::fs::read(dist.join(file)).unwrap(), "{path}");
    }
    let (status, _) = kit::call(anonymous.get(format!("{api}/ui/missing.js"))).await;
    assert_eq!(status, 404);
    // The page may call the members' APIs (failover), and nothing else.
    let r = anonymous.get(format!("{api}/ui/")).send().await.unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(csp.contains(&format!("connect-src 'self' {api};")), "{csp}");
    // CORS: a member's origin may read the API's answers; another may not.
    let preflight = |origin: &str| {
        anonymous
            .request(reqwest::Method::OPTIONS, format!("{api}/v1/resources/vs"))
            .header("origin", origin)
            .header("access-control-request-method", "GET")
            .header("access-control-request-headers", "authorization")
            .send()
    };
    let r = preflight(&api).await.unwrap();
    assert_eq!(r.status(), 204);
    assert_eq!(r.headers()["access-control-allow-origin"], api.as_str());
    assert_eq!(r.headers()["access-control-allow-headers"], "authorization, content-type, x-lodestar-message");
    assert!(r.headers().get("access-control-allow-credentials").is_none(), "bearer tokens only, never cookies");
    let r = preflight("https://elsewhere.example").await.unwrap();
    assert_ne!(r.status(), 204);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    for (origin, allowed) in [(api.as_str(), true), ("https://elsewhere.example", false)] {
        let r = c.http.get(format!("{api}/v1/resources/vs")).header("origin", origin).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers().get("access-control-allow-origin").is_some(), allowed, "{origin}");
    }
    // The data behind it is not public: the API wants a token.
    let (status, _) = kit::call(anonymous.get(format!("{api}/v1/resources/vs"))).await;
    assert_eq!(status, 401);

    // Who a token is: any valid token may ask; no secret in the answer.
    let (status, _) = kit::call(anonymous.get(format!("{api}/v1/acl/token/self"))).await;
    assert_eq!(status, 401);
    let (status, me) = kit::call(c.http.get(format!("{api}/v1/acl/token/self"))).await;
    assert_eq!((status, &me), (200, &json!({"who": "the initial management token", "clusterRead": true, "management": true})));
    applied(&c.http, &api, SHOP).await;
    let t = token_create(&api, &["--policy", "shop-reader"]);
    let secret = t["secret"].as_str().unwrap();
    let (status, me) = kit::call(token_client(Some(secret)).get(format!("{api}/v1/acl/token/self"))).await;
    let accessor = t["accessorId"].as_str().unwrap();
    assert_eq!((status, &me), (200, &json!({"who": format!("token {accessor}"), "clusterRead": false, "management": false})));
    assert!(!me.to_string().contains(secret));
    // The CLI asks the same.
    let (ok, out, err) = cli(&api, &["--token", secret, "token", "self"]);
    assert!(ok, "{err}");
    assert_eq!(out, format!("token {accessor}\ncluster read: no\nmanagement: no\n"));

    // What the editor asks as the user types: `POST /v1/validate`, an
    // apply's checks and nothing more. Invalid is an answer (200, the
    // error the apply would give, its fields named); nothing is written.
    let validate = |who: &reqwest::Client, q: &str, body: &str| {
        who.post(format!("{api}/v1/validate{q}")).header("content-type", "application/yaml").body(body.to_string())
    };
    let vs = |name: &str, extra: &str| {
        format!(
            "apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata:\n  name: {name}\n  namespace: shop\nspec:\n  hosts: [ratings.shop.svc.cluster.local]\n  http:\n  - route:\n    - destination:\n        host: ratings.shop.svc.cluster.local\n{extra}"
        )
    };
    let (status, at) = get_json(&c.http, &format!("{api}/v1/resources/vs")).await;
    assert_eq!(status, 200, "{at}");
    let r = validate(&c.http, "", &vs("typed", "")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["x-lodestar-revision"].to_str().unwrap().parse::<u64>().unwrap()), (200, at["revision"].as_u64().unwrap()));
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"valid": true, "revision": at["revision"], "warnings": []}));
    let (status, _) = kit::call(c.http.get(format!("{api}/v1/resources/vs/shop/typed"))).await;
    assert_eq!(status, 404, "a validation writes nothing");
    // The analyzers' findings on the write are its warnings (a second
    // VirtualService for reviews' host).
    let (status, clash) = kit::call(validate(&c.http, "", &vs("typed", "").replace("ratings.", "reviews."))).await;
    assert_eq!((status, &clash["valid"]), (200, &json!(true)), "{clash}");
    assert!(clash["warnings"].as_array().unwrap().iter().any(|w| w.as_str().unwrap().starts_with("Error [IST0109] (VirtualService shop/typed) ")), "{clash}");
    let two = format!("{}---\n{}", vs("ok", ""), vs("typed", "      weight: 150\n"));
    let (status, bad) = kit::call(validate(&c.http, "", &two)).await;
    assert_eq!((status, &bad["valid"], &bad["error"]["code"]), (200, &json!(false), &json!("InvalidArgument")), "{bad}");
    assert_eq!(bad["error"]["fields"][0]["field"], "resources[1].spec.http[0].route[0].weight", "{bad}");
    // The apply refuses the same body with the same error.
    let (status, refused) = kit::call(c.http.post(format!("{api}/v1/apply")).header("content-type", "application/yaml").body(two.clone())).await;
    assert_eq!((status, &refused["error"]), (400, &bad["error"]), "{refused}");
    // A parser's error says where; an unknown field is a warning (as the
    // apply's default), refused with fieldValidation=Strict.
    let (status, syntax) = kit::call(validate(&c.http, "", "kind: VirtualService\nmetadata:\n\tname: x\n")).await;
    let reason = syntax["error"]["fields"][0]["reason"].as_str().unwrap_or_default().to_string();
    assert!(status == 200 && reason.starts_with("malformed YAML") && reason.contains("line 3 column 1"), "{syntax}");
    let unknown = vs("typed", "    retriez: 3\n");
    let (status, warned) = kit::call(validate(&c.http, "", &unknown)).await;
    assert_eq!((status, &warned["valid"]), (200, &json!(true)), "{warned}");
    assert!(
        warned["warnings"][0].as_str().is_some_and(|w| w.starts_with("resources[0] (virtualservices/shop/typed): unknown field spec.http[0].retriez dropped")),
        "{warned}"
    );
    let (_, strict) = kit::call(validate(&c.http, "?fieldValidation=Strict", &unknown)).await;
    assert_eq!((&strict["valid"], &strict["error"]["fields"][0]["field"]), (&json!(false), &json!("resources[0].spec.http[0].retriez")), "{strict}");
    // Authorized as the apply: a token that may only read gets the
    // apply's refusal, not a verdict on the text.
    let (status, denied) = kit::call(validate(&token_client(Some(secret)), "", &vs("typed", ""))).await;
    assert_eq!((status, &denied["error"]["code"]), (403, &json!("PermissionDenied")), "{denied}");
    // The CLI: `lodestar validate -f`, exit status and all.
    let file = c.tmp.path().join("typed.yaml");
    std::fs::write(&file, &two).unwrap();
    let (ok, out, err) = cli(&api, &["validate", "-f", file.to_str().unwrap()]);
    assert!(!ok && out.is_empty() && err.contains("resources[1].spec.http[0].route[0].weight: weight 150 must be in the range 0..=100"), "{out}\n{err}");
    std::fs::write(&file, &unknown).unwrap();
    let (ok, out, err) = cli(&api, &["validate", "-f", file.to_str().unwrap()]);
    assert!(ok && out.starts_with("valid: 1 resource(s), checked at revision ") && err.contains("unknown field spec.http[0].retriez"), "{out}\n{err}");
    let (ok, _, err) = cli(&api, &["validate", "--validate", "strict", "-f", file.to_str().unwrap()]);
    assert!(!ok && err.contains("resources[0].spec.http[0].retriez"), "{err}");

    // Who may call whom: every edge for the management token...
    let edges = |t: &Value| -> Vec<String> {
        t["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{} -> {}: {}", e["from"].as_str().unwrap(), e["to"].as_str().unwrap(), e["verdict"].as_str().unwrap()))
            .collect()
    };
    let (status, all) = kit::call(c.http.get(format!("{api}/v1/topology"))).await;
    assert_eq!(status, 200, "{all}");
    let (ratings, payments) = ("ratings.shop.svc.cluster.local", "payments.billing.svc.cluster.local");
    assert!(edges(&all).contains(&format!("{ratings} -> {payments}: allowed")), "{all}");
    assert!(edges(&all).contains(&format!("reviews.shop.svc.cluster.local -> {payments}: denied")), "{all}");
    // ...and only its namespace's for a namespace reader (no error: what
    // it may not read is left out).
    let (status, mine) = kit::call(token_client(Some(secret)).get(format!("{api}/v1/topology"))).await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(
        edges(&mine),
        [
            "ratings.shop.svc.cluster.local -> reviews.shop.svc.cluster.local: allowed".to_string(),
            format!("reviews.shop.svc.cluster.local -> {ratings}: allowed")
        ],
        "{mine}"
    );
    assert!(!mine.to_string().contains("billing"), "{mine}");
    // The CLI prints the same edges.
    let (ok, out, err) = cli(&api, &["topology", "--namespace", "billing"]);
    assert!(ok, "{err}");
    let line = out.lines().find(|l| l.starts_with(ratings)).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        [ratings, payments, "allowed", "VirtualService", "billing/payments,", "AuthorizationPolicy", "billing/payments-from-ratings"],
        "{out}"
    );
    let (status, bad) = kit::call(c.http.get(format!("{api}/v1/topology?limit=0"))).await;
    assert_eq!((status, bad["error"]["fields"][0]["field"].as_str()), (400, Some("limit")), "{bad}");
    // The NACKs of the last hour: none yet; a namespace reader may not ask.
    let (status, nacks) = kit::call(c.http.get(format!("{api}/v1/nacks/recent"))).await;
    assert_eq!((status, &nacks["replica"], &nacks["nacks"]), (200, &json!(1), &json!([])), "{nacks}");
    let (status, _) = kit::call(token_client(Some(secret)).get(format!("{api}/v1/nacks/recent"))).await;
    assert_eq!(status, 403);
    // The ACK progress of a revision no proxy waits for: one final line.
    let r = c.http.get(format!("{api}/v1/wait?revision=1&progress=true&timeout=5s")).send().await.unwrap();
    assert_eq!((r.status().as_u16(), r.headers()["content-type"].to_str().unwrap()), (200, "application/x-ndjson"));
    let lines: Vec<Value> = r.text().await.unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, [json!({"revision": 1, "converged": true, "proxies": 0, "synced": 0, "pending": [], "nacked": [], "unreachable": []})]);
    // A proxy that has its clusters but has not ACKed them yet: the
    // stream says so at once, then, when it ACKs, that it has.
    let (ads, first) = ads_clusters(1, &c.replica(1).xds_addr(), "sidecar~127.0.0.78~slow.default~default.svc.cluster.local").await;
    let revision: u64 = first.version_info.parse().unwrap();
    let mut r = c.http.get(format!("{api}/v1/wait?revision={revision}&progress=true&timeout=20s")).send().await.unwrap();
    let mut buf = String::new();
    let waiting = next_line(&mut r, &mut buf).await;
    assert_eq!(
        (&waiting["converged"], &waiting["proxies"], &waiting["synced"], &waiting["pending"]),
        (&json!(false), &json!(1), &json!(0), &json!(["sidecar~127.0.0.78~slow.default~default.svc.cluster.local (replica 1)"])),
        "{waiting}"
    );
    ads.send(DiscoveryRequest {
        type_url: CLUSTERS.into(),
        version_info: first.version_info.clone(),
        response_nonce: first.nonce.clone(),
        ..Default::default()
    })
    .await;
    let done = next_line(&mut r, &mut buf).await;
    assert_eq!((&done["converged"], &done["proxies"], &done["synced"]), (&json!(true), &json!(1), &json!(1)), "{done}");
    assert!(r.chunk().await.unwrap().is_none(), "the stream ends with the outcome");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_edits_and_rolls_back_the_mesh_in_a_real_browser() {
    let (modules, browser) = (node_modules(), chromium());
    let mut fx = Fixture::start(3).await;
    let api = fx.api(1);
    let rev = fx.apply(SHOP).await;
    let proxy = fx.sidecar("web", 1, 1, false, rev).await;
    // A second Envoy, on another replica: the ACK progress after an edit
    // counts both.
    let other = fx.sidecar("ratings", 2, 2, false, rev).await;
    // A proxy on a third replica rejects a config and goes away: the
    // Overview still lists its NACK (every replica's, kept after the
    // stream ends).
    nack_once(&fx, 3, "console: rejected on purpose").await;
    // The CLI lists it too, asking any replica (each member is asked).
    let (ok, out, err) = cli(&api, &["nacks", "--recent"]);
    assert!(ok, "{err}");
    assert_eq!(out, "replica 3: rejecter.default rejected CDS version 1: console: rejected on purpose\n", "{err}");
    let scoped = token_create(&api, &["--policy", "shop-reader", "--description", "console reader", "--ttl", "1h"]);
    let common = [
        ("NODE_PATH", modules.display().to_string()),
        ("NODE_EXTRA_CA_CERTS", test_ca().ca_file.display().to_string()),
        ("CHROMIUM", browser.display().to_string()),
        ("CONSOLE_URL", format!("{api}/ui/")),
        ("CONSOLE_TOKEN", management_token().to_string()),
        ("CONSOLE_SCOPED_TOKEN", scoped["secret"].as_str().unwrap().to_string()),
        ("CONSOLE_NS_A", "shop".into()),
        ("CONSOLE_NS_B", "billing".into()),
        ("CONSOLE_PROXY", proxy.id.clone()),
        ("CONSOLE_PROXIES", "2".into()),
        ("CONSOLE_NACKER", "rejecter.default".into()),
        ("CONSOLE_SCOPED_ACCESSOR", scoped["accessorId"].as_str().unwrap().to_string()),
        ("CONSOLE_MEMBERS", "3".into()),
    ];
    let all = scenarios(&common, &[("CONSOLE_SCENARIOS", "main".into())]).await;
    let (base, edited, rolled_back) =
        (all["edit"]["base"].as_u64().unwrap(), all["edit"]["revision"].as_u64().unwrap(), all["rollback"]["revision"].as_u64().unwrap());
    assert!(base < edited && edited < rolled_back, "{all}");
    for shot in [
        "sign-in",
        "overview",
        "config",
        "object",
        "edit-preview",
        "edit-errors",
        "history",
        "diff",
        "rollback-preview",
        "edit-applied",
        "scoped-denied",
        "proxies",
        "proxy-config",
        "services",
        "security",
    ] {
        assert!(screenshots().join(format!("{shot}.png")).exists(), "no screenshot of {shot}");
    }

    // Through the REST API: the edit was the previewed change, at the
    // previewed revision; the rollback restored the spec as it was.
    let get = |path: String| {
        let http = fx.client.clone();
        async move {
            let (status, body) = get_json(&http, &path).await;
            assert_eq!(status, 200, "{path}: {body}");
            body
        }
    };
    let d = get(format!("{api}/v1/diff?from={base}&to={edited}")).await;
    assert_eq!(
        d["changes"],
        json!([{"kind": "VirtualService", "namespace": "shop", "name": "reviews", "action": "configured",
                "diff": [{"path": "spec.http[0].timeout", "before": "2s", "after": "5s"}]}]),
        "{d}"
    );
    let reviews = get(format!("{api}/v1/resources/vs/shop/reviews")).await;
    assert_eq!(reviews["spec"]["http"][0]["timeout"], "2s", "{reviews}");
    assert_eq!(reviews["metadata"]["modRevision"], rolled_back, "{reviews}");
    let h = get(format!("{api}/v1/history?kind=vs&namespace=shop&name=reviews")).await;
    let revs: Vec<u64> = h["revisions"].as_array().unwrap().iter().map(|r| r["revision"].as_u64().unwrap()).collect();
    // (the other change the browser test made between preview and confirm
    // is at edited - 1)
    assert_eq!(revs[..4], [rolled_back, edited, edited - 1, rev], "{h}");
    assert_eq!(reviews["metadata"]["labels"]["changed"], "meanwhile", "{reviews}");
    // The edit's change message and author, as History shows them.
    let at_edit = h["revisions"].as_array().unwrap().iter().find(|r| r["revision"] == edited).unwrap();
    assert_eq!(at_edit["message"], "console: timeout 5s", "{at_edit}");
    let at_rollback = &h["revisions"][0];
    assert_eq!(
        (&at_rollback["revision"], &at_rollback["message"]),
        (&json!(rolled_back), &json!(format!("rollback to revision {} (console)", edited - 1))),
        "{h}"
    );
    assert!(at_edit["author"].as_str().is_some_and(|a| !a.is_empty()), "{at_edit}");
    // And the Envoys took both, without a rejection.
    for p in [&proxy, &other] {
        p.wait_synced(rolled_back).await;
        p.envoy.assert_no_rejections().await;
    }

    // The replica serving the page dies (the browser script kills it, at
    // the moment it chooses): the page carries on with another member.
    let pid = fx.cluster.replica(1).pid().expect("replica 1 runs").to_string();
    scenarios(&common, &[("CONSOLE_SCENARIOS", "failover".into()), ("CONSOLE_KILL_PID", pid), ("CONSOLE_OTHER_API", fx.api(2))]).await;
    fx.cluster.kill(1); // reaps it
    let (status, details) = get_json(&fx.client, &format!("{}/v1/resources/vs/shop/details", fx.api(3))).await;
    assert_eq!(status, 200, "the change made after the failover: {details}");
}

const CLUSTERS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// The next line of an NDJSON answer (`buf` keeps what came after it).
async fn next_line(r: &mut reqwest::Response, buf: &mut String) -> Value {
    while !buf.contains('\n') {
        let chunk = tokio::time::timeout(Duration::from_secs(20), r.chunk()).await.expect("a line within 20 s").unwrap().expect("the answer goes on");
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let (line, rest) = buf.split_once('\n').unwrap();
    let line = serde_json::from_str(line).unwrap();
    *buf = rest.to_string();
    line
}

/// A proxy `id` on member `n`'s xDS port (`xds`) asking for clusters: its
/// stream and the first response.
async fn ads_clusters(n: u64, xds: &str, id: &str) -> (AdsStream<DiscoveryRequest, DiscoveryResponse>, DiscoveryResponse) {
    use envoy_types::pb::envoy::config::core::v3::Node;
    let mut client = ads_client(n, xds);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let node = Node { id: id.into(), cluster: "test".into(), ..Default::default() };
    tx.send(DiscoveryRequest { node: Some(node), type_url: CLUSTERS.into(), ..Default::default() }).await.unwrap();
    let rx = client.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let mut ads = AdsStream { tx, rx };
    let first = ads.recv().await;
    (ads, first)
}

/// A proxy connects to replica `n`, rejects the first clusters it gets
/// with `error`, and disconnects once the replica has recorded the NACK.
async fn nack_once(fx: &Fixture, n: u64, error: &str) {
    use envoy_types::pb::google::rpc::Status as RpcStatus;
    let (ads, r) = ads_clusters(n, &fx.cluster.replica(n).xds_addr(), "sidecar~127.0.0.79~rejecter.default~default.svc.cluster.local").await;
    let status = RpcStatus { code: 3, message: error.into(), details: vec![] };
    ads.send(DiscoveryRequest { type_url: CLUSTERS.into(), response_nonce: r.nonce, error_detail: Some(status), ..Default::default() }).await;
    let api = fx.api(n);
    eventually("the replica records the NACK", Duration::from_secs(10), || async {
        let (_, body) = get_json(&fx.client, &format!("{api}/v1/nacks/recent")).await;
        body["nacks"].as_array().is_some_and(|l| l.iter().any(|e| e["error"] == error)).then_some(())
    })
    .await;
}

fn screenshots() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
}

/// Run `tests/console/console.cjs` with `env`: its summary line.
async fn scenarios(common: &[(&str, String)], env: &[(&str, String)]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/console.cjs");
    let started = std::time::Instant::now();
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(script).env("CONSOLE_SHOTS", screenshots()).kill_on_drop(true);
    for (k, v) in common.iter().chain(env) {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output()).await.expect("the browser scenarios finish within 2 minutes").expect("run node");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{stdout}\nbrowser scenarios {env:?}: {:.1} s", started.elapsed().as_secs_f64());
    assert!(out.status.success(), "the browser scenarios failed (screenshots in {}):\n{stdout}\n{stderr}", screenshots().display());
    stdout.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find(|v| v["scenario"] == "all").expect("the summary line")
}
