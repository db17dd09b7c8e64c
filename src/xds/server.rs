//! The ADS server: one task per connected proxy, state of the world and
//! delta, for CDS, EDS, LDS and RDS, and SDS for gateways' `credentialName`
//! secrets (`xds::secrets`).
//!
//! A stream's life:
//! 1. The handler reads the first request and parses the proxy's identity
//!    from its `Node` (a malformed node id ends the stream with
//!    INVALID_ARGUMENT naming the problem), then generates the proxy's
//!    config from the current applied store snapshot. A stream whose first
//!    generation fails ends with UNAVAILABLE rather than serving an empty
//!    config: an Envoy that reconnects keeps what it has and retries.
//! 2. The stream task then waits on three things: a request (handled by
//!    the protocol state in `xds::sotw` / `xds::delta`), a new
//!    applied revision, and shutdown.
//! 3. On a new revision it regenerates once and pushes only the types, and
//!    (delta) resources, that changed for this proxy, in make-before-break
//!    order. Revisions arriving while it generates or pushes are coalesced by
//!    the watch channel: the next round uses the newest, never a backlog.
//!
//! Every response is built from one `ProxyConfig`, generated from one
//! `Arc<Applied>`: one revision, never a mix. Its `revision` is set here
//! from that snapshot, so `version_info` is the store revision whatever the
//! generator does.

use super::delta::DeltaStream;
use super::resources::{Generator, ProxyConfig, ResourceType};
use super::service::{Requests, StreamCaller};
use super::session::Received;
use super::sotw::SotwStream;
use super::status::{Protocol, StreamHandle, SyncRegistry};
use crate::model::proxy::ProxyIdentity;
use crate::state::access::index::CertFacts;
use crate::state::access::{Credentials, Principal, Refusal, Who};
use crate::store::Applied;
use crate::tls::conn::Tracked;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use serde_json::Value;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tonic::{Code, Response, Status};

/// Responses queued per stream before the stream task waits for the
/// client to read. Small: a slow proxy should coalesce revisions, not queue.
const STREAM_BUFFER: usize = 4;

/// HTTP/2 pings find proxies that vanished without closing their streams.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Streams one connection may have open at once (HTTP/2
/// SETTINGS_MAX_CONCURRENT_STREAMS). An Envoy or gRPC client opens one ADS
/// stream, plus CSRs; the load generator multiplexes up to a few hundred.
/// tonic leaves this unlimited unless set (it overrides hyper's 200).
const MAX_STREAMS_PER_CONNECTION: u32 = 1024;
/// Streams a client may open and reset before the server accepts them, and
/// streams the server may reset for a client's protocol errors, before the
/// connection is closed (rapid-reset floods). tonic passes "unlimited" for
/// the second unless set, which turns off hyper's default of 1024.
const MAX_PENDING_RESETS: usize = 20;
const MAX_LOCAL_ERROR_RESETS: usize = 1024;

/// How long a connection whose client certificate was refused lives on,
/// so that the refusal's status reaches the client before the connection
/// closes (`tls::conn::Closer`).
const CLOSE_DELAY: Duration = Duration::from_millis(500);

/// Per-stream lines (opened, closed, refused) written at info (refusals at
/// warn) in each window, at most; past that they are written at debug only
/// and counted, and one info line per window sums them up. A flood of
/// streams (a reconnect storm, an abusive client) costs a bounded number
/// of lines, while an ordinary Envoy's connection is still logged by name
/// (istiod logs each one at info).
pub const STREAM_LOG_LINES: u64 = 20;
pub const STREAM_LOG_WINDOW: Duration = Duration::from_secs(10);

/// Whether this replica may serve, and how it proves it is current. The
/// replica's `Node` implements it (see `ha`); [`AlwaysCurrent`] is for a
/// store that is the only copy.
#[tonic::async_trait]
pub trait Fence: Send + Sync + 'static {
    /// `Err(why)` while this replica must not open new streams (it is not
    /// ready: starting, or cut off from the quorum).
    fn ready(&self) -> Result<(), String>;
    /// Wait, bounded, until this replica has applied every write committed
    /// before the call: then nothing it serves is older than what any
    /// Envoy has ACKed from any replica.
    async fn barrier(&self) -> Result<(), String>;
}

/// Which client certificates naming a SPIFFE id are workload identities:
/// the mesh CA (the root's `ca::MeshCa` implements it). The server knows no
/// CA, only this call.
pub trait WorkloadCerts: Send + Sync + 'static {
    /// The facts of the chain's leaf if the mesh CA issued it to a
    /// workload and it is current, or why not.
    fn verify_workload(&self, chain: &[rustls::pki_types::CertificateDer<'static>]) -> Result<CertFacts, String>;
}

/// Who may open a stream as which proxy: the replica's ACLs (the root's
/// `auth::Acl` implements it). The server knows no token store and no
/// audit log, only these calls (go-control-plane's callbacks).
pub trait Admission: Send + Sync + 'static {
    /// ACLs on: every stream authenticates, and is checked again while it
    /// lives.
    fn enabled(&self) -> bool;
    /// The principal a stream's credentials stand for, or why not.
    fn authenticate(&self, creds: &Credentials) -> Result<Principal, Refusal>;
    /// Why a mesh certificate is refused (the deny list), if it is.
    fn revoked(&self, cert: &CertFacts) -> Option<String>;
    /// Record a stream refused for its credential (the audit log).
    fn refused(&self, who: &str, proxy: Option<&str>, reason: &str);
}

/// A fence for a store with no other replicas to be behind.
pub struct AlwaysCurrent;

#[tonic::async_trait]
impl Fence for AlwaysCurrent {
    fn ready(&self) -> Result<(), String> {
        Ok(())
    }
    async fn barrier(&self) -> Result<(), String> {
        Ok(())
    }
}

/// How streams are admitted and how long they live.
#[derive(Clone)]
pub struct ServeOptions {
    pub fence: Arc<dyn Fence>,
    /// Close a stream after this long (± 10% jitter) so Envoys spread out
    /// again over time; `None`: never.
    pub max_stream_age: Option<Duration>,
    /// How long a stream waits for this replica to reach the revision its
    /// proxy already holds.
    pub fence_timeout: Duration,
    /// The store's newest applied state, when `applied` (what is pushed) is
    /// debounced: new streams and catching up read this one.
    pub latest: Option<watch::Receiver<Arc<Applied>>>,
    /// Who may open a stream as which proxy; `None`: anyone, as anything.
    pub acl: Option<Arc<dyn Admission>>,
    /// The mesh CA: a client certificate's SPIFFE id is a workload
    /// identity only if this CA issued it.
    pub mesh_ca: Option<Arc<dyn WorkloadCerts>>,
    /// Changes when an input of translation other than the store changed
    /// (key sets fetched from `jwksUri`s, the root's `jwks` fetcher): every stream
    /// then regenerates at its revision and pushes what changed.
    pub refresh: Option<watch::Receiver<u64>>,
    /// The cluster secrets key: gateways' `credentialName` secrets are
    /// served over SDS on their stream (`xds::secrets`); `None`: none are.
    pub secrets: Option<Arc<dyn super::secrets::Unseal>>,
    /// Streams this replica serves at once (`xds_max_streams`); more are
    /// refused with RESOURCE_EXHAUSTED. 0: no limit.
    pub max_streams: usize,
    /// Bytes of incomplete requests held across all streams
    /// (`xds_max_buffered_request_bytes`); a stream whose request would
    /// take more ends with RESOURCE_EXHAUSTED. 0: no limit (each stream
    /// is still held to one request's limit).
    pub max_buffered_request_bytes: usize,
    /// Streams one credential (`xds_max_streams_per_credential`) and one
    /// source address (`xds_max_streams_per_source`) may have open on this
    /// replica; more are refused with RESOURCE_EXHAUSTED. 0: no limit.
    pub max_streams_per_credential: usize,
    pub max_streams_per_source: usize,
    /// What one stream's subscribed names may cost, every type together
    /// (`xds_max_subscription_bytes`, see `session::name_cost`); a stream
    /// over it ends with RESOURCE_EXHAUSTED. 0: no limit.
    pub max_subscription_bytes: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            fence: Arc::new(AlwaysCurrent),
            max_stream_age: None,
            fence_timeout: Duration::from_secs(5),
            latest: None,
            acl: None,
            mesh_ca: None,
            refresh: None,
            secrets: None,
            max_streams: 0,
            max_buffered_request_bytes: 0,
            max_streams_per_credential: 0,
            max_streams_per_source: 0,
            max_subscription_bytes: 0,
        }
    }
}

/// Serve ADS on `listener` until `shutdown` becomes true (or its sender is
/// dropped); then every stream ends cleanly (status OK) and this returns.
///
/// `applied` is the store's applied-state channel
/// (`StoreReader::subscribe_applied`); tests may drive one by hand.
/// `also`: another gRPC service on the port (Istio's CSR service, the
/// root's `ca::service`, wrapped in `Tracked`), generic so this module
/// names no CA.
pub async fn serve<C>(
    incoming: crate::tls::conn::Incoming,
    applied: watch::Receiver<Arc<Applied>>,
    generator: Arc<dyn Generator>,
    registry: SyncRegistry,
    options: ServeOptions,
    also: Option<C>,
    shutdown: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error>
where
    C: tonic::codegen::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    C::Future: Send + 'static,
{
    let service = AdsService::new(applied, generator, registry, options, shutdown.clone());
    tokio::spawn(summarize_stream_log(service.shared.clone(), shutdown.clone()));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_RESETS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        // Requests count on their connection while they last (a stream: as
        // long as it is open), for the port's idle timeout (`tls::conn`).
        .add_service(Tracked(service.into_server()))
        // Istio's CSR service shares the port, as on istiod (see `ca`).
        .add_optional_service(also)
        // `Incoming` sets TCP_NODELAY (tonic ignores its builder's with an
        // incoming stream) and does the TLS handshakes.
        .serve_with_incoming_shutdown(incoming.into_stream(), stopped(shutdown))
        .await
}

/// Every `STREAM_LOG_WINDOW`: the info line summing up the stream lines
/// left at debug, if any, and a new budget of lines.
async fn summarize_stream_log(shared: Arc<Shared>, shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(STREAM_LOG_WINDOW);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let stop = stopped(shutdown);
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => return,
            _ = tick.tick() => {}
        }
        if let Some([opened, closed, refused]) = shared.log.window() {
            let open = shared.streams.load(Ordering::Relaxed);
            tracing::info!(
                opened,
                closed,
                refused,
                open,
                "xDS streams in the last {}s beyond the {STREAM_LOG_LINES} logged one by one (the rest are at debug level)",
                STREAM_LOG_WINDOW.as_secs()
            );
        }
    }
}

/// The budget of per-stream log lines (see `STREAM_LOG_LINES`).
#[derive(Default)]
struct StreamLog {
    lines: AtomicU64,
    /// Opened, closed and refused streams not logged one by one.
    unlogged: [AtomicU64; 3],
}

#[derive(Clone, Copy)]
enum StreamEvent {
    Opened = 0,
    Closed = 1,
    Refused = 2,
}

impl StreamLog {
    /// Whether this event gets its own line at info (warn); if not, it is
    /// counted for the summary (and logged at debug by the caller).
    fn line(&self, event: StreamEvent) -> bool {
        if self.lines.fetch_add(1, Ordering::Relaxed) < STREAM_LOG_LINES {
            return true;
        }
        self.unlogged[event as usize].fetch_add(1, Ordering::Relaxed);
        false
    }

    /// A new window: the counts left unlogged in the last one, if any.
    fn window(&self) -> Option<[u64; 3]> {
        self.lines.store(0, Ordering::Relaxed);
        let counts = [0, 1, 2].map(|i| self.unlogged[i].swap(0, Ordering::Relaxed));
        counts.iter().any(|&n| n > 0).then_some(counts)
    }
}

/// One open stream, counted against `max_streams` until dropped.
struct StreamPermit(Arc<AtomicUsize>);

impl Drop for StreamPermit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn stopped(mut shutdown: watch::Receiver<bool>) {
    // A dropped sender also means stop.
    let _ = shutdown.wait_for(|s| *s).await;
}

/// The ADS gRPC service. Cheap to clone.
#[derive(Clone)]
pub struct AdsService {
    shared: Arc<Shared>,
}

struct Shared {
    applied: watch::Receiver<Arc<Applied>>,
    generator: Arc<dyn Generator>,
    registry: SyncRegistry,
    options: ServeOptions,
    shutdown: watch::Receiver<bool>,
    log: StreamLog,
    /// Streams open (past authentication), for `max_streams`.
    streams: Arc<AtomicUsize>,
    /// Bytes of incomplete requests held across streams.
    pub(super) request_budget: Arc<super::service::RequestBudget>,
    /// Streams per credential and per source address.
    quotas: Arc<super::limits::Quotas>,
}

impl AdsService {
    pub fn new(
        applied: watch::Receiver<Arc<Applied>>,
        generator: Arc<dyn Generator>,
        registry: SyncRegistry,
        options: ServeOptions,
        shutdown: watch::Receiver<bool>,
    ) -> AdsService {
        let request_budget = Arc::new(super::service::RequestBudget::new(options.max_buffered_request_bytes));
        let quotas = super::limits::Quotas::new(options.max_streams_per_credential, options.max_streams_per_source);
        let shared = Shared { applied, generator, registry, options, shutdown, log: StreamLog::default(), streams: Arc::default(), request_budget, quotas };
        AdsService { shared: Arc::new(shared) }
    }

    pub(super) fn request_budget(&self) -> Arc<super::service::RequestBudget> {
        self.shared.request_budget.clone()
    }

    pub fn into_server(self) -> super::service::AdsServer {
        super::service::AdsServer(Arc::new(self))
    }

    /// Read the first request, identify the proxy, generate its config and
    /// start the stream task.
    async fn open<V: Variant>(&self, mut caller: StreamCaller, mut inbound: Requests<V::Req>) -> Result<Response<Outbound<V::Resp>>, Status> {
        self.verify_mesh_cert(&mut caller);
        // Credentials first: an unauthenticated stream is refused before
        // its first request is read, and costs no translation.
        let principal = authenticate(&self.shared, &caller, None)?;
        // Its credential's and its source's quotas, then the replica-wide
        // stream limit, counted from here: a stream holds its places until
        // it ends, first request or not.
        let quota = self.admit_quota(&caller, &principal)?;
        let permit = self.admit_stream(&caller)?;
        let first = tokio::select! {
            m = inbound.message() => m?.ok_or_else(|| Status::invalid_argument("the stream closed before its first request"))?,
            _ = stopped(self.shared.shutdown.clone()) => return Err(Status::unavailable("the server is shutting down")),
        };
        if let Some(node) = V::node(&first) {
            super::limits::check_node(node)?;
        }
        let identity = Arc::new(proxy_identity(V::node(&first))?);
        // The identity it claims must be one its credential is for.
        authorize(&self.shared, &caller, &principal, &identity)?;
        // Admission: a replica that is not ready (starting, or cut off from
        // the quorum) opens no stream; the Envoy keeps its config and
        // reconnects, to another replica as its bootstrap rotates.
        let fence = &self.shared.options.fence;
        fence.ready().map_err(|why| {
            crate::metrics::metrics().streams_refused.with(&["not_ready"]).inc();
            Status::unavailable(format!("this replica is not ready: {why}; reconnect to another"))
        })?;
        // Fencing: an Envoy that already has config (a reconnect) must never
        // get older config. SotW requests carry the revision the client
        // holds: a request newer than this replica waits for it (see
        // `catch_up`). Delta's do not: before answering, this replica
        // applies everything committed so far, which includes whatever the
        // Envoy ACKed from any replica. Either way, if it cannot within the
        // bound, it sends the Envoy elsewhere rather than answer from behind.
        if V::needs_barrier(&first) {
            fence.barrier().await.map_err(|why| {
                crate::metrics::metrics().streams_refused.with(&["behind"]).inc();
                Status::unavailable(format!("cannot confirm this replica is current: {why}; reconnect to another"))
            })?;
        }
        let handle = self.shared.registry.connect(&identity, V::PROTOCOL);
        let mut applied = self.shared.applied.clone();
        applied.borrow_and_update();
        // A new stream starts from the newest applied revision, not the
        // last debounced push: it has nothing to coalesce with.
        let current = self.shared.options.latest.as_ref().map_or_else(|| applied.borrow().clone(), |l| l.borrow().clone());
        // Fetched inputs (JWT keys) seen from here on are in the first
        // config; a change after this mark regenerates.
        let refresh = self.shared.options.refresh.clone().map(|mut r| {
            r.mark_unchanged();
            r
        });
        // Secrets (SDS): a gateway on a TLS connection with an authenticated
        // identity, for its own namespace only (see `xds::secrets`).
        let secrets = secrets_for(&self.shared, &caller, &principal, &identity).map(|key| Arc::new(super::secrets::SecretSource::new(key, &identity)));
        let config = generate(&self.shared.generator, &identity, current, &handle, secrets.as_ref().ok())
            .await
            .map_err(|e| Status::unavailable(format!("cannot generate the configuration of {}: {e}", identity.id)))?;
        if self.shared.log.line(StreamEvent::Opened) {
            tracing::info!(proxy = %identity.id, stream = handle.stream(), protocol = V::PROTOCOL.as_str(), revision = config.revision, "xDS stream opened");
        } else {
            tracing::debug!(proxy = %identity.id, stream = handle.stream(), protocol = ?V::PROTOCOL, revision = config.revision, "xDS stream opened");
        }
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let max_age = self.shared.options.max_stream_age.map(|a| jittered(a, handle.stream()));
        let caller = self.shared.options.acl.as_ref().filter(|a| a.enabled()).map(|_| Box::new(caller));
        let cert_expiry = caller.as_ref().filter(|c| c.bearer.as_ref().is_ok_and(Option::is_none)).and_then(|c| c.mesh_cert.as_ref()).map(|c| c.not_after);
        let stream = StreamTask {
            shared: self.shared.clone(),
            identity,
            handle,
            applied,
            tx,
            config,
            variant: V::default(),
            max_age,
            caller,
            refresh,
            secrets,
            said_why_no_secrets: false,
            cert_expiry,
            nack_log: Default::default(),
            _permit: permit,
            _quota: quota,
        };
        // Requests come boxed (see `Requests::message`): an async fn keeps
        // room for its arguments for the future's whole life, and an
        // Envoy's first request (its node inline) would otherwise take
        // about a kilobyte of every idle stream's task, twice over.
        tokio::spawn(stream.run(first, inbound));
        Ok(Response::new(Outbound(rx)))
    }
}

impl AdsService {
    /// A client certificate naming a SPIFFE id is a workload identity only
    /// if the mesh CA issued it (not the cluster CA, say) and it is
    /// current: then its facts are kept for the checks while the stream
    /// lives (expiry, the deny list); else it is no identity, and why is
    /// kept for the refusal.
    fn verify_mesh_cert(&self, caller: &mut StreamCaller) {
        let chain = std::mem::take(&mut caller.chain);
        if !caller.peer.as_ref().is_some_and(|p| p.0.starts_with("spiffe://")) {
            return;
        }
        let Some(ca) = &self.shared.options.mesh_ca else {
            caller.peer = None;
            return;
        };
        match ca.verify_workload(&chain) {
            Ok(f) => caller.mesh_cert = Some(f),
            Err(why) => {
                caller.peer = None;
                caller.mesh_cert_refused = Some(why);
            }
        }
    }

    /// A place in the quotas of the stream's credential (ACLs on) and of
    /// its source address, or RESOURCE_EXHAUSTED naming the setting
    /// (counted, logged within the line budget, kept in `/debug/syncz`).
    fn admit_quota(&self, caller: &StreamCaller, principal: &Principal) -> Result<super::limits::QuotaPermit, Status> {
        let credential = (principal.who != Who::Anonymous).then(|| principal.who.audit_name());
        let (over, limit) = match self.shared.quotas.admit(credential.as_deref(), caller.remote.map(|r| r.ip())) {
            Ok(permit) => return Ok(permit),
            Err(over) => over,
        };
        let reason = match over {
            super::limits::Over::Credential => {
                format!("{} has its limit of {limit} xDS streams open on this replica (xds_max_streams_per_credential)", principal.who)
            }
            super::limits::Over::Source => {
                let ip = caller.remote.map_or_else(|| "-".to_string(), |r| r.ip().to_string());
                format!("{ip} has its limit of {limit} xDS streams open on this replica (xds_max_streams_per_source)")
            }
        };
        Err(refuse_with(&self.shared, caller, &principal.who.audit_name(), None, Code::ResourceExhausted, over.reason(), reason))
    }

    /// A place under `max_streams`, or RESOURCE_EXHAUSTED (counted,
    /// logged within the line budget).
    fn admit_stream(&self, caller: &StreamCaller) -> Result<StreamPermit, Status> {
        let (streams, max) = (&self.shared.streams, self.shared.options.max_streams);
        let admitted = streams.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (max == 0 || n < max).then_some(n + 1)).is_ok();
        if admitted {
            return Ok(StreamPermit(streams.clone()));
        }
        crate::metrics::metrics().streams_refused.with(&["stream_limit"]).inc();
        let remote = caller.remote.map(|r| r.to_string());
        let remote = remote.as_deref().unwrap_or("-");
        if self.shared.log.line(StreamEvent::Refused) {
            tracing::warn!(remote, limit = max, "xDS stream refused: this replica serves its limit of streams");
        } else {
            tracing::debug!(remote, limit = max, "xDS stream refused: this replica serves its limit of streams");
        }
        Err(Status::resource_exhausted(format!("this replica serves its limit of {max} xDS streams (xds_max_streams); reconnect to another replica")))
    }
}

/// The principal a stream's credentials stand for (anyone, as anything,
/// without ACLs), or UNAUTHENTICATED. `proxy`: the node id, once known.
/// A stream authenticated by its mesh certificate is refused once the
/// certificate has expired or is on the deny list; a stream refused for a
/// client certificate closes its connection (the certificate is the
/// connection's: the client dials again with its current one).
fn authenticate(shared: &Shared, caller: &StreamCaller, proxy: Option<&str>) -> Result<Principal, Status> {
    let Some(acl) = &shared.options.acl else { return Ok(Principal::anonymous()) };
    let refused = |who: &str, why: String| {
        if caller.mesh_cert.is_some() || caller.mesh_cert_refused.is_some() {
            if let Some(c) = &caller.closer {
                c.close_after(CLOSE_DELAY);
            }
        }
        refuse(shared, caller, who, proxy, Code::Unauthenticated, why)
    };
    let bearer = match &caller.bearer {
        Ok(b) => b.clone(),
        Err(why) => return Err(refused("anonymous", why.to_string())),
    };
    let by_cert = bearer.is_none();
    let creds = Credentials { bearer, peer: caller.peer.clone() };
    let principal = acl.authenticate(&creds).map_err(|r| {
        let cert = caller.mesh_cert_refused.as_ref().map(|e| format!("; the client certificate is no current mesh certificate ({e})")).unwrap_or_default();
        let reason = format!("{}: a proxy sends a proxy token (gRPC metadata authorization: Bearer <secret>) or a workload certificate{cert}", r.reason);
        refused(&r.who, reason)
    })?;
    if let (Some(cert), true, true) = (&caller.mesh_cert, by_cert, acl.enabled()) {
        let expired = (unix_now() as i64 >= cert.not_after)
            .then(|| format!("the client certificate {} expired at {}", cert.serial, crate::model::acl::format_rfc3339(cert.not_after.max(0) as u64)));
        if let Some(why) = expired.or_else(|| acl.revoked(cert)) {
            return Err(refused(&principal.who.audit_name(), format!("{why}: reconnect with a current certificate")));
        }
    }
    Ok(principal)
}

/// PERMISSION_DENIED unless `principal` may be the proxy `identity` claims.
fn authorize(shared: &Shared, caller: &StreamCaller, principal: &Principal, identity: &ProxyIdentity) -> Result<(), Status> {
    principal
        .may_be_proxy(&identity.namespace, &identity.name)
        .map_err(|why| refuse(shared, caller, &principal.who.audit_name(), Some(&identity.id), Code::PermissionDenied, why))
}

/// Both, again, for an open stream.
fn admit(shared: &Shared, caller: &StreamCaller, identity: &ProxyIdentity) -> Result<Principal, Status> {
    let principal = authenticate(shared, caller, Some(&identity.id))?;
    authorize(shared, caller, &principal, identity)?;
    Ok(principal)
}

/// The secrets key, if the stream is served its namespace's Secrets (a
/// gateway, see `xds::secrets` and `Principal::may_have_secrets`), or why not.
fn secrets_for(shared: &Shared, caller: &StreamCaller, principal: &Principal, identity: &ProxyIdentity) -> Result<Arc<dyn super::secrets::Unseal>, String> {
    let authenticated = shared.options.acl.as_ref().is_some_and(|a| a.enabled());
    let key = super::secrets::eligible(identity, caller.tls, authenticated, shared.options.secrets.as_ref()).map_err(str::to_string)?;
    principal.may_have_secrets(&identity.namespace)?;
    Ok(key)
}

/// Count, remember (`/debug/syncz`), audit and log a refused stream.
fn refuse(shared: &Shared, caller: &StreamCaller, who: &str, proxy: Option<&str>, code: Code, reason: String) -> Status {
    let label = if code == Code::Unauthenticated { "unauthenticated" } else { "permission_denied" };
    refuse_with(shared, caller, who, proxy, code, label, reason)
}

/// [`refuse`] with the metric's reason label given. Only refusals for the
/// credential itself (unauthenticated, permission denied) are audited: a
/// quota refusal is no authorization decision, and a client hammering a
/// full quota must not fill the audit log.
fn refuse_with(shared: &Shared, caller: &StreamCaller, who: &str, proxy: Option<&str>, code: Code, label: &'static str, reason: String) -> Status {
    crate::metrics::metrics().streams_refused.with(&[label]).inc();
    let remote = caller.remote.map(|r| r.to_string());
    if shared.log.line(StreamEvent::Refused) {
        tracing::warn!(remote = remote.as_deref().unwrap_or("-"), proxy = proxy.unwrap_or("-"), who, reason = %reason, "xDS stream refused");
    } else {
        tracing::debug!(remote = remote.as_deref().unwrap_or("-"), proxy = proxy.unwrap_or("-"), who, reason = %reason, "xDS stream refused");
    }
    if let Some(acl) = shared.options.acl.as_ref().filter(|_| matches!(code, Code::Unauthenticated | Code::PermissionDenied)) {
        acl.refused(who, proxy, &reason);
    }
    let code_name = match code {
        Code::Unauthenticated => "unauthenticated",
        Code::PermissionDenied => "permission_denied",
        _ => "resource_exhausted",
    };
    let refused = super::status::Refused { at_ms: 0, remote, proxy: proxy.map(str::to_string), who: who.to_string(), code: code_name, reason: reason.clone() };
    shared.registry.refuse(refused);
    Status::new(code, reason)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A stream's queued responses. Boxed: the channel allocates its slots in
/// blocks of 32, and an idle stream should not hold 32 responses' worth.
type Queued<R> = Result<Box<R>, Box<Status>>;

/// The response side of a stream, as tonic takes it.
pub struct Outbound<R>(mpsc::Receiver<Queued<R>>);

impl<R> futures::Stream for Outbound<R> {
    type Item = Result<R, Status>;
    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        self.0.poll_recv(cx).map(|r| r.map(|r| r.map(|b| *b).map_err(|e| *e)))
    }
}

impl AdsService {
    /// `StreamAggregatedResources`: a state-of-the-world stream.
    pub(super) async fn sotw(&self, caller: StreamCaller, inbound: Requests<DiscoveryRequest>) -> Result<Response<Outbound<DiscoveryResponse>>, Status> {
        self.open::<SotwStream>(caller, inbound).await
    }

    /// `DeltaAggregatedResources`: an incremental stream.
    pub(super) async fn delta(
        &self,
        caller: StreamCaller,
        inbound: Requests<DeltaDiscoveryRequest>,
    ) -> Result<Response<Outbound<DeltaDiscoveryResponse>>, Status> {
        self.open::<DeltaStream>(caller, inbound).await
    }
}

/// What the stream task needs from a protocol variant.
trait Variant: Default + Send + 'static {
    type Req: prost::Message + Default + super::service::NameFields + Send + 'static;
    type Resp: Send + 'static;
    const PROTOCOL: Protocol;
    fn node(req: &Self::Req) -> Option<&Node>;
    /// The client already holds config, and its request cannot say how new
    /// (delta's `initial_resource_versions`): fence with a barrier.
    fn needs_barrier(first: &Self::Req) -> bool;
    /// The store revision of the config the client holds for the request's
    /// type, when the request says (SotW's `version_info`).
    fn client_revision(req: &Self::Req) -> Option<u64>;
    fn on_request(&mut self, req: &Self::Req, config: &ProxyConfig) -> (Received, Option<Self::Resp>);
    fn on_config(&mut self, config: &ProxyConfig) -> Vec<Self::Resp>;
    fn record(handle: &StreamHandle, resp: &Self::Resp);
    fn type_of(resp: &Self::Resp) -> Option<ResourceType>;
    /// The most names the stream subscribes to for one type.
    fn most_names(&self) -> usize;
    /// What its subscribed names cost together (`session::name_cost`).
    fn subscribed_bytes(&self) -> usize;
}

impl Variant for SotwStream {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    const PROTOCOL: Protocol = Protocol::Sotw;
    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn needs_barrier(_: &DiscoveryRequest) -> bool {
        false
    }
    fn client_revision(req: &DiscoveryRequest) -> Option<u64> {
        req.version_info.parse().ok()
    }
    fn on_request(&mut self, req: &DiscoveryRequest, config: &ProxyConfig) -> (Received, Option<DiscoveryResponse>) {
        SotwStream::on_request(self, req, config)
    }
    fn on_config(&mut self, config: &ProxyConfig) -> Vec<DiscoveryResponse> {
        SotwStream::on_config(self, config)
    }
    fn most_names(&self) -> usize {
        SotwStream::most_names(self)
    }
    fn subscribed_bytes(&self) -> usize {
        SotwStream::subscribed_bytes(self)
    }
    fn type_of(r: &DiscoveryResponse) -> Option<ResourceType> {
        ResourceType::from_type_url(&r.type_url)
    }
    fn record(handle: &StreamHandle, r: &DiscoveryResponse) {
        if let Some(t) = ResourceType::from_type_url(&r.type_url) {
            handle.sent(t, &r.version_info, &r.nonce, r.resources.len(), 0);
        }
    }
}

impl Variant for DeltaStream {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaDiscoveryResponse;
    const PROTOCOL: Protocol = Protocol::Delta;
    fn node(req: &DeltaDiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn needs_barrier(first: &DeltaDiscoveryRequest) -> bool {
        !first.initial_resource_versions.is_empty()
    }
    fn client_revision(_: &DeltaDiscoveryRequest) -> Option<u64> {
        None
    }
    fn on_request(&mut self, req: &DeltaDiscoveryRequest, config: &ProxyConfig) -> (Received, Option<DeltaDiscoveryResponse>) {
        DeltaStream::on_request(self, req, config)
    }
    fn on_config(&mut self, config: &ProxyConfig) -> Vec<DeltaDiscoveryResponse> {
        DeltaStream::on_config(self, config)
    }
    fn most_names(&self) -> usize {
        DeltaStream::most_names(self)
    }
    fn subscribed_bytes(&self) -> usize {
        DeltaStream::subscribed_bytes(self)
    }
    fn type_of(r: &DeltaDiscoveryResponse) -> Option<ResourceType> {
        ResourceType::from_type_url(&r.type_url)
    }
    fn record(handle: &StreamHandle, r: &DeltaDiscoveryResponse) {
        if let Some(t) = ResourceType::from_type_url(&r.type_url) {
            handle.sent(t, &r.system_version_info, &r.nonce, r.resources.len(), r.removed_resources.len());
        }
    }
}

/// One proxy's stream. Dropping it (the task ending) ends the response
/// stream with OK and removes the proxy from the registry.
struct StreamTask<V: Variant> {
    shared: Arc<Shared>,
    identity: Arc<ProxyIdentity>,
    handle: StreamHandle,
    applied: watch::Receiver<Arc<Applied>>,
    tx: mpsc::Sender<Queued<V::Resp>>,
    config: Arc<ProxyConfig>,
    variant: V,
    /// When this stream closes itself (max stream age), if ever.
    max_age: Option<Duration>,
    /// Its credentials, checked again at every new revision (ACLs on).
    caller: Option<Box<StreamCaller>>,
    /// See `ServeOptions::refresh`.
    refresh: Option<watch::Receiver<u64>>,
    /// Where its SDS secrets come from, or why it gets none.
    secrets: Result<Arc<super::secrets::SecretSource>, String>,
    said_why_no_secrets: bool,
    /// When the mesh certificate it was authenticated with expires (unix
    /// seconds): the stream ends then, revision or not.
    cert_expiry: Option<i64>,
    /// How often its NACKs are logged (`limits::NackLog`).
    nack_log: super::limits::NackLog,
    _permit: StreamPermit,
    _quota: super::limits::QuotaPermit,
}

/// Why a stream stops.
enum End {
    Shutdown,
    ClientGone,
    /// Its credential was revoked or expired, or no longer covers its
    /// identity: the stream ends with this status.
    Refused(Box<Status>),
    /// A request the server will not take (not protobuf, too large, too
    /// many names): the stream ends with this status.
    Invalid(Box<Status>),
    /// The server closes it so its Envoy reconnects (rebalancing, max age):
    /// the stream ends UNAVAILABLE with this message.
    Closed(&'static str),
}

/// How long until unix time `at` (seconds).
fn until_unix(at: i64) -> Duration {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(at.max(0) as u64);
    at.duration_since(std::time::SystemTime::now()).unwrap_or_default()
}

/// `age` ± 10%, spread by the stream id so streams opened together do not
/// all close together.
fn jittered(age: Duration, stream: u64) -> Duration {
    let spread = (crate::translate::resources::fnv1a(&stream.to_le_bytes()) % 2001) as f64 / 10_000.0 - 0.1;
    age.mul_f64(1.0 + spread)
}

impl<V: Variant> StreamTask<V> {
    async fn run(mut self, first: Box<V::Req>, mut inbound: Requests<V::Req>) {
        let end = self.serve(first, &mut inbound).await;
        let why = match end {
            End::Shutdown => "server shutdown",
            End::ClientGone => "client gone",
            End::Closed(why) => {
                crate::metrics::metrics().streams_shed.inc();
                self.handle.closing(why);
                let _ = self.tx.try_send(Err(Box::new(Status::unavailable(format!("{why}: reconnect")))));
                why
            }
            End::Refused(status) => {
                let _ = self.tx.try_send(Err(status));
                "its credential no longer allows it"
            }
            End::Invalid(status) => {
                let _ = self.tx.try_send(Err(status));
                "a request it sent was refused"
            }
        };
        if self.shared.log.line(StreamEvent::Closed) {
            tracing::info!(proxy = %self.identity.id, stream = self.handle.stream(), why, "xDS stream closed");
        } else {
            tracing::debug!(proxy = %self.identity.id, stream = self.handle.stream(), why, "xDS stream closed");
        }
        self.shared.generator.forget(&self.identity.id);
    }

    async fn serve(&mut self, first: Box<V::Req>, inbound: &mut Requests<V::Req>) -> End {
        if let Err(end) = Box::pin(self.on_request(first)).await {
            return end;
        }
        // The first responses are answers to the proxy's requests: from
        // here, every type it subscribes to is answered from this config.
        self.handle.pushed(self.config.revision);
        let max_age = self.max_age;
        let closer = self.handle.closer();
        let aged = async move {
            match max_age {
                Some(age) => tokio::time::sleep(age).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(aged);
        // Boxed, and no timer at all for a stream without a certificate
        // (a box of `pending` allocates nothing): idle streams stay small.
        let mut expired: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match self.cert_expiry {
            Some(at) => Box::pin(tokio::time::sleep(until_unix(at))),
            None => Box::pin(std::future::pending()),
        };
        loop {
            tokio::select! {
                biased;
                _ = stopped(self.shared.shutdown.clone()) => return End::Shutdown,
                _ = closer.notified() => return End::Closed("rebalancing"),
                _ = &mut aged => return End::Closed("max stream age reached"),
                // Its certificate expired: refused by the check, which
                // closes the connection too.
                _ = &mut expired => {
                    if let Some(caller) = &self.caller {
                        if let Err(status) = admit(&self.shared, caller, &self.identity) {
                            return End::Refused(Box::new(status));
                        }
                    }
                    return End::Closed("its client certificate expired");
                }
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        // Boxed (here and below): the task's size is that of
                        // its largest await, and an idle stream waits in
                        // this select, not in a request or a push.
                        if let Err(end) = Box::pin(self.on_request(req)).await {
                            return end;
                        }
                    }
                    Ok(None) => return End::ClientGone,
                    Err(status) => {
                        tracing::debug!(proxy = %self.identity.id, %status, "xDS stream error");
                        // A request refused (too large, too many names, not
                        // protobuf) says why; a client that reset its stream
                        // is gone and reads nothing.
                        return End::Invalid(Box::new(status));
                    }
                },
                changed = self.applied.changed() => {
                    // The store closed: the replica is stopping.
                    if changed.is_err() {
                        return End::Shutdown;
                    }
                    if let Err(end) = Box::pin(self.on_applied()).await {
                        return end;
                    }
                }
                changed = async {
                    match &mut self.refresh {
                        Some(r) => r.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if changed.is_err() {
                        // The fetcher stopped: nothing more will change.
                        self.refresh = None;
                        continue;
                    }
                    let current = self.applied.borrow().clone();
                    if let Err(end) = Box::pin(self.regenerate_with(current, true)).await {
                        return end;
                    }
                }
            }
        }
    }

    async fn on_request(&mut self, req: Box<V::Req>) -> Result<(), End> {
        if let Some(v) = V::client_revision(&req).filter(|v| *v > self.config.revision) {
            self.catch_up(v).await?;
        }
        let (received, response) = self.variant.on_request(&req, &self.config);
        drop(req);
        // Delta subscriptions add up over requests: bound them per type as
        // one request's names are (`service::MAX_NAMES`), and every type's
        // names together by what they hold (SotW too: each type keeps its
        // last request's names).
        let most = self.variant.most_names();
        if most > super::service::MAX_NAMES {
            crate::metrics::metrics().streams_refused.with(&["subscription_limit"]).inc();
            return Err(End::Invalid(Box::new(Status::resource_exhausted(format!(
                "resource_names: a subscription to {most} resources of one type is over the limit of {}",
                super::service::MAX_NAMES
            )))));
        }
        let (bytes, limit) = (self.variant.subscribed_bytes(), self.shared.options.max_subscription_bytes);
        if limit > 0 && bytes > limit {
            crate::metrics::metrics().streams_refused.with(&["subscription_limit"]).inc();
            return Err(End::Invalid(Box::new(Status::resource_exhausted(format!(
                "resource_names: the stream's subscriptions take {bytes} bytes (each name counts {} bytes more than its length), over the limit of {limit} per stream (xds_max_subscription_bytes)",
                super::session::NAME_OVERHEAD
            )))));
        }
        let id = &self.identity.id;
        match received {
            Received::Ack { t, version } => {
                tracing::debug!(proxy = %id, r#type = t.short(), version, "ACK");
                self.handle.acked(t, &version);
            }
            Received::Nack { t, rejected_version, nonce, error } => {
                match self.nack_log.warn(std::time::Instant::now()) {
                    Some(skipped) => {
                        let error = super::session::truncated(&error, super::limits::NACK_LOG_TEXT);
                        tracing::warn!(proxy = %id, r#type = t.short(), version = rejected_version, error, skipped, "NACK: the proxy rejected a response (the last NACK of each type is in /debug/syncz; NACKs are logged once per 10s per stream, `skipped` at debug since)");
                    }
                    None => tracing::debug!(proxy = %id, r#type = t.short(), version = rejected_version, "NACK: the proxy rejected a response"),
                }
                self.handle.nacked(t, &rejected_version, &nonce, &error);
            }
            Received::Stale(t) => tracing::debug!(proxy = %id, r#type = t.short(), "request with a stale nonce ignored"),
            Received::Initial(ResourceType::Secret) | Received::Update(ResourceType::Secret) if self.secrets.is_err() && !self.said_why_no_secrets => {
                self.said_why_no_secrets = true;
                let why = self.secrets.as_ref().err().cloned().unwrap_or_default();
                tracing::warn!(proxy = %id, why, "the proxy asks for secrets (SDS) and is served none");
            }
            Received::Initial(t) | Received::Update(t) => tracing::debug!(proxy = %id, r#type = t.short(), "subscription"),
            Received::UnknownType(url) => tracing::debug!(proxy = %id, type_url = url, "request for a type this server does not serve ignored"),
        }
        match response {
            Some(r) => self.send(r).await,
            None => Ok(()),
        }
    }

    /// The client holds revision `v`, newer than this stream's config: wait
    /// (bounded) until this replica has applied it, and regenerate, before
    /// answering anything; if it cannot, close the stream so the Envoy
    /// reconnects elsewhere, keeping its config.
    async fn catch_up(&mut self, v: u64) -> Result<(), End> {
        let bound = self.shared.options.fence_timeout;
        tracing::info!(proxy = %self.identity.id, client = v, replica = self.config.revision, "xDS: the proxy is ahead of this replica; waiting to catch up");
        let mut latest = self.shared.options.latest.clone().unwrap_or_else(|| self.applied.clone());
        let caught_up = tokio::time::timeout(bound, latest.wait_for(|a| a.revision() >= v)).await.map(|r| r.map(|a| a.clone()));
        match caught_up {
            Ok(Ok(a)) => self.regenerate(a).await?,
            Ok(Err(_)) => return Err(End::Shutdown),
            Err(_) => {
                crate::metrics::metrics().streams_refused.with(&["behind"]).inc();
                return Err(End::Closed("this replica is behind the proxy's config"));
            }
        }
        if self.config.revision < v {
            return Err(End::Closed("this replica is behind the proxy's config"));
        }
        Ok(())
    }

    /// A new applied revision: regenerate from the newest one and push what
    /// changed. A failed generation keeps serving the previous config.
    async fn on_applied(&mut self) -> Result<(), End> {
        let next = self.applied.borrow_and_update().clone();
        self.regenerate(next).await
    }

    /// Regenerate from `next` (if newer than what the stream serves) and
    /// push what changed.
    async fn regenerate(&mut self, next: Arc<Applied>) -> Result<(), End> {
        self.regenerate_with(next, false).await
    }

    /// As `regenerate`; `same_revision`: also at the revision it serves
    /// (an input besides the store changed).
    async fn regenerate_with(&mut self, next: Arc<Applied>, same_revision: bool) -> Result<(), End> {
        if next.revision() < self.config.revision || (next.revision() == self.config.revision && !same_revision) {
            return Ok(());
        }
        // A token revoked or expired since the stream opened, a certificate
        // revoked: nothing more is sent (the revocation is itself a new
        // revision, so an open stream learns of it with the push that
        // follows). A credential no longer a gateway's is served no secrets.
        if let Some(caller) = &self.caller {
            let principal = admit(&self.shared, caller, &self.identity).map_err(|s| End::Refused(Box::new(s)))?;
            match (secrets_for(&self.shared, caller, &principal, &self.identity), &self.secrets) {
                (Ok(_), Ok(_)) | (Err(_), Err(_)) => {}
                (Ok(key), Err(_)) => self.secrets = Ok(Arc::new(super::secrets::SecretSource::new(key, &self.identity))),
                (Err(why), Ok(_)) => {
                    tracing::warn!(proxy = %self.identity.id, why, "the proxy's credential no longer allows it its namespace's secrets; they are withdrawn");
                    self.secrets = Err(why);
                    self.said_why_no_secrets = true;
                }
            }
        }
        let revision = next.revision();
        let started = std::time::Instant::now();
        match generate(&self.shared.generator, &self.identity, next, &self.handle, self.secrets.as_ref().ok()).await {
            Ok(config) => self.config = config,
            Err(e) => {
                tracing::warn!(proxy = %self.identity.id, revision, error = e, "cannot generate the configuration; keeping the previous one");
                return Ok(());
            }
        }
        let responses = self.variant.on_config(&self.config);
        let types: Vec<&'static str> = responses.iter().filter_map(|r| V::type_of(r)).map(|t| t.short()).collect();
        for r in responses {
            self.send(r).await?;
        }
        self.handle.pushed(self.config.revision);
        let took = started.elapsed();
        for t in types {
            crate::metrics::metrics().push_time.with(&[&t.to_ascii_lowercase()]).observe(took);
        }
        Ok(())
    }

    async fn send(&mut self, r: V::Resp) -> Result<(), End> {
        V::record(&self.handle, &r);
        tokio::select! {
            sent = self.tx.send(Ok(Box::new(r))) => sent.map_err(|_| End::ClientGone),
            _ = stopped(self.shared.shutdown.clone()) => Err(End::Shutdown),
        }
    }
}

/// Translation runs on a small fixed pool of threads, one per core: it is
/// CPU work, so more threads would only contend, and a fixed pool bounds how
/// many proxies are translated at once (each stream has at most one
/// generation queued) without creating and destroying threads per push.
struct GeneratePool {
    jobs: std::sync::Mutex<std::sync::mpsc::Sender<Box<dyn FnOnce() + Send>>>,
}

fn pool() -> &'static GeneratePool {
    static POOL: std::sync::OnceLock<GeneratePool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Box<dyn FnOnce() + Send>>();
        let rx = Arc::new(std::sync::Mutex::new(rx));
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).max(2);
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("xds-generate-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
                .expect("spawning an xDS generation thread");
        }
        GeneratePool { jobs: std::sync::Mutex::new(tx) }
    })
}

/// Generate on the pool from one snapshot; the config's revision is that
/// snapshot's.
async fn generate(
    generator: &Arc<dyn Generator>,
    identity: &Arc<ProxyIdentity>,
    applied: Arc<Applied>,
    handle: &StreamHandle,
    secrets: Option<&Arc<super::secrets::SecretSource>>,
) -> Result<Arc<ProxyConfig>, String> {
    let revision = applied.revision();
    let (generator, id, secrets) = (generator.clone(), identity.clone(), secrets.cloned());
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = Box::new(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let config = generator.generate(&id, &applied)?;
            Ok((config, secrets.map(|s| s.resources(&applied))))
        }));
        let _ = tx.send(r.unwrap_or_else(|_| Err("the generator panicked".to_string())));
    });
    let sent = pool().jobs.lock().unwrap_or_else(|e| e.into_inner()).send(job);
    let result = match sent {
        Ok(()) => rx.await.unwrap_or_else(|_| Err("the generation pool is gone".to_string())),
        Err(_) => Err("the generation pool is gone".to_string()),
    };
    match result {
        Ok((mut config, secrets)) => {
            config.revision = revision;
            handle.generated(revision);
            let public = Arc::new(config);
            // What `/debug/config_dump` shows: never the secrets.
            handle.serving(public.clone());
            match secrets.filter(|m| !m.is_empty()) {
                None => Ok(public),
                Some(map) => {
                    let mut config = (*public).clone();
                    config.resources.insert(ResourceType::Secret, map);
                    Ok(Arc::new(config))
                }
            }
        }
        Err(e) => {
            handle.generate_failed(revision, &e);
            Err(e)
        }
    }
}

/// The proxy's identity from the first request's node (its id and
/// metadata), or INVALID_ARGUMENT naming the problem.
pub fn proxy_identity(node: Option<&Node>) -> Result<ProxyIdentity, Status> {
    let node =
        node.ok_or_else(|| Status::invalid_argument("the first request has no node; it must carry node.id (TYPE~IP~NAME.NAMESPACE~NAMESPACE.svc.DOMAIN)"))?;
    let metadata = node.metadata.as_ref().map_or_else(|| Value::Object(Default::default()), struct_to_json);
    ProxyIdentity::parse(&node.id, &metadata).map_err(|e| Status::invalid_argument(format!("node.id: {e}")))
}

/// A protobuf `Struct` (node metadata) as JSON.
pub fn struct_to_json(s: &Struct) -> Value {
    Value::Object(s.fields.iter().map(|(k, v)| (k.clone(), value_to_json(v))).collect())
}

fn value_to_json(v: &PbValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::google::protobuf::ListValue;

    fn s(v: &str) -> PbValue {
        PbValue { kind: Some(Kind::StringValue(v.into())) }
    }

    #[test]
    fn node_identity() {
        let labels = Struct { fields: [("app".to_string(), s("reviews"))].into() };
        let meta = Struct {
            fields: [
                ("NAMESPACE".to_string(), s("bookinfo")),
                ("LABELS".to_string(), PbValue { kind: Some(Kind::StructValue(labels)) }),
                ("LIST".to_string(), PbValue { kind: Some(Kind::ListValue(ListValue { values: vec![s("a")] })) }),
            ]
            .into(),
        };
        let node = Node { id: "sidecar~127.0.0.5~reviews-v1.bookinfo~bookinfo.svc.cluster.local".into(), metadata: Some(meta), ..Default::default() };
        let id = proxy_identity(Some(&node)).unwrap();
        assert_eq!((id.namespace.as_str(), id.labels["app"].as_str()), ("bookinfo", "reviews"));

        let err = proxy_identity(Some(&Node { id: "envoy-1".into(), ..Default::default() })).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("envoy-1"), "{}", err.message());
        assert_eq!(proxy_identity(None).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
