//! The ADS gRPC service, written out instead of tonic's generated one so
//! that an idle stream holds no buffers.
//!
//! tonic's generated server gives every stream an 8 KiB decode buffer up
//! front, and an encode buffer that grows to the largest burst of
//! responses it ever encoded and keeps that capacity for the stream's life
//! (measured: 16 KiB per idle stream with a 22 KiB initial config). Even
//! with a small initial buffer, tonic's `Streaming` keeps whatever its
//! buffer grew to for the stream's life: an Envoy's first request carries
//! its node metadata, so about 3 KiB per stream. Here requests are decoded
//! by [`Requests`], which holds a buffer only while a message is
//! incomplete, and each response is encoded into its own exactly sized
//! frame, freed once written: an idle stream holds no buffer either way,
//! whatever its config or its node. Framing is gRPC's (1-byte flag, 4-byte
//! length), status in the trailers.

use super::server::AdsService;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::Stream;
use http_body::Frame;
use std::convert::Infallible;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::codegen::{http, Body, Service, StdError};
use tonic::server::NamedService;
use tonic::{Response, Status};

const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// Largest request accepted (tonic's default, and istiod's
/// `MaxRecvMsgSize`): a larger one ends the stream with OUT_OF_RANGE once
/// its 5-byte header is read, before any of it is buffered.
const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// Most resource names one request may carry (SotW `resource_names`, delta
/// `resource_names_subscribe`, `resource_names_unsubscribe` and
/// `initial_resource_versions` together). Counted on the wire before the
/// request is decoded: a 4 MiB request of one-byte names would otherwise
/// decode into about a million strings (some 50 MiB) per stream. An Envoy
/// names one resource per cluster or route it uses; this is far above any
/// real mesh.
pub const MAX_NAMES: usize = 100_000;

/// While a message is incomplete, the buffer grows with what arrives, at
/// most this much ahead: a header announcing 4 MiB reserves no 4 MiB.
const MAX_RESERVE: usize = 64 * 1024;

/// The ADS server for tonic's router.
#[derive(Clone)]
pub struct AdsServer(pub(super) Arc<AdsService>);

impl NamedService for AdsServer {
    const NAME: &'static str = SERVICE;
}

/// A request body's data, whatever its concrete type.
trait RequestBody: Send {
    /// The next chunk of data (trailers are skipped), or None at the end.
    fn poll_data(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Status>>>;
}

impl<B> RequestBody for B
where
    B: Body + Send,
    B::Error: Into<StdError>,
{
    fn poll_data(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, Status>>> {
        loop {
            match std::task::ready!(self.as_mut().poll_frame(cx)) {
                None => return Poll::Ready(None),
                Some(Err(e)) => return Poll::Ready(Some(Err(Status::from_error(e.into())))),
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        return Poll::Ready(Some(Ok(data.copy_to_bytes(data.remaining()))));
                    }
                }
            }
        }
    }
}

/// A stream's requests, decoded as they arrive. It holds a buffer only
/// while a message is incomplete: once every received byte is decoded the
/// buffer is released, so an idle stream keeps none, however large the
/// requests were (tonic's `Streaming` keeps what its buffer grew to).
pub struct Requests<Req> {
    body: Pin<Box<dyn RequestBody>>,
    buf: BytesMut,
    ended: bool,
    /// The replica-wide budget `buf`'s bytes are charged to, and how many
    /// are charged now (released as messages are decoded, and on drop).
    budget: Arc<RequestBudget>,
    charged: usize,
    _req: PhantomData<fn() -> Req>,
}

impl<Req> Drop for Requests<Req> {
    fn drop(&mut self) {
        self.budget.release(self.charged);
    }
}

/// Bytes of incomplete requests held across every stream of a replica
/// (`xds_max_buffered_request_bytes`). Each stream is held to one
/// request's limit (4 MiB); without this, many authenticated streams each
/// sending most of a large request could hold that much each.
pub struct RequestBudget {
    limit: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl RequestBudget {
    /// `limit` 0: no limit.
    pub fn new(limit: usize) -> RequestBudget {
        RequestBudget { limit, used: Default::default() }
    }

    fn charge(&self, n: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let charged = self.used.fetch_update(Relaxed, Relaxed, |u| (self.limit == 0 || u + n <= self.limit).then_some(u + n)).is_ok();
        if charged {
            crate::metrics::metrics().xds_request_buffer.inc_by(n as i64);
        }
        charged
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
        crate::metrics::metrics().xds_request_buffer.dec_by(n as i64);
    }

    /// Bytes held now.
    #[cfg(test)]
    fn used(&self) -> usize {
        self.used.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The top-level fields of a request that name resources, counted
/// against [`MAX_NAMES`] before it is decoded.
pub trait NameFields {
    const FIELDS: &'static [u32];
}

/// SotW: `resource_names` (3), `resource_locators` (7).
impl NameFields for envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest {
    const FIELDS: &'static [u32] = &[3, 7];
}

/// Delta: `resource_names_subscribe` (3), `resource_names_unsubscribe`
/// (4), `initial_resource_versions` (5), `resource_locators_subscribe` (8)
/// and `_unsubscribe` (9).
impl NameFields for envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest {
    const FIELDS: &'static [u32] = &[3, 4, 5, 8, 9];
}

impl<Req: prost::Message + Default + NameFields> Requests<Req> {
    fn new<B>(body: B, budget: Arc<RequestBudget>) -> Self
    where
        B: Body + Send + 'static,
        B::Error: Into<StdError>,
    {
        Requests { body: Box::pin(body), buf: BytesMut::new(), ended: false, budget, charged: 0, _req: PhantomData }
    }

    /// The next request, or None when the client ended the stream.
    /// Cancel-safe: received bytes stay buffered across calls. Boxed: a
    /// request (an Envoy's node inline) is large, and whoever awaits this
    /// in a loop would otherwise keep room for one in its idle state.
    pub async fn message(&mut self) -> Result<Option<Box<Req>>, Status> {
        loop {
            if let Some(request) = self.decode_buffered()? {
                return Ok(Some(request));
            }
            if self.ended {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(Status::internal(format!("the request stream ended inside a message ({} bytes)", self.buf.len())));
            }
            match std::future::poll_fn(|cx| self.body.as_mut().poll_data(cx)).await {
                None => self.ended = true,
                Some(Err(status)) => return Err(status),
                Some(Ok(data)) => {
                    if !self.budget.charge(data.len()) {
                        crate::metrics::metrics().streams_refused.with(&["request_buffer_full"]).inc();
                        return Err(Status::resource_exhausted(format!(
                            "this replica holds its limit of {} bytes of incomplete requests across streams (xds_max_buffered_request_bytes); reconnect later or to another replica",
                            self.budget.limit
                        )));
                    }
                    self.charged += data.len();
                    self.buf.extend_from_slice(&data);
                }
            }
        }
    }

    /// One whole message from the buffer, if it holds one.
    fn decode_buffered(&mut self) -> Result<Option<Box<Req>>, Status> {
        match decode_frame::<Req>(&self.buf)? {
            Decoded::Incomplete(whole) => {
                self.buf.reserve(whole.saturating_sub(self.buf.len()).min(MAX_RESERVE));
                Ok(None)
            }
            Decoded::Request(request, used) => {
                self.buf.advance(used);
                if self.buf.is_empty() {
                    self.buf = BytesMut::new();
                }
                self.budget.release(self.charged - self.buf.len());
                self.charged = self.buf.len();
                Ok(Some(request))
            }
        }
    }
}

/// What the front of a stream's received bytes holds.
#[derive(Debug)]
pub enum Decoded<Req> {
    /// Not a whole message yet: it takes this many bytes, header included
    /// (5 while the header itself is incomplete).
    Incomplete(usize),
    /// A request, and how many bytes it took.
    Request(Box<Req>, usize),
}

/// One gRPC-framed request from the front of `buf`, with every
/// per-request limit checked before anything is decoded: no compression,
/// at most [`MAX_REQUEST`] bytes, at most [`MAX_NAMES`] names, protobuf.
/// What [`Requests`] does with the bytes a stream receives; public for the
/// fuzz target (`fuzz/fuzz_targets/xds.rs`).
pub fn decode_frame<Req: prost::Message + Default + NameFields>(buf: &[u8]) -> Result<Decoded<Req>, Status> {
    let Some(header) = buf.get(..5) else { return Ok(Decoded::Incomplete(5)) };
    if header[0] != 0 {
        return Err(Status::unimplemented("compressed requests are not supported"));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if len > MAX_REQUEST {
        return Err(Status::out_of_range(format!("a request of {len} bytes is over the {MAX_REQUEST}-byte limit")));
    }
    let Some(body) = buf.get(5..5 + len) else { return Ok(Decoded::Incomplete(5 + len)) };
    let names = count_names(body, Req::FIELDS).map_err(|e| Status::invalid_argument(format!("undecodable request: {e}")))?;
    if names > MAX_NAMES {
        return Err(Status::resource_exhausted(format!("resource_names: a request naming {names} resources is over the limit of {MAX_NAMES} per request")));
    }
    let request = Box::new(Req::decode(body).map_err(|e| Status::invalid_argument(format!("undecodable request: {e}")))?);
    Ok(Decoded::Request(request, 5 + len))
}

/// How many length-delimited top-level `fields` an encoded request holds
/// (each element of a repeated field or map is one). Walks the wire format
/// without allocating; Err if it is not protobuf.
fn count_names(mut body: &[u8], fields: &[u32]) -> Result<usize, &'static str> {
    fn varint(b: &mut &[u8]) -> Result<u64, &'static str> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first().ok_or("truncated varint")?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint over 10 bytes")
    }
    let mut names = 0;
    while !body.is_empty() {
        let key = varint(&mut body)?;
        let skip = match key & 7 {
            0 => {
                varint(&mut body)?;
                0
            }
            1 => 8,
            2 => usize::try_from(varint(&mut body)?).map_err(|_| "length too large")?,
            5 => 4,
            _ => return Err("unsupported wire type"),
        };
        body = body.get(skip..).ok_or("field runs past the end")?;
        if key & 7 == 2 && fields.iter().any(|&f| u64::from(f) == key >> 3) {
            names += 1;
        }
    }
    Ok(names)
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

/// What a stream presents: the `authorization` metadata (`Bearer
/// <secret>`; a malformed value is kept as an error, never quoted), the
/// client certificate's identity, and the remote address.
pub(super) struct StreamCaller {
    pub bearer: Result<Option<String>, &'static str>,
    pub peer: Option<crate::state::access::PeerIdentity>,
    pub remote: Option<std::net::SocketAddr>,
    /// The client certificate chain, until the stream opens (a SPIFFE id
    /// counts only from a certificate of the mesh CA).
    pub chain: Vec<rustls::pki_types::CertificateDer<'static>>,
    /// The connection is TLS: secrets (private keys) are served only then.
    pub tls: bool,
    /// The mesh certificate the connection was authenticated with, once
    /// the stream verified it (its expiry and the deny list are checked
    /// again while the stream lives).
    pub mesh_cert: Option<crate::state::access::index::CertFacts>,
    /// Why a client certificate naming a SPIFFE id is no current mesh
    /// certificate (expired, another CA's), for the refusal.
    pub mesh_cert_refused: Option<String>,
    /// Closes the connection (see `tls::conn::Closer`).
    pub closer: Option<crate::tls::conn::Closer>,
}

fn caller<B>(req: &http::Request<B>) -> StreamCaller {
    let conn = req.extensions().get::<crate::tls::conn::ConnInfo>();
    let bearer = match req.headers().get(http::header::AUTHORIZATION) {
        None => Ok(None),
        Some(v) => v.to_str().map_err(|_| "malformed authorization: expected `Bearer <secret>`").and_then(crate::state::access::parse_bearer).map(Some),
    };
    let cert = conn.and_then(|c| c.cert.as_ref());
    StreamCaller {
        bearer,
        peer: cert.map(|c| crate::state::access::PeerIdentity(c.identity())),
        remote: conn.map(|c| c.remote),
        chain: cert.map(|c| c.chain.clone()).unwrap_or_default(),
        tls: conn.is_some_and(|c| c.tls),
        mesh_cert: None,
        mesh_cert_refused: None,
        closer: conn.map(|c| c.closer.clone()),
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
        let caller = caller(&req);
        match req.uri().path().strip_prefix("/envoy.service.discovery.v3.AggregatedDiscoveryService/") {
            Some("StreamAggregatedResources") => {
                let budget = svc.request_budget();
                Box::pin(async move { Ok(response(svc.sotw(caller, Requests::new(req.into_body(), budget)).await)) })
            }
            Some("DeltaAggregatedResources") => {
                let budget = svc.request_budget();
                Box::pin(async move { Ok(response(svc.delta(caller, Requests::new(req.into_body(), budget)).await)) })
            }
            _ => Box::pin(async move { Ok(Status::unimplemented(format!("{SERVICE} has no method {}", req.uri().path())).into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use prost::Message;
    use std::collections::VecDeque;

    /// A request body that yields the given chunks, then ends.
    struct Chunks(VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    fn framed(req: &DiscoveryRequest) -> Vec<u8> {
        let body = req.encode_to_vec();
        let mut out = vec![0];
        out.extend((body.len() as u32).to_be_bytes());
        out.extend(body);
        out
    }

    fn request(n: usize) -> DiscoveryRequest {
        DiscoveryRequest { type_url: format!("type-{n}"), resource_names: vec!["x".repeat(100 * n)], ..Default::default() }
    }

    fn requests(chunks: Vec<Vec<u8>>) -> Requests<DiscoveryRequest> {
        Requests::new(Chunks(chunks.into_iter().map(Bytes::from).collect()), Arc::new(RequestBudget::new(0)))
    }

    #[tokio::test]
    async fn messages_split_and_joined_across_chunks_decode_in_order_and_leave_no_buffer() {
        let all: Vec<u8> = (1..=3).flat_map(|n| framed(&request(n))).collect();
        // Cut inside the first header, inside the first body, and so that
        // the second and third messages share a chunk.
        let cut = [3, 40, framed(&request(1)).len() + 2];
        let chunks = vec![all[..cut[0]].to_vec(), all[cut[0]..cut[1]].to_vec(), all[cut[1]..cut[2]].to_vec(), all[cut[2]..].to_vec()];
        let mut r = requests(chunks);
        for n in 1..=3 {
            assert_eq!(r.message().await.unwrap(), Some(Box::new(request(n))));
        }
        assert_eq!(r.buf.capacity(), 0, "an idle stream holds no buffer");
        assert_eq!(r.message().await.unwrap(), None);
    }

    #[tokio::test]
    async fn bad_framing_is_an_error_naming_the_problem() {
        let mut compressed = framed(&request(1));
        compressed[0] = 1;
        assert_eq!(requests(vec![compressed]).message().await.unwrap_err().code(), tonic::Code::Unimplemented);

        let mut huge = vec![0];
        huge.extend(((MAX_REQUEST + 1) as u32).to_be_bytes());
        let e = requests(vec![huge]).message().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert!(e.message().contains("limit"), "{}", e.message());

        // Garbage where a request should be: INVALID_ARGUMENT.
        let mut garbage = vec![0, 0, 0, 0, 4];
        garbage.extend([0xff, 0xff, 0xff, 0xff]);
        let e = requests(vec![garbage]).message().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{}", e.message());

        let whole = framed(&request(2));
        let e = requests(vec![whole[..whole.len() - 1].to_vec()]).message().await.unwrap_err();
        assert!(e.message().contains("ended inside a message"), "{}", e.message());
    }

    /// A header announcing a large message reserves no more than
    /// `MAX_RESERVE` until the bytes arrive.
    #[tokio::test]
    async fn an_announced_length_is_not_allocated_up_front() {
        let mut header = vec![0];
        header.extend(((MAX_REQUEST - 1) as u32).to_be_bytes());
        let mut r = requests(vec![header]);
        assert!(r.message().await.is_err(), "the stream ended inside the message");
        assert!(r.buf.capacity() <= 5 + MAX_RESERVE, "reserved {} bytes for a message not received", r.buf.capacity());
    }

    /// The replica-wide budget: bytes of an incomplete request are charged
    /// while held and released once decoded or when the stream ends; a
    /// stream whose bytes would go over it ends RESOURCE_EXHAUSTED.
    #[tokio::test]
    async fn incomplete_requests_are_charged_to_the_replica_budget() {
        let whole = framed(&request(3));
        let budget = Arc::new(RequestBudget::new(whole.len()));
        let mut r: Requests<DiscoveryRequest> = Requests::new(Chunks(VecDeque::from([Bytes::from(whole.clone())])), budget.clone());
        assert_eq!(r.message().await.unwrap(), Some(Box::new(request(3))));
        assert_eq!(budget.used(), 0, "a decoded request is released");
        // One stream holds most of a request; a second cannot take more
        // than what is left, and gets it back when the first ends.
        let held = whole[..whole.len() - 1].to_vec();
        let mut first: Requests<DiscoveryRequest> = Requests::new(Pending(Some(Bytes::from(held))), budget.clone());
        assert!(tokio::time::timeout(std::time::Duration::from_millis(50), first.message()).await.is_err(), "waits for the rest");
        assert_eq!(budget.used(), whole.len() - 1);
        let mut second: Requests<DiscoveryRequest> = Requests::new(Chunks(VecDeque::from([Bytes::from(whole.clone())])), budget.clone());
        let e = second.message().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("xds_max_buffered_request_bytes"), "{}", e.message());
        drop(first);
        assert_eq!(budget.used(), 0, "an ended stream releases what it held");
        let mut third: Requests<DiscoveryRequest> = Requests::new(Chunks(VecDeque::from([Bytes::from(whole)])), budget.clone());
        assert_eq!(third.message().await.unwrap(), Some(Box::new(request(3))));
    }

    /// A body that yields one chunk, then never ends.
    struct Pending(Option<Bytes>);

    impl Body for Pending {
        type Data = Bytes;
        type Error = Infallible;
        fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            match self.0.take() {
                Some(b) => Poll::Ready(Some(Ok(Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    /// Too many names in one request: RESOURCE_EXHAUSTED naming the field,
    /// counted before decoding. At the limit it decodes.
    #[tokio::test]
    async fn too_many_resource_names_are_refused_before_decoding() {
        let names = |n: usize| DiscoveryRequest { type_url: "t".into(), resource_names: vec!["a".into(); n], ..Default::default() };
        let e = requests(vec![framed(&names(MAX_NAMES + 1))]).message().await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("resource_names") && e.message().contains(&MAX_NAMES.to_string()), "{}", e.message());
        let ok = requests(vec![framed(&names(MAX_NAMES))]).message().await.unwrap().unwrap();
        assert_eq!(ok.resource_names.len(), MAX_NAMES);

        use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
        let delta = DeltaDiscoveryRequest {
            resource_names_subscribe: vec!["a".into(); MAX_NAMES / 2],
            resource_names_unsubscribe: vec!["b".into(); MAX_NAMES / 2],
            initial_resource_versions: [("c".to_string(), "1".to_string())].into(),
            ..Default::default()
        };
        let body = delta.encode_to_vec();
        let mut frame = vec![0];
        frame.extend((body.len() as u32).to_be_bytes());
        frame.extend(body);
        let mut r: Requests<DeltaDiscoveryRequest> = Requests::new(Chunks(VecDeque::from([Bytes::from(frame)])), Arc::new(RequestBudget::new(0)));
        assert_eq!(r.message().await.unwrap_err().code(), tonic::Code::ResourceExhausted);
        assert_eq!(count_names(&names(7).encode_to_vec(), DiscoveryRequest::FIELDS), Ok(7));
    }
}
