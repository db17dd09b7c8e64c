//! Gateway proxies (Pilot's gateway merging and listener building): a
//! listener per server port of every Gateway whose selector matches the
//! proxy, with routes from the VirtualServices bound to those gateways.
//!
//! A port serves either plain HTTP or HTTPS: whichever its first server
//! (oldest Gateway first) asks for; a later server asking for the other is
//! left out, as Pilot does.
//! - Plain HTTP servers share one route table, `http.PORT`.
//! - Each HTTPS server terminates TLS in its own filter chain with its own
//!   route table, `https.PORT.PORT_NAME.GATEWAY.NAMESPACE`, holding only
//!   its hosts. When a port has several, the chain is chosen by SNI among
//!   the servers' hosts; a server naming a host an earlier one on the port
//!   has is left out (Envoy refuses two chains matching the same name).
//!   A lone server matches any SNI (or none), so clients that send no SNI
//!   (by IP address) reach it.
//!
//! - TLS passed through (PASSTHROUGH, AUTO_PASSTHROUGH) and TCP servers
//!   get filter chains by SNI or address (`l4`); one listener per port.
//!
//! An HTTPS server with `credentialName` gets its certificate (and, for
//! MUTUAL, its client CA as `<credentialName>-cacert`) over SDS on the
//! proxy's ADS stream (`tls::downstream`); the xDS layer serves the
//! secrets. ISTIO_MUTUAL serves the gateway's own workload certificate
//! (the agent's SDS, as sidecars' mutual TLS does), only on a proxy that
//! has it (`LODESTAR_SDS`); another gets no listener for that server.
//! Servers Lodestar cannot serve (`credentialNames`, TLS terminated then
//! routed as TCP) are refused by validation; one stored before that gets
//! no listener here, never a plaintext one.

use super::l4::{self, Chains, L4Chain};
use super::listener::{self, Routes, TlsChain};
use super::route::{self, RouteCtx};
use super::scope::ProxyScope;
use super::{add_service_clusters, assemble_route, ClusterCache, RdsParts, VhostPart};
use crate::mesh::{Mesh, Service};
use crate::model::istio::common::Protocol;
use crate::model::istio::gateway::{Server, ServerTlsMode};
use crate::model::istio::{host_matches, resolve_short_name};
use crate::model::proxy::ProxyIdentity;
use crate::resources::{ProxyConfig, ResourceType, XdsResource};
use envoy_types::pb::envoy::config::route::v3::{virtual_host::TlsRequirementType, VirtualHost};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A server of a Gateway that applies to the proxy.
struct GatewayServer<'a> {
    /// `namespace/name` of its Gateway.
    gateway: String,
    server: &'a Server,
    /// Generated from a Gateway API Gateway: its virtual hosts also match
    /// the host with any port (`host:*`), as the Gateway API requires.
    any_port: bool,
}

impl GatewayServer<'_> {
    fn namespace(&self) -> &str {
        self.gateway.split('/').next().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.gateway.split('/').nth(1).unwrap_or("")
    }

    /// Whether the server exposes `host` (of a VirtualService in `vs_ns`):
    /// `[namespace/]host` entries, where `*/` is any namespace and `./`
    /// the Gateway's own.
    fn admits(&self, host: &str, vs_ns: &str) -> bool {
        self.server.hosts.iter().any(|sh| {
            let (ns, pattern) = sh.split_once('/').unwrap_or(("*", sh));
            (ns == "*" || ns == vs_ns || (ns == "." && vs_ns == self.namespace())) && (host_matches(pattern, host) || host_matches(host, pattern))
        })
    }

    /// The server's hosts without their namespaces, sorted and unique:
    /// the SNI names of its filter chain.
    fn sni_hosts(&self) -> Vec<String> {
        let hosts: BTreeSet<&str> = self.server.hosts.iter().map(|h| h.split_once('/').map_or(h.as_str(), |(_, host)| host)).collect();
        hosts.into_iter().map(String::from).collect()
    }

    fn https_redirect(&self) -> bool {
        self.server.tls.as_ref().is_some_and(|t| t.https_redirect == Some(true))
    }
}

/// What a server is served as; `None` for what Lodestar cannot serve.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serves {
    Http,
    Https,
    /// TLS passed through by SNI: PASSTHROUGH and AUTO_PASSTHROUGH
    /// servers, which may share a port.
    Sni,
    Tcp,
}

fn serves(server: &Server, proxy: &ProxyIdentity) -> Option<Serves> {
    let protocol = Protocol::parse(&server.port.protocol)?;
    if protocol.is_http() {
        return Some(Serves::Http);
    }
    let Some(tls) = server.tls.as_ref() else {
        return (protocol.is_tcp() && !protocol.is_tls()).then_some(Serves::Tcp);
    };
    if matches!(tls.mode(), ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough) {
        return protocol.is_tls().then_some(Serves::Sni);
    }
    // ISTIO_MUTUAL: the gateway's workload certificate over the agent's
    // SDS; a gateway without one gets no listener (never plaintext).
    let terminates = tls.terminates() || (tls.mode() == ServerTlsMode::IstioMutual && proxy.sds);
    (protocol == Protocol::Https && terminates).then_some(Serves::Https)
}

/// The servers on one port.
struct PortPlan<'a> {
    serves: Serves,
    servers: Vec<GatewayServer<'a>>,
    /// HTTPS: every SNI host a server on the port has.
    sni_hosts: BTreeSet<String>,
}

/// The servers of the Gateways that apply to `proxy`, by (address, port):
/// servers that `bind` an address of their own get listeners of their own
/// (Gateway API Gateways sharing a proxy).
fn port_plans<'a>(mesh: &'a Mesh, proxy: &ProxyIdentity) -> BTreeMap<(String, u32), PortPlan<'a>> {
    let mut ports: BTreeMap<(String, u32), PortPlan> = BTreeMap::new();
    let selected = mesh.gateways.iter().filter(|g| {
        super::gateway_api::selects(g, proxy)
            .unwrap_or_else(|| !g.spec.selector.is_empty() && g.spec.selector.iter().all(|(k, v)| proxy.labels.get(k) == Some(v)))
    });
    for g in selected {
        for server in &g.spec.servers {
            let Some(kind) = serves(server, proxy) else { continue };
            let any_port = g.labels.contains_key(super::gateway_api::CLASS_LABEL);
            let s = GatewayServer { gateway: format!("{}/{}", g.key.namespace, g.key.name), server, any_port };
            let bind = server.bind.clone().filter(|b| !b.is_empty() && b != "0.0.0.0").unwrap_or_else(|| proxy.ip.clone());
            let plan = ports.entry((bind, server.port.number())).or_insert_with(|| PortPlan { serves: kind, servers: Vec::new(), sni_hosts: BTreeSet::new() });
            if plan.serves != kind {
                continue;
            }
            if kind == Serves::Https {
                let hosts = s.sni_hosts();
                if hosts.iter().any(|h| plan.sni_hosts.contains(h)) {
                    continue;
                }
                plan.sni_hosts.extend(hosts);
            }
            plan.servers.push(s);
        }
    }
    ports
}

/// The name of the route table of a plain HTTP port.
fn http_table(bind: &str, port: u32, proxy: &ProxyIdentity) -> String {
    if bind == proxy.ip {
        format!("http.{port}")
    } else {
        format!("http.{bind}_{port}")
    }
}

/// The name of an HTTPS server's own route table.
fn https_table(port: u32, s: &GatewayServer) -> String {
    format!("https.{port}.{}.{}.{}", s.server.port.name, s.name(), s.namespace())
}

/// Every route table of the proxy: its name, port and servers.
fn tables<'p, 'a>(plans: &'p BTreeMap<(String, u32), PortPlan<'a>>, proxy: &ProxyIdentity) -> Vec<(String, u32, &'p [GatewayServer<'a>])> {
    let mut out = Vec::new();
    for ((bind, port), plan) in plans {
        match plan.serves {
            Serves::Http => out.push((http_table(bind, *port, proxy), *port, &plan.servers[..])),
            Serves::Https => {
                for s in plan.servers.iter().filter(|s| s.server.tls.is_some()) {
                    out.push((https_table(*port, s), *port, std::slice::from_ref(s)));
                }
            }
            Serves::Sni | Serves::Tcp => {}
        }
    }
    out
}

pub(super) fn translate(cfg: &mut ProxyConfig, rds: &mut BTreeMap<String, RdsParts>, mesh: &Mesh, proxy: &ProxyIdentity, cache: Option<&ClusterCache>) {
    let ports = port_plans(mesh, proxy);
    for (name, port, servers) in tables(&ports, proxy) {
        let parts = RdsParts { port, parts: Arc::new(route_parts(port, servers, mesh, proxy)) };
        cfg.insert(ResourceType::Route, assemble_route(&name, &parts.parts));
        rds.insert(name, parts);
    }

    // AuthorizationPolicies selecting the gateway guard its listeners.
    let authz = super::authz::AuthzFilters::for_proxy(mesh, proxy);
    // RequestAuthentication: the same filters on every gateway HTTP(S) port.
    // Then the RBAC filters (they read the verified token's payload).
    let first: Vec<_> = super::jwt::jwt_filter(mesh, proxy).into_iter().chain(authz.http.iter().cloned()).collect();
    for ((bind, port), plan) in ports {
        let name = format!("{bind}_{port}");
        let mut l = match plan.serves {
            Serves::Http => listener::http_listener_with(&name, &bind, port, Routes::Rds(http_table(&bind, port, proxy)), &first),
            Serves::Https => {
                let several = plan.servers.len() > 1;
                let chains = plan
                    .servers
                    .iter()
                    .filter_map(|s| {
                        let tls = s.server.tls.as_ref()?;
                        let route_name = https_table(port, s);
                        // `*` is every name: the chain then matches on none.
                        let hosts = s.sni_hosts();
                        let server_names = if several && !hosts.iter().any(|h| h == "*") { hosts } else { Vec::new() };
                        Some(TlsChain { server_names, tls: super::tls::downstream(tls, &mesh.config.trust_domain), route: route_name })
                    })
                    .collect();
                listener::https_listener(&name, &bind, port, chains, &first)
            }
            Serves::Sni | Serves::Tcp => {
                let chains = l4_chains(port, &plan.servers, mesh, proxy);
                if chains.is_empty() {
                    continue;
                }
                chains.listener(&name, &bind, port)
            }
        };
        authz.guard_tcp(&mut l);
        cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l));
    }
    let all: BTreeMap<String, Arc<Service>> = ProxyScope::new(mesh, proxy, None).services().map(|s| (s.hostname.clone(), s.clone())).collect();
    add_service_clusters(cfg, mesh, proxy, &all, cache);
}

/// The virtual hosts of `servers` on `port`, by host: a host of each
/// VirtualService bound to a server's Gateway, if the server admits it;
/// and every host of a server with `httpsRedirect` (`vhost_of`).
fn route_parts(port: u32, servers: &[GatewayServer], mesh: &Mesh, proxy: &ProxyIdentity) -> Vec<VhostPart> {
    let suffix = &mesh.config.domain_suffix;
    let scope = ProxyScope::new(mesh, proxy, None);
    let mut hosts: BTreeSet<String> = BTreeSet::new();
    for s in servers {
        let ctx = RouteCtx { mesh, proxy, scope: &scope, port, gateway: Some(&s.gateway) };
        for vs in mesh.virtual_services.iter().filter(|vs| ctx.vs_applies(vs)) {
            hosts.extend(vs.spec.hosts.iter().map(|h| resolve_short_name(h, &vs.key.namespace, suffix)).filter(|h| s.admits(h, &vs.key.namespace)));
        }
        if s.https_redirect() {
            hosts.extend(s.sni_hosts());
        }
    }
    hosts.into_iter().filter_map(|h| Some(VhostPart::of(h.clone(), &vhost_of(&h, port, servers, mesh, proxy, &scope)?))).collect()
}

/// The virtual host of `host` on `port`, if any: the routes of the first
/// VirtualService naming it (oldest first) bound to the first server (in
/// order) that admits it. A server with `httpsRedirect` redirects every
/// host it has, with or without a VirtualService.
fn vhost_of(host: &str, port: u32, servers: &[GatewayServer], mesh: &Mesh, proxy: &ProxyIdentity, scope: &ProxyScope) -> Option<VirtualHost> {
    let suffix = &mesh.config.domain_suffix;
    let empty = |redirect: bool| VirtualHost {
        name: format!("{host}:{port}"),
        domains: vec![host.to_string(), format!("{host}:{port}")],
        require_tls: if redirect { TlsRequirementType::All as i32 } else { TlsRequirementType::None as i32 },
        ..Default::default()
    };
    // The VirtualServices naming exactly `host`, in the mesh's order.
    let mut naming: Vec<_> = if host.contains('*') { mesh.vs_wildcard.iter().collect() } else { mesh.vs_by_host.get(host).into_iter().flatten().collect() };
    naming.retain(|vs| vs.spec.hosts.iter().any(|h| resolve_short_name(h, &vs.key.namespace, suffix) == host));
    naming.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    let mut out: Option<VirtualHost> = None;
    for s in servers {
        if out.is_none() {
            let ctx = RouteCtx { mesh, proxy, scope, port, gateway: Some(&s.gateway) };
            if let Some(vs) = naming.iter().find(|vs| ctx.vs_applies(vs) && s.admits(host, &vs.key.namespace)) {
                let mut v = VirtualHost { routes: route::http_routes(&ctx, vs, None), ..empty(s.https_redirect()) };
                // Envoy takes one wildcard per domain: not for `*.x:*`.
                if s.any_port && !host.contains('*') {
                    v.domains.push(format!("{host}:*"));
                }
                out = Some(v);
            }
        }
        if s.https_redirect() && s.sni_hosts().iter().any(|h| h == host) {
            out.get_or_insert_with(|| empty(true)).require_tls = TlsRequirementType::All as i32;
        }
    }
    out
}

/// The gateway's config after changes that altered only the VirtualServices
/// of `hosts` (Gateway API routes: the Gateways, services and every other
/// rule are those of `prev_cfg`): the virtual hosts of those hosts are
/// built again in every route table, the others reused as encoded.
/// `None` when the tables themselves are not those of `prev_rds`.
pub(super) fn incremental(
    prev_cfg: &ProxyConfig,
    prev_rds: &BTreeMap<String, RdsParts>,
    mesh: &Mesh,
    proxy: &ProxyIdentity,
    hosts: &BTreeSet<String>,
) -> Option<(ProxyConfig, BTreeMap<String, RdsParts>)> {
    let mut cfg = prev_cfg.clone();
    cfg.revision = mesh.revision;
    let mut rds = prev_rds.clone();
    let plans = port_plans(mesh, proxy);
    let tables = tables(&plans, proxy);
    if tables.len() != prev_rds.len() {
        return None;
    }
    let scope = ProxyScope::new(mesh, proxy, None);
    for (name, port, servers) in tables {
        let table = rds.get_mut(&name).filter(|t| t.port == port)?;
        let mut changed = false;
        for host in hosts {
            let at = table.parts.binary_search_by(|p| p.hostname.as_str().cmp(host));
            let part = vhost_of(host, port, servers, mesh, proxy, &scope).map(|v| VhostPart::of(host.clone(), &v));
            match (at, part) {
                (Ok(i), Some(p)) if table.parts[i].hash == p.hash && table.parts[i].bytes == p.bytes => continue,
                (Ok(i), Some(p)) => Arc::make_mut(&mut table.parts)[i] = p,
                (Ok(i), None) => {
                    Arc::make_mut(&mut table.parts).remove(i);
                }
                (Err(i), Some(p)) => Arc::make_mut(&mut table.parts).insert(i, p),
                (Err(_), None) => continue,
            }
            changed = true;
        }
        if changed {
            cfg.insert(ResourceType::Route, assemble_route(&name, &table.parts));
        }
    }
    Some((cfg, rds))
}

/// The filter chains of the passthrough or TCP servers on `port`:
/// PASSTHROUGH servers route by the `tls` routes of the VirtualServices
/// bound to their Gateway (SNI hosts the server admits); AUTO_PASSTHROUGH
/// servers by the cluster the SNI names; TCP servers by the `tcp` routes of
/// a VirtualService bound to their Gateway whose hosts the server admits.
fn l4_chains(port: u32, servers: &[GatewayServer], mesh: &Mesh, proxy: &ProxyIdentity) -> Chains {
    let suffix = &mesh.config.domain_suffix;
    let mut chains = Chains::default();
    let scope = ProxyScope::new(mesh, proxy, None);
    for s in servers {
        let ctx = RouteCtx { mesh, proxy, scope: &scope, port, gateway: Some(&s.gateway) };
        match s.server.tls.as_ref().map(|t| t.mode()) {
            Some(ServerTlsMode::AutoPassthrough) => {
                for svc in scope.services().filter(|svc| s.admits(&svc.hostname, &svc.namespace)) {
                    let dr = super::destination_rule_for(mesh, &proxy.namespace, svc);
                    let subsets = std::iter::once("").chain(dr.into_iter().flat_map(|d| d.spec.subsets.iter().map(|s| s.name.as_str())));
                    for subset in subsets {
                        for p in &svc.ports {
                            chains.push(L4Chain {
                                server_names: vec![l4::auto_passthrough_sni(p.number, subset, &svc.hostname)],
                                destination_subnets: Vec::new(),
                                clusters: vec![(super::outbound_cluster_name(p.number, subset, &svc.hostname), 1)],
                            });
                        }
                    }
                }
            }
            Some(_) => {
                for vs in mesh.virtual_services.iter().filter(|vs| ctx.vs_applies(vs)) {
                    let admit = |host: &str| s.admits(host, &vs.key.namespace);
                    l4::tls_route_chains(&ctx, vs, &admit, &mut chains);
                }
            }
            None => {
                for vs in mesh.virtual_services.iter().filter(|vs| ctx.vs_applies(vs)) {
                    if vs.spec.hosts.iter().any(|h| s.admits(&resolve_short_name(h, &vs.key.namespace, suffix), &vs.key.namespace)) {
                        l4::tcp_route_chains(&ctx, vs, &[], &mut chains);
                    }
                }
            }
        }
    }
    chains
}
