//! Platform adapters: sources outside the API that feed the store, like the
//! registries Pilot aggregates. An adapter is a [`Source`] of desired
//! resources; [`run`] keeps the store in step with it through the same
//! write path as the API (validation, one atomic transaction per change).
//!
//! Ownership: every resource a source writes carries the annotation
//! `lodestar.io/source: NAME`, and a source only ever deletes resources
//! with its own name; resources written through the API are never touched.
//! A Consul catalog or a Kubernetes informer would be another `Source`
//! returning its services as `Service`/`Instance` resources.

pub mod directory;

use crate::api::{apply_txn, ApplyItem};
use crate::error::Error;
use crate::model::{ResourceKey, StoredObject};
use crate::store::types::{Op, Txn};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;
use tokio::sync::watch;

pub const SOURCE_ANNOTATION: &str = "lodestar.io/source";

/// One adapter's view of the world.
#[tonic::async_trait]
pub trait Source: Send + 'static {
    /// Stable name, written in the ownership annotation.
    fn name(&self) -> &str;
    /// Wait until the source may have changed, then return everything it
    /// wants stored now (its whole desired set, not a delta). An error
    /// (a malformed file, say) leaves the store as it is.
    async fn next(&mut self) -> Result<Vec<Value>, String>;
}

/// Keep the store in step with `source` until shutdown.
pub async fn run(replica: Arc<crate::replica::Replica>, mut source: Box<dyn Source>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let desired = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            d = source.next() => d,
        };
        match desired {
            Err(e) => tracing::error!(source = source.name(), error = e, "adapter: not applied; the store keeps the last good state"),
            Ok(docs) => loop {
                match reconcile(&replica, source.name(), docs.clone()).await {
                    Ok(Some(rev)) => tracing::info!(source = source.name(), revision = rev, "adapter: store in step"),
                    Ok(None) => tracing::debug!(source = source.name(), "adapter: nothing to change"),
                    // No leader yet (starting up) or no quorum: try again.
                    Err(e) if e.code == crate::error::Code::Unavailable => {
                        tracing::warn!(source = source.name(), error = %e, "adapter: store unavailable; retrying");
                        tokio::select! {
                            _ = shutdown.wait_for(|s| *s) => return,
                            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => continue,
                        }
                    }
                    Err(e) => tracing::error!(source = source.name(), error = %e, "adapter: not applied; the store keeps the last good state"),
                }
                break;
            },
        }
    }
}

fn owned_by(obj: &StoredObject, source: &str) -> bool {
    obj.body().pointer("/metadata/annotations").and_then(|a| a.get(SOURCE_ANNOTATION)).and_then(Value::as_str) == Some(source)
}

/// One atomic write that makes the source's resources exactly `docs`:
/// puts for every document, deletes for what it owned and no longer
/// lists. `None` when nothing changed.
pub async fn reconcile(replica: &crate::replica::Replica, source: &str, docs: Vec<Value>) -> Result<Option<u64>, Error> {
    let node = &replica.node;
    let items = docs
        .into_iter()
        .map(|mut d| {
            if let Some(meta) = d.get_mut("metadata").and_then(Value::as_object_mut) {
                let ann = meta.entry("annotations").or_insert_with(|| json!({}));
                if let Some(ann) = ann.as_object_mut() {
                    ann.insert(SOURCE_ANNOTATION.into(), json!(source));
                }
            }
            ApplyItem { resource: d, expected_revision: None }
        })
        .collect::<Vec<_>>();
    let current = node.read(crate::node::Consistency::Linearizable).await?;
    let (mut ops, desired): (Vec<Op>, BTreeSet<ResourceKey>) = if items.is_empty() {
        (Vec::new(), BTreeSet::new())
    } else {
        let (mut txn, _warnings) = apply_txn(items, crate::model::FieldValidation::Strict)?;
        // A trusted source, but no namespace's object attaches to another's
        // hostnames (`mesh::hosts`), whoever writes it.
        let suffix = &replica.config.domain_suffix;
        crate::api::owned_hostnames(&crate::api::hostname_claims(&txn, suffix)?, suffix)?;
        // Secrets' keys sealed; unchanged ones keep their stored envelope.
        crate::secrets::seal_txn(replica.secrets.as_deref(), &mut txn, &current)?;
        let keys = txn.ops.iter().filter_map(|o| o.key().cloned()).collect();
        (txn.ops, keys)
    };
    // Puts that change nothing are dropped, so an unchanged scan is no write.
    ops.retain(|op| match op {
        Op::Put { key, body, .. } => match current.state.get(key) {
            Some(cur) => serde_json::from_str::<Value>(body).ok().as_ref() != Some(&strip_status(cur.body())),
            None => true,
        },
        _ => true,
    });
    for (key, obj) in current.state.objects.iter() {
        // global-management records the ACL bootstrap: never deleted (`api::delete_txn`).
        let bootstrap_record = key.kind == crate::model::Kind::Policy && key.name == crate::model::acl::GLOBAL_MANAGEMENT;
        if owned_by(obj, source) && !desired.contains(key) && !bootstrap_record {
            ops.push(Op::Delete { key: key.clone(), expected_revision: None, ignore_missing: true });
        }
    }
    if ops.is_empty() {
        return Ok(None);
    }
    let ok = node.write(Txn { ops }).await?;
    Ok(Some(ok.revision))
}

fn strip_status(body: &Value) -> Value {
    let mut b = body.clone();
    if let Some(o) = b.as_object_mut() {
        o.remove("status");
    }
    b
}
