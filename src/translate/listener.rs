//! Listeners: HTTP connection managers (RDS) or TCP proxies on the
//! addresses planned in `scope`, inbound listeners for Sidecar ingress, and
//! gateway listeners.

use super::cluster::socket_address;
use super::route::{http_filter_names, CORS_FILTER, FAULT_FILTER};
use super::util::{ads_config_source, any};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, FilterChain, Listener};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::Cors;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    http_connection_manager::{CodecType, RouteSpecifier},
    http_filter, HttpConnectionManager, HttpFilter, Rds,
};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
    tcp_proxy::{weighted_cluster::ClusterWeight, ClusterSpecifier, WeightedCluster},
    TcpProxy,
};

pub const HCM: &str = "envoy.filters.network.http_connection_manager";
pub const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";

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
        ..Default::default()
    }
}

pub fn http_listener(name: &str, ip: &str, port: u32, routes: Routes) -> Listener {
    let hcm = http_connection_manager(name, routes);
    listener(name, ip, port, Filter { name: HCM.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&hcm))) })
}

/// A TCP proxy to one cluster, or split across weighted clusters.
pub fn tcp_listener(name: &str, ip: &str, port: u32, clusters: Vec<(String, u32)>) -> Listener {
    let cluster_specifier = match clusters.as_slice() {
        [(one, _)] => ClusterSpecifier::Cluster(one.clone()),
        many => ClusterSpecifier::WeightedClusters(WeightedCluster {
            clusters: many.iter().map(|(n, w)| ClusterWeight { name: n.clone(), weight: *w, ..Default::default() }).collect(),
        }),
    };
    let tcp = TcpProxy { stat_prefix: name.to_string(), cluster_specifier: Some(cluster_specifier), ..Default::default() };
    listener(name, ip, port, Filter { name: TCP_PROXY.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&tcp))) })
}

fn listener(name: &str, ip: &str, port: u32, filter: Filter) -> Listener {
    Listener {
        name: name.to_string(),
        address: Some(socket_address(ip, port)),
        filter_chains: vec![FilterChain { filters: vec![filter], ..Default::default() }],
        ..Default::default()
    }
}
