//! VirtualService → Envoy routes (RDS), following Pilot's conversion.

use super::util::{any, fraction, header_options, istio_duration, string_matcher};
use super::{destination_rule_for, outbound_cluster_name};
use crate::mesh::{Config, Mesh, Service};
use crate::model::istio::common::Destination;
use crate::model::istio::delegate::merge_routes;
use crate::model::istio::destination_rule::ConsistentHashLb;
use crate::model::istio::virtual_service::{Delegate, Headers, HttpMatchRequest, HttpRoute, RedirectPortSelection, UnmatchedPreflights};
use crate::model::istio::{resolve_short_name, VirtualService};
use crate::model::proxy::ProxyIdentity;
use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource, RuntimeFractionalPercent};
use envoy_types::pb::envoy::config::route::v3::{
    header_matcher::HeaderMatchSpecifier,
    redirect_action::{PathRewriteSpecifier, SchemeRewriteSpecifier},
    retry_policy::{RetryBackOff, RetryHostPredicate},
    route::Action,
    route_action::{
        hash_policy::{ConnectionProperties, Cookie, Header, PolicySpecifier, QueryParameter},
        ClusterSpecifier, HashPolicy, HostRewriteSpecifier, RequestMirrorPolicy,
    },
    route_match::PathSpecifier,
    weighted_cluster::ClusterWeight,
    DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction, RetryPolicy, Route, RouteAction, RouteMatch, VirtualHost, WeightedCluster,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{fault_delay::FaultDelaySecifier, FaultDelay};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{fault_abort::ErrorType, FaultAbort, HttpFault};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use std::collections::BTreeMap;

pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
pub const CORS_FILTER: &str = "envoy.filters.http.cors";

/// Where the routes are being built for: a sidecar's outbound port, or a
/// gateway (`namespace/name`) server port.
pub struct RouteCtx<'a> {
    pub mesh: &'a Mesh,
    pub proxy: &'a ProxyIdentity,
    /// Which service each hostname is, for this proxy.
    pub scope: &'a super::scope::ProxyScope<'a>,
    pub port: u32,
    /// `Some("ns/name")` for gateway routes; `None` for the mesh.
    pub gateway: Option<&'a str>,
}

impl RouteCtx<'_> {
    /// Does a VirtualService (or one of its matches) with this `gateways`
    /// list apply here? Empty means `mesh`.
    fn gateways_apply(&self, gateways: &[String], vs_ns: &str) -> bool {
        match self.gateway {
            None => gateways.is_empty() || gateways.iter().any(|g| g == "mesh"),
            Some(gw) => gateways.iter().any(|g| if g.contains('/') { g == gw } else { format!("{vs_ns}/{g}") == gw }),
        }
    }

    /// A VirtualService applies to this proxy: exported to its namespace and
    /// bound to this gateway (or the mesh).
    pub fn vs_applies(&self, vs: &Config<VirtualService>) -> bool {
        crate::mesh::exported_to(&vs.spec.export_to, &vs.key.namespace, &self.proxy.namespace) && self.gateways_apply(&vs.spec.gateways, &vs.key.namespace)
    }

    /// Whether a `tcp` or `tls` match's proxy-side conditions hold here:
    /// its port (if any) is this listener's, its source labels are the
    /// proxy's, and its gateways (if any) include this one (or `mesh`).
    /// Destination subnets and SNI hosts are matched by Envoy.
    pub(super) fn l4_match_applies(&self, port: Option<u32>, source_labels: &BTreeMap<String, String>, gateways: &[String], vs_ns: &str) -> bool {
        port.is_none_or(|p| p == self.port)
            && source_labels.iter().all(|(k, v)| self.proxy.labels.get(k) == Some(v))
            && (gateways.is_empty() || self.gateways_apply(gateways, vs_ns))
    }

    fn match_applies(&self, m: &HttpMatchRequest, vs_ns: &str) -> bool {
        if m.port.is_some_and(|p| p != self.port) {
            return false;
        }
        if !m.source_labels.iter().all(|(k, v)| self.proxy.labels.get(k) == Some(v)) {
            return false;
        }
        if m.source_namespace.as_ref().is_some_and(|ns| *ns != self.proxy.namespace) {
            return false;
        }
        m.gateways.is_empty() || self.gateways_apply(&m.gateways, vs_ns)
    }
}

/// The oldest VirtualService that applies here and names `host`. On a
/// sidecar, a hostname a namespace owns (`NAME.NS.svc.DOMAIN`, see
/// `mesh::hosts`) is routed only by VirtualServices of that namespace, of
/// the proxy's own (its client-side rules) and of the root namespace: one
/// in a third namespace cannot redirect other namespaces' traffic to it
/// (stricter than Istio, where any exported VirtualService may).
/// As in Istio, one private to the proxy's namespace (`exportTo: ["."]`,
/// a Gateway API consumer route among them) comes before the others.
pub fn virtual_service_for<'a>(ctx: &RouteCtx<'a>, host: &str) -> Option<&'a Config<VirtualService>> {
    let config = &ctx.mesh.config;
    let owner = match crate::mesh::hosts::owner(host, &config.domain_suffix) {
        crate::mesh::hosts::Owner::Namespace(ns) if ctx.gateway.is_none() => Some(ns),
        _ => None,
    };
    let may_route = |ns: &str| owner.as_ref().is_none_or(|o| ns == o || ns == ctx.proxy.namespace || ns == config.root_namespace);
    let candidates = ctx.mesh.virtual_services_for_host(host);
    let ns = &ctx.proxy.namespace;
    let private = candidates
        .iter()
        .filter(|vs| vs.key.namespace == *ns && !vs.spec.export_to.is_empty() && vs.spec.export_to.iter().all(|e| e == "." || e == ns.as_str()));
    private.chain(candidates.iter()).copied().find(|vs| may_route(&vs.key.namespace) && ctx.vs_applies(vs)).map(|v| v.as_ref())
}

/// Domains a service answers to from a proxy in `proxy_ns`: the FQDN and,
/// for `NAME.NS.svc.SUFFIX` names, `NAME.NS.svc` and `NAME.NS` (and `NAME`
/// from the same namespace); each also with `:PORT`.
pub fn domains(svc: &Service, port: u32, proxy_ns: &str, suffix: &str) -> Vec<String> {
    let mut names = vec![svc.hostname.clone()];
    if let Some(short) = svc.hostname.strip_suffix(&format!(".svc.{suffix}")) {
        names.push(format!("{short}.svc"));
        names.push(short.to_string());
        if svc.namespace == proxy_ns {
            if let Some((name, _)) = short.split_once('.') {
                names.push(name.to_string());
            }
        }
    }
    let mut out = Vec::with_capacity(names.len() * 2);
    for n in names {
        out.push(format!("{n}:{port}"));
        out.push(n);
    }
    out
}

/// The [`domains`] of each of `services` (in order) on `port`, none listed
/// twice (Envoy refuses a domain two virtual hosts list): the names of
/// services in the mesh's domain (`NAME.NS.svc.SUFFIX`, whose owner
/// namespace alone declares them, and their short forms) come before any
/// other service's, so that an entry for the external name `reviews.team-b`
/// cannot take the short name `reviews.team-b` of team-b's service; then
/// first come, first served.
pub fn unique_domains(services: &[&Service], port: u32, proxy_ns: &str, suffix: &str) -> Vec<Vec<String>> {
    let in_mesh = format!(".svc.{suffix}");
    let mut seen = std::collections::BTreeSet::new();
    let mut out = vec![Vec::new(); services.len()];
    for first in [true, false] {
        for (i, svc) in services.iter().enumerate().filter(|(_, s)| s.hostname.ends_with(&in_mesh) == first) {
            out[i] = domains(svc, port, proxy_ns, suffix).into_iter().filter(|d| seen.insert(d.clone())).collect();
        }
    }
    out
}

/// A service's virtual host on one port: the VirtualService's routes if one
/// applies, else a default route to the service. As in Istio, a
/// VirtualService none of whose routes applies on this port (each match
/// names another `port`, say: a Gateway API mesh route whose parentRef
/// names one) leaves the port's default route in place.
pub fn virtual_host(ctx: &RouteCtx, svc: &Service, domains: Vec<String>) -> VirtualHost {
    let routes = virtual_service_for(ctx, &svc.hostname).map(|vs| http_routes(ctx, vs, Some(svc))).unwrap_or_default();
    let routes = if routes.is_empty() { vec![default_route(ctx, svc)] } else { routes };
    VirtualHost { name: format!("{}:{}", svc.hostname, ctx.port), domains, routes, ..Default::default() }
}

fn default_route(ctx: &RouteCtx, svc: &Service) -> Route {
    let dest = Destination { host: svc.hostname.clone(), subset: None, port: None };
    let action = RouteAction {
        cluster_specifier: Some(ClusterSpecifier::Cluster(outbound_cluster_name(ctx.port, "", &svc.hostname))),
        retry_policy: Some(default_retry_policy()),
        hash_policy: hash_policies(ctx, &dest, &svc.namespace),
        timeout: Some(super::util::millis(0)),
        ..Default::default()
    };
    Route { name: "default".into(), r#match: Some(prefix_match("/")), action: Some(Action::Route(action)), ..Default::default() }
}

fn prefix_match(p: &str) -> RouteMatch {
    RouteMatch { path_specifier: Some(PathSpecifier::Prefix(p.into())), ..Default::default() }
}

/// Istio's retry policy when a route sets none: 2 attempts on connection
/// failures and refused streams, on another host.
pub fn default_retry_policy() -> RetryPolicy {
    retry_policy(2, "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes", (None, None))
}

/// `backoff` (nonzero) is Envoy's base interval, the first retry's wait
/// drawn from [0, backoff), the n-th's from [0, (2^n - 1) * backoff),
/// at most ten times it (Envoy's fully jittered exponential back-off).
fn retry_policy(
    attempts: u32,
    retry_on: &str,
    (per_try, backoff): (Option<&crate::model::istio::Duration>, Option<&crate::model::istio::Duration>),
) -> RetryPolicy {
    // Istio lets retryOn carry status codes ("503,connect-failure").
    let (codes, conditions): (Vec<&str>, Vec<&str>) = retry_on.split(',').map(str::trim).filter(|s| !s.is_empty()).partition(|s| s.parse::<u32>().is_ok());
    let mut conditions: Vec<String> = conditions.into_iter().map(String::from).collect();
    if !codes.is_empty() && !conditions.iter().any(|c| c == "retriable-status-codes") {
        conditions.push("retriable-status-codes".into());
    }
    RetryPolicy {
        retry_on: conditions.join(","),
        num_retries: Some(UInt32Value { value: attempts }),
        per_try_timeout: per_try.map(istio_duration),
        retriable_status_codes: codes.iter().filter_map(|c| c.parse().ok()).collect(),
        retry_host_predicate: vec![RetryHostPredicate {
            name: "envoy.retry_host_predicates.previous_hosts".into(),
            config_type: Some(envoy_types::pb::envoy::config::route::v3::retry_policy::retry_host_predicate::ConfigType::TypedConfig(any(
                &PreviousHostsPredicate::default(),
            ))),
        }],
        host_selection_retry_max_attempts: 5,
        retry_back_off: backoff
            .filter(|b| b.to_std().is_ok_and(|d| !d.is_zero()))
            .map(|b| RetryBackOff { base_interval: Some(istio_duration(b)), max_interval: None }),
        ..Default::default()
    }
}

/// Every Envoy route of a VirtualService's `http` section that applies here.
/// Each Istio match becomes one Envoy route (matches are OR-ed).
pub fn http_routes(ctx: &RouteCtx, vs: &Config<VirtualService>, _svc: Option<&Service>) -> Vec<Route> {
    let mut out = Vec::new();
    let mut push = |vs: &Config<VirtualService>, r: &HttpRoute, i: usize| {
        let name = r.name.clone().unwrap_or_else(|| format!("{}.{}.{i}", vs.key.namespace, vs.key.name));
        let matches: Vec<RouteMatch> = if r.matches.is_empty() {
            vec![prefix_match("/")]
        } else {
            r.matches.iter().filter(|m| ctx.match_applies(m, &vs.key.namespace)).map(route_match).collect()
        };
        for m in matches {
            out.push(route(ctx, vs, r, name.clone(), m));
        }
    };
    for (i, r) in vs.spec.http.iter().enumerate() {
        let Some(delegate) = &r.delegate else {
            push(vs, r, i);
            continue;
        };
        // The child's routes in its order, under this route's matches;
        // no child (or one that is not a delegate): no route.
        if let Some(child) = delegate_child(ctx.mesh, vs, delegate) {
            for (j, merged) in merge_routes(r, &child.spec.http).iter().enumerate() {
                push(child, merged, j);
            }
        }
    }
    out
}

/// The VirtualService a `delegate` names (in the root's namespace unless
/// it names one): it must have no hosts (a root is never a child) and be
/// exported to the root's namespace.
fn delegate_child<'m>(mesh: &'m Mesh, root: &Config<VirtualService>, delegate: &Delegate) -> Option<&'m Config<VirtualService>> {
    let name = delegate.name.as_deref()?;
    let ns = delegate.namespace.as_deref().unwrap_or(&root.key.namespace);
    mesh.virtual_services
        .iter()
        .find(|c| c.key.name == name && c.key.namespace == ns)
        .filter(|c| c.spec.hosts.is_empty() && crate::mesh::exported_to(&c.spec.export_to, &c.key.namespace, &root.key.namespace))
        .map(|c| c.as_ref())
}

fn route_match(m: &HttpMatchRequest) -> RouteMatch {
    let ignore_case = m.ignore_uri_case.unwrap_or(false);
    let path = match m.uri.as_ref().and_then(|u| u.kind()) {
        Some(crate::model::istio::common::MatchKind::Exact(p)) => PathSpecifier::Path(p.into()),
        Some(crate::model::istio::common::MatchKind::Prefix(p)) => PathSpecifier::Prefix(p.into()),
        Some(crate::model::istio::common::MatchKind::Regex(r)) => {
            PathSpecifier::SafeRegex(envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher { regex: r.into(), ..Default::default() })
        }
        None => PathSpecifier::Prefix("/".into()),
    };
    let mut headers = Vec::new();
    let mut header = |name: &str, sm: &crate::model::istio::common::StringMatch, invert: bool| {
        let spec = match string_matcher(sm, false) {
            Some(matcher) => HeaderMatchSpecifier::StringMatch(matcher),
            // `{}` matches presence (or, inverted, absence).
            None => HeaderMatchSpecifier::PresentMatch(true),
        };
        headers.push(HeaderMatcher { name: name.into(), invert_match: invert, header_match_specifier: Some(spec), ..Default::default() });
    };
    for (name, sm) in &m.headers {
        header(name, sm, false);
    }
    for (name, sm) in &m.without_headers {
        header(name, sm, true);
    }
    if let Some(sm) = &m.method {
        header(":method", sm, false);
    }
    if let Some(sm) = &m.authority {
        header(":authority", sm, false);
    }
    if let Some(sm) = &m.scheme {
        header(":scheme", sm, false);
    }
    let query_parameters = m
        .query_params
        .iter()
        .map(|(name, sm)| QueryParameterMatcher {
            name: name.clone(),
            query_parameter_match_specifier: Some(match string_matcher(sm, false) {
                Some(s) => envoy_types::pb::envoy::config::route::v3::query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(s),
                None => envoy_types::pb::envoy::config::route::v3::query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true),
            }),
        })
        .collect();
    RouteMatch { path_specifier: Some(path), case_sensitive: Some(BoolValue { value: !ignore_case }), headers, query_parameters, ..Default::default() }
}

fn route(ctx: &RouteCtx, vs: &Config<VirtualService>, r: &HttpRoute, name: String, m: RouteMatch) -> Route {
    let ns = &vs.key.namespace;
    let mut route = Route { name, r#match: Some(m), ..Default::default() };
    if let Some(Headers { request, response }) = &r.headers {
        if let Some(h) = request {
            route.request_headers_to_add = header_options(&h.set, &h.add);
            route.request_headers_to_remove = h.remove.clone();
        }
        if let Some(h) = response {
            route.response_headers_to_add = header_options(&h.set, &h.add);
            route.response_headers_to_remove = h.remove.clone();
        }
    }
    if let Some(redirect) = &r.redirect {
        let code = match redirect.redirect_code.unwrap_or(301) {
            302 => 1, // FOUND
            303 => 2, // SEE_OTHER
            307 => 3, // TEMPORARY_REDIRECT
            308 => 4, // PERMANENT_REDIRECT
            _ => 0,   // MOVED_PERMANENTLY
        };
        let mut action = RedirectAction {
            host_redirect: redirect.authority.clone().unwrap_or_default(),
            response_code: code,
            path_rewrite_specifier: redirect.uri.clone().map(PathRewriteSpecifier::PathRedirect),
            scheme_rewrite_specifier: redirect.scheme.clone().map(SchemeRewriteSpecifier::SchemeRedirect),
            ..Default::default()
        };
        if let (None, Some(prefix)) = (&redirect.uri, &redirect.prefix_rewrite) {
            action.path_rewrite_specifier = Some(PathRewriteSpecifier::PrefixRewrite(prefix.clone()));
        }
        if let Some(p) = redirect.port {
            action.port_redirect = p;
        } else if redirect.derive_port == Some(RedirectPortSelection::FromRequestPort) {
            action.port_redirect = ctx.port;
        }
        route.action = Some(Action::Redirect(action));
        return route;
    }
    if let Some(dr) = &r.direct_response {
        let body = dr.body.as_ref().and_then(|b| b.string.clone()).map(|s| DataSource { specifier: Some(Specifier::InlineString(s)), ..Default::default() });
        route.action = Some(Action::DirectResponse(DirectResponseAction { status: dr.status, body, ..Default::default() }));
        return route;
    }

    let mut action = RouteAction { timeout: Some(r.timeout.as_ref().map_or_else(|| super::util::millis(0), istio_duration)), ..Default::default() };
    let cluster_of = |d: &Destination| {
        let host = resolve_short_name(&d.host, ns, &ctx.mesh.config.domain_suffix);
        let port = d
            .port
            .as_ref()
            .map(|p| p.number)
            .or_else(|| ctx.scope.service(&host).filter(|s| s.ports.len() == 1).map(|s| s.ports[0].number))
            .unwrap_or(ctx.port);
        outbound_cluster_name(port, d.subset.as_deref().unwrap_or(""), &host)
    };
    match r.route.as_slice() {
        [] => {}
        [one] => {
            action.cluster_specifier = Some(ClusterSpecifier::Cluster(cluster_of(&one.destination)));
            if let Some(Headers { request, response }) = &one.headers {
                if let Some(h) = request {
                    route.request_headers_to_add.extend(header_options(&h.set, &h.add));
                    route.request_headers_to_remove.extend(h.remove.iter().cloned());
                }
                if let Some(h) = response {
                    route.response_headers_to_add.extend(header_options(&h.set, &h.add));
                    route.response_headers_to_remove.extend(h.remove.iter().cloned());
                }
            }
        }
        many => {
            let clusters = many
                .iter()
                .map(|d| {
                    let mut cw = ClusterWeight {
                        name: cluster_of(&d.destination),
                        weight: Some(UInt32Value { value: d.weight.unwrap_or(0).max(0) as u32 }),
                        ..Default::default()
                    };
                    if let Some(Headers { request, response }) = &d.headers {
                        if let Some(h) = request {
                            cw.request_headers_to_add = header_options(&h.set, &h.add);
                            cw.request_headers_to_remove = h.remove.clone();
                        }
                        if let Some(h) = response {
                            cw.response_headers_to_add = header_options(&h.set, &h.add);
                            cw.response_headers_to_remove = h.remove.clone();
                        }
                    }
                    cw
                })
                .collect();
            action.cluster_specifier = Some(ClusterSpecifier::WeightedClusters(WeightedCluster { clusters, ..Default::default() }));
        }
    }
    if let Some(first) = r.route.first() {
        action.hash_policy = hash_policies(ctx, &first.destination, ns);
    }
    action.retry_policy = match &r.retries {
        None => Some(default_retry_policy()),
        Some(rt) if rt.attempts.unwrap_or(0) <= 0 => None,
        Some(rt) => Some(retry_policy(
            rt.attempts.unwrap_or(0) as u32,
            rt.retry_on.as_deref().unwrap_or("connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"),
            (rt.per_try_timeout.as_ref(), rt.backoff.as_ref()),
        )),
    };
    if let Some(rw) = &r.rewrite {
        if let Some(uri) = &rw.uri {
            action.prefix_rewrite = uri.clone();
        }
        if let Some(a) = &rw.authority {
            action.host_rewrite_specifier = Some(HostRewriteSpecifier::HostRewriteLiteral(a.clone()));
        }
        if let Some(re) = rw.uri_regex_rewrite.as_ref().filter(|re| rw.uri.is_none() && !re.pattern.is_empty()) {
            action.regex_rewrite = Some(envoy_types::pb::envoy::r#type::matcher::v3::RegexMatchAndSubstitute {
                pattern: Some(envoy_types::pb::envoy::r#type::matcher::v3::RegexMatcher { regex: re.pattern.clone(), ..Default::default() }),
                substitution: re.rewrite.clone(),
            });
        }
    }
    let mut mirrors: Vec<(Destination, Option<crate::model::istio::common::Percent>)> = Vec::new();
    if let Some(m) = &r.mirror {
        let pct = r
            .mirror_percentage
            .or_else(|| r.mirror_percent.map(|p| crate::model::istio::common::Percent { value: Some(crate::model::istio::common::Float::new(p as f64)) }));
        mirrors.push((m.clone(), pct));
    }
    for m in &r.mirrors {
        mirrors.push((m.destination.clone(), m.percentage));
    }
    action.request_mirror_policies = mirrors
        .iter()
        .map(|(d, pct)| RequestMirrorPolicy {
            cluster: cluster_of(d),
            runtime_fraction: Some(RuntimeFractionalPercent { default_value: Some(fraction(pct.as_ref(), 100.0)), runtime_key: String::new() }),
            ..Default::default()
        })
        .collect();

    let mut per_filter = BTreeMap::new();
    if let Some(f) = &r.fault {
        per_filter.insert(FAULT_FILTER.to_string(), any(&http_fault(f)));
    }
    if let Some(c) = &r.cors_policy {
        per_filter.insert(CORS_FILTER.to_string(), any(&cors_policy(c)));
    }
    route.typed_per_filter_config = per_filter.into_iter().collect();
    route.action = Some(Action::Route(action));
    route
}

fn http_fault(f: &crate::model::istio::virtual_service::HttpFaultInjection) -> HttpFault {
    let delay = f.delay.as_ref().map(|d| {
        let pct =
            d.percentage.or_else(|| d.percent.map(|p| crate::model::istio::common::Percent { value: Some(crate::model::istio::common::Float::new(p as f64)) }));
        FaultDelay {
            fault_delay_secifier: d.fixed_delay.as_ref().map(|fd| FaultDelaySecifier::FixedDelay(istio_duration(fd))),
            percentage: Some(fraction(pct.as_ref(), 100.0)),
        }
    });
    let abort = f.abort.as_ref().and_then(|a| {
        // As Pilot: an HTTP status, or a gRPC status by its code (gRPC
        // clients honour it, A33; Envoy answers with that grpc-status).
        let error_type = a
            .http_status
            .map(|s| ErrorType::HttpStatus(s as u32))
            .or_else(|| a.grpc_status.as_deref().and_then(crate::model::istio::virtual_service::grpc_status_code).map(ErrorType::GrpcStatus))?;
        Some(FaultAbort { error_type: Some(error_type), percentage: Some(fraction(a.percentage.as_ref(), 100.0)), ..Default::default() })
    });
    HttpFault { delay, abort, ..Default::default() }
}

fn cors_policy(c: &crate::model::istio::virtual_service::CorsPolicy) -> CorsPolicy {
    let mut origins: Vec<_> = c.allow_origins.iter().filter_map(|m| string_matcher(m, false)).collect();
    origins.extend(
        c.allow_origin.iter().filter_map(|o| string_matcher(&crate::model::istio::common::StringMatch { exact: Some(o.clone()), ..Default::default() }, false)),
    );
    CorsPolicy {
        allow_origin_string_match: origins,
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c.max_age.as_ref().map(|d| d.to_std().unwrap_or_default().as_secs().to_string()).unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|v| BoolValue { value: v }),
        // Istio's: IGNORE answers a preflight from another origin at the
        // proxy (without an allowed origin); FORWARD and unset pass it on.
        forward_not_matching_preflights: match c.unmatched_preflights {
            Some(UnmatchedPreflights::Ignore) => Some(BoolValue { value: false }),
            Some(UnmatchedPreflights::Forward) => Some(BoolValue { value: true }),
            Some(UnmatchedPreflights::Unspecified) | None => None,
        },
        ..Default::default()
    }
}

/// Hash policies from the destination's DestinationRule consistentHash.
fn hash_policies(ctx: &RouteCtx, dest: &Destination, ns: &str) -> Vec<HashPolicy> {
    let host = resolve_short_name(&dest.host, ns, &ctx.mesh.config.domain_suffix);
    let Some(svc) = ctx.scope.service(&host) else { return Vec::new() };
    let Some(dr) = destination_rule_for(ctx.mesh, &ctx.proxy.namespace, svc) else { return Vec::new() };
    let subset_policy = dest.subset.as_ref().and_then(|s| dr.spec.subsets.iter().find(|x| &x.name == s)).and_then(|s| s.traffic_policy.as_ref());
    let lb = subset_policy.and_then(|p| p.load_balancer.as_ref()).or_else(|| dr.spec.traffic_policy.as_ref().and_then(|p| p.load_balancer.as_ref()));
    match lb.and_then(|lb| lb.consistent_hash.as_ref()) {
        Some(ch) => hash_policy(ch).into_iter().collect(),
        None => Vec::new(),
    }
}

fn hash_policy(ch: &ConsistentHashLb) -> Option<HashPolicy> {
    let spec = if let Some(h) = &ch.http_header_name {
        PolicySpecifier::Header(Header { header_name: h.clone(), ..Default::default() })
    } else if let Some(c) = &ch.http_cookie {
        PolicySpecifier::Cookie(Cookie {
            name: c.name.clone(),
            path: c.path.clone().unwrap_or_default(),
            ttl: c.ttl.as_ref().map(istio_duration),
            ..Default::default()
        })
    } else if ch.use_source_ip == Some(true) {
        PolicySpecifier::ConnectionProperties(ConnectionProperties { source_ip: true })
    } else if let Some(q) = &ch.http_query_parameter_name {
        PolicySpecifier::QueryParameter(QueryParameter { name: q.clone() })
    } else {
        return None;
    };
    Some(HashPolicy { policy_specifier: Some(spec), terminal: false })
}

/// The HCM filters every HTTP listener carries: fault and CORS (configured
/// per route, inert elsewhere), then the router.
pub fn http_filter_names() -> [&'static str; 3] {
    [FAULT_FILTER, CORS_FILTER, "envoy.filters.http.router"]
}
