//! The ADS server end to end.
//!
//! Translation is not here yet, so most tests run a replica in this process
//! (`server::run_with`: real raft, store, API and xDS ports) with a test
//! generator that turns stored VirtualServices into resources, and speak
//! the protocol with a hand-rolled tonic ADS client. Others start real
//! Envoys (bootstrapped by `lodestar bootstrap`) against an in-process
//! replica or a replica process.
//!
//! Deterministic: "nothing was sent" is shown by the next response being
//! the one a later, known change causes, never by waiting for silence.
//! Waits are bounded polls.

use crate::kit;

use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    address, config_source::ConfigSourceSpecifier, socket_address::PortSpecifier, Address, AggregatedConfigSource, ApiVersion, ConfigSource, Locality, Node,
    SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::{route, route_action, route_match, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router as RouterFilter;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use envoy_types::util::pack_any;
use kit::envoy::{loopback_prefix, Envoy, EnvoyOptions, Upstream};
use lodestar::config::ServerConfig;
use lodestar::model::proxy::ProxyIdentity;
use lodestar::model::Kind;
use lodestar::store::Applied;
use lodestar::xds::resources::{Generator, ProxyConfig, ResourceType, XdsResource};
use prost::Message;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;

const CDS: ResourceType = ResourceType::Cluster;
const EDS: ResourceType = ResourceType::Endpoint;
const LDS: ResourceType = ResourceType::Listener;
const RDS: ResourceType = ResourceType::Route;

const NODE: &str = "sidecar~127.0.0.9~client.default~default.svc.cluster.local";
const BOUND: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// An in-process replica.

struct InProcess {
    api: String,
    xds: String,
    http: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl InProcess {
    async fn start(generator: Arc<dyn Generator>) -> InProcess {
        Self::start_on(&loopback_prefix(), generator).await
    }

    /// The replica listens on PREFIX.1 (API :7000, raft :7001, xDS :7002).
    async fn start_on(prefix: &str, generator: Arc<dyn Generator>) -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let ip = format!("{prefix}.1");
        let config = ServerConfig {
            id: 1,
            data_dir: dir.path().join("data"),
            api_addr: format!("{ip}:7000"),
            raft_addr: format!("{ip}:7001"),
            xds_addr: format!("{ip}:7002"),
            heartbeat_ms: 50,
            election_timeout_min_ms: 200,
            election_timeout_max_ms: 400,
            tls_ca_file: Some(kit::test_ca().ca_file.clone()),
            tls_ca_key_file: Some(kit::test_ca().ca_key_file.clone()),
            initial_management_token_file: Some(kit::test_ca().token_file.clone()),
            user_client_config: None,
            ..Default::default()
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(lodestar::server::run_with(config, generator, async move {
            let _ = stopped.await;
        }));
        let r = InProcess { api: format!("https://{ip}:7000"), xds: format!("{ip}:7002"), http: kit::http(), stop: Some(stop), task: Some(task), _dir: dir };
        let ready = || async { r.http.get(format!("{}/readyz", r.api)).timeout(Duration::from_secs(2)).send().await.is_ok_and(|x| x.status().is_success()) };
        kit::until("the in-process replica ready", BOUND, ready).await;
        r
    }

    /// Apply documents; the revision they produced.
    async fn apply(&self, docs: Vec<Value>) -> u64 {
        kit::applied(&self.http, &self.api, docs).await
    }

    async fn delete_vs(&self, name: &str) -> u64 {
        let r = self.http.delete(format!("{}/v1/resources/vs/default/{name}", self.api)).send().await.unwrap();
        assert!(r.status().is_success());
        r.json::<Value>().await.unwrap()["revision"].as_u64().unwrap()
    }

    async fn syncz(&self) -> Value {
        syncz(&self.http, &self.api).await
    }

    async fn wait_syncz(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        wait_syncz(&self.http, &self.api, what, pred).await
    }

    /// Shut down (as on SIGTERM) and wait for `run_with` to return.
    async fn stop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(BOUND, task).await.expect("replica stops in time").expect("replica task");
            result.expect("replica ran cleanly");
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

use kit::mesh::{syncz, wait_syncz};

/// The one proxy with this node id in a syncz document.
fn proxy<'a>(s: &'a Value, id: &str) -> Option<&'a Value> {
    s["proxies"].as_array()?.iter().find(|p| p["id"] == id)
}

fn acked(s: &Value, id: &str, t: ResourceType, version: u64) -> bool {
    proxy(s, id).is_some_and(|p| p["types"][t.short()]["acked_version"] == version.to_string().as_str() && p["types"][t.short()]["in_sync"] == true)
}

// ---------------------------------------------------------------------------
// Test generators.

/// Every VirtualService becomes a cluster, an endpoint assignment, a
/// listener and a route configuration named after it. The `tag` label
/// shows in the cluster and the endpoints (so changing it changes those two
/// types only); tag `fail` makes generation fail.
struct VsGenerator;

impl Generator for VsGenerator {
    fn generate(&self, _proxy: &ProxyIdentity, applied: &Applied) -> Result<ProxyConfig, String> {
        let mut c = ProxyConfig { revision: applied.revision(), ..Default::default() };
        for (key, obj) in applied.state.objects.iter() {
            if key.kind != Kind::VirtualService {
                continue;
            }
            let name = key.name.to_string();
            let tag = obj.body()["metadata"]["labels"]["tag"].as_str().unwrap_or("").to_string();
            if tag == "fail" {
                return Err(format!("cannot translate {name}"));
            }
            c.insert(CDS, XdsResource::new(&name, &Cluster { name: name.clone(), alt_stat_name: tag.clone(), ..Default::default() }));
            let locality = LocalityLbEndpoints { locality: Some(Locality { zone: tag.clone(), ..Default::default() }), ..Default::default() };
            c.insert(EDS, XdsResource::new(&name, &ClusterLoadAssignment { cluster_name: name.clone(), endpoints: vec![locality], ..Default::default() }));
            c.insert(LDS, XdsResource::new(&name, &Listener { name: name.clone(), ..Default::default() }));
            c.insert(RDS, XdsResource::new(&name, &RouteConfiguration { name: name.clone(), ..Default::default() }));
        }
        Ok(c)
    }
}

fn socket(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

fn ads() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

/// A working Envoy config: listener `http` on LISTEN → RDS `routes` →
/// EDS cluster `upstream` → the upstream helper. With a VirtualService
/// named `broken` in the store it adds a cluster Envoy must reject.
struct EnvoyGenerator {
    upstream: SocketAddr,
    listen: (String, u32),
}

impl Generator for EnvoyGenerator {
    fn generate(&self, _proxy: &ProxyIdentity, applied: &Applied) -> Result<ProxyConfig, String> {
        let mut c = ProxyConfig { revision: applied.revision(), ..Default::default() };
        let cluster = Cluster {
            name: "upstream".into(),
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
            eds_cluster_config: Some(EdsClusterConfig { eds_config: Some(ads()), ..Default::default() }),
            connect_timeout: Some(PbDuration { seconds: 1, nanos: 0 }),
            ..Default::default()
        };
        c.insert(CDS, XdsResource::new("upstream", &cluster));
        let endpoint = LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(socket(&self.upstream.ip().to_string(), self.upstream.port() as u32)),
                ..Default::default()
            })),
            ..Default::default()
        };
        let cla = ClusterLoadAssignment {
            cluster_name: "upstream".into(),
            endpoints: vec![LocalityLbEndpoints { lb_endpoints: vec![endpoint], ..Default::default() }],
            ..Default::default()
        };
        c.insert(EDS, XdsResource::new("upstream", &cla));
        let hcm = HttpConnectionManager {
            stat_prefix: "http".into(),
            route_specifier: Some(RouteSpecifier::Rds(Rds { config_source: Some(ads()), route_config_name: "routes".into() })),
            http_filters: vec![HttpFilter {
                name: "envoy.filters.http.router".into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(pack_any(RouterFilter::default()))),
                ..Default::default()
            }],
            ..Default::default()
        };
        let listener = Listener {
            name: "http".into(),
            address: Some(socket(&self.listen.0, self.listen.1)),
            filter_chains: vec![FilterChain {
                filters: vec![Filter {
                    name: "envoy.filters.network.http_connection_manager".into(),
                    config_type: Some(filter::ConfigType::TypedConfig(pack_any(hcm))),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        c.insert(LDS, XdsResource::new("http", &listener));
        let routes = RouteConfiguration {
            name: "routes".into(),
            virtual_hosts: vec![VirtualHost {
                name: "all".into(),
                domains: vec!["*".into()],
                routes: vec![Route {
                    r#match: Some(RouteMatch { path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())), ..Default::default() }),
                    action: Some(route::Action::Route(RouteAction {
                        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster("upstream".into())),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        c.insert(RDS, XdsResource::new("routes", &routes));
        let broken = applied.state.objects.keys().any(|k| k.kind == Kind::VirtualService && k.name == "broken");
        if broken {
            let endpoint = LbEndpoint {
                host_identifier: Some(HostIdentifier::Endpoint(Endpoint { address: Some(socket("not-an-ip", 80)), ..Default::default() })),
                ..Default::default()
            };
            let bad = Cluster {
                name: "broken".into(),
                cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
                connect_timeout: Some(PbDuration { seconds: 1, nanos: 0 }),
                load_assignment: Some(ClusterLoadAssignment {
                    cluster_name: "broken".into(),
                    endpoints: vec![LocalityLbEndpoints { lb_endpoints: vec![endpoint], ..Default::default() }],
                    ..Default::default()
                }),
                ..Default::default()
            };
            c.insert(CDS, XdsResource::new("broken", &bad));
        }
        Ok(c)
    }
}

// ---------------------------------------------------------------------------
// A hand-rolled ADS client.

fn node(id: &str) -> Node {
    Node { id: id.to_string(), ..Default::default() }
}

fn req(t: ResourceType, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: t.type_url(),
        resource_names: names.iter().map(|s| s.to_string()).collect(),
        version_info: version.to_string(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    }
}

fn first(mut r: DiscoveryRequest) -> DiscoveryRequest {
    r.node = Some(node(NODE));
    r
}

fn ack(r: &DiscoveryResponse, names: &[&str]) -> DiscoveryRequest {
    let t = ResourceType::from_type_url(&r.type_url).unwrap();
    req(t, names, &r.version_info, &r.nonce)
}

fn nack(t: ResourceType, names: &[&str], previous_version: &str, nonce: &str, error: &str) -> DiscoveryRequest {
    let mut r = req(t, names, previous_version, nonce);
    r.error_detail = Some(RpcStatus { code: 3, message: error.to_string(), details: vec![] });
    r
}

fn dreq(t: ResourceType, subscribe: &[&str], unsubscribe: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: t.type_url(),
        resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    }
}

/// The name inside an encoded resource of type `t`.
fn resource_name(t: ResourceType, bytes: &[u8]) -> String {
    match t {
        CDS => Cluster::decode(bytes).unwrap().name,
        EDS => ClusterLoadAssignment::decode(bytes).unwrap().cluster_name,
        LDS => Listener::decode(bytes).unwrap().name,
        RDS => RouteConfiguration::decode(bytes).unwrap().name,
        ResourceType::Secret => envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret::decode(bytes).unwrap().name,
        // One table per proxy, unnamed.
        ResourceType::NameTable => String::new(),
        ResourceType::ExtensionConfig => envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig::decode(bytes).unwrap().name,
    }
}

fn kind_of(type_url: &str) -> ResourceType {
    ResourceType::from_type_url(type_url).unwrap_or_else(|| panic!("unexpected type {type_url}"))
}

fn names(r: &DiscoveryResponse) -> Vec<String> {
    let t = kind_of(&r.type_url);
    r.resources.iter().map(|a| resource_name(t, &a.value)).collect()
}

fn dnames(r: &DeltaDiscoveryResponse) -> Vec<String> {
    let t = kind_of(&r.type_url);
    r.resources
        .iter()
        .map(|res| {
            let name = resource_name(t, &res.resource.as_ref().unwrap().value);
            assert_eq!(name, res.name);
            name
        })
        .collect()
}

async fn channel(xds: &str) -> kit::AdsClient {
    kit::ads_client(1, xds)
}

type Client<Req, Resp> = kit::AdsStream<Req, Resp>;
type Sotw = Client<DiscoveryRequest, DiscoveryResponse>;
type Delta = Client<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

/// Open a SotW stream whose first request is `first` (the server reads it
/// before it answers the call).
async fn sotw(xds: &str, first: DiscoveryRequest) -> Result<Sotw, tonic::Status> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(first).await.unwrap();
    let rx = channel(xds).await.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
    Ok(Client { tx, rx })
}

async fn delta(xds: &str, mut first: DeltaDiscoveryRequest) -> Delta {
    first.node = Some(node(NODE));
    let (tx, rx) = mpsc::channel(16);
    tx.send(first).await.unwrap();
    let rx = channel(xds).await.delta_aggregated_resources(ReceiverStream::new(rx)).await.expect("delta stream").into_inner();
    Client { tx, rx }
}

fn dr(name: &str, host: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": {"name": name, "namespace": "default"}, "spec": {"host": host}})
}

// ---------------------------------------------------------------------------
// Protocol tests with the hand-rolled client.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_subscribe_ack_nack_stale_and_late_names() {
    let r = InProcess::start(Arc::new(VsGenerator)).await;
    let rev1 = r.apply(vec![kit::vs("a", "default", "v1"), kit::vs("b", "default", "v1")]).await;

    let mut c = sotw(&r.xds, first(req(CDS, &[], "", ""))).await.unwrap();
    let cds1 = c.recv().await;
    assert_eq!((kind_of(&cds1.type_url), cds1.version_info.clone(), names(&cds1)), (CDS, rev1.to_string(), vec!["a".to_string(), "b".into()]));
    c.send(ack(&cds1, &[])).await;
    // EDS by name, one of them not there yet. Had the ACK above been
    // answered, the next message would be a CDS one.
    c.send(req(EDS, &["a", "b", "c"], "", "")).await;
    let eds1 = c.recv().await;
    assert_eq!((kind_of(&eds1.type_url), eds1.version_info.clone(), names(&eds1)), (EDS, rev1.to_string(), vec!["a".to_string(), "b".into()]));
    c.send(ack(&eds1, &["a", "b", "c"])).await;
    r.wait_syncz("CDS and EDS acked", |s| acked(s, NODE, CDS, rev1) && acked(s, NODE, EDS, rev1)).await;

    // A change to `a`: clusters, then endpoints (make before break); the
    // listeners and routes it did not change are not sent.
    let rev2 = r.apply(vec![kit::vs("a", "default", "v2")]).await;
    let p1 = c.recv().await;
    let p2 = c.recv().await;
    assert_eq!((kind_of(&p1.type_url), p1.version_info.clone()), (CDS, rev2.to_string()));
    assert_eq!((kind_of(&p2.type_url), p2.version_info.clone(), names(&p2)), (EDS, rev2.to_string(), vec!["a".to_string(), "b".into()]));

    // A NACK with a stale nonce is neither ACK nor NACK of the latest; the
    // NACK of the latest CDS is recorded with the rejected version.
    c.send(nack(CDS, &[], &rev1.to_string(), &cds1.nonce, "stale complaint")).await;
    c.send(nack(CDS, &[], &rev1.to_string(), &p1.nonce, "cluster a: bad")).await;
    c.send(ack(&p2, &["a", "b", "c"])).await;
    let s = r.wait_syncz("EDS acked at rev2", |s| acked(s, NODE, EDS, rev2)).await;
    let cds = &proxy(&s, NODE).unwrap()["types"]["CDS"];
    assert_eq!(cds["last_nack"]["error"], "cluster a: bad", "{s:#}");
    assert_eq!(cds["last_nack"]["rejected_version"], rev2.to_string().as_str());
    assert_eq!((cds["acked_version"].clone(), cds["in_sync"].clone()), (json!(rev1.to_string()), json!(false)));

    // A revision that changes nothing for this proxy sends nothing: the next
    // response is the one for the revision after it.
    let rev3 = r.apply(vec![dr("a", "a.default.svc.cluster.local")]).await;
    assert!(rev3 > rev2);
    // `c` was requested before it existed: it arrives with the clusters.
    let rev4 = r.apply(vec![kit::vs("c", "default", "v1")]).await;
    let p3 = c.recv().await;
    let p4 = c.recv().await;
    assert_eq!((kind_of(&p3.type_url), p3.version_info.clone(), names(&p3).len()), (CDS, rev4.to_string(), 3));
    assert_eq!((kind_of(&p4.type_url), names(&p4)), (EDS, vec!["a".to_string(), "b".into(), "c".into()]));
    c.send(ack(&p3, &[])).await;
    c.send(ack(&p4, &["a", "b", "c"])).await;

    // A generation failure keeps the last config and shows in syncz; the
    // next good revision is pushed.
    let bad = r.apply(vec![kit::vs("d", "default", "fail")]).await;
    r.wait_syncz("generate error", |s| proxy(s, NODE).is_some_and(|p| p["generate_error"].as_str().is_some_and(|e| e.contains("cannot translate d")))).await;
    let good = r.apply(vec![kit::vs("d", "default", "ok")]).await;
    assert!(good > bad);
    let p5 = c.recv().await;
    assert_eq!((kind_of(&p5.type_url), p5.version_info.clone(), names(&p5).len()), (CDS, good.to_string(), 4));
    let s = r.syncz().await;
    assert!(proxy(&s, NODE).unwrap()["generate_error"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_reconnect_with_last_version() {
    let r = InProcess::start(Arc::new(VsGenerator)).await;
    let rev = r.apply(vec![kit::vs("a", "default", "v1")]).await;
    let mut c = sotw(&r.xds, first(req(LDS, &[], "", ""))).await.unwrap();
    let l1 = c.recv().await;
    c.send(ack(&l1, &[])).await;
    r.wait_syncz("LDS acked", |s| acked(s, NODE, LDS, rev)).await;
    drop(c);
    r.wait_syncz("the closed stream is gone", |s| proxy(s, NODE).is_none()).await;

    // The reconnect carries the version it has and no nonce: it is answered
    // (same content, same version) so the client has a nonce to ACK.
    let mut c = sotw(&r.xds, first(req(LDS, &[], &rev.to_string(), ""))).await.unwrap();
    let l2 = c.recv().await;
    assert_eq!((l2.version_info.clone(), names(&l2)), (rev.to_string(), vec!["a".to_string()]));
    assert!(!l2.nonce.is_empty());
    assert_eq!(l2.resources, l1.resources);
    c.send(ack(&l2, &[])).await;
    let s = r.wait_syncz("LDS acked after reconnect", |s| acked(s, NODE, LDS, rev)).await;
    assert_eq!(s["proxies"].as_array().unwrap().len(), 1, "{s:#}");
    assert_eq!(proxy(&s, NODE).unwrap()["protocol"], "sotw");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_subscriptions_removals_and_reconnect() {
    let r = InProcess::start(Arc::new(VsGenerator)).await;
    let rev1 = r.apply(vec![kit::vs("a", "default", "v1"), kit::vs("b", "default", "v1")]).await;

    let mut d = delta(&r.xds, dreq(CDS, &[], &[], "")).await;
    let c1 = d.recv().await;
    assert_eq!((c1.system_version_info.clone(), dnames(&c1), c1.removed_resources.len()), (rev1.to_string(), vec!["a".to_string(), "b".into()], 0));
    let versions: HashMap<String, String> = c1.resources.iter().map(|r| (r.name.clone(), r.version.clone())).collect();
    d.send(dreq(CDS, &[], &[], &c1.nonce)).await;

    // By name: "zz" does not exist and is answered as removed.
    d.send(dreq(EDS, &["a", "zz"], &[], "")).await;
    let e1 = d.recv().await;
    assert_eq!((dnames(&e1), e1.removed_resources.clone()), (vec!["a".to_string()], vec!["zz".to_string()]));
    d.send(dreq(EDS, &[], &[], &e1.nonce)).await;
    r.wait_syncz("delta CDS and EDS acked", |s| acked(s, NODE, CDS, rev1) && acked(s, NODE, EDS, rev1)).await;

    // Deleting b: CDS says removed; EDS never had b, so nothing there.
    let rev2 = r.delete_vs("b").await;
    let c2 = d.recv().await;
    assert_eq!((kind_of(&c2.type_url), c2.system_version_info.clone()), (CDS, rev2.to_string()));
    assert_eq!((dnames(&c2), c2.removed_resources.clone()), (Vec::<String>::new(), vec!["b".to_string()]));
    d.send(dreq(CDS, &[], &[], &c2.nonce)).await;

    // Changing a: CDS then EDS, only a.
    let rev3 = r.apply(vec![kit::vs("a", "default", "v2")]).await;
    let c3 = d.recv().await;
    let e3 = d.recv().await;
    assert_eq!((kind_of(&c3.type_url), dnames(&c3), c3.system_version_info.clone()), (CDS, vec!["a".to_string()], rev3.to_string()));
    assert_eq!((kind_of(&e3.type_url), dnames(&e3)), (EDS, vec!["a".to_string()]));
    d.send(dreq(CDS, &[], &[], &c3.nonce)).await;
    d.send(dreq(EDS, &[], &[], &e3.nonce)).await;

    // Unsubscribed from EDS a: the next change sends clusters only, and a
    // NACK of it is recorded.
    d.send(dreq(EDS, &[], &["a"], "")).await;
    let rev4 = r.apply(vec![kit::vs("a", "default", "v3")]).await;
    let c4 = d.recv().await;
    assert_eq!((kind_of(&c4.type_url), c4.system_version_info.clone()), (CDS, rev4.to_string()));
    let mut n = dreq(CDS, &[], &[], &c4.nonce);
    n.error_detail = Some(RpcStatus { code: 3, message: "delta says no".into(), details: vec![] });
    d.send(n).await;
    let rev5 = r.apply(vec![kit::vs("c", "default", "v1")]).await;
    let c5 = d.recv().await;
    assert_eq!((kind_of(&c5.type_url), dnames(&c5), c5.system_version_info.clone()), (CDS, vec!["c".to_string()], rev5.to_string()));
    let s = r.wait_syncz("delta NACK", |s| proxy(s, NODE).is_some_and(|p| !p["types"]["CDS"]["last_nack"].is_null())).await;
    assert_eq!(proxy(&s, NODE).unwrap()["types"]["CDS"]["last_nack"]["rejected_version"], rev4.to_string().as_str());
    assert_eq!(proxy(&s, NODE).unwrap()["protocol"], "delta");
    let a_now = c5.resources.iter().chain(&c4.resources).find(|r| r.name == "a").map(|r| r.version.clone()).unwrap();
    drop(d);

    // Reconnect: the client still has a (current), b (gone) and an old c.
    let mut first = dreq(CDS, &["*"], &[], "");
    first.initial_resource_versions = [("a".to_string(), a_now), ("b".to_string(), versions["b"].clone()), ("c".to_string(), "stale".to_string())].into();
    let mut d = delta(&r.xds, first).await;
    let c6 = d.recv().await;
    assert_eq!((dnames(&c6), c6.removed_resources.clone()), (vec!["c".to_string()], vec!["b".to_string()]));
    assert_eq!(c6.system_version_info, rev5.to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_node_id_is_rejected() {
    let r = InProcess::start(Arc::new(VsGenerator)).await;
    let mut bad = req(CDS, &[], "", "");
    bad.node = Some(node("envoy-1"));
    let err = sotw(&r.xds, bad).await.err().expect("rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("envoy-1") && err.message().contains("node.id"), "{}", err.message());
    let err = sotw(&r.xds, req(CDS, &[], "", "")).await.err().expect("rejected without a node");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(r.syncz().await["proxies"].as_array().unwrap().is_empty());
}

/// Messages and header blocks bigger than the connection's buffers, on a
/// stream that goes idle between pushes: the xDS port's HTTP/2 (h2 with
/// Lodestar's buffer patches, `vendor/h2/PATCHES.md`) starts its read and
/// write buffers at 4 KiB and releases them whenever a connection is idle,
/// so each push after an idle period allocates them again and must still
/// carry frames, messages and headers of any size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_messages_and_headers_across_idle_periods() {
    let mut r = InProcess::start(Arc::new(VsGenerator)).await;
    // About 110 bytes of CDS per name (a DNS label: at most 63 characters):
    // 300 of them are a response of several 16 KiB HTTP/2 frames.
    let name = |i: usize| format!("a-service-name-long-enough-to-span-several-frames-{i:03}");
    let mut rev = r.apply((0..300).map(|i| kit::vs(&name(i), "default", "v1")).collect()).await;

    // A 64 KiB first request (the node) and a 12 KiB header: both span
    // several reads of the server's 4 KiB read buffer.
    let mut hello = first(req(CDS, &[], "", ""));
    hello.node.as_mut().unwrap().user_agent_name = "u".repeat(64 * 1024);
    let (tx, rx) = mpsc::channel(16);
    tx.send(hello).await.unwrap();
    let mut call = tonic::Request::new(ReceiverStream::new(rx));
    call.metadata_mut().insert("x-padding", "p".repeat(12 * 1024).parse().unwrap());
    let ch = tokio::time::timeout(BOUND, channel(&r.xds)).await.expect("connected in time");
    let rx = tokio::time::timeout(BOUND, ch.clone().stream_aggregated_resources(call))
        .await
        .expect("the server answers the call once it has the 64 KiB first request")
        .expect("stream with a 12 KiB header")
        .into_inner();
    let mut c = Client { tx, rx };

    for round in 0..3 {
        let cds = c.recv().await;
        assert_eq!((kind_of(&cds.type_url), cds.version_info.clone(), names(&cds).len()), (CDS, rev.to_string(), 300 + round));
        assert!(cds.encoded_len() > 3 * 16 * 1024 / 2, "round {round}: a CDS response of {} bytes", cds.encoded_len());
        c.send(ack(&cds, &[])).await;
        r.wait_syncz("CDS acked", |s| acked(s, NODE, CDS, rev)).await;
        // Idle now: nothing in flight either way. The next change pushes
        // the whole set again.
        rev = r.apply(vec![kit::vs(&format!("late-{round}"), "default", "v1")]).await;
    }
    drop(c);
    // Stop the replica before the test's runtime goes away: dropped
    // mid-shutdown, sled's final flush can wait forever for a write that
    // its cancelled caller was to complete.
    r.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_end_cleanly_on_shutdown() {
    let mut r = InProcess::start(Arc::new(VsGenerator)).await;
    let mut c = sotw(&r.xds, first(req(CDS, &[], "", ""))).await.unwrap();
    c.recv().await;
    r.stop().await;
    let end = tokio::time::timeout(BOUND, c.rx.message()).await.expect("stream ends");
    assert!(matches!(end, Ok(None)), "a clean end (status OK), got {end:?}");
}

// ---------------------------------------------------------------------------
// Real Envoys.

/// Envoy, bootstrapped by `lodestar bootstrap` from the replica's member
/// list, against a replica process serving the default (pre-translation,
/// empty) config: it connects, ACKs CDS and LDS, and shows up in syncz.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_connects_to_a_replica_process() {
    kit::envoy::envoy_binary();
    let cluster = kit::Cluster::start(1, "").await;
    let api = cluster.replica(1).api();
    let tmp = tempfile::tempdir().unwrap();
    let mut o = EnvoyOptions::new("productpage-v1", &format!("{}.2", loopback_prefix()));
    o.labels = vec![("app".into(), "productpage".into())];
    o.server_api = Some(api.clone());
    let id = o.node_id();
    let mut envoy = Envoy::start(tmp.path(), o);
    envoy.wait_ready(BOUND).await;
    let rev = cluster.local_revision(1).await.unwrap();
    let s = wait_syncz(&cluster.http, &api, "CDS and LDS acked", |s| acked(s, &id, CDS, rev) && acked(s, &id, LDS, rev)).await;
    let p = proxy(&s, &id).unwrap();
    assert_eq!((p["name"].clone(), p["labels"]["app"].clone(), p["kind"].clone()), (json!("productpage-v1"), json!("productpage"), json!("sidecar")));
    envoy.assert_no_rejections().await;
}

async fn envoy_smoke(delta: bool) {
    kit::envoy::envoy_binary();
    let prefix = loopback_prefix();
    let upstream = Upstream::start(&format!("{prefix}.3"), "reviews-v2").await;
    let envoy_ip = format!("{prefix}.2");
    let generator = EnvoyGenerator { upstream: upstream.addr, listen: (envoy_ip.clone(), 18080) };
    let r = InProcess::start_on(&prefix, Arc::new(generator)).await;
    let tmp = tempfile::tempdir().unwrap();
    let mut o = EnvoyOptions::new("ratings-v1", &envoy_ip);
    o.delta = delta;
    o.xds_servers = vec![r.xds.clone()];
    let id = o.node_id();
    let mut envoy = Envoy::start(tmp.path(), o);
    envoy.wait_ready(BOUND).await;
    envoy.wait_for_cluster("upstream", BOUND).await;
    envoy.wait_for_listener("http", BOUND).await;

    // Through Envoy to the upstream (the cluster may still be warming).
    let url = format!("http://{envoy_ip}:18080/hello");
    let body = kit::eventually("a 200 through envoy", BOUND, || async {
        let resp = r.http.get(&url).timeout(Duration::from_secs(2)).send().await.ok()?;
        if resp.status().is_success() {
            Some(resp.text().await.unwrap())
        } else {
            None
        }
    })
    .await;
    assert_eq!(body, "reviews-v2");
    assert!(upstream.requests().iter().any(|q| q.path == "/hello"));

    let s = r
        .wait_syncz("all four types acked", |s| {
            proxy(s, &id)
                .is_some_and(|p| [CDS, EDS, LDS, RDS].iter().all(|t| p["types"][t.short()]["in_sync"] == true && p["types"][t.short()]["last_nack"].is_null()))
        })
        .await;
    assert_eq!(proxy(&s, &id).unwrap()["protocol"], if delta { "delta" } else { "sotw" });
    envoy.assert_no_rejections().await;

    // A cluster Envoy must reject: the NACK (Envoy's own error text) is in
    // syncz, and Envoy keeps serving the last good config.
    let bad_rev = r.apply(vec![kit::vs("broken", "default", "x")]).await;
    let s = r.wait_syncz("CDS NACK", |s| proxy(s, &id).is_some_and(|p| !p["types"]["CDS"]["last_nack"].is_null())).await;
    let n = &proxy(&s, &id).unwrap()["types"]["CDS"]["last_nack"];
    assert_eq!(n["rejected_version"], bad_rev.to_string().as_str(), "{s:#}");
    assert!(n["error"].as_str().unwrap().contains("not-an-ip"), "{n:#}");
    envoy.wait_for_stats("cds update_rejected", BOUND, |s| s.get("cluster_manager.cds.update_rejected").is_some_and(|v| *v >= 1)).await;
    let still = r.http.get(&url).timeout(Duration::from_secs(5)).send().await.unwrap();
    assert_eq!(still.text().await.unwrap(), "reviews-v2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_routes_through_served_config_sotw() {
    envoy_smoke(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_routes_through_served_config_delta() {
    envoy_smoke(true).await;
}

/// Envoy is bootstrapped with every replica; when the one serving it dies,
/// it reconnects to another and is in sync there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_fails_over_to_another_replica() {
    kit::envoy::envoy_binary();
    let mut cluster = kit::Cluster::start(3, "").await;
    let tmp = tempfile::tempdir().unwrap();
    let mut o = EnvoyOptions::new("details-v1", &format!("{}.2", loopback_prefix()));
    o.server_api = Some(cluster.replica(1).api());
    let id = o.node_id();
    let mut envoy = Envoy::start(tmp.path(), o);
    envoy.wait_ready(BOUND).await;
    let bootstrap = std::fs::read_to_string(tmp.path().join("bootstrap.yaml")).unwrap();
    for r in &cluster.replicas {
        assert!(bootstrap.contains(&r.ip), "the bootstrap lists replica {}: {bootstrap}", r.id);
    }

    let first = replica_serving(&cluster, &id).await;
    cluster.kill(first);
    let second = replica_serving(&cluster, &id).await;
    assert_ne!(first, second);
    envoy.assert_no_rejections().await;
}

/// The live replica that has proxy `id` in sync for CDS and LDS.
async fn replica_serving(cluster: &kit::Cluster, id: &str) -> u64 {
    kit::eventually(&format!("a live replica with {id} in sync"), BOUND, || async {
        for r in cluster.replicas.iter().filter(|r| r.child.is_some()) {
            let Ok(resp) = cluster.http.get(format!("{}/debug/syncz", r.api())).timeout(Duration::from_secs(2)).send().await else { continue };
            let Ok(s) = resp.json::<Value>().await else { continue };
            if proxy(&s, id).is_some_and(|p| p["types"]["CDS"]["in_sync"] == true && p["types"]["LDS"]["in_sync"] == true) {
                return Some(r.id);
            }
        }
        None
    })
    .await
}

/// A gate a generator waits at, opened and closed by the test.
#[derive(Default)]
struct Gate {
    closed: std::sync::Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.cv.notify_all();
    }
    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.cv.wait(closed).unwrap();
        }
    }
}

/// [`VsGenerator`] that records the revisions it generates for and waits
/// at a gate first.
struct GatedGenerator {
    gate: Arc<Gate>,
    seen: Arc<std::sync::Mutex<Vec<u64>>>,
}

impl Generator for GatedGenerator {
    fn generate(&self, proxy: &ProxyIdentity, applied: &Applied) -> Result<ProxyConfig, String> {
        self.seen.lock().unwrap().push(applied.revision());
        self.gate.pass();
        VsGenerator.generate(proxy, applied)
    }
}

/// Revisions that arrive while a stream is busy are coalesced: it then
/// generates once, for the newest, and never sends the ones in between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revisions_arriving_during_a_push_are_coalesced() {
    let gate = Arc::new(Gate::default());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let r = InProcess::start(Arc::new(GatedGenerator { gate: gate.clone(), seen: seen.clone() })).await;
    let rev0 = r.apply(vec![kit::vs("a", "default", "v0")]).await;
    let mut c = sotw(&r.xds, first(req(CDS, &[], "", ""))).await.unwrap();
    assert_eq!(c.recv().await.version_info, rev0.to_string());

    // The stream is stuck generating revision A ...
    gate.set(true);
    let a = r.apply(vec![kit::vs("a", "default", "v1")]).await;
    let deadline = Instant::now() + BOUND;
    while !seen.lock().unwrap().contains(&a) {
        assert!(Instant::now() < deadline, "generation for {a} did not start");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ... while B, C and D commit.
    let mut last = a;
    for tag in ["v2", "v3", "v4"] {
        last = r.apply(vec![kit::vs("a", "default", tag)]).await;
    }
    // The debouncer hands the newest to the streams within its window
    // (later on a loaded machine): wait for it (in this process) before
    // the stream is let go, else it may take an older one first.
    let deadline = Instant::now() + BOUND;
    while lodestar::xds::push::published_at(last).is_none() {
        assert!(Instant::now() < deadline, "revision {last} was not pushed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    gate.set(false);
    let p1 = c.recv().await;
    let p2 = c.recv().await;
    assert_eq!((p1.version_info.clone(), p2.version_info.clone()), (a.to_string(), last.to_string()));
    // Generated once at connect, once for A, once for the newest.
    assert_eq!(*seen.lock().unwrap(), vec![rev0, a, last]);
}

// ---------------------------------------------------------------------------
// The xDS port under abuse, against a replica process (ACLs on): garbage,
// a 100 MiB request, a million names, and thousands of streams opened as
// fast as one client can, each from a client without credentials and from
// one with the management token. Each is refused or closed, and the replica
// still serves a well-behaved ADS client. Its memory (VmRSS, VmHWM) is
// printed (`rss:` lines; `benches/abuse.sh xds-port` collects them), not
// asserted.

/// A codec that sends bytes as they are: garbage where a request belongs
/// (and, in the Gateway API harness, the echo server's JSON).
#[derive(Clone, Copy, Default)]
pub(crate) struct RawCodec;
pub(crate) struct RawEncoder;
pub(crate) struct RawDecoder;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// Send `messages` as the requests of one SotW stream on `xds`, with
/// `token`; the status the stream ends with (OK if it is still open after
/// the first response).
async fn raw_stream(xds: &str, token: Option<&str>, messages: Vec<Vec<u8>>) -> tonic::Status {
    let bearer = lodestar::cli::client::Bearer::new(token).unwrap();
    let channel = tonic::service::interceptor::InterceptedService::new(kit::grpc_channel(1, xds), bearer);
    let mut grpc = tonic::client::Grpc::new(channel);
    if let Err(e) = grpc.ready().await {
        return tonic::Status::unavailable(format!("not ready: {e}"));
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources");
    // The request stream stays open (pending) after its messages: the
    // server's answer, not the client's end, closes it.
    let requests = tokio_stream::StreamExt::chain(tokio_stream::iter(messages), tokio_stream::pending());
    let call = tokio::time::timeout(BOUND, grpc.streaming(tonic::Request::new(requests), path, RawCodec)).await.expect("an answer in time");
    match call {
        Err(status) => status,
        Ok(resp) => match tokio::time::timeout(BOUND, resp.into_inner().message()).await.expect("an answer in time") {
            Err(status) => status,
            Ok(_) => tonic::Status::ok("served"),
        },
    }
}

/// A well-behaved ADS client is served the current config.
async fn still_serves(cluster: &kit::Cluster, after: &str) {
    let xds = cluster.replica(1).xds_addr();
    let rev = cluster.local_revision(1).await.unwrap();
    let mut c = sotw(&xds, first(req(CDS, &[], "", ""))).await.unwrap_or_else(|e| panic!("after {after}: a well-behaved stream refused: {e}"));
    let cds = c.recv().await;
    assert_eq!((kind_of(&cds.type_url), cds.version_info.clone()), (CDS, rev.to_string()), "after {after}");
}

fn frame_of(m: &impl Message) -> Vec<u8> {
    m.encode_to_vec()
}

async fn abuse(token: Option<&str>) {
    let who = if token.is_some() { "authenticated" } else { "unauthenticated" };
    let cluster = kit::Cluster::start(1, "").await;
    let r = cluster.replica(1);
    let (xds, pid) = (r.xds_addr(), r.pid().unwrap());
    let (status, body) = kit::apply(&cluster.http, &r.api(), vec![kit::vs("web", "default", "v1")]).await;
    assert_eq!(status, 200, "{body}");
    still_serves(&cluster, "start").await;
    let report = |what: &str| {
        let (rss, hwm) = kit::memory_kib(pid);
        println!("rss: client={who} after={what} rss_kib={rss} hwm_kib={hwm}");
    };
    report("start");
    // Without credentials everything is refused before a request is read.
    let refused = |s: &tonic::Status, want: tonic::Code, what: &str| {
        let want = if token.is_some() { want } else { tonic::Code::Unauthenticated };
        assert_eq!(s.code(), want, "{who} {what}: {s:?}");
    };

    // Garbage on the socket: not TLS, then TLS but not HTTP/2. The
    // connection is closed.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let garbage: Vec<u8> = (0..64 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut tcp = tokio::net::TcpStream::connect(&xds).await.unwrap();
    let _ = tcp.write_all(&garbage).await;
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(BOUND, tcp.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "a connection sending garbage instead of TLS is closed");
    let roots = lodestar::tls::roots_from_pem(&kit::test_ca().ca_file).unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(lodestar::tls::client_config(roots, None).unwrap()));
    let name = rustls::pki_types::ServerName::try_from(lodestar::tls::pki::member_name(1)).unwrap();
    let mut conn = tls.connect(name, tokio::net::TcpStream::connect(&xds).await.unwrap()).await.expect("TLS handshake");
    let _ = conn.write_all(&garbage).await;
    let mut sink = Vec::new();
    let closed = tokio::time::timeout(BOUND, conn.read_to_end(&mut sink)).await;
    assert!(closed.is_ok(), "a connection sending garbage instead of HTTP/2 is closed");
    // HTTP/2 and gRPC framing, garbage where the protobuf belongs.
    let s = raw_stream(&xds, token, vec![vec![0xff; 64]]).await;
    refused(&s, tonic::Code::InvalidArgument, "garbage request");
    report("garbage");
    still_serves(&cluster, "garbage").await;

    // A 100 MiB request: refused from its header, never buffered.
    let mut huge = first(req(CDS, &[], "", ""));
    huge.node.as_mut().unwrap().user_agent_name = "x".repeat(100 * 1024 * 1024);
    let s = raw_stream(&xds, token, vec![frame_of(&huge)]).await;
    drop(huge);
    refused(&s, tonic::Code::OutOfRange, "100 MiB request");
    if token.is_some() {
        assert!(s.message().contains("limit"), "{}", s.message());
    }
    report("100MiB");
    still_serves(&cluster, "a 100 MiB request").await;

    // A million names (one byte each: a 3 MB request, under the size
    // limit), first request and on an open stream.
    let mut many = first(req(EDS, &[], "", ""));
    many.resource_names = vec!["a".to_string(); 1_000_000];
    let s = raw_stream(&xds, token, vec![frame_of(&many)]).await;
    refused(&s, tonic::Code::ResourceExhausted, "a million names");
    if token.is_some() {
        assert!(s.message().contains("resource_names"), "{}", s.message());
        many.node = None;
        let s = raw_stream(&xds, token, vec![frame_of(&first(req(CDS, &[], "", ""))), frame_of(&many)]).await;
        assert_eq!(s.code(), tonic::Code::Ok, "the first request is served: {s:?}");
    }
    drop(many);
    // Delta subscriptions add up: 10,000 names, then 10,000 more, on one
    // stream (each request under the stream's subscription budget,
    // xds_max_subscription_bytes, the stream over it).
    if token.is_some() {
        let names = |from: usize| (from..from + 10_000).map(|i| format!("n{i}")).collect::<Vec<_>>();
        let mut first = DeltaDiscoveryRequest { type_url: EDS.type_url(), resource_names_subscribe: names(0), ..Default::default() };
        first.node = Some(node(NODE));
        let (tx, rx) = mpsc::channel(4);
        tx.send(first).await.unwrap();
        let mut rx = kit::ads_client(1, &xds).delta_aggregated_resources(ReceiverStream::new(rx)).await.expect("delta stream").into_inner();
        let more = DeltaDiscoveryRequest { type_url: EDS.type_url(), resource_names_subscribe: names(10_000), ..Default::default() };
        tx.send(more).await.unwrap();
        let end = loop {
            match tokio::time::timeout(BOUND, rx.message()).await.expect("the stream ends in time") {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("the stream ended OK, not over the limit"),
                Err(s) => break s,
            }
        };
        assert_eq!(end.code(), tonic::Code::ResourceExhausted, "{end:?}");
        assert!(end.message().contains("xds_max_subscription_bytes"), "{}", end.message());
    }
    report("million-names");
    still_serves(&cluster, "a million names").await;

    // 4,000 streams over 4 connections, as fast as they open (one
    // credential from one address: 1,000 are served, its quota). Each
    // response is dropped as soon as it comes; the request side stays open
    // until the flood is over, then ends, as a client that goes away.
    let channels: Vec<kit::AdsClient> = (0..4).map(|_| kit::ads_client_as(1, &xds, token)).collect();
    let (gone_tx, gone_rx) = tokio::sync::watch::channel(false);
    let opened = std::sync::atomic::AtomicUsize::new(0);
    futures::StreamExt::for_each_concurrent(futures::stream::iter(0..4000usize), 512, |i| {
        let mut ch = channels[i % channels.len()].clone();
        let (opened, mut gone) = (&opened, gone_rx.clone());
        async move {
            let hello = async_stream::stream! {
                yield first(req(CDS, &[], "", ""));
                let _ = gone.wait_for(|g| *g).await;
            };
            match tokio::time::timeout(BOUND, ch.stream_aggregated_resources(hello)).await.expect("an answer in time") {
                Ok(_) => {
                    opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // One credential from one address: its quota, then refused.
                Err(s) => refused(&s, tonic::Code::ResourceExhausted, "a stream flood"),
            }
        }
    })
    .await;
    let opened = opened.into_inner();
    if token.is_some() {
        assert_eq!(opened, 1000, "an authenticated client's streams are served up to its quota (xds_max_streams_per_credential)");
    } else {
        assert_eq!(opened, 0, "no stream opens without credentials");
    }
    report("stream-flood");
    gone_tx.send(true).unwrap();
    drop(channels);
    // Every dropped stream is gone from the replica.
    wait_syncz(&cluster.http, &r.api(), "no stream left", |s| s["proxies"].as_array().is_some_and(|p| p.is_empty())).await;
    report("stream-flood-closed");
    still_serves(&cluster, "4,000 streams").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_abuse_without_credentials_is_refused_and_the_replica_keeps_serving() {
    abuse(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xds_abuse_with_the_management_token_is_refused_and_the_replica_keeps_serving() {
    abuse(Some(kit::management_token())).await;
}

// ---------------------------------------------------------------------------
// Replica-wide limits and the stream log, against a replica process.

/// A metric's value in the replica's `/metrics` (0 if absent).
async fn metric(cluster: &kit::Cluster, series: &str) -> f64 {
    let text = cluster.http.get(format!("{}/metrics", cluster.replica(1).api())).send().await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// `xds_max_streams`: past it a stream is refused RESOURCE_EXHAUSTED
/// naming the setting, and counted; when one ends, another may open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_over_the_replica_limit_are_refused_until_one_ends() {
    let cluster = kit::Cluster::start(1, "xds_max_streams = 5").await;
    let xds = cluster.replica(1).xds_addr();
    let mut open = Vec::new();
    for _ in 0..5 {
        let mut c = sotw(&xds, first(req(CDS, &[], "", ""))).await.expect("a stream under the limit opens");
        c.recv().await;
        open.push(c);
    }
    let series = "lodestar_xds_streams_refused_total{reason=\"stream_limit\"}";
    let before = metric(&cluster, series).await;
    let Err(refused) = sotw(&xds, first(req(CDS, &[], "", ""))).await else { panic!("a sixth stream was served") };
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("xds_max_streams"), "{}", refused.message());
    assert_eq!(metric(&cluster, series).await, before + 1.0);
    // One ends (the client goes away): its place is free again once the
    // replica has seen it go.
    drop(open.pop());
    let mut again = None;
    for _ in 0..100 {
        match sotw(&xds, first(req(CDS, &[], "", ""))).await {
            Ok(c) => {
                again = Some(c);
                break;
            }
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::ResourceExhausted, "{s:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    again.expect("a stream opens once one has ended").recv().await;
}

/// A request body written as given, then held open until `release`.
struct HeldBody {
    chunks: std::collections::VecDeque<bytes::Bytes>,
    release: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
}

impl http_body::Body for HeldBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        if let Some(c) = self.chunks.pop_front() {
            return std::task::Poll::Ready(Some(Ok(http_body::Frame::data(c))));
        }
        std::future::Future::poll(self.release.as_mut(), cx).map(|()| None)
    }
}

/// Open a SotW stream with the management token whose request body is
/// `chunks` and then stays open until `release`: the grpc-status it ends
/// with (from its headers or trailers).
async fn held_stream(xds: String, chunks: Vec<Vec<u8>>, mut release: tokio::sync::watch::Receiver<bool>) -> tonic::Code {
    let mut ch = kit::grpc_channel(1, &xds);
    let release = Box::pin(async move {
        let _ = release.wait_for(|r| *r).await;
    });
    let body = HeldBody { chunks: chunks.into_iter().map(bytes::Bytes::from).collect(), release };
    let req = tonic::codegen::http::Request::builder()
        .method("POST")
        .uri(format!("http://{xds}/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {}", kit::management_token()))
        .body(tonic::body::Body::new(body))
        .unwrap();
    std::future::poll_fn(|cx| tonic::client::GrpcService::poll_ready(&mut ch, cx)).await.expect("channel ready");
    let resp = tonic::client::GrpcService::call(&mut ch, req).await.expect("an HTTP response");
    if let Some(s) = tonic::Status::from_header_map(resp.headers()) {
        return s.code();
    }
    let mut body = resp.into_body();
    loop {
        let frame = std::future::poll_fn(|cx| http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)).await;
        match frame {
            Some(Ok(f)) if f.is_trailers() => return tonic::Status::from_header_map(f.trailers_ref().unwrap()).map_or(tonic::Code::Ok, |s| s.code()),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return tonic::Code::Unknown,
        }
    }
}

/// `xds_max_buffered_request_bytes`: streams holding incomplete requests
/// share one budget. One stream holding most of it leaves too little for
/// a second, which ends RESOURCE_EXHAUSTED (counted); once the first ends
/// its bytes are free again and a large request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incomplete_requests_across_streams_share_one_budget() {
    const BUDGET: usize = 1024 * 1024;
    let cluster = kit::Cluster::start(1, &format!("xds_max_buffered_request_bytes = {BUDGET}")).await;
    let xds = cluster.replica(1).xds_addr();
    // 700 KB of a 900 KB request, then nothing more.
    let partial = || {
        let mut f = vec![0];
        f.extend(900_000u32.to_be_bytes());
        f.extend(vec![0u8; 700_000]);
        vec![f]
    };
    let (release, released) = tokio::sync::watch::channel(false);
    let holder = tokio::spawn(held_stream(xds.clone(), partial(), released));
    // Wait until the replica holds the first stream's bytes (its gauge):
    // a second stream's then cannot fit.
    let held = "lodestar_xds_request_buffer_bytes";
    kit::until("the replica holds the first stream's 700 KB", BOUND, || async { metric(&cluster, held).await >= 700_000.0 }).await;
    let series = "lodestar_xds_streams_refused_total{reason=\"request_buffer_full\"}";
    let (_keep, never) = tokio::sync::watch::channel(false);
    let second = tokio::time::timeout(BOUND, held_stream(xds.clone(), partial(), never)).await.expect("the second stream ends in time");
    assert_eq!(second, tonic::Code::ResourceExhausted, "a stream over the shared budget ends");
    assert!(metric(&cluster, series).await >= 1.0);
    // The holder ends its stream (inside a message): its bytes are freed,
    // and a 700 KB request (which would not fit beside them) is served.
    release.send(true).unwrap();
    let _ = tokio::time::timeout(BOUND, holder).await.expect("the holder's stream ends");
    kit::until("the ended streams' bytes are released", BOUND, || async { metric(&cluster, held).await == 0.0 }).await;
    let mut big = first(req(CDS, &[], "", ""));
    big.node.as_mut().unwrap().user_agent_name = "x".repeat(700_000);
    let mut served = sotw(&xds, big).await.expect("a large request is served once the budget is free");
    served.recv().await;
}

/// A burst of streams costs a bounded number of info lines: per-stream
/// lines up to `STREAM_LOG_LINES` per window, the rest summed up in one
/// line per window, and every stream is accounted for in one or the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_streams_yields_a_bounded_number_of_log_lines() {
    use lodestar::xds::server::{STREAM_LOG_LINES, STREAM_LOG_WINDOW};
    const STREAMS: usize = 300;
    let cluster = kit::Cluster::start(1, "").await;
    let started = Instant::now();
    let xds = cluster.replica(1).xds_addr();
    let client = channel(&xds).await;
    futures::StreamExt::for_each_concurrent(futures::stream::iter(0..STREAMS), 64, |_| {
        let mut client = client.clone();
        async move {
            let (tx, rx) = mpsc::channel(1);
            tx.send(first(req(CDS, &[], "", ""))).await.unwrap();
            let mut rx = client.stream_aggregated_resources(ReceiverStream::new(rx)).await.expect("a stream").into_inner();
            tokio::time::timeout(BOUND, rx.message()).await.expect("a response in time").expect("a response");
        }
    })
    .await;
    drop(client);
    // Lines are read without the terminal colours tracing may add.
    let strip = regex::Regex::new("\x1b\\[[0-9;]*m").unwrap();
    let count = |field: &str| regex::Regex::new(&format!(r"\b{field}=(\d+)")).unwrap();
    let (opened_re, closed_re) = (count("opened"), count("closed"));
    let deadline = Instant::now() + STREAM_LOG_WINDOW * 4;
    loop {
        let log = strip.replace_all(&cluster.replica(1).log(), "").into_owned();
        let per_stream = |what: &str| log.lines().filter(|l| l.contains(" INFO ") && l.contains(what)).count();
        let (opened_lines, closed_lines) = (per_stream("xDS stream opened"), per_stream("xDS stream closed"));
        let summaries: Vec<&str> = log.lines().filter(|l| l.contains(" INFO ") && l.contains("xDS streams in the last")).collect();
        let sum = |re: &regex::Regex| summaries.iter().filter_map(|l| re.captures(l)?.get(1)?.as_str().parse::<usize>().ok()).sum::<usize>();
        let (opened, closed) = (opened_lines + sum(&opened_re), closed_lines + sum(&closed_re));
        if opened == STREAMS && closed == STREAMS {
            // Per-stream lines share a budget per window: at most that many
            // in each window the run took, plus one summary per window.
            let windows = (started.elapsed().as_secs_f64() / STREAM_LOG_WINDOW.as_secs_f64()).ceil() as usize + 1;
            assert!(
                opened_lines + closed_lines <= STREAM_LOG_LINES as usize * windows,
                "{opened_lines} + {closed_lines} per-stream lines in {windows} windows"
            );
            assert!(summaries.len() <= windows, "{} summaries in {windows} windows", summaries.len());
            assert!(opened_lines + closed_lines + summaries.len() < STREAMS, "a burst of {STREAMS} streams took fewer lines than streams");
            return;
        }
        assert!(opened <= STREAMS && closed <= STREAMS, "streams counted twice: {opened} opened, {closed} closed");
        assert!(Instant::now() < deadline, "{opened} opened and {closed} closed of {STREAMS} accounted for in the log:\n{log}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
