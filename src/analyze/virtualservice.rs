//! VirtualService analyzers (Istio's `virtualservice.*`):
//! - IST0101 `host`, `mirror host`, `host:port` and IST0112
//!   (`DestinationHostAnalyzer`): every route and mirror destination names
//!   a service the referring VirtualService can see, and a port it has;
//! - IST0101 `host+subset in destinationrule`, `mirror+subset in
//!   destinationrule` (`DestinationRuleAnalyzer`);
//! - IST0101 `gateway` and IST0132 (`GatewayAnalyzer`);
//! - IST0109 (`ConflictingMeshGatewayHostsAnalyzer`);
//! - IST0140 (`DestinationHostAnalyzer`, the subset half);
//! - IST0149 (`JWTClaimRouteAnalyzer`);
//! - LST0003: several VirtualServices for one host at one gateway.
//!
//! Where Lodestar differs from Istio, on purpose:
//! - the host table is Lodestar's service model: registry Services (and
//!   the services their Instances imply) and ServiceEntries, with their
//!   `exportTo` (Istio reads Kubernetes Services and ServiceEntries);
//! - a subset is looked for in the DestinationRule a proxy in the
//!   VirtualService's namespace uses for the service (its namespace's, the
//!   service's, the root namespace's: Lodestar picks one per host, as
//!   translation does); only for a host no service claims exactly does it
//!   fall back to Istio's rule (a DestinationRule whose host names the
//!   same `namespace/name`);
//! - a gateway's pods are the registered workloads its selector picks, or
//!   the gateway proxy it implies (IST0149);
//! - IST0132 matches a VirtualService's short host names resolved in its
//!   namespace too (`reviews` is served by a Gateway host
//!   `reviews.default.svc.cluster.local`, as translation binds it; Istio's
//!   analyzer compares them as written).

use super::{exported_to_all, quote, slice, Ctx, Item, Message, Workload, IST0101, IST0109, IST0112, IST0132, IST0140, IST0149, LST0003};
use crate::mesh::Service;
use crate::model::istio::common::Destination;
use crate::model::istio::{hosts_overlap, resolve_short_name, DestinationRule, VirtualService};
use crate::model::{Kind, ResourceKey};
use std::collections::{BTreeMap, BTreeSet};

const MESH: &str = "mesh";

pub(super) fn run(ctx: &Ctx, out: &mut Vec<Message>) {
    for vs in &ctx.vs {
        destinations(ctx, vs, out);
        gateways(ctx, vs, out);
        jwt_claim_routes(ctx, vs, out);
    }
    conflicting_mesh_hosts(ctx, out);
    ingress_subsets(ctx, out);
    gateway_duplicates(ctx, out);
}

/// A destination with where it is (`spec.http[0].route[1].destination`).
struct Dest<'a> {
    dest: &'a Destination,
    at: String,
    mirror: bool,
}

fn all_destinations(vs: &VirtualService) -> Vec<Dest<'_>> {
    let mut out = Vec::new();
    for (i, r) in vs.tcp.iter().enumerate() {
        out.extend(r.route.iter().enumerate().map(|(j, d)| Dest { dest: &d.destination, at: format!("spec.tcp[{i}].route[{j}].destination"), mirror: false }));
    }
    for (i, r) in vs.tls.iter().enumerate() {
        out.extend(r.route.iter().enumerate().map(|(j, d)| Dest { dest: &d.destination, at: format!("spec.tls[{i}].route[{j}].destination"), mirror: false }));
    }
    for (i, r) in vs.http.iter().enumerate() {
        out.extend(r.route.iter().enumerate().map(|(j, d)| Dest { dest: &d.destination, at: format!("spec.http[{i}].route[{j}].destination"), mirror: false }));
    }
    for (i, r) in vs.http.iter().enumerate() {
        out.extend(r.mirror.iter().map(|d| Dest { dest: d, at: format!("spec.http[{i}].mirror"), mirror: true }));
        out.extend(r.mirrors.iter().enumerate().map(|(j, m)| Dest {
            dest: &m.destination,
            at: format!("spec.http[{i}].mirrors[{j}].destination"),
            mirror: true,
        }));
    }
    out
}

fn destinations(ctx: &Ctx, vs: &Item<VirtualService>, out: &mut Vec<Message>) {
    for d in all_destinations(vs.spec) {
        let host = &d.dest.host;
        let field = Some(format!("{}.host", d.at));
        match ctx.find_host(vs.ns(), &vs.spec.export_to, host) {
            None => {
                let reftype = if d.mirror { "mirror host" } else { "host" };
                out.push(Message::new(IST0101, vs.key(), field.clone(), format!("Referenced {reftype} not found: {}", quote(host))));
            }
            Some(svc) => match d.dest.port.as_ref().map(|p| p.number).filter(|n| *n != 0) {
                None if svc.ports.len() > 1 => {
                    let ports = slice(svc.ports.iter().map(|p| p.number));
                    let text = format!(
                        "This VirtualService routes to a service {} that exposes multiple ports {ports}. Specifying a port in the destination is required to disambiguate.",
                        quote(host)
                    );
                    out.push(Message::new(IST0112, vs.key(), field.clone(), text));
                }
                Some(n) if !svc.ports.iter().any(|p| p.number == n) => {
                    out.push(Message::new(IST0101, vs.key(), field.clone(), format!("Referenced host:port not found: {}", quote(&format!("{host}:{n}")))));
                }
                _ => {}
            },
        }
        if let Some(subset) = d.dest.subset.as_deref().filter(|s| !s.is_empty()) {
            if !subset_defined(ctx, vs.ns(), host, subset) {
                let reftype = if d.mirror { "mirror+subset in destinationrule" } else { "host+subset in destinationrule" };
                let field = Some(format!("{}.subset", d.at));
                out.push(Message::new(IST0101, vs.key(), field, format!("Referenced {reftype} not found: {}", quote(&format!("{host}+{subset}")))));
            }
        }
    }
}

/// Whether `subset` of `host` (as a VirtualService in `ns` names it) is
/// defined where Lodestar looks for it (see the module doc).
fn subset_defined(ctx: &Ctx, ns: &str, host: &str, subset: &str) -> bool {
    let fqdn = resolve_short_name(host, ns, ctx.suffix());
    let has = |dr: &DestinationRule| dr.subsets.iter().any(|s| s.name == subset);
    match crate::mesh::resolve(ctx.mesh.claims(&fqdn), ns, |_| true) {
        Some(svc) => destination_rule_for(ctx, ns, svc).is_some_and(|dr| has(dr.spec)),
        None => {
            let want = namespaced_name(ctx, ns, host);
            ctx.dr.iter().any(|dr| namespaced_name(ctx, dr.ns(), &dr.spec.host) == want && has(dr.spec))
        }
    }
}

/// Istio's `GetResourceNameFromHost`: `name.ns.svc.DOMAIN` is (ns, name);
/// anything else a name in the referring resource's namespace.
fn namespaced_name(ctx: &Ctx, ns: &str, host: &str) -> (String, String) {
    let svc = format!(".svc.{}", ctx.suffix());
    if let Some((name, host_ns)) = host.strip_suffix(svc.as_str()).and_then(|r| r.split_once('.')).filter(|(_, n)| !n.contains('.')) {
        return (host_ns.to_string(), name.to_string());
    }
    (ns.to_string(), host.to_string())
}

/// The DestinationRule a proxy in `proxy_ns` uses for `svc`, as translation
/// picks it (`translate::destination_rule_for`): exported to the proxy's
/// namespace; in its namespace, else the service's, else the root
/// namespace; an exact host before a wildcard; the oldest first.
pub(super) fn destination_rule_for<'c, 'a>(ctx: &'c Ctx<'a>, proxy_ns: &str, svc: &Service) -> Option<&'c Item<'a, DestinationRule>> {
    let mut candidates: Vec<(&Item<DestinationRule>, &str)> =
        ctx.destination_rules_for_host(&svc.hostname).into_iter().filter(|(dr, _)| crate::mesh::exported_to(&dr.spec.export_to, dr.ns(), proxy_ns)).collect();
    candidates.sort_by(|(a, _), (b, _)| (a.obj.create_revision, a.key()).cmp(&(b.obj.create_revision, b.key())));
    for ns in [proxy_ns, svc.namespace.as_str(), ctx.root_ns()] {
        let in_ns: Vec<&(&Item<DestinationRule>, &str)> = candidates.iter().filter(|(dr, _)| dr.ns() == ns).collect();
        let exact = in_ns.iter().find(|(_, host)| *host == svc.hostname);
        if let Some((dr, _)) = exact.or(in_ns.first()) {
            return Some(*dr);
        }
    }
    None
}

/// A `gateways[]` entry as `namespace/name` (a bare name is in the
/// VirtualService's namespace).
pub(super) fn gateway_ref(vs_ns: &str, entry: &str) -> (String, String) {
    match entry.split_once('/') {
        Some((ns, name)) => (ns.to_string(), name.to_string()),
        None => (vs_ns.to_string(), entry.to_string()),
    }
}

fn gateways(ctx: &Ctx, vs: &Item<VirtualService>, out: &mut Vec<Message>) {
    for (i, entry) in vs.spec.gateways.iter().enumerate().filter(|(_, g)| *g != MESH) {
        let (ns, name) = gateway_ref(vs.ns(), entry);
        let field = Some(format!("spec.gateways[{i}]"));
        let gw = ctx.gateway(&ns, &name);
        if gw.is_none() {
            out.push(Message::new(IST0101, vs.key(), field.clone(), format!("Referenced gateway not found: {}", quote(entry))));
        }
        let gateway_hosts: Vec<String> = gw.map(|g| server_hosts(g)).unwrap_or_default();
        // Hosts of other namespaces are not this VirtualService's to bind.
        let found = gateway_hosts
            .iter()
            .filter_map(|h| match h.split_once('/') {
                None => Some(h.as_str()),
                Some((n, host)) if n == "*" || n == vs.ns() => Some(host),
                Some(_) => None,
            })
            .any(|g| vs.spec.hosts.iter().any(|h| hosts_overlap(g, h) || hosts_overlap(g, &resolve_short_name(h, vs.ns(), ctx.suffix()))));
        if !found {
            let text = format!("one or more host {} defined in VirtualService {} not found in Gateway {ns}/{name}.", slice(&vs.spec.hosts), vs.full_name());
            out.push(Message::new(IST0132, vs.key(), field, text).naming([&ResourceKey::new(Kind::Gateway, ns.as_str(), name.as_str())]));
        }
    }
}

/// Istio's `sanitizeServerHostNamespace`: `./h` is `GW_NS/h`, `*/h` is
/// `h`, and `*/*` makes the server's hosts just `*`.
fn server_hosts(gw: &Item<crate::model::istio::Gateway>) -> Vec<String> {
    let mut out = Vec::new();
    for server in &gw.spec.servers {
        let mut hosts = Vec::new();
        for h in &server.hosts {
            match h.split_once('/') {
                Some((".", host)) => hosts.push(format!("{}/{host}", gw.ns())),
                Some(("*", "*")) => {
                    hosts = vec!["*".to_string()];
                    break;
                }
                Some(("*", host)) => hosts.push(host.to_string()),
                _ => hosts.push(h.clone()),
            }
        }
        out.extend(hosts);
    }
    out
}

/// The key of a claim-based route: `@request.auth.claims` (any case) then
/// `.a[.b...]` or `[a][b]...` (Istio's `jwt.ToRoutingClaim`).
fn is_routing_claim(key: &str) -> bool {
    const PREFIX: &str = "@request.auth.claims";
    let Some(head) = key.get(..PREFIX.len()) else { return false };
    if !head.eq_ignore_ascii_case(PREFIX) {
        return false;
    }
    let rest = &key[PREFIX.len()..];
    if let Some(dotted) = rest.strip_prefix('.') {
        return dotted.split('.').all(|s| !s.is_empty());
    }
    let mut rest = rest;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let Some(inner) = rest.strip_prefix('[') else { return false };
        let Some((name, after)) = inner.split_once(']') else { return false };
        if name.is_empty() {
            return false;
        }
        rest = after;
    }
    true
}

fn jwt_claim_routes(ctx: &Ctx, vs: &Item<VirtualService>, out: &mut Vec<Message>) {
    let key = vs.spec.http.iter().flat_map(|r| &r.matches).flat_map(|m| m.headers.keys().chain(m.without_headers.keys())).find(|k| is_routing_claim(k));
    let Some(key) = key else { return };
    for (i, entry) in vs.spec.gateways.iter().enumerate().filter(|(_, g)| *g != MESH) {
        let (ns, name) = gateway_ref(vs.ns(), entry);
        let Some(gw) = ctx.gateway(&ns, &name) else { continue };
        for pod in ctx.gateway_workloads(gw.spec) {
            if !request_authn_covers(ctx, pod) {
                let text = format!(
                    "The virtual service uses the JWT claim based routing (key: {key}) but found no request authentication for the gateway ({}) pod ({}). \
                     The request authentication must first be applied for the gateway pods to validate the JWT token and make the claims available for routing.",
                    gw.full_name(),
                    pod.name
                );
                out.push(Message::new(IST0149, vs.key(), Some(format!("spec.gateways[{i}]")), text).naming([gw.key()].into_iter().chain(pod.key)));
            }
        }
    }
}

/// Some RequestAuthentication in the root namespace or the workload's own
/// selects it (Lodestar's scope for them, as `translate::jwt`).
fn request_authn_covers(ctx: &Ctx, w: &Workload) -> bool {
    ctx.ra.iter().any(|ra| {
        let labels = ra.spec.selector.as_ref().map(|s| &s.match_labels);
        crate::model::istio::common::policy_applies(ra.ns(), labels, ctx.root_ns(), &w.namespace, &w.labels)
    })
}

/// IST0109: mesh-bound VirtualServices that define one host for one scope.
fn conflicting_mesh_hosts(ctx: &Ctx, out: &mut Vec<Message>) {
    let suffix = ctx.suffix();
    let mut keys: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    let mut exported_all: Vec<(usize, String)> = Vec::new();
    for (i, vs) in ctx.vs.iter().enumerate() {
        let g = &vs.spec.gateways;
        if !(g.is_empty() || g.iter().any(|g| g == MESH)) {
            continue;
        }
        let scopes: BTreeSet<String> = if exported_to_all(&vs.spec.export_to) {
            BTreeSet::from(["*".to_string()])
        } else {
            vs.spec.export_to.iter().map(|e| if e == "." { vs.ns().to_string() } else { e.clone() }).collect()
        };
        for h in &vs.spec.hosts {
            let host = resolve_short_name(h, vs.ns(), suffix);
            for scope in &scopes {
                keys.entry((scope.clone(), host.clone())).or_default().push(i);
            }
            if scopes.contains("*") {
                exported_all.push((i, host));
            }
        }
    }
    for ((scope, host), members) in keys.iter_mut() {
        if scope != "*" {
            for (i, h) in &exported_all {
                if hosts_overlap(h, host) && !members.contains(i) {
                    members.push(*i);
                }
            }
        }
        members.sort();
        members.dedup();
    }
    let mut reported = BTreeSet::new();
    for ((scope, host), members) in &keys {
        if members.len() < 2 {
            continue;
        }
        let mut names: Vec<String> = members.iter().map(|i| ctx.vs[*i].full_name()).collect();
        names.sort();
        let names = names.join(",");
        for i in members {
            if reported.insert(*i) {
                let text = format!(
                    "The VirtualServices {names} associated with mesh gateway define the same host {scope}/{host} which can lead to undefined behavior. \
                     This can be fixed by merging the conflicting VirtualServices into a single resource."
                );
                out.push(Message::new(IST0109, ctx.vs[*i].key(), Some("metadata.name".into()), text).naming(members.iter().map(|m| ctx.vs[*m].key())));
            }
        }
    }
}

/// IST0140: a gateway-bound route to a host without a subset, where some
/// VirtualService of that host routes it by subsets (which the gateway's
/// requests then bypass).
fn ingress_subsets(ctx: &Ctx, out: &mut Vec<Message>) {
    let mut by_subsets: Vec<(&Item<VirtualService>, &str)> = Vec::new();
    for vs in &ctx.vs {
        for d in vs.spec.http.iter().flat_map(|r| &r.route).map(|r| &r.destination) {
            if d.subset.as_deref().is_some_and(|s| !s.is_empty()) && vs.spec.hosts.contains(&d.host) {
                by_subsets.push((vs, d.host.as_str()));
            }
        }
    }
    for vs in ctx.vs.iter().filter(|v| !v.spec.gateways.is_empty()) {
        for (i, r) in vs.spec.http.iter().enumerate() {
            for (j, d) in r.route.iter().enumerate().filter(|(_, d)| d.destination.subset.as_deref().is_none_or(str::is_empty)) {
                for (subset_vs, _) in by_subsets.iter().filter(|(_, h)| *h == d.destination.host) {
                    let text = format!("Subset in virtual service {} has no effect on ingress gateway {} requests", subset_vs.full_name(), vs.full_name());
                    let field = Some(format!("spec.http[{i}].route[{j}].destination.host"));
                    out.push(Message::new(IST0140, vs.key(), field, text).naming([subset_vs.key()]));
                }
            }
        }
    }
}

/// LST0003: at a gateway, translation uses the oldest VirtualService that
/// names a host (`translate::gateway`); any other naming it is ignored
/// there for that host (Istio's mesh-bound conflicts are IST0109).
fn gateway_duplicates(ctx: &Ctx, out: &mut Vec<Message>) {
    let suffix = ctx.suffix();
    let mut groups: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (i, vs) in ctx.vs.iter().enumerate() {
        for entry in vs.spec.gateways.iter().filter(|g| *g != MESH) {
            let (ns, name) = gateway_ref(vs.ns(), entry);
            if ctx.gateway(&ns, &name).is_none() {
                continue;
            }
            for h in &vs.spec.hosts {
                let members = groups.entry((format!("{ns}/{name}"), resolve_short_name(h, vs.ns(), suffix))).or_default();
                if !members.contains(&i) {
                    members.push(i);
                }
            }
        }
    }
    for ((gateway, host), mut members) in groups {
        if members.len() < 2 {
            continue;
        }
        members.sort_by(|a, b| (ctx.vs[*a].obj.create_revision, ctx.vs[*a].key()).cmp(&(ctx.vs[*b].obj.create_revision, ctx.vs[*b].key())));
        let oldest = ctx.vs[members[0]].full_name();
        let mut names: Vec<String> = members.iter().map(|i| ctx.vs[*i].full_name()).collect();
        names.sort();
        let names = slice(&names);
        for i in &members {
            let text = format!(
                "The VirtualServices {names} bound to gateway {gateway} define the same host {host}; the gateway uses only the oldest ({oldest}) for it."
            );
            out.push(Message::new(LST0003, ctx.vs[*i].key(), Some("spec.hosts".into()), text).naming(members.iter().map(|m| ctx.vs[*m].key())));
        }
    }
}
