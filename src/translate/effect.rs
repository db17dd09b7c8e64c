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
use super::resources::{Generator, ProxyConfig, ResourceMap, ResourceType, XdsResource};
use crate::model::diff::{diff, FieldChange};
use crate::model::proxy::ProxyIdentity;
use crate::state::State;
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

/// What a change does to a set of proxies: those whose config would
/// change (proxies that would lose a cluster their routes use first, then
/// by node id), those that could not be translated (node id, error), and
/// how many would not change.
#[derive(Debug, Default)]
pub struct Effects {
    pub changed: Vec<ProxyEffect>,
    pub failed: Vec<(String, String)>,
    pub unchanged: usize,
}

/// How every one of `proxies` changes from `before` to `after`, with
/// `scratch` (a translator of its own: a fork of the xDS server's, so a
/// proxy served at `before` starts from its served config). Every proxy
/// at `before` first, then every one at `after`: a translator keeps one
/// mesh, and alternating revisions would rebuild it for every proxy. At
/// `after` a proxy the change cannot reach keeps its config's maps as
/// they are (the translator's scope check), so comparing it costs a
/// pointer compare per resource type.
pub fn preview(scratch: &dyn Generator, proxies: &[ProxyIdentity], before: &State, after: &State) -> Effects {
    let mut out = Effects::default();
    let mut diffs = DiffCache::new();
    let befores: Vec<_> = proxies.iter().map(|p| scratch.generate(p, before)).collect();
    for (p, b) in proxies.iter().zip(befores) {
        match (b, scratch.generate(p, after)) {
            (Ok(b), Ok(a)) => out.changed.extend(proxy_effect(p, &b, &a, &mut diffs)),
            (_, Err(e)) | (Err(e), _) => out.failed.push((p.id.clone(), e)),
        }
        scratch.forget(&p.id);
    }
    out.changed.sort_by(|a, b| (a.lost_clusters.is_empty(), &a.proxy).cmp(&(b.lost_clusters.is_empty(), &b.proxy)));
    out.unchanged = proxies.len() - out.changed.len() - out.failed.len();
    out
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
    use crate::mesh::MeshConfig;
    use crate::model::{Kind, ResourceKey};
    use crate::state::txn::{Op, Txn};
    use crate::Translator;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::route::v3::{Route, RouteAction, VirtualHost};
    use envoy_types::pb::google::protobuf::Duration;
    use serde_json::{json, Value};

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

    fn doc(doc: Value) -> Op {
        let r = crate::model::parse_resource(doc, "default").unwrap();
        crate::model::validate_spec(&r).unwrap();
        Op::Put { body: crate::model::json_text(&r.body).into(), key: r.key, expected_revision: None }
    }

    fn apply(state: &State, ops: Vec<Op>) -> State {
        let mut s = state.clone();
        s.apply_txn(&Txn { ops }).0.expect("applied");
        s
    }

    fn put(state: &State, docs: Vec<Value>) -> State {
        apply(state, docs.into_iter().map(doc).collect())
    }

    fn service(name: &str, ns: &str) -> Value {
        json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
               "spec": {"ports": [{"name": "http", "number": 80, "targetPort": 8080}]}})
    }

    fn instance(name: &str, svc: &str, ns: &str, addr: &str, version: &str) -> Value {
        json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance",
               "metadata": {"name": name, "namespace": ns, "labels": {"version": version}},
               "spec": {"service": svc, "address": addr, "port": 8080}})
    }

    fn split(host: &str, ns: &str, weight: u32) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": host, "namespace": ns},
               "spec": {"hosts": [host], "http": [{"route": [
                   {"destination": {"host": host, "subset": "v1"}, "weight": weight},
                   {"destination": {"host": host, "subset": "v2"}, "weight": 100 - weight}]}]}})
    }

    fn subsets(host: &str, ns: &str, names: &[&str]) -> Value {
        let subsets: Vec<Value> = names.iter().map(|n| json!({"name": n, "labels": {"version": n}})).collect();
        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule", "metadata": {"name": host, "namespace": ns},
               "spec": {"host": host, "subsets": subsets}})
    }

    fn sidecar(ns: &str, hosts: &[&str]) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar", "metadata": {"name": "default", "namespace": ns},
               "spec": {"egress": [{"hosts": hosts}]}})
    }

    /// Services reviews, ratings, details in `shop` (lonely in `far`, seen
    /// by no one); proxies in `a` see reviews, in `b` all of shop, in `c`
    /// details; a gateway routes to reviews.
    fn mesh() -> State {
        let mut docs = Vec::new();
        for (i, svc) in ["reviews", "ratings", "details"].iter().enumerate() {
            docs.push(service(svc, "shop"));
            for v in ["v1", "v2"] {
                docs.push(instance(&format!("{svc}-{v}"), svc, "shop", &format!("10.0.{i}.{}", v.as_bytes()[1]), v));
            }
            docs.push(subsets(svc, "shop", &["v1", "v2"]));
        }
        docs.push(split("reviews", "shop", 80));
        // Exported to its own namespace only: no proxy here sees it.
        let mut lonely = service("lonely", "far");
        lonely["spec"]["exportTo"] = json!(["."]);
        docs.push(lonely);
        docs.push(instance("lonely-1", "lonely", "far", "10.0.9.1", "v1"));
        docs.push(sidecar("a", &["shop/reviews.shop.svc.cluster.local"]));
        docs.push(sidecar("b", &["shop/*"]));
        docs.push(sidecar("c", &["shop/details.shop.svc.cluster.local"]));
        docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway", "metadata": {"name": "gw", "namespace": "gw"},
            "spec": {"selector": {"istio": "ingress"}, "servers": [{"port": {"number": 8080, "name": "http", "protocol": "HTTP"}, "hosts": ["*/shop.example"]}]}}));
        docs.push(gateway_vs("v1"));
        put(&State::default(), docs)
    }

    fn gateway_vs(subset: &str) -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "front", "namespace": "gw"},
               "spec": {"hosts": ["shop.example"], "gateways": ["gw/gw"], "http": [{"route": [
                   {"destination": {"host": "reviews.shop.svc.cluster.local", "subset": subset}}]}]}})
    }

    fn proxies() -> Vec<ProxyIdentity> {
        let mut out = Vec::new();
        for (ns, n) in [("a", 3), ("b", 3), ("c", 2)] {
            for i in 0..n {
                let id = format!("sidecar~127.0.{}.{}~app-{i}.{ns}~{ns}.svc.cluster.local", ns.as_bytes()[0], i + 1);
                out.push(ProxyIdentity::parse(&id, &json!({"LABELS": {"app": format!("app-{i}")}})).unwrap());
            }
        }
        out.push(ProxyIdentity::parse("router~127.0.0.9~ingress.gw~gw.svc.cluster.local", &json!({"LABELS": {"istio": "ingress"}})).unwrap());
        out
    }

    /// The reference the preview must agree with: every proxy translated in
    /// full at both states by fresh translators, every resource compared.
    fn effect_in_full(proxies: &[ProxyIdentity], before: &State, after: &State) -> Effects {
        let mut out = Effects::default();
        let mut diffs = DiffCache::new();
        for p in proxies {
            let b = Translator::new(MeshConfig::default()).generate(p, before).unwrap();
            let a = Translator::new(MeshConfig::default()).generate(p, after).unwrap();
            out.changed.extend(proxy_effect(p, &b, &a, &mut diffs));
        }
        out.changed.sort_by(|a, b| (a.lost_clusters.is_empty(), &a.proxy).cmp(&(b.lost_clusters.is_empty(), &b.proxy)));
        out.unchanged = proxies.len() - out.changed.len();
        out
    }

    fn same(a: &Effects, b: &Effects) -> bool {
        a.changed == b.changed && a.failed == b.failed && a.unchanged == b.unchanged
    }

    fn names(p: &Effects) -> Vec<&str> {
        p.changed.iter().map(|c| c.proxy.as_str()).collect()
    }

    #[test]
    fn a_dry_run_lists_the_proxies_and_diffs_that_translating_every_proxy_in_full_gives() {
        let base = mesh();
        let proxies = proxies();
        let id = |prefix: &str, ns: &str| -> Vec<String> {
            let mut v: Vec<String> = proxies.iter().filter(|p| p.id.starts_with(prefix) && p.namespace == ns).map(|p| p.id.clone()).collect();
            v.sort();
            v
        };
        let (a, b, c, gw) = (id("sidecar", "a"), id("sidecar", "b"), id("sidecar", "c"), id("router", "gw"));
        let mut hidden = service("new", "far");
        hidden["spec"]["exportTo"] = json!(["."]);
        let delete = |kind: Kind, ns: &str, name: &str| Op::Delete { key: ResourceKey::new(kind, ns, name), expected_revision: None, ignore_missing: false };
        // Each change, and the proxies it must change.
        let changes: Vec<(&str, State, Vec<String>)> = vec![
            ("a route weight of reviews", put(&base, vec![split("reviews", "shop", 60)]), [a.clone(), b.clone()].concat()),
            // The gateway has a cluster for every service it sees.
            ("a subset of ratings", put(&base, vec![subsets("ratings", "shop", &["v1", "v2", "v3"])]), [b.clone(), gw.clone()].concat()),
            (
                "an endpoint of details",
                put(&base, vec![instance("details-v3", "details", "shop", "10.0.2.9", "v3")]),
                [b.clone(), c.clone(), gw.clone()].concat(),
            ),
            ("a host no proxy sees", put(&base, vec![split("lonely.far.svc.cluster.local", "far", 50), subsets("lonely", "far", &["v1", "v2"])]), vec![]),
            ("a new service no proxy sees", put(&base, vec![hidden]), vec![]),
            ("the gateway's route", put(&base, vec![gateway_vs("v2")]), gw.clone()),
            ("a Sidecar's scope", put(&base, vec![sidecar("c", &["shop/details.shop.svc.cluster.local", "shop/ratings.shop.svc.cluster.local"])]), c.clone()),
            (
                "every proxy at once",
                put(&base, vec![split("reviews", "shop", 10), subsets("details", "shop", &["v1"])]),
                [a.clone(), b.clone(), c.clone(), gw.clone()].concat(),
            ),
            ("reviews' route deleted", apply(&base, vec![delete(Kind::VirtualService, "shop", "reviews")]), [a.clone(), b.clone()].concat()),
        ];
        // The server has served every proxy at `base`; a preview forks it.
        let served = Translator::new(MeshConfig::default());
        for p in &proxies {
            served.generate(p, &base).unwrap();
        }
        for (what, after, want) in &changes {
            let reference = effect_in_full(&proxies, &base, after);
            let mut listed: Vec<String> = names(&reference).into_iter().map(String::from).collect();
            listed.sort();
            let mut want = want.clone();
            want.sort();
            assert_eq!(listed, want, "{what}: the reference lists the proxies the change reaches");
            assert_eq!(reference.unchanged, proxies.len() - want.len(), "{what}");
            let fork = served.fork().expect("a fork");
            let cold = Translator::new(MeshConfig::default());
            for (how, scratch) in [("forked", fork.as_ref()), ("cold", &cold as &dyn Generator)] {
                let got = preview(scratch, &proxies, &base, after);
                assert!(same(&got, &reference), "{what} ({how} translator): the preview differs from translating in full:\n{got:?}\n{reference:?}");
            }
        }
        // A preview from a revision the proxies were not served at yet
        // (their streams lag): the same again.
        let (_, lagging, _) = &changes[0];
        let after = put(lagging, vec![subsets("ratings", "shop", &["v1"])]);
        let reference = effect_in_full(&proxies, lagging, &after);
        assert!(!reference.changed.is_empty());
        assert!(same(&preview(served.fork().unwrap().as_ref(), &proxies, lagging, &after), &reference), "a preview from a revision not yet served");
        // The server's translator is untouched: its proxies still get the
        // config of `base`.
        let p = &proxies[0];
        let again = Generator::generate(&served, p, &base).unwrap();
        let fresh = Translator::new(MeshConfig::default()).generate(p, &base).unwrap();
        assert!(proxy_effect(p, &fresh, &again, &mut DiffCache::new()).is_none());
    }
}
