//! Types shared by several `networking.istio.io` kinds.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::host;
use super::validate::{check_port, Path, Report};

/// Kubernetes-style labels. A `BTreeMap` keeps serialisation deterministic.
pub type Labels = BTreeMap<String, String>;

/// Istio's `StringMatch`: exactly one of `exact`, `prefix` or `regex`.
///
/// Modelled as three optional fields (rather than a Rust enum) so that a
/// spec setting two of them, or none, still parses and validation can say
/// precisely what is wrong, next to every other problem in the spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StringMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// RE2 syntax, matched against the whole value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// The match a [`StringMatch`] expresses, once validation has ensured there
/// is at most one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchKind<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Regex(&'a str),
}

impl StringMatch {
    /// The first match set, in `exact`, `prefix`, `regex` order; `None` for an
    /// empty match, which in `headers`/`queryParams` means "present".
    pub fn kind(&self) -> Option<MatchKind<'_>> {
        self.exact
            .as_deref()
            .map(MatchKind::Exact)
            .or_else(|| self.prefix.as_deref().map(MatchKind::Prefix))
            .or_else(|| self.regex.as_deref().map(MatchKind::Regex))
    }

    /// How many of the three alternatives are set.
    pub(super) fn count_set(&self) -> usize {
        [&self.exact, &self.prefix, &self.regex].iter().filter(|v| v.is_some()).count()
    }
}

/// A percentage in `0.0..=100.0` (Istio's `Percent`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Percent {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Float>,
}

impl Percent {
    /// The percentage; protobuf's default of 0 when unset.
    pub fn get(&self) -> f64 {
        self.value.map_or(0.0, Float::get)
    }
}

/// A protobuf `double` that serialises the way it was written.
///
/// `value: 100` and `value: 100.0` are the same number, but JSON values
/// (and users diffing their config) tell them apart, so the form is kept
/// for the round trip. Equality compares the numbers only.
#[derive(Debug, Clone, Copy, Default)]
pub struct Float {
    value: f64,
    written_as_integer: bool,
}

impl Float {
    pub fn new(value: f64) -> Self {
        Float { value, written_as_integer: false }
    }

    pub fn get(self) -> f64 {
        self.value
    }
}

impl From<f64> for Float {
    fn from(value: f64) -> Self {
        Float::new(value)
    }
}

impl PartialEq for Float {
    fn eq(&self, other: &Self) -> bool {
        self.value == other.value
    }
}

impl Serialize for Float {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Only values that came in as integers are written as integers, and
        // those are exact in an f64 up to 2^53, well beyond any percentage.
        if self.written_as_integer && self.value.fract() == 0.0 {
            if self.value >= 0.0 {
                serializer.serialize_u64(self.value as u64)
            } else {
                serializer.serialize_i64(self.value as i64)
            }
        } else {
            serializer.serialize_f64(self.value)
        }
    }
}

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;

        impl serde::de::Visitor<'_> for Visitor {
            type Value = Float;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number")
            }

            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Float, E> {
                Ok(Float::new(v))
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Float, E> {
                Ok(Float { value: v as f64, written_as_integer: true })
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Float, E> {
                Ok(Float { value: v as f64, written_as_integer: true })
            }
        }

        deserializer.deserialize_f64(Visitor)
    }
}

/// A port on a destination service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PortSelector {
    #[serde(default, skip_serializing_if = "is_zero")]
    pub number: u32,
}

/// Where traffic goes: a service host, optionally a subset and port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Destination {
    /// Service registry name; short names are relative to the config's
    /// namespace (see [`super::host::resolve_short_name`]).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    /// A subset declared in the host's DestinationRule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<PortSelector>,
}

impl Destination {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let host_at = at.field("host");
        if self.host.is_empty() {
            r.error(&host_at, "destination host is required");
        } else if self.host == "*" {
            r.error(&host_at, "destination host cannot be the wildcard *");
        } else {
            r.check(&host_at, host::check_wildcard_domain(&self.host));
        }
        if let Some(subset) = &self.subset {
            check_subset_name(&at.field("subset"), subset, r);
        }
        if let Some(port) = &self.port {
            check_port(r, &at.field("port").field("number"), port.number);
        }
    }
}

pub(super) fn check_subset_name(at: &Path, name: &str, r: &mut Report) {
    if name.is_empty() {
        r.error(at, "subset name cannot be empty");
    } else if !host::is_dns1123_label(name) {
        r.error(at, format!("subset name {name:?} is invalid: must be a DNS label (alphanumerics and '-')"));
    }
}

/// Selects workloads by labels (`networking.istio.io` Sidecar, ServiceEntry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
}

/// Selects workloads by labels (`istio.type.v1beta1.WorkloadSelector`, as
/// used by DestinationRule): the same idea, but the field is `matchLabels`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MatchLabelsSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: Labels,
}

/// Whether a security policy (AuthorizationPolicy, RequestAuthentication,
/// PeerAuthentication) in `policy_ns` with workload selector `match_labels`
/// applies to a workload in `workload_ns` with `workload_labels`, as Istio
/// scopes them: a policy in the root namespace applies mesh-wide (to the
/// workloads its selector matches, in every namespace), any other to its
/// own namespace; no selector (or an empty one) selects every workload in
/// scope, a selector those whose labels include all of its own.
pub fn policy_applies(policy_ns: &str, match_labels: Option<&Labels>, root_ns: &str, workload_ns: &str, workload_labels: &Labels) -> bool {
    (policy_ns == root_ns || policy_ns == workload_ns) && match_labels.is_none_or(|l| l.iter().all(|(k, v)| workload_labels.get(k) == Some(v)))
}

/// A port protocol as Istio understands it. Parsing is case-insensitive,
/// like Istio's `protocol.Parse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Http,
    Http2,
    HttpProxy,
    Https,
    Grpc,
    GrpcWeb,
    Tcp,
    Tls,
    Udp,
    Mongo,
    Redis,
    Mysql,
}

impl Protocol {
    pub fn parse(s: &str) -> Option<Protocol> {
        let protocol = match s.to_ascii_lowercase().as_str() {
            "http" => Protocol::Http,
            "http2" => Protocol::Http2,
            "http_proxy" => Protocol::HttpProxy,
            "https" => Protocol::Https,
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "tcp" => Protocol::Tcp,
            "tls" => Protocol::Tls,
            "udp" => Protocol::Udp,
            "mongo" => Protocol::Mongo,
            "redis" => Protocol::Redis,
            "mysql" => Protocol::Mysql,
            _ => return None,
        };
        Some(protocol)
    }

    /// Carried over HTTP (so L7 routing applies).
    pub fn is_http(self) -> bool {
        matches!(self, Protocol::Http | Protocol::Http2 | Protocol::HttpProxy | Protocol::Grpc | Protocol::GrpcWeb)
    }

    /// Carried over TLS, with SNI available.
    pub fn is_tls(self) -> bool {
        matches!(self, Protocol::Https | Protocol::Tls)
    }

    /// Opaque TCP as far as the proxy is concerned.
    pub fn is_tcp(self) -> bool {
        matches!(self, Protocol::Tcp | Protocol::Https | Protocol::Tls | Protocol::Mongo | Protocol::Redis | Protocol::Mysql)
    }
}

/// The protocols a port may declare, for error messages.
pub(super) const SUPPORTED_PROTOCOLS: &str = "HTTP, HTTPS, HTTP2, GRPC, GRPC-WEB, HTTP_PROXY, TCP, TLS, UDP, MONGO, REDIS, MYSQL";

pub(super) fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn string_match_kind() {
        let m: StringMatch = serde_json::from_value(json!({"prefix": "/api"})).unwrap();
        assert_eq!(m.kind(), Some(MatchKind::Prefix("/api")));
        assert_eq!(m.count_set(), 1);
        assert_eq!(StringMatch::default().kind(), None);
    }

    #[test]
    fn percent_keeps_the_written_form() {
        for v in [json!({"value": 50}), json!({"value": 100.0}), json!({"value": 0.1}), json!({})] {
            let p: Percent = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(serde_json::to_value(p).unwrap(), v);
        }
        let p: Percent = serde_json::from_value(json!({"value": 50})).unwrap();
        assert_eq!(p.get(), 50.0);
        assert_eq!(p, Percent { value: Some(Float::new(50.0)) });
        assert_eq!(Percent::default().get(), 0.0);
        assert!(serde_json::from_value::<Percent>(json!({"value": "50"})).is_err());
    }

    #[test]
    fn protocols_parse_case_insensitively() {
        assert_eq!(Protocol::parse("HTTP"), Some(Protocol::Http));
        assert_eq!(Protocol::parse("grpc-web"), Some(Protocol::GrpcWeb));
        assert_eq!(Protocol::parse("Mongo"), Some(Protocol::Mongo));
        assert_eq!(Protocol::parse("SOAP"), None);
        assert_eq!(Protocol::parse(""), None);
        assert!(Protocol::Grpc.is_http());
        assert!(Protocol::Https.is_tls() && Protocol::Https.is_tcp());
        assert!(!Protocol::Http.is_tcp());
    }

    #[test]
    fn destination_round_trips() {
        let v = json!({"host": "reviews", "subset": "v1", "port": {"number": 9080}});
        let d: Destination = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&d).unwrap(), v);
    }
}
