//! Which workloads are registered on a host: what a host agent may ask
//! certificates for (Istio's node authorizer checks that a pod with the
//! requested service account runs on the caller's node; SPIRE gives a
//! workload entry the node as its parent).
//!
//! A workload `NS/SA` is registered on host `H` when, in namespace `NS`,
//! - a registry Instance has `spec.host: H` and `spec.serviceAccount: SA`, or
//! - a WorkloadEntry has the label [`HOST_LABEL`]`: H` (on the object, in
//!   `metadata.labels`) and `spec.serviceAccount: SA`.
//!
//! Pure: reads one applied state. Looks at the Instances and WorkloadEntries
//! of one namespace (the store is ordered by kind, namespace, name).

use super::{HostId, WorkloadId};
use crate::model::{Kind, ResourceKey, TypedSpec};
use crate::state::State;

/// The label that puts a WorkloadEntry on a host.
pub const HOST_LABEL: &str = "lodestar.io/host";

/// Whether a workload with identity `id` is registered on `host`.
pub fn registered_on(state: &State, host: &HostId, id: &WorkloadId) -> bool {
    let of = |kind: Kind| {
        state
            .objects
            .range(ResourceKey::new(kind, id.namespace.as_str(), "")..)
            .take_while(move |(k, _)| k.kind == kind && k.namespace.as_str() == id.namespace)
            .map(|(_, o)| o)
    };
    let instance = of(Kind::Instance).any(|o| match o.typed().map(|t| t.as_ref()) {
        Ok(TypedSpec::Instance(i)) => i.host.as_deref() == Some(host.0.as_str()) && i.service_account.as_deref() == Some(id.service_account.as_str()),
        _ => false,
    });
    instance
        || of(Kind::WorkloadEntry).any(|o| {
            o.labels().get(HOST_LABEL) == Some(&host.0.as_str())
                && o.spec().get("serviceAccount").and_then(serde_json::Value::as_str) == Some(id.service_account.as_str())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::types::{Op, Txn};
    use serde_json::json;

    fn put(state: &mut State, doc: serde_json::Value) {
        let r = crate::model::parse_resource(doc, "default").unwrap();
        crate::model::validate_spec(&r).unwrap();
        let (res, _) = state.apply_txn(&Txn { ops: vec![Op::Put { body: crate::model::json_text(&r.body).into(), key: r.key, expected_revision: None }] });
        res.unwrap();
    }

    #[test]
    fn instances_and_workload_entries_put_workloads_on_hosts() {
        let mut s = State::default();
        put(
            &mut s,
            json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": "cart-1", "namespace": "shop"},
                   "spec": {"service": "cart", "address": "10.0.0.1", "port": 80, "serviceAccount": "cart", "host": "node-a"}}),
        );
        put(
            &mut s,
            json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry", "metadata": {"name": "pay", "namespace": "bank", "labels": {HOST_LABEL: "node-b"}},
                   "spec": {"address": "10.0.0.2", "serviceAccount": "pay"}}),
        );
        // No host: on no host.
        put(
            &mut s,
            json!({"apiVersion": "registry.lodestar.io/v1", "kind": "Instance", "metadata": {"name": "web-1", "namespace": "shop"},
                   "spec": {"service": "web", "address": "10.0.0.3", "port": 80, "serviceAccount": "web"}}),
        );
        let (a, b) = (HostId::parse("node-a").unwrap(), HostId::parse("node-b").unwrap());
        let id = |s: &str| WorkloadId::parse(s).unwrap();
        assert!(registered_on(&s, &a, &id("shop/cart")));
        assert!(!registered_on(&s, &b, &id("shop/cart")));
        assert!(registered_on(&s, &b, &id("bank/pay")));
        assert!(!registered_on(&s, &a, &id("bank/pay")));
        assert!(!registered_on(&s, &a, &id("shop/web")));
        // Same service account, other namespace.
        assert!(!registered_on(&s, &a, &id("shop2/cart")));
        assert!(!registered_on(&s, &b, &id("shop/pay")));
    }
}
