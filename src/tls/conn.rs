//! Accepted connections, plain or TLS, with who is on the other end.
//!
//! [`Incoming`] accepts TCP connections and runs each TLS handshake on its
//! own task (a slow or silent client holds up nobody), handing over only
//! connections whose handshake completed. It feeds axum (as a `Listener`)
//! and tonic (as a stream of `Conn`), so the API, xDS and raft ports share
//! one accept path. Every connection carries a [`ConnInfo`]: the remote
//! address and, when the client presented a certificate the CA verified,
//! its identities. tonic puts it into each request's extensions.

use super::{Port, Tls};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Completed handshakes waiting to be served.
const BACKLOG: usize = 1024;

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
    /// Ends the connection from the server's side.
    pub closer: Closer,
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
    closed: std::sync::atomic::AtomicBool,
    reader: futures::task::AtomicWaker,
}

impl Closer {
    pub fn close(&self) {
        self.0.closed.store(true, std::sync::atomic::Ordering::Release);
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
        if self.0.closed.load(std::sync::atomic::Ordering::Acquire) {
            return true;
        }
        self.0.reader.register(cx.waker());
        self.0.closed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// An accepted connection.
pub enum Conn {
    Plain(TcpStream, ConnInfo),
    /// Either side: replicas dial each other with the same type.
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>, ConnInfo),
}

impl Conn {
    pub fn info(&self) -> &ConnInfo {
        match self {
            Conn::Plain(_, i) | Conn::Tls(_, i) => i,
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Conn::Plain($s, _) => {
                let $s = Pin::new($s);
                $e
            }
            Conn::Tls($s, _) => {
                let $s = Pin::new($s.as_mut());
                $e
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.info().closer.poll_closed(cx) {
            // The end of the stream: the server closes the connection.
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
        match self {
            Conn::Plain(s, _) => s.is_write_vectored(),
            Conn::Tls(s, _) => s.is_write_vectored(),
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
    /// Accept on `listener`: TLS with the port's current configuration
    /// when `tls` is set (read per connection, so reloaded certificates
    /// apply to new connections only), plaintext otherwise.
    pub fn new(listener: TcpListener, tls: Option<(Arc<Tls>, Port)>) -> io::Result<Incoming> {
        let local = listener.local_addr()?;
        let (tx, rx) = mpsc::channel(BACKLOG);
        tokio::spawn(accept_loop(listener, tls, tx));
        Ok(Incoming { rx, local })
    }

    /// As a stream, for tonic's `serve_with_incoming`.
    pub fn into_stream(self) -> impl futures::Stream<Item = io::Result<Conn>> + Send + 'static {
        futures::stream::unfold(self.rx, |mut rx| async move { rx.recv().await.map(|c| (Ok(c), rx)) })
    }
}

async fn accept_loop(listener: TcpListener, tls: Option<(Arc<Tls>, Port)>, tx: mpsc::Sender<Conn>) {
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: wait, do not spin.
                tracing::warn!(error = %e, "accepting a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if tx.is_closed() {
            return;
        }
        // TCP_NODELAY: gRPC replies are several small writes (headers,
        // data, trailers); with Nagle they wait for a delayed ACK.
        let _ = tcp.set_nodelay(true);
        let Some((tls, port)) = tls.clone() else {
            let info = ConnInfo { remote, cert: None, tls: false, closer: Closer::default() };
            if tx.send(Conn::Plain(tcp, info)).await.is_err() {
                return;
            }
            continue;
        };
        let tx = tx.clone();
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config(port));
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let cert = PeerCert::of(stream.get_ref().1);
                    let _ = tx.send(Conn::Tls(Box::new(stream.into()), ConnInfo { remote, cert, tls: true, closer: Closer::default() })).await;
                }
                // Plaintext to a TLS port, an unknown CA, a port scan: the
                // client is told by the failed handshake; nothing to serve.
                Ok(Err(e)) => tracing::debug!(%remote, port = port.name(), error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(%remote, port = port.name(), "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for Incoming {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => {
                let remote = c.info().remote;
                (c, remote)
            }
            // The accept loop is gone only if the listener failed for good.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Incoming>> for ConnInfo {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Incoming>) -> ConnInfo {
        stream.io().info().clone()
    }
}
