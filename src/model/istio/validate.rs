//! Validation of `networking.istio.io` specs: typed parsing with field
//! paths, then the semantic checks Istio's own validation performs
//! (istio/istio `pkg/config/validation`), reporting every problem at once.

use std::collections::BTreeSet;
use std::fmt;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::authorization_policy::AuthorizationPolicy;
use super::common::{Labels, MatchKind, Percent, StringMatch};
use super::destination_rule::DestinationRule;
use super::duration::Duration;
use super::envoy_filter::EnvoyFilter;
use super::gateway::Gateway;
use super::host;
use super::mesh_config::MeshConfig;
use super::peer_authentication::PeerAuthentication;
use super::request_authentication::RequestAuthentication;
use super::service_entry::ServiceEntry;
use super::sidecar::Sidecar;
use super::telemetry::Telemetry;
use super::virtual_service::VirtualService;
use super::workload_entry::WorkloadEntry;
use super::workload_group::WorkloadGroup;

/// One problem in a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Where, rooted at `spec`: `spec.http[0].route[1].weight`. Map keys
    /// that are not plain identifiers are quoted: `spec.selector["app.kubernetes.io/name"]`.
    pub field: String,
    /// What is wrong, for a human.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for FieldError {}

/// A spec that passed validation, with the warnings it raised: fields that
/// are deprecated, or accepted for compatibility but not acted upon.
/// Each warning starts with the path of the field it concerns.
///
/// Specs are boxed because they differ widely in size (a DestinationRule
/// with all its optional policies is over a kilobyte).
#[derive(Debug, Clone, PartialEq)]
pub enum Validated {
    VirtualService { spec: Box<VirtualService>, warnings: Vec<String> },
    DestinationRule { spec: Box<DestinationRule>, warnings: Vec<String> },
    ServiceEntry { spec: Box<ServiceEntry>, warnings: Vec<String> },
    Gateway { spec: Box<Gateway>, warnings: Vec<String> },
    Sidecar { spec: Box<Sidecar>, warnings: Vec<String> },
    WorkloadEntry { spec: Box<WorkloadEntry>, warnings: Vec<String> },
    AuthorizationPolicy { spec: Box<AuthorizationPolicy>, warnings: Vec<String> },
    PeerAuthentication { spec: Box<PeerAuthentication>, warnings: Vec<String> },
    RequestAuthentication { spec: Box<RequestAuthentication>, warnings: Vec<String> },
    WorkloadGroup { spec: Box<WorkloadGroup>, warnings: Vec<String> },
    MeshConfig { spec: Box<MeshConfig>, warnings: Vec<String> },
    Telemetry { spec: Box<Telemetry>, warnings: Vec<String> },
    EnvoyFilter { spec: Box<EnvoyFilter>, warnings: Vec<String> },
}

impl Validated {
    /// The resource kind, as in `kind:` of the manifest.
    pub fn kind(&self) -> &'static str {
        match self {
            Validated::VirtualService { .. } => "VirtualService",
            Validated::DestinationRule { .. } => "DestinationRule",
            Validated::ServiceEntry { .. } => "ServiceEntry",
            Validated::Gateway { .. } => "Gateway",
            Validated::Sidecar { .. } => "Sidecar",
            Validated::WorkloadEntry { .. } => "WorkloadEntry",
            Validated::AuthorizationPolicy { .. } => "AuthorizationPolicy",
            Validated::PeerAuthentication { .. } => "PeerAuthentication",
            Validated::RequestAuthentication { .. } => "RequestAuthentication",
            Validated::WorkloadGroup { .. } => "WorkloadGroup",
            Validated::MeshConfig { .. } => "MeshConfig",
            Validated::Telemetry { .. } => "Telemetry",
            Validated::EnvoyFilter { .. } => "EnvoyFilter",
        }
    }

    pub fn warnings(&self) -> &[String] {
        match self {
            Validated::VirtualService { warnings, .. }
            | Validated::DestinationRule { warnings, .. }
            | Validated::ServiceEntry { warnings, .. }
            | Validated::Gateway { warnings, .. }
            | Validated::Sidecar { warnings, .. }
            | Validated::WorkloadEntry { warnings, .. }
            | Validated::AuthorizationPolicy { warnings, .. }
            | Validated::PeerAuthentication { warnings, .. } => warnings,
            Validated::RequestAuthentication { warnings, .. }
            | Validated::WorkloadGroup { warnings, .. }
            | Validated::MeshConfig { warnings, .. }
            | Validated::Telemetry { warnings, .. }
            | Validated::EnvoyFilter { warnings, .. } => warnings,
        }
    }

    /// The spec as JSON again; fields the user left out stay out.
    pub fn to_json(&self) -> Result<Value, serde_json::Error> {
        match self {
            Validated::VirtualService { spec, .. } => serde_json::to_value(spec),
            Validated::DestinationRule { spec, .. } => serde_json::to_value(spec),
            Validated::ServiceEntry { spec, .. } => serde_json::to_value(spec),
            Validated::Gateway { spec, .. } => serde_json::to_value(spec),
            Validated::Sidecar { spec, .. } => serde_json::to_value(spec),
            Validated::WorkloadEntry { spec, .. } => serde_json::to_value(spec),
            Validated::AuthorizationPolicy { spec, .. } => serde_json::to_value(spec),
            Validated::PeerAuthentication { spec, .. } => serde_json::to_value(spec),
            Validated::RequestAuthentication { spec, .. } => serde_json::to_value(spec),
            Validated::WorkloadGroup { spec, .. } => serde_json::to_value(spec),
            Validated::MeshConfig { spec, .. } => serde_json::to_value(spec),
            Validated::Telemetry { spec, .. } => serde_json::to_value(spec),
            Validated::EnvoyFilter { spec, .. } => serde_json::to_value(spec),
        }
    }
}

/// The kinds [`validate`] understands.
pub const KINDS: [&str; 13] = [
    "VirtualService",
    "DestinationRule",
    "ServiceEntry",
    "Gateway",
    "Sidecar",
    "WorkloadEntry",
    "AuthorizationPolicy",
    "PeerAuthentication",
    "RequestAuthentication",
    "WorkloadGroup",
    "MeshConfig",
    "Telemetry",
    "EnvoyFilter",
];

/// Parses and validates the `spec` of a `networking.istio.io` resource of
/// the given kind (any API version: v1alpha3, v1beta1 and v1 share one
/// shape). Returns every error found, each with the path of its field.
///
/// Checks that need the resource's namespace or name (e.g. `exportTo`
/// listing the own namespace twice, once as `.`) are not made here.
pub fn validate(kind: &str, spec: &Value) -> Result<Validated, Vec<FieldError>> {
    match kind {
        "VirtualService" => run(spec, VirtualService::check).map(|(spec, warnings)| Validated::VirtualService { spec, warnings }),
        "DestinationRule" => run(spec, DestinationRule::check).map(|(spec, warnings)| Validated::DestinationRule { spec, warnings }),
        "ServiceEntry" => run(spec, ServiceEntry::check).map(|(spec, warnings)| Validated::ServiceEntry { spec, warnings }),
        "Gateway" => run(spec, Gateway::check).map(|(spec, warnings)| Validated::Gateway { spec, warnings }),
        "Sidecar" => run(spec, Sidecar::check).map(|(spec, warnings)| Validated::Sidecar { spec, warnings }),
        "WorkloadEntry" => run(spec, WorkloadEntry::check).map(|(spec, warnings)| Validated::WorkloadEntry { spec, warnings }),
        "AuthorizationPolicy" => run(spec, AuthorizationPolicy::check).map(|(spec, warnings)| Validated::AuthorizationPolicy { spec, warnings }),
        "PeerAuthentication" => run(spec, PeerAuthentication::check).map(|(spec, warnings)| Validated::PeerAuthentication { spec, warnings }),
        "RequestAuthentication" => run(spec, RequestAuthentication::check).map(|(spec, warnings)| Validated::RequestAuthentication { spec, warnings }),
        "WorkloadGroup" => run(spec, WorkloadGroup::check).map(|(spec, warnings)| Validated::WorkloadGroup { spec, warnings }),
        "MeshConfig" => run(spec, MeshConfig::check).map(|(spec, warnings)| Validated::MeshConfig { spec, warnings }),
        "Telemetry" => run(spec, Telemetry::check).map(|(spec, warnings)| Validated::Telemetry { spec, warnings }),
        "EnvoyFilter" => run(spec, EnvoyFilter::check).map(|(spec, warnings)| Validated::EnvoyFilter { spec, warnings }),
        other => Err(vec![FieldError { field: "kind".to_string(), reason: format!("unsupported kind {other:?}; expected one of {}", KINDS.join(", ")) }]),
    }
}

/// Drop every field of `spec` that `kind` does not have, as a Kubernetes
/// API server does with field validation `Warn` (its default since 1.27,
/// what `kubectl apply` gets for Istio's CRDs): the paths dropped, for the
/// warnings. Stops at the first error that is not an unknown field (the
/// validation that follows reports it, and the write fails anyway).
pub fn drop_unknown_fields(kind: &str, spec: &mut Value) -> Vec<String> {
    fn first<T: DeserializeOwned>(spec: &Value) -> Option<Vec<Segment>> {
        match serde_path_to_error::deserialize::<_, T>(spec) {
            Err(e) if e.inner().to_string().starts_with("unknown field") => Some(e.path().iter().map(Segment::from).collect()),
            _ => None,
        }
    }
    let unknown: fn(&Value) -> Option<Vec<Segment>> = match kind {
        "VirtualService" => first::<VirtualService>,
        "DestinationRule" => first::<DestinationRule>,
        "ServiceEntry" => first::<ServiceEntry>,
        "Gateway" => first::<Gateway>,
        "Sidecar" => first::<Sidecar>,
        "WorkloadEntry" => first::<WorkloadEntry>,
        "AuthorizationPolicy" => first::<AuthorizationPolicy>,
        "PeerAuthentication" => first::<PeerAuthentication>,
        "RequestAuthentication" => first::<RequestAuthentication>,
        "WorkloadGroup" => first::<WorkloadGroup>,
        "Telemetry" => first::<Telemetry>,
        "EnvoyFilter" => first::<EnvoyFilter>,
        _ => return Vec::new(),
    };
    let mut dropped = Vec::new();
    while dropped.len() < MAX_STRUCTURAL_ERRORS {
        let Some(at) = unknown(spec) else { break };
        match drop_at(spec, &at) {
            Some(removed) => dropped.push(format_segments(&removed)),
            None => break,
        }
    }
    dropped
}

fn run<T: DeserializeOwned + Serialize>(spec: &Value, check: fn(&T, &Path, &mut Report)) -> Result<(Box<T>, Vec<String>), Vec<FieldError>> {
    if spec.is_null() {
        return Err(vec![FieldError { field: ROOT.to_string(), reason: "spec is required".to_string() }]);
    }
    let typed: Box<T> = from_value(spec)?;
    let mut report = Report::default();
    check(&typed, &Path::root(), &mut report);
    if report.errors.is_empty() {
        Ok((typed, report.warnings))
    } else {
        Err(report.errors)
    }
}

const ROOT: &str = "spec";

/// How many structural errors one spec may report; past this the spec is
/// probably not the kind it claims to be and more errors would not help.
const MAX_STRUCTURAL_ERRORS: usize = 20;

/// Deserialises a spec, turning serde's errors into [`FieldError`]s with
/// paths rooted at `spec`.
///
/// Serde stops at the first error, so to report several at once (say, two
/// misspelt fields in different routes) each offending field is dropped from
/// a scratch copy and deserialisation retried. An error that only appears
/// because of such a drop (a required field now missing) ends the search.
/// Semantic checks are not run on a spec that failed here: they would judge
/// a spec the user did not write. A struct written as an array, which serde
/// tolerates but protobuf JSON does not, is reported too.
pub fn from_value<T: DeserializeOwned + Serialize>(value: &Value) -> Result<T, Vec<FieldError>> {
    // The common case, valid input, needs no path tracking: plain serde
    // first. Only on failure is it run again, tracking paths, to name the
    // fields (both accept and reject exactly the same input).
    let mut error = match T::deserialize(value).or_else(|_| serde_path_to_error::deserialize::<_, T>(value)) {
        Ok(typed) => {
            let mut errors = Vec::new();
            // Serialising our own types to JSON cannot fail (all map keys
            // are strings); were it to, there would be nothing to compare.
            if let Ok(parsed) = serde_json::to_value(&typed) {
                find_positional_structs(value, &parsed, &mut Vec::new(), &mut errors);
            }
            return if errors.is_empty() { Ok(typed) } else { Err(errors) };
        }
        Err(e) => e,
    };
    let mut errors = Vec::new();
    let mut scratch = value.clone();
    let mut dropped: Vec<Vec<Segment>> = Vec::new();
    loop {
        let segments: Vec<Segment> = error.path().iter().map(Segment::from).collect();
        let reason = error.inner().to_string();
        let caused_by_drop = reason.starts_with("missing field") && dropped.iter().any(|d| d.len() == segments.len() + 1 && d.starts_with(&segments));
        if caused_by_drop {
            break;
        }
        errors.push(FieldError { field: format_segments(&segments), reason });
        let Some(removed) = drop_at(&mut scratch, &segments) else {
            break;
        };
        dropped.push(removed);
        if errors.len() >= MAX_STRUCTURAL_ERRORS {
            break;
        }
        match serde_path_to_error::deserialize::<_, T>(&scratch) {
            Ok(_) => break,
            Err(e) => error = e,
        }
    }
    Err(errors)
}

/// Serde's derived `Deserialize` also accepts a struct written as an array
/// of its fields in order (`destination: [reviews, v1]`), which protobuf
/// JSON, and so Istio, rejects. Such input shows up as an array in the
/// spec where the parsed value serialises to an object.
fn find_positional_structs(input: &Value, parsed: &Value, at: &mut Vec<Segment>, errors: &mut Vec<FieldError>) {
    match (input, parsed) {
        (Value::Array(_), Value::Object(_)) => {
            errors.push(FieldError { field: format_segments(at), reason: "invalid type: sequence, expected a mapping of field names to values".to_string() })
        }
        (Value::Array(items), Value::Array(parsed_items)) => {
            for (i, (item, parsed_item)) in items.iter().zip(parsed_items).enumerate() {
                at.push(Segment::Index(i));
                find_positional_structs(item, parsed_item, at, errors);
                at.pop();
            }
        }
        (Value::Object(fields), Value::Object(parsed_fields)) => {
            for (key, field) in fields {
                // Only containers can hold a positional struct.
                if !matches!(field, Value::Array(_) | Value::Object(_)) {
                    continue;
                }
                if let Some(parsed_field) = parsed_fields.get(key) {
                    at.push(Segment::Key(key.clone()));
                    find_positional_structs(field, parsed_field, at, errors);
                    at.pop();
                }
            }
        }
        _ => {}
    }
}

/// An owned step of a serde path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
    Other,
}

impl From<&serde_path_to_error::Segment> for Segment {
    fn from(segment: &serde_path_to_error::Segment) -> Self {
        match segment {
            serde_path_to_error::Segment::Map { key } => Segment::Key(key.clone()),
            serde_path_to_error::Segment::Seq { index } => Segment::Index(*index),
            _ => Segment::Other,
        }
    }
}

fn format_segments(segments: &[Segment]) -> String {
    let mut path = Path::root();
    for segment in segments {
        path = match segment {
            Segment::Key(key) => path.key(key),
            Segment::Index(index) => path.index(*index),
            Segment::Other => path.field("?"),
        };
    }
    path.0
}

/// Removes the object member the path ends in (for a path ending in an
/// array index, the member holding the array, since removing an element
/// would shift the indices of later errors). Returns the path removed.
fn drop_at(root: &mut Value, segments: &[Segment]) -> Option<Vec<Segment>> {
    let key_pos = segments.iter().rposition(|s| matches!(s, Segment::Key(_)))?;
    let Segment::Key(key) = &segments[key_pos] else {
        return None;
    };
    let mut parent = &mut *root;
    for segment in &segments[..key_pos] {
        parent = match segment {
            Segment::Key(k) => parent.get_mut(k.as_str())?,
            Segment::Index(i) => parent.get_mut(*i)?,
            Segment::Other => return None,
        };
    }
    parent.as_object_mut()?.remove(key)?;
    Some(segments[..=key_pos].to_vec())
}

/// The path of a field inside a spec, rooted at `spec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Path(String);

impl Path {
    pub(super) fn root() -> Self {
        Path(ROOT.to_string())
    }

    /// A struct field, named as in YAML. (A path is built for every field
    /// checked, error or not: plain concatenation, no `format!`.)
    pub(super) fn field(&self, name: &str) -> Self {
        let mut p = String::with_capacity(self.0.len() + 1 + name.len());
        p.push_str(&self.0);
        p.push('.');
        p.push_str(name);
        Path(p)
    }

    pub(super) fn index(&self, index: usize) -> Self {
        Path(format!("{}[{index}]", self.0))
    }

    /// A map entry: plain identifiers read like fields, anything else (label
    /// keys with dots or slashes, header names with dashes) is quoted so the
    /// path stays unambiguous.
    pub(super) fn key(&self, key: &str) -> Self {
        let plain = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_') && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if plain {
            self.field(key)
        } else {
            let quoted = serde_json::to_string(key).unwrap_or_else(|_| format!("{key:?}"));
            Path(format!("{}[{quoted}]", self.0))
        }
    }
}

impl fmt::Display for Path {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Collects the errors and warnings of one spec.
#[derive(Debug, Default)]
pub(super) struct Report {
    errors: Vec<FieldError>,
    warnings: Vec<String>,
}

impl Report {
    pub(super) fn error(&mut self, at: &Path, reason: impl Into<String>) {
        self.errors.push(FieldError { field: at.0.clone(), reason: reason.into() });
    }

    pub(super) fn warn(&mut self, at: &Path, message: impl fmt::Display) {
        self.warnings.push(format!("{at}: {message}"));
    }

    pub(super) fn check(&mut self, at: &Path, result: Result<(), String>) {
        if let Err(reason) = result {
            self.error(at, reason);
        }
    }

    /// A field Istio defines and we parse (so configs written for Istio
    /// load) but Lodestar does not act on.
    pub(super) fn ignored(&mut self, at: &Path) {
        self.warn(at, "accepted but not implemented by Lodestar; it has no effect");
    }

    pub(super) fn ignored_if(&mut self, present: bool, at: &Path) {
        if present {
            self.ignored(at);
        }
    }

    pub(super) fn deprecated(&mut self, at: &Path, instead: &str) {
        self.warn(at, format!("deprecated; use {instead} instead"));
    }

    /// A feature Lodestar cannot honour, where ignoring it would route
    /// traffic differently from what the user asked for.
    pub(super) fn unsupported(&mut self, at: &Path, what: &str) {
        self.error(at, format!("{what} are not supported yet"));
    }

    /// [`Report::unsupported`] for one thing, with what to do instead.
    pub(super) fn unsupported_one(&mut self, at: &Path, what: &str, instead: &str) {
        self.error(at, format!("{what} is not supported yet; {instead}"));
    }

    #[cfg(test)]
    pub(super) fn into_parts(self) -> (Vec<FieldError>, Vec<String>) {
        (self.errors, self.warnings)
    }
}

// ---------------------------------------------------------------------------
// Checks shared by several kinds.
// ---------------------------------------------------------------------------

pub(super) fn check_port(r: &mut Report, at: &Path, number: u32) {
    if !(1..=65535).contains(&number) {
        r.error(at, format!("port number {number} must be in the range 1..65535"));
    }
}

/// Istio's `ValidateDuration`: Envoy timers below a millisecond are
/// meaningless and sub-millisecond precision is silently lost, so both are
/// rejected.
pub(super) fn check_duration(r: &mut Report, at: &Path, duration: &Duration) {
    match duration.to_std() {
        Err(e) => r.error(at, e),
        Ok(d) if d < std::time::Duration::from_millis(1) => r.error(at, format!("duration {duration} must be at least 1ms")),
        Ok(d) if d.subsec_nanos() % 1_000_000 != 0 => r.error(at, format!("duration {duration}: only durations to ms precision are supported")),
        Ok(_) => {}
    }
}

/// A duration that only has to be well-formed (zero allowed).
pub(super) fn check_duration_syntax(r: &mut Report, at: &Path, duration: &Duration) {
    if let Err(e) = duration.to_std() {
        r.error(at, e);
    }
}

/// Istio's `validatePercentage`: 0, or a value in `[0.0001, 100]` (Envoy's
/// fractional percent has a resolution of one in a million).
pub(super) fn check_percentage(r: &mut Report, at: &Path, percent: &Percent) {
    let value = percent.get();
    if !(0.0..=100.0).contains(&value) || (value > 0.0 && value < 0.0001) {
        r.error(&at.field("value"), format!("percentage {value} must be 0 or in the range 0.0001..=100"));
    }
}

pub(super) fn check_percent_int(r: &mut Report, at: &Path, value: i32) {
    if !(0..=100).contains(&value) {
        r.error(at, format!("percentage {value} is not in range 0..100"));
    }
}

pub(super) fn check_non_negative(r: &mut Report, at: &Path, value: Option<i32>) {
    if let Some(v) = value.filter(|v| *v < 0) {
        r.error(at, format!("{v} must be non-negative"));
    }
}

/// Kubernetes label syntax (Istio's `labels.Instance.Validate`).
pub(super) fn check_labels(r: &mut Report, at: &Path, labels: &Labels) {
    for (key, value) in labels {
        let entry = at.key(key);
        if let Err(e) = check_label_key(key) {
            r.error(&entry, e);
        }
        if !value.is_empty() && !is_qualified_name(value) {
            r.error(&entry, format!("invalid label value {value:?}"));
        }
    }
}

fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.len() > 253 || !prefix.split('.').all(host::is_dns1123_label) {
            return Err(format!("invalid label key {key:?} (bad DNS prefix)"));
        }
    }
    if !is_qualified_name(name) {
        return Err(format!("invalid label key {key:?}"));
    }
    if name.len() > 63 {
        return Err(format!("invalid label key {key:?} (name is too long)"));
    }
    Ok(())
}

/// Alphanumerics, `-`, `_` and `.`, starting and ending alphanumeric.
fn is_qualified_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric() && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// A policy's target (`selector`, or `targetRef(s)`, Istio's
/// validateOneOfSelectorType): the selector's labels checked, a targetRef
/// refused (policies attach to workloads by selector only here).
pub(super) fn check_policy_target(r: &mut Report, at: &Path, selector: Option<&super::common::MatchLabelsSelector>, target_ref: bool, target_refs: bool) {
    if let Some(sel) = selector {
        check_selector_labels(r, &at.field("selector").field("matchLabels"), &sel.match_labels);
    }
    for (field, set) in [("targetRef", target_ref), ("targetRefs", target_refs)] {
        if set {
            r.unsupported_one(&at.field(field), field, "a policy cannot target Gateway API objects in Lodestar: use selector");
        }
    }
}

/// Labels of a workload selector (Istio's `ValidateAlphaWorkloadSelector`):
/// empty keys and wildcards are errors, an empty selector selects the whole
/// namespace, which is allowed but probably a mistake.
pub(super) fn check_selector_labels(r: &mut Report, at: &Path, labels: &Labels) {
    if labels.is_empty() {
        r.warn(at, "workload selector without labels applies to every workload in the namespace");
    }
    for (key, value) in labels {
        if key.is_empty() {
            r.error(at, format!("empty key is not supported in selector: \"={value}\""));
        }
        if key.contains('*') || value.contains('*') {
            r.error(&at.key(key), format!("wildcard is not supported in selector: \"{key}={value}\""));
        }
    }
}

/// `exportTo` entries: `.`, `*`, a namespace, or (ServiceEntry only) `~`.
pub(super) fn check_export_to(r: &mut Report, at: &Path, entries: &[String], allow_none: bool) {
    let mut seen = BTreeSet::new();
    for (i, entry) in entries.iter().enumerate() {
        let entry_at = at.index(i);
        if !seen.insert(entry.as_str()) {
            r.error(&entry_at, format!("duplicate entry {entry:?} in exportTo"));
            continue;
        }
        match entry.as_str() {
            "." | "*" => {}
            "~" if allow_none => {}
            "~" => r.error(&entry_at, "exportTo ~ (none) is only allowed for ServiceEntry"),
            ns if host::is_dns1123_label(ns) => {}
            _ => r.error(&entry_at, format!("invalid exportTo entry {entry:?}: only ., *, or a namespace name is allowed")),
        }
    }
    if entries.len() > 1 {
        if seen.contains("*") {
            r.error(at, "cannot have both public (*) and non-public exportTo values");
        }
        if seen.contains("~") {
            r.error(at, "cannot export to no one (~) and someone");
        }
    }
}

/// Gateway references: `name`, `namespace/name`, the legacy
/// `name.namespace[.svc.cluster.local]`, or the reserved `mesh`.
pub(super) fn check_gateway_names(r: &mut Report, at: &Path, names: &[String]) {
    for (i, name) in names.iter().enumerate() {
        let name_at = at.index(i);
        match name.split_once('/') {
            None => {
                if let Some((gateway, namespace)) = name.split_once('.') {
                    let namespace = namespace.split('.').next().unwrap_or_default();
                    r.warn(&name_at, format!("legacy gateway name format {name:?}; prefer {namespace}/{gateway}"));
                }
                r.check(&name_at, host::check_fqdn(name));
            }
            Some((namespace, gateway)) => {
                if !host::is_dns1123_label(namespace) {
                    r.error(&name_at, format!("invalid namespace {namespace:?} in gateway name"));
                }
                if !host::is_dns1123_label(gateway) {
                    r.error(&name_at, format!("invalid gateway name {gateway:?}"));
                }
            }
        }
    }
}

/// Envoy's (and Istio's) limit: regexes are compiled on every proxy, so
/// very large ones are a denial-of-service risk.
const MAX_REGEX_LEN: usize = 1024;

/// Envoy matches with RE2; the `regex` crate implements nearly the same
/// syntax and, like RE2, rejects backreferences and look-around.
pub(super) fn check_regex(r: &mut Report, at: &Path, pattern: &str) {
    if pattern.len() > MAX_REGEX_LEN {
        r.error(at, format!("regex is too large, max length allowed is {MAX_REGEX_LEN}"));
        return;
    }
    if let Err(e) = regex::Regex::new(pattern) {
        // The parser's message draws a caret diagram over several lines;
        // its last line says what is wrong.
        let message = e.to_string();
        let summary = message.lines().rev().find_map(|l| l.strip_prefix("error: ")).unwrap_or(&message).to_string();
        r.error(at, format!("invalid regex {pattern:?}: {summary} (Istio uses RE2 syntax)"));
    }
}

/// What an empty [`StringMatch`] (no alternative set) means where it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum EmptyMatch {
    /// Header and query-parameter matches: the key must merely be present.
    Presence,
    /// Elsewhere it matches anything, which is almost certainly a mistake.
    Suspicious,
}

pub(super) fn check_string_match(r: &mut Report, at: &Path, m: &StringMatch, empty: EmptyMatch, empty_prefix_ok: bool) {
    match m.count_set() {
        0 if empty == EmptyMatch::Suspicious => r.warn(at, "empty string match matches any value"),
        0 | 1 => {}
        _ => r.error(at, "only one of exact, prefix or regex may be set"),
    }
    if m.prefix.as_deref() == Some("") && !empty_prefix_ok {
        r.error(&at.field("prefix"), "prefix string match should not be empty");
    }
    if let Some(re) = &m.regex {
        if re.is_empty() {
            r.error(&at.field("regex"), "regex string match should not be empty");
        } else {
            check_regex(r, &at.field("regex"), re);
        }
    }
}

/// Header names per RFC 7230 `token`.
pub(super) fn is_header_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// A header value Envoy will accept in a header operation: no control
/// characters except tab, and `%` only as `%%` or around a
/// `%VARIABLE(args)%` substitution (a port of Envoy's header parser, as in
/// Istio's `validateHeaderValue`).
pub(super) fn check_header_value(value: &str) -> Result<(), String> {
    if value.chars().any(|c| c != '\t' && (c.is_ascii_control())) {
        return Err(format!("header value {value:?} contains control characters"));
    }
    #[derive(PartialEq)]
    enum State {
        Literal,
        VariableName,
        ExpectArray,
        ExpectString,
        InString,
        ExpectDelimiterOrEnd,
        ExpectArgsEnd,
        ExpectVariableEnd,
    }
    let bytes = value.as_bytes();
    let mut state = State::Literal;
    let mut pos = 0;
    while pos < bytes.len() {
        let ch = bytes[pos];
        let has_next = pos + 1 < bytes.len();
        match state {
            State::Literal => {
                if ch == b'%' {
                    if !has_next {
                        return Err(format!("header value {value:?}: un-escaped % (write %% for a literal %)"));
                    }
                    if bytes[pos + 1] == b'%' {
                        pos += 1;
                    } else {
                        state = State::VariableName;
                    }
                }
            }
            State::VariableName => match ch {
                b'%' => state = State::Literal,
                b'(' => state = State::ExpectArray,
                _ => {}
            },
            State::ExpectArray => {
                if ch == b'[' {
                    state = State::ExpectString;
                } else if ch != b' ' {
                    state = State::InString;
                }
            }
            State::ExpectDelimiterOrEnd => match ch {
                b',' => state = State::ExpectString,
                b']' => state = State::ExpectArgsEnd,
                b' ' => {}
                _ => return Err(format!("header value {value:?}: expecting ',', ']' or whitespace")),
            },
            State::ExpectString => match ch {
                b'"' => state = State::InString,
                b' ' => {}
                _ => return Err(format!("header value {value:?}: expecting '\"'")),
            },
            State::InString => match ch {
                b'\\' => {
                    if !has_next {
                        return Err(format!("header value {value:?}: un-terminated backslash"));
                    }
                    pos += 1;
                }
                b')' => state = State::ExpectVariableEnd,
                b'"' => state = State::ExpectDelimiterOrEnd,
                _ => {}
            },
            State::ExpectArgsEnd => match ch {
                b')' => state = State::ExpectVariableEnd,
                b' ' => {}
                _ => return Err(format!("header value {value:?}: expecting ')'")),
            },
            State::ExpectVariableEnd => match ch {
                b'%' => state = State::Literal,
                b' ' => {}
                _ => return Err(format!("header value {value:?}: expecting '%'")),
            },
        }
        pos += 1;
    }
    if state != State::Literal {
        return Err(format!("header value {value:?}: un-terminated variable expression"));
    }
    Ok(())
}

/// Unix socket paths as used after `unix://`: absolute, not a directory,
/// or an abstract socket starting with `@`.
pub(super) fn check_unix_address(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("unix address must not be empty".to_string());
    }
    if path.starts_with('@') {
        return Ok(());
    }
    if !path.starts_with('/') || path.ends_with('/') {
        return Err(format!("{path} is not an absolute path to a file"));
    }
    Ok(())
}

/// Port names are DNS labels (they become parts of cluster names).
pub(super) fn check_port_name(name: &str) -> Result<(), String> {
    if host::is_dns1123_label(name) {
        Ok(())
    } else {
        Err(format!("invalid port name {name:?}: must be a DNS label"))
    }
}

/// Tells whether a match kind is a prefix (redirect `prefixRewrite` needs it).
pub(super) fn is_prefix(m: &StringMatch) -> bool {
    matches!(m.kind(), Some(MatchKind::Prefix(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_kind_is_reported() {
        let err = validate("ProxyConfig", &json!({})).unwrap_err();
        assert_eq!(err[0].field, "kind");
        assert!(err[0].reason.contains("unsupported kind"));
    }

    #[test]
    fn null_spec_is_reported() {
        let err = validate("Gateway", &Value::Null).unwrap_err();
        assert_eq!(err, vec![FieldError { field: "spec".into(), reason: "spec is required".into() }]);
    }

    #[test]
    fn a_spec_of_the_wrong_shape_is_reported_at_the_root() {
        let err = validate("Gateway", &json!("gateway")).unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(err[0].field, "spec");
        assert!(err[0].reason.contains("invalid type"), "{err:?}");
    }

    #[test]
    fn structs_written_as_arrays_are_rejected() {
        let err = validate("Gateway", &json!([[]])).unwrap_err();
        assert_eq!(err[0].field, "spec", "{err:?}");
        let spec = json!({"hosts": ["r"], "http": [{"route": [{"destination": ["reviews", "v1"]}]}]});
        let err = validate("VirtualService", &spec).unwrap_err();
        assert_eq!(err.len(), 1, "{err:?}");
        assert_eq!(err[0].field, "spec.http[0].route[0].destination");
        assert!(err[0].reason.contains("expected a mapping"), "{err:?}");
    }

    #[test]
    fn several_structural_errors_are_reported_together() {
        let spec = json!({
            "hosts": ["reviews"],
            "http": [
                {"route": [{"destination": {"host": "reviews"}}], "timout": "1s"},
                {"route": [{"destination": {"host": "reviews", "subset": 5}}]}
            ],
            "exportTo": "."
        });
        let errors = validate("VirtualService", &spec).unwrap_err();
        // Reported in the order serde meets them: JSON object keys sorted.
        let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["spec.exportTo", "spec.http[0].timout", "spec.http[1].route[0].destination.subset"], "{errors:?}");
        assert!(errors[1].reason.contains("unknown field `timout`"));
    }

    #[test]
    fn unknown_fields_are_dropped_and_named_in_warn_mode() {
        let mut spec = json!({
            "hosts": ["reviews"],
            "http": [{"websocketUpgrade": true, "route": [{"destination": {"host": "reviews", "colour": "blue"}}]}],
        });
        let dropped = drop_unknown_fields("VirtualService", &mut spec);
        // In the order serde meets them: JSON object keys sorted.
        assert_eq!(dropped, ["spec.http[0].route[0].destination.colour", "spec.http[0].websocketUpgrade"]);
        assert!(validate("VirtualService", &spec).is_ok(), "{spec}");
        // A wrong type is left for validation to refuse.
        let mut bad = json!({"hosts": "reviews", "extra": 1});
        assert!(drop_unknown_fields("VirtualService", &mut bad).len() <= 1);
        assert!(validate("VirtualService", &bad).is_err());
    }

    #[test]
    fn dropping_a_required_field_does_not_add_noise() {
        let spec = json!({"hosts": ["a"], "http": [{"route": [{"destination": 5}]}]});
        let errors = validate("VirtualService", &spec).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].field, "spec.http[0].route[0].destination");
    }

    #[test]
    fn map_keys_are_quoted_when_needed() {
        let p = Path::root().field("selector");
        assert_eq!(p.key("app").to_string(), "spec.selector.app");
        assert_eq!(p.key("app.kubernetes.io/name").to_string(), r#"spec.selector["app.kubernetes.io/name"]"#);
        assert_eq!(p.key("x-user").to_string(), r#"spec.selector["x-user"]"#);
    }

    #[test]
    fn durations() {
        let mut r = Report::default();
        let at = Path::root();
        check_duration(&mut r, &at, &Duration::new("1ms"));
        check_duration(&mut r, &at, &Duration::new("1.5s"));
        let (errors, _) = std::mem::take(&mut r).into_parts();
        assert!(errors.is_empty(), "{errors:?}");
        check_duration(&mut r, &at, &Duration::new("0s"));
        check_duration(&mut r, &at, &Duration::new("1500us"));
        check_duration(&mut r, &at, &Duration::new("soon"));
        let (errors, _) = r.into_parts();
        assert_eq!(errors.len(), 3);
        assert!(errors[0].reason.contains("at least 1ms"));
        assert!(errors[1].reason.contains("ms precision"));
        assert!(errors[2].reason.contains("invalid duration"));
    }

    #[test]
    fn labels() {
        let mut r = Report::default();
        let labels: Labels = [("app", "reviews"), ("app.kubernetes.io/name", "x"), ("version", ""), ("bad key", "v"), ("ok", "bad value!"), ("-x", "v")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        check_labels(&mut r, &Path::root(), &labels);
        let (errors, _) = r.into_parts();
        assert_eq!(errors.len(), 3, "{errors:?}");
    }

    #[test]
    fn header_values() {
        for ok in ["foo", "%HOSTNAME%", "100%%", "prefix %HOSTNAME% suffix", "%REQ(x-foo)%", "%PER_REQUEST_STATE([\"a\"])%", "tab\there"] {
            assert_eq!(check_header_value(ok), Ok(()), "{ok}");
        }
        for bad in ["abc%123", "%START_TIME%%", "trailing%", "new\nline", "%VAR([\"a\" x])%"] {
            assert!(check_header_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn regexes() {
        let mut r = Report::default();
        check_regex(&mut r, &Path::root(), "^/api/v[0-9]+/.*$");
        check_regex(&mut r, &Path::root(), "(a)\\1");
        check_regex(&mut r, &Path::root(), "(?=x)");
        check_regex(&mut r, &Path::root(), "(unclosed");
        check_regex(&mut r, &Path::root(), &"a".repeat(1025));
        let (errors, _) = r.into_parts();
        assert_eq!(errors.len(), 4, "{errors:?}");
        assert!(errors.iter().all(|e| !e.reason.contains('\n')));
    }

    #[test]
    fn export_to() {
        let mut r = Report::default();
        let to = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        check_export_to(&mut r, &Path::root(), &to(&[".", "istio-system"]), false);
        let (errors, _) = std::mem::take(&mut r).into_parts();
        assert!(errors.is_empty());
        check_export_to(&mut r, &Path::root(), &to(&["~"]), false);
        check_export_to(&mut r, &Path::root(), &to(&["*", "ns"]), false);
        check_export_to(&mut r, &Path::root(), &to(&["ns", "ns"]), false);
        check_export_to(&mut r, &Path::root(), &to(&["Not_A_Namespace"]), false);
        let (errors, _) = std::mem::take(&mut r).into_parts();
        assert_eq!(errors.len(), 4, "{errors:?}");
        check_export_to(&mut r, &Path::root(), &to(&["~"]), true);
        let (errors, _) = r.into_parts();
        assert!(errors.is_empty());
    }
}
