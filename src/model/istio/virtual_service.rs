//! `VirtualService`: how requests for a set of hosts are routed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::{Destination, Labels, Percent, StringMatch};
use super::duration::Duration;
use super::host;
use super::validate::{
    check_duration, check_export_to, check_gateway_names, check_header_value, check_labels, check_percent_int, check_percentage, check_port, check_regex,
    check_string_match, is_header_token, is_prefix, EmptyMatch, Path, Report,
};

/// The mesh-internal gateway name: routes bound to it apply to sidecars.
pub const MESH_GATEWAY: &str = "mesh";

/// Prefix of header-match keys that match JWT claims instead of headers
/// (`@request.auth.claims.group` or `@request.auth.claims[group]`); only
/// gateways authenticate requests, so only they can use it.
const JWT_CLAIM_PREFIX: &str = "@request.auth.claims";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VirtualService {
    /// Hosts the routes apply to: DNS names (short names are relative to
    /// the config's namespace), wildcards, or IP addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Gateways (and/or `mesh`) the routes apply to; empty means `mesh`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpRoute>,
    /// Routes for TLS (HTTPS, TLS) ports, by SNI.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls: Vec<TlsRoute>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp: Vec<TcpRoute>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRoute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Conditions, OR-ed; empty matches every request.
    #[serde(rename = "match", default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpMatchRequest>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<HttpRouteDestination>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<HttpRedirect>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_response: Option<HttpDirectResponse>,
    /// Routes of another (host-less) VirtualService take this route's
    /// place, under its matches (`delegate::merge_routes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delegate: Option<Delegate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rewrite: Option<HttpRewrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<HttpRetry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<HttpFaultInjection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Destination>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<HttpMirrorPolicy>,
    /// Deprecated integer form of `mirrorPercentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_percentage: Option<Percent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors_policy: Option<CorsPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpMatchRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<StringMatch>,
    /// Header name (lower case) to match; an empty match tests presence.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_labels: Labels,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub query_params: BTreeMap<String, StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_uri_case: Option<bool>,
    /// Headers that must *not* match.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub without_headers: BTreeMap<String, StringMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stat_prefix: Option<String>,
}

impl HttpMatchRequest {
    /// Whether this match accepts every request (only a name, or nothing).
    fn matches_everything(&self) -> bool {
        self.uri.is_none()
            && self.scheme.is_none()
            && self.method.is_none()
            && self.authority.is_none()
            && self.headers.is_empty()
            && self.port.is_none()
            && self.source_labels.is_empty()
            && self.gateways.is_empty()
            && self.query_params.is_empty()
            && self.without_headers.is_empty()
            && self.source_namespace.is_none()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRouteDestination {
    pub destination: Destination,
    /// Share of traffic, 0..=100; with several destinations they sum to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Headers>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteDestination {
    pub destination: Destination,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
}

/// Header manipulation, applied before forwarding / before responding.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Headers {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<HeaderOperations>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<HeaderOperations>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderOperations {
    /// Overwrite.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub set: BTreeMap<String, String>,
    /// Append.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub add: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRedirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub derive_port: Option<RedirectPortSelection>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Defaults to 301.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_code: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_rewrite: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RedirectPortSelection {
    FromProtocolDefault,
    FromRequestPort,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpDirectResponse {
    #[serde(default, skip_serializing_if = "super::common::is_zero")]
    pub status: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<HttpBody>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub string: Option<String>,
    /// Base64, as protobuf JSON encodes `bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRewrite {
    /// Replaces the matched path prefix (or the whole path for exact matches).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RegexRewrite {
    #[serde(rename = "match", default, skip_serializing_if = "String::is_empty")]
    pub pattern: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rewrite: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpRetry {
    /// Retries (not counting the first try); 0 disables retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_try_timeout: Option<Duration>,
    /// Comma-separated Envoy retry policies and/or HTTP status codes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_on: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_remote_localities: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_ignore_previous_hosts: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CorsPolicy {
    /// Deprecated exact-match form of `allowOrigins`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origin: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<StringMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmatched_preflights: Option<UnmatchedPreflights>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UnmatchedPreflights {
    Unspecified,
    Forward,
    Ignore,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpFaultInjection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<Delay>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<Abort>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Delay {
    /// Deprecated integer form of `percentage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_delay: Option<Duration>,
    /// Parsed so Istio configs load, but rejected (as Istio does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponential_delay: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Abort {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc_status: Option<String>,
    /// Parsed so Istio configs load, but rejected (as Istio does).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http2_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpMirrorPolicy {
    pub destination: Destination,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Delegate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpRoute {
    #[serde(rename = "match", default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<L4MatchAttributes>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RouteDestination>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct L4MatchAttributes {
    /// IPs or CIDRs of the original destination.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_subnets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_subnet: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_labels: Labels,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsRoute {
    #[serde(rename = "match", default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<TlsMatchAttributes>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RouteDestination>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsMatchAttributes {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sni_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub destination_subnets: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub source_labels: Labels,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_namespace: Option<String>,
}

// ---------------------------------------------------------------------------
// Validation (after istio/istio pkg/config/validation: ValidateVirtualService
// and virtualservice.go).
// ---------------------------------------------------------------------------

/// Largest `directResponse` body accepted; every proxy keeps a copy.
const MAX_DIRECT_RESPONSE_BODY: usize = 1024 * 1024;
/// Above this, a body is accepted with a warning.
const LARGE_DIRECT_RESPONSE_BODY: usize = 100 * 1024;

/// Methods Istio accepts in `corsPolicy.allowMethods`.
const CORS_METHODS: [&str; 10] = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*"];

/// Envoy's `x-envoy-retry-on` and `x-envoy-retry-grpc-on` policies.
const RETRY_ON_POLICIES: [&str; 16] = [
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

/// gRPC status names accepted for `fault.abort.grpcStatus`, in code order
/// (a name's index is its code).
pub const GRPC_STATUSES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// HTTP status codes with a registered meaning (Go's `http.StatusText`),
/// which `retryOn` accepts besides the named policies.
fn is_known_http_status(code: u16) -> bool {
    matches!(code,
        100..=103 | 200..=208 | 226 | 300..=305 | 307 | 308 | 400..=418 | 421..=426 | 428 | 429
        | 431 | 451 | 500..=508 | 510 | 511)
}

impl VirtualService {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let hosts_at = at.field("hosts");
        // Istio's ValidateVirtualService: one without hosts is a delegate
        // (a child of a root's `delegate` route), which only has HTTP routes
        // and binds to no gateway (its root does).
        let is_delegate = self.hosts.is_empty();
        if is_delegate {
            if !self.gateways.is_empty() {
                r.error(&at.field("gateways"), "delegate virtual service must have no gateways specified");
            }
            if !self.tls.is_empty() {
                r.error(&at.field("tls"), "delegate virtual service must have no tls route specified");
            }
            if !self.tcp.is_empty() {
                r.error(&at.field("tcp"), "delegate virtual service must have no tcp route specified");
            }
            for (i, _) in self.http.iter().enumerate().filter(|(_, h)| h.delegate.is_some()) {
                r.error(&at.field("http").index(i).field("delegate"), "a delegate virtual service cannot delegate again (one level only)");
            }
        }

        // Like Istio: a VirtualService is bound to the mesh when it names no
        // gateways or names `mesh` among them.
        let bound_to_mesh = self.gateways.is_empty() || self.gateways.iter().any(|g| g == MESH_GATEWAY);
        check_gateway_names(r, &at.field("gateways"), &self.gateways);

        let mut all_hosts_valid = true;
        for (i, h) in self.hosts.iter().enumerate() {
            let host_at = hosts_at.index(i);
            if let Err(e) = host::check_wildcard_domain(h) {
                if !host::is_ip_address(h) {
                    r.error(&host_at, e);
                    all_hosts_valid = false;
                }
            } else if bound_to_mesh && h == "*" {
                r.error(&host_at, "wildcard host * is not allowed for virtual services bound to the mesh");
                all_hosts_valid = false;
            }
        }
        if all_hosts_valid {
            for (j, b) in self.hosts.iter().enumerate() {
                if let Some(a) = self.hosts[..j].iter().find(|a| host::hosts_overlap(a, b)) {
                    r.error(&hosts_at.index(j), format!("duplicate hosts in virtual service: {a} & {b}"));
                }
            }
        }

        if self.http.is_empty() && self.tcp.is_empty() && self.tls.is_empty() {
            r.error(at, "http, tcp or tls must be provided in virtual service");
        }
        let http_at = at.field("http");
        for (i, route) in self.http.iter().enumerate() {
            route.check(&http_at.index(i), r, bound_to_mesh);
        }
        warn_unreachable(r, &http_at, self.http.iter().map(|h| h.matches.is_empty() || h.matches.iter().any(HttpMatchRequest::matches_everything)));
        let tls_at = at.field("tls");
        for (i, route) in self.tls.iter().enumerate() {
            route.check(&tls_at.index(i), r, self);
        }
        let tcp_at = at.field("tcp");
        for (i, route) in self.tcp.iter().enumerate() {
            route.check(&tcp_at.index(i), r);
        }
        warn_unreachable(r, &tcp_at, self.tcp.iter().map(|t| t.matches.is_empty()));
        check_export_to(r, &at.field("exportTo"), &self.export_to, false);
    }
}

/// Routes are tried in order, so every route after one that matches all
/// traffic is dead. Istio warns rather than rejects; so do we.
fn warn_unreachable(r: &mut Report, at: &Path, catch_all: impl Iterator<Item = bool>) {
    let mut first_catch_all = None;
    for (i, is_catch_all) in catch_all.enumerate() {
        if let Some(earlier) = first_catch_all {
            r.warn(&at.index(i), format!("route is never used: route {earlier} before it matches all traffic"));
        } else if is_catch_all {
            first_catch_all = Some(i);
        }
    }
}

impl HttpRoute {
    fn check(&self, at: &Path, r: &mut Report, bound_to_mesh: bool) {
        self.check_actions(at, r);

        let match_at = at.field("match");
        for (i, m) in self.matches.iter().enumerate() {
            m.check(&match_at.index(i), r, bound_to_mesh);
        }
        if let Some(headers) = &self.headers {
            headers.check(&at.field("headers"), r);
        }
        if let Some(cors) = &self.cors_policy {
            cors.check(&at.field("corsPolicy"), r);
        }
        if let Some(fault) = &self.fault {
            fault.check(&at.field("fault"), r);
        }
        if let Some(percent) = self.mirror_percent {
            let percent_at = at.field("mirrorPercent");
            r.deprecated(&percent_at, "mirrorPercentage");
            if percent > 100 {
                r.error(&percent_at, format!("mirrorPercent {percent} must be at most 100"));
            }
        }
        if let Some(percentage) = &self.mirror_percentage {
            check_mirror_percentage(r, &at.field("mirrorPercentage"), percentage);
        }
        if let Some(mirror) = &self.mirror {
            mirror.check(&at.field("mirror"), r);
        }
        let mirrors_at = at.field("mirrors");
        for (i, mirror) in self.mirrors.iter().enumerate() {
            let mirror_at = mirrors_at.index(i);
            mirror.destination.check(&mirror_at.field("destination"), r);
            if let Some(percentage) = &mirror.percentage {
                check_mirror_percentage(r, &mirror_at.field("percentage"), percentage);
            }
        }
        if let Some(redirect) = &self.redirect {
            redirect.check(&at.field("redirect"), r, &self.matches);
        }
        if let Some(direct) = &self.direct_response {
            direct.check(&at.field("directResponse"), r);
        }
        if let Some(retries) = &self.retries {
            retries.check(&at.field("retries"), r);
        }
        if let Some(rewrite) = &self.rewrite {
            rewrite.check(&at.field("rewrite"), r);
        }
        self.check_authority_rewrite(at, r);

        let route_at = at.field("route");
        for (i, destination) in self.route.iter().enumerate() {
            let dest_at = route_at.index(i);
            destination.destination.check(&dest_at.field("destination"), r);
            if let Some(headers) = &destination.headers {
                headers.check(&dest_at.field("headers"), r);
            }
        }
        check_weights(r, &route_at, self.route.iter().map(|d| d.weight));
        if let Some(timeout) = &self.timeout {
            check_duration(r, &at.field("timeout"), timeout);
        }
    }

    /// A route does exactly one thing: forward, redirect or respond.
    fn check_actions(&self, at: &Path, r: &mut Report) {
        // Istio's validateHTTPRouteConflict: a delegating route only
        // delegates (the child's routes do the rest).
        if let Some(delegate) = &self.delegate {
            let delegate_at = at.field("delegate");
            if delegate.name.as_deref().is_none_or(str::is_empty) {
                r.error(&delegate_at.field("name"), "delegate name is required");
            }
            if let Some(ns) = delegate.namespace.as_deref().filter(|ns| !host::is_dns1123_label(ns) || ns.bytes().any(|b| b.is_ascii_uppercase())) {
                r.error(&delegate_at.field("namespace"), format!("invalid namespace {ns:?}"));
            }
            for (field, set) in [("route", !self.route.is_empty()), ("redirect", self.redirect.is_some()), ("directResponse", self.direct_response.is_some())] {
                if set {
                    r.error(&at.field(field), format!("HTTP route cannot contain both {field} and delegate"));
                }
            }
            return;
        }
        let exclusive_with = |r: &mut Report, action: &str, action_at: &Path| {
            if !self.route.is_empty() {
                r.error(action_at, format!("HTTP route cannot contain both route and {action}"));
            }
            if self.fault.is_some() {
                r.error(action_at, format!("HTTP route cannot contain both fault and {action}"));
            }
            if self.rewrite.is_some() {
                r.error(action_at, format!("HTTP route cannot contain both rewrite and {action}"));
            }
        };
        if self.redirect.is_some() {
            let redirect_at = at.field("redirect");
            exclusive_with(r, "redirect", &redirect_at);
            if self.direct_response.is_some() {
                r.error(&redirect_at, "HTTP route cannot contain both directResponse and redirect");
            }
        } else if self.direct_response.is_some() {
            exclusive_with(r, "directResponse", &at.field("directResponse"));
        } else if self.route.is_empty() && self.delegate.is_none() {
            r.error(&at.field("route"), "HTTP route must have route, redirect or directResponse");
        }
        if self.mirror.is_some() && !self.mirrors.is_empty() {
            r.error(&at.field("mirrors"), "HTTP route cannot contain both mirror and mirrors");
        }
    }

    /// The authority may be rewritten in one place only, or the result
    /// would depend on Envoy's order of operations.
    fn check_authority_rewrite(&self, at: &Path, r: &mut Report) {
        let mut sources = Vec::new();
        if let Some(authority) = self.rewrite.as_ref().and_then(|rw| rw.authority.as_ref()) {
            sources.push(authority.clone());
        }
        if let Some(request) = self.headers.as_ref().and_then(|h| h.request.as_ref()) {
            for (name, value) in request.set.iter().chain(&request.add) {
                if is_authority_header(name) {
                    sources.push(value.clone());
                }
            }
        }
        if sources.len() > 1 {
            r.error(at, format!("authority header cannot be set multiple times: {}", sources.join(", ")));
        }
    }
}

fn check_mirror_percentage(r: &mut Report, at: &Path, percentage: &Percent) {
    let value = percentage.get();
    if !(0.0..=100.0).contains(&value) {
        r.error(&at.field("value"), format!("mirror percentage {value} must be in the range 0..=100"));
    }
}

/// Weights are each in `0..=100`; once any is given they must add up to
/// 100 (Istio itself normalises other sums, but a sum other than 100 is
/// almost always an editing mistake), and several destinations need
/// weights to split traffic at all.
fn check_weights(r: &mut Report, route_at: &Path, weights: impl Iterator<Item = Option<i32>>) {
    let mut count = 0;
    let mut total: i64 = 0;
    let mut any_set = false;
    let mut all_in_range = true;
    for (i, weight) in weights.enumerate() {
        count += 1;
        if let Some(w) = weight {
            any_set = true;
            total += i64::from(w);
            if !(0..=100).contains(&w) {
                all_in_range = false;
                r.error(&route_at.index(i).field("weight"), format!("weight {w} must be in the range 0..=100"));
            }
        }
    }
    if !all_in_range {
        return;
    }
    if any_set && total != 100 {
        r.error(route_at, format!("destination weights sum to {total}, they must sum to 100"));
    } else if !any_set && count > 1 {
        r.error(route_at, "total destination weight = 0: with several destinations, give each a weight, summing to 100");
    }
}

impl HttpMatchRequest {
    fn check(&self, at: &Path, r: &mut Report, bound_to_mesh: bool) {
        // Envoy's path matcher accepts an empty prefix (it matches all
        // paths); its scheme/method/authority matchers do not.
        if let Some(uri) = &self.uri {
            check_string_match(r, &at.field("uri"), uri, EmptyMatch::Suspicious, true);
        }
        for (name, m) in [("scheme", &self.scheme), ("method", &self.method), ("authority", &self.authority)] {
            if let Some(m) = m {
                check_string_match(r, &at.field(name), m, EmptyMatch::Suspicious, false);
            }
        }
        for (field, map) in [("headers", &self.headers), ("withoutHeaders", &self.without_headers)] {
            let map_at = at.field(field);
            for (name, m) in map {
                let entry_at = map_at.key(name);
                if let Some(claim) = name.strip_prefix(JWT_CLAIM_PREFIX) {
                    let well_formed = match claim.strip_prefix('[') {
                        Some(bracketed) => bracketed.len() > 1 && bracketed.ends_with(']'),
                        None => claim.len() > 1 && claim.starts_with('.'),
                    };
                    if !well_formed {
                        r.error(&entry_at, format!("{name:?} is not a valid JWT claim; use @request.auth.claims.NAME or @request.auth.claims[NAME]"));
                    }
                    if bound_to_mesh {
                        r.error(&entry_at, "JWT claim based routing is only supported for gateways (not the mesh)");
                    }
                } else if !is_header_token(name) && !is_pseudo_header(name) {
                    r.error(&entry_at, format!("{name:?} is not a valid header name"));
                }
                // In withoutHeaders, `regex: "*"` is Istio's spelling of
                // "header absent", not an RE2 pattern.
                if !(field == "withoutHeaders" && m.regex.as_deref() == Some("*")) {
                    check_string_match(r, &entry_at, m, EmptyMatch::Presence, false);
                }
            }
        }
        let params_at = at.field("queryParams");
        for (name, m) in &self.query_params {
            check_string_match(r, &params_at.key(name), m, EmptyMatch::Presence, false);
        }
        if let Some(port) = self.port {
            check_port(r, &at.field("port"), port);
        }
        check_labels(r, &at.field("sourceLabels"), &self.source_labels);
        check_gateway_names(r, &at.field("gateways"), &self.gateways);
        if let Some(ns) = &self.source_namespace {
            if !host::is_dns1123_label(ns) {
                r.error(&at.field("sourceNamespace"), format!("sourceNamespace {ns:?} is not a valid namespace name"));
            }
        }
        r.ignored_if(self.stat_prefix.is_some(), &at.field("statPrefix"));
    }
}

fn is_pseudo_header(name: &str) -> bool {
    matches!(name, ":method" | ":scheme" | ":authority" | ":path" | ":status")
}

fn is_authority_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host")
}

impl Headers {
    fn check(&self, at: &Path, r: &mut Report) {
        if let Some(request) = &self.request {
            // Requests may rewrite the authority through `:authority`/`host`;
            // other pseudo-headers are Envoy's own.
            request.check(&at.field("request"), r, |name| {
                if name.starts_with(':') && !is_authority_header(name) {
                    Err(format!("invalid header {name:?}: header cannot have \":\" prefix"))
                } else {
                    Ok(())
                }
            });
        }
        if let Some(response) = &self.response {
            response.check(&at.field("response"), r, check_modifiable_header);
        }
    }
}

/// Headers that may be removed from requests or changed on responses.
fn check_modifiable_header(name: &str) -> Result<(), String> {
    if name.eq_ignore_ascii_case("host") {
        Err(format!("invalid header {name:?}: cannot set Host header"))
    } else if name.starts_with(':') {
        Err(format!("invalid header {name:?}: header cannot have \":\" prefix"))
    } else {
        Ok(())
    }
}

impl HeaderOperations {
    fn check(&self, at: &Path, r: &mut Report, check_settable: fn(&str) -> Result<(), String>) {
        for (field, map) in [("set", &self.set), ("add", &self.add)] {
            let map_at = at.field(field);
            for (name, value) in map {
                let entry_at = map_at.key(name);
                if name.is_empty() {
                    r.error(&entry_at, "header name cannot be empty");
                }
                r.check(&entry_at, check_settable(name));
                r.check(&entry_at, check_header_value(value));
            }
        }
        let remove_at = at.field("remove");
        for (i, name) in self.remove.iter().enumerate() {
            if name.is_empty() {
                r.error(&remove_at.index(i), "header name cannot be empty");
            }
            r.check(&remove_at.index(i), check_modifiable_header(name));
        }
    }
}

impl CorsPolicy {
    fn check(&self, at: &Path, r: &mut Report) {
        if !self.allow_origin.is_empty() {
            r.deprecated(&at.field("allowOrigin"), "allowOrigins");
        }
        let origins_at = at.field("allowOrigins");
        for (i, origin) in self.allow_origins.iter().enumerate() {
            let origin_at = origins_at.index(i);
            let value = origin.kind().map(|k| match k {
                super::common::MatchKind::Exact(v) | super::common::MatchKind::Prefix(v) | super::common::MatchKind::Regex(v) => v,
            });
            if origin.count_set() != 1 || value.is_none_or(str::is_empty) {
                r.error(&origin_at, "allowOrigins entries need exactly one non-empty exact, prefix or regex");
            } else if let Some(re) = &origin.regex {
                check_regex(r, &origin_at.field("regex"), re);
            }
        }
        let methods_at = at.field("allowMethods");
        for (i, method) in self.allow_methods.iter().enumerate() {
            if !CORS_METHODS.contains(&method.as_str()) {
                r.error(&methods_at.index(i), format!("{method:?} is not a supported HTTP method"));
            }
        }
        for (field, names) in [("allowHeaders", &self.allow_headers), ("exposeHeaders", &self.expose_headers)] {
            let names_at = at.field(field);
            for (i, name) in names.iter().enumerate() {
                if name != "*" && !is_header_token(name) {
                    r.error(&names_at.index(i), format!("{name:?} is not a valid header name"));
                }
            }
        }
        if let Some(max_age) = &self.max_age {
            let max_age_at = at.field("maxAge");
            check_duration(r, &max_age_at, max_age);
            // The Access-Control-Max-Age header carries whole seconds.
            if max_age.to_std().is_ok_and(|d| d.subsec_nanos() != 0) {
                r.error(&max_age_at, "maxAge is accurate only to seconds precision");
            }
        }
    }
}

impl HttpFaultInjection {
    fn check(&self, at: &Path, r: &mut Report) {
        if self.abort.is_none() && self.delay.is_none() {
            r.error(at, "HTTP fault injection must have an abort and/or a delay");
        }
        if let Some(abort) = &self.abort {
            abort.check(&at.field("abort"), r);
        }
        if let Some(delay) = &self.delay {
            delay.check(&at.field("delay"), r);
        }
    }
}

impl Abort {
    fn check(&self, at: &Path, r: &mut Report) {
        if let Some(percentage) = &self.percentage {
            check_percentage(r, &at.field("percentage"), percentage);
        }
        let set = [self.http_status.is_some(), self.grpc_status.is_some(), self.http2_error.is_some()].iter().filter(|s| **s).count();
        if set > 1 {
            r.error(at, "only one of httpStatus, grpcStatus or http2Error may be set");
        }
        if set == 0 {
            r.warn(at, "abort configured, but error type not set");
        }
        if let Some(status) = self.http_status {
            if !(200..=599).contains(&status) {
                r.error(&at.field("httpStatus"), format!("HTTP status {status} is not in range 200..=599"));
            }
        }
        if let Some(status) = &self.grpc_status {
            if !GRPC_STATUSES.contains(&status.as_str()) {
                r.error(&at.field("grpcStatus"), format!("gRPC status {status:?} is not supported; use a code name such as NOT_FOUND"));
            }
        }
        if self.http2_error.is_some() {
            r.unsupported(&at.field("http2Error"), "HTTP/2 abort faults");
        }
    }
}

/// The numeric gRPC status code of a `grpcStatus` name (validated names only).
pub fn grpc_status_code(name: &str) -> Option<u32> {
    GRPC_STATUSES.iter().position(|s| *s == name).map(|i| i as u32)
}

impl Delay {
    fn check(&self, at: &Path, r: &mut Report) {
        if let Some(percent) = self.percent {
            let percent_at = at.field("percent");
            r.deprecated(&percent_at, "percentage");
            check_percent_int(r, &percent_at, percent);
        }
        if let Some(percentage) = &self.percentage {
            check_percentage(r, &at.field("percentage"), percentage);
        }
        match (&self.fixed_delay, &self.exponential_delay) {
            (Some(fixed), None) => check_duration(r, &at.field("fixedDelay"), fixed),
            (None, None) => r.error(&at.field("fixedDelay"), "delay needs a fixedDelay"),
            (_, Some(_)) => {
                if self.fixed_delay.is_some() {
                    r.error(at, "only one of fixedDelay or exponentialDelay may be set");
                }
                r.unsupported(&at.field("exponentialDelay"), "exponential delays");
            }
        }
    }
}

impl HttpRedirect {
    fn check(&self, at: &Path, r: &mut Report, matches: &[HttpMatchRequest]) {
        if self.uri.is_some() && self.prefix_rewrite.is_some() {
            r.error(at, "redirect may only specify one of uri or prefixRewrite");
        }
        if self.prefix_rewrite.is_some() {
            r.ignored(&at.field("prefixRewrite"));
            if matches.iter().any(|m| m.uri.as_ref().is_some_and(|u| !is_prefix(u))) {
                r.error(&at.field("prefixRewrite"), "redirect prefixRewrite requires all URI matches to use prefix match type");
            }
        }
        if self.uri.is_none()
            && self.prefix_rewrite.is_none()
            && self.authority.is_none()
            && self.port.is_none()
            && self.derive_port.is_none()
            && self.scheme.is_none()
        {
            r.error(at, "redirect must specify uri, prefixRewrite, authority, scheme or port");
        }
        if let Some(code) = self.redirect_code {
            if !(300..=399).contains(&code) {
                r.error(&at.field("redirectCode"), format!("{code} is not a valid redirect code, must be in the range 300..=399"));
            }
        }
        if let Some(scheme) = &self.scheme {
            if scheme != "http" && scheme != "https" {
                r.error(&at.field("scheme"), "invalid redirect scheme, must be \"http\" or \"https\"");
            }
        }
        if let Some(port) = self.port {
            check_port(r, &at.field("port"), port);
        }
        if self.port.is_some() && self.derive_port.is_some() {
            r.error(at, "only one of port or derivePort may be set");
        }
        r.ignored_if(self.derive_port.is_some(), &at.field("derivePort"));
    }
}

impl HttpDirectResponse {
    fn check(&self, at: &Path, r: &mut Report) {
        if !(200..=599).contains(&self.status) {
            r.error(&at.field("status"), format!("HTTP status {} is not in range 200..=599", self.status));
        }
        let Some(body) = &self.body else {
            return;
        };
        let body_at = at.field("body");
        let size = match (&body.string, &body.bytes) {
            (Some(_), Some(_)) => {
                r.error(&body_at, "only one of string or bytes may be set");
                return;
            }
            (Some(s), None) => s.len(),
            // Base64 carries three bytes in every four characters.
            (None, Some(b)) => b.len() / 4 * 3,
            (None, None) => 0,
        };
        if size > MAX_DIRECT_RESPONSE_BODY {
            r.error(&body_at, "direct response body must be less than 1MB");
        } else if size > LARGE_DIRECT_RESPONSE_BODY {
            r.warn(&body_at, "large direct responses may impact control plane performance");
        }
    }
}

impl HttpRetry {
    fn check(&self, at: &Path, r: &mut Report) {
        // Protobuf's default makes a missing `attempts` mean 0, i.e. retries
        // disabled, so any other retry setting is then a mistake (Istio
        // rejects it the same way).
        let attempts = self.attempts.unwrap_or(0);
        if attempts < 0 {
            r.error(&at.field("attempts"), "attempts cannot be negative");
        } else if attempts == 0 && (self.per_try_timeout.is_some() || self.retry_on.is_some() || self.retry_remote_localities.is_some()) {
            r.error(&at.field("attempts"), "http retry policy configured when attempts are set to 0 (disabled)");
        }
        if let Some(timeout) = &self.per_try_timeout {
            check_duration(r, &at.field("perTryTimeout"), timeout);
        }
        if let Some(retry_on) = &self.retry_on {
            for policy in retry_on.split(',') {
                let known = RETRY_ON_POLICIES.contains(&policy) || policy.parse::<u16>().is_ok_and(is_known_http_status);
                if !known {
                    r.error(&at.field("retryOn"), format!("{policy:?} is not a valid retryOn policy"));
                }
            }
        }
        if let Some(backoff) = &self.backoff {
            check_duration(r, &at.field("backoff"), backoff);
        }
        r.ignored_if(self.retry_ignore_previous_hosts.is_some(), &at.field("retryIgnorePreviousHosts"));
    }
}

impl HttpRewrite {
    fn check(&self, at: &Path, r: &mut Report) {
        if self.uri.is_some() && self.uri_regex_rewrite.is_some() {
            r.error(at, "rewrite may only contain one of uri or uriRegexRewrite");
        }
        if self.uri.is_none() && self.uri_regex_rewrite.is_none() && self.authority.is_none() {
            r.error(at, "rewrite must specify at least one of uri, uriRegexRewrite or authority");
        }
        if let Some(regex_rewrite) = &self.uri_regex_rewrite {
            let rewrite_at = at.field("uriRegexRewrite");
            r.ignored(&rewrite_at);
            if regex_rewrite.pattern.is_empty() || regex_rewrite.rewrite.is_empty() {
                r.error(&rewrite_at, "uriRegexRewrite requires both match and rewrite");
            } else {
                check_regex(r, &rewrite_at.field("match"), &regex_rewrite.pattern);
            }
        }
    }
}

/// The fields TCP and TLS matches share (Istio's validateTCPMatch and the
/// tail of validateTLSMatch).
fn check_l4_match(r: &mut Report, m_at: &Path, destination_subnets: &[String], port: Option<u32>, source_labels: &Labels, gateways: &[String]) {
    let subnets_at = m_at.field("destinationSubnets");
    for (j, subnet) in destination_subnets.iter().enumerate() {
        r.check(&subnets_at.index(j), host::check_ip_subnet(subnet));
    }
    if let Some(port) = port {
        check_port(r, &m_at.field("port"), port);
    }
    check_labels(r, &m_at.field("sourceLabels"), source_labels);
    check_gateway_names(r, &m_at.field("gateways"), gateways);
}

/// A route's destinations (Istio's validateRouteDestinations).
fn check_route_destinations(r: &mut Report, route_at: &Path, route: &[RouteDestination], what: &str) {
    if route.is_empty() {
        r.error(route_at, format!("{what} route is required"));
    }
    for (i, destination) in route.iter().enumerate() {
        destination.destination.check(&route_at.index(i).field("destination"), r);
    }
    check_weights(r, route_at, route.iter().map(|d| d.weight));
}

impl TcpRoute {
    /// Istio's validateTCPRoute.
    fn check(&self, at: &Path, r: &mut Report) {
        let match_at = at.field("match");
        for (i, m) in self.matches.iter().enumerate() {
            let m_at = match_at.index(i);
            check_l4_match(r, &m_at, &m.destination_subnets, m.port, &m.source_labels, &m.gateways);
            r.ignored_if(m.source_subnet.is_some(), &m_at.field("sourceSubnet"));
            r.ignored_if(m.source_namespace.is_some(), &m_at.field("sourceNamespace"));
        }
        check_route_destinations(r, &at.field("route"), &self.route, "TCP");
    }
}

impl TlsRoute {
    /// Istio's validateTLSRoute and validateTLSMatch: every match names SNI
    /// hosts, each within the VirtualService's hosts.
    fn check(&self, at: &Path, r: &mut Report, vs: &VirtualService) {
        let match_at = at.field("match");
        if self.matches.is_empty() {
            r.error(&match_at, "TLS route must have at least one match condition");
        }
        for (i, m) in self.matches.iter().enumerate() {
            let m_at = match_at.index(i);
            let sni_at = m_at.field("sniHosts");
            if m.sni_hosts.is_empty() {
                r.error(&sni_at, "TLS match must have at least one SNI host");
            }
            for (j, sni) in m.sni_hosts.iter().enumerate() {
                let host_at = sni_at.index(j);
                if let Err(e) = host::check_wildcard_domain(sni) {
                    if host::is_ip_address(sni) {
                        r.warn(&host_at, format!("using an IP address ({sni:?}) goes against the SNI spec and most clients do not support this"));
                    } else {
                        r.error(&host_at, e);
                    }
                } else if !vs.hosts.iter().any(|h| host::host_matches(h, sni)) {
                    r.error(&host_at, format!("SNI host {sni:?} is not a compatible subset of any of the virtual service hosts: [{}]", vs.hosts.join(", ")));
                }
            }
            check_l4_match(r, &m_at, &m.destination_subnets, m.port, &m.source_labels, &m.gateways);
            r.ignored_if(m.source_namespace.is_some(), &m_at.field("sourceNamespace"));
        }
        check_route_destinations(r, &at.field("route"), &self.route, "TLS");
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError, Validated};
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("VirtualService", &spec).expect_err("spec should be invalid")
    }

    fn has(errors: &[FieldError], field: &str, reason: &str) -> bool {
        errors.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    fn route_to(host: &str) -> Value {
        json!([{"destination": {"host": host}}])
    }

    #[test]
    fn minimal_route_is_valid_and_round_trips() {
        let spec = json!({"hosts": ["reviews"], "http": [{"route": route_to("reviews")}]});
        let validated = validate("VirtualService", &spec).unwrap();
        assert!(matches!(validated, Validated::VirtualService { .. }));
        assert!(validated.warnings().is_empty());
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn needs_routes() {
        let e = errors(json!({}));
        assert!(has(&e, "spec", "http, tcp or tls must be provided"));
    }

    #[test]
    fn delegation() {
        let root = json!({"hosts": ["bookinfo.example.com"], "gateways": ["gw"], "http": [
            {"match": [{"uri": {"prefix": "/reviews"}}], "delegate": {"name": "reviews", "namespace": "team-a"}}]});
        assert!(validate("VirtualService", &root).is_ok());
        let child = json!({"http": [{"match": [{"uri": {"prefix": "/reviews/v2"}}], "route": route_to("reviews")}]});
        assert!(validate("VirtualService", &child).is_ok());
        let e = errors(json!({"hosts": ["r"], "http": [{"delegate": {"namespace": "Team"}, "route": route_to("r")}]}));
        assert!(has(&e, "spec.http[0].delegate.name", "required"), "{e:?}");
        assert!(has(&e, "spec.http[0].delegate.namespace", "invalid namespace"), "{e:?}");
        assert!(has(&e, "spec.http[0].route", "both route and delegate"), "{e:?}");
        let e = errors(json!({"gateways": ["gw"], "tcp": [{"route": route_to("r")}], "http": [{"delegate": {"name": "x"}}]}));
        assert!(has(&e, "spec.gateways", "must have no gateways"), "{e:?}");
        assert!(has(&e, "spec.tcp", "must have no tcp route"), "{e:?}");
        assert!(has(&e, "spec.http[0].delegate", "one level only"), "{e:?}");
    }

    #[test]
    fn weights_must_sum_to_100() {
        let e = errors(json!({"hosts": ["r"], "http": [{"route": [
            {"destination": {"host": "r", "subset": "v1"}, "weight": 70},
            {"destination": {"host": "r", "subset": "v2"}, "weight": 20}
        ]}]}));
        assert!(has(&e, "spec.http[0].route", "sum to 90"), "{e:?}");
        let e = errors(json!({"hosts": ["r"], "http": [{"route": [
            {"destination": {"host": "r"}, "weight": 120},
            {"destination": {"host": "r"}, "weight": -20}
        ]}]}));
        assert!(has(&e, "spec.http[0].route[0].weight", "0..=100"), "{e:?}");
        assert!(has(&e, "spec.http[0].route[1].weight", "0..=100"), "{e:?}");
        let e = errors(json!({"hosts": ["r"], "tcp": [{"route": [
            {"destination": {"host": "a"}}, {"destination": {"host": "b"}}
        ]}]}));
        assert!(has(&e, "spec.tcp[0].route", "total destination weight = 0"), "{e:?}");
    }

    #[test]
    fn single_unweighted_destination_is_fine() {
        let spec = json!({"hosts": ["r"], "tcp": [{"route": route_to("r")}]});
        assert!(validate("VirtualService", &spec).is_ok());
    }

    #[test]
    fn redirect_excludes_route_fault_and_rewrite() {
        let e = errors(json!({"hosts": ["r"], "http": [{
            "redirect": {"uri": "/new"},
            "route": route_to("r"),
            "rewrite": {"uri": "/x"},
            "fault": {"abort": {"httpStatus": 500}}
        }]}));
        for what in ["route and redirect", "fault and redirect", "rewrite and redirect"] {
            assert!(has(&e, "spec.http[0].redirect", what), "{what}: {e:?}");
        }
    }

    #[test]
    fn mesh_bound_wildcard_and_duplicate_hosts() {
        let e = errors(json!({"hosts": ["*"], "http": [{"route": route_to("r")}]}));
        assert!(has(&e, "spec.hosts[0]", "not allowed"));
        let ok = json!({"hosts": ["*"], "gateways": ["ingress"], "http": [{"route": route_to("r")}]});
        assert!(validate("VirtualService", &ok).is_ok());
        let e = errors(json!({"hosts": ["*.example.com", "a.example.com"], "http": [{"route": route_to("r")}]}));
        assert!(has(&e, "spec.hosts[1]", "duplicate hosts"));
    }

    #[test]
    fn jwt_claim_routing_only_on_gateways() {
        let spec = |gateways: Value| {
            json!({"hosts": ["a.example.com"], "gateways": gateways, "http": [{
                "match": [{"headers": {"@request.auth.claims.group": {"exact": "admin"}}}],
                "route": route_to("r")
            }]})
        };
        assert!(validate("VirtualService", &spec(json!(["istio-system/ingress"]))).is_ok());
        let bracketed = json!({"hosts": ["a.example.com"], "gateways": ["ingress"], "http": [{
            "match": [{"headers": {"@request.auth.claims[groups]": {"exact": "admin"}, "@request.auth.claims": {}}}],
            "route": route_to("r")
        }]});
        let e = errors(bracketed);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(has(&e, "spec.http[0].match[0].headers[\"@request.auth.claims\"]", "not a valid JWT claim"), "{e:?}");
        let e = errors(spec(json!(["mesh"])));
        assert!(has(&e, "spec.http[0].match[0].headers[\"@request.auth.claims.group\"]", "only supported for gateways"), "{e:?}");
    }

    #[test]
    fn string_matches() {
        let e = errors(json!({"hosts": ["r"], "http": [{
            "match": [{
                "uri": {"exact": "/a", "prefix": "/b"},
                "method": {"prefix": ""},
                "headers": {"bad header": {"exact": "x"}, "x-re": {"regex": "(a"}}
            }],
            "route": route_to("r")
        }]}));
        assert!(has(&e, "spec.http[0].match[0].uri", "only one of"), "{e:?}");
        assert!(has(&e, "spec.http[0].match[0].method.prefix", "should not be empty"), "{e:?}");
        assert!(has(&e, "spec.http[0].match[0].headers[\"bad header\"]", "not a valid header name"), "{e:?}");
        assert!(has(&e, "spec.http[0].match[0].headers[\"x-re\"].regex", "invalid regex"), "{e:?}");
    }

    #[test]
    fn header_presence_and_absence_matches_are_valid() {
        let spec = json!({"hosts": ["r"], "http": [{
            "match": [{"headers": {"x-canary": {}}, "withoutHeaders": {"x-debug": {"regex": "*"}}, "uri": {"prefix": ""}}],
            "route": route_to("r")
        }]});
        let validated = validate("VirtualService", &spec).unwrap();
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn retries_with_zero_attempts_are_rejected() {
        let e = errors(json!({"hosts": ["r"], "http": [{"route": route_to("r"), "retries": {"perTryTimeout": "2s"}}]}));
        assert!(has(&e, "spec.http[0].retries.attempts", "set to 0"), "{e:?}");
        let e = errors(json!({"hosts": ["r"], "http": [{"route": route_to("r"), "retries": {"attempts": 3, "retryOn": "5xx,bogus,503"}}]}));
        assert!(has(&e, "spec.http[0].retries.retryOn", "\"bogus\""), "{e:?}");
        assert_eq!(e.len(), 1, "{e:?}");
    }

    #[test]
    fn header_operations() {
        let e = errors(json!({"hosts": ["r"], "http": [{
            "route": route_to("r"),
            "headers": {
                "request": {"set": {":path": "/x", "x-ok": "%BAD"}, "remove": ["host"]},
                "response": {"add": {"Host": "x"}}
            }
        }]}));
        assert!(has(&e, "spec.http[0].headers.request.set[\":path\"]", "cannot have"), "{e:?}");
        assert!(has(&e, "spec.http[0].headers.request.set[\"x-ok\"]", "variable"), "{e:?}");
        assert!(has(&e, "spec.http[0].headers.request.remove[0]", "Host"), "{e:?}");
        assert!(has(&e, "spec.http[0].headers.response.add.Host", "Host"), "{e:?}");
    }

    #[test]
    fn authority_rewritten_twice() {
        let e = errors(json!({"hosts": ["r"], "http": [{
            "route": route_to("r"),
            "rewrite": {"authority": "a.example.com"},
            "headers": {"request": {"set": {":authority": "b.example.com"}}}
        }]}));
        assert!(has(&e, "spec.http[0]", "authority header cannot be set multiple times"), "{e:?}");
    }

    #[test]
    fn unreachable_routes_warn() {
        let spec = json!({"hosts": ["r"], "http": [
            {"route": route_to("r")},
            {"match": [{"uri": {"prefix": "/a"}}], "route": route_to("r")}
        ]});
        let validated = validate("VirtualService", &spec).unwrap();
        assert_eq!(validated.warnings().len(), 1);
        assert!(validated.warnings()[0].starts_with("spec.http[1]: route is never used"));
    }

    #[test]
    fn deprecated_and_ignored_fields_warn() {
        let spec = json!({"hosts": ["r"], "http": [{
            "route": route_to("r"),
            "mirror": {"host": "m"},
            "mirrorPercent": 5,
            "retries": {"attempts": 2, "retryIgnorePreviousHosts": true}
        }]});
        let validated = validate("VirtualService", &spec).unwrap();
        let warnings = validated.warnings();
        assert!(warnings.iter().any(|w| w.starts_with("spec.http[0].mirrorPercent: deprecated")), "{warnings:?}");
        assert!(warnings.iter().any(|w| w.starts_with("spec.http[0].retries.retryIgnorePreviousHosts: accepted but")), "{warnings:?}");
    }

    #[test]
    fn tls_routes_need_sni_hosts_within_the_hosts() {
        let ok = json!({"hosts": ["*.example.com"], "tls": [{"match": [{"sniHosts": ["a.example.com"], "port": 443}], "route": [
            {"destination": {"host": "a"}, "weight": 75}, {"destination": {"host": "b"}, "weight": 25}]}]});
        assert!(validate("VirtualService", &ok).is_ok());
        let e = errors(json!({"hosts": ["r"], "tls": [{"match": [{"sniHosts": ["other"]}, {"port": 443}], "route": route_to("r")}, {"route": route_to("r")}]}));
        assert!(has(&e, "spec.tls[0].match[0].sniHosts[0]", "not a compatible subset"), "{e:?}");
        assert!(has(&e, "spec.tls[0].match[1].sniHosts", "at least one SNI host"), "{e:?}");
        assert!(has(&e, "spec.tls[1].match", "at least one match condition"), "{e:?}");
    }

    #[test]
    fn fault_checks() {
        let e = errors(json!({"hosts": ["r"], "http": [{
            "route": route_to("r"),
            "fault": {
                "abort": {"httpStatus": 700, "percentage": {"value": 101}},
                "delay": {"fixedDelay": "0.5ms", "percentage": {"value": 10}}
            }
        }]}));
        assert!(has(&e, "spec.http[0].fault.abort.httpStatus", "200..=599"), "{e:?}");
        assert!(has(&e, "spec.http[0].fault.abort.percentage.value", "101"), "{e:?}");
        assert!(has(&e, "spec.http[0].fault.delay.fixedDelay", "at least 1ms"), "{e:?}");
        let e = errors(json!({"hosts": ["r"], "http": [{"route": route_to("r"), "fault": {}}]}));
        assert!(has(&e, "spec.http[0].fault", "abort and/or a delay"));
    }

    #[test]
    fn cors_checks() {
        let e = errors(json!({"hosts": ["r"], "http": [{
            "route": route_to("r"),
            "corsPolicy": {
                "allowOrigins": [{"exact": ""}, {"regex": "https://.*\\.example\\.com"}],
                "allowMethods": ["GET", "FETCH"],
                "allowHeaders": ["x-ok", "bad header"],
                "maxAge": "1.5s"
            }
        }]}));
        assert!(has(&e, "spec.http[0].corsPolicy.allowOrigins[0]", "exactly one non-empty"), "{e:?}");
        assert!(has(&e, "spec.http[0].corsPolicy.allowMethods[1]", "FETCH"), "{e:?}");
        assert!(has(&e, "spec.http[0].corsPolicy.allowHeaders[1]", "not a valid header"), "{e:?}");
        assert!(has(&e, "spec.http[0].corsPolicy.maxAge", "seconds precision"), "{e:?}");
        assert_eq!(e.len(), 4, "{e:?}");
    }
}
