//! What both ADS variants share: how a request is classified and what a
//! subscription selects. The per-stream protocol state lives in
//! `super::sotw` and `super::delta`; both are pure (no IO, no clock) so
//! they are unit-tested directly, and the server only moves messages.

use super::limits::MAX_NACK_TEXT;
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
    /// that appears later is sent then. Changed through `insert` and
    /// `remove`, which keep `bytes`.
    names: BTreeSet<String>,
    /// What `names` costs, as [`name_cost`] counts it.
    bytes: usize,
}

/// What one subscribed name is counted as against a stream's subscription
/// budget (`xds_max_subscription_bytes`): its bytes, and about what a
/// set entry holding it takes besides (the `String`, the B-tree's share).
pub fn name_cost(name: &str) -> usize {
    name.len() + NAME_OVERHEAD
}

/// See [`name_cost`].
pub const NAME_OVERHEAD: usize = 64;

impl Subscription {
    /// SotW: the request's full name list. An empty list or `*` means
    /// wildcard for the types that allow it (legacy and explicit wildcard).
    pub fn from_names(t: ResourceType, names: &[String]) -> Subscription {
        let wildcard = t.wildcard_allowed() && (names.is_empty() || names.iter().any(|n| n == WILDCARD));
        let mut sub = Subscription { wildcard, ..Default::default() };
        for n in names.iter().filter(|n| !(t.wildcard_allowed() && *n == WILDCARD)) {
            sub.insert(n);
        }
        sub
    }

    /// The explicitly named resources.
    pub fn names(&self) -> &BTreeSet<String> {
        &self.names
    }

    /// What the names cost against the stream's budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Add a name (no-op if present).
    pub fn insert(&mut self, name: &str) {
        if !self.names.contains(name) {
            self.bytes += name_cost(name);
            self.names.insert(name.to_string());
        }
    }

    /// Remove a name (no-op if absent).
    pub fn remove(&mut self, name: &str) {
        if self.names.remove(name) {
            self.bytes -= name_cost(name);
        }
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

/// A `google.rpc.Status` from a NACK, as one line of text of at most
/// [`MAX_NACK_TEXT`] bytes (and a note of what was cut).
pub fn error_text(status: &envoy_types::pb::google::rpc::Status) -> String {
    if status.message.is_empty() {
        format!("(no message, code {})", status.code)
    } else {
        truncated(&status.message, MAX_NACK_TEXT)
    }
}

/// `text` cut to at most `max` bytes at a character boundary, with
/// `… (N more bytes)` when something was cut.
pub fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes)", &text[..end], text.len() - end)
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

    #[test]
    fn subscription_bytes_follow_the_names() {
        let mut s = Subscription::from_names(ResourceType::Endpoint, &["ab".into(), "ab".into(), "c".into()]);
        assert_eq!(s.bytes(), name_cost("ab") + name_cost("c"));
        s.insert("c");
        s.remove("zz");
        assert_eq!(s.bytes(), name_cost("ab") + name_cost("c"));
        s.remove("ab");
        s.remove("c");
        assert_eq!((s.bytes(), s.names().len()), (0, 0));
    }

    #[test]
    fn nack_text_is_cut_at_a_character_boundary() {
        let status = |m: &str| envoy_types::pb::google::rpc::Status { code: 3, message: m.into(), details: vec![] };
        assert_eq!(error_text(&status("short")), "short");
        assert_eq!(error_text(&status("")), "(no message, code 3)");
        let long = "é".repeat(MAX_NACK_TEXT);
        let cut = error_text(&status(&long));
        assert!(cut.len() <= MAX_NACK_TEXT + 40, "{}", cut.len());
        assert!(cut.ends_with(&format!("… ({} more bytes)", long.len() - MAX_NACK_TEXT)), "{}", &cut[cut.len() - 40..]);
    }
}
