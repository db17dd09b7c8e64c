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
    if errors.is_empty() {
        Ok(s)
    } else {
        Err(errors)
    }
}
