//! Istio's `schema.ValidationAnalyzer.<Kind>` and `deprecation.DeprecationAnalyzer`:
//! - IST0106: the spec does not pass validation (offline: the files';
//!   the live store holds only valid objects);
//! - IST0133: validation accepted it with a warning (Lodestar's validators
//!   warn about what Istio's do, and about what Lodestar stores but does
//!   not serve);
//! - IST0130 / IST0131: VirtualService rules or matches that can never be
//!   reached (Istio's `analyzeUnreachable*Rules`, which validation turns
//!   into these codes);
//! - IST0002: deprecated fields (`fault.delay.percent`, a Sidecar's
//!   `outboundTrafficPolicy.egressProxy`, which nothing serves).

use super::{quote, Ctx, Message, IST0002, IST0106, IST0130, IST0131, IST0133};
use crate::model::istio::virtual_service::{HttpMatchRequest, HttpRoute};
use crate::model::istio::VirtualService;
use crate::model::ResourceKey;
use std::collections::BTreeMap;

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    for (obj, why) in &ctx.invalid {
        out.push(schema_error(&obj.key, why));
    }
    for (obj, warnings) in &ctx.validated {
        for w in warnings.iter().filter(|w| !covered(w)) {
            let field = w.split_once(": ").map(|(f, _)| f.to_string()).filter(|f| f.starts_with("spec"));
            out.push(Message::new(IST0133, &obj.key, field, IST0133.template.replace("%v", w)));
        }
    }
    for vs in &ctx.vs {
        unreachable_rules(vs.key(), vs.spec, out);
        for (i, route) in vs.spec.http.iter().enumerate() {
            if route.fault.as_ref().and_then(|f| f.delay.as_ref()).and_then(|d| d.percent).is_some_and(|p| p > 0) {
                let field = format!("spec.http[{i}].fault.delay.percent");
                out.push(Message::new(
                    IST0002,
                    vs.key(),
                    Some(field),
                    "Deprecated: HTTPRoute.fault.delay.percent is deprecated; use HTTPRoute.fault.delay.percentage".into(),
                ));
            }
        }
    }
    for sc in &ctx.sidecars {
        if sc.spec.outbound_traffic_policy.as_ref().is_some_and(|p| p.egress_proxy.is_some()) {
            let field = "spec.outboundTrafficPolicy.egressProxy".to_string();
            out.push(Message::new(IST0002, sc.key(), Some(field), "Deprecated: OutboundTrafficPolicy.EgressProxy ignored".into()));
        }
    }
}

/// IST0106 for one validation error (`field: reason`, or a whole text).
pub(crate) fn schema_error(key: &ResourceKey, error: &str) -> Message {
    let field = error.split_once(": ").map(|(f, _)| f.to_string()).filter(|f| f.starts_with("spec") || f.starts_with("metadata"));
    Message::new(IST0106, key, field, IST0106.template.replace("%v", error))
}

/// Validation warnings another code reports (so they are not said twice):
/// unreachable routes (IST0130), TLS origination without a CA at the
/// levels IST0128/IST0129 check, `fault.delay.percent` (IST0002).
fn covered(warning: &str) -> bool {
    let (field, reason) = warning.split_once(": ").unwrap_or(("", warning));
    reason.starts_with("route is never used")
        || (reason.starts_with("without caCertificates") && (field == "spec.trafficPolicy.tls" || is_port_level_tls(field)))
        || (field.ends_with(".fault.delay.percent") && reason.starts_with("deprecated"))
}

fn is_port_level_tls(field: &str) -> bool {
    field
        .strip_prefix("spec.trafficPolicy.portLevelSettings[")
        .and_then(|r| r.split_once("]."))
        .is_some_and(|(n, rest)| rest == "tls" && n.parse::<usize>().is_ok())
}

/// Istio's `routeName`: an HTTP route's name quoted, else `#index`.
fn route_name(route: Option<&HttpRoute>, n: usize) -> String {
    route.and_then(|r| r.name.as_deref()).filter(|n| !n.is_empty()).map_or_else(|| format!("#{n}"), quote)
}

fn request_name(m: Option<&HttpMatchRequest>, n: usize) -> String {
    m.and_then(|m| m.name.as_deref()).filter(|n| !n.is_empty()).map_or_else(|| format!("#{n}"), quote)
}

struct Report<'a> {
    key: &'a ResourceKey,
    out: &'a mut Vec<Message>,
}

impl Report<'_> {
    fn unreachable(&mut self, list: &str, rule: usize, ruleno: &str, reason: &str) {
        let text = format!("VirtualService rule {ruleno} not used ({reason}).");
        self.out.push(Message::new(IST0130, self.key, Some(format!("spec.{list}[{rule}]")), text));
    }

    fn ineffective(&mut self, list: &str, rule: usize, ruleno: &str, matchno: &str, dupno: &str) {
        let text = format!("VirtualService rule {ruleno} match {matchno} is not used (duplicate/overlapping match in rule {dupno}).");
        self.out.push(Message::new(IST0131, self.key, Some(format!("spec.{list}[{rule}]")), text));
    }
}

/// Istio's `analyzeUnreachableHTTPRules`, `...TCPRules`, `...TLSRules`.
fn unreachable_rules(key: &ResourceKey, vs: &VirtualService, out: &mut Vec<Message>) {
    let mut r = Report { key, out };
    // HTTP: matches compared as Istio compares their JSON, without `name`.
    let unnamed = |m: &HttpMatchRequest| HttpMatchRequest { name: None, ..m.clone() };
    let mut seen: Vec<(HttpMatchRequest, usize)> = Vec::new();
    let mut empty: Option<usize> = None;
    let mut prefixed: Vec<PrefixMatch> = Vec::new();
    for (n, route) in vs.http.iter().enumerate() {
        let name = route_name(Some(route), n);
        if route.matches.is_empty() {
            if empty.is_some() {
                r.unreachable("http", n, &name, "only the last rule can have no matches");
            }
            empty = Some(n);
            continue;
        }
        let mut duplicates = 0;
        for (mn, m) in route.matches.iter().enumerate() {
            if empty.is_some() {
                r.unreachable("http", n, &name, "route without matches defined before");
                continue;
            }
            let bare = unnamed(m);
            if let Some((_, dup)) = seen.iter().find(|(s, _)| *s == bare) {
                r.ineffective("http", n, &name, &request_name(Some(m), mn), &route_name(vs.http.get(*dup), *dup));
                duplicates += 1;
                continue;
            }
            seen.push((bare, n));
            prefixed.extend(PrefixMatch::of(m, n, name.clone(), request_name(Some(m), mn)));
        }
        if duplicates == route.matches.len() {
            r.unreachable("http", n, &name, "all matches used by prior rules");
        }
    }
    for (i, a) in prefixed.iter().enumerate() {
        for b in &prefixed[i + 1..] {
            if b.prefix != a.prefix && a.covers(b) {
                let matchno = format!("{} of prefix {}", b.match_str, b.prefix);
                let dupno = format!("{} of prefix {} on {}", a.match_str, a.prefix, a.route_str);
                r.ineffective("http", b.rule, &b.route_str, &matchno, &dupno);
            }
        }
    }
    l4_rules(&mut r, "tcp", vs.tcp.iter().map(|t| t.matches.as_slice()));
    l4_rules(&mut r, "tls", vs.tls.iter().map(|t| t.matches.as_slice()));
}

/// The TCP and TLS versions: unnamed rules and matches, no prefixes.
fn l4_rules<'m, M: PartialEq + 'm>(r: &mut Report, list: &str, rules: impl Iterator<Item = &'m [M]>) {
    let mut seen: Vec<(&M, usize)> = Vec::new();
    let mut empty: Option<usize> = None;
    for (n, matches) in rules.enumerate() {
        let name = format!("#{n}");
        if matches.is_empty() {
            if empty.is_some() {
                r.unreachable(list, n, &name, "only the last rule can have no matches");
            }
            empty = Some(n);
            continue;
        }
        let mut duplicates = 0;
        for (mn, m) in matches.iter().enumerate() {
            if empty.is_some() {
                r.unreachable(list, n, &name, "route without matches defined before");
                continue;
            }
            match seen.iter().find(|(s, _)| *s == m) {
                Some((_, dup)) => {
                    r.ineffective(list, n, &name, &format!("#{mn}"), &format!("#{dup}"));
                    duplicates += 1;
                }
                None => seen.push((m, n)),
            }
        }
        if duplicates == matches.len() {
            r.unreachable(list, n, &name, "all matches used by prior rules");
        }
    }
}

/// Istio's `OverlappingMatchValidationForHTTPRoute`: a match on a URI
/// prefix, with the other conditions as `exact:`/`prefix:` strings.
struct PrefixMatch {
    rule: usize,
    route_str: String,
    match_str: String,
    prefix: String,
    port: u32,
    method: String,
    authority: String,
    headers: BTreeMap<String, String>,
    query: BTreeMap<String, String>,
    without: BTreeMap<String, String>,
}

fn exact_or_prefix(m: Option<&crate::model::istio::common::StringMatch>) -> String {
    match m {
        Some(m) if m.exact.as_deref().is_some_and(|e| !e.is_empty()) => format!("exact:{}", m.exact.as_deref().unwrap_or("")),
        Some(m) if m.prefix.as_deref().is_some_and(|p| !p.is_empty()) => format!("prefix:{}", m.prefix.as_deref().unwrap_or("")),
        _ => String::new(),
    }
}

impl PrefixMatch {
    fn of(m: &HttpMatchRequest, rule: usize, route_str: String, match_str: String) -> Option<PrefixMatch> {
        let prefix = m.uri.as_ref()?.prefix.clone().filter(|p| !p.is_empty())?;
        let method = Some(exact_or_prefix(m.method.as_ref())).filter(|s| !s.is_empty()).unwrap_or_else(|| "exact:GET".into());
        let map = |h: &BTreeMap<String, crate::model::istio::common::StringMatch>| h.iter().map(|(k, v)| (k.clone(), exact_or_prefix(Some(v)))).collect();
        Some(PrefixMatch {
            rule,
            route_str,
            match_str,
            prefix,
            port: m.port.unwrap_or(0),
            method,
            authority: exact_or_prefix(m.authority.as_ref()),
            headers: map(&m.headers),
            query: map(&m.query_params),
            without: map(&m.without_headers),
        })
    }

    /// Istio's `coveredValidation(a, b)`: `b`'s prefix extends `a`'s and
    /// every other condition of `a` is `b`'s or starts with it.
    fn covers(&self, b: &PrefixMatch) -> bool {
        let same_or_prefixed = |x: &str, y: &str| x == y || x.starts_with(y);
        let maps = |x: &BTreeMap<String, String>, y: &BTreeMap<String, String>| {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_or_prefixed(v, w)))
        };
        b.prefix.starts_with(&self.prefix)
            && self.port == b.port
            && same_or_prefixed(&self.method, &b.method)
            && same_or_prefixed(&self.authority, &b.authority)
            && maps(&self.headers, &b.headers)
            && maps(&self.query, &b.query)
            && maps(&self.without, &b.without)
    }
}
