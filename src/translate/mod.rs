//! Translation: a pure function from one mesh snapshot and one proxy to that
//! proxy's Envoy resources (clusters, endpoints, listeners, routes). Golden
//! tested in `tests/e2e/translate.rs`; deterministic (BTreeMaps throughout), so
//! the same snapshot always gives the same bytes and versions. Its input is
//! a `state::State` (no raft log id). A crate of its own: no tokio, tonic,
//! axum, sled or openraft in its dependency tree, and no xDS server: `xds`
//! imports it.
//!
//! - `mesh`: the index translation reads (services, instances, rules by
//!   host), built from one state; `mesh::hosts`: hostname ownership.
//! - `resources`: what translation produces (`ProxyConfig`, `XdsResource`,
//!   `ResourceType`) and the `Generator` trait.
//! - `json`: proto-JSON rendering of resources (debug output, golden files).
//! - `effect`: how a change alters one proxy's config (dry-run previews).
//! - `explain`: Envoy's RBAC evaluation replayed over a served config.
//! - `intern`, `encode`, `util`: shared output, deterministic encoding,
//!   small conversions (and the TLS transport socket).
//! - `scope`: Sidecar selection, visibility, the egress listener plan.
//! - `route`: VirtualService → routes.
//! - `cluster`: services + DestinationRules → clusters and endpoints.
//! - `listener`: HTTP/TCP listeners.
//! - `authz`: AuthorizationPolicy → RBAC filters on inbound and gateway listeners.
//! - `extauthz`: CUSTOM AuthorizationPolicies → ext_authz behind shadow RBAC.
//! - `telemetry`: Telemetry access logging and tracing → `access_log` and
//!   `tracing` of every listener's connection managers.
//! - `l4`: VirtualService `tls` and `tcp` routes → SNI/address filter chains.
//! - `inbound`: Sidecar ingress → inbound listeners and clusters.
//! - `gateway`: Gateway servers → gateway listeners and route tables.
//! - `gateway_api`: Gateway API kinds → Istio Gateways and VirtualServices, and their status.
//! - `backend_tls`: BackendTLSPolicies → DestinationRules originating TLS, and their status.
//! - `grpc`: proxyless gRPC clients → API listeners, routes, clusters.
//! - `tls`: TLS contexts (gateway termination, DestinationRule origination).
//! - `mtls`: mutual TLS between Envoys (PeerAuthentication, ISTIO_MUTUAL,
//!   auto-mTLS) with the workload certificates over SDS.
//! - `jwt`: RequestAuthentication → `jwt_authn` on inbound and gateway listeners.
//! - `envoyfilter`: EnvoyFilter patches, applied to a proxy's translated
//!   config as the last step.
//! - `capture`: captured proxies (`INTERCEPTION_MODE: REDIRECT`) →
//!   `virtualOutbound`/`virtualInbound` and unbound per-port listeners.

pub mod authz;
pub mod backend_tls;
pub mod capture;
pub mod cluster;
pub mod dns;
pub mod effect;
pub mod encode;
pub mod envoyfilter;
pub mod explain;
pub mod extauthz;
pub mod gateway;
pub mod gateway_api;
pub mod grpc;
pub mod inbound;
pub mod intern;
pub mod json;
pub mod jwt;
pub mod l4;
pub mod listener;
pub mod mesh;
pub mod mtls;
pub mod resources;
pub mod route;
pub mod scope;
pub mod telemetry;
pub mod tls;
pub mod util;

// The crates below under the names the sources use (`crate::model::Kind`).
use lodestar_model as model;
use lodestar_state as state;

use crate::mesh::{Config, Mesh, MeshConfig, Service};
use crate::model::istio::{resolve_short_name, DestinationRule};
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use crate::resources::{Generator, ProxyConfig, ResourceType, XdsResource};
use crate::state::Objects;
use crate::state::State;
pub use cluster::outbound_cluster_name;
use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, Cluster};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use listener::Routes;
use route::RouteCtx;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// The DestinationRule for a service, as a proxy in `proxy_ns` sees it:
/// Istio looks in the proxy's namespace, then the service's, then the root
/// namespace's (mesh-wide rules), and nowhere else (so a rule in a third
/// namespace never changes how others reach a service); an exact host beats
/// a wildcard.
pub fn destination_rule_for<'a>(mesh: &'a Mesh, proxy_ns: &str, svc: &Service) -> Option<&'a Arc<Config<DestinationRule>>> {
    let suffix = &mesh.config.domain_suffix;
    let candidates: Vec<&'a Arc<Config<DestinationRule>>> = mesh
        .destination_rules_for_host(&svc.hostname)
        .into_iter()
        .filter(|dr| crate::mesh::exported_to(&dr.spec.export_to, &dr.key.namespace, proxy_ns))
        .collect();
    let exact = |dr: &&Arc<Config<DestinationRule>>| resolve_short_name(&dr.spec.host, &dr.key.namespace, suffix) == svc.hostname;
    for ns_pref in [proxy_ns, svc.namespace.as_str(), mesh.config.root_namespace.as_str()] {
        let in_ns: Vec<&'a Arc<Config<DestinationRule>>> = candidates.iter().copied().filter(|dr| dr.key.namespace == ns_pref).collect();
        if let Some(dr) = in_ns.iter().copied().find(|d| exact(d)).or(in_ns.first().copied()) {
            return Some(dr);
        }
    }
    None
}

/// Clusters and load assignments depend only on the service, the port,
/// the subset, the DestinationRule that applies, whether the proxy is a
/// gateway (a rule's `credentialName`), and (mutual TLS) whether
/// the proxy has a workload certificate and the PeerAuthentications
/// (`UpstreamMtls::fingerprint`): shared by every proxy
/// that gets the same ones (translate once per distinct input). Keyed by
/// the identity of the service and rule objects, which a new mesh shares
/// when they did not change; entries hold them, so an identity is never
/// reused while its entry lives, and `prune` drops entries no mesh uses.
#[derive(Default)]
pub struct ClusterCache {
    map: Mutex<std::collections::HashMap<ClusterKey, CachedCluster>>,
}

/// Service and rule identities, port, subset, `UpstreamMtls::fingerprint`,
/// whether the proxy is a gateway (`credentialName` applies), whether it
/// captures (`resolution: NONE` gets a cluster).
type ClusterKey = (usize, usize, u32, String, u64, bool, bool);

struct CachedCluster {
    svc: Arc<Service>,
    _dr: Option<Arc<Config<DestinationRule>>>,
    cluster: Option<Arc<XdsResource>>,
    eds: Option<Arc<XdsResource>>,
}

impl ClusterCache {
    /// Drop entries for services no longer referenced outside the cache.
    pub fn prune(&self) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, e| Arc::strong_count(&e.svc) > 1);
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Clusters and endpoints for every port of every service in `services`.
fn add_service_clusters(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, services: &BTreeMap<String, Arc<Service>>, cache: Option<&ClusterCache>) {
    let up = mtls::UpstreamMtls { mesh, client_sds: proxy.sds, gateway: proxy.kind == ProxyKind::Router, capture: proxy.capture };
    let fingerprint = up.fingerprint();
    for svc in services.values() {
        let dr_config = destination_rule_for(mesh, &proxy.namespace, svc);
        let dr = dr_config.map(|d| &d.spec);
        let mut subsets: Vec<Option<&str>> = vec![None];
        if let Some(dr) = dr {
            subsets.extend(dr.subsets.iter().map(|s| Some(s.name.as_str())));
        }
        for port in &svc.ports {
            for subset in &subsets {
                let build = || {
                    let c = cluster::cluster(svc, port, *subset, dr, &up);
                    let auto = cluster::auto_mtls(svc, port.number, *subset, dr, &up);
                    let eds = c
                        .as_ref()
                        .filter(|c| is_eds(c))
                        .map(|c| Arc::new(XdsResource::new(c.name.clone(), &cluster::load_assignment(&c.name, svc, port, *subset, dr, auto))));
                    (c.map(|c| Arc::new(XdsResource::new(c.name.clone(), &c))), eds)
                };
                let (c, eds) = match cache {
                    None => build(),
                    Some(cache) => {
                        let key = (
                            Arc::as_ptr(svc) as usize,
                            dr_config.map_or(0, |d| Arc::as_ptr(d) as usize),
                            port.number,
                            subset.unwrap_or("").to_string(),
                            fingerprint,
                            up.gateway,
                            up.capture,
                        );
                        let mut map = cache.map.lock().unwrap_or_else(|p| p.into_inner());
                        let e = map.entry(key).or_insert_with(|| {
                            let (cluster, eds) = build();
                            CachedCluster { svc: svc.clone(), _dr: dr_config.cloned(), cluster, eds }
                        });
                        (e.cluster.clone(), e.eds.clone())
                    }
                };
                if let Some(eds) = eds {
                    cfg.insert_shared(ResourceType::Endpoint, eds);
                }
                if let Some(c) = c {
                    cfg.insert_shared(ResourceType::Cluster, c);
                }
            }
        }
    }
}

/// Routes go through the deterministic encoder (see `encode`).
fn route_resource(rc: &RouteConfiguration) -> XdsResource {
    XdsResource::from_encoded::<RouteConfiguration>(rc.name.clone(), encode::route_configuration_bytes(rc))
}

fn is_eds(c: &Cluster) -> bool {
    c.cluster_discovery_type == Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
}

/// Translate everything one proxy needs from one mesh snapshot.
pub fn translate(mesh: &Mesh, proxy: &ProxyIdentity) -> ProxyConfig {
    let mut cfg = translate_with_parts(mesh, proxy, None).0;
    envoyfilter::apply(&mut cfg, mesh, proxy);
    cfg
}

fn translate_with_parts(mesh: &Mesh, proxy: &ProxyIdentity, cache: Option<&ClusterCache>) -> (ProxyConfig, BTreeMap<String, RdsParts>) {
    let mut cfg = ProxyConfig { revision: mesh.revision, ..Default::default() };
    let mut rds = BTreeMap::new();
    match proxy.kind {
        ProxyKind::Sidecar => sidecar(&mut cfg, &mut rds, mesh, proxy, cache),
        ProxyKind::Router => gateway::translate(&mut cfg, &mut rds, mesh, proxy, cache),
        ProxyKind::Grpc => grpc::translate(&mut cfg, mesh, proxy),
    }
    if proxy.kind != ProxyKind::Grpc {
        add_service_clusters(&mut cfg, mesh, proxy, &extauthz::provider_services(mesh, proxy), cache);
        add_service_clusters(&mut cfg, mesh, proxy, &telemetry::tracer_services(mesh, proxy), cache);
    }
    telemetry::apply(&mut cfg, mesh, proxy);
    (cfg, rds)
}

/// One virtual host of a sidecar route table, encoded, with what it was
/// built for: an incremental translation re-encodes only the parts whose
/// host a change touched and copies the rest.
#[derive(Clone)]
struct VhostPart {
    hostname: String,
    /// Its domains, after de-duplication against the earlier parts (they
    /// depend only on the services, so an incremental rebuild reuses them).
    domains: Arc<Vec<String>>,
    bytes: Arc<Vec<u8>>,
    /// Hash of `bytes`, so a table's version costs one step per part.
    hash: u64,
}

impl VhostPart {
    fn build(ctx: &RouteCtx, svc: &Service, domains: Vec<String>) -> VhostPart {
        VhostPart::of(svc.hostname.clone(), &route::virtual_host(ctx, svc, domains))
    }

    /// A part for `vhost`, built for `hostname` (empty: for no service).
    fn of(hostname: String, vhost: &envoy_types::pb::envoy::config::route::v3::VirtualHost) -> VhostPart {
        let bytes = encode::virtual_host_bytes(vhost);
        let hash = crate::resources::fnv1a(&bytes);
        let (bytes, domains) = (intern::bytes(hash, Arc::new(bytes)), intern::domains(Arc::new(vhost.domains.clone())));
        VhostPart { hostname, domains, bytes, hash }
    }
}

/// The parts of one sidecar route table (RDS resource).
#[derive(Clone)]
struct RdsParts {
    port: u32,
    /// Shared: a proxy's next config copies it whole unless a change
    /// touched one of its hosts.
    parts: Arc<Vec<VhostPart>>,
}

fn assemble_route(name: &str, parts: &[VhostPart]) -> XdsResource {
    let shell = RouteConfiguration {
        name: name.to_string(),
        validate_clusters: Some(envoy_types::pb::google::protobuf::BoolValue { value: false }),
        ..Default::default()
    };
    let bytes: Vec<&[u8]> = parts.iter().map(|p| p.bytes.as_slice()).collect();
    let encoded = encode::route_configuration_from_parts(&shell, &bytes);
    // The version: a hash of the shell and of each part's hash (content
    // derived and deterministic like any other version, without hashing
    // the whole table again).
    let mut summary = prost::Message::encode_to_vec(&shell);
    for p in parts {
        summary.extend_from_slice(&p.hash.to_le_bytes());
    }
    XdsResource::with_version::<RouteConfiguration>(name.to_string(), encoded, format!("{:016x}", crate::resources::fnv1a(&summary)))
}

fn sidecar(cfg: &mut ProxyConfig, rds: &mut BTreeMap<String, RdsParts>, mesh: &Mesh, proxy: &ProxyIdentity, cache: Option<&ClusterCache>) {
    let sc = scope::sidecar_for(mesh, proxy);
    let services = scope::ProxyScope::new(mesh, proxy, sc.map(|s| s.as_ref()));
    let plans = scope::egress_plans(&services, proxy, sc.map(|s| s.as_ref()));
    let suffix = &mesh.config.domain_suffix;
    let mut reachable: BTreeMap<String, Arc<Service>> = BTreeMap::new();
    let allow_any = capture::allow_any(mesh, sc.map(|s| s.as_ref()));
    for plan in &plans {
        reachable.extend(plan.services.iter().map(|(k, v)| (k.clone(), v.clone())));
        // A captured proxy's listeners for its own address bind nothing:
        // `virtualOutbound` hands them connections (`capture`).
        let captured = proxy.capture && plan.bind == proxy.ip;
        let http: Vec<&Arc<Service>> = plan.services.values().filter(|s| s.port(plan.port).is_some_and(|p| p.is_http())).collect();
        let ctx = RouteCtx { mesh, proxy, scope: &services, port: plan.port, gateway: None };
        let mut http_listener = None;
        if !http.is_empty() {
            let route_name = plan.route_name(&proxy.ip);
            let services: Vec<&Service> = http.iter().map(|s| s.as_ref()).collect();
            let mut domains = route::unique_domains(&services, plan.port, &proxy.namespace, suffix);
            if captured {
                capture::add_address_domains(proxy, &services, &mut domains, plan.port);
            }
            // A service left with no name of its own here gets no virtual
            // host (Envoy refuses one without domains).
            let mut parts: Vec<VhostPart> =
                services.iter().zip(domains).filter(|(_, d)| !d.is_empty()).map(|(svc, domains)| VhostPart::build(&ctx, svc, domains)).collect();
            if captured && allow_any {
                parts.push(VhostPart::of(String::new(), &capture::allow_any_vhost()));
            }
            cfg.insert(ResourceType::Route, assemble_route(&route_name, &parts));
            rds.insert(route_name.clone(), RdsParts { port: plan.port, parts: Arc::new(parts) });
            http_listener = Some(match captured {
                true => capture::unbound(listener::http_listener(&format!("0.0.0.0_{}", plan.port), "0.0.0.0", plan.port, Routes::Rds(route_name))),
                false => listener::http_listener(&plan.listener_name(), &plan.bind, plan.port, Routes::Rds(route_name)),
            });
        }
        if captured {
            // TCP services told apart by their addresses (and subnets).
            let services: Vec<&Service> = plan.services.values().map(|s| s.as_ref()).collect();
            for l in capture::tcp_listeners(&ctx, &services, http_listener.as_mut()) {
                cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l));
            }
        } else if http.is_empty() {
            // TLS services are told apart by SNI; plain TCP carries no name,
            // and without iptables there is no original destination either,
            // so one TCP service per port (see `l4`).
            let services: Vec<&Service> = plan.services.values().map(|s| s.as_ref()).collect();
            if let Some(l) = l4::sidecar_listener(&ctx, &plan.listener_name(), &plan.bind, &services) {
                cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l));
            }
        }
        if let Some(l) = http_listener {
            cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l));
        }
    }
    // Destinations named by routes must exist even if the egress scope does
    // not list them (Envoy answers 503 for unknown clusters otherwise).
    add_service_clusters(cfg, mesh, proxy, &reachable, cache);
    if proxy.capture {
        capture::virtual_listeners(cfg, mesh, proxy, sc.map(|s| s.as_ref()));
        if proxy.dns_capture {
            dns::insert_name_table(cfg, reachable.values().map(|s| s.as_ref()), proxy, mesh);
        }
    } else if let Some(sc) = sc {
        inbound::sidecar_ingress(cfg, mesh, proxy, sc);
    }
}

/// What the translator remembers of a proxy's last translation.
struct Previous {
    identity: ProxyIdentity,
    objects: Objects,
    mesh: Arc<Mesh>,
    /// Translated, before EnvoyFilter patches: what the incremental paths
    /// start from.
    config: ProxyConfig,
    /// What was served: `config` with the EnvoyFilters patches applied.
    served: ProxyConfig,
    /// The patches `served` has (`envoyfilter::apply_after` reuses its
    /// resources of the types `config` shares with the next config).
    patch_ids: Vec<u64>,
    rds: BTreeMap<String, RdsParts>,
    /// The hosts its config depends on, computed on first use, or carried
    /// over from the config this one was derived from incrementally (those
    /// keep every cluster and every route table's hosts).
    deps: std::sync::OnceLock<Arc<BTreeSet<String>>>,
}

impl Previous {
    /// Every host the config has clusters or routes for.
    fn deps(&self) -> &Arc<BTreeSet<String>> {
        self.deps.get_or_init(|| {
            let mut hosts: BTreeSet<String> = BTreeSet::new();
            for name in self.config.of(ResourceType::Cluster).into_iter().flat_map(|m| m.keys()) {
                let mut parts = name.splitn(4, '|');
                if let (Some("outbound"), Some(_), Some(_), Some(host)) = (parts.next(), parts.next(), parts.next(), parts.next()) {
                    hosts.insert(host.to_string());
                }
            }
            hosts.extend(self.rds.values().flat_map(|t| t.parts.iter().map(|p| p.hostname.clone())));
            Arc::new(hosts)
        })
    }
}

/// The [`Generator`] the xDS server uses. It builds the mesh once per store
/// revision (shared by every proxy) and translates per proxy,
/// incrementally where it can: when only VirtualServices changed since a
/// proxy's last translation, only the virtual hosts of the hosts they name
/// (before and after the change) are re-translated; route tables are
/// re-assembled from the other, already encoded, virtual hosts, and every
/// other resource type is shared with the previous config as is.
pub struct Translator {
    config: Arc<MeshConfig>,
    /// The last mesh built, with the store objects it was built from.
    mesh: Mutex<Option<(Arc<Mesh>, Objects)>>,
    previous: Mutex<std::collections::HashMap<String, Arc<Previous>>>,
    /// Recent steps between revisions and what changed in them.
    changes: Mutex<std::collections::VecDeque<Step>>,
    /// Clusters and load assignments shared across proxies.
    clusters: ClusterCache,
    /// Route tables rebuilt for a VirtualService change, at one revision.
    route_steps: Mutex<RouteSteps>,
    /// Key sets fetched from `jwksUri`s (written by the root's `jwks` fetcher).
    keys: Arc<jwt::KeyCell>,
}

/// Route tables rebuilt at `revision` by the incremental path, by the table
/// they replaced. Proxies of one namespace (and labels) that had the same
/// table before (interned: the same `Arc`) get the same table after, so
/// the first one to make the step rebuilds it and the others take it.
#[derive(Default)]
struct RouteSteps {
    revision: u64,
    steps: std::collections::HashMap<usize, Vec<RouteStep>>,
}

struct RouteStep {
    /// Held, so that its address cannot be reused while this entry lives.
    before: Arc<XdsResource>,
    namespace: String,
    labels: BTreeMap<String, String>,
    after: Arc<XdsResource>,
    parts: RdsParts,
}

/// A step between two revisions (from, to) and what changed in it.
type Step = ((u64, u64), Arc<Vec<Change>>);

/// One object's change: key, before, after.
type Change = (crate::model::ResourceKey, Option<Arc<crate::model::StoredObject>>, Option<Arc<crate::model::StoredObject>>);

impl Translator {
    pub fn new(config: MeshConfig) -> Translator {
        Translator {
            config: Arc::new(config),
            mesh: Mutex::new(None),
            previous: Mutex::new(Default::default()),
            changes: Mutex::new(Default::default()),
            clusters: Default::default(),
            route_steps: Mutex::new(Default::default()),
            keys: Default::default(),
        }
    }

    /// Whether the fetched key sets `proxy`'s config holds are the same in
    /// `mesh` as in the mesh its previous config was translated from.
    fn same_keys(prev: &Previous, mesh: &Mesh, proxy: &ProxyIdentity) -> bool {
        Arc::ptr_eq(&prev.mesh.jwks, &mesh.jwks) || jwt::fetched_uris_for(mesh, proxy).iter().all(|u| prev.mesh.jwks.sets.get(u) == mesh.jwks.sets.get(u))
    }

    fn route_step(&self, revision: u64, before: &Arc<XdsResource>, proxy: &ProxyIdentity) -> Option<(Arc<XdsResource>, RdsParts)> {
        let steps = self.route_steps.lock().unwrap_or_else(|p| p.into_inner());
        if steps.revision != revision {
            return None;
        }
        let step = steps
            .steps
            .get(&(Arc::as_ptr(before) as usize))?
            .iter()
            .find(|s| Arc::ptr_eq(&s.before, before) && s.namespace == proxy.namespace && s.labels == proxy.labels)?;
        Some((step.after.clone(), step.parts.clone()))
    }

    fn remember_route_step(&self, revision: u64, before: Arc<XdsResource>, proxy: &ProxyIdentity, after: Arc<XdsResource>, parts: RdsParts) {
        let mut steps = self.route_steps.lock().unwrap_or_else(|p| p.into_inner());
        if steps.revision != revision {
            if steps.revision > revision {
                return; // a straggler: the cache has moved on
            }
            *steps = RouteSteps { revision, steps: Default::default() };
        }
        let step = RouteStep { before, namespace: proxy.namespace.clone(), labels: proxy.labels.clone(), after, parts };
        steps.steps.entry(Arc::as_ptr(&step.before) as usize).or_default().push(step);
    }

    /// The mesh at `state`'s revision, built once per revision and
    /// updated from the previous one when only traffic rules changed.
    pub fn mesh(&self, state: &State) -> Arc<Mesh> {
        let keys = self.keys.get();
        let mut cached = self.mesh.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((m, objects)) = &*cached {
            if m.revision == state.revision() {
                if Arc::ptr_eq(&m.jwks, &keys) {
                    return m.clone();
                }
                // The same store state with newly fetched key sets.
                let m = Arc::new(Mesh { jwks: keys, ..(**m).clone() });
                let objects = objects.clone();
                *cached = Some((m.clone(), objects));
                return m;
            }
        }
        let m = match &*cached {
            // Only statuses changed (`Op::Status`: translation reads none):
            // the same mesh, at the new revision. Either way: the status
            // writer (`gateway_status`) and a new stream may ask for a
            // revision just before or after the streams' last one.
            Some((prev, objects)) if objects.spec_diff(&state.objects).next().is_none() => Some(Mesh { revision: state.revision(), ..(**prev).clone() }),
            Some((prev, objects)) if prev.revision < state.revision() => prev
                .update_instances(objects, state)
                .map(|(m, _)| m)
                .or_else(|| prev.update_rules(objects, state))
                .or_else(|| prev.update_gateway_routes(objects, state)),
            _ => None,
        };
        let mut m = m.unwrap_or_else(|| Mesh::build(state, self.config.clone()));
        m.jwks = keys;
        let m = Arc::new(m);
        // Services no mesh shares any more are no use to the cluster cache.
        self.clusters.prune();
        *cached = Some((m.clone(), state.objects.clone()));
        m
    }

    /// Hosts whose virtual hosts a set of changes can affect, if the changes
    /// allow an incremental translation (only VirtualServices, naming exact
    /// hosts, with no TCP routes): `None` means translate in full.
    /// What changed between a proxy's last translation and `state`:
    /// diffed once per pair of revisions and shared by every proxy making
    /// the same step (most of them, most of the time).
    fn changes(&self, prev: &Previous, state: &State) -> Arc<Vec<Change>> {
        let step = (prev.config.revision, state.revision());
        let mut cache = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, c)) = cache.iter().find(|(s, _)| *s == step) {
            return c.clone();
        }
        let list: Vec<Change> = prev.objects.spec_diff(&state.objects).map(|d| (d.key().clone(), d.before().cloned(), d.after().cloned())).collect();
        let list = Arc::new(list);
        if cache.len() >= 16 {
            cache.pop_front();
        }
        cache.push_back((step, list.clone()));
        list
    }

    /// Whether every change since the proxy's last translation is outside
    /// its scope (the dependency check of Sidecar scoping): each changed
    /// object names only hosts the proxy neither routes to nor has
    /// clusters for, and whose services exist before and after with the
    /// same visibility (so the proxy's scope itself cannot change).
    /// Anything else (Sidecars, Gateways, WorkloadEntries, wildcard hosts,
    /// services appearing or going) is treated as affecting everyone.
    fn unaffected(&self, prev: &Previous, state: &State, mesh: &Mesh) -> bool {
        use crate::model::istio::Validated;
        use crate::model::{Kind, TypedSpec};
        let suffix = &self.config.domain_suffix;
        let deps = prev.deps();
        let neutral = |host: &str| -> bool {
            if host.contains('*') || deps.contains(host) {
                return false;
            }
            crate::mesh::same_claimants(prev.mesh.claims(host), mesh.claims(host))
        };
        let hosts_of = |o: &crate::model::StoredObject| -> Option<Vec<String>> {
            let ns = &o.key.namespace;
            Some(match (o.key.kind, o.typed().ok()?.as_ref()) {
                // Leases and WorkloadGroups reach no proxy (only the
                // Instances registered from them do).
                (Kind::Lease | Kind::WorkloadGroup, _) => Vec::new(),
                (k, _) if k.is_acl() => Vec::new(),
                // A mesh route (a Service parent) routes sidecars' traffic.
                (_, TypedSpec::GatewayApi(route)) if route.is_mesh_route() => return None,
                // A BackendTLSPolicy, and a Secret one reads its CA from,
                // change every proxy's clusters for the services it targets.
                (_, TypedSpec::GatewayApi(crate::model::gateway_api::Spec::BackendTlsPolicy(_))) => return None,
                (Kind::Secret, _)
                    if [&prev.mesh.backend_cas, &mesh.backend_cas].iter().any(|c| c.secrets.contains(&(ns.to_string(), o.key.name.to_string()))) =>
                {
                    return None
                }
                // What else the Gateway API generates binds to gateways only.
                (k, _) if k.is_gateway_api() || k == Kind::Namespace => Vec::new(),
                // Listeners name secrets; their content is SDS's (xds).
                (Kind::Secret, _) => Vec::new(),
                (_, TypedSpec::Instance(i)) => vec![crate::mesh::instance_hostname(i, ns, suffix)],
                (_, TypedSpec::Service(svc)) => vec![svc.hostname.clone().unwrap_or_else(|| format!("{}.{ns}.svc.{suffix}", o.key.name))],
                // A delegate (no hosts) routes under whichever roots name it.
                (_, TypedSpec::Istio(Validated::VirtualService { spec, .. })) if spec.hosts.is_empty() => return None,
                (_, TypedSpec::Istio(Validated::VirtualService { spec, .. })) => spec.hosts.iter().map(|h| resolve_short_name(h, ns, suffix)).collect(),
                (_, TypedSpec::Istio(Validated::DestinationRule { spec, .. })) => vec![resolve_short_name(&spec.host, ns, suffix)],
                (_, TypedSpec::Istio(Validated::ServiceEntry { spec, .. })) => spec.hosts.iter().map(|h| resolve_short_name(h, ns, suffix)).collect(),
                // A policy matters only to the workloads it selects.
                (_, TypedSpec::Istio(Validated::AuthorizationPolicy { spec, .. })) => {
                    let labels = spec.selector.as_ref().map(|s| &s.match_labels);
                    if scope::policy_selects(ns, labels, &self.config.root_namespace, &prev.identity) {
                        return None;
                    }
                    Vec::new()
                }
                // An EnvoyFilter matters only to the proxies it selects.
                (_, TypedSpec::Istio(Validated::EnvoyFilter { spec, .. })) => {
                    if scope::policy_selects(ns, spec.selector(), &self.config.root_namespace, &prev.identity) {
                        return None;
                    }
                    Vec::new()
                }
                (_, TypedSpec::Istio(Validated::RequestAuthentication { spec, .. })) => {
                    let labels = spec.selector.as_ref().map(|s| &s.match_labels);
                    if scope::policy_selects(ns, labels, &self.config.root_namespace, &prev.identity) {
                        return None;
                    }
                    Vec::new()
                }
                _ => return None,
            })
        };
        self.changes(prev, state)
            .iter()
            .all(|(_, old, new)| old.iter().chain(new.iter()).all(|o| hosts_of(o).is_some_and(|hosts| hosts.iter().all(|h| neutral(h)))))
    }

    /// Hosts whose virtual hosts (and, with TLS or TCP routes, whose
    /// outbound TLS/TCP listeners) a set of changes can affect, if the
    /// changes allow an incremental translation: only VirtualServices,
    /// naming exact hosts. The flag says whether any of them had or has
    /// `tls` or `tcp` routes. `None` means translate in full.
    fn vs_only_hosts(&self, prev: &Previous, state: &State) -> Option<(BTreeSet<String>, bool)> {
        let suffix = &self.config.domain_suffix;
        let mut hosts = BTreeSet::new();
        let mut l4 = false;
        let mut add = |obj: &crate::model::StoredObject| -> Option<()> {
            if obj.key.kind != crate::model::Kind::VirtualService {
                return None;
            }
            let Ok(typed) = obj.typed() else { return None };
            let crate::model::TypedSpec::Istio(crate::model::istio::Validated::VirtualService { spec, .. }) = typed.as_ref() else { return None };
            // A delegate (no hosts) routes under whichever roots name it.
            if spec.hosts.is_empty() {
                return None;
            }
            // TLS and TCP routes are filter chains of the listeners of the
            // ports their hosts' services have (`l4`).
            l4 |= !spec.tcp.is_empty() || !spec.tls.is_empty();
            for h in &spec.hosts {
                let h = resolve_short_name(h, &obj.key.namespace, suffix);
                if h.contains('*') {
                    return None;
                }
                hosts.insert(h);
            }
            Some(())
        };
        for (_, old, new) in self.changes(prev, state).iter() {
            for o in old.iter().chain(new.iter()) {
                add(o)?;
            }
        }
        Some((hosts, l4))
    }

    /// Whether a registry Instance at `proxy`'s address changed (was
    /// added, removed, or changed) since its last translation.
    fn own_instances_changed(&self, prev: &Previous, state: &State, proxy: &ProxyIdentity) -> bool {
        self.changes(prev, state).iter().filter(|(key, _, _)| key.kind == crate::model::Kind::Instance).any(|(_, old, new)| {
            old.iter()
                .chain(new.iter())
                .any(|o| o.typed().ok().is_some_and(|t| matches!(t.as_ref(), crate::model::TypedSpec::Instance(i) if i.address == proxy.ip)))
        })
    }

    /// Whether every change since the proxy's last translation is to an
    /// AuthorizationPolicy or a RequestAuthentication (both only shape the
    /// filters of inbound and gateway listeners).
    fn authz_only(&self, prev: &Previous, state: &State) -> bool {
        use crate::model::Kind;
        self.changes(prev, state).iter().all(|(key, _, _)| matches!(key.kind, Kind::AuthorizationPolicy | Kind::RequestAuthentication))
    }

    /// Hosts whose endpoints changed, if every change since the proxy's last
    /// translation is to registry Instances of services that kept their
    /// shape: then only EDS changes (Pilot's incremental EDS). `None`
    /// means translate in full.
    fn endpoints_only_hosts(&self, prev: &Previous, state: &State, mesh: &Mesh) -> Option<BTreeSet<String>> {
        let mut hosts = BTreeSet::new();
        let suffix = &self.config.domain_suffix;
        for (key, old, new) in self.changes(prev, state).iter() {
            if key.kind != crate::model::Kind::Instance {
                return None;
            }
            for o in old.iter().chain(new.iter()) {
                let typed = o.typed().ok()?;
                let crate::model::TypedSpec::Instance(spec) = typed.as_ref() else { return None };
                hosts.insert(crate::mesh::instance_hostname(spec, &key.namespace, suffix));
            }
        }
        for h in &hosts {
            let (before, after) = (prev.mesh.claims(h), mesh.claims(h));
            // The clusters expect the service's identities (mutual TLS): a
            // change to those is a cluster change.
            if before.is_empty() || before.len() != after.len() || !before.iter().zip(after).all(|(a, b)| a.same_shape(b) && a.identities() == b.identities()) {
                return None;
            }
        }
        Some(hosts)
    }

    /// Hosts whose gateway virtual hosts a set of changes can affect, if
    /// every change is to a Gateway API route (or to no part of the mesh)
    /// and the mesh was stepped from the previous one
    /// (`Mesh::update_gateway_routes`: the same Gateways and services):
    /// the hosts of the generated VirtualServices that went or came, if
    /// they route HTTP only (TLS and TCP routes are listeners' filter
    /// chains). `None` means translate in full.
    fn gateway_routes_only_hosts(&self, prev: &Previous, state: &State, mesh: &Mesh) -> Option<BTreeSet<String>> {
        use crate::model::Kind;
        let route_or_nothing = |k: Kind| matches!(k, Kind::HttpRoute | Kind::GrpcRoute | Kind::TcpRoute | Kind::TlsRoute) || k.is_acl();
        if !self.changes(prev, state).iter().all(|(key, _, _)| route_or_nothing(key.kind)) {
            return None;
        }
        let (was, is) = (&prev.mesh, mesh);
        if !Arc::ptr_eq(&was.services, &is.services)
            || was.gateways.len() != is.gateways.len()
            || !was.gateways.iter().zip(&is.gateways).all(|(a, b)| Arc::ptr_eq(a, b))
        {
            return None;
        }
        let ptrs = |m: &Mesh| -> BTreeSet<usize> { m.gateway_api.virtual_services.iter().map(|v| Arc::as_ptr(v) as usize).collect() };
        let (before, after) = (ptrs(was), ptrs(is));
        let gone = was.gateway_api.virtual_services.iter().filter(|v| !after.contains(&(Arc::as_ptr(v) as usize)));
        let came = is.gateway_api.virtual_services.iter().filter(|v| !before.contains(&(Arc::as_ptr(v) as usize)));
        let mut hosts = BTreeSet::new();
        for vs in gone.chain(came) {
            if !vs.spec.tcp.is_empty() || !vs.spec.tls.is_empty() {
                return None;
            }
            hosts.extend(vs.spec.hosts.iter().map(|h| resolve_short_name(h, &vs.key.namespace, &self.config.domain_suffix)));
        }
        Some(hosts)
    }

    fn incremental(&self, prev: &Previous, mesh: &Mesh, proxy: &ProxyIdentity, hosts: &BTreeSet<String>) -> (ProxyConfig, BTreeMap<String, RdsParts>) {
        let mut cfg = prev.config.clone();
        cfg.revision = mesh.revision;
        let mut rds = prev.rds.clone();
        let services = scope::ProxyScope::of(mesh, proxy);
        for (name, table) in rds.iter_mut() {
            if !table.parts.iter().any(|p| hosts.contains(&p.hostname)) {
                continue;
            }
            // Only VirtualServices changed, so the table keeps its hosts: what
            // it becomes depends on what it was, the mesh, and how this proxy
            // sees it (namespace, labels). Another proxy may have made the
            // same step already.
            let before = prev.config.of(ResourceType::Route).and_then(|m| m.get(name)).cloned();
            if let Some((after, parts)) = before.as_ref().and_then(|b| self.route_step(mesh.revision, b, proxy)) {
                *table = parts;
                cfg.insert_shared(ResourceType::Route, after);
                continue;
            }
            let ctx = RouteCtx { mesh, proxy, scope: &services, port: table.port, gateway: None };
            for part in Arc::make_mut(&mut table.parts).iter_mut().filter(|p| hosts.contains(&p.hostname)) {
                let Some(svc) = services.service(&part.hostname) else { continue };
                *part = VhostPart::build(&ctx, svc, part.domains.as_ref().clone());
            }
            let after = intern::resource(Arc::new(assemble_route(name, &table.parts)));
            cfg.insert_shared(ResourceType::Route, after.clone());
            if let Some(before) = before {
                self.remember_route_step(mesh.revision, before, proxy, after, table.clone());
            }
        }
        (cfg, rds)
    }
}

/// Rebuild, in a config derived from the previous one, the sidecar's
/// outbound TLS/TCP listeners (ports without HTTP services) that carry one
/// of `hosts`: their filter chains are the `tls` and `tcp` routes of those
/// hosts' VirtualServices. Ports, services and clusters are unchanged (only
/// VirtualServices changed), so the set of listeners is too.
fn l4_incremental(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, hosts: &BTreeSet<String>) {
    let sc = scope::sidecar_for(mesh, proxy);
    let services = scope::ProxyScope::new(mesh, proxy, sc.map(|s| s.as_ref()));
    for plan in scope::egress_plans(&services, proxy, sc.map(|s| s.as_ref())) {
        if !plan.services.keys().any(|h| hosts.contains(h)) || plan.services.values().any(|s| s.port(plan.port).is_some_and(|p| p.is_http())) {
            continue;
        }
        let ctx = RouteCtx { mesh, proxy, scope: &services, port: plan.port, gateway: None };
        let services: Vec<&Service> = plan.services.values().map(|s| s.as_ref()).collect();
        let name = plan.listener_name();
        match l4::sidecar_listener(&ctx, &name, &plan.bind, &services) {
            Some(l) => cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l)),
            None => {
                if let Some(map) = cfg.resources.get_mut(&ResourceType::Listener) {
                    Arc::make_mut(map).remove(&name);
                }
            }
        }
    }
}

/// The previous config with its inbound listeners rebuilt (their RBAC
/// filters are all an AuthorizationPolicy change can alter); clusters,
/// endpoints, routes and outbound listeners are shared as they are.
fn authz_incremental(prev: &Previous, mesh: &Mesh, proxy: &ProxyIdentity) -> ProxyConfig {
    let mut cfg = prev.config.clone();
    cfg.revision = mesh.revision;
    if let Some(sc) = scope::sidecar_for(mesh, proxy) {
        let mut inbound = ProxyConfig::default();
        inbound::sidecar_ingress(&mut inbound, mesh, proxy, sc);
        for l in inbound.of(ResourceType::Listener).into_iter().flatten().map(|(_, l)| l.clone()) {
            cfg.insert_shared(ResourceType::Listener, l);
        }
    }
    // A CUSTOM policy may name a provider whose cluster is not there yet.
    add_service_clusters(&mut cfg, mesh, proxy, &extauthz::provider_services(mesh, proxy), None);
    add_service_clusters(&mut cfg, mesh, proxy, &telemetry::tracer_services(mesh, proxy), None);
    telemetry::apply(&mut cfg, mesh, proxy);
    cfg
}

/// The previous config with the load assignments of `hosts`' clusters
/// rebuilt; clusters, listeners and routes are shared as they are.
fn endpoints_incremental(prev: &Previous, mesh: &Mesh, proxy: &ProxyIdentity, hosts: &BTreeSet<String>) -> ProxyConfig {
    let mut cfg = prev.config.clone();
    cfg.revision = mesh.revision;
    let Some(eds) = prev.config.of(ResourceType::Endpoint) else { return cfg };
    let up = mtls::UpstreamMtls { mesh, client_sds: proxy.sds, gateway: proxy.kind == ProxyKind::Router, capture: proxy.capture };
    let services = scope::ProxyScope::of(mesh, proxy);
    // Only the clusters of the changed hosts: their names follow from the
    // service's ports and the subsets of its DestinationRule.
    for host in hosts {
        let Some(svc) = services.service(host) else { continue };
        let dr = destination_rule_for(mesh, &proxy.namespace, svc).map(|d| &d.spec);
        let subsets = std::iter::once(None).chain(dr.into_iter().flat_map(|d| d.subsets.iter().map(|s| Some(s.name.as_str()))));
        for subset in subsets {
            for port in &svc.ports {
                let name = outbound_cluster_name(port.number, subset.unwrap_or(""), host);
                if eds.contains_key(&name) {
                    let auto = cluster::auto_mtls(svc, port.number, subset, dr, &up);
                    cfg.insert(ResourceType::Endpoint, XdsResource::new(name.clone(), &cluster::load_assignment(&name, svc, port, subset, dr, auto)));
                }
            }
        }
    }
    cfg
}

impl Generator for Translator {
    fn generate(&self, proxy: &ProxyIdentity, state: &State) -> Result<ProxyConfig, String> {
        let mesh = self.mesh(state);
        if proxy.names_only {
            // The agent's DNS stream: its name table only, from scratch (a
            // scope walk, no Envoy resources).
            return Ok(dns::names_only(&mesh, proxy));
        }
        let prev = self.previous.lock().unwrap_or_else(|p| p.into_inner()).get(&proxy.id).cloned();
        let prev = prev.filter(|p| p.identity == *proxy && p.config.revision <= state.revision());
        // Set when the config is derived from `prev` incrementally: it keeps
        // prev's clusters and route tables' hosts, so its dependencies.
        let mut incremental = true;
        let mut router_step = match &prev {
            Some(p) if proxy.kind == ProxyKind::Router && !proxy.capture && p.config.revision < state.revision() && Self::same_keys(p, &mesh, proxy) => {
                self.gateway_routes_only_hosts(p, state, &mesh).and_then(|hosts| gateway::incremental(&p.config, &p.rds, &mesh, proxy, &hosts))
            }
            _ => None,
        };
        let (config, rds) = match (&prev, proxy.kind) {
            // Fetched keys this proxy holds changed (at this revision or
            // with other changes): translate in full.
            (Some(p), _) if !Self::same_keys(p, &mesh, proxy) => {
                incremental = false;
                translate_with_parts(&mesh, proxy, Some(&self.clusters))
            }
            (Some(p), _) if p.config.revision == state.revision() => return Ok(p.served.clone()),
            // A captured proxy's inbound ports are those of the instances
            // at its address (`capture::inbound_ports`): a change to one of
            // them is a listener change, whatever else it is.
            (Some(p), _) if proxy.capture && self.own_instances_changed(p, state, proxy) => {
                incremental = false;
                translate_with_parts(&mesh, proxy, Some(&self.clusters))
            }
            // No change translation reads (only statuses, `Op::Status`, or
            // objects no part of the mesh): the same config, for any proxy.
            (Some(p), _) if self.changes(p, state).is_empty() => {
                let mut config = p.config.clone();
                config.revision = state.revision();
                (config, p.rds.clone())
            }
            // Nothing this proxy depends on changed: its config is the same
            // at the new revision, with no translation at all.
            (Some(p), ProxyKind::Sidecar) if self.unaffected(p, state, &mesh) => {
                let mut config = p.config.clone();
                config.revision = state.revision();
                (config, p.rds.clone())
            }
            // Only AuthorizationPolicies or RequestAuthentications changed:
            // only the inbound listeners (where their filters are) can differ.
            // A captured proxy's inbound listener is `virtualInbound`
            // (`capture`): translated in full.
            (Some(p), ProxyKind::Sidecar) if !proxy.capture && self.authz_only(p, state) => (authz_incremental(p, &mesh, proxy), p.rds.clone()),
            // Only Gateway API routes changed: a gateway's virtual hosts of
            // the hosts whose generated VirtualServices changed.
            (Some(_), ProxyKind::Router) if router_step.is_some() => router_step.take().unwrap_or_default(),
            (Some(p), kind) => match self.endpoints_only_hosts(p, state, &mesh) {
                Some(hosts) => (endpoints_incremental(p, &mesh, proxy, &hosts), p.rds.clone()),
                None => match (kind, self.vs_only_hosts(p, state)) {
                    // A captured proxy's TCP listeners are its own
                    // (`capture`): with TLS/TCP routes, translated in full.
                    (ProxyKind::Sidecar, Some((hosts, l4))) if !(proxy.capture && l4) => {
                        let (mut cfg, rds) = self.incremental(p, &mesh, proxy, &hosts);
                        if l4 {
                            l4_incremental(&mut cfg, &mesh, proxy, &hosts);
                            telemetry::apply(&mut cfg, &mesh, proxy);
                        }
                        (cfg, rds)
                    }
                    _ => {
                        incremental = false;
                        translate_with_parts(&mesh, proxy, Some(&self.clusters))
                    }
                },
            },
            _ => {
                incremental = false;
                translate_with_parts(&mesh, proxy, Some(&self.clusters))
            }
        };
        // Share what other proxies already hold: equal route tables and
        // equal whole maps (CDS/EDS of proxies that see the same services).
        // A map carried over from the previous config is interned already.
        let mut config = config;
        for (t, map) in config.resources.iter_mut() {
            if prev.as_ref().and_then(|p| p.config.resources.get(t)).is_some_and(|old| Arc::ptr_eq(old, map)) {
                continue;
            }
            if let Some(m) = Arc::get_mut(map) {
                for r in m.values_mut() {
                    *r = intern::resource(r.clone());
                }
            }
            *map = intern::map(map.clone());
        }
        // EnvoyFilters patch the translated config last; the incremental
        // paths above work on the unpatched one (`Previous::config`).
        let mut served = config.clone();
        let last = prev.as_ref().map(|p| envoyfilter::Patched { base: &p.config, served: &p.served, ids: &p.patch_ids });
        let patch_ids = envoyfilter::apply_after(&mut served, &mesh, proxy, last).unwrap_or_default();
        if !patch_ids.is_empty() {
            for (t, map) in served.resources.iter_mut() {
                if config.resources.get(t).is_some_and(|base| Arc::ptr_eq(base, map)) {
                    continue;
                }
                *map = intern::map(map.clone());
            }
        }
        let deps = std::sync::OnceLock::new();
        if let Some(d) = prev.as_ref().filter(|_| incremental).and_then(|p| p.deps.get()) {
            let _ = deps.set(d.clone());
        }
        let entry = Arc::new(Previous {
            identity: proxy.clone(),
            objects: state.objects.clone(),
            mesh: mesh.clone(),
            config,
            served: served.clone(),
            patch_ids,
            rds,
            deps,
        });
        self.previous.lock().unwrap_or_else(|p| p.into_inner()).insert(proxy.id.clone(), entry);
        Ok(served)
    }

    fn fork(&self) -> Option<Box<dyn Generator>> {
        fn lock<T: Clone>(m: &Mutex<T>) -> T {
            m.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }
        Some(Box::new(Translator {
            config: self.config.clone(),
            mesh: Mutex::new(lock(&self.mesh)),
            // Shared `Arc`s: the fork replaces entries, never edits them.
            previous: Mutex::new(lock(&self.previous)),
            changes: Mutex::new(lock(&self.changes)),
            // Keyed by object identities and revision numbers: a
            // hypothetical revision's entries must stay in the fork.
            clusters: Default::default(),
            route_steps: Mutex::new(Default::default()),
            keys: self.keys.clone(),
        }))
    }

    fn forget(&self, proxy_id: &str) {
        self.previous.lock().unwrap_or_else(|p| p.into_inner()).remove(proxy_id);
    }

    fn key_cell(&self) -> Option<Arc<jwt::KeyCell>> {
        Some(self.keys.clone())
    }

    fn mesh(&self, state: &State) -> Option<Arc<Mesh>> {
        Some(Translator::mesh(self, state))
    }
}
