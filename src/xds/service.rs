//! The ADS gRPC service, written out instead of tonic's generated one so
//! that an idle stream holds no buffers.
//!
//! tonic's generated server gives every stream an 8 KiB decode buffer up
//! front, and an encode buffer that grows to the largest burst of
//! responses it ever encoded and keeps that capacity for the stream's life
//! (measured: 16 KiB per idle stream with a 22 KiB initial config). Here
//! requests are decoded by tonic's `Streaming` with a 512-byte initial
//! buffer, and each response is encoded into its own exactly sized frame,
//! freed once written: an idle stream's cost no longer depends on how big
//! its config is. Framing is gRPC's (1-byte flag, 4-byte length), status in
//! the trailers.

use super::server::AdsService;
use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use futures::Stream;
use http_body::Frame;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codec::{BufferSettings, Codec};
use tonic::codegen::{http, Body, Service, StdError};
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// The request decoder's initial buffer (it grows as a message needs).
fn buffer() -> BufferSettings {
    BufferSettings::new(512, 32 * 1024)
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// Largest request accepted (tonic's default).
const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// The ADS server for tonic's router.
#[derive(Clone)]
pub struct AdsServer(pub(super) Arc<AdsService>);

impl NamedService for AdsServer {
    const NAME: &'static str = SERVICE;
}

/// The request stream of `req`, decoded as `Req`, as tonic hands it to a handler.
fn request<B, Req>(req: http::Request<B>) -> Request<Streaming<Req>>
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
    Req: prost::Message + Default + Send + 'static,
{
    let (parts, body) = req.into_parts();
    let decoder = <ProstCodec<(), Req> as Codec>::Decoder::new(buffer());
    Request::from_http(http::Request::from_parts(parts, Streaming::new_request(decoder, body, None, Some(MAX_REQUEST))))
}

/// The handler's answer as an HTTP response: headers now, then one frame
/// per response message, then the status in the trailers.
fn response<S, M>(result: Result<Response<S>, Status>) -> http::Response<tonic::body::Body>
where
    S: Stream<Item = Result<M, Status>> + Send + 'static,
    M: prost::Message + 'static,
{
    match result {
        Err(status) => status.into_http(),
        Ok(resp) => {
            let (metadata, stream, extensions) = resp.into_parts();
            let mut http = http::Response::new(tonic::body::Body::new(Frames { stream: Box::pin(stream), done: false }));
            *http.headers_mut() = metadata.into_headers();
            http.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
            *http.extensions_mut() = extensions;
            http
        }
    }
}

/// A response stream as gRPC frames.
struct Frames<M> {
    stream: Pin<Box<dyn Stream<Item = Result<M, Status>> + Send>>,
    done: bool,
}

impl<M: prost::Message> Body for Frames<M> {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.done {
            return Poll::Ready(None);
        }
        let status = match std::task::ready!(self.stream.as_mut().poll_next(cx)) {
            Some(Ok(message)) => {
                let len = message.encoded_len();
                let Ok(len32) = u32::try_from(len) else {
                    self.done = true;
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers(&Status::internal("response too large"))))));
                };
                let mut buf = BytesMut::with_capacity(5 + len);
                buf.put_u8(0);
                buf.put_u32(len32);
                message.encode_raw(&mut buf);
                return Poll::Ready(Some(Ok(Frame::data(buf.freeze()))));
            }
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        self.done = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

fn trailers(status: &Status) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    if status.add_header(&mut map).is_err() {
        map.insert("grpc-status", http::HeaderValue::from_static("13"));
    }
    map
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
            Some("StreamAggregatedResources") => {
                Box::pin(async move { Ok(response(svc.stream_aggregated_resources(request::<B, DiscoveryRequest>(req)).await)) })
            }
            Some("DeltaAggregatedResources") => {
                Box::pin(async move { Ok(response(svc.delta_aggregated_resources(request::<B, DeltaDiscoveryRequest>(req)).await)) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented(format!("{SERVICE} has no method {}", req.uri().path())).into_http()) }),
        }
    }
}
