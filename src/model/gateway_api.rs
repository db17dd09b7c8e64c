//! The Kubernetes Gateway API (`gateway.networking.k8s.io`, standard
//! channel): GatewayClass, Gateway, HTTPRoute, GRPCRoute, ReferenceGrant,
//! BackendTLSPolicy, ListenerSet, and the experimental channel's TCPRoute
//! and TLSRoute, typed,
//! with the checks of the CRDs' OpenAPI schema and CEL rules that matter
//! (required fields, enums, hostname and path formats, ranges, list
//! lengths), each error naming its field (`spec.rules[0].matches[1].path`).
//!
//! Fields Lodestar does not act on yet (session persistence,
//! infrastructure, TLS options) are accepted as written so that upstream
//! manifests apply unchanged; status says what is not supported. Translation into the Istio model and status are
//! `translate::gateway_api`.

use crate::error::FieldError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

pub const GROUP: &str = "gateway.networking.k8s.io";
/// The `controllerName` a GatewayClass names for Lodestar to serve it.
pub const CONTROLLER_NAME: &str = "lodestar.dev/gateway-controller";
/// Istio's, accepted too so that Istio manifests apply unchanged.
pub const ISTIO_CONTROLLER_NAME: &str = "istio.io/gateway-controller";

/// The `credentialName` prefix of the DestinationRules generated from
/// BackendTLSPolicies (`translate::backend_tls`); refused in stored rules.
pub const BACKEND_CA_PREFIX: &str = "backendtlspolicy://";

/// Whether a GatewayClass with this `controllerName` is Lodestar's.
pub fn is_ours(controller_name: &str) -> bool {
    controller_name == CONTROLLER_NAME || controller_name == ISTIO_CONTROLLER_NAME
}

/// One of the kinds, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum Spec {
    GatewayClass(GatewayClass),
    Gateway(Gateway),
    HttpRoute(HttpRoute),
    ReferenceGrant(ReferenceGrant),
    GrpcRoute(GrpcRoute),
    TcpRoute(L4Route),
    TlsRoute(L4Route),
    BackendTlsPolicy(BackendTlsPolicy),
    ListenerSet(ListenerSet),
}

impl Spec {
    /// Whether it is a route with a Service among its parents (a mesh
    /// route, GAMMA): it reaches sidecars, not only gateways.
    pub fn is_mesh_route(&self) -> bool {
        let parents = match self {
            Spec::HttpRoute(r) => &r.parent_refs,
            Spec::GrpcRoute(r) => &r.parent_refs,
            _ => return false,
        };
        parents.iter().any(ParentRef::is_mesh_service)
    }
}

impl ParentRef {
    /// A Service (core group) or an Istio ServiceEntry: a mesh parent.
    pub fn is_mesh_service(&self) -> bool {
        matches!((self.group.as_deref(), self.kind.as_deref()), (Some(""), Some("Service")) | (Some("networking.istio.io"), Some("ServiceEntry")))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayClass {
    pub controller_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gateway {
    pub gateway_class_name: String,
    pub listeners: Vec<Listener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<GatewayAddress>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure: Option<Value>,
    /// Which ListenerSets may add listeners (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_listeners: Option<AllowedListeners>,
    #[serde(default, rename = "tls", skip_serializing_if = "Option::is_none")]
    pub tls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_scope: Option<Value>,
}

/// A Gateway's `allowedListeners`: the namespaces whose ListenerSets may
/// attach (`from`: `Same`, `All`, `Selector` or `None`, the default).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedListeners {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
}

/// ListenerSet (GEP-1713, standard channel since v1.5.0): listeners merged
/// into the parent Gateway, if that Gateway allows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerSet {
    pub parent_ref: ParentGatewayRef,
    pub listeners: Vec<Listener>,
}

/// A ListenerSet's parent: a Gateway (the defaults), in the ListenerSet's
/// namespace unless said otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParentGatewayRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl ParentGatewayRef {
    /// Whether it names a Gateway (the group and kind, or their defaults).
    pub fn is_gateway(&self) -> bool {
        self.group.as_deref().unwrap_or(GROUP) == GROUP && self.kind.as_deref().unwrap_or("Gateway") == "Gateway"
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GatewayAddress {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub value: String,
}

impl GatewayAddress {
    /// `IPAddress` unless said otherwise.
    pub fn address_type(&self) -> &str {
        self.kind.as_deref().unwrap_or("IPAddress")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    pub port: u32,
    pub protocol: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub certificate_refs: Vec<ObjectRef>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend_validation: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AllowedRoutes {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kinds: Vec<RouteGroupKind>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteNamespaces {
    /// `Same` (default), `All` or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteGroupKind {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    pub kind: String,
}

/// A reference with optional group, kind, namespace and port: Secret
/// references, backend references, parent references.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

impl ObjectRef {
    pub fn group_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.group.as_deref().unwrap_or(default)
    }
    pub fn kind_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.kind.as_deref().unwrap_or(default)
    }
    pub fn namespace_or<'a>(&'a self, own: &'a str) -> &'a str {
        self.namespace.as_deref().unwrap_or(own)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ParentRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

/// An HTTPRoute or a GRPCRoute: parents, hostnames, rules (one that
/// matches everything and has no backend when none is written).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, bound(deserialize = "R: Deserialize<'de> + Default", serialize = "R: Serialize"))]
pub struct Route<R> {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    #[serde(default = "default_rules")]
    pub rules: Vec<R>,
}

pub type HttpRoute = Route<HttpRouteRule>;
/// GRPCRoute: gRPC methods routed by service and method name.
pub type GrpcRoute = Route<GrpcRouteRule>;

fn default_rules<R: Default>() -> Vec<R> {
    vec![R::default()]
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<HttpRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<Timeouts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<Value>,
}

/// A rule's `retry` (HTTPRouteRetry, experimental channel): which answers
/// are retried besides connection failures, how many times, and the
/// least wait between tries.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Retry {
    /// HTTP status codes, 400 to 599.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<i64>,
    /// Retries after the first try (at least 1); unset: Lodestar's
    /// default, 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i64>,
    /// A Gateway API duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// The CORS filter (HTTPCORSFilter): the gateway answers preflights and
/// adds the `Access-Control-*` headers to answers.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CorsFilter {
    /// `*`, or `http(s)://host[:port]` whose host may start with `*.`
    /// (any number of labels) or be `*` (any host).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_origins: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// Methods, or `*` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_methods: Vec<String>,
    /// Header names, or `*` alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_headers: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expose_headers: Vec<String>,
    /// Seconds a preflight's answer may be cached; default
    /// [`CORS_DEFAULT_MAX_AGE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<i64>,
}

/// The CRD's default `maxAge`, in seconds.
pub const CORS_DEFAULT_MAX_AGE: i64 = 5;

/// A rule's timeouts: Gateway API durations (`500ms`, `1h30m`; `0s` is
/// none).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Timeouts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub query_params: Vec<ValueMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathMatch {
    /// `Exact`, `PathPrefix` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Default `/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

impl PathMatch {
    pub fn match_type(&self) -> &str {
        self.kind.as_deref().unwrap_or("PathPrefix")
    }
    pub fn path(&self) -> &str {
        self.value.as_deref().unwrap_or("/")
    }
}

/// A header or query parameter match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValueMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    pub value: String,
}

impl ValueMatch {
    pub fn is_regex(&self) -> bool {
        self.kind.as_deref() == Some("RegularExpression")
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpRouteFilter {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HeaderModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<RequestMirror>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<RequestRedirect>,
    #[serde(default, rename = "urlRewrite", skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<UrlRewrite>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<CorsFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_auth: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_ref: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeaderModifier {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub set: Vec<Header>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<Header>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Header {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestMirror {
    pub backend_ref: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// `numerator / denominator` of the requests (denominator 100 by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Fraction {
    pub numerator: i64,
    #[serde(default = "Fraction::hundred")]
    pub denominator: i64,
}

impl Fraction {
    fn hundred() -> i64 {
        100
    }

    /// The share of requests, in percent.
    pub fn percent(&self) -> f64 {
        self.numerator as f64 * 100.0 / self.denominator.max(1) as f64
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestRedirect {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UrlRewrite {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathModifier>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpBackendRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
}

impl HttpBackendRef {
    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef { group: self.group.clone(), kind: self.kind.clone(), name: self.name.clone(), namespace: self.namespace.clone(), port: self.port }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcRouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matches: Vec<GrpcRouteMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<HttpRouteFilter>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_persistence: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcRouteMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<ValueMatch>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrpcMethodMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

impl GrpcMethodMatch {
    pub fn is_regex(&self) -> bool {
        self.kind.as_deref() == Some("RegularExpression")
    }
}

/// TCPRoute and TLSRoute (experimental channel, v1alpha2): connections
/// forwarded to weighted backends; a TLSRoute's by SNI hostname.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct L4Route {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parent_refs: Vec<ParentRef>,
    /// TLSRoute only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostnames: Vec<String>,
    pub rules: Vec<L4RouteRule>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct L4RouteRule {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Without filters (refused by validation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backend_refs: Vec<HttpBackendRef>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ReferenceGrant {
    pub from: Vec<GrantFrom>,
    pub to: Vec<GrantTo>,
}

impl ReferenceGrant {
    /// Whether this grant (stored in the Secret's namespace) lets the
    /// gateway proxies of namespace `proxy_ns` read Secret `name`: it lets
    /// Gateways or ListenerSets of `proxy_ns` refer to it. The one rule for
    /// a certificate in another namespace: the translation programs a
    /// listener with it only if it holds, and SDS serves the Secret to a
    /// gateway proxy only if it holds for the proxy's own namespace.
    pub fn lets_gateways_read_secret(&self, proxy_ns: &str, name: &str) -> bool {
        self.from.iter().any(|f| f.group == GROUP && matches!(f.kind.as_str(), "Gateway" | "ListenerSet") && f.namespace == proxy_ns)
            && self.to.iter().any(|t| t.group.is_empty() && t.kind == "Secret" && t.name.as_deref().is_none_or(|n| n == name))
    }
}

/// The SDS name of a certificate Secret in another namespace than the
/// gateway proxy's (`NS/NAME`; a Secret's own name has no `/`).
pub fn cross_namespace_secret(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantFrom {
    pub group: String,
    pub kind: String,
    pub namespace: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GrantTo {
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// BackendTLSPolicy (v1; v1alpha3 has the same fields): how proxies
/// originate TLS to the targeted services' ports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTlsPolicy {
    pub target_refs: Vec<PolicyTargetRef>,
    pub validation: BackendTlsValidation,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
}

/// A target in the policy's namespace: a Service (core group) or an Istio
/// ServiceEntry, all its ports or the one `sectionName` names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicyTargetRef {
    pub group: String,
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackendTlsValidation {
    /// Secrets (Lodestar's; a ConfigMap is Kubernetes-only) holding the CA
    /// bundle in `ca.crt` (or `cacert`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ca_certificate_refs: Vec<LocalObjectRef>,
    /// `System`: the CA bundle of the host the proxy runs on.
    #[serde(default, rename = "wellKnownCACertificates", skip_serializing_if = "Option::is_none")]
    pub well_known_ca_certificates: Option<String>,
    /// The SNI sent, and the name the certificate must carry unless
    /// `subjectAltNames` says otherwise.
    pub hostname: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<SubjectAltName>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LocalObjectRef {
    pub group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubjectAltName {
    /// `Hostname` or `URI`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

// ---------------------------------------------------------------------------
// Validation: the CRDs' schema and CEL rules.

static HOSTNAME: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").expect("a valid regex"));
static CONTROLLER: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$").expect("a valid regex")
});
static DURATION: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"^([0-9]{1,5}(h|m|s|ms)){1,4}$").expect("a valid regex"));
static HEADER_NAME: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$").expect("a valid regex"));
/// A CORS origin (the CRD's pattern): `*`, or `http(s)://host[:port]`, the
/// host a name whose first label may be `*`, or `*` alone.
static CORS_ORIGIN: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^(\*|https?://((\*\.)?([a-zA-Z0-9-]+\.)*[a-zA-Z0-9-]+|\*)(:[0-9]{1,5})?)$").expect("a valid regex"));
/// The methods an HTTPRoute matches and a CORS filter allows.
const HTTP_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// Collects errors with their paths.
struct Check(Vec<FieldError>);

impl Check {
    fn err(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(FieldError::new(field, reason));
    }

    fn max_items<T>(&mut self, field: &str, list: &[T], max: usize) {
        if list.len() > max {
            self.err(field, format!("has {} items, at most {max} allowed", list.len()));
        }
    }

    fn one_of(&mut self, field: &str, value: &str, allowed: &[&str]) {
        if !allowed.contains(&value) {
            self.err(field, format!("{value:?}: must be one of {}", allowed.join(", ")));
        }
    }

    fn hostname(&mut self, field: &str, h: &str) {
        if h.is_empty() || h.len() > 253 || !HOSTNAME.is_match(h) {
            self.err(field, format!("{h:?} is not a valid hostname (lower-case RFC 1123 name, optionally prefixed by \"*.\"; no IP addresses)"));
        }
    }

    /// A precise hostname (no wildcard), as redirects and rewrites take.
    fn precise_hostname(&mut self, field: &str, h: &str) {
        if h.starts_with('*') {
            self.err(field, format!("{h:?}: a wildcard is not allowed here"));
        } else {
            self.hostname(field, h);
        }
    }

    fn name(&mut self, field: &str, s: &str) {
        if let Err(why) = super::resource::check_dns_subdomain(s) {
            self.err(field, why);
        }
    }

    fn section_name(&mut self, field: &str, s: &str) {
        if let Err(why) = super::resource::check_dns_label(s) {
            self.err(field, why);
        }
    }

    fn port(&mut self, field: &str, p: u32) {
        if !(1..=65535).contains(&p) {
            self.err(field, format!("{p} must be between 1 and 65535"));
        }
    }

    fn header_name(&mut self, field: &str, s: &str) {
        if s.is_empty() || s.len() > 256 || !HEADER_NAME.is_match(s) {
            self.err(field, format!("{s:?} is not a valid HTTP header name"));
        }
    }

    /// A Gateway API duration (GEP-2257: `500ms`, `1h30m`), in milliseconds.
    fn duration(&mut self, field: &str, d: &str) -> Option<u128> {
        match super::istio::parse_duration(d) {
            Ok(v) if DURATION.is_match(d) => Some(v.as_millis()),
            _ => {
                self.err(field, format!("{d:?} is not a duration (1 to 4 of NUMBERh|m|s|ms, e.g. 500ms, 1h30m)"));
                None
            }
        }
    }

    /// A list the CRD declares a set: no item twice.
    fn unique<T: PartialEq + std::fmt::Debug>(&mut self, field: &str, list: &[T]) {
        for (i, v) in list.iter().enumerate() {
            if list[..i].contains(v) {
                self.err(format!("{field}[{i}]"), format!("{v:?} is listed twice"));
            }
        }
    }

    /// The CRD's CEL rule: `*` only as the list's one item.
    fn wildcard_alone(&mut self, field: &str, list: &[String], what: &str) {
        if list.len() > 1 && list.iter().any(|v| v == "*") {
            self.err(field, format!("'*' cannot be listed alongside other {what}"));
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(spec: &Value) -> Result<T, Vec<FieldError>> {
    super::parse_spec(spec)
}

/// Parse and check a Gateway API kind's spec.
pub fn validate(kind: &str, spec: &Value) -> Result<Spec, Vec<FieldError>> {
    let mut c = Check(Vec::new());
    let typed = match kind {
        "GatewayClass" => {
            let s: GatewayClass = parse(spec)?;
            if s.controller_name.len() > 253 || !CONTROLLER.is_match(&s.controller_name) {
                c.err("spec.controllerName", format!("{:?} must be a domain-prefixed path (example.com/controller)", s.controller_name));
            }
            Spec::GatewayClass(s)
        }
        "Gateway" => {
            let s: Gateway = parse(spec)?;
            check_gateway(&mut c, &s);
            Spec::Gateway(s)
        }
        "HTTPRoute" => {
            let s: HttpRoute = parse(spec)?;
            check_route(&mut c, &s);
            Spec::HttpRoute(s)
        }
        "GRPCRoute" => {
            let s: GrpcRoute = parse(spec)?;
            check_grpc_route(&mut c, &s);
            Spec::GrpcRoute(s)
        }
        "TCPRoute" | "TLSRoute" => {
            let s: L4Route = parse(spec)?;
            check_l4_route(&mut c, kind, &s);
            if kind == "TCPRoute" {
                Spec::TcpRoute(s)
            } else {
                Spec::TlsRoute(s)
            }
        }
        "ReferenceGrant" => {
            let s: ReferenceGrant = parse(spec)?;
            for (field, len) in [("spec.from", s.from.len()), ("spec.to", s.to.len())] {
                if !(1..=16).contains(&len) {
                    c.err(field, format!("has {len} items, must have 1 to 16"));
                }
            }
            for (i, f) in s.from.iter().enumerate() {
                c.section_name(&format!("spec.from[{i}].namespace"), &f.namespace);
                if f.kind.is_empty() {
                    c.err(format!("spec.from[{i}].kind"), "required");
                }
            }
            for (i, t) in s.to.iter().enumerate() {
                if t.kind.is_empty() {
                    c.err(format!("spec.to[{i}].kind"), "required");
                }
                if let Some(n) = &t.name {
                    c.name(&format!("spec.to[{i}].name"), n);
                }
            }
            Spec::ReferenceGrant(s)
        }
        "BackendTLSPolicy" => {
            let s: BackendTlsPolicy = parse(spec)?;
            check_backend_tls_policy(&mut c, &s);
            Spec::BackendTlsPolicy(s)
        }
        "ListenerSet" => {
            let s: ListenerSet = parse(spec)?;
            check_listener_set(&mut c, &s);
            Spec::ListenerSet(s)
        }
        other => return Err(vec![FieldError::new("kind", format!("{other} is not a Gateway API kind"))]),
    };
    if c.0.is_empty() {
        Ok(typed)
    } else {
        Err(c.0)
    }
}

/// The CRD's schema and CEL rules; the targets and CA references Lodestar
/// supports (a ConfigMap is Kubernetes-only: a Secret holds the CA here).
fn check_backend_tls_policy(c: &mut Check, s: &BackendTlsPolicy) {
    if !(1..=16).contains(&s.target_refs.len()) {
        c.err("spec.targetRefs", format!("has {} items, must have 1 to 16", s.target_refs.len()));
    }
    for (i, t) in s.target_refs.iter().enumerate() {
        let f = format!("spec.targetRefs[{i}]");
        c.name(&format!("{f}.name"), &t.name);
        if !matches!((t.group.as_str(), t.kind.as_str()), ("", "Service") | ("networking.istio.io", "ServiceEntry")) {
            let why = format!("{}/{}: must be a Service (group \"\") or a networking.istio.io ServiceEntry", t.group, t.kind);
            c.err(format!("{f}.kind"), why);
        }
        if let Some(sn) = &t.section_name {
            c.section_name(&format!("{f}.sectionName"), sn);
        }
        // CEL: two references to one target need distinct sectionNames.
        let same = s.target_refs[..i].iter().filter(|q| q.group == t.group && q.kind == t.kind && q.name == t.name);
        if same.clone().any(|q| q.section_name.is_none() || t.section_name.is_none()) {
            c.err(f.clone(), "sectionName must be specified when targetRefs includes 2 or more references to the same target");
        } else if same.clone().any(|q| q.section_name == t.section_name) {
            c.err(format!("{f}.sectionName"), "sectionName must be unique when targetRefs includes 2 or more references to the same target");
        }
    }
    let v = &s.validation;
    let f = "spec.validation";
    c.precise_hostname(&format!("{f}.hostname"), &v.hostname);
    c.max_items(&format!("{f}.caCertificateRefs"), &v.ca_certificate_refs, 8);
    // CEL: exactly one of caCertificateRefs and wellKnownCACertificates.
    match (v.ca_certificate_refs.is_empty(), &v.well_known_ca_certificates) {
        (true, None) => c.err(f, "must specify either caCertificateRefs or wellKnownCACertificates"),
        (false, Some(_)) => c.err(f, "must not contain both caCertificateRefs and wellKnownCACertificates"),
        _ => {}
    }
    if let Some(w) = &v.well_known_ca_certificates {
        c.one_of(&format!("{f}.wellKnownCACertificates"), w, &["System"]);
    }
    for (i, r) in v.ca_certificate_refs.iter().enumerate() {
        let rf = format!("{f}.caCertificateRefs[{i}]");
        c.name(&format!("{rf}.name"), &r.name);
        if !r.group.is_empty() || r.kind != "Secret" {
            let why = format!(
                "{}/{}: Lodestar reads a CA bundle from a Secret (group \"\", kind Secret, key ca.crt); a ConfigMap is Kubernetes-only",
                r.group, r.kind
            );
            c.err(format!("{rf}.kind"), why);
        }
    }
    c.max_items(&format!("{f}.subjectAltNames"), &v.subject_alt_names, 5);
    for (i, san) in v.subject_alt_names.iter().enumerate() {
        let sf = format!("{f}.subjectAltNames[{i}]");
        match (san.kind.as_str(), &san.hostname, &san.uri) {
            ("Hostname", Some(h), None) => c.hostname(&format!("{sf}.hostname"), h),
            ("Hostname", None, _) => c.err(format!("{sf}.hostname"), "required when type is Hostname"),
            ("URI", None, Some(u)) => {
                if !u.contains("://") || u.len() > 253 {
                    c.err(format!("{sf}.uri"), format!("{u:?} is not an absolute URI (scheme://...)"));
                }
            }
            ("URI", _, None) => c.err(format!("{sf}.uri"), "required when type is URI"),
            ("Hostname", _, Some(_)) => c.err(format!("{sf}.uri"), "must not be set when type is Hostname"),
            ("URI", Some(_), _) => c.err(format!("{sf}.hostname"), "must not be set when type is URI"),
            (other, _, _) => c.one_of(&format!("{sf}.type"), other, &["Hostname", "URI"]),
        }
    }
    c.max_items("spec.options", &s.options.iter().collect::<Vec<_>>(), 16);
}

fn check_gateway(c: &mut Check, s: &Gateway) {
    c.name("spec.gatewayClassName", &s.gateway_class_name);
    if s.listeners.is_empty() {
        c.err("spec.listeners", "required: at least one listener");
    }
    c.max_items("spec.listeners", &s.listeners, 64);
    c.max_items("spec.addresses", &s.addresses, 16);
    for (i, a) in s.addresses.iter().enumerate() {
        let f = format!("spec.addresses[{i}]");
        match a.address_type() {
            "IPAddress" if a.value.parse::<std::net::IpAddr>().is_err() => c.err(format!("{f}.value"), format!("{:?} is not an IP address", a.value)),
            "Hostname" => c.precise_hostname(&format!("{f}.value"), &a.value),
            _ => {}
        }
    }
    if let Some(ns) = s.allowed_listeners.as_ref().and_then(|a| a.namespaces.as_ref()) {
        check_namespaces_from(c, "spec.allowedListeners.namespaces", ns, "None");
    }
    check_listeners(c, &s.listeners);
}

/// A ListenerSet: its parent, and its listeners as a Gateway's, with the
/// CRD's TLS mode rules for HTTPS and TLS.
fn check_listener_set(c: &mut Check, s: &ListenerSet) {
    let p = &s.parent_ref;
    c.name("spec.parentRef.name", &p.name);
    if let Some(ns) = &p.namespace {
        c.section_name("spec.parentRef.namespace", ns);
    }
    if !p.is_gateway() {
        let why = format!("{}/{}: must be a Gateway (group {GROUP})", p.group.as_deref().unwrap_or(GROUP), p.kind.as_deref().unwrap_or("Gateway"));
        c.err("spec.parentRef.kind", why);
    }
    if s.listeners.is_empty() {
        c.err("spec.listeners", "required: at least one listener");
    }
    c.max_items("spec.listeners", &s.listeners, 64);
    check_listeners(c, &s.listeners);
    for (i, l) in s.listeners.iter().enumerate() {
        let mode = l.tls.as_ref().and_then(|t| t.mode.as_deref());
        match (l.protocol.as_str(), mode, &l.tls) {
            ("HTTPS", Some(m), _) if m != "Terminate" => c.err(format!("spec.listeners[{i}].tls.mode"), "tls mode must be Terminate for protocol HTTPS"),
            ("TLS", None, _) => c.err(format!("spec.listeners[{i}].tls.mode"), "tls mode must be set for protocol TLS"),
            _ => {}
        }
    }
}

/// `namespaces.from` (with its default) and its selector.
fn check_namespaces_from(c: &mut Check, f: &str, ns: &RouteNamespaces, default: &str) {
    let from = ns.from.as_deref().unwrap_or(default);
    c.one_of(&format!("{f}.from"), from, &["All", "Same", "Selector", "None"]);
    if from == "Selector" && ns.selector.is_none() {
        c.err(format!("{f}.selector"), "required when from is Selector");
    }
    if let Some(sel) = &ns.selector {
        check_selector(c, &format!("{f}.selector"), sel);
    }
}

/// The listener entries of a Gateway or a ListenerSet (`spec.listeners`).
fn check_listeners(c: &mut Check, listeners: &[Listener]) {
    let mut names = BTreeSet::new();
    let mut combos = BTreeSet::new();
    for (i, l) in listeners.iter().enumerate() {
        let f = format!("spec.listeners[{i}]");
        c.section_name(&format!("{f}.name"), &l.name);
        if !names.insert(l.name.as_str()) {
            c.err(format!("{f}.name"), format!("{:?}: listener names must be unique", l.name));
        }
        if !combos.insert((l.port, l.protocol.as_str(), l.hostname.as_deref().unwrap_or(""))) {
            c.err(f.clone(), "the combination of port, protocol and hostname must be unique for each listener");
        }
        c.port(&format!("{f}.port"), l.port);
        if l.protocol.is_empty() || l.protocol.len() > 255 {
            c.err(format!("{f}.protocol"), "required: 1 to 255 characters");
        }
        if let Some(h) = &l.hostname {
            c.hostname(&format!("{f}.hostname"), h);
            if matches!(l.protocol.as_str(), "TCP" | "UDP") {
                c.err(format!("{f}.hostname"), "must not be set for protocols TCP and UDP");
            }
        }
        match (&l.tls, l.protocol.as_str()) {
            (Some(_), "HTTP" | "TCP" | "UDP") => c.err(format!("{f}.tls"), format!("must not be set for protocol {}", l.protocol)),
            (None, "HTTPS") => c.err(format!("{f}.tls"), "required for protocol HTTPS"),
            _ => {}
        }
        if let Some(tls) = &l.tls {
            let mode = tls.mode.as_deref().unwrap_or("Terminate");
            c.one_of(&format!("{f}.tls.mode"), mode, &["Terminate", "Passthrough"]);
            c.max_items(&format!("{f}.tls.certificateRefs"), &tls.certificate_refs, 64);
            if mode == "Terminate" && tls.certificate_refs.is_empty() && tls.options.is_empty() {
                c.err(format!("{f}.tls.certificateRefs"), "certificateRefs or options must be specified when mode is Terminate");
            }
            for (j, r) in tls.certificate_refs.iter().enumerate() {
                c.name(&format!("{f}.tls.certificateRefs[{j}].name"), &r.name);
            }
        }
        if let Some(ar) = &l.allowed_routes {
            if let Some(ns) = &ar.namespaces {
                check_namespaces_from(c, &format!("{f}.allowedRoutes.namespaces"), ns, "Same");
            }
            c.max_items(&format!("{f}.allowedRoutes.kinds"), &ar.kinds, 8);
        }
    }
}

/// A Kubernetes label selector's shape.
fn check_selector(c: &mut Check, f: &str, sel: &Value) {
    let Some(obj) = sel.as_object() else { return c.err(f, "expected an object") };
    for k in obj.keys().filter(|k| !matches!(k.as_str(), "matchLabels" | "matchExpressions")) {
        c.err(format!("{f}.{k}"), "unknown field (expected matchLabels, matchExpressions)");
    }
    if let Some(m) = obj.get("matchLabels") {
        if !m.as_object().is_some_and(|m| m.values().all(Value::is_string)) {
            c.err(format!("{f}.matchLabels"), "expected a map of strings");
        }
    }
    for (i, e) in obj.get("matchExpressions").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let op = e["operator"].as_str().unwrap_or("");
        c.one_of(&format!("{f}.matchExpressions[{i}].operator"), op, &["In", "NotIn", "Exists", "DoesNotExist"]);
        if !e["key"].is_string() {
            c.err(format!("{f}.matchExpressions[{i}].key"), "required");
        }
    }
}

fn check_route(c: &mut Check, s: &HttpRoute) {
    check_parents_and_hostnames(c, &s.parent_refs, &s.hostnames);
    c.max_items("spec.rules", &s.rules, 16);
    for (i, r) in s.rules.iter().enumerate() {
        let f = format!("spec.rules[{i}]");
        if let Some(n) = &r.name {
            c.section_name(&format!("{f}.name"), n);
        }
        if let Some(t) = &r.timeouts {
            let mut ms = [None, None];
            for (i, (name, d)) in [("request", &t.request), ("backendRequest", &t.backend_request)].into_iter().enumerate() {
                let Some(d) = d else { continue };
                ms[i] = c.duration(&format!("{f}.timeouts.{name}"), d);
            }
            // CEL: backendRequest must be <= request, unless request is 0s.
            if let [Some(request), Some(backend)] = ms {
                if request != 0 && backend > request {
                    c.err(format!("{f}.timeouts.backendRequest"), "must be less than or equal to request");
                }
            }
        }
        if let Some(retry) = &r.retry {
            check_retry(c, &format!("{f}.retry"), retry);
        }
        c.max_items(&format!("{f}.matches"), &r.matches, 64);
        for (j, m) in r.matches.iter().enumerate() {
            check_match(c, &format!("{f}.matches[{j}]"), m);
        }
        check_rule_filters_and_backends(c, &f, &r.filters, &r.backend_refs, &r.matches, FILTER_TYPES);
    }
}

/// HTTPRouteRetry: codes 400 to 599 (a set), at least one attempt, a
/// Gateway API duration.
fn check_retry(c: &mut Check, f: &str, r: &Retry) {
    for (i, code) in r.codes.iter().enumerate() {
        if !(400..=599).contains(code) {
            c.err(format!("{f}.codes[{i}]"), format!("{code} must be between 400 and 599"));
        }
    }
    c.unique(&format!("{f}.codes"), &r.codes);
    if let Some(a) = r.attempts.filter(|a| !(1..=i64::from(i32::MAX)).contains(a)) {
        c.err(format!("{f}.attempts"), format!("{a} must be between 1 and {}", i32::MAX));
    }
    if let Some(b) = &r.backoff {
        c.duration(&format!("{f}.backoff"), b);
    }
}

/// HTTPCORSFilter: origins (the CRD's pattern, a port from 1 to 65535),
/// methods and header names, each list a set where `*` stands alone
/// (expose headers excepted), and a positive 32-bit `maxAge`.
fn check_cors(c: &mut Check, f: &str, cors: &CorsFilter) {
    let origins = format!("{f}.allowOrigins");
    c.max_items(&origins, &cors.allow_origins, 64);
    c.wildcard_alone(&origins, &cors.allow_origins, "origins");
    c.unique(&origins, &cors.allow_origins);
    for (i, o) in cors.allow_origins.iter().enumerate() {
        let port = o.rsplit_once(':').map(|(_, p)| p).filter(|p| p.bytes().all(|b| b.is_ascii_digit()));
        if o.len() > 253 || !CORS_ORIGIN.is_match(o) {
            let why = "is not an origin: '*', or http(s)://HOST[:PORT] where HOST may start with '*.' or be '*'";
            c.err(format!("{origins}[{i}]"), format!("{o:?} {why}"));
        } else if port.is_some_and(|p| !p.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p))) {
            c.err(format!("{origins}[{i}]"), format!("{o:?}: the port must be between 1 and 65535"));
        }
    }
    let methods = format!("{f}.allowMethods");
    c.max_items(&methods, &cors.allow_methods, 9);
    c.wildcard_alone(&methods, &cors.allow_methods, "methods");
    c.unique(&methods, &cors.allow_methods);
    let allowed: Vec<&str> = HTTP_METHODS.iter().copied().chain(["*"]).collect();
    for (i, m) in cors.allow_methods.iter().enumerate() {
        c.one_of(&format!("{methods}[{i}]"), m, &allowed);
    }
    for (name, list) in [("allowHeaders", &cors.allow_headers), ("exposeHeaders", &cors.expose_headers)] {
        let hf = format!("{f}.{name}");
        c.max_items(&hf, list, 64);
        c.unique(&hf, list);
        for (i, h) in list.iter().enumerate() {
            c.header_name(&format!("{hf}[{i}]"), h);
        }
    }
    c.wildcard_alone(&format!("{f}.allowHeaders"), &cors.allow_headers, "headers");
    if let Some(age) = cors.max_age.filter(|a| !(1..=i64::from(i32::MAX)).contains(a)) {
        c.err(format!("{f}.maxAge"), format!("{age} must be between 1 and {} (seconds)", i32::MAX));
    }
}

/// The filters and weighted backends of an HTTPRoute's or a GRPCRoute's
/// rule (`f`), with the filter types the kind has.
fn check_rule_filters_and_backends(
    c: &mut Check,
    f: &str,
    filters: &[HttpRouteFilter],
    backends: &[HttpBackendRef],
    matches: &[HttpRouteMatch],
    types: &[&str],
) {
    c.max_items(&format!("{f}.filters"), filters, 16);
    c.max_items(&format!("{f}.backendRefs"), backends, 16);
    check_filters(c, &format!("{f}.filters"), filters, matches, types);
    for (j, b) in backends.iter().enumerate() {
        let bf = format!("{f}.backendRefs[{j}]");
        check_backend(c, &bf, &b.object_ref(), b.weight);
        check_filters(c, &format!("{bf}.filters"), &b.filters, matches, types);
    }
}

/// GRPC method names: a service is a dotted protobuf name, a method an
/// identifier (the CRD's CEL rules for `Exact`).
static GRPC_SERVICE: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"^(?i)\.?[a-z_][a-z_0-9]*(\.[a-z_][a-z_0-9]*)*$").expect("a valid regex"));
static GRPC_METHOD: LazyLock<regex::Regex> = LazyLock::new(|| regex::Regex::new(r"^[A-Za-z_][A-Za-z_0-9]*$").expect("a valid regex"));

const GRPC_FILTER_TYPES: &[&str] = &["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "ExtensionRef"];

fn check_grpc_route(c: &mut Check, s: &GrpcRoute) {
    check_parents_and_hostnames(c, &s.parent_refs, &s.hostnames);
    c.max_items("spec.rules", &s.rules, 16);
    for (i, r) in s.rules.iter().enumerate() {
        let f = format!("spec.rules[{i}]");
        if let Some(n) = &r.name {
            c.section_name(&format!("{f}.name"), n);
        }
        c.max_items(&format!("{f}.matches"), &r.matches, 64);
        for (j, m) in r.matches.iter().enumerate() {
            let mf = format!("{f}.matches[{j}]");
            if let Some(mm) = &m.method {
                let t = mm.kind.as_deref().unwrap_or("Exact");
                c.one_of(&format!("{mf}.method.type"), t, &["Exact", "RegularExpression"]);
                if mm.service.is_none() && mm.method.is_none() {
                    c.err(format!("{mf}.method"), "one or both of service and method must be specified");
                }
                for (name, value, re) in [("service", &mm.service, &*GRPC_SERVICE), ("method", &mm.method, &*GRPC_METHOD)] {
                    let Some(v) = value else { continue };
                    if v.len() > 1024 {
                        c.err(format!("{mf}.method.{name}"), "at most 1024 characters");
                    } else if mm.is_regex() {
                        if let Err(e) = regex::Regex::new(v) {
                            c.err(format!("{mf}.method.{name}"), format!("{v:?} is not a valid regular expression: {e}"));
                        }
                    } else if !re.is_match(v) {
                        c.err(format!("{mf}.method.{name}"), format!("{v:?} is not a valid gRPC {name} name"));
                    }
                }
            }
            // Header matches are checked as an HTTPRoute's are.
            check_match(c, &mf, &HttpRouteMatch { headers: m.headers.clone(), ..Default::default() });
        }
        check_rule_filters_and_backends(c, &f, &r.filters, &r.backend_refs, &[], GRPC_FILTER_TYPES);
    }
}

fn check_l4_route(c: &mut Check, kind: &str, s: &L4Route) {
    if kind == "TCPRoute" && !s.hostnames.is_empty() {
        c.err("spec.hostnames", "a TCPRoute has no hostnames");
    }
    check_parents_and_hostnames(c, &s.parent_refs, &s.hostnames);
    if !(1..=16).contains(&s.rules.len()) {
        c.err("spec.rules", format!("has {} items, must have 1 to 16", s.rules.len()));
    }
    for (i, r) in s.rules.iter().enumerate() {
        let f = format!("spec.rules[{i}]");
        if let Some(n) = &r.name {
            c.section_name(&format!("{f}.name"), n);
        }
        if !(1..=16).contains(&r.backend_refs.len()) {
            c.err(format!("{f}.backendRefs"), format!("has {} items, must have 1 to 16", r.backend_refs.len()));
        }
        for (j, b) in r.backend_refs.iter().enumerate() {
            check_backend(c, &format!("{f}.backendRefs[{j}]"), &b.object_ref(), b.weight);
            if !b.filters.is_empty() {
                c.err(format!("{f}.backendRefs[{j}].filters"), format!("a {kind}'s backends have no filters"));
            }
        }
    }
}

fn check_parents_and_hostnames(c: &mut Check, parent_refs: &[ParentRef], hostnames: &[String]) {
    c.max_items("spec.parentRefs", parent_refs, 32);
    c.max_items("spec.hostnames", hostnames, 16);
    for (i, h) in hostnames.iter().enumerate() {
        c.hostname(&format!("spec.hostnames[{i}]"), h);
    }
    for (i, p) in parent_refs.iter().enumerate() {
        let f = format!("spec.parentRefs[{i}]");
        c.name(&format!("{f}.name"), &p.name);
        if let Some(sn) = &p.section_name {
            c.section_name(&format!("{f}.sectionName"), sn);
        }
        if let Some(port) = p.port {
            c.port(&format!("{f}.port"), port);
        }
        let same_parent: Vec<&ParentRef> =
            parent_refs[..i].iter().filter(|q| q.group == p.group && q.kind == p.kind && q.namespace == p.namespace && q.name == p.name).collect();
        // CEL: two refs to one parent must both name a distinct
        // sectionName or port.
        let distinct = same_parent.iter().all(|q| {
            (q.section_name.is_some() && p.section_name.is_some() && q.section_name != p.section_name)
                || (q.port.is_some() && p.port.is_some() && q.port != p.port)
        });
        if !distinct {
            c.err(f.clone(), "sectionName or port must be specified and unique when parentRefs include two references to the same parent");
        }
    }
}

fn check_backend(c: &mut Check, f: &str, b: &ObjectRef, weight: Option<u32>) {
    c.name(&format!("{f}.name"), &b.name);
    if weight.is_some_and(|w| w > 1_000_000) {
        c.err(format!("{f}.weight"), format!("{} must be between 0 and 1000000", weight.unwrap_or_default()));
    }
    if let Some(ns) = &b.namespace {
        c.section_name(&format!("{f}.namespace"), ns);
    }
    match b.port {
        Some(p) => c.port(&format!("{f}.port"), p),
        None if b.group_or("").is_empty() && b.kind_or("Service") == "Service" => c.err(format!("{f}.port"), "required for a Service reference"),
        None => {}
    }
}

fn check_match(c: &mut Check, f: &str, m: &HttpRouteMatch) {
    if let Some(p) = &m.path {
        let t = p.match_type();
        c.one_of(&format!("{f}.path.type"), t, &["Exact", "PathPrefix", "RegularExpression"]);
        let v = p.path();
        if v.len() > 1024 {
            c.err(format!("{f}.path.value"), "at most 1024 characters");
        }
        if t != "RegularExpression" {
            if !v.starts_with('/') {
                c.err(format!("{f}.path.value"), format!("{v:?} must be an absolute path (start with '/')"));
            } else if ["//", "/./", "/../", "%2f", "%2F", "#"].iter().any(|bad| v.contains(bad)) || v.ends_with("/..") || v.ends_with("/.") {
                c.err(format!("{f}.path.value"), format!("{v:?} must not contain '//', '/./', '/../', '%2f', '%2F' or '#', nor end with '/..' or '/.'"));
            }
        } else if let Err(e) = regex::Regex::new(v) {
            c.err(format!("{f}.path.value"), format!("{v:?} is not a valid regular expression: {e}"));
        }
    }
    c.max_items(&format!("{f}.headers"), &m.headers, 16);
    c.max_items(&format!("{f}.queryParams"), &m.query_params, 16);
    for (what, list) in [("headers", &m.headers), ("queryParams", &m.query_params)] {
        let mut seen = BTreeSet::new();
        for (k, h) in list.iter().enumerate() {
            let hf = format!("{f}.{what}[{k}]");
            c.one_of(&format!("{hf}.type"), h.kind.as_deref().unwrap_or("Exact"), &["Exact", "RegularExpression"]);
            c.header_name(&format!("{hf}.name"), &h.name);
            if h.value.len() > 4096 {
                c.err(format!("{hf}.value"), "at most 4096 characters");
            }
            if h.is_regex() {
                if let Err(e) = regex::Regex::new(&h.value) {
                    c.err(format!("{hf}.value"), format!("not a valid regular expression: {e}"));
                }
            }
            let key = if what == "headers" { h.name.to_ascii_lowercase() } else { h.name.clone() };
            if !seen.insert(key) {
                c.err(format!("{hf}.name"), format!("{:?} is matched twice: names must be unique", h.name));
            }
        }
    }
    if let Some(method) = &m.method {
        c.one_of(&format!("{f}.method"), method, HTTP_METHODS);
    }
}

const FILTER_TYPES: &[&str] =
    &["RequestHeaderModifier", "ResponseHeaderModifier", "RequestMirror", "RequestRedirect", "URLRewrite", "CORS", "ExternalAuth", "ExtensionRef"];

fn check_filters(c: &mut Check, f: &str, filters: &[HttpRouteFilter], matches: &[HttpRouteMatch], types: &[&str]) {
    let mut once = BTreeSet::new();
    for (i, flt) in filters.iter().enumerate() {
        let ff = format!("{f}[{i}]");
        c.one_of(&format!("{ff}.type"), &flt.kind, types);
        let set = [
            ("RequestHeaderModifier", "requestHeaderModifier", flt.request_header_modifier.is_some()),
            ("ResponseHeaderModifier", "responseHeaderModifier", flt.response_header_modifier.is_some()),
            ("RequestMirror", "requestMirror", flt.request_mirror.is_some()),
            ("RequestRedirect", "requestRedirect", flt.request_redirect.is_some()),
            ("URLRewrite", "urlRewrite", flt.url_rewrite.is_some()),
            ("CORS", "cors", flt.cors.is_some()),
            ("ExternalAuth", "externalAuth", flt.external_auth.is_some()),
            ("ExtensionRef", "extensionRef", flt.extension_ref.is_some()),
        ];
        for (t, field, present) in set {
            if t == flt.kind && !present {
                c.err(format!("{ff}.{field}"), format!("required for a filter of type {t}"));
            }
            if t != flt.kind && present {
                c.err(format!("{ff}.{field}"), format!("must not be set for a filter of type {}", flt.kind));
            }
        }
        if flt.kind != "RequestMirror" && flt.kind != "ExtensionRef" && !once.insert(flt.kind.as_str()) {
            c.err(format!("{ff}.type"), format!("{}: may appear at most once per rule", flt.kind));
        }
        for (name, hm) in [("requestHeaderModifier", &flt.request_header_modifier), ("responseHeaderModifier", &flt.response_header_modifier)] {
            let Some(hm) = hm else { continue };
            let hf = format!("{ff}.{name}");
            c.max_items(&format!("{hf}.set"), &hm.set, 16);
            c.max_items(&format!("{hf}.add"), &hm.add, 16);
            c.max_items(&format!("{hf}.remove"), &hm.remove, 16);
            for (list, headers) in [("set", &hm.set), ("add", &hm.add)] {
                for (k, h) in headers.iter().enumerate() {
                    c.header_name(&format!("{hf}.{list}[{k}].name"), &h.name);
                }
            }
            for (k, h) in hm.remove.iter().enumerate() {
                c.header_name(&format!("{hf}.remove[{k}]"), h);
            }
        }
        if let Some(m) = &flt.request_mirror {
            check_backend(c, &format!("{ff}.requestMirror.backendRef"), &m.backend_ref, None);
            if m.percent.is_some_and(|p| p > 100) {
                c.err(format!("{ff}.requestMirror.percent"), "must be between 0 and 100");
            }
            if let Some(f) = &m.fraction {
                if m.percent.is_some() {
                    c.err(format!("{ff}.requestMirror"), "only one of percent or fraction may be set");
                }
                if f.denominator < 1 {
                    c.err(format!("{ff}.requestMirror.fraction.denominator"), "must be at least 1");
                }
                if f.numerator < 0 || f.numerator > f.denominator {
                    c.err(format!("{ff}.requestMirror.fraction.numerator"), "must be between 0 and the denominator");
                }
            }
        }
        if let Some(r) = &flt.request_redirect {
            let rf = format!("{ff}.requestRedirect");
            if let Some(s) = &r.scheme {
                c.one_of(&format!("{rf}.scheme"), s, &["http", "https"]);
            }
            if let Some(h) = &r.hostname {
                c.precise_hostname(&format!("{rf}.hostname"), h);
            }
            if let Some(p) = r.port {
                c.port(&format!("{rf}.port"), p);
            }
            if let Some(code) = r.status_code {
                c.one_of(&format!("{rf}.statusCode"), &code.to_string(), &["301", "302", "303", "307", "308"]);
            }
            if let Some(p) = &r.path {
                check_path_modifier(c, &format!("{rf}.path"), p, matches);
            }
        }
        if let Some(cors) = &flt.cors {
            check_cors(c, &format!("{ff}.cors"), cors);
        }
        if let Some(u) = &flt.url_rewrite {
            if let Some(h) = &u.hostname {
                c.precise_hostname(&format!("{ff}.urlRewrite.hostname"), h);
            }
            if let Some(p) = &u.path {
                check_path_modifier(c, &format!("{ff}.urlRewrite.path"), p, matches);
            }
        }
    }
    let kinds: BTreeSet<&str> = filters.iter().map(|f| f.kind.as_str()).collect();
    if kinds.contains("RequestRedirect") && kinds.contains("URLRewrite") {
        c.err(f, "RequestRedirect and URLRewrite filters cannot be used together");
    }
}

fn check_path_modifier(c: &mut Check, f: &str, p: &PathModifier, matches: &[HttpRouteMatch]) {
    match p.kind.as_str() {
        "ReplaceFullPath" => {
            if p.replace_full_path.is_none() {
                c.err(format!("{f}.replaceFullPath"), "required when type is ReplaceFullPath");
            }
            if p.replace_prefix_match.is_some() {
                c.err(format!("{f}.replacePrefixMatch"), "must not be set when type is ReplaceFullPath");
            }
        }
        "ReplacePrefixMatch" => {
            if p.replace_prefix_match.is_none() {
                c.err(format!("{f}.replacePrefixMatch"), "required when type is ReplacePrefixMatch");
            }
            if p.replace_full_path.is_some() {
                c.err(format!("{f}.replaceFullPath"), "must not be set when type is ReplacePrefixMatch");
            }
            // CEL: only with PathPrefix matches.
            if matches.iter().any(|m| m.path.as_ref().is_some_and(|p| p.match_type() != "PathPrefix")) {
                c.err(format!("{f}.type"), "ReplacePrefixMatch needs every match of the rule to be a PathPrefix match");
            }
        }
        other => c.one_of(&format!("{f}.type"), other, &["ReplaceFullPath", "ReplacePrefixMatch"]),
    }
    for v in [&p.replace_full_path, &p.replace_prefix_match].into_iter().flatten() {
        if v.len() > 1024 {
            c.err(f, "at most 1024 characters");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(kind: &str, spec: Value) -> Vec<String> {
        validate(kind, &spec).err().unwrap_or_default().into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn valid_specs_parse() {
        let gw = json!({"gatewayClassName": "lodestar", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP", "hostname": "*.example.com",
            "allowedRoutes": {"namespaces": {"from": "All"}}}]});
        assert!(matches!(validate("Gateway", &gw), Ok(Spec::Gateway(_))));
        let route = json!({"parentRefs": [{"name": "gw", "sectionName": "http"}], "hostnames": ["a.example.com"],
            "rules": [{"matches": [{"path": {"type": "Exact", "value": "/one"}, "headers": [{"name": "Version", "value": "one"}]}],
                       "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "X-A", "value": "1"}]}}],
                       "backendRefs": [{"name": "svc", "port": 8080, "weight": 3}]}]});
        let Ok(Spec::HttpRoute(r)) = validate("HTTPRoute", &route) else { panic!("route") };
        assert_eq!(r.rules[0].backend_refs[0].weight, Some(3));
        let Ok(Spec::HttpRoute(r)) = validate("HTTPRoute", &json!({})) else { panic!("empty route") };
        assert_eq!(r.rules.len(), 1, "one default rule");
    }

    #[test]
    fn grpc_tcp_and_tls_routes_name_their_fields() {
        let ok = json!({"parentRefs": [{"name": "gw"}], "rules": [{"matches": [{"method": {"service": "pkg.Echo", "method": "Call"}}],
            "backendRefs": [{"name": "echo", "port": 50051}]}]});
        assert!(matches!(validate("GRPCRoute", &ok), Ok(Spec::GrpcRoute(_))));
        let bad = json!({"rules": [{"matches": [{"method": {}}, {"method": {"service": "not a service", "type": "Exact"}}, {"method": {"type": "Prefix", "method": "x"}}],
            "filters": [{"type": "URLRewrite", "urlRewrite": {}}]}]});
        assert_eq!(
            fields("GRPCRoute", bad),
            [
                "spec.rules[0].matches[0].method",
                "spec.rules[0].matches[1].method.service",
                "spec.rules[0].matches[2].method.type",
                "spec.rules[0].filters[0].type"
            ]
        );
        let tcp = json!({"parentRefs": [{"name": "gw", "sectionName": "db"}], "rules": [{"backendRefs": [{"name": "db", "port": 5432}]}]});
        assert!(matches!(validate("TCPRoute", &tcp), Ok(Spec::TcpRoute(_))));
        assert_eq!(
            fields("TCPRoute", json!({"hostnames": ["a.example.com"], "rules": [{"backendRefs": []}]})),
            ["spec.hostnames", "spec.rules[0].backendRefs"]
        );
        assert_eq!(fields("TLSRoute", json!({"hostnames": ["A_B"], "rules": []})), ["spec.hostnames[0]", "spec.rules"]);
        assert_eq!(fields("TLSRoute", json!({"rules": [{"backendRefs": [{"name": "x"}]}]})), ["spec.rules[0].backendRefs[0].port"]);
    }

    #[test]
    fn errors_name_their_field() {
        assert_eq!(fields("GatewayClass", json!({"controllerName": "nope"})), ["spec.controllerName"]);
        assert_eq!(fields("Gateway", json!({"gatewayClassName": "c", "listeners": []})), ["spec.listeners"]);
        assert_eq!(
            fields("Gateway", json!({"gatewayClassName": "c", "listeners": [{"name": "a", "port": 0, "protocol": "HTTP", "hostname": "1.2.3.4:80"}]})),
            ["spec.listeners[0].port", "spec.listeners[0].hostname"]
        );
        assert_eq!(
            fields("Gateway", json!({"gatewayClassName": "c", "listeners": [{"name": "a", "port": 443, "protocol": "HTTPS"}]})),
            ["spec.listeners[0].tls"]
        );
        assert_eq!(
            fields(
                "Gateway",
                json!({"gatewayClassName": "c", "listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}, {"name": "a", "port": 80, "protocol": "HTTP"}]})
            ),
            ["spec.listeners[1].name", "spec.listeners[1]"]
        );
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"matches": [{"path": {"type": "Prefix", "value": "/x"}}]}]})), ["spec.rules[0].matches[0].path.type"]);
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"matches": [{"path": {"value": "/a//b"}}]}]})), ["spec.rules[0].matches[0].path.value"]);
        assert_eq!(
            fields("HTTPRoute", json!({"rules": [{"backendRefs": [{"name": "s", "port": 80, "weight": 1000001}]}]})),
            ["spec.rules[0].backendRefs[0].weight"]
        );
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"backendRefs": [{"name": "s"}]}]})), ["spec.rules[0].backendRefs[0].port"]);
        assert_eq!(fields("HTTPRoute", json!({"hostnames": ["Bad_Host"]})), ["spec.hostnames[0]"]);
        assert_eq!(fields("HTTPRoute", json!({"hostnames": vec!["a.b"; 17]})), ["spec.hostnames"]);
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"filters": [{"type": "RequestRedirect"}]}]})), ["spec.rules[0].filters[0].requestRedirect"]);
        assert_eq!(
            fields("HTTPRoute", json!({"rules": [{"filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 305}}]}]})),
            ["spec.rules[0].filters[0].requestRedirect.statusCode"]
        );
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"matches": [{"method": "FETCH"}]}]})), ["spec.rules[0].matches[0].method"]);
        let mirror = |m: Value| json!({"rules": [{"filters": [{"type": "RequestMirror", "requestMirror": m}]}]});
        assert!(fields("HTTPRoute", mirror(json!({"backendRef": {"name": "b", "port": 80}, "fraction": {"numerator": 25, "denominator": 50}}))).is_empty());
        assert_eq!(
            fields("HTTPRoute", mirror(json!({"backendRef": {"name": "b", "port": 80}, "fraction": {"numerator": 3, "denominator": 2}}))),
            ["spec.rules[0].filters[0].requestMirror.fraction.numerator"]
        );
        assert_eq!(
            fields("HTTPRoute", mirror(json!({"backendRef": {"name": "b", "port": 80}, "percent": 5, "fraction": {"numerator": 1, "denominator": 0}}))),
            [
                "spec.rules[0].filters[0].requestMirror",
                "spec.rules[0].filters[0].requestMirror.fraction.denominator",
                "spec.rules[0].filters[0].requestMirror.fraction.numerator"
            ]
        );
        assert_eq!(fields("HTTPRoute", json!({"parentRefs": [{"name": "g"}, {"name": "g"}]})), ["spec.parentRefs[1]"]);
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"bogus": 1}]})), ["spec.rules[0].bogus"]);
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"timeouts": {"request": "1x"}}]})), ["spec.rules[0].timeouts.request"]);
        assert_eq!(fields("HTTPRoute", json!({"rules": [{"timeouts": {"request": "1s", "backendRequest": "2s"}}]})), ["spec.rules[0].timeouts.backendRequest"]);
        assert_eq!(fields("ReferenceGrant", json!({"from": [], "to": [{"group": "", "kind": "Service"}]})), ["spec.from"]);
    }

    #[test]
    fn cors_filters_and_retries_name_their_fields() {
        let route = |rule: Value| json!({"rules": [rule]});
        let cors = |c: Value| route(json!({"filters": [{"type": "CORS", "cors": c}]}));
        let ok = cors(json!({"allowOrigins": ["https://www.foo.com", "https://*.bar.com", "http://a.example:8080", "https://*"],
            "allowMethods": ["GET", "OPTIONS"], "allowHeaders": ["x-header-1"], "exposeHeaders": ["*"], "allowCredentials": true, "maxAge": 3600}));
        let Ok(Spec::HttpRoute(r)) = validate("HTTPRoute", &ok) else { panic!("cors route") };
        let c = r.rules[0].filters[0].cors.as_ref().unwrap();
        assert_eq!((c.allow_origins.len(), c.max_age, c.allow_credentials), (4, Some(3600), Some(true)));
        for star in [json!({"allowOrigins": ["*"], "allowMethods": ["*"], "allowHeaders": ["*"]}), json!({})] {
            assert!(validate("HTTPRoute", &cors(star.clone())).is_ok(), "{star}");
        }
        let bad = cors(json!({
            "allowOrigins": ["*", "https://a.com", "ftp://a.com", "https://a.*.com", "https://a.com:0", "https://a.com:70000", "a.com", "https://a.com"],
            "allowMethods": ["GET", "FETCH", "get", "GET"],
            "allowHeaders": ["x-a", "*", "bad header"],
            "exposeHeaders": ["x-a", "x-a"],
            "maxAge": 0}));
        assert_eq!(
            fields("HTTPRoute", bad),
            [
                "spec.rules[0].filters[0].cors.allowOrigins",
                "spec.rules[0].filters[0].cors.allowOrigins[7]",
                "spec.rules[0].filters[0].cors.allowOrigins[2]",
                "spec.rules[0].filters[0].cors.allowOrigins[3]",
                "spec.rules[0].filters[0].cors.allowOrigins[4]",
                "spec.rules[0].filters[0].cors.allowOrigins[5]",
                "spec.rules[0].filters[0].cors.allowOrigins[6]",
                "spec.rules[0].filters[0].cors.allowMethods[3]",
                "spec.rules[0].filters[0].cors.allowMethods[1]",
                "spec.rules[0].filters[0].cors.allowMethods[2]",
                "spec.rules[0].filters[0].cors.allowHeaders[2]",
                "spec.rules[0].filters[0].cors.exposeHeaders[1]",
                "spec.rules[0].filters[0].cors.allowHeaders",
                "spec.rules[0].filters[0].cors.maxAge"
            ]
        );
        let e = validate("HTTPRoute", &cors(json!({"allowOrigins": ["https://a.com:70000"]}))).unwrap_err();
        assert!(e[0].to_string().contains("between 1 and 65535"), "{e:?}");
        assert_eq!(fields("HTTPRoute", cors(json!({"allowMethods": ["*", "GET"]}))), ["spec.rules[0].filters[0].cors.allowMethods"]);
        assert_eq!(fields("HTTPRoute", cors(json!({"allowOrigin": ["*"]}))), ["spec.rules[0].filters[0].cors.allowOrigin"]);
        assert_eq!(
            fields("HTTPRoute", route(json!({"filters": [{"type": "CORS"}, {"type": "RequestHeaderModifier", "requestHeaderModifier": {}, "cors": {}}]}))),
            ["spec.rules[0].filters[0].cors", "spec.rules[0].filters[1].cors"]
        );
        assert_eq!(fields("HTTPRoute", cors(json!({"maxAge": 2147483648u64}))), ["spec.rules[0].filters[0].cors.maxAge"]);

        let ok = route(json!({"retry": {"codes": [500, 502, 503, 504, 429], "attempts": 3, "backoff": "100ms"}}));
        let Ok(Spec::HttpRoute(r)) = validate("HTTPRoute", &ok) else { panic!("retry route") };
        assert_eq!(r.rules[0].retry.as_ref().unwrap().attempts, Some(3));
        assert!(validate("HTTPRoute", &route(json!({"retry": {}}))).is_ok());
        assert_eq!(
            fields("HTTPRoute", route(json!({"retry": {"codes": [500, 399, 600, 500], "attempts": 0, "backoff": "1.5s"}}))),
            [
                "spec.rules[0].retry.codes[1]",
                "spec.rules[0].retry.codes[2]",
                "spec.rules[0].retry.codes[3]",
                "spec.rules[0].retry.attempts",
                "spec.rules[0].retry.backoff"
            ]
        );
        assert_eq!(fields("HTTPRoute", route(json!({"retry": {"attempts": 1, "perTryTimeout": "1s"}}))), ["spec.rules[0].retry.perTryTimeout"]);
        assert_eq!(fields("HTTPRoute", route(json!({"retry": {"codes": ["500"]}}))), ["spec.rules[0].retry.codes[0]"]);
    }

    #[test]
    fn listener_sets_and_allowed_listeners_name_their_fields() {
        let ok = json!({"parentRef": {"name": "web", "namespace": "infra"}, "listeners": [
            {"name": "extra", "port": 8081, "protocol": "HTTP", "hostname": "a.example.com", "allowedRoutes": {"namespaces": {"from": "All"}}},
            {"name": "tls", "port": 8443, "protocol": "TLS", "tls": {"mode": "Passthrough"}}]});
        let Ok(Spec::ListenerSet(ls)) = validate("ListenerSet", &ok) else { panic!("listener set") };
        assert!(ls.parent_ref.is_gateway());
        assert_eq!(fields("ListenerSet", json!({"parentRef": {"name": "web"}, "listeners": []})), ["spec.listeners"]);
        assert!(validate("ListenerSet", &json!({"listeners": []})).unwrap_err()[0].to_string().contains("parentRef"));
        let bad = json!({"parentRef": {"name": "Web_1", "kind": "Service", "group": ""}, "listeners": [
            {"name": "a", "port": 70000, "protocol": "HTTP", "tls": {"certificateRefs": [{"name": "c"}]}},
            {"name": "a", "port": 80, "protocol": "TCP", "hostname": "x.example.com"},
            {"name": "s", "port": 443, "protocol": "HTTPS", "tls": {"mode": "Passthrough", "certificateRefs": [{"name": "c"}]}},
            {"name": "t", "port": 444, "protocol": "TLS", "tls": {"certificateRefs": [{"name": "c"}]}},
            {"name": "r", "port": 81, "protocol": "HTTP", "allowedRoutes": {"namespaces": {"from": "Selector"}}}]});
        assert_eq!(
            fields("ListenerSet", bad),
            [
                "spec.parentRef.name",
                "spec.parentRef.kind",
                "spec.listeners[0].port",
                "spec.listeners[0].tls",
                "spec.listeners[1].name",
                "spec.listeners[1].hostname",
                "spec.listeners[4].allowedRoutes.namespaces.selector",
                "spec.listeners[2].tls.mode",
                "spec.listeners[3].tls.mode"
            ]
        );
        let many: Vec<Value> = (0..65).map(|i| json!({"name": format!("l{i}"), "port": 80 + i, "protocol": "HTTP"})).collect();
        assert_eq!(fields("ListenerSet", json!({"parentRef": {"name": "w"}, "listeners": many})), ["spec.listeners"]);
        let gw = |allowed: Value| json!({"gatewayClassName": "c", "allowedListeners": allowed, "listeners": [{"name": "a", "port": 80, "protocol": "HTTP"}]});
        assert!(validate("Gateway", &gw(json!({"namespaces": {"from": "Same"}}))).is_ok());
        assert!(validate("Gateway", &gw(json!({}))).is_ok());
        assert_eq!(fields("Gateway", gw(json!({"namespaces": {"from": "Some"}}))), ["spec.allowedListeners.namespaces.from"]);
        assert_eq!(fields("Gateway", gw(json!({"namespaces": {"from": "Selector"}}))), ["spec.allowedListeners.namespaces.selector"]);
        assert_eq!(fields("Gateway", gw(json!({"namespace": {}}))), ["spec.allowedListeners.namespace"]);
    }

    #[test]
    fn backend_tls_policies_name_their_fields() {
        let ok = json!({"targetRefs": [{"group": "", "kind": "Service", "name": "s", "sectionName": "https"}, {"group": "", "kind": "Service", "name": "s", "sectionName": "grpc"}],
            "validation": {"caCertificateRefs": [{"group": "", "kind": "Secret", "name": "ca"}], "hostname": "s.example.com",
                           "subjectAltNames": [{"type": "Hostname", "hostname": "s.example.com"}, {"type": "URI", "uri": "spiffe://td/ns/a/sa/s"}]}});
        assert!(matches!(validate("BackendTLSPolicy", &ok), Ok(Spec::BackendTlsPolicy(_))));
        let system = json!({"targetRefs": [{"group": "networking.istio.io", "kind": "ServiceEntry", "name": "api"}],
            "validation": {"wellKnownCACertificates": "System", "hostname": "api.example.com"}});
        assert!(matches!(validate("BackendTLSPolicy", &system), Ok(Spec::BackendTlsPolicy(_))));
        let bad = json!({"targetRefs": [{"group": "", "kind": "Service", "name": "s"}, {"group": "", "kind": "Service", "name": "s"}],
            "validation": {"hostname": "*.example.com", "subjectAltNames": [{"type": "Hostname"}, {"type": "IP", "hostname": "a"}]}});
        assert_eq!(
            fields("BackendTLSPolicy", bad),
            [
                "spec.targetRefs[1]",
                "spec.validation.hostname",
                "spec.validation",
                "spec.validation.subjectAltNames[0].hostname",
                "spec.validation.subjectAltNames[1].type"
            ]
        );
        let both = json!({"targetRefs": [{"group": "", "kind": "ConfigMap", "name": "s"}],
            "validation": {"hostname": "a.b", "wellKnownCACertificates": "Mine", "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}]}});
        assert_eq!(
            fields("BackendTLSPolicy", both),
            ["spec.targetRefs[0].kind", "spec.validation", "spec.validation.wellKnownCACertificates", "spec.validation.caCertificateRefs[0].kind"]
        );
        assert_eq!(
            fields("BackendTLSPolicy", json!({"targetRefs": [], "validation": {"hostname": "a.b", "wellKnownCACertificates": "System"}})),
            ["spec.targetRefs"]
        );
    }
}
