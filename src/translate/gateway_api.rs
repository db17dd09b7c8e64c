//! The Gateway API translated into the Istio model, as Istio's own
//! controller does, plus the status a Kubernetes controller would write.
//! Pure: a function of one snapshot's Gateway API objects and of which
//! backends exist; `Mesh::build` runs it and adds what it generates to the
//! mesh's Gateways and VirtualServices, as if stored (never stored).
//!
//! - A Gateway whose GatewayClass names Lodestar's controller
//!   (`model::gateway_api::CONTROLLER_NAME`, or Istio's) becomes one Istio
//!   Gateway per HTTP/HTTPS listener (`<gateway>.<listener>`, one server;
//!   hosts `*/<listener hostname>`; `bind` the Gateway's first IPAddress
//!   address; HTTPS terminates with `credentialName` = the certificate
//!   Secret). Proxies select it by label: [`NAME_LABEL`] = the Gateway's
//!   name (in its namespace), or [`CLASS_LABEL`] = its class (one proxy
//!   serving every Gateway of a class, each at its own address).
//! - Each HTTPRoute attaches to the listeners its parentRefs name (by
//!   sectionName and port) that allow it (kinds, namespaces `Same`, `All`,
//!   or `Selector` over the labels of `Namespace` objects)
//!   and whose hostnames intersect its own. Every rule match becomes an
//!   Istio HTTP route; the routes of every HTTPRoute attached to one
//!   listener for one hostname form one VirtualService
//!   (`<gateway>.<listener>.<host>`), sorted by the spec's precedence
//!   (exact path, longest prefix, method, most headers, most query
//!   parameters, oldest route, then rule order).
//! - A ListenerSet whose Gateway's `allowedListeners` admits its namespace
//!   adds its listeners to that Gateway's, after the Gateway's own and
//!   those of older sets (then by namespace/name); one whose port an
//!   earlier listener has with another protocol, or with the same
//!   hostname, is Conflicted and not served. Routes reach a set's
//!   listeners through a `kind: ListenerSet` parentRef only.
//! - GRPCRoutes join HTTPRoutes on HTTP(S) listeners (a method is the
//!   path `/service/method`); TCPRoutes become TCP routes of a TCP
//!   listener, TLSRoutes TLS routes by SNI of a TLS listener passed
//!   through.
//! - Mesh routes (GAMMA): an HTTPRoute or GRPCRoute whose parentRef is a
//!   Service (core group) or a ServiceEntry routes the traffic of every sidecar to that
//!   service: one VirtualService per (route namespace, service host), no
//!   gateways, labelled [`MESH_ROUTE_LABEL`]. A route in the service's
//!   namespace (a producer route) applies to every client; one elsewhere
//!   (a consumer route) only to its own namespace's (`exportTo: .`).
//!   A parentRef `port` narrows the matches to that port.
//! - A listener is served if its protocol is (HTTP, HTTPS, TCP, TLS passed
//!   through) and, for HTTPS, its certificate is a Secret the Gateway may
//!   use (its namespace, or a ReferenceGrant) that exists and holds a
//!   certificate; else its conditions say why. A Gateway is Accepted
//!   while one of its own listeners is (`ListenersNotValid` when another
//!   is not), and not at all with an `infrastructure.parametersRef`
//!   (`InvalidParameters`: Lodestar takes none), then serving nothing.
//! - A backend that does not resolve (unknown kind, another namespace
//!   without a ReferenceGrant, not found) answers 500 for its share of the
//!   traffic (a fault abort), as the spec requires.

use super::mesh::Config;
use crate::model::gateway_api::{
    self as api, CorsFilter, GrpcRoute, GrpcRouteMatch, GrpcRouteRule, HttpBackendRef, HttpRoute, HttpRouteFilter, HttpRouteMatch, HttpRouteRule, L4Route,
    Listener, ObjectRef, ParentRef, Retry, Spec, Timeouts,
};
use crate::model::istio::{host_matches, DestinationRule, Gateway as IstioGateway, VirtualService};
use crate::model::{Kind, ResourceKey, StoredObject};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A proxy with this label = a Gateway's name (in the Gateway's
/// namespace) serves that Gateway (Istio's manual deployment).
pub const NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";
/// A proxy with this label = a GatewayClass's name serves every Gateway of
/// the class (merged gateways); generated Istio Gateways carry it too.
pub const CLASS_LABEL: &str = "gateway.networking.k8s.io/gateway-class-name";

/// A Gateway API object with its typed spec: what [`translate`] reads.
pub type Object = (Arc<StoredObject>, Spec);

/// Status by object (`Mesh::gateway_api_status`): a persistent map, so a
/// change to a few routes shares every other entry.
pub type Status = imbl::OrdMap<ResourceKey, Value>;

/// A backend, as the mesh resolves it.
pub enum BackendKind {
    /// A registry Service (core group, kind Service).
    Service,
    /// An Istio ServiceEntry (`networking.istio.io`).
    ServiceEntry,
}

/// A generated VirtualService of a mesh (GAMMA) route has this label.
pub const MESH_ROUTE_LABEL: &str = "gateway.networking.k8s.io/mesh-route";

/// Resolves a backend in a namespace to (hostname, port), the port being
/// the one asked for (checked to exist) or the service's only port.
pub trait Backends {
    /// The hostname of a service, whatever its ports.
    fn hostname(&self, kind: BackendKind, namespace: &str, name: &str) -> Option<String>;
    fn resolve(&self, kind: BackendKind, namespace: &str, name: &str, port: Option<u32>) -> Option<(String, u32)>;
    /// The number of a service's port of this name.
    fn port_named(&self, kind: BackendKind, namespace: &str, name: &str, port_name: &str) -> Option<u32>;
    /// The CA bundle (PEM) of the Secret `namespace/name`: its `ca.crt`
    /// (or `cacert`); `None` if there is no such Secret or it holds no CA.
    fn ca_bundle(&self, namespace: &str, name: &str) -> Option<String>;
    /// Whether the Secret `namespace/name` holds a certificate to serve
    /// (a stored one always comes with its key, checked to match when
    /// written), else why not.
    fn certificate(&self, namespace: &str, name: &str) -> Result<(), &'static str>;
}

/// What the translation produces.
#[derive(Debug, Clone, Default)]
pub struct Output {
    pub gateways: Vec<Arc<Config<IstioGateway>>>,
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    /// One per service a BackendTLSPolicy targets (`backend_tls`).
    pub destination_rules: Vec<Arc<Config<DestinationRule>>>,
    /// The CA bundles those rules name, and the Secrets they were read from.
    pub backend_cas: super::backend_tls::BackendCas,
    /// The Secrets (namespace, name) HTTPS listeners name as their
    /// certificate, there or not: a change to one changes their status.
    pub certificates: BTreeSet<(String, String)>,
    /// Status by object: GatewayClasses, Gateways and HTTPRoutes of ours.
    pub status: BTreeMap<ResourceKey, Value>,
    /// Objects whose translation failed, with why (a bug if ever seen).
    pub skipped: Vec<(ResourceKey, String)>,
    /// By the key of each generated VirtualService (also of one that came
    /// out empty and was left out): the routes attached to its slot (a
    /// listener and host, or a mesh route's namespace and service host).
    /// What [`update_routes`] re-translates when one of them changes.
    pub contributors: BTreeMap<ResourceKey, BTreeSet<ResourceKey>>,
}

pub(super) fn condition(kind: &str, ok: bool, reason: &str, message: &str, generation: u64) -> Value {
    json!({"type": kind, "status": if ok { "True" } else { "False" }, "reason": reason, "message": message, "observedGeneration": generation})
}

struct Class<'a> {
    controller: &'a str,
}

struct GatewayIn<'a> {
    obj: &'a StoredObject,
    spec: &'a api::Gateway,
    class: &'a str,
    controller: &'a str,
}

/// One listener of one of our Gateways, its own or a ListenerSet's.
struct ListenerState<'a> {
    gw: usize,
    /// The ListenerSet it comes from (an index into the accepted sets).
    set: Option<usize>,
    /// The namespace of the object it is written in (`allowedRoutes`
    /// `Same`), and the name of its generated Istio Gateway.
    ns: &'a str,
    id: String,
    listener: &'a Listener,
    /// Route kinds it admits: HTTPRoute and GRPCRoute on HTTP(S),
    /// TCPRoute on TCP, TLSRoute on TLS passed through.
    admits: Vec<&'static str>,
    /// Whether it is served (HTTP, or HTTPS with a usable certificate).
    served: bool,
    conditions: Vec<Value>,
    attached: u32,
}

/// Precedence of one generated HTTP route among those of one host.
type Rank = (u8, std::cmp::Reverse<usize>, u8, std::cmp::Reverse<usize>, std::cmp::Reverse<usize>, u64, String, String, usize, usize, usize);

pub fn translate(objects: &[(Arc<StoredObject>, Spec)], namespaces: &NamespaceLabels, backends: &dyn Backends) -> Output {
    let mut out = Output::default();
    let mut classes: BTreeMap<&str, Class> = BTreeMap::new();
    let mut grants: Vec<(&str, &api::ReferenceGrant)> = Vec::new();
    let mut routes: Vec<(&StoredObject, RouteIn)> = Vec::new();
    let mut gateway_objs: Vec<(&StoredObject, &api::Gateway)> = Vec::new();
    let mut policies: Vec<(&StoredObject, &api::BackendTlsPolicy)> = Vec::new();
    let mut set_objs: Vec<(&StoredObject, &api::ListenerSet)> = Vec::new();
    // Who sends to each backend host: BackendTLSPolicy ancestors.
    let mut ancestors: Ancestors = BTreeMap::new();
    for (obj, spec) in objects {
        match spec {
            Spec::GatewayClass(c) => {
                classes.insert(obj.key.name.as_str(), Class { controller: c.controller_name.as_str() });
                if api::is_ours(&c.controller_name) {
                    let status = json!({"conditions": [
                        condition("Accepted", true, "Accepted", "Handled by Lodestar", obj.version),
                        condition("SupportedVersion", true, "SupportedVersion", "", obj.version),
                    ]});
                    out.status.insert(obj.key.clone(), status);
                }
            }
            Spec::Gateway(g) => gateway_objs.push((obj, g)),
            Spec::HttpRoute(r) => routes.push((obj, RouteIn::Http(r))),
            Spec::GrpcRoute(r) => routes.push((obj, RouteIn::Grpc(r))),
            Spec::TcpRoute(r) => routes.push((obj, RouteIn::Tcp(r))),
            Spec::TlsRoute(r) => routes.push((obj, RouteIn::Tls(r))),
            Spec::ReferenceGrant(g) => grants.push((obj.key.namespace.as_str(), g)),
            Spec::BackendTlsPolicy(p) => policies.push((obj, p)),
            Spec::ListenerSet(l) => set_objs.push((obj, l)),
        }
    }
    let gateways: Vec<GatewayIn> = gateway_objs
        .iter()
        .copied()
        .filter_map(|(obj, spec)| {
            let class = classes.get(spec.gateway_class_name.as_str())?;
            api::is_ours(class.controller).then_some(GatewayIn { obj, spec, class: spec.gateway_class_name.as_str(), controller: class.controller })
        })
        .collect();
    let resolver = Resolver { backends, grants };

    // Listeners: what each admits and whether it is served; the
    // Gateways' own, then those of the ListenerSets they accept.
    let mut listeners: Vec<ListenerState> = Vec::new();
    for (gi, g) in gateways.iter().enumerate() {
        let ns = g.obj.key.namespace.as_str();
        for l in &g.spec.listeners {
            let id = format!("{}.{}", g.obj.key.name, l.name);
            listeners.push(listener_state(gi, None, l, ("Gateway", ns, id), ns, g.obj.version, &resolver));
        }
    }
    let sets = listener_sets(set_objs, &gateway_objs, &gateways, namespaces, &resolver, &mut listeners, &mut out);
    // A Gateway not accepted (its parametersRef) serves no listener.
    for l in listeners.iter_mut().filter(|l| invalid_parameters(gateways[l.gw].spec).is_some()) {
        l.served = false;
        if let Some(c) = l.conditions.iter_mut().find(|c| c["type"] == "Programmed") {
            *c = condition("Programmed", false, "Invalid", "the Gateway is not accepted", gateways[l.gw].obj.version);
        }
    }
    for l in &listeners {
        let certificate = l.listener.tls.as_ref().filter(|_| l.listener.protocol == "HTTPS").and_then(|t| t.certificate_refs.first());
        if let Some(r) = certificate.filter(|r| r.group_or("").is_empty() && r.kind_or("Secret") == "Secret") {
            out.certificates.insert((r.namespace_or(l.ns).to_string(), r.name.clone()));
        }
    }

    // Routes: attachment per parentRef, then their HTTP routes per
    // (listener, host).
    routes.sort_by(|(a, _), (b, _)| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    let mut by_host: BTreeMap<(usize, String), Vec<(Rank, Value)>> = BTreeMap::new();
    // TCPRoutes by listener; TLSRoutes by (listener, SNI host).
    let mut tcp: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    let mut tls: BTreeMap<(usize, String), Vec<Value>> = BTreeMap::new();
    let mut mesh_routes = MeshRoutes::new();
    // The routes of each (listener, host): HTTP, TCP (host `*`) or TLS.
    let mut slots: BTreeMap<(usize, String), BTreeSet<ResourceKey>> = BTreeMap::new();
    for (obj, route) in &routes {
        let ns = obj.key.namespace.as_str();
        let (parent_refs, _) = route.parents_and_hostnames();
        let mesh_only = !parent_refs.is_empty() && parent_refs.iter().all(ParentRef::is_mesh_service);
        let from = Referrer { kind: route.kind(), ns, mesh_only };
        let gen = obj.version;
        let refs = resolved_refs(route.backends(), &from, &resolver);
        let unsupported = route.unsupported_filter();
        let mut parents = Vec::new();
        let (parent_refs, hostnames) = route.parents_and_hostnames();
        let http_routes = route.http_routes(obj, &from, &resolver);
        for pref in parent_refs {
            if pref.is_mesh_service() {
                let parent = mesh_parent(obj, route, &http_routes, pref, (&from, &resolver), (&refs, unsupported.as_deref()), &mut mesh_routes);
                if parent["conditions"][0]["status"] == "True" {
                    let service = (
                        pref.group.clone().unwrap_or_default(),
                        pref.kind.clone().unwrap_or_default(),
                        pref.namespace.as_deref().unwrap_or(ns).to_string(),
                        pref.name.clone(),
                    );
                    add_ancestor(&mut ancestors, route, &from, &resolver, (api::CONTROLLER_NAME, service));
                }
                parents.push(parent);
                continue;
            }
            let parent_kind = pref.kind.as_deref().unwrap_or("Gateway");
            if pref.group.as_deref().unwrap_or(api::GROUP) != api::GROUP || !matches!(parent_kind, "Gateway" | "ListenerSet") {
                continue; // not a parent kind of ours
            }
            let parent_ns = pref.namespace.as_deref().unwrap_or(ns);
            // A Gateway's own listeners, or those of an accepted ListenerSet.
            let (gi, set) = if parent_kind == "Gateway" {
                let Some(gi) = gateways.iter().position(|g| g.obj.key.namespace == parent_ns && g.obj.key.name == pref.name) else { continue };
                (gi, None)
            } else {
                let Some(s) = sets.iter().find(|s| s.obj.key.namespace == parent_ns && s.obj.key.name == pref.name) else { continue };
                (s.gw, s.accepted.then_some(s.index))
            };
            let g = &gateways[gi];
            let gw_ns = g.obj.key.namespace.as_str();
            let candidates: Vec<usize> = (0..listeners.len())
                .filter(|&i| listeners[i].gw == gi && listeners[i].set == set && (set.is_some() || parent_kind == "Gateway"))
                .filter(|&i| pref.section_name.as_deref().is_none_or(|s| s == listeners[i].listener.name))
                .filter(|&i| pref.port.is_none_or(|p| p == listeners[i].listener.port))
                .collect();
            let mut accepted: Vec<(usize, Vec<String>)> = Vec::new();
            let mut allowed_any = false;
            for &i in &candidates {
                let l = &listeners[i];
                if !l.admits.contains(&from.kind) || !namespace_allowed(l.listener, l.ns, ns, namespaces) {
                    continue;
                }
                allowed_any = true;
                let hosts = intersect(l.listener.hostname.as_deref(), hostnames);
                if !hosts.is_empty() {
                    accepted.push((i, hosts));
                }
            }
            let accepted_cond = match (&accepted[..], &unsupported) {
                (_, Some(why)) => condition("Accepted", false, "UnsupportedValue", why, gen),
                ([], _) if parent_kind == "ListenerSet" && set.is_none() => {
                    condition("Accepted", false, "NoMatchingParent", "the ListenerSet is not accepted by its Gateway", gen)
                }
                ([], _) if candidates.is_empty() => condition("Accepted", false, "NoMatchingParent", "no listener matches the sectionName and port", gen),
                ([], _) if !allowed_any => condition("Accepted", false, "NotAllowedByListeners", "no listener allows this route", gen),
                ([], _) => condition("Accepted", false, "NoMatchingListenerHostname", "no listener hostname intersects the route's", gen),
                _ => condition("Accepted", true, "Accepted", "", gen),
            };
            let mut parent_ref = serde_json::to_value(pref).unwrap_or(Value::Null);
            parent_ref["group"] = json!(pref.group.as_deref().unwrap_or(api::GROUP));
            parent_ref["kind"] = json!(parent_kind);
            parents.push(json!({
                "parentRef": parent_ref,
                "controllerName": g.controller,
                "conditions": [accepted_cond, condition("ResolvedRefs", refs.ok, refs.reason, &refs.message, gen)],
            }));
            if unsupported.is_some() {
                continue;
            }
            if !accepted.is_empty() {
                let gateway = (api::GROUP.to_string(), "Gateway".to_string(), gw_ns.to_string(), g.obj.key.name.to_string());
                add_ancestor(&mut ancestors, route, &from, &resolver, (g.controller, gateway));
            }
            for (i, hosts) in accepted {
                listeners[i].attached += 1;
                if !listeners[i].served {
                    continue;
                }
                let port = listeners[i].listener.port;
                if matches!(route, RouteIn::Tcp(_)) {
                    slots.entry((i, "*".to_string())).or_default().insert(obj.key.clone());
                }
                let isolated = |h: &String| matches!(route, RouteIn::Http(_) | RouteIn::Grpc(_)) && isolated(&listeners, i, h);
                for host in hosts.into_iter().filter(|h| !isolated(h)) {
                    if !matches!(route, RouteIn::Tcp(_)) {
                        slots.entry((i, host.clone())).or_default().insert(obj.key.clone());
                    }
                    match route {
                        RouteIn::Http(_) | RouteIn::Grpc(_) => by_host.entry((i, host)).or_default().extend(http_routes.iter().cloned()),
                        RouteIn::Tcp(r) => tcp.entry(i).or_default().extend(l4_routes(r, None, port, &from, &resolver)),
                        RouteIn::Tls(r) => {
                            let entries = l4_routes(r, Some(&host), port, &from, &resolver);
                            tls.entry((i, host)).or_default().extend(entries);
                        }
                    }
                }
            }
        }
        if !parents.is_empty() {
            out.status.insert(obj.key.clone(), json!({"parents": parents}));
        }
    }

    // Istio Gateways, one per served listener; their VirtualServices.
    for l in &listeners {
        if !l.served {
            continue;
        }
        let g = &gateways[l.gw];
        let name = l.id.clone();
        let mut server = json!({
            "port": {"number": l.listener.port, "name": l.listener.name, "protocol": l.listener.protocol},
            "hosts": [format!("*/{}", l.listener.hostname.as_deref().unwrap_or("*"))],
        });
        if let Some(a) = g.spec.addresses.iter().find(|a| a.address_type() == "IPAddress") {
            server["bind"] = json!(a.value);
        }
        if l.listener.protocol == "TLS" {
            server["tls"] = json!({"mode": "PASSTHROUGH"});
        } else if let Some(r) = l.listener.tls.as_ref().and_then(|t| t.certificate_refs.first()) {
            let secret_ns = r.namespace_or(l.ns);
            let name = if secret_ns == g.obj.key.namespace { r.name.clone() } else { api::cross_namespace_secret(secret_ns, &r.name) };
            server["tls"] = json!({"mode": "SIMPLE", "credentialName": name});
        }
        let spec = json!({"selector": {NAME_LABEL: g.obj.key.name}, "servers": [server]});
        match serde_json::from_value::<IstioGateway>(spec) {
            Ok(spec) => out.gateways.push(generated(g.obj, Kind::Gateway, &name, (CLASS_LABEL, g.class), spec)),
            Err(e) => out.skipped.push((g.obj.key.clone(), format!("generated Gateway {name}: {e}"))),
        }
    }
    let http = by_host.into_iter().map(|((i, host), mut entries)| {
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        (i, host, "http", entries.into_iter().map(|(_, v)| v).collect::<Vec<_>>())
    });
    let tcp = tcp.into_iter().map(|(i, entries)| (i, "*".to_string(), "tcp", entries));
    let tls = tls.into_iter().map(|((i, host), entries)| (i, host, "tls", entries));
    for ((i, host), routes) in slots {
        let g = &gateways[listeners[i].gw];
        let name = format!("{}.{}", listeners[i].id, host.replace('*', "wildcard"));
        out.contributors.insert(ResourceKey::new(Kind::VirtualService, g.obj.key.namespace.as_str(), name), routes);
    }
    for (i, host, routes_kind, entries) in http.chain(tcp).chain(tls) {
        if entries.is_empty() {
            continue;
        }
        let l = &listeners[i];
        let g = &gateways[l.gw];
        let gw_name = format!("{}/{}", g.obj.key.namespace, l.id);
        let spec = json!({"hosts": [host], "gateways": [gw_name], routes_kind: entries});
        let name = format!("{}.{}", l.id, host.replace('*', "wildcard"));
        match serde_json::from_value::<VirtualService>(spec) {
            Ok(spec) => out.virtual_services.push(generated(g.obj, Kind::VirtualService, &name, (CLASS_LABEL, g.class), spec)),
            Err(e) => out.skipped.push((g.obj.key.clone(), format!("generated VirtualService {name}: {e}"))),
        }
    }

    // Mesh routes: one VirtualService per (route namespace, service host).
    for ((ns, host), m) in mesh_routes {
        let mut entries = m.entries;
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut spec = json!({"hosts": [host], "http": entries.into_iter().map(|(_, v)| v).collect::<Vec<_>>()});
        if m.consumer {
            spec["exportTo"] = json!(["."]);
        }
        let name = format!("mesh.{host}");
        out.contributors.insert(ResourceKey::new(Kind::VirtualService, ns.as_str(), name.as_str()), m.routes);
        match serde_json::from_value::<VirtualService>(spec) {
            Ok(spec) => out.virtual_services.push(generated(m.source, Kind::VirtualService, &name, (MESH_ROUTE_LABEL, &ns), spec)),
            Err(e) => out.skipped.push((m.source.key.clone(), format!("generated VirtualService {ns}/{name}: {e}"))),
        }
    }

    super::backend_tls::translate(&policies, &ancestors, backends, &mut out);

    // Gateway status, with each listener's attached routes.
    for (gi, g) in gateways.iter().enumerate() {
        let gen = g.obj.version;
        let ls = listener_status(&listeners, gi, None);
        let addresses: Vec<Value> = g.spec.addresses.iter().map(|a| json!({"type": a.address_type(), "value": a.value})).collect();
        // Without Kubernetes no address is assigned: it is spec.addresses
        // (which the listeners bind), else the address of each proxy that
        // serves the Gateway, which the snapshot does not know.
        let message = if addresses.is_empty() { "served to the proxies that select it, at their own addresses" } else { "" };
        // Accepted while one of its own listeners is (ListenersNotValid
        // when another is not), unless its parametersRef is unusable.
        let own = || listeners.iter().filter(|l| l.gw == gi && l.set.is_none());
        let valid = own().filter(|l| listener_accepted(l)).count();
        let (accepted, reason, why) = match invalid_parameters(g.spec) {
            Some(why) => (false, "InvalidParameters", why),
            None if valid == 0 => (false, "ListenersNotValid", "no listener is valid: see their conditions".to_string()),
            None if valid < own().count() => (true, "ListenersNotValid", "some listeners are not valid: see their conditions".to_string()),
            None => (true, "Accepted", String::new()),
        };
        let programmed =
            if accepted { condition("Programmed", true, "Programmed", message, gen) } else { condition("Programmed", false, "Invalid", &why, gen) };
        out.status.insert(
            g.obj.key.clone(),
            json!({
                "addresses": addresses,
                "conditions": [condition("Accepted", accepted, reason, &why, gen), programmed],
                "listeners": ls,
                "attachedListenerSets": sets.iter().filter(|s| s.gw == gi && s.accepted).count(),
            }),
        );
    }
    for s in &sets {
        let gen = s.obj.version;
        let (accepted, programmed) = if !s.accepted {
            let reason = s.reason;
            (condition("Accepted", false, reason, &s.message, gen), condition("Programmed", false, reason, &s.message, gen))
        } else {
            let reason = if s.all_valid { "Accepted" } else { "ListenersNotValid" };
            (condition("Accepted", true, reason, &s.message, gen), condition("Programmed", true, "Programmed", "", gen))
        };
        let mut status = json!({"conditions": [accepted, programmed]});
        if s.allowed {
            status["listeners"] = json!(listener_status(&listeners, s.gw, Some(s.index)));
        }
        out.status.insert(s.obj.key.clone(), status);
    }
    out
}

/// The `listeners` status of a Gateway's own listeners (`set` None) or of
/// one ListenerSet's.
fn listener_status(listeners: &[ListenerState], gw: usize, set: Option<usize>) -> Vec<Value> {
    listeners
        .iter()
        .filter(|l| l.gw == gw && l.set == set)
        .map(|l| {
            let kinds: Vec<Value> = l.admits.iter().map(|k| json!({"group": api::GROUP, "kind": k})).collect();
            json!({"name": l.listener.name, "supportedKinds": kinds, "attachedRoutes": l.attached, "conditions": l.conditions})
        })
        .collect()
}

/// One ListenerSet whose parent is one of our Gateways.
struct SetState<'a> {
    obj: &'a StoredObject,
    gw: usize,
    /// Its index among the sets (its listeners' `set`).
    index: usize,
    /// The Gateway's `allowedListeners` admits it.
    allowed: bool,
    /// Allowed, with at least one valid listener.
    accepted: bool,
    all_valid: bool,
    reason: &'static str,
    message: String,
}

/// The ListenerSets of our Gateways, oldest first (then by namespace and
/// name): whether each Gateway allows each, and its listeners merged after
/// the Gateway's own and earlier sets', a listener that conflicts with one
/// of those (same port: another protocol, or the same hostname) not
/// served. A set whose parent Gateway does not exist gets its status here;
/// one whose Gateway is another controller's is left alone.
fn listener_sets<'a>(
    mut set_objs: Vec<(&'a StoredObject, &'a api::ListenerSet)>,
    all_gateways: &[(&StoredObject, &api::Gateway)],
    gateways: &[GatewayIn<'a>],
    namespaces: &NamespaceLabels,
    resolver: &Resolver,
    listeners: &mut Vec<ListenerState<'a>>,
    out: &mut Output,
) -> Vec<SetState<'a>> {
    set_objs.sort_by(|(a, _), (b, _)| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    let mut sets = Vec::new();
    for (obj, set) in set_objs {
        let ns = obj.key.namespace.as_str();
        let p = &set.parent_ref;
        let gw_ns = p.namespace.as_deref().unwrap_or(ns);
        let Some(gi) = gateways.iter().position(|g| g.obj.key.namespace == gw_ns && g.obj.key.name == p.name) else {
            if !all_gateways.iter().any(|(g, _)| g.key.namespace == gw_ns && g.key.name == p.name) {
                let why = format!("no Gateway {gw_ns}/{}", p.name);
                let conditions = [
                    condition("Accepted", false, "ParentNotAccepted", &why, obj.version),
                    condition("Programmed", false, "ParentNotAccepted", &why, obj.version),
                ];
                out.status.insert(obj.key.clone(), json!({"conditions": conditions}));
            }
            continue;
        };
        let g = &gateways[gi];
        let index = sets.len();
        let from = g.spec.allowed_listeners.as_ref().and_then(|a| a.namespaces.as_ref());
        let allowed = match from.and_then(|f| f.from.as_deref()).unwrap_or("None") {
            "All" => true,
            "Same" => gw_ns == ns,
            "Selector" => from.and_then(|f| f.selector.as_ref()).is_some_and(|s| selector_matches(s, &namespace_labels(namespaces, ns))),
            _ => false,
        };
        let mut state = SetState { obj, gw: gi, index, allowed, accepted: false, all_valid: true, reason: "NotAllowed", message: String::new() };
        if !allowed {
            state.message = format!("Gateway {gw_ns}/{}'s allowedListeners does not admit ListenerSets of namespace {ns}", p.name);
            sets.push(state);
            continue;
        }
        for l in &set.listeners {
            let id = format!("{}.{}.{}.{}", g.obj.key.name, ns, obj.key.name, l.name);
            let mut st = listener_state(gi, Some(index), l, ("ListenerSet", ns, id), gw_ns, obj.version, resolver);
            let merged = listeners.iter().filter(|o| o.gw == gi && o.listener.port == l.port && !is_conflicted(o));
            let conflict = merged
                .map(|o| {
                    if o.listener.protocol != l.protocol {
                        "ProtocolConflict"
                    } else if o.listener.hostname == l.hostname {
                        "HostnameConflict"
                    } else {
                        ""
                    }
                })
                .find(|r| !r.is_empty());
            if let Some(reason) = conflict {
                let why = format!("port {} is taken by an earlier listener of the Gateway", l.port);
                let refs = st.conditions[1].clone();
                st.conditions = vec![
                    condition("Accepted", false, reason, &why, obj.version),
                    refs,
                    condition("Programmed", false, reason, &why, obj.version),
                    condition("Conflicted", true, reason, &why, obj.version),
                ];
                st.served = false;
            }
            let valid = st.served;
            state.accepted |= valid;
            state.all_valid &= valid;
            listeners.push(st);
        }
        if !state.accepted {
            state.reason = "ListenersNotValid";
            state.message = "no listener is valid".to_string();
        } else if !state.all_valid {
            state.message = "some listeners are not valid: see their conditions".to_string();
        }
        sets.push(state);
    }
    sets
}

/// Its `Accepted` condition is True (a supported protocol, no conflict).
fn listener_accepted(l: &ListenerState) -> bool {
    l.conditions.iter().any(|c| c["type"] == "Accepted" && c["status"] == "True")
}

/// Why a Gateway's `infrastructure.parametersRef` cannot be used: Lodestar
/// takes no infrastructure parameters, so any reference is (the spec's
/// InvalidParameters; Istio's a ConfigMap, which exists only in
/// Kubernetes).
fn invalid_parameters(g: &api::Gateway) -> Option<String> {
    let r = g.infrastructure.as_ref()?.get("parametersRef")?;
    let s = |k: &str| r[k].as_str().unwrap_or("").to_string();
    Some(format!("infrastructure.parametersRef {}/{} {}: Lodestar takes no infrastructure parameters", s("group"), s("kind"), s("name")))
}

fn is_conflicted(l: &ListenerState) -> bool {
    l.conditions.iter().any(|c| c["type"] == "Conflicted" && c["status"] == "True")
}

/// A listener's state: the route kinds it admits, and whether it can be
/// served (its protocol; an HTTPS certificate the owner, a Gateway or a
/// ListenerSet in namespace `owner_ns`, may use and the Gateway's proxies,
/// in `gw_ns`, can read).
fn listener_state<'a>(
    gw: usize,
    set: Option<usize>,
    l: &'a Listener,
    (owner_kind, owner_ns, id): (&str, &'a str, String),
    gw_ns: &str,
    gen: u64,
    resolver: &Resolver,
) -> ListenerState<'a> {
    let mut conditions = Vec::new();
    let passthrough = l.tls.as_ref().and_then(|t| t.mode.as_deref()) == Some("Passthrough");
    let supported: &[&'static str] = match l.protocol.as_str() {
        "HTTP" | "HTTPS" => &["HTTPRoute", "GRPCRoute"],
        "TCP" => &["TCPRoute"],
        "TLS" if passthrough => &["TLSRoute"],
        _ => &[],
    };
    let protocol_ok = !supported.is_empty();
    let kinds = l.allowed_routes.as_ref().map(|a| a.kinds.as_slice()).unwrap_or_default();
    let ours = |k: &api::RouteGroupKind| k.group.as_deref().unwrap_or(api::GROUP) == api::GROUP;
    let bad_kinds = kinds.iter().any(|k| !ours(k) || !supported.contains(&k.kind.as_str()));
    let admits: Vec<&'static str> = supported.iter().copied().filter(|s| kinds.is_empty() || kinds.iter().any(|k| ours(k) && k.kind == *s)).collect();
    // HTTPS: its first certificate, a Secret this namespace may use.
    let mut refs_ok = (!bad_kinds, if bad_kinds { "InvalidRouteKinds" } else { "ResolvedRefs" });
    let mut refs_message = String::new();
    if let Some(tls) = l.tls.as_ref().filter(|_| l.protocol == "HTTPS") {
        if tls.mode.as_deref().is_some_and(|m| m != "Terminate") {
            refs_ok = (false, "UnsupportedValue");
        } else if let Some(r) = tls.certificate_refs.first() {
            let secret_ns = r.namespace_or(owner_ns);
            if !r.group_or("").is_empty() || r.kind_or("Secret") != "Secret" {
                refs_ok = (false, "InvalidCertificateRef");
            } else if !resolver.granted(owner_kind, owner_ns, "", "Secret", secret_ns, &r.name) {
                refs_ok = (false, "RefNotPermitted");
            } else if secret_ns != gw_ns && !resolver.grants.iter().any(|(ns, g)| *ns == secret_ns && g.lets_gateways_read_secret(gw_ns, &r.name)) {
                // The Gateway's proxies (in its namespace) are served a
                // Secret of another namespace only if a ReferenceGrant
                // there lets that namespace's Gateways or ListenerSets
                // use it (`xds::secrets`, the same rule).
                refs_ok = (false, "InvalidCertificateRef");
            } else if let Err(why) = resolver.backends.certificate(secret_ns, &r.name) {
                // Missing, or holding no certificate (a CA bundle only):
                // nothing to terminate TLS with (Istio: InvalidTLS).
                refs_ok = (false, "InvalidCertificateRef");
                refs_message = format!("certificateRefs[0]: Secret {secret_ns}/{}: {why}", r.name);
            }
        }
    }
    let served = protocol_ok && refs_ok.0;
    conditions.push(if protocol_ok {
        condition("Accepted", true, "Accepted", "", gen)
    } else if l.protocol == "TLS" {
        let why = "TLS terminated at the gateway then forwarded as TCP is not supported: use mode Passthrough with TLSRoutes, or HTTPS";
        condition("Accepted", false, "UnsupportedProtocol", why, gen)
    } else {
        condition("Accepted", false, "UnsupportedProtocol", &format!("protocol {} is not supported", l.protocol), gen)
    });
    conditions.push(condition("ResolvedRefs", refs_ok.0, refs_ok.1, &refs_message, gen));
    conditions.push(condition("Programmed", served, if served { "Programmed" } else { "Invalid" }, "", gen));
    conditions.push(condition("Conflicted", false, "NoConflicts", "", gen));
    ListenerState { gw, set, ns: owner_ns, id, listener: l, admits, served, conditions, attached: 0 }
}

/// The translation after a change to routes only (HTTPRoute, GRPCRoute,
/// TCPRoute, TLSRoute), from the translation before it (`prev`), equal to
/// a full [`translate`] of the objects after it. `context`: every Gateway
/// API object that is not a route (unchanged since `prev`); `before` and
/// `after`: the changed routes as they were and as they are; `current`:
/// an unchanged route as it is. Only the slots (generated VirtualServices)
/// the changed routes had or have are translated again, from the routes
/// attached to them; the changed routes' status is theirs in that
/// translation, and each listener's `attachedRoutes` moves by what they
/// attach after minus what they attached before. `None` when the change
/// cannot be made so (BackendTLSPolicies: their ancestors are every
/// route's; a translation that skipped something): translate in full.
pub fn update_routes(
    prev: &Output,
    prev_status: &Status,
    context: &[Object],
    (before, after): (&[Object], &[Object]),
    current: &dyn Fn(&ResourceKey) -> Option<Object>,
    namespaces: &NamespaceLabels,
    backends: &dyn Backends,
) -> Option<(Output, Status)> {
    let is_route = |s: &Spec| matches!(s, Spec::HttpRoute(_) | Spec::GrpcRoute(_) | Spec::TcpRoute(_) | Spec::TlsRoute(_));
    if !prev.skipped.is_empty()
        || !prev.destination_rules.is_empty()
        || context.iter().any(|(_, s)| is_route(s) || matches!(s, Spec::BackendTlsPolicy(_)))
        || !before.iter().chain(after).all(|(_, s)| is_route(s))
    {
        return None;
    }
    let with = |routes: &[Object]| -> Vec<Object> { context.iter().chain(routes).cloned().collect() };
    let was = translate(&with(before), namespaces, backends);
    let is = translate(&with(after), namespaces, backends);
    let slots: BTreeSet<&ResourceKey> = was.contributors.keys().chain(is.contributors.keys()).collect();
    let changed: BTreeSet<&ResourceKey> = before.iter().chain(after).map(|(o, _)| &o.key).collect();
    // Every route of those slots, as it is now.
    let mut routes: Vec<Object> = after.to_vec();
    let others: BTreeSet<&ResourceKey> = slots.iter().filter_map(|s| prev.contributors.get(*s)).flatten().filter(|k| !changed.contains(k)).collect();
    for k in others {
        routes.push(current(k)?);
    }
    let now = translate(&with(&routes), namespaces, backends);
    if !was.skipped.is_empty() || !is.skipped.is_empty() || !now.skipped.is_empty() {
        return None;
    }
    let mut out = Output { virtual_services: prev.virtual_services.iter().filter(|v| !slots.contains(&v.key)).cloned().collect(), ..prev.clone() };
    out.virtual_services.extend(now.virtual_services.iter().filter(|v| slots.contains(&v.key)).cloned());
    for s in &slots {
        match now.contributors.get(*s) {
            Some(r) => out.contributors.insert((*s).clone(), r.clone()),
            None => out.contributors.remove(*s),
        };
    }
    let mut status = prev_status.clone();
    for k in &changed {
        match now.status.get(*k) {
            Some(v) => status.insert((*k).clone(), v.clone()),
            None => status.remove(*k),
        };
    }
    // attachedRoutes: as before, less what the changed routes attached,
    // plus what they attach now.
    let attached = |t: &Output, g: &ResourceKey, i: usize| t.status.get(g).and_then(|s| s["listeners"][i]["attachedRoutes"].as_i64()).unwrap_or(0);
    let of_kind = |k: Kind| status.range(ResourceKey::new(k, "", "")..).take_while(move |(key, _)| key.kind == k).map(|(key, _)| key.clone());
    let gateways: Vec<ResourceKey> = of_kind(Kind::KubeGateway).chain(of_kind(Kind::ListenerSet)).collect();
    for g in &gateways {
        let Some(s) = status.get_mut(g) else { continue };
        for (i, l) in s.get_mut("listeners").and_then(Value::as_array_mut).into_iter().flatten().enumerate() {
            let n = l["attachedRoutes"].as_i64().unwrap_or(0) - attached(&was, g, i) + attached(&is, g, i);
            l["attachedRoutes"] = json!(n);
        }
    }
    Some((out, status))
}

/// The parents (controller, ancestorRef) whose routes send to each backend
/// host: the ancestors of the BackendTLSPolicies of those hosts.
pub type Ancestors<'a> = BTreeMap<String, BTreeSet<(&'a str, AncestorRef)>>;

/// An ancestor's group, kind, namespace and name.
pub type AncestorRef = (String, String, String, String);

fn add_ancestor<'a>(ancestors: &mut Ancestors<'a>, route: &RouteIn, from: &Referrer, r: &Resolver, ancestor: (&'a str, AncestorRef)) {
    for b in route.backends() {
        if let Ok((host, _)) = backend_problem(&b, from, r) {
            ancestors.entry(host).or_default().insert(ancestor.clone());
        }
    }
}

/// The HTTP routes of mesh (GAMMA) routes, by (route namespace, service
/// host); the oldest route is the generated VirtualService's source.
type MeshRoutes<'a> = BTreeMap<(String, String), MeshHost<'a>>;

struct MeshHost<'a> {
    source: &'a StoredObject,
    /// A consumer route (not in the service's namespace).
    consumer: bool,
    entries: Vec<(Rank, Value)>,
    /// The routes whose entries these are.
    routes: BTreeSet<ResourceKey>,
}

/// A mesh parentRef (a Service): the route's HTTP routes into
/// `mesh_routes`, and its status (`unsupported`: why a filter the route
/// has is not supported, which refuses it as on a Gateway).
fn mesh_parent<'a>(
    obj: &'a StoredObject,
    route: &RouteIn,
    http_routes: &[(Rank, Value)],
    pref: &ParentRef,
    (from, r): (&Referrer, &Resolver),
    (refs, unsupported): (&RefsStatus, Option<&str>),
    mesh_routes: &mut MeshRoutes<'a>,
) -> Value {
    let gen = obj.version;
    let svc_ns = pref.namespace.as_deref().unwrap_or(from.ns);
    let kind = || if pref.kind.as_deref() == Some("ServiceEntry") { BackendKind::ServiceEntry } else { BackendKind::Service };
    let host = r.backends.hostname(kind(), svc_ns, &pref.name);
    let port_ok = pref.port.is_none_or(|p| host.is_some() && r.backends.resolve(kind(), svc_ns, &pref.name, Some(p)).is_some());
    let accepted = match (route, &host, unsupported) {
        (RouteIn::Tcp(_) | RouteIn::Tls(_), _, _) => {
            condition("Accepted", false, "UnsupportedValue", "TCP and TLS routes have no mesh (Service) parents yet", gen)
        }
        (_, _, Some(why)) => condition("Accepted", false, "UnsupportedValue", why, gen),
        (_, None, _) => condition("Accepted", false, "NoMatchingParent", &format!("no {} {svc_ns}/{}", pref.kind.as_deref().unwrap_or(""), pref.name), gen),
        (_, Some(_), _) if !port_ok => {
            let why = format!("{} {svc_ns}/{} has no port {}", pref.kind.as_deref().unwrap_or(""), pref.name, pref.port.unwrap_or(0));
            condition("Accepted", false, "NoMatchingParent", &why, gen)
        }
        _ => condition("Accepted", true, "Accepted", "", gen),
    };
    if let (Some(host), "True") = (&host, accepted["status"].as_str().unwrap_or("")) {
        let mut entries = http_routes.to_vec();
        if let Some(port) = pref.port {
            for (_, http) in &mut entries {
                for m in http["match"].as_array_mut().into_iter().flatten() {
                    m["port"] = json!(port);
                }
            }
        }
        let m = mesh_routes.entry((from.ns.to_string(), host.clone())).or_insert_with(|| MeshHost {
            source: obj,
            consumer: from.ns != svc_ns,
            entries: Vec::new(),
            routes: BTreeSet::new(),
        });
        m.entries.extend(entries);
        m.routes.insert(obj.key.clone());
    }
    let parent_ref = serde_json::to_value(pref).unwrap_or(Value::Null);
    json!({
        "parentRef": parent_ref,
        "controllerName": api::CONTROLLER_NAME,
        "conditions": [accepted, condition("ResolvedRefs", refs.ok, refs.reason, &refs.message, gen)],
    })
}

/// A generated object: the source's namespace and revisions, and one
/// label (its class, or a mesh route's namespace).
pub(super) fn generated<T>(source: &StoredObject, kind: Kind, name: &str, (label, value): (&str, &str), spec: T) -> Arc<Config<T>> {
    Arc::new(Config {
        key: ResourceKey::new(kind, source.key.namespace.as_str(), name),
        create_revision: source.create_revision,
        mod_revision: source.mod_revision,
        labels: BTreeMap::from([(label.to_string(), value.to_string())]),
        spec,
    })
}

/// Whether a generated Istio Gateway applies to a proxy: by its class
/// label, or by its Gateway's name label in the Gateway's namespace.
pub fn selects(gw: &Config<IstioGateway>, proxy: &crate::model::proxy::ProxyIdentity) -> Option<bool> {
    let class = gw.labels.get(CLASS_LABEL)?;
    let by_class = proxy.labels.get(CLASS_LABEL) == Some(class);
    let by_name = proxy.namespace == gw.key.namespace && gw.spec.selector.iter().all(|(k, v)| proxy.labels.get(k) == Some(v));
    Some(by_class || by_name)
}

/// Namespace name → its labels (from Namespace objects).
pub type NamespaceLabels = BTreeMap<String, BTreeMap<String, String>>;

fn namespace_allowed(l: &Listener, gw_ns: &str, route_ns: &str, namespaces: &NamespaceLabels) -> bool {
    let from = l.allowed_routes.as_ref().and_then(|a| a.namespaces.as_ref());
    match from.and_then(|n| n.from.as_deref()).unwrap_or("Same") {
        "All" => true,
        "Same" => gw_ns == route_ns,
        "Selector" => from.and_then(|n| n.selector.as_ref()).is_some_and(|s| selector_matches(s, &namespace_labels(namespaces, route_ns))),
        _ => false,
    }
}

/// A namespace's labels, with its name as a label (as in Kubernetes).
fn namespace_labels(namespaces: &NamespaceLabels, ns: &str) -> BTreeMap<String, String> {
    let mut labels = namespaces.get(ns).cloned().unwrap_or_default();
    labels.insert("kubernetes.io/metadata.name".into(), ns.to_string());
    labels
}

/// A Kubernetes label selector (`matchLabels`, `matchExpressions`) over
/// `labels`; an empty selector matches everything.
pub fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_label =
        selector["matchLabels"].as_object().into_iter().flatten().all(|(k, v)| v.as_str().is_some_and(|v| labels.get(k).map(String::as_str) == Some(v)));
    let by_expression = selector["matchExpressions"].as_array().into_iter().flatten().all(|e| {
        let value = e["key"].as_str().and_then(|k| labels.get(k));
        let listed = |v: &String| e["values"].as_array().into_iter().flatten().any(|x| x.as_str() == Some(v.as_str()));
        match e["operator"].as_str() {
            Some("In") => value.is_some_and(listed),
            Some("NotIn") => !value.is_some_and(listed),
            Some("Exists") => value.is_some(),
            Some("DoesNotExist") => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}

/// Listener isolation (GatewayHTTPListenerIsolation): a request goes to
/// the routes of the most specific listener of its Gateway and port that
/// matches its host, so a route's hostname `host` on listener `i` is left
/// out when every host it names also matches a more specific served
/// listener there (as `*.example.com` on a listener without hostname does
/// where another listener is `*.example.com`). Hosts only partly covered
/// stay: Envoy picks the most specific virtual host for those.
fn isolated(listeners: &[ListenerState], i: usize, host: &str) -> bool {
    let l = &listeners[i];
    let own = l.listener.hostname.as_deref().unwrap_or("*");
    listeners.iter().enumerate().any(|(j, o)| {
        j != i
            && o.gw == l.gw
            && o.served
            && o.listener.port == l.listener.port
            && o.listener.hostname.as_deref().is_some_and(|h| !h.eq_ignore_ascii_case(own) && host_matches(own, h) && host_matches(h, host))
    })
}

/// The hostnames a route answers on a listener (the spec's intersection).
pub fn intersect(listener: Option<&str>, route: &[String]) -> Vec<String> {
    let Some(l) = listener else {
        return if route.is_empty() { vec!["*".to_string()] } else { dedup(route.to_vec()) };
    };
    if route.is_empty() {
        return vec![l.to_string()];
    }
    let mut out = Vec::new();
    for h in route {
        if h == l || (host_matches(l, h) && !host_matches(h, l)) {
            out.push(h.clone());
        } else if host_matches(h, l) {
            out.push(l.to_string());
        }
    }
    dedup(out)
}

fn dedup(mut v: Vec<String>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    v.retain(|h| seen.insert(h.clone()));
    v
}

/// What resolving a reference needs: the backends, and the
/// ReferenceGrants (by their namespace).
struct Resolver<'a> {
    backends: &'a dyn Backends,
    grants: Vec<(&'a str, &'a api::ReferenceGrant)>,
}

impl Resolver<'_> {
    /// Whether a `from_kind` in `from_ns` may refer to `to_group`/`to_kind`
    /// `to_name` in `to_ns`: the same namespace, or a ReferenceGrant there.
    fn granted(&self, from_kind: &str, from_ns: &str, to_group: &str, to_kind: &str, to_ns: &str, to_name: &str) -> bool {
        from_ns == to_ns
            || self.grants.iter().any(|(ns, g)| {
                *ns == to_ns
                    && g.from.iter().any(|f| f.group == api::GROUP && f.kind == from_kind && f.namespace == from_ns)
                    && g.to.iter().any(|t| t.group == to_group && t.kind == to_kind && t.name.as_deref().is_none_or(|n| n == to_name))
            })
    }
}

/// Who refers to a backend: a route of a kind, in a namespace
/// (ReferenceGrants name both).
struct Referrer<'a> {
    kind: &'static str,
    ns: &'a str,
    /// Every parent is a Service (a mesh route): its backends in other
    /// namespaces need no ReferenceGrant (GEP-1294). A mesh route only
    /// changes where calls to a service go, and only its own namespace's
    /// calls unless the service is its own; the backend's own policies
    /// still see each caller's identity, so no one reaches more than they
    /// could dial. Istio and the suite's MeshConsumerRoute agree.
    mesh_only: bool,
}

/// A route of any kind, as attachment sees it.
enum RouteIn<'a> {
    Http(&'a HttpRoute),
    Grpc(&'a GrpcRoute),
    Tcp(&'a L4Route),
    Tls(&'a L4Route),
}

impl RouteIn<'_> {
    fn kind(&self) -> &'static str {
        match self {
            RouteIn::Http(_) => "HTTPRoute",
            RouteIn::Grpc(_) => "GRPCRoute",
            RouteIn::Tcp(_) => "TCPRoute",
            RouteIn::Tls(_) => "TLSRoute",
        }
    }

    fn parents_and_hostnames(&self) -> (&[ParentRef], &[String]) {
        match self {
            RouteIn::Http(r) => (&r.parent_refs, &r.hostnames),
            RouteIn::Grpc(r) => (&r.parent_refs, &r.hostnames),
            RouteIn::Tcp(r) | RouteIn::Tls(r) => (&r.parent_refs, &r.hostnames),
        }
    }

    /// Why a filter it has is not supported: ExternalAuth and ExtensionRef
    /// anywhere, CORS on a backendRef (a preflight is answered before a
    /// backend is chosen).
    fn unsupported_filter(&self) -> Option<String> {
        if let Some(f) = self.filters().find(|f| matches!(f.kind.as_str(), "ExternalAuth" | "ExtensionRef")) {
            return Some(format!("filter type {} is not supported", f.kind));
        }
        let backend_filters: Vec<&HttpRouteFilter> = match self {
            RouteIn::Http(r) => r.rules.iter().flat_map(|r| &r.backend_refs).flat_map(|b| &b.filters).collect(),
            RouteIn::Grpc(r) => r.rules.iter().flat_map(|r| &r.backend_refs).flat_map(|b| &b.filters).collect(),
            RouteIn::Tcp(_) | RouteIn::Tls(_) => Vec::new(),
        };
        backend_filters
            .iter()
            .find(|f| matches!(f.kind.as_str(), "CORS" | "ExternalAuth" | "ExtensionRef"))
            .map(|f| format!("filter type {} is not supported on a backendRef", f.kind))
    }

    /// Every rule's filters (HTTP and gRPC routes).
    fn filters(&self) -> Box<dyn Iterator<Item = &HttpRouteFilter> + '_> {
        match self {
            RouteIn::Http(r) => Box::new(r.rules.iter().flat_map(|r| r.filters.iter())),
            RouteIn::Grpc(r) => Box::new(r.rules.iter().flat_map(|r| r.filters.iter())),
            RouteIn::Tcp(_) | RouteIn::Tls(_) => Box::new(std::iter::empty()),
        }
    }

    /// The Istio HTTP routes of an HTTPRoute's or a GRPCRoute's rules
    /// (none for TCP and TLS routes), ranked.
    fn http_routes(&self, obj: &StoredObject, from: &Referrer, r: &Resolver) -> Vec<(Rank, Value)> {
        match self {
            RouteIn::Http(rt) => rt.rules.iter().enumerate().flat_map(|(ri, rule)| rule_routes(obj, ri, rule, from, r)).collect(),
            RouteIn::Grpc(rt) => rt.rules.iter().enumerate().flat_map(|(ri, rule)| grpc_rule_routes(obj, ri, rule, from, r)).collect(),
            RouteIn::Tcp(_) | RouteIn::Tls(_) => Vec::new(),
        }
    }

    /// Every backend it names: its rules' and its mirrors'.
    fn backends(&self) -> Vec<ObjectRef> {
        let mirrors = self.filters().filter_map(|f| f.request_mirror.as_ref().map(|m| m.backend_ref.clone()));
        let rules: Vec<&[HttpBackendRef]> = match self {
            RouteIn::Http(r) => r.rules.iter().map(|r| &r.backend_refs[..]).collect(),
            RouteIn::Grpc(r) => r.rules.iter().map(|r| &r.backend_refs[..]).collect(),
            RouteIn::Tcp(r) | RouteIn::Tls(r) => r.rules.iter().map(|r| &r.backend_refs[..]).collect(),
        };
        rules.into_iter().flatten().map(HttpBackendRef::object_ref).chain(mirrors).collect()
    }
}

struct RefsStatus {
    ok: bool,
    reason: &'static str,
    message: String,
}

/// Why a backend does not resolve.
fn backend_problem(b: &ObjectRef, from: &Referrer, r: &Resolver) -> Result<(String, u32), (&'static str, String)> {
    let ns = b.namespace_or(from.ns);
    let (group, kind) = (b.group_or(""), b.kind_or("Service"));
    let backend_kind = match (group, kind) {
        ("", "Service") => BackendKind::Service,
        ("networking.istio.io", "ServiceEntry") => BackendKind::ServiceEntry,
        _ => return Err(("InvalidKind", format!("backend kind {group}/{kind} is not supported"))),
    };
    if !from.mesh_only && !r.granted(from.kind, from.ns, group, kind, ns, &b.name) {
        return Err(("RefNotPermitted", format!("no ReferenceGrant in {ns} allows a reference to {kind} {}", b.name)));
    }
    r.backends
        .resolve(backend_kind, ns, &b.name, b.port)
        .ok_or_else(|| ("BackendNotFound", format!("{kind} {ns}/{} not found{}", b.name, b.port.map(|p| format!(" (port {p})")).unwrap_or_default())))
}

fn resolved_refs(refs: Vec<ObjectRef>, from: &Referrer, r: &Resolver) -> RefsStatus {
    for b in refs {
        if let Err((reason, message)) = backend_problem(&b, from, r) {
            return RefsStatus { ok: false, reason, message };
        }
    }
    RefsStatus { ok: true, reason: "ResolvedRefs", message: String::new() }
}

/// The Istio HTTP routes of one rule: one per match (a PathPrefix match
/// is two: the path itself and everything under it).
fn rule_routes(obj: &StoredObject, ri: usize, rule: &HttpRouteRule, from: &Referrer, r: &Resolver) -> Vec<(Rank, Value)> {
    let default_match = [HttpRouteMatch::default()];
    let matches = if rule.matches.is_empty() { &default_match[..] } else { &rule.matches[..] };
    let mut out = Vec::new();
    for (mi, m) in matches.iter().enumerate() {
        let path = m.path.clone().unwrap_or_default();
        let value = path.path().to_string();
        let (kind_rank, uris): (u8, Vec<(Value, Option<String>)>) = match path.match_type() {
            "Exact" => (0, vec![(json!({"exact": value}), None)]),
            "RegularExpression" => (1, vec![(json!({"regex": value}), None)]),
            _ => {
                let base = value.trim_end_matches('/');
                if base.is_empty() {
                    (2, vec![(json!({"prefix": "/"}), Some("/".to_string()))])
                } else {
                    (2, vec![(json!({"exact": base}), Some(base.to_string())), (json!({"prefix": format!("{base}/")}), Some(format!("{base}/")))])
                }
            }
        };
        for (ui, (uri, matched_prefix)) in uris.into_iter().enumerate() {
            let mut mr = Map::new();
            mr.insert("uri".into(), uri);
            header_matches(&mut mr, &m.headers);
            if !m.query_params.is_empty() {
                mr.insert("queryParams".into(), m.query_params.iter().map(|q| (q.name.clone(), string_match(q.is_regex(), &q.value))).collect());
            }
            if let Some(method) = &m.method {
                mr.insert("method".into(), json!({"exact": method}));
            }
            let mut http = Map::new();
            http.insert("name".into(), json!(format!("{}.{}.{ri}.{mi}", obj.key.namespace, obj.key.name)));
            http.insert("match".into(), json!([Value::Object(mr)]));
            let policy = (rule.timeouts.as_ref(), rule.retry.as_ref());
            apply_rule(&mut http, &rule.filters, &rule.backend_refs, policy, matched_prefix.as_deref(), from, r);
            let rank: Rank = (
                kind_rank,
                std::cmp::Reverse(value.trim_end_matches('/').len()),
                if m.method.is_some() { 0 } else { 1 },
                std::cmp::Reverse(m.headers.len()),
                std::cmp::Reverse(m.query_params.len()),
                obj.create_revision,
                obj.key.namespace.to_string(),
                obj.key.name.to_string(),
                ri,
                mi,
                ui,
            );
            out.push((rank, Value::Object(http)));
        }
    }
    out
}

/// The Istio HTTP routes of one GRPCRoute rule, one per match: a method
/// is the path `/service/method` (the whole of it exact; a service alone
/// a prefix; a method alone, or regular expressions, a regex).
fn grpc_rule_routes(obj: &StoredObject, ri: usize, rule: &GrpcRouteRule, from: &Referrer, r: &Resolver) -> Vec<(Rank, Value)> {
    let default_match = [GrpcRouteMatch::default()];
    let matches = if rule.matches.is_empty() { &default_match[..] } else { &rule.matches[..] };
    let mut out = Vec::new();
    for (mi, m) in matches.iter().enumerate() {
        let (service, method) = m.method.as_ref().map_or((None, None), |mm| (mm.service.as_deref(), mm.method.as_deref()));
        let regex = m.method.as_ref().is_some_and(|mm| mm.is_regex());
        let (kind_rank, uri) = match (service, method) {
            (None, None) => (2, json!({"prefix": "/"})),
            _ if regex => (1, json!({"regex": format!("/{}/{}", service.unwrap_or("[^/]+"), method.unwrap_or("[^/]+"))})),
            (Some(s), Some(m)) => (0, json!({"exact": format!("/{s}/{m}")})),
            (Some(s), None) => (2, json!({"prefix": format!("/{s}/")})),
            (None, Some(m)) => (1, json!({"regex": format!("/[^/]+/{m}")})),
        };
        let mut mr = Map::new();
        mr.insert("uri".into(), uri);
        header_matches(&mut mr, &m.headers);
        let mut http = Map::new();
        http.insert("name".into(), json!(format!("{}.{}.{ri}.{mi}", obj.key.namespace, obj.key.name)));
        http.insert("match".into(), json!([Value::Object(mr)]));
        apply_rule(&mut http, &rule.filters, &rule.backend_refs, (None, None), None, from, r);
        let len = service.map_or(0, str::len) + method.map_or(0, str::len);
        let rank: Rank = (
            kind_rank,
            std::cmp::Reverse(len),
            1,
            std::cmp::Reverse(m.headers.len()),
            std::cmp::Reverse(0),
            obj.create_revision,
            obj.key.namespace.to_string(),
            obj.key.name.to_string(),
            ri,
            mi,
            0,
        );
        out.push((rank, Value::Object(http)));
    }
    out
}

/// A TCPRoute's or TLSRoute's rules as Istio TCP or TLS routes on a
/// gateway port (`sni`: the TLSRoute's host). A rule none of whose
/// backends resolves has no route: its connections are refused.
fn l4_routes(route: &L4Route, sni: Option<&str>, port: u32, from: &Referrer, r: &Resolver) -> Vec<Value> {
    let mut out = Vec::new();
    for rule in &route.rules {
        let backends = rule.backend_refs.iter().map(|b| (b.object_ref(), b.weight.unwrap_or(1), &[][..]));
        let (routes, _, _) = weighted(backends, from, r);
        if routes.is_empty() {
            continue;
        }
        let m = match sni {
            Some(host) => json!([{"sniHosts": [host], "port": port}]),
            None => json!([{"port": port}]),
        };
        out.push(json!({"match": m, "route": routes}));
    }
    out
}

fn header_matches(mr: &mut Map<String, Value>, headers: &[api::ValueMatch]) {
    if !headers.is_empty() {
        mr.insert("headers".into(), headers.iter().map(|h| (h.name.to_ascii_lowercase(), string_match(h.is_regex(), &h.value))).collect());
    }
}

fn string_match(regex: bool, value: &str) -> Value {
    if regex {
        json!({"regex": value})
    } else {
        json!({"exact": value})
    }
}

fn header_ops(m: &api::HeaderModifier) -> Value {
    let mut v = Map::new();
    if !m.set.is_empty() {
        v.insert("set".into(), m.set.iter().map(|h| (h.name.to_ascii_lowercase(), json!(h.value))).collect());
    }
    if !m.add.is_empty() {
        v.insert("add".into(), m.add.iter().map(|h| (h.name.to_ascii_lowercase(), json!(h.value))).collect());
    }
    if !m.remove.is_empty() {
        v.insert("remove".into(), json!(m.remove.iter().map(|h| h.to_ascii_lowercase()).collect::<Vec<_>>()));
    }
    Value::Object(v)
}

/// A rule's filters, timeouts, retry and backends on one generated route.
/// `prefix` is the path prefix the route matches (PathPrefix), for prefix
/// rewrites.
fn apply_rule(
    http: &mut Map<String, Value>,
    filters: &[HttpRouteFilter],
    backends: &[HttpBackendRef],
    (timeouts, retry): (Option<&Timeouts>, Option<&Retry>),
    prefix: Option<&str>,
    from: &Referrer,
    r: &Resolver,
) {
    let mut headers = Map::new();
    let mut mirrors = Vec::new();
    for f in filters {
        apply_filter(http, &mut headers, &mut mirrors, f, prefix, from, r);
    }
    if !headers.is_empty() {
        http.insert("headers".into(), Value::Object(headers));
    }
    if !mirrors.is_empty() {
        http.insert("mirrors".into(), json!(mirrors));
    }
    if http.contains_key("redirect") {
        return;
    }
    // Timeouts: the request's is the route's (it bounds every try); the
    // backend request's each try's (`0s`: none).
    let nonzero = |d: &&String| crate::model::istio::parse_duration(d).is_ok_and(|v| !v.is_zero());
    if let Some(d) = timeouts.and_then(|t| t.request.as_ref()) {
        http.insert("timeout".into(), json!(d));
    }
    let per_try = timeouts.and_then(|t| t.backend_request.as_ref()).filter(nonzero);
    match (retry, per_try) {
        (Some(rt), _) => {
            http.insert("retries".into(), retries(rt, per_try));
        }
        (None, Some(d)) => {
            http.insert("retries".into(), json!({"attempts": 1, "perTryTimeout": d}));
        }
        (None, None) => {}
    }
    // Backends: resolved ones share the traffic by weight; the share of
    // the others (and everything, with none) answers 500.
    let (routes, good, bad) = weighted(backends.iter().map(|b| (b.object_ref(), b.weight.unwrap_or(1), &b.filters[..])), from, r);
    if routes.is_empty() {
        http.insert("directResponse".into(), json!({"status": 500}));
        return;
    }
    http.insert("route".into(), json!(routes));
    if bad > 0 {
        let percent = bad as f64 * 100.0 / (good + bad) as f64;
        http.insert("fault".into(), json!({"abort": {"httpStatus": 500, "percentage": {"value": percent}}}));
    }
}

/// Connection failures a rule's `retry` retries whatever its `codes`
/// (the spec: disconnect, reset, timeout, TCP failure): Envoy's
/// `connect-failure` and `reset` (a reset, a disconnect or a per-try
/// timeout), `refused-stream`, and gRPC's `unavailable` and `cancelled`.
const RETRY_ON_FAILURES: &str = "connect-failure,refused-stream,reset,unavailable,cancelled";

/// Attempts when a rule's `retry` names none: as many as Istio's default
/// retry policy.
const DEFAULT_RETRY_ATTEMPTS: i64 = 2;

/// A rule's `retry` as Istio `retries`: its codes retried besides
/// [`RETRY_ON_FAILURES`], `attempts` retries after the first try, each
/// try bounded by the backend request timeout (`per_try`), and `backoff`
/// as Envoy's base interval (`0s`: Envoy's default).
fn retries(rt: &Retry, per_try: Option<&String>) -> Value {
    let codes = rt.codes.iter().map(|c| format!(",{c}")).collect::<String>();
    let mut v = json!({"attempts": rt.attempts.unwrap_or(DEFAULT_RETRY_ATTEMPTS), "retryOn": format!("{RETRY_ON_FAILURES}{codes}")});
    if let Some(d) = per_try {
        v["perTryTimeout"] = json!(d);
    }
    if let Some(b) = rt.backoff.as_ref().filter(|b| crate::model::istio::parse_duration(b).is_ok_and(|v| !v.is_zero())) {
        v["backoff"] = json!(b);
    }
    v
}

/// A CORS filter as an Istio `corsPolicy`: origins exact (`*`: any), or a
/// regex for a wildcard host; an origin's default port left out (an
/// `Origin` header never carries it); `*` methods and headers, which
/// Envoy answers with the preflight's own method and headers, so never
/// `*` with credentials; expose headers `*` left out with credentials
/// (the spec forbids answering it); `maxAge` (default 5 s); and preflights
/// from other origins answered by the gateway without an allowed origin,
/// not forwarded (`unmatchedPreflights: IGNORE`).
fn cors_policy(c: &CorsFilter) -> Value {
    let origins: Vec<Value> = c.allow_origins.iter().map(|o| cors_origin(o)).collect();
    let credentials = c.allow_credentials == Some(true);
    let mut v = json!({
        "allowOrigins": origins,
        "maxAge": format!("{}s", c.max_age.unwrap_or(api::CORS_DEFAULT_MAX_AGE)),
        "unmatchedPreflights": "IGNORE",
    });
    for (name, list) in [("allowMethods", &c.allow_methods), ("allowHeaders", &c.allow_headers), ("exposeHeaders", &c.expose_headers)] {
        let forbidden = credentials && name == "exposeHeaders" && list.iter().any(|h| h == "*");
        if !list.is_empty() && !forbidden {
            v[name] = json!(list);
        }
    }
    if credentials {
        v["allowCredentials"] = json!(true);
    }
    v
}

/// One allowed origin as an Istio string match (lower case, as browsers
/// send it): `*` as Envoy's any-origin `*`; a host `*.name` as one or more
/// labels before `.name`, a host `*` as any host name.
fn cors_origin(origin: &str) -> Value {
    let origin = origin.to_ascii_lowercase();
    let Some((scheme, authority)) = origin.split_once("://") else { return json!({"exact": origin}) };
    let default_port = if scheme == "https" { ":443" } else { ":80" };
    let authority = authority.strip_suffix(default_port).unwrap_or(authority);
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, format!(":{p}")),
        None => (authority, String::new()),
    };
    let host_regex = match host.strip_prefix('*') {
        None => return json!({"exact": format!("{scheme}://{host}{port}")}),
        Some("") => r"[a-z0-9-]+(\.[a-z0-9-]+)*".to_string(),
        Some(rest) => format!(r"([a-z0-9-]+\.)+{}", regex::escape(rest.trim_start_matches('.'))),
    };
    json!({"regex": format!("{scheme}://{host_regex}{}", regex::escape(&port))})
}

/// Istio route destinations of the backends that resolve and have a
/// weight (the weight left out when one alone), their total weight, and
/// the weight of those that do not resolve.
fn weighted<'b>(backends: impl Iterator<Item = (ObjectRef, u32, &'b [HttpRouteFilter])>, from: &Referrer, r: &Resolver) -> (Vec<Value>, u64, u64) {
    let mut routes = Vec::new();
    let (mut good, mut bad) = (0u64, 0u64);
    for (b, weight, filters) in backends {
        match backend_problem(&b, from, r) {
            Ok((host, port)) if weight > 0 => {
                good += u64::from(weight);
                let mut d = json!({"destination": {"host": host, "port": {"number": port}}, "weight": weight});
                let mut bh = Map::new();
                for f in filters {
                    if let Some(m) = &f.request_header_modifier {
                        bh.insert("request".into(), header_ops(m));
                    }
                    if let Some(m) = &f.response_header_modifier {
                        bh.insert("response".into(), header_ops(m));
                    }
                }
                if !bh.is_empty() {
                    d["headers"] = Value::Object(bh);
                }
                routes.push(d);
            }
            Ok(_) => {}
            Err(_) => bad += u64::from(weight),
        }
    }
    if routes.len() == 1 {
        if let Some(d) = routes[0].as_object_mut() {
            d.remove("weight");
        }
    }
    (routes, good, bad)
}

#[allow(clippy::too_many_arguments)]
fn apply_filter(
    http: &mut Map<String, Value>,
    headers: &mut Map<String, Value>,
    mirrors: &mut Vec<Value>,
    f: &HttpRouteFilter,
    prefix: Option<&str>,
    from: &Referrer,
    r: &Resolver,
) {
    if let Some(m) = &f.request_header_modifier {
        headers.insert("request".into(), header_ops(m));
    }
    if let Some(m) = &f.response_header_modifier {
        headers.insert("response".into(), header_ops(m));
    }
    if let Some(r) = &f.request_redirect {
        let mut v = Map::new();
        if let Some(s) = &r.scheme {
            v.insert("scheme".into(), json!(s));
        }
        if let Some(h) = &r.hostname {
            v.insert("authority".into(), json!(h));
        }
        // No port: the scheme's default when the scheme changes, else the
        // listener's port (the request's), as the HTTPRoute spec says and
        // Istio translates it.
        match (r.port, &r.scheme) {
            (Some(p), _) => v.insert("port".into(), json!(p)),
            (None, Some(_)) => v.insert("derivePort".into(), json!("FROM_PROTOCOL_DEFAULT")),
            (None, None) => v.insert("derivePort".into(), json!("FROM_REQUEST_PORT")),
        };
        v.insert("redirectCode".into(), json!(r.status_code.unwrap_or(302)));
        if let Some(p) = &r.path {
            match (p.kind.as_str(), prefix) {
                ("ReplaceFullPath", _) => {
                    v.insert("uri".into(), json!(p.replace_full_path.clone().unwrap_or_default()));
                }
                (_, Some(prefix)) => {
                    v.insert("prefixRewrite".into(), json!(prefix_replacement(prefix, p.replace_prefix_match.as_deref().unwrap_or("/"))));
                }
                _ => {}
            }
        }
        http.insert("redirect".into(), Value::Object(v));
    }
    if let Some(u) = &f.url_rewrite {
        let mut v = Map::new();
        if let Some(h) = &u.hostname {
            v.insert("authority".into(), json!(h));
        }
        if let Some(p) = &u.path {
            match (p.kind.as_str(), prefix) {
                ("ReplaceFullPath", _) => {
                    v.insert("uriRegexRewrite".into(), json!({"match": "^/.*$", "rewrite": p.replace_full_path.clone().unwrap_or_default()}));
                }
                (_, Some(prefix)) => {
                    v.insert("uri".into(), json!(prefix_replacement(prefix, p.replace_prefix_match.as_deref().unwrap_or("/"))));
                }
                _ => {}
            }
        }
        http.insert("rewrite".into(), Value::Object(v));
    }
    if let Some(c) = &f.cors {
        http.insert("corsPolicy".into(), cors_policy(c));
    }
    if let Some(m) = &f.request_mirror {
        if let Ok((host, port)) = backend_problem(&m.backend_ref, from, r) {
            let mut mirror = json!({"destination": {"host": host, "port": {"number": port}}});
            let percent = m.percent.map(|p| json!(p)).or_else(|| m.fraction.as_ref().map(|f| json!(f.percent())));
            if let Some(p) = percent {
                mirror["percentage"] = json!({"value": p});
            }
            mirrors.push(mirror);
        }
    }
}

/// What replaces the matched prefix: for the route matching the path
/// itself (`/foo`), the replacement; for the one matching under it
/// (`/foo/`), the replacement with one trailing slash.
fn prefix_replacement(matched: &str, replacement: &str) -> String {
    if matched.ends_with('/') {
        format!("{}/", replacement.trim_end_matches('/'))
    } else {
        replacement.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_intersection() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(intersect(None, &[]), s(&["*"]));
        assert_eq!(intersect(Some("very.specific.com"), &s(&["non.matching.com", "*.specific.com"])), s(&["very.specific.com"]));
        assert_eq!(
            intersect(Some("*.wildcard.io"), &s(&["wildcard.io", "foo.wildcard.io", "foo.bar.wildcard.io"])),
            s(&["foo.wildcard.io", "foo.bar.wildcard.io"])
        );
        assert_eq!(intersect(Some("*.anotherwildcard.io"), &s(&["*.anotherwildcard.io"])), s(&["*.anotherwildcard.io"]));
        assert_eq!(intersect(Some("*.a.io"), &s(&["*.b.a.io"])), s(&["*.b.a.io"]));
        assert!(intersect(Some("very.specific.com"), &s(&["specific.but.wrong.com", "wildcard.io"])).is_empty());
    }

    #[test]
    fn prefix_replacements() {
        assert_eq!(prefix_replacement("/foo", "/bar"), "/bar");
        assert_eq!(prefix_replacement("/foo/", "/bar"), "/bar/");
        assert_eq!(prefix_replacement("/foo/", "/"), "/");
    }

    use crate::mesh::{Mesh, MeshConfig};
    use crate::model::documents::parse_documents;
    use crate::model::proxy::ProxyIdentity;
    use crate::model::{parse_resource, validate_spec};
    use crate::resources::{Generator, ProxyConfig, ResourceType};
    use crate::state::txn::{Op, Txn};
    use crate::state::State;
    use crate::Translator;
    use serde_json::Map;

    fn state_from(yaml: &str) -> State {
        let mut state = State::default();
        for doc in parse_documents(yaml, "input.yaml").unwrap() {
            let r = parse_resource(doc, "default").unwrap();
            validate_spec(&r).unwrap();
            state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        }
        state
    }

    /// Every resource of a config as JSON, by type and name.
    fn render(cfg: &ProxyConfig) -> Value {
        let mut out = Map::new();
        for t in ResourceType::PUSH_ORDER {
            let by_name: Map<String, Value> = cfg.of(t).into_iter().flatten().map(|(n, r)| (n.clone(), crate::json::any_to_json(&r.any).unwrap())).collect();
            out.insert(format!("{t:?}"), Value::Object(by_name));
        }
        Value::Object(out)
    }

    /// Everything of a mesh the Gateway API translation shapes, comparable:
    /// the rules (generated and stored, in the mesh's order), their indexes,
    /// the status, what was skipped, and the translation's slot index.
    fn gateway_api_mesh_view(m: &Mesh) -> Value {
        let config = |key: &crate::model::ResourceKey, create: u64, labels: &std::collections::BTreeMap<String, String>, spec: Value| {
            json!([key.to_string(), create, labels, spec])
        };
        let mut wildcard: Vec<String> = m.vs_wildcard.iter().map(|v| v.key.to_string()).collect();
        wildcard.sort();
        json!({
            "revision": m.revision,
            "virtualServices": m.virtual_services.iter().map(|v| config(&v.key, v.create_revision, &v.labels, serde_json::to_value(&v.spec).unwrap())).collect::<Vec<_>>(),
            "gateways": m.gateways.iter().map(|g| config(&g.key, g.create_revision, &g.labels, serde_json::to_value(&g.spec).unwrap())).collect::<Vec<_>>(),
            "destinationRules": m.destination_rules.iter().map(|d| d.key.to_string()).collect::<Vec<_>>(),
            "byHost": m.vs_by_host.iter().map(|(h, l)| (h.clone(), json!(l.iter().map(|v| v.key.to_string()).collect::<Vec<_>>()))).collect::<Map<_, _>>(),
            "wildcard": wildcard,
            "status": m.gateway_api_status.iter().map(|(k, v)| (k.to_string(), v.clone())).collect::<Map<_, _>>(),
            "skipped": m.skipped.iter().map(|(k, why)| format!("{k}: {why}")).collect::<Vec<_>>(),
            "contributors": m.gateway_api.contributors.iter().map(|(k, r)| (k.to_string(), json!(r.iter().map(ToString::to_string).collect::<Vec<_>>()))).collect::<Map<_, _>>(),
        })
    }

    /// A random HTTPRoute, GRPCRoute or TCPRoute write (or delete) among a few
    /// names, on the `gateway-api` case: parents by section and port, mesh
    /// (Service) parents, hostnames that do and do not intersect, backends
    /// that resolve, need a grant, or are missing.
    fn random_route_write(rng: &mut u64) -> Op {
        let mut pick = |n: usize| {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            (*rng % n as u64) as usize
        };
        let names = [("infra", "main"), ("web", "shop"), ("infra", "secure"), ("infra", "r1"), ("web", "r2"), ("infra", "r3")];
        let (ns, name) = names[pick(names.len())];
        let kind = ["HTTPRoute", "HTTPRoute", "HTTPRoute", "GRPCRoute", "TCPRoute"][pick(5)];
        if pick(5) == 0 {
            let kind = crate::model::Kind::from_kind_and_api_version(kind, Some("gateway.networking.k8s.io/v1alpha2")).unwrap();
            return Op::Delete { key: crate::model::ResourceKey::new(kind, ns, name), expected_revision: None, ignore_missing: true };
        }
        let parents = [
            "[{name: web, namespace: infra}]",
            "[{name: web, namespace: infra, sectionName: http}]",
            "[{name: web, namespace: infra, sectionName: shop}, {name: web, namespace: infra, sectionName: team}]",
            "[{name: web, namespace: infra, port: 80}]",
            "[{name: web, namespace: infra, sectionName: tcp}]",
            "[{name: web, namespace: infra, sectionName: nope}]",
            "[{group: \"\", kind: Service, name: echo-v1, namespace: infra}]",
            "[{group: \"\", kind: Service, name: web-backend, namespace: web, port: 8080}, {name: web, namespace: infra}]",
        ];
        let hosts = ["[]", "[a.shop.example]", "[b.shop.example, x.example]", "[\"*.shop.example\"]", "[x.example]"];
        let backends = [
            "[{name: echo-v1, namespace: infra, port: 8080}]",
            "[{name: echo-v2, namespace: infra, port: 8080, weight: 2}, {name: echo-v1, namespace: infra, port: 8080}]",
            "[{name: web-backend, namespace: web, port: 8080}]",
            "[{name: nope, port: 8080}]",
        ];
        let (parent, host, backend) = (parents[pick(parents.len())], hosts[pick(hosts.len())], backends[pick(backends.len())]);
        let path = ["/", "/a", "/a/b"][pick(3)];
        let spec = match kind {
            "HTTPRoute" => format!("  parentRefs: {parent}\n  hostnames: {host}\n  rules:\n  - matches: [{{path: {{type: PathPrefix, value: {path}}}}}]\n    backendRefs: {backend}\n  - backendRefs: {backend}\n"),
            "GRPCRoute" => format!("  parentRefs: {parent}\n  hostnames: {host}\n  rules:\n  - matches: [{{method: {{service: pkg.Svc, method: Get}}}}]\n    backendRefs: {backend}\n"),
            _ => format!("  parentRefs: {parent}\n  rules:\n  - backendRefs: {backend}\n"),
        };
        let version = if kind == "TCPRoute" { "v1alpha2" } else { "v1" };
        let yaml = format!("apiVersion: gateway.networking.k8s.io/{version}\nkind: {kind}\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{spec}");
        let r = parse_resource(parse_documents(&yaml, "change").unwrap().remove(0), "default").unwrap();
        validate_spec(&r).unwrap_or_else(|e| panic!("{yaml}: {e:?}"));
        Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
    }

    /// Gateway API route writes through the incremental path: after each of a
    /// random sequence of HTTPRoute, GRPCRoute and TCPRoute writes and deletes
    /// (with now and then a change that is not a route's: a Namespace's
    /// labels, which the path refuses), the mesh stepped from the previous
    /// one (`Mesh::update_gateway_routes`) equals a full build, and so do the
    /// translator's configs (gateway proxy and sidecar) and a full translation.
    #[test]
    fn gateway_api_incremental_equals_full() {
        let base = state_from(include_str!("../../tests/fixtures/translate/gateway-api/input.yaml"));
        let gateway = ProxyIdentity::parse(
            "router~127.0.22.1~web-gateway.infra~infra.svc.cluster.local",
            &json!({"LABELS": {"gateway.networking.k8s.io/gateway-name": "web"}}),
        )
        .unwrap();
        let sidecar = ProxyIdentity::parse("sidecar~127.0.22.20~client.infra~infra.svc.cluster.local", &json!({})).unwrap();
        let config = Arc::new(MeshConfig::default());
        let mut incremental_steps = 0;
        for seed in [0x9e37_79b9_7f4a_7c15u64, 7, 1234567] {
            let translator = Translator::new(MeshConfig::default());
            let mut rng = seed;
            let mut state = base.clone();
            let mut mesh = Mesh::build(&state, config.clone());
            for step in 0..40 {
                let before = state.objects.clone();
                let route_only = step % 9 != 8;
                let op = if route_only {
                    random_route_write(&mut rng)
                } else {
                    let yaml = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: web, labels: {{team: {}}}}}\n", ["shop", "none"][step % 2]);
                    let r = parse_resource(parse_documents(&yaml, "change").unwrap().remove(0), "default").unwrap();
                    Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
                };
                let what = format!("seed {seed}, step {step}: {op:?}");
                if state.apply_txn(&Txn { ops: vec![op] }).0.is_err() || state.objects == before {
                    continue; // a delete of nothing
                }
                let full = Mesh::build(&state, config.clone());
                let stepped = mesh.update_gateway_routes(&before, &state);
                assert_eq!(stepped.is_some(), route_only, "{what}: incremental path taken?");
                let stepped = stepped.unwrap_or_else(|| Mesh::build(&state, config.clone()));
                incremental_steps += usize::from(route_only);
                assert_eq!(gateway_api_mesh_view(&stepped), gateway_api_mesh_view(&full), "{what}");
                for proxy in [&gateway, &sidecar] {
                    let got = translator.generate(proxy, &state).unwrap();
                    assert_eq!(render(&got), render(&crate::translate(&full, proxy)), "{what}: {}", proxy.id);
                }
                mesh = stepped;
            }
        }
        assert!(incremental_steps > 80, "only {incremental_steps} incremental steps");
    }
    /// Route writes through ListenerSets take the incremental path and
    /// give what a full translation gives (the sets' listeners'
    /// `attachedRoutes` included); a ListenerSet write does not.
    #[test]
    fn listener_set_routes_incremental_equals_full() {
        let mut state = state_from(include_str!("../../tests/fixtures/translate/gateway-api-listenerset/input.yaml"));
        let config = Arc::new(MeshConfig::default());
        let mut mesh = Mesh::build(&state, config.clone());
        let route = |name: &str, parents: &str| {
            let yaml = format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n  parentRefs: {parents}\n  rules:\n  - backendRefs: [{{name: store, port: 8080}}]\n"
            );
            let r = parse_resource(parse_documents(&yaml, "change").unwrap().remove(0), "default").unwrap();
            Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }
        };
        let attached = |m: &Mesh, listener: usize| {
            let key = crate::model::ResourceKey::new(crate::model::Kind::ListenerSet, "shop", "store");
            m.gateway_api_status.get(&key).unwrap()["listeners"][listener]["attachedRoutes"].as_u64().unwrap()
        };
        assert_eq!((attached(&mesh, 0), attached(&mesh, 1)), (2, 1));
        let store = crate::model::ResourceKey::new(crate::model::Kind::HttpRoute, "shop", "store");
        let steps = [
            route("more", "[{kind: ListenerSet, name: store, sectionName: store}]"),
            route("extra-only", "[{kind: ListenerSet, name: store, port: 80}]"),
            Op::Delete { key: store, expected_revision: None, ignore_missing: false },
            route("more", "[{kind: ListenerSet, name: refused, namespace: infra}]"),
        ];
        for (i, op) in steps.into_iter().enumerate() {
            let before = state.objects.clone();
            state.apply_txn(&Txn { ops: vec![op] }).0.unwrap();
            let full = Mesh::build(&state, config.clone());
            let stepped = mesh.update_gateway_routes(&before, &state).unwrap_or_else(|| panic!("step {i}: not incremental"));
            assert_eq!(gateway_api_mesh_view(&stepped), gateway_api_mesh_view(&full), "step {i}");
            mesh = stepped;
        }
        assert_eq!((attached(&mesh, 0), attached(&mesh, 1)), (0, 1), "{:?}", mesh.gateway_api_status);
        // Allowing no ListenerSets: not a route change; the set is refused.
        let before = state.objects.clone();
        let gw = "apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: web, namespace: infra}\nspec:\n  gatewayClassName: lodestar\n  listeners: [{name: http, port: 80, protocol: HTTP}]\n";
        let r = parse_resource(parse_documents(gw, "change").unwrap().remove(0), "default").unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        assert!(mesh.update_gateway_routes(&before, &state).is_none());
        let full = Mesh::build(&state, config);
        let set = full.gateway_api_status.get(&crate::model::ResourceKey::new(crate::model::Kind::ListenerSet, "shop", "store")).unwrap();
        assert_eq!(set["conditions"][0]["reason"], "NotAllowed", "{set}");
        assert!(full.gateways.iter().all(|g| !g.key.name.contains(".shop.")), "a refused set's listener is served");
    }

    /// A Secret document holding a fresh self-signed certificate for
    /// `host` and its key (a listener's certificate).
    fn tls_secret(name: &str, ns: &str, host: &str) -> String {
        use base64::Engine;
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![host.into()]).unwrap().self_signed(&key).unwrap();
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {{name: {name}, namespace: {ns}}}\ndata: {{tls.crt: {}, tls.key: {}}}\n---\n",
            b64(cert.pem()),
            b64(key.serialize_pem())
        )
    }

    /// A listener's certificate must exist and hold a certificate (else
    /// InvalidCertificateRef, not served); a Gateway is Accepted while one
    /// of its listeners is (ListenersNotValid when another is not), and
    /// not with a parametersRef (InvalidParameters, nothing served). The
    /// missing certificate written alone is no incremental change: the
    /// mesh is built again and the listener served.
    #[test]
    fn listener_certificates_and_gateway_acceptance() {
        let good = tls_secret("good-cert", "infra", "good.example");
        let missing = tls_secret("missing-cert", "infra", "missing.example");
        let ca_only = {
            let cert = good.split("tls.crt: ").nth(1).unwrap().split(',').next().unwrap();
            format!("apiVersion: v1\nkind: Secret\nmetadata: {{name: ca-only, namespace: infra}}\ndata: {{ca.crt: {cert}}}\n---\n")
        };
        let https = |name: &str, cert: &str| {
            format!("  - {{name: {name}, port: 443, protocol: HTTPS, hostname: {name}.example, tls: {{certificateRefs: [{{name: {cert}}}]}}}}\n")
        };
        let gateway = |name: &str, extra: &str, listeners: &str| {
            format!("apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: infra}}\nspec:\n  gatewayClassName: lodestar\n{extra}  listeners:\n{listeners}---\n")
        };
        let http = "  - {name: http, port: 80, protocol: HTTP}\n";
        let invalid = "  - {name: invalid, port: 1111, protocol: INVALID}\n";
        let yaml = format!(
            "apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: lodestar}}\nspec: {{controllerName: lodestar.dev/gateway-controller}}\n---\n{good}{ca_only}{}{}{}{}",
            gateway("tls", "", &(https("good", "good-cert") + &https("missing", "missing-cert") + &https("ca", "ca-only"))),
            gateway("mixed", "", &(http.to_string() + invalid)),
            gateway("invalid", "", invalid),
            gateway("params", "  infrastructure: {parametersRef: {group: invalid.io, kind: InvalidParameters, name: invalid}}\n", http),
        );
        let mut state = state_from(&yaml);
        let mesh = Mesh::build(&state, Arc::new(MeshConfig::default()));
        let status =
            |m: &Mesh, gw: &str| m.gateway_api_status.get(&crate::model::ResourceKey::new(crate::model::Kind::KubeGateway, "infra", gw)).unwrap().clone();
        let condition = |v: &Value, t: &str| {
            let c = v.as_array().unwrap().iter().find(|c| c["type"] == t).unwrap();
            (c["status"].as_str().unwrap().to_string(), c["reason"].as_str().unwrap().to_string())
        };
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        let served = |m: &Mesh| -> BTreeSet<String> { m.gateways.iter().map(|g| g.key.name.to_string()).collect() };
        let tls = status(&mesh, "tls");
        let refs: Vec<_> = (0..3).map(|i| condition(&tls["listeners"][i]["conditions"], "ResolvedRefs")).collect();
        assert_eq!(refs, [pair("True", "ResolvedRefs"), pair("False", "InvalidCertificateRef"), pair("False", "InvalidCertificateRef")], "{tls}");
        assert_eq!(condition(&tls["conditions"], "Accepted"), pair("True", "Accepted"), "{tls}");
        let mixed = status(&mesh, "mixed");
        assert_eq!(
            (condition(&mixed["conditions"], "Accepted"), condition(&mixed["conditions"], "Programmed")),
            (pair("True", "ListenersNotValid"), pair("True", "Programmed"))
        );
        assert_eq!(mixed["listeners"][1]["supportedKinds"], json!([]), "{mixed}");
        let invalid = status(&mesh, "invalid");
        assert_eq!(
            (condition(&invalid["conditions"], "Accepted"), condition(&invalid["conditions"], "Programmed")),
            (pair("False", "ListenersNotValid"), pair("False", "Invalid"))
        );
        let params = status(&mesh, "params");
        assert_eq!(condition(&params["conditions"], "Accepted"), pair("False", "InvalidParameters"), "{params}");
        assert_eq!(condition(&params["listeners"][0]["conditions"], "Programmed"), pair("False", "Invalid"), "{params}");
        assert_eq!(served(&mesh), BTreeSet::from(["mixed.http".to_string(), "tls.good".to_string()]));

        // The missing certificate arrives: built again, served.
        let before = state.objects.clone();
        let r = parse_resource(parse_documents(&missing, "change").unwrap().remove(0), "default").unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        assert!(mesh.update_rules(&before, &state).is_none(), "a certificate's write was skipped");
        let rebuilt = Mesh::build(&state, Arc::new(MeshConfig::default()));
        assert_eq!(condition(&status(&rebuilt, "tls")["listeners"][1]["conditions"], "ResolvedRefs"), pair("True", "ResolvedRefs"));
        assert!(served(&rebuilt).contains("tls.missing"));
        // A Secret no listener names is still no part of the mesh.
        let before = state.objects.clone();
        let r = parse_resource(parse_documents(&tls_secret("unrelated", "infra", "x.example"), "change").unwrap().remove(0), "default").unwrap();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: r.key, body: r.body.to_string().into(), expected_revision: None }] }).0.unwrap();
        assert!(rebuilt.update_rules(&before, &state).is_some(), "an unrelated Secret rebuilt the mesh");
    }

    /// An HTTPS listener of a ListenerSet in another namespace than its
    /// Gateway's: the certificate (in the Gateway's namespace, where its
    /// proxies read Secrets) needs a ReferenceGrant from ListenerSets of
    /// the set's namespace (a Gateway's does not count); without one the
    /// listener is RefNotPermitted and the set, with no listener that can
    /// be served, is not accepted.
    #[test]
    fn listener_set_certificates_need_a_grant_to_listener_sets() {
        let secret = tls_secret("team-cert", "infra", "team.example");
        let yaml = |grant_kind: &str| {
            format!(
                "{secret}apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: lodestar}}\nspec: {{controllerName: lodestar.dev/gateway-controller}}\n---\n\
                 apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: infra}}\nspec:\n  gatewayClassName: lodestar\n  allowedListeners: {{namespaces: {{from: All}}}}\n  listeners: [{{name: http, port: 80, protocol: HTTP}}]\n---\n\
                 apiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {{name: certs, namespace: infra}}\nspec:\n  from: [{{group: gateway.networking.k8s.io, kind: {grant_kind}, namespace: team}}]\n  to: [{{group: \"\", kind: Secret}}]\n---\n\
                 apiVersion: gateway.networking.k8s.io/v1\nkind: ListenerSet\nmetadata: {{name: tls, namespace: team}}\nspec:\n  parentRef: {{name: web, namespace: infra}}\n  listeners:\n  - {{name: https, port: 443, protocol: HTTPS, hostname: team.example, tls: {{certificateRefs: [{{name: team-cert, namespace: infra}}]}}}}\n"
            )
        };
        let config = Arc::new(MeshConfig::default());
        let key = crate::model::ResourceKey::new(crate::model::Kind::ListenerSet, "team", "tls");
        let without = Mesh::build(&state_from(&yaml("Gateway")), config.clone());
        let set = without.gateway_api_status.get(&key).unwrap();
        assert_eq!((set["conditions"][0]["status"].as_str(), set["conditions"][0]["reason"].as_str()), (Some("False"), Some("ListenersNotValid")), "{set}");
        assert_eq!(set["listeners"][0]["conditions"][1]["reason"], "RefNotPermitted", "{set}");
        assert!(without.gateways.iter().all(|g| g.spec.servers.iter().all(|s| s.port.number != Some(443))), "a listener without a grant is served");
        let with = Mesh::build(&state_from(&yaml("ListenerSet")), config);
        let set = with.gateway_api_status.get(&key).unwrap();
        assert_eq!((set["conditions"][0]["status"].as_str(), set["listeners"][0]["conditions"][1]["status"].as_str()), (Some("True"), Some("True")), "{set}");
        let served = with.gateways.iter().find(|g| g.key.name == "web.team.tls.https").expect("the set's listener");
        assert_eq!(serde_json::to_value(&served.spec.servers[0]).unwrap()["tls"]["credentialName"], "team-cert");
    }

    /// A mesh route's backends in other namespaces need no ReferenceGrant
    /// (GEP-1294; the suite's MeshConsumerRoute): a consumer route in
    /// `default` sends to `shop`'s Service, resolved. A route with a
    /// Gateway parent still needs the grant, mesh parents beside it or not.
    #[test]
    fn mesh_routes_reach_other_namespaces_without_a_grant() {
        let route = |name: &str, parents: &str| {
            format!(
                "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: default}}\n\
                 spec:\n  parentRefs: {parents}\n  rules:\n  - backendRefs: [{{name: reviews-v2, namespace: shop, port: 9080}}]\n"
            )
        };
        let mesh_parent = "{group: \"\", kind: Service, name: reviews, namespace: shop}";
        let yaml = format!(
            "apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: reviews, namespace: shop}}\nspec: {{ports: [{{name: http, number: 9080, protocol: HTTP}}]}}\n---\n\
             apiVersion: registry.lodestar.io/v1\nkind: Service\nmetadata: {{name: reviews-v2, namespace: shop}}\nspec: {{ports: [{{name: http, number: 9080, protocol: HTTP}}]}}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: lodestar}}\nspec: {{controllerName: lodestar.dev/gateway-controller}}\n---\n\
             apiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: web, namespace: default}}\nspec:\n  gatewayClassName: lodestar\n  listeners: [{{name: http, port: 80, protocol: HTTP}}]\n\
             {}{}{}",
            route("consumer", &format!("[{mesh_parent}]")),
            route("ingress", "[{name: web}]"),
            route("both", &format!("[{{name: web}}, {mesh_parent}]")),
        );
        let m = Mesh::build(&state_from(&yaml), Arc::new(MeshConfig::default()));
        let resolved = |name: &str| {
            let s = m.gateway_api_status.get(&crate::model::ResourceKey::new(crate::model::Kind::HttpRoute, "default", name)).unwrap();
            let c = s["parents"][0]["conditions"].as_array().unwrap().iter().find(|c| c["type"] == "ResolvedRefs").unwrap().clone();
            (c["status"].as_str().unwrap().to_string(), c["reason"].as_str().unwrap().to_string())
        };
        assert_eq!(resolved("consumer"), ("True".to_string(), "ResolvedRefs".to_string()));
        assert_eq!(resolved("ingress"), ("False".to_string(), "RefNotPermitted".to_string()));
        assert_eq!(resolved("both"), ("False".to_string(), "RefNotPermitted".to_string()));
        let vs = m
            .virtual_services
            .iter()
            .find(|v| v.key.namespace == "default" && serde_json::to_string(&v.spec).unwrap().contains("reviews.shop"))
            .expect("the consumer route's VirtualService");
        let spec = serde_json::to_value(&vs.spec).unwrap();
        assert_eq!(spec["http"][0]["route"][0]["destination"]["host"], "reviews-v2.shop.svc.cluster.local", "{spec}");
    }

    /// A status write that keeps the generation (`Op::Status`, what the
    /// leader writes from `Mesh::gateway_api_status`) is no change to
    /// translation: the mesh is the same one at the new revision (nothing
    /// rebuilt), every proxy keeps the very resource maps it had, the
    /// objects keep their generation, and a route write after it still
    /// takes the incremental path.
    #[test]
    fn status_writes_are_no_change_to_translation() {
        let mut state = state_from(include_str!("../../tests/fixtures/translate/gateway-api/input.yaml"));
        let gateway = ProxyIdentity::parse(
            "router~127.0.22.1~web-gateway.infra~infra.svc.cluster.local",
            &json!({"LABELS": {"gateway.networking.k8s.io/gateway-name": "web"}}),
        )
        .unwrap();
        let sidecar = ProxyIdentity::parse("sidecar~127.0.22.20~client.infra~infra.svc.cluster.local", &json!({})).unwrap();
        let translator = Translator::new(MeshConfig::default());
        let before = translator.mesh(&state);
        let configs: Vec<_> = [&gateway, &sidecar].iter().map(|p| translator.generate(p, &state).unwrap()).collect();
        let ops: Vec<Op> = before
            .gateway_api_status
            .iter()
            .map(|(key, status)| Op::Status { key: key.clone(), status: status.to_string(), expected_revision: None })
            .collect();
        assert!(ops.len() > 3, "statuses to write: {}", ops.len());
        let versions: Vec<u64> = ops.iter().map(|op| state.get(op.key().unwrap()).unwrap().version).collect();
        let revision = state.apply_txn(&Txn { ops: ops.clone() }).0.unwrap().revision;
        assert_eq!(versions, ops.iter().map(|op| state.get(op.key().unwrap()).unwrap().version).collect::<Vec<_>>(), "a status write bumped a generation");
        assert!(ops.iter().all(|op| state.get(op.key().unwrap()).unwrap().body()["status"].is_object()));
        let after = translator.mesh(&state);
        assert_eq!(after.revision, revision);
        assert!(Arc::ptr_eq(&before.gateway_api, &after.gateway_api) && Arc::ptr_eq(&before.services, &after.services), "the mesh was rebuilt");
        for (proxy, was) in [&gateway, &sidecar].iter().zip(&configs) {
            let now = translator.generate(proxy, &state).unwrap();
            assert_eq!(now.revision, revision);
            assert!(now.resources.iter().all(|(t, m)| was.resources.get(t).is_some_and(|w| Arc::ptr_eq(w, m))), "{} translated again", proxy.id);
        }
        // A route's spec write after its status: incremental, status kept.
        let route = ops.iter().filter_map(Op::key).find(|k| k.kind == crate::model::Kind::HttpRoute).unwrap().clone();
        let mut body = state.get(&route).unwrap().body().clone();
        body.as_object_mut().unwrap().remove("status");
        body["metadata"]["labels"] = json!({"touched": "yes"});
        let objects = state.objects.clone();
        state.apply_txn(&Txn { ops: vec![Op::Put { key: route.clone(), body: body.to_string().into(), expected_revision: None }] }).0.unwrap();
        assert!(state.get(&route).unwrap().body()["status"].is_object(), "a spec write dropped the status");
        assert!(after.update_gateway_routes(&objects, &state).is_some(), "a route write after a status write is not incremental");
    }

    /// The status writer (the root's `gateway_status`) reads the streams'
    /// mesh at the revision they were pushed, which may be just before one
    /// a new stream asked for (a status write's): a revision back with the
    /// same specs is the same mesh at that revision, not a full build.
    #[test]
    fn a_status_only_revision_back_is_the_same_mesh() {
        let mut state = state_from(include_str!("../../tests/fixtures/translate/gateway-api/input.yaml"));
        let translator = Translator::new(MeshConfig::default());
        let pushed = state.clone();
        let built = translator.mesh(&pushed);
        let ops: Vec<Op> =
            built.gateway_api_status.iter().map(|(key, status)| Op::Status { key: key.clone(), status: status.to_string(), expected_revision: None }).collect();
        state.apply_txn(&Txn { ops }).0.unwrap();
        assert!(Arc::ptr_eq(&translator.mesh(&state).gateway_api, &built.gateway_api));
        let back = translator.mesh(&pushed);
        assert_eq!(back.revision, pushed.revision());
        assert!(Arc::ptr_eq(&back.gateway_api, &built.gateway_api) && Arc::ptr_eq(&back.services, &built.services), "the mesh was built again");
    }
}
