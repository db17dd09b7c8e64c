//! Listeners: HTTP connection managers (RDS) or TCP proxies on the
//! addresses planned in `scope`, inbound listeners for Sidecar ingress, and
//! gateway listeners (plain HTTP, or HTTPS with a TLS filter chain per
//! server).

use super::cluster::socket_address;
use super::route::{http_filter_names, CORS_FILTER, FAULT_FILTER};
use super::util::{ads_config_source, any};
use envoy_types::pb::envoy::config::listener::v3::{filter, listener_filter, Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, ForwardClientCertDetails, RouteSpecifier, SetCurrentClientCertDetails, UpgradeConfig},
    http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::{weighted_cluster::ClusterWeight, ClusterSpecifier, WeightedCluster},
    TcpProxy,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

pub const HCM: &str = "envoy.filters.network.http_connection_manager";
pub const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";
pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";

/// RDS by name, or an inline route table (inbound listeners).
pub enum Routes {
    Rds(String),
    Inline(Box<RouteConfiguration>),
}

pub fn http_connection_manager(stat_prefix: &str, routes: Routes) -> HttpConnectionManager {
    let http_filters = http_filter_names()
        .into_iter()
        .map(|name| {
            let typed = match name {
                FAULT_FILTER => any(&HttpFault::default()),
                CORS_FILTER => any(&Cors::default()),
                _ => any(&Router::default()),
            };
            HttpFilter { name: name.to_string(), config_type: Some(http_filter::ConfigType::TypedConfig(typed)), ..Default::default() }
        })
        .collect();
    let route_specifier = match routes {
        Routes::Rds(name) => RouteSpecifier::Rds(Rds { config_source: Some(ads_config_source()), route_config_name: name }),
        Routes::Inline(rc) => RouteSpecifier::RouteConfig(*rc),
    };
    HttpConnectionManager {
        stat_prefix: stat_prefix.to_string(),
        codec_type: CodecType::Auto as i32,
        route_specifier: Some(route_specifier),
        http_filters,
        // WebSocket upgrades are proxied (Envoy refuses an upgrade it is
        // not configured for), as on Istio's listeners.
        upgrade_configs: vec![UpgradeConfig { upgrade_type: "websocket".into(), ..Default::default() }],
        ..Default::default()
    }
}

pub fn http_listener(name: &str, ip: &str, port: u32, routes: Routes) -> Listener {
    http_listener_with(name, ip, port, routes, &[])
}

/// An HTTP listener whose filter chain starts with `first` (security
/// filters: `jwt::jwt_filter`), then the usual ones.
pub fn http_listener_with(name: &str, ip: &str, port: u32, routes: Routes, first: &[HttpFilter]) -> Listener {
    let mut hcm = http_connection_manager(name, routes);
    prepend_filters(&mut hcm, first);
    listener(name, ip, port, Filter { name: HCM.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))) })
}

/// A TCP proxy to one cluster, or split across weighted clusters.
pub fn tcp_listener(name: &str, ip: &str, port: u32, clusters: Vec<(String, u32)>) -> Listener {
    listener(name, ip, port, tcp_proxy_filter(name, &clusters))
}

/// One filter chain of an HTTPS listener: TLS terminated with `tls`, then
/// HTTP routed by the route table `route`. `server_names` (SNI) choose the
/// chain when a port has several; empty matches any.
pub struct TlsChain {
    pub server_names: Vec<String>,
    pub tls: DownstreamTlsContext,
    pub route: String,
}

/// Put `first` at the head of an HTTP connection manager's filters.
pub fn prepend_filters(hcm: &mut HttpConnectionManager, first: &[HttpFilter]) {
    hcm.http_filters.splice(0..0, first.iter().cloned());
}

/// An HTTPS listener: a filter chain per TLS server, each HTTP connection
/// manager starting with `first`. Nothing on it speaks plaintext: a
/// connection that does not complete a TLS handshake with one of the
/// chains is closed.
pub fn https_listener(name: &str, ip: &str, port: u32, chains: Vec<TlsChain>, first: &[HttpFilter]) -> Listener {
    let listener_filters = tls_inspector_if(chains.iter().any(|c| !c.server_names.is_empty()));
    let filter_chains = chains
        .into_iter()
        .map(|c| {
            let mut hcm = http_connection_manager(&c.route, Routes::Rds(c.route.clone()));
            prepend_filters(&mut hcm, first);
            // As Istio's gateways: the client certificate of a mutual TLS
            // connection goes upstream in x-forwarded-client-cert, and a
            // client's own header is never passed on.
            hcm.forward_client_cert_details = ForwardClientCertDetails::SanitizeSet as i32;
            hcm.set_current_client_cert_details = Some(SetCurrentClientCertDetails {
                subject: Some(envoy_types::pb::google::protobuf::BoolValue { value: true }),
                cert: true,
                dns: true,
                uri: true,
                ..Default::default()
            });
            FilterChain {
                name: c.route,
                filter_chain_match: (!c.server_names.is_empty()).then(|| FilterChainMatch { server_names: c.server_names, ..Default::default() }),
                filters: vec![Filter { name: HCM.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))) }],
                transport_socket: Some(super::util::transport_socket(&c.tls)),
                ..Default::default()
            }
        })
        .collect();
    Listener { name: name.to_string(), address: Some(socket_address(ip, port)), filter_chains, listener_filters, ..Default::default() }
}

/// A TCP proxy to one cluster, or split across weighted clusters.
pub fn tcp_proxy_filter(stat_prefix: &str, clusters: &[(String, u32)]) -> Filter {
    let cluster_specifier = match clusters {
        [(one, _)] => ClusterSpecifier::Cluster(one.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many.iter().map(|(n, w)| ClusterWeight { name: n.clone(), weight: *w, ..Default::default() }).collect(),
        }),
    };
    let tcp = TcpProxy { stat_prefix: stat_prefix.to_string(), cluster_specifier: Some(cluster_specifier), ..Default::default() };
    Filter { name: TCP_PROXY.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&tcp))) }
}

/// The TLS inspector, which reads SNI from the ClientHello: only needed
/// (and only added) when some filter chain matches on server names.
pub fn tls_inspector_if(needed: bool) -> Vec<ListenerFilter> {
    if !needed {
        return Vec::new();
    }
    vec![ListenerFilter {
        name: TLS_INSPECTOR.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(any(&TlsInspector::default()))),
        ..Default::default()
    }]
}

fn listener(name: &str, ip: &str, port: u32, filter: Filter) -> Listener {
    Listener {
        name: name.to_string(),
        address: Some(socket_address(ip, port)),
        filter_chains: vec![FilterChain { filters: vec![filter], ..Default::default() }],
        ..Default::default()
    }
}
