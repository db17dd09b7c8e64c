//! The domain model: kinds, resources, keys, selectors, typed specs and
//! their validation (Istio, registry, ACL), proxy identity.
//!
//! Invariant: this crate is pure. It knows nothing of sled, openraft, tonic
//! or axum (none is in its dependency tree); everything here is testable
//! with plain values.

pub mod acl;
pub mod diff;
pub mod dns;
pub mod documents;
pub mod envoy_api;
pub mod error;
pub mod gateway_api;
pub mod istio;
pub mod kinds;
pub mod proxy;
pub mod registry;
pub mod resource;
pub mod secret;
pub mod selector;

pub use kinds::Kind;
pub use resource::{json_text, parse_resource, Name, NewResource, ResourceKey, StoredObject, DEFAULT_NAMESPACE};
pub use selector::Selector;

use crate::error::FieldError;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A stored object's spec, typed.
#[derive(Debug, Clone, PartialEq)]
pub enum TypedSpec {
    Istio(istio::Validated),
    Service(registry::ServiceSpec),
    Instance(registry::InstanceSpec),
    Lease(registry::LeaseSpec),
    /// Policy, Role, Token or CertificateRevocation: read by `auth` (and
    /// the mesh CA), never by translation.
    Acl(acl::AclSpec),
    /// A Secret: its body is read whole (`secret::Stored`), by the xDS
    /// layer only; translation names secrets, never reads them.
    Secret,
    /// GatewayClass, Gateway, HTTPRoute or ReferenceGrant: translated into
    /// Istio Gateways and VirtualServices (`translate::gateway_api`).
    GatewayApi(gateway_api::Spec),
    /// A Namespace: its labels (metadata) are what is read.
    Namespace,
}

/// Kind-specific validation of a resource that passed the structural checks.
/// Returns warnings (accepted but not acted upon) or every field error.
pub fn validate_spec(resource: &NewResource) -> Result<Vec<String>, Vec<FieldError>> {
    if resource.key.kind == Kind::Secret {
        return secret::decode(&resource.body).map(|_| secret::warnings(&resource.body));
    }
    if resource.key.kind == Kind::MeshConfig && resource.key.name != istio::mesh_config::MESH_CONFIG_NAME {
        return Err(vec![FieldError::new("metadata.name", format!("a mesh has one MeshConfig, named {:?}", istio::mesh_config::MESH_CONFIG_NAME))]);
    }
    let spec = resource.body.get("spec").unwrap_or(&Value::Null);
    let typed = typed_spec(resource.key.kind, spec)?;
    Ok(match typed {
        TypedSpec::Istio(v) => v.warnings().to_vec(),
        _ => Vec::new(),
    })
}

/// How an apply treats fields a kind does not have: Kubernetes' field
/// validation, whose default (`Warn`, since 1.27) is what `kubectl apply`
/// of Istio's CRDs gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop them, with a warning naming each.
    #[default]
    Warn,
    /// Refuse the resource, naming them.
    Strict,
}

impl FieldValidation {
    /// `Warn` or `Strict` (any case), as kubectl's `--validate` and the
    /// API's `fieldValidation` name them.
    pub fn parse(s: &str) -> Option<FieldValidation> {
        match s.to_ascii_lowercase().as_str() {
            "warn" => Some(FieldValidation::Warn),
            "strict" | "true" => Some(FieldValidation::Strict),
            _ => None,
        }
    }
}

/// In `Warn` mode, drop the fields of an Istio resource's spec that its
/// kind does not have: the paths dropped.
pub fn drop_unknown_fields(resource: &mut NewResource, mode: FieldValidation) -> Vec<String> {
    if mode == FieldValidation::Strict || !resource.key.kind.is_istio() {
        return Vec::new();
    }
    match resource.body.get_mut("spec") {
        Some(spec) => istio::drop_unknown_fields(resource.key.kind.name(), spec),
        None => Vec::new(),
    }
}

fn typed_spec(kind: Kind, spec: &Value) -> Result<TypedSpec, Vec<FieldError>> {
    match kind {
        Kind::Service => registry::validate_service(spec).map(TypedSpec::Service),
        Kind::Instance => registry::validate_instance(spec).map(TypedSpec::Instance),
        Kind::Lease => registry::validate_lease(spec).map(TypedSpec::Lease),
        Kind::Policy | Kind::Role | Kind::Token | Kind::CertificateRevocation => acl::validate(kind, spec).map(TypedSpec::Acl),
        Kind::Secret => Ok(TypedSpec::Secret),
        Kind::Namespace => Ok(TypedSpec::Namespace),
        k if k.is_gateway_api() => gateway_api::validate(k.name(), spec).map(TypedSpec::GatewayApi),
        istio_kind => istio::validate(istio_kind.name(), spec)
            .map(TypedSpec::Istio)
            .map_err(|errs| errs.into_iter().map(|e| FieldError::new(e.field, e.reason)).collect()),
    }
}

/// Parse a stored spec (already validated when written).
pub fn parse_typed(kind: Kind, spec: &Value) -> Result<TypedSpec, String> {
    typed_spec(kind, spec).map_err(|errs| errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))
}

/// Deserialize a spec, naming the failing field by its path under `spec`.
pub fn parse_spec<T: DeserializeOwned>(spec: &Value) -> Result<T, Vec<FieldError>> {
    serde_path_to_error::deserialize(spec).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path.is_empty() { "spec".to_string() } else { format!("spec.{path}") };
        vec![FieldError::new(field, e.into_inner().to_string())]
    })
}
