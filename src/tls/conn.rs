//! Accepted connections, plain or TLS, with who is on the other end, and
//! the limits that keep one client from holding a port.
//!
//! [`Incoming`] accepts TCP connections and runs each TLS handshake on its
//! own task (a slow or silent client holds up nobody), handing over only
//! connections whose handshake completed. It feeds tonic (as a stream of
//! `Conn`) and the API's HTTP server (`api::serve`), so the API, xDS and
//! raft ports share one accept path. Every connection carries a
//! [`ConnInfo`]: the remote address and, when the client presented a
//! certificate the CA verified, its identities. tonic puts it into each
//! request's extensions.
//!
//! Each port has [`Limits`]: connections open at once (handshakes
//! included), and of them from one source address (an IPv6 client: its
//! /64); past either, a new connection is closed as it is accepted and
//! counted in `lodestar_connections_refused_total`. A handshake that takes
//! too long is dropped. A connection with no request in progress for the
//! idle timeout is closed: [`Activity`] counts a connection's requests
//! (from the request's arrival until its response body is done, so an xDS
//! stream counts for as long as it is open, however quiet), and
//! [`Conn`]'s reads end once it has been at zero for that long. A client
//! that connects and says nothing, or dribbles a request's headers, is cut
//! off by the same clock; Envoys' idle streams are not.

use super::{Port, Tls};
use futures::task::AtomicWaker;
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// What the accept path counts, by port. The replica's metrics implement
/// it (`lodestar_connections`, `lodestar_connections_refused_total`,
/// `lodestar_connections_closed_total`); `()` counts nothing.
pub trait ConnCounters: Send + Sync + 'static {
    /// A connection took a place (`+1`, handshake included) or gave it back (`-1`).
    fn open(&self, port: Port, delta: i64);
    /// A connection closed as it was accepted, over a limit: `port_limit`, `source_limit`.
    fn refused(&self, port: Port, reason: &'static str);
    /// A connection the server closed: `idle`, `handshake_timeout`.
    fn closed(&self, port: Port, reason: &'static str);
}

impl ConnCounters for () {
    fn open(&self, _: Port, _: i64) {}
    fn refused(&self, _: Port, _: &'static str) {}
    fn closed(&self, _: Port, _: &'static str) {}
}

/// Completed handshakes waiting to be served.
const BACKLOG: usize = 1024;
/// At most one warning per port this often about refused connections.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// The identities in a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    pub dns_names: Vec<String>,
    pub uris: Vec<String>,
    /// The certificate's serial, hex.
    pub serial: String,
    /// The chain as presented, leaf first (the mesh CA checks a renewing
    /// workload's against its own root).
    pub chain: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl PeerCert {
    /// The member id the certificate names (`member-<id>.lodestar`).
    pub fn member(&self) -> Option<u64> {
        self.dns_names.iter().find_map(|n| super::pki::member_of(n))
    }

    pub fn parse(der: &[u8]) -> Option<PeerCert> {
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let (mut dns_names, mut uris) = (Vec::new(), Vec::new());
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    x509_parser::extensions::GeneralName::DNSName(n) => dns_names.push(n.to_string()),
                    x509_parser::extensions::GeneralName::URI(u) => uris.push(u.to_string()),
                    _ => {}
                }
            }
        }
        Some(PeerCert { dns_names, uris, serial: cert.raw_serial_as_string(), chain: vec![rustls::pki_types::CertificateDer::from(der.to_vec())] })
    }

    /// The leaf certificate the other side of a handshake presented.
    pub fn of(session: &rustls::CommonState) -> Option<Arc<PeerCert>> {
        let chain = session.peer_certificates()?;
        let mut cert = PeerCert::parse(chain.first()?)?;
        cert.chain = chain.iter().map(|c| c.clone().into_owned()).collect();
        Some(Arc::new(cert))
    }

    /// How audit lines and errors name it: its first URI or DNS name.
    pub fn identity(&self) -> String {
        self.uris.first().or(self.dns_names.first()).cloned().unwrap_or_else(|| format!("certificate {}", self.serial))
    }
}

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    pub remote: SocketAddr,
    /// The client's certificate, verified by the CA; None on plaintext or
    /// when the client presented none.
    pub cert: Option<Arc<PeerCert>>,
    /// The connection is TLS (what a private key may travel over).
    pub tls: bool,
    /// Ends the connection from the server's side (see [`Closer`]).
    pub closer: Closer,
    /// The connection's requests in progress, on a port with an idle
    /// timeout (see [`Activity`]); None otherwise, and on the client side.
    pub activity: Option<Arc<Activity>>,
}

/// Ends a connection from the server's side: its reads see the end of the
/// stream, so the HTTP/2 server closes it and the client dials again. The
/// credential of a TLS connection is the client certificate of its
/// handshake: a stream that ends because that certificate expired or was
/// revoked closes its connection, else a client would retry on the same
/// connection, with the same certificate, forever (`xds::server`).
#[derive(Debug, Clone, Default)]
pub struct Closer(Arc<CloserState>);

#[derive(Debug, Default)]
struct CloserState {
    closed: AtomicBool,
    reader: AtomicWaker,
}

impl Closer {
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.reader.wake();
    }

    /// Close after `delay`: time for a refusal's status to reach the
    /// client before its connection goes.
    pub fn close_after(&self, delay: Duration) {
        let closer = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            closer.close();
        });
    }

    /// Whether it is closed; if not, `cx` is woken when it is.
    fn poll_closed(&self, cx: &Context<'_>) -> bool {
        if self.0.closed.load(Ordering::Acquire) {
            return true;
        }
        self.0.reader.register(cx.waker());
        self.0.closed.load(Ordering::Acquire)
    }
}

impl ConnInfo {
    /// A connection this side dialled, or one accepted without limits.
    pub fn new(remote: SocketAddr, cert: Option<Arc<PeerCert>>, tls: bool) -> ConnInfo {
        ConnInfo { remote, cert, tls, activity: None, closer: Closer::default() }
    }
}

/// The connection limits of one port (`ServerConfig`: `api_max_connections`
/// and the like; see `ops/lodestar.toml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, handshakes included; 0: no limit.
    pub max: usize,
    /// Of them, from one source address (IPv6: one /64); 0: no limit.
    pub per_source: usize,
    /// A TLS handshake that takes longer is dropped.
    pub handshake_timeout: Duration,
    /// A connection with no request in progress for this long is closed;
    /// None: never.
    pub idle_timeout: Option<Duration>,
}

impl Default for Limits {
    /// No limits but a 10 s handshake.
    fn default() -> Self {
        Limits { max: 0, per_source: 0, handshake_timeout: Duration::from_secs(10), idle_timeout: None }
    }
}

/// The requests in progress on one connection, and since when it has had
/// none. A request counts from its arrival until its response (body
/// included: a stream) is done or dropped: hold a [`RequestGuard`].
#[derive(Debug)]
pub struct Activity {
    /// When the connection was accepted (tokio's clock: tests pause it).
    accepted: tokio::time::Instant,
    open: AtomicUsize,
    /// When `open` last fell to zero, in milliseconds since `accepted`.
    idle_since_ms: AtomicU64,
    /// The connection's reader, woken when `open` falls to zero so that it
    /// starts the idle clock.
    reader: AtomicWaker,
}

impl Activity {
    fn new() -> Arc<Activity> {
        Arc::new(Activity { accepted: tokio::time::Instant::now(), open: AtomicUsize::new(0), idle_since_ms: AtomicU64::new(0), reader: AtomicWaker::new() })
    }

    /// Since when the connection has had no request in progress; None
    /// while it has one.
    fn idle_since(&self) -> Option<tokio::time::Instant> {
        if self.open.load(Ordering::Acquire) > 0 {
            return None;
        }
        Some(self.accepted + Duration::from_millis(self.idle_since_ms.load(Ordering::Acquire)))
    }
}

/// One request in progress on a connection (see [`Activity`]).
#[derive(Debug)]
pub struct RequestGuard(Option<Arc<Activity>>);

impl RequestGuard {
    /// For a request on the connection `info` describes (nothing to count
    /// where the port has no idle timeout).
    pub fn new(info: Option<&ConnInfo>) -> RequestGuard {
        let activity = info.and_then(|i| i.activity.clone());
        if let Some(a) = &activity {
            a.open.fetch_add(1, Ordering::AcqRel);
        }
        RequestGuard(activity)
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        if let Some(a) = &self.0 {
            a.idle_since_ms.store(a.accepted.elapsed().as_millis() as u64, Ordering::Release);
            if a.open.fetch_sub(1, Ordering::AcqRel) == 1 {
                a.reader.wake();
            }
        }
    }
}

/// A response body that holds its request's [`RequestGuard`] until it is
/// done (or dropped).
pub struct Guarded<B> {
    body: B,
    guard: Option<RequestGuard>,
}

impl<B> Guarded<B> {
    pub fn new(body: B, guard: RequestGuard) -> Guarded<B> {
        Guarded { body, guard: Some(guard) }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Guarded<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let frame = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(frame, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.guard = None;
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A tonic service whose requests count on their connection's
/// [`Activity`] (the xDS port's, for its idle timeout).
#[derive(Clone)]
pub struct Tracked<S>(pub S);

impl<S: tonic::server::NamedService> tonic::server::NamedService for Tracked<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, RB> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Tracked<S>
where
    S: tonic::codegen::Service<tonic::codegen::http::Request<B>, Response = tonic::codegen::http::Response<RB>>,
    S::Future: Send + 'static,
    // Any response body tonic can box (an intercepted service's is not
    // tonic's own `Body`).
    RB: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RB::Error: Into<tonic::codegen::StdError>,
{
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let guard = RequestGuard::new(req.extensions().get::<ConnInfo>());
        let response = self.0.call(req);
        Box::pin(async move { Ok(response.await?.map(|body| tonic::body::Body::new(Guarded::new(tonic::body::Body::new(body), guard)))) })
    }
}

/// How many connections a port has open, in all and per source.
struct Slots {
    port: Port,
    limits: Limits,
    counters: Arc<dyn ConnCounters>,
    open: AtomicUsize,
    by_source: Mutex<HashMap<IpAddr, usize>>,
    /// When the last refusal was logged, in milliseconds since `started`
    /// (0: never).
    logged_ms: AtomicU64,
    started: Instant,
}

/// One connection's place in its port's [`Slots`]; freed when dropped.
struct Slot {
    slots: Arc<Slots>,
    source: IpAddr,
}

/// Connections are counted per source address; an IPv6 client usually
/// holds a whole /64, so that is one source.
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Slots {
    /// A place for a connection from `ip`, or why there is none.
    fn admit(self: &Arc<Slots>, ip: IpAddr) -> Result<Slot, &'static str> {
        let source = source_of(ip);
        let mut by_source = self.by_source.lock().unwrap_or_else(|p| p.into_inner());
        if self.limits.max > 0 && self.open.load(Ordering::Relaxed) >= self.limits.max {
            return Err("port_limit");
        }
        let n = by_source.entry(source).or_default();
        if self.limits.per_source > 0 && *n >= self.limits.per_source {
            return Err("source_limit");
        }
        *n += 1;
        self.open.fetch_add(1, Ordering::Relaxed);
        self.counters.open(self.port, 1);
        Ok(Slot { slots: self.clone(), source })
    }

    /// Count a refusal; warn about it now and then.
    fn refused(&self, remote: SocketAddr, reason: &'static str) {
        self.counters.refused(self.port, reason);
        let (now, last) = (self.started.elapsed().as_millis() as u64, self.logged_ms.load(Ordering::Relaxed));
        let due = last == 0 || now.saturating_sub(last) >= REFUSAL_LOG_EVERY.as_millis() as u64;
        if due && self.logged_ms.compare_exchange(last, now.max(1), Ordering::Relaxed, Ordering::Relaxed).is_ok() {
            let port = self.port.name();
            let (limit, setting) = match reason {
                "port_limit" => (self.limits.max, format!("{port}_max_connections")),
                _ => (self.limits.per_source, format!("{port}_max_connections_per_source")),
            };
            tracing::warn!(%remote, port, limit, setting, "refused connections at the limit (counted in lodestar_connections_refused_total; this is logged at most every 10 s)");
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut by_source = self.slots.by_source.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                by_source.remove(&self.source);
            }
        }
        self.slots.open.fetch_sub(1, Ordering::Relaxed);
        self.slots.counters.open(self.slots.port, -1);
    }
}

/// Ends a connection's reads once it has had no request in progress for
/// its port's idle timeout.
struct IdleClose {
    timeout: Duration,
    activity: Arc<Activity>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    port: Port,
    counters: Arc<dyn ConnCounters>,
    expired: bool,
}

impl IdleClose {
    /// Whether the connection has been idle for too long; otherwise arms
    /// the timer (and the activity's waker) to look again.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        if self.expired {
            return true;
        }
        self.activity.reader.register(cx.waker());
        let Some(since) = self.activity.idle_since() else {
            self.timer = None;
            return false;
        };
        let deadline = since + self.timeout;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if timer.deadline() != deadline {
            timer.as_mut().reset(deadline);
        }
        if timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        self.expired = true;
        self.counters.closed(self.port, "idle");
        true
    }
}

/// The byte stream of a connection.
enum Io {
    Plain(TcpStream),
    /// Either side: replicas dial each other with the same type.
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

/// A connection, accepted or dialled.
pub struct Conn {
    io: Io,
    info: ConnInfo,
    idle: Option<IdleClose>,
    /// Its place in the port's limits, freed when the connection closes.
    _slot: Option<Slot>,
}

impl Conn {
    pub fn plain(tcp: TcpStream, info: ConnInfo) -> Conn {
        Conn { io: Io::Plain(tcp), info, idle: None, _slot: None }
    }

    pub fn tls(stream: tokio_rustls::TlsStream<TcpStream>, info: ConnInfo) -> Conn {
        Conn { io: Io::Tls(Box::new(stream)), info, idle: None, _slot: None }
    }

    pub fn info(&self) -> &ConnInfo {
        &self.info
    }

    /// Accepted under `slots`' limits: the idle timeout applies.
    fn limited(mut self, slot: Slot) -> Conn {
        if let Some(timeout) = slot.slots.limits.idle_timeout {
            let activity = Activity::new();
            self.info.activity = Some(activity.clone());
            self.idle = Some(IdleClose { timeout, activity, timer: None, port: slot.slots.port, counters: slot.slots.counters.clone(), expired: false });
        }
        self._slot = Some(slot);
        self
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match &mut $self.get_mut().io {
            Io::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Io::Tls($s) => {
                let $s = Pin::new($s.as_mut());
                $e
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        // Closed by the server (a credential that ended), or idle too long:
        // the end of the stream, as if the client had closed it.
        if self.info.closer.poll_closed(cx) || self.idle.as_mut().is_some_and(|i| i.expired(cx)) {
            return Poll::Ready(Ok(()));
        }
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Conn {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }
    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        match &self.io {
            Io::Plain(s) => s.is_write_vectored(),
            Io::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        self.info().clone()
    }
}

/// Accepted connections of one port, handshakes done.
pub struct Incoming {
    rx: mpsc::Receiver<Conn>,
    local: SocketAddr,
}

impl Incoming {
    /// Accept on `listener` for `port` under `limits`: TLS with the port's
    /// current configuration when `tls` is set (read per connection, so
    /// reloaded certificates apply to new connections only), plaintext
    /// otherwise; counted in `counters`.
    pub fn new(listener: TcpListener, port: Port, tls: Option<Arc<Tls>>, limits: Limits, counters: Arc<dyn ConnCounters>) -> io::Result<Incoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(BACKLOG);
        let slots = Arc::new(Slots {
            port,
            limits,
            counters,
            open: AtomicUsize::new(0),
            by_source: Mutex::default(),
            logged_ms: AtomicU64::new(0),
            started: Instant::now(),
        });
        tokio::spawn(accept_loop(listener, slots, tls, tx));
        Ok(Incoming { rx, local })
    }

    /// As a stream, for tonic's `serve_with_incoming`.
    pub fn into_stream(self) -> impl futures::Stream<Item = io::Result<Conn>> + Send + 'static {
        futures::stream::unfold(self.rx, |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) })
    }

    /// The next connection; None once the accept loop is gone (the
    /// listener failed for good).
    pub async fn next(&mut self) -> Option<Conn> {
        self.rx.recv().await
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

async fn accept_loop(listener: TcpListener, slots: Arc<Slots>, tls: Option<Arc<Tls>>, tx: mpsc::Sender<Conn>) {
    let port = slots.port;
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::warn!(error = %e, port = port.name(), "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if tx.is_closed() {
            return;
        }
        // Over a limit: closed at once (dropped), before any TLS work.
        let slot = match slots.admit(remote.ip()) {
            Ok(slot) => slot,
            Err(reason) => {
                slots.refused(remote, reason);
                continue;
            }
        };
        // TCP_NODELAY: gRPC replies are several small writes (headers,
        // data, trailers); with Nagle they wait for a delayed ACK.
        let _ = tcp.set_nodelay(true);
        let Some(tls) = tls.clone() else {
            if tx.send(Conn::plain(tcp, ConnInfo::new(remote, None, false)).limited(slot)).await.is_err() {
                return;
            }
            continue;
        };
        let tx = tx.clone();
        let (timeout, counters) = (slots.limits.handshake_timeout, slots.counters.clone());
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config(port));
            match tokio::time::timeout(timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let cert = PeerCert::of(stream.get_ref().1);
                    let _ = tx.send(Conn::tls(stream.into(), ConnInfo::new(remote, cert, true)).limited(slot)).await;
                }
                // Plaintext to a TLS port, an unknown CA, a port scan: the
                // client is told by the failed handshake; nothing to serve.
                Ok(Err(e)) => tracing::debug!(%remote, port = port.name(), error = %e, "TLS handshake failed"),
                Err(_) => {
                    counters.closed(port, "handshake_timeout");
                    tracing::debug!(%remote, port = port.name(), "TLS handshake timed out");
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(max: usize, per_source: usize) -> Arc<Slots> {
        let limits = Limits { max, per_source, ..Limits::default() };
        Arc::new(Slots {
            port: Port::Api,
            limits,
            counters: Arc::new(()),
            open: AtomicUsize::new(0),
            by_source: Mutex::default(),
            logged_ms: AtomicU64::new(0),
            started: Instant::now(),
        })
    }

    #[test]
    fn connections_are_capped_per_port_and_per_source() {
        let s = slots(5, 2);
        let ip = |x: &str| x.parse::<IpAddr>().unwrap();
        let a1 = s.admit(ip("127.0.0.1")).unwrap();
        let _a2 = s.admit(ip("127.0.0.1")).unwrap();
        assert_eq!(s.admit(ip("127.0.0.1")).err(), Some("source_limit"));
        // An IPv6 client's /64 is one source; the mapped form of an IPv4
        // address is that address.
        let _b1 = s.admit(ip("2001:db8::1")).unwrap();
        let _b2 = s.admit(ip("2001:db8::2:3")).unwrap();
        assert_eq!(s.admit(ip("2001:db8::ffff")).err(), Some("source_limit"));
        assert_eq!(s.admit(ip("::ffff:127.0.0.1")).err(), Some("source_limit"));
        let _c = s.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(s.admit(ip("10.0.0.2")).err(), Some("port_limit"));
        // A closed connection frees its places.
        drop(a1);
        let _a3 = s.admit(ip("127.0.0.1")).unwrap();
        assert_eq!(s.open.load(Ordering::Relaxed), 5);
        // 0: no limit.
        let open = slots(0, 0);
        let all: Vec<Slot> = (0..1000).map(|_| open.admit(ip("127.0.0.1")).unwrap()).collect();
        drop(all);
        assert!(open.by_source.lock().unwrap().is_empty());
    }

    /// The idle clock runs only while no request is in progress, and
    /// restarts when the last one ends.
    #[tokio::test]
    async fn the_idle_clock_runs_only_without_requests() {
        let timeout = Duration::from_millis(1000);
        let activity = Activity::new();
        let mut idle = IdleClose { timeout, activity: activity.clone(), timer: None, port: Port::Api, counters: Arc::new(()), expired: false };
        let info = ConnInfo { activity: Some(activity.clone()), ..ConnInfo::new("127.0.0.1:1".parse().unwrap(), None, true) };
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(!idle.expired(&mut cx));
        let request = RequestGuard::new(Some(&info));
        tokio::time::sleep(timeout + Duration::from_millis(200)).await;
        assert!(!idle.expired(&mut cx), "a request (an open stream) is in progress");
        drop(request);
        let ended = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(ended.elapsed() >= timeout || !idle.expired(&mut cx), "the clock restarted when the request ended");
        tokio::time::sleep(timeout).await;
        assert!(idle.expired(&mut cx));
        assert!(idle.expired(&mut cx), "and stays expired");
    }
}
