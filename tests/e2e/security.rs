//! Secure by default, end to end: real replica processes with the TLS they
//! set up on their own, real handshakes. Plaintext is refused on every
//! port; the raft port takes only members, each speaking for itself; a
//! certificate replaced on disk is served to new connections while open
//! streams and the raft leader carry on.

use crate::kit;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use kit::{client_cert, test_ca, tls_channel, Cluster};
use lodestar::proto::peer::raft_peer_client::RaftPeerClient;
use lodestar::proto::peer::Payload;
use lodestar::tls::conn::PeerCert;
use lodestar::tls::{client_config, roots_from_pem};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

fn plaintext_channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect_lazy()
}

/// The serial of the certificate `addr` serves to a new connection.
async fn served_serial(addr: &str) -> String {
    let roots = roots_from_pem(&test_ca().ca_file).unwrap();
    let config = Arc::new(client_config(roots, None).unwrap());
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let host = addr.rsplit_once(':').unwrap().0.to_string();
    let name = rustls::pki_types::ServerName::try_from(host).unwrap();
    let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await.expect("TLS handshake");
    let cert = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    PeerCert::parse(&cert).unwrap().serial
}

/// The leader and its term once they have held for a second: a cluster
/// just started (on a loaded machine) may still hold a second election,
/// which must not be taken for one the test caused.
async fn settled_leader(c: &Cluster) -> (u64, u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    loop {
        let leader = c.wait_for_leader(Duration::from_secs(20)).await;
        let term = c.status(leader).await.and_then(|s| s["term"].as_u64());
        if let Some(term) = term {
            if last == Some((leader, term)) {
                return (leader, term);
            }
            last = Some((leader, term));
        }
        assert!(Instant::now() < deadline, "no stable leader within 30s");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn status_payload() -> Payload {
    Payload { data: lodestar::store::codec::encode(&()) }
}

#[tokio::test(flavor = "multi_thread")]
async fn plaintext_and_strangers_are_refused_on_every_port() {
    let c = Cluster::start(1, "").await;
    let r = c.replica(1);

    // TLS with the cluster's CA works (as `curl --cacert ca.pem` does).
    let ok = c.http.get(format!("{}/readyz", r.api())).send().await.expect("https with the CA");
    assert!(ok.status().is_success());

    // Plain HTTP to the API port: no answer, the handshake fails.
    let plain = reqwest::Client::new().get(format!("http://{}/readyz", r.api_addr())).timeout(Duration::from_secs(5)).send().await;
    assert!(plain.is_err(), "plaintext HTTP answered: {plain:?}");
    // A client that does not trust the cluster's CA refuses the server.
    let stranger = reqwest::Client::builder().build().unwrap().get(format!("{}/readyz", r.api())).timeout(Duration::from_secs(5)).send().await;
    let err = format!("{:?}", stranger.expect_err("a client without the CA must not connect"));
    assert!(err.contains("UnknownIssuer") || err.contains("certificate"), "{err}");

    // Plaintext gRPC: the xDS port and the raft port.
    let mut xds = AggregatedDiscoveryServiceClient::new(plaintext_channel(&r.xds_addr()));
    let req = DiscoveryRequest {
        node: Some(Node { id: "sidecar~127.0.0.9~x.default~default.svc.cluster.local".into(), ..Default::default() }),
        type_url: CLUSTER_TYPE.into(),
        ..Default::default()
    };
    assert!(xds.stream_aggregated_resources(futures::stream::iter(vec![req])).await.is_err(), "plaintext xDS was served");
    let mut raft = RaftPeerClient::new(plaintext_channel(&r.raft_addr()));
    assert!(raft.status(status_payload()).await.is_err(), "plaintext raft was served");

    // The raft port over TLS but without a client certificate: refused at
    // the handshake. With a certificate from the CA that names no member:
    // refused by the raft service, which says why.
    let member = lodestar::tls::pki::member_name(1);
    let mut raft = RaftPeerClient::new(tls_channel(&r.raft_addr(), &member, None));
    assert!(raft.status(status_payload()).await.is_err(), "raft served a client without a certificate");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = client_cert(dir.path(), "someone.example");
    let mut raft = RaftPeerClient::new(tls_channel(&r.raft_addr(), &member, Some((&cert, &key))));
    let err = raft.status(status_payload()).await.expect_err("a non-member certificate on the raft port");
    assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err:?}");
    assert!(err.message().contains("names none"), "{err:?}");

    // Dialling member 1 but expecting member 2's name fails: a replica's
    // certificate names its own member only.
    let mut wrong = RaftPeerClient::new(tls_channel(&r.raft_addr(), &lodestar::tls::pki::member_name(2), None));
    assert!(wrong.status(status_payload()).await.is_err());
}

/// A replica restarted with another member's (valid) certificate speaks
/// for a member it is not: its peers refuse it both ways, and the cluster
/// keeps its leader and term.
#[tokio::test(flavor = "multi_thread")]
async fn a_member_with_another_members_certificate_is_refused() {
    let mut c = Cluster::start(3, "").await;
    let (leader, term) = settled_leader(&c).await;
    let victim = (1..=3).find(|id| *id != leader).unwrap();
    let donor = (1..=3).find(|id| *id != leader && *id != victim).unwrap();

    c.stop(victim);
    let tls = |id: u64| c.replica(id).data_dir().join("tls");
    for f in ["server.pem", "server-key.pem"] {
        std::fs::copy(tls(donor).join(f), tls(victim).join(f)).unwrap();
    }
    c.restart(victim);

    // Writes keep committing through the leader meanwhile, for longer than
    // several election timeouts of the impostor.
    let api = c.replica(leader).api();
    let mut last = 0;
    let until = Instant::now() + Duration::from_secs(5);
    let mut i = 0;
    while Instant::now() < until {
        let (status, body) = kit::apply(&c.http, &api, vec![kit::vs("w", "default", &format!("v{i}"))]).await;
        assert_eq!(status, 200, "{body}");
        last = body["revision"].as_u64().unwrap();
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let now = c.status(leader).await.unwrap();
    assert_eq!((now["leader"].as_u64(), now["term"].as_u64()), (Some(leader), Some(term)), "the leader changed: {now}");

    // Nobody takes the impostor for the member it claims: the leader
    // cannot reach it as that member (the handshake fails on the name), and
    // neither can a client of its API (its certificate names another
    // member's address).
    let r = c.replica(victim);
    let cluster = c.status(leader).await.unwrap();
    let member = cluster["members"].as_array().unwrap().iter().find(|m| m["id"].as_u64() == Some(victim)).unwrap().clone();
    assert!(member["status"].is_null() && member["error"].is_string(), "the leader reached the impostor: {member}");
    let api = c.http.get(format!("{}/v1/node", r.api())).send().await;
    assert!(format!("{:?}", api.expect_err("the impostor's API")).contains("NotValidForName"));
    let _ = last;
    let refused = c.replica(donor).log() + &c.replica(leader).log() + &r.log();
    assert!(
        refused.contains(&format!("the certificate names member {donor}, the message claims member {victim}")) || refused.contains("NotValidForName"),
        "no refusal in the logs"
    );
}

/// Certificate files replaced on disk: new handshakes get the new
/// certificate; an open xDS stream keeps being pushed to; raft keeps its
/// leader and term.
#[tokio::test(flavor = "multi_thread")]
async fn replaced_certificate_files_are_served_without_a_restart() {
    let c = Cluster::start(3, "tls_reload_interval_ms = 200").await;
    let (leader, term) = settled_leader(&c).await;
    let r = c.replica(leader);
    let before = served_serial(&r.api_addr()).await;

    // An open ADS stream to the leader, with its first response.
    let mut xds = kit::ads_client(leader, &r.xds_addr());
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let node = Node { id: "sidecar~127.0.0.9~rot.default~default.svc.cluster.local".into(), ..Default::default() };
    tx.send(DiscoveryRequest { node: Some(node), type_url: CLUSTER_TYPE.into(), ..Default::default() }).await.unwrap();
    let mut stream = xds.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.unwrap().into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.unwrap().unwrap().unwrap();
    tx.send(DiscoveryRequest {
        type_url: CLUSTER_TYPE.into(),
        version_info: first.version_info.clone(),
        response_nonce: first.nonce.clone(),
        ..Default::default()
    })
    .await
    .unwrap();

    // Rotate: a new certificate for the same member from the same CA.
    let ca = test_ca();
    let (cert, key) =
        lodestar::tls::pki::issue_member(&ca.ca_pem, &std::fs::read_to_string(&ca.ca_key_file).unwrap(), leader, std::slice::from_ref(&r.ip)).unwrap();
    let dir = r.data_dir().join("tls");
    lodestar::tls::pki::write_file(&dir.join("server-key.pem"), &key, true).unwrap();
    lodestar::tls::pki::write_file(&dir.join("server.pem"), &cert, false).unwrap();
    let after = kit::eventually("the new certificate served", Duration::from_secs(10), || async {
        let s = served_serial(&r.api_addr()).await;
        (s != before).then_some(s)
    })
    .await;
    assert_eq!(served_serial(&r.xds_addr()).await, after);

    // The open stream is still pushed to: a new service means new clusters.
    let svc = json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": "rotated", "namespace": "default"}, "spec": {"ports": [{"name": "http", "number": 9080}]}});
    let (status, body) = kit::apply(&c.http, &r.api(), vec![svc]).await;
    assert_eq!(status, 200, "{body}");
    let pushed = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("a push on the open stream").unwrap().unwrap();
    assert_ne!(pushed.version_info, first.version_info);
    assert!(pushed.resources.len() > first.resources.len(), "the new service's clusters were pushed");

    // Raft: same leader, same term; the write reached every replica.
    let now = c.status(leader).await.unwrap();
    assert_eq!((now["leader"].as_u64(), now["term"].as_u64()), (Some(leader), Some(term)), "{now}");
    c.wait_for_revision(body["revision"].as_u64().unwrap(), Duration::from_secs(10)).await;
}

/// With ACLs on, a single replica's first start generates the management
/// token (0600) and puts it in the client config it writes: the CLI with
/// that config works, a request without the token gets 401, and the
/// secret is nowhere in the replica's log.
#[tokio::test(flavor = "multi_thread")]
async fn first_start_with_acls_writes_a_working_admin_client_config() {
    // ACLs are on by default; without the harness's token file the
    // replica generates its own.
    let mut c = Cluster::prepare(1, "");
    c.replicas[0].management_token = false;
    c.http = kit::anonymous_http_builder().build().unwrap();
    c.spawn_all();
    // The probes stay open: wait on /readyz (the status needs a token).
    kit::until("ready", Duration::from_secs(20), || async {
        c.http.get(format!("{}/readyz", c.replica(1).api())).send().await.is_ok_and(|r| r.status().is_success())
    })
    .await;
    let r = c.replica(1);
    let token_file = r.data_dir().join("management.token");
    let secret = std::fs::read_to_string(&token_file).expect("the generated management token").trim().to_string();
    assert!(secret.len() >= 32, "a long random secret");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&token_file).unwrap().permissions().mode() & 0o077, 0, "the token file is its owner's only");
    }
    let client_config = r.data_dir().join("client.toml");
    let config = lodestar::config::ClientConfig::from_toml(&std::fs::read_to_string(&client_config).unwrap()).unwrap();
    assert_eq!(config.token.as_deref(), Some(secret.as_str()));
    assert_eq!(config.server, r.api());

    // No token: 401, even with the CA.
    let (status, _) = kit::get_json(&c.http, &format!("{}/v1/resources/vs", r.api())).await;
    assert_eq!(status, 401);
    // The CLI with the written client config alone: server, CA and token.
    let out =
        std::process::Command::new(kit::BIN).env_remove("LODESTAR_SERVER").env("LODESTAR_CONFIG", &client_config).args(["get", "vs", "-A"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!r.log().contains(&secret), "the secret reached the log");
}

/// The xDS port takes a proxy only with a credential for the identity it
/// claims: real Envoys from `lodestar bootstrap --proxy-token-file`, one
/// per replica, each served with a proxy token bound to namespace `shop`;
/// an Envoy with that token claiming namespace `bank`, and one with no
/// credential, are refused (PERMISSION_DENIED, UNAUTHENTICATED), which
/// `/debug/syncz` and the metrics show, and neither is translated for.
/// Metrics and debug output need a token on the API port, and are served
/// without one only on the local `metrics_addr`. Revoking the token closes
/// the Envoys' open streams on every replica.
#[tokio::test(flavor = "multi_thread")]
async fn proxies_need_a_token_for_the_identity_they_claim() {
    use kit::envoy::{Envoy, EnvoyOptions};
    let mut c = Cluster::prepare(3, "");
    for r in &mut c.replicas {
        r.extra_toml = format!("metrics_addr = \"{}:7009\"\n", r.ip);
    }
    c.launch().await;
    let api = c.replica(1).api();
    let prefix = c.replica(1).ip.rsplit_once('.').unwrap().0.to_string();
    let dir = tempfile::tempdir().unwrap();

    // A proxy token for namespace shop, through the CLI.
    let (ok, out, err) = kit::cli(&api, &["token", "create", "--proxy", "shop", "--description", "shop proxies"]);
    assert!(ok, "{out}{err}");
    let created = out.clone();
    let secret = out.lines().find_map(|l| l.strip_prefix("SecretID:")).expect("the secret").trim().to_string();
    let token_file = dir.path().join("shop.token");
    std::fs::write(&token_file, format!("{secret}\n")).unwrap();
    // It grants nothing on the API.
    let proxy_api = kit::anonymous_http_builder()
        .default_headers([(reqwest::header::AUTHORIZATION, format!("Bearer {secret}").parse().unwrap())].into_iter().collect())
        .build()
        .unwrap();
    assert_eq!(kit::get_json(&proxy_api, &format!("{api}/v1/resources/vs?namespace=shop")).await.0, 403);

    // One Envoy per replica, each dialling only that replica.
    let connected = |e: &std::collections::BTreeMap<String, u64>| e.get("control_plane.connected_state") == Some(&1);
    let mut envoys = Vec::new();
    for r in &c.replicas {
        let mut o = EnvoyOptions::new(&format!("web-{}", r.id), &format!("{prefix}.{}", 20 + r.id));
        o.namespace = "shop".into();
        o.xds_servers = vec![r.xds_addr()];
        o.proxy_token_file = Some(token_file.clone());
        let mut e = Envoy::start(&dir.path().join(format!("envoy-{}", r.id)), o);
        e.wait_ready(Duration::from_secs(30)).await;
        e.wait_for_stats("connected to its replica", Duration::from_secs(30), connected).await;
        envoys.push(e);
    }
    for r in &c.replicas {
        let (_, syncz) = kit::get_json(&c.http, &format!("{}/debug/syncz", r.api())).await;
        let id = format!("sidecar~{prefix}.{}~web-{}.shop~shop.svc.cluster.local", 20 + r.id, r.id);
        assert!(syncz["proxies"].as_array().unwrap().iter().any(|p| p["id"] == id.as_str()), "replica {} serves {id}: {syncz}", r.id);
    }

    // The shop token claiming namespace bank; and no credential at all.
    let r1 = c.replica(1);
    let mut bank = EnvoyOptions::new("teller", &format!("{prefix}.31"));
    bank.namespace = "bank".into();
    bank.xds_servers = vec![r1.xds_addr()];
    bank.proxy_token_file = Some(token_file.clone());
    let mut bank = Envoy::start(&dir.path().join("envoy-bank"), bank);
    let mut anon = EnvoyOptions::new("nobody", &format!("{prefix}.32"));
    anon.xds_servers = vec![r1.xds_addr()];
    anon.proxy_token_file = None;
    let mut anon = Envoy::start(&dir.path().join("envoy-anon"), anon);
    // (They never become ready: Envoy waits for its first config.)

    // The local observer address: no TLS, no token.
    let observer = reqwest::Client::new();
    let local = format!("http://{}:7009", r1.ip);
    let syncz = kit::eventually_or("refusals shown in /debug/syncz", Duration::from_secs(30), || async {
        let syncz: serde_json::Value = observer.get(format!("{local}/debug/syncz")).send().await.unwrap().json().await.unwrap();
        let refused = syncz["refused"].as_array().unwrap();
        let by = |code: &str, pred: &dyn Fn(&serde_json::Value) -> bool| refused.iter().any(|x| x["code"] == code && pred(x));
        let denied = by("permission_denied", &|x| {
            x["proxy"].as_str().is_some_and(|p| p.contains("teller.bank")) && x["reason"].as_str().is_some_and(|m| m.contains("bound to proxy identity shop"))
        });
        let unauthenticated = by("unauthenticated", &|x| x["who"] == "anonymous");
        if denied && unauthenticated {
            Ok(syncz)
        } else {
            Err(syncz.to_string())
        }
    })
    .await;
    // Neither was served, or translated for.
    let listed = |needle: &str| syncz["proxies"].as_array().unwrap().iter().any(|p| p["id"].as_str().is_some_and(|id| id.contains(needle)));
    assert!(!listed("teller.bank") && !listed("nobody."), "{syncz}");
    let disconnected = |e: &std::collections::BTreeMap<String, u64>| e.get("control_plane.connected_state") == Some(&0);
    bank.wait_for_stats("not connected", Duration::from_secs(10), disconnected).await;
    anon.wait_for_stats("not connected", Duration::from_secs(10), disconnected).await;
    let metrics = observer.get(format!("{local}/metrics")).send().await.unwrap().text().await.unwrap();
    for reason in ["permission_denied", "unauthenticated"] {
        let line = metrics.lines().find(|l| l.starts_with(&format!("lodestar_xds_streams_refused_total{{reason=\"{reason}\"}}")));
        let n: f64 = line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        assert!(n >= 1.0, "{reason}: {line:?}");
    }
    assert!(!metrics.contains(&secret), "the secret is in the metrics");
    // The observer address serves nothing else; the API port wants a token.
    assert_eq!(observer.get(format!("{local}/v1/resources/vs")).send().await.unwrap().status().as_u16(), 404);
    let anonymous = kit::anonymous_http_builder().build().unwrap();
    for path in ["/metrics", "/debug/syncz", "/debug/configz"] {
        assert_eq!(kit::get_json(&anonymous, &format!("{}{path}", r1.api())).await.0, 401, "{path} without a token");
        assert_eq!(c.http.get(format!("{}{path}", r1.api())).send().await.unwrap().status().as_u16(), 200, "{path} with the management token");
    }

    // Revoking the token closes the open streams at the next revision (the
    // revocation's own), on every replica; reconnecting is refused.
    let accessor = created.lines().find_map(|l| l.strip_prefix("AccessorID:")).expect("the accessor").trim().to_string();
    let (ok, out, err) = kit::cli(&api, &["token", "revoke", &accessor]);
    assert!(ok, "{out}{err}");
    for e in envoys.iter_mut() {
        e.wait_for_stats("disconnected after the revocation", Duration::from_secs(20), disconnected).await;
    }
    for r in &c.replicas {
        let (_, syncz) = kit::get_json(&c.http, &format!("{}/debug/syncz", r.api())).await;
        assert!(!syncz["proxies"].as_array().unwrap().iter().any(|p| p["id"].as_str().is_some_and(|id| id.contains(".shop~"))), "{syncz}");
        let revoked = syncz["refused"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["code"] == "unauthenticated" && x["reason"].as_str().is_some_and(|m| m.contains("unknown or revoked")));
        assert!(revoked, "replica {}: {syncz}", r.id);
    }
    for e in envoys.iter_mut().chain([&mut bank, &mut anon]) {
        e.stop();
    }
    let log = r1.log();
    assert!(!log.contains(&secret), "the proxy token reached the replica's log");
}

/// A workload identity on the xDS port comes from the mesh CA only: a
/// certificate from the cluster CA that carries a SPIFFE id in namespace
/// shop is no credential for a shop proxy (UNAUTHENTICATED), while a
/// management token on the same connection is.
#[tokio::test(flavor = "multi_thread")]
async fn a_spiffe_id_counts_only_from_the_mesh_ca() {
    let c = Cluster::start(1, "").await;
    let r = c.replica(1);
    let dir = tempfile::tempdir().unwrap();
    let ca = test_ca();
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&ca.ca_key_file).unwrap()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.ca_pem, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = vec![rcgen::SanType::URI("spiffe://cluster.local/ns/shop/sa/web".try_into().unwrap())];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (cert_file, key_file) = (dir.path().join("spiffe.pem"), dir.path().join("spiffe-key.pem"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();

    let first = || DiscoveryRequest {
        node: Some(Node { id: "sidecar~127.0.0.9~web.shop~shop.svc.cluster.local".into(), ..Default::default() }),
        type_url: CLUSTER_TYPE.into(),
        ..Default::default()
    };
    let member = lodestar::tls::pki::member_name(1);
    let mut xds = AggregatedDiscoveryServiceClient::new(tls_channel(&r.xds_addr(), &member, Some((&cert_file, &key_file))));
    let err = xds.stream_aggregated_resources(futures::stream::iter(vec![first()])).await.expect_err("a cluster-CA SPIFFE id as a proxy credential");
    assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
    // The same certificate with the management token: served.
    let bearer = lodestar::cli::client::Bearer::new(Some(kit::management_token())).unwrap();
    let mut xds = AggregatedDiscoveryServiceClient::with_interceptor(tls_channel(&r.xds_addr(), &member, Some((&cert_file, &key_file))), bearer);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(first()).await.unwrap();
    let mut stream = xds.stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx)).await.expect("served with the token").into_inner();
    let resp = tokio::time::timeout(Duration::from_secs(10), stream.message()).await.expect("a response").expect("no error").expect("a message");
    assert_eq!(resp.type_url, CLUSTER_TYPE);
}
