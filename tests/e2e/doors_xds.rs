//! The xDS port and mesh identity against an attacker who holds one
//! low-privilege credential (issue 32): what one proxy token, one source
//! address and one stream may hold on a replica; Envoy's admin port and
//! the proxy token in its bootstrap; gateway secrets and the mesh CA's
//! deny list.
//!
//! Real replicas as processes (`kit::Cluster`), hand-rolled ADS clients
//! over TLS, real Envoys and `lodestar agent`s where it matters. Waits are
//! bounded polls.

use crate::kit;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind as PbKind, Struct, Value as PbValue};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use lodestar::xds::resources::ResourceType;
use serde_json::Value;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

const BOUND: Duration = Duration::from_secs(20);
const CDS: ResourceType = ResourceType::Cluster;
const EDS: ResourceType = ResourceType::Endpoint;
const RDS: ResourceType = ResourceType::Route;

/// The node id of a sidecar `name` in `namespace`.
fn node_id(name: &str, namespace: &str) -> String {
    format!("sidecar~127.0.0.5~{name}.{namespace}~{namespace}.svc.cluster.local")
}

fn node(id: &str) -> Node {
    Node { id: id.to_string(), ..Default::default() }
}

fn req(t: ResourceType, names: &[String], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest { type_url: t.type_url(), resource_names: names.to_vec(), response_nonce: nonce.to_string(), ..Default::default() }
}

/// A proxy token bound to `namespace`: (accessor, secret).
fn proxy_token(api: &str, args: &[&str]) -> (String, String) {
    let t = kit::token_create(api, args);
    (t["accessorId"].as_str().unwrap().to_string(), t["secret"].as_str().unwrap().to_string())
}

type Stream<Req, Resp> = kit::AdsStream<Req, Resp>;

/// A SotW stream on member 1's xDS port `xds` with `token`, whose first
/// request is `first` (the server reads it before it answers).
async fn sotw(xds: &str, token: &str, first: DiscoveryRequest) -> Result<Stream<DiscoveryRequest, DiscoveryResponse>, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let rx = kit::ads_client_as(1, xds, Some(token)).stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Stream { tx, rx })
}

async fn delta(xds: &str, token: &str, first: DeltaDiscoveryRequest) -> Stream<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let rx = kit::ads_client_as(1, xds, Some(token)).delta_aggregated_resources(ReceiverStream::new(rx)).await.expect("a delta stream").into_inner();
    Stream { tx, rx }
}

/// A metric's value in the replica's `/metrics` (0 if absent).
async fn metric(cluster: &kit::Cluster, series: &str) -> f64 {
    let text = cluster.http.get(format!("{}/metrics", cluster.replica(1).api())).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// Replica 1's `/debug/syncz`.
async fn syncz(cluster: &kit::Cluster) -> Value {
    kit::mesh::syncz(&cluster.http, &cluster.replica(1).api()).await
}

/// Poll replica 1's `/debug/syncz` until `pred` holds.
async fn wait_syncz(cluster: &kit::Cluster, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    kit::mesh::wait_syncz(&cluster.http, &cluster.replica(1).api(), what, pred).await
}

// ---------------------------------------------------------------------------
// Item 4: the xDS edge per credential, source and stream.

/// Ten NACKs of 3 MB each on one stream, with a namespace-bound proxy
/// token: `/debug/syncz` keeps the last one cut to 4 KiB (saying how much
/// was cut), and the log has one warn line for them, itself cut to 1 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nack_of_megabytes_is_kept_and_logged_cut_and_once_per_interval() {
    use lodestar::xds::limits::{MAX_NACK_TEXT, NACK_LOG_TEXT};
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (_, secret) = proxy_token(&r.api(), &["--proxy", "team-a"]);
    let id = node_id("web", "team-a");
    let mut first = req(CDS, &[], "");
    first.node = Some(node(&id));
    let mut s = sotw(&r.xds_addr(), &secret, first).await.expect("the proxy token opens its namespace's stream");
    let cds = s.recv().await;
    let text = "the proxy says no. ".repeat(3 * 1024 * 1024 / 19);
    let series = "pilot_total_xds_rejects{type=\"cds\"}";
    let before = metric(&cluster, series).await;
    for _ in 0..10 {
        let mut nack = req(CDS, &[], &cds.nonce);
        nack.version_info = cds.version_info.clone();
        nack.error_detail = Some(RpcStatus { code: 3, message: text.clone(), details: vec![] });
        s.send(nack).await;
    }
    kit::until("the replica counts the ten NACKs", BOUND, || async { metric(&cluster, series).await >= before + 10.0 }).await;
    let z = syncz(&cluster).await;
    let p = z["proxies"].as_array().unwrap().iter().find(|p| p["id"] == id.as_str()).expect("the proxy in syncz");
    let kept = p["types"]["CDS"]["last_nack"]["error"].as_str().expect("the last NACK is kept");
    assert!(kept.len() <= MAX_NACK_TEXT + 64, "syncz keeps {} bytes of a {}-byte NACK", kept.len(), text.len());
    assert!(kept.starts_with("the proxy says no.") && kept.contains("more bytes)"), "{}", &kept[kept.len().saturating_sub(80)..]);
    let log = r.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("NACK: the proxy rejected") && l.contains(&id)).collect();
    let warn: Vec<&&str> = lines.iter().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warn.len(), 1, "one warn line for ten NACKs within the interval; lines: {}", lines.len());
    assert!(warn[0].len() < NACK_LOG_TEXT + 1024, "the warn line is {} bytes", warn[0].len());
    assert!(log.len() < 1024 * 1024, "the replica's log grew to {} bytes", log.len());
}

/// Node metadata over the caps is refused at admission, INVALID_ARGUMENT
/// naming the field and the limit; at the caps it is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_metadata_over_the_caps_is_refused_naming_the_limit() {
    use lodestar::xds::limits::{MAX_NODE_LABELS, MAX_NODE_METADATA};
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (_, secret) = proxy_token(&r.api(), &["--proxy", "team-a"]);
    let s = |v: &str| PbValue { kind: Some(PbKind::StringValue(v.into())) };
    let with = |labels: usize, pad: usize| {
        let labels = Struct { fields: (0..labels).map(|i| (format!("label-{i}"), s("x"))).collect() };
        let mut n = node(&node_id("web", "team-a"));
        n.metadata = Some(Struct {
            fields: [("LABELS".to_string(), PbValue { kind: Some(PbKind::StructValue(labels)) }), ("PAD".to_string(), s(&"p".repeat(pad)))].into(),
        });
        let mut first = req(CDS, &[], "");
        first.node = Some(n);
        first
    };
    let refused = |r: Result<_, tonic::Status>| match r {
        Ok(_) => panic!("served"),
        Err(s) => s,
    };
    let e = refused(sotw(&r.xds_addr(), &secret, with(MAX_NODE_LABELS + 1, 0)).await);
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("node.metadata.LABELS") && e.message().contains(&MAX_NODE_LABELS.to_string()), "{}", e.message());
    let e = refused(sotw(&r.xds_addr(), &secret, with(1, 100 * 1024)).await);
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("node.metadata") && e.message().contains(&MAX_NODE_METADATA.to_string()), "{}", e.message());
    let mut ok = sotw(&r.xds_addr(), &secret, with(MAX_NODE_LABELS, 32 * 1024)).await.expect("a node at the caps is served");
    ok.recv().await;
}

/// `count` names of 60 bytes, from `from`.
fn names(from: usize, count: usize) -> Vec<String> {
    let name = |i: usize| format!("outbound|8080||service-{i:08}.team-a.svc.cluster.local");
    (from..from + count).map(|i| format!("{}{}", name(i), "x".repeat(60 - name(i).len()))).collect()
}

/// A stream's subscriptions, every type together, are held to
/// `xds_max_subscription_bytes` (1 MiB, each name counting its length plus
/// 64 bytes): delta subscriptions that add up past it over requests end
/// the stream RESOURCE_EXHAUSTED naming the setting, and so do SotW
/// subscriptions of two types that together go past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_past_the_stream_budget_end_the_stream() {
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (_, secret) = proxy_token(&r.api(), &["--proxy", "team-a"]);
    let series = "lodestar_xds_streams_refused_total{reason=\"subscription_limit\"}";
    assert_eq!(names(0, 1)[0].len(), 60);

    // Delta: 4,000 names (496 KB), 4,000 more (992 KB): served; 4,000
    // more: over.
    let mut first = DeltaDiscoveryRequest { type_url: EDS.type_url(), resource_names_subscribe: names(0, 4000), ..Default::default() };
    first.node = Some(node(&node_id("delta", "team-a")));
    let mut d = delta(&r.xds_addr(), &secret, first).await;
    d.recv().await;
    d.send(DeltaDiscoveryRequest { type_url: EDS.type_url(), resource_names_subscribe: names(4000, 4000), ..Default::default() }).await;
    d.recv().await;
    d.send(DeltaDiscoveryRequest { type_url: EDS.type_url(), resource_names_subscribe: names(8000, 4000), ..Default::default() }).await;
    let end = d.end().await;
    assert_eq!(end.code(), tonic::Code::ResourceExhausted, "{end:?}");
    assert!(end.message().contains("xds_max_subscription_bytes"), "{}", end.message());

    // SotW: 4,500 EDS names, then 4,500 RDS names: each type under the
    // budget, the stream over it.
    let mut first = req(EDS, &names(0, 4500), "");
    first.node = Some(node(&node_id("sotw", "team-a")));
    let mut s = sotw(&r.xds_addr(), &secret, first).await.expect("a stream under the budget");
    s.recv().await;
    s.send(req(RDS, &names(0, 4500), "")).await;
    let end = s.end().await;
    assert_eq!(end.code(), tonic::Code::ResourceExhausted, "{end:?}");
    assert!(end.message().contains("xds_max_subscription_bytes"), "{}", end.message());
    assert_eq!(metric(&cluster, series).await, 2.0);
}

/// One proxy token opens `xds_max_streams_per_credential` streams and no
/// more: the next is refused RESOURCE_EXHAUSTED naming the setting,
/// counted, and listed in `/debug/syncz`, while another namespace's proxy
/// still connects; the source address's quota holds every credential
/// from it; a stream that ends gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_quotas_per_credential_and_per_source() {
    let cluster = kit::Cluster::start(1, "xds_max_streams_per_credential = 20\nxds_max_streams_per_source = 30").await;
    let r = cluster.replica(1);
    let xds = r.xds_addr();
    let (accessor_a, secret_a) = proxy_token(&r.api(), &["--proxy", "team-a"]);
    let (_, secret_b) = proxy_token(&r.api(), &["--proxy", "team-b"]);
    let open = |secret: String, ns: &'static str, i: usize| {
        let xds = xds.clone();
        async move {
            let mut first = req(CDS, &[], "");
            first.node = Some(node(&node_id(&format!("p{i}"), ns)));
            sotw(&xds, &secret, first).await
        }
    };
    let mut held_a = Vec::new();
    for i in 0..20 {
        let mut s = open(secret_a.clone(), "team-a", i).await.unwrap_or_else(|e| panic!("team-a stream {i}: {e:?}"));
        s.recv().await;
        held_a.push(s);
    }
    let Err(e) = open(secret_a.clone(), "team-a", 20).await else { panic!("a 21st stream of one token was served") };
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("xds_max_streams_per_credential") && e.message().contains(&accessor_a), "{}", e.message());
    assert_eq!(metric(&cluster, "lodestar_xds_streams_refused_total{reason=\"credential_quota\"}").await, 1.0);
    let z = syncz(&cluster).await;
    let listed = z["refused"].as_array().unwrap().iter().any(|r| r["code"] == "resource_exhausted" && r["who"] == format!("token:{accessor_a}").as_str());
    assert!(listed, "the refusal is in syncz: {:#}", z["refused"]);

    // Another namespace's proxy connects, up to the source's quota (30
    // from this address, whatever the credential).
    let mut held_b = Vec::new();
    for i in 0..10 {
        let mut s = open(secret_b.clone(), "team-b", i).await.unwrap_or_else(|e| panic!("team-b stream {i}: {e:?}"));
        s.recv().await;
        held_b.push(s);
    }
    let Err(e) = open(secret_b.clone(), "team-b", 10).await else { panic!("a 31st stream from one address was served") };
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("xds_max_streams_per_source"), "{}", e.message());
    assert_eq!(metric(&cluster, "lodestar_xds_streams_refused_total{reason=\"source_quota\"}").await, 1.0);

    // One of team-a's streams ends: its place is free again once the
    // replica has seen it go.
    drop(held_a.pop());
    let mut again = kit::eventually("the place comes back", BOUND, || async {
        match open(secret_a.clone(), "team-a", 21).await {
            Ok(s) => Some(s),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                None
            }
        }
    })
    .await;
    again.recv().await;
    let _ = wait_syncz(&cluster, "31 streams", |s| s["proxies"].as_array().is_some_and(|p| p.len() == 30)).await;
}

// ---------------------------------------------------------------------------
// Item 5: Envoy's admin port and the proxy token.

/// An Envoy bootstrapped by `lodestar bootstrap --proxy-token-file` is
/// served with that token (bound to team-a: its stream is accepted), yet
/// neither the bootstrap nor the admin's `/config_dump` holds the token:
/// Envoy reads the file itself (a static `generic_secret`, redacted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_reads_its_proxy_token_from_the_file_and_config_dump_shows_none() {
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (_, secret) = proxy_token(&r.api(), &["--proxy", "team-a"]);
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("proxy.token");
    std::fs::write(&token_file, format!("{secret}\n")).unwrap();
    let ip = format!("{}.7", kit::loopback_prefix());
    let mut o = kit::envoy::EnvoyOptions::new("web", &ip);
    o.namespace = "team-a".into();
    o.server_api = Some(r.api());
    o.proxy_token_file = Some(token_file);
    let id = o.node_id();
    let bootstrap = kit::envoy::bootstrap_yaml(&o);
    assert!(!bootstrap.contains(&secret), "the bootstrap holds the token:\n{bootstrap}");
    let mut envoy = kit::envoy::Envoy::start(&tmp.path().join("envoy"), o);
    envoy.wait_ready(BOUND).await;
    // Served: only the token could have authenticated it (no certificate).
    wait_syncz(&cluster, "the Envoy connected", |s| s["proxies"].as_array().is_some_and(|p| p.iter().any(|p| p["id"] == id.as_str()))).await;
    let dump = envoy.config_dump().await.to_string();
    assert!(!dump.contains(&secret), "config_dump shows the proxy token");
    assert!(dump.contains("lodestar-proxy-token"), "the secret holding it is listed (redacted)");
    let stats = envoy.stats().await;
    assert!(!format!("{stats:?}").contains(&secret));
}

/// Run `f` on a thread inside the network namespace `ns`.
fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: setns on this thread only, with a namespace file we opened.
        let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns({path}): {}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// A network namespace of this test, deleted (with whatever runs in it)
/// when dropped.
struct Netns(String);

impl Netns {
    fn create(name: &str) -> Netns {
        assert_eq!(unsafe { libc::geteuid() }, 0, "this test creates a network namespace: run it as root");
        let run = |args: &[&str]| {
            let out = std::process::Command::new("ip").args(args).output().expect("the `ip` tool (iproute2)");
            assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        let _ = std::process::Command::new("ip").args(["netns", "del", name]).output();
        run(&["netns", "add", name]);
        let ns = Netns(name.to_string());
        run(&["-n", name, "link", "set", "lo", "up"]);
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(out) = std::process::Command::new("ip").args(["netns", "pids", &self.0]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = std::process::Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A proxy whose address is routable (198.18.0.7, in a namespace of its
/// own): its Envoy's admin answers on 127.0.0.1 and not on the proxy's
/// address. `--admin-address` puts it there, with a warning on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_admin_is_not_reachable_on_the_proxys_address() {
    const IP: &str = "198.18.0.7";
    let ns = Netns::create(&format!("ldx{:x}-admin", std::process::id()));
    let out = std::process::Command::new("ip").args(["-n", &ns.0, "addr", "add", &format!("{IP}/32"), "dev", "lo"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let tmp = tempfile::tempdir().unwrap();
    let token_file = tmp.path().join("proxy.token");
    std::fs::write(&token_file, "not-a-real-token\n").unwrap();
    let bootstrap = |extra: &[&str]| {
        let mut cmd = kit::cli_command();
        cmd.args(["bootstrap", "--name", "web", "--ip", IP, "--admin-port", "15000", "--xds-servers", "127.0.0.1:1", "-o", "json", "--proxy-token-file"])
            .arg(&token_file)
            .args(extra);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let (doc, stderr) = bootstrap(&[]);
    assert!(stderr.is_empty(), "no warning for loopback: {stderr}");
    let (_, warned) = bootstrap(&["--admin-address", IP]);
    assert!(warned.contains("warning") && warned.contains("/config_dump"), "{warned}");
    let path = tmp.path().join("bootstrap.json");
    std::fs::write(&path, doc).unwrap();
    let mut envoy = std::process::Command::new("ip");
    envoy.args(["netns", "exec", &ns.0]).arg(kit::envoy::envoy_binary()).arg("-c").arg(&path).args(["--use-dynamic-base-id", "--log-level", "info"]);
    let _envoy = kit::Proc::spawn("envoy", envoy, &tmp.path().join("envoy.log"));
    let envoy_log = tmp.path().join("envoy.log");
    let (loopback, routable) = in_netns(&ns.0, move || {
        let connect = |addr: &str| std::net::TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(1));
        let deadline = Instant::now() + BOUND;
        while connect("127.0.0.1:15000").is_err() {
            let log = std::fs::read_to_string(&envoy_log).unwrap_or_default();
            assert!(Instant::now() < deadline, "Envoy's admin never listened on 127.0.0.1:15000:\n{log}");
            std::thread::sleep(Duration::from_millis(100));
        }
        (connect("127.0.0.1:15000").is_ok(), connect(&format!("{IP}:15000")).map_err(|e| e.kind()))
    });
    assert!(loopback);
    assert_eq!(routable.err(), Some(std::io::ErrorKind::ConnectionRefused), "the admin answers on the proxy's address {IP}");
}

// ---------------------------------------------------------------------------
// Item 7: gateway keys, the mesh CA's deny list, certificate expiry.

use lodestar::proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use lodestar::proto::istio_ca::IstioCertificateRequest;

/// An ADS client over TLS presenting `identity` (certificate and key
/// files) and no token.
fn ads_with_cert(xds: &str, identity: (&std::path::Path, &std::path::Path)) -> kit::AdsClient {
    let channel = kit::tls_channel(xds, &lodestar::tls::pki::member_name(1), Some(identity));
    envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient::with_interceptor(
        channel,
        lodestar::cli::client::Bearer::new(None).unwrap(),
    )
}

async fn sotw_on(mut client: kit::AdsClient, first: DiscoveryRequest) -> Result<Stream<DiscoveryRequest, DiscoveryResponse>, tonic::Status> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(first).await.unwrap();
    let rx = client.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Stream { tx, rx })
}

/// A mesh certificate: its key, chain (PEM, leaf first), files for a TLS
/// client, and serial.
struct MeshCert {
    chain: Vec<String>,
    files: (std::path::PathBuf, std::path::PathBuf),
    serial: String,
}

impl MeshCert {
    fn identity(&self) -> (&std::path::Path, &std::path::Path) {
        (&self.files.0, &self.files.1)
    }
}

/// `CreateCertificate` on member 1's xDS port with `bearer` (a join
/// token) or, without, with `renew` as the client certificate; the new
/// certificate written to `dir` as `name`.
async fn certificate(xds: &str, bearer: Option<&str>, renew: Option<&MeshCert>, dir: &std::path::Path, name: &str) -> Result<MeshCert, tonic::Status> {
    let key = rcgen::KeyPair::generate().unwrap();
    let csr = rcgen::CertificateParams::default().serialize_request(&key).unwrap().pem().unwrap();
    let channel = kit::tls_channel(xds, &lodestar::tls::pki::member_name(1), renew.map(MeshCert::identity));
    let mut req = tonic::Request::new(IstioCertificateRequest { csr, validity_duration: 3600, metadata: None });
    if let Some(b) = bearer {
        req.metadata_mut().insert("authorization", format!("Bearer {b}").parse().unwrap());
    }
    let chain = IstioCertificateServiceClient::new(channel).create_certificate(req).await?.into_inner().cert_chain;
    let files = (dir.join(format!("{name}.pem")), dir.join(format!("{name}-key.pem")));
    std::fs::write(&files.0, chain[..chain.len() - 1].concat()).unwrap();
    std::fs::write(&files.1, key.serialize_pem()).unwrap();
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
    let serial = lodestar::ca::cert_facts(&der).expect("a mesh certificate").serial;
    Ok(MeshCert { chain, files, serial })
}

/// The SDS request of a gateway for `names`.
fn sds(node_id: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
    let mut r = DiscoveryRequest {
        type_url: ResourceType::Secret.type_url(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    };
    if nonce.is_empty() {
        r.node = Some(node(node_id));
    }
    r
}

fn secret_names(r: &DiscoveryResponse) -> Vec<String> {
    use prost::Message;
    r.resources.iter().map(|a| envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret::decode(a.value.as_slice()).unwrap().name).collect()
}

/// A gateway's Secrets (certificates and keys over SDS) go only to
/// credentials allowed to be gateways: a proxy token made with
/// `--gateway` (not a plain proxy token of the namespace), and a workload
/// certificate only while a Role lets its identity read secrets there,
/// granted and withdrawn on an open stream at the next revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_secrets_go_only_to_credentials_allowed_to_be_gateways() {
    use base64::Engine;
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let leaf = kit::tls::Ca::new("edge-ca").server(&["edge.example.test"]);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "edge-cred", "namespace": "edge"},
        "type": "kubernetes.io/tls", "data": {"tls.crt": b64(&leaf.cert_pem), "tls.key": b64(&leaf.key_pem)}});
    let (status, body) = kit::apply(&cluster.http, &api, vec![secret]).await;
    assert_eq!(status, 200, "{body}");
    let gw = "router~127.0.0.5~ingress.edge~edge.svc.cluster.local";
    let served = |client: kit::AdsClient| async move {
        let mut s = sotw_on(client, sds(gw, &["edge-cred"], "")).await.expect("the gateway's stream opens");
        secret_names(&s.recv().await)
    };

    // Proxy tokens: of the namespace, and a gateway's.
    let (_, plain) = proxy_token(&api, &["--proxy", "edge"]);
    let (_, gateway) = proxy_token(&api, &["--proxy", "edge/ingress", "--gateway"]);
    assert!(served(kit::ads_client_as(1, &xds, Some(&plain))).await.is_empty(), "a plain proxy token was served the gateway's key");
    assert_eq!(served(kit::ads_client_as(1, &xds, Some(&gateway))).await, ["edge-cred"]);
    let (ok, out, _) = kit::cli(&api, &["token", "list"]);
    assert!(ok && out.contains("edge/ingress (gateway)"), "{out}");
    let (status, body) = kit::get_json(&cluster.http, &format!("{api}/v1/acl/tokens")).await;
    assert!(status == 200 || status == 405, "{body}");
    let bad = cluster.http.post(format!("{api}/v1/acl/tokens")).json(&serde_json::json!({"policies": ["x"], "gateway": true})).send().await.unwrap();
    assert_eq!(bad.status(), 400);
    let body = bad.text().await.unwrap();
    assert!(body.contains("gateway"), "{body}");

    // A workload certificate of edge/ingress: no secrets until a Role lets
    // its identity read them, on the same stream.
    let tmp = tempfile::tempdir().unwrap();
    let (_, join) = proxy_token(&api, &["--workload", "edge/ingress"]);
    let cert = certificate(&xds, Some(&join), None, tmp.path(), "ingress").await.expect("a workload certificate");
    let mut s = sotw_on(ads_with_cert(&xds, cert.identity()), sds(gw, &["edge-cred"], "")).await.expect("the certificate opens its stream");
    let first = s.recv().await;
    assert!(secret_names(&first).is_empty(), "a workload certificate was served the gateway's key");
    s.send(sds(gw, &["edge-cred"], &first.nonce)).await;
    for args in [
        vec!["policy", "create", "edge-secrets", "--rule", "read:secrets:edge"],
        vec!["role", "create", "edge-gateways", "--policy", "edge-secrets", "--identity", "spiffe://cluster.local/ns/edge/sa/ingress"],
    ] {
        let (ok, _, err) = kit::cli(&api, &args);
        assert!(ok, "{args:?}: {err}");
    }
    let granted = s.recv().await;
    assert_eq!(secret_names(&granted), ["edge-cred"], "served once the Role allows it");
    s.send(sds(gw, &["edge-cred"], &granted.nonce)).await;
    let (ok, _, err) = kit::cli(&api, &["role", "delete", "edge-gateways"]);
    assert!(ok, "{err}");
    let withdrawn = s.recv().await;
    assert!(secret_names(&withdrawn).is_empty(), "withdrawn with the Role");
    drop(cert.chain);
}

/// The mesh CA's deny list. A SPIFFE id revoked: its certificates renew
/// no more, its open stream ends, no new stream opens, while a
/// certificate from a new join (signed after the revocation) works; a
/// serial revoked: that certificate only; an identity revoked with
/// `--all`: no certificate is signed for it, join token or not, until
/// it is taken off the list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_certificates_neither_renew_nor_keep_their_streams() {
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    let (_, join) = proxy_token(&api, &["--workload", "shop/cart", "--uses", "4"]);
    let a = certificate(&xds, Some(&join), None, tmp.path(), "a").await.expect("joined");
    let b = certificate(&xds, None, Some(&a), tmp.path(), "b").await.expect("a renews itself");
    let id = node_id("cart", "shop");
    let mut first = req(CDS, &[], "");
    first.node = Some(node(&id));
    let mut stream = sotw_on(ads_with_cert(&xds, a.identity()), first.clone()).await.expect("the certificate opens its stream");
    stream.recv().await;

    let spiffe = "spiffe://cluster.local/ns/shop/sa/cart";
    let (ok, out, err) = kit::cli(&api, &["cert", "revoke", "--spiffe-id", spiffe, "--reason", "key leaked"]);
    assert!(ok, "{out}{err}");
    let revoked_at = std::time::SystemTime::now();
    let end = stream.end().await;
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
    assert!(end.message().contains("revoked") && end.message().contains("key leaked"), "{}", end.message());
    for (name, cert) in [("a", &a), ("b", &b)] {
        let e = certificate(&xds, None, Some(cert), tmp.path(), "x").await.err().unwrap_or_else(|| panic!("revoked {name} renewed"));
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{name}: {e:?}");
        assert!(e.message().contains("revoked"), "{name}: {}", e.message());
        let Err(e) = sotw_on(ads_with_cert(&xds, cert.identity()), first.clone()).await else { panic!("revoked {name} opened a stream") };
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{name}: {e:?}");
    }
    let z = syncz(&cluster).await;
    assert!(z["refused"].as_array().unwrap().iter().any(|x| x["reason"].as_str().is_some_and(|r| r.contains("revoked"))), "{:#}", z["refused"]);
    let (ok, out, _) = kit::cli(&api, &["cert", "revocations"]);
    assert!(ok && out.contains(spiffe) && out.contains("key leaked"), "{out}");

    // A new join, signed after the revocation (a later second: times are
    // whole seconds): served, and renews.
    while std::time::SystemTime::now().duration_since(revoked_at).unwrap() < Duration::from_millis(1100) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let c = certificate(&xds, Some(&join), None, tmp.path(), "c").await.expect("a new join after the revocation");
    let mut s = sotw_on(ads_with_cert(&xds, c.identity()), first.clone()).await.expect("a certificate signed after the revocation");
    s.recv().await;
    let d = certificate(&xds, None, Some(&c), tmp.path(), "d").await.expect("and it renews");

    // By serial: c only (d, the same identity, still works).
    let (ok, out, err) = kit::cli(&api, &["cert", "revoke", "--serial", &c.serial.to_uppercase()]);
    assert!(ok, "{out}{err}");
    let end = s.end().await;
    assert_eq!(end.code(), tonic::Code::Unauthenticated, "{end:?}");
    assert!(certificate(&xds, None, Some(&c), tmp.path(), "x").await.is_err(), "a revoked serial renewed");
    let mut still = sotw_on(ads_with_cert(&xds, d.identity()), first.clone()).await.expect("another certificate of the identity");
    still.recv().await;

    // --all: nothing is signed for the identity, not even with a join
    // token, until the revocation is deleted.
    let (ok, out, err) = kit::cli(&api, &["cert", "revoke", "--spiffe-id", spiffe, "--all", "--name", "cart-banned"]);
    assert!(ok, "{out}{err}");
    let e = certificate(&xds, Some(&join), None, tmp.path(), "x").await.err().expect("a banned identity was signed");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("cart-banned"), "{}", e.message());
    let (ok, _, err) = kit::cli(&api, &["cert", "unrevoke", "cart-banned"]);
    assert!(ok, "{err}");
    certificate(&xds, Some(&join), None, tmp.path(), "e").await.expect("signed again once the ban is lifted");

    // Admin only: a namespace writer may not revoke (or unrevoke).
    let (ok, _, err) = kit::cli(&api, &["policy", "create", "shop-writer", "--rule", "read,write,delete:*:shop"]);
    assert!(ok, "{err}");
    let writer = kit::token_create(&api, &["--policy", "shop-writer"])["secret"].as_str().unwrap().to_string();
    let doc =
        serde_json::json!({"apiVersion": "acl.lodestar.io/v1", "kind": "CertificateRevocation", "metadata": {"name": "sneaky"}, "spec": {"serial": "01"}});
    let resp = kit::anonymous_http_builder()
        .build()
        .unwrap()
        .post(format!("{api}/v1/apply"))
        .bearer_auth(writer)
        .json(&serde_json::json!({"resources": [doc]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
}

/// A stream authenticated by a workload certificate ends when the
/// certificate expires, with no new revision, and closes its connection:
/// a real Envoy, whose `lodestar agent` renewed the certificate, connects
/// again with the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_certificate_ends_its_stream_and_envoy_reconnects_with_the_renewed_one() {
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (api, xds) = (r.api(), r.xds_addr());
    let tmp = tempfile::tempdir().unwrap();
    let (_, join) = proxy_token(&api, &["--workload", "shop/cart"]);
    let token_file = tmp.path().join("join.token");
    std::fs::write(&token_file, &join).unwrap();
    let ip = format!("{}.10", kit::loopback_prefix());
    let dir = tmp.path().join("agent");
    let _agent = kit::agent::AgentBuilder::new("shop", "cart", &xds, tmp.path())
        .identity_dir(&dir)
        .args(["--ip", &ip, "--ttl", "8s", "--run-envoy", "--envoy-binary"])
        .args([kit::envoy::envoy_binary()])
        .join_token_file(&token_file)
        .args(["--envoy-arg=--use-dynamic-base-id"])
        .start();
    let agent_log = || std::fs::read_to_string(tmp.path().join("agent.log")).unwrap_or_default();
    let id = node_id("cart", "shop").replace("127.0.0.5", &ip);
    let streams =
        |z: &Value| -> Vec<u64> { z["proxies"].as_array().unwrap().iter().filter(|p| p["id"] == id.as_str()).filter_map(|p| p["stream"].as_u64()).collect() };
    let first = kit::eventually("the agent's Envoy connects", Duration::from_secs(30), || async { streams(&syncz(&cluster).await).first().copied() }).await;
    let revision = cluster.local_revision(1).await.unwrap();
    // The first certificate lives 8 s: its stream ends then (no write in
    // between), and the Envoy is back on a new stream with the renewed
    // certificate, over a new connection.
    kit::eventually_or(&format!("stream {first} ended and a new one open, after its certificate expired"), Duration::from_secs(30), || async {
        let now = streams(&syncz(&cluster).await);
        if !now.contains(&first) && !now.is_empty() {
            Ok(())
        } else {
            Err(format!("{now:?}"))
        }
    })
    .await;
    assert_eq!(cluster.local_revision(1).await, Some(revision), "no write happened: the timer ended the stream");
    assert!(r.log().contains("expired at"), "the replica says why the stream ended");
    assert!(agent_log().contains("renewed the certificate"), "{}", agent_log());
}
