//! Incremental (delta) ADS: one stream's protocol state.
//!
//! The server keeps, per type, what it believes the client has (name →
//! version) and sends only the difference: resources whose version changed
//! or that are new to the client, and `removed_resources` for names the
//! client has that no longer exist (or left a wildcard subscription).
//!
//! - The first request for a type opens the subscription: an empty
//!   `resource_names_subscribe` or `*` means wildcard (LDS, CDS), and
//!   `initial_resource_versions` is what the client kept from an earlier
//!   stream, so a reconnect receives only what differs. It always gets a
//!   response, so the client's initial fetch completes.
//! - Later requests change the subscription (`resource_names_subscribe`,
//!   `resource_names_unsubscribe`) and/or ACK/NACK the latest response by
//!   its nonce. Subscription changes apply even when the nonce is stale:
//!   they are deltas, dropping one would leave both sides disagreeing.
//! - A newly subscribed name that does not exist is answered in
//!   `removed_resources` (the protocol's "does not exist"), once; it is sent
//!   when it appears.
//! - A NACKed response is not resent: the server still counts its resources
//!   as the client's, so only a later change sends them again.
//! - `system_version_info` is the store revision the response was built from.

use super::resources::{ProxyConfig, ResourceMap, ResourceType};
use super::session::{error_text, Received, Subscription, WILDCARD};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Boxed per type: a map node holds room for 11 entries, and thousands of
/// idle streams each hold one.
#[derive(Default)]
pub struct DeltaStream {
    nonces: u64,
    types: BTreeMap<ResourceType, Box<TypeState>>,
}

/// A version as the stream remembers it: a 64-bit hash of its text (only
/// ever compared for equality, and an idle stream holds one per resource).
fn version_key(v: &str) -> u64 {
    super::resources::fnv1a(v.as_bytes())
}

#[derive(Default)]
struct TypeState {
    sub: Subscription,
    /// What the client has, as far as we know: name → version (hashed).
    /// Names are the resources' own (`Arc`), not copies.
    known: BTreeMap<Arc<str>, u64>,
    sent_version: String,
    /// The latest nonce sent for this type ("" before the first response).
    nonce: String,
    /// The map `known` was last brought in line with. A config that still
    /// holds this very map (translation shares unchanged types) has nothing
    /// new for the client, so the diff is skipped. Cleared whenever `known`
    /// or `sub` change otherwise.
    synced: Option<Arc<ResourceMap>>,
}

impl DeltaStream {
    /// The most names subscribed for one type (delta subscriptions
    /// accumulate over requests).
    pub fn most_names(&self) -> usize {
        self.types.values().map(|s| s.sub.names().len()).max().unwrap_or(0)
    }

    /// What every type's subscribed names cost together (see
    /// `session::name_cost`).
    pub fn subscribed_bytes(&self) -> usize {
        self.types.values().map(|s| s.sub.bytes()).sum()
    }

    pub fn on_request(&mut self, req: &DeltaDiscoveryRequest, config: &ProxyConfig) -> (Received, Option<DeltaDiscoveryResponse>) {
        let Some(t) = ResourceType::from_type_url(&req.type_url) else {
            return (Received::UnknownType(req.type_url.clone()), None);
        };
        let Some(state) = self.types.get_mut(&t) else {
            let sub = Subscription::from_names(t, &req.resource_names_subscribe);
            // What the client kept is only its business if it is subscribed.
            let known =
                req.initial_resource_versions.iter().filter(|(name, _)| sub.wants(name)).map(|(n, v)| (Arc::from(n.as_str()), version_key(v))).collect();
            let newly: BTreeSet<String> = sub.names().clone();
            self.types.insert(t, Box::new(TypeState { sub, known, ..Default::default() }));
            let response = self.diff(t, config, &newly, true);
            return (Received::Initial(t), response);
        };

        let received = if req.response_nonce.is_empty() {
            Received::Update(t)
        } else if req.response_nonce != state.nonce {
            Received::Stale(t)
        } else {
            match &req.error_detail {
                Some(e) => Received::Nack { t, rejected_version: state.sent_version.clone(), nonce: state.nonce.clone(), error: error_text(e) },
                None => Received::Ack { t, version: state.sent_version.clone() },
            }
        };
        state.synced = None;

        for name in &req.resource_names_unsubscribe {
            if name == WILDCARD && t.wildcard_allowed() {
                state.sub.wildcard = false;
                // The client drops what only the wildcard gave it.
                let names = state.sub.names();
                state.known.retain(|k, _| names.contains(&**k));
            } else {
                state.sub.remove(name);
                if !state.sub.wildcard {
                    state.known.remove(name.as_str());
                }
            }
        }
        let mut newly = BTreeSet::new();
        for name in &req.resource_names_subscribe {
            if name == WILDCARD && t.wildcard_allowed() {
                state.sub.wildcard = true;
            } else {
                state.sub.insert(name);
                // The client asks for it now: send it even if we believe it
                // has it (a re-subscription after an unsubscribe, or a retry).
                state.known.remove(name.as_str());
                newly.insert(name.clone());
            }
        }
        let response = self.diff(t, config, &newly, false);
        (received, response)
    }

    /// A new config: responses, in push order, with what changed per type.
    /// The endpoints of every cluster sent are sent again, even unchanged:
    /// Envoy rebuilds an updated EDS cluster and keeps it warming until its
    /// endpoints arrive (else until its initial fetch timeout, 15 s).
    pub fn on_config(&mut self, config: &ProxyConfig) -> Vec<DeltaDiscoveryResponse> {
        let subscribed: Vec<ResourceType> = ResourceType::PUSH_ORDER.into_iter().filter(|t| self.types.contains_key(t)).collect();
        let mut out = Vec::new();
        for t in subscribed {
            let Some(r) = self.diff(t, config, &BTreeSet::new(), false) else { continue };
            if t == ResourceType::Cluster {
                if let Some(eds) = self.types.get_mut(&ResourceType::Endpoint) {
                    for c in &r.resources {
                        eds.known.remove(c.name.as_str());
                    }
                    eds.synced = None;
                }
            }
            out.push(r);
        }
        out
    }

    /// The response that brings the client from `known` to the config, or
    /// None when there is nothing to say (unless `always`).
    fn diff(&mut self, t: ResourceType, config: &ProxyConfig, newly: &BTreeSet<String>, always: bool) -> Option<DeltaDiscoveryResponse> {
        let state = self.types.get_mut(&t)?;
        let map = config.resources.get(&t);
        if !always && newly.is_empty() && state.synced.as_ref().zip(map).is_some_and(|(a, b)| Arc::ptr_eq(a, b)) {
            return None;
        }
        state.synced = map.cloned();
        let all = config.of(t);
        let desired = state.sub.select(all);
        let changed: Vec<_> = desired.into_iter().filter(|r| state.known.get(&r.name) != Some(&version_key(&r.version))).collect();
        let exists = |name: &str| all.is_some_and(|a| a.contains_key(name));
        let mut removed: BTreeSet<String> = state.known.keys().filter(|k| !(state.sub.wants(k) && exists(k))).map(|k| k.to_string()).collect();
        removed.extend(newly.iter().filter(|n| !exists(n)).cloned());
        if changed.is_empty() && removed.is_empty() && !always {
            return None;
        }
        for r in &changed {
            state.known.insert(r.name.clone(), version_key(&r.version));
        }
        for name in &removed {
            state.known.remove(name.as_str());
        }
        self.nonces += 1;
        state.nonce = self.nonces.to_string();
        state.sent_version = config.revision.to_string();
        Some(DeltaDiscoveryResponse {
            system_version_info: state.sent_version.clone(),
            resources: changed
                .iter()
                .map(|r| Resource { name: r.name.to_string(), version: r.version.clone(), resource: Some(r.any.clone()), ..Default::default() })
                .collect(),
            type_url: t.type_url(),
            removed_resources: removed.into_iter().collect(),
            nonce: state.nonce.clone(),
            ..Default::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::resources::XdsResource;
    use envoy_types::pb::envoy::config::cluster::v3::Cluster;
    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use envoy_types::pb::google::rpc::Status;

    fn config(revision: u64, clusters: &[(&str, u32)], endpoints: &[&str]) -> ProxyConfig {
        let mut c = ProxyConfig { revision, ..Default::default() };
        for (name, v) in clusters {
            let cluster = Cluster { name: name.to_string(), alt_stat_name: format!("v{v}"), ..Default::default() };
            c.insert(ResourceType::Cluster, XdsResource::new(*name, &cluster));
        }
        for name in endpoints {
            c.insert(ResourceType::Endpoint, XdsResource::new(*name, &ClusterLoadAssignment { cluster_name: name.to_string(), ..Default::default() }));
        }
        c
    }

    fn req(t: ResourceType, sub: &[&str], unsub: &[&str], nonce: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: t.type_url(),
            resource_names_subscribe: sub.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|s| s.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    fn names(r: &DeltaDiscoveryResponse) -> Vec<&str> {
        r.resources.iter().map(|r| r.name.as_str()).collect()
    }

    #[test]
    fn wildcard_changes_and_removals() {
        let mut s = DeltaStream::default();
        let c1 = config(1, &[("a", 1), ("b", 1)], &[]);
        let (rx, r) = s.on_request(&req(ResourceType::Cluster, &[], &[], ""), &c1);
        assert_eq!(rx, Received::Initial(ResourceType::Cluster));
        let r = r.unwrap();
        assert_eq!((names(&r), r.system_version_info.as_str()), (vec!["a", "b"], "1"));
        let (rx, none) = s.on_request(&req(ResourceType::Cluster, &[], &[], &r.nonce), &c1);
        assert_eq!((rx, none), (Received::Ack { t: ResourceType::Cluster, version: "1".into() }, None));

        // a changes, b goes, c comes: only those.
        let pushed = s.on_config(&config(2, &[("a", 2), ("c", 1)], &[]));
        assert_eq!(pushed.len(), 1);
        assert_eq!((names(&pushed[0]), pushed[0].removed_resources.clone()), (vec!["a", "c"], vec!["b".to_string()]));
        assert!(s.on_config(&config(3, &[("a", 2), ("c", 1)], &[])).is_empty(), "nothing changed for this proxy");

        let mut nack = req(ResourceType::Cluster, &[], &[], &pushed[0].nonce);
        nack.error_detail = Some(Status { code: 3, message: "no".into(), details: vec![] });
        let (rx, r) = s.on_request(&nack, &config(3, &[("a", 2), ("c", 1)], &[]));
        assert!(matches!(rx, Received::Nack { ref rejected_version, .. } if rejected_version == "2"));
        assert!(r.is_none());
    }

    /// Translation shares unchanged maps between configs: such a type is
    /// skipped without a diff, and what the skip must not hide is still
    /// sent (endpoints after their clusters, a subscription change).
    #[test]
    fn shared_maps_are_skipped_but_nothing_is_missed() {
        let mut s = DeltaStream::default();
        let c1 = config(1, &[("a", 1)], &["a"]);
        for (t, sub) in [(ResourceType::Cluster, "*"), (ResourceType::Endpoint, "a")] {
            let (_, r) = s.on_request(&req(t, &[sub], &[], ""), &c1);
            let nonce = r.unwrap().nonce;
            s.on_request(&req(t, &[], &[], &nonce), &c1);
        }
        // The same maps at a newer revision: nothing to say.
        let mut c2 = c1.clone();
        c2.revision = 2;
        assert!(s.on_config(&c2).is_empty());
        // Clusters change, endpoints are the very same map: both are sent.
        let mut c3 = config(3, &[("a", 2)], &[]);
        c3.resources.insert(ResourceType::Endpoint, c1.resources[&ResourceType::Endpoint].clone());
        let pushed = s.on_config(&c3);
        assert_eq!(
            pushed.iter().map(|r| (r.type_url.clone(), names(r))).collect::<Vec<_>>(),
            vec![(ResourceType::Cluster.type_url(), vec!["a"]), (ResourceType::Endpoint.type_url(), vec!["a"]),]
        );
        // Unsubscribing and subscribing again over the same map re-sends it.
        let (_, r) = s.on_request(&req(ResourceType::Endpoint, &[], &["a"], &pushed[1].nonce), &c3);
        assert!(r.is_none());
        let (_, r) = s.on_request(&req(ResourceType::Endpoint, &["a"], &[], ""), &c3);
        assert_eq!(names(&r.unwrap()), vec!["a"]);
    }

    #[test]
    fn reconnect_sends_only_what_differs() {
        let mut s = DeltaStream::default();
        let c = config(4, &[("a", 1), ("b", 2)], &[]);
        let mut first = req(ResourceType::Cluster, &["*"], &[], "");
        let a_version = c.of(ResourceType::Cluster).unwrap()["a"].version.clone();
        first.initial_resource_versions = [("a".to_string(), a_version), ("b".to_string(), "old".to_string()), ("gone".to_string(), "x".to_string())].into();
        let (_, r) = s.on_request(&first, &c);
        let r = r.unwrap();
        assert_eq!(names(&r), vec!["b"]);
        assert_eq!(r.removed_resources, vec!["gone".to_string()]);
    }

    #[test]
    fn named_subscriptions() {
        let mut s = DeltaStream::default();
        let c1 = config(1, &[], &["x"]);
        // "y" does not exist: answered as removed, then sent when it appears.
        let (_, r) = s.on_request(&req(ResourceType::Endpoint, &["x", "y"], &[], ""), &c1);
        let r = r.unwrap();
        assert_eq!((names(&r), r.removed_resources.clone()), (vec!["x"], vec!["y".to_string()]));
        let pushed = s.on_config(&config(2, &[], &["x", "y", "z"]));
        assert_eq!((names(&pushed[0]), pushed[0].removed_resources.len()), (vec!["y"], 0));

        // Unsubscribe x: nothing sent; x then disappearing sends nothing either.
        let (rx, r) = s.on_request(&req(ResourceType::Endpoint, &[], &["x"], ""), &config(2, &[], &["x", "y", "z"]));
        assert_eq!((rx, r), (Received::Update(ResourceType::Endpoint), None));
        assert!(s.on_config(&config(3, &[], &["y", "z"])).is_empty());

        // Subscribe z with a stale nonce: the subscription still counts.
        let (rx, r) = s.on_request(&req(ResourceType::Endpoint, &["z"], &[], "0"), &config(3, &[], &["y", "z"]));
        assert_eq!(rx, Received::Stale(ResourceType::Endpoint));
        assert_eq!(names(&r.unwrap()), vec!["z"]);

        // y removed from the config: removed_resources.
        let pushed = s.on_config(&config(4, &[], &["z"]));
        assert_eq!(pushed[0].removed_resources, vec!["y".to_string()]);
    }

    #[test]
    fn push_order_is_make_before_break() {
        let mut s = DeltaStream::default();
        let c1 = config(1, &[], &[]);
        s.on_request(&req(ResourceType::Endpoint, &["a"], &[], ""), &c1);
        s.on_request(&req(ResourceType::Cluster, &[], &[], ""), &c1);
        let order: Vec<_> = s.on_config(&config(2, &[("a", 1)], &["a"])).iter().map(|r| ResourceType::from_type_url(&r.type_url).unwrap()).collect();
        assert_eq!(order, vec![ResourceType::Cluster, ResourceType::Endpoint]);
    }

    #[test]
    fn an_updated_cluster_gets_its_endpoints_again() {
        let mut s = DeltaStream::default();
        let c1 = config(1, &[("a", 1), ("b", 1)], &["a", "b"]);
        s.on_request(&req(ResourceType::Cluster, &[], &[], ""), &c1);
        s.on_request(&req(ResourceType::Endpoint, &["a", "b"], &[], ""), &c1);
        // Only cluster a changes; its unchanged endpoints follow it, b's do not.
        let pushed = s.on_config(&config(2, &[("a", 2), ("b", 1)], &["a", "b"]));
        let got: Vec<_> = pushed.iter().map(|r| (ResourceType::from_type_url(&r.type_url).unwrap(), names(r))).collect();
        assert_eq!(got, vec![(ResourceType::Cluster, vec!["a"]), (ResourceType::Endpoint, vec!["a"])]);
    }
}
