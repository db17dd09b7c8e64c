//! VirtualService delegation, with Istio's merge rules (pilot's
//! `mergeHTTPRoute`, `mergeHTTPMatchRequests`, `hasConflict`): a root
//! VirtualService's HTTP route with `delegate` is replaced by the child's
//! routes, in the child's order, each with its matches intersected with the
//! root route's. A child match that no root match admits (a conflict, as a
//! prefix `/b` under a root prefix `/a`) drops that child route; properties
//! the child route leaves unset (timeout, retries, rewrite, fault, mirror,
//! CORS, headers) come from the root route. Only one level: a child's own
//! `delegate` routes are dropped.

use super::common::{MatchKind, StringMatch};
use super::virtual_service::{HttpMatchRequest, HttpRoute};

/// The routes `root` (a route with `delegate`) becomes with the child's
/// HTTP routes `child`.
pub fn merge_routes(root: &HttpRoute, child: &[HttpRoute]) -> Vec<HttpRoute> {
    child.iter().filter(|c| c.delegate.is_none()).filter_map(|c| merge_route(root, c)).collect()
}

fn merge_route(root: &HttpRoute, child: &HttpRoute) -> Option<HttpRoute> {
    let mut out = child.clone();
    out.matches = merge_matches(&root.matches, &child.matches)?;
    out.name = match (&root.name, &child.name) {
        (Some(r), Some(c)) => Some(format!("{r}-{c}")),
        (r, c) => c.clone().or_else(|| r.clone()),
    };
    if out.rewrite.is_none() {
        out.rewrite = root.rewrite.clone();
    }
    if out.timeout.is_none() {
        out.timeout = root.timeout.clone();
    }
    if out.retries.is_none() {
        out.retries = root.retries.clone();
    }
    if out.fault.is_none() {
        out.fault = root.fault.clone();
    }
    if out.mirror.is_none() && out.mirrors.is_empty() {
        out.mirror = root.mirror.clone();
        out.mirrors = root.mirrors.clone();
        out.mirror_percent = out.mirror_percent.or(root.mirror_percent);
        out.mirror_percentage = out.mirror_percentage.or(root.mirror_percentage);
    }
    if out.cors_policy.is_none() {
        out.cors_policy = root.cors_policy.clone();
    }
    if out.headers.is_none() {
        out.headers = root.headers.clone();
    }
    Some(out)
}

/// Every child match must be admitted by some root match (else `None`:
/// the route conflicts); the result is each admitted pair, merged.
fn merge_matches(root: &[HttpMatchRequest], child: &[HttpMatchRequest]) -> Option<Vec<HttpMatchRequest>> {
    if root.is_empty() {
        return Some(child.to_vec());
    }
    if child.is_empty() {
        return Some(root.to_vec());
    }
    let mut out = Vec::new();
    for c in child {
        let admitted: Vec<HttpMatchRequest> = root.iter().filter(|r| !conflict(r, c)).map(|r| merge_match(r, c)).collect();
        if admitted.is_empty() {
            return None;
        }
        out.extend(admitted);
    }
    Some(out)
}

fn merge_match(root: &HttpMatchRequest, child: &HttpMatchRequest) -> HttpMatchRequest {
    let mut out = child.clone();
    out.name = match (&root.name, &child.name) {
        (Some(r), Some(c)) => Some(format!("{r}-{c}")),
        (r, c) => c.clone().or_else(|| r.clone()),
    };
    out.uri = out.uri.or_else(|| root.uri.clone());
    out.scheme = out.scheme.or_else(|| root.scheme.clone());
    out.method = out.method.or_else(|| root.method.clone());
    out.authority = out.authority.or_else(|| root.authority.clone());
    for (k, v) in &root.headers {
        out.headers.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in &root.without_headers {
        out.without_headers.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in &root.query_params {
        out.query_params.entry(k.clone()).or_insert_with(|| v.clone());
    }
    out.port = out.port.or(root.port);
    for (k, v) in &root.source_labels {
        out.source_labels.entry(k.clone()).or_insert_with(|| v.clone());
    }
    out.source_namespace = out.source_namespace.or_else(|| root.source_namespace.clone());
    if out.gateways.is_empty() {
        out.gateways = root.gateways.clone();
    }
    out
}

/// Whether the child match asks for something the root match excludes.
fn conflict(root: &HttpMatchRequest, child: &HttpMatchRequest) -> bool {
    let pairs = [(&root.uri, &child.uri), (&root.scheme, &child.scheme), (&root.method, &child.method), (&root.authority, &child.authority)];
    if pairs.iter().any(|(r, c)| string_conflict(r.as_ref(), c.as_ref())) {
        return true;
    }
    let maps = [(&root.headers, &child.headers), (&root.without_headers, &child.without_headers), (&root.query_params, &child.query_params)];
    if maps.iter().any(|(r, c)| c.iter().any(|(k, v)| string_conflict(r.get(k), Some(v)))) {
        return true;
    }
    if root.ignore_uri_case.unwrap_or(false) != child.ignore_uri_case.unwrap_or(false) {
        return true;
    }
    if root.port.is_some_and(|r| child.port.is_some_and(|c| c != r)) {
        return true;
    }
    if root.source_namespace.as_ref().is_some_and(|r| child.source_namespace.as_ref() != Some(r)) {
        return true;
    }
    if child.source_labels.iter().any(|(k, v)| root.source_labels.get(k).is_some_and(|r| r != v)) {
        return true;
    }
    !root.gateways.is_empty() && !child.gateways.is_empty() && child.gateways.iter().any(|g| !root.gateways.contains(g))
}

/// Istio's `stringMatchConflict`: the child must narrow the root (an
/// exact equal to it, a prefix or exact under its prefix); regexes only
/// combine with nothing on the other side.
fn string_conflict(root: Option<&StringMatch>, child: Option<&StringMatch>) -> bool {
    let (Some(root), Some(child)) = (root.and_then(StringMatch::kind), child.and_then(StringMatch::kind)) else {
        return false;
    };
    match (root, child) {
        (MatchKind::Regex(_), _) | (_, MatchKind::Regex(_)) => true,
        (MatchKind::Exact(r), MatchKind::Exact(c)) => r != c,
        (MatchKind::Exact(_), MatchKind::Prefix(_)) => true,
        (MatchKind::Prefix(r), MatchKind::Prefix(c) | MatchKind::Exact(c)) => !c.starts_with(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(v: serde_json::Value) -> HttpRoute {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn child_matches_are_intersected_with_the_root_and_order_kept() {
        let root = route(json!({"name": "reviews", "match": [{"uri": {"prefix": "/reviews"}}], "delegate": {"name": "child"}, "timeout": "2s"}));
        let child = [
            route(
                json!({"match": [{"uri": {"prefix": "/reviews/v2"}, "headers": {"end-user": {"exact": "jason"}}}], "route": [{"destination": {"host": "v2"}}]}),
            ),
            route(json!({"match": [{"uri": {"prefix": "/ratings"}}], "route": [{"destination": {"host": "elsewhere"}}]})),
            route(json!({"name": "rest", "route": [{"destination": {"host": "v1"}}], "timeout": "5s"})),
        ];
        let merged = merge_routes(&root, &child);
        assert_eq!(merged.len(), 2, "the /ratings route conflicts with /reviews: {merged:#?}");
        assert_eq!(merged[0].matches[0].uri.as_ref().and_then(|u| u.prefix.as_deref()), Some("/reviews/v2"));
        assert!(merged[0].matches[0].headers.contains_key("end-user"));
        assert_eq!(merged[0].timeout, root.timeout, "unset in the child: the root's");
        assert_eq!(merged[0].name.as_deref(), Some("reviews"));
        // A child route without matches takes the root's.
        assert_eq!(merged[1].matches, root.matches);
        assert_eq!(merged[1].name.as_deref(), Some("reviews-rest"));
        assert_ne!(merged[1].timeout, root.timeout, "set in the child: its own");
    }

    #[test]
    fn conflicts() {
        let m = |v: serde_json::Value| -> HttpMatchRequest { serde_json::from_value(v).unwrap() };
        assert!(conflict(&m(json!({"uri": {"exact": "/a"}})), &m(json!({"uri": {"prefix": "/a"}}))));
        assert!(!conflict(&m(json!({"uri": {"prefix": "/a"}})), &m(json!({"uri": {"exact": "/a/b"}}))));
        assert!(conflict(&m(json!({"uri": {"regex": "/a.*"}})), &m(json!({"uri": {"prefix": "/a"}}))));
        assert!(conflict(&m(json!({"headers": {"x": {"exact": "1"}}})), &m(json!({"headers": {"x": {"exact": "2"}}}))));
        assert!(!conflict(&m(json!({"headers": {"x": {"exact": "1"}}})), &m(json!({"headers": {"y": {"exact": "2"}}}))));
        assert!(conflict(&m(json!({"port": 80})), &m(json!({"port": 81}))));
        assert!(conflict(&m(json!({"gateways": ["a"]})), &m(json!({"gateways": ["b"]}))));
        assert!(!conflict(&m(json!({})), &m(json!({"uri": {"regex": ".*"}}))));
    }
}
