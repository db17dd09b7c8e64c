//! EnvoyFilter patches, applied to one proxy's translated config (the last
//! step of translation; pure and deterministic). Istio's semantics as
//! istiod 1.30 implements them (`pilot/pkg/networking/core/envoyfilter`;
//! facts in `tests/fixtures/istio/corpus-38/envoyfilter-semantics.md`):
//!
//! - Which filters: those of the root namespace and of the proxy's
//!   namespace whose `workloadSelector` the proxy's labels satisfy;
//!   ordered by `priority`, then (equal priority) root namespace first,
//!   then creation revision, then `name.namespace`. Patches are taken in
//!   that order, each filter's in `configPatches` order, and kept only if
//!   `match.proxy` (version regex against `ISTIO_VERSION`, metadata)
//!   matches.
//! - Contexts: a sidecar's inbound listeners (its Sidecar `ingress` ports,
//!   or `virtualInbound`) and `inbound|…` clusters are SIDECAR_INBOUND, the
//!   rest SIDECAR_OUTBOUND; everything of a gateway is GATEWAY. Route
//!   configurations served over RDS take the proxy's outbound context;
//!   inline ones (the inbound `inbound|<port>||`) their listener's.
//! - Order within a listener: its inline route configurations, LISTENER
//!   MERGE/REMOVE, LISTENER_FILTER, per filter chain FILTER_CHAIN
//!   MERGE/REMOVE, NETWORK_FILTER list operations, per network filter its
//!   MERGE and (HCM) HTTP_FILTER list operations and MERGE; then
//!   FILTER_CHAIN ADD; after all listeners LISTENER ADD.
//! - A patch that fails (a MERGE of two different typed_config types) is
//!   skipped; the object stays as it was before that patch.
//! - EXTENSION_CONFIG ADD defines an ECDS resource (`ResourceType::
//!   ExtensionConfig`) for the proxies the filter selects, whatever the
//!   context; filters name it in `config_discovery`.
//!
//! A patched resource's version is derived from its unpatched version and
//! the patches that touched it (not from its bytes: prost encodes map
//! fields in hash order), so it is the same on every replica.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::listener::v3::{filter, listener_filter, Filter, FilterChain, Listener, ListenerFilter};
use envoy_types::pb::envoy::config::route::v3::{route, Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::RouteSpecifier, http_filter, HttpConnectionManager, HttpFilter,
};
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use prost_reflect::{DynamicMessage, ReflectMessage};

use crate::capture::{VIRTUAL_INBOUND, VIRTUAL_OUTBOUND};
use crate::mesh::{Config, Mesh};
use crate::model::envoy_api as api;
use crate::model::istio::envoy_filter::{ApplyTo, ClusterMatch, ListenerMatch, Operation, PatchContext, RouteAction, RouteConfigurationMatch, HCM};
use crate::model::istio::EnvoyFilter;
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use crate::model::ResourceKey;
use crate::resources::{fnv1a, ProxyConfig, ResourceType, XdsResource};

/// One EnvoyFilter with its patch values built, once per mesh.
#[derive(Debug)]
pub struct CompiledFilter {
    pub key: ResourceKey,
    pub create_revision: u64,
    pub priority: i32,
    selector: Option<BTreeMap<String, String>>,
    patches: Vec<CompiledPatch>,
}

#[derive(Debug)]
struct CompiledPatch {
    apply_to: ApplyTo,
    op: Operation,
    context: PatchContext,
    proxy_version: Option<regex::Regex>,
    metadata: BTreeMap<String, String>,
    listener: Option<ListenerMatch>,
    route: Option<RouteConfigurationMatch>,
    cluster: Option<ClusterMatch>,
    value: Option<DynamicMessage>,
    /// Identifies the patch (filter, revision, index) in versions.
    id: u64,
}

impl CompiledFilter {
    /// Builds every patch value (validation already checked them; a value
    /// that no longer builds, say after an upgrade, leaves the filter out).
    pub fn new(cfg: &Config<EnvoyFilter>) -> Result<CompiledFilter, String> {
        let mut patches = Vec::new();
        for (i, p) in cfg.spec.config_patches.iter().enumerate() {
            let (Some(apply_to), Some(op)) = (p.apply_to, p.operation()) else { continue };
            let value = match (apply_to.message(), p.patch.as_ref().and_then(|p| p.value.as_ref())) {
                (Some(message), Some(v)) if op != Operation::Remove => {
                    Some(api::message_from_json(message, v).map_err(|(path, e)| format!("spec.configPatches[{i}].patch.value.{path}: {e}"))?)
                }
                _ => None,
            };
            let m = p.match_.as_ref();
            let proxy = m.and_then(|m| m.proxy.as_ref());
            let proxy_version = match proxy.map(|p| p.proxy_version.as_str()).filter(|v| !v.is_empty()) {
                Some(re) => Some(regex::Regex::new(re).map_err(|e| format!("spec.configPatches[{i}].match.proxy.proxyVersion: {e}"))?),
                None => None,
            };
            let id = fnv1a(format!("{}/{}@{}#{i}", cfg.key.namespace, cfg.key.name, cfg.mod_revision).as_bytes());
            patches.push(CompiledPatch {
                apply_to,
                op,
                context: p.context(),
                proxy_version,
                metadata: proxy.map(|p| p.metadata.clone()).unwrap_or_default(),
                listener: m.and_then(|m| m.listener.clone()),
                route: m.and_then(|m| m.route_configuration.clone()),
                cluster: m.and_then(|m| m.cluster.clone()),
                value,
                id,
            });
        }
        Ok(CompiledFilter {
            key: cfg.key.clone(),
            create_revision: cfg.create_revision,
            priority: cfg.spec.priority,
            selector: cfg.spec.selector().cloned(),
            patches,
        })
    }

    /// Istio's global order (`initEnvoyFilters`).
    pub fn order_key(&self) -> (i32, u64, String) {
        (self.priority, self.create_revision, format!("{}.{}", self.key.name, self.key.namespace))
    }
}

impl CompiledPatch {
    fn proxy_matches(&self, proxy: &ProxyIdentity) -> bool {
        if let Some(re) = &self.proxy_version {
            match &proxy.istio_version {
                Some(v) if re.is_match(v) => {}
                _ => return false,
            }
        }
        self.metadata.iter().all(|(k, v)| proxy.metadata.get(k) == Some(v))
    }

    /// Whether the patch applies where the generation context is `ctx`.
    fn in_context(&self, ctx: PatchContext) -> bool {
        self.context == PatchContext::Any || self.context == ctx
    }

    /// For ADD of whole listeners and clusters: ANY adds only outbound
    /// and at gateways.
    fn adds_in(&self, ctx: PatchContext) -> bool {
        self.context == ctx || (self.context == PatchContext::Any && ctx != PatchContext::SidecarInbound)
    }

    fn value_as<M: Message + Default>(&self) -> Option<M> {
        self.value.as_ref().and_then(|v| api::from_dynamic::<M>(v).ok())
    }
}

/// The patches that apply to one proxy, by `applyTo`, in order.
pub struct ProxyPatches<'a> {
    by_kind: BTreeMap<ApplyTo, Vec<&'a CompiledPatch>>,
}

impl<'a> ProxyPatches<'a> {
    pub fn for_proxy(mesh: &'a Mesh, proxy: &ProxyIdentity) -> Option<ProxyPatches<'a>> {
        if proxy.kind == ProxyKind::Grpc || mesh.envoy_filters.is_empty() {
            return None;
        }
        let root = &mesh.config.root_namespace;
        let mut filters: Vec<&CompiledFilter> = mesh
            .envoy_filters
            .iter()
            .map(|f| f.as_ref())
            .filter(|f| crate::scope::policy_selects(&f.key.namespace, f.selector.as_ref(), root, proxy))
            .collect();
        filters.sort_by_key(|f| (f.priority, f.key.namespace != *root, f.create_revision, format!("{}.{}", f.key.name, f.key.namespace)));
        let mut by_kind: BTreeMap<ApplyTo, Vec<&CompiledPatch>> = BTreeMap::new();
        for p in filters.iter().flat_map(|f| f.patches.iter()).filter(|p| p.proxy_matches(proxy)) {
            by_kind.entry(p.apply_to).or_default().push(p);
        }
        (!by_kind.is_empty()).then_some(ProxyPatches { by_kind })
    }

    fn of(&self, kind: ApplyTo) -> &[&'a CompiledPatch] {
        self.by_kind.get(&kind).map_or(&[], Vec::as_slice)
    }
}

/// Which patches touched one resource (for its version).
#[derive(Default)]
struct Touched(Vec<u64>);

impl Touched {
    fn add(&mut self, p: &CompiledPatch) {
        self.0.push(p.id);
    }
    fn version(&self, base: &str) -> String {
        let mut bytes = base.as_bytes().to_vec();
        for id in &self.0 {
            bytes.extend_from_slice(&id.to_le_bytes());
        }
        format!("{:016x}", fnv1a(&bytes))
    }
}

/// Applies the EnvoyFilters that select `proxy` to its config. Returns
/// whether any applied to it (matched or not).
pub fn apply(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity) -> bool {
    apply_after(cfg, mesh, proxy, None).is_some()
}

/// What one proxy's last patching started from and gave: its unpatched
/// config, the patched one, and the patches (by id, in order).
pub struct Patched<'a> {
    pub base: &'a ProxyConfig,
    pub served: &'a ProxyConfig,
    pub ids: &'a [u64],
}

/// [`apply`], reusing `prev`'s patched resources of every type whose
/// unpatched map is the same (`Arc`) and whose patches are the same ones:
/// an incremental translation re-patches only what it rebuilt. The ids of
/// the patches that apply, if any.
pub fn apply_after(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, prev: Option<Patched>) -> Option<Vec<u64>> {
    let patches = ProxyPatches::for_proxy(mesh, proxy)?;
    let ids: Vec<u64> = patches.by_kind.values().flatten().map(|p| p.id).collect();
    let reuse = |cfg: &mut ProxyConfig, t: ResourceType| -> bool {
        let Some(prev) = prev.as_ref().filter(|p| p.ids == ids.as_slice()) else { return false };
        let same = match (prev.base.resources.get(&t), cfg.resources.get(&t)) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        };
        match prev.served.resources.get(&t).filter(|_| same) {
            Some(served) => {
                cfg.resources.insert(t, served.clone());
                true
            }
            None => false,
        }
    };
    let inbound = inbound_listener_names(mesh, proxy);
    let outbound_ctx = if proxy.kind == ProxyKind::Router { PatchContext::Gateway } else { PatchContext::SidecarOutbound };
    let listener_ctx = |name: &str| match proxy.kind {
        ProxyKind::Router => PatchContext::Gateway,
        _ if inbound.iter().any(|n| n == name) => PatchContext::SidecarInbound,
        _ => PatchContext::SidecarOutbound,
    };
    let cluster_ctx = |name: &str| match proxy.kind {
        ProxyKind::Router => PatchContext::Gateway,
        _ if name.starts_with("inbound|") || name == "InboundPassthroughCluster" => PatchContext::SidecarInbound,
        _ => PatchContext::SidecarOutbound,
    };
    let gen_contexts: &[PatchContext] =
        if proxy.kind == ProxyKind::Router { &[PatchContext::Gateway] } else { &[PatchContext::SidecarOutbound, PatchContext::SidecarInbound] };

    // Clusters.
    let reused = reuse(cfg, ResourceType::Cluster);
    if let Some(map) = cfg.resources.get(&ResourceType::Cluster).cloned().filter(|_| !reused) {
        let mut out = map.as_ref().clone();
        let kinds = patches.of(ApplyTo::Cluster);
        if !kinds.is_empty() {
            for (name, res) in map.iter() {
                let Ok(mut c) = Cluster::decode(res.any.value.as_slice()) else { continue };
                let ctx = cluster_ctx(name);
                let mut touched = Touched::default();
                let mut removed = false;
                for p in kinds.iter() {
                    if !(p.in_context(ctx) && cluster_matches(p.cluster.as_ref(), &c)) {
                        continue;
                    }
                    match p.op {
                        Operation::Merge => {
                            if let Some(v) = &p.value {
                                if merge_into(&mut c, v).is_ok() {
                                    touched.add(p);
                                }
                            }
                        }
                        Operation::Remove => removed = true,
                        Operation::Replace => {
                            if let Some(v) = p.value_as::<Cluster>() {
                                c = v;
                                touched.add(p);
                            }
                        }
                        _ => {}
                    }
                    if removed {
                        break;
                    }
                }
                if removed {
                    out.remove(name);
                } else if !touched.0.is_empty() {
                    out.insert(
                        name.clone(),
                        std::sync::Arc::new(XdsResource::with_version::<Cluster>(name.clone(), c.encode_to_vec(), touched.version(&res.version))),
                    );
                }
            }
            for ctx in gen_contexts {
                for p in kinds.iter().filter(|p| p.op == Operation::Add && p.adds_in(*ctx)) {
                    if let Some(c) = p.value_as::<Cluster>() {
                        out.insert(c.name.clone(), std::sync::Arc::new(XdsResource::new(c.name.clone(), &c)));
                    }
                }
            }
            cfg.resources.insert(ResourceType::Cluster, std::sync::Arc::new(out));
        }
    }

    // Route configurations served over RDS.
    let reused = reuse(cfg, ResourceType::Route);
    if let Some(map) = cfg.resources.get(&ResourceType::Route).cloned().filter(|_| !reused) {
        if has_route_patches(&patches) {
            let mut out = map.as_ref().clone();
            for (name, res) in map.iter() {
                let Ok(mut rc) = RouteConfiguration::decode(res.any.value.as_slice()) else { continue };
                let mut touched = Touched::default();
                patch_route_configuration(&mut rc, outbound_ctx, &patches, &mut touched);
                if !touched.0.is_empty() {
                    let bytes = crate::encode::route_configuration_bytes(&rc);
                    out.insert(
                        name.clone(),
                        std::sync::Arc::new(XdsResource::with_version::<RouteConfiguration>(name.clone(), bytes, touched.version(&res.version))),
                    );
                }
            }
            cfg.resources.insert(ResourceType::Route, std::sync::Arc::new(out));
        }
    }

    // Listeners.
    let reused = reuse(cfg, ResourceType::Listener);
    if let Some(map) = cfg.resources.get(&ResourceType::Listener).cloned().filter(|_| !reused) {
        let mut out = map.as_ref().clone();
        for (name, res) in map.iter() {
            let Ok(mut l) = Listener::decode(res.any.value.as_slice()) else { continue };
            let mut touched = Touched::default();
            let keep = patch_listener(&mut l, listener_ctx(name), &patches, &mut touched);
            if !keep {
                out.remove(name);
            } else if !touched.0.is_empty() {
                out.insert(
                    name.clone(),
                    std::sync::Arc::new(XdsResource::with_version::<Listener>(name.clone(), l.encode_to_vec(), touched.version(&res.version))),
                );
            }
        }
        for ctx in gen_contexts {
            for p in patches.of(ApplyTo::Listener).iter().filter(|p| p.op == Operation::Add && p.adds_in(*ctx)) {
                if let Some(l) = p.value_as::<Listener>() {
                    out.insert(l.name.clone(), std::sync::Arc::new(XdsResource::new(l.name.clone(), &l)));
                }
            }
        }
        cfg.resources.insert(ResourceType::Listener, std::sync::Arc::new(out));
    }

    // Extension configs (ECDS).
    if let Some(map) = extension_configs(&patches) {
        cfg.resources.insert(ResourceType::ExtensionConfig, std::sync::Arc::new(map));
    }
    Some(ids)
}

/// ECDS: one `TypedExtensionConfig` per EXTENSION_CONFIG ADD, by name (of
/// two with one name, the later patch wins, as Envoy keeps the last of a
/// response). As istiod's `InsertedExtensionConfigurations`: `match.context`
/// is not looked at, other operations add nothing (validation warns), and
/// Envoy asks for the names its filters' `config_discovery` give.
fn extension_configs(patches: &ProxyPatches) -> Option<crate::resources::ResourceMap> {
    let mut out = crate::resources::ResourceMap::new();
    for p in patches.of(ApplyTo::ExtensionConfig).iter().filter(|p| p.op == Operation::Add) {
        let Some(ec) = p.value_as::<TypedExtensionConfig>() else { continue };
        let mut touched = Touched::default();
        touched.add(p);
        let version = touched.version(&ec.name);
        out.insert(ec.name.clone(), std::sync::Arc::new(XdsResource::with_version::<TypedExtensionConfig>(ec.name.clone(), ec.encode_to_vec(), version)));
    }
    (!out.is_empty()).then_some(out)
}

/// The names of a sidecar's inbound listeners: its Sidecar's `ingress`
/// ports (`<bind>_<port>`), or `virtualInbound` when captured.
fn inbound_listener_names(mesh: &Mesh, proxy: &ProxyIdentity) -> Vec<String> {
    if proxy.kind != ProxyKind::Sidecar {
        return Vec::new();
    }
    if proxy.capture {
        return vec![VIRTUAL_INBOUND.to_string()];
    }
    let Some(sc) = crate::scope::sidecar_for(mesh, proxy) else { return Vec::new() };
    crate::inbound::sidecar_ports(proxy, sc).iter().map(|p| format!("{}_{}", p.bind, p.port)).collect()
}

fn has_route_patches(p: &ProxyPatches) -> bool {
    [ApplyTo::RouteConfiguration, ApplyTo::VirtualHost, ApplyTo::HttpRoute].iter().any(|k| !p.of(*k).is_empty())
}

/// Istio's MERGE of `patch` into a generated message.
fn merge_into<M: Message + Name + Default>(target: &mut M, patch: &DynamicMessage) -> Result<(), String> {
    let mut base = api::to_dynamic(target)?;
    if base.descriptor() != patch.descriptor() {
        return Err(format!("cannot merge {} into {}", api::full_name(patch), M::full_name()));
    }
    api::merge(&mut base, patch);
    *target = api::from_dynamic(&base)?;
    Ok(())
}

/// Merges two typed configs of the same type (Istio's `MergeAnyWithAny`).
fn merge_any(base: &mut Any, patch: &Any) -> Result<(), String> {
    if api::type_name(&base.type_url) != api::type_name(&patch.type_url) {
        return Err(format!("cannot merge a {} into a {}", patch.type_url, base.type_url));
    }
    let mut b = api::unpack(&base.type_url, &base.value)?;
    let p = api::unpack(&patch.type_url, &patch.value)?;
    api::merge(&mut b, &p);
    base.value = prost::Message::encode_to_vec(&b);
    Ok(())
}

// ---------------------------------------------------------------------------
// Clusters.
// ---------------------------------------------------------------------------

/// Istio's `clusterMatch`: a name is exact; otherwise the fields given
/// must equal those parsed from `<direction>|<port>|<subset>|<host>`.
fn cluster_matches(m: Option<&ClusterMatch>, c: &Cluster) -> bool {
    let Some(m) = m else { return true };
    if !m.name.is_empty() {
        return m.name == c.name;
    }
    let parts: Vec<&str> = c.name.splitn(4, '|').collect();
    let (port, subset, host) = match parts.as_slice() {
        [_, port, subset, host] => (port.parse::<u32>().unwrap_or(0), *subset, *host),
        _ => (0, "", ""),
    };
    (m.subset.is_empty() || m.subset == subset) && (m.service.is_empty() || m.service == host) && (m.port_number == 0 || m.port_number == port)
}

// ---------------------------------------------------------------------------
// Route configurations, virtual hosts, routes.
// ---------------------------------------------------------------------------

/// The port a route configuration serves, and (gateway HTTPS) its port
/// name and gateway, from its name: `9080`, `inbound|9080||`, `http.8080`,
/// `https.443.https.gw.ns`.
fn route_name_parts(name: &str) -> (u32, &str, String) {
    if let Some(rest) = name.strip_prefix("inbound|") {
        return (rest.split('|').next().and_then(|p| p.parse().ok()).unwrap_or(0), "", String::new());
    }
    if let Some(port) = name.strip_prefix("http.") {
        return (port.parse().unwrap_or(0), "", String::new());
    }
    if let Some(rest) = name.strip_prefix("https.") {
        let parts: Vec<&str> = rest.splitn(4, '.').collect();
        if let [port, port_name, gw, ns] = parts.as_slice() {
            return (port.parse().unwrap_or(0), port_name, format!("{ns}/{gw}"));
        }
    }
    (name.parse().unwrap_or(0), "", String::new())
}

fn route_config_matches(m: Option<&RouteConfigurationMatch>, rc: &RouteConfiguration) -> bool {
    let Some(m) = m else { return true };
    if !m.name.is_empty() && m.name != rc.name {
        return false;
    }
    let (port, port_name, gateway) = route_name_parts(&rc.name);
    (m.port_number == 0 || m.port_number == port) && (m.port_name.is_empty() || m.port_name == port_name) && (m.gateway.is_empty() || m.gateway == gateway)
}

fn vhost_matches(m: Option<&RouteConfigurationMatch>, vh: &VirtualHost) -> bool {
    let Some(v) = m.and_then(|m| m.vhost.as_ref()) else { return true };
    (v.name.is_empty() || v.name == vh.name) && (v.domain_name.is_empty() || vh.domains.contains(&v.domain_name))
}

fn route_matches(m: Option<&RouteConfigurationMatch>, r: &Route) -> bool {
    let Some(rm) = m.and_then(|m| m.vhost.as_ref()).and_then(|v| v.route.as_ref()) else { return true };
    if !rm.name.is_empty() && rm.name != r.name {
        return false;
    }
    match rm.action.unwrap_or_default() {
        RouteAction::Any => true,
        RouteAction::Route => matches!(r.action, Some(route::Action::Route(_))),
        RouteAction::Redirect => matches!(r.action, Some(route::Action::Redirect(_))),
        RouteAction::DirectResponse => matches!(r.action, Some(route::Action::DirectResponse(_))),
    }
}

/// Whether an HTTP_ROUTE patch names a route to match.
fn has_route_match(m: Option<&RouteConfigurationMatch>) -> bool {
    m.and_then(|m| m.vhost.as_ref()).and_then(|v| v.route.as_ref()).is_some_and(|r| !r.name.is_empty() || r.action.is_some_and(|a| a != RouteAction::Any))
}

fn patch_route_configuration(rc: &mut RouteConfiguration, ctx: PatchContext, patches: &ProxyPatches, touched: &mut Touched) {
    for p in patches.of(ApplyTo::RouteConfiguration) {
        if !(p.op == Operation::Merge && p.in_context(ctx) && route_config_matches(p.route.as_ref(), rc)) {
            continue;
        }
        if let Some(v) = &p.value {
            if merge_into(rc, v).is_ok() {
                touched.add(p);
            }
        }
    }
    let rc_ok = |p: &&&CompiledPatch, rc: &RouteConfiguration| p.in_context(ctx) && route_config_matches(p.route.as_ref(), rc);
    // Virtual hosts: MERGE/REPLACE/REMOVE in place, then each one's routes,
    // then ADDs appended.
    let vh_patches: Vec<&&CompiledPatch> = patches.of(ApplyTo::VirtualHost).iter().filter(|p| rc_ok(p, rc)).collect();
    let route_patches: Vec<&&CompiledPatch> = patches.of(ApplyTo::HttpRoute).iter().filter(|p| rc_ok(p, rc)).collect();
    let mut vhosts = Vec::with_capacity(rc.virtual_hosts.len());
    for mut vh in std::mem::take(&mut rc.virtual_hosts) {
        let mut removed = false;
        for p in vh_patches.iter() {
            if !vhost_matches(p.route.as_ref(), &vh) {
                continue;
            }
            match p.op {
                Operation::Merge => {
                    if let Some(v) = &p.value {
                        if merge_into(&mut vh, v).is_ok() {
                            touched.add(p);
                        }
                    }
                }
                Operation::Replace => {
                    if let Some(v) = p.value_as::<VirtualHost>() {
                        vh = v;
                        touched.add(p);
                    }
                }
                Operation::Remove => {
                    removed = true;
                    touched.add(p);
                    break;
                }
                _ => {}
            }
        }
        if removed {
            continue;
        }
        for p in route_patches.iter() {
            if !vhost_matches(p.route.as_ref(), &vh) {
                continue;
            }
            patch_routes(&mut vh.routes, p, touched);
        }
        vhosts.push(vh);
    }
    for p in vh_patches.iter().filter(|p| p.op == Operation::Add) {
        if let Some(v) = p.value_as::<VirtualHost>() {
            vhosts.push(v);
            touched.add(p);
        }
    }
    rc.virtual_hosts = vhosts;
}

fn patch_routes(routes: &mut Vec<Route>, p: &CompiledPatch, touched: &mut Touched) {
    let m = p.route.as_ref();
    let matching = |r: &Route| route_matches(m, r);
    let before = routes.len();
    match p.op {
        Operation::Merge => {
            for r in routes.iter_mut().filter(|r| matching(r)) {
                if let Some(v) = &p.value {
                    if merge_into(r, v).is_ok() {
                        touched.add(p);
                    }
                }
            }
            return;
        }
        Operation::Remove => routes.retain(|r| !matching(r)),
        Operation::Replace => return,
        op => {
            let Some(value) = p.value_as::<Route>() else { return };
            let first = routes.iter().position(matching);
            let at = match (op, has_route_match(m), first) {
                (Operation::Add, _, _) => Some(routes.len()),
                (Operation::InsertFirst, false, _) | (Operation::InsertFirst, true, Some(_)) => Some(0),
                (Operation::InsertBefore, false, _) => Some(0),
                (Operation::InsertBefore, true, Some(i)) => Some(i),
                (Operation::InsertAfter, false, _) => Some(routes.len()),
                (Operation::InsertAfter, true, Some(i)) => Some(i + 1),
                _ => None,
            };
            if let Some(at) = at {
                routes.insert(at, value);
                touched.add(p);
            }
            return;
        }
    }
    if routes.len() != before {
        touched.add(p);
    }
}

// ---------------------------------------------------------------------------
// Listeners, listener filters, filter chains, network and HTTP filters.
// ---------------------------------------------------------------------------

fn is_virtual(l: &Listener) -> bool {
    l.name == VIRTUAL_INBOUND || l.name == VIRTUAL_OUTBOUND
}

fn listener_port(l: &Listener) -> u32 {
    use envoy_types::pb::envoy::config::core::v3::{address::Address as A, socket_address::PortSpecifier};
    match l.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(A::SocketAddress(s)) => match s.port_specifier {
            Some(PortSpecifier::PortValue(p)) => p,
            _ => 0,
        },
        _ => 0,
    }
}

/// Istio's `listenerMatch`: name, and port (on the virtual listeners the
/// port is a filter chain's, except for LISTENER patches).
fn listener_matches(m: Option<&ListenerMatch>, l: &Listener, apply_to: ApplyTo) -> bool {
    let Some(m) = m else { return true };
    if !m.name.is_empty() && m.name != l.name {
        return false;
    }
    if m.port_number == 0 || (is_virtual(l) && apply_to != ApplyTo::Listener) {
        return true;
    }
    m.port_number == listener_port(l)
}

/// Istio's `filterChainMatch` (the network filter name is checked per filter).
fn chain_matches(m: Option<&ListenerMatch>, l: &Listener, fc: &FilterChain) -> bool {
    let Some(m) = m else { return true };
    let fcm = fc.filter_chain_match.as_ref();
    let dest_port = fcm.and_then(|f| f.destination_port.as_ref()).map(|p| p.value);
    if is_virtual(l) && m.port_number > 0 && dest_port != Some(m.port_number) {
        return false;
    }
    let Some(c) = &m.filter_chain else { return true };
    if !c.name.is_empty() && c.name != fc.name {
        return false;
    }
    if !c.sni.is_empty() && !fcm.is_some_and(|f| f.server_names.contains(&c.sni)) {
        return false;
    }
    if !c.transport_protocol.is_empty() && fcm.map(|f| f.transport_protocol.as_str()) != Some(c.transport_protocol.as_str()) {
        return false;
    }
    if !c.application_protocols.is_empty()
        && !c.application_protocols.split(',').all(|a| fcm.is_some_and(|f| f.application_protocols.iter().any(|x| x == a.trim())))
    {
        return false;
    }
    c.destination_port == 0 || dest_port == Some(c.destination_port)
}

fn filter_name_match(m: Option<&ListenerMatch>) -> Option<&str> {
    m.and_then(|m| m.filter_chain.as_ref()).and_then(|c| c.filter.as_ref()).map(|f| f.name.as_str()).filter(|n| !n.is_empty())
}

fn sub_filter_match(m: Option<&ListenerMatch>) -> Option<&str> {
    m.and_then(|m| m.filter_chain.as_ref())
        .and_then(|c| c.filter.as_ref())
        .and_then(|f| f.sub_filter.as_ref())
        .map(|s| s.name.as_str())
        .filter(|n| !n.is_empty())
}

/// The list operations Istio shares among network, HTTP and listener
/// filters: `target` is the name to match (none: no match given).
fn list_op<T>(items: &mut Vec<T>, op: Operation, target: Option<&str>, name: impl Fn(&T) -> &str, value: impl FnOnce() -> Option<T>) -> bool {
    let first = target.and_then(|t| items.iter().position(|i| name(i) == t));
    match op {
        Operation::Remove => {
            let Some(t) = target else { return false };
            let before = items.len();
            items.retain(|i| name(i) != t);
            return items.len() != before;
        }
        Operation::Replace => {
            let (Some(i), Some(v)) = (first, value()) else { return false };
            items[i] = v;
            return true;
        }
        _ => {}
    }
    let at = match (op, target, first) {
        (Operation::Add, _, _) => items.len(),
        (Operation::InsertFirst, _, _) => 0,
        (Operation::InsertBefore, None, _) => 0,
        (Operation::InsertBefore, Some(_), Some(i)) => i,
        (Operation::InsertAfter, None, _) => items.len(),
        (Operation::InsertAfter, Some(_), Some(i)) => i + 1,
        _ => return false,
    };
    let Some(v) = value() else { return false };
    items.insert(at, v);
    true
}

fn lf_name(f: &ListenerFilter) -> &str {
    &f.name
}

fn fname(f: &Filter) -> &str {
    &f.name
}

fn hname(h: &HttpFilter) -> &str {
    &h.name
}

/// Patches one listener; false if a patch removed it.
fn patch_listener(l: &mut Listener, ctx: PatchContext, patches: &ProxyPatches, touched: &mut Touched) -> bool {
    let ok = |p: &&&CompiledPatch, l: &Listener| p.in_context(ctx) && listener_matches(p.listener.as_ref(), l, p.apply_to);
    // Inline route configurations (inbound HTTP) first, as istiod patches
    // them when it builds the connection manager.
    if has_route_patches(patches) {
        for fc in l.filter_chains.iter_mut().chain(l.default_filter_chain.iter_mut()) {
            for f in fc.filters.iter_mut().filter(|f| f.name == HCM) {
                with_hcm(f, |hcm| {
                    let Some(RouteSpecifier::RouteConfig(rc)) = &mut hcm.route_specifier else { return false };
                    let mut t = Touched::default();
                    patch_route_configuration(rc, ctx, patches, &mut t);
                    let changed = !t.0.is_empty();
                    touched.0.extend(t.0);
                    changed
                });
            }
        }
    }
    for p in patches.of(ApplyTo::Listener) {
        if !ok(&p, l) {
            continue;
        }
        match p.op {
            Operation::Remove => return false,
            Operation::Merge => {
                if let Some(v) = &p.value {
                    if merge_into(l, v).is_ok() {
                        touched.add(p);
                    }
                }
            }
            _ => {}
        }
    }
    for p in patches.of(ApplyTo::ListenerFilter) {
        if !ok(&p, l) {
            continue;
        }
        let target = p.listener.as_ref().map(|m| m.listener_filter.as_str()).filter(|n| !n.is_empty());
        let changed = if p.op == Operation::Merge {
            let mut any = false;
            for f in l.listener_filters.iter_mut().filter(|f| target.is_some_and(|t| t == f.name)) {
                let Some(listener_filter::ConfigType::TypedConfig(base)) = &mut f.config_type else { continue };
                let v = p.value_as::<ListenerFilter>();
                if let Some(listener_filter::ConfigType::TypedConfig(pv)) = v.and_then(|v| v.config_type) {
                    any |= merge_any(base, &pv).is_ok();
                }
            }
            any
        } else {
            list_op(&mut l.listener_filters, p.op, target, lf_name, || p.value_as::<ListenerFilter>())
        };
        if changed {
            touched.add(p);
        }
    }
    let listener_snapshot = Listener { name: l.name.clone(), address: l.address.clone(), ..Default::default() };
    let mut chains = std::mem::take(&mut l.filter_chains);
    chains.retain_mut(|fc| patch_chain(fc, &listener_snapshot, ctx, patches, touched));
    if let Some(mut fc) = l.default_filter_chain.take() {
        if patch_chain(&mut fc, &listener_snapshot, ctx, patches, touched) {
            l.default_filter_chain = Some(fc);
        }
    }
    for p in patches.of(ApplyTo::FilterChain).iter().filter(|p| p.op == Operation::Add && ok(p, &listener_snapshot)) {
        if let Some(fc) = p.value_as::<FilterChain>() {
            chains.push(fc);
            touched.add(p);
        }
    }
    l.filter_chains = chains;
    true
}

/// Patches one filter chain; false if a patch removed it.
fn patch_chain(fc: &mut FilterChain, l: &Listener, ctx: PatchContext, patches: &ProxyPatches, touched: &mut Touched) -> bool {
    let ok = |p: &&&CompiledPatch, fc: &FilterChain| {
        p.in_context(ctx) && listener_matches(p.listener.as_ref(), l, p.apply_to) && chain_matches(p.listener.as_ref(), l, fc)
    };
    for p in patches.of(ApplyTo::FilterChain) {
        if !ok(&p, fc) {
            continue;
        }
        match p.op {
            Operation::Remove => {
                touched.add(p);
                return false;
            }
            Operation::Merge => {
                if let Some(v) = &p.value {
                    if merge_into(fc, v).is_ok() {
                        touched.add(p);
                    }
                }
            }
            _ => {}
        }
    }
    for p in patches.of(ApplyTo::NetworkFilter) {
        if p.op == Operation::Merge || !ok(&p, fc) {
            continue;
        }
        if list_op(&mut fc.filters, p.op, filter_name_match(p.listener.as_ref()), fname, || p.value_as::<Filter>()) {
            touched.add(p);
        }
    }
    let snapshot = FilterChain { name: fc.name.clone(), filter_chain_match: fc.filter_chain_match.clone(), ..Default::default() };
    for f in fc.filters.iter_mut() {
        for p in patches.of(ApplyTo::NetworkFilter).iter().filter(|p| p.op == Operation::Merge && ok(p, &snapshot)) {
            if filter_name_match(p.listener.as_ref()).is_some_and(|n| n != f.name) {
                continue;
            }
            if merge_filter(f, p) {
                touched.add(p);
            }
        }
        if f.name != HCM {
            continue;
        }
        let http: Vec<&&CompiledPatch> =
            patches.of(ApplyTo::HttpFilter).iter().filter(|p| ok(p, &snapshot) && filter_name_match(p.listener.as_ref()).is_none_or(|n| n == f.name)).collect();
        if http.is_empty() {
            continue;
        }
        with_hcm(f, |hcm| {
            let mut changed = false;
            for p in http.iter().filter(|p| p.op != Operation::Merge) {
                if list_op(&mut hcm.http_filters, p.op, sub_filter_match(p.listener.as_ref()), hname, || p.value_as::<HttpFilter>()) {
                    touched.add(p);
                    changed = true;
                }
            }
            for h in hcm.http_filters.iter_mut() {
                for p in http.iter() {
                    if p.op != Operation::Merge || sub_filter_match(p.listener.as_ref()).is_some_and(|n| n != h.name) {
                        continue;
                    }
                    if merge_http_filter(h, p) {
                        touched.add(p);
                        changed = true;
                    }
                }
            }
            changed
        });
    }
    true
}

/// Runs `f` on the connection manager in `filter`'s typed_config and packs
/// it back if `f` says it changed it.
fn with_hcm(filter: &mut Filter, f: impl FnOnce(&mut HttpConnectionManager) -> bool) {
    let Some(filter::ConfigType::TypedConfig(any)) = &mut filter.config_type else { return };
    let Ok(mut hcm) = HttpConnectionManager::decode(any.value.as_slice()) else { return };
    if f(&mut hcm) {
        any.value = hcm.encode_to_vec();
    }
}

/// NETWORK_FILTER MERGE: the value's name renames; typed configs merge
/// (same type only). Filters without a typed_config are left alone.
fn merge_filter(f: &mut Filter, p: &CompiledPatch) -> bool {
    let Some(filter::ConfigType::TypedConfig(base)) = &mut f.config_type else { return false };
    let Some(v) = p.value_as::<Filter>() else { return false };
    let mut next = base.clone();
    if let Some(filter::ConfigType::TypedConfig(pv)) = &v.config_type {
        if merge_any(&mut next, pv).is_err() {
            return false;
        }
    }
    *base = next;
    if !v.name.is_empty() {
        f.name = v.name;
    }
    true
}

/// HTTP_FILTER MERGE, as [`merge_filter`].
fn merge_http_filter(h: &mut HttpFilter, p: &CompiledPatch) -> bool {
    let Some(http_filter::ConfigType::TypedConfig(base)) = &mut h.config_type else { return false };
    let Some(v) = p.value_as::<HttpFilter>() else { return false };
    let mut next = base.clone();
    if let Some(http_filter::ConfigType::TypedConfig(pv)) = &v.config_type {
        if merge_any(&mut next, pv).is_err() {
            return false;
        }
    }
    *base = next;
    if !v.name.is_empty() {
        h.name = v.name;
    }
    true
}
