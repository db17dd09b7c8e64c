//! `DestinationRule`: what happens to traffic once routing has picked a
//! service: load balancing, connection pools, outlier detection, TLS, subsets.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::common::{check_subset_name, Float, Labels, MatchLabelsSelector, PortSelector};
use super::duration::Duration;
use super::host;
use super::validate::{
    check_duration, check_duration_syntax, check_export_to, check_labels, check_non_negative, check_percent_int, check_port, check_selector_labels, Path,
    Report,
};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DestinationRule {
    /// The service the rule applies to; short names are relative to the
    /// config's namespace, wildcards are allowed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsets: Vec<Subset>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<MatchLabelsSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TrafficPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
    /// Overrides for individual ports; these take precedence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub port_level_settings: Vec<PortTrafficPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<TunnelSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_budget: Option<RetryBudget>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortTrafficPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer: Option<LoadBalancerSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outlier_detection: Option<OutlierDetection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ClientTlsSettings>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TunnelSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_host: String,
    #[serde(default, skip_serializing_if = "super::common::is_zero")]
    pub target_port: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyProtocol {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<ProxyProtocolVersion>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProxyProtocolVersion {
    V1,
    V2,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RetryBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<Float>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_retry_concurrency: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_interval: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Subset {
    /// A DNS label, referenced by `destination.subset` in routes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Selects the endpoints of the service that form the subset.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    /// Overrides the rule's policy for this subset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_policy: Option<TrafficPolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LoadBalancerSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub simple: Option<SimpleLb>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistent_hash: Option<ConsistentHashLb>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality_lb_setting: Option<LocalityLbSetting>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_aware_lb_setting: Option<ZoneAwareLbSetting>,
    /// Slow-start window for new endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_duration_secs: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup: Option<WarmupConfiguration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SimpleLb {
    Unspecified,
    /// Deprecated alias of `LEAST_REQUEST`.
    LeastConn,
    Random,
    /// Forward to the address the caller asked for, without balancing.
    Passthrough,
    RoundRobin,
    LeastRequest,
}

/// Session affinity: exactly one hash key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConsistentHashLb {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_header_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_cookie: Option<HttpCookie>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_source_ip: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_query_parameter_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ring_hash: Option<RingHash>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maglev: Option<Maglev>,
    /// Deprecated in favour of `ringHash.minimumRingSize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RingHash {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_ring_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Maglev {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpCookie {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Lifetime of a cookie the proxy generates when the request has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<CookieAttribute>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CookieAttribute {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// Locality-weighted load balancing (`region/zone/subzone`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalityLbSetting {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distribute: Vec<LocalityDistribute>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover: Vec<LocalityFailover>,
    /// Labels whose equality with the client's ranks endpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover_priority: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalityDistribute {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub to: BTreeMap<String, u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LocalityFailover {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub from: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub to: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ZoneAwareLbSetting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover: Vec<LocalityFailover>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failover_priority: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cluster_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WarmupConfiguration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum_percent: Option<Float>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggression: Option<Float>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConnectionPoolSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSettings>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_keepalive: Option<TcpKeepalive>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connection_duration: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpKeepalive {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http1_max_pending_requests: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_max_requests: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_connection: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_retries: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub h2_upgrade_policy: Option<H2UpgradePolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_client_protocol: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_streams: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_keep_alive: Option<Http2KeepAlive>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum H2UpgradePolicy {
    Default,
    DoNotUpgrade,
    Upgrade,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Http2KeepAlive {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutlierDetection {
    /// Deprecated: use `consecutive5xxErrors` / `consecutiveGatewayErrors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_errors: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split_external_local_origin_errors: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_local_origin_failures: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_gateway_errors: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consecutive_5xx_errors: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_ejection_time: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ejection_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_health_percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outlier_detection_http_error_codes: Vec<u32>,
}

/// TLS from the proxy to the upstream service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientTlsSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ClientTlsMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_crl: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ClientTlsMode {
    Disable,
    Simple,
    Mutual,
    IstioMutual,
}

// ---------------------------------------------------------------------------
// Validation (after istio/istio ValidateDestinationRule and its helpers).
// ---------------------------------------------------------------------------

/// Maglev needs a prime table size below this (Envoy's limit).
const MAGLEV_MAX_TABLE_SIZE: u64 = 5_000_011;

impl DestinationRule {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let host_at = at.field("host");
        if self.host.is_empty() {
            r.error(&host_at, "host is required");
        } else {
            r.check(&host_at, host::check_wildcard_domain(&self.host));
        }
        if let Some(policy) = &self.traffic_policy {
            policy.check(&at.field("trafficPolicy"), r);
        }
        let subsets_at = at.field("subsets");
        let mut names = BTreeSet::new();
        for (i, subset) in self.subsets.iter().enumerate() {
            let subset_at = subsets_at.index(i);
            let name_at = subset_at.field("name");
            check_subset_name(&name_at, &subset.name, r);
            if !subset.name.is_empty() && !names.insert(subset.name.as_str()) {
                r.error(&name_at, format!("duplicate subset name {:?}", subset.name));
            }
            check_labels(r, &subset_at.field("labels"), &subset.labels);
            if let Some(policy) = &subset.traffic_policy {
                policy.check(&subset_at.field("trafficPolicy"), r);
            }
        }
        let export_to_at = at.field("exportTo");
        check_export_to(r, &export_to_at, &self.export_to, false);
        if let Some(selector) = &self.workload_selector {
            check_selector_labels(r, &at.field("workloadSelector").field("matchLabels"), &selector.match_labels);
            // A rule applying to the workloads of one namespace cannot be
            // meaningfully exported elsewhere. Only `.` and the rule's own
            // namespace name are fine; without the namespace at hand we can
            // only reject what is certainly wrong.
            if self.export_to.len() > 1 || self.export_to.iter().any(|e| e == "*") {
                r.error(&export_to_at, "destination rule with workload selector cannot have exportTo beyond the current namespace");
            }
        }
    }
}

impl TrafficPolicy {
    fn check(&self, at: &Path, r: &mut Report) {
        let is_empty = self.load_balancer.is_none()
            && self.connection_pool.is_none()
            && self.outlier_detection.is_none()
            && self.tls.is_none()
            && self.port_level_settings.is_empty()
            && self.tunnel.is_none()
            && self.proxy_protocol.is_none()
            && self.retry_budget.is_none();
        if is_empty {
            r.error(at, "traffic policy must have at least one field");
            return;
        }
        if self.tunnel.is_some() && self.proxy_protocol.is_some() {
            r.error(at, "tunnel and proxyProtocol must not be set together");
        }
        check_policy_parts(r, at, self.load_balancer.as_ref(), self.connection_pool.as_ref(), self.outlier_detection.as_ref(), self.tls.as_ref());
        let ports_at = at.field("portLevelSettings");
        for (i, port_policy) in self.port_level_settings.iter().enumerate() {
            port_policy.check(&ports_at.index(i), r);
        }
        if let Some(tunnel) = &self.tunnel {
            let tunnel_at = at.field("tunnel");
            r.ignored(&tunnel_at);
            tunnel.check(&tunnel_at, r);
        }
        r.ignored_if(self.proxy_protocol.is_some(), &at.field("proxyProtocol"));
        if let Some(budget) = &self.retry_budget {
            let budget_at = at.field("retryBudget");
            r.ignored(&budget_at);
            if let Some(percent) = budget.percent.map(Float::get) {
                if !(0.0..=100.0).contains(&percent) {
                    r.error(&budget_at.field("percent"), format!("percent {percent} must be in the range 0..=100"));
                }
            }
            if let Some(interval) = &budget.budget_interval {
                check_duration(r, &budget_at.field("budgetInterval"), interval);
            }
        }
    }
}

fn check_policy_parts(
    r: &mut Report,
    at: &Path,
    load_balancer: Option<&LoadBalancerSettings>,
    connection_pool: Option<&ConnectionPoolSettings>,
    outlier_detection: Option<&OutlierDetection>,
    tls: Option<&ClientTlsSettings>,
) {
    if let Some(lb) = load_balancer {
        lb.check(&at.field("loadBalancer"), r, outlier_detection.is_some());
    }
    if let Some(pool) = connection_pool {
        pool.check(&at.field("connectionPool"), r);
    }
    if let Some(outlier) = outlier_detection {
        outlier.check(&at.field("outlierDetection"), r);
    }
    if let Some(tls) = tls {
        tls.check(&at.field("tls"), r);
    }
}

impl PortTrafficPolicy {
    fn check(&self, at: &Path, r: &mut Report) {
        match &self.port {
            Some(port) => check_port(r, &at.field("port").field("number"), port.number),
            None => r.error(&at.field("port"), "port-level traffic policy must have a port"),
        }
        if self.load_balancer.is_none() && self.connection_pool.is_none() && self.outlier_detection.is_none() && self.tls.is_none() {
            r.error(at, "port traffic policy must have at least one field");
        }
        check_policy_parts(r, at, self.load_balancer.as_ref(), self.connection_pool.as_ref(), self.outlier_detection.as_ref(), self.tls.as_ref());
    }
}

impl TunnelSettings {
    fn check(&self, at: &Path, r: &mut Report) {
        if let Some(protocol) = &self.protocol {
            if protocol != "CONNECT" && protocol != "POST" {
                r.error(&at.field("protocol"), "tunnel protocol must be \"CONNECT\" or \"POST\"");
            }
        }
        if host::check_fqdn(&self.target_host).is_err() && !host::is_ip_address(&self.target_host) {
            r.error(&at.field("targetHost"), "tunnel target host must be a valid FQDN or IP address");
        }
        check_port(r, &at.field("targetPort"), self.target_port);
    }
}

impl LoadBalancerSettings {
    fn check(&self, at: &Path, r: &mut Report, has_outlier_detection: bool) {
        if self.simple.is_some() && self.consistent_hash.is_some() {
            r.error(at, "only one of simple or consistentHash may be set");
        }
        if let Some(hash) = &self.consistent_hash {
            hash.check(&at.field("consistentHash"), r);
        }
        if self.locality_lb_setting.is_some() && self.zone_aware_lb_setting.is_some() {
            r.error(at, "only one of localityLbSetting and zoneAwareLbSetting can be set");
        }
        if let Some(locality) = &self.locality_lb_setting {
            locality.check(&at.field("localityLbSetting"), r, has_outlier_detection);
        }
        r.ignored_if(self.zone_aware_lb_setting.is_some(), &at.field("zoneAwareLbSetting"));
        if let Some(warmup) = &self.warmup_duration_secs {
            check_duration_syntax(r, &at.field("warmupDurationSecs"), warmup);
        }
        if let Some(warmup) = &self.warmup {
            let warmup_at = at.field("warmup");
            r.ignored(&warmup_at);
            match &warmup.duration {
                Some(d) => check_duration(r, &warmup_at.field("duration"), d),
                None => r.error(&warmup_at.field("duration"), "duration is required"),
            }
            if warmup.minimum_percent.is_some_and(|p| !(0.0..=100.0).contains(&p.get())) {
                r.error(&warmup_at.field("minimumPercent"), "minimumPercent must be in the range 0..=100");
            }
            if warmup.aggression.is_some_and(|a| a.get() <= 0.0) {
                r.error(&warmup_at.field("aggression"), "aggression must be greater than 0");
            }
        }
    }
}

impl ConsistentHashLb {
    fn check(&self, at: &Path, r: &mut Report) {
        let keys = [self.http_header_name.is_some(), self.http_cookie.is_some(), self.use_source_ip.is_some(), self.http_query_parameter_name.is_some()]
            .iter()
            .filter(|k| **k)
            .count();
        if keys != 1 {
            r.error(
                at,
                format!(
                    "consistentHash needs exactly one of httpHeaderName, httpCookie, useSourceIp or \
                     httpQueryParameterName ({keys} set)"
                ),
            );
        }
        if self.http_header_name.as_deref() == Some("") {
            r.error(&at.field("httpHeaderName"), "header name cannot be empty");
        }
        if self.http_query_parameter_name.as_deref() == Some("") {
            r.error(&at.field("httpQueryParameterName"), "query parameter name cannot be empty");
        }
        if let Some(cookie) = &self.http_cookie {
            let cookie_at = at.field("httpCookie");
            if cookie.name.is_empty() {
                r.error(&cookie_at.field("name"), "name required for httpCookie");
            }
            if let Some(ttl) = &cookie.ttl {
                // A zero TTL is meaningful: it makes the cookie a session cookie.
                check_duration_syntax(r, &cookie_at.field("ttl"), ttl);
            }
            let attributes_at = cookie_at.field("attributes");
            let mut seen = BTreeSet::new();
            for (i, attribute) in cookie.attributes.iter().enumerate() {
                let name_at = attributes_at.index(i).field("name");
                if attribute.name.is_empty() {
                    r.error(&name_at, "cookie attribute name cannot be empty");
                } else if !seen.insert(attribute.name.as_str()) {
                    r.error(&name_at, format!("duplicate cookie attribute name {:?}", attribute.name));
                }
            }
            r.ignored_if(!cookie.attributes.is_empty(), &attributes_at);
        }
        if self.minimum_ring_size.is_some() {
            let ring_at = at.field("minimumRingSize");
            r.deprecated(&ring_at, "ringHash.minimumRingSize");
            if self.ring_hash.is_some() || self.maglev.is_some() {
                r.error(&ring_at, "only one of minimumRingSize or maglev/ringHash can be specified");
            }
        }
        if self.ring_hash.is_some() && self.maglev.is_some() {
            r.error(at, "only one of ringHash or maglev may be set");
        }
        if let Some(maglev) = &self.maglev {
            let size_at = at.field("maglev").field("tableSize");
            match maglev.table_size {
                None | Some(0) => r.error(&size_at, "tableSize must be set for maglev"),
                Some(size) if size >= MAGLEV_MAX_TABLE_SIZE => r.error(&size_at, format!("tableSize must be less than {MAGLEV_MAX_TABLE_SIZE} for maglev")),
                Some(size) if !is_prime(size) => r.error(&size_at, "tableSize must be a prime number for maglev"),
                Some(_) => {}
            }
        }
    }
}

/// Trial division, as Envoy does; table sizes are bounded by
/// [`MAGLEV_MAX_TABLE_SIZE`] so this is cheap.
fn is_prime(x: u64) -> bool {
    if x < 2 {
        return false;
    }
    if x < 4 {
        return true;
    }
    if x.is_multiple_of(2) {
        return false;
    }
    let mut factor = 3;
    while factor * factor <= x {
        if x.is_multiple_of(factor) {
            return false;
        }
        factor += 2;
    }
    true
}

impl LocalityLbSetting {
    fn check(&self, at: &Path, r: &mut Report, has_outlier_detection: bool) {
        if !self.distribute.is_empty() && !self.failover.is_empty() {
            r.error(at, "can not simultaneously specify 'distribute' and 'failover'");
            return;
        }
        if !self.failover.is_empty() {
            let topology = ["topology.kubernetes.io/region", "topology.kubernetes.io/zone", "topology.istio.io/subzone"];
            if let Some(label) = self.failover_priority.iter().find(|l| topology.contains(&l.as_str())) {
                r.error(&at.field("failoverPriority"), format!("can not simultaneously set 'failover' and topology label {label:?} in 'failoverPriority'"));
            }
        }
        let distribute_at = at.field("distribute");
        let mut sources = Vec::new();
        for (i, entry) in self.distribute.iter().enumerate() {
            let entry_at = distribute_at.index(i);
            sources.push(entry.from.as_str());
            let to_at = entry_at.field("to");
            if entry.to.values().any(|w| !(1..=100).contains(w)) {
                r.error(&to_at, "locality weight must be in range [1, 100]");
                continue;
            }
            let total: u32 = entry.to.values().sum();
            if total != 100 {
                r.error(&to_at, format!("total locality weight {total} != 100"));
                continue;
            }
            let targets: Vec<&str> = entry.to.keys().map(String::as_str).collect();
            r.check(&to_at, check_localities(&targets));
        }
        r.check(&distribute_at, check_localities(&sources));
        if (!self.failover.is_empty() || !self.failover_priority.is_empty()) && !has_outlier_detection {
            r.warn(at, "outlier detection policy must be provided for failover to take effect");
        }
        let failover_at = at.field("failover");
        for (i, failover) in self.failover.iter().enumerate() {
            let entry_at = failover_at.index(i);
            if failover.from == failover.to {
                r.error(&entry_at, "locality lb failover settings must specify different regions");
            }
            if failover.from.contains('/') || failover.to.contains('/') {
                r.error(&entry_at, "locality lb failover only specify region");
            }
            if failover.from.contains('*') || failover.to.contains('*') {
                r.error(&entry_at, "locality lb failover region should not contain '*' wildcard");
            }
        }
    }
}

/// Localities are `region[/zone[/subzone]]`, a trailing `*` allowed as the
/// last part; none may overlap another (Istio's `validateLocalities`).
fn check_localities(localities: &[&str]) -> Result<(), String> {
    let mut seen: Vec<Vec<&str>> = Vec::new();
    for locality in localities {
        let stars = locality.matches('*').count();
        if stars > 1 || (stars == 1 && !locality.ends_with('*')) {
            return Err(format!("locality {locality} wildcard '*' number can not exceed 1 and must be in the end"));
        }
        let parts: Vec<&str> = locality.splitn(3, '/').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!("locality {locality} must not contain empty region/zone/subzone info"));
        }
        // Two localities overlap when one is a prefix of the other, `*`
        // standing for everything below its level.
        let covers = |a: &[&str], b: &[&str]| a.iter().zip(b).all(|(x, y)| x == y || *x == "*" || *y == "*");
        if seen.iter().any(|other| covers(other, &parts)) {
            return Err(format!("locality {locality} overlap with previous specified ones"));
        }
        seen.push(parts);
    }
    Ok(())
}

impl ConnectionPoolSettings {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        if self.http.is_none() && self.tcp.is_none() {
            r.error(at, "connection pool must have at least one field");
            return;
        }
        if let Some(http) = &self.http {
            let http_at = at.field("http");
            check_non_negative(r, &http_at.field("http1MaxPendingRequests"), http.http1_max_pending_requests);
            check_non_negative(r, &http_at.field("http2MaxRequests"), http.http2_max_requests);
            check_non_negative(r, &http_at.field("maxRequestsPerConnection"), http.max_requests_per_connection);
            check_non_negative(r, &http_at.field("maxRetries"), http.max_retries);
            check_non_negative(r, &http_at.field("maxConcurrentStreams"), http.max_concurrent_streams);
            if let Some(idle) = &http.idle_timeout {
                check_duration(r, &http_at.field("idleTimeout"), idle);
            }
            if http.h2_upgrade_policy == Some(H2UpgradePolicy::Upgrade) && http.use_client_protocol == Some(true) {
                r.error(&http_at, "useClientProtocol must not be true when h2UpgradePolicy is UPGRADE");
            }
            r.ignored_if(http.use_client_protocol.is_some(), &http_at.field("useClientProtocol"));
            r.ignored_if(http.max_concurrent_streams.is_some(), &http_at.field("maxConcurrentStreams"));
            if let Some(keepalive) = &http.http2_keep_alive {
                let keepalive_at = http_at.field("http2KeepAlive");
                r.ignored(&keepalive_at);
                for (name, value) in [("interval", &keepalive.interval), ("timeout", &keepalive.timeout)] {
                    match value {
                        Some(d) => check_duration(r, &keepalive_at.field(name), d),
                        None => r.error(&keepalive_at.field(name), format!("http2 keepalive {name} is required")),
                    }
                }
            }
        }
        if let Some(tcp) = &self.tcp {
            let tcp_at = at.field("tcp");
            check_non_negative(r, &tcp_at.field("maxConnections"), tcp.max_connections);
            if let Some(timeout) = &tcp.connect_timeout {
                check_duration(r, &tcp_at.field("connectTimeout"), timeout);
            }
            if let Some(duration) = &tcp.max_connection_duration {
                let duration_at = tcp_at.field("maxConnectionDuration");
                check_duration(r, &duration_at, duration);
                r.ignored(&duration_at);
            }
            if let Some(idle) = &tcp.idle_timeout {
                let idle_at = tcp_at.field("idleTimeout");
                // "0s" disables the idle timeout altogether.
                if idle.to_std().is_ok_and(|d| d.is_zero()) {
                    check_duration_syntax(r, &idle_at, idle);
                } else {
                    check_duration(r, &idle_at, idle);
                }
                r.ignored(&idle_at);
            }
            if let Some(keepalive) = &tcp.tcp_keepalive {
                let keepalive_at = tcp_at.field("tcpKeepalive");
                if let Some(time) = &keepalive.time {
                    check_duration(r, &keepalive_at.field("time"), time);
                }
                if let Some(interval) = &keepalive.interval {
                    check_duration(r, &keepalive_at.field("interval"), interval);
                }
            }
        }
    }
}

impl OutlierDetection {
    fn check(&self, at: &Path, r: &mut Report) {
        if let Some(errors) = self.consecutive_errors {
            let errors_at = at.field("consecutiveErrors");
            r.deprecated(&errors_at, "consecutiveGatewayErrors or consecutive5xxErrors");
            check_non_negative(r, &errors_at, Some(errors));
        }
        if self.consecutive_local_origin_failures.is_some_and(|f| f > 0) && self.split_external_local_origin_errors != Some(true) {
            r.error(&at.field("consecutiveLocalOriginFailures"), "consecutiveLocalOriginFailures is set, but splitExternalLocalOriginErrors is not true");
        }
        if let Some(interval) = &self.interval {
            check_duration(r, &at.field("interval"), interval);
        }
        if let Some(base) = &self.base_ejection_time {
            check_duration(r, &at.field("baseEjectionTime"), base);
        }
        if let Some(p) = self.max_ejection_percent {
            check_percent_int(r, &at.field("maxEjectionPercent"), p);
        }
        if let Some(p) = self.min_health_percent {
            check_percent_int(r, &at.field("minHealthPercent"), p);
        }
        r.ignored_if(self.split_external_local_origin_errors.is_some(), &at.field("splitExternalLocalOriginErrors"));
        r.ignored_if(self.consecutive_local_origin_failures.is_some(), &at.field("consecutiveLocalOriginFailures"));
        let codes_at = at.field("outlierDetectionHttpErrorCodes");
        r.ignored_if(!self.outlier_detection_http_error_codes.is_empty(), &codes_at);
        for (i, code) in self.outlier_detection_http_error_codes.iter().enumerate() {
            if !(100..=599).contains(code) {
                r.error(&codes_at.index(i), format!("{code} is not an HTTP status code"));
            }
        }
    }
}

impl ClientTlsSettings {
    fn check(&self, at: &Path, r: &mut Report) {
        let mode = self.mode.unwrap_or(ClientTlsMode::Disable);
        // Reserved for the rules BackendTLSPolicies generate.
        if self.credential_name.as_deref().is_some_and(|n| n.starts_with(crate::gateway_api::BACKEND_CA_PREFIX)) {
            r.error(&at.field("credentialName"), "the backendtlspolicy:// prefix is reserved for BackendTLSPolicy CA bundles");
        }
        if self.insecure_skip_verify == Some(true) {
            let conflicting = match mode {
                ClientTlsMode::Simple => self.ca_certificates.is_some() || self.credential_name.is_some() || !self.subject_alt_names.is_empty(),
                ClientTlsMode::Mutual => self.ca_certificates.is_some() || !self.subject_alt_names.is_empty(),
                _ => false,
            };
            if conflicting {
                r.error(&at.field("insecureSkipVerify"), "cannot specify caCertificates, credentialName or subjectAltNames when insecureSkipVerify is true");
            }
        }
        let uses_credential = matches!(mode, ClientTlsMode::Simple | ClientTlsMode::Mutual) && self.credential_name.is_some();
        if uses_credential {
            if self.client_certificate.is_some() || self.private_key.is_some() || self.ca_certificates.is_some() || self.ca_crl.is_some() {
                r.error(at, "cannot specify client certificates, CA certificate or CA CRL if credentialName is set");
            }
        } else if mode == ClientTlsMode::Mutual {
            if self.client_certificate.as_deref().is_none_or(str::is_empty) {
                r.error(&at.field("clientCertificate"), "client certificate required for mutual tls");
            }
            if self.private_key.as_deref().is_none_or(str::is_empty) {
                r.error(&at.field("privateKey"), "private key required for mutual tls");
            }
        }
        let originates = matches!(mode, ClientTlsMode::Simple | ClientTlsMode::Mutual);
        // Istio's validateTLS: ISTIO_MUTUAL uses the workload certificate
        // (SDS), so no other certificate, CA or credential may be given.
        if mode == ClientTlsMode::IstioMutual
            && (self.client_certificate.is_some() || self.private_key.is_some() || self.ca_certificates.is_some() || self.credential_name.is_some())
        {
            r.error(at, "cannot specify client certificates or CA certificate or CredentialName If tls mode is ISTIO_MUTUAL");
        }
        if originates {
            // Envoy checks names (and revocation) only on a certificate it
            // validated against a CA; Lodestar does not assume the system's
            // CA bundle is where Envoy runs.
            let no_ca = self.ca_certificates.as_deref().is_none_or(str::is_empty) && self.credential_name.is_none();
            if no_ca && !self.subject_alt_names.is_empty() {
                r.error(&at.field("subjectAltNames"), "subjectAltNames need caCertificates to verify the server's certificate against");
            }
            if no_ca && self.ca_crl.is_some() {
                r.error(&at.field("caCrl"), "caCrl needs caCertificates to verify the server's certificate against");
            }
            if no_ca && self.insecure_skip_verify != Some(true) && self.credential_name.is_none() {
                r.warn(at, "without caCertificates the server's certificate is not verified; set caCertificates, or insecureSkipVerify: true to say so");
            }
        } else {
            r.ignored_if(self.credential_name.is_some(), &at.field("credentialName"));
            r.ignored_if(self.ca_crl.is_some(), &at.field("caCrl"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use super::*;
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("DestinationRule", &spec).expect_err("spec should be invalid")
    }

    fn has(errors: &[FieldError], field: &str, reason: &str) -> bool {
        errors.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn subsets_round_trip() {
        let spec = json!({
            "host": "reviews",
            "trafficPolicy": {"loadBalancer": {"simple": "LEAST_REQUEST"}},
            "subsets": [
                {"name": "v1", "labels": {"version": "v1"}},
                {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}
            ]
        });
        let validated = validate("DestinationRule", &spec).unwrap();
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn subset_names_are_labels_and_unique() {
        let e = errors(json!({"host": "r", "subsets": [{"name": "v1"}, {"name": "v1"}, {"name": "V_2"}, {}]}));
        assert!(has(&e, "spec.subsets[1].name", "duplicate subset name"), "{e:?}");
        assert!(has(&e, "spec.subsets[2].name", "invalid"), "{e:?}");
        assert!(has(&e, "spec.subsets[3].name", "cannot be empty"), "{e:?}");
    }

    #[test]
    fn consistent_hash_needs_one_key_and_excludes_simple() {
        let e = errors(json!({"host": "r", "trafficPolicy": {"loadBalancer": {
            "simple": "RANDOM",
            "consistentHash": {"httpHeaderName": "x-user", "useSourceIp": true}
        }}}));
        assert!(has(&e, "spec.trafficPolicy.loadBalancer", "only one of simple or consistentHash"), "{e:?}");
        assert!(has(&e, "spec.trafficPolicy.loadBalancer.consistentHash", "exactly one"), "{e:?}");
        let e = errors(json!({"host": "r", "trafficPolicy": {"loadBalancer": {"consistentHash": {"minimumRingSize": 1024}}}}));
        assert!(has(&e, "spec.trafficPolicy.loadBalancer.consistentHash", "(0 set)"), "{e:?}");
    }

    #[test]
    fn maglev_table_size_is_prime() {
        let e = errors(json!({"host": "r", "trafficPolicy": {"loadBalancer": {"consistentHash": {
            "useSourceIp": true, "maglev": {"tableSize": 65536}
        }}}}));
        assert!(has(&e, "spec.trafficPolicy.loadBalancer.consistentHash.maglev.tableSize", "prime"), "{e:?}");
        assert!(is_prime(65537) && is_prime(2) && !is_prime(1) && !is_prime(9));
    }

    #[test]
    fn empty_policies_are_rejected() {
        let e = errors(json!({"host": "r", "trafficPolicy": {}, "subsets": [{"name": "a", "trafficPolicy": {"connectionPool": {}}}]}));
        assert!(has(&e, "spec.trafficPolicy", "at least one field"), "{e:?}");
        assert!(has(&e, "spec.subsets[0].trafficPolicy.connectionPool", "at least one field"), "{e:?}");
    }

    #[test]
    fn outlier_detection_checks() {
        let e = errors(json!({"host": "r", "trafficPolicy": {"outlierDetection": {
            "interval": "0s", "maxEjectionPercent": 150, "consecutiveLocalOriginFailures": 3
        }}}));
        assert!(has(&e, "spec.trafficPolicy.outlierDetection.interval", "at least 1ms"), "{e:?}");
        assert!(has(&e, "spec.trafficPolicy.outlierDetection.maxEjectionPercent", "150"), "{e:?}");
        assert!(has(&e, "spec.trafficPolicy.outlierDetection.consecutiveLocalOriginFailures", "split"), "{e:?}");
    }

    #[test]
    fn mutual_tls_needs_certificates() {
        let e = errors(json!({"host": "r", "trafficPolicy": {"tls": {"mode": "MUTUAL"}}}));
        assert!(has(&e, "spec.trafficPolicy.tls.clientCertificate", "required"), "{e:?}");
        assert!(has(&e, "spec.trafficPolicy.tls.privateKey", "required"), "{e:?}");
    }

    #[test]
    fn tls_origination_checks() {
        let e = errors(
            json!({"host": "r", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL", "caCertificates": "/ca.pem"}, "portLevelSettings": [{"port": {"number": 80}, "tls": {"mode": "ISTIO_MUTUAL", "clientCertificate": "/c.pem"}}]},
            "subsets": [{"name": "a", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL", "credentialName": "c"}}}]}),
        );
        assert!(validate(
            "DestinationRule",
            &json!({"host": "r", "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL", "sni": "x", "subjectAltNames": ["spiffe://td/ns/a/sa/b"]}}})
        )
        .is_ok());
        for field in ["spec.trafficPolicy.tls", "spec.trafficPolicy.portLevelSettings[0].tls", "spec.subsets[0].trafficPolicy.tls"] {
            assert!(has(&e, field, "If tls mode is ISTIO_MUTUAL"), "{field}: {e:?}");
        }
        // A Secret's certificate and CA (gateway proxies: `credentialName`).
        assert!(validate(
            "DestinationRule",
            &json!({"host": "r", "trafficPolicy": {"tls": {"mode": "MUTUAL", "credentialName": "c", "subjectAltNames": ["r.example.com"]}}})
        )
        .is_ok());
        let e = errors(json!({"host": "r", "trafficPolicy": {"tls": {"mode": "SIMPLE", "subjectAltNames": ["r.example.com"], "caCrl": "/crl.pem"}}}));
        assert!(has(&e, "spec.trafficPolicy.tls.subjectAltNames", "need caCertificates"), "{e:?}");
        assert!(has(&e, "spec.trafficPolicy.tls.caCrl", "needs caCertificates"), "{e:?}");
        // Verified, or explicitly not: no warning; else one.
        let ok = validate(
            "DestinationRule",
            &json!({"host": "r", "trafficPolicy": {"tls": {"mode": "SIMPLE", "caCertificates": "/ca.pem", "subjectAltNames": ["r"]}}}),
        )
        .unwrap();
        assert!(ok.warnings().is_empty(), "{:?}", ok.warnings());
        let ok = validate("DestinationRule", &json!({"host": "r", "trafficPolicy": {"tls": {"mode": "SIMPLE", "insecureSkipVerify": true}}})).unwrap();
        assert!(ok.warnings().is_empty(), "{:?}", ok.warnings());
        let unverified = validate("DestinationRule", &json!({"host": "r", "trafficPolicy": {"tls": {"mode": "SIMPLE", "sni": "r"}}})).unwrap();
        assert!(unverified.warnings().iter().any(|w| w.contains("not verified")), "{:?}", unverified.warnings());
    }

    #[test]
    fn locality_settings() {
        let e = errors(json!({"host": "r", "trafficPolicy": {"loadBalancer": {"localityLbSetting": {
            "distribute": [{"from": "us-west/zone1/*", "to": {"us-west/zone1/*": 80, "us-west/zone2/*": 10}}]
        }}}}));
        assert!(has(&e, "spec.trafficPolicy.loadBalancer.localityLbSetting.distribute[0].to", "90 != 100"), "{e:?}");
        assert!(check_localities(&["us-west/*", "us-west/zone1"]).is_err());
        assert!(check_localities(&["us-west/zone1/*", "us-west/zone2/*"]).is_ok());
        assert!(check_localities(&["*", "us-east"]).is_err());
        assert!(check_localities(&["a/*/b"]).is_err());
        assert!(check_localities(&["a//b"]).is_err());
    }

    #[test]
    fn port_level_settings_need_a_port() {
        let e = errors(json!({"host": "r", "trafficPolicy": {"portLevelSettings": [
            {"loadBalancer": {"simple": "RANDOM"}},
            {"port": {"number": 70000}, "tls": {"mode": "SIMPLE"}}
        ]}}));
        assert!(has(&e, "spec.trafficPolicy.portLevelSettings[0].port", "must have a port"), "{e:?}");
        assert!(has(&e, "spec.trafficPolicy.portLevelSettings[1].port.number", "70000"), "{e:?}");
    }

    #[test]
    fn workload_selector_limits_export() {
        let e = errors(json!({"host": "r", "workloadSelector": {"matchLabels": {"app": "x"}}, "exportTo": ["*"]}));
        assert!(has(&e, "spec.exportTo", "workload selector"), "{e:?}");
    }
}
