//! TLS and TCP routing (VirtualService `tls` and `tcp` routes), after
//! Pilot's filter chain building for non-HTTP ports: a listener of filter
//! chains, each chosen by SNI (read by the `tls_inspector`) and/or the
//! destination address, each a TCP proxy to one cluster or to weighted
//! clusters. TLS is never terminated here: the backend does it.
//!
//! - Sidecars: a non-HTTP port gets, per TLS/HTTPS service on it, the
//!   chains of its VirtualService's `tls` routes (SNI hosts), then a chain
//!   for the service's own name by SNI (its `tcp` routes, else the service
//!   itself). A plain TCP service on the port gets the chains without SNI
//!   (its `tcp` routes, else itself). A port with a single service needs no
//!   SNI for it: its default chain matches every connection, as before.
//! - Gateways: PASSTHROUGH servers get the `tls` routes of the
//!   VirtualServices bound to them (SNI hosts the server admits);
//!   AUTO_PASSTHROUGH servers a chain per cluster, named by SNI
//!   `outbound_.PORT_.SUBSET_.HOST` (Istio's form); TCP servers the `tcp`
//!   routes.
//!
//! Envoy refuses two chains with the same match, so the first chain for a
//! match wins (the order is Istio's: routes in order, VirtualServices
//! oldest first).

use super::listener::tcp_proxy_filter;
use super::route::RouteCtx;
use super::{cluster::socket_address, outbound_cluster_name};
use crate::mesh::{Config, Service};
use crate::model::istio::virtual_service::RouteDestination;
use crate::model::istio::{resolve_short_name, VirtualService};
use envoy_types::pb::envoy::config::core::v3::CidrRange;
use envoy_types::pb::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::google::protobuf::UInt32Value;
use std::collections::BTreeSet;

/// One filter chain: what it matches and where it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L4Chain {
    /// SNI names; empty matches any (and connections without SNI).
    pub server_names: Vec<String>,
    /// Destination addresses (CIDRs or IPs); empty matches any.
    pub destination_subnets: Vec<String>,
    /// Clusters and their weights (one: no split).
    pub clusters: Vec<(String, u32)>,
}

/// Chains in the order they were added, without two for the same match.
#[derive(Default)]
pub struct Chains {
    chains: Vec<L4Chain>,
    seen: BTreeSet<(Vec<String>, Vec<String>)>,
}

impl Chains {
    pub fn push(&mut self, mut chain: L4Chain) {
        chain.server_names.sort();
        chain.server_names.dedup();
        chain.destination_subnets.sort();
        chain.destination_subnets.dedup();
        if chain.clusters.is_empty() || !self.seen.insert((chain.server_names.clone(), chain.destination_subnets.clone())) {
            return;
        }
        self.chains.push(chain);
    }

    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// Add `other`'s chains, those matching any destination narrowed to
    /// `subnets` (none: as they are).
    fn extend_within(&mut self, other: Chains, subnets: &[String]) {
        for mut c in other.chains {
            if c.destination_subnets.is_empty() {
                c.destination_subnets = subnets.to_vec();
            }
            self.push(c);
        }
    }

    /// Its filter chains (stats under `stat_prefix`) and whether one
    /// matches on SNI (the listener then needs the TLS inspector).
    pub fn filter_chains(self, stat_prefix: &str) -> (Vec<FilterChain>, bool) {
        let sni = self.chains.iter().any(|c| !c.server_names.is_empty());
        (self.chains.into_iter().map(|c| filter_chain(stat_prefix, c)).collect(), sni)
    }

    /// The listener: a TLS inspector when a chain matches on SNI.
    pub fn listener(self, name: &str, ip: &str, port: u32) -> Listener {
        let (filter_chains, sni) = self.filter_chains(name);
        let listener_filters = super::listener::tls_inspector_if(sni);
        Listener { name: name.to_string(), address: Some(socket_address(ip, port)), filter_chains, listener_filters, ..Default::default() }
    }
}

fn filter_chain(stat_prefix: &str, c: L4Chain) -> FilterChain {
    let matches = !c.server_names.is_empty() || !c.destination_subnets.is_empty();
    let filter_chain_match = matches.then(|| FilterChainMatch {
        server_names: c.server_names,
        prefix_ranges: c.destination_subnets.iter().filter_map(|s| cidr(s)).collect(),
        ..Default::default()
    });
    FilterChain { filter_chain_match, filters: vec![tcp_proxy_filter(stat_prefix, &c.clusters)], ..Default::default() }
}

/// `10.0.0.0/8` or a bare address (a /32 or /128).
fn cidr(subnet: &str) -> Option<CidrRange> {
    let (address, len) = match subnet.split_once('/') {
        Some((a, l)) => (a, l.parse::<u32>().ok()?),
        None => (subnet, if subnet.contains(':') { 128 } else { 32 }),
    };
    Some(CidrRange { address_prefix: address.to_string(), prefix_len: Some(UInt32Value { value: len }) })
}

/// A route's destinations as clusters and weights. An unweighted lone
/// destination takes everything; in a split, an unweighted one takes
/// nothing (Istio's weights default to 0), and Envoy wants no 0 weights.
pub fn destinations(ctx: &RouteCtx, vs_ns: &str, route: &[RouteDestination]) -> Vec<(String, u32)> {
    let suffix = &ctx.mesh.config.domain_suffix;
    route
        .iter()
        .filter_map(|d| {
            let weight = d.weight.unwrap_or(if route.len() == 1 { 100 } else { 0 });
            if weight <= 0 {
                return None;
            }
            let host = resolve_short_name(&d.destination.host, vs_ns, suffix);
            // No port given: the service's only port, else the listener's.
            let port = match &d.destination.port {
                Some(p) => p.number,
                None => match ctx.scope.service(&host).map(|s| s.ports.as_slice()) {
                    Some([only]) => only.number,
                    _ => ctx.port,
                },
            };
            Some((outbound_cluster_name(port, d.destination.subset.as_deref().unwrap_or(""), &host), weight as u32))
        })
        .collect()
}

/// The chains of a VirtualService's `tls` routes that apply here, with
/// the SNI hosts `admit` keeps (all, on a sidecar; the server's, on a
/// gateway).
pub fn tls_route_chains(ctx: &RouteCtx, vs: &Config<VirtualService>, admit: &dyn Fn(&str) -> bool, out: &mut Chains) {
    let ns = &vs.key.namespace;
    let suffix = &ctx.mesh.config.domain_suffix;
    for route in &vs.spec.tls {
        let clusters = destinations(ctx, ns, &route.route);
        for m in route.matches.iter().filter(|m| ctx.l4_match_applies(m.port, &m.source_labels, &m.gateways, ns)) {
            let server_names: Vec<String> = m.sni_hosts.iter().map(|h| resolve_short_name(h, ns, suffix)).filter(|h| admit(h)).collect();
            if server_names.is_empty() {
                continue;
            }
            out.push(L4Chain { server_names, destination_subnets: m.destination_subnets.clone(), clusters: clusters.clone() });
        }
    }
}

/// The chains of a VirtualService's `tcp` routes that apply here (a route
/// without matches matches everything), each also matching `server_names`.
pub fn tcp_route_chains(ctx: &RouteCtx, vs: &Config<VirtualService>, server_names: &[String], out: &mut Chains) {
    let ns = &vs.key.namespace;
    for route in &vs.spec.tcp {
        let clusters = destinations(ctx, ns, &route.route);
        if route.matches.is_empty() {
            out.push(L4Chain { server_names: server_names.to_vec(), destination_subnets: Vec::new(), clusters });
            continue;
        }
        for m in route.matches.iter().filter(|m| ctx.l4_match_applies(m.port, &m.source_labels, &m.gateways, ns)) {
            out.push(L4Chain { server_names: server_names.to_vec(), destination_subnets: m.destination_subnets.clone(), clusters: clusters.clone() });
        }
    }
}

/// A sidecar's listener for a port without HTTP services (see the module
/// documentation); `None` if nothing on it can be routed.
pub fn sidecar_listener(ctx: &RouteCtx, name: &str, bind: &str, services: &[&Service]) -> Option<Listener> {
    let chains = sidecar_chains(ctx, services, false);
    (!chains.is_empty()).then(|| chains.listener(name, bind, ctx.port))
}

/// A service's CIDR `addresses` (`198.18.200.0/24`): on a captured proxy
/// its connections are told apart by their original destination in them.
pub fn subnets(svc: &Service) -> Vec<String> {
    svc.addresses.iter().filter(|a| a.contains('/')).cloned().collect()
}

/// The chains of `services` on one port. `by_subnet` (a captured proxy's
/// `0.0.0.0_PORT`): a service with CIDR addresses has every chain of its
/// own (those of its routes without `destinationSubnets`, and its default)
/// match its subnets, as Istio's listener for a CIDR service does; the
/// plain TCP service that takes unmatched connections is the first one
/// without subnets.
pub fn sidecar_chains(ctx: &RouteCtx, services: &[&Service], by_subnet: bool) -> Chains {
    let single = services.len() == 1;
    let subnets = |svc: &Service| if by_subnet { subnets(svc) } else { Vec::new() };
    let mut chains = Chains::default();
    let tls = |s: &&&Service| s.port(ctx.port).is_some_and(|p| p.protocol.is_tls());
    for svc in services.iter().filter(tls) {
        let mut own = Chains::default();
        let vs = super::route::virtual_service_for(ctx, &svc.hostname);
        if let Some(vs) = vs {
            tls_route_chains(ctx, vs, &|_| true, &mut own);
        }
        let names = if single { Vec::new() } else { vec![svc.hostname.clone()] };
        if let Some(vs) = vs {
            tcp_route_chains(ctx, vs, &names, &mut own);
        }
        own.push(L4Chain { server_names: names, destination_subnets: Vec::new(), clusters: vec![(outbound_cluster_name(ctx.port, "", &svc.hostname), 1)] });
        chains.extend_within(own, &subnets(svc));
    }
    // Plain TCP carries no name: one service per port (the first without
    // subnets) is reached by connections no other chain takes.
    let plain: Vec<&Service> = services.iter().filter(|s| !tls(s)).copied().collect();
    let catch_all = plain.iter().find(|s| subnets(s).is_empty());
    for svc in plain.iter().filter(|s| !subnets(s).is_empty()).chain(catch_all) {
        let mut own = Chains::default();
        if let Some(vs) = super::route::virtual_service_for(ctx, &svc.hostname) {
            tcp_route_chains(ctx, vs, &[], &mut own);
        }
        own.push(L4Chain {
            server_names: Vec::new(),
            destination_subnets: Vec::new(),
            clusters: vec![(outbound_cluster_name(ctx.port, "", &svc.hostname), 1)],
        });
        chains.extend_within(own, &subnets(svc));
    }
    chains
}

/// The AUTO_PASSTHROUGH SNI name of a cluster (Istio's
/// `outbound_.PORT_.SUBSET_.HOST`).
pub fn auto_passthrough_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}
