//! Registry kinds (`registry.lodestar.io/v1`): the services and instances
//! Lodestar itself is the platform registry for, Consul-catalog style.
//!
//! - `Service` declares a service explicitly: hostname (default
//!   `NAME.NAMESPACE.svc.DOMAIN`), ports with protocols, optional addresses.
//! - `Instance` is one endpoint: the service it belongs to (a Service name in
//!   the same namespace, or a hostname), address, ports (by port name, or one
//!   `port` for every service port), labels (metadata.labels, used by subsets),
//!   locality `region/zone/subzone`, weight.
//!
//! An Instance whose service is not declared implies a service with the
//! Instance's ports (protocol from the port name prefix, Istio-style:
//! `http-web` is HTTP). Declaring services is recommended: it fixes the ports
//! and protocols instead of leaving them to whichever instance came first.

use super::istio::duration::Duration;
use crate::error::FieldError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServicePort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServicePort {
    pub name: String,
    pub number: u32,
    /// HTTP, HTTP2, GRPC, TCP, ... (default: from the name prefix, else TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InstanceSpec {
    pub service: String,
    pub address: String,
    /// Port name → port on this instance.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u32>,
    /// One port for every service port (when `ports` does not name it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// How the instance's health is decided (none: always healthy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// The Lease (same namespace) that owns this instance: when the lease
    /// expires or is revoked, the instance is deleted in the same write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<String>,
    /// The workload's identity (`spiffe://TRUST_DOMAIN/ns/NAMESPACE/sa/THIS`)
    /// when it runs with `lodestar agent`: clients speak mutual TLS to it
    /// (auto-mTLS) and expect this identity in its certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// The host (`lodestar token create --host NAME`) the instance runs on:
    /// that host's agent may obtain the certificate of `serviceAccount`
    /// for it (`ca::hosts`). None (as in data written before it existed):
    /// on no host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// One health check, Consul-style: exactly one of `ttl`, `http`, `tcp`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheck {
    /// The instance (or its agent) must heartbeat within this duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Duration>,
    /// A replica GETs this URL; 2xx/3xx passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
    /// A replica opens a TCP connection to this `host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<String>,
    /// Probe period (HTTP/TCP), default 10s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// Wait this long after a replica takes the check on (the instance
    /// registered, or the probing replica changed) before the first probe
    /// (WorkloadGroup `probe.initialDelaySeconds`); the instance's health
    /// stays unknown meanwhile. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<Duration>,
    /// Probe timeout (HTTP/TCP), default 2s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// Consecutive failures before the instance turns unhealthy (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unhealthy_threshold: Option<u32>,
    /// Consecutive successes before it turns healthy again (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy_threshold: Option<u32>,
    /// Deregister (delete) the instance once it has been unhealthy this long
    /// (Consul's DeregisterCriticalServiceAfter). Unset: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deregister_after: Option<Duration>,
}

pub const DEFAULT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);
pub const DEFAULT_CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

impl HealthCheck {
    fn dur(d: &Option<Duration>, default: std::time::Duration) -> std::time::Duration {
        d.as_ref().and_then(|d| d.to_std().ok()).unwrap_or(default)
    }
    pub fn ttl(&self) -> Option<std::time::Duration> {
        self.ttl.as_ref().and_then(|d| d.to_std().ok())
    }
    pub fn interval(&self) -> std::time::Duration {
        Self::dur(&self.interval, DEFAULT_CHECK_INTERVAL)
    }
    pub fn initial_delay(&self) -> std::time::Duration {
        Self::dur(&self.initial_delay, std::time::Duration::ZERO)
    }
    pub fn timeout(&self) -> std::time::Duration {
        Self::dur(&self.timeout, DEFAULT_CHECK_TIMEOUT)
    }
    pub fn deregister_after(&self) -> Option<std::time::Duration> {
        self.deregister_after.as_ref().and_then(|d| d.to_std().ok())
    }
    pub fn unhealthy_threshold(&self) -> u32 {
        self.unhealthy_threshold.unwrap_or(1).max(1)
    }
    pub fn healthy_threshold(&self) -> u32 {
        self.healthy_threshold.unwrap_or(1).max(1)
    }
    /// A probe a replica runs (HTTP or TCP), as opposed to a TTL.
    pub fn is_probe(&self) -> bool {
        self.http.is_some() || self.tcp.is_some()
    }
}

/// A Lease: an agent's session. Instances name it in `spec.lease`; when no
/// keepalive arrives within `ttl` it expires and they are deleted with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LeaseSpec {
    pub ttl: Duration,
}

impl LeaseSpec {
    pub fn ttl(&self) -> std::time::Duration {
        self.ttl.to_std().unwrap_or(std::time::Duration::from_secs(1))
    }
}

/// Health as the store records it, in an Instance's `status` (written by
/// the replicas through raft, never by `apply`: an apply keeps the stored
/// status, as a Kubernetes spec update does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum HealthState {
    Healthy,
    Unhealthy,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceStatus {
    pub health: HealthState,
    /// Why: the probe's result, "TTL expired", "heartbeat".
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The replica (node id) that decided it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_by: Option<u64>,
    /// Wall-clock time of the transition, unix milliseconds.
    #[serde(default)]
    pub since_unix_ms: u64,
}

impl InstanceStatus {
    /// The status stored in an object body, if any.
    pub fn of(body: &serde_json::Value) -> Option<InstanceStatus> {
        body.get("status").and_then(|s| serde_json::from_value(s.clone()).ok())
    }
}

/// Istio's protocol selection from a port name: `http`, `http-foo`, `grpc-x`.
pub fn protocol_from_name(name: &str) -> &'static str {
    let prefix = name.split('-').next().unwrap_or("").to_ascii_lowercase();
    match prefix.as_str() {
        "http" => "HTTP",
        "http2" => "HTTP2",
        "grpc" | "grpc-web" => "GRPC",
        "https" => "HTTPS",
        "tls" => "TLS",
        "mongo" => "Mongo",
        "redis" => "Redis",
        "mysql" => "MySQL",
        _ => "TCP",
    }
}

fn check_port(path: &str, n: u32, errors: &mut Vec<FieldError>) {
    if !(1..=65535).contains(&n) {
        errors.push(FieldError::new(path, format!("port {n} is not in 1..65535")));
    }
}

pub fn validate_service(spec: &serde_json::Value) -> Result<ServiceSpec, Vec<FieldError>> {
    let s: ServiceSpec = super::parse_spec(spec)?;
    let mut errors = Vec::new();
    if let Some(h) = &s.hostname {
        if let Err(r) = super::resource::check_dns_subdomain(h) {
            errors.push(FieldError::new("spec.hostname", r));
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in s.ports.iter().enumerate() {
        check_port(&format!("spec.ports[{i}].number"), p.number, &mut errors);
        if let Some(t) = p.target_port {
            check_port(&format!("spec.ports[{i}].targetPort"), t, &mut errors);
        }
        if p.name.is_empty() {
            errors.push(FieldError::new(format!("spec.ports[{i}].name"), "required"));
        } else if !names.insert(&p.name) {
            errors.push(FieldError::new(format!("spec.ports[{i}].name"), format!("duplicate port name {:?}", p.name)));
        }
    }
    for (i, a) in s.addresses.iter().enumerate() {
        if a.parse::<std::net::IpAddr>().is_err() {
            errors.push(FieldError::new(format!("spec.addresses[{i}]"), format!("{a:?} is not an IP address")));
        }
    }
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}

fn positive_duration(path: &str, d: &Duration, errors: &mut Vec<FieldError>) {
    match d.to_std() {
        Err(e) => errors.push(FieldError::new(path, e)),
        Ok(v) if v.is_zero() => errors.push(FieldError::new(path, "must be greater than 0")),
        Ok(_) => {}
    }
}

fn validate_check(hc: &HealthCheck, errors: &mut Vec<FieldError>) {
    let kinds = [hc.ttl.is_some(), hc.http.is_some(), hc.tcp.is_some()].iter().filter(|b| **b).count();
    if kinds != 1 {
        errors.push(FieldError::new("spec.healthCheck", "exactly one of ttl, http, tcp is required"));
    }
    if let Some(ttl) = &hc.ttl {
        positive_duration("spec.healthCheck.ttl", ttl, errors);
    }
    if let Some(url) = &hc.http {
        if let Err(r) = parse_http_url(url) {
            errors.push(FieldError::new("spec.healthCheck.http", r));
        }
    }
    if let Some(addr) = &hc.tcp {
        if let Err(r) = parse_host_port(addr) {
            errors.push(FieldError::new("spec.healthCheck.tcp", r));
        }
    }
    for (name, d) in [("interval", &hc.interval), ("timeout", &hc.timeout), ("deregisterAfter", &hc.deregister_after)] {
        if let Some(d) = d {
            positive_duration(&format!("spec.healthCheck.{name}"), d, errors);
        }
    }
    if hc.ttl.is_some() && (hc.interval.is_some() || hc.timeout.is_some()) {
        errors.push(FieldError::new("spec.healthCheck", "interval and timeout apply to http and tcp checks, not ttl"));
    }
}

/// `host:port` (host a name or IP; IPv6 in brackets).
pub fn parse_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = s.rsplit_once(':').ok_or_else(|| format!("{s:?} is not host:port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().map_err(|_| format!("{s:?}: port {port:?} is not a number in 1..65535"))?;
    if host.is_empty() || port == 0 {
        return Err(format!("{s:?} is not host:port"));
    }
    Ok((host.to_string(), port))
}

/// An `http://host:port/path` URL: (host, port, path). HTTPS is not probed.
pub fn parse_http_url(url: &str) -> Result<(String, u16, String), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url:?}: only http:// URLs are probed"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = if authority.contains(':') { parse_host_port(authority)? } else { (authority.to_string(), 80) };
    if host.is_empty() {
        return Err(format!("{url:?} has no host"));
    }
    Ok((host, port, path.to_string()))
}

pub fn validate_lease(spec: &serde_json::Value) -> Result<LeaseSpec, Vec<FieldError>> {
    let s: LeaseSpec = super::parse_spec(spec)?;
    let mut errors = Vec::new();
    positive_duration("spec.ttl", &s.ttl, &mut errors);
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}

/// A host name (join tokens' `host`, Instances' `spec.host`, the
/// WorkloadEntry label `lodestar.io/host`): a DNS subdomain of at most 63
/// characters, so that it is also a valid label value.
pub fn check_host_name(h: &str) -> Result<(), String> {
    super::resource::check_dns_subdomain(h)?;
    if h.len() > 63 {
        return Err(format!("{h:?}: at most 63 characters"));
    }
    Ok(())
}

pub fn validate_instance(spec: &serde_json::Value) -> Result<InstanceSpec, Vec<FieldError>> {
    let s: InstanceSpec = super::parse_spec(spec)?;
    let mut errors = Vec::new();
    if s.service.is_empty() {
        errors.push(FieldError::new("spec.service", "required: the service this instance belongs to"));
    }
    if s.address.parse::<std::net::IpAddr>().is_err() {
        errors.push(FieldError::new("spec.address", format!("{:?} is not an IP address", s.address)));
    }
    if s.ports.is_empty() && s.port.is_none() {
        errors.push(FieldError::new("spec.ports", "required: name → port, or `port`"));
    }
    for (name, p) in &s.ports {
        check_port(&format!("spec.ports.{name}"), *p, &mut errors);
    }
    if let Some(p) = s.port {
        check_port("spec.port", p, &mut errors);
    }
    if let Some(l) = &s.locality {
        if l.split('/').count() > 3 {
            errors.push(FieldError::new("spec.locality", "expected region/zone/subzone"));
        }
    }
    if let Some(lease) = &s.lease {
        if let Err(r) = super::resource::check_dns_subdomain(lease) {
            errors.push(FieldError::new("spec.lease", r));
        }
    }
    if let Some(hc) = &s.health_check {
        validate_check(hc, &mut errors);
    }
    if let Some(sa) = &s.service_account {
        if let Err(r) = super::resource::check_dns_subdomain(sa) {
            errors.push(FieldError::new("spec.serviceAccount", r));
        }
    }
    if let Some(h) = &s.host {
        if let Err(r) = check_host_name(h) {
            errors.push(FieldError::new("spec.host", r));
        }
        if s.service_account.is_none() {
            errors.push(FieldError::new("spec.host", "a host names where the workload identity runs: give spec.serviceAccount too"));
        }
    }
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}
