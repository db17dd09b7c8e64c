//! The analysis of one write, for the warnings of the apply answer: cheap
//! enough for the write path, because it looks only where the write can
//! change a finding.
//!
//! - The analyzers run are those the written kinds concern (a
//!   VirtualService write runs the VirtualService analyzers, a
//!   DestinationRule write those and the DestinationRule ones...).
//! - They run on a part of the store: the written objects, and the objects
//!   that share a host with them (VirtualServices naming it, its
//!   DestinationRules, ServiceEntries and registry Services and Instances),
//!   the workloads and policies of their namespaces, every Gateway, every
//!   RequestAuthentication, the Secrets the Gateways name, and (for an
//!   EnvoyFilter write) every EnvoyFilter. The few
//!   lookups across every namespace (a workload anywhere with a subset's
//!   labels, a namespace by name) look in the whole store.
//! - Both before and after the write: the answer is every finding about a
//!   written object after it, and every finding about another object that
//!   the write makes appear (a VirtualService whose subset a deleted
//!   DestinationRule defined).
//!
//! Left out, because the apply answer already says them: validation
//! warnings (IST0133; IST0106 cannot happen, the write was validated) and
//! an AuthorizationPolicy's IST0127 (`api::policy_warnings`).

use super::{run, Ctx, Family, Message, Options, IST0106, IST0127, IST0133};
use crate::model::istio::{hosts_overlap, resolve_short_name, Validated};
use crate::model::{Kind, ResourceKey, StoredObject, TypedSpec};
use crate::state::{Objects, State};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Findings a write causes: `writes` are the objects it puts (`Some`,
/// the object as it will be stored) and deletes (`None`), on `before`.
pub fn on_write(before: &State, writes: &[(ResourceKey, Option<Arc<StoredObject>>)], options: &Options) -> Vec<Message> {
    let suffix = options.mesh.domain_suffix.as_str();
    let mut after = before.clone();
    for (key, obj) in writes {
        match obj {
            Some(o) => {
                after.objects.insert(o.clone());
            }
            None => {
                after.objects.remove(key);
            }
        }
    }
    let mut scope = Scope { written: writes.iter().map(|(k, _)| k.clone()).collect(), ..Default::default() };
    let mut families: Vec<Family> = Vec::new();
    for (key, now) in writes {
        scope.namespaces.insert(key.namespace.to_string());
        for obj in [before.get(key), now.as_ref()].into_iter().flatten() {
            scope.hosts.extend(hosts_of(obj, suffix));
            if key.kind == Kind::WorkloadEntry {
                scope.hosts.extend(entries_selecting(before, obj, suffix));
            }
        }
        match key.kind {
            Kind::Gateway => scope.gateways.push(format!("{}/{}", key.namespace, key.name)),
            Kind::RequestAuthentication => scope.claim_routes = true,
            Kind::EnvoyFilter => scope.envoy_filters = true,
            _ => {}
        }
        for f in families_for(key.kind) {
            if !families.contains(f) {
                families.push(*f);
            }
        }
    }
    if families.is_empty() {
        return Vec::new();
    }
    // A namespace's every workload matters only to the analyzers that
    // look at workloads by namespace (not to a route's or a rule's).
    scope.namespace_workloads = families.iter().any(|f| matches!(f, Family::Sidecar | Family::Authz | Family::Gateway));
    let (part_before, part_after) = (scope.part(before, options), scope.part(&after, options));
    let findings = |part: &State, whole: &State| {
        let mut ctx = Ctx::new(part, options);
        ctx.universe = Some(whole);
        run(&ctx, &families)
    };
    let was = findings(&part_before, before);
    let now = findings(&part_after, &after);
    let puts: BTreeSet<&ResourceKey> = writes.iter().filter(|(_, o)| o.is_some()).map(|(k, _)| k).collect();
    now.into_iter()
        .filter(|m| m.code != IST0133.code && m.code != IST0106.code)
        .filter(|m| {
            let key = m.resource.as_ref().and_then(|r| r.key());
            match &key {
                Some(k) if puts.contains(k) => !(k.kind == Kind::AuthorizationPolicy && m.code == IST0127.code),
                _ => !was.contains(m),
            }
        })
        .collect()
}

/// The analyzers a write of `kind` concerns.
fn families_for(kind: Kind) -> &'static [Family] {
    use Family::*;
    match kind {
        Kind::VirtualService => &[Schema, VirtualService],
        Kind::DestinationRule => &[Schema, DestinationRule, VirtualService],
        Kind::ServiceEntry => &[Schema, ServiceEntry, VirtualService, DestinationRule],
        Kind::Service | Kind::Instance | Kind::WorkloadEntry => &[Schema, VirtualService, DestinationRule, Sidecar, Authz, Gateway],
        Kind::Gateway => &[Schema, Gateway, VirtualService, Authz],
        Kind::Sidecar => &[Schema, Sidecar],
        Kind::AuthorizationPolicy => &[Schema, Authz],
        Kind::RequestAuthentication => &[Schema, VirtualService],
        Kind::Secret => &[Gateway],
        // IST0155 compares a filter's patches with every other filter's.
        Kind::EnvoyFilter => &[Schema, EnvoyFilter],
        Kind::PeerAuthentication | Kind::WorkloadGroup | Kind::Lease | Kind::Telemetry => &[Schema],
        // Its providers are what CUSTOM policies name.
        Kind::MeshConfig => &[Schema, Authz],
        Kind::Policy | Kind::Role | Kind::Token | Kind::CertificateRevocation => &[],
        Kind::GatewayClass | Kind::KubeGateway | Kind::HttpRoute | Kind::ReferenceGrant | Kind::Namespace => &[],
        Kind::GrpcRoute | Kind::TcpRoute | Kind::TlsRoute | Kind::BackendTlsPolicy | Kind::ListenerSet => &[],
    }
}

/// The hostnames an object names, as FQDNs: a VirtualService's hosts and
/// destinations, a DestinationRule's host, a ServiceEntry's hosts, a
/// registry Service's hostname, an Instance's service.
fn hosts_of(obj: &StoredObject, suffix: &str) -> Vec<String> {
    let ns = obj.key.namespace.as_str();
    let fqdn = |h: &str| resolve_short_name(h, ns, suffix);
    let Ok(typed) = obj.typed() else { return Vec::new() };
    match &**typed {
        TypedSpec::Istio(Validated::VirtualService { spec, .. }) => {
            let routes =
                spec.http.iter().flat_map(|r| r.route.iter().map(|d| &d.destination).chain(r.mirror.iter()).chain(r.mirrors.iter().map(|m| &m.destination)));
            let l4 = spec.tcp.iter().flat_map(|r| &r.route).chain(spec.tls.iter().flat_map(|r| &r.route)).map(|d| &d.destination);
            spec.hosts.iter().map(|h| fqdn(h)).chain(routes.chain(l4).map(|d| fqdn(&d.host))).collect()
        }
        TypedSpec::Istio(Validated::DestinationRule { spec, .. }) => vec![fqdn(&spec.host)],
        TypedSpec::Istio(Validated::ServiceEntry { spec, .. }) => spec.hosts.iter().map(|h| fqdn(h)).collect(),
        TypedSpec::Service(s) => vec![s.hostname.clone().unwrap_or_else(|| format!("{}.{ns}.svc.{suffix}", obj.key.name))],
        TypedSpec::Instance(i) => vec![crate::translate::mesh::instance_hostname(i, ns, suffix)],
        _ => Vec::new(),
    }
}

/// The hosts of the ServiceEntries whose workloadSelector picks a
/// WorkloadEntry.
fn entries_selecting(state: &State, we: &StoredObject, suffix: &str) -> Vec<String> {
    let Ok(TypedSpec::Istio(Validated::WorkloadEntry { spec, .. })) = we.typed().map(|t| &**t) else { return Vec::new() };
    let labels = if spec.labels.is_empty() { we.labels().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() } else { spec.labels.clone() };
    let ns = we.key.namespace.as_str();
    let lo = ResourceKey::new(Kind::ServiceEntry, ns, "");
    let mut out = Vec::new();
    for (_, o) in state.objects.range(lo..).take_while(|(k, _)| k.kind == Kind::ServiceEntry && k.namespace == ns) {
        if let Ok(TypedSpec::Istio(Validated::ServiceEntry { spec: se, .. })) = o.typed().map(|t| &**t) {
            if se.workload_selector.as_ref().is_some_and(|s| super::selects(&s.labels, &labels)) {
                out.extend(se.hosts.iter().map(|h| resolve_short_name(h, ns, suffix)));
            }
        }
    }
    out
}

/// What a write concerns.
#[derive(Default)]
struct Scope {
    written: BTreeSet<ResourceKey>,
    /// The hostnames (FQDNs) the written objects name, before and after.
    hosts: BTreeSet<String>,
    namespaces: BTreeSet<String>,
    /// Written Gateways, `namespace/name`.
    gateways: Vec<String>,
    /// A RequestAuthentication is written: VirtualServices with claim
    /// routes matter.
    claim_routes: bool,
    /// Every Instance of the scope's namespaces matters, not only those
    /// of its hosts.
    namespace_workloads: bool,
    /// An EnvoyFilter is written: every EnvoyFilter matters (IST0155).
    envoy_filters: bool,
}

/// A scope's hostnames, to test names as objects write them without
/// building their FQDNs (the write path reads every object of some kinds).
struct Hosts<'s> {
    exact: &'s BTreeSet<String>,
    /// `name.NS.svc.DOMAIN` hosts as NS → names.
    short: std::collections::BTreeMap<&'s str, BTreeSet<&'s str>>,
    wildcards: bool,
    suffix: &'s str,
}

impl<'s> Hosts<'s> {
    fn new(hosts: &'s BTreeSet<String>, suffix: &'s str) -> Hosts<'s> {
        let tail = format!(".svc.{suffix}");
        let mut short: std::collections::BTreeMap<&str, BTreeSet<&str>> = Default::default();
        for h in hosts {
            if let Some((name, ns)) = h.strip_suffix(tail.as_str()).and_then(|r| r.split_once('.')).filter(|(_, ns)| !ns.contains('.')) {
                short.entry(ns).or_default().insert(name);
            }
        }
        Hosts { exact: hosts, short, wildcards: hosts.iter().any(|h| h.contains('*')), suffix }
    }

    /// `raw`, as an object in `ns` writes it, is (or overlaps) one of them.
    fn names(&self, raw: &str, ns: &str) -> bool {
        if !raw.contains('.') && raw != "*" {
            return self.short.get(ns).is_some_and(|names| names.contains(raw)) || (self.wildcards && self.overlaps(raw, ns));
        }
        if !self.wildcards && !raw.contains('*') {
            return self.exact.contains(raw);
        }
        self.exact.iter().any(|h| hosts_overlap(h, raw))
    }

    fn overlaps(&self, raw: &str, ns: &str) -> bool {
        let fqdn = resolve_short_name(raw, ns, self.suffix);
        self.exact.iter().any(|h| hosts_overlap(h, &fqdn))
    }
}

impl Scope {
    /// The part of `state` the write concerns (see the module doc): the
    /// objects of the kinds that matter, read by kind (and, where a host
    /// or namespace decides, by namespace).
    fn part(&self, state: &State, options: &Options) -> State {
        let (suffix, root) = (options.mesh.domain_suffix.as_str(), options.mesh.root_namespace.as_str());
        let hosts = Hosts::new(&self.hosts, suffix);
        let mut objects = Objects::default();
        for key in &self.written {
            if let Some(o) = state.get(key) {
                objects.insert(o.clone());
            }
        }
        let of_kind = |kind: Kind| {
            let lo = ResourceKey::new(kind, "", "");
            state.objects.range(lo..).take_while(move |(k, _)| k.kind == kind).map(|(_, o)| o)
        };
        let in_ns = |kind: Kind, ns: &str| {
            let lo = ResourceKey::new(kind, ns, "");
            let ns = ns.to_string();
            state.objects.range(lo..).take_while(move |(k, _)| k.kind == kind && k.namespace == ns.as_str()).map(|(_, o)| o)
        };
        for o in of_kind(Kind::VirtualService) {
            if self.names_any(&hosts, o) || self.binds_written_gateway(o) || (self.claim_routes && has_claim_route(o)) {
                objects.insert(o.clone());
            }
        }
        if self.envoy_filters {
            for o in of_kind(Kind::EnvoyFilter) {
                objects.insert(o.clone());
            }
        }
        for kind in [Kind::DestinationRule, Kind::ServiceEntry, Kind::Service] {
            for o in of_kind(kind).filter(|o| self.names_any(&hosts, o)) {
                objects.insert(o.clone());
            }
        }
        // Instances: those of the scope's namespaces, and those that claim
        // one of its hosts (only a host's own namespace can claim a
        // NAME.NS.svc host; any namespace another).
        let mut namespaces: BTreeSet<String> = self.namespaces.clone();
        let anywhere = self.hosts.iter().any(|h| match crate::translate::mesh::hosts::owner(h, suffix) {
            crate::translate::mesh::hosts::Owner::Namespace(ns) => {
                namespaces.insert(ns);
                false
            }
            _ => true,
        });
        let instances: Box<dyn Iterator<Item = &Arc<StoredObject>>> =
            if anywhere { Box::new(of_kind(Kind::Instance)) } else { Box::new(namespaces.iter().flat_map(|ns| in_ns(Kind::Instance, ns))) };
        for o in instances.filter(|o| (self.namespace_workloads && self.namespaces.contains(o.key.namespace.as_str())) || self.names_any(&hosts, o)) {
            objects.insert(o.clone());
        }
        // Workload entries and sidecars of the scope's namespaces, and the
        // entries ServiceEntries in the part may select.
        let mut we_namespaces = self.namespaces.clone();
        we_namespaces.extend(objects.keys().filter(|k| k.kind == Kind::ServiceEntry).map(|k| k.namespace.to_string()));
        for ns in &we_namespaces {
            for o in in_ns(Kind::WorkloadEntry, ns) {
                objects.insert(o.clone());
            }
        }
        for ns in self.namespaces.iter().map(String::as_str).chain([root]) {
            for o in in_ns(Kind::Sidecar, ns).chain(in_ns(Kind::AuthorizationPolicy, ns)) {
                objects.insert(o.clone());
            }
        }
        let mut credentials: BTreeSet<String> = BTreeSet::new();
        for o in of_kind(Kind::Gateway).chain(of_kind(Kind::RequestAuthentication)) {
            if let Ok(TypedSpec::Istio(Validated::Gateway { spec, .. })) = o.typed().map(|t| &**t) {
                for tls in spec.servers.iter().filter_map(|s| s.tls.as_ref()) {
                    credentials.extend(tls.credential_name.iter().chain(&tls.credential_names).map(|c| c.rsplit('/').next().unwrap_or(c).to_string()));
                }
            }
            objects.insert(o.clone());
        }
        for o in of_kind(Kind::Secret).filter(|o| credentials.contains(o.key.name.as_str())) {
            objects.insert(o.clone());
        }
        State { revision: state.revision, objects }
    }

    /// The object names one of the scope's hosts (as [`hosts_of`] reads it).
    fn names_any(&self, hosts: &Hosts, obj: &StoredObject) -> bool {
        let ns = obj.key.namespace.as_str();
        let Ok(typed) = obj.typed() else { return false };
        match &**typed {
            TypedSpec::Istio(Validated::VirtualService { spec, .. }) => {
                let routes = spec
                    .http
                    .iter()
                    .flat_map(|r| r.route.iter().map(|d| &d.destination).chain(r.mirror.iter()).chain(r.mirrors.iter().map(|m| &m.destination)));
                let l4 = spec.tcp.iter().flat_map(|r| &r.route).chain(spec.tls.iter().flat_map(|r| &r.route)).map(|d| &d.destination);
                spec.hosts.iter().any(|h| hosts.names(h, ns)) || routes.chain(l4).any(|d| hosts.names(&d.host, ns))
            }
            TypedSpec::Istio(Validated::DestinationRule { spec, .. }) => hosts.names(&spec.host, ns),
            TypedSpec::Istio(Validated::ServiceEntry { spec, .. }) => spec.hosts.iter().any(|h| hosts.names(h, ns)),
            TypedSpec::Service(s) => hosts.names(s.hostname.as_deref().unwrap_or(&obj.key.name), ns),
            TypedSpec::Instance(i) => hosts.names(&i.service, ns),
            _ => false,
        }
    }

    fn binds_written_gateway(&self, vs: &StoredObject) -> bool {
        if self.gateways.is_empty() {
            return false;
        }
        let Ok(TypedSpec::Istio(Validated::VirtualService { spec, .. })) = vs.typed().map(|t| &**t) else { return false };
        spec.gateways.iter().any(|g| {
            let (ns, name) = super::virtualservice::gateway_ref(&vs.key.namespace, g);
            self.gateways.contains(&format!("{ns}/{name}"))
        })
    }
}

fn has_claim_route(vs: &StoredObject) -> bool {
    let Ok(TypedSpec::Istio(Validated::VirtualService { spec, .. })) = vs.typed().map(|t| &**t) else { return false };
    spec.http
        .iter()
        .flat_map(|r| &r.matches)
        .flat_map(|m| m.headers.keys().chain(m.without_headers.keys()))
        .any(|k| k.to_ascii_lowercase().starts_with("@request.auth.claims"))
}
