//! What both ADS variants share: how a request is classified and what a
//! subscription selects. The per-stream protocol state lives in
//! `super::sotw` and `super::delta`; both are pure (no IO, no clock) so
//! they are unit-tested directly, and the server only moves messages.

use super::resources::{ResourceMap, ResourceType, XdsResource};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The wildcard resource name (explicit wildcard subscription).
pub const WILDCARD: &str = "*";

/// What a request meant, for the sync registry and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A type URL we do not serve; ignored.
    UnknownType(String),
    /// The first request for this type on the stream (a subscription, or a
    /// reconnect carrying the version the client already has).
    Initial(ResourceType),
    /// Delta only: a subscription change that acknowledges nothing.
    Update(ResourceType),
    /// Its nonce is not the latest one sent for this type: it answers an
    /// older response, so it is neither an ACK nor a NACK of the latest.
    Stale(ResourceType),
    /// The latest response for this type was accepted.
    Ack { t: ResourceType, version: String },
    /// The latest response for this type was rejected.
    Nack { t: ResourceType, rejected_version: String, nonce: String, error: String },
}

/// What a stream asked for, for one type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscription {
    /// Everything of the type (LDS and CDS only).
    pub wildcard: bool,
    /// Explicitly named resources, whether they exist yet or not: a name
    /// that appears later is sent then.
    pub names: BTreeSet<String>,
}

impl Subscription {
    /// SotW: the request's full name list. An empty list or `*` means
    /// wildcard for the types that allow it (legacy and explicit wildcard).
    pub fn from_names(t: ResourceType, names: &[String]) -> Subscription {
        let wildcard = t.wildcard_allowed() && (names.is_empty() || names.iter().any(|n| n == WILDCARD));
        let names = names.iter().filter(|n| !(t.wildcard_allowed() && *n == WILDCARD)).cloned().collect();
        Subscription { wildcard, names }
    }

    /// Whether the named resource, if it exists, belongs to this subscription.
    pub fn wants(&self, name: &str) -> bool {
        self.wildcard || self.names.contains(name)
    }

    /// The existing resources this subscription covers, in name order.
    pub fn select<'a>(&'a self, all: Option<&'a ResourceMap>) -> Vec<&'a Arc<XdsResource>> {
        let Some(all) = all else { return Vec::new() };
        if self.wildcard {
            all.values().collect()
        } else {
            self.names.iter().filter_map(|n| all.get(n)).collect()
        }
    }
}

/// A `google.rpc.Status` from a NACK, as one line of text.
pub fn error_text(status: &envoy_types::pb::google::rpc::Status) -> String {
    if status.message.is_empty() {
        format!("(no message, code {})", status.code)
    } else {
        status.message.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_only_where_allowed() {
        let s = Subscription::from_names(ResourceType::Cluster, &[]);
        assert!(s.wildcard && s.names.is_empty());
        let s = Subscription::from_names(ResourceType::Listener, &["*".into(), "a".into()]);
        assert!(s.wildcard && s.names.len() == 1);
        let s = Subscription::from_names(ResourceType::Cluster, &["a".into()]);
        assert!(!s.wildcard && s.wants("a") && !s.wants("b"));
        let s = Subscription::from_names(ResourceType::Endpoint, &[]);
        assert!(!s.wildcard && !s.wants("a"));
    }
}
