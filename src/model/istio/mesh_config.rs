//! `MeshConfig`: Istio's mesh-wide settings (istio/api
//! `mesh/v1alpha1/config.proto`), the YAML Istio reads from the `mesh` key
//! of ConfigMap `istio-system/istio` or `IstioOperator.spec.meshConfig`,
//! stored as the `spec` of one object (`mesh.lodestar.io/v1` `MeshConfig`
//! named `default`, cluster-scoped).
//!
//! What applies without Kubernetes: `extensionProviders` (ext_authz over
//! HTTP or gRPC for CUSTOM authorization; Zipkin and OpenTelemetry
//! tracers (OTLP over gRPC or HTTP), file access logs and Prometheus for the
//! Telemetry API),
//! `defaultProviders`, the legacy access log settings (`accessLogFile`,
//! `accessLogEncoding`, `accessLogFormat`), `enableTracing`,
//! `defaultConfig.tracing.sampling`, `outboundTrafficPolicy` (the default
//! of Sidecars that set none), and `rootNamespace` / `trustDomain`, which
//! are the server's own settings (`root_namespace`, `trust_domain`): the
//! resource may repeat them, a different value is refused where it is
//! written (`api`). Every other field Istio defines is refused by name with
//! the reason.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::duration::Duration;
use super::sidecar::OutboundMode;
use super::validate::{check_duration, check_port, Path, Report};

/// The only name a MeshConfig may have: there is one per mesh.
pub const MESH_CONFIG_NAME: &str = "default";

/// Providers Istio always has (`pkg/config/mesh` `DefaultMeshConfig`);
/// a user provider of the same name replaces it.
pub const BUILTIN_ENVOY: &str = "envoy";
pub const BUILTIN_PROMETHEUS: &str = "prometheus";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeshConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extension_providers: Vec<ExtensionProvider>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_providers: Option<DefaultProviders>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_encoding: Option<AccessLogEncoding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_log_format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tracing: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_config: Option<DefaultConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<MeshOutboundTrafficPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_domain: Option<String>,
    /// Every other field: refused by name in `check` (Istio fields that do
    /// not apply, or unknown ones).
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum AccessLogEncoding {
    Text,
    Json,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DefaultProviders {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tracing: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub access_logging: Vec<String>,
}

/// `defaultConfig` is Istio's ProxyConfig: only its tracing settings are
/// mesh-wide translation input here; the rest belongs to a proxy's
/// bootstrap (`lodestar bootstrap` / `lodestar agent`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefaultConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<DefaultTracing>,
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DefaultTracing {
    /// Percent of requests sampled when no Telemetry says (0: Istio's
    /// default of 1%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<f64>,
    #[serde(flatten, default, skip_serializing_if = "BTreeMap::is_empty")]
    pub other: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MeshOutboundTrafficPolicy {
    /// `ALLOW_ANY` when unset (Istio's mesh default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<OutboundMode>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtensionProvider {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_http: Option<ExtAuthzHttp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zipkin: Option<Zipkin>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opentelemetry: Option<OpenTelemetry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_file_access_log: Option<FileAccessLog>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<Value>,
    // Istio providers Lodestar does not translate: parsed so that the
    // refusal names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skywalking: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datadog: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lightstep: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stackdriver: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_otel_als: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_http_als: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub envoy_tcp_als: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sds: Option<Value>,
}

/// A protobuf uint32 as Istio's mesh config files write it: a number, or a
/// string of digits (protobuf JSON accepts both; the authz-custom task
/// writes `port: "9000"`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Port(pub u32);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u32),
            S(String),
        }
        match Raw::deserialize(d).map_err(|_| serde::de::Error::custom("expected a port number (or a string of digits)"))? {
            Raw::N(n) => Ok(Port(n)),
            Raw::S(s) => s.trim().parse().map(Port).map_err(|_| serde::de::Error::custom(format!("{s:?} is not a port number"))),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzHttp {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_open: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear_route_cache: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_on_error: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include_headers_in_check: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include_request_headers_in_check: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_request_body_in_check: Option<RequestBody>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_upstream_on_allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_downstream_on_deny: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers_to_downstream_on_allow: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzGrpc {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_open: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear_route_cache: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_on_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_request_body_in_check: Option<RequestBody>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_request_bytes: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_partial_message: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pack_as_bytes: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Zipkin {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tag_length: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable64bit_trace_id: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OpenTelemetry {
    #[serde(default)]
    pub service: String,
    #[serde(default)]
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tag_length: Option<u32>,
    /// OTLP over HTTP (protobuf POSTs); unset: OTLP over gRPC (Istio's
    /// default), to the same service and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<OtelHttp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_detectors: Option<ResourceDetectors>,
    /// Refused by name (`check_kind`): Dynatrace's sampler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynatrace_sampler: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OtelHttp {
    /// Where spans are POSTed (`/v1/traces`, OTLP's path, when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<HttpHeader>,
}

/// Istio's `ExtensionProvider.HttpHeader`: `value`, or `envName` (refused:
/// it reads istiod's own environment).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_name: Option<String>,
}

/// Envoy's OpenTelemetry resource detectors: `environment` (the proxy's
/// `OTEL_RESOURCE_ATTRIBUTES`); `dynatrace` is refused by name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourceDetectors {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynatrace: Option<Value>,
}

/// OTLP/HTTP's traces path, when `http.path` is unset.
pub const OTLP_HTTP_PATH: &str = "/v1/traces";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileAccessLog {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct LogFormat {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub omit_empty_values: bool,
}

/// What one provider is, once validated.
#[derive(Debug, Clone, PartialEq)]
pub enum ProviderKind<'a> {
    ExtAuthzHttp(&'a ExtAuthzHttp),
    ExtAuthzGrpc(&'a ExtAuthzGrpc),
    Zipkin(&'a Zipkin),
    OpenTelemetry(&'a OpenTelemetry),
    FileAccessLog(&'a FileAccessLog),
    Prometheus,
}

/// Istio's built-in `envoy` provider: a file access log to /dev/stdout.
static BUILTIN_ENVOY_LOG: FileAccessLog = FileAccessLog { path: None, log_format: None };

impl ExtensionProvider {
    /// The kinds set on this provider, by YAML name.
    fn kinds(&self) -> Vec<&'static str> {
        let set = [
            ("envoyExtAuthzHttp", self.envoy_ext_authz_http.is_some()),
            ("envoyExtAuthzGrpc", self.envoy_ext_authz_grpc.is_some()),
            ("zipkin", self.zipkin.is_some()),
            ("opentelemetry", self.opentelemetry.is_some()),
            ("envoyFileAccessLog", self.envoy_file_access_log.is_some()),
            ("prometheus", self.prometheus.is_some()),
            ("skywalking", self.skywalking.is_some()),
            ("datadog", self.datadog.is_some()),
            ("lightstep", self.lightstep.is_some()),
            ("stackdriver", self.stackdriver.is_some()),
            ("envoyOtelAls", self.envoy_otel_als.is_some()),
            ("envoyHttpAls", self.envoy_http_als.is_some()),
            ("envoyTcpAls", self.envoy_tcp_als.is_some()),
            ("sds", self.sds.is_some()),
        ];
        set.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect()
    }

    pub fn kind(&self) -> Option<ProviderKind<'_>> {
        if let Some(p) = &self.envoy_ext_authz_http {
            return Some(ProviderKind::ExtAuthzHttp(p));
        }
        if let Some(p) = &self.envoy_ext_authz_grpc {
            return Some(ProviderKind::ExtAuthzGrpc(p));
        }
        if let Some(p) = &self.zipkin {
            return Some(ProviderKind::Zipkin(p));
        }
        if let Some(p) = &self.opentelemetry {
            return Some(ProviderKind::OpenTelemetry(p));
        }
        if let Some(p) = &self.envoy_file_access_log {
            return Some(ProviderKind::FileAccessLog(p));
        }
        self.prometheus.as_ref().map(|_| ProviderKind::Prometheus)
    }
}

impl MeshConfig {
    /// The provider named `name`: the user's, else Istio's built-ins
    /// (`envoy`, `prometheus`).
    pub fn provider(&self, name: &str) -> Option<ProviderKind<'_>> {
        if let Some(p) = self.extension_providers.iter().find(|p| p.name == name) {
            return p.kind();
        }
        match name {
            BUILTIN_ENVOY => Some(ProviderKind::FileAccessLog(&BUILTIN_ENVOY_LOG)),
            BUILTIN_PROMETHEUS => Some(ProviderKind::Prometheus),
            _ => None,
        }
    }

    /// `outboundTrafficPolicy.mode`, Istio's default `ALLOW_ANY` if unset.
    pub fn allow_any(&self) -> bool {
        self.outbound_traffic_policy.as_ref().and_then(|p| p.mode).is_none_or(|m| m == OutboundMode::AllowAny)
    }

    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        for name in self.other.keys() {
            r.error(&at.key(name), refusal(name));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, p) in self.extension_providers.iter().enumerate() {
            let at = at.field("extensionProviders").index(i);
            if p.name.is_empty() {
                r.error(&at.field("name"), "empty extension provider name");
            } else if !seen.insert(p.name.as_str()) {
                r.error(&at.field("name"), format!("duplicate extension provider name {:?}", p.name));
            } else if !super::host::is_dns1123_label(&p.name) {
                // istiod refuses other names at translation time; refused
                // here so that a policy naming it never silently denies.
                r.error(&at.field("name"), format!("{:?}: must be a DNS-1123 label (lower case letters, digits and '-', at most 63)", p.name));
            }
            match p.kinds().as_slice() {
                [] => r.error(
                    &at,
                    "an extension provider needs one of envoyExtAuthzHttp, envoyExtAuthzGrpc, zipkin, opentelemetry, envoyFileAccessLog, prometheus",
                ),
                [one] => p.check_kind(one, &at, r),
                many => r.error(&at, format!("an extension provider has exactly one kind; found {}", many.join(", "))),
            }
        }
        if let Some(d) = &self.default_providers {
            let at = at.field("defaultProviders");
            for (field, names) in [("tracing", &d.tracing), ("metrics", &d.metrics), ("accessLogging", &d.access_logging)] {
                for (i, n) in names.iter().enumerate() {
                    let ok = matches!(
                        (field, self.provider(n)),
                        ("tracing", Some(ProviderKind::Zipkin(_) | ProviderKind::OpenTelemetry(_)))
                            | ("metrics", Some(ProviderKind::Prometheus))
                            | ("accessLogging", Some(ProviderKind::FileAccessLog(_)))
                    );
                    if !ok {
                        r.error(&at.field(field).index(i), format!("{n:?} is no {field} provider of this mesh config"));
                    }
                }
            }
        }
        if self.default_providers.as_ref().is_some_and(|d| !d.metrics.is_empty()) {
            r.warn(
                &at.field("defaultProviders").field("metrics"),
                "accepted (Istio's default mesh config names prometheus) with no effect: Lodestar's Envoys expose Envoy's own statistics, not Istio's standard metrics",
            );
        }
        if let Some(f) = &self.access_log_format {
            if f.is_empty() {
                r.warn(&at.field("accessLogFormat"), "empty: Istio's default format is used");
            }
        }
        if let Some(dc) = &self.default_config {
            let at = at.field("defaultConfig");
            for name in dc.other.keys() {
                r.error(
                    &at.key(name),
                    format!("defaultConfig.{name} is a per-proxy bootstrap setting (Istio's ProxyConfig): Lodestar's bootstraps come from `lodestar bootstrap` / `lodestar agent`; only defaultConfig.tracing.sampling applies mesh-wide"),
                );
            }
            if let Some(t) = &dc.tracing {
                let at = at.field("tracing");
                for name in t.other.keys() {
                    r.error(
                        &at.key(name),
                        format!("defaultConfig.tracing.{name} is not supported; declare the tracer as an extensionProvider and select it with a Telemetry"),
                    );
                }
                if let Some(s) = t.sampling.filter(|s| !(0.0..=100.0).contains(s)) {
                    r.error(&at.field("sampling"), format!("sampling {s} must be in the range 0..=100"));
                }
            }
        }
        if let Some(ns) = &self.root_namespace {
            if !super::host::is_dns1123_label(ns) {
                r.error(&at.field("rootNamespace"), format!("{ns:?} is not a valid namespace name"));
            }
        }
    }
}

impl ExtensionProvider {
    fn check_kind(&self, kind: &str, at: &Path, r: &mut Report) {
        let at = at.field(kind);
        match self.kind() {
            Some(ProviderKind::ExtAuthzHttp(h)) => {
                check_service(r, &at, &h.service, h.port.0);
                if let Some(t) = &h.timeout {
                    check_duration(r, &at.field("timeout"), t);
                }
                if let Some(p) = h.path_prefix.as_deref().filter(|p| !p.starts_with('/')) {
                    r.error(&at.field("pathPrefix"), format!("{p:?} must begin with `/`"));
                }
                check_status(r, &at, h.status_on_error.as_deref());
                check_body(r, &at, h.include_request_body_in_check.as_ref());
                for (field, list) in [
                    ("includeHeadersInCheck", &h.include_headers_in_check),
                    ("includeRequestHeadersInCheck", &h.include_request_headers_in_check),
                    ("headersToUpstreamOnAllow", &h.headers_to_upstream_on_allow),
                    ("headersToDownstreamOnDeny", &h.headers_to_downstream_on_deny),
                    ("headersToDownstreamOnAllow", &h.headers_to_downstream_on_allow),
                ] {
                    for (i, v) in list.iter().enumerate() {
                        r.check(&at.field(field).index(i), check_header_pattern(v));
                    }
                }
                if !h.include_headers_in_check.is_empty() {
                    r.deprecated(&at.field("includeHeadersInCheck"), "includeRequestHeadersInCheck");
                }
                if h.clear_route_cache {
                    r.warn(&at.field("clearRouteCache"), "accepted and, as by istiod, not translated (Envoy's clear_route_cache stays false)");
                }
                if h.include_request_body_in_check.as_ref().is_some_and(|b| b.pack_as_bytes) {
                    r.warn(&at.field("includeRequestBodyInCheck").field("packAsBytes"), "only meaningful for a gRPC provider; ignored");
                }
            }
            Some(ProviderKind::ExtAuthzGrpc(g)) => {
                check_service(r, &at, &g.service, g.port.0);
                if let Some(t) = &g.timeout {
                    check_duration(r, &at.field("timeout"), t);
                }
                check_status(r, &at, g.status_on_error.as_deref());
                check_body(r, &at, g.include_request_body_in_check.as_ref());
                if g.clear_route_cache {
                    r.warn(&at.field("clearRouteCache"), "accepted and, as by istiod, not translated (Envoy's clear_route_cache stays false)");
                }
            }
            Some(ProviderKind::Zipkin(z)) => {
                check_service(r, &at, &z.service, z.port.0);
                if let Some(p) = z.path.as_deref().filter(|p| !p.starts_with('/')) {
                    r.error(&at.field("path"), format!("{p:?} must begin with `/`"));
                }
            }
            Some(ProviderKind::OpenTelemetry(o)) => o.check(&at, r),
            Some(ProviderKind::FileAccessLog(f)) => {
                if f.path.as_deref().is_some_and(str::is_empty) {
                    r.error(&at.field("path"), "empty path (leave it out for /dev/stdout)");
                }
                if let Some(lf) = &f.log_format {
                    if lf.text.is_some() && lf.labels.is_some() {
                        r.error(&at.field("logFormat"), "text and labels are exclusive");
                    }
                }
            }
            Some(ProviderKind::Prometheus) => {
                if self.prometheus.as_ref().is_some_and(|v| v.as_object().is_none_or(|o| !o.is_empty())) {
                    r.error(&at, "prometheus takes no settings: {}");
                }
            }
            None => r.error(
                &at,
                format!("extension provider kind {kind} is not supported by Lodestar (supported: envoyExtAuthzHttp, envoyExtAuthzGrpc, zipkin, opentelemetry, envoyFileAccessLog, prometheus)"),
            ),
        }
    }
}

impl OpenTelemetry {
    fn check(&self, at: &Path, r: &mut Report) {
        check_service(r, at, &self.service, self.port.0);
        if self.dynatrace_sampler.is_some() {
            r.error(
                &at.field("dynatraceSampler"),
                "Dynatrace's sampler is not translated by Lodestar; leave it out (sampling is the Telemetry's randomSamplingPercentage)",
            );
        }
        if let Some(d) = &self.resource_detectors {
            let at = at.field("resourceDetectors");
            if d.dynatrace.is_some() {
                r.error(
                    &at.field("dynatrace"),
                    "Dynatrace's resource detector is not translated by Lodestar (it reads files Dynatrace's OneAgent writes); use environment",
                );
            }
            if d.environment.as_ref().is_some_and(|v| v.as_object().is_none_or(|o| !o.is_empty())) {
                r.error(&at.field("environment"), "environment takes no settings: {}");
            }
        }
        if let Some(h) = &self.http {
            let at = at.field("http");
            if let Some(p) = h.path.as_deref().filter(|p| !p.starts_with('/')) {
                r.error(&at.field("path"), format!("{p:?} must begin with `/`"));
            }
            if let Some(t) = &h.timeout {
                check_duration(r, &at.field("timeout"), t);
            }
            for (i, hd) in h.headers.iter().enumerate() {
                let at = at.field("headers").index(i);
                if hd.name.is_empty() {
                    r.error(&at.field("name"), "required");
                } else if !hd.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
                    r.error(&at.field("name"), format!("{:?} is not an HTTP header name", hd.name));
                }
                if hd.env_name.is_some() {
                    r.error(&at.field("envName"), "reads istiod's own environment, which Lodestar does not have; write the value");
                } else if let Some(v) = &hd.value {
                    if v.bytes().any(|b| b == 0 || b == b'\r' || b == b'\n') || v.len() > 16384 {
                        r.error(&at.field("value"), "not an HTTP header value (no NUL, CR or LF; at most 16384 bytes)");
                    }
                } else {
                    r.error(&at.field("value"), "required");
                }
            }
        }
    }
}

/// Envoy refuses a body buffer of 0 bytes (`BufferSettings.max_request_bytes`
/// must be > 0): refused here rather than NACKed by every proxy.
fn check_body(r: &mut Report, at: &Path, body: Option<&RequestBody>) {
    if body.is_some_and(|b| b.max_request_bytes.unwrap_or(0) == 0) {
        r.error(&at.field("includeRequestBodyInCheck").field("maxRequestBytes"), "required, at least 1 (Envoy buffers at most this many bytes of the body)");
    }
}

/// Istio's `validateExtensionProviderService`: `[<namespace>/]<hostname>`.
fn check_service(r: &mut Report, at: &Path, service: &str, port: u32) {
    check_port(r, &at.field("port"), port);
    let host = match service.split_once('/') {
        Some((ns, host)) => {
            if !super::host::is_dns1123_label(ns) {
                r.error(&at.field("service"), format!("{service:?}: {ns:?} is not a valid namespace"));
            }
            host
        }
        None => service,
    };
    if host.is_empty() {
        r.error(&at.field("service"), "required: [<namespace>/]<hostname>");
    } else if host.parse::<std::net::IpAddr>().is_err() && !host.split('.').all(super::host::is_dns1123_label) {
        r.error(&at.field("service"), format!("{service:?} is not a valid hostname"));
    }
}

/// Envoy's `type.v3.StatusCode` values (what `statusOnError` may name).
pub fn parse_status(s: &str) -> Result<u32, String> {
    let code: u32 = s.trim().parse().map_err(|_| format!("{s:?} is not an HTTP status code"))?;
    // StatusCode's enum: 1xx-5xx codes Envoy knows (a code outside is
    // refused by Envoy: keep to its range).
    if !(100..=599).contains(&code) || code == 0 {
        return Err(format!("{code} is not an HTTP status code Envoy knows"));
    }
    Ok(code)
}

fn check_status(r: &mut Report, at: &Path, status: Option<&str>) {
    if let Some(s) = status {
        r.check(&at.field("statusOnError"), parse_status(s).map(|_| ()));
    }
}

/// Exact `abc`, prefix `abc*`, suffix `*abc`; a lone `*` is an error.
fn check_header_pattern(v: &str) -> Result<(), String> {
    if v.is_empty() {
        return Err("empty header name".into());
    }
    if v == "*" {
        return Err("`*` alone is not allowed: name the headers (exact, prefix* or *suffix)".into());
    }
    let inner = v.trim_start_matches('*').trim_end_matches('*');
    if inner.contains('*') || (v.starts_with('*') && v.ends_with('*')) {
        return Err(format!("{v:?}: only one leading or trailing `*`"));
    }
    Ok(())
}

/// Why a top-level mesh config field is refused.
fn refusal(name: &str) -> String {
    const KUBERNETES: &[&str] = &[
        "ingressClass",
        "ingressService",
        "ingressControllerMode",
        "ingressSelector",
        "enableAutoMtls",
        "discoverySelectors",
        "certificates",
        "caCertificates",
        "configSources",
        "trustDomainAliases",
        "defaultServiceExportTo",
        "defaultVirtualServiceExportTo",
        "defaultDestinationRuleExportTo",
        "localityLbSetting",
        "dnsRefreshRate",
        "h2UpgradePolicy",
        "inboundClusterStatName",
        "outboundClusterStatName",
        "proxyListenPort",
        "proxyInboundListenPort",
        "proxyHttpPort",
        "connectTimeout",
        "protocolDetectionTimeout",
        "tcpKeepalive",
        "enablePrometheusMerge",
        "verifyCertificateAtClient",
        "serviceSettings",
        "meshMTLS",
        "tlsDefaults",
        "pathNormalization",
        "enableEnvoyAccessLogService",
        "thriftConfig",
        "accessLogFilter",
        "ca",
        "defaultHttpRetryPolicy",
        "extensionProviderDefaults",
        "meshNetworks",
        "serviceScopeConfigs",
    ];
    if KUBERNETES.contains(&name) {
        format!("mesh config field {name} does not apply to Lodestar (an istiod/Kubernetes or per-proxy setting it does not translate); remove it")
    } else {
        format!("unknown mesh config field {name}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::validate;
    use serde_json::json;

    fn errors(v: serde_json::Value) -> Vec<String> {
        match validate("MeshConfig", &v) {
            Ok(_) => Vec::new(),
            Err(e) => e.iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn corpus_providers_parse() {
        let v: serde_json::Value = yaml_serde::from_str(include_str!("../../../tests/fixtures/istio/corpus-38/meshconfig-extauthz-providers.yaml")).unwrap();
        assert_eq!(errors(v), Vec::<String>::new());
    }

    #[test]
    fn refusals_name_the_field() {
        let e = errors(json!({"ingressClass": "istio", "extensionProviders": [{"name": "x", "envoyOtelAls": {}}]}));
        assert!(e.iter().any(|e| e.starts_with("spec.ingressClass: mesh config field ingressClass does not apply")), "{e:?}");
        assert!(e.iter().any(|e| e.starts_with("spec.extensionProviders[0].envoyOtelAls: extension provider kind envoyOtelAls is not supported")), "{e:?}");
        let e = errors(json!({"extensionProviders": [{"name": "a", "envoyExtAuthzHttp": {"service": "x.y", "port": 0, "pathPrefix": "check"}}]}));
        assert!(e.iter().any(|e| e.contains("port number 0")), "{e:?}");
        assert!(e.iter().any(|e| e.starts_with("spec.extensionProviders[0].envoyExtAuthzHttp.pathPrefix")), "{e:?}");
        let e = errors(json!({"extensionProviders": [{"name": "a", "envoyExtAuthzGrpc": {"service": "x.y", "port": "9000", "statusOnError": "abc"}}]}));
        assert!(e.iter().any(|e| e.starts_with("spec.extensionProviders[0].envoyExtAuthzGrpc.statusOnError")), "{e:?}");
        let e = errors(
            json!({"extensionProviders": [{"name": "a", "envoyExtAuthzGrpc": {"service": "x.y", "port": 1, "includeRequestBodyInCheck": {"allowPartialMessage": true}}}]}),
        );
        assert!(e.iter().any(|e| e.starts_with("spec.extensionProviders[0].envoyExtAuthzGrpc.includeRequestBodyInCheck.maxRequestBytes: required")), "{e:?}");
        let e = errors(json!({"defaultProviders": {"accessLogging": ["nope"]}}));
        assert!(e.iter().any(|e| e.starts_with("spec.defaultProviders.accessLogging[0]")), "{e:?}");
        let e = errors(json!({"defaultConfig": {"holdApplicationUntilProxyStarts": true}}));
        assert!(e.iter().any(|e| e.starts_with("spec.defaultConfig.holdApplicationUntilProxyStarts")), "{e:?}");
        let e = errors(json!({"extensionProviders": [{"name": "a", "envoyExtAuthzHttp": {"service": "x.y", "port": 1, "headersToUpstreamOnAllow": ["*"]}}]}));
        assert!(e.iter().any(|e| e.starts_with("spec.extensionProviders[0].envoyExtAuthzHttp.headersToUpstreamOnAllow[0]")), "{e:?}");
    }

    /// Istio's OpenTelemetry tracer: gRPC (the samples' provider) and HTTP
    /// with every field Lodestar translates apply; what it does not
    /// translate is refused by name.
    #[test]
    fn opentelemetry_providers() {
        let v: serde_json::Value = yaml_serde::from_str(
            "extensionProviders:\n- {name: otel-tracing, opentelemetry: {port: 4317, service: opentelemetry-collector.observability.svc.cluster.local}}\n- name: otel-http\n  opentelemetry:\n    service: collector.observability.svc.cluster.local\n    port: 4318\n    maxTagLength: 64\n    http: {path: /v1/traces, timeout: 3s, headers: [{name: x-token, value: abc}]}\n    resourceDetectors: {environment: {}}\ndefaultProviders: {tracing: [otel-tracing]}\n",
        )
        .unwrap();
        assert_eq!(errors(v), Vec::<String>::new());
        let e = errors(json!({"extensionProviders": [{"name": "o", "opentelemetry": {
            "service": "c.o", "port": 4317, "dynatraceSampler": {"tenant": "t"},
            "resourceDetectors": {"dynatrace": {}},
            "http": {"path": "v1/traces", "timeout": "soon", "headers": [{"name": "x-a", "envName": "TOKEN"}, {"name": "x b", "value": "v"}, {"name": "x-c"}]},
        }}]}));
        let at = "spec.extensionProviders[0].opentelemetry.";
        for field in [
            "dynatraceSampler: Dynatrace's sampler is not translated",
            "resourceDetectors.dynatrace: Dynatrace's resource detector is not translated",
            "http.path: \"v1/traces\" must begin",
            "http.timeout",
            "http.headers[0].envName: reads istiod's own environment",
            "http.headers[1].name: \"x b\" is not an HTTP header name",
            "http.headers[2].value: required",
        ] {
            assert!(e.iter().any(|e| e.starts_with(&format!("{at}{field}"))), "{field}: {e:?}");
        }
        let e = errors(json!({"extensionProviders": [{"name": "o", "opentelemetry": {"service": "c.o", "port": 4317, "grpc": {}}}]}));
        assert!(e.iter().any(|e| e.contains("grpc")), "unknown field named: {e:?}");
    }
}
