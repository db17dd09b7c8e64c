//! The domain model: kinds, resources, keys, selectors, validation.
//!
//! Invariant: this module is pure. It knows nothing of sled, openraft, tonic
//! or axum; everything here is testable with plain values.

pub mod documents;
pub mod kinds;
pub mod resource;
pub mod selector;

pub use kinds::Kind;
pub use resource::{parse_resource, NewResource, ResourceKey, StoredObject, DEFAULT_NAMESPACE};
pub use selector::Selector;

use crate::error::FieldError;
use serde_json::Value;

/// Kind-specific validation of a resource that passed the structural checks.
/// Returns warnings (accepted but ignored fields) or every field error.
pub fn validate_spec(resource: &NewResource) -> Result<Vec<String>, Vec<FieldError>> {
    let spec = resource.body.get("spec").unwrap_or(&Value::Null);
    let _ = spec;
    // The typed Istio model and the registry kinds plug in here.
    Ok(Vec::new())
}
