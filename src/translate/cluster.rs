//! Services and DestinationRules → Envoy clusters (CDS) and their
//! endpoints (EDS), named as Pilot names them: `outbound|PORT|SUBSET|HOST`.

use super::mtls::{self, UpstreamMtls};
use super::util::{ads_config_source, any, duration, istio_duration};
use crate::mesh::{Health, Instance, Resolution, Service, ServicePort};
use crate::model::istio::destination_rule::{ClientTlsMode, ConnectionPoolSettings, LoadBalancerSettings, OutlierDetection, SimpleLb, TrafficPolicy};
use crate::model::istio::DestinationRule;
use envoy_types::pb::envoy::config::cluster::v3::{
    circuit_breakers::Thresholds,
    cluster::{ClusterDiscoveryType, CommonLbConfig, DiscoveryType, EdsClusterConfig, LbConfig, LbPolicy, MaglevLbConfig, RingHashLbConfig},
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlier,
};
use envoy_types::pb::envoy::config::core::v3::{
    address, socket_address::PortSpecifier, Address, HealthStatus, Http2ProtocolOptions, HttpProtocolOptions as CoreHttpOptions, Locality, SocketAddress,
};
use envoy_types::pb::envoy::config::endpoint::v3::{lb_endpoint::HostIdentifier, ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    http_protocol_options::{explicit_http_config::ProtocolConfig, ExplicitHttpConfig, UpstreamProtocolOptions},
    HttpProtocolOptions,
};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::UInt32Value;
use std::collections::BTreeMap;

pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

pub fn outbound_cluster_name(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

pub fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_string(),
            port_specifier: Some(PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// The effective policy for a port and subset: Istio merges the subset's
/// policy over the rule's, and port-level settings over either.
pub fn effective_policy(dr: Option<&DestinationRule>, port: u32, subset: Option<&str>) -> TrafficPolicy {
    let mut policy = dr.and_then(|d| d.traffic_policy.clone()).unwrap_or_default();
    if let Some(sp) = subset.and_then(|s| dr?.subsets.iter().find(|x| x.name == s)).and_then(|s| s.traffic_policy.clone()) {
        overlay(&mut policy, sp.load_balancer, sp.connection_pool, sp.outlier_detection, sp.tls);
        if !sp.port_level_settings.is_empty() {
            policy.port_level_settings = sp.port_level_settings;
        }
    }
    if let Some(pl) = policy.port_level_settings.iter().find(|p| p.port.as_ref().is_some_and(|s| s.number == port)).cloned() {
        overlay(&mut policy, pl.load_balancer, pl.connection_pool, pl.outlier_detection, pl.tls);
    }
    policy
}

/// Each setting present in the more specific policy replaces the general one.
fn overlay(
    policy: &mut TrafficPolicy,
    lb: Option<LoadBalancerSettings>,
    pool: Option<ConnectionPoolSettings>,
    outliers: Option<OutlierDetection>,
    tls: Option<crate::model::istio::destination_rule::ClientTlsSettings>,
) {
    if lb.is_some() {
        policy.load_balancer = lb;
    }
    if pool.is_some() {
        policy.connection_pool = pool;
    }
    if outliers.is_some() {
        policy.outlier_detection = outliers;
    }
    if tls.is_some() {
        policy.tls = tls;
    }
}

/// Auto-mTLS applies to a cluster when its DestinationRule sets no TLS
/// mode, the client has a workload certificate and the service is in the
/// mesh: then `Some(up)`, which `load_assignment` uses to mark the
/// endpoints that speak mutual TLS.
pub fn auto_mtls<'a, 'm>(
    svc: &Service,
    port: u32,
    subset: Option<&str>,
    dr: Option<&DestinationRule>,
    up: &'a UpstreamMtls<'m>,
) -> Option<&'a UpstreamMtls<'m>> {
    let unset = effective_policy(dr, port, subset).tls.as_ref().and_then(|t| t.mode).is_none();
    (unset && up.client_sds && !svc.mesh_external).then_some(up)
}

/// The cluster for one service port (and subset). Passthrough services
/// (`resolution: NONE`) get an ORIGINAL_DST cluster on a captured proxy
/// (Istio's: connections go where the client dialled), none elsewhere: on
/// bare metal without capture nothing redirects their traffic.
///
/// TLS: a DestinationRule's SIMPLE / MUTUAL with files (`tls::upstream`),
/// a BackendTLSPolicy's with its CA bundle inline (`backend_tls`),
/// or on a gateway proxy with a Secret (`credentialName`,
/// `tls::upstream_credential`; a sidecar's cluster is closed);
/// its ISTIO_MUTUAL with the workload certificate (`mtls::upstream`),
/// expecting the destination's SPIFFE ids (or the rule's
/// `subjectAltNames`), SNI `outbound_.PORT_.SUBSET_.HOST` (or the rule's
/// `sni`); no mode at all: auto-mTLS (mutual TLS to the endpoints marked
/// in EDS, plaintext to the rest). A client without a workload
/// certificate cannot do ISTIO_MUTUAL: its cluster has no endpoints
/// (closed, never plaintext), and it gets no auto-mTLS.
/// A cluster that must not send: no endpoints at all.
fn close(c: &mut Cluster) {
    c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32));
    c.eds_cluster_config = None;
    c.load_assignment = Some(ClusterLoadAssignment { cluster_name: c.name.clone(), ..Default::default() });
}

pub fn cluster(svc: &Service, port: &ServicePort, subset: Option<&str>, dr: Option<&DestinationRule>, up: &UpstreamMtls<'_>) -> Option<Cluster> {
    let name = outbound_cluster_name(port.number, subset.unwrap_or(""), &svc.hostname);
    let policy = effective_policy(dr, port.number, subset);
    let mut c = Cluster {
        name: name.clone(),
        connect_timeout: Some(
            policy
                .connection_pool
                .as_ref()
                .and_then(|p| p.tcp.as_ref())
                .and_then(|t| t.connect_timeout.as_ref())
                .map_or_else(|| duration(std::time::Duration::from_secs(10)), istio_duration),
        ),
        ..Default::default()
    };
    match svc.resolution {
        Resolution::Static => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32));
            c.eds_cluster_config = Some(EdsClusterConfig { eds_config: Some(ads_config_source()), service_name: name.clone() });
        }
        Resolution::Dns => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32));
            c.load_assignment = Some(dns_load_assignment(&name, svc, port, subset, dr, auto_mtls(svc, port.number, subset, dr, up)));
        }
        Resolution::Passthrough if up.capture => {
            c.cluster_discovery_type = Some(ClusterDiscoveryType::Type(DiscoveryType::OriginalDst as i32));
            c.lb_policy = envoy_types::pb::envoy::config::cluster::v3::cluster::LbPolicy::ClusterProvided as i32;
        }
        Resolution::Passthrough => return None,
    }
    // An ORIGINAL_DST cluster's balancing is its own (CLUSTER_PROVIDED).
    if svc.resolution != Resolution::Passthrough {
        apply_lb(&mut c, policy.load_balancer.as_ref());
    }
    apply_connection_pool(&mut c, policy.connection_pool.as_ref(), port);
    if let Some(od) = &policy.outlier_detection {
        apply_outlier(&mut c, od);
    }
    let backend_ca = policy.tls.as_ref().and_then(|t| t.credential_name.as_deref()).filter(|n| n.starts_with(super::backend_tls::CA_PREFIX));
    match policy.tls.as_ref().filter(|t| t.credential_name.is_some()) {
        // A BackendTLSPolicy's CA bundle, inline, for every proxy; closed
        // if no CA resolved.
        Some(tls) if backend_ca.is_some() => match backend_ca.and_then(|n| up.mesh.backend_cas.bundles.get(n)) {
            Some(pem) => c.transport_socket = Some(super::util::transport_socket(&super::tls::upstream_inline_ca(tls, pem))),
            None => close(&mut c),
        },
        // A Secret's certificate and CA over SDS: a gateway proxy's own
        // namespace's Secrets. A sidecar is served none (Istio sends it
        // no TLS at all for such a rule): closed, never plaintext.
        Some(tls) => match super::tls::upstream_credential(tls) {
            Some(ctx) if up.gateway => c.transport_socket = Some(super::util::transport_socket(&ctx)),
            Some(_) => close(&mut c),
            None => {}
        },
        None => {
            if let Some(ctx) = policy.tls.as_ref().and_then(super::tls::upstream) {
                c.transport_socket = Some(super::util::transport_socket(&ctx));
            }
        }
    }
    let trust_domain = &up.mesh.config.trust_domain;
    let sni = || mtls::mesh_sni(port.number, subset.unwrap_or(""), &svc.hostname);
    match policy.tls.as_ref().filter(|t| t.mode == Some(ClientTlsMode::IstioMutual)) {
        Some(tls) if up.client_sds => {
            let sans = if tls.subject_alt_names.is_empty() { mtls::service_identities(svc, trust_domain) } else { tls.subject_alt_names.clone() };
            let sni = tls.sni.clone().filter(|s| !s.is_empty()).unwrap_or_else(sni);
            c.transport_socket = Some(super::util::transport_socket(&mtls::upstream(&sni, &sans)));
        }
        Some(_) => close(&mut c),
        None => {
            if auto_mtls(svc, port.number, subset, dr, up).is_some() {
                let sans = mtls::service_identities(svc, trust_domain);
                if !sans.is_empty() {
                    c.transport_socket_matches = vec![mtls::mesh_socket_match(&sni(), &sans)];
                }
            }
        }
    }
    Some(c)
}

fn apply_lb(c: &mut Cluster, lb: Option<&LoadBalancerSettings>) {
    // Istio's default is LEAST_REQUEST.
    c.lb_policy = LbPolicy::LeastRequest as i32;
    let Some(lb) = lb else { return };
    if let Some(ch) = &lb.consistent_hash {
        if let Some(m) = &ch.maglev {
            c.lb_policy = LbPolicy::Maglev as i32;
            c.lb_config = Some(LbConfig::MaglevLbConfig(MaglevLbConfig {
                table_size: m.table_size.map(|v| envoy_types::pb::google::protobuf::UInt64Value { value: v }),
            }));
        } else {
            c.lb_policy = LbPolicy::RingHash as i32;
            let min = ch.ring_hash.as_ref().and_then(|r| r.minimum_ring_size).or(ch.minimum_ring_size);
            c.lb_config = Some(LbConfig::RingHashLbConfig(RingHashLbConfig {
                minimum_ring_size: min.map(|v| envoy_types::pb::google::protobuf::UInt64Value { value: v }),
                ..Default::default()
            }));
        }
        return;
    }
    c.lb_policy = match lb.simple {
        Some(SimpleLb::RoundRobin) => LbPolicy::RoundRobin,
        Some(SimpleLb::Random) => LbPolicy::Random,
        _ => LbPolicy::LeastRequest,
    } as i32;
}

fn apply_connection_pool(c: &mut Cluster, pool: Option<&ConnectionPoolSettings>, port: &ServicePort) {
    // Istio lifts Envoy's default limits (1024) so only configured ones bite.
    const UNLIMITED: u32 = u32::MAX;
    let tcp = pool.and_then(|p| p.tcp.as_ref());
    let http = pool.and_then(|p| p.http.as_ref());
    let limit = |v: Option<i32>| Some(UInt32Value { value: v.filter(|v| *v > 0).map_or(UNLIMITED, |v| v as u32) });
    c.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![Thresholds {
            max_connections: limit(tcp.and_then(|t| t.max_connections)),
            max_pending_requests: limit(http.and_then(|h| h.http1_max_pending_requests)),
            max_requests: limit(http.and_then(|h| h.http2_max_requests)),
            max_retries: limit(http.and_then(|h| h.max_retries)),
            track_remaining: true,
            ..Default::default()
        }],
        ..Default::default()
    });
    let mut options = HttpProtocolOptions::default();
    let mut set = false;
    let mut common = CoreHttpOptions::default();
    if let Some(n) = http.and_then(|h| h.max_requests_per_connection).filter(|n| *n > 0) {
        common.max_requests_per_connection = Some(UInt32Value { value: n as u32 });
        set = true;
    }
    if let Some(d) = http.and_then(|h| h.idle_timeout.as_ref()) {
        common.idle_timeout = Some(istio_duration(d));
        set = true;
    }
    if set {
        options.common_http_protocol_options = Some(common);
    }
    if matches!(port.protocol, crate::model::istio::common::Protocol::Http2 | crate::model::istio::common::Protocol::Grpc) {
        options.upstream_protocol_options = Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
            protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(Http2ProtocolOptions::default())),
        }));
        set = true;
    }
    if set {
        c.typed_extension_protocol_options = [(HTTP_PROTOCOL_OPTIONS.to_string(), any(&options))].into_iter().collect();
    }
}

fn apply_outlier(c: &mut Cluster, od: &OutlierDetection) {
    let consecutive_5xx = od.consecutive_5xx_errors.or(od.consecutive_errors.filter(|v| *v > 0).map(|v| v as u32));
    let mut o = EnvoyOutlier {
        interval: od.interval.as_ref().map(istio_duration),
        base_ejection_time: od.base_ejection_time.as_ref().map(istio_duration),
        max_ejection_percent: od.max_ejection_percent.map(|v| UInt32Value { value: v.max(0) as u32 }),
        // Istio turns success-rate ejection off; only consecutive errors count.
        enforcing_success_rate: Some(UInt32Value { value: 0 }),
        ..Default::default()
    };
    match consecutive_5xx {
        Some(n) if n > 0 => {
            o.consecutive_5xx = Some(UInt32Value { value: n });
            o.enforcing_consecutive_5xx = Some(UInt32Value { value: 100 });
        }
        _ => o.enforcing_consecutive_5xx = Some(UInt32Value { value: 0 }),
    }
    if let Some(n) = od.consecutive_gateway_errors.filter(|n| *n > 0) {
        o.consecutive_gateway_failure = Some(UInt32Value { value: n });
        o.enforcing_consecutive_gateway_failure = Some(UInt32Value { value: 100 });
    }
    c.outlier_detection = Some(o);
    if let Some(p) = od.min_health_percent {
        c.common_lb_config = Some(CommonLbConfig { healthy_panic_threshold: Some(Percent { value: p.max(0) as f64 }), ..Default::default() });
    }
}

/// Instances of a subset (all, without one).
pub fn subset_instances<'a>(svc: &'a Service, subset: Option<&str>, dr: Option<&DestinationRule>) -> Vec<&'a Instance> {
    let labels = subset.and_then(|s| dr?.subsets.iter().find(|x| x.name == s)).map(|s| &s.labels);
    match (subset, labels) {
        (None, _) => svc.instances.iter().collect(),
        // A subset the rule does not define has no endpoints.
        (Some(_), None) => Vec::new(),
        (Some(_), Some(labels)) => svc.instances.iter().filter(|i| labels.iter().all(|(k, v)| i.labels.get(k) == Some(v))).collect(),
    }
}

fn locality(s: &str) -> Locality {
    let mut parts = s.splitn(3, '/');
    Locality { region: parts.next().unwrap_or("").into(), zone: parts.next().unwrap_or("").into(), sub_zone: parts.next().unwrap_or("").into() }
}

fn health(h: Health) -> i32 {
    match h {
        Health::Healthy => HealthStatus::Healthy as i32,
        Health::Unhealthy => HealthStatus::Unhealthy as i32,
        Health::Unknown => HealthStatus::Unknown as i32,
    }
}

/// EDS for one cluster: instances grouped by locality, each locality with
/// the sum of its weights (gRPC clients require a locality weight). With
/// auto-mTLS (`auto`, from [`auto_mtls`]) the endpoints that speak mutual
/// TLS carry the metadata the cluster's transport socket match reads.
pub fn load_assignment(
    name: &str,
    svc: &Service,
    port: &ServicePort,
    subset: Option<&str>,
    dr: Option<&DestinationRule>,
    auto: Option<&UpstreamMtls<'_>>,
) -> ClusterLoadAssignment {
    let mut by_locality: BTreeMap<&str, Vec<&Instance>> = BTreeMap::new();
    // Unhealthy instances are left out (Istio's default), not sent marked:
    // Envoy's panic threshold would route to them when most are unhealthy.
    for i in subset_instances(svc, subset, dr).into_iter().filter(|i| i.health != Health::Unhealthy) {
        by_locality.entry(i.locality.as_str()).or_default().push(i);
    }
    let endpoints = by_locality
        .into_iter()
        .map(|(loc, insts)| LocalityLbEndpoints {
            locality: Some(locality(loc)),
            load_balancing_weight: Some(UInt32Value { value: insts.iter().map(|i| i.weight).sum::<u32>().max(1) }),
            lb_endpoints: insts
                .iter()
                .map(|i| LbEndpoint {
                    host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                        address: Some(socket_address(&i.address, i.port_for(port))),
                        ..Default::default()
                    })),
                    health_status: health(i.health),
                    load_balancing_weight: Some(UInt32Value { value: i.weight.max(1) }),
                    metadata: auto.filter(|a| a.endpoint_is_mesh(i, i.port_for(port))).map(|_| mtls::mesh_endpoint_metadata()),
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    ClusterLoadAssignment { cluster_name: name.to_string(), endpoints, ..Default::default() }
}

/// DNS clusters carry their (hostname) endpoints inline; with no endpoints
/// the service host itself is resolved.
fn dns_load_assignment(
    name: &str,
    svc: &Service,
    port: &ServicePort,
    subset: Option<&str>,
    dr: Option<&DestinationRule>,
    auto: Option<&UpstreamMtls<'_>>,
) -> ClusterLoadAssignment {
    if svc.instances.is_empty() {
        let host = Instance {
            address: svc.hostname.clone(),
            ports: BTreeMap::new(),
            default_port: None,
            labels: BTreeMap::new(),
            locality: String::new(),
            weight: 1,
            health: Health::Healthy,
            source: None,
            namespace: svc.namespace.clone(),
            service_account: None,
        };
        let one = Service { instances: vec![host], ..svc.clone() };
        return load_assignment(name, &one, port, None, None, None);
    }
    load_assignment(name, svc, port, subset, dr, auto)
}
