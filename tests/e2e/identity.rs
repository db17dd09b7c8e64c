//! Mesh identity: the mesh CA on the replicas, Istio's CSR service on the
//! xDS port, join tokens, and `lodestar agent` (renewal, resume, SDS to a
//! real Envoy). Real replicas, real TLS, real processes.

use crate::kit;

use kit::agent::{Agent, AgentBuilder};
use kit::{cli, grpc_channel, tls_channel, Cluster, Proc};
use lodestar::proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use lodestar::proto::istio_ca::IstioCertificateRequest;
use rcgen::{CertificateParams, KeyPair, PublicKeyData, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a test reads from a certificate.
#[derive(Debug)]
struct Cert {
    serial: String,
    uris: Vec<String>,
    server_auth: bool,
    client_auth: bool,
    /// not_after - not_before, seconds.
    lifetime: i64,
    not_after: i64,
    spki: Vec<u8>,
}

fn parse_cert(pem: &str) -> Cert {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate");
    let (_, c) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let uris = c
        .subject_alternative_name()
        .unwrap()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let (server_auth, client_auth) = c.extended_key_usage().unwrap().map_or((false, false), |e| (e.value.server_auth, e.value.client_auth));
    Cert {
        serial: c.raw_serial_as_string().replace(':', "").to_lowercase(),
        uris,
        server_auth,
        client_auth,
        lifetime: c.validity().not_after.timestamp() - c.validity().not_before.timestamp(),
        not_after: c.validity().not_after.timestamp(),
        spki: c.public_key().raw.to_vec(),
    }
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A CSR for a fresh key that asks for an identity it should not get.
fn new_csr() -> (KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::default();
    p.subject_alt_names = vec![SanType::URI("spiffe://cluster.local/ns/istio-system/sa/istiod".try_into().unwrap())];
    let pem = p.serialize_request(&key).unwrap().pem().unwrap();
    (key, pem)
}

async fn create_certificate(channel: tonic::transport::Channel, csr: &str, ttl: i64, bearer: Option<&str>) -> Result<Vec<String>, tonic::Status> {
    let mut req = tonic::Request::new(IstioCertificateRequest { csr: csr.to_string(), validity_duration: ttl, metadata: None });
    if let Some(b) = bearer {
        req.metadata_mut().insert("authorization", format!("Bearer {b}").parse().unwrap());
    }
    IstioCertificateServiceClient::new(channel).create_certificate(req).await.map(|r| r.into_inner().cert_chain)
}

/// `lodestar token create --workload ...` → (accessor, secret).
fn join_token(api: &str, args: &[&str]) -> (String, String) {
    let v = kit::token_create(api, args);
    (v["accessorId"].as_str().unwrap().to_string(), v["secret"].as_str().unwrap().to_string())
}

async fn metric(api: &str, name: &str) -> f64 {
    let text = kit::http().get(format!("{api}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

#[tokio::test]
async fn csr_service_signs_the_authenticated_identity_only() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let channel = grpc_channel(1, &xds);
    let (key, csr) = new_csr();

    // No credentials, or an unknown token: UNAUTHENTICATED.
    let e = create_certificate(channel.clone(), &csr, 0, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let e = create_certificate(channel.clone(), &csr, 0, Some(&"ab".repeat(32))).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // Bad input names the field, and costs the token no use.
    let (accessor, secret) = join_token(&api, &["--workload", "shop/cart", "--uses", "1"]);
    let e = create_certificate(channel.clone(), "not a csr", 0, Some(&secret)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("csr"), "{e:?}");

    // A join token: the identity it is bound to, whatever the CSR asked;
    // server and client auth; the default lifetime (24 h).
    let chain = create_certificate(channel.clone(), &csr, 0, Some(&secret)).await.unwrap();
    assert_eq!(chain.len(), 2, "leaf and root");
    let leaf = parse_cert(&chain[0]);
    assert_eq!(leaf.uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
    assert!(leaf.server_auth && leaf.client_auth);
    assert_eq!(leaf.lifetime, 24 * 3600 + 60, "24 h, plus a minute back-dated");
    assert_eq!(leaf.spki, key.subject_public_key_info(), "the CSR's key");
    let root_file = std::fs::read_to_string(r.data_dir().join("mesh-ca/root-cert.pem")).unwrap();
    assert_eq!(chain[1], root_file, "the chain ends with the mesh root");

    // Single use: asked again for the same key (an answer that was lost),
    // the same identity, and no second use; for another key, refused. The
    // count is on the token.
    let again = create_certificate(channel.clone(), &csr, 0, Some(&secret)).await.unwrap();
    assert_eq!(parse_cert(&again[0]).uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
    assert_eq!(parse_cert(&again[0]).spki, key.subject_public_key_info());
    let e = create_certificate(channel.clone(), &new_csr().1, 0, Some(&secret)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("used up"), "{e:?}");
    let (ok, out, err) = cli(&api, &["token", "read", &accessor, "-o", "json"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"used\": 1") || out.contains("\"used\":1"), "{out}");
    assert!(!out.contains(&secret));

    // Renewal: the certificate as the TLS client certificate, no token;
    // the identity is the certificate's, the lifetime asked for (1 h).
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_file, chain[0].as_bytes()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let mtls = tls_channel(&xds, &lodestar::tls::pki::member_name(1), Some((&cert_file, &key_file)));
    let (key2, csr2) = new_csr();
    let renewed = create_certificate(mtls.clone(), &csr2, 3600, None).await.unwrap();
    let leaf2 = parse_cert(&renewed[0]);
    assert_eq!(leaf2.uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
    assert_eq!(leaf2.lifetime, 3600 + 60);
    assert_eq!(leaf2.spki, key2.subject_public_key_info());
    assert_ne!(leaf2.serial, leaf.serial);

    // A certificate of the cluster CA (not the mesh CA) is no workload identity.
    let member = tls_channel(&xds, &lodestar::tls::pki::member_name(1), Some((&r.data_dir().join("tls/server.pem"), &r.data_dir().join("tls/server-key.pem"))));
    let e = create_certificate(member, &csr2, 0, None).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // Bound to source addresses: from elsewhere, refused.
    let (_, far) = join_token(&api, &["--workload", "shop/cart", "--cidr", "10.0.0.0/8"]);
    let e = create_certificate(channel.clone(), &csr, 0, Some(&far)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    let (_, near) = join_token(&api, &["--workload", "shop/web", "--cidr", "127.0.0.0/8", "--cidr", "::1/128"]);
    let chain = create_certificate(channel.clone(), &csr, 0, Some(&near)).await.unwrap();
    assert_eq!(parse_cert(&chain[0]).uris, ["spiffe://cluster.local/ns/shop/sa/web"]);

    // Expired: refused.
    let (_, short) = join_token(&api, &["--workload", "shop/cart", "--ttl", "1s"]);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let e = create_certificate(channel.clone(), &csr, 0, Some(&short)).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("expired"), "{e:?}");

    // Bad token requests name the field.
    for (args, field) in [
        (vec!["--workload", "shop"], "workload"),
        (vec!["--workload", "shop/cart", "--uses", "0"], "uses"),
        (vec!["--workload", "shop/cart", "--cidr", "10.0.0.0/40"], "cidrs[0]"),
        (vec!["--workload", "shop/cart", "--policy", "p"], "policies"),
    ] {
        let mut all = vec!["token", "create"];
        all.extend(args.iter());
        let (ok, _, err) = cli(&api, &all);
        assert!(!ok && err.contains(field), "{args:?}: {err}");
    }

    // Metrics.
    assert!(metric(&api, "citadel_server_success_cert_issuance_count").await >= 3.0);
    assert!(metric(&api, "citadel_server_authentication_failure_count").await >= 5.0);
    assert!(metric(&api, "lodestar_ca_sign_duration_seconds_count").await >= 3.0);
    let root_expiry = metric(&api, "citadel_server_root_cert_expiry_timestamp").await;
    assert!(root_expiry > (now() + 9 * 365 * 86400) as f64, "{root_expiry}");
}

/// Over `ca_max_in_flight`, requests are turned away with
/// RESOURCE_EXHAUSTED before a token use is consumed: the count on the
/// token is the certificates issued, and the turned-away agents, asking
/// again with their keys, get the rest.
#[tokio::test]
async fn a_busy_ca_turns_requests_away_before_consuming_a_use() {
    let cluster = Cluster::start(1, "ca_max_in_flight = 1\nca_max_queue_wait_ms = 0\n").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let mut turned_away_once = false;
    for round in 0..5 {
        let (accessor, secret) = join_token(&api, &["--workload", "shop/cart", "--uses", "30"]);
        let keys: Vec<(KeyPair, String)> = (0..30).map(|_| new_csr()).collect();
        let tasks: Vec<_> = keys
            .iter()
            .map(|(_, csr)| {
                let (channel, csr, secret) = (grpc_channel(1, &xds), csr.clone(), secret.clone());
                tokio::spawn(async move { create_certificate(channel, &csr, 0, Some(&secret)).await })
            })
            .collect();
        let mut busy = Vec::new();
        let mut issued = 0;
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await.unwrap() {
                Ok(_) => issued += 1,
                Err(e) => {
                    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "round {round}: {e:?}");
                    assert!(e.message().contains("no join token use was consumed"), "{e:?}");
                    busy.push(i);
                }
            }
        }
        let used = |out: &str| serde_json::from_str::<Value>(out).unwrap()["status"]["used"].as_u64().unwrap_or(0);
        let (ok, out, err) = cli(&api, &["token", "read", &accessor, "-o", "json"]);
        assert!(ok, "{err}");
        assert_eq!(used(&out), issued, "round {round}: {issued} issued, {} turned away: {out}", busy.len());
        // The turned-away ones ask again, one at a time: all served.
        for &i in &busy {
            let chain = create_certificate(grpc_channel(1, &xds), &keys[i].1, 0, Some(&secret)).await.unwrap();
            assert_eq!(parse_cert(&chain[0]).spki, keys[i].0.subject_public_key_info());
        }
        let (_, out, _) = cli(&api, &["token", "read", &accessor, "-o", "json"]);
        assert_eq!(used(&out), 30, "{out}");
        if !busy.is_empty() {
            turned_away_once = true;
            break;
        }
    }
    assert!(turned_away_once, "30 requests at once with one in flight allowed: some must be turned away");
    let refused = metric(&api, "lodestar_ca_errors_total{reason=\"exhausted\"}").await;
    assert!(refused >= 1.0, "{refused}");
}

/// One single-use token sent to every replica at once: exactly one
/// certificate (the use is a compare-and-set through raft).
#[tokio::test]
async fn a_single_use_token_signs_once_across_replicas() {
    let ca = tempfile::tempdir().unwrap();
    let (ok, _, err) = {
        let out = kit::cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(ca.path()).output().unwrap();
        (out.status.success(), String::new(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert!(ok, "{err}");
    let cluster = Cluster::start(3, &format!("mesh_ca_dir = {:?}\n", ca.path())).await;
    let api = cluster.replica(1).api();
    for round in 0..3 {
        let (_, secret) = join_token(&api, &["--workload", "shop/cart"]);
        let mut tasks = Vec::new();
        for r in &cluster.replicas {
            for _ in 0..2 {
                let channel = grpc_channel(r.id, &r.xds_addr());
                let secret = secret.clone();
                tasks.push(tokio::spawn(async move { create_certificate(channel, &new_csr().1, 0, Some(&secret)).await }));
            }
        }
        let mut won = 0;
        for t in tasks {
            match t.await.unwrap() {
                Ok(chain) => {
                    won += 1;
                    assert_eq!(parse_cert(&chain[0]).uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
                }
                Err(e) => assert!(matches!(e.code(), tonic::Code::Unauthenticated | tonic::Code::Unavailable), "round {round}: {e:?}"),
            }
        }
        assert_eq!(won, 1, "round {round}: one certificate for a single-use token");
    }
    // Every replica signs from the same root, with the same trust domain.
    let roots: Vec<String> = cluster.replicas.iter().map(|_| std::fs::read_to_string(ca.path().join("root-cert.pem")).unwrap()).collect();
    assert!(roots.windows(2).all(|w| w[0] == w[1]));
}

/// A token with N uses sent by more than N agents at once, through every
/// replica: exactly N certificates (concurrent uses on a replica are
/// counted in one compare-and-set; the replicas' writes still race), and
/// the count on the token is N.
#[tokio::test]
async fn a_token_with_n_uses_signs_n_times_under_concurrency() {
    let ca = tempfile::tempdir().unwrap();
    let out = kit::cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(ca.path()).output().unwrap();
    assert!(out.status.success());
    let cluster = Cluster::start(3, &format!("mesh_ca_dir = {:?}\n", ca.path())).await;
    let api = cluster.replica(1).api();
    let (accessor, secret) = join_token(&api, &["--workload", "shop/cart", "--uses", "20"]);
    let mut tasks = Vec::new();
    for r in &cluster.replicas {
        for _ in 0..10 {
            let channel = grpc_channel(r.id, &r.xds_addr());
            let secret = secret.clone();
            tasks.push(tokio::spawn(async move { create_certificate(channel, &new_csr().1, 0, Some(&secret)).await }));
        }
    }
    let (mut won, mut used_up) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Ok(chain) => {
                won += 1;
                assert_eq!(parse_cert(&chain[0]).uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
            }
            Err(e) if e.code() == tonic::Code::Unauthenticated && e.message().contains("used up") => used_up += 1,
            // Lost every race to the other replicas: the agent retries.
            Err(e) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}"),
        }
    }
    assert_eq!(won, 20, "20 uses, 20 certificates ({used_up} told used up)");
    let (ok, out, err) = cli(&api, &["token", "read", &accessor, "-o", "json"]);
    assert!(ok, "{err}");
    assert!(out.contains("\"used\": 20") || out.contains("\"used\":20"), "{out}");
}

/// `lodestar agent` for shop/cart keeping its identity in `dir` (its log
/// beside it, `DIR.log`).
fn start_agent(dir: &Path, xds: &str, token_file: Option<&Path>, extra: &[&str]) -> Agent {
    let mut agent = AgentBuilder::new("shop", "cart", xds, dir).identity_dir(dir).log(&dir.with_extension("log")).args(extra);
    if let Some(t) = token_file {
        agent = agent.join_token_file(t);
    }
    agent.start()
}

/// The certificate in the agent's directory, once one is there and (if
/// given) its serial differs from `not`.
async fn wait_cert(dir: &Path, not: Option<&str>, timeout: Duration) -> Cert {
    kit::eventually(&format!("a (new) certificate in {}", dir.display()), timeout, || async {
        let pem = std::fs::read_to_string(dir.join("cert-chain.pem")).ok().filter(|p| !p.is_empty())?;
        let c = parse_cert(&pem);
        (Some(c.serial.as_str()) != not).then_some(c)
    })
    .await
}

/// An agent that waited for its first certificate and was restarted (the
/// CA had consumed the single-use token for it, and the answer was lost)
/// asks again with the key it left on disk, and gets its certificate; an
/// agent with a key of its own is refused.
#[tokio::test]
async fn a_restarted_agent_is_not_stranded_by_a_consumed_single_use_token() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    let (dir, token_file) = (tmp.path().join("agent"), tmp.path().join("join.token"));
    let (_, secret) = join_token(&api, &["--workload", "shop/cart"]);
    std::fs::write(&token_file, &secret).unwrap();

    // The agent's first run wrote its key and asked; its answer was lost.
    let key = KeyPair::generate().unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    let csr = CertificateParams::default().serialize_request(&key).unwrap().pem().unwrap();
    create_certificate(grpc_channel(1, &xds), &csr, 0, Some(&secret)).await.unwrap();

    let agent = start_agent(&dir, &xds, Some(&token_file), &[]);
    let cert = wait_cert(&dir, None, Duration::from_secs(20)).await;
    assert_eq!(cert.uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
    assert_eq!(cert.spki, key.subject_public_key_info(), "the key it left on disk");
    drop(agent);

    // Another host (its own directory, its own key) with the same token.
    let mut other = start_agent(&tmp.path().join("other"), &xds, Some(&token_file), &[]);
    let (ok, log) = (other.proc.wait_exit(Duration::from_secs(20)).success(), other.log());
    assert!(!ok && log.contains("used up"), "{log}");
}

#[tokio::test]
async fn agent_joins_renews_without_its_token_and_resumes() {
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    let (dir, token_file) = (tmp.path().join("agent"), tmp.path().join("join.token"));
    let (_, secret) = join_token(&api, &["--workload", "shop/cart", "--uses", "1", "--ttl", "1h"]);
    std::fs::write(&token_file, &secret).unwrap();

    // The first certificate, with the join token: SAN, EKU, the lifetime
    // asked for; files 0600.
    let mut agent = start_agent(&dir, &xds, Some(&token_file), &["--ttl", "8s"]);
    let first = wait_cert(&dir, None, Duration::from_secs(20)).await;
    assert_eq!(first.uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
    assert!(first.server_auth && first.client_auth);
    assert_eq!(first.lifetime, 8 + 60);
    use std::os::unix::fs::PermissionsExt;
    for f in ["key.pem", "cert-chain.pem", "root-cert.pem"] {
        assert_eq!(std::fs::metadata(dir.join(f)).unwrap().permissions().mode() & 0o777, 0o600, "{f}");
    }
    let key = KeyPair::from_pem(&std::fs::read_to_string(dir.join("key.pem")).unwrap()).unwrap();
    assert_eq!(key.subject_public_key_info(), first.spki, "the key on disk is the certificate's");

    // The token is gone (file deleted, and used up anyway): the agent keeps
    // renewing with its certificate, past three lifetimes.
    std::fs::remove_file(&token_file).unwrap();
    let started = Instant::now();
    let mut serial = first.serial.clone();
    let mut renewals = 0;
    while started.elapsed() < Duration::from_secs(3 * 8 + 2) || renewals < 3 {
        let next = wait_cert(&dir, Some(&serial), Duration::from_secs(15)).await;
        assert_eq!(next.uris, first.uris);
        assert!(next.not_after > now(), "renewed before expiry");
        serial = next.serial;
        renewals += 1;
    }
    assert!(agent.log().contains("renewed the certificate"));

    // A restart resumes from disk (no token needed), then renews.
    agent.proc.kill();
    let on_disk = parse_cert(&std::fs::read_to_string(dir.join("cert-chain.pem")).unwrap());
    let agent = start_agent(&dir, &xds, None, &["--ttl", "8s"]);
    let next = wait_cert(&dir, Some(&on_disk.serial), Duration::from_secs(15)).await;
    assert_eq!(next.uris, first.uris);
    assert!(agent.log().contains("resumed from the certificate on disk"), "{}", agent.log());

    // A second agent with the used single-use token is refused, and exits.
    let other = tmp.path().join("other");
    std::fs::write(&token_file, &secret).unwrap();
    let mut second = start_agent(&other, &xds, Some(&token_file), &[]);
    let (ok, log) = (second.proc.wait_exit(Duration::from_secs(20)).success(), second.log());
    assert!(!ok && log.contains("used up"), "{log}");
    assert!(!other.join("cert-chain.pem").exists());
}

/// Records the certificate a TLS server presents, without judging it (the
/// test checks what it records).
#[derive(Debug, Default)]
struct Recorder(std::sync::Mutex<Option<Vec<u8>>>);

impl rustls::client::danger::ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.0.lock().unwrap() = Some(end_entity.to_vec());
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &rustls::crypto::ring::default_provider().signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &rustls::crypto::ring::default_provider().signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider().signature_verification_algorithms.supported_schemes()
    }
}

/// The serial of the certificate served at `addr` (a TLS handshake).
async fn served_serial(addr: &str) -> Result<String, String> {
    let recorder = std::sync::Arc::new(Recorder::default());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("workload").unwrap();
    let handshake = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp);
    tokio::time::timeout(Duration::from_secs(5), handshake).await.map_err(|_| "handshake timed out".to_string())?.map_err(|e| format!("handshake: {e}"))?;
    let der = recorder.0.lock().unwrap().clone().ok_or("no certificate")?;
    let (_, c) = x509_parser::parse_x509_certificate(&der).map_err(|e| e.to_string())?;
    Ok(c.raw_serial_as_string().replace(':', "").to_lowercase())
}

async fn envoy_stats(admin: &str) -> std::collections::BTreeMap<String, u64> {
    kit::envoy::admin_stats(admin).await.expect("envoy stats")
}

/// A real Envoy gets the agent's certificate over SDS (secret `default`),
/// connects to the xDS port with it, serves it on a listener, and after a
/// rotation serves the new one with no listener or cluster change.
#[tokio::test]
async fn envoy_rotates_the_agents_certificate_over_sds() {
    let envoy_bin = kit::envoy::envoy_binary();
    let cluster = Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    let (dir, token_file, bootstrap) = (tmp.path().join("agent"), tmp.path().join("join.token"), tmp.path().join("bootstrap.json"));
    let (_, secret) = join_token(&api, &["--workload", "shop/cart"]);
    std::fs::write(&token_file, &secret).unwrap();
    let ip = format!("{}.10", kit::loopback_prefix());
    let mut agent = start_agent(
        &dir,
        &xds,
        Some(&token_file),
        &["--ttl", "10s", "--ip", &ip, "--admin-port", "15000", "-o", "json", "--bootstrap", bootstrap.to_str().unwrap()],
    );
    let first = wait_cert(&dir, None, Duration::from_secs(20)).await;

    // The bootstrap the agent wrote, plus a listener serving the SDS
    // certificate (a static fixture that needs no mesh config; the
    // translated mutual TLS listeners are tested in tests/e2e/mtls.rs).
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(&bootstrap).unwrap()).unwrap();
    let sds_config = serde_json::json!({"resource_api_version": "V3", "api_config_source": {"api_type": "GRPC", "transport_api_version": "V3", "grpc_services": [{"envoy_grpc": {"cluster_name": "sds-grpc"}}]}});
    doc["static_resources"]["listeners"] = serde_json::json!([{
        "name": "sds-probe",
        "address": {"socket_address": {"address": ip, "port_value": 15443}},
        "filter_chains": [{
            "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": {
                    "tls_certificate_sds_secret_configs": [{"name": "default", "sds_config": sds_config}],
                    "validation_context_sds_secret_config": {"name": "ROOTCA", "sds_config": sds_config}
                }
            }},
            // HTTP that waits for a request (a filter that writes and
            // closes at once races the client's end of the handshake).
            "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": "probe",
                "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "direct_response": {"status": 200}}]}]},
                "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]
            }}]
        }]
    }]);
    std::fs::write(&bootstrap, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    let mut envoy = std::process::Command::new(envoy_bin);
    envoy.arg("-c").arg(&bootstrap).args(["--use-dynamic-base-id", "--log-level", "info", "--drain-time-s", "1"]);
    let _envoy = Proc::spawn("envoy", envoy, &tmp.path().join("envoy.log"));
    let envoy_log = || std::fs::read_to_string(tmp.path().join("envoy.log")).unwrap_or_default();
    let admin = format!("http://{ip}:15000");
    let probe = format!("{ip}:15443");

    // Ready: ADS over TLS with the workload certificate as client
    // certificate (the xDS port accepts the mesh CA's), LDS and CDS done;
    // the listener serves the SDS certificate.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut served = Err(String::new());
    while Instant::now() < deadline {
        let ready = kit::http().get(format!("{admin}/ready")).send().await.is_ok_and(|r| r.status().is_success());
        if ready {
            served = served_serial(&probe).await;
            if served.is_ok() {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut serial = served.unwrap_or_else(|e| panic!("envoy never served the SDS certificate: {e}\n{}\n{}", envoy_log(), agent.log()));
    let on_disk = parse_cert(&std::fs::read_to_string(dir.join("cert-chain.pem")).unwrap()).serial;
    assert!(serial == on_disk || serial == first.serial, "served {serial}, agent has {on_disk}");
    let before = envoy_stats(&admin).await;
    assert!(before.get("cluster_manager.cds.update_success").copied().unwrap_or(0) >= 1, "CDS from the replica: {before:?}");
    assert_eq!(before.get("listener_manager.lds.update_rejected"), Some(&0));

    // Two rotations: each new serial is served, and no listener or cluster changed.
    for round in 0..2 {
        let deadline = Instant::now() + Duration::from_secs(20);
        let next = loop {
            let s = match served_serial(&probe).await {
                Ok(s) => s,
                Err(e) => {
                    let stats = envoy_stats(&admin).await;
                    let sds: Vec<_> = stats.iter().filter(|(k, _)| k.starts_with("sds.") || k.contains("ssl")).collect();
                    let log = envoy_log();
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    panic!("round {round}: {e}\n{sds:?}\n{}\n{}", tail.join("\n"), agent.log());
                }
            };
            if s != serial {
                break s;
            }
            assert!(Instant::now() < deadline, "round {round}: the served certificate did not rotate\n{}\n{}", agent.log(), envoy_log());
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let on_disk = parse_cert(&std::fs::read_to_string(dir.join("cert-chain.pem")).unwrap());
        assert_eq!(next, on_disk.serial, "round {round}: Envoy serves the agent's current certificate");
        serial = next;
    }
    let after = envoy_stats(&admin).await;
    // Not `*.update_success`: the first certificate expires about when the
    // second rotation comes, and its xDS stream ends then (and its
    // connection: the Envoy dials again with the rotated certificate), so
    // the same versions may be delivered again on a new stream.
    for stat in [
        "listener_manager.lds.version",
        "cluster_manager.cds.version",
        "listener_manager.listener_modified",
        "listener_manager.listener_added",
        "cluster_manager.cluster_modified",
        "cluster_manager.cluster_added",
    ] {
        assert!(before.contains_key(stat), "{stat} is one of Envoy's stats");
        assert_eq!(before.get(stat), after.get(stat), "{stat} changed across rotations");
    }
    eprintln!("LDS/CDS stats before and after: {:?}", before.iter().filter(|(k, _)| k.contains("lds.") || k.contains("cds.")).collect::<Vec<_>>());
    assert!(after.get("sds.default.update_success").copied().unwrap_or(0) >= 3, "{:?}", after.get("sds.default.update_success"));
    assert_eq!(after.get("sds.default.update_rejected").copied().unwrap_or(0), 0);
    agent.proc.kill();
}

/// `lodestar-bench csr` runs (small), renewing through every replica.
#[tokio::test]
async fn bench_csr_renews_through_the_replicas() {
    let ca = tempfile::tempdir().unwrap();
    let out = kit::cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(ca.path()).output().unwrap();
    assert!(out.status.success());
    let cluster = Cluster::start(2, &format!("mesh_ca_dir = {:?}\n", ca.path())).await;
    let api = cluster.replica(1).api();
    let (_, secret) = join_token(&api, &["--workload", "bench/agent"]);
    // Every replica knows the token before the bench asks both of them.
    let mut newest = 0;
    for id in [1, 2] {
        newest = newest.max(cluster.local_revision(id).await.unwrap_or(0));
    }
    cluster.wait_for_revision(newest, Duration::from_secs(10)).await;
    let token = ca.path().join("bench.token");
    std::fs::write(&token, &secret).unwrap();
    let servers = cluster.replicas.iter().map(|r| r.xds_addr()).collect::<Vec<_>>().join(",");
    let out = kit::bench(&api, &["csr", "--xds-servers", &servers, "--join-token-file", token.to_str().unwrap(), "--clients", "4", "--requests", "40"]).await;
    let r = &kit::results(&out)[0];
    assert_eq!(kit::number(r, "certs"), 40.0);
    assert_eq!(kit::number(r, "errors"), 0.0);
    // Both replicas signed.
    for id in [1, 2] {
        assert!(metric(&cluster.replica(id).api(), "citadel_server_success_cert_issuance_count").await >= 10.0, "replica {id}");
    }
}

/// A replica is killed: the agent keeps renewing through the others (every
/// replica signs from the same mesh CA files; renewal needs no quorum).
#[tokio::test]
async fn agent_renews_through_the_other_replicas_when_one_dies() {
    let ca = tempfile::tempdir().unwrap();
    let out = kit::cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(ca.path()).output().unwrap();
    assert!(out.status.success());
    let mut cluster = Cluster::start(3, &format!("mesh_ca_dir = {:?}\n", ca.path())).await;
    let api = cluster.replica(2).api();
    let (_, secret) = join_token(&api, &["--workload", "shop/cart"]);
    let tmp = tempfile::tempdir().unwrap();
    let (dir, token_file) = (tmp.path().join("agent"), tmp.path().join("join.token"));
    std::fs::write(&token_file, &secret).unwrap();
    let servers = cluster.replicas.iter().map(|r| r.xds_addr()).collect::<Vec<_>>().join(",");
    let agent = start_agent(&dir, &servers, Some(&token_file), &["--ttl", "6s"]);
    let first = wait_cert(&dir, None, Duration::from_secs(20)).await;
    // The agent asks the first replica listed first: kill it.
    cluster.kill(1);
    let mut serial = first.serial;
    for _ in 0..3 {
        let next = wait_cert(&dir, Some(&serial), Duration::from_secs(15)).await;
        assert_eq!(next.uris, ["spiffe://cluster.local/ns/shop/sa/cart"]);
        serial = next.serial;
    }
    assert!(agent.log().contains("renewed the certificate"));
}

/// CreateCertificate over `channel` asking for `impersonate` (Istio's
/// `ImpersonatedIdentity` metadata).
async fn impersonate(channel: tonic::transport::Channel, csr: &str, bearer: Option<&str>, impersonate: &str) -> Result<Vec<String>, tonic::Status> {
    let metadata = Some(lodestar::agent::impersonation_metadata(impersonate));
    let mut req = tonic::Request::new(IstioCertificateRequest { csr: csr.to_string(), validity_duration: 0, metadata });
    if let Some(b) = bearer {
        req.metadata_mut().insert("authorization", format!("Bearer {b}").parse().unwrap());
    }
    IstioCertificateServiceClient::new(channel).create_certificate(req).await.map(|r| r.into_inner().cert_chain)
}

/// A certificate and its key written to files in `dir`, for a TLS client.
fn cert_files(dir: &Path, name: &str, chain: &[String], key: &KeyPair) -> (PathBuf, PathBuf) {
    let (cert, key_file) = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
    std::fs::write(&cert, chain[..chain.len() - 1].concat()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    (cert, key_file)
}

/// Host agents (ztunnel's model, SPIRE's node SVIDs): a host's join token
/// gives it a host certificate; with it, it obtains the identities of the
/// workloads registered on its host (an Instance's `spec.host`, a
/// WorkloadEntry's `lodestar.io/host` label), and no other: not those of
/// another host, not one whose registration is gone. A workload may not
/// impersonate, and a host certificate is no workload identity.
#[tokio::test]
async fn a_host_obtains_only_identities_registered_on_it() {
    let ca = tempfile::tempdir().unwrap();
    let out = kit::cli_command().args(["tls", "ca", "create", "--mesh", "--dir"]).arg(ca.path()).output().unwrap();
    assert!(out.status.success());
    let cluster = Cluster::start(3, &format!("mesh_ca_dir = {:?}\n", ca.path())).await;
    let (r1, r2) = (cluster.replica(1), cluster.replica(2));
    let api = r1.api();
    let tmp = tempfile::tempdir().unwrap();

    // Host tokens: the first host certificate, its own SPIFFE path, client
    // authentication only; the CSR's key, whatever the CSR asked.
    let mut hosts = Vec::new();
    for name in ["node-a", "node-b"] {
        let (_, secret) = join_token(&api, &["--host", name, "--uses", "1", "--cidr", "127.0.0.0/8"]);
        let (key, csr) = new_csr();
        let chain = create_certificate(grpc_channel(1, &r1.xds_addr()), &csr, 0, Some(&secret)).await.unwrap();
        let leaf = parse_cert(&chain[0]);
        assert_eq!(leaf.uris, [format!("spiffe://cluster.local/lodestar/host/{name}")]);
        assert!(leaf.client_auth && !leaf.server_auth, "a host certificate is for client authentication only");
        assert_eq!(leaf.spki, key.subject_public_key_info());
        hosts.push(cert_files(tmp.path(), name, &chain, &key));
    }
    let as_host = |i: usize, r: &kit::Replica| tls_channel(&r.xds_addr(), &lodestar::tls::pki::member_name(r.id), Some((&hosts[i].0, &hosts[i].1)));

    // Registrations: shop/cart on node-a (an Instance), bank/pay on node-b
    // (a WorkloadEntry), shop/web on no host.
    let (status, body) = kit::apply(
        &cluster.http,
        &api,
        vec![
            serde_json::json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": "cart-1", "namespace": "shop"},
                "spec": {"service": "cart", "address": "10.1.0.1", "port": 8080, "serviceAccount": "cart", "host": "node-a"}}),
            serde_json::json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": "web-1", "namespace": "shop"},
                "spec": {"service": "web", "address": "10.1.0.2", "port": 8080, "serviceAccount": "web"}}),
            serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
                "metadata": {"name": "pay-1", "namespace": "bank", "labels": {"lodestar.io/host": "node-b"}},
                "spec": {"address": "10.1.0.3", "serviceAccount": "pay"}}),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // Host A gets shop/cart (through another replica than the write's):
    // the SAN is the impersonated identity, never the CSR's or the host's.
    let cart = "spiffe://cluster.local/ns/shop/sa/cart";
    let (cart_key, csr) = new_csr();
    let cart_chain = impersonate(as_host(0, r2), &csr, None, cart).await.unwrap();
    let leaf = parse_cert(&cart_chain[0]);
    assert_eq!(leaf.uris, [cart]);
    assert!(leaf.server_auth && leaf.client_auth);
    assert_eq!(leaf.spki, cart_key.subject_public_key_info());

    // Host A cannot get bank/pay (registered on node-b), nor shop/web (on
    // no host), nor an unknown one: PERMISSION_DENIED, naming its own host
    // and nothing of node-b's.
    for wanted in ["spiffe://cluster.local/ns/bank/sa/pay", "spiffe://cluster.local/ns/shop/sa/web", "spiffe://cluster.local/ns/shop/sa/nobody"] {
        let e = impersonate(as_host(0, r1), &new_csr().1, None, wanted).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{wanted}: {e:?}");
        assert!(e.message().contains("registered on host node-a"), "{e:?}");
        assert!(!e.message().contains("node-b"), "no word of other hosts: {e:?}");
    }
    // Host B gets bank/pay through its WorkloadEntry, but not shop/cart.
    let chain = impersonate(as_host(1, r1), &new_csr().1, None, "spiffe://cluster.local/ns/bank/sa/pay").await.unwrap();
    assert_eq!(parse_cert(&chain[0]).uris, ["spiffe://cluster.local/ns/bank/sa/pay"]);
    let e = impersonate(as_host(1, r1), &new_csr().1, None, cart).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // A malformed or foreign identity names the field.
    for bad in ["spiffe://other.domain/ns/shop/sa/cart", "spiffe://cluster.local/lodestar/host/node-b", "cart"] {
        let e = impersonate(as_host(0, r1), &new_csr().1, None, bad).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        assert!(e.message().contains("metadata.ImpersonatedIdentity"), "{e:?}");
    }

    // A workload certificate (the cart one just issued) may not
    // impersonate, not even itself; nor may a workload's join token.
    let cart_files = cert_files(tmp.path(), "cart", &cart_chain, &cart_key);
    let as_cart = tls_channel(&r1.xds_addr(), &lodestar::tls::pki::member_name(1), Some((&cart_files.0, &cart_files.1)));
    for wanted in [cart, "spiffe://cluster.local/ns/bank/sa/pay"] {
        let e = impersonate(as_cart.clone(), &new_csr().1, None, wanted).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("only a host agent"), "{e:?}");
    }
    let (_, workload_token) = join_token(&api, &["--workload", "shop/cart", "--uses", "5"]);
    let e = impersonate(grpc_channel(1, &r1.xds_addr()), &new_csr().1, Some(&workload_token), "spiffe://cluster.local/ns/bank/sa/pay").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    // Without impersonation the workload certificate renews itself, as before.
    let renewed = create_certificate(as_cart.clone(), &new_csr().1, 0, None).await.unwrap();
    assert_eq!(parse_cert(&renewed[0]).uris, [cart]);

    // The host renews its own certificate with itself.
    let renewed = create_certificate(as_host(0, r2), &new_csr().1, 3600, None).await.unwrap();
    assert_eq!(parse_cert(&renewed[0]).uris, ["spiffe://cluster.local/lodestar/host/node-a"]);

    // A host certificate is no workload identity on the xDS port: an ADS
    // stream presenting it (and no token) is refused.
    let mut ads = envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient::new(as_host(0, r1));
    let node = envoy_types::pb::envoy::config::core::v3::Node {
        id: "sidecar~10.1.0.1~cart-1.shop~shop.svc.cluster.local".into(),
        cluster: "cart".into(),
        ..Default::default()
    };
    let first = envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
        node: Some(node),
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        ..Default::default()
    };
    let e = match ads.stream_aggregated_resources(tokio_stream::iter([first])).await {
        Err(e) => e,
        Ok(resp) => resp.into_inner().message().await.expect_err("a host certificate must not open an xDS stream"),
    };
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");

    // The registration is deleted (through replica 1): host A is refused at
    // once, through replica 2 (the check reads linearizably).
    let del = cluster.http.delete(format!("{api}/v1/resources/instances/shop/cart-1")).send().await.unwrap();
    assert!(del.status().is_success(), "{:?}", del.text().await);
    let e = impersonate(as_host(0, r2), &new_csr().1, None, cart).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");

    // Bad host tokens name the field.
    for (args, field) in [(vec!["--host", "Node_A"], "host"), (vec!["--host", "node-a", "--policy", "p"], "policies"), (vec!["--uses", "2"], "workload")] {
        let mut all = vec!["token", "create"];
        all.extend(args.iter());
        let (ok, _, err) = cli(&api, &all);
        assert!(!ok && err.contains(field), "{args:?}: {err}");
    }
}
