//! Proxyless gRPC clients (`ProxyKind::Grpc`): what a gRPC application that
//! dials `xds:///HOST:PORT` needs, with no Envoy in between. gRPC's xDS
//! client (gRFCs A27, A28) subscribes by name: the listener `HOST:PORT`
//! (an API listener: an HttpConnectionManager with RDS and the router),
//! the route table it names, the clusters the routes name, their load
//! assignments. So every visible service port gets an API listener under
//! each name an application may dial (`reviews.bookinfo.svc.cluster.local:9080`,
//! `reviews.bookinfo.svc:9080`, `reviews.bookinfo:9080`, and `reviews:9080`
//! from its own namespace), all naming one route table (`HOST:PORT`) whose
//! one virtual host answers to those names. Sidecar egress scoping applies
//! as it does to a sidecar (only the hosts and ports it admits).
//!
//! Routes are the sidecar's (same VirtualService conversion), adjusted to
//! what gRPC implements, since gRPC NACKs what it does not know rather
//! than ignoring it:
//! - timeouts: gRPC ignores `RouteAction.timeout` and reads
//!   `max_stream_duration` (A31), so the route's timeout is copied there;
//! - fault injection: the HTTP fault filter and per-route overrides (A33)
//!   are kept; CORS (a browser concern, unknown to gRPC) is dropped;
//! - retries (A44): gRPC honours `retry_on` conditions that are gRPC status
//!   names (`unavailable`, `cancelled`, `deadline-exceeded`, `internal`,
//!   `resource-exhausted`) and `num_retries`, and ignores the rest;
//! - header, path and prefix matches, weighted clusters, hash policies on
//!   headers (ring hash, A42) work as in Envoy.
//!
//! Clusters are the sidecar's EDS clusters with the LB policy gRPC has:
//! ROUND_ROBIN (Istio's default LEAST_REQUEST, RANDOM: gRPC's
//! round robin), RING_HASH for consistent hashing (MAGLEV too). Outlier
//! detection (A50) is sent as for Envoy; gRPC implements only success-rate
//! and failure-percentage ejection, which Istio leaves off, so Istio's
//! consecutive-error ejection is not enforced by gRPC clients (documented).
//! Left out, so a call fails rather than doing something else:
//! DNS-resolved clusters (gRPC has no STRICT_DNS) and clusters whose
//! DestinationRule originates TLS (never plaintext where TLS was asked;
//! gRPC's xDS TLS needs certificate providers this server does not
//! configure).

use super::cluster::{self, HTTP_PROTOCOL_OPTIONS};
use super::listener::{http_connection_manager, Routes};
use super::route::{self, RouteCtx, CORS_FILTER};
use super::scope;
use super::util::any;
use crate::mesh::{Mesh, Service};
use crate::model::proxy::ProxyIdentity;
use crate::resources::{ProxyConfig, ResourceType, XdsResource};
use envoy_types::pb::envoy::config::cluster::v3::{
    cluster::{ClusterDiscoveryType, DiscoveryType, LbConfig, LbPolicy, RingHashLbConfig},
    Cluster,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{route::Action, route_action::MaxStreamDuration, RouteConfiguration, VirtualHost};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The name of a proxyless client's listener and route table for a service
/// port: what it dials, `HOST:PORT`.
pub fn listener_name(host: &str, port: u32) -> String {
    format!("{host}:{port}")
}

/// Everything a proxyless gRPC client may ask for.
pub fn translate(cfg: &mut ProxyConfig, mesh: &Mesh, proxy: &ProxyIdentity) {
    let sc = scope::sidecar_for(mesh, proxy).map(|s| s.as_ref());
    let services = scope::ProxyScope::new(mesh, proxy, sc);
    let plans = scope::egress_plans(&services, proxy, sc);
    let suffix = &mesh.config.domain_suffix;
    let mut reachable: BTreeMap<String, Arc<Service>> = BTreeMap::new();
    for plan in &plans {
        let ctx = RouteCtx { mesh, proxy, scope: &services, port: plan.port, gateway: None };
        let members: Vec<&Service> = plan.services.values().map(|s| s.as_ref()).collect();
        let unique = route::unique_domains(&members, plan.port, &proxy.namespace, suffix);
        for (svc, domains) in plan.services.values().zip(unique).filter(|(_, d)| !d.is_empty()) {
            reachable.insert(svc.hostname.clone(), svc.clone());
            let name = listener_name(&svc.hostname, plan.port);
            let vhost = grpc_virtual_host(route::virtual_host(&ctx, svc, domains.clone()));
            let table = RouteConfiguration { name: name.clone(), virtual_hosts: vec![vhost], ..Default::default() };
            cfg.insert(ResourceType::Route, super::route_resource(&table));
            // One API listener per name the service may be dialled by.
            let hcm = grpc_connection_manager(&name);
            for alias in domains.iter().filter(|d| d.ends_with(&format!(":{}", plan.port))) {
                let l = Listener { name: alias.clone(), api_listener: Some(ApiListener { api_listener: Some(any(&hcm)) }), ..Default::default() };
                cfg.insert(ResourceType::Listener, XdsResource::new(alias.clone(), &l));
            }
        }
    }
    // The sidecar's clusters and load assignments, adjusted for gRPC or
    // left out (interned afterwards like any proxy's).
    // Proxyless clients read no SDS secrets: no mutual TLS (auto-mTLS off,
    // and an ISTIO_MUTUAL cluster comes out closed and is left out below).
    let up = super::mtls::UpstreamMtls { mesh, client_sds: false, gateway: false, capture: false };
    for svc in reachable.values() {
        let dr = super::destination_rule_for(mesh, &proxy.namespace, svc).map(|d| &d.spec);
        let subsets = std::iter::once(None).chain(dr.into_iter().flat_map(|d| d.subsets.iter().map(|s| Some(s.name.as_str()))));
        for subset in subsets {
            for port in &svc.ports {
                let Some(c) = cluster::cluster(svc, port, subset, dr, &up).and_then(grpc_cluster) else { continue };
                // Each locality carries its load_balancing_weight, which
                // gRPC requires.
                cfg.insert(ResourceType::Endpoint, XdsResource::new(c.name.clone(), &cluster::load_assignment(&c.name, svc, port, subset, dr, None)));
                cfg.insert(ResourceType::Cluster, XdsResource::new(c.name.clone(), &c));
            }
        }
    }
}

/// HCM for an API listener: RDS over ADS, the fault filter (A33), the
/// router; nothing gRPC does not implement.
fn grpc_connection_manager(route_name: &str) -> envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager {
    let mut hcm = http_connection_manager(route_name, Routes::Rds(route_name.to_string()));
    hcm.http_filters.retain(|f| f.name != CORS_FILTER);
    hcm.upgrade_configs.clear();
    hcm
}

/// A sidecar's virtual host as gRPC reads it (see the module doc).
fn grpc_virtual_host(mut vh: VirtualHost) -> VirtualHost {
    vh.typed_per_filter_config.remove(CORS_FILTER);
    for r in &mut vh.routes {
        r.typed_per_filter_config.remove(CORS_FILTER);
        if let Some(Action::Route(a)) = &mut r.action {
            if let Some(t) = a.timeout.take().filter(|t| t.seconds > 0 || t.nanos > 0) {
                a.max_stream_duration = Some(MaxStreamDuration { max_stream_duration: Some(t), ..Default::default() });
            }
        }
    }
    vh
}

/// A sidecar cluster as gRPC takes it, or `None` when gRPC cannot use it
/// as asked (see the module doc).
fn grpc_cluster(mut c: Cluster) -> Option<Cluster> {
    if c.cluster_discovery_type != Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)) || c.transport_socket.is_some() {
        return None;
    }
    let lb = LbPolicy::try_from(c.lb_policy).unwrap_or(LbPolicy::RoundRobin);
    match lb {
        LbPolicy::RingHash => {}
        LbPolicy::Maglev => {
            c.lb_policy = LbPolicy::RingHash as i32;
            c.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig::default()));
        }
        _ => {
            c.lb_policy = LbPolicy::RoundRobin as i32;
            c.lb_config = None;
        }
    }
    // gRPC speaks HTTP/2 whatever the port's protocol says.
    c.typed_extension_protocol_options.remove(HTTP_PROTOCOL_OPTIONS);
    Some(c)
}
