//! Inbound: a Sidecar's `ingress` listeners, each forwarding to the
//! workload's own endpoint (`defaultEndpoint`) through a static
//! `inbound|PORT||` cluster. HTTP ports get an HTTP connection manager with
//! an inline route table, other ports a TCP proxy; both behind the RBAC
//! filters of the AuthorizationPolicies that select the workload (`authz`).
//!
//! Mutual TLS (`mtls::inbound_mode`, from PeerAuthentication) decides the
//! filter chains of each port, all with the same filters
//! ([`inbound_filters`]):
//! - plaintext: one chain, no TLS;
//! - STRICT: a `tls_inspector` and one chain for mesh TLS (transport `tls`,
//!   a mesh ALPN), terminating it with the workload certificate and
//!   requiring the client's; anything else matches no chain and is closed;
//! - PERMISSIVE: the same mesh TLS chain, byte for byte, plus chains that
//!   pass everything else to the app as is (other TLS, and plaintext). Flipping PERMISSIVE and STRICT only adds or
//!   removes the plaintext chain, so Envoy keeps the mutual TLS
//!   connections open (an in-place filter chain update), and the server
//!   accepts mutual TLS in both modes before any client sends it.

use super::authz::AuthzFilters;
use super::listener::{self, Routes, HCM};
use super::mtls::{self, Inbound};
use super::util::any;
use super::{cluster, util};
use crate::mesh::{Config, Mesh};
use crate::model::istio::Sidecar;
use crate::model::proxy::ProxyIdentity;
use crate::resources::{ProxyConfig, ResourceType, XdsResource};
use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, Cluster};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, FilterChainMatch, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{ForwardClientCertDetails, SetCurrentClientCertDetails},
    HttpFilter,
};

/// One inbound port of a workload: where Envoy listens (a bound listener's
/// address; a captured proxy's `virtualInbound` chain matches the port)
/// and the workload's endpoint it forwards to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressPort {
    pub port: u32,
    pub bind: String,
    pub endpoint: (String, u32),
    pub is_http: bool,
}

/// The ports of the Sidecar `sc`'s `ingress` (bound to `bind`, else the
/// proxy's IP), but those that would forward to themselves.
pub fn sidecar_ports(proxy: &ProxyIdentity, sc: &Config<Sidecar>) -> Vec<IngressPort> {
    let mut out = Vec::new();
    for ing in &sc.spec.ingress {
        let port = ing.port.number();
        let bind = ing.bind.clone().filter(|b| !b.is_empty() && b != "0.0.0.0").unwrap_or_else(|| proxy.ip.clone());
        let endpoint = ing.default_endpoint();
        let Some((ep_ip, ep_port)) = endpoint.rsplit_once(':').and_then(|(ip, p)| Some((ip, p.parse::<u32>().ok()?))) else { continue };
        if ep_ip == bind && ep_port == port {
            // The proxy would forward to itself.
            continue;
        }
        let is_http = crate::model::istio::common::Protocol::parse(&ing.port.protocol).is_some_and(|p| p.is_http());
        out.push(IngressPort { port, bind, endpoint: (ep_ip.to_string(), ep_port), is_http });
    }
    out
}

/// The inbound listeners and clusters of the Sidecar `sc` selecting `proxy`.
pub fn sidecar_ingress(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, sc: &Config<Sidecar>) {
    for l in ingress_listeners(cfg, mesh, proxy, &sidecar_ports(proxy, sc)) {
        cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l));
    }
}

/// A listener per port (its clusters inserted into `cfg`), with the filter
/// chains of its mutual TLS mode and the workload's RBAC filters; none for
/// a port mutual TLS closes (STRICT without a workload certificate).
pub fn ingress_listeners(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, ports: &[IngressPort]) -> Vec<Listener> {
    // The AuthorizationPolicies selecting this workload guard every port.
    let authz = AuthzFilters::for_proxy(mesh, proxy);
    // RequestAuthentication: the same filters on every inbound HTTP port.
    // Then the RBAC filters (they read the verified token's payload).
    let first: Vec<_> = super::jwt::jwt_filter(mesh, proxy).into_iter().chain(authz.http.iter().cloned()).collect();
    let mut out = Vec::new();
    for p in ports {
        let port = p.port;
        let mode = mtls::inbound_mode(mesh, proxy, port);
        if mode == Inbound::Refused {
            // STRICT without a workload certificate: closed, not plaintext.
            continue;
        }
        let cluster_name = format!("inbound|{port}||");
        let c = inbound_cluster(&cluster_name, &p.endpoint.0, p.endpoint.1);
        cfg.insert(ResourceType::Cluster, XdsResource::new(cluster_name.clone(), &c));
        let name = format!("{}_{port}", p.bind);
        let filters = |_tls: bool| inbound_filters(&name, port, p.is_http, &cluster_name, &first);
        let mut l = inbound_listener(&name, &p.bind, port, mode, &mesh.config.trust_domain, filters);
        authz.guard_tcp(&mut l);
        out.push(l);
    }
    out
}

/// An inbound listener with the filter chains of `mode`, each chain's
/// filters from `filters(is_mutual_tls_chain)`.
fn inbound_listener(name: &str, bind: &str, port: u32, mode: Inbound, trust_domain: &str, filters: impl Fn(bool) -> Vec<Filter>) -> Listener {
    let mtls_chain = || FilterChain {
        name: "mtls".into(),
        filter_chain_match: Some(FilterChainMatch {
            transport_protocol: "tls".into(),
            application_protocols: mtls::MESH_ALPN.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }),
        filters: filters(true),
        transport_socket: Some(super::util::transport_socket(&mtls::downstream(trust_domain))),
        ..Default::default()
    };
    let plaintext_chain = || FilterChain { name: "plaintext".into(), filters: filters(false), ..Default::default() };
    // TLS that is not the mesh's (an app's own) goes to the app as bytes.
    // It needs a chain of its own: Envoy picks the most specific transport
    // protocol first and does not fall back, so TLS without a mesh ALPN
    // would match no chain at all.
    let app_tls_chain = || FilterChain {
        name: "app-tls".into(),
        filter_chain_match: Some(FilterChainMatch { transport_protocol: "tls".into(), ..Default::default() }),
        filters: filters(false),
        ..Default::default()
    };
    let (filter_chains, inspect) = match mode {
        Inbound::Plaintext | Inbound::Refused => (vec![plaintext_chain()], false),
        Inbound::Strict => (vec![mtls_chain()], true),
        Inbound::Permissive => (vec![mtls_chain(), app_tls_chain(), plaintext_chain()], true),
    };
    Listener {
        name: name.to_string(),
        address: Some(cluster::socket_address(bind, port)),
        filter_chains,
        listener_filters: listener::tls_inspector_if(inspect),
        // A client that sends nothing first (a server-first protocol) is
        // not mesh TLS: after the inspector's timeout it gets the chain
        // for plaintext (PERMISSIVE) or none (STRICT: closed). The same in
        // both modes, so a flip changes filter chains only.
        continue_on_listener_filters_timeout: inspect,
        ..Default::default()
    }
}

/// The filters of one inbound filter chain (HTTP: `first`, then the
/// connection manager's own), ending in the HTTP router
/// (through the connection manager) or the TCP proxy to `cluster_name`.
/// Every chain of a port gets the same; filters that act on the peer
/// (authorization) go here, before the router / TCP proxy.
///
/// HTTP: the peer's certificate (its SPIFFE id, when the chain is mutual
/// TLS) goes to the workload in `x-forwarded-client-cert`, and a client's
/// own such header is always dropped (Envoy's SANITIZE_SET), so the
/// workload can trust it.
pub fn inbound_filters(stat_prefix: &str, port: u32, is_http: bool, cluster_name: &str, first: &[HttpFilter]) -> Vec<Filter> {
    if !is_http {
        return vec![super::listener::tcp_proxy_filter(stat_prefix, &[(cluster_name.to_string(), 1)])];
    }
    let rc = RouteConfiguration {
        name: format!("inbound|{port}||"),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(envoy_types::pb::envoy::config::route::v3::route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(cluster_name.to_string())),
                    timeout: Some(util::millis(0)),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut hcm = listener::http_connection_manager(stat_prefix, Routes::Inline(Box::new(rc)));
    // RequestAuthentication's filters (`jwt`) first.
    listener::prepend_filters(&mut hcm, first);
    hcm.forward_client_cert_details = ForwardClientCertDetails::SanitizeSet as i32;
    hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails { uri: true, ..Default::default() });
    vec![Filter { name: HCM.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))) }]
}

pub fn inbound_cluster(name: &str, ip: &str, port: u32) -> Cluster {
    use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints};
    Cluster {
        name: name.into(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
        connect_timeout: Some(util::duration(std::time::Duration::from_secs(10))),
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: name.into(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint { address: Some(cluster::socket_address(ip, port)), ..Default::default() })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}
