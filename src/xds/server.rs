//! The ADS server: one task per connected proxy, state of the world and
//! delta, for CDS, EDS, LDS and RDS.
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
use super::session::Received;
use super::sotw::SotwStream;
use super::status::{Protocol, StreamHandle, SyncRegistry};
use crate::model::proxy::ProxyIdentity;
use crate::store::Applied;
use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{AggregatedDiscoveryService, AggregatedDiscoveryServiceServer};
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value as PbValue};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

/// Responses queued per stream before the stream task waits for the
/// client to read. Small: a slow proxy should coalesce revisions, not queue.
const STREAM_BUFFER: usize = 4;

/// HTTP/2 pings find proxies that vanished without closing their streams.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Serve ADS on `listener` until `shutdown` becomes true (or its sender is
/// dropped); then every stream ends cleanly (status OK) and this returns.
///
/// `applied` is the store's applied-state channel
/// (`StoreReader::subscribe_applied`); tests may drive one by hand.
pub async fn serve(
    listener: TcpListener,
    applied: watch::Receiver<Arc<Applied>>,
    generator: Arc<dyn Generator>,
    registry: SyncRegistry,
    shutdown: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let service = AdsService::new(applied, generator, registry, shutdown.clone());
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .add_service(service.into_server())
        // With an incoming stream tonic ignores the builder's tcp_nodelay.
        .serve_with_incoming_shutdown(TcpIncoming::from(listener).with_nodelay(Some(true)), stopped(shutdown))
        .await
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
    shutdown: watch::Receiver<bool>,
}

impl AdsService {
    pub fn new(applied: watch::Receiver<Arc<Applied>>, generator: Arc<dyn Generator>, registry: SyncRegistry, shutdown: watch::Receiver<bool>) -> AdsService {
        AdsService { shared: Arc::new(Shared { applied, generator, registry, shutdown }) }
    }

    pub fn into_server(self) -> AggregatedDiscoveryServiceServer<AdsService> {
        AggregatedDiscoveryServiceServer::new(self)
    }

    /// Read the first request, identify the proxy, generate its config and
    /// start the stream task.
    async fn open<V: Variant>(&self, request: Request<Streaming<V::Req>>) -> Result<Response<ReceiverStream<Result<V::Resp, Status>>>, Status> {
        let mut inbound = request.into_inner();
        let first = tokio::select! {
            m = inbound.message() => m?.ok_or_else(|| Status::invalid_argument("the stream closed before its first request"))?,
            _ = stopped(self.shared.shutdown.clone()) => return Err(Status::unavailable("the server is shutting down")),
        };
        let identity = Arc::new(identity(V::node(&first))?);
        let handle = self.shared.registry.connect(&identity, V::PROTOCOL);
        let mut applied = self.shared.applied.clone();
        let current = applied.borrow_and_update().clone();
        let config = generate(&self.shared.generator, &identity, current, &handle)
            .await
            .map_err(|e| Status::unavailable(format!("cannot generate the configuration of {}: {e}", identity.id)))?;
        tracing::info!(proxy = %identity.id, stream = handle.stream(), protocol = ?V::PROTOCOL, revision = config.revision, "xDS stream opened");
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let stream = StreamTask { shared: self.shared.clone(), identity, handle, applied, tx, config, variant: V::default() };
        tokio::spawn(stream.run(first, inbound));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.open::<SotwStream>(request).await
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.open::<DeltaStream>(request).await
    }
}

/// What the stream task needs from a protocol variant.
trait Variant: Default + Send + 'static {
    type Req: Send + 'static;
    type Resp: Send + 'static;
    const PROTOCOL: Protocol;
    fn node(req: &Self::Req) -> Option<&Node>;
    fn on_request(&mut self, req: &Self::Req, config: &ProxyConfig) -> (Received, Option<Self::Resp>);
    fn on_config(&mut self, config: &ProxyConfig) -> Vec<Self::Resp>;
    fn record(handle: &StreamHandle, resp: &Self::Resp);
}

impl Variant for SotwStream {
    type Req = DiscoveryRequest;
    type Resp = DiscoveryResponse;
    const PROTOCOL: Protocol = Protocol::Sotw;
    fn node(req: &DiscoveryRequest) -> Option<&Node> {
        req.node.as_ref()
    }
    fn on_request(&mut self, req: &DiscoveryRequest, config: &ProxyConfig) -> (Received, Option<DiscoveryResponse>) {
        SotwStream::on_request(self, req, config)
    }
    fn on_config(&mut self, config: &ProxyConfig) -> Vec<DiscoveryResponse> {
        SotwStream::on_config(self, config)
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
    fn on_request(&mut self, req: &DeltaDiscoveryRequest, config: &ProxyConfig) -> (Received, Option<DeltaDiscoveryResponse>) {
        DeltaStream::on_request(self, req, config)
    }
    fn on_config(&mut self, config: &ProxyConfig) -> Vec<DeltaDiscoveryResponse> {
        DeltaStream::on_config(self, config)
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
    tx: mpsc::Sender<Result<V::Resp, Status>>,
    config: Arc<ProxyConfig>,
    variant: V,
}

/// Why a stream stops.
enum End {
    Shutdown,
    ClientGone,
}

impl<V: Variant> StreamTask<V> {
    async fn run(mut self, first: V::Req, mut inbound: Streaming<V::Req>) {
        let end = self.serve(first, &mut inbound).await;
        let why = match end {
            End::Shutdown => "server shutdown",
            End::ClientGone => "client gone",
        };
        tracing::info!(proxy = %self.identity.id, stream = self.handle.stream(), why, "xDS stream closed");
        self.shared.generator.forget(&self.identity.id);
    }

    async fn serve(&mut self, first: V::Req, inbound: &mut Streaming<V::Req>) -> End {
        if let Err(end) = self.on_request(first).await {
            return end;
        }
        loop {
            tokio::select! {
                biased;
                _ = stopped(self.shared.shutdown.clone()) => return End::Shutdown,
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        if let Err(end) = self.on_request(req).await {
                            return end;
                        }
                    }
                    Ok(None) => return End::ClientGone,
                    Err(status) => {
                        tracing::debug!(proxy = %self.identity.id, %status, "xDS stream error");
                        return End::ClientGone;
                    }
                },
                changed = self.applied.changed() => {
                    // The store closed: the replica is stopping.
                    if changed.is_err() {
                        return End::Shutdown;
                    }
                    if let Err(end) = self.on_applied().await {
                        return end;
                    }
                }
            }
        }
    }

    async fn on_request(&mut self, req: V::Req) -> Result<(), End> {
        let (received, response) = self.variant.on_request(&req, &self.config);
        let id = &self.identity.id;
        match received {
            Received::Ack { t, version } => {
                tracing::debug!(proxy = %id, r#type = t.short(), version, "ACK");
                self.handle.acked(t, &version);
            }
            Received::Nack { t, rejected_version, nonce, error } => {
                tracing::warn!(proxy = %id, r#type = t.short(), version = rejected_version, error, "NACK: the proxy rejected a response");
                self.handle.nacked(t, &rejected_version, &nonce, &error);
            }
            Received::Stale(t) => tracing::debug!(proxy = %id, r#type = t.short(), "request with a stale nonce ignored"),
            Received::Initial(t) | Received::Update(t) => tracing::debug!(proxy = %id, r#type = t.short(), "subscription"),
            Received::UnknownType(url) => tracing::debug!(proxy = %id, type_url = url, "request for a type this server does not serve ignored"),
        }
        match response {
            Some(r) => self.send(r).await,
            None => Ok(()),
        }
    }

    /// A new applied revision: regenerate from the newest one and push what
    /// changed. A failed generation keeps serving the previous config.
    async fn on_applied(&mut self) -> Result<(), End> {
        let next = self.applied.borrow_and_update().clone();
        if next.revision() == self.config.revision {
            return Ok(());
        }
        let revision = next.revision();
        match generate(&self.shared.generator, &self.identity, next, &self.handle).await {
            Ok(config) => self.config = config,
            Err(e) => {
                tracing::warn!(proxy = %self.identity.id, revision, error = e, "cannot generate the configuration; keeping the previous one");
                return Ok(());
            }
        }
        for r in self.variant.on_config(&self.config) {
            self.send(r).await?;
        }
        Ok(())
    }

    async fn send(&mut self, r: V::Resp) -> Result<(), End> {
        V::record(&self.handle, &r);
        tokio::select! {
            sent = self.tx.send(Ok(r)) => sent.map_err(|_| End::ClientGone),
            _ = stopped(self.shared.shutdown.clone()) => Err(End::Shutdown),
        }
    }
}

/// Generate off the async threads (translation is CPU work) from one
/// snapshot; the config's revision is that snapshot's.
async fn generate(
    generator: &Arc<dyn Generator>,
    identity: &Arc<ProxyIdentity>,
    applied: Arc<Applied>,
    handle: &StreamHandle,
) -> Result<Arc<ProxyConfig>, String> {
    let revision = applied.revision();
    let (generator, id) = (generator.clone(), identity.clone());
    let result = tokio::task::spawn_blocking(move || generator.generate(&id, &applied)).await.unwrap_or_else(|e| Err(format!("the generator panicked: {e}")));
    match result {
        Ok(mut config) => {
            config.revision = revision;
            handle.generated(revision);
            Ok(Arc::new(config))
        }
        Err(e) => {
            handle.generate_failed(revision, &e);
            Err(e)
        }
    }
}

/// The proxy's identity from the first request's node.
fn identity(node: Option<&Node>) -> Result<ProxyIdentity, Status> {
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
        let id = identity(Some(&node)).unwrap();
        assert_eq!((id.namespace.as_str(), id.labels["app"].as_str()), ("bookinfo", "reviews"));

        let err = identity(Some(&Node { id: "envoy-1".into(), ..Default::default() })).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("envoy-1"), "{}", err.message());
        assert_eq!(identity(None).unwrap_err().code(), tonic::Code::InvalidArgument);
    }
}
