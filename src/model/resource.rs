//! Resources in the Kubernetes/Istio shape, their keys, and the structural
//! checks every write passes before it is proposed to raft.

use super::kinds::Kind;
use super::TypedSpec;
use crate::error::FieldError;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, OnceLock};

pub const DEFAULT_NAMESPACE: &str = "default";

/// Identifies one stored object. Ordered by kind, then namespace, then name,
/// which is also the order of every listing.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ResourceKey {
    pub kind: Kind,
    pub namespace: Name,
    pub name: Name,
}

impl ResourceKey {
    pub fn new(kind: Kind, namespace: impl Into<Name>, name: impl Into<Name>) -> Self {
        ResourceKey { kind, namespace: namespace.into(), name: name.into() }
    }
}

/// A namespace or object name: an immutable string that is cheap to clone.
/// The store's map copies whole B-tree nodes of keys on every write
/// (copy-on-write), so key clones are on the write path. Encodes exactly as
/// a `String` (serde and bincode).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Name(Arc<str>);

impl Name {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Self {
        Name(s.into())
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name(s.into())
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Self {
        Name(s.as_str().into())
    }
}

impl From<&Name> for Name {
    fn from(s: &Name) -> Self {
        s.clone()
    }
}

impl From<Name> for String {
    fn from(n: Name) -> Self {
        n.0.to_string()
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        **self == *other.0
    }
}

impl PartialEq<Name> for str {
    fn eq(&self, other: &Name) -> bool {
        *self == *other.0
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        **self == *other.0
    }
}

impl fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.kind.plural(), self.namespace, self.name)
    }
}

/// Metadata fields the server owns. They are dropped from input (so the output
/// of `get -o yaml` can be applied again) and written on output.
const SERVER_METADATA: &[&str] = &[
    "resourceVersion",
    "creationRevision",
    "modRevision",
    "generation",
    "uid",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

/// A resource that passed the structural checks: the body is normalised
/// (metadata.namespace set, server-owned fields and `status` removed).
#[derive(Debug, Clone, PartialEq)]
pub struct NewResource {
    pub key: ResourceKey,
    pub body: Value,
}

/// An object as the store holds it.
#[derive(Debug, Clone)]
pub struct StoredObject {
    pub key: ResourceKey,
    /// Revision at which the object was created (etcd's create_revision).
    pub create_revision: u64,
    /// Revision of the last change (etcd's mod_revision); `resourceVersion`.
    pub mod_revision: u64,
    /// How many times it was written since creation (etcd's version).
    pub version: u64,
    /// The normalised body as applied, without server-owned fields, as
    /// JSON text. serde_json keeps object keys sorted, so the text of a
    /// value is canonical: equal bodies have equal texts.
    text: Arc<str>,
    /// The body parsed, on first use: a write stores the text it carries
    /// without parsing it on every replica (most objects are only ever
    /// read again typed, or as text).
    body: OnceLock<Value>,
    /// Whether the body has a `status` (registry health).
    status: bool,
    /// The typed spec, parsed on first use and shared by every revision
    /// that still holds this object (translation reads it, not the JSON).
    typed: OnceLock<Result<Arc<TypedSpec>, String>>,
}

impl PartialEq for StoredObject {
    fn eq(&self, other: &Self) -> bool {
        (&self.key, self.create_revision, self.mod_revision, self.version, &self.text)
            == (&other.key, other.create_revision, other.mod_revision, other.version, &other.text)
    }
}

/// `Eq` lets `Arc<StoredObject>` compare by pointer first (std's fast
/// path), which is what diffing two revisions' maps mostly meets.
impl Eq for StoredObject {}

/// The compact JSON text of a value: the same bytes as its `Display`
/// (`to_string`), written straight into a buffer by `serde_json::to_string`
/// rather than through `fmt`'s adapter, which made up a tenth of validating
/// a write (`cargo bench --bench apply`).
pub fn json_text(value: &Value) -> String {
    // A `Value`'s map keys are strings: serializing it cannot fail.
    serde_json::to_string(value).expect("a JSON value serializes")
}

impl StoredObject {
    pub fn new(key: ResourceKey, create_revision: u64, mod_revision: u64, version: u64, body: Value) -> Self {
        let (text, status) = (Arc::from(json_text(&body)), body.get("status").is_some());
        StoredObject { key, create_revision, mod_revision, version, text, body: OnceLock::from(body), status, typed: OnceLock::new() }
    }

    /// An object from the canonical JSON text of a body without `status`
    /// (a normalised resource as `apply` writes it), parsed on first use.
    pub fn from_text(key: ResourceKey, create_revision: u64, mod_revision: u64, version: u64, text: Arc<str>) -> Self {
        StoredObject { key, create_revision, mod_revision, version, text, body: OnceLock::new(), status: false, typed: OnceLock::new() }
    }

    /// An object from the canonical JSON text the store wrote
    /// (`StoredObject::text`), parsed on first use like [`Self::from_text`]:
    /// a restarted replica holds its objects as text, as one that applied
    /// them does (parsed up front, 100,000 VirtualServices took 1.2 GB
    /// more; issue 33). The text is checked to be JSON here, without
    /// keeping what is parsed.
    pub fn from_stored_text(key: ResourceKey, create_revision: u64, mod_revision: u64, version: u64, text: Arc<str>) -> Result<Self, serde_json::Error> {
        /// Only whether the body has a `status`; the rest is skipped.
        #[derive(serde::Deserialize)]
        struct Probe {
            status: Option<serde::de::IgnoredAny>,
        }
        let status = serde_json::from_str::<Probe>(&text)?.status.is_some();
        Ok(StoredObject { key, create_revision, mod_revision, version, text, body: OnceLock::new(), status, typed: OnceLock::new() })
    }

    /// The body. Text that is not JSON (data from an incompatible version)
    /// reads as null, whose typed spec then fails and says so.
    pub fn body(&self) -> &Value {
        self.body.get_or_init(|| serde_json::from_str(&self.text).unwrap_or(Value::Null))
    }

    /// The body as canonical JSON text.
    pub fn text(&self) -> &Arc<str> {
        &self.text
    }

    pub fn has_status(&self) -> bool {
        self.status
    }

    /// This object with `body`, which differs from its own only in
    /// `status` (`Op::Status`), at `mod_revision`: the typed spec (parsed
    /// from `spec` alone) is shared, not parsed again.
    pub fn with_status(&self, mod_revision: u64, body: Value) -> Self {
        let mut object = StoredObject::new(self.key.clone(), self.create_revision, mod_revision, self.version, body);
        object.typed = self.typed.clone();
        object
    }

    /// Whether `new` is `old` with only its status written by `Op::Status`
    /// (the store's status write that keeps the generation): the same
    /// object (create revision) at the same version. Every spec write
    /// bumps the version, so this is exact. Translation never reads such
    /// a status, so it skips these changes (no translation, no push).
    pub fn status_only_change(old: &StoredObject, new: &StoredObject) -> bool {
        old.key == new.key && old.create_revision == new.create_revision && old.version == new.version
    }

    /// The spec as its typed model. Stored objects passed validation when
    /// they were written, so an error here means data from an incompatible
    /// version; callers skip such objects and report the message.
    pub fn typed(&self) -> Result<&Arc<TypedSpec>, &str> {
        self.typed.get_or_init(|| super::parse_typed(self.key.kind, self.spec()).map(Arc::new)).as_ref().map_err(|e| e.as_str())
    }

    pub fn labels(&self) -> BTreeMap<&str, &str> {
        labels_of(self.body())
    }

    pub fn spec(&self) -> &Value {
        self.body().get("spec").unwrap_or(&Value::Null)
    }

    /// One annotation's value (`metadata.annotations[name]`).
    pub fn annotation(&self, name: &str) -> Option<&str> {
        self.body().get("metadata")?.get("annotations")?.get(name)?.as_str()
    }

    /// The object as clients see it: the body plus the server's metadata.
    /// A Token's secret hash and a Secret's sealed key are left out: every read path (get, list,
    /// watch, REST and gRPC) renders objects here, and none may show it.
    pub fn to_json(&self) -> Value {
        let mut out = self.body().clone();
        if self.key.kind == Kind::Secret {
            super::secret::redact(&mut out);
        }
        if self.key.kind == Kind::Token {
            if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
                spec.remove(super::acl::SECRET_HASH_FIELD);
            }
        }
        if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(self.mod_revision.to_string()));
            meta.insert("creationRevision".into(), Value::from(self.create_revision));
            meta.insert("modRevision".into(), Value::from(self.mod_revision));
            meta.insert("generation".into(), Value::from(self.version));
        }
        out
    }

    /// [`to_json`](Self::to_json)'s JSON, serialized straight from the
    /// stored body: a list of ten thousand objects copies and frees no
    /// tree (that was most of a list's time). Secrets and Tokens, which
    /// leave fields out, go through `to_json`.
    pub fn json_view(&self) -> JsonView<'_> {
        JsonView(self)
    }
}

/// See [`StoredObject::json_view`].
pub struct JsonView<'a>(&'a StoredObject);

impl Serialize for JsonView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let o = self.0;
        let body = match o.body() {
            Value::Object(body) if !matches!(o.key.kind, Kind::Secret | Kind::Token) => body,
            _ => return o.to_json().serialize(s),
        };
        let mut map = s.serialize_map(Some(body.len()))?;
        for (k, v) in body {
            match v {
                Value::Object(meta) if k == "metadata" => map.serialize_entry(k, &MetaView(meta, o))?,
                _ => map.serialize_entry(k, v)?,
            }
        }
        map.end()
    }
}

/// An object's metadata with the server's four fields merged in, in the
/// sorted key order `to_json`'s map gives them.
struct MetaView<'a>(&'a Map<String, Value>, &'a StoredObject);

impl Serialize for MetaView<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let MetaView(meta, o) = *self;
        let version = o.mod_revision.to_string();
        let server: [(&str, Value); 4] = [
            ("creationRevision", o.create_revision.into()),
            ("generation", o.version.into()),
            ("modRevision", o.mod_revision.into()),
            ("resourceVersion", Value::String(version)),
        ];
        let mut extra = server.iter().peekable();
        let mut map = s.serialize_map(None)?;
        for (k, v) in meta.iter().filter(|(k, _)| !server.iter().any(|(n, _)| n == k)) {
            while let Some((n, x)) = extra.next_if(|(n, _)| *n < k.as_str()) {
                map.serialize_entry(n, x)?;
            }
            map.serialize_entry(k, v)?;
        }
        for (n, x) in extra {
            map.serialize_entry(n, x)?;
        }
        map.end()
    }
}

pub fn labels_of(body: &Value) -> BTreeMap<&str, &str> {
    body.get("metadata")
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
        .map(|l| l.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.as_str(), v))).collect())
        .unwrap_or_default()
}

/// Structural checks (kind, apiVersion, metadata, spec shape) and
/// normalisation. `path` prefixes every field error, e.g. `resources[3]`.
/// Deep, kind-specific validation is `model::validate_spec`.
pub fn parse_resource(value: Value, default_namespace: &str) -> Result<NewResource, Vec<FieldError>> {
    let mut errors = Vec::new();
    let Value::Object(mut obj) = value else {
        return Err(vec![FieldError::new("", format!("expected an object, got {}", type_name(&value)))]);
    };

    // A Secret has Kubernetes' shape: no spec, its content at the top.
    let secret = obj.get("kind").and_then(Value::as_str) == Some(Kind::Secret.name());
    for key in obj.keys() {
        let known = match key.as_str() {
            "apiVersion" | "kind" | "metadata" | "status" => true,
            "spec" => !secret,
            "type" | "data" | "stringData" | "immutable" | super::secret::SEALED_FIELD => secret,
            _ => false,
        };
        if !known {
            let expected = if secret { "apiVersion, kind, metadata, type, data, stringData" } else { "apiVersion, kind, metadata, spec" };
            errors.push(FieldError::new(key.clone(), format!("unknown field (expected {expected})")));
        }
    }
    // Status is written by controllers, never by users; exported YAML may carry it.
    obj.remove("status");

    let kind = match obj.get("kind") {
        None => {
            errors.push(FieldError::new("kind", "required"));
            None
        }
        Some(Value::String(s)) => match Kind::from_kind_and_api_version(s, obj.get("apiVersion").and_then(Value::as_str)) {
            Some(k) => Some(k),
            None => {
                let hint = Kind::from_cli_name(s).map(|k| format!(" (did you mean {k}?)")).unwrap_or_default();
                errors.push(FieldError::new("kind", format!("unknown kind {s:?}{hint}")));
                None
            }
        },
        Some(other) => {
            errors.push(FieldError::new("kind", format!("expected a string, got {}", type_name(other))));
            None
        }
    };

    match obj.get("apiVersion") {
        None => errors.push(FieldError::new("apiVersion", "required")),
        Some(Value::String(s)) => {
            if let Some(kind) = kind.filter(|k| k.group().is_empty()) {
                // Kubernetes' core group: the bare version (`v1`).
                if !kind.versions().contains(&s.as_str()) {
                    errors.push(FieldError::new("apiVersion", format!("{s:?} is not a valid apiVersion for {kind}: use {}", kind.versions().join(", "))));
                }
            } else if let Some(kind) = kind {
                match s.split_once('/') {
                    Some((group, version)) if group == kind.group() => {
                        if !kind.versions().contains(&version) {
                            errors.push(FieldError::new(
                                "apiVersion",
                                format!("version {version:?} is not served for {kind}; use one of {}", kind.versions().join(", ")),
                            ));
                        }
                    }
                    _ => errors.push(FieldError::new("apiVersion", format!("{s:?} is not a valid apiVersion for {kind}: the group must be {}", kind.group()))),
                }
            }
        }
        Some(other) => errors.push(FieldError::new("apiVersion", format!("expected a string, got {}", type_name(other)))),
    }

    let mut key = None;
    // Cluster-scoped kinds (ACL) always live in one namespace.
    let cluster_scoped = kind.filter(|k| k.is_cluster_scoped());
    let default_namespace = cluster_scoped.map_or(default_namespace, |k| k.default_namespace());
    match obj.get_mut("metadata") {
        None => errors.push(FieldError::new("metadata", "required")),
        Some(Value::Object(meta)) => {
            if let Some((name, namespace)) = check_metadata(meta, default_namespace, &mut errors) {
                match (kind, cluster_scoped) {
                    (Some(k), Some(_)) if namespace != default_namespace => errors.push(FieldError::new(
                        "metadata.namespace",
                        format!("{k} is cluster-scoped: leave the namespace out (it is always {default_namespace})"),
                    )),
                    (Some(kind), _) => key = Some(ResourceKey { kind, namespace: namespace.into(), name: name.into() }),
                    (None, _) => {}
                }
            }
        }
        Some(other) => errors.push(FieldError::new("metadata", format!("expected an object, got {}", type_name(other)))),
    }

    match obj.get("spec") {
        None if secret || kind == Some(Kind::Namespace) => {}
        None => errors.push(FieldError::new("spec", "required")),
        Some(Value::Object(_)) => {}
        Some(other) => errors.push(FieldError::new("spec", format!("expected an object, got {}", type_name(other)))),
    }

    match (errors.is_empty(), key) {
        (true, Some(key)) => Ok(NewResource { key, body: Value::Object(obj) }),
        _ => Err(errors),
    }
}

/// Returns (name, namespace) when both are valid; normalises the map.
fn check_metadata(meta: &mut Map<String, Value>, default_namespace: &str, errors: &mut Vec<FieldError>) -> Option<(String, String)> {
    for f in SERVER_METADATA {
        meta.remove(*f);
    }
    for key in meta.keys() {
        if !matches!(key.as_str(), "name" | "namespace" | "labels" | "annotations") {
            errors.push(FieldError::new(format!("metadata.{key}"), "unknown or unsupported field (expected name, namespace, labels, annotations)"));
        }
    }
    let name = match meta.get("name") {
        None => {
            errors.push(FieldError::new("metadata.name", "required"));
            None
        }
        Some(Value::String(n)) => match check_dns_subdomain(n) {
            Ok(()) => Some(n.clone()),
            Err(reason) => {
                errors.push(FieldError::new("metadata.name", reason));
                None
            }
        },
        Some(other) => {
            errors.push(FieldError::new("metadata.name", format!("expected a string, got {}", type_name(other))));
            None
        }
    };
    let namespace = match meta.get("namespace") {
        None | Some(Value::Null) => Some(default_namespace.to_string()),
        Some(Value::String(ns)) => match check_dns_label(ns) {
            Ok(()) => Some(ns.clone()),
            Err(reason) => {
                errors.push(FieldError::new("metadata.namespace", reason));
                None
            }
        },
        Some(other) => {
            errors.push(FieldError::new("metadata.namespace", format!("expected a string, got {}", type_name(other))));
            None
        }
    };
    if let Some(ns) = &namespace {
        meta.insert("namespace".into(), Value::String(ns.clone()));
    }
    for field in ["labels", "annotations"] {
        match meta.get(field) {
            None => {}
            Some(Value::Object(map)) => {
                for (k, v) in map {
                    let path = format!("metadata.{field}.{k}");
                    if let Err(reason) = check_label_key(k) {
                        errors.push(FieldError::new(path.clone(), reason));
                    }
                    match v {
                        Value::String(s) if field == "labels" => {
                            if let Err(reason) = check_label_value(s) {
                                errors.push(FieldError::new(path, reason));
                            }
                        }
                        Value::String(_) => {}
                        other => errors.push(FieldError::new(path, format!("expected a string, got {}", type_name(other)))),
                    }
                }
            }
            Some(other) => errors.push(FieldError::new(format!("metadata.{field}"), format!("expected a map of strings, got {}", type_name(other)))),
        }
    }
    Some((name?, namespace?))
}

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// RFC 1123 label, as Kubernetes checks namespaces.
pub fn check_dns_label(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 63 {
        return Err(format!("{s:?} must be 1 to 63 characters"));
    }
    let ok = s.chars().all(|c| is_alnum(c) || c == '-') && s.starts_with(is_alnum) && s.ends_with(is_alnum);
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} must consist of lower case alphanumeric characters or '-', and start and end with an alphanumeric character"))
    }
}

/// RFC 1123 subdomain, as Kubernetes checks object names.
pub fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 253 {
        return Err(format!("{s:?} must be 1 to 253 characters"));
    }
    let ok = s.chars().all(|c| is_alnum(c) || c == '-' || c == '.') && s.starts_with(is_alnum) && s.ends_with(is_alnum);
    if ok {
        Ok(())
    } else {
        Err(format!("{s:?} must consist of lower case alphanumeric characters, '-' or '.', and start and end with an alphanumeric character"))
    }
}

fn check_label_name(s: &str) -> bool {
    let an = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty() && s.len() <= 63 && s.chars().all(|c| an(c) || matches!(c, '-' | '_' | '.')) && s.starts_with(an) && s.ends_with(an)
}

pub fn check_label_key(k: &str) -> Result<(), String> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix {
        check_dns_subdomain(p).map_err(|e| format!("key prefix {e}"))?;
    }
    if check_label_name(name) {
        Ok(())
    } else {
        Err(format!("key {k:?} must be at most 63 characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric, with an optional DNS prefix and '/'"))
    }
}

pub fn check_label_value(v: &str) -> Result<(), String> {
    if v.is_empty() || check_label_name(v) {
        Ok(())
    } else {
        Err(format!("value {v:?} must be empty or at most 63 characters of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A stored object read back keeps its body as text until it is read:
    /// a restarted replica's memory is that of one that applied the objects.
    #[test]
    fn an_object_read_from_the_store_is_parsed_on_first_use() {
        let key = ResourceKey::new(Kind::Instance, "default", "a-1");
        let body = json!({"kind": "Instance", "metadata": {"name": "a-1"}, "spec": {"service": "a"}, "status": {"health": "Healthy"}});
        let text: Arc<str> = Arc::from(json_text(&body));
        let o = StoredObject::from_stored_text(key.clone(), 1, 2, 1, text.clone()).unwrap();
        assert!(o.body.get().is_none(), "not parsed yet");
        assert!(o.has_status());
        assert_eq!(o, StoredObject::new(key.clone(), 1, 2, 1, body.clone()), "the same object as one built from its body");
        assert_eq!(o.body(), &body);
        let plain = StoredObject::from_stored_text(key.clone(), 1, 2, 1, Arc::from(r#"{"kind":"Instance","spec":{}}"#)).unwrap();
        assert!(!plain.has_status());
        assert!(StoredObject::from_stored_text(key, 1, 2, 1, Arc::from("{not json")).is_err());
    }

    /// The list path's serializer writes what `to_json` gives, byte for
    /// byte: metadata keys before, between and after the server's four,
    /// a body without metadata, and the kinds that leave fields out.
    #[test]
    fn json_view_writes_what_to_json_gives() {
        let bodies = [
            (
                Kind::VirtualService,
                json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
                "metadata": {"annotations": {"a": "b"}, "labels": {"app": "r"}, "name": "r", "namespace": "default", "uid": "x", "zz": 1},
                "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}}),
            ),
            (Kind::VirtualService, json!({"kind": "VirtualService", "metadata": {}, "spec": {}})),
            (Kind::VirtualService, json!({"kind": "VirtualService", "spec": {}})),
            (
                Kind::Instance,
                json!({"kind": "Instance", "metadata": {"name": "i", "namespace": "n", "modRevision": 7}, "spec": {"service": "a"}, "status": {"health": "Healthy"}}),
            ),
            (Kind::Token, json!({"kind": "Token", "metadata": {"name": "t"}, "spec": {super::super::acl::SECRET_HASH_FIELD: "h", "policies": ["p"]}})),
        ];
        for (kind, body) in bodies {
            let o = StoredObject::new(ResourceKey::new(kind, "default", "x"), 3, 12, 4, body);
            assert_eq!(serde_json::to_string(&o.json_view()).unwrap(), serde_json::to_string(&o.to_json()).unwrap(), "{kind:?}");
        }
    }

    fn vs() -> Value {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
               "metadata": {"name": "reviews", "labels": {"app": "reviews"}},
               "spec": {"hosts": ["reviews"]}})
    }

    #[test]
    fn accepts_and_normalises() {
        let mut v = vs();
        v["metadata"]["resourceVersion"] = json!("7");
        v["status"] = json!({"x": 1});
        let r = parse_resource(v, "default").unwrap();
        assert_eq!(r.key, ResourceKey::new(Kind::VirtualService, "default", "reviews"));
        assert_eq!(r.body["metadata"]["namespace"], "default");
        assert!(r.body["metadata"].get("resourceVersion").is_none());
        assert!(r.body.get("status").is_none());
    }

    #[test]
    fn names_the_field() {
        let cases = [
            (json!({"apiVersion": "networking.istio.io/v1", "metadata": {"name": "a"}, "spec": {}}), "kind", "required"),
            (json!({"apiVersion": "networking.istio.io/v1", "kind": "Pod", "metadata": {"name": "a"}, "spec": {}}), "kind", "unknown kind"),
            (
                json!({"apiVersion": "apps/v1", "kind": "VirtualService", "metadata": {"name": "a"}, "spec": {}}),
                "apiVersion",
                "group must be networking.istio.io",
            ),
            (json!({"apiVersion": "networking.istio.io/v2", "kind": "VirtualService", "metadata": {"name": "a"}, "spec": {}}), "apiVersion", "not served"),
            (json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {}, "spec": {}}), "metadata.name", "required"),
            (
                json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "Bad_Name"}, "spec": {}}),
                "metadata.name",
                "lower case",
            ),
            (
                json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "a", "labels": {"x": 3}}, "spec": {}}),
                "metadata.labels.x",
                "expected a string",
            ),
            (json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "a"}, "spec": []}), "spec", "expected an object"),
            (
                json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService", "metadata": {"name": "a"}, "spec": {}, "extra": 1}),
                "extra",
                "unknown field",
            ),
        ];
        for (input, field, reason) in cases {
            let errs = parse_resource(input.clone(), "default").unwrap_err();
            assert!(errs.iter().any(|e| e.field == field && e.reason.contains(reason)), "{input}: {errs:?}");
        }
    }

    #[test]
    fn output_carries_revisions() {
        let r = parse_resource(vs(), "default").unwrap();
        let o = StoredObject::new(r.key, 3, 9, 2, r.body);
        let j = o.to_json();
        assert_eq!(j["metadata"]["resourceVersion"], "9");
        assert_eq!(j["metadata"]["creationRevision"], 3);
        assert_eq!(o.labels().get("app"), Some(&"reviews"));
    }
}
