//! Inbound: a Sidecar's `ingress` listeners, each forwarding to the
//! workload's own endpoint (`defaultEndpoint`) through a static
//! `inbound|PORT||` cluster. HTTP ports get an HTTP connection manager with
//! an inline route table, other ports a TCP proxy; both behind the RBAC
//! filters of the AuthorizationPolicies that select the workload (`authz`).

use super::authz::AuthzFilters;
use super::listener::{self, Routes};
use super::{cluster, util};
use crate::mesh::{Config, Mesh};
use crate::model::istio::Sidecar;
use crate::model::proxy::ProxyIdentity;
use crate::xds::resources::{ProxyConfig, ResourceType, XdsResource};
use envoy_types::pb::envoy::config::cluster::v3::{cluster::ClusterDiscoveryType, cluster::DiscoveryType, Cluster};
use envoy_types::pb::envoy::config::route::v3::{
    route::Action, route_action::ClusterSpecifier, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost,
};

/// The inbound listeners and clusters of the Sidecar `sc` selecting `proxy`.
pub fn sidecar_ingress(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity, sc: &Config<Sidecar>) {
    // The AuthorizationPolicies selecting this workload guard every port.
    let authz = AuthzFilters::for_proxy(mesh, proxy);
    // RequestAuthentication: the same filters on every inbound HTTP port.
    let first: Vec<_> = super::jwt::jwt_filter(mesh, proxy).into_iter().collect();
    for ing in &sc.spec.ingress {
        let port = ing.port.number();
        let bind = ing.bind.clone().filter(|b| !b.is_empty() && b != "0.0.0.0").unwrap_or_else(|| proxy.ip.clone());
        let endpoint = ing.default_endpoint();
        let Some((ep_ip, ep_port)) = endpoint.rsplit_once(':').and_then(|(ip, p)| Some((ip, p.parse::<u32>().ok()?))) else { continue };
        if ep_ip == bind && ep_port == port {
            // The proxy would forward to itself.
            continue;
        }
        let cluster_name = format!("inbound|{port}||");
        let c = inbound_cluster(&cluster_name, ep_ip, ep_port);
        cfg.insert(ResourceType::Cluster, XdsResource::new(cluster_name.clone(), &c));
        let name = format!("{bind}_{port}");
        let is_http = crate::model::istio::common::Protocol::parse(&ing.port.protocol).is_some_and(|p| p.is_http());
        let mut l = if is_http {
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
                            cluster_specifier: Some(ClusterSpecifier::Cluster(cluster_name.clone())),
                            timeout: Some(util::millis(0)),
                            ..Default::default()
                        })),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            };
            listener::http_listener_with(&name, &bind, port, Routes::Inline(Box::new(rc)), &first)
        } else {
            listener::tcp_listener(&name, &bind, port, vec![(cluster_name, 1)])
        };
        authz.apply(&mut l);
        cfg.insert(ResourceType::Listener, XdsResource::new(l.name.clone(), &l));
    }
}

fn inbound_cluster(name: &str, ip: &str, port: u32) -> Cluster {
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
