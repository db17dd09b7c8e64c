//! TLS on the three ports (rustls, ring; no OpenSSL).
//!
//! - [`pki`]: the cluster CA and each replica's certificate (generated on
//!   first start, or supplied by the operator).
//! - [`Tls`]: the rustls configurations of a replica, rebuilt when the
//!   certificate, key or CA files change on disk ([`Tls::watch`]). Each new
//!   connection takes the current configuration; connections already open
//!   keep theirs, so a rotation drops no stream and no raft leader.
//! - [`conn`]: the accept path shared by the ports, and what a connection
//!   knows of its client (`ConnInfo`).
//! - [`PeerConnector`]: how replicas dial each other on the raft port,
//!   checking that the certificate names the member they dialled.
//!
//! Who must show what: the raft port requires a client certificate from
//! the CA (mutual TLS, peers only); the API port accepts one (required
//! with `verify_incoming`) as an identity besides tokens; the xDS port
//! accepts one (proxies also authenticate with tokens).

pub mod conn;
pub mod pki;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// The ports a replica serves TLS on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Api,
    Xds,
    Raft,
}

impl Port {
    pub fn name(self) -> &'static str {
        match self {
            Port::Api => "api",
            Port::Xds => "xds",
            Port::Raft => "raft",
        }
    }
}

/// Where a replica's certificate, key and trusted CA bundle are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::File { path: path.to_path_buf(), msg: e.to_string() }
}

/// Certificates in a PEM file, in order (leaf first for a chain).
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path).map_err(|e| file_err(path, e))?.collect::<Result<_, _>>().map_err(|e| file_err(path, e))?;
    if certs.is_empty() {
        return Err(file_err(path, "no certificate in the file"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_err(path, format!("reading the private key: {e}")))
}

/// A root store of every certificate in a PEM bundle.
pub fn roots_from_pem(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(path)? {
        roots.add(cert).map_err(|e| file_err(path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// A root store of the certificates in PEM text.
pub fn roots_from_pem_text(pem: &str) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert = cert.map_err(|e| TlsError::Config(format!("the CA bundle: {e}")))?;
        roots.add(cert).map_err(|e| TlsError::Config(format!("the CA bundle: not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Config("the CA bundle holds no certificate".into()));
    }
    Ok(roots)
}

/// How clients (the bench, tests) dial a replica's gRPC port at `target`:
/// `http://` is plaintext; `https://`, or a bare `HOST:PORT` when `tls` is
/// set, is TLS with `tls`, the certificate checked for the target's host
/// (a replica's certificate carries its IPs). Never plaintext for https.
pub fn dial(target: &str, tls: Option<Arc<ClientConfig>>) -> Result<(tonic::transport::Endpoint, PeerConnector), TlsError> {
    let (secure, addr) = match target.split_once("://") {
        Some(("https", rest)) => (true, rest),
        Some(("http", rest)) => (false, rest),
        Some((scheme, _)) => return Err(TlsError::Config(format!("{target}: unknown scheme {scheme:?}"))),
        None => (tls.is_some(), target),
    };
    let addr = addr.trim_end_matches('/');
    let source = match (secure, tls) {
        (true, Some(config)) => Some(Arc::new(ClientTlsSource::Fixed(config))),
        (true, None) => return Err(TlsError::Config(format!("{target}: TLS needs the cluster's CA (a client config or a CA file)"))),
        (false, _) => None,
    };
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).trim_start_matches('[').trim_end_matches(']');
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).map_err(|e| TlsError::Config(format!("{target}: {e}")))?;
    Ok((endpoint, PeerConnector::new(source, host)?))
}

/// The client side of a TLS connection trusting `roots`, with an optional
/// client certificate (chain file, key file). HTTP/2 by ALPN.
pub fn client_config(roots: RootCertStore, identity: Option<(&Path, &Path)>) -> Result<ClientConfig, TlsError> {
    let builder = ClientConfig::builder().with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            builder.with_client_auth_cert(read_certs(cert)?, read_key(key)?).map_err(|e| TlsError::Config(format!("{}: {e}", cert.display())))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Everything built from one read of the files.
struct Configs {
    api: Arc<ServerConfig>,
    xds: Arc<ServerConfig>,
    raft: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    /// The serving certificate's serial (hex), as `openssl x509 -serial`.
    serial: String,
}

/// A replica's TLS configurations, swapped whole when the files change.
pub struct Tls {
    files: TlsFiles,
    verify_incoming: bool,
    /// The mesh CA's root (`ca`): the xDS port also accepts workload
    /// certificates from it, for the CSR service's renewals.
    mesh_root: Option<PathBuf>,
    current: RwLock<(Arc<Configs>, Stamps)>,
}

impl Tls {
    /// Read the files and build every configuration; `verify_incoming`
    /// makes the API require a client certificate.
    pub fn load(files: TlsFiles, verify_incoming: bool) -> Result<Arc<Tls>, TlsError> {
        Tls::load_with_mesh_root(files, verify_incoming, None)
    }

    /// As [`Tls::load`], the xDS port also trusting client certificates
    /// from the mesh CA root in `mesh_root` (a PEM file).
    pub fn load_with_mesh_root(files: TlsFiles, verify_incoming: bool, mesh_root: Option<PathBuf>) -> Result<Arc<Tls>, TlsError> {
        let stamps = stamps(&files, mesh_root.as_deref());
        let configs = build(&files, verify_incoming, mesh_root.as_deref())?;
        Ok(Arc::new(Tls { files, verify_incoming, mesh_root, current: RwLock::new((Arc::new(configs), stamps)) }))
    }

    fn current(&self) -> Arc<Configs> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    pub fn server_config(&self, port: Port) -> Arc<ServerConfig> {
        let c = self.current();
        match port {
            Port::Api => c.api.clone(),
            Port::Xds => c.xds.clone(),
            Port::Raft => c.raft.clone(),
        }
    }

    /// For dialling peers: the CA as roots, this replica's certificate as
    /// its client certificate.
    pub fn peer_client_config(&self) -> Arc<ClientConfig> {
        self.current().client.clone()
    }

    /// The serial of the certificate new connections are served.
    pub fn serial(&self) -> String {
        self.current().serial.clone()
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Rebuild the configurations if any file changed since the last load.
    /// A file caught mid-replacement (a key that does not match its
    /// certificate yet) fails here; the old configuration stays, and the
    /// next check tries again.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        let now = stamps(&self.files, self.mesh_root.as_deref());
        if self.current.read().unwrap_or_else(|p| p.into_inner()).1 == now {
            return Ok(false);
        }
        let configs = build(&self.files, self.verify_incoming, self.mesh_root.as_deref())?;
        let serial = configs.serial.clone();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (Arc::new(configs), now);
        tracing::info!(serial, cert = %self.files.cert.display(), "TLS: reloaded the certificate files");
        Ok(true)
    }

    /// Check the files every `every` until shutdown.
    pub async fn watch(self: Arc<Self>, every: Duration, shutdown: watch::Receiver<bool>) {
        poll_reload(every, shutdown, "TLS", move || self.reload_if_changed().map_err(|e| e.to_string())).await
    }
}

/// Call `reload` every `every` until shutdown: how certificate files
/// (this module's, and the mesh CA's) are picked up. A failure is logged
/// once until a reload succeeds again; the caller keeps what it had.
pub async fn poll_reload(every: Duration, mut shutdown: watch::Receiver<bool>, what: &str, reload: impl Fn() -> Result<bool, String>) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        match reload() {
            Ok(_) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "{what}: the changed certificate files do not load; still using the previous ones");
            }
            Err(_) => {}
        }
    }
}

/// What files looked like when read: modification time and size each.
pub type Stamps = Vec<Option<(SystemTime, u64)>>;

/// The stamps of `paths` now (None for a file that is not there).
pub fn stamps_of<'a>(paths: impl Iterator<Item = &'a Path>) -> Stamps {
    paths.map(|p| std::fs::metadata(p).ok().and_then(|m| Some((m.modified().ok()?, m.len())))).collect()
}

fn stamps(files: &TlsFiles, mesh_root: Option<&Path>) -> Stamps {
    stamps_of([files.ca.as_path(), files.cert.as_path(), files.key.as_path()].into_iter().chain(mesh_root))
}

fn build(files: &TlsFiles, verify_incoming: bool, mesh_root: Option<&Path>) -> Result<Configs, TlsError> {
    let roots = Arc::new(roots_from_pem(&files.ca)?);
    // xDS clients may show a workload certificate of the mesh CA instead.
    let mut xds_roots = (*roots).clone();
    if let Some(path) = mesh_root {
        for cert in read_certs(path)? {
            xds_roots.add(cert).map_err(|e| file_err(path, format!("not a usable CA certificate: {e}")))?;
        }
    }
    let xds_roots = Arc::new(xds_roots);
    let chain = read_certs(&files.cert)?;
    let serial = conn::PeerCert::parse(&chain[0]).map(|c| c.serial).unwrap_or_default();
    let key = read_key(&files.key)?;
    let server = |roots: &Arc<RootCertStore>, client_auth: ClientAuth, alpn: &[&[u8]]| -> Result<Arc<ServerConfig>, TlsError> {
        let verifier = WebPkiClientVerifier::builder(roots.clone());
        let verifier = match client_auth {
            ClientAuth::Required => verifier.build(),
            ClientAuth::Optional => verifier.allow_unauthenticated().build(),
        }
        .map_err(|e| TlsError::Config(e.to_string()))?;
        let mut config = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| TlsError::Config(format!("{}: {e}", files.cert.display())))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    };
    let api_auth = if verify_incoming { ClientAuth::Required } else { ClientAuth::Optional };
    let client = client_config((*roots).clone(), Some((&files.cert, &files.key)))?;
    Ok(Configs {
        // REST clients speak HTTP/1.1 or 2; gRPC clients 2.
        api: server(&roots, api_auth, &[b"h2", b"http/1.1"])?,
        xds: server(&xds_roots, ClientAuth::Optional, &[b"h2"])?,
        raft: server(&roots, ClientAuth::Required, &[b"h2"])?,
        client: Arc::new(client),
        serial,
    })
}

#[derive(Clone, Copy)]
enum ClientAuth {
    Required,
    Optional,
}

/// Dials a peer for tonic: TCP, then TLS checking that the certificate
/// names `server_name` (`member-<id>.lodestar` for a replica), or
/// plaintext when `tls` is None (`insecure`).
#[derive(Clone)]
pub struct PeerConnector {
    tls: Option<Arc<ClientTlsSource>>,
    server_name: ServerName<'static>,
    /// The local address to connect from; None: the system's choice.
    source: Option<std::net::IpAddr>,
}

/// Where a connector takes its client configuration from on each dial.
pub enum ClientTlsSource {
    /// A replica's, reloaded with its files.
    Replica(Arc<Tls>),
    /// A fixed one (the CLI, tests, benchmarks).
    Fixed(Arc<ClientConfig>),
}

impl ClientTlsSource {
    fn config(&self) -> Arc<ClientConfig> {
        match self {
            ClientTlsSource::Replica(t) => t.peer_client_config(),
            ClientTlsSource::Fixed(c) => c.clone(),
        }
    }
}

impl PeerConnector {
    pub fn new(tls: Option<Arc<ClientTlsSource>>, server_name: &str) -> Result<PeerConnector, TlsError> {
        let server_name = ServerName::try_from(server_name.to_string()).map_err(|e| TlsError::Config(format!("{server_name:?}: {e}")))?;
        Ok(PeerConnector { tls, server_name, source: None })
    }

    /// Connect from `ip` (e.g. one of the many loopback addresses, to
    /// look like another client to a server's per-source limits).
    pub fn with_source(self, ip: std::net::IpAddr) -> PeerConnector {
        PeerConnector { source: Some(ip), ..self }
    }
}

/// A TCP connection to `addr` (HOST:PORT), from `source` if given.
pub async fn connect_tcp(addr: &str, source: Option<std::net::IpAddr>) -> std::io::Result<tokio::net::TcpStream> {
    let Some(ip) = source else { return tokio::net::TcpStream::connect(addr).await };
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr}: no address"));
    for target in tokio::net::lookup_host(addr).await?.filter(|a| a.is_ipv4() == ip.is_ipv4()) {
        let socket = if ip.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
        socket.bind(std::net::SocketAddr::new(ip, 0))?;
        match socket.connect(target).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl tonic::codegen::Service<tonic::codegen::http::Uri> for PeerConnector {
    type Response = hyper_util::rt::TokioIo<conn::Conn>;
    type Error = std::io::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, std::io::Error>>;

    fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: tonic::codegen::http::Uri) -> Self::Future {
        let (tls, server_name, source) = (self.tls.clone(), self.server_name.clone(), self.source);
        Box::pin(async move {
            let authority = uri.authority().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("no address in {uri}")))?;
            let tcp = connect_tcp(authority.as_str(), source).await?;
            tcp.set_nodelay(true)?;
            let remote = tcp.peer_addr()?;
            let conn = match tls {
                None => conn::Conn::plain(tcp, conn::ConnInfo::new(remote, None, false)),
                Some(tls) => {
                    let stream = tokio_rustls::TlsConnector::from(tls.config()).connect(server_name, tcp).await?;
                    let cert = conn::PeerCert::of(stream.get_ref().1);
                    conn::Conn::tls(stream.into(), conn::ConnInfo::new(remote, cert, true))
                }
            };
            Ok(hyper_util::rt::TokioIo::new(conn))
        })
    }
}
