//! The service model, after Pilot's: services (hostname, ports, protocols,
//! mesh-internal or external) and their instances, plus the traffic rules
//! indexed for translation. Built from one applied store snapshot, so
//! everything in a [`Mesh`] is at one revision.
//!
//! Sources, like Pilot's aggregate registry:
//! - registry `Service` / `Instance` kinds (Lodestar is the platform registry);
//! - `ServiceEntry` (hosts × ports), with `endpoints` or a `workloadSelector`
//!   over `WorkloadEntry`s in its namespace.
//!
//! Services are keyed by hostname and namespace: each namespace has at
//! most one service per hostname, and a hostname claimed by several
//! namespaces (ServiceEntries for one external host, say) is resolved per
//! proxy by [`resolve`], as Istio does. What a namespace may claim at
//! all is `hosts`' rule (another namespace's `*.NS.svc.DOMAIN` never).
//!
//! Pure: no IO. Objects whose stored spec no longer parses, and claims of
//! hostnames another namespace owns, are skipped and listed in
//! `Mesh::skipped`.

pub mod hosts;

use crate::model::istio::common::Protocol;
use crate::model::istio::service_entry::{Location, Resolution as SeResolution};
use crate::model::istio::{
    self, AuthorizationPolicy, DestinationRule, Gateway, PeerAuthentication, RequestAuthentication, ServiceEntry, Sidecar, Validated, VirtualService,
    WorkloadEntry,
};
use crate::model::registry::{protocol_from_name, HealthState, InstanceSpec, InstanceStatus, ServiceSpec};
use crate::model::{Kind, ResourceKey, StoredObject, TypedSpec};
use crate::state::State;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Mesh-wide settings that translation needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshConfig {
    /// `cluster.local`: short name `reviews` in `default` is
    /// `reviews.default.svc.cluster.local`.
    pub domain_suffix: String,
    /// Where mesh-wide Sidecar and DestinationRule defaults live.
    pub root_namespace: String,
    /// The SPIFFE trust domain of workload identities
    /// (`spiffe://TRUST_DOMAIN/ns/NS/sa/SA`), the mesh CA's.
    pub trust_domain: String,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig { domain_suffix: "cluster.local".into(), root_namespace: "istio-system".into(), trust_domain: "cluster.local".into() }
    }
}

/// An AuthorizationPolicy with its `istio.io/dry-run` annotation (Istio
/// parses it as a boolean; anything else is not a dry run).
#[derive(Debug, Clone)]
pub struct Authz {
    pub spec: AuthorizationPolicy,
    pub dry_run: bool,
}

/// A config resource with the metadata translation needs.
#[derive(Debug, Clone)]
pub struct Config<T> {
    pub key: ResourceKey,
    pub create_revision: u64,
    pub mod_revision: u64,
    pub labels: BTreeMap<String, String>,
    pub spec: T,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Resolution {
    /// Endpoints are known (EDS).
    Static,
    /// Envoy resolves the endpoint hostnames (STRICT_DNS).
    Dns,
    /// Traffic goes where the client addressed it (needs iptables: not
    /// translated on bare metal, see ARCHITECTURE.md).
    Passthrough,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePort {
    pub name: String,
    pub number: u32,
    pub protocol: Protocol,
    /// Port on the instances when they do not name one.
    pub target_port: Option<u32>,
}

impl ServicePort {
    /// The protocol, when not given, comes from the port name (Istio's
    /// `http-web` convention), else TCP.
    pub fn new(name: &str, number: u32, protocol_name: Option<&str>, target_port: Option<u32>) -> ServicePort {
        ServicePort { name: name.to_string(), number, protocol: protocol(protocol_name.unwrap_or_else(|| protocol_from_name(name))), target_port }
    }

    pub fn is_http(&self) -> bool {
        self.protocol.is_http()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Health {
    Healthy,
    Unhealthy,
    Unknown,
}

/// One endpoint of a service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instance {
    pub address: String,
    /// Port name → port on this instance; `default_port` for the rest.
    pub ports: BTreeMap<String, u32>,
    pub default_port: Option<u32>,
    pub labels: BTreeMap<String, String>,
    /// `region/zone/subzone` (any part may be empty).
    pub locality: String,
    pub weight: u32,
    pub health: Health,
    /// The registry Instance (or WorkloadEntry) it came from, if any.
    pub source: Option<ResourceKey>,
    /// The workload's namespace (its identity's, and where the
    /// PeerAuthentication that governs its inbound lives).
    pub namespace: String,
    /// Its identity's service account, if it has one (a mesh workload with
    /// a certificate): clients then speak mutual TLS to it (auto-mTLS).
    pub service_account: Option<String>,
}

impl Instance {
    /// The port this instance serves `port` on.
    pub fn port_for(&self, port: &ServicePort) -> u32 {
        self.ports.get(&port.name).copied().or(self.default_port).or(port.target_port).unwrap_or(port.number)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub hostname: String,
    pub namespace: String,
    pub ports: Vec<ServicePort>,
    pub addresses: Vec<String>,
    pub mesh_external: bool,
    pub resolution: Resolution,
    pub export_to: Vec<String>,
    pub instances: Vec<Instance>,
    /// The resources this service was built from, with their revisions:
    /// what a cache of its translation depends on.
    pub sources: Vec<(ResourceKey, u64)>,
    /// The create revision of what declared it (its registry Service or
    /// ServiceEntry; an implied service: its oldest Instance): among
    /// namespaces claiming one hostname, the oldest wins (Istio's
    /// creationTimestamp).
    pub created: u64,
    /// Its address from 240.240.0.0/16 when it declares none
    /// (`translate::dns::auto_vips`): served in a captured proxy's DNS and
    /// matched by its outbound listeners.
    pub auto_address: Option<String>,
}

impl Service {
    /// Its virtual IPs: the declared addresses, else (with `auto`: for a
    /// proxy whose agent answers DNS with it) the allocated one.
    pub fn vips(&self, auto: bool) -> impl Iterator<Item = &str> + '_ {
        let auto = self.auto_address.as_deref().filter(|_| auto && self.addresses.is_empty());
        self.addresses.iter().map(String::as_str).chain(auto)
    }

    /// Equal in everything but the instances: a change between two such
    /// services is an endpoint change (EDS only).
    pub fn same_shape(&self, other: &Service) -> bool {
        (&self.hostname, &self.namespace, &self.ports, &self.addresses, self.mesh_external, self.resolution, &self.export_to, self.created, &self.auto_address)
            == (
                &other.hostname,
                &other.namespace,
                &other.ports,
                &other.addresses,
                other.mesh_external,
                other.resolution,
                &other.export_to,
                other.created,
                &other.auto_address,
            )
    }

    /// Declared by a registry `Service` (not implied by its instances).
    fn declared(&self) -> bool {
        self.sources.iter().any(|(k, _)| k.kind != Kind::Instance)
    }

    /// The identities (namespace, service account) of its instances.
    pub fn identities(&self) -> BTreeSet<(&str, &str)> {
        self.instances.iter().filter_map(|i| Some((i.namespace.as_str(), i.service_account.as_deref()?))).collect()
    }

    pub fn port(&self, number: u32) -> Option<&ServicePort> {
        self.ports.iter().find(|p| p.number == number)
    }

    /// Istio's exportTo: empty or `*` is everyone, `.` the own namespace.
    pub fn visible_to(&self, namespace: &str) -> bool {
        exported_to(&self.export_to, &self.namespace, namespace)
    }
}

pub fn exported_to(export_to: &[String], own: &str, namespace: &str) -> bool {
    export_to.is_empty() || export_to.iter().any(|e| e == "*" || e == namespace || (e == "." && own == namespace))
}

/// Host resolution for a proxy in `namespace` (Istio's, in
/// `SidecarScope`): among the services claiming one hostname (`claims`,
/// oldest first) that are exported to `namespace` and that `admit` lets
/// through, its own namespace's; else the oldest (lowest create revision,
/// then namespace name). The one place a hostname becomes a service for a
/// proxy (through `translate::scope::ProxyScope`): any new lookup by name
/// (Gateway API routes, virtual IPs) belongs here too, so that every part
/// of a proxy's config agrees on one service per hostname.
pub fn resolve<'a>(claims: &'a [Arc<Service>], namespace: &str, admit: impl Fn(&Service) -> bool) -> Option<&'a Arc<Service>> {
    let mut candidates = claims.iter().filter(|s| s.visible_to(namespace) && admit(s));
    let first = candidates.next()?;
    if first.namespace == namespace {
        return Some(first);
    }
    Some(candidates.find(|s| s.namespace == namespace).unwrap_or(first))
}

/// Whether two claim lists resolve alike for every proxy: the same
/// namespaces, visibility and order (their other contents may differ).
pub fn same_claimants(a: &[Arc<Service>], b: &[Arc<Service>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (&x.namespace, &x.export_to, x.created) == (&y.namespace, &y.export_to, y.created))
}

/// Everything translation reads, at one revision.
#[derive(Debug, Clone, Default)]
pub struct Mesh {
    pub revision: u64,
    pub config: Arc<MeshConfig>,
    /// By hostname: every namespace's service for it (at most one per
    /// namespace), oldest first; [`resolve`] picks a proxy's. Shared
    /// between revisions that changed no service.
    pub services: Arc<BTreeMap<String, Vec<Arc<Service>>>>,
    /// Oldest first (Istio's precedence among conflicting rules).
    pub virtual_services: Vec<Arc<Config<VirtualService>>>,
    pub destination_rules: Vec<Arc<Config<DestinationRule>>>,
    pub gateways: Vec<Arc<Config<Gateway>>>,
    pub sidecars: Vec<Arc<Config<Sidecar>>>,
    /// security.istio.io PeerAuthentications, oldest first.
    pub peer_authentications: Vec<Arc<Config<PeerAuthentication>>>,
    /// AuthorizationPolicies, oldest first.
    pub authorization_policies: Vec<Arc<Config<Authz>>>,
    /// The stored `MeshConfig` (Istio's defaults when there is none).
    pub mesh_config: Arc<istio::MeshConfig>,
    /// Telemetries, oldest first.
    pub telemetries: Vec<Arc<Config<istio::Telemetry>>>,
    /// Objects left out, with why.
    pub skipped: Vec<(ResourceKey, String)>,
    /// VirtualServices by each exact host they name (resolved to an FQDN),
    /// and those naming a wildcard; each list oldest first.
    /// (Persistent maps: an update shares all untouched entries.)
    pub vs_by_host: imbl::OrdMap<String, Vec<Arc<Config<VirtualService>>>>,
    pub vs_wildcard: Vec<Arc<Config<VirtualService>>>,
    /// DestinationRules by exact host, and wildcard ones; oldest first.
    pub dr_by_host: imbl::OrdMap<String, Vec<Arc<Config<DestinationRule>>>>,
    pub dr_wildcard: Vec<Arc<Config<DestinationRule>>>,
    /// RequestAuthentications, oldest first.
    pub request_authentications: Vec<Arc<Config<RequestAuthentication>>>,
    /// Key sets fetched from `jwksUri`s (the root's `jwks` fetcher): an input of
    /// translation that is not in the store; replaced when they change.
    pub jwks: Arc<FetchedKeys>,
    /// Status of the Gateway API objects (`translate::gateway_api`), by key;
    /// what that translation generated is in `gateways` and
    /// `virtual_services` (never stored).
    pub gateway_api_status: Arc<super::gateway_api::Status>,
    /// That translation's output (its status aside), which a change to
    /// routes only updates (`update_gateway_routes`).
    pub gateway_api: Arc<super::gateway_api::Output>,
    /// EnvoyFilters with their patch values built (`translate::envoyfilter`),
    /// in Istio's global order (priority, then age, then name).
    pub envoy_filters: Vec<Arc<crate::envoyfilter::CompiledFilter>>,
    /// The CA bundles of BackendTLSPolicies (`translate::backend_tls`),
    /// which their generated DestinationRules name.
    pub backend_cas: Arc<crate::backend_tls::BackendCas>,
}

impl Mesh {
    /// The services claiming `hostname`, oldest first.
    pub fn claims(&self, hostname: &str) -> &[Arc<Service>] {
        self.services.get(hostname).map_or(&[], Vec::as_slice)
    }

    /// Every service of every namespace, by hostname then age.
    pub fn all_services(&self) -> impl Iterator<Item = &Arc<Service>> + '_ {
        self.services.values().flatten()
    }

    /// VirtualServices that may name `host` (exact or wildcard), oldest first.
    pub fn virtual_services_for_host(&self, host: &str) -> Vec<&Arc<Config<VirtualService>>> {
        let mut out: Vec<&Arc<Config<VirtualService>>> = self.vs_by_host.get(host).into_iter().flatten().collect();
        let suffix = &self.config.domain_suffix;
        out.extend(
            self.vs_wildcard
                .iter()
                .filter(|vs| vs.spec.hosts.iter().any(|h| istio::host_matches(&istio::resolve_short_name(h, &vs.key.namespace, suffix), host))),
        );
        out.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        out.dedup_by(|a, b| a.key == b.key);
        out
    }

    /// DestinationRules whose host matches `host` (exact or wildcard).
    pub fn destination_rules_for_host(&self, host: &str) -> Vec<&Arc<Config<DestinationRule>>> {
        let suffix = &self.config.domain_suffix;
        let mut out: Vec<&Arc<Config<DestinationRule>>> = self.dr_by_host.get(host).into_iter().flatten().collect();
        out.extend(self.dr_wildcard.iter().filter(|dr| istio::host_matches(&istio::resolve_short_name(&dr.spec.host, &dr.key.namespace, suffix), host)));
        out.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        out
    }

    /// The mesh at `state`'s revision from the mesh at the revision of
    /// `prev_objects`, when the changes in between touch only traffic rules
    /// (VirtualService, DestinationRule, Gateway, Sidecar; ACL objects are
    /// no part of the mesh and are skipped): services are
    /// shared, only the changed rules are re-read. `None` when something
    /// else changed (then `build` it).
    pub fn update_rules(&self, prev_objects: &crate::state::Objects, state: &State) -> Option<Mesh> {
        let mut changed: Vec<(&ResourceKey, Option<&Arc<StoredObject>>)> = Vec::new();
        for d in prev_objects.spec_diff(&state.objects) {
            let (key, now) = (d.key(), d.after());
            // Tokens, policies, roles and Secrets are no part of the mesh,
            // nor are WorkloadGroups (templates the agents read).
            // A Secret a BackendTLSPolicy reads its CA from, or a Gateway
            // API listener its certificate: rebuilt (`build`).
            if key.kind == Kind::Secret && self.gateway_api_reads(key) {
                return None;
            }
            if key.kind.is_acl() || matches!(key.kind, Kind::WorkloadGroup | Kind::Secret) {
                continue;
            }
            // Gateway API objects are translated together (`build`).
            if !matches!(
                key.kind,
                Kind::VirtualService | Kind::DestinationRule | Kind::Gateway | Kind::Sidecar | Kind::AuthorizationPolicy | Kind::RequestAuthentication
            ) || (!self.gateway_api_status.is_empty()
                && matches!(key.kind, Kind::Gateway | Kind::VirtualService | Kind::DestinationRule)
                && self.generated(key))
            {
                return None;
            }
            changed.push((key, now));
        }
        let mut mesh = Mesh {
            revision: state.revision(),
            config: self.config.clone(),
            services: self.services.clone(),
            virtual_services: self.virtual_services.clone(),
            destination_rules: self.destination_rules.clone(),
            gateways: self.gateways.clone(),
            sidecars: self.sidecars.clone(),
            peer_authentications: self.peer_authentications.clone(),
            authorization_policies: self.authorization_policies.clone(),
            mesh_config: self.mesh_config.clone(),
            telemetries: self.telemetries.clone(),
            skipped: self.skipped.clone(),
            vs_by_host: self.vs_by_host.clone(),
            vs_wildcard: self.vs_wildcard.clone(),
            dr_by_host: self.dr_by_host.clone(),
            dr_wildcard: self.dr_wildcard.clone(),
            request_authentications: self.request_authentications.clone(),
            jwks: self.jwks.clone(),
            gateway_api_status: self.gateway_api_status.clone(),
            gateway_api: self.gateway_api.clone(),
            envoy_filters: self.envoy_filters.clone(),
            backend_cas: self.backend_cas.clone(),
        };
        for (key, _) in &changed {
            if let Some(old) = self.virtual_services.iter().find(|c| c.key == **key) {
                mesh.unindex_vs(old);
            }
            if let Some(old) = self.destination_rules.iter().find(|c| c.key == **key) {
                mesh.unindex_dr(old);
            }
        }
        for (key, now) in changed {
            mesh.virtual_services.retain(|c| c.key != *key);
            mesh.destination_rules.retain(|c| c.key != *key);
            mesh.gateways.retain(|c| c.key != *key);
            mesh.sidecars.retain(|c| c.key != *key);
            mesh.authorization_policies.retain(|c| c.key != *key);
            mesh.request_authentications.retain(|c| c.key != *key);
            mesh.skipped.retain(|(k, _)| k != key);
            let Some(obj) = now else { continue };
            match obj.typed().map(|t| t.as_ref()) {
                Ok(TypedSpec::Istio(Validated::VirtualService { spec, .. })) => {
                    let c = to_config(obj, spec.as_ref());
                    mesh.index_vs(&c);
                    mesh.virtual_services.push(c);
                }
                Ok(TypedSpec::Istio(Validated::DestinationRule { spec, .. })) => {
                    let c = to_config(obj, spec.as_ref());
                    mesh.index_dr(&c);
                    mesh.destination_rules.push(c);
                }
                Ok(TypedSpec::Istio(Validated::Gateway { spec, .. })) => mesh.gateways.push(to_config(obj, spec.as_ref())),
                Ok(TypedSpec::Istio(Validated::Sidecar { spec, .. })) => mesh.sidecars.push(to_config(obj, spec.as_ref())),
                Ok(TypedSpec::Istio(Validated::AuthorizationPolicy { spec, .. })) => mesh.authorization_policies.push(authz_config(obj, spec)),
                Ok(TypedSpec::Istio(Validated::RequestAuthentication { spec, .. })) => mesh.request_authentications.push(to_config(obj, spec.as_ref())),
                Ok(_) => {}
                Err(e) => mesh.skipped.push((key.clone(), e.to_string())),
            }
        }
        mesh.virtual_services.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.destination_rules.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.gateways.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.sidecars.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.authorization_policies.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.request_authentications.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        Some(mesh)
    }

    /// The mesh at `state`'s revision when every change since
    /// `prev_objects` is to registry Instances of services that exist in
    /// both and keep their shape (ports, addresses): only those services'
    /// instance lists are rebuilt, everything else is shared. Returns the
    /// hostnames whose endpoints changed. `None`: build it.
    pub fn update_instances(&self, prev_objects: &crate::state::Objects, state: &State) -> Option<(Mesh, BTreeSet<String>)> {
        let suffix = &self.config.domain_suffix;
        let spec_of = |o: &StoredObject| -> Option<InstanceSpec> {
            match o.typed().ok()?.as_ref() {
                TypedSpec::Instance(i) => Some(i.clone()),
                _ => None,
            }
        };
        let mut services: Option<BTreeMap<String, Vec<Arc<Service>>>> = None;
        let mut hosts = BTreeSet::new();
        // An Instance is in its own namespace's service of its hostname.
        fn own<'a>(services: &'a mut BTreeMap<String, Vec<Arc<Service>>>, host: &str, ns: &str) -> Option<&'a mut Service> {
            services.get_mut(host)?.iter_mut().find(|s| s.namespace == ns).map(Arc::make_mut)
        }
        for d in prev_objects.spec_diff(&state.objects) {
            let (key, old, new) = (d.key(), d.before(), d.after());
            if key.kind != Kind::Instance {
                return None;
            }
            let services = services.get_or_insert_with(|| (*self.services).clone());
            if let Some(old) = old {
                let spec = spec_of(old)?;
                let host = instance_hostname(&spec, &key.namespace, suffix);
                let svc = own(services, &host, &key.namespace)?;
                svc.instances.retain(|i| i.source.as_ref() != Some(key));
                svc.sources.retain(|(k, _)| k != key);
                if !svc.declared() && svc.instances.is_empty() {
                    return None; // an implied service goes away
                }
                hosts.insert(host);
            }
            if let Some(new) = new {
                let spec = spec_of(new)?;
                let host = instance_hostname(&spec, &key.namespace, suffix);
                let svc = own(services, &host, &key.namespace)?;
                svc.instances.push(registry_instance(new, &spec));
                svc.instances.sort();
                svc.sources.push((key.clone(), new.mod_revision));
                svc.sources.sort();
                hosts.insert(host);
            }
        }
        let Some(services) = services else {
            return Some((Mesh { revision: state.revision(), ..self.clone() }, hosts));
        };
        // An implied service takes its ports from its first instance (in
        // key order), and its age from its oldest: if that changed them, the
        // shape (or the order of the claims) changed.
        for host in &hosts {
            for svc in services.get(host)?.iter().filter(|s| !s.declared()) {
                let first = svc.instances.iter().filter_map(|i| i.source.as_ref()).min()?;
                let spec = spec_of(state.get(first)?)?;
                let oldest = svc.instances.iter().filter_map(|i| Some(state.get(i.source.as_ref()?)?.create_revision)).min()?;
                if implied_ports(&spec) != svc.ports || oldest != svc.created {
                    return None;
                }
            }
        }
        Some((Mesh { revision: state.revision(), services: Arc::new(services), ..self.clone() }, hosts))
    }

    fn vs_hosts(&self, vs: &Config<VirtualService>) -> Vec<String> {
        vs.spec.hosts.iter().map(|h| istio::resolve_short_name(h, &vs.key.namespace, &self.config.domain_suffix)).collect()
    }

    fn dr_host(&self, dr: &Config<DestinationRule>) -> String {
        istio::resolve_short_name(&dr.spec.host, &dr.key.namespace, &self.config.domain_suffix)
    }

    fn index_vs(&mut self, vs: &Arc<Config<VirtualService>>) {
        let hosts = self.vs_hosts(vs);
        if hosts.iter().any(|h| h.contains('*')) {
            self.vs_wildcard.push(vs.clone());
        }
        for h in hosts.into_iter().filter(|h| !h.contains('*')) {
            let entry = self.vs_by_host.entry(h).or_default();
            entry.push(vs.clone());
            entry.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        }
    }

    fn unindex_vs(&mut self, vs: &Arc<Config<VirtualService>>) {
        self.vs_wildcard.retain(|c| c.key != vs.key);
        for h in self.vs_hosts(vs) {
            if let Some(list) = self.vs_by_host.get_mut(&h) {
                list.retain(|c| c.key != vs.key);
                if list.is_empty() {
                    self.vs_by_host.remove(&h);
                }
            }
        }
    }

    fn index_dr(&mut self, dr: &Arc<Config<DestinationRule>>) {
        let host = self.dr_host(dr);
        if host.contains('*') {
            self.dr_wildcard.push(dr.clone());
        } else {
            let entry = self.dr_by_host.entry(host).or_default();
            entry.push(dr.clone());
            entry.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        }
    }

    fn unindex_dr(&mut self, dr: &Arc<Config<DestinationRule>>) {
        self.dr_wildcard.retain(|c| c.key != dr.key);
        let host = self.dr_host(dr);
        if let Some(list) = self.dr_by_host.get_mut(&host) {
            list.retain(|c| c.key != dr.key);
            if list.is_empty() {
                self.dr_by_host.remove(&host);
            }
        }
    }

    fn index_rules(&mut self) {
        for vs in self.virtual_services.clone() {
            self.index_vs(&vs);
        }
        for dr in self.destination_rules.clone() {
            self.index_dr(&dr);
        }
    }
}

fn labels_of(o: &StoredObject) -> BTreeMap<String, String> {
    o.labels().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn to_config<T: Clone>(o: &StoredObject, spec: &T) -> Arc<Config<T>> {
    Arc::new(Config { key: o.key.clone(), create_revision: o.create_revision, mod_revision: o.mod_revision, labels: labels_of(o), spec: spec.clone() })
}

fn authz_config(o: &StoredObject, spec: &AuthorizationPolicy) -> Arc<Config<Authz>> {
    let dry_run = o.annotation(istio::authorization_policy::DRY_RUN_ANNOTATION).is_some_and(parse_go_bool);
    to_config(o, &Authz { spec: spec.clone(), dry_run })
}

/// Go's `strconv.ParseBool` true values (how Istio reads the annotation).
fn parse_go_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

fn protocol(name: &str) -> Protocol {
    Protocol::parse(name).unwrap_or(Protocol::Tcp)
}

impl Mesh {
    pub fn build(state: &State, config: Arc<MeshConfig>) -> Mesh {
        let mut mesh = Mesh { revision: state.revision(), config: config.clone(), ..Default::default() };
        let mut declared: Vec<(Arc<StoredObject>, ServiceSpec)> = Vec::new();
        let mut instances: Vec<(Arc<StoredObject>, InstanceSpec)> = Vec::new();
        let mut entries: Vec<(Arc<StoredObject>, ServiceEntry)> = Vec::new();
        let mut workloads: Vec<(Arc<StoredObject>, WorkloadEntry)> = Vec::new();
        let mut gateway_api: Vec<(Arc<StoredObject>, crate::model::gateway_api::Spec)> = Vec::new();
        let mut namespaces: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (key, obj) in state.objects.iter() {
            let typed = match obj.typed() {
                Ok(t) => t.clone(),
                Err(e) => {
                    mesh.skipped.push((key.clone(), e.to_string()));
                    continue;
                }
            };
            match &*typed {
                TypedSpec::Istio(Validated::VirtualService { spec, .. }) => mesh.virtual_services.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::DestinationRule { spec, .. }) => mesh.destination_rules.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::Gateway { spec, .. }) => mesh.gateways.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::Sidecar { spec, .. }) => mesh.sidecars.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::PeerAuthentication { spec, .. }) => mesh.peer_authentications.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::AuthorizationPolicy { spec, .. }) => mesh.authorization_policies.push(authz_config(obj, spec)),
                TypedSpec::Istio(Validated::ServiceEntry { spec, .. }) => entries.push((obj.clone(), spec.as_ref().clone())),
                TypedSpec::Istio(Validated::WorkloadEntry { spec, .. }) => workloads.push((obj.clone(), spec.as_ref().clone())),
                TypedSpec::Istio(Validated::RequestAuthentication { spec, .. }) => mesh.request_authentications.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::MeshConfig { spec, .. }) => mesh.mesh_config = Arc::new(spec.as_ref().clone()),
                TypedSpec::Istio(Validated::Telemetry { spec, .. }) => mesh.telemetries.push(to_config(obj, spec.as_ref())),
                TypedSpec::Istio(Validated::EnvoyFilter { spec, .. }) => match crate::envoyfilter::CompiledFilter::new(&to_config(obj, spec.as_ref())) {
                    Ok(f) => mesh.envoy_filters.push(Arc::new(f)),
                    Err(e) => mesh.skipped.push((key.clone(), e)),
                },
                TypedSpec::Service(s) => declared.push((obj.clone(), s.clone())),
                TypedSpec::Instance(i) => instances.push((obj.clone(), i.clone())),
                TypedSpec::GatewayApi(g) => gateway_api.push((obj.clone(), g.clone())),
                TypedSpec::Namespace => {
                    namespaces.insert(key.name.to_string(), labels_of(obj));
                }
                // A WorkloadGroup is read by the agents that register from
                // it; what they register (Instances) is what the mesh sees.
                // Secrets are served by name over SDS, not translated.
                TypedSpec::Lease(_) | TypedSpec::Acl(_) | TypedSpec::Secret | TypedSpec::Istio(Validated::WorkloadGroup { .. }) => {}
            }
        }
        mesh.virtual_services.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.destination_rules.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.gateways.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.sidecars.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.peer_authentications.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.authorization_policies.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.request_authentications.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.telemetries.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.envoy_filters.sort_by_key(|f| f.order_key());

        let suffix = &config.domain_suffix;
        // By (hostname, namespace): one service per namespace and hostname.
        // Registry services first, then ServiceEntries oldest first, so that
        // within a namespace the registry's and then the oldest entry's win.
        let mut services: BTreeMap<(String, String), Service> = BTreeMap::new();
        let mut refuse = |key: &ResourceKey, field: &str, hostname: &str| -> bool {
            let why = hosts::refusal(&key.namespace, hostname, suffix);
            if let Some(why) = &why {
                mesh.skipped.push((key.clone(), format!("{field}: {why}")));
            }
            why.is_some()
        };

        // Registry services, declared.
        for (obj, spec) in &declared {
            let ns = &obj.key.namespace;
            let hostname = spec.hostname.clone().unwrap_or_else(|| format!("{}.{ns}.svc.{suffix}", obj.key.name));
            if refuse(&obj.key, "spec.hostname", &hostname) {
                continue;
            }
            let ports = spec.ports.iter().map(|p| ServicePort::new(&p.name, p.number, p.protocol.as_deref(), p.target_port)).collect();
            let svc = Service {
                hostname: hostname.clone(),
                namespace: ns.to_string(),
                ports,
                addresses: spec.addresses.clone(),
                mesh_external: false,
                resolution: Resolution::Static,
                export_to: spec.export_to.clone(),
                instances: Vec::new(),
                sources: vec![(obj.key.clone(), obj.mod_revision)],
                created: obj.create_revision,
                auto_address: None,
            };
            // Two Services of one namespace naming one hostname: the older.
            match services.entry((hostname, ns.to_string())) {
                std::collections::btree_map::Entry::Occupied(mut e) if (obj.create_revision, &obj.key) < (e.get().created, &e.get().sources[0].0) => {
                    e.insert(svc);
                }
                std::collections::btree_map::Entry::Occupied(_) => {}
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert(svc);
                }
            }
        }
        // Registry instances join their own namespace's service of their
        // hostname; an undeclared service is implied by its instances.
        for (obj, spec) in &instances {
            let ns = &obj.key.namespace;
            let hostname = instance_hostname(spec, ns, suffix);
            if refuse(&obj.key, "spec.service", &hostname) {
                continue;
            }
            let svc = services.entry((hostname.clone(), ns.to_string())).or_insert_with(|| Service {
                hostname: hostname.clone(),
                namespace: ns.to_string(),
                ports: implied_ports(spec),
                addresses: Vec::new(),
                mesh_external: false,
                resolution: Resolution::Static,
                export_to: Vec::new(),
                instances: Vec::new(),
                sources: Vec::new(),
                created: obj.create_revision,
                auto_address: None,
            });
            if !svc.declared() {
                svc.created = svc.created.min(obj.create_revision);
            }
            svc.instances.push(registry_instance(obj, spec));
            svc.sources.push((obj.key.clone(), obj.mod_revision));
        }
        // ServiceEntries: one service per host, oldest entry first.
        entries.sort_by(|(a, _), (b, _)| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        for (obj, se) in &entries {
            let ns = &obj.key.namespace;
            let resolution = match se.resolution() {
                SeResolution::Static => Resolution::Static,
                SeResolution::Dns | SeResolution::DnsRoundRobin => Resolution::Dns,
                _ => Resolution::Passthrough,
            };
            let ports: Vec<ServicePort> = se.ports.iter().map(|p| ServicePort::new(&p.name, p.number, p.protocol_name(), p.target_port)).collect();
            let mut insts: Vec<Instance> = se.endpoints.iter().map(|we| instance_of_workload(we, &BTreeMap::new(), ns)).collect();
            let mut sources = vec![(obj.key.clone(), obj.mod_revision)];
            if let Some(sel) = &se.workload_selector {
                for (wobj, we) in workloads.iter().filter(|(w, _)| w.key.namespace == *ns) {
                    let labels = if we.labels.is_empty() { labels_of(wobj) } else { we.labels.clone() };
                    if sel.labels.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                        insts.push(instance_of_workload(we, &labels, ns));
                        sources.push((wobj.key.clone(), wobj.mod_revision));
                    }
                }
            }
            for (i, host) in se.hosts.iter().enumerate() {
                let hostname = istio::resolve_short_name(host, ns, suffix);
                if refuse(&obj.key, &format!("spec.hosts[{i}]"), &hostname) {
                    continue;
                }
                services.entry((hostname.clone(), ns.to_string())).or_insert_with(|| Service {
                    hostname,
                    namespace: ns.to_string(),
                    ports: ports.clone(),
                    addresses: se.addresses.clone(),
                    mesh_external: se.location != Some(Location::MeshInternal),
                    resolution,
                    export_to: se.export_to.clone(),
                    instances: insts.clone(),
                    sources: sources.clone(),
                    created: obj.create_revision,
                    auto_address: None,
                });
            }
        }
        // Addresses for those that declare none, from every such hostname
        // in the store (one per hostname, whichever namespace claims it).
        let vips = super::dns::auto_vips(services.values().filter(|s| super::dns::wants_auto_vip(s)).map(|s| s.hostname.as_str()));
        let mut by_host: BTreeMap<String, Vec<Arc<Service>>> = BTreeMap::new();
        for ((hostname, _), mut svc) in services {
            if super::dns::wants_auto_vip(&svc) {
                svc.auto_address = vips.get(&hostname).map(ToString::to_string);
            }
            svc.instances.sort();
            svc.sources.sort();
            by_host.entry(hostname).or_default().push(Arc::new(svc));
        }
        for claims in by_host.values_mut() {
            claims.sort_by(|a, b| (a.created, &a.namespace).cmp(&(b.created, &b.namespace)));
        }
        mesh.services = Arc::new(by_host);
        if !gateway_api.is_empty() {
            let mut out = super::gateway_api::translate(&gateway_api, &namespaces, &MeshBackends { services: &mesh.services, suffix, state });
            mesh.gateways.extend(out.gateways.iter().cloned());
            mesh.virtual_services.extend(out.virtual_services.iter().cloned());
            mesh.destination_rules.extend(out.destination_rules.iter().cloned());
            mesh.destination_rules.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
            mesh.backend_cas = Arc::new(out.backend_cas.clone());
            mesh.gateways.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
            mesh.virtual_services.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
            mesh.gateway_api_status = Arc::new(std::mem::take(&mut out.status).into_iter().collect());
            mesh.skipped.extend(out.skipped.iter().cloned());
            mesh.gateway_api = Arc::new(out);
        }
        mesh.index_rules();
        mesh
    }

    /// The mesh at `state`'s revision when every change since
    /// `prev_objects` is to Gateway API routes (HTTPRoute, GRPCRoute,
    /// TCPRoute, TLSRoute) or to objects no part of the mesh: services and
    /// every other rule are shared, and only the VirtualServices generated
    /// for the slots those routes had or have are translated again
    /// (`gateway_api::update_routes`). `None`: build it.
    pub fn update_gateway_routes(&self, prev_objects: &crate::state::Objects, state: &State) -> Option<Mesh> {
        let route = |k: Kind| matches!(k, Kind::HttpRoute | Kind::GrpcRoute | Kind::TcpRoute | Kind::TlsRoute);
        let typed = |o: &Arc<StoredObject>| -> Option<(Arc<StoredObject>, crate::model::gateway_api::Spec)> {
            match o.typed().ok()?.as_ref() {
                TypedSpec::GatewayApi(g) => Some((o.clone(), g.clone())),
                _ => None,
            }
        };
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for d in prev_objects.spec_diff(&state.objects) {
            let key = d.key();
            if key.kind == Kind::Secret && self.gateway_api_reads(key) {
                return None;
            }
            if key.kind.is_acl() || matches!(key.kind, Kind::WorkloadGroup | Kind::Secret) {
                continue;
            }
            if !route(key.kind) {
                return None;
            }
            if let Some(o) = d.before() {
                before.push(typed(o)?);
            }
            if let Some(o) = d.after() {
                after.push(typed(o)?);
            }
        }
        if before.is_empty() && after.is_empty() {
            return None;
        }
        // Every Gateway API object that is not a route; Namespaces' labels.
        let of_kind = |k: Kind| state.objects.range(ResourceKey::new(k, "", "")..).take_while(move |(key, _)| key.kind == k);
        let mut context = Vec::new();
        for k in [Kind::GatewayClass, Kind::KubeGateway, Kind::ReferenceGrant, Kind::BackendTlsPolicy, Kind::ListenerSet] {
            for (_, o) in of_kind(k) {
                context.push(typed(o)?);
            }
        }
        let namespaces: BTreeMap<String, BTreeMap<String, String>> = of_kind(Kind::Namespace).map(|(k, o)| (k.name.to_string(), labels_of(o))).collect();
        let current = |k: &ResourceKey| state.objects.get(k).and_then(typed);
        let backends = MeshBackends { services: &self.services, suffix: &self.config.domain_suffix, state };
        let (out, status) =
            super::gateway_api::update_routes(&self.gateway_api, &self.gateway_api_status, &context, (&before, &after), &current, &namespaces, &backends)?;
        let mut mesh = Mesh { revision: state.revision(), ..self.clone() };
        let generated =
            |v: &Config<VirtualService>| v.labels.contains_key(super::gateway_api::CLASS_LABEL) || v.labels.contains_key(super::gateway_api::MESH_ROUTE_LABEL);
        // The generated VirtualServices that are not the same Arc as before
        // went; those that are new came.
        let kept: BTreeSet<*const Config<VirtualService>> = out.virtual_services.iter().map(Arc::as_ptr).collect();
        let gone: Vec<Arc<Config<VirtualService>>> = self.gateway_api.virtual_services.iter().filter(|v| !kept.contains(&Arc::as_ptr(v))).cloned().collect();
        for v in &gone {
            mesh.unindex_vs(v);
        }
        let gone_ptrs: BTreeSet<*const Config<VirtualService>> = gone.iter().map(Arc::as_ptr).collect();
        mesh.virtual_services.retain(|v| !(generated(v) && gone_ptrs.contains(&Arc::as_ptr(v))));
        let prev_ptrs: BTreeSet<*const Config<VirtualService>> = self.gateway_api.virtual_services.iter().map(Arc::as_ptr).collect();
        for v in out.virtual_services.iter().filter(|v| !prev_ptrs.contains(&Arc::as_ptr(v))) {
            mesh.index_vs(v);
            mesh.virtual_services.push(v.clone());
        }
        mesh.virtual_services.sort_by(|a, b| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
        mesh.gateway_api_status = Arc::new(status);
        mesh.gateway_api = Arc::new(out);
        Some(mesh)
    }

    /// Whether the Gateway API translation read the Secret `key`: a
    /// BackendTLSPolicy's CA bundle, or a listener's certificate (whose
    /// status says whether it is there).
    fn gateway_api_reads(&self, key: &ResourceKey) -> bool {
        let secret = (key.namespace.to_string(), key.name.to_string());
        self.backend_cas.secrets.contains(&secret) || self.gateway_api.certificates.contains(&secret)
    }

    /// Whether `key` names a Gateway or VirtualService the Gateway API
    /// translation generated (a stored one of that key is shadowed).
    fn generated(&self, key: &ResourceKey) -> bool {
        let is = |labels: &BTreeMap<String, String>| {
            labels.contains_key(super::gateway_api::CLASS_LABEL)
                || labels.contains_key(super::gateway_api::MESH_ROUTE_LABEL)
                || labels.contains_key(super::backend_tls::POLICY_LABEL)
        };
        self.gateways.iter().any(|g| g.key == *key && is(&g.labels))
            || self.virtual_services.iter().any(|v| v.key == *key && is(&v.labels))
            || self.destination_rules.iter().any(|d| d.key == *key && is(&d.labels))
    }

    /// A Kind-filtered view, for debugging and tests.
    pub fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::VirtualService => self.virtual_services.len(),
            Kind::DestinationRule => self.destination_rules.len(),
            Kind::Gateway => self.gateways.len(),
            Kind::Sidecar => self.sidecars.len(),
            _ => self.all_services().count(),
        }
    }
}

/// Backends of Gateway API routes, as this mesh has them.
struct MeshBackends<'a> {
    services: &'a BTreeMap<String, Vec<Arc<Service>>>,
    suffix: &'a str,
    /// Secrets (BackendTLSPolicy CA bundles).
    state: &'a State,
}

impl MeshBackends<'_> {
    fn find(&self, kind: super::gateway_api::BackendKind, namespace: &str, name: &str) -> Option<&Arc<Service>> {
        use super::gateway_api::BackendKind;
        let from = |k: Kind| move |s: &&Arc<Service>| s.namespace == namespace && s.sources.iter().any(|(key, _)| key.kind == k && key.name == name);
        match kind {
            BackendKind::Service => {
                let host = format!("{name}.{namespace}.svc.{}", self.suffix);
                self.services
                    .get(&host)
                    .and_then(|c| c.iter().find(|s| s.namespace == namespace))
                    .or_else(|| self.services.values().flatten().find(from(Kind::Service)))
            }
            BackendKind::ServiceEntry => self.services.values().flatten().find(from(Kind::ServiceEntry)),
        }
    }
}

impl super::gateway_api::Backends for MeshBackends<'_> {
    fn hostname(&self, kind: super::gateway_api::BackendKind, namespace: &str, name: &str) -> Option<String> {
        self.find(kind, namespace, name).map(|s| s.hostname.clone())
    }

    fn resolve(&self, kind: super::gateway_api::BackendKind, namespace: &str, name: &str, port: Option<u32>) -> Option<(String, u32)> {
        let svc = self.find(kind, namespace, name)?;
        let port = match port {
            Some(p) => svc.port(p)?.number,
            None => svc.ports.first().filter(|_| svc.ports.len() == 1)?.number,
        };
        Some((svc.hostname.clone(), port))
    }

    fn port_named(&self, kind: super::gateway_api::BackendKind, namespace: &str, name: &str, port_name: &str) -> Option<u32> {
        self.find(kind, namespace, name)?.ports.iter().find(|p| p.name == port_name).map(|p| p.number)
    }

    fn ca_bundle(&self, namespace: &str, name: &str) -> Option<String> {
        let obj = self.state.objects.get(&ResourceKey::new(Kind::Secret, namespace, name))?;
        crate::model::secret::Stored::from_body(obj.body()).ca
    }

    fn certificate(&self, namespace: &str, name: &str) -> Result<(), &'static str> {
        let obj = self.state.objects.get(&ResourceKey::new(Kind::Secret, namespace, name)).ok_or("not found")?;
        match crate::model::secret::Stored::from_body(obj.body()).cert_chain {
            Some(_) => Ok(()),
            None => Err("holds no certificate (tls.crt or cert)"),
        }
    }
}

fn instance_of_workload(we: &WorkloadEntry, labels: &BTreeMap<String, String>, namespace: &str) -> Instance {
    Instance {
        address: we.address.clone(),
        ports: we.ports.clone(),
        default_port: None,
        labels: if we.labels.is_empty() { labels.clone() } else { we.labels.clone() },
        locality: we.locality.clone().unwrap_or_default(),
        weight: we.weight.unwrap_or(1).max(1),
        health: Health::Healthy,
        source: None,
        namespace: namespace.to_string(),
        service_account: we.service_account.clone().filter(|s| !s.is_empty()),
    }
}

/// The hostname of the service an Instance belongs to.
pub fn instance_hostname(spec: &InstanceSpec, namespace: &str, suffix: &str) -> String {
    if spec.service.contains('.') {
        spec.service.clone()
    } else {
        format!("{}.{namespace}.svc.{suffix}", spec.service)
    }
}

/// An Instance's health: its recorded status, else healthy when nothing
/// probes it (no check, or a TTL that registration started) and unknown
/// while a probe has not yet reported (Envoy routes to unknown hosts).
pub fn instance_health(obj: &StoredObject, spec: &InstanceSpec) -> Health {
    match InstanceStatus::of(obj.body()).map(|s| s.health) {
        Some(HealthState::Healthy) => Health::Healthy,
        Some(HealthState::Unhealthy) => Health::Unhealthy,
        None if spec.health_check.as_ref().is_some_and(|c| c.is_probe()) => Health::Unknown,
        None => Health::Healthy,
    }
}

fn registry_instance(obj: &StoredObject, spec: &InstanceSpec) -> Instance {
    Instance {
        address: spec.address.clone(),
        ports: spec.ports.clone(),
        default_port: spec.port,
        labels: labels_of(obj),
        locality: spec.locality.clone().unwrap_or_default(),
        weight: spec.weight.unwrap_or(1).max(1),
        health: instance_health(obj, spec),
        source: Some(obj.key.clone()),
        namespace: obj.key.namespace.to_string(),
        service_account: spec.service_account.clone(),
    }
}

/// The ports of a service implied by its first instance: its named ports
/// (protocol from the name, `http-web` is HTTP), or for a bare `port` one
/// TCP port named `tcp` (as Consul, which knows no protocol by default).
fn implied_ports(spec: &InstanceSpec) -> Vec<ServicePort> {
    if spec.ports.is_empty() {
        return spec.port.map(|n| ServicePort { name: "tcp".into(), number: n, protocol: Protocol::Tcp, target_port: None }).into_iter().collect();
    }
    spec.ports
        .iter()
        .map(|(name, &number)| ServicePort { name: name.clone(), number, protocol: protocol(protocol_from_name(name)), target_port: None })
        .collect()
}

/// Key sets fetched from `jwksUri`s: the last good JWKS text by URI.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FetchedKeys {
    pub sets: BTreeMap<String, Arc<str>>,
}

/// The current [`FetchedKeys`], shared by the fetcher (writes) and the
/// translator (reads); replaced whole, never edited in place.
#[derive(Debug, Default)]
pub struct KeyCell {
    current: Mutex<Arc<FetchedKeys>>,
}

impl KeyCell {
    pub fn get(&self) -> Arc<FetchedKeys> {
        self.current.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn set(&self, keys: FetchedKeys) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
    }
}
