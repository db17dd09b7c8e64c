//! The MeshConfig's `rootNamespace` and `trustDomain` are the server's own
//! settings (`root_namespace`, `trust_domain` in its config file: the mesh
//! CA signs identities of that trust domain, and every replica must agree
//! on both before any object is stored). A MeshConfig may repeat them, as
//! Istio's mesh config files do; a different value is refused here, where
//! the server's settings are known, naming the field.

use crate::error::{Error, FieldError, Result};
use crate::model::Kind;
use crate::store::types::{Op, Txn};
use serde_json::Value;

pub fn check_server_settings(txn: &Txn, root_namespace: &str, trust_domain: &str) -> Result<()> {
    let mut errors = Vec::new();
    for (i, op) in txn.ops.iter().enumerate() {
        let Op::Put { key, body, .. } = op else { continue };
        if key.kind != Kind::MeshConfig {
            continue;
        }
        let body: Value = serde_json::from_str(body).map_err(|e| Error::internal(format!("a validated body does not parse: {e}")))?;
        for (field, server, setting) in [("rootNamespace", root_namespace, "root_namespace"), ("trustDomain", trust_domain, "trust_domain")] {
            match body.pointer(&format!("/spec/{field}")).and_then(Value::as_str) {
                Some(v) if v != server => errors.push(FieldError::new(
                    format!("resources[{i}].spec.{field}"),
                    format!("{v:?} differs from this server's {setting} ({server:?}): it is a server setting (every replica's config file), not changed by a MeshConfig; leave it out or repeat it"),
                )),
                _ => {}
            }
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid_fields(errors))
    }
}
