//! AuthorizationPolicy → Envoy RBAC, with Istio's semantics
//! (pilot/pkg/security/authz): the filters and policy names Istio
//! generates, so Envoy's `rbac` stats and `%RESPONSE_CODE_DETAILS%`
//! (`rbac_access_denied_matched_policy[ns[NS]-policy[NAME]-rule[N]]`) name
//! the rule that decided.
//!
//! - The policies that select a proxy (`scope::policy_selects`) become, in
//!   this order, an RBAC filter per action: AUDIT (`LOG`), DENY, ALLOW.
//!   Envoy runs them in order, so DENY wins over ALLOW, and once any ALLOW
//!   policy selects a workload a request no ALLOW rule matches is denied.
//!   CUSTOM policies come first: `extauthz`.
//! - Each rule is one RBAC policy named `ns[NS]-policy[NAME]-rule[I]`:
//!   `from` entries are its principals (ORed), `to` entries its permissions
//!   (ORed), the fields inside one entry and the `when` conditions ANDed,
//!   the values of one field ORed and its `not` values negated. A policy
//!   with no rules gets a rule that never matches (an ALLOW with no rules
//!   denies everything); `rules: [{}]` matches everything.
//! - HTTP ports get the HTTP RBAC filter, TCP ports the RBAC network
//!   filter. On TCP, a field only HTTP has (methods, paths, hosts, request
//!   principals, headers, JWT claims) makes an ALLOW rule match nothing
//!   (the rule is left out) and is ignored in a DENY or AUDIT rule (it
//!   matches more), as Istio documents.
//! - `istio.io/dry-run: "true"` puts the policy's rules in `shadow_rules`
//!   (counted under `istio_dry_run_allow_` / `istio_dry_run_deny_`, never
//!   enforced).
//! - JWT-derived attributes (`requestPrincipals`, `request.auth.*`) read
//!   the token payload that `jwt_authn` writes to dynamic metadata
//!   (`envoy.filters.http.jwt_authn` / `payload`).
//!
//! Envoy's RBAC keeps its policies in a protobuf map, which prost encodes
//! in hash order: the filters are encoded here with the map sorted, so the
//! same policies always give the same bytes and versions.

use super::encode::{put_len_delimited, put_sorted_messages};
use super::scope::policy_selects;
use crate::mesh::{Authz, Config, Mesh};
use crate::model::istio::authorization_policy::{contains_path_template, Action, Attribute, Rule};
use crate::model::proxy::ProxyIdentity;
use envoy_types::pb::envoy::config::core::v3::{CidrRange, TypedExtensionConfig};
use envoy_types::pb::envoy::config::listener::v3::{filter, Filter, Listener};
use envoy_types::pb::envoy::config::rbac::v3::{
    permission, principal, rbac::Action as RbacAction, MetadataSource, Permission, Policy, Principal, Rbac, SourcedMetadata,
};
use envoy_types::pb::envoy::config::route::v3::{header_matcher::HeaderMatchSpecifier, HeaderMatcher};
use envoy_types::pb::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_filter, HttpFilter};
use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    list_matcher, metadata_matcher::path_segment::Segment, metadata_matcher::PathSegment, path_matcher, string_matcher::MatchPattern, value_matcher,
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, RegexMatcher, StringMatcher, ValueMatcher,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use prost::{Message, Name};
use std::sync::Arc;

pub const HTTP_RBAC: &str = "envoy.filters.http.rbac";
pub const NETWORK_RBAC: &str = "envoy.filters.network.rbac";
/// Where `jwt_authn` puts a verified token's payload (`payload_in_metadata`).
pub const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
pub const JWT_PAYLOAD_KEY: &str = "payload";
/// Istio's stat prefixes for dry-run (shadow) rules, and for the network
/// filter.
pub const SHADOW_ALLOW_PREFIX: &str = "istio_dry_run_allow_";
pub const SHADOW_DENY_PREFIX: &str = "istio_dry_run_deny_";
pub const TCP_STAT_PREFIX: &str = "tcp.";

/// Istio's name for one rule of one policy.
pub fn policy_name(namespace: &str, name: &str, rule: usize) -> String {
    format!("ns[{namespace}]-policy[{name}]-rule[{rule}]")
}

/// The policies that select `proxy`, oldest first.
pub fn selected<'m>(mesh: &'m Mesh, proxy: &ProxyIdentity) -> Vec<&'m Arc<Config<Authz>>> {
    let root = &mesh.config.root_namespace;
    mesh.authorization_policies
        .iter()
        .filter(|p| policy_selects(&p.key.namespace, p.spec.spec.selector.as_ref().map(|s| &s.match_labels), root, proxy))
        .collect()
}

/// The RBAC filters of one proxy's inbound (or gateway) listeners: HTTP
/// filters for connection managers, network filters for TCP proxies.
/// Empty when no policy selects the proxy.
#[derive(Debug, Clone, Default)]
pub struct AuthzFilters {
    pub http: Vec<HttpFilter>,
    pub network: Vec<Filter>,
}

impl AuthzFilters {
    pub fn for_proxy(mesh: &Mesh, proxy: &ProxyIdentity) -> AuthzFilters {
        let policies = selected(mesh, proxy);
        if policies.is_empty() {
            return AuthzFilters::default();
        }
        let mut out = AuthzFilters::default();
        // CUSTOM first: ext_authz runs before DENY and ALLOW (`extauthz`).
        (out.http, out.network) = super::extauthz::filters(mesh, &policies);
        for action in [Action::Audit, Action::Deny, Action::Allow] {
            let of_action: Vec<&Arc<Config<Authz>>> = policies.iter().copied().filter(|p| p.spec.spec.action() == action).collect();
            if of_action.is_empty() {
                continue;
            }
            let http = build(&of_action, action, false);
            out.http.push(http_rbac_filter(&http, &shadow_prefix(&http)));
            let tcp = build(&of_action, action, true);
            out.network.push(network_rbac_filter(&tcp, &shadow_prefix(&tcp)));
        }
        out
    }

    /// Put the network filters before every TCP proxy of `l` (TCP ports;
    /// the HTTP filters go into connection managers as they are built,
    /// after `jwt_authn`: the listener builders' `first` filters). A no-op
    /// when there are none.
    pub fn guard_tcp(&self, l: &mut Listener) {
        if self.network.is_empty() {
            return;
        }
        for chain in &mut l.filter_chains {
            if let Some(at) = chain.filters.iter().position(|f| f.name == super::listener::TCP_PROXY) {
                chain.filters.splice(at..at, self.network.iter().cloned());
            }
        }
    }
}

/// Enforced and dry-run rules of one action.
#[derive(Debug, Clone, PartialEq)]
pub struct Built {
    pub rules: Option<Rbac>,
    pub shadow: Option<Rbac>,
}

fn rbac_action(action: Action) -> RbacAction {
    match action {
        Action::Allow => RbacAction::Allow,
        Action::Deny | Action::Custom => RbacAction::Deny,
        Action::Audit => RbacAction::Log,
    }
}

/// Istio's `build`: one RBAC (enforced) and one shadow RBAC (dry run) for
/// the policies of one action.
pub fn build(policies: &[&Arc<Config<Authz>>], action: Action, tcp: bool) -> Built {
    let empty = || Rbac { action: rbac_action(action) as i32, ..Default::default() };
    let (mut rules, mut shadow) = (None::<Rbac>, None::<Rbac>);
    for p in policies {
        let target = if p.spec.dry_run { shadow.get_or_insert_with(empty) } else { rules.get_or_insert_with(empty) };
        let spec = &p.spec.spec;
        let list = spec.rules.as_deref().unwrap_or_default();
        if list.is_empty() {
            target.policies.insert(policy_name(&p.key.namespace, &p.key.name, 0), match_never());
            continue;
        }
        for (i, rule) in list.iter().enumerate() {
            if let Some(policy) = generate(rule, &p.key.namespace, action, tcp) {
                target.policies.insert(policy_name(&p.key.namespace, &p.key.name, i), policy);
            }
        }
    }
    Built { rules, shadow }
}

fn match_never() -> Policy {
    Policy {
        permissions: vec![Permission { rule: Some(permission::Rule::NotRule(Box::new(Permission { rule: Some(permission::Rule::Any(true)) }))) }],
        principals: vec![Principal {
            identifier: Some(principal::Identifier::NotId(Box::new(Principal { identifier: Some(principal::Identifier::Any(true)) }))),
        }],
        ..Default::default()
    }
}

/// A value a generator could not use: an HTTP-only field on TCP.
struct HttpOnly;

/// One key of a rule with its values and `not` values.
struct Field<'a, G> {
    values: &'a [String],
    not_values: &'a [String],
    gen: G,
    http_only: bool,
}

/// OR and NOT of permissions or principals.
type Combinators<T> = (fn(Vec<T>) -> T, fn(T) -> T);

/// How a key's values combine, as Istio's `rule.permission/principal`:
/// OR of the values, NOT(OR) of the not-values; on TCP an HTTP-only key
/// fails an ALLOW rule and vanishes from a DENY/AUDIT one.
fn combine<T>(
    (values, not_values, http_only): (&[String], &[String], bool),
    (tcp, action): (bool, Action),
    gen: &dyn Fn(&str) -> Option<T>,
    (or, not): Combinators<T>,
) -> Result<Vec<T>, HttpOnly> {
    if http_only && tcp {
        return if action == Action::Allow { Err(HttpOnly) } else { Ok(Vec::new()) };
    }
    let mut out = Vec::new();
    let ors: Vec<T> = values.iter().filter_map(|v| gen(v)).collect();
    if !ors.is_empty() {
        out.push(or(ors));
    }
    let nots: Vec<T> = not_values.iter().filter_map(|v| gen(v)).collect();
    if !nots.is_empty() {
        out.push(not(or(nots)));
    }
    Ok(out)
}

fn perm_or(v: Vec<Permission>) -> Permission {
    Permission { rule: Some(permission::Rule::OrRules(permission::Set { rules: v })) }
}
fn perm_and(v: Vec<Permission>) -> Permission {
    Permission { rule: Some(permission::Rule::AndRules(permission::Set { rules: v })) }
}
fn perm_not(p: Permission) -> Permission {
    Permission { rule: Some(permission::Rule::NotRule(Box::new(p))) }
}
fn prin_or(v: Vec<Principal>) -> Principal {
    Principal { identifier: Some(principal::Identifier::OrIds(principal::Set { ids: v })) }
}
fn prin_and(v: Vec<Principal>) -> Principal {
    Principal { identifier: Some(principal::Identifier::AndIds(principal::Set { ids: v })) }
}
fn prin_not(p: Principal) -> Principal {
    Principal { identifier: Some(principal::Identifier::NotId(Box::new(p))) }
}

type PermGen<'a> = Box<dyn Fn(&str) -> Option<Permission> + 'a>;
type PrinGen<'a> = Box<dyn Fn(&str) -> Option<Principal> + 'a>;

/// Istio's `Model::Generate` for one rule; `None` when the rule is left out
/// (HTTP-only fields in an ALLOW rule on TCP).
pub fn generate(rule: &Rule, policy_ns: &str, action: Action, tcp: bool) -> Option<Policy> {
    // `when` conditions split into permission and principal keys.
    let mut base_perm: Vec<Field<PermGen>> = Vec::new();
    let mut base_prin: Vec<Field<PrinGen>> = Vec::new();
    for c in &rule.when {
        let Ok(attr) = Attribute::parse(&c.key) else { continue };
        let http_only = attr.http_only();
        let (values, not_values) = (c.values.as_slice(), c.not_values.as_slice());
        match attr {
            Attribute::DestinationIp => base_perm.push(Field { values, not_values, gen: Box::new(|v| cidr(v).map(perm_dest_ip)), http_only }),
            Attribute::DestinationPort => base_perm.push(Field { values, not_values, gen: Box::new(|v| v.parse().ok().map(perm_port)), http_only }),
            Attribute::ConnectionSni => base_perm.push(Field {
                values,
                not_values,
                gen: Box::new(|v| Some(Permission { rule: Some(permission::Rule::RequestedServerName(string_matcher(v, "", false))) })),
                http_only,
            }),
            Attribute::EnvoyFilter { filter, key } => base_perm.push(Field {
                values,
                not_values,
                gen: Box::new(move |v| {
                    let value = match v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
                        Some(inner) => list_one_of(string_matcher(inner, "", false)),
                        None => string_value(string_matcher(v, "", false)),
                    };
                    Some(Permission { rule: Some(permission::Rule::SourcedMetadata(sourced(metadata(&filter, &[key.as_str()], value)))) })
                }),
                http_only,
            }),
            Attribute::SourceIp => base_prin.push(Field { values, not_values, gen: Box::new(|v| cidr(v).map(prin_direct_ip)), http_only }),
            Attribute::RemoteIp => base_prin.push(Field { values, not_values, gen: Box::new(|v| cidr(v).map(prin_remote_ip)), http_only }),
            Attribute::SourceNamespace => base_prin.push(Field { values, not_values, gen: Box::new(|v| Some(prin_namespace(v))), http_only }),
            Attribute::SourcePrincipal => base_prin.push(Field { values, not_values, gen: Box::new(|v| Some(prin_principal(v))), http_only }),
            Attribute::SourceServiceAccount => {
                base_prin.push(Field { values, not_values, gen: Box::new(move |v| Some(prin_service_account(policy_ns, v))), http_only })
            }
            Attribute::RequestPrincipal => base_prin.push(Field { values, not_values, gen: Box::new(|v| Some(prin_request_principal(v))), http_only }),
            Attribute::RequestAudiences => base_prin.push(Field { values, not_values, gen: Box::new(|v| Some(prin_claim(&["aud"], v))), http_only }),
            Attribute::RequestPresenter => base_prin.push(Field { values, not_values, gen: Box::new(|v| Some(prin_claim(&["azp"], v))), http_only }),
            Attribute::RequestClaim(path) => base_prin.push(Field {
                values,
                not_values,
                gen: Box::new(move |v| Some(prin_claim(&path.iter().map(String::as_str).collect::<Vec<_>>(), v))),
                http_only,
            }),
            Attribute::RequestHeader(name) => {
                base_prin.push(Field { values, not_values, gen: Box::new(move |v| Some(prin_header(header_matcher(&name, v)))), http_only })
            }
        }
    }

    let gen_perms = |fields: &[Field<PermGen>]| -> Result<Permission, HttpOnly> {
        let mut and = Vec::new();
        for f in fields {
            and.extend(combine((f.values, f.not_values, f.http_only), (tcp, action), &*f.gen, (perm_or, perm_not))?);
        }
        if and.is_empty() {
            and.push(Permission { rule: Some(permission::Rule::Any(true)) });
        }
        Ok(perm_and(and))
    };
    let gen_prins = |fields: &[Field<PrinGen>]| -> Result<Principal, HttpOnly> {
        let mut and = Vec::new();
        for f in fields {
            and.extend(combine((f.values, f.not_values, f.http_only), (tcp, action), &*f.gen, (prin_or, prin_not))?);
        }
        if and.is_empty() {
            and.push(Principal { identifier: Some(principal::Identifier::Any(true)) });
        }
        Ok(prin_and(and))
    };

    let mut principals = Vec::new();
    match &rule.from {
        Some(froms) if !froms.is_empty() => {
            for from in froms {
                let Some(s) = &from.source else { continue };
                let mut fields: Vec<Field<PrinGen>> = vec![
                    Field { values: &s.principals, not_values: &s.not_principals, gen: Box::new(|v| Some(prin_principal(v))), http_only: false },
                    Field {
                        values: &s.service_accounts,
                        not_values: &s.not_service_accounts,
                        gen: Box::new(move |v| Some(prin_service_account(policy_ns, v))),
                        http_only: false,
                    },
                    Field {
                        values: &s.request_principals,
                        not_values: &s.not_request_principals,
                        gen: Box::new(|v| Some(prin_request_principal(v))),
                        http_only: true,
                    },
                    Field { values: &s.namespaces, not_values: &s.not_namespaces, gen: Box::new(|v| Some(prin_namespace(v))), http_only: false },
                    Field {
                        values: &s.remote_ip_blocks,
                        not_values: &s.not_remote_ip_blocks,
                        gen: Box::new(|v| cidr(v).map(prin_remote_ip)),
                        http_only: false,
                    },
                    Field { values: &s.ip_blocks, not_values: &s.not_ip_blocks, gen: Box::new(|v| cidr(v).map(prin_direct_ip)), http_only: false },
                ];
                fields.retain(|f| !f.values.is_empty() || !f.not_values.is_empty());
                fields.extend(base_prin.iter().map(|f| Field {
                    values: f.values,
                    not_values: f.not_values,
                    gen: Box::new(|v: &str| (f.gen)(v)) as PrinGen,
                    http_only: f.http_only,
                }));
                principals.push(gen_prins(&fields).ok()?);
            }
        }
        _ => principals.push(gen_prins(&base_prin).ok()?),
    }
    let mut permissions = Vec::new();
    match &rule.to {
        Some(tos) if !tos.is_empty() => {
            for to in tos {
                let Some(op) = &to.operation else { continue };
                let mut fields: Vec<Field<PermGen>> = vec![
                    Field { values: &op.hosts, not_values: &op.not_hosts, gen: Box::new(|v| Some(perm_header(host_matcher(v)))), http_only: true },
                    Field {
                        values: &op.methods,
                        not_values: &op.not_methods,
                        gen: Box::new(|v| Some(perm_header(header_matcher(":method", v)))),
                        http_only: true,
                    },
                    Field { values: &op.paths, not_values: &op.not_paths, gen: Box::new(|v| Some(perm_path(v))), http_only: true },
                    Field { values: &op.ports, not_values: &op.not_ports, gen: Box::new(|v| v.parse().ok().map(perm_port)), http_only: false },
                ];
                fields.retain(|f| !f.values.is_empty() || !f.not_values.is_empty());
                fields.extend(base_perm.iter().map(|f| Field {
                    values: f.values,
                    not_values: f.not_values,
                    gen: Box::new(|v: &str| (f.gen)(v)) as PermGen,
                    http_only: f.http_only,
                }));
                permissions.push(gen_perms(&fields).ok()?);
            }
        }
        _ => permissions.push(gen_perms(&base_perm).ok()?),
    }
    if permissions.is_empty() || principals.is_empty() {
        return None;
    }
    Some(Policy { permissions, principals, ..Default::default() })
}

fn cidr(v: &str) -> Option<CidrRange> {
    let (ip, len) = match v.split_once('/') {
        Some((ip, len)) => (ip, len.parse::<u32>().ok()?),
        None => (v, if v.contains(':') { 128 } else { 32 }),
    };
    ip.parse::<std::net::IpAddr>().ok()?;
    Some(CidrRange { address_prefix: ip.to_string(), prefix_len: Some(UInt32Value { value: len }) })
}

fn perm_dest_ip(c: CidrRange) -> Permission {
    Permission { rule: Some(permission::Rule::DestinationIp(c)) }
}
fn perm_port(p: u32) -> Permission {
    Permission { rule: Some(permission::Rule::DestinationPort(p)) }
}
fn perm_header(h: HeaderMatcher) -> Permission {
    Permission { rule: Some(permission::Rule::Header(h)) }
}
fn prin_header(h: HeaderMatcher) -> Principal {
    Principal { identifier: Some(principal::Identifier::Header(h)) }
}
fn prin_direct_ip(c: CidrRange) -> Principal {
    Principal { identifier: Some(principal::Identifier::DirectRemoteIp(c)) }
}
fn prin_remote_ip(c: CidrRange) -> Principal {
    Principal { identifier: Some(principal::Identifier::RemoteIp(c)) }
}
fn prin_authenticated(m: StringMatcher) -> Principal {
    Principal { identifier: Some(principal::Identifier::Authenticated(principal::Authenticated { principal_name: Some(m) })) }
}

fn regex(r: String) -> StringMatcher {
    StringMatcher { match_pattern: Some(MatchPattern::SafeRegex(RegexMatcher { regex: r, ..Default::default() })), ignore_case: false }
}

/// Istio's `StringMatcherWithPrefix`: `*` any non-empty value, `*x` a
/// suffix, `x*` a prefix, else exact; `prefix` is prepended (spiffe://).
pub fn string_matcher(v: &str, prefix: &str, ignore_case: bool) -> StringMatcher {
    let pattern = if v == "*" {
        return regex(".+".into());
    } else if let Some(suffix) = v.strip_prefix('*') {
        if !prefix.is_empty() {
            return regex(format!("{}.*{}", regex_quote(prefix), regex_quote(suffix)));
        }
        MatchPattern::Suffix(suffix.to_string())
    } else if let Some(p) = v.strip_suffix('*') {
        MatchPattern::Prefix(format!("{prefix}{p}"))
    } else {
        MatchPattern::Exact(format!("{prefix}{v}"))
    };
    StringMatcher { match_pattern: Some(pattern), ignore_case }
}

fn regex_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A header: `*` present, `*x` suffix, `x*` prefix, else exact.
fn header_matcher(name: &str, v: &str) -> HeaderMatcher {
    let spec = if v == "*" { HeaderMatchSpecifier::PresentMatch(true) } else { HeaderMatchSpecifier::StringMatch(string_matcher(v, "", false)) };
    HeaderMatcher { name: name.to_string(), header_match_specifier: Some(spec), ..Default::default() }
}

/// `:authority`, case-insensitive; an exact host also matches with any
/// port (`example.com` admits `example.com:8080`).
fn host_matcher(v: &str) -> HeaderMatcher {
    let spec = if v == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else if v.starts_with('*') || v.ends_with('*') || v.contains(':') {
        HeaderMatchSpecifier::StringMatch(string_matcher(v, "", true))
    } else {
        HeaderMatchSpecifier::StringMatch(regex(format!("(?i){}(:[0-9]+)?", regex_quote(v))))
    };
    HeaderMatcher { name: ":authority".into(), header_match_specifier: Some(spec), ..Default::default() }
}

/// The request path without its query; `{*}`/`{**}` templates become
/// Envoy's URI template matcher.
fn perm_path(v: &str) -> Permission {
    if contains_path_template(v) {
        let template = v.replace("{**}", "**").replace("{*}", "*");
        return Permission {
            rule: Some(permission::Rule::UriTemplate(TypedExtensionConfig {
                name: "uri-template".into(),
                typed_config: Some(super::util::any(&UriTemplateMatchConfig { path_template: template })),
            })),
        };
    }
    Permission { rule: Some(permission::Rule::UrlPath(PathMatcher { rule: Some(path_matcher::Rule::Path(string_matcher(v, "", false))) })) }
}

fn prin_principal(v: &str) -> Principal {
    prin_authenticated(string_matcher(v, "spiffe://", false))
}

fn prin_namespace(v: &str) -> Principal {
    prin_authenticated(regex(format!(".*/ns/{}/.*", regex_quote(v).replace("\\*", ".*"))))
}

/// `serviceAccounts`: `NAME` (in the policy's namespace) or `NS/NAME`.
fn prin_service_account(policy_ns: &str, v: &str) -> Principal {
    let (ns, sa) = v.split_once('/').unwrap_or((policy_ns, v));
    prin_authenticated(regex(format!("spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?", regex_quote(ns), regex_quote(sa))))
}

fn metadata(filter: &str, path: &[&str], value: ValueMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_string(),
        path: path.iter().map(|k| PathSegment { segment: Some(Segment::Key(k.to_string())) }).collect(),
        value: Some(value),
        invert: false,
    }
}

fn sourced(m: MetadataMatcher) -> SourcedMetadata {
    SourcedMetadata { metadata_matcher: Some(m), metadata_source: MetadataSource::Dynamic as i32 }
}

fn prin_metadata(m: MetadataMatcher) -> Principal {
    Principal { identifier: Some(principal::Identifier::SourcedMetadata(sourced(m))) }
}

fn string_value(m: StringMatcher) -> ValueMatcher {
    ValueMatcher { match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)) }
}

fn list_one_of(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(string_value(m)))),
        }))),
    }
}

/// A claim of the verified token: a string claim equal to the value, or a
/// list claim containing it (`aud`, `groups` may be either).
fn prin_claim(path: &[&str], v: &str) -> Principal {
    let mut full = vec![JWT_PAYLOAD_KEY];
    full.extend_from_slice(path);
    let m = string_matcher(v, "", false);
    let either =
        ValueMatcher { match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher { value_matchers: vec![string_value(m.clone()), list_one_of(m)] })) };
    prin_metadata(metadata(JWT_FILTER, &full, either))
}

/// `requestPrincipals`: `ISS/SUB`, split at the last `/` (issuers are
/// URLs), with Istio's wildcards (`*`, `*/SUB`, `ISS/*`, `*suffix`,
/// `prefix*`).
fn prin_request_principal(v: &str) -> Principal {
    let any = || regex(".+".into());
    let exact = |s: &str| StringMatcher { match_pattern: Some(MatchPattern::Exact(s.to_string())), ignore_case: false };
    let (iss, sub, found) = match v.rfind('/') {
        Some(i) => (&v[..i], &v[i + 1..], true),
        None => (v, "", false),
    };
    let suffix = |x: &str| StringMatcher { match_pattern: Some(MatchPattern::Suffix(x.to_string())), ignore_case: false };
    let prefix = |x: &str| StringMatcher { match_pattern: Some(MatchPattern::Prefix(x.to_string())), ignore_case: false };
    let (m_iss, m_sub) = if v == "*" {
        (any(), any())
    } else if let Some(rest) = v.strip_prefix('*') {
        match (found, iss.strip_prefix('*')) {
            (true, Some("")) => (any(), exact(sub)),
            (true, Some(iss_suffix)) => (suffix(iss_suffix), exact(sub)),
            _ => (any(), suffix(rest)),
        }
    } else if let Some(rest) = v.strip_suffix('*') {
        match (found, sub.strip_suffix('*')) {
            (true, Some("")) => (exact(iss), any()),
            (true, Some(sub_prefix)) => (exact(iss), prefix(sub_prefix)),
            _ => (prefix(rest), any()),
        }
    } else {
        (exact(iss), exact(sub))
    };
    prin_and(vec![
        prin_metadata(metadata(JWT_FILTER, &[JWT_PAYLOAD_KEY, "iss"], string_value(m_iss))),
        prin_metadata(metadata(JWT_FILTER, &[JWT_PAYLOAD_KEY, "sub"], string_value(m_sub))),
    ])
}

/// `envoy.config.rbac.v3.RBAC` with its policies sorted by name.
pub fn rbac_bytes(r: &Rbac) -> Vec<u8> {
    let mut bare = r.clone();
    let policies = std::mem::take(&mut bare.policies);
    let mut out = bare.encode_to_vec();
    put_sorted_messages(2, &policies, &mut out);
    out
}

fn shadow_prefix(b: &Built) -> String {
    match b.shadow.as_ref().map(|s| s.action) {
        Some(a) if a == RbacAction::Allow as i32 => SHADOW_ALLOW_PREFIX.into(),
        Some(a) if a == RbacAction::Deny as i32 => SHADOW_DENY_PREFIX.into(),
        _ => String::new(),
    }
}

/// The HTTP RBAC filter of `b`, its shadow rules counted under `shadow_prefix`.
pub(super) fn http_rbac_filter(b: &Built, shadow_prefix: &str) -> HttpFilter {
    let shell = HttpRbac { shadow_rules_stat_prefix: shadow_prefix.into(), track_per_rule_stats: true, ..Default::default() };
    let any = Any { type_url: HttpRbac::type_url(), value: with_rules(shell.encode_to_vec(), b) };
    HttpFilter { name: HTTP_RBAC.into(), config_type: Some(http_filter::ConfigType::TypedConfig(any)), ..Default::default() }
}

/// The network RBAC filter of `b`.
pub(super) fn network_rbac_filter(b: &Built, shadow_prefix: &str) -> Filter {
    let shell = NetworkRbac { stat_prefix: TCP_STAT_PREFIX.into(), shadow_rules_stat_prefix: shadow_prefix.into(), ..Default::default() };
    let any = Any { type_url: NetworkRbac::type_url(), value: with_rules(shell.encode_to_vec(), b) };
    Filter { name: NETWORK_RBAC.into(), config_type: Some(filter::ConfigType::TypedConfig(any)) }
}

/// A filter's encoded shell with its rules (field 1) and shadow rules
/// (field 2) appended, each with its policies sorted: the same field
/// numbers in the HTTP and the network filter.
fn with_rules(mut out: Vec<u8>, b: &Built) -> Vec<u8> {
    if let Some(r) = &b.rules {
        put_len_delimited(1, &rbac_bytes(r), &mut out);
    }
    if let Some(s) = &b.shadow {
        put_len_delimited(2, &rbac_bytes(s), &mut out);
    }
    out
}

/// For golden tests and `authz check`: the policies map of an RBAC, sorted.
pub fn sorted_policies(r: &Rbac) -> Vec<(&String, &Policy)> {
    let mut v: Vec<(&String, &Policy)> = r.policies.iter().collect();
    v.sort_by(|a, b| a.0.cmp(b.0));
    v
}

/// Decode an RBAC filter's config (HTTP or network) back to its rules.
pub fn decode_filter(any: &Any) -> Option<(Option<Rbac>, Option<Rbac>)> {
    if any.type_url == HttpRbac::type_url() {
        let r = HttpRbac::decode(any.value.as_slice()).ok()?;
        Some((r.rules, r.shadow_rules))
    } else if any.type_url == NetworkRbac::type_url() {
        let r = NetworkRbac::decode(any.value.as_slice()).ok()?;
        Some((r.rules, r.shadow_rules))
    } else {
        None
    }
}
