//! Istio's listener model for a proxy whose workload's traffic is captured
//! (`INTERCEPTION_MODE: REDIRECT`, `lodestar agent --capture`): nothing
//! binds but two listeners, and every connection is dispatched by its
//! original destination (`SO_ORIGINAL_DST`).
//!
//! - `virtualOutbound` (0.0.0.0:15001, `use_original_dst`): Envoy hands each
//!   connection to the listener for its original `IP:PORT`, else
//!   `0.0.0.0:PORT`, else keeps it: then to `PassthroughCluster` (the
//!   original destination, ALLOW_ANY) or `BlackHoleCluster` (the Sidecar's
//!   `outboundTrafficPolicy: REGISTRY_ONLY`).
//! - Per port with HTTP services, `0.0.0.0_PORT` (`bind_to_port: false`):
//!   the route table `PORT` as for bound proxies, whose virtual hosts also
//!   answer to the services' addresses (`VIP`, `VIP:PORT`), plus Istio's
//!   `allow_any` virtual host to `PassthroughCluster` under ALLOW_ANY.
//! - Per TCP/TLS service address, `VIP_PORT` (`bind_to_port: false`): the
//!   service's filter chains (`l4`), so services sharing a port are told
//!   apart by address (declared; with DNS capture, else allocated:
//!   `dns::auto_vips`); those without one share `0.0.0.0_PORT` as bound
//!   proxies share their port, and so do those with CIDR `addresses`,
//!   each by a filter chain matching its subnets (`prefix_ranges` on the
//!   original destination; on a port with HTTP services, chains of the
//!   HTTP listener), as do a VirtualService's `destinationSubnets`.
//! - `virtualInbound` (0.0.0.0:15006, the `original_dst` listener filter):
//!   per inbound port the filter chains a bound inbound listener has (the
//!   port's mutual TLS mode, RBAC, `inbound|PORT||` to the workload's
//!   endpoint), matched by destination port; other ports pass through to
//!   their original destination (`InboundPassthroughClusterIpv4`, from
//!   127.0.0.6, which the capture rules leave alone) unless mutual TLS is
//!   STRICT. The inbound ports are the Sidecar's `ingress`, else those of
//!   the registry instances at the proxy's address (to 127.0.0.1).

use super::cluster::socket_address;
use super::inbound::{self, IngressPort};
use super::listener::tcp_proxy_filter;
use super::mtls::{self, Inbound};
use super::route::RouteCtx;
use super::util::{any, duration};
use crate::mesh::{Config, Mesh, Service};
use crate::model::istio::sidecar::OutboundMode;
use crate::model::istio::Sidecar;
use crate::model::proxy::ProxyIdentity;
use crate::resources::{ProxyConfig, ResourceType, XdsResource};
use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, cluster::LbPolicy, Cluster};
use envoy_types::pb::envoy::config::core::v3::{socket_address::PortSpecifier, BindConfig, SocketAddress};
use envoy_types::pb::envoy::config::listener::v3::{listener_filter, FilterChain, FilterChainMatch, Listener, ListenerFilter};
use envoy_types::pb::envoy::config::route::v3::{route::Action, route_action::ClusterSpecifier, Route, RouteAction, RouteMatch, VirtualHost};
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use std::collections::BTreeMap;

pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
pub const OUTBOUND_PORT: u32 = 15001;
pub const INBOUND_PORT: u32 = 15006;
pub const PASSTHROUGH: &str = "PassthroughCluster";
pub const BLACKHOLE: &str = "BlackHoleCluster";
pub const INBOUND_PASSTHROUGH: &str = "InboundPassthroughClusterIpv4";
/// The source of inbound passthrough connections (Istio's; excluded from
/// capture by the agent's rules).
pub const INBOUND_PASSTHROUGH_SOURCE: &str = "127.0.0.6";
const ORIGINAL_DST_FILTER: &str = "envoy.filters.listener.original_dst";

/// Whether a destination outside the mesh passes (ALLOW_ANY) or is
/// refused (REGISTRY_ONLY): the Sidecar's `outboundTrafficPolicy` (one that
/// names no mode is REGISTRY_ONLY, as protobuf's default), else the
/// MeshConfig's (`ALLOW_ANY`, Istio's mesh default, when unset).
pub fn allow_any(mesh: &Mesh, sc: Option<&Config<Sidecar>>) -> bool {
    match sc.and_then(|s| s.spec.outbound_traffic_policy.as_ref()) {
        None => mesh.mesh_config.allow_any(),
        Some(p) => p.mode == Some(OutboundMode::AllowAny),
    }
}

/// Extend each service's domains on `port` with its addresses (`VIP` and
/// `VIP:PORT`), none listed twice: a client that dials the address sends
/// it as the Host.
pub fn add_address_domains(proxy: &ProxyIdentity, services: &[&Service], domains: &mut [Vec<String>], port: u32) {
    let mut seen: std::collections::BTreeSet<String> = domains.iter().flatten().cloned().collect();
    for (svc, d) in services.iter().zip(domains.iter_mut()) {
        // A CIDR address is no Host a client sends.
        for a in svc.vips(proxy.dns_capture).filter(|a| !a.contains('/')) {
            for name in [format!("{a}:{port}"), a.to_string()] {
                if seen.insert(name.clone()) {
                    d.push(name);
                }
            }
        }
    }
}

/// Istio's `allow_any` virtual host: any other Host to the original
/// destination.
pub fn allow_any_vhost() -> VirtualHost {
    let action =
        RouteAction { cluster_specifier: Some(ClusterSpecifier::Cluster(PASSTHROUGH.into())), timeout: Some(super::util::millis(0)), ..Default::default() };
    VirtualHost {
        name: "allow_any".into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: "allow_any".into(),
            r#match: Some(RouteMatch {
                path_specifier: Some(envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            action: Some(Action::Route(action)),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A listener that binds nothing: `virtualOutbound` hands it connections.
pub fn unbound(mut l: Listener) -> Listener {
    l.bind_to_port = Some(BoolValue { value: false });
    l
}

/// The outbound listeners of a port's non-HTTP services: one per service
/// address (`VIP_PORT`), and `0.0.0.0_PORT` for those without one and
/// those with CIDR addresses (chains matching their subnets, `l4`). On a
/// port with HTTP services (`http`: its `0.0.0.0_PORT` listener), the
/// subnets' chains join that listener, as Istio merges them; services
/// without an address are not reached there.
pub fn tcp_listeners(ctx: &RouteCtx, services: &[&Service], http: Option<&mut Listener>) -> Vec<Listener> {
    let port = ctx.port;
    let tcp: Vec<&Service> = services.iter().copied().filter(|s| s.port(port).is_some_and(|p| !p.is_http())).collect();
    let mut out = Vec::new();
    let auto = ctx.proxy.dns_capture;
    for svc in &tcp {
        for a in svc.vips(auto).filter(|a| a.parse::<std::net::IpAddr>().is_ok()) {
            if let Some(l) = super::l4::sidecar_listener(ctx, &format!("{a}_{port}"), a, &[*svc]) {
                out.push(unbound(l));
            }
        }
    }
    let by_subnet = |s: &&Service| !super::l4::subnets(s).is_empty();
    let shared: Vec<&Service> = tcp.iter().copied().filter(|s| s.vips(auto).next().is_none() || by_subnet(s)).collect();
    let name = format!("0.0.0.0_{port}");
    match http {
        None if !shared.is_empty() => {
            let chains = super::l4::sidecar_chains(ctx, &shared, true);
            if !chains.is_empty() {
                out.push(unbound(chains.listener(&name, "0.0.0.0", port)));
            }
        }
        Some(l) => {
            let subnetted: Vec<&Service> = shared.into_iter().filter(by_subnet).collect();
            let (chains, sni) = super::l4::sidecar_chains(ctx, &subnetted, true).filter_chains(&name);
            if sni && !l.listener_filters.iter().any(|f| f.name == super::listener::TLS_INSPECTOR) {
                l.listener_filters.extend(super::listener::tls_inspector_if(true));
            }
            // Before the HTTP chain (Envoy picks the most specific match
            // whatever the order; this keeps the output stable).
            l.filter_chains.splice(0..0, chains);
        }
        None => {}
    }
    out
}

/// `virtualOutbound`, `virtualInbound` and their clusters.
pub fn virtual_listeners(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, sc: Option<&Config<Sidecar>>) {
    for c in [passthrough_cluster(PASSTHROUGH, None), passthrough_cluster(INBOUND_PASSTHROUGH, Some(INBOUND_PASSTHROUGH_SOURCE)), blackhole_cluster()] {
        cfg.insert(ResourceType::Cluster, XdsResource::new(c.name.clone(), &c));
    }
    let fallback = if allow_any(mesh, sc) { PASSTHROUGH } else { BLACKHOLE };
    let outbound = Listener {
        name: VIRTUAL_OUTBOUND.into(),
        address: Some(socket_address("0.0.0.0", OUTBOUND_PORT)),
        use_original_dst: Some(BoolValue { value: true }),
        filter_chains: vec![FilterChain {
            name: format!("{VIRTUAL_OUTBOUND}-catchall-tcp"),
            filters: vec![tcp_proxy_filter(fallback, &[(fallback.to_string(), 1)])],
            ..Default::default()
        }],
        ..Default::default()
    };
    cfg.insert(ResourceType::Listener, XdsResource::new(outbound.name.clone(), &outbound));
    let inbound = virtual_inbound(cfg, mesh, proxy, sc);
    cfg.insert(ResourceType::Listener, XdsResource::new(inbound.name.clone(), &inbound));
}

/// The workload's inbound ports: the Sidecar's ingress, else the ports of
/// the registry instances at the proxy's address (each to 127.0.0.1 on
/// the port the instance serves).
pub fn inbound_ports(mesh: &Mesh, proxy: &ProxyIdentity, sc: Option<&Config<Sidecar>>) -> Vec<IngressPort> {
    if let Some(sc) = sc.filter(|s| !s.spec.ingress.is_empty()) {
        return inbound::sidecar_ports(proxy, sc).into_iter().map(|p| IngressPort { bind: "0.0.0.0".into(), ..p }).collect();
    }
    let mut ports: BTreeMap<u32, IngressPort> = BTreeMap::new();
    for svc in mesh.services.values().flatten() {
        for i in svc.instances.iter().filter(|i| i.address == proxy.ip) {
            for p in &svc.ports {
                let port = i.port_for(p);
                ports.entry(port).or_insert_with(|| IngressPort { port, bind: "0.0.0.0".into(), endpoint: ("127.0.0.1".into(), port), is_http: p.is_http() });
            }
        }
    }
    ports.into_values().collect()
}

fn virtual_inbound(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, sc: Option<&Config<Sidecar>>) -> Listener {
    let ports = inbound_ports(mesh, proxy, sc);
    let mut filter_chains = Vec::new();
    for (p, l) in ports.iter().zip(inbound::ingress_listeners(cfg, mesh, proxy, &ports)) {
        for mut chain in l.filter_chains {
            let m = chain.filter_chain_match.get_or_insert_with(FilterChainMatch::default);
            m.destination_port = Some(UInt32Value { value: p.port });
            chain.name = format!("{}_{}", p.port, chain.name);
            filter_chains.push(chain);
        }
    }
    // Other ports: to their original destination, unless only mutual TLS
    // may come in.
    if matches!(mtls::inbound_mode(mesh, proxy, 0), Inbound::Plaintext | Inbound::Permissive) {
        filter_chains.push(FilterChain {
            name: "inbound-passthrough".into(),
            filters: vec![tcp_proxy_filter(INBOUND_PASSTHROUGH, &[(INBOUND_PASSTHROUGH.to_string(), 1)])],
            ..Default::default()
        });
    }
    let inspect = filter_chains.iter().any(|c| c.filter_chain_match.as_ref().is_some_and(|m| !m.transport_protocol.is_empty()));
    let mut listener_filters = vec![ListenerFilter {
        name: ORIGINAL_DST_FILTER.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(&OriginalDst {}))),
        ..Default::default()
    }];
    if inspect {
        listener_filters.extend(super::listener::tls_inspector_if(true));
    }
    Listener {
        name: VIRTUAL_INBOUND.into(),
        address: Some(socket_address("0.0.0.0", INBOUND_PORT)),
        filter_chains,
        listener_filters,
        continue_on_listener_filters_timeout: inspect,
        ..Default::default()
    }
}

/// An ORIGINAL_DST cluster (connections go where they were headed), from
/// `source` if given.
fn passthrough_cluster(name: &str, source: Option<&str>) -> Cluster {
    Cluster {
        name: name.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::OriginalDst as i32)),
        lb_policy: LbPolicy::ClusterProvided as i32,
        connect_timeout: Some(duration(std::time::Duration::from_secs(10))),
        upstream_bind_config: source.map(|s| BindConfig {
            source_address: Some(SocketAddress { address: s.into(), port_specifier: Some(PortSpecifier::PortValue(0)), ..Default::default() }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A cluster with no endpoints: connections to it are closed.
fn blackhole_cluster() -> Cluster {
    Cluster {
        name: BLACKHOLE.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: Some(duration(std::time::Duration::from_secs(10))),
        ..Default::default()
    }
}
