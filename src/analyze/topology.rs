//! Who may call whom (`GET /v1/topology`, the console's Services view),
//! from config and registry alone (no traffic data): a pure function of
//! one [`Mesh`].
//!
//! The callers are the registry's workloads: each service with instances,
//! as one workload (the labels all its instances share, their namespace,
//! their service accounts). For each, the services its proxy can reach
//! (exported to its namespace and admitted by the egress of the Sidecar
//! that applies to it, as its listeners are built: `translate::scope`);
//! a host with a VirtualService (the oldest visible one bound to `mesh`)
//! leads to that route's destinations instead. Each edge then gets the
//! verdict of the callee's AuthorizationPolicies for the caller's
//! identity: DENY first, then ALLOW (no ALLOW policy: allowed). A rule
//! that depends on the request (operations, conditions, request
//! principals, IP blocks) makes the edge `conditional`. CUSTOM, AUDIT
//! and dry-run policies change no verdict.

use crate::model::istio::authorization_policy::{Action, Rule, Source};
use crate::model::istio::resolve_short_name;
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use crate::model::ResourceKey;
use crate::translate::mesh::{exported_to, Mesh, Service};
use crate::translate::scope::{egress_plans, sidecar_for, ProxyScope};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The graph at one revision.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    pub revision: u64,
    /// Every service shown (callers and callees).
    pub services: Vec<Node>,
    pub edges: Vec<Edge>,
    /// More edges than the limit: the rest left out.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    pub hostname: String,
    pub namespace: String,
    /// Its instances (0: it calls nothing; a ServiceEntry, say).
    pub instances: usize,
    /// The Sidecar that scopes its calls, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sidecar: Option<Via>,
    /// The config that applies to calls to it: VirtualServices (`route`),
    /// DestinationRules (`destination`), AuthorizationPolicies on its
    /// workloads (`allow`, `deny`, `audit`, `custom`). Only those the
    /// caller may read.
    pub applies: Vec<Via>,
}

/// One caller → callee edge.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edge {
    /// The caller's and the callee's hostnames and namespaces.
    pub from: String,
    pub from_namespace: String,
    pub to: String,
    pub to_namespace: String,
    /// The host the caller names, when a VirtualService sends it elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub verdict: Verdict,
    /// Why, in words.
    pub reason: String,
    /// The objects the edge goes through: the route, the Sidecar, the
    /// policies that decided it.
    pub via: Vec<Via>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allowed,
    Denied,
    /// Some requests: a rule that decides depends on the request.
    Conditional,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Via {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// `route`, `egress`, `allow` or `deny`.
    pub role: &'static str,
}

impl Via {
    fn of(key: &ResourceKey, role: &'static str) -> Via {
        Via { kind: key.kind.name(), namespace: key.namespace.to_string(), name: key.name.to_string(), role }
    }
}

/// A workload as a caller or callee: the labels every instance has.
struct Workload<'a> {
    service: &'a Arc<Service>,
    labels: BTreeMap<String, String>,
    /// (namespace, service account) of its instances.
    identities: BTreeSet<(&'a str, &'a str)>,
}

fn workload(service: &Arc<Service>) -> Workload<'_> {
    let mut labels = service.instances.first().map(|i| i.labels.clone()).unwrap_or_default();
    for i in &service.instances[1.min(service.instances.len())..] {
        labels.retain(|k, v| i.labels.get(k) == Some(v));
    }
    Workload { service, labels, identities: service.identities() }
}

/// The topology of `mesh`, as a caller who may read what `may_read` lets
/// through sees it: a service is shown if every object it is built from
/// is readable; an edge if both its ends are and every object it goes
/// through. `namespace`: only edges with an end there. At most `limit`
/// edges.
pub fn topology(mesh: &Mesh, may_read: impl Fn(&ResourceKey) -> bool, namespace: Option<&str>, limit: usize) -> Topology {
    let readable = |s: &Service| s.sources.iter().all(|(k, _)| may_read(k));
    let wanted = |s: &Service| namespace.is_none_or(|ns| s.namespace == ns);
    let (mut edges, mut shown, mut truncated) = (Vec::new(), BTreeSet::new(), false);
    'callers: for caller in mesh.all_services().filter(|s| !s.instances.is_empty() && readable(s)) {
        let w = workload(caller);
        let proxy = identity(&w);
        let sidecar = sidecar_for(mesh, &proxy);
        // Its calls cannot be told without the Sidecar that scopes them.
        if sidecar.is_some_and(|s| !may_read(&s.key)) {
            continue;
        }
        let scope = ProxyScope::of(mesh, &proxy);
        let reachable: BTreeMap<String, Arc<Service>> =
            egress_plans(&scope, &proxy, sidecar.map(|s| s.as_ref())).into_iter().flat_map(|p| p.services).collect();
        let sidecar_via = sidecar.map(|s| Via::of(&s.key, "egress"));
        for (host, callee) in &reachable {
            for (to, route) in destinations(mesh, &scope, &proxy.namespace, host, callee) {
                if to.hostname == caller.hostname || !readable(&to) || !(wanted(caller) || wanted(&to)) {
                    continue;
                }
                let mut via: Vec<Via> = route.iter().map(|k| Via::of(k, "route")).chain(sidecar_via.clone()).collect();
                let (verdict, reason, policies) = authorize(mesh, &w, &workload(&to));
                if route.iter().chain(policies.iter().map(|(k, _)| k)).any(|k| !may_read(k)) {
                    continue;
                }
                via.extend(policies.iter().map(|(k, role)| Via::of(k, role)));
                if edges.len() == limit {
                    truncated = true;
                    break 'callers;
                }
                shown.insert((to.hostname.clone(), to.namespace.clone()));
                shown.insert((caller.hostname.clone(), caller.namespace.clone()));
                let host = (to.hostname != *host).then(|| host.clone());
                edges.push(Edge {
                    from: caller.hostname.clone(),
                    from_namespace: caller.namespace.clone(),
                    to: to.hostname.clone(),
                    to_namespace: to.namespace.clone(),
                    host,
                    verdict,
                    reason,
                    via,
                });
            }
        }
    }
    let services = mesh
        .all_services()
        .filter(|s| readable(s) && (wanted(s) || shown.contains(&(s.hostname.clone(), s.namespace.clone()))))
        .map(|s| node(mesh, s, &may_read))
        .collect();
    Topology { revision: mesh.revision, services, edges, truncated }
}

/// A service as a node: its Sidecar (when it has workloads) and the
/// config that applies to it, as far as `may_read` lets through.
fn node(mesh: &Mesh, s: &Arc<Service>, may_read: impl Fn(&ResourceKey) -> bool) -> Node {
    let w = workload(s);
    let sidecar = if s.instances.is_empty() { None } else { sidecar_for(mesh, &identity(&w)).filter(|c| may_read(&c.key)).map(|c| Via::of(&c.key, "egress")) };
    let routes = mesh.virtual_services_for_host(&s.hostname).into_iter().map(|c| (&c.key, "route"));
    let rules = mesh.destination_rules_for_host(&s.hostname).into_iter().map(|c| (&c.key, "destination"));
    let root = &mesh.config.root_namespace;
    let policies = mesh
        .authorization_policies
        .iter()
        .filter(|p| {
            !s.instances.is_empty()
                && crate::model::istio::common::policy_applies(
                    &p.key.namespace,
                    p.spec.spec.selector.as_ref().map(|l| &l.match_labels),
                    root,
                    &s.namespace,
                    &w.labels,
                )
        })
        .map(|p| {
            let role = match p.spec.spec.action() {
                Action::Allow => "allow",
                Action::Deny => "deny",
                Action::Audit => "audit",
                Action::Custom => "custom",
            };
            (&p.key, role)
        });
    let applies = routes.chain(rules).chain(policies).filter(|(k, _)| may_read(k)).map(|(k, role)| Via::of(k, role)).collect();
    Node { hostname: s.hostname.clone(), namespace: s.namespace.clone(), instances: s.instances.len(), sidecar, applies }
}

/// A proxy of the workload, as the translation would see it.
fn identity(w: &Workload) -> ProxyIdentity {
    let s = w.service;
    let ip = s.instances.first().map_or("127.0.0.1", |i| i.address.as_str()).to_string();
    ProxyIdentity {
        id: format!("sidecar~{ip}~{}.{}~{}.svc", s.hostname, s.namespace, s.namespace),
        kind: ProxyKind::Sidecar,
        ip,
        name: s.hostname.clone(),
        namespace: s.namespace.clone(),
        labels: w.labels.clone(),
        sds: false,
        capture: false,
        names_only: false,
        dns_capture: false,
        istio_version: None,
        metadata: BTreeMap::new(),
    }
}

/// Where calling `host` leads: the destinations of its VirtualService's
/// routes (the oldest one visible in `ns` bound to the mesh), each with
/// that VirtualService; else the service itself.
fn destinations(mesh: &Mesh, scope: &ProxyScope, ns: &str, host: &str, service: &Arc<Service>) -> Vec<(Arc<Service>, Option<ResourceKey>)> {
    let vs = mesh
        .virtual_services_for_host(host)
        .into_iter()
        .find(|vs| exported_to(&vs.spec.export_to, &vs.key.namespace, ns) && (vs.spec.gateways.is_empty() || vs.spec.gateways.iter().any(|g| g == "mesh")));
    let Some(vs) = vs else { return vec![(service.clone(), None)] };
    let suffix = &mesh.config.domain_suffix;
    let hosts = vs.spec.http.iter().flat_map(|r| r.route.iter().map(|d| &d.destination.host));
    let hosts = hosts.chain(vs.spec.tcp.iter().flat_map(|r| r.route.iter().map(|d| &d.destination.host)));
    let hosts = hosts.chain(vs.spec.tls.iter().flat_map(|r| r.route.iter().map(|d| &d.destination.host)));
    let found: BTreeSet<String> = hosts.map(|h| resolve_short_name(h, &vs.key.namespace, suffix)).collect();
    found.iter().filter_map(|h| scope.service(h)).map(|s| (s.clone(), Some(vs.key.clone()))).collect()
}

/// How far a rule (or source) matches the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Match {
    No,
    /// For some requests (or some of its instances).
    Some,
    All,
}

/// The verdict of the callee's policies on the caller, why, and the
/// policies that decided it (each `allow` or `deny`).
fn authorize(mesh: &Mesh, caller: &Workload, callee: &Workload) -> (Verdict, String, Vec<(ResourceKey, &'static str)>) {
    let root = &mesh.config.root_namespace;
    let ns = &callee.service.namespace;
    let applying = |action: Action| {
        mesh.authorization_policies.iter().filter(move |p| {
            !p.spec.dry_run
                && p.spec.spec.action() == action
                && p.spec.spec.target_ref.is_none()
                && p.spec.spec.target_refs.is_empty()
                && !callee.service.instances.is_empty()
                && crate::model::istio::common::policy_applies(
                    &p.key.namespace,
                    p.spec.spec.selector.as_ref().map(|s| &s.match_labels),
                    root,
                    ns,
                    &callee.labels,
                )
        })
    };
    let best = |p: &crate::translate::mesh::Config<crate::translate::mesh::Authz>| {
        p.spec.spec.rules.iter().flatten().map(|r| rule(r, &p.key.namespace, caller, &mesh.config.trust_domain)).max().unwrap_or(Match::No)
    };
    let names = |ps: &[ResourceKey]| ps.iter().map(|k| format!("{}/{}", k.namespace, k.name)).collect::<Vec<_>>().join(", ");
    let denies: Vec<(Match, ResourceKey)> = applying(Action::Deny).map(|p| (best(p), p.key.clone())).filter(|(m, _)| *m != Match::No).collect();
    if let Some((_, k)) = denies.iter().find(|(m, _)| *m == Match::All) {
        return (Verdict::Denied, format!("DENY policy {}/{} matches every request from it", k.namespace, k.name), vec![(k.clone(), "deny")]);
    }
    let partly_denied: Vec<ResourceKey> = denies.into_iter().map(|(_, k)| k).collect();
    let allows: Vec<(Match, ResourceKey)> = applying(Action::Allow).map(|p| (best(p), p.key.clone())).collect();
    if allows.is_empty() && partly_denied.is_empty() {
        return (Verdict::Allowed, "no ALLOW or DENY policy applies to the callee".into(), Vec::new());
    }
    let top = allows.iter().map(|(m, _)| *m).max();
    let allow = |ks: Vec<ResourceKey>| ks.into_iter().map(|k| (k, "allow"));
    let deciding: Vec<ResourceKey> = allows.iter().filter(|(m, _)| Some(*m) == top && *m != Match::No).map(|(_, k)| k.clone()).collect();
    match top {
        Some(Match::No) => {
            let all: Vec<ResourceKey> = allows.into_iter().map(|(_, k)| k).collect();
            (Verdict::Denied, format!("ALLOW policies apply to the callee and no rule of {} matches it", names(&all)), allow(all).collect())
        }
        Some(Match::All) if partly_denied.is_empty() => (Verdict::Allowed, format!("allowed by {}", names(&deciding)), allow(deciding).collect()),
        _ => {
            let mut why = Vec::new();
            if !deciding.is_empty() {
                why.push(format!("allowed for some requests by {}", names(&deciding)));
            }
            if !partly_denied.is_empty() {
                why.push(format!("some requests denied by {}", names(&partly_denied)));
            }
            (Verdict::Conditional, why.join("; "), allow(deciding).chain(partly_denied.into_iter().map(|k| (k, "deny"))).collect())
        }
    }
}

fn rule(r: &Rule, policy_ns: &str, caller: &Workload, trust_domain: &str) -> Match {
    let source = match r.from.as_deref() {
        None | Some([]) => Match::All,
        Some(froms) => froms.iter().map(|f| f.source.as_ref().map_or(Match::All, |s| source(s, policy_ns, caller, trust_domain))).max().unwrap_or(Match::No),
    };
    let request_dependent = r.to.iter().flatten().any(|t| t.operation.is_some()) || !r.when.is_empty();
    if request_dependent {
        source.min(Match::Some)
    } else {
        source
    }
}

/// Istio's `StringMatcherWithPrefix` over a value: `*` any, `*x` suffix,
/// `x*` prefix, else exact.
fn glob(pattern: &str, v: &str) -> bool {
    match (pattern.strip_prefix('*'), pattern.strip_suffix('*')) {
        _ if pattern == "*" => !v.is_empty(),
        (Some(suffix), _) => v.ends_with(suffix),
        (_, Some(prefix)) => v.starts_with(prefix),
        _ => v == pattern,
    }
}

fn source(s: &Source, policy_ns: &str, caller: &Workload, trust_domain: &str) -> Match {
    // Per identity: whether the fields that depend only on who calls hold.
    let holds = |id: Option<(&str, &str)>| {
        let field = |values: &[String], not_values: &[String], test: &dyn Fn(&str) -> bool| {
            (values.is_empty() || values.iter().any(|v| test(v))) && !not_values.iter().any(|v| test(v))
        };
        let principal = id.map(|(ns, sa)| format!("{trust_domain}/ns/{ns}/sa/{sa}"));
        field(&s.principals, &s.not_principals, &|v| principal.as_deref().is_some_and(|p| glob(v, p)))
            && field(&s.namespaces, &s.not_namespaces, &|v| id.is_some_and(|(ns, _)| glob(v, ns)))
            && field(&s.service_accounts, &s.not_service_accounts, &|v| {
                let (ns, sa) = v.split_once('/').unwrap_or((policy_ns, v));
                id.is_some_and(|id| id == (ns, sa))
            })
    };
    let ids: Vec<Option<(&str, &str)>> = if caller.identities.is_empty() { vec![None] } else { caller.identities.iter().map(|&id| Some(id)).collect() };
    let n = ids.iter().filter(|&&id| holds(id)).count();
    let by_identity = if n == ids.len() {
        Match::All
    } else if n > 0 {
        Match::Some
    } else {
        Match::No
    };
    let request_dependent = [&s.request_principals, &s.not_request_principals, &s.ip_blocks, &s.not_ip_blocks, &s.remote_ip_blocks, &s.not_remote_ip_blocks]
        .iter()
        .any(|l| !l.is_empty());
    if request_dependent {
        by_identity.min(Match::Some)
    } else {
        by_identity
    }
}

#[cfg(test)]
mod tests;
