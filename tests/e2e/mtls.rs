//! Mutual TLS between Envoys: two workloads (client `web`, server
//! `reviews`, namespace `shop`), each a `lodestar agent` process and a real
//! Envoy started from the agent's bootstrap, against a real replica; the
//! server's app is an HTTP upstream and a TCP echo behind its Envoy's
//! inbound listeners. PeerAuthentication modes, auto-mTLS, ISTIO_MUTUAL
//! with a wrong SAN, certificate rotation under open connections, and a
//! gateway (an agent with `--node-type router`) terminating ISTIO_MUTUAL.

use crate::kit;

use kit::agent::{AgentBuilder, Workload};
use kit::envoy::Upstream;
use kit::mesh::{plain, via_client};
use kit::{cli, until, Cluster};
use serde_json::Value;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NS: &str = "shop";
const CLIENT_ID: &str = "spiffe://cluster.local/ns/shop/sa/web";

/// Start the agent for `shop/NAME` (label app=NAME) at `ip`, wait for its
/// certificate and bootstrap, then start Envoy from that bootstrap.
async fn workload(root: &Path, api: &str, xds: &str, name: &str, ip: &str, ttl: Option<&str>) -> Workload {
    workload_with(root, api, xds, name, ip, ttl, &[]).await
}

/// As `workload`, with more `lodestar agent` flags (`--node-type router`).
async fn workload_with(root: &Path, api: &str, xds: &str, name: &str, ip: &str, ttl: Option<&str>, extra: &[&str]) -> Workload {
    let mut agent = AgentBuilder::new(NS, name, xds, &root.join(name))
        .args(["--label", &format!("app={name}"), "--ip", ip, "--admin-port", "15000", "-o", "json"])
        .join_token(api, &format!("{NS}/{name}"))
        .args(extra);
    if let Some(ttl) = ttl {
        agent = agent.args(["--ttl", ttl]);
    }
    Workload::start(agent, ip, |admin| async move { kit::envoy::serving_serial(&admin).await.is_some() }).await
}

async fn delete(api: &str, kind: &str, name: &str) {
    let (ok, _, err) = cli(api, &["delete", kind, name, "-n", NS]);
    assert!(ok, "delete {kind} {name}: {err}");
}

/// Until every proxy has ACKed `revision` (none NACKed it).
async fn wait_synced(api: &str, revision: u64) {
    let r = kit::http().get(format!("{api}/v1/wait?revision={revision}&timeout=20s")).timeout(Duration::from_secs(25)).send().await.unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap_or(Value::Null);
    assert_eq!(status, 200, "proxies did not converge on {revision}: {body:#}");
}

/// TCP echo: everything read is written back.
async fn tcp_echo(ip: &str) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let l = tokio::net::TcpListener::bind(format!("{ip}:0")).await.unwrap();
    let addr = l.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (addr, task)
}

/// One round trip on a TCP connection: `Ok` when the echo came back.
async fn echo_once(s: &mut tokio::net::TcpStream, msg: &[u8]) -> Result<(), String> {
    s.write_all(msg).await.map_err(|e| format!("write: {e}"))?;
    let mut got = vec![0u8; msg.len()];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut got)).await.map_err(|_| "echo timed out".to_string())?.map_err(|e| format!("read: {e}"))?;
    if got != msg {
        return Err(format!("echo {got:?}"));
    }
    Ok(())
}

async fn tcp_roundtrip(addr: &str) -> Result<(), String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    // More than a TLS record header: the inspector decides on five bytes.
    echo_once(&mut s, b"ping over the mesh\n").await
}

/// The registry, the server's Sidecar (inbound 9080 HTTP2 to its app, 9090
/// TCP to its echo) and the two services: `reviews` (port 9080: the mesh
/// server with identity shop/reviews, and a legacy endpoint with none) and
/// `echo` (9090, the mesh server only).
fn mesh_yaml(p: &str, app: &Upstream, echo: std::net::SocketAddr, legacy: Option<&Upstream>) -> String {
    let legacy = legacy.map_or_else(String::new, |l| {
        format!(
            "---\napiVersion: registry.lodestar.io/v1\nkind: Instance\nmetadata: {{name: reviews-legacy, namespace: shop}}\nspec: {{service: reviews, address: {}, port: {}}}\n",
            l.addr.ip(),
            l.addr.port()
        )
    });
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
  - port: {{number: 9090, protocol: TCP, name: tcp}}
    defaultEndpoint: {echo}
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
kind: Instance
metadata: {{name: reviews-mesh, namespace: shop, labels: {{app: reviews}}}}
spec: {{service: reviews, address: {p}.21, port: 9080, serviceAccount: reviews}}
{legacy}---
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: echo, namespace: shop}}
spec:
  ports: [{{name: tcp, number: 9090}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: echo-mesh, namespace: shop, labels: {{app: reviews}}}}
spec: {{service: echo, address: {p}.21, port: 9090, serviceAccount: reviews}}
"#,
        app = app.addr,
    )
}

fn peer_auth(name: &str, body: &str) -> String {
    format!("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n{body}\n")
}

/// The dynamic listeners in a workload's Envoy config dump.
async fn listeners(w: &Workload) -> Vec<Value> {
    let v: Value = plain().get(format!("{}/config_dump?resource=dynamic_listeners", w.admin())).send().await.unwrap().json().await.unwrap();
    v["configs"].as_array().cloned().unwrap_or_default()
}

/// Until no listener of the workload's Envoy is draining (bounded).
async fn wait_no_draining(w: &Workload) {
    let what = format!("listeners no longer draining on {}", w.ip);
    until(&what, Duration::from_secs(20), || async { !listeners(w).await.iter().any(|l| l.get("draining_state").is_some()) }).await;
}

/// The bytes of a TLS ClientHello offering `alpn`.
fn client_hello(alpn: &[&str]) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|a| a.as_bytes().to_vec()).collect();
    let name = rustls::pki_types::ServerName::try_from("reviews.shop").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    conn.write_tls(&mut out).unwrap();
    out
}

/// A TLS stat of the client's reviews cluster (whichever transport socket
/// recorded it), summed.
async fn reviews_ssl(w: &Workload, suffix: &str) -> u64 {
    w.stats().await.iter().filter(|(k, _)| k.starts_with("cluster.outbound|9080||reviews.") && k.ends_with(suffix)).map(|(_, v)| v).sum()
}

fn xfcc(u: &Upstream, path: &str) -> Vec<Option<String>> {
    u.requests().into_iter().filter(|r| r.path == path).map(|r| r.headers.get("x-forwarded-client-cert").cloned()).collect()
}

#[tokio::test]
async fn peer_authentication_and_auto_mtls_between_two_envoys() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let p = kit::loopback_prefix();
    let (client_ip, server_ip) = (format!("{p}.20"), format!("{p}.21"));
    // Istio's Sidecar ingress forwards to 127.0.0.1 (the workload's own host).
    let app = Upstream::start("127.0.0.1", "reviews-mesh").await;
    let legacy = Upstream::start(&format!("{p}.22"), "reviews-legacy").await;
    let (echo, _echo_task) = tcp_echo("127.0.0.1").await;
    let rev = kit::applied(&kit::http(), &api, &mesh_yaml(&p, &app, echo, Some(&legacy))).await;

    let tmp = tempfile::tempdir().unwrap();
    let client = workload(tmp.path(), &api, &xds, "web", &client_ip, None).await;
    let server = workload(tmp.path(), &api, &xds, "reviews", &server_ip, None).await;
    wait_synced(&api, rev).await;
    let dump = || format!("{}\n{}", client.logs(), server.logs());

    // 1. No PeerAuthentication: PERMISSIVE. The client's Envoy speaks mutual
    // TLS to the endpoint with an identity and plaintext to the legacy one
    // (auto-mTLS, one cluster); the server's app sees the client's SPIFFE
    // id, the legacy one no client certificate; plaintext from outside the
    // mesh is served too.
    for i in 0..20 {
        let (status, body) = via_client(&client_ip, "/p1/echo").await.unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(status, 200, "request {i}: {body}\n{}", dump());
    }
    let mesh_seen = xfcc(&app, "/p1/echo");
    let legacy_seen = xfcc(&legacy, "/p1/echo");
    assert!(!mesh_seen.is_empty() && !legacy_seen.is_empty(), "both endpoints served: mesh {} legacy {}", mesh_seen.len(), legacy_seen.len());
    for h in &mesh_seen {
        let h = h.as_deref().unwrap_or_else(|| panic!("the server saw no client certificate\n{}", dump()));
        assert!(h.contains(&format!("URI={CLIENT_ID}")), "x-forwarded-client-cert {h:?} names the client's SPIFFE id");
    }
    assert!(legacy_seen.iter().all(Option::is_none), "the legacy endpoint got plaintext: {legacy_seen:?}");
    let ssl_ok = reviews_ssl(&client, "ssl.handshake").await;
    assert!(ssl_ok >= 1, "the client's Envoy made TLS handshakes to reviews");
    let r = plain().get(format!("http://{server_ip}:9080/p1-plain")).send().await.expect("PERMISSIVE serves plaintext");
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(xfcc(&app, "/p1-plain"), vec![None], "plaintext carries no identity (and none can be forged)");
    let forged = plain().get(format!("http://{server_ip}:9080/p1-forged")).header("x-forwarded-client-cert", format!("URI={CLIENT_ID}")).send().await.unwrap();
    assert_eq!(forged.status().as_u16(), 200);
    assert_eq!(xfcc(&app, "/p1-forged"), vec![None], "a client's own x-forwarded-client-cert is dropped");
    if let Err(e) = tcp_roundtrip(&format!("{client_ip}:9090")).await {
        let pick = |m: std::collections::BTreeMap<String, u64>| m.into_iter().filter(|(k, v)| k.contains("9090") && *v > 0).collect::<Vec<_>>();
        panic!("TCP through both Envoys: {e}\nclient {:?}\nserver {:?}\n{}", pick(client.stats().await), pick(server.stats().await), dump());
    }
    tcp_roundtrip(&format!("{server_ip}:9090")).await.unwrap();
    // An app's own TLS (no mesh ALPN) is plaintext to the server's Envoy:
    // its ClientHello reaches the echo as bytes; one offering the mesh
    // ALPN is answered by Envoy's TLS (a ServerHello, not the echo).
    let app_hello = client_hello(&["h2"]);
    let mut s = tokio::net::TcpStream::connect(format!("{server_ip}:9090")).await.unwrap();
    echo_once(&mut s, &app_hello).await.expect("an app's TLS goes to the plaintext chain under PERMISSIVE");
    let mesh_hello = client_hello(&["istio"]);
    let mut s = tokio::net::TcpStream::connect(format!("{server_ip}:9090")).await.unwrap();
    assert!(echo_once(&mut s, &mesh_hello).await.is_err(), "mesh TLS is terminated by the server's Envoy");

    // 2. STRICT for the namespace: plaintext is refused, mutual TLS served.
    let rev = kit::applied(&kit::http(), &api, &peer_auth("default", "  mtls: {mode: STRICT}")).await;
    wait_synced(&api, rev).await;
    assert!(plain().get(format!("http://{server_ip}:9080/p2-plain")).send().await.is_err(), "STRICT refuses plaintext HTTP");
    assert!(tcp_roundtrip(&format!("{server_ip}:9090")).await.is_err(), "STRICT refuses plaintext TCP");
    assert!(xfcc(&app, "/p2-plain").is_empty());
    for i in 0..10 {
        let (status, body) = via_client(&client_ip, "/p2/echo").await.unwrap();
        assert_eq!(status, 200, "request {i} under STRICT: {body}");
    }
    assert!(xfcc(&app, "/p2/echo").iter().all(|h| h.as_deref().is_some_and(|h| h.contains(CLIENT_ID))));
    tcp_roundtrip(&format!("{client_ip}:9090")).await.expect("mutual TLS TCP under STRICT");

    // 3. DISABLE: plaintext only; the client's auto-mTLS follows the
    // server's policy and sends plaintext.
    let rev = kit::applied(&kit::http(), &api, &peer_auth("default", "  mtls: {mode: DISABLE}")).await;
    wait_synced(&api, rev).await;
    let r = plain().get(format!("http://{server_ip}:9080/p3-plain")).send().await.expect("DISABLE serves plaintext");
    assert_eq!(r.status().as_u16(), 200);
    // Connections opened before the change drain with the server's old
    // listener (--drain-time-s 2), then close; new ones are plaintext.
    wait_no_draining(&server).await;
    for i in 0..10 {
        let (status, body) = via_client(&client_ip, "/p3/echo").await.unwrap();
        assert_eq!(status, 200, "request {i} under DISABLE: {body}");
    }
    assert!(xfcc(&app, "/p3/echo").iter().all(Option::is_none), "no mutual TLS under DISABLE");
    let active: Vec<Value> = listeners(&server).await.iter().filter_map(|l| l.get("active_state").cloned()).collect();
    assert!(!active.is_empty() && !Value::from(active).to_string().contains("DownstreamTlsContext"), "DISABLE: no TLS on the server's listeners");

    // 4. portLevelMtls: the workload is STRICT but its TCP port 9090 DISABLE.
    delete(&api, "peerauthentication", "default").await;
    let rev = kit::applied(
        &kit::http(),
        &api,
        &peer_auth("reviews", "  selector: {matchLabels: {app: reviews}}\n  mtls: {mode: STRICT}\n  portLevelMtls:\n    9090: {mode: DISABLE}"),
    )
    .await;
    wait_synced(&api, rev).await;
    assert!(plain().get(format!("http://{server_ip}:9080/p4-plain")).send().await.is_err(), "9080 is STRICT");
    tcp_roundtrip(&format!("{server_ip}:9090")).await.expect("9090 is DISABLE: plaintext");
    tcp_roundtrip(&format!("{client_ip}:9090")).await.expect("the client sends 9090 plaintext");
    let (status, _) = via_client(&client_ip, "/p4/echo").await.unwrap();
    assert_eq!(status, 200);

    // 5. Flip PERMISSIVE <-> STRICT under a steady client loop: not one
    // request fails (the mutual TLS chain is the same in both modes, and
    // the server accepts mutual TLS before and after).
    delete(&api, "peerauthentication", "reviews").await;
    let rev = kit::applied(&kit::http(), &api, &peer_auth("default", "  mtls: {mode: PERMISSIVE}")).await;
    wait_synced(&api, rev).await;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut loops = Vec::new();
    for _ in 0..2 {
        let (stop, ok, failed, failures, client_ip) = (stop.clone(), ok.clone(), failed.clone(), failures.clone(), client_ip.clone());
        loops.push(tokio::spawn(async move {
            // Bounded: at most 5,000 requests per loop.
            for _ in 0..5_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                match via_client(&client_ip, "/p5").await {
                    Ok((200, _)) => ok.fetch_add(1, Ordering::SeqCst),
                    other => {
                        failures.lock().unwrap().push(format!("{other:?}"));
                        failed.fetch_add(1, Ordering::SeqCst)
                    }
                };
            }
        }));
    }
    let modified_before = server.stats().await.get("listener_manager.listener_in_place_updated").copied().unwrap_or(0);
    for mode in ["STRICT", "PERMISSIVE", "STRICT", "PERMISSIVE"] {
        let rev = kit::applied(&kit::http(), &api, &peer_auth("default", &format!("  mtls: {{mode: {mode}}}"))).await;
        wait_synced(&api, rev).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for l in loops {
        l.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    let in_place = server.stats().await.get("listener_manager.listener_in_place_updated").copied().unwrap_or(0) - modified_before;
    eprintln!("flips: {ok} requests ok, {failed} failed; {in_place} in-place listener updates on the server");
    assert!(ok > 50, "the loop ran ({ok} requests)");
    assert_eq!(failed, 0, "requests failed across PERMISSIVE/STRICT flips: {:?}", failures.lock().unwrap());
    assert!(in_place >= 4, "each flip was a filter-chain-only (in-place) listener update: {in_place}");

    // 6. A DestinationRule ISTIO_MUTUAL expecting another identity: the
    // handshake fails on the SAN check, nothing reaches the app.
    let before = reviews_ssl(&client, "ssl.fail_verify_san").await;
    let wrong = "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata: {name: reviews, namespace: shop}\nspec:\n  host: reviews\n  trafficPolicy: {tls: {mode: ISTIO_MUTUAL, subjectAltNames: [\"spiffe://cluster.local/ns/shop/sa/nobody\"]}}\n";
    let rev = kit::applied(&kit::http(), &api, wrong).await;
    wait_synced(&api, rev).await;
    for _ in 0..6 {
        let (status, _) = via_client(&client_ip, "/p6/echo").await.unwrap();
        assert_eq!(status, 503, "a server without the expected identity is not served");
    }
    assert!(xfcc(&app, "/p6/echo").is_empty(), "nothing reached the app");
    let after = reviews_ssl(&client, "ssl.fail_verify_san").await;
    assert!(after > before, "ssl.fail_verify_san rose: {before} -> {after}");
    // The right identity is served.
    let right = wrong.replace("sa/nobody", "sa/reviews");
    let rev = kit::applied(&kit::http(), &api, &right).await;
    wait_synced(&api, rev).await;
    // ISTIO_MUTUAL applies to every endpoint: the legacy one cannot answer
    // mutual TLS (503), the mesh one can.
    let mut served = 0;
    for _ in 0..10 {
        let (status, body) = via_client(&client_ip, "/p6-right/echo").await.unwrap();
        assert!(status == 200 || status == 503, "{status} {body}");
        served += usize::from(status == 200);
    }
    let seen = xfcc(&app, "/p6-right/echo");
    assert!(served > 0 && seen.len() == served, "the mesh endpoint served ISTIO_MUTUAL: {served} answers, {seen:?}");
    assert!(seen.iter().all(|h| h.as_deref().is_some_and(|h| h.contains(CLIENT_ID))));
    assert!(xfcc(&legacy, "/p6-right/echo").is_empty(), "never plaintext to the legacy endpoint under ISTIO_MUTUAL");

    // 7. Authorization on the peer's identity: under STRICT, an
    // AuthorizationPolicy allowing the client's principal lets it in; one
    // naming another principal turns it away at the server's Envoy (403),
    // while the legacy endpoint (no Envoy) is untouched.
    delete(&api, "destinationrule", "reviews").await;
    let rev = kit::applied(&kit::http(), &api, &peer_auth("default", "  mtls: {mode: STRICT}")).await;
    wait_synced(&api, rev).await;
    let allow = |principal: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  rules: [{{from: [{{source: {{principals: [\"{principal}\"]}}}}]}}]\n")
    };
    let rev = kit::applied(&kit::http(), &api, &allow("cluster.local/ns/shop/sa/web")).await;
    wait_synced(&api, rev).await;
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..10 {
        let (status, _) = via_client(&client_ip, "/p7-allowed/echo").await.unwrap();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [200], "the client's principal is allowed: {statuses:?}");
    assert!(!xfcc(&app, "/p7-allowed/echo").is_empty());
    let rev = kit::applied(&kit::http(), &api, &allow("cluster.local/ns/shop/sa/someone-else")).await;
    wait_synced(&api, rev).await;
    // A policy change changes the chains' filters (an in-place update):
    // connections opened under the old policy drain with it
    // (--drain-time-s 2), new ones get the new one.
    until("the new policy denies the client", Duration::from_secs(15), || async { via_client(&client_ip, "/p7-drain/echo").await.unwrap().0 == 403 }).await;
    tokio::time::sleep(Duration::from_secs(3)).await; // past the drain time
    let mut statuses = std::collections::BTreeMap::new();
    for _ in 0..10 {
        let (status, _) = via_client(&client_ip, "/p7-denied/echo").await.unwrap();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert!(statuses.contains_key(&403), "another principal only: the client is denied at the server: {statuses:?}");
    assert!(statuses.keys().all(|s| *s == 403 || *s == 200), "{statuses:?}");
    assert!(xfcc(&app, "/p7-denied/echo").is_empty(), "nothing denied reached the app");
    assert_eq!(xfcc(&legacy, "/p7-denied/echo").len(), statuses.get(&200).copied().unwrap_or(0), "the 200s are the legacy endpoint's");
    // `namespaces` reads the namespace of the caller's SPIFFE id: shop is
    // let in, and `notNamespaces: [shop]` turns it away.
    let by_ns = |field: &str| {
        format!("apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: reviews, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: reviews}}}}\n  rules: [{{from: [{{source: {{{field}: [shop]}}}}]}}]\n")
    };
    for (field, want) in [("namespaces", 200), ("notNamespaces", 403)] {
        let rev = kit::applied(&kit::http(), &api, &by_ns(field)).await;
        wait_synced(&api, rev).await;
        until(&format!("{field}: {want}"), Duration::from_secs(15), || async { via_client(&client_ip, "/p7-ns/echo").await.unwrap().0 == want }).await;
        // Past the drain time, ten requests in a row get the new answer. A
        // connection on the old listener may outlive the drain on a loaded
        // machine: up to 5 tries, each on a path of its own (the app's log
        // is per path).
        let mut attempt = 0;
        let (path, statuses) = loop {
            attempt += 1;
            tokio::time::sleep(Duration::from_secs(if attempt == 1 { 3 } else { 1 })).await;
            let path = format!("/p7-{field}-{attempt}/echo");
            let mut statuses = std::collections::BTreeMap::new();
            for _ in 0..10 {
                *statuses.entry(via_client(&client_ip, &path).await.unwrap().0).or_insert(0) += 1;
            }
            if statuses.keys().eq([&want]) || attempt == 5 {
                break (path, statuses);
            }
        };
        if want == 200 {
            assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [200], "{field}: {statuses:?}");
            assert!(!xfcc(&app, &path).is_empty(), "{field}: the mesh endpoint served some");
        } else {
            assert!(statuses.contains_key(&403) && xfcc(&app, &path).is_empty(), "{field}: {statuses:?}");
        }
    }

    // Zero NACKs on either Envoy through all of it.
    for w in [&client, &server] {
        let s = w.stats().await;
        for stat in ["listener_manager.lds.update_rejected", "cluster_manager.cds.update_rejected"] {
            assert_eq!(s.get(stat).copied().unwrap_or(0), 0, "{stat} on {}\n{}", w.ip, w.logs());
        }
    }
    let _ = (&client.agent, &server.agent);
}

/// Rotation under open connections: short-lived certificates rotate while
/// a raw TCP stream (echo, through both Envoys over mutual TLS) and one
/// HTTP/2 stream (a slow answer) stay open: no reset, the served serial
/// changes `rotations` times on both sides, and no listener or cluster
/// changes (LDS/CDS untouched). The suite runs it with a 10 s TTL and 3
/// rotations; `rotation_long` (ignored) is the issue's 2 min x 5.
async fn rotation_under_open_streams(ttl_s: u64, rotations: usize) {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let p = kit::loopback_prefix();
    let (client_ip, server_ip) = (format!("{p}.20"), format!("{p}.21"));
    let app = Upstream::start("127.0.0.1", "reviews-mesh").await;
    let (echo, _echo_task) = tcp_echo("127.0.0.1").await;
    let rev = kit::applied(&kit::http(), &api, &mesh_yaml(&p, &app, echo, None)).await;
    let rev = kit::applied(&kit::http(), &api, &peer_auth("default", "  mtls: {mode: STRICT}")).await.max(rev);
    let tmp = tempfile::tempdir().unwrap();
    let ttl = format!("{ttl_s}s");
    let client = workload(tmp.path(), &api, &xds, "web", &client_ip, Some(&ttl)).await;
    let server = workload(tmp.path(), &api, &xds, "reviews", &server_ip, Some(&ttl)).await;
    wait_synced(&api, rev).await;
    // Not the LDS/CDS deliveries and versions: the xDS stream ends when the
    // certificate it was opened with expires (its connection too, and the
    // Envoy dials again with the rotated one), and the new stream delivers
    // the same listeners and clusters again, at the current revision.
    let watched = ["listener_manager.listener_modified", "listener_manager.listener_in_place_updated", "cluster_manager.cluster_modified"];
    let pick = |m: &std::collections::BTreeMap<String, u64>| watched.iter().map(|k| (k.to_string(), m.get(*k).copied())).collect::<Vec<_>>();
    let (client_before, server_before) = (pick(&client.stats().await), pick(&server.stats().await));

    // The raw TCP stream.
    let mut tcp = tokio::net::TcpStream::connect(format!("{client_ip}:9090")).await.unwrap();
    echo_once(&mut tcp, b"first message over the stream\n").await.unwrap();
    // The HTTP/2 stream: HTTP/1.1 to the client's Envoy (reqwest is built
    // without h2 here), one HTTP/2 stream between the Envoys (the port is
    // HTTP2) over mutual TLS, answered after about half the rotations.
    // (At most 4 minutes: Envoy ends a stream idle for 5, its default
    // stream_idle_timeout, rotation or not.)
    app.set_delay(Duration::from_secs((ttl_s * rotations as u64 / 2).min(240)));
    let h2 = reqwest::Client::builder().no_proxy().build().unwrap();
    let long = {
        let url = format!("http://{client_ip}:9080/long/echo");
        tokio::spawn(async move { h2.get(url).header("host", "reviews.shop.svc.cluster.local").send().await.map(|r| r.status().as_u16()) })
    };

    let mut seen = vec![(client.serving_serial().await.unwrap(), server.serving_serial().await.unwrap())];
    let deadline = Instant::now() + Duration::from_secs(ttl_s * (rotations as u64 + 3));
    let mut messages = 1;
    while seen.iter().map(|(_, s)| s).collect::<std::collections::BTreeSet<_>>().len() <= rotations
        || seen.iter().map(|(c, _)| c).collect::<std::collections::BTreeSet<_>>().len() <= rotations
    {
        assert!(Instant::now() < deadline, "{rotations} rotations not seen within the bound: {seen:?}\n{}\n{}", client.logs(), server.logs());
        tokio::time::sleep(Duration::from_millis(500)).await;
        echo_once(&mut tcp, format!("message {messages}\n").as_bytes()).await.unwrap_or_else(|e| panic!("the TCP stream broke after {messages} messages: {e}"));
        messages += 1;
        let now = (client.serving_serial().await.unwrap_or_default(), server.serving_serial().await.unwrap_or_default());
        if seen.last() != Some(&now) {
            seen.push(now);
        }
    }
    assert_eq!(long.await.unwrap().expect("the HTTP/2 stream was not reset"), 200);
    echo_once(&mut tcp, b"last message\n").await.expect("the TCP stream is still open");
    eprintln!("rotation: ttl {ttl_s}s, serials seen (client, server): {seen:?}, {messages} messages on one TCP stream");
    // The served serial changed on both sides; nothing but secrets changed.
    assert_eq!(pick(&client.stats().await), client_before, "client: LDS/CDS untouched by rotation");
    assert_eq!(pick(&server.stats().await), server_before, "server: LDS/CDS untouched by rotation");
    let cx = |m: std::collections::BTreeMap<String, u64>, k: &str| {
        m.iter().filter(|(n, _)| n.starts_with("cluster.outbound|") && n.ends_with(k)).map(|(_, v)| *v).sum::<u64>()
    };
    let stats = client.stats().await;
    assert_eq!(cx(stats.clone(), ".upstream_cx_destroy"), 0, "no upstream connection closed across rotations");
    assert_eq!(cx(stats, ".upstream_cx_total"), 2, "one connection each for the TCP and the HTTP/2 stream");
    let s = server.stats().await;
    assert!(s.get("sds.default.update_success").copied().unwrap_or(0) > rotations as u64, "{:?}", s.get("sds.default.update_success"));
    let _ = (&client.agent, &server.agent);
}

#[tokio::test]
async fn rotation_keeps_mutual_tls_streams_open() {
    rotation_under_open_streams(10, 3).await;
}

/// The issue's measure: a 2 minute TTL and 5 rotations (about 6 minutes).
#[tokio::test]
#[ignore]
async fn rotation_long() {
    rotation_under_open_streams(120, 5).await;
}

/// `GET path` over TLS to `addr` with `openssl s_client`, verifying the
/// server's chain against `ca` (a workload certificate names no DNS
/// host, so no name check), presenting `identity` (chain, key) if given:
/// the HTTP answer, or why not.
fn openssl_get(addr: &str, host: &str, path: &str, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<String, String> {
    use std::io::Write;
    let mut cmd = std::process::Command::new("openssl");
    cmd.args(["s_client", "-quiet", "-verify_return_error", "-connect", addr, "-servername", host, "-CAfile"]).arg(ca);
    if let Some((chain, key)) = identity {
        cmd.arg("-cert").arg(chain).arg("-key").arg(key);
    }
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().map_err(|e| format!("openssl: {e}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let _ = child.stdin.take().unwrap().write_all(request.as_bytes());
    let out = child.wait_with_output().map_err(|e| format!("openssl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if text.starts_with("HTTP/1.1") {
        Ok(text)
    } else {
        Err(format!("no HTTP answer: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// A gateway (`lodestar agent --node-type router`) terminating mutual TLS
/// with its own mesh identity: Gateway `tls.mode: ISTIO_MUTUAL` on an
/// HTTPS server. A client with a mesh certificate of an allowed identity
/// gets through; one without a certificate, or with another identity, is
/// refused at the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_istio_mutual_uses_the_gateway_identity() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let p = kit::loopback_prefix();
    let (gw_ip, web_ip, other_ip) = (format!("{p}.30"), format!("{p}.31"), format!("{p}.32"));
    let shop = Upstream::start(&format!("{p}.33"), "shop").await;
    let yaml = format!(
        r#"
apiVersion: registry.lodestar.io/v1
kind: Service
metadata: {{name: shop, namespace: {NS}}}
spec:
  ports: [{{name: http, number: 9080}}]
---
apiVersion: registry.lodestar.io/v1
kind: Instance
metadata: {{name: shop-1, namespace: {NS}}}
spec: {{service: shop, address: {ip}, port: {port}}}
---
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {{name: mesh-gateway, namespace: {NS}}}
spec:
  selector: {{istio: ingressgateway}}
  servers:
  - port: {{number: 8443, name: https-mesh, protocol: HTTPS}}
    hosts: [shop.example.test]
    tls: {{mode: ISTIO_MUTUAL, subjectAltNames: ["{CLIENT_ID}"]}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {{name: shop, namespace: {NS}}}
spec:
  hosts: [shop.example.test]
  gateways: [mesh-gateway]
  http:
  - route: [{{destination: {{host: shop, port: {{number: 9080}}}}}}]
"#,
        ip = shop.addr.ip(),
        port = shop.addr.port()
    );
    let rev = kit::applied(&kit::http(), &api, &yaml).await;
    let tmp = tempfile::tempdir().unwrap();
    let gw = workload_with(tmp.path(), &api, &xds, "ingressgateway", &gw_ip, None, &["--node-type", "router", "--label", "istio=ingressgateway"]).await;
    // Two workload identities for clients: `web` (allowed) and `other`.
    let web = workload(tmp.path(), &api, &xds, "web", &web_ip, None).await;
    let other = workload(tmp.path(), &api, &xds, "other", &other_ip, None).await;
    wait_synced(&api, rev).await;
    let addr = format!("{gw_ip}:8443");
    let id = |w: &Workload| (w.dir.join("identity/cert-chain.pem"), w.dir.join("identity/key.pem"));
    let root = web.dir.join("identity/root-cert.pem");
    let (web_chain, web_key) = id(&web);
    let reply = kit::eventually_or("web through the gateway", Duration::from_secs(20), || async {
        openssl_get(&addr, "shop.example.test", "/orders", &root, Some((&web_chain, &web_key)))
    })
    .await;
    assert!(reply.starts_with("HTTP/1.1 200") && reply.ends_with("shop"), "{reply}");
    let (other_chain, other_key) = id(&other);
    for (who, identity) in [("no certificate", None), ("another identity", Some((other_chain.as_path(), other_key.as_path())))] {
        let r = openssl_get(&addr, "shop.example.test", "/orders", &root, identity);
        assert!(r.is_err(), "a client with {who} got through: {r:?}");
    }
    let stats = gw.stats().await;
    let ssl = |stat: &str| stats.iter().filter(|(k, _)| k.starts_with("listener.") && k.ends_with(&format!(".ssl.{stat}"))).map(|(_, v)| v).sum::<u64>();
    assert!(ssl("fail_verify_san") >= 1, "the other identity was refused for its SAN: {stats:?}");
}
