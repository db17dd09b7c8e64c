//! The workload's registration (`lodestar agent --register SERVICE` or
//! `--workload-group NS/NAME`): what `lodestar lease grant`, `register
//! --lease` and `lease keepalive --every` do, run by the agent for as long
//! as it lives (the Consul client agent's job).
//!
//! - One write creates the Lease and the Instance bound to it (`spec.lease`),
//!   with `serviceAccount` the identity of the agent's certificate.
//! - Keepalives every third of the lease's TTL. A keepalive answered 404
//!   (the lease expired, e.g. after a partition longer than its TTL, or was
//!   revoked) registers both again; so does an Instance found missing.
//! - On a clean stop the lease is revoked: the Instance goes with it in the
//!   same write (`State::plan`), so EDS drops the endpoint.
//!
//! The API calls carry the agent's token: it needs `write` and `delete` on
//! `leases` and `instances` in the workload's namespace (and `read` on
//! `workloadgroups` with `--workload-group`); see ops/README.md.

use anyhow::{anyhow, bail, Result};
use lodestar_client::Client;
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::watch;

/// One API call gives up after this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Retry bounds of the first registration.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Every this many keepalives, check that the Instance is still there.
const CHECK_EVERY: u64 = 3;

pub struct Registration {
    pub client: Client,
    pub namespace: String,
    /// The Lease's name (the Instance's too).
    pub name: String,
    pub lease_ttl: Duration,
    /// The Instance resource (apiVersion, kind, metadata, spec with
    /// `lease` = `name`).
    pub instance: Value,
}

/// The namespace and service account of a SPIFFE id
/// (`spiffe://TRUST_DOMAIN/ns/NS/sa/SA`).
pub fn spiffe_workload(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("spiffe://")?;
    let (_, path) = rest.split_once("/ns/")?;
    let (ns, sa) = path.split_once("/sa/")?;
    (!ns.is_empty() && !sa.is_empty() && !sa.contains('/')).then(|| (ns.to_string(), sa.to_string()))
}

enum Outcome {
    Ok,
    /// 404: the lease (or instance) is gone.
    Gone,
}

impl Registration {
    fn base(&self) -> String {
        format!("/v1/resources/leases/{}/{}", self.namespace, self.name)
    }

    fn documents(&self) -> Value {
        let ttl = format!("{}s", self.lease_ttl.as_secs().max(1));
        let lease = json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Lease",
                           "metadata": {"name": self.name, "namespace": self.namespace}, "spec": {"ttl": ttl}});
        json!({"resources": [lease, self.instance]})
    }

    async fn call<F: std::future::Future<Output = Result<(u16, Value)>>>(f: F) -> Result<(u16, Value)> {
        tokio::time::timeout(CALL_TIMEOUT, f).await.map_err(|_| anyhow!("no answer within {CALL_TIMEOUT:?}"))?
    }

    /// Create (or update) the lease and the instance in one write. A
    /// refusal (400, 401, 403) is returned as fatal, anything else as
    /// retryable.
    async fn register(&self) -> Result<(), (bool, String)> {
        match Self::call(self.client.post_any("/v1/apply", &self.documents())).await {
            Ok((200, body)) => {
                tracing::info!(instance = %self.name, namespace = %self.namespace, revision = %body["revision"], "registered the instance (lease {}s)", self.lease_ttl.as_secs());
                Ok(())
            }
            Ok((status @ (400 | 401 | 403 | 404), body)) => Err((true, lodestar_client::render_error(status, &body))),
            Ok((status, body)) => Err((false, lodestar_client::render_error(status, &body))),
            Err(e) => Err((false, format!("{e:#}"))),
        }
    }

    async fn keepalive(&self) -> Result<Outcome> {
        match Self::call(self.client.post_any(&format!("{}/heartbeat", self.base()), &json!({}))).await? {
            (200, _) => Ok(Outcome::Ok),
            (404, _) => Ok(Outcome::Gone),
            (status, body) => Err(anyhow!(lodestar_client::render_error(status, &body))),
        }
    }

    async fn instance_exists(&self) -> Result<Outcome> {
        let path = format!("/v1/resources/instances/{}/{}?consistency=stale", self.namespace, self.name);
        match Self::call(self.client.get_any(&path)).await? {
            (200, _) => Ok(Outcome::Ok),
            (404, _) => Ok(Outcome::Gone),
            (status, body) => Err(anyhow!(lodestar_client::render_error(status, &body))),
        }
    }

    /// Revoke the lease (and so deregister the instance); a lease already
    /// gone is fine. A few attempts, then give up (it expires anyway).
    pub async fn revoke(&self) {
        for attempt in 1..=3 {
            match Self::call(self.client.delete_any(&self.base())).await {
                Ok((200 | 404, _)) => {
                    tracing::info!(instance = %self.name, namespace = %self.namespace, "revoked the lease: the instance is deregistered");
                    return;
                }
                Ok((status, body)) => tracing::warn!(attempt, "revoking the lease: {}", lodestar_client::render_error(status, &body)),
                Err(e) => tracing::warn!(attempt, "revoking the lease: {e:#}"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        tracing::warn!(instance = %self.name, "could not revoke the lease; it expires within {:?}", self.lease_ttl);
    }

    /// Register (retrying while the API is unreachable; a refusal is an
    /// error), then keep the lease alive until `stop`. Does not revoke:
    /// the caller does, at the right moment of its shutdown.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) -> Result<()> {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.register().await {
                Ok(()) => break,
                Err((true, e)) => bail!("registering {}/{}: {e}", self.namespace, self.name),
                Err((false, e)) => tracing::warn!("registering: {e}; retrying in {backoff:?}"),
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return Ok(()),
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        let every = (self.lease_ttl / 3).max(Duration::from_millis(200));
        let mut sent = 0u64;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return Ok(()),
                _ = tokio::time::sleep(every) => {}
            }
            sent += 1;
            let outcome = match self.keepalive().await {
                Ok(Outcome::Ok) if sent.is_multiple_of(CHECK_EVERY) => self.instance_exists().await,
                other => other,
            };
            match outcome {
                Ok(Outcome::Ok) => {}
                Ok(Outcome::Gone) => {
                    tracing::warn!(instance = %self.name, "the lease or the instance is gone (expired or deleted); registering again");
                    if let Err((_, e)) = self.register().await {
                        tracing::warn!("registering again: {e}; retrying at the next keepalive");
                    }
                }
                Err(e) => tracing::warn!("lease keepalive: {e:#}; retrying in {every:?}"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn spiffe_ids() {
        assert_eq!(super::spiffe_workload("spiffe://cluster.local/ns/shop/sa/web"), Some(("shop".into(), "web".into())));
        assert_eq!(super::spiffe_workload("spiffe://cluster.local/ns//sa/web"), None);
        assert_eq!(super::spiffe_workload("https://x/ns/a/sa/b"), None);
    }
}
