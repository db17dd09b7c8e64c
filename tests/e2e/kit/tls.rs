//! TLS for end-to-end tests: certificate authorities and certificates
//! generated in the test (rcgen), written as PEM files for Envoy to read,
//! and a client (rustls) that trusts only the test CA, sends SNI, offers a
//! client certificate if given one, and speaks HTTP/1.1 over the
//! connection.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    der: CertificateDer<'static>,
    pub pem: String,
}

/// A certificate with its key.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let cert = params.self_signed(&key).unwrap();
        Ca { pem: cert.pem(), der: cert.der().clone(), issuer: Issuer::new(params, key) }
    }

    /// A server certificate for DNS names.
    pub fn server(&self, names: &[&str]) -> Leaf {
        let sans = names.iter().map(|n| SanType::DnsName((*n).try_into().unwrap())).collect();
        self.leaf(names[0], sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A server certificate for DNS names with a 2048-bit RSA key
    /// (made by `openssl genpkey`: rcgen on ring cannot generate RSA keys;
    /// the CA, ECDSA, signs it).
    pub fn server_rsa(&self, names: &[&str]) -> Leaf {
        let out = std::process::Command::new("openssl")
            .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"])
            .output()
            .expect("run openssl genpkey");
        assert!(out.status.success(), "openssl genpkey: {}", String::from_utf8_lossy(&out.stderr));
        let pem = String::from_utf8(out.stdout).unwrap();
        let key = KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).expect("an RSA key");
        let sans = names.iter().map(|n| SanType::DnsName((*n).try_into().unwrap())).collect();
        self.leaf_with(key, names[0], sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate naming the client by URI (a SPIFFE id, say).
    pub fn client(&self, uri: &str) -> Leaf {
        self.leaf("client", vec![SanType::URI(uri.try_into().unwrap())], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(&self, common_name: &str, sans: Vec<SanType>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_with(KeyPair::generate().unwrap(), common_name, sans, usage)
    }

    fn leaf_with(&self, key: KeyPair, common_name: &str, sans: Vec<SanType>, usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf { cert_pem: cert.pem(), key_pem: key.serialize_pem(), der: cert.der().clone(), key_der: key.serialize_der() }
    }

    /// Write the CA's certificate to `dir/NAME.pem`.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

impl Leaf {
    /// The certificate, DER.
    pub fn der(&self) -> &[u8] {
        &self.der
    }

    /// The private key, PKCS#8 DER.
    pub fn key_der(&self) -> &[u8] {
        &self.key_der
    }

    /// Write `dir/NAME.pem` and `dir/NAME-key.pem`; their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}-key.pem"));
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (cert, key)
    }
}

/// An answer over TLS: the status, the body, the application protocol the
/// server chose (ALPN) and the TLS version.
#[derive(Debug)]
pub struct TlsReply {
    pub status: u16,
    #[allow(dead_code)] // shown (Debug) when a test fails
    pub head: String,
    pub body: String,
    pub alpn: Option<String>,
    /// `TLSv1_2`, `TLSv1_3`.
    pub version: Option<String>,
}

/// What a client offers in its ClientHello: only these signature
/// algorithms, only this TLS version.
#[derive(Clone, Copy)]
pub struct Offer<'a> {
    pub schemes: &'a [rustls::SignatureScheme],
    pub version: &'static rustls::SupportedProtocolVersion,
}

/// Who connects: the CA it trusts (only that one), the server name it
/// sends (SNI) and expects the certificate to be valid for, its own
/// certificate if it offers one, and the application protocols it offers.
pub struct TlsClient<'a> {
    pub ca: &'a Ca,
    pub server_name: &'a str,
    pub certificate: Option<&'a Leaf>,
    pub alpn: &'a [&'a str],
}

impl TlsClient<'_> {
    async fn connect(&self, addr: SocketAddr) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        self.connect_offering(addr, None).await
    }

    /// As `connect`; with an offer, the ClientHello offers only its
    /// signature algorithms (a client that can verify only ECDSA, say) and
    /// its TLS version.
    async fn connect_offering(&self, addr: SocketAddr, offer: Option<Offer<'_>>) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, String> {
        let mut provider = rustls::crypto::ring::default_provider();
        let mut versions = rustls::DEFAULT_VERSIONS;
        if let Some(Offer { schemes, version }) = offer {
            // What the handshake may be signed with: the offered schemes
            // only. Certificates in the chain are still checked with every
            // algorithm (`all`).
            let algorithms = provider.signature_verification_algorithms;
            let mapping: Vec<_> = algorithms.mapping.iter().filter(|(scheme, _)| schemes.contains(scheme)).cloned().collect();
            assert!(!mapping.is_empty(), "none of {schemes:?} is supported");
            provider.signature_verification_algorithms =
                rustls::crypto::WebPkiSupportedAlgorithms { all: algorithms.all, mapping: Box::leak(mapping.into_boxed_slice()) };
            versions = Box::leak(Box::new([version]));
        }
        let provider = Arc::new(provider);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der.clone()).map_err(|e| format!("test CA: {e}"))?;
        let builder =
            rustls::ClientConfig::builder_with_provider(provider).with_protocol_versions(versions).map_err(|e| format!("{e}"))?.with_root_certificates(roots);
        let mut config = match self.certificate {
            Some(leaf) => {
                let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_der.clone()));
                builder.with_client_auth_cert(vec![leaf.der.clone()], key).map_err(|e| format!("client certificate: {e}"))?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = self.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let name = ServerName::try_from(self.server_name.to_string()).map_err(|e| format!("server name: {e}"))?;
        let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
        connector.connect(name, tcp).await.map_err(|e| format!("TLS handshake with {addr} ({}): {e}", self.server_name))
    }

    /// A handshake only: the server's certificate (DER, the leaf).
    pub async fn peer_leaf(&self, addr: SocketAddr) -> Result<Vec<u8>, String> {
        self.peer_leaf_offering(addr, None).await
    }

    /// A handshake offering `offer` (if given): the server's certificate
    /// (DER, the leaf).
    pub async fn peer_leaf_offering(&self, addr: SocketAddr, offer: Option<Offer<'_>>) -> Result<Vec<u8>, String> {
        let tls =
            tokio::time::timeout(Duration::from_secs(10), self.connect_offering(addr, offer)).await.map_err(|_| format!("{addr}: handshake timed out"))??;
        let certs = tls.get_ref().1.peer_certificates().ok_or("no server certificate")?;
        Ok(certs.first().ok_or("no server certificate")?.to_vec())
    }

    /// A handshake only: the protocol the server chose (ALPN).
    pub async fn handshake(&self, addr: SocketAddr) -> Result<Option<String>, String> {
        let tls = tokio::time::timeout(Duration::from_secs(10), self.connect(addr)).await.map_err(|_| format!("{addr}: handshake timed out"))??;
        Ok(tls.get_ref().1.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned()))
    }

    /// `GET path` with `Host: host` over HTTP/1.1 on a new connection. Any
    /// failure (handshake, certificate, refused client, closed
    /// connection) is an `Err` saying where.
    pub async fn get(&self, addr: SocketAddr, host: &str, path: &str) -> Result<TlsReply, String> {
        let exchange = async {
            let mut tls = self.connect(addr).await?;
            let alpn = tls.get_ref().1.alpn_protocol().map(|p| String::from_utf8_lossy(p).into_owned());
            let version = tls.get_ref().1.protocol_version().map(|v| format!("{v:?}"));
            let request = format!("GET {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n");
            tls.write_all(request.as_bytes()).await.map_err(|e| format!("send: {e}"))?;
            let mut raw = Vec::new();
            // A server that refuses the client's certificate says so after
            // the client's side of a TLS 1.3 handshake is done: on reading.
            tls.read_to_end(&mut raw).await.map_err(|e| format!("read from {addr} ({}): {e}", self.server_name))?;
            let text = String::from_utf8_lossy(&raw).into_owned();
            let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP answer from {addr} ({}): {text:?}", self.server_name))?;
            let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| format!("bad status line: {head:?}"))?;
            Ok(TlsReply { status, head: head.to_string(), body: body.to_string(), alpn, version })
        };
        tokio::time::timeout(Duration::from_secs(10), exchange).await.map_err(|_| format!("{addr} ({}): timed out", self.server_name))?
    }
}

/// A TLS backend that terminates TLS itself (with `leaf`), answers any
/// HTTP/1.1 request with its identity as the body, and closes. Records the
/// SNI name of every connection it accepted.
pub struct TlsUpstream {
    pub addr: SocketAddr,
    sni: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsUpstream {
    pub async fn start(ip: &str, identity: &str, leaf: &Leaf) -> TlsUpstream {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_der.clone()));
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der.clone()], key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(format!("{ip}:0")).await.expect("bind TLS upstream");
        let addr = listener.local_addr().unwrap();
        let sni = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (seen, identity) = (sni.clone(), identity.to_string());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, seen, identity) = (acceptor.clone(), seen.clone(), identity.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    seen.lock().unwrap().push(tls.get_ref().1.server_name().map(String::from));
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let answer = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{identity}", identity.len());
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        TlsUpstream { addr, sni, task }
    }

    /// The SNI name of each connection accepted so far.
    pub fn sni(&self) -> Vec<Option<String>> {
        self.sni.lock().unwrap().clone()
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
