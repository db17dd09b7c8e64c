//! The ADS gRPC service as tonic serves it, with small codec buffers.
//!
//! tonic's generated server gives every stream an 8 KiB decode buffer and
//! an 8 KiB encode buffer up front. An idle Envoy's stream needs neither
//! (requests are small, and the encode buffer grows to the largest response
//! anyway), and with thousands of streams per replica those 16 KiB were the
//! largest fixed cost of a stream. This is the generated service with a
//! codec that starts its buffers at 512 bytes; everything else (routing,
//! status codes, message size limits) is tonic's.

use super::server::AdsService;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse};
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{http, Body, Service, StdError};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// Initial codec buffer (they grow as a message needs), and tonic's
/// default yield threshold.
fn buffer() -> BufferSettings {
    BufferSettings::new(512, 32 * 1024)
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// prost encoding with [`buffer`]'s settings.
struct SmallCodec<T, U>(PhantomData<fn() -> (T, U)>);

impl<T, U> Default for SmallCodec<T, U> {
    fn default() -> Self {
        SmallCodec(PhantomData)
    }
}

impl<T, U> Codec for SmallCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(buffer())
    }
    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(buffer())
    }
}

/// The ADS server for tonic's router.
#[derive(Clone)]
pub struct AdsServer(pub(super) Arc<AdsService>);

impl NamedService for AdsServer {
    const NAME: &'static str = SERVICE;
}

struct Sotw(Arc<AdsService>);
struct Delta(Arc<AdsService>);

impl StreamingService<DiscoveryRequest> for Sotw {
    type Response = DiscoveryResponse;
    type ResponseStream = <AdsService as AggregatedDiscoveryService>::StreamAggregatedResourcesStream;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;
    fn call(&mut self, request: Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move { svc.stream_aggregated_resources(request).await })
    }
}

impl StreamingService<DeltaDiscoveryRequest> for Delta {
    type Response = DeltaDiscoveryResponse;
    type ResponseStream = <AdsService as AggregatedDiscoveryService>::DeltaAggregatedResourcesStream;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;
    fn call(&mut self, request: Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        let svc = self.0.clone();
        Box::pin(async move { svc.delta_aggregated_resources(request).await })
    }
}

impl<B> Service<http::Request<B>> for AdsServer
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let svc = self.0.clone();
        match req.uri().path().strip_prefix("/envoy.service.discovery.v3.AggregatedDiscoveryService/") {
            Some("StreamAggregatedResources") => Box::pin(async move { Ok(Grpc::new(SmallCodec::default()).streaming(Sotw(svc), req).await) }),
            Some("DeltaAggregatedResources") => Box::pin(async move { Ok(Grpc::new(SmallCodec::default()).streaming(Delta(svc), req).await) }),
            _ => Box::pin(async move { Ok(Status::unimplemented(format!("{SERVICE} has no method {}", req.uri().path())).into_http()) }),
        }
    }
}
