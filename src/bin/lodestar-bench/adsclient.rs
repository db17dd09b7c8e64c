//! A simulated Envoy for benchmarks: one real ADS stream per proxy, state
//! of the world or delta, subscribing the way Envoy does.
//!
//! - Node id in Istio form, `sidecar~IP~bench-N.NS~NS.svc.cluster.local`,
//!   metadata `NAMESPACE=NS` (by default IP 127.0.0.1 and NS `default`).
//! - Wildcard CDS and LDS; then EDS for every EDS cluster received (by its
//!   `service_name`, else its name) and RDS for every route configuration
//!   the listeners name (HTTP connection managers with `rds`).
//! - Every response is ACKed at once, never NACKed; subscription changes
//!   follow the ACK that caused them.
//!
//! What a proxy keeps is only what measurements need, so that thousands
//! of them fit in one process: per type, responses and bytes received
//! (atomics the caller reads at any time); whether it has its initial
//! config (CDS, LDS, and every EDS and RDS resource they call for); its
//! EDS and RDS subscriptions; and, per EDS cluster, the endpoint
//! addresses it currently has. Each response is reported to an
//! [`Observer`] (ACK time, type, version, the resources' encoded bytes,
//! and for EDS which addresses each cluster gained and lost); observers
//! aggregate across proxies.
//!
//! Each proxy opens its own HTTP/2 connection, as Envoy does, unless its
//! spec carries a shared [`Channel`] ([`connect_all_shared`]: many
//! streams per connection, so that tens of thousands of streams need only
//! hundreds of sockets).

use anyhow::{anyhow, Context, Result};
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address::PortSpecifier, Node};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint::HostIdentifier, ClusterLoadAssignment};
use envoy_types::pb::envoy::config::listener::v3::{filter, Listener};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_connection_manager::RouteSpecifier, HttpConnectionManager};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use lodestar::xds::resources::ResourceType;
use prost::{Message, Name};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic::Streaming;

/// Opening a stream (connect, first request, the server's answer).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);
/// Large configs in one state-of-the-world response exceed tonic's 4 MiB default.
const MAX_MESSAGE: usize = 256 * 1024 * 1024;
/// How long `Proxy::stop` waits for the stream task.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The ADS variant a proxy speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// Incremental xDS (`DeltaAggregatedResources`).
    Delta,
    /// State of the world (`StreamAggregatedResources`).
    Sotw,
}

/// Which proxy, to which server, speaking what.
#[derive(Clone, Debug)]
pub struct ProxySpec {
    /// N in `bench-N`; also how observers tell proxies apart (0..count).
    pub index: usize,
    /// The replica's xDS address, HOST:PORT.
    pub xds: String,
    pub protocol: Protocol,
    /// The proxy's namespace (which Sidecar applies to it).
    pub namespace: String,
    /// The proxy's address (node id), where its listeners would bind.
    pub ip: Ipv4Addr,
    /// A connection to `xds` shared with other proxies; None: its own.
    pub channel: Option<Channel>,
}

impl ProxySpec {
    /// Proxy `index` in namespace `default` at 127.0.0.1, on its own connection.
    pub fn new(index: usize, xds: String, protocol: Protocol) -> ProxySpec {
        ProxySpec { index, xds, protocol, namespace: "default".into(), ip: Ipv4Addr::LOCALHOST, channel: None }
    }

    pub fn node_id(&self) -> String {
        format!("sidecar~{}~bench-{}.{ns}~{ns}.svc.cluster.local", self.ip, self.index, ns = self.namespace)
    }

    fn node(&self) -> Node {
        let namespace = PbValue { kind: Some(Kind::StringValue(self.namespace.clone())) };
        Node { id: self.node_id(), metadata: Some(Struct { fields: [("NAMESPACE".to_string(), namespace)].into() }), ..Default::default() }
    }
}

/// Endpoint addresses of one cluster, sorted and unique.
pub type Addrs = Vec<SocketAddr>;

/// What one response (or, for a dropped cluster, a CDS response) changed
/// in one cluster's endpoints, as this proxy sees them.
#[derive(Debug, Clone)]
pub struct EndpointChange {
    pub cluster: String,
    pub added: Addrs,
    pub removed: Addrs,
}

/// One response, received and ACKed.
pub struct Update<'a> {
    pub proxy: usize,
    pub kind: ResourceType,
    /// When its ACK, and the subscription changes it caused, were handed
    /// to the request stream.
    pub acked: Instant,
    /// `version_info` (SotW) or `system_version_info` (delta).
    pub version: &'a str,
    /// The encoded (protobuf) bytes of each resource the response carries.
    pub resources: &'a [&'a [u8]],
    /// Endpoint changes: EDS responses, and CDS responses that dropped an
    /// EDS cluster (its endpoints are gone with it).
    pub endpoints: &'a [EndpointChange],
}

/// Receives every proxy's updates, from the proxies' tasks: keep it quick.
pub trait Observer: Send + Sync + 'static {
    fn update(&self, u: &Update<'_>);
}

/// Responses and bytes received, per type (index: `ResourceType as usize`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub responses: [u64; 4],
    pub bytes: [u64; 4],
}

impl Counts {
    pub fn of(&self, t: ResourceType) -> (u64, u64) {
        (self.responses[t as usize], self.bytes[t as usize])
    }

    /// What was received since `earlier`.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut d = Counts::default();
        for i in 0..4 {
            d.responses[i] = self.responses[i].saturating_sub(earlier.responses[i]);
            d.bytes[i] = self.bytes[i].saturating_sub(earlier.bytes[i]);
        }
        d
    }

    pub fn add(&mut self, other: &Counts) {
        for i in 0..4 {
            self.responses[i] += other.responses[i];
            self.bytes[i] += other.bytes[i];
        }
    }
}

/// What a proxy's task shares with its owner.
#[derive(Default)]
struct Shared {
    responses: [AtomicU64; 4],
    bytes: [AtomicU64; 4],
    /// Set once the proxy has its initial config: CDS and LDS, and every
    /// EDS and RDS resource they call for (see `View::complete`).
    synced: AtomicBool,
    /// Why the stream ended, if it ended by itself.
    error: Mutex<Option<String>>,
    /// When `synced` was set.
    synced_at: std::sync::OnceLock<Instant>,
    /// Notified once when the stream ends by itself, and once when the
    /// proxy has its initial config (one waiter each: [`Proxy::ended`],
    /// [`Proxy::synced_at`]).
    ended: Notify,
    synced_note: Notify,
}

/// A connected proxy. Its stream runs in its own task until `stop`.
pub struct Proxy {
    pub index: usize,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<BTreeMap<String, Addrs>>,
}

/// A stopped proxy: its final endpoints (EDS cluster → addresses).
#[derive(Debug, Clone)]
pub struct Final {
    pub index: usize,
    pub endpoints: BTreeMap<String, Addrs>,
    /// Set when the stream had ended (server gone, stream error) or the
    /// task could not be stopped cleanly.
    pub error: Option<String>,
}

impl Proxy {
    /// Connect to `spec.xds`, open the stream and send the initial wildcard
    /// CDS and LDS requests; the stream then runs in its own task.
    pub async fn connect(spec: ProxySpec, observer: Arc<dyn Observer>) -> Result<Proxy> {
        let what = || format!("proxy bench-{} to xDS {}", spec.index, spec.xds);
        tokio::time::timeout(OPEN_TIMEOUT, Self::open(spec.clone(), observer))
            .await
            .map_err(|_| anyhow!("no answer within {OPEN_TIMEOUT:?}"))
            .with_context(what)?
            .with_context(what)
    }

    async fn open(spec: ProxySpec, observer: Arc<dyn Observer>) -> Result<Proxy> {
        let channel = match spec.channel.clone() {
            Some(c) => c,
            None => connect_channel(&spec.xds).await?,
        };
        let mut client = AggregatedDiscoveryServiceClient::with_interceptor(channel, crate::bearer()?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let shared = Arc::new(Shared::default());
        let (stop, stopped) = oneshot::channel();
        let index = spec.index;
        let task = match spec.protocol {
            Protocol::Sotw => {
                let (tx, rx) = mpsc::unbounded_channel();
                let mut first = sotw_request(ResourceType::Cluster, Vec::new(), "", "");
                first.node = Some(spec.node());
                // The server reads the first request before it answers the call.
                tx.send(Box::new(first)).map_err(|_| anyhow!("request stream closed"))?;
                tx.send(Box::new(sotw_request(ResourceType::Listener, Vec::new(), "", ""))).map_err(|_| anyhow!("request stream closed"))?;
                let inbound = client.stream_aggregated_resources(UnboundedReceiverStream::new(rx).map(|r| *r)).await?.into_inner();
                let state = State::new(index, observer, shared.clone(), Sotw { tx, last: Default::default() });
                tokio::spawn(state.run(inbound, stopped))
            }
            Protocol::Delta => {
                let (tx, rx) = mpsc::unbounded_channel();
                let mut first = DeltaDiscoveryRequest { type_url: ResourceType::Cluster.type_url(), ..Default::default() };
                first.node = Some(spec.node());
                tx.send(Box::new(first)).map_err(|_| anyhow!("request stream closed"))?;
                tx.send(Box::new(DeltaDiscoveryRequest { type_url: ResourceType::Listener.type_url(), ..Default::default() }))
                    .map_err(|_| anyhow!("request stream closed"))?;
                let inbound = client.delta_aggregated_resources(UnboundedReceiverStream::new(rx).map(|r| *r)).await?.into_inner();
                let state = State::new(index, observer, shared.clone(), Delta { tx });
                tokio::spawn(state.run(inbound, stopped))
            }
        };
        Ok(Proxy { index, shared, stop: Some(stop), task })
    }

    /// Responses and bytes received so far, per type.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for i in 0..4 {
            c.responses[i] = self.shared.responses[i].load(Ordering::Relaxed);
            c.bytes[i] = self.shared.bytes[i].load(Ordering::Relaxed);
        }
        c
    }

    /// Whether the proxy has its initial config (CDS, LDS, and every EDS
    /// and RDS resource they call for, each received and ACKed).
    pub fn synced(&self) -> bool {
        self.shared.synced.load(Ordering::Relaxed)
    }

    /// Why the stream ended, if it did by itself.
    pub fn error(&self) -> Option<String> {
        self.shared.error.lock().unwrap().clone()
    }

    /// Returns once the stream has ended by itself (server gone, stream
    /// error); never if it does not. One caller at a time.
    pub async fn ended(&self) {
        if self.error().is_none() {
            self.shared.ended.notified().await;
        }
    }

    /// When the proxy had its initial config (the ACK that completed it),
    /// waiting for it; never returns if it does not get it. One caller at
    /// a time.
    pub async fn synced_at(&self) -> Instant {
        loop {
            if let Some(t) = self.shared.synced_at.get() {
                return *t;
            }
            self.shared.synced_note.notified().await;
        }
    }

    /// Close the stream; the proxy's final state.
    pub async fn stop(mut self) -> Final {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let (endpoints, stop_error) = match tokio::time::timeout(STOP_TIMEOUT, &mut self.task).await {
            Ok(Ok(endpoints)) => (endpoints, None),
            Ok(Err(e)) => (BTreeMap::new(), Some(format!("the stream task failed: {e}"))),
            Err(_) => {
                self.task.abort();
                (BTreeMap::new(), Some(format!("the stream task did not stop within {STOP_TIMEOUT:?}")))
            }
        };
        Final { index: self.index, endpoints, error: self.error().or(stop_error) }
    }
}

/// One HTTP/2 connection to an xDS address, HOST:PORT or a URL.
pub async fn connect_channel(xds: &str) -> Result<Channel> {
    crate::grpc(xds, OPEN_TIMEOUT).await
}

/// Connect `specs`, each proxy on its own connection, at most `parallel`
/// connection attempts at a time; fails on the first proxy that cannot
/// connect.
pub async fn connect_all(specs: Vec<ProxySpec>, observer: Arc<dyn Observer>, parallel: usize) -> Result<Vec<Proxy>> {
    connect_all_shared(specs, observer, parallel, 1).await
}

/// Like [`connect_all`], with up to `per_connection` streams on each HTTP/2
/// connection: specs without a channel are grouped by xDS address, in
/// order, and each group of `per_connection` shares one (opened first).
pub async fn connect_all_shared(mut specs: Vec<ProxySpec>, observer: Arc<dyn Observer>, parallel: usize, per_connection: usize) -> Result<Vec<Proxy>> {
    if per_connection > 1 {
        // Which specs share a connection: (address, group) → spec indexes.
        let mut filled: HashMap<String, (usize, usize)> = HashMap::new();
        let mut groups: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, spec) in specs.iter().enumerate().filter(|(_, s)| s.channel.is_none()) {
            let slot = filled.entry(spec.xds.clone()).or_insert((usize::MAX, per_connection));
            if slot.1 == per_connection {
                *slot = (groups.len(), 0);
                groups.push((spec.xds.clone(), Vec::new()));
            }
            slot.1 += 1;
            groups[slot.0].1.push(i);
        }
        let gate = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
        let opened = futures::future::join_all(groups.iter().map(|(xds, _)| {
            let gate = gate.clone();
            async move {
                let _permit = gate.acquire_owned().await?;
                tokio::time::timeout(OPEN_TIMEOUT, connect_channel(xds))
                    .await
                    .map_err(|_| anyhow!("no connection within {OPEN_TIMEOUT:?}"))
                    .and_then(|r| r)
                    .with_context(|| format!("connecting to xDS {xds}"))
            }
        }))
        .await;
        for ((_, members), channel) in groups.iter().zip(opened) {
            let channel = channel?;
            for &i in members {
                specs[i].channel = Some(channel.clone());
            }
        }
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(parallel.max(1)));
    let tasks: Vec<_> = specs
        .into_iter()
        .map(|spec| {
            let (gate, observer) = (gate.clone(), observer.clone());
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await?;
                Proxy::connect(spec, observer).await
            })
        })
        .collect();
    let mut proxies = Vec::with_capacity(tasks.len());
    let mut first_error = None;
    for t in tasks {
        match t.await.map_err(anyhow::Error::from).and_then(|r| r) {
            Ok(p) => proxies.push(p),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        None => Ok(proxies),
        Some(e) => {
            for p in proxies {
                p.stop().await;
            }
            Err(e)
        }
    }
}

// ---------------------------------------------------------------------------
// The stream task.

/// A protocol variant: how responses are read and requests written.
trait Variant: Send + 'static {
    type Resp: Message + Send + 'static;
    /// Decode one response into the proxy's state, send its ACK and the
    /// subscription changes it causes. Returns the response's version.
    fn on_response(&mut self, state: &mut View, resp: &Self::Resp, changes: &mut Vec<EndpointChange>) -> Option<(ResourceType, String)>;
    /// The encoded bytes of each resource a response carries.
    fn resources(resp: &Self::Resp) -> Vec<&[u8]>;
}

/// The `name` (field 1) of a route configuration, without decoding the rest.
#[derive(Clone, PartialEq, prost::Message)]
struct NameOnly {
    #[prost(string, tag = "1")]
    name: String,
}

struct State<V: Variant> {
    index: usize,
    observer: Arc<dyn Observer>,
    shared: Arc<Shared>,
    view: View,
    variant: V,
}

/// What the proxy has: subscriptions and endpoints.
#[derive(Default)]
struct View {
    /// EDS cluster name → the name its endpoints are requested by.
    eds_clusters: BTreeMap<String, String>,
    eds_names: BTreeSet<String>,
    /// Listener → the route configurations it names.
    listeners: BTreeMap<String, Vec<String>>,
    rds_names: BTreeSet<String>,
    endpoints: BTreeMap<String, Addrs>,
    /// Route configurations received at least once.
    routes_seen: BTreeSet<String>,
    /// Types received at least once.
    seen: [bool; 4],
}

impl<V: Variant> State<V> {
    fn new(index: usize, observer: Arc<dyn Observer>, shared: Arc<Shared>, variant: V) -> State<V> {
        State { index, observer, shared, view: View::default(), variant }
    }

    async fn run(mut self, mut inbound: Streaming<V::Resp>, mut stop: oneshot::Receiver<()>) -> BTreeMap<String, Addrs> {
        let mut changes = Vec::new();
        loop {
            let msg = tokio::select! {
                biased;
                _ = &mut stop => break,
                m = inbound.message() => m,
            };
            let resp = match msg {
                Ok(Some(r)) => r,
                Ok(None) => {
                    *self.shared.error.lock().unwrap() = Some("the server ended the stream".into());
                    self.shared.ended.notify_one();
                    break;
                }
                Err(status) => {
                    *self.shared.error.lock().unwrap() = Some(format!("stream error: {}: {}", status.code(), status.message()));
                    self.shared.ended.notify_one();
                    break;
                }
            };
            let bytes = resp.encoded_len();
            changes.clear();
            let Some((kind, version)) = self.variant.on_response(&mut self.view, &resp, &mut changes) else { continue };
            let acked = Instant::now();
            self.view.seen[kind as usize] = true;
            if !self.shared.synced.load(Ordering::Relaxed) && self.view.complete() {
                let _ = self.shared.synced_at.set(acked);
                self.shared.synced.store(true, Ordering::Relaxed);
                self.shared.synced_note.notify_one();
            }
            self.shared.responses[kind as usize].fetch_add(1, Ordering::Relaxed);
            self.shared.bytes[kind as usize].fetch_add(bytes as u64, Ordering::Relaxed);
            let resources = V::resources(&resp);
            self.observer.update(&Update { proxy: self.index, kind, acked, version: &version, resources: &resources, endpoints: &changes });
        }
        self.view.endpoints
    }
}

impl View {
    /// Whether the proxy has its initial config: clusters and listeners,
    /// an assignment for every EDS name and every route configuration the
    /// listeners name.
    fn complete(&self) -> bool {
        self.seen[ResourceType::Cluster as usize]
            && self.seen[ResourceType::Listener as usize]
            && self.eds_names.iter().all(|n| self.endpoints.contains_key(n))
            && self.rds_names.iter().all(|n| self.routes_seen.contains(n))
    }

    /// Set (or, with None, drop) one cluster's endpoints; record what changed.
    fn set_endpoints(&mut self, cluster: &str, addrs: Option<Addrs>, changes: &mut Vec<EndpointChange>) {
        let old = match addrs {
            Some(a) => match self.endpoints.get_mut(cluster) {
                Some(slot) => std::mem::replace(slot, a),
                None => {
                    self.endpoints.insert(cluster.to_string(), a);
                    Vec::new()
                }
            },
            None => self.endpoints.remove(cluster).unwrap_or_default(),
        };
        let new = self.endpoints.get(cluster).map_or(&[][..], |v| v.as_slice());
        let (added, removed) = diff_sorted(&old, new);
        if !added.is_empty() || !removed.is_empty() {
            changes.push(EndpointChange { cluster: cluster.to_string(), added, removed });
        }
    }

    /// The EDS names the clusters call for now; drops the endpoints of
    /// names no longer wanted. Returns (subscribe, unsubscribe) if changed.
    fn update_eds_names(&mut self, changes: &mut Vec<EndpointChange>) -> Option<(Vec<String>, Vec<String>)> {
        let wanted: BTreeSet<String> = self.eds_clusters.values().cloned().collect();
        if wanted == self.eds_names {
            return None;
        }
        let subscribe: Vec<String> = wanted.difference(&self.eds_names).cloned().collect();
        let unsubscribe: Vec<String> = self.eds_names.difference(&wanted).cloned().collect();
        for name in &unsubscribe {
            self.set_endpoints(name, None, changes);
        }
        self.eds_names = wanted;
        Some((subscribe, unsubscribe))
    }

    fn update_rds_names(&mut self) -> Option<(Vec<String>, Vec<String>)> {
        let wanted: BTreeSet<String> = self.listeners.values().flatten().cloned().collect();
        if wanted == self.rds_names {
            return None;
        }
        let subscribe = wanted.difference(&self.rds_names).cloned().collect();
        let unsubscribe = self.rds_names.difference(&wanted).cloned().collect();
        self.rds_names = wanted;
        Some((subscribe, unsubscribe))
    }
}

/// (in `new` only, in `old` only), both sorted.
fn diff_sorted(old: &[SocketAddr], new: &[SocketAddr]) -> (Addrs, Addrs) {
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(a), Some(b)) if a == b => {
                i += 1;
                j += 1;
            }
            (Some(a), Some(b)) if a < b => {
                removed.push(*a);
                i += 1;
            }
            (Some(a), None) => {
                removed.push(*a);
                i += 1;
            }
            (_, Some(b)) => {
                added.push(*b);
                j += 1;
            }
            (None, None) => unreachable!(),
        }
    }
    (added, removed)
}

/// The name an EDS cluster's endpoints are requested by; None for other clusters.
fn eds_name(c: &Cluster) -> Option<String> {
    if c.cluster_discovery_type != Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)) {
        return None;
    }
    let service = c.eds_cluster_config.as_ref().map_or("", |e| e.service_name.as_str());
    Some(if service.is_empty() { c.name.clone() } else { service.to_string() })
}

/// Every endpoint address of a load assignment, sorted and unique.
fn addresses(cla: &ClusterLoadAssignment) -> Addrs {
    let mut out: Addrs = cla
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(ep)) => match ep.address.as_ref()?.address.as_ref()? {
                address::Address::SocketAddress(sa) => {
                    let ip: IpAddr = sa.address.parse().ok()?;
                    let port = match sa.port_specifier {
                        Some(PortSpecifier::PortValue(p)) => u16::try_from(p).ok()?,
                        _ => 0,
                    };
                    Some(SocketAddr::new(ip, port))
                }
                _ => None,
            },
            _ => None,
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// The route configurations a listener's HTTP connection managers fetch by RDS.
fn route_names(l: &Listener) -> Vec<String> {
    let chains = l.filter_chains.iter().chain(l.default_filter_chain.as_ref());
    let mut names: Vec<String> = chains
        .flat_map(|c| &c.filters)
        .filter_map(|f| match &f.config_type {
            Some(filter::ConfigType::TypedConfig(any)) if any.type_url == HttpConnectionManager::type_url() => {
                match HttpConnectionManager::decode(any.value.as_slice()).ok()?.route_specifier? {
                    RouteSpecifier::Rds(rds) => Some(rds.route_config_name),
                    _ => None,
                }
            }
            _ => None,
        })
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

// ---------------------------------------------------------------------------
// State of the world.

struct Sotw {
    /// Boxed: the channel allocates its slots in blocks of 32, and a
    /// request is ~600 bytes, which per proxy would be ~20 KiB.
    tx: mpsc::UnboundedSender<Box<DiscoveryRequest>>,
    /// Per type: the latest (version_info, nonce) received.
    last: [(String, String); 4],
}

fn sotw_request(t: ResourceType, names: Vec<String>, version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest { type_url: t.type_url(), resource_names: names, version_info: version.into(), response_nonce: nonce.into(), ..Default::default() }
}

impl Sotw {
    fn send(&self, r: DiscoveryRequest) {
        // A closed request stream shows as the response stream ending.
        let _ = self.tx.send(Box::new(r));
    }

    /// The full name list a request of type `t` carries.
    fn names(view: &View, t: ResourceType) -> Vec<String> {
        match t {
            ResourceType::Endpoint => view.eds_names.iter().cloned().collect(),
            ResourceType::Route => view.rds_names.iter().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

impl Variant for Sotw {
    type Resp = DiscoveryResponse;

    fn on_response(&mut self, view: &mut View, r: &DiscoveryResponse, changes: &mut Vec<EndpointChange>) -> Option<(ResourceType, String)> {
        let t = ResourceType::from_type_url(&r.type_url)?;
        match t {
            // The load generator asks for no secrets (nor name tables, ECDS).
            ResourceType::Secret | ResourceType::NameTable | ResourceType::ExtensionConfig => {}
            // Every cluster, every time: absence means removal.
            ResourceType::Cluster => {
                view.eds_clusters =
                    r.resources.iter().filter_map(|a| Cluster::decode(a.value.as_slice()).ok()).filter_map(|c| eds_name(&c).map(|n| (c.name, n))).collect();
            }
            // Incremental even in SotW (as Envoy treats it): a name left
            // out is unchanged; assignments go when CDS drops their cluster.
            ResourceType::Endpoint => {
                for a in &r.resources {
                    let Ok(cla) = ClusterLoadAssignment::decode(a.value.as_slice()) else { continue };
                    view.set_endpoints(&cla.cluster_name, Some(addresses(&cla)), changes);
                }
            }
            ResourceType::Listener => {
                view.listeners =
                    r.resources.iter().filter_map(|a| Listener::decode(a.value.as_slice()).ok()).map(|l| (l.name.clone(), route_names(&l))).collect();
            }
            ResourceType::Route => {
                for a in &r.resources {
                    if let Ok(n) = NameOnly::decode(a.value.as_slice()) {
                        view.routes_seen.insert(n.name);
                    }
                }
            }
        }
        self.last[t as usize] = (r.version_info.clone(), r.nonce.clone());
        self.send(sotw_request(t, Self::names(view, t), &r.version_info, &r.nonce));
        // A subscription change is a request with the latest nonce of its
        // type (an ACK of that response with the new names), as Envoy does.
        let follow = match t {
            ResourceType::Cluster => view.update_eds_names(changes).map(|_| ResourceType::Endpoint),
            ResourceType::Listener => view.update_rds_names().map(|_| ResourceType::Route),
            _ => None,
        };
        if let Some(f) = follow {
            let (version, nonce) = &self.last[f as usize];
            self.send(sotw_request(f, Self::names(view, f), version, nonce));
        }
        Some((t, r.version_info.clone()))
    }

    fn resources(r: &DiscoveryResponse) -> Vec<&[u8]> {
        r.resources.iter().map(|a| a.value.as_slice()).collect()
    }
}

// ---------------------------------------------------------------------------
// Delta.

struct Delta {
    /// Boxed, as for `Sotw`.
    tx: mpsc::UnboundedSender<Box<DeltaDiscoveryRequest>>,
}

/// A delta resource's encoded bytes (empty when it carries none).
fn value(res: &Resource) -> &[u8] {
    res.resource.as_ref().map_or(&[][..], |a| a.value.as_slice())
}

impl Variant for Delta {
    type Resp = DeltaDiscoveryResponse;

    fn on_response(&mut self, view: &mut View, r: &DeltaDiscoveryResponse, changes: &mut Vec<EndpointChange>) -> Option<(ResourceType, String)> {
        let t = ResourceType::from_type_url(&r.type_url)?;
        match t {
            // The load generator asks for no secrets (nor name tables, ECDS).
            ResourceType::Secret | ResourceType::NameTable | ResourceType::ExtensionConfig => {}
            ResourceType::Cluster => {
                for res in &r.resources {
                    match Cluster::decode(value(res)).ok().as_ref().and_then(eds_name) {
                        Some(n) => view.eds_clusters.insert(res.name.clone(), n),
                        None => view.eds_clusters.remove(&res.name),
                    };
                }
                for name in &r.removed_resources {
                    view.eds_clusters.remove(name);
                }
            }
            ResourceType::Endpoint => {
                for res in &r.resources {
                    let addrs = ClusterLoadAssignment::decode(value(res)).map(|c| addresses(&c)).unwrap_or_default();
                    view.set_endpoints(&res.name, Some(addrs), changes);
                }
                for name in &r.removed_resources {
                    view.set_endpoints(name, None, changes);
                }
            }
            ResourceType::Listener => {
                for res in &r.resources {
                    let routes = Listener::decode(value(res)).map(|l| route_names(&l)).unwrap_or_default();
                    view.listeners.insert(res.name.clone(), routes);
                }
                for name in &r.removed_resources {
                    view.listeners.remove(name);
                }
            }
            ResourceType::Route => {
                for res in &r.resources {
                    view.routes_seen.insert(res.name.clone());
                }
            }
        }
        let _ = self.tx.send(Box::new(DeltaDiscoveryRequest { type_url: r.type_url.clone(), response_nonce: r.nonce.clone(), ..Default::default() }));
        let follow = match t {
            ResourceType::Cluster => view.update_eds_names(changes).map(|s| (ResourceType::Endpoint, s)),
            ResourceType::Listener => view.update_rds_names().map(|s| (ResourceType::Route, s)),
            _ => None,
        };
        if let Some((f, (subscribe, unsubscribe))) = follow {
            let _ = self.tx.send(Box::new(DeltaDiscoveryRequest {
                type_url: f.type_url(),
                resource_names_subscribe: subscribe,
                resource_names_unsubscribe: unsubscribe,
                ..Default::default()
            }));
        }
        Some((t, r.system_version_info.clone()))
    }

    fn resources(r: &DeltaDiscoveryResponse) -> Vec<&[u8]> {
        r.resources.iter().map(value).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn sorted_diff() {
        let old = vec![a("127.0.0.1:1"), a("127.0.0.2:1"), a("127.0.0.4:1")];
        let new = vec![a("127.0.0.2:1"), a("127.0.0.3:1"), a("127.0.0.5:1")];
        let (added, removed) = diff_sorted(&old, &new);
        assert_eq!(added, vec![a("127.0.0.3:1"), a("127.0.0.5:1")]);
        assert_eq!(removed, vec![a("127.0.0.1:1"), a("127.0.0.4:1")]);
        assert_eq!(diff_sorted(&[], &[]), (vec![], vec![]));
    }

    #[test]
    fn endpoint_changes_and_subscriptions() {
        let mut v = View::default();
        let mut ch = Vec::new();
        v.set_endpoints("c", Some(vec![a("127.0.0.1:80")]), &mut ch);
        v.set_endpoints("c", Some(vec![a("127.0.0.1:80")]), &mut ch);
        assert_eq!(ch.len(), 1, "an unchanged assignment is no change");
        v.eds_clusters.insert("c".into(), "c".into());
        assert_eq!(v.update_eds_names(&mut ch), Some((vec!["c".to_string()], vec![])));
        assert_eq!(v.update_eds_names(&mut ch), None);
        v.eds_clusters.clear();
        ch.clear();
        assert_eq!(v.update_eds_names(&mut ch), Some((vec![], vec!["c".to_string()])));
        assert_eq!((ch[0].removed.clone(), v.endpoints.len()), (vec![a("127.0.0.1:80")], 0), "a dropped cluster's endpoints are gone");
    }
}
