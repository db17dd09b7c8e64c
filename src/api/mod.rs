//! Client-facing APIs. `rest` (axum) and `grpc` (tonic) are thin: both turn
//! requests into the calls below and [`Node`](crate::node::Node) methods,
//! and map [`Error`] codes to statuses in one function each.

pub mod grpc;
pub mod rest;

use crate::error::{Error, FieldError, Result};
use crate::model::{self, Kind, ResourceKey, Selector, StoredObject, DEFAULT_NAMESPACE};
use crate::store::types::{ItemResult, Op, Txn, TxnOk};
use crate::store::Applied;
use serde::Serialize;
use serde_json::Value;
use std::sync::Arc;

/// One resource to apply, with an optional optimistic-concurrency check.
#[derive(Debug, Clone)]
pub struct ApplyItem {
    pub resource: Value,
    pub expected_revision: Option<u64>,
}

/// Validate every resource (reporting every bad field of every resource,
/// each path prefixed `resources[i]`) and build one atomic transaction.
pub fn apply_txn(items: Vec<ApplyItem>) -> Result<(Txn, Vec<String>)> {
    if items.is_empty() {
        return Err(Error::field("resources", "no resources given"));
    }
    let mut errors = Vec::new();
    let mut warnings = Vec::new();
    let mut ops = Vec::with_capacity(items.len());
    let mut seen = std::collections::BTreeSet::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("resources[{i}]");
        match model::parse_resource(item.resource, DEFAULT_NAMESPACE) {
            Err(errs) => errors.extend(errs.into_iter().map(|e| e.under(&path))),
            Ok(res) => {
                match model::validate_spec(&res) {
                    Err(errs) => errors.extend(errs.into_iter().map(|e| e.under(&path))),
                    Ok(w) => warnings.extend(w.into_iter().map(|w| format!("{path} ({}): {w}", res.key))),
                }
                if !seen.insert(res.key.clone()) {
                    errors.push(FieldError::new(format!("{path}.metadata.name"), format!("{} appears more than once in this request", res.key)));
                }
                ops.push(Op::Put { body: model::json_text(&res.body).into(), key: res.key, expected_revision: item.expected_revision });
            }
        }
    }
    if errors.is_empty() {
        Ok((Txn { ops }, warnings))
    } else {
        Err(Error::invalid_fields(errors))
    }
}

/// A resource named for deletion.
#[derive(Debug, Clone)]
pub struct DeleteItem {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub expected_revision: Option<u64>,
}

pub fn delete_txn(items: Vec<DeleteItem>, ignore_missing: bool) -> Result<Txn> {
    if items.is_empty() {
        return Err(Error::field("resources", "no resources given"));
    }
    let mut errors = Vec::new();
    let mut ops = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let path = format!("resources[{i}]");
        match key_of(&item.kind, item.namespace.as_deref(), &item.name) {
            Ok(key) => ops.push(Op::Delete { key, expected_revision: item.expected_revision, ignore_missing }),
            Err(e) => errors.extend(e.fields.into_iter().map(|f| f.under(&path))),
        }
    }
    if errors.is_empty() {
        Ok(Txn { ops })
    } else {
        Err(Error::invalid_fields(errors))
    }
}

/// A delete request from whole resource documents (`delete -f`).
pub fn delete_items_from_documents(docs: Vec<Value>) -> Result<Vec<DeleteItem>> {
    let mut errors = Vec::new();
    let mut items = Vec::new();
    for (i, doc) in docs.into_iter().enumerate() {
        let path = format!("resources[{i}]");
        let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        match (s(doc.get("kind")), s(doc.pointer("/metadata/name"))) {
            (Some(kind), Some(name)) => items.push(DeleteItem { kind, name, namespace: s(doc.pointer("/metadata/namespace")), expected_revision: None }),
            (None, _) => errors.push(FieldError::new(format!("{path}.kind"), "required")),
            (_, None) => errors.push(FieldError::new(format!("{path}.metadata.name"), "required")),
        }
    }
    if errors.is_empty() {
        Ok(items)
    } else {
        Err(Error::invalid_fields(errors))
    }
}

pub fn parse_kind(kind: &str) -> Result<Kind> {
    Kind::from_cli_name(kind).ok_or_else(|| Error::field("kind", format!("unknown kind {kind:?}; known kinds: {}", Kind::cli_names_help())))
}

pub fn key_of(kind: &str, namespace: Option<&str>, name: &str) -> Result<ResourceKey> {
    let kind = parse_kind(kind)?;
    let namespace = namespace.filter(|n| !n.is_empty()).unwrap_or(DEFAULT_NAMESPACE);
    model::resource::check_dns_label(namespace).map_err(|r| Error::field("namespace", r))?;
    model::resource::check_dns_subdomain(name).map_err(|r| Error::field("name", r))?;
    Ok(ResourceKey::new(kind, namespace, name))
}

/// The object a heartbeat renews: an Instance (its TTL) or a Lease.
pub fn heartbeat_key(kind: &str, namespace: &str, name: &str) -> Result<ResourceKey> {
    let key = key_of(kind, Some(namespace), name)?;
    if !matches!(key.kind, Kind::Instance | Kind::Lease) {
        return Err(Error::field("kind", format!("only instances and leases take heartbeats, not {}", key.kind.plural())));
    }
    Ok(key)
}

pub fn get(applied: &Applied, key: &ResourceKey) -> Result<Arc<StoredObject>> {
    applied.state.get(key).cloned().ok_or_else(|| Error::not_found(format!("{key} not found")))
}

/// Objects of one kind, optionally in one namespace and matching a selector,
/// in key order.
pub fn list(applied: &Applied, kind: Kind, namespace: Option<&str>, selector: &Selector) -> Vec<Arc<StoredObject>> {
    let namespace = namespace.filter(|n| !n.is_empty());
    let lo = ResourceKey::new(kind, namespace.unwrap_or(""), "");
    applied
        .state
        .objects
        .range(lo..)
        .take_while(|(k, _)| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
        .filter(|(_, o)| selector.is_empty() || selector.matches(&o.labels()))
        .map(|(_, o)| o.clone())
        .collect()
}

pub fn parse_selector(s: Option<&str>) -> Result<Selector> {
    Selector::parse(s.unwrap_or("")).map_err(|e| Error::invalid_fields(vec![e]))
}

/// The JSON shape of a write result, shared by REST and the CLI.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteResult {
    pub revision: u64,
    pub items: Vec<WriteItem>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteItem {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub action: String,
    pub mod_revision: u64,
}

impl WriteResult {
    pub fn new(ok: TxnOk, warnings: Vec<String>) -> Self {
        WriteResult { revision: ok.revision, items: ok.items.into_iter().map(WriteItem::from).collect(), warnings }
    }
}

impl From<ItemResult> for WriteItem {
    fn from(i: ItemResult) -> Self {
        WriteItem {
            kind: i.key.kind.name().to_string(),
            namespace: i.key.namespace.into(),
            name: i.key.name.into(),
            action: i.action.as_str().to_string(),
            mod_revision: i.mod_revision,
        }
    }
}

/// One registry service as `lodestar get services` shows it: declared by a
/// `Service` or implied by its instances, with instance counts by health.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceView {
    pub hostname: String,
    pub namespace: String,
    pub declared: bool,
    pub ports: Vec<String>,
    pub instances: usize,
    pub healthy: usize,
    pub unhealthy: usize,
    pub unknown: usize,
}

/// The registry's services at one snapshot (ServiceEntries excluded).
pub fn registry_services(applied: &Applied, config: &crate::config::ServerConfig, namespace: Option<&str>) -> Vec<ServiceView> {
    use crate::mesh::{Health, Mesh};
    let mesh = Mesh::build(applied, Arc::new(config.mesh_config()));
    mesh.services
        .values()
        .filter(|s| s.sources.iter().any(|(k, _)| matches!(k.kind, Kind::Service | Kind::Instance)))
        .filter(|s| namespace.is_none_or(|ns| ns.is_empty() || s.namespace == ns))
        .map(|s| {
            let count = |h: Health| s.instances.iter().filter(|i| i.health == h).count();
            ServiceView {
                hostname: s.hostname.clone(),
                namespace: s.namespace.clone(),
                declared: s.sources.iter().any(|(k, _)| k.kind == Kind::Service),
                ports: s.ports.iter().map(|p| format!("{}:{}/{:?}", p.name, p.number, p.protocol)).collect(),
                instances: s.instances.len(),
                healthy: count(Health::Healthy),
                unhealthy: count(Health::Unhealthy),
                unknown: count(Health::Unknown),
            }
        })
        .collect()
}
