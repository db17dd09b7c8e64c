//! State-of-the-world ADS: one stream's protocol state.
//!
//! - Every response carries `version_info` = the store revision of the
//!   config it was built from, and a nonce unique on the stream.
//! - A request with the latest nonce for its type is an ACK (no
//!   `error_detail`) or a NACK (with one). A request with an older nonce is
//!   stale and ignored whole: the client sends its full, current request
//!   again when it answers the latest response.
//! - A request with an empty nonce, or the first for its type on this
//!   stream, is a subscription: it always gets a response, even when its
//!   `version_info` says the client already has the content (a reconnect),
//!   because the client waits for a nonce to answer.
//! - CDS and LDS responses carry every resource of the type (absence means
//!   deletion); EDS and RDS carry the requested names that exist.
//! - After that, a type is sent only when what the stream would receive
//!   (names and versions) differs from what it was last sent: a new store
//!   revision that changes nothing for this proxy sends nothing, and a
//!   NACKed response is not resent until its content changes. One
//!   exception: a CDS push is always followed by EDS (see `on_config`).

use super::resources::{ProxyConfig, ResourceMap, ResourceType, XdsResource};
use super::session::{error_text, Received, Subscription};
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Default)]
pub struct SotwStream {
    nonces: u64,
    /// Boxed: see `delta::DeltaStream`.
    types: BTreeMap<ResourceType, Box<TypeState>>,
}

#[derive(Default)]
struct TypeState {
    sub: Subscription,
    /// The resources the latest response carried, in its order (their
    /// names and versions are what later configs are compared with). Shared
    /// with the config they came from, not copied; they stay alive until the
    /// type is next sent.
    sent: Vec<Arc<XdsResource>>,
    sent_version: String,
    /// The latest nonce sent for this type.
    nonce: String,
    /// The map `sent` was taken from, under the current subscription: a
    /// config that still holds this very map (translation shares unchanged
    /// types) cannot differ, so it is not compared name by name.
    synced: Option<Arc<ResourceMap>>,
}

impl SotwStream {
    /// The most names subscribed for one type.
    pub fn most_names(&self) -> usize {
        self.types.values().map(|s| s.sub.names().len()).max().unwrap_or(0)
    }

    /// What every type's subscribed names cost together (see
    /// `session::name_cost`).
    pub fn subscribed_bytes(&self) -> usize {
        self.types.values().map(|s| s.sub.bytes()).sum()
    }

    /// Handle one request against the stream's current config; at most one
    /// response, of the request's type.
    pub fn on_request(&mut self, req: &DiscoveryRequest, config: &ProxyConfig) -> (Received, Option<DiscoveryResponse>) {
        let Some(t) = ResourceType::from_type_url(&req.type_url) else {
            return (Received::UnknownType(req.type_url.clone()), None);
        };
        let received = match self.types.get(&t) {
            // First for this type on this stream: a subscription, whatever
            // nonce it carries (one from an earlier stream means nothing here).
            None => Received::Initial(t),
            Some(_) if req.response_nonce.is_empty() => Received::Initial(t),
            Some(s) if s.nonce != req.response_nonce => return (Received::Stale(t), None),
            Some(s) => match &req.error_detail {
                Some(e) => Received::Nack { t, rejected_version: s.sent_version.clone(), nonce: s.nonce.clone(), error: error_text(e) },
                None => Received::Ack { t, version: s.sent_version.clone() },
            },
        };
        let state = self.types.entry(t).or_default();
        state.sub = Subscription::from_names(t, &req.resource_names);
        state.synced = None;
        let respond = matches!(received, Received::Initial(_)) || self.differs(t, config);
        let response = respond.then(|| self.respond(t, config));
        (received, response)
    }

    /// A new config: responses, in push order, for every subscribed type
    /// whose content for this stream changed. Clusters are always followed
    /// by endpoints: Envoy rebuilds an updated EDS cluster and keeps it
    /// warming until its endpoints arrive again, even unchanged (else until
    /// its initial fetch timeout, 15 s).
    ///
    /// EDS and RDS pushes carry only the resources that changed, unless
    /// their parent type (CDS, LDS) changed in the same round: the xDS
    /// protocol treats those two types incrementally even in SotW (a
    /// resource left out of a response is unchanged, not removed), and an
    /// endpoint change then costs one load assignment, not all of them.
    pub fn on_config(&mut self, config: &ProxyConfig) -> Vec<DiscoveryResponse> {
        let cds_changed = self.differs(ResourceType::Cluster, config);
        let lds_changed = self.differs(ResourceType::Listener, config);
        let changed: Vec<ResourceType> = ResourceType::PUSH_ORDER
            .into_iter()
            .filter(|t| self.differs(*t, config) || (cds_changed && *t == ResourceType::Endpoint && self.types.contains_key(t)))
            .collect();
        changed
            .into_iter()
            .map(|t| {
                let partial = match t {
                    ResourceType::Endpoint => !cds_changed,
                    ResourceType::Route => !lds_changed,
                    _ => false,
                };
                self.respond_with(t, config, partial)
            })
            .collect()
    }

    fn differs(&self, t: ResourceType, config: &ProxyConfig) -> bool {
        let Some(state) = self.types.get(&t) else { return false };
        if state.synced.as_ref().zip(config.resources.get(&t)).is_some_and(|(a, b)| Arc::ptr_eq(a, b)) {
            return false;
        }
        let now = state.sub.select(config.of(t));
        now.len() != state.sent.len() || now.iter().zip(&state.sent).any(|(r, s)| r.name != s.name || r.version != s.version)
    }

    fn respond(&mut self, t: ResourceType, config: &ProxyConfig) -> DiscoveryResponse {
        self.respond_with(t, config, false)
    }

    /// A response of type `t`; `partial`: only the resources whose version
    /// differs from what was last sent (when none was removed).
    fn respond_with(&mut self, t: ResourceType, config: &ProxyConfig, partial: bool) -> DiscoveryResponse {
        self.nonces += 1;
        let nonce = self.nonces.to_string();
        let version = config.revision.to_string();
        let state = self.types.entry(t).or_default();
        let selected = state.sub.select(config.of(t));
        let now: Vec<Arc<XdsResource>> = selected.iter().map(|r| Arc::clone(r)).collect();
        let removed = state.sent.iter().any(|s| !now.iter().any(|n| n.name == s.name));
        let resources = if partial && !removed {
            let before: std::collections::HashMap<&str, &str> = state.sent.iter().map(|s| (&*s.name, s.version.as_str())).collect();
            selected.iter().filter(|r| before.get(&*r.name) != Some(&r.version.as_str())).map(|r| r.any.clone()).collect()
        } else {
            selected.iter().map(|r| r.any.clone()).collect()
        };
        state.sent = now;
        state.synced = config.resources.get(&t).cloned();
        state.sent_version = version.clone();
        state.nonce = nonce.clone();
        DiscoveryResponse { version_info: version, resources, type_url: t.type_url(), nonce, ..Default::default() }
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
        for (name, ms) in clusters {
            let cluster = Cluster { name: name.to_string(), alt_stat_name: format!("v{ms}"), ..Default::default() };
            c.insert(ResourceType::Cluster, XdsResource::new(*name, &cluster));
        }
        for name in endpoints {
            c.insert(ResourceType::Endpoint, XdsResource::new(*name, &ClusterLoadAssignment { cluster_name: name.to_string(), ..Default::default() }));
        }
        c
    }

    fn req(t: ResourceType, names: &[&str], version: &str, nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: t.type_url(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            version_info: version.into(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[test]
    fn subscribe_ack_nack_and_stale() {
        let mut s = SotwStream::default();
        let c1 = config(1, &[("a", 1), ("b", 1)], &["a"]);
        let (rx, resp) = s.on_request(&req(ResourceType::Cluster, &[], "", ""), &c1);
        assert_eq!(rx, Received::Initial(ResourceType::Cluster));
        let resp = resp.unwrap();
        assert_eq!((resp.version_info.as_str(), resp.resources.len()), ("1", 2));

        let (rx, again) = s.on_request(&req(ResourceType::Cluster, &[], "1", &resp.nonce), &c1);
        assert_eq!(rx, Received::Ack { t: ResourceType::Cluster, version: "1".into() });
        assert!(again.is_none(), "an ACK of unchanged content gets no response");

        // EDS by name: only the requested names that exist.
        let (_, eds) = s.on_request(&req(ResourceType::Endpoint, &["a", "b"], "", ""), &c1);
        assert_eq!(eds.unwrap().resources.len(), 1);

        // A change to one cluster: CDS again, then EDS although unchanged
        // (Envoy warms the rebuilt cluster until it gets them), nothing else.
        let c2 = config(2, &[("a", 2), ("b", 1)], &["a"]);
        let pushed = s.on_config(&c2);
        let types = pushed.iter().map(|r| ResourceType::from_type_url(&r.type_url).unwrap()).collect::<Vec<_>>();
        assert_eq!(types, vec![ResourceType::Cluster, ResourceType::Endpoint]);
        assert_eq!(pushed[1].resources.len(), 1);
        let n2 = pushed[0].nonce.clone();

        // A revision that changes nothing for this proxy: nothing is sent.
        assert!(s.on_config(&config(3, &[("a", 2), ("b", 1)], &["a"])).is_empty());

        // The old nonce is stale now.
        let (rx, r) = s.on_request(&req(ResourceType::Cluster, &[], "1", &resp.nonce), &c2);
        assert_eq!((rx, r), (Received::Stale(ResourceType::Cluster), None));

        let mut nack = req(ResourceType::Cluster, &[], "1", &n2);
        nack.error_detail = Some(Status { code: 3, message: "bad cluster a".into(), details: vec![] });
        let (rx, r) = s.on_request(&nack, &c2);
        assert_eq!(rx, Received::Nack { t: ResourceType::Cluster, rejected_version: "2".into(), nonce: n2, error: "bad cluster a".into() });
        assert!(r.is_none(), "a NACKed response is not resent unchanged");
    }

    /// Maps shared with the config last sent are not compared again, and
    /// the endpoints of a changed cluster still follow it.
    #[test]
    fn shared_maps_are_skipped_but_nothing_is_missed() {
        let mut s = SotwStream::default();
        let c1 = config(1, &[("a", 1)], &["a"]);
        let (_, r) = s.on_request(&req(ResourceType::Cluster, &[], "", ""), &c1);
        s.on_request(&req(ResourceType::Cluster, &[], "1", &r.unwrap().nonce), &c1);
        s.on_request(&req(ResourceType::Endpoint, &["a"], "", ""), &c1);
        let mut c2 = c1.clone();
        c2.revision = 2;
        assert!(s.on_config(&c2).is_empty());
        let mut c3 = config(3, &[("a", 2)], &[]);
        c3.resources.insert(ResourceType::Endpoint, c1.resources[&ResourceType::Endpoint].clone());
        let types: Vec<_> = s.on_config(&c3).iter().map(|r| ResourceType::from_type_url(&r.type_url).unwrap()).collect();
        assert_eq!(types, vec![ResourceType::Cluster, ResourceType::Endpoint]);
    }

    #[test]
    fn names_requested_before_they_exist_arrive_later() {
        let mut s = SotwStream::default();
        let c1 = config(1, &[], &[]);
        let (_, r) = s.on_request(&req(ResourceType::Endpoint, &["x"], "", ""), &c1);
        assert_eq!(r.unwrap().resources.len(), 0, "the first request is answered even when nothing exists");
        let pushed = s.on_config(&config(2, &[], &["x", "y"]));
        assert_eq!(pushed.len(), 1);
        assert_eq!(pushed[0].resources.len(), 1, "only the requested name");
    }

    #[test]
    fn subscription_change_with_ack_is_answered() {
        let mut s = SotwStream::default();
        let c = config(5, &[], &["a", "b"]);
        let (_, r) = s.on_request(&req(ResourceType::Endpoint, &["a"], "", ""), &c);
        let n = r.unwrap().nonce;
        let (rx, r) = s.on_request(&req(ResourceType::Endpoint, &["a", "b"], "5", &n), &c);
        assert!(matches!(rx, Received::Ack { .. }));
        assert_eq!(r.unwrap().resources.len(), 2);
    }

    #[test]
    fn reconnect_is_answered_and_pushes_follow_order() {
        let mut s = SotwStream::default();
        let c = config(7, &[("a", 1)], &["a"]);
        // A reconnect: the client has version 7 already, still gets a nonce.
        let (rx, r) = s.on_request(&req(ResourceType::Endpoint, &["a"], "7", ""), &c);
        assert_eq!(rx, Received::Initial(ResourceType::Endpoint));
        assert_eq!(r.unwrap().version_info, "7");
        s.on_request(&req(ResourceType::Cluster, &[], "7", ""), &c);
        let c2 = config(8, &[("a", 2)], &[]);
        let order: Vec<_> = s.on_config(&c2).iter().map(|r| ResourceType::from_type_url(&r.type_url).unwrap()).collect();
        assert_eq!(order, vec![ResourceType::Cluster, ResourceType::Endpoint]);
    }

    #[test]
    fn endpoint_pushes_carry_only_what_changed_unless_clusters_did() {
        let mut s = SotwStream::default();
        let with = |revision: u64, ms: u32, a_endpoints: &str| {
            let mut c = config(revision, &[("a", ms), ("b", 1)], &[]);
            let cla = |name: &str, tag: &str| ClusterLoadAssignment {
                cluster_name: name.to_string(),
                policy: None,
                endpoints: vec![],
                named_endpoints: [(tag.to_string(), Default::default())].into(),
            };
            c.insert(ResourceType::Endpoint, XdsResource::new("a", &cla("a", a_endpoints)));
            c.insert(ResourceType::Endpoint, XdsResource::new("b", &cla("b", "b")));
            c
        };
        let c1 = with(1, 1, "a1");
        let (_, r) = s.on_request(&req(ResourceType::Cluster, &[], "", ""), &c1);
        s.on_request(&req(ResourceType::Cluster, &[], "1", &r.unwrap().nonce), &c1);
        let (_, r) = s.on_request(&req(ResourceType::Endpoint, &["a", "b"], "", ""), &c1);
        assert_eq!(r.as_ref().unwrap().resources.len(), 2);
        s.on_request(&req(ResourceType::Endpoint, &["a", "b"], "1", &r.unwrap().nonce), &c1);
        // Only a's endpoints change: one assignment.
        let pushed = s.on_config(&with(2, 1, "a2"));
        assert_eq!(pushed.len(), 1);
        assert_eq!((pushed[0].resources.len(), pushed[0].version_info.as_str()), (1, "2"));
        // A cluster changes too: every assignment follows it.
        let pushed = s.on_config(&with(3, 2, "a3"));
        let sizes: Vec<usize> = pushed.iter().map(|r| r.resources.len()).collect();
        assert_eq!(sizes, vec![2, 2]);
    }
}
