//! What one proxy credential, one source address and one stream may hold
//! on a replica's xDS port, so that no single client takes what the
//! replica-wide limits (`xds_max_streams`, `xds_max_buffered_request_bytes`)
//! share among everyone:
//!
//! - streams per credential (`xds_max_streams_per_credential`) and per
//!   source address (`xds_max_streams_per_source`), counted from
//!   authentication to the stream's end ([`Quotas`]); past either, a new
//!   stream is refused RESOURCE_EXHAUSTED;
//! - a node's metadata size and label count ([`check_node`]): what a stream
//!   keeps of its node (its labels, twice: the identity and `/debug/syncz`)
//!   is bounded before it is parsed;
//! - the NACK text a stream keeps and logs ([`MAX_NACK_TEXT`]), and
//!   how often it logs one ([`NackLog`]);
//! - the names a stream subscribes to, every type together
//!   (`xds_max_subscription_bytes`, checked by the stream task).

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::google::protobuf::value::Kind;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tonic::Status;

/// Longest node id accepted (`TYPE~IP~NAME.NAMESPACE~NAMESPACE.svc.DOMAIN`
/// with a DNS name and namespace is well under 400 bytes).
pub const MAX_NODE_ID: usize = 1024;
/// Largest node metadata accepted, encoded. An Istio pilot-agent's
/// (labels, annotations, platform metadata) is a few KiB.
pub const MAX_NODE_METADATA: usize = 64 * 1024;
/// Most labels a node's `LABELS` may carry (Kubernetes' own recommended
/// labels are a dozen).
pub const MAX_NODE_LABELS: usize = 256;

/// INVALID_ARGUMENT naming the field and the limit if the node is over one;
/// checked before the node is parsed into an identity.
pub fn check_node(node: &Node) -> Result<(), Status> {
    if node.id.len() > MAX_NODE_ID {
        return Err(Status::invalid_argument(format!("node.id: {} bytes is over the limit of {MAX_NODE_ID}", node.id.len())));
    }
    let Some(metadata) = &node.metadata else { return Ok(()) };
    let size = prost::Message::encoded_len(metadata);
    if size > MAX_NODE_METADATA {
        return Err(Status::invalid_argument(format!("node.metadata: {size} bytes is over the limit of {MAX_NODE_METADATA}")));
    }
    let labels = match metadata.fields.get("LABELS").and_then(|v| v.kind.as_ref()) {
        Some(Kind::StructValue(s)) => s.fields.len(),
        _ => 0,
    };
    if labels > MAX_NODE_LABELS {
        return Err(Status::invalid_argument(format!("node.metadata.LABELS: {labels} labels is over the limit of {MAX_NODE_LABELS}")));
    }
    Ok(())
}

/// Why a stream is over a quota (the metric's `reason` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Credential,
    Source,
}

impl Over {
    pub fn reason(self) -> &'static str {
        match self {
            Over::Credential => "credential_quota",
            Over::Source => "source_quota",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Credential(String),
    Source(IpAddr),
}

/// Streams open per credential and per source address on this replica.
pub struct Quotas {
    per_credential: usize,
    per_source: usize,
    /// Only keys with at least one stream: as many entries as streams, at most.
    held: Mutex<HashMap<Key, usize>>,
}

/// One stream's place in its credential's and its source's quota, given
/// back when dropped.
pub struct QuotaPermit {
    quotas: Arc<Quotas>,
    keys: Vec<Key>,
}

impl Drop for QuotaPermit {
    fn drop(&mut self) {
        let mut held = self.quotas.held.lock().unwrap_or_else(|e| e.into_inner());
        for k in &self.keys {
            if let Some(n) = held.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    held.remove(k);
                }
            }
        }
    }
}

impl Quotas {
    /// 0: no limit.
    pub fn new(per_credential: usize, per_source: usize) -> Arc<Quotas> {
        Arc::new(Quotas { per_credential, per_source, held: Mutex::default() })
    }

    /// A place for one more stream of `credential` (None: no credential,
    /// ACLs off) from `source`, or which quota is full (and its limit).
    pub fn admit(self: &Arc<Self>, credential: Option<&str>, source: Option<IpAddr>) -> Result<QuotaPermit, (Over, usize)> {
        let mut keys = Vec::with_capacity(2);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let candidates = [
            (credential.map(|c| Key::Credential(c.to_string())), self.per_credential, Over::Credential),
            (source.map(|ip| Key::Source(canonical(ip))), self.per_source, Over::Source),
        ];
        // A quota of 0 is no limit, and costs no bookkeeping.
        for (key, limit, over) in candidates {
            let Some(key) = key.filter(|_| limit > 0) else { continue };
            if held.get(&key).copied().unwrap_or(0) >= limit {
                return Err((over, limit));
            }
            keys.push(key);
        }
        for k in &keys {
            *held.entry(k.clone()).or_default() += 1;
        }
        drop(held);
        Ok(QuotaPermit { quotas: self.clone(), keys })
    }

    #[cfg(test)]
    fn entries(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

/// The most of a NACK's error text kept (in `/debug/syncz`); the rest is
/// cut, saying how much (`session::error_text`). Envoy lists every rejected
/// resource with its reason, so a real NACK is a few hundred bytes; a
/// client may send megabytes (istiod keeps and logs the whole text:
/// `pkg/xds/server.go`, `LastError`).
pub const MAX_NACK_TEXT: usize = 4096;

/// NACK lines of one stream: one at warn per [`NACK_LOG_INTERVAL`]; the
/// others at debug, counted, and the count said by the next warn line.
pub const NACK_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// The most of a NACK's text a log line carries (the whole kept text, up
/// to [`MAX_NACK_TEXT`], is in `/debug/syncz`).
pub const NACK_LOG_TEXT: usize = 1024;

/// IPv4 clients on a dual-stack socket arrive as ::ffff:a.b.c.d.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[derive(Default)]
pub struct NackLog {
    last: Option<Instant>,
    suppressed: u64,
}

impl NackLog {
    /// Whether this NACK gets a warn line now; if so, how many were left
    /// at debug since the last one.
    pub fn warn(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|l| now.duration_since(l) < NACK_LOG_INTERVAL) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::{Struct, Value};

    fn s(v: &str) -> Value {
        Value { kind: Some(Kind::StringValue(v.into())) }
    }

    #[test]
    fn nodes_over_a_limit_are_refused_naming_it() {
        let labels = |n: usize| Struct { fields: (0..n).map(|i| (format!("l{i}"), s("v"))).collect() };
        let node = |id: &str, n: usize, pad: usize| Node {
            id: id.into(),
            metadata: Some(Struct {
                fields: [("LABELS".to_string(), Value { kind: Some(Kind::StructValue(labels(n))) }), ("PAD".to_string(), s(&"x".repeat(pad)))].into(),
            }),
            ..Default::default()
        };
        assert!(check_node(&node("sidecar~1.2.3.4~a.b~b.svc.cluster.local", MAX_NODE_LABELS, 1000)).is_ok());
        let e = check_node(&node("x", MAX_NODE_LABELS + 1, 0)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("LABELS") && e.message().contains(&MAX_NODE_LABELS.to_string()), "{}", e.message());
        let e = check_node(&node("x", 1, MAX_NODE_METADATA)).unwrap_err();
        assert!(e.message().starts_with("node.metadata:") && e.message().contains(&MAX_NODE_METADATA.to_string()), "{}", e.message());
        let e = check_node(&node(&"x".repeat(MAX_NODE_ID + 1), 0, 0)).unwrap_err();
        assert!(e.message().starts_with("node.id:"), "{}", e.message());
    }

    #[test]
    fn quotas_count_per_credential_and_per_source_and_free_on_drop() {
        let q = Quotas::new(2, 3);
        let (a, b) = ("10.0.0.1".parse().ok(), "10.0.0.2".parse().ok());
        let p1 = q.admit(Some("token:x"), a).unwrap();
        let p2 = q.admit(Some("token:x"), b).unwrap();
        assert_eq!(q.admit(Some("token:x"), b).err(), Some((Over::Credential, 2)));
        // Another credential from the same address, up to the source's limit.
        let p3 = q.admit(Some("token:y"), a).unwrap();
        let _p4 = q.admit(Some("token:z"), a).unwrap();
        assert_eq!(q.admit(Some("token:w"), a).err(), Some((Over::Source, 3)));
        // The mapped form of an address is the same source.
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(q.admit(None, Some(mapped)).err(), Some((Over::Source, 3)));
        drop(p1);
        assert!(q.admit(Some("token:x"), b).is_ok(), "a place is free again");
        drop((p2, p3));
        // No credential (ACLs off): only the source counts.
        let unlimited = Quotas::new(0, 0);
        let held: Vec<_> = (0..100).map(|_| unlimited.admit(None, a).unwrap()).collect();
        drop(held);
        assert_eq!(unlimited.entries(), 0, "entries go with their last stream");
    }

    #[test]
    fn nack_lines_are_rate_limited_and_say_what_they_skipped() {
        let mut log = NackLog::default();
        let t0 = Instant::now();
        assert_eq!(log.warn(t0), Some(0));
        assert_eq!(log.warn(t0 + Duration::from_secs(1)), None);
        assert_eq!(log.warn(t0 + Duration::from_secs(2)), None);
        assert_eq!(log.warn(t0 + NACK_LOG_INTERVAL), Some(2));
        assert_eq!(log.warn(t0 + NACK_LOG_INTERVAL), None);
    }
}
