//! Why a request would be allowed or denied at a proxy: Envoy's RBAC
//! evaluation, replayed over the RBAC filters in the config the proxy was
//! served (not over the policies), so the answer is the one the proxy
//! gives. Every policy of every filter is evaluated, and a policy that does
//! not match says which of its conditions failed.
//!
//! Envoy's semantics: the RBAC filters run in order (AUDIT, DENY, ALLOW as
//! `authz` builds them); a DENY filter denies when a policy matches, an
//! ALLOW filter when none does (an ALLOW with no policies denies all), a
//! LOG filter never denies. Shadow (dry-run) rules are evaluated and
//! reported, never enforced. A policy matches when one of its permissions
//! and one of its principals match.

use super::authz::{decode_filter, sorted_policies, HTTP_RBAC, JWT_FILTER, NETWORK_RBAC};
use crate::resources::{ProxyConfig, ResourceType};
use envoy_types::pb::envoy::config::core::v3::{address, CidrRange};
use envoy_types::pb::envoy::config::listener::v3::{filter, Listener};
use envoy_types::pb::envoy::config::rbac::v3::{permission, principal, rbac::Action, Permission, Policy, Principal, Rbac};
use envoy_types::pb::envoy::config::route::v3::{header_matcher::HeaderMatchSpecifier, HeaderMatcher};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_filter, HttpConnectionManager};
use envoy_types::pb::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    list_matcher, metadata_matcher::path_segment::Segment, path_matcher, string_matcher::MatchPattern, value_matcher, MetadataMatcher, StringMatcher,
    ValueMatcher,
};
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// The request to explain. Unset fields are unknown: a condition on them
/// does not match (and says so).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct Request {
    /// The listener port (default: the only port with RBAC filters).
    pub port: Option<u32>,
    /// The peer's address (`ipBlocks`, `source.ip`).
    pub source_ip: Option<IpAddr>,
    /// The original client (`remoteIpBlocks`); default: `source_ip`.
    pub remote_ip: Option<IpAddr>,
    /// The peer certificate's URI SAN (`spiffe://...`), with mutual TLS.
    pub principal: Option<String>,
    #[serde(default)]
    pub method: String,
    /// Path, optionally with a query (`paths` match without it).
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub host: String,
    /// Request headers (names any case).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// A verified JWT's payload (`requestPrincipals`, `request.auth.*`).
    pub claims: Option<Value>,
    /// TLS SNI (`connection.sni`).
    pub sni: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Explanation {
    pub listener: String,
    /// `http` or `tcp`: which RBAC filters applied.
    pub protocol: &'static str,
    pub allowed: bool,
    /// The policy whose rule decided (a DENY that matched, or the ALLOW
    /// that matched); `None` when no policy applies, or when an ALLOW
    /// filter denied because none of its policies matched.
    pub decided_by: Option<String>,
    /// One line for humans.
    pub summary: String,
    pub filters: Vec<Stage>,
    /// The ext_authz provider a CUSTOM policy hands the request to first
    /// (`extauthz`): the answer above holds only if it allows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delegated_to: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stage {
    /// ALLOW, DENY or LOG (AUDIT).
    pub action: &'static str,
    pub policies: Vec<PolicyResult>,
    /// Dry-run policies: evaluated, not enforced.
    pub dry_run: Vec<PolicyResult>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PolicyResult {
    pub name: String,
    pub matched: bool,
    /// Why it did not match (empty when it did).
    pub why: String,
}

/// Explain `req` at the proxy served `config`.
pub fn explain(config: &ProxyConfig, req: &Request) -> Result<Explanation, String> {
    let listeners: Vec<Listener> = config
        .of(ResourceType::Listener)
        .into_iter()
        .flatten()
        .filter_map(|(_, r)| Listener::decode(r.any.value.as_slice()).ok())
        .filter(|l| req.port.is_none_or(|p| listener_port(l) == Some(p)))
        .collect();
    let with_rbac: Vec<(Listener, &'static str, Vec<Rbacs>)> = listeners
        .into_iter()
        .filter_map(|l| {
            let (proto, rbacs) = rbac_filters(&l);
            Some((l, proto?, rbacs))
        })
        .collect();
    let (listener, protocol, rbacs) = match (with_rbac.len(), req.port) {
        (0, Some(p)) => return Err(format!("the proxy has no inbound or gateway listener on port {p}")),
        (0, None) => return Err("the proxy has no inbound or gateway listener".into()),
        (1, _) => with_rbac.into_iter().next().unwrap_or_else(|| unreachable!()),
        (_, _) => {
            let ports: Vec<String> = with_rbac.iter().filter_map(|(l, _, _)| listener_port(l)).map(|p| p.to_string()).collect();
            return Err(format!("the proxy has several listeners ({}); say which port", ports.join(", ")));
        }
    };
    let ctx = Ctx { req, dest_ip: listener_ip(&listener), port: req.port.or(listener_port(&listener)).unwrap_or(0) };
    let mut filters = Vec::new();
    let (mut allowed, mut decided_by, mut summary) = (true, None, String::new());
    let mut delegated_to: Option<String> = None;
    for (rules, shadow) in rbacs {
        let eval = |r: &Rbac| sorted_policies(r).into_iter().map(|(name, p)| ctx.policy(name, p)).collect::<Vec<_>>();
        let action = rules.as_ref().or(shadow.as_ref()).map_or(Action::Allow as i32, |r| r.action);
        // CUSTOM's shadow filter: a match hands the request to ext_authz.
        let custom =
            rules.is_none() && shadow.as_ref().is_some_and(|s| !s.policies.is_empty() && s.policies.keys().all(|k| k.starts_with(super::extauthz::KEY_PREFIX)));
        let stage = Stage {
            action: match Action::try_from(action) {
                _ if custom => "CUSTOM",
                Ok(Action::Deny) => "DENY",
                Ok(Action::Log) => "LOG",
                _ => "ALLOW",
            },
            policies: rules.as_ref().map(eval).unwrap_or_default(),
            dry_run: shadow.as_ref().map(eval).unwrap_or_default(),
        };
        if custom && allowed && delegated_to.is_none() {
            if let Some(p) = stage.dry_run.iter().find(|p| p.matched) {
                delegated_to = Some(format!("{} (CUSTOM rule {})", super::extauthz::provider_of_key(&p.name).unwrap_or("?"), p.name));
            }
        }
        // The first filter that denies ends the request (Envoy stops there).
        if allowed && rules.is_some() {
            let matched = stage.policies.iter().find(|p| p.matched).map(|p| p.name.clone());
            match stage.action {
                "DENY" if matched.is_some() => {
                    allowed = false;
                    summary = format!("denied by {}", matched.as_deref().unwrap_or_default());
                    decided_by = matched;
                }
                "ALLOW" => match matched {
                    Some(name) => {
                        summary = format!("allowed by {name}");
                        decided_by = Some(name);
                    }
                    None => {
                        allowed = false;
                        decided_by = None;
                        summary = if stage.policies.is_empty() {
                            "denied: an ALLOW policy with no rules selects the workload".into()
                        } else {
                            "denied: ALLOW policies select the workload and none of their rules matched".into()
                        };
                    }
                },
                _ => {}
            }
        }
        filters.push(stage);
    }
    if summary.is_empty() {
        summary = "allowed: no policy denies it and none requires an ALLOW".into();
    }
    if let Some(p) = &delegated_to {
        summary = format!("delegated to the external authorizer {p}: it decides first; if it allows, {summary}");
    }
    Ok(Explanation { listener: listener.name, protocol, allowed, decided_by, summary, filters, delegated_to })
}

/// Enforced and shadow rules of each RBAC filter of a listener, in order.
type Rbacs = (Option<Rbac>, Option<Rbac>);

fn rbac_filters(l: &Listener) -> (Option<&'static str>, Vec<Rbacs>) {
    let Some(chain) = l.filter_chains.first() else { return (None, Vec::new()) };
    let mut out = Vec::new();
    let mut proto = None;
    for f in &chain.filters {
        let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else { continue };
        if f.name == super::listener::HCM {
            proto = Some("http");
            let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice()) else { continue };
            for hf in hcm.http_filters.iter().filter(|h| h.name == HTTP_RBAC) {
                if let Some(http_filter::ConfigType::TypedConfig(a)) = &hf.config_type {
                    out.extend(decode_filter(a));
                }
            }
        } else if f.name == NETWORK_RBAC {
            out.extend(decode_filter(any));
        } else if f.name == super::listener::TCP_PROXY {
            proto = proto.or(Some("tcp"));
        }
    }
    (proto, out)
}

fn listener_port(l: &Listener) -> Option<u32> {
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(s) => match s.port_specifier.as_ref()? {
            envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p) => Some(*p),
            _ => None,
        },
        _ => None,
    }
}

fn listener_ip(l: &Listener) -> Option<IpAddr> {
    match l.address.as_ref()?.address.as_ref()? {
        address::Address::SocketAddress(s) => s.address.parse().ok(),
        _ => None,
    }
}

struct Ctx<'a> {
    req: &'a Request,
    dest_ip: Option<IpAddr>,
    port: u32,
}

type Outcome = Result<(), String>;

impl Ctx<'_> {
    fn policy(&self, name: &str, p: &Policy) -> PolicyResult {
        let perm = any_of(p.permissions.iter().map(|x| self.permission(x)));
        let prin = any_of(p.principals.iter().map(|x| self.principal(x)));
        let why = match (perm, prin) {
            (Ok(()), Ok(())) => String::new(),
            (Err(a), Ok(())) => a,
            (Ok(()), Err(b)) => b,
            (Err(a), Err(b)) => format!("{a}; {b}"),
        };
        PolicyResult { name: name.to_string(), matched: why.is_empty(), why }
    }

    fn permission(&self, p: &Permission) -> Outcome {
        use permission::Rule;
        match p.rule.as_ref() {
            None => Err("empty permission".into()),
            Some(Rule::Any(true)) => Ok(()),
            Some(Rule::Any(false)) => Err("any: false".into()),
            Some(Rule::AndRules(s)) => s.rules.iter().try_for_each(|r| self.permission(r)),
            Some(Rule::OrRules(s)) => any_of(s.rules.iter().map(|r| self.permission(r))),
            Some(Rule::NotRule(r)) => match self.permission(r) {
                Ok(()) => Err(format!("not({})", describe_perm(r))),
                Err(_) => Ok(()),
            },
            Some(Rule::Header(h)) => self.header(h),
            Some(Rule::UrlPath(m)) => {
                let path = self.req.path.split('?').next().unwrap_or_default();
                match m.rule.as_ref() {
                    Some(path_matcher::Rule::Path(s)) => check(string_matches(s, path), || format!("path {path:?} is not {}", describe_string(s))),
                    None => Err("empty path matcher".into()),
                }
            }
            Some(Rule::UriTemplate(t)) => {
                let template =
                    t.typed_config.as_ref().and_then(|a| UriTemplateMatchConfig::decode(a.value.as_slice()).ok()).map(|c| c.path_template).unwrap_or_default();
                let path = self.req.path.split('?').next().unwrap_or_default();
                check(template_matches(&template, path), || format!("path {path:?} does not match template {template:?}"))
            }
            Some(Rule::DestinationIp(c)) => match self.dest_ip {
                Some(ip) => check(in_cidr(ip, c), || format!("destination {ip} is not in {}/{}", c.address_prefix, prefix_len(c))),
                None => Err("destination IP unknown".into()),
            },
            Some(Rule::DestinationPort(p)) => check(self.port == *p, || format!("port {} is not {p}", self.port)),
            Some(Rule::RequestedServerName(s)) => match &self.req.sni {
                Some(sni) => check(string_matches(s, sni), || format!("SNI {sni:?} is not {}", describe_string(s))),
                None => Err("no SNI".into()),
            },
            Some(Rule::SourcedMetadata(m)) => self.metadata(m.metadata_matcher.as_ref()),
            Some(other) => Err(format!("cannot evaluate {other:?}")),
        }
    }

    fn principal(&self, p: &Principal) -> Outcome {
        use principal::Identifier;
        match p.identifier.as_ref() {
            None => Err("empty principal".into()),
            Some(Identifier::Any(true)) => Ok(()),
            Some(Identifier::Any(false)) => Err("any: false".into()),
            Some(Identifier::AndIds(s)) => s.ids.iter().try_for_each(|r| self.principal(r)),
            Some(Identifier::OrIds(s)) => any_of(s.ids.iter().map(|r| self.principal(r))),
            Some(Identifier::NotId(r)) => match self.principal(r) {
                Ok(()) => Err(format!("not({})", describe_prin(r))),
                Err(_) => Ok(()),
            },
            Some(Identifier::Authenticated(a)) => {
                let Some(m) = &a.principal_name else { return check(self.req.principal.is_some(), || "no client certificate".into()) };
                match &self.req.principal {
                    Some(id) => check(string_matches(m, id), || format!("peer identity {id:?} is not {}", describe_string(m))),
                    None => Err(format!("no peer identity (mutual TLS) to match {}", describe_string(m))),
                }
            }
            Some(Identifier::DirectRemoteIp(c)) => match self.req.source_ip {
                Some(ip) => check(in_cidr(ip, c), || format!("source {ip} is not in {}/{}", c.address_prefix, prefix_len(c))),
                None => Err("source address unknown".into()),
            },
            Some(Identifier::RemoteIp(c)) => match self.req.remote_ip.or(self.req.source_ip) {
                Some(ip) => check(in_cidr(ip, c), || format!("remote address {ip} is not in {}/{}", c.address_prefix, prefix_len(c))),
                None => Err("remote address unknown".into()),
            },
            Some(Identifier::Header(h)) => self.header(h),
            Some(Identifier::SourcedMetadata(m)) => self.metadata(m.metadata_matcher.as_ref()),
            Some(other) => Err(format!("cannot evaluate {other:?}")),
        }
    }

    fn header_value(&self, name: &str) -> Option<&str> {
        match name {
            ":method" => Some(self.req.method.as_str()),
            ":authority" => Some(self.req.host.as_str()),
            ":path" => Some(self.req.path.as_str()),
            n => self.req.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(n)).map(|(_, v)| v.as_str()),
        }
    }

    fn header(&self, h: &HeaderMatcher) -> Outcome {
        let value = self.header_value(&h.name);
        let what = if h.name == ":method" {
            "method".to_string()
        } else if h.name == ":authority" {
            "host".to_string()
        } else {
            format!("header {}", h.name)
        };
        let hit = match (&h.header_match_specifier, value) {
            (Some(HeaderMatchSpecifier::PresentMatch(want)), v) => v.is_some() == *want,
            (Some(HeaderMatchSpecifier::StringMatch(s)), Some(v)) => string_matches(s, v),
            (_, None) => false,
            (Some(other), Some(_)) => return Err(format!("cannot evaluate {other:?}")),
            (None, v) => v.is_some(),
        } != h.invert_match;
        check(hit, || match (value, &h.header_match_specifier) {
            (None, _) => format!("no {what}"),
            (Some(v), Some(HeaderMatchSpecifier::StringMatch(s))) => format!("{what} {v:?} is not {}", describe_string(s)),
            (Some(v), _) => format!("{what} {v:?} does not match"),
        })
    }

    fn metadata(&self, m: Option<&MetadataMatcher>) -> Outcome {
        let Some(m) = m else { return Err("empty metadata matcher".into()) };
        let keys: Vec<&str> = m.path.iter().filter_map(|s| s.segment.as_ref().map(|Segment::Key(k)| k.as_str())).collect();
        if m.filter != JWT_FILTER || keys.first() != Some(&super::authz::JWT_PAYLOAD_KEY) {
            return Err(format!("cannot evaluate dynamic metadata of {}", m.filter));
        }
        let claim = keys[1..].join(".");
        let Some(claims) = &self.req.claims else { return Err(format!("no verified JWT (claim {claim})")) };
        let value = keys[1..].iter().try_fold(claims, |v, k| v.get(k));
        let hit = value.is_some_and(|v| m.value.as_ref().is_some_and(|vm| value_matches(vm, v))) != m.invert;
        check(hit, || match value {
            None => format!("the JWT has no claim {claim}"),
            Some(v) => format!("JWT claim {claim} = {v} does not match"),
        })
    }
}

fn check(ok: bool, why: impl FnOnce() -> String) -> Outcome {
    if ok {
        Ok(())
    } else {
        Err(why())
    }
}

fn any_of(outcomes: impl Iterator<Item = Outcome>) -> Outcome {
    let mut whys = Vec::new();
    for o in outcomes {
        match o {
            Ok(()) => return Ok(()),
            Err(w) => whys.push(w),
        }
    }
    match whys.len() {
        0 => Err("nothing to match".into()),
        1 => Err(whys.remove(0)),
        _ => Err(format!("none of: {}", whys.join(" | "))),
    }
}

fn value_matches(m: &ValueMatcher, v: &Value) -> bool {
    match &m.match_pattern {
        Some(value_matcher::MatchPattern::StringMatch(s)) => v.as_str().is_some_and(|x| string_matches(s, x)),
        Some(value_matcher::MatchPattern::PresentMatch(p)) => *p,
        Some(value_matcher::MatchPattern::BoolMatch(b)) => v.as_bool() == Some(*b),
        Some(value_matcher::MatchPattern::OrMatch(o)) => o.value_matchers.iter().any(|m| value_matches(m, v)),
        Some(value_matcher::MatchPattern::ListMatch(l)) => match (&l.match_pattern, v.as_array()) {
            (Some(list_matcher::MatchPattern::OneOf(one)), Some(items)) => items.iter().any(|i| value_matches(one, i)),
            _ => false,
        },
        _ => false,
    }
}

pub fn string_matches(m: &StringMatcher, v: &str) -> bool {
    let (v, fold) = if m.ignore_case { (v.to_ascii_lowercase(), true) } else { (v.to_string(), false) };
    let f = |s: &str| if fold { s.to_ascii_lowercase() } else { s.to_string() };
    match &m.match_pattern {
        Some(MatchPattern::Exact(e)) => v == f(e),
        Some(MatchPattern::Prefix(p)) => v.starts_with(&f(p)),
        Some(MatchPattern::Suffix(s)) => v.ends_with(&f(s)),
        Some(MatchPattern::Contains(c)) => v.contains(&f(c)),
        Some(MatchPattern::SafeRegex(r)) => regex::Regex::new(&format!("^(?:{})$", r.regex)).is_ok_and(|re| re.is_match(&v)),
        _ => false,
    }
}

fn describe_string(m: &StringMatcher) -> String {
    match &m.match_pattern {
        Some(MatchPattern::Exact(e)) => format!("{e:?}"),
        Some(MatchPattern::Prefix(p)) => format!("prefix {p:?}"),
        Some(MatchPattern::Suffix(s)) => format!("suffix {s:?}"),
        Some(MatchPattern::Contains(c)) => format!("containing {c:?}"),
        Some(MatchPattern::SafeRegex(r)) => format!("regex {:?}", r.regex),
        _ => "?".into(),
    }
}

fn describe_perm(p: &Permission) -> String {
    use permission::Rule;
    match &p.rule {
        Some(Rule::UrlPath(m)) => match &m.rule {
            Some(path_matcher::Rule::Path(s)) => format!("path {}", describe_string(s)),
            None => "path".into(),
        },
        Some(Rule::Header(h)) => format!("{} {}", h.name, header_spec(h)),
        Some(Rule::DestinationPort(p)) => format!("port {p}"),
        Some(Rule::OrRules(s)) => s.rules.iter().map(describe_perm).collect::<Vec<_>>().join(" or "),
        Some(Rule::AndRules(s)) => s.rules.iter().map(describe_perm).collect::<Vec<_>>().join(" and "),
        _ => "a condition".into(),
    }
}

fn describe_prin(p: &Principal) -> String {
    use principal::Identifier;
    match &p.identifier {
        Some(Identifier::DirectRemoteIp(c)) => format!("source in {}/{}", c.address_prefix, prefix_len(c)),
        Some(Identifier::RemoteIp(c)) => format!("remote in {}/{}", c.address_prefix, prefix_len(c)),
        Some(Identifier::Authenticated(a)) => format!("peer {}", a.principal_name.as_ref().map(describe_string).unwrap_or_default()),
        Some(Identifier::Header(h)) => format!("{} {}", h.name, header_spec(h)),
        Some(Identifier::OrIds(s)) => s.ids.iter().map(describe_prin).collect::<Vec<_>>().join(" or "),
        Some(Identifier::AndIds(s)) => s.ids.iter().map(describe_prin).collect::<Vec<_>>().join(" and "),
        _ => "a condition".into(),
    }
}

fn header_spec(h: &HeaderMatcher) -> String {
    match &h.header_match_specifier {
        Some(HeaderMatchSpecifier::StringMatch(s)) => describe_string(s),
        Some(HeaderMatchSpecifier::PresentMatch(_)) => "present".into(),
        _ => "?".into(),
    }
}

fn prefix_len(c: &CidrRange) -> u32 {
    c.prefix_len.as_ref().map_or(0, |p| p.value)
}

fn in_cidr(ip: IpAddr, c: &CidrRange) -> bool {
    let Ok(base) = c.address_prefix.parse::<IpAddr>() else { return false };
    ipnet::IpNet::new(base, prefix_len(c) as u8).is_ok_and(|n| n.trunc().contains(&ip))
}

/// Envoy's URI templates as `authz` writes them: `*` one segment, `**` the
/// rest (the last segment).
fn template_matches(template: &str, path: &str) -> bool {
    let t: Vec<&str> = template.split('/').collect();
    let p: Vec<&str> = path.split('/').collect();
    for (i, seg) in t.iter().enumerate() {
        match *seg {
            "**" => return i <= p.len(),
            "*" => {
                if p.get(i).is_none_or(|s| s.is_empty()) {
                    return false;
                }
            }
            lit => {
                if p.get(i) != Some(&lit) {
                    return false;
                }
            }
        }
    }
    t.len() == p.len()
}
