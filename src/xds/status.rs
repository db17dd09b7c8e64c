//! Who is connected and how far each proxy is in sync: per stream, per
//! resource type, the last response sent, the last ACK and the last NACK.
//! Shared by every ADS stream of a replica and served as JSON at
//! `GET /debug/syncz`. Only connected proxies are listed: an entry lives as
//! long as its stream.

use super::resources::ResourceType;
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// The registry: cheap to clone, one per replica.
#[derive(Clone, Default)]
pub struct SyncRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    next_stream: AtomicU64,
    streams: Mutex<BTreeMap<u64, ProxyStatus>>,
    /// Per stream: notified to ask the stream to close (rebalancing).
    closers: Mutex<BTreeMap<u64, Arc<tokio::sync::Notify>>>,
    /// Per stream: who is on it (what a dry-run translates for).
    identities: Mutex<BTreeMap<u64, ProxyIdentity>>,
    /// Per stream: the config it serves (`/debug/config_dump`).
    configs: Mutex<BTreeMap<u64, Arc<super::resources::ProxyConfig>>>,
    /// The last streams refused for their credentials or their quotas,
    /// newest last.
    refused: Mutex<std::collections::VecDeque<Refused>>,
    /// Every NACK as it arrives, for `GET /v1/nacks` (nobody listening:
    /// dropped).
    nacks: NackBus,
    /// The last NACKs, newest last, whether their proxy is still
    /// connected or not (`GET /v1/nacks/recent`).
    recent_nacks: Mutex<std::collections::VecDeque<NackEvent>>,
    /// (pushed, to): the revisions after `pushed` up to `to` changed only
    /// statuses, so every config at them is the one at `pushed`
    /// (`push::debounce` skips them).
    same_config: Mutex<(u64, u64)>,
}

/// A proxy rejected a response: the event `GET /v1/nacks` streams.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NackEvent {
    /// NAME.NAMESPACE, as `lodestar wait --proxy` names it.
    pub proxy: String,
    /// The node id as the proxy sent it.
    pub id: String,
    #[serde(rename = "type")]
    pub type_short: &'static str,
    /// The version (store revision) it rejected.
    pub rejected_version: String,
    /// Envoy's error detail (at most `limits::MAX_NACK_TEXT` bytes).
    pub error: String,
    pub at_unix_ms: u64,
}

/// Events buffered for a slow listener before it is told it missed some.
const NACK_BUFFER: usize = 256;

/// NACKs kept for `GET /v1/nacks/recent` (the oldest dropped first).
const RECENT_NACKS_KEPT: usize = 256;

struct NackBus(tokio::sync::broadcast::Sender<NackEvent>);

impl Default for NackBus {
    fn default() -> Self {
        NackBus(tokio::sync::broadcast::channel(NACK_BUFFER).0)
    }
}

/// Refused streams kept for `/debug/syncz`.
const REFUSED_KEPT: usize = 32;

/// A stream refused for its credentials (unauthenticated, or a proxy
/// claiming an identity its credential is not for), or because its
/// credential or source address has its quota of streams open.
#[derive(Debug, Clone, Serialize)]
pub struct Refused {
    /// Unix milliseconds.
    pub at_ms: u64,
    pub remote: Option<String>,
    /// The node id it claimed; none when refused before its first request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// `token:<accessor>`, `identity:<id>`, `anonymous`, `unknown-token`.
    pub who: String,
    /// `unauthenticated`, `permission_denied` or `resource_exhausted`.
    pub code: &'static str,
    pub reason: String,
}

/// Which ADS variant a stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// State of the world (`StreamAggregatedResources`).
    Sotw,
    /// Incremental (`DeltaAggregatedResources`).
    Delta,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Sotw => "sotw",
            Protocol::Delta => "delta",
        }
    }
}

/// One connected proxy (one ADS stream).
#[derive(Debug, Clone, Serialize)]
pub struct ProxyStatus {
    /// Unique per replica run; a reconnecting proxy gets a new one.
    pub stream: u64,
    /// The node id as the proxy sent it.
    pub id: String,
    pub kind: &'static str,
    pub ip: String,
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub protocol: Protocol,
    pub connected_at_unix_ms: u64,
    /// The store revision of the config this stream currently serves from.
    pub revision: Option<u64>,
    /// The revision whose changes have all been sent on this stream (a
    /// push round completed): with every type ACKed, the proxy has it.
    #[serde(default)]
    pub pushed_revision: Option<u64>,
    /// The last generation failure (the stream keeps serving the previous
    /// config); cleared by the next success.
    pub generate_error: Option<String>,
    /// By short type name (`CDS`, `EDS`, `LDS`, `RDS`).
    /// Boxed: a map node holds room for 11 entries, and every stream has one.
    pub types: BTreeMap<&'static str, Box<TypeStatus>>,
    /// Set when the server asked this stream to close (and why).
    pub closing: Option<String>,
}

/// One resource type on one stream.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TypeStatus {
    /// The last response sent: its version (store revision), nonce, how many
    /// resources it carried (delta: changed ones) and how many it removed.
    pub sent_version: Option<String>,
    pub sent_nonce: Option<String>,
    pub sent_resources: usize,
    pub sent_removed: usize,
    pub sent_at_unix_ms: Option<u64>,
    /// Responses of this type sent on this stream (the push record).
    pub pushes: u64,
    /// The version the proxy last accepted (an ACK of our latest response).
    pub acked_version: Option<String>,
    pub acked_at_unix_ms: Option<u64>,
    /// The last rejection, kept after later ACKs so it can be inspected.
    pub last_nack: Option<Nack>,
    /// Sent, and the latest response is ACKed.
    pub in_sync: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Nack {
    /// The version that was rejected (the response the NACK answers).
    pub rejected_version: String,
    pub nonce: String,
    pub error: String,
    pub at_unix_ms: u64,
}

/// Everything, as `/debug/syncz` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SyncStatus {
    pub proxies: Vec<ProxyStatus>,
    /// The last streams refused for their credentials or quotas (at most 32).
    pub refused: Vec<Refused>,
}

/// Where one proxy stands with respect to a revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Convergence {
    /// Has it: every response for it (or a newer one) sent and ACKed.
    Synced,
    /// Not yet.
    Pending,
    /// Rejected the latest response of a type: (type, error).
    Nacked(String, String),
}

impl ProxyStatus {
    /// Whether this proxy has ACKed `revision` or newer. A proxy the
    /// revision does not affect gets no response for it, and counts as
    /// synced once its stream has moved to it.
    ///
    /// A NACK of the latest response rejects `revision` only once the
    /// stream has moved to it (or the rejected version is that new): a
    /// NACK of an older revision, before this one reached the proxy, says
    /// nothing yet about this one (the proxy may well accept it).
    pub fn convergence(&self, revision: u64) -> Convergence {
        let moved = self.pushed_revision.is_some_and(|r| r >= revision);
        for (t, ts) in &self.types {
            if let (Some(n), Some(sent)) = (&ts.last_nack, &ts.sent_nonce) {
                if &n.nonce == sent && (moved || n.rejected_version.parse::<u64>().is_ok_and(|v| v >= revision)) {
                    return Convergence::Nacked(t.to_string(), n.error.clone());
                }
            }
        }
        let acked = !self.types.is_empty() && self.types.values().all(|t| t.in_sync || t.sent_nonce.is_none());
        if moved && acked {
            Convergence::Synced
        } else {
            Convergence::Pending
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn kind_name(kind: ProxyKind) -> &'static str {
    match kind {
        ProxyKind::Sidecar => "sidecar",
        ProxyKind::Router => "router",
        ProxyKind::Grpc => "grpc",
    }
}

impl SyncRegistry {
    pub fn new() -> SyncRegistry {
        SyncRegistry::default()
    }

    /// The NACKs received since `since_unix_ms` (at most the last
    /// [`RECENT_NACKS_KEPT`]), oldest first.
    pub fn recent_nacks(&self, since_unix_ms: u64) -> Vec<NackEvent> {
        let recent = self.inner.recent_nacks.lock().unwrap_or_else(|e| e.into_inner());
        recent.iter().filter(|e| e.at_unix_ms >= since_unix_ms).cloned().collect()
    }

    /// Every NACK from now on, as it arrives.
    pub fn subscribe_nacks(&self) -> tokio::sync::broadcast::Receiver<NackEvent> {
        self.inner.nacks.0.subscribe()
    }

    /// Revisions after `pushed` up to `to` changed only statuses: no push.
    pub fn same_config(&self, pushed: u64, to: u64) {
        *self.inner.same_config.lock().unwrap_or_else(|e| e.into_inner()) = (pushed, to);
    }

    /// The revision whose configs are those at `revision`: the last one
    /// pushed before it if it changed only statuses, else itself.
    pub fn config_revision(&self, revision: u64) -> u64 {
        match *self.inner.same_config.lock().unwrap_or_else(|e| e.into_inner()) {
            (pushed, to) if pushed < revision && revision <= to => pushed,
            _ => revision,
        }
    }

    fn streams(&self) -> MutexGuard<'_, BTreeMap<u64, ProxyStatus>> {
        // A panic while holding the lock leaves plain data behind: keep going.
        self.inner.streams.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Register a new stream; the entry is removed when the handle drops.
    pub fn connect(&self, identity: &ProxyIdentity, protocol: Protocol) -> StreamHandle {
        let stream = self.inner.next_stream.fetch_add(1, Ordering::Relaxed) + 1;
        let status = ProxyStatus {
            stream,
            id: identity.id.clone(),
            kind: kind_name(identity.kind),
            ip: identity.ip.clone(),
            name: identity.name.clone(),
            namespace: identity.namespace.clone(),
            labels: identity.labels.clone(),
            protocol,
            connected_at_unix_ms: now_ms(),
            revision: None,
            pushed_revision: None,
            generate_error: None,
            types: BTreeMap::new(),
            closing: None,
        };
        self.streams().insert(stream, status);
        self.inner.identities.lock().unwrap_or_else(|e| e.into_inner()).insert(stream, identity.clone());
        crate::metrics::metrics().xds_connected.inc();
        let close = Arc::new(tokio::sync::Notify::new());
        self.inner.closers.lock().unwrap_or_else(|e| e.into_inner()).insert(stream, close.clone());
        StreamHandle { registry: self.clone(), stream, close }
    }

    /// Ask the `n` longest-connected streams to close (they end with
    /// UNAVAILABLE and their Envoys reconnect, to another replica as the
    /// bootstrap's round robin picks). Returns the streams asked.
    pub fn shed(&self, n: usize) -> Vec<u64> {
        let oldest: Vec<u64> = {
            let streams = self.streams();
            let mut v: Vec<(u64, u64)> = streams.values().filter(|s| s.closing.is_none()).map(|s| (s.connected_at_unix_ms, s.stream)).collect();
            v.sort();
            v.into_iter().take(n).map(|(_, id)| id).collect()
        };
        let closers = self.inner.closers.lock().unwrap_or_else(|e| e.into_inner());
        let mut streams = self.streams();
        for id in &oldest {
            if let Some(c) = closers.get(id) {
                c.notify_one();
            }
            if let Some(s) = streams.get_mut(id) {
                s.closing = Some("rebalancing".into());
            }
        }
        oldest
    }

    /// Every connected proxy, by node id then stream.
    pub fn snapshot(&self) -> SyncStatus {
        let mut proxies: Vec<ProxyStatus> = self.streams().values().cloned().collect();
        proxies.sort_by(|a, b| (&a.id, a.stream).cmp(&(&b.id, b.stream)));
        let refused = self.inner.refused.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect();
        SyncStatus { proxies, refused }
    }

    /// Remember a refused stream (the last few are kept).
    pub fn refuse(&self, mut r: Refused) {
        r.at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let mut q = self.inner.refused.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == REFUSED_KEPT {
            q.pop_front();
        }
        q.push_back(r);
    }

    /// The config a connected proxy is served (its newest stream's), by
    /// node id.
    pub fn config_of(&self, proxy_id: &str) -> Option<Arc<super::resources::ProxyConfig>> {
        let stream = self.streams().values().filter(|s| s.id == proxy_id).map(|s| s.stream).max()?;
        self.inner.configs.lock().unwrap_or_else(|e| e.into_inner()).get(&stream).cloned()
    }

    /// Every connected proxy's identity, once per node id (its newest
    /// stream's), by node id.
    pub fn identities(&self) -> Vec<ProxyIdentity> {
        let ids = self.inner.identities.lock().unwrap_or_else(|e| e.into_inner());
        let mut newest: BTreeMap<&str, &ProxyIdentity> = BTreeMap::new();
        for p in ids.values() {
            newest.insert(&p.id, p); // streams in order: a later one wins
        }
        newest.into_values().cloned().collect()
    }

    /// Connected streams right now.
    pub fn len(&self) -> usize {
        self.streams().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One stream's entry in the registry. Dropping it removes the entry.
pub struct StreamHandle {
    registry: SyncRegistry,
    stream: u64,
    close: Arc<tokio::sync::Notify>,
}

impl StreamHandle {
    pub fn stream(&self) -> u64 {
        self.stream
    }

    /// Notified when the server asks this stream to close.
    pub fn closer(&self) -> Arc<tokio::sync::Notify> {
        self.close.clone()
    }

    /// Record why the stream is closing (shown by `/debug/syncz`).
    pub fn closing(&self, why: &str) {
        self.update(|s| s.closing = Some(why.to_string()));
    }

    fn update(&self, f: impl FnOnce(&mut ProxyStatus)) {
        if let Some(s) = self.registry.streams().get_mut(&self.stream) {
            f(s);
        }
    }

    fn update_type(&self, t: ResourceType, f: impl FnOnce(&mut TypeStatus)) {
        self.update(|s| f(s.types.entry(t.short()).or_default()));
    }

    pub fn generated(&self, revision: u64) {
        self.update(|s| {
            s.revision = Some(revision);
            s.generate_error = None;
        });
    }

    /// The config the stream now serves.
    pub fn serving(&self, config: Arc<super::resources::ProxyConfig>) {
        self.registry.inner.configs.lock().unwrap_or_else(|e| e.into_inner()).insert(self.stream, config);
    }

    /// Every response for `revision` has been queued on the stream.
    pub fn pushed(&self, revision: u64) {
        self.update(|s| s.pushed_revision = Some(revision));
    }

    pub fn generate_failed(&self, revision: u64, error: &str) {
        self.update(|s| s.generate_error = Some(format!("revision {revision}: {error}")));
    }

    pub fn sent(&self, t: ResourceType, version: &str, nonce: &str, resources: usize, removed: usize) {
        self.update_type(t, |ts| {
            ts.sent_version = Some(version.to_string());
            ts.sent_nonce = Some(nonce.to_string());
            ts.sent_resources = resources;
            ts.sent_removed = removed;
            ts.sent_at_unix_ms = Some(now_ms());
            ts.pushes += 1;
            ts.in_sync = false;
        });
        crate::metrics::metrics().xds_pushes.with(&[&t.short().to_ascii_lowercase()]).inc();
    }

    pub fn acked(&self, t: ResourceType, version: &str) {
        if let Some(at) = version.parse().ok().and_then(super::push::published_at) {
            crate::metrics::metrics().convergence_time.observe(at.elapsed());
        }
        self.update_type(t, |ts| {
            ts.acked_version = Some(version.to_string());
            ts.acked_at_unix_ms = Some(now_ms());
            ts.in_sync = true;
        });
    }

    pub fn nacked(&self, t: ResourceType, rejected_version: &str, nonce: &str, error: &str) {
        crate::metrics::metrics().xds_rejects.with(&[&t.short().to_ascii_lowercase()]).inc();
        let at_unix_ms = now_ms();
        let mut event = None;
        self.update(|s| {
            let ts = s.types.entry(t.short()).or_default();
            ts.last_nack = Some(Nack { rejected_version: rejected_version.to_string(), nonce: nonce.to_string(), error: error.to_string(), at_unix_ms });
            ts.in_sync = false;
            event = Some(NackEvent {
                proxy: format!("{}.{}", s.name, s.namespace),
                id: s.id.clone(),
                type_short: t.short(),
                rejected_version: rejected_version.to_string(),
                error: error.to_string(),
                at_unix_ms,
            });
        });
        if let Some(e) = event {
            {
                let mut recent = self.registry.inner.recent_nacks.lock().unwrap_or_else(|e| e.into_inner());
                if recent.len() == RECENT_NACKS_KEPT {
                    recent.pop_front();
                }
                recent.push_back(e.clone());
            }
            // No listener: nothing to tell.
            let _ = self.registry.inner.nacks.0.send(e);
        }
    }
}

impl Drop for StreamHandle {
    fn drop(&mut self) {
        crate::metrics::metrics().xds_connected.dec();
        self.registry.inner.closers.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.stream);
        self.registry.inner.configs.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.stream);
        self.registry.inner.identities.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.stream);
        self.registry.streams().remove(&self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_live_as_long_as_their_stream() {
        let reg = SyncRegistry::new();
        let id = ProxyIdentity::parse("sidecar~127.0.0.2~a.ns~ns.svc.cluster.local", &json!({})).unwrap();
        let h = reg.connect(&id, Protocol::Sotw);
        h.sent(ResourceType::Cluster, "3", "1", 2, 0);
        h.nacked(ResourceType::Cluster, "3", "1", "bad cluster");
        h.acked(ResourceType::Cluster, "3");
        let snap = serde_json::to_value(reg.snapshot()).unwrap();
        let cds = &snap["proxies"][0]["types"]["CDS"];
        assert_eq!((cds["sent_version"].as_str(), cds["acked_version"].as_str(), cds["in_sync"].as_bool()), (Some("3"), Some("3"), Some(true)));
        assert_eq!(cds["last_nack"]["error"], "bad cluster");
        assert_eq!(snap["proxies"][0]["protocol"], "sotw");
        drop(h);
        assert!(reg.is_empty());
        // The NACK outlives its stream, for `/v1/nacks/recent`.
        let recent = reg.recent_nacks(0);
        assert_eq!(recent.iter().map(|e| (e.proxy.as_str(), e.type_short, e.error.as_str())).collect::<Vec<_>>(), [("a.ns", "CDS", "bad cluster")]);
        assert!(reg.recent_nacks(recent[0].at_unix_ms + 1).is_empty());
    }

    #[test]
    fn recent_nacks_are_bounded() {
        let reg = SyncRegistry::new();
        let id = ProxyIdentity::parse("sidecar~127.0.0.2~a.ns~ns.svc.cluster.local", &json!({})).unwrap();
        let h = reg.connect(&id, Protocol::Sotw);
        for v in 0..RECENT_NACKS_KEPT + 10 {
            h.nacked(ResourceType::Listener, &v.to_string(), "1", "bad listener");
        }
        let recent = reg.recent_nacks(0);
        assert_eq!(recent.len(), RECENT_NACKS_KEPT);
        assert_eq!(recent[0].rejected_version, "10", "the oldest are dropped first");
    }
}
