//! AuthorizationPolicy `action: CUSTOM` → Envoy external authorization,
//! as istiod builds it (pilot/pkg/security/authz/builder):
//!
//! - Per provider the CUSTOM policies selecting a proxy name (sorted by
//!   name), two HTTP filters ahead of the AUDIT/DENY/ALLOW RBAC filters: an
//!   RBAC filter with only `shadow_rules` (action DENY) holding the
//!   policies' rules, keyed `istio-ext-authz-<provider>-ns[NS]-policy[NAME]-rule[I]`
//!   (a shadow match enforces nothing; it writes the matched key into
//!   dynamic metadata, `istio_ext_authz_shadow_effective_policy_id`), then
//!   `ext_authz` with `filter_enabled_metadata` on that key's prefix: the
//!   external check runs only for requests a CUSTOM rule matches. So
//!   CUSTOM is evaluated before DENY and ALLOW; a CUSTOM deny ends the
//!   request, an allow goes on to them.
//! - TCP ports: the network RBAC (shadow) and network `ext_authz` filters,
//!   for a gRPC provider only (an HTTP provider is left off TCP chains).
//! - The provider is the MeshConfig's `extensionProviders` entry of that
//!   name (`envoyExtAuthzHttp` / `envoyExtAuthzGrpc`); its `service` must
//!   be a service of the mesh with that `port`, whose cluster
//!   (`outbound|PORT||HOST`) is added to the proxy when its scope lacks it
//!   ([`ensure_clusters`]). A provider that is unknown, of another kind, or
//!   whose service is missing fails closed as in istiod: the policies'
//!   rules become an enforcing DENY, keyed `...-deny-due-to-bad-CUSTOM-action`
//!   (`lodestar analyze` reports why).
//! - Several providers for one workload get a pair each (istiod's
//!   `PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS`). Dry-run CUSTOM
//!   policies (`istio.io/dry-run`) are left out, as istiod 1.29 does.

use super::authz::{build, policy_name, Built, HTTP_RBAC, NETWORK_RBAC};
use super::util::{any, duration};
use crate::mesh::{Authz, Config, Mesh, Service};
use crate::model::istio::authorization_policy::Action;
use crate::model::istio::mesh_config::{parse_status, ExtAuthzGrpc, ExtAuthzHttp, ProviderKind, RequestBody};
use crate::model::proxy::ProxyIdentity;
use envoy_types::pb::envoy::config::core::v3::{grpc_service, GrpcService, HeaderValue, HttpUri};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter};
use envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::{
    ext_authz::Services, AuthorizationRequest, AuthorizationResponse, BufferSettings, ExtAuthz, HttpService,
};
use envoy_types::pb::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_filter, HttpFilter};
use envoy_types::pb::envoy::r#type::matcher::v3::{
    metadata_matcher::path_segment::Segment, metadata_matcher::PathSegment, string_matcher::MatchPattern, value_matcher, ListStringMatcher, MetadataMatcher,
    StringMatcher, ValueMatcher,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use std::collections::BTreeMap;
use std::sync::Arc;

pub const HTTP_EXT_AUTHZ: &str = "envoy.filters.http.ext_authz";
pub const NETWORK_EXT_AUTHZ: &str = "envoy.filters.network.ext_authz";
/// Istio's shadow stat prefix and metadata key for CUSTOM rules.
pub const SHADOW_PREFIX: &str = "istio_ext_authz_";
pub const SHADOW_POLICY_ID: &str = "istio_ext_authz_shadow_effective_policy_id";
/// Keys of CUSTOM rules start with this and the provider's name.
pub const KEY_PREFIX: &str = "istio-ext-authz-";
pub const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";
/// istiod's default check timeout (the provider's `timeout` unset).
const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A provider resolved to its service.
#[derive(Debug, Clone)]
pub enum Resolved<'m> {
    Http(&'m ExtAuthzHttp, Arc<Service>),
    Grpc(&'m ExtAuthzGrpc, Arc<Service>),
}

impl Resolved<'_> {
    pub fn service(&self) -> &Arc<Service> {
        match self {
            Resolved::Http(_, s) | Resolved::Grpc(_, s) => s,
        }
    }
    fn port(&self) -> u32 {
        match self {
            Resolved::Http(p, _) => p.port.0,
            Resolved::Grpc(p, _) => p.port.0,
        }
    }
    fn cluster(&self) -> String {
        super::outbound_cluster_name(self.port(), "", &self.service().hostname)
    }
}

/// The ext_authz provider `name` of the mesh's MeshConfig, with its
/// service; or why it cannot be used.
pub fn resolve<'m>(mesh: &'m Mesh, name: &str) -> Result<Resolved<'m>, String> {
    let kind = mesh.mesh_config.provider(name).ok_or_else(|| format!("no extension provider {name:?} in the MeshConfig"))?;
    let (service, port) = match &kind {
        ProviderKind::ExtAuthzHttp(h) => (h.service.as_str(), h.port.0),
        ProviderKind::ExtAuthzGrpc(g) => (g.service.as_str(), g.port.0),
        _ => return Err(format!("extension provider {name:?} is not envoyExtAuthzHttp or envoyExtAuthzGrpc")),
    };
    let svc = provider_service(mesh, name, service, port)?;
    Ok(match kind {
        ProviderKind::ExtAuthzHttp(h) => Resolved::Http(h, svc),
        ProviderKind::ExtAuthzGrpc(g) => Resolved::Grpc(g, svc),
        _ => unreachable!("checked above"),
    })
}

/// The service an extension provider's `service` (`[NAMESPACE/]HOST`) and
/// `port` name: one service of the mesh with that port (istiod's lookup).
pub fn provider_service(mesh: &Mesh, name: &str, service: &str, port: u32) -> Result<Arc<Service>, String> {
    let (ns, host) = match service.split_once('/') {
        Some((ns, host)) => (Some(ns), host),
        None => (None, service),
    };
    let claims: Vec<&Arc<Service>> = mesh.claims(host).iter().filter(|s| ns.is_none_or(|n| s.namespace == n)).collect();
    let svc = match claims.as_slice() {
        [] => return Err(format!("provider {name:?}: no service {service:?} in the mesh")),
        [one] => (*one).clone(),
        _ => return Err(format!("provider {name:?}: {host:?} is a service of several namespaces; write NAMESPACE/{host}")),
    };
    if svc.port(port).is_none() {
        return Err(format!("provider {name:?}: service {host} has no port {port}"));
    }
    Ok(svc)
}

/// The CUSTOM policies of `policies` (enforced ones), by provider name.
fn by_provider<'p>(policies: &[&'p Arc<Config<Authz>>]) -> BTreeMap<String, Vec<&'p Arc<Config<Authz>>>> {
    let mut out: BTreeMap<String, Vec<&Arc<Config<Authz>>>> = BTreeMap::new();
    for p in policies.iter().copied().filter(|p| p.spec.spec.action() == Action::Custom && !p.spec.dry_run) {
        let name = p.spec.spec.provider.as_ref().map(|p| p.name.clone()).unwrap_or_default();
        out.entry(name).or_default().push(p);
    }
    out
}

/// Rename the rules of `b` (keyed `ns[..]-policy[..]-rule[..]`).
fn renamed(mut b: Built, rename: impl Fn(&str) -> String) -> Built {
    if let Some(r) = b.rules.as_mut() {
        r.policies = std::mem::take(&mut r.policies).into_iter().map(|(k, v)| (rename(&k), v)).collect();
    }
    b
}

/// The CUSTOM filters of a proxy's inbound or gateway listeners (HTTP and
/// network), to go before the other RBAC filters.
pub fn filters(mesh: &Mesh, policies: &[&Arc<Config<Authz>>]) -> (Vec<HttpFilter>, Vec<Filter>) {
    let (mut http, mut network) = (Vec::new(), Vec::new());
    for (provider, of_provider) in by_provider(policies) {
        let prefix = format!("{KEY_PREFIX}{provider}");
        match resolve(mesh, &provider) {
            Err(_) => {
                // Fail closed: the matched requests are denied.
                let rename = |k: &str| format!("{k}{BAD_CUSTOM_SUFFIX}");
                http.push(super::authz::http_rbac_filter(&renamed(build(&of_provider, Action::Custom, false), rename), ""));
                network.push(super::authz::network_rbac_filter(&renamed(build(&of_provider, Action::Custom, true), rename), ""));
            }
            Ok(resolved) => {
                let rename = |k: &str| format!("{prefix}-{k}");
                let shadow = |tcp: bool| {
                    let b = renamed(build(&of_provider, Action::Custom, tcp), rename);
                    // Istio: a policy without rules gets a never-matching entry
                    // (`build` does that); shadow only, never enforced.
                    Built { rules: None, shadow: b.rules }
                };
                http.push(super::authz::http_rbac_filter(&shadow(false), SHADOW_PREFIX));
                http.push(HttpFilter {
                    name: HTTP_EXT_AUTHZ.into(),
                    config_type: Some(http_filter::ConfigType::TypedConfig(any(&http_ext_authz(&resolved, &prefix)))),
                    ..Default::default()
                });
                if let Resolved::Grpc(g, _) = &resolved {
                    network.push(super::authz::network_rbac_filter(&shadow(true), SHADOW_PREFIX));
                    let cfg = NetworkExtAuthz {
                        stat_prefix: super::authz::TCP_STAT_PREFIX.into(),
                        grpc_service: Some(grpc_service_of(g, &resolved)),
                        failure_mode_allow: g.fail_open,
                        transport_api_version: 2, // V3
                        filter_enabled_metadata: Some(enabled_when(NETWORK_RBAC, &prefix)),
                        ..Default::default()
                    };
                    network.push(Filter { name: NETWORK_EXT_AUTHZ.into(), config_type: Some(filter::ConfigType::TypedConfig(any(&cfg))) });
                }
            }
        }
    }
    (http, network)
}

/// Run only when the shadow rules of `rbac_filter` matched a rule of this
/// provider.
fn enabled_when(rbac_filter: &str, prefix: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: rbac_filter.into(),
        path: vec![PathSegment { segment: Some(Segment::Key(SHADOW_POLICY_ID.into())) }],
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(StringMatcher {
                match_pattern: Some(MatchPattern::Prefix(prefix.into())),
                ..Default::default()
            })),
        }),
        ..Default::default()
    }
}

fn timeout(t: Option<&crate::model::istio::Duration>) -> envoy_types::pb::google::protobuf::Duration {
    duration(t.and_then(|t| t.to_std().ok()).unwrap_or(DEFAULT_TIMEOUT))
}

fn grpc_service_of(g: &ExtAuthzGrpc, r: &Resolved) -> GrpcService {
    GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
            cluster_name: r.cluster(),
            authority: r.service().hostname.clone(),
            ..Default::default()
        })),
        timeout: Some(timeout(g.timeout.as_ref())),
        ..Default::default()
    }
}

fn body(b: Option<&RequestBody>) -> Option<BufferSettings> {
    b.map(|b| BufferSettings {
        max_request_bytes: b.max_request_bytes.unwrap_or(0),
        allow_partial_message: b.allow_partial_message,
        pack_as_bytes: b.pack_as_bytes,
    })
}

fn status(s: Option<&str>) -> Option<HttpStatus> {
    s.and_then(|s| parse_status(s).ok()).map(|code| HttpStatus { code: code as i32 })
}

/// Istio's header patterns: `abc*` prefix, `*abc` suffix, else exact; any case.
fn patterns(list: &[String]) -> Option<ListStringMatcher> {
    if list.is_empty() {
        return None;
    }
    let patterns = list
        .iter()
        .map(|h| {
            let p = if let Some(prefix) = h.strip_suffix('*') {
                MatchPattern::Prefix(prefix.into())
            } else if let Some(suffix) = h.strip_prefix('*') {
                MatchPattern::Suffix(suffix.into())
            } else {
                MatchPattern::Exact(h.clone())
            };
            StringMatcher { match_pattern: Some(p), ignore_case: true }
        })
        .collect();
    Some(ListStringMatcher { patterns })
}

fn http_ext_authz(r: &Resolved, prefix: &str) -> ExtAuthz {
    let mut cfg = ExtAuthz {
        transport_api_version: 2, // V3
        filter_enabled_metadata: Some(enabled_when(HTTP_RBAC, prefix)),
        ..Default::default()
    };
    match r {
        Resolved::Grpc(g, _) => {
            cfg.services = Some(Services::GrpcService(grpc_service_of(g, r)));
            cfg.failure_mode_allow = g.fail_open;
            cfg.status_on_error = status(g.status_on_error.as_deref());
            cfg.with_request_body = body(g.include_request_body_in_check.as_ref());
        }
        Resolved::Http(h, svc) => {
            let headers_to_add = h
                .include_additional_headers_in_check
                .iter()
                .map(|(k, v)| HeaderValue { key: k.clone(), value: v.clone(), ..Default::default() })
                .collect::<Vec<_>>();
            let response = [&h.headers_to_upstream_on_allow, &h.headers_to_downstream_on_deny, &h.headers_to_downstream_on_allow]
                .iter()
                .any(|l| !l.is_empty())
                .then(|| AuthorizationResponse {
                    allowed_upstream_headers: patterns(&h.headers_to_upstream_on_allow),
                    allowed_client_headers: patterns(&h.headers_to_downstream_on_deny),
                    allowed_client_headers_on_success: patterns(&h.headers_to_downstream_on_allow),
                    ..Default::default()
                });
            #[allow(deprecated)]
            let request = AuthorizationRequest { headers_to_add, ..Default::default() };
            cfg.services = Some(Services::HttpService(HttpService {
                server_uri: Some(HttpUri {
                    uri: format!("http://{}", svc.hostname),
                    timeout: Some(timeout(h.timeout.as_ref())),
                    http_upstream_type: Some(envoy_types::pb::envoy::config::core::v3::http_uri::HttpUpstreamType::Cluster(r.cluster())),
                }),
                path_prefix: h.path_prefix.clone().unwrap_or_default(),
                authorization_request: Some(request),
                authorization_response: response,
                ..Default::default()
            }));
            let allowed = if h.include_request_headers_in_check.is_empty() { &h.include_headers_in_check } else { &h.include_request_headers_in_check };
            cfg.allowed_headers = patterns(allowed);
            cfg.failure_mode_allow = h.fail_open;
            cfg.status_on_error = status(h.status_on_error.as_deref());
            cfg.with_request_body = body(h.include_request_body_in_check.as_ref());
        }
    }
    cfg
}

/// The services of the ext_authz providers the CUSTOM policies selecting
/// `proxy` name: their clusters must be in the proxy's config even where
/// its outbound scope leaves them out (Envoy refuses a gRPC ext_authz
/// whose cluster it does not have).
pub fn provider_services(mesh: &Mesh, proxy: &ProxyIdentity) -> BTreeMap<String, Arc<Service>> {
    let policies = super::authz::selected(mesh, proxy);
    by_provider(&policies).keys().filter_map(|name| resolve(mesh, name).ok()).map(|r| (r.service().hostname.clone(), r.service().clone())).collect()
}

/// Istio's name of a CUSTOM rule (for `authz check` and tests).
pub fn custom_rule_name(provider: &str, namespace: &str, name: &str, rule: usize) -> String {
    format!("{KEY_PREFIX}{provider}-{}", policy_name(namespace, name, rule))
}

/// The provider a CUSTOM shadow key names (`istio-ext-authz-P-ns[...`).
pub fn provider_of_key(key: &str) -> Option<&str> {
    key.strip_prefix(KEY_PREFIX)?.split_once("-ns[").map(|(p, _)| p)
}
