//! What a change does to one proxy: its config translated before and after,
//! compared resource by resource (`lodestar apply --dry-run` lists every
//! connected proxy whose Envoy config would change). Pure: two configs in,
//! a diff out.
//!
//! Resources are compared by their versions (a hash of the deterministic
//! encoding), so an unchanged resource costs a string compare (and a type
//! map shared by both configs, nothing); only the
//! changed ones are rendered as proto-JSON for a field-level diff. Secrets
//! are named, never rendered.

use super::json::any_to_json;
use super::resources::{ProxyConfig, ResourceMap, ResourceType, XdsResource};
use crate::model::diff::{diff, FieldChange};
use crate::model::proxy::ProxyIdentity;
use envoy_types::pb::envoy::config::listener::v3::{filter, Listener};
use envoy_types::pb::envoy::config::route::v3::{route::Action, route_action::ClusterSpecifier, RouteConfiguration};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{http_connection_manager::RouteSpecifier, HttpConnectionManager};
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{tcp_proxy, TcpProxy};
use prost::{Message, Name};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::sync::Arc;

/// One proxy whose config would change.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProxyEffect {
    /// The node id.
    pub proxy: String,
    pub kind: String,
    pub namespace: String,
    /// Clusters this change removes that the proxy's routes or TCP
    /// listeners still send traffic to: requests there would fail (503).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost_clusters: Vec<String>,
    /// Every resource that differs, by type (CDS, EDS, SDS, LDS, RDS) then
    /// name.
    pub changes: Vec<ResourceChange>,
}

/// One resource of a proxy's config that would change.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ResourceChange {
    /// CDS, EDS, SDS, LDS or RDS.
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub name: String,
    /// added, removed or changed.
    pub action: &'static str,
    /// The proto-JSON fields that differ (changed resources; never for a
    /// secret).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub diff: Vec<FieldChange>,
}

/// Field diffs already computed, by type, name and the two versions:
/// proxies that share a resource (most do: interned route tables and
/// clusters) share its diff, computed once per preview.
pub type DiffCache = std::collections::HashMap<(&'static str, String, String, String), Vec<FieldChange>>;

/// How `proxy`'s config changes from `before` to `after`; `None` when it
/// does not. Field diffs come from (and go into) `cache`.
pub fn proxy_effect(proxy: &ProxyIdentity, before: &ProxyConfig, after: &ProxyConfig, cache: &mut DiffCache) -> Option<ProxyEffect> {
    let empty = ResourceMap::new();
    let mut changes = Vec::new();
    for t in ResourceType::PUSH_ORDER {
        // A type the translation carried over (most of them, for most
        // changes) is the same map: nothing to compare.
        if let (Some(b), Some(a)) = (before.resources.get(&t), after.resources.get(&t)) {
            if Arc::ptr_eq(b, a) {
                continue;
            }
        }
        let (b, a) = (before.of(t).unwrap_or(&empty), after.of(t).unwrap_or(&empty));
        // Both maps are sorted by name: walk them side by side.
        let (mut bi, mut ai) = (b.iter().peekable(), a.iter().peekable());
        loop {
            let order = match (bi.peek(), ai.peek()) {
                (None, None) => break,
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (Some((nb, _)), Some((na, _))) => nb.cmp(na),
            };
            let change = match order {
                Ordering::Less => {
                    let (name, _) = bi.next().expect("peeked");
                    ResourceChange { type_: t.short(), name: name.clone(), action: "removed", diff: Vec::new() }
                }
                Ordering::Greater => {
                    let (name, _) = ai.next().expect("peeked");
                    ResourceChange { type_: t.short(), name: name.clone(), action: "added", diff: Vec::new() }
                }
                Ordering::Equal => {
                    let ((name, x), (_, y)) = (bi.next().expect("peeked"), ai.next().expect("peeked"));
                    if Arc::ptr_eq(x, y) || x.version == y.version {
                        continue;
                    }
                    let key = (t.short(), name.clone(), x.version.clone(), y.version.clone());
                    let diff = cache.entry(key).or_insert_with(|| resource_diff(t, x, y)).clone();
                    ResourceChange { type_: t.short(), name: name.clone(), action: "changed", diff }
                }
            };
            changes.push(change);
        }
    }
    if changes.is_empty() {
        return None;
    }
    let removed: BTreeSet<&str> = changes.iter().filter(|c| c.type_ == "CDS" && c.action == "removed").map(|c| c.name.as_str()).collect();
    let lost_clusters = if removed.is_empty() { Vec::new() } else { referenced_clusters(after).into_iter().filter(|c| removed.contains(c.as_str())).collect() };
    Some(ProxyEffect { proxy: proxy.id.clone(), kind: format!("{:?}", proxy.kind).to_lowercase(), namespace: proxy.namespace.clone(), lost_clusters, changes })
}

fn resource_diff(t: ResourceType, before: &XdsResource, after: &XdsResource) -> Vec<FieldChange> {
    if t == ResourceType::Secret {
        return Vec::new();
    }
    match (any_to_json(&before.any), any_to_json(&after.any)) {
        (Ok(b), Ok(a)) => diff(&b, &a, false),
        _ => Vec::new(),
    }
}

/// Every cluster a config's routes and TCP proxies send traffic to.
pub fn referenced_clusters(config: &ProxyConfig) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for r in config.of(ResourceType::Route).into_iter().flat_map(|m| m.values()) {
        if let Ok(rc) = RouteConfiguration::decode(r.any.value.as_slice()) {
            route_clusters(&rc, &mut out);
        }
    }
    for l in config.of(ResourceType::Listener).into_iter().flat_map(|m| m.values()) {
        let Ok(listener) = Listener::decode(l.any.value.as_slice()) else { continue };
        for f in listener.filter_chains.iter().chain(listener.default_filter_chain.iter()).flat_map(|c| &c.filters) {
            let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else { continue };
            if any.type_url == TcpProxy::type_url() {
                match TcpProxy::decode(any.value.as_slice()).ok().and_then(|t| t.cluster_specifier) {
                    Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => {
                        out.insert(c);
                    }
                    Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) => out.extend(w.clusters.into_iter().map(|c| c.name)),
                    None => {}
                }
            } else if any.type_url == HttpConnectionManager::type_url() {
                if let Some(RouteSpecifier::RouteConfig(rc)) = HttpConnectionManager::decode(any.value.as_slice()).ok().and_then(|h| h.route_specifier) {
                    route_clusters(&rc, &mut out);
                }
            }
        }
    }
    out
}

fn route_clusters(rc: &RouteConfiguration, out: &mut BTreeSet<String>) {
    for route in rc.virtual_hosts.iter().flat_map(|v| &v.routes) {
        let Some(Action::Route(action)) = &route.action else { continue };
        match &action.cluster_specifier {
            Some(ClusterSpecifier::Cluster(c)) => {
                out.insert(c.clone());
            }
            Some(ClusterSpecifier::WeightedClusters(w)) => out.extend(w.clusters.iter().map(|c| c.name.clone())),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, VirtualHost};
    use envoy_types::pb::google::protobuf::Duration;

    fn proxy() -> ProxyIdentity {
        ProxyIdentity::parse("sidecar~127.0.0.1~web.shop~shop.svc.cluster.local", &serde_json::json!({})).unwrap()
    }

    fn cluster(name: &str, timeout_s: i64) -> XdsResource {
        XdsResource::new(name, &Cluster { name: name.into(), connect_timeout: Some(Duration { seconds: timeout_s, nanos: 0 }), ..Default::default() })
    }

    fn routes(to: &[&str]) -> XdsResource {
        let routes = to
            .iter()
            .map(|c| Route {
                action: Some(Action::Route(RouteAction { cluster_specifier: Some(ClusterSpecifier::Cluster(c.to_string())), ..Default::default() })),
                ..Default::default()
            })
            .collect();
        XdsResource::new(
            "80",
            &RouteConfiguration {
                name: "80".into(),
                virtual_hosts: vec![VirtualHost { name: "v".into(), routes, ..Default::default() }],
                ..Default::default()
            },
        )
    }

    fn config(resources: Vec<(ResourceType, XdsResource)>) -> ProxyConfig {
        let mut c = ProxyConfig::default();
        for (t, r) in resources {
            c.insert(t, r);
        }
        c
    }

    #[test]
    fn lists_what_differs_with_field_diffs() {
        let before = config(vec![(ResourceType::Cluster, cluster("a", 1)), (ResourceType::Cluster, cluster("b", 1)), (ResourceType::Route, routes(&["a"]))]);
        let after = config(vec![(ResourceType::Cluster, cluster("a", 2)), (ResourceType::Cluster, cluster("c", 1)), (ResourceType::Route, routes(&["a"]))]);
        let e = proxy_effect(&proxy(), &before, &after, &mut DiffCache::new()).expect("a change");
        let got: Vec<(&str, &str, &str)> = e.changes.iter().map(|c| (c.type_, c.name.as_str(), c.action)).collect();
        assert_eq!(got, vec![("CDS", "a", "changed"), ("CDS", "b", "removed"), ("CDS", "c", "added")]);
        assert_eq!(e.changes[0].diff.len(), 1, "{:?}", e.changes[0].diff);
        assert_eq!(e.changes[0].diff[0].path, "connectTimeout");
        assert!(e.lost_clusters.is_empty(), "b is not routed to");
        assert_eq!(proxy_effect(&proxy(), &before, &before, &mut DiffCache::new()), None);
    }

    #[test]
    fn a_removed_cluster_still_routed_to_is_called_out() {
        let before =
            config(vec![(ResourceType::Cluster, cluster("a", 1)), (ResourceType::Cluster, cluster("b", 1)), (ResourceType::Route, routes(&["a", "b"]))]);
        let after = config(vec![(ResourceType::Cluster, cluster("a", 1)), (ResourceType::Route, routes(&["a", "b"]))]);
        let e = proxy_effect(&proxy(), &before, &after, &mut DiffCache::new()).expect("a change");
        assert_eq!(e.lost_clusters, vec!["b".to_string()]);
    }
}
