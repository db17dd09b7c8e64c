//! `lodestar analyze`: Istio's configuration analysis (`istioctl analyze`)
//! without Kubernetes, with Istio's message codes, levels and wording, and
//! a few cross-object checks Istio lacks (Kiali's), under Lodestar's own
//! codes (`LST0001`+).
//!
//! One pure function, [`analyze`], of one store [`State`]: the live store's
//! (`GET /v1/analyze`), one built from files ([`files`], offline), or the
//! live one with files laid over it. [`on_write`] runs the analyzers a
//! write concerns on the part of the store it concerns, for the apply
//! answer's warnings.
//!
//! Imports, and nothing else (a later refactor moves this into a pure
//! crate): `crate::model` (kinds, keys, stored objects, the Istio and
//! registry specs, documents), `crate::mesh` (the service model: hostname
//! → the services claiming it, their ports and instances; `Mesh::build`,
//! `mesh::resolve`, `mesh::exported_to`), `crate::state::State` (the
//! pure state: a persistent map of objects) and, outside the crate, serde,
//! serde_json, yaml_serde and x509-parser (a Secret's certificate, IST0161).
//! No tokio, tonic, axum, sled or openraft; no clock (the caller gives
//! `Options::now`), no IO.
//!
//! # Layout
//! - this file: messages, the catalogue of codes, the context the
//!   analyzers share ([`Ctx`]: typed objects by kind, workloads, the host
//!   table), suppression, order, and the output forms (log, JSON, YAML).
//! - `schema`: IST0106/IST0133 (validation errors and warnings),
//!   IST0130/IST0131 (unreachable rules), IST0002 (deprecated fields).
//! - `virtualservice`: IST0101 (hosts, subsets, gateways), IST0109,
//!   IST0112, IST0132, IST0140, IST0149; LST0003.
//! - `destinationrule`: IST0128, IST0129, IST0173, IST0174; LST0001,
//!   LST0002, LST0004.
//! - `gateway`: IST0138, IST0145, IST0161, IST0101 (credentialName).
//! - `serviceentry`: IST0134.
//! - `sidecar`: IST0110, IST0111, IST0101 (selector).
//! - `envoyfilter`: IST0151-IST0155 (patch operations).
//! - `authz`: IST0127, IST0101 (namespace); LST0005; LST0006 (CUSTOM provider).
//! - `files`: documents from files into a State (offline), with the line
//!   of each field (`file:line` in the output).
//! - `write`: the analysis of one write (apply warnings).

mod authz;
mod destinationrule;
mod envoyfilter;
pub mod files;
mod gateway;
mod schema;
mod serviceentry;
mod sidecar;
pub mod topology;
mod virtualservice;
pub mod write;

pub use write::on_write;

use crate::model::istio::{
    AuthorizationPolicy, DestinationRule, EnvoyFilter, Gateway, PeerAuthentication, RequestAuthentication, ServiceEntry, Sidecar, Validated, VirtualService,
};
use crate::model::{Kind, ResourceKey, StoredObject, TypedSpec};
use crate::state::State;
use crate::translate::mesh::{MeshConfig, Service};
use serde::{Deserialize, Serialize};
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

/// How bad a finding is. Ordered from the worst: `Error < Warning < Info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Level {
    Error,
    Warning,
    Info,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Error => "Error",
            Level::Warning => "Warning",
            Level::Info => "Info",
        }
    }

    /// `Info`, `Warning` or `Error`, any case (istioctl's flag values).
    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "error" => Some(Level::Error),
            "warning" => Some(Level::Warning),
            "info" => Some(Level::Info),
            _ => None,
        }
    }

    /// At `threshold` or worse.
    pub fn reaches(self, threshold: Level) -> bool {
        self <= threshold
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One message code: Istio's (`IST`), byte for byte as Istio 1.30.3 has
/// it, or Lodestar's own (`LST`).
#[derive(Debug, PartialEq, Eq)]
pub struct Code {
    pub code: &'static str,
    pub name: &'static str,
    pub level: Level,
    /// Go `fmt` verbs, as Istio's catalogue writes them.
    pub template: &'static str,
}

macro_rules! codes {
    ($($id:ident = $code:literal $name:literal $level:ident $template:literal;)*) => {
        $(pub const $id: &Code = &Code { code: $code, name: $name, level: Level::$level, template: $template };)*
        /// Every code `analyze` can report, in code order.
        pub const CATALOGUE: &[&Code] = &[$($id),*];
    };
}

codes! {
    IST0002 = "IST0002" "Deprecated" Warning "Deprecated: %s";
    IST0101 = "IST0101" "ReferencedResourceNotFound" Error "Referenced %s not found: %q";
    IST0106 = "IST0106" "SchemaValidationError" Error "Schema validation error: %v";
    IST0109 = "IST0109" "ConflictingMeshGatewayVirtualServiceHosts" Error "The VirtualServices %s associated with mesh gateway define the same host %s which can lead to undefined behavior. This can be fixed by merging the conflicting VirtualServices into a single resource.";
    IST0110 = "IST0110" "ConflictingSidecarWorkloadSelectors" Error "The Sidecars %v in namespace %q select the same workload pod %q, which can lead to undefined behavior.";
    IST0111 = "IST0111" "MultipleSidecarsWithoutWorkloadSelectors" Error "The Sidecars %v in namespace %q have no workload selector, which can lead to undefined behavior.";
    IST0112 = "IST0112" "VirtualServiceDestinationPortSelectorRequired" Error "This VirtualService routes to a service %q that exposes multiple ports %v. Specifying a port in the destination is required to disambiguate.";
    IST0127 = "IST0127" "NoMatchingWorkloadsFound" Warning "No matching workloads for this resource with the following labels: %s";
    IST0128 = "IST0128" "NoServerCertificateVerificationDestinationLevel" Warning "DestinationRule %s in namespace %s has TLS mode set to %s but no caCertificates are set to validate server identity for host: %s";
    IST0129 = "IST0129" "NoServerCertificateVerificationPortLevel" Warning "DestinationRule %s in namespace %s has TLS mode set to %s but no caCertificates are set to validate server identity for host: %s at port %s";
    IST0130 = "IST0130" "VirtualServiceUnreachableRule" Warning "VirtualService rule %v not used (%s).";
    IST0131 = "IST0131" "VirtualServiceIneffectiveMatch" Info "VirtualService rule %v match %v is not used (duplicate/overlapping match in rule %v).";
    IST0132 = "IST0132" "VirtualServiceHostNotFoundInGateway" Warning "one or more host %v defined in VirtualService %s not found in Gateway %s.";
    IST0133 = "IST0133" "SchemaWarning" Warning "Schema validation warning: %v";
    IST0134 = "IST0134" "ServiceEntryAddressesRequired" Warning "ServiceEntry addresses are required for this protocol.";
    IST0138 = "IST0138" "GatewayDuplicateCertificate" Warning "Duplicate certificate in multiple gateways %v may cause 404s if clients re-use HTTP2 connections.";
    IST0140 = "IST0140" "IngressRouteRulesNotAffected" Warning "Subset in virtual service %s has no effect on ingress gateway %s requests";
    IST0145 = "IST0145" "ConflictingGateways" Error "Conflict with gateways %s (workload selector %s, port %s, hosts %v).";
    IST0149 = "IST0149" "JwtClaimBasedRoutingWithoutRequestAuthN" Error "The virtual service uses the JWT claim based routing (key: %s) but found no request authentication for the gateway (%s) pod (%s). The request authentication must first be applied for the gateway pods to validate the JWT token and make the claims available for routing.";
    IST0151 = "IST0151" "EnvoyFilterUsesRelativeOperation" Warning "This EnvoyFilter does not have a priority and has a relative patch operation set which can cause the EnvoyFilter not to be applied. Using the INSERT_FIRST of ADD option or setting the priority may help in ensuring the EnvoyFilter is applied correctly.";
    IST0152 = "IST0152" "EnvoyFilterUsesReplaceOperationIncorrectly" Error "The REPLACE operation is only valid for HTTP_FILTER and NETWORK_FILTER.";
    IST0153 = "IST0153" "EnvoyFilterUsesAddOperationIncorrectly" Error "The ADD operation will be ignored when applyTo is set to ROUTE_CONFIGURATION, or HTTP_ROUTE.";
    IST0154 = "IST0154" "EnvoyFilterUsesRemoveOperationIncorrectly" Error "The REMOVE operation will be ignored when applyTo is set to ROUTE_CONFIGURATION, or HTTP_ROUTE.";
    IST0155 = "IST0155" "EnvoyFilterUsesRelativeOperationWithProxyVersion" Warning "This EnvoyFilter does not have a priority and has a relative patch operation (NSTERT_BEFORE/AFTER, REPLACE, MERGE, DELETE) and proxyVersion set which can cause the EnvoyFilter not to be applied during an upgrade. Using the INSERT_FIRST or ADD option or setting the priority may help in ensuring the EnvoyFilter is applied correctly.";
    IST0161 = "IST0161" "InvalidGatewayCredential" Error "The credential referenced by the Gateway %s in namespace %s is invalid, which can cause the traffic not to work as expected.";
    IST0173 = "IST0173" "DestinationRuleSubsetNotSelectPods" Error "The Subset %s defined in the DestinationRule does not select any pods. Which may lead to 503 UH (NoHealthyUpstream).";
    IST0174 = "IST0174" "UnknownDestinationRuleHost" Warning "The host %s defined in the DestinationRule does not match any services in the mesh.";
    LST0001 = "LST0001" "DuplicateDestinationRuleSubset" Warning "The DestinationRules %v in namespace %q define subset %q for the same host %s; a proxy uses one DestinationRule per host, so only one of these definitions applies.";
    LST0002 = "LST0002" "MultipleDestinationRulesForHost" Warning "The DestinationRules %v in namespace %q apply to the same host %s; a proxy that sees several of them uses the oldest (%s) and ignores the others.";
    LST0003 = "LST0003" "MultipleGatewayVirtualServicesForHost" Warning "The VirtualServices %v bound to gateway %s define the same host %s; the gateway uses only the oldest (%s) for it.";
    LST0004 = "LST0004" "SubsetSelectsNoInstanceOfHost" Warning "The Subset %s defined in the DestinationRule selects no instance of host %s (it has %d); traffic to the subset gets 503 UH (NoHealthyUpstream).";
    LST0005 = "LST0005" "WorkloadNotCoveredByAuthorizationPolicy" Warning "No AuthorizationPolicy applies to this workload although ALLOW policies %v in namespace %q select other workloads: every request to it is allowed.";
    LST0006 = "LST0006" "CustomAuthorizationProviderUnusable" Error "The CUSTOM policy names ext_authz provider %q, which cannot be used (%s): the requests its rules match are denied.";
}

/// The catalogue entry of a code, if it is one `analyze` reports.
pub fn code(code: &str) -> Option<&'static Code> {
    CATALOGUE.iter().copied().find(|c| c.code == code)
}

/// The documentation of a code: Istio's page for the Istio version whose
/// analyzers Lodestar follows (istioctl prints the same), the README's
/// section for Lodestar's own.
pub fn documentation_url(code: &str) -> String {
    if code.starts_with("IST") {
        format!("https://istio.io/v1.30/docs/reference/config/analysis/{}/?ref=istioctl-analyze", code.to_ascii_lowercase())
    } else {
        format!("README.md#lodestar-analysis-codes-{}", code.to_ascii_lowercase())
    }
}

/// The resource a message is about.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Resource {
    /// As in `kind:` (`VirtualService`).
    pub kind: String,
    pub namespace: String,
    pub name: String,
}

impl Resource {
    pub fn of(key: &ResourceKey) -> Resource {
        Resource { kind: key.kind.name().to_string(), namespace: key.namespace.to_string(), name: key.name.to_string() }
    }

    /// The store key, if the kind is one Lodestar stores.
    pub fn key(&self) -> Option<ResourceKey> {
        Kind::from_kind_field(&self.kind).map(|k| ResourceKey::new(k, self.namespace.as_str(), self.name.as_str()))
    }
}

impl fmt::Display for Resource {
    /// `Kind namespace/name`, as istioctl names a resource in its output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub code: String,
    pub level: Level,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
    /// The template with its placeholders filled as Istio prints them.
    pub message: String,
    /// The field it is about, from the resource's root
    /// (`spec.http[0].route[0].destination.host`), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Other resources the message names (the conflicting VirtualServices,
    /// the Gateway): who may not read them may not see it (the API).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub related: Vec<Resource>,
}

impl Message {
    pub(crate) fn new(code: &Code, key: &ResourceKey, field: Option<String>, message: String) -> Message {
        Message { code: code.code.to_string(), level: code.level, resource: Some(Resource::of(key)), message, field, related: Vec::new() }
    }

    /// The same, naming other resources too.
    pub(crate) fn naming<'k>(mut self, keys: impl IntoIterator<Item = &'k ResourceKey>) -> Message {
        self.related.extend(keys.into_iter().map(Resource::of));
        self.related.sort();
        self.related.dedup();
        self
    }

    /// `Kind namespace/name`.
    pub fn origin(&self) -> Option<String> {
        self.resource.as_ref().map(Resource::to_string)
    }

    /// istioctl's log line: `Error [IST0101] (VirtualService default/reviews vs.yaml:14) Referenced ...`.
    pub fn log_line(&self, reference: Option<&str>) -> String {
        let origin = match (self.origin(), reference) {
            (Some(o), Some(r)) => format!(" ({o} {r})"),
            (Some(o), None) => format!(" ({o})"),
            (None, _) => String::new(),
        };
        format!("{} [{}]{origin} {}", self.level, self.code, self.message)
    }

    /// The JSON object `istioctl analyze -o json` prints for it; keys in
    /// alphabetical order, as istioctl's (a Go map).
    pub fn istio_json(&self, reference: Option<&str>) -> serde_json::Value {
        let mut m = serde_json::Map::new();
        m.insert("code".into(), self.code.clone().into());
        m.insert("documentationUrl".into(), documentation_url(&self.code).into());
        m.insert("level".into(), self.level.as_str().into());
        m.insert("message".into(), self.message.clone().into());
        if let Some(o) = self.origin() {
            m.insert("origin".into(), o.into());
        }
        if let (Some(r), Some(_)) = (reference, &self.resource) {
            m.insert("reference".into(), r.into());
        }
        serde_json::Value::Object(m)
    }
}

/// What `analyze` needs besides the objects.
#[derive(Debug, Clone)]
pub struct Options {
    pub mesh: Arc<MeshConfig>,
    /// Now, in Unix seconds, for certificates' validity (IST0161); `None`
    /// checks no validity period.
    pub now: Option<i64>,
}

impl Options {
    pub fn new(mesh: MeshConfig) -> Options {
        Options { mesh: Arc::new(mesh), now: None }
    }
}

/// Every finding about `state`, in istioctl's order (level, code,
/// resource, text), each line once; findings on a resource whose
/// `galley.istio.io/analyze-suppress` annotation names their code (or `*`)
/// left out.
pub fn analyze(state: &State, options: &Options) -> Vec<Message> {
    run(&Ctx::new(state, options), Family::ALL)
}

/// The analyzers, by the kinds they read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Schema,
    VirtualService,
    DestinationRule,
    Gateway,
    ServiceEntry,
    Sidecar,
    Authz,
    EnvoyFilter,
}

impl Family {
    pub(crate) const ALL: &'static [Family] = &[
        Family::Schema,
        Family::VirtualService,
        Family::DestinationRule,
        Family::Gateway,
        Family::ServiceEntry,
        Family::Sidecar,
        Family::Authz,
        Family::EnvoyFilter,
    ];
}

pub(crate) fn run(ctx: &Ctx, families: &[Family]) -> Vec<Message> {
    let mut out = Vec::new();
    for f in families {
        match f {
            Family::Schema => schema::run(ctx, &mut out),
            Family::VirtualService => virtualservice::run(ctx, &mut out),
            Family::DestinationRule => destinationrule::run(ctx, &mut out),
            Family::Gateway => gateway::run(ctx, &mut out),
            Family::ServiceEntry => serviceentry::run(ctx, &mut out),
            Family::Sidecar => sidecar::run(ctx, &mut out),
            Family::Authz => authz::run(ctx, &mut out),
            Family::EnvoyFilter => envoyfilter::run(ctx, &mut out),
        }
    }
    out.retain(|m| !ctx.suppressed_by_annotation(m));
    sort(&mut out);
    out
}

/// istioctl's order: level, code, resource (kind, name, namespace), text;
/// a message that repeats (the same code, resource, text and field: the
/// same log line) once.
pub fn sort(messages: &mut Vec<Message>) {
    let key = |m: &Message| {
        let r = m.resource.as_ref();
        (m.level, m.code.clone(), r.map(|r| (r.kind.clone(), r.name.clone(), r.namespace.clone())), m.message.clone(), m.field.clone())
    };
    messages.sort_by_cached_key(key);
    messages.dedup_by(|a, b| a.code == b.code && a.resource == b.resource && a.message == b.message && a.field == b.field);
}

/// The annotation that suppresses codes on one resource (Istio's).
pub const SUPPRESS_ANNOTATION: &str = "galley.istio.io/analyze-suppress";

/// `--suppress CODE=RESOURCE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppression {
    pub code: String,
    /// A glob over `Kind namespace/name`: `*` is any run of characters.
    pub pattern: String,
}

impl Suppression {
    /// istioctl's `CODE=Kind namespace/name` (a glob, `*` the wildcard),
    /// and Lodestar's `CODE=KIND/NAME` or `CODE=KIND/NAMESPACE/NAME` (a
    /// kind as `lodestar get` takes it; no namespace: any namespace).
    pub fn parse(value: &str) -> Result<Suppression, String> {
        let parts: Vec<&str> = value.split('=').collect();
        let [code, resource] = parts[..] else {
            return Err(format!("{value} is not a valid suppression value (CODE=Kind namespace/name, or CODE=KIND/NAME)"));
        };
        let pattern = if resource.contains(' ') || resource == "*" || !resource.contains('/') {
            resource.to_string()
        } else {
            let mut it = resource.splitn(3, '/');
            let (kind, a, b) = (it.next().unwrap_or(""), it.next(), it.next());
            let kind_name = Kind::from_cli_name(kind).or_else(|| Kind::from_kind_field(kind)).map_or(kind.to_string(), |k| k.name().to_string());
            match (a, b) {
                (Some(name), None) => format!("{kind_name} */{name}"),
                (Some(ns), Some(name)) => format!("{kind_name} {ns}/{name}"),
                _ => resource.to_string(),
            }
        };
        Ok(Suppression { code: code.to_string(), pattern })
    }

    pub fn matches(&self, m: &Message) -> bool {
        m.code == self.code && m.origin().is_some_and(|o| glob(&self.pattern, &o))
    }
}

/// Istio's glob: `*` is any run of characters (`/` and spaces too),
/// everything else is literal; case-sensitive.
pub fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

// ---------------------------------------------------------------------------
// Go formatting, as Istio's messages print their arguments.
// ---------------------------------------------------------------------------

/// Go's `%q` of a string (`strconv.Quote`).
pub(crate) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Go's `%v` of a slice: `[a b c]`.
pub(crate) fn slice<T: fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    format!("[{}]", items.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" "))
}

/// A label selector as Kubernetes prints it: `k1=v1,k2=v2`, keys sorted.
pub(crate) fn selector_text(labels: &BTreeMap<String, String>) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

/// Every label of `selector` is on `labels`.
pub(crate) fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

// ---------------------------------------------------------------------------
// The context the analyzers share.
// ---------------------------------------------------------------------------

/// A typed object of one kind.
pub(crate) struct Item<'a, T> {
    pub obj: &'a StoredObject,
    pub spec: &'a T,
}

impl<T> Item<'_, T> {
    pub fn key(&self) -> &ResourceKey {
        &self.obj.key
    }
    pub fn ns(&self) -> &str {
        &self.obj.key.namespace
    }
    pub fn name(&self) -> &str {
        &self.obj.key.name
    }
    /// `namespace/name`.
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.obj.key.namespace, self.obj.key.name)
    }
}

/// Something that runs a proxy: a registry Instance, a WorkloadEntry, a
/// ServiceEntry's inline endpoint, or a gateway no registered workload
/// stands for (its selector's labels in its own namespace: Lodestar's
/// gateway proxies connect with labels and are rarely registered, as
/// istioctl's offline analysis assumes an ingress gateway pod).
pub(crate) struct Workload<'a> {
    /// The Instance or WorkloadEntry, if it is one.
    pub key: Option<&'a ResourceKey>,
    /// The proxy a Gateway implies.
    pub gateway: bool,
    pub namespace: String,
    /// What a message calls its pod.
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

pub(crate) struct Ctx<'a> {
    pub opts: &'a Options,
    pub state: &'a State,
    pub mesh: crate::translate::mesh::Mesh,
    pub vs: Vec<Item<'a, VirtualService>>,
    pub dr: Vec<Item<'a, DestinationRule>>,
    pub gw: Vec<Item<'a, Gateway>>,
    pub se: Vec<Item<'a, ServiceEntry>>,
    pub sidecars: Vec<Item<'a, Sidecar>>,
    pub ap: Vec<Item<'a, AuthorizationPolicy>>,
    pub ra: Vec<Item<'a, RequestAuthentication>>,
    pub pa: Vec<Item<'a, PeerAuthentication>>,
    /// In store order (namespace, name): IST0155 depends on it.
    pub envoy_filters: Vec<Item<'a, EnvoyFilter>>,
    /// Every object with its validation warnings, and those whose spec
    /// does not parse (with why).
    pub validated: Vec<(&'a StoredObject, &'a [String])>,
    pub invalid: Vec<(&'a StoredObject, &'a str)>,
    pub workloads: Vec<Workload<'a>>,
    /// Services claiming a wildcard hostname (`*.example.com`).
    pub wildcard_services: Vec<Arc<Service>>,
    /// Every namespace that holds an object.
    pub namespaces: BTreeSet<String>,
    /// The whole store, when `state` is a part of it (`on_write`): where
    /// the few lookups across every namespace look instead.
    pub universe: Option<&'a State>,
    /// `workloads` by each of their labels (indexes into it): a selector
    /// looks only at the workloads carrying its rarest label.
    by_label: HashMap<(String, String), Vec<usize>>,
    /// Each DestinationRule's host, resolved (`dr`'s order), and the
    /// exact ones by host: a lookup by host is not a scan of every rule.
    dr_hosts: Vec<String>,
    dr_exact: HashMap<String, Vec<usize>>,
    dr_wildcard: Vec<usize>,
    /// The universe's workloads, indexed as `by_label` (built on first use).
    universe_index: OnceCell<LabelIndex>,
}

/// Label sets (with whether each is only a ServiceEntry's inline
/// endpoint) indexed by each of their labels.
#[derive(Default)]
struct LabelIndex {
    sets: Vec<(BTreeMap<String, String>, bool)>,
    by_label: HashMap<(String, String), Vec<usize>>,
}

impl LabelIndex {
    fn push(&mut self, labels: BTreeMap<String, String>, endpoint: bool) {
        let i = self.sets.len();
        for (k, v) in &labels {
            self.by_label.entry((k.clone(), v.clone())).or_default().push(i);
        }
        self.sets.push((labels, endpoint));
    }

    fn any(&self, selector: &BTreeMap<String, String>, endpoints: bool) -> bool {
        let ok = |i: &usize| {
            let (labels, endpoint) = &self.sets[*i];
            (endpoints || !endpoint) && selects(selector, labels)
        };
        match rarest(&self.by_label, selector) {
            Some(list) => list.iter().any(ok),
            None if selector.is_empty() => (0..self.sets.len()).any(|i| ok(&i)),
            None => false,
        }
    }
}

/// The shortest list of `index` among the selector's labels; `None` for an
/// empty selector, or an empty list when a label is on nothing.
fn rarest<'i>(index: &'i HashMap<(String, String), Vec<usize>>, selector: &BTreeMap<String, String>) -> Option<&'i [usize]> {
    let mut best: Option<&[usize]> = None;
    for (k, v) in selector {
        let list = index.get(&(k.clone(), v.clone())).map_or(&[][..], Vec::as_slice);
        if best.is_none_or(|b| list.len() < b.len()) {
            best = Some(list);
        }
    }
    best
}

impl<'a> Ctx<'a> {
    pub fn new(state: &'a State, opts: &'a Options) -> Ctx<'a> {
        let mesh = crate::translate::mesh::Mesh::build(state, opts.mesh.clone());
        let mut ctx = Ctx {
            opts,
            state,
            mesh,
            vs: Vec::new(),
            dr: Vec::new(),
            gw: Vec::new(),
            se: Vec::new(),
            sidecars: Vec::new(),
            ap: Vec::new(),
            ra: Vec::new(),
            pa: Vec::new(),
            envoy_filters: Vec::new(),
            validated: Vec::new(),
            invalid: Vec::new(),
            workloads: Vec::new(),
            wildcard_services: Vec::new(),
            namespaces: BTreeSet::new(),
            universe: None,
            by_label: HashMap::new(),
            dr_hosts: Vec::new(),
            dr_exact: HashMap::new(),
            dr_wildcard: Vec::new(),
            universe_index: OnceCell::new(),
        };
        for (key, obj) in state.objects.iter() {
            if key.kind.is_acl() {
                continue;
            }
            ctx.namespaces.insert(key.namespace.to_string());
            let typed = match obj.typed() {
                Ok(t) => t,
                Err(e) => {
                    ctx.invalid.push((obj, e));
                    continue;
                }
            };
            match &**typed {
                TypedSpec::Istio(v) => {
                    ctx.validated.push((obj, v.warnings()));
                    match v {
                        Validated::VirtualService { spec, .. } => ctx.vs.push(Item { obj, spec }),
                        Validated::DestinationRule { spec, .. } => ctx.dr.push(Item { obj, spec }),
                        Validated::Gateway { spec, .. } => ctx.gw.push(Item { obj, spec }),
                        Validated::ServiceEntry { spec, .. } => {
                            for (i, e) in spec.endpoints.iter().enumerate() {
                                let name = format!("{}[{i}]", key.name);
                                ctx.workloads.push(Workload {
                                    key: None,
                                    gateway: false,
                                    namespace: key.namespace.to_string(),
                                    name,
                                    labels: e.labels.clone(),
                                });
                            }
                            ctx.se.push(Item { obj, spec })
                        }
                        Validated::Sidecar { spec, .. } => ctx.sidecars.push(Item { obj, spec }),
                        Validated::AuthorizationPolicy { spec, .. } => ctx.ap.push(Item { obj, spec }),
                        Validated::RequestAuthentication { spec, .. } => ctx.ra.push(Item { obj, spec }),
                        Validated::PeerAuthentication { spec, .. } => ctx.pa.push(Item { obj, spec }),
                        Validated::WorkloadEntry { spec, .. } => {
                            let labels = if spec.labels.is_empty() { labels_of(obj) } else { spec.labels.clone() };
                            ctx.workloads.push(Workload {
                                key: Some(key),
                                gateway: false,
                                namespace: key.namespace.to_string(),
                                name: key.name.to_string(),
                                labels,
                            });
                        }
                        Validated::EnvoyFilter { spec, .. } => ctx.envoy_filters.push(Item { obj, spec }),
                        // Schema findings only (their warnings).
                        Validated::WorkloadGroup { .. } | Validated::MeshConfig { .. } | Validated::Telemetry { .. } => {}
                    }
                }
                TypedSpec::Instance(_) => ctx.workloads.push(Workload {
                    key: Some(key),
                    gateway: false,
                    namespace: key.namespace.to_string(),
                    name: key.name.to_string(),
                    labels: labels_of(obj),
                }),
                // Gateway API objects: their status says what is wrong with them.
                TypedSpec::Service(_) | TypedSpec::Lease(_) | TypedSpec::Acl(_) | TypedSpec::Secret | TypedSpec::GatewayApi(_) | TypedSpec::Namespace => {}
            }
        }
        ctx.index_workloads(0);
        // Gateways no registered workload stands for.
        let implied: Vec<Workload> = ctx
            .gw
            .iter()
            .filter(|g| !g.spec.selector.is_empty() && !ctx.selected(&g.spec.selector).any(|w| w.key.is_some()))
            .map(|g| Workload {
                key: None,
                gateway: true,
                namespace: g.ns().to_string(),
                name: selector_text(&g.spec.selector),
                labels: g.spec.selector.clone(),
            })
            .collect();
        let from = ctx.workloads.len();
        ctx.workloads.extend(implied);
        ctx.index_workloads(from);
        let suffix = opts.mesh.domain_suffix.clone();
        for (i, dr) in ctx.dr.iter().enumerate() {
            let host = crate::model::istio::resolve_short_name(&dr.spec.host, dr.ns(), &suffix);
            if host.starts_with('*') {
                ctx.dr_wildcard.push(i);
            } else {
                ctx.dr_exact.entry(host.clone()).or_default().push(i);
            }
            ctx.dr_hosts.push(host);
        }
        ctx.wildcard_services = ctx.mesh.services.iter().filter(|(h, _)| h.starts_with('*')).flat_map(|(_, c)| c.iter().cloned()).collect();
        ctx
    }

    fn index_workloads(&mut self, from: usize) {
        for (i, w) in self.workloads.iter().enumerate().skip(from) {
            for (k, v) in &w.labels {
                self.by_label.entry((k.clone(), v.clone())).or_default().push(i);
            }
        }
    }

    /// The workloads carrying every label of `selector` (all of them for
    /// an empty one), in `workloads`' order.
    pub fn selected<'c>(&'c self, selector: &'c BTreeMap<String, String>) -> Box<dyn Iterator<Item = &'c Workload<'a>> + 'c> {
        match rarest(&self.by_label, selector) {
            Some(list) => Box::new(list.iter().map(|i| &self.workloads[*i]).filter(move |w| selects(selector, &w.labels))),
            None => Box::new(self.workloads.iter()),
        }
    }

    /// The DestinationRules whose (resolved) host matches `hostname`, as
    /// `host_matches` has it, in `dr`'s order, with their resolved hosts.
    pub fn destination_rules_for_host<'c>(&'c self, hostname: &str) -> Vec<(&'c Item<'a, DestinationRule>, &'c str)> {
        let mut idx: Vec<usize> = self.dr_exact.get(hostname).cloned().unwrap_or_default();
        idx.extend(self.dr_wildcard.iter().copied().filter(|i| crate::model::istio::host_matches(&self.dr_hosts[*i], hostname)));
        if hostname.starts_with('*') {
            // A wildcard service: exact rules its pattern covers too.
            idx = (0..self.dr.len()).filter(|i| crate::model::istio::host_matches(&self.dr_hosts[*i], hostname)).collect();
        }
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| (&self.dr[i], self.dr_hosts[i].as_str())).collect()
    }

    pub fn suffix(&self) -> &str {
        &self.opts.mesh.domain_suffix
    }

    pub fn root_ns(&self) -> &str {
        &self.opts.mesh.root_namespace
    }

    /// A Gateway by namespace and name.
    pub fn gateway(&self, ns: &str, name: &str) -> Option<&Item<'a, Gateway>> {
        self.gw.iter().find(|g| g.ns() == ns && g.name() == name)
    }

    /// The workloads a Gateway's selector picks (registered ones, else the
    /// one it implies); none for an empty selector (Lodestar serves a
    /// Gateway to no proxy then).
    pub fn gateway_workloads<'c>(&'c self, gw: &'c Gateway) -> Vec<&'c Workload<'a>> {
        if gw.selector.is_empty() {
            return Vec::new();
        }
        self.selected(&gw.selector).collect()
    }

    /// The service a destination host names, looked up as Istio's analyzers
    /// do (`GetDestinationHost`): the host (a short name in `source_ns`)
    /// claimed by a service exported to every namespace; else by one
    /// exported to a namespace of the referring resource's own `exportTo`
    /// (its namespace when it has none); else covered by a wildcard
    /// hostname exported to every namespace or to `source_ns`.
    pub fn find_host(&self, source_ns: &str, export_to: &[String], host: &str) -> Option<&Arc<Service>> {
        let fqdn = crate::model::istio::resolve_short_name(host, source_ns, self.suffix());
        let claims = self.mesh.claims(&fqdn);
        if let Some(s) = claims.iter().find(|s| exported_to_all(&s.export_to)) {
            return Some(s);
        }
        let scopes: Vec<&str> =
            if export_to.is_empty() { vec![source_ns] } else { export_to.iter().map(|e| if e == "." { source_ns } else { e.as_str() }).collect() };
        if let Some(s) = claims.iter().find(|s| scopes.iter().any(|scope| service_scoped_to(s, scope))) {
            return Some(s);
        }
        let bare = fqdn.strip_prefix('*').unwrap_or(&fqdn);
        self.wildcard_services
            .iter()
            .find(|s| (exported_to_all(&s.export_to) || service_scoped_to(s, source_ns)) && bare.ends_with(s.hostname.strip_prefix('*').unwrap_or(&s.hostname)))
    }

    /// Some workload of any namespace carries every label of `selector`:
    /// a registered one, a gateway's, or (with `endpoints`) a
    /// ServiceEntry's inline endpoint.
    pub fn any_workload(&self, selector: &BTreeMap<String, String>, endpoints: bool) -> bool {
        if self.selected(selector).any(|w| endpoints || w.key.is_some() || w.gateway) {
            return true;
        }
        let Some(universe) = self.universe else { return false };
        self.universe_index.get_or_init(|| universe_workloads(universe)).any(selector, endpoints)
    }

    /// Some namespace matches `pattern` (`*`, `*suffix`, `prefix*`, or a
    /// name, any case): one that holds an object.
    pub fn namespace_exists(&self, pattern: &str) -> bool {
        let matches = |ns: &str| {
            if pattern == "*" {
                true
            } else if let Some(suffix) = pattern.strip_prefix('*') {
                ns.ends_with(suffix)
            } else if let Some(prefix) = pattern.strip_suffix('*') {
                ns.starts_with(prefix)
            } else {
                ns.eq_ignore_ascii_case(pattern)
            }
        };
        self.namespaces.iter().any(|ns| matches(ns)) || self.universe.is_some_and(|u| u.objects.keys().any(|k| !k.kind.is_acl() && matches(&k.namespace)))
    }

    fn suppressed_by_annotation(&self, m: &Message) -> bool {
        let Some(key) = m.resource.as_ref().and_then(Resource::key) else { return false };
        let Some(value) = self.state.get(&key).and_then(|o| o.annotation(SUPPRESS_ANNOTATION).map(str::to_string)) else { return false };
        value == "*" || value.split(',').any(|c| c == m.code)
    }
}

/// Every workload of `state`: Instances, WorkloadEntries and (flagged)
/// ServiceEntries' inline endpoints, by their labels.
fn universe_workloads(state: &State) -> LabelIndex {
    let mut index = LabelIndex::default();
    for o in state.objects.values() {
        match o.typed().map(|t| &**t) {
            Ok(TypedSpec::Instance(_)) => index.push(labels_of(o), false),
            Ok(TypedSpec::Istio(Validated::WorkloadEntry { spec, .. })) if spec.labels.is_empty() => index.push(labels_of(o), false),
            Ok(TypedSpec::Istio(Validated::WorkloadEntry { spec, .. })) => index.push(spec.labels.clone(), false),
            Ok(TypedSpec::Istio(Validated::ServiceEntry { spec, .. })) => spec.endpoints.iter().for_each(|e| index.push(e.labels.clone(), true)),
            _ => {}
        }
    }
    index
}

fn labels_of(obj: &StoredObject) -> BTreeMap<String, String> {
    obj.labels().into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `exportTo` empty or holding `*`.
pub(crate) fn exported_to_all(export_to: &[String]) -> bool {
    export_to.is_empty() || export_to.iter().any(|e| e == "*")
}

/// A service's `exportTo` names `scope` (`.` its own namespace).
fn service_scoped_to(s: &Service, scope: &str) -> bool {
    s.export_to.iter().any(|e| e == scope || (e == "." && s.namespace == scope))
}

#[cfg(test)]
mod tests;
