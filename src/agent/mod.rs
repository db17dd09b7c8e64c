//! `lodestar agent`: a workload's identity on its host, as Istio's
//! pilot-agent keeps one.
//!
//! - The key is generated here (P-256) and never leaves the host: only a
//!   CSR goes to the mesh CA (Istio's `CreateCertificate` on a replica's
//!   xDS port, `ca::service`).
//! - The first certificate is obtained with a join token; every renewal
//!   authenticates with the current certificate as the TLS client
//!   certificate, never with the token again, so the token can be gone.
//! - Key and certificate are written to a directory (0600 files in a 0700
//!   directory: `key.pem`, `cert-chain.pem`, `root-cert.pem`, Istio's
//!   names), and a restarted agent resumes from them while the certificate
//!   is valid.
//! - Renewal at about half the certificate's remaining life, with jitter
//!   (0.45–0.55), so that agents started together spread out; failures are
//!   retried with backoff, across the replicas given.
//! - [`sds`]: the certificate goes to Envoy over SDS on a Unix socket
//!   (secret names `default` and `ROOTCA`), so a rotation changes no
//!   listener or cluster.
//! - [`envoy`]: optionally, Envoy itself as a child process, restarted
//!   when it dies, drained and stopped on shutdown.
//! - [`capture`], [`dns`]: optionally, the host's traffic (and DNS)
//!   captured into Envoy (and the agent's DNS proxy), as Istio's sidecar
//!   on a VM.
//! - [`register`]: optionally, the workload's Instance in the registry,
//!   bound to a Lease the agent keeps alive and revokes on shutdown;
//!   registered once its Envoy (if the agent runs it) is ready.
//!
//! Shutdown (SIGTERM, SIGINT) runs in this order: the lease is revoked (the
//! endpoint leaves EDS, so clients stop choosing it), then Envoy drains its
//! listeners for the drain time and is stopped, then SDS stops; the agent
//! exits after Envoy. Deregistering before draining is what Kubernetes does
//! (the endpoint is removed as termination starts, while the pod drains):
//! draining first would keep sending new requests to a proxy that is
//! closing its connections.

pub mod capture;
pub mod dns;
pub mod envoy;
pub mod register;
pub mod sds;
pub mod xds_proxy;

use anyhow::{anyhow, bail, Context, Result};
use lodestar_proto::istio_ca::istio_certificate_service_client::IstioCertificateServiceClient;
use lodestar_proto::istio_ca::IstioCertificateRequest;
use lodestar_tls::pki;
use rcgen::{CertificateParams, KeyPair, PublicKeyData};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Files in the agent's directory (Istio's names).
pub const KEY_FILE: &str = "key.pem";
pub const CHAIN_FILE: &str = "cert-chain.pem";
pub const ROOT_FILE: &str = "root-cert.pem";

/// One request to one replica gives up after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Retry backoff bounds.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A workload certificate with its key.
#[derive(Clone)]
pub struct Identity {
    pub key_pem: String,
    /// The leaf and intermediates, PEM.
    pub chain_pem: String,
    pub root_pem: String,
    /// The leaf's serial, hex (as `openssl x509 -serial`, lower case).
    pub serial: String,
    /// The leaf's URIs (its SPIFFE id).
    pub uris: Vec<String>,
    /// Unix seconds.
    pub not_after: i64,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("serial", &self.serial).field("uris", &self.uris).field("not_after", &self.not_after).finish()
    }
}

fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

impl Identity {
    /// From a CA's answer (leaf first, root last) and the key it was for:
    /// the leaf must carry this key.
    fn from_answer(key: &KeyPair, chain: &[String]) -> Result<Identity> {
        let (root, rest) = chain.split_last().ok_or_else(|| anyhow!("the CA answered an empty certificate chain"))?;
        if rest.is_empty() {
            bail!("the CA answered only one certificate; expected the leaf and the root");
        }
        let identity =
            Identity { key_pem: key.serialize_pem(), chain_pem: rest.concat(), root_pem: root.clone(), serial: String::new(), uris: Vec::new(), not_after: 0 };
        identity.checked()
    }

    /// Fill in what the leaf says, checking that it carries the key.
    fn checked(mut self) -> Result<Identity> {
        let leaf = CertificateDer::pem_slice_iter(self.chain_pem.as_bytes()).next().ok_or_else(|| anyhow!("no certificate in the chain"))??;
        let (_, cert) = x509_parser::parse_x509_certificate(&leaf).map_err(|e| anyhow!("the certificate does not parse: {e}"))?;
        let key = KeyPair::from_pem(&self.key_pem).context("the private key")?;
        if cert.public_key().raw != key.subject_public_key_info().as_slice() {
            bail!("the certificate is not for this key");
        }
        let peer = lodestar_tls::conn::PeerCert::parse(&leaf).ok_or_else(|| anyhow!("the certificate does not parse"))?;
        self.serial = peer.serial.to_lowercase();
        self.uris = peer.uris;
        self.not_after = cert.validity().not_after.timestamp();
        Ok(self)
    }

    /// The key and chain as a rustls client identity (renewals).
    fn client_auth(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let certs = CertificateDer::pem_slice_iter(self.chain_pem.as_bytes()).collect::<Result<Vec<_>, _>>().map_err(|e| anyhow!("the chain: {e}"))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| anyhow!("the key: {e}"))?;
        Ok((certs, key))
    }

    /// Load from `dir`, if the files are there, agree, and the certificate
    /// has not expired.
    pub fn load(dir: &Path) -> Result<Option<Identity>> {
        let paths = [dir.join(KEY_FILE), dir.join(CHAIN_FILE), dir.join(ROOT_FILE)];
        if !paths.iter().all(|p| p.exists()) {
            return Ok(None);
        }
        let [key_pem, chain_pem, root_pem] = paths.map(|p| pki::read_file(&p));
        let identity =
            Identity { key_pem: key_pem?, chain_pem: chain_pem?, root_pem: root_pem?, serial: String::new(), uris: Vec::new(), not_after: 0 }.checked()?;
        Ok((identity.not_after > unix_now()).then_some(identity))
    }

    /// Write to `dir` (0700), every file 0600 and replaced atomically; the
    /// chain last, so a chain on disk always has its key there.
    pub fn save(&self, dir: &Path) -> Result<()> {
        private_dir(dir)?;
        pki::write_file(&dir.join(ROOT_FILE), &self.root_pem, true)?;
        pki::write_file(&dir.join(KEY_FILE), &self.key_pem, true)?;
        pki::write_file(&dir.join(CHAIN_FILE), &self.chain_pem, true)?;
        Ok(())
    }

    /// When to renew, seen at `now`: at 45–55% of the remaining life.
    pub fn renew_at(&self, now: i64) -> i64 {
        let remaining = (self.not_after - now).max(0) as f64;
        now + (remaining * rand::Rng::gen_range(&mut rand::thread_rng(), 0.45..0.55)) as i64
    }
}

/// How the agent reaches the mesh CA.
#[derive(Clone)]
pub struct CaClient {
    /// Replicas' xDS addresses, HOST:PORT, tried in turn.
    pub servers: Vec<String>,
    /// The cluster CA replicas' certificates are checked against; None:
    /// plaintext (an `insecure` cluster).
    pub cluster_ca_pem: Option<String>,
    /// The lifetime asked for; None: the CA's default.
    pub ttl: Option<Duration>,
}

impl CaClient {
    /// A new key and a certificate for it, from the first replica that
    /// answers: with `bearer` (a join token), or `current` as the client
    /// certificate. A refusal (the caller is not authenticated, or bad
    /// input) is returned at once; unreachable replicas are skipped.
    pub async fn issue(&self, bearer: Option<&str>, current: Option<&Identity>) -> Result<Identity, IssueError> {
        self.issue_as(bearer, current, None).await
    }

    /// The same, asking for `impersonate` (a workload's SPIFFE id, Istio's
    /// `ImpersonatedIdentity`) rather than the caller's own identity: a
    /// host agent's request for a workload registered on its host.
    pub async fn issue_as(&self, bearer: Option<&str>, current: Option<&Identity>, impersonate: Option<&str>) -> Result<Identity, IssueError> {
        let key = KeyPair::generate().map_err(|e| IssueError::Fatal(format!("generating a key: {e}")))?;
        self.issue_for(&key, bearer, current, impersonate).await
    }

    /// The same for a given key: a join-token request asked again after a
    /// lost answer must name the same key, which the CA then answers
    /// without consuming another use.
    pub async fn issue_for(&self, key: &KeyPair, bearer: Option<&str>, current: Option<&Identity>, impersonate: Option<&str>) -> Result<Identity, IssueError> {
        let csr = CertificateParams::default().serialize_request(key).and_then(|c| c.pem()).map_err(|e| IssueError::Fatal(format!("making the CSR: {e}")))?;
        let mut last = String::from("no xDS servers");
        for server in &self.servers {
            match self.ask(server, &csr, bearer, current, impersonate).await {
                Ok(chain) => return Identity::from_answer(key, &chain).map_err(|e| IssueError::Retry(format!("{server}: {e:#}"))),
                Err(status) if matches!(status.code(), tonic::Code::Unauthenticated | tonic::Code::PermissionDenied | tonic::Code::InvalidArgument) => {
                    return Err(IssueError::Refused(format!("{server}: {}", status.message())));
                }
                Err(status) => last = format!("{server}: {}: {}", status.code(), status.message()),
            }
        }
        Err(IssueError::Retry(last))
    }

    async fn ask(
        &self,
        server: &str,
        csr: &str,
        bearer: Option<&str>,
        current: Option<&Identity>,
        impersonate: Option<&str>,
    ) -> Result<Vec<String>, tonic::Status> {
        let channel = self.channel(server, current, Some(REQUEST_TIMEOUT)).await?;
        let metadata = impersonate.map(impersonation_metadata);
        let mut request =
            tonic::Request::new(IstioCertificateRequest { csr: csr.to_string(), validity_duration: self.ttl.map_or(0, |t| t.as_secs() as i64), metadata });
        if let Some(secret) = bearer {
            let value = format!("Bearer {secret}").parse().map_err(|_| tonic::Status::invalid_argument("the join token is not valid in a header"))?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(IstioCertificateServiceClient::new(channel).create_certificate(request).await?.into_inner().cert_chain)
    }

    /// A connection to one replica's xDS port: TLS checked against the
    /// cluster CA, `current` as the client certificate if given. `timeout`
    /// bounds each request (None for long-lived streams).
    pub(crate) async fn channel(
        &self,
        server: &str,
        current: Option<&Identity>,
        timeout: Option<Duration>,
    ) -> Result<tonic::transport::Channel, tonic::Status> {
        let tls = match &self.cluster_ca_pem {
            None => None,
            Some(pem) => {
                let roots = lodestar_tls::roots_from_pem_text(pem).map_err(|e| tonic::Status::internal(e.to_string()))?;
                let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
                let mut config = match current {
                    Some(id) => {
                        let (certs, key) = id.client_auth().map_err(|e| tonic::Status::internal(format!("{e:#}")))?;
                        builder.with_client_auth_cert(certs, key).map_err(|e| tonic::Status::internal(e.to_string()))?
                    }
                    None => builder.with_no_client_auth(),
                };
                config.alpn_protocols = vec![b"h2".to_vec()];
                Some(Arc::new(config))
            }
        };
        let target = if tls.is_some() { format!("https://{server}") } else { format!("http://{server}") };
        let (endpoint, connector) = lodestar_tls::dial(&target, tls).map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
        let endpoint = endpoint.connect_timeout(REQUEST_TIMEOUT);
        let endpoint = match timeout {
            Some(t) => endpoint.timeout(t),
            None => endpoint.http2_keep_alive_interval(Duration::from_secs(10)).keep_alive_timeout(Duration::from_secs(5)),
        };
        endpoint.connect_with_connector(connector).await.map_err(|e| tonic::Status::unavailable(format!("connecting: {e}")))
    }
}

/// The request metadata that asks for `spiffe_id` (Istio's
/// `ImpersonatedIdentity`).
pub fn impersonation_metadata(spiffe_id: &str) -> envoy_types::pb::google::protobuf::Struct {
    use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
    let value = Value { kind: Some(Kind::StringValue(spiffe_id.to_string())) };
    Struct { fields: [(lodestar_client::IMPERSONATED_IDENTITY.to_string(), value)].into_iter().collect() }
}

#[derive(Debug)]
pub enum IssueError {
    /// The CA refused the caller: asking again will not help.
    Refused(String),
    /// No replica answered, or the answer was unusable: try again later.
    Retry(String),
    Fatal(String),
}

impl std::fmt::Display for IssueError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IssueError::Refused(m) => write!(f, "refused: {m}"),
            IssueError::Retry(m) => write!(f, "no certificate yet: {m}"),
            IssueError::Fatal(m) => write!(f, "{m}"),
        }
    }
}

/// What `lodestar agent` runs with.
pub struct AgentOptions {
    pub ca: CaClient,
    pub dir: PathBuf,
    /// The join token's file, read only when there is no valid certificate
    /// on disk.
    pub join_token_file: Option<PathBuf>,
    pub sds_socket: Option<PathBuf>,
    /// Where to serve ADS for local clients that cannot do TLS themselves
    /// ([`xds_proxy`]); None: no such socket.
    pub xds_socket: Option<PathBuf>,
    /// Run Envoy as a child process.
    pub envoy: Option<envoy::EnvoyOptions>,
    /// Capture the namespace's traffic into Envoy ([`capture`]): the rules
    /// are installed before anything else and removed when `run` returns.
    pub capture: Option<(capture::rules::CaptureOptions, capture::Backend)>,
    /// The DNS proxy (`--capture-dns`, [`dns`]).
    pub dns: Option<DnsSetup>,
}

/// The DNS proxy's options, and the node its name table is asked for.
pub struct DnsSetup {
    pub opts: dns::DnsOptions,
    /// [`dns::nds::dns_node`].
    pub node: envoy_types::pb::envoy::config::core::v3::Node,
    /// The mesh's DNS domain (`cluster.local`).
    pub domain: String,
}

/// Builds the registration once the identity is known (its service
/// account goes into the Instance).
pub type RegistrationPlan = Box<dyn FnOnce(&Identity) -> Result<register::Registration> + Send>;

/// The first certificate: from disk when it is there and valid, else with
/// the join token (retrying while no replica answers).
pub async fn first_identity(opts: &AgentOptions) -> Result<Identity> {
    match Identity::load(&opts.dir) {
        Ok(Some(id)) => {
            tracing::info!(serial = %id.serial, identity = %id.uris.join(", "), "resumed from the certificate on disk");
            return Ok(id);
        }
        Ok(None) => {}
        // E.g. a key written and its certificate not yet (a crash between
        // the two files): start over with the join token, if there is one.
        Err(e) => tracing::warn!(dir = %opts.dir.display(), error = %format!("{e:#}"), "the certificate on disk is unusable"),
    }
    let Some(path) = &opts.join_token_file else {
        bail!("no valid certificate in {} and no join token: give --join-token-file (lodestar token create --workload NS/SA)", opts.dir.display());
    };
    let token = std::fs::read_to_string(path).with_context(|| format!("reading the join token {}", path.display()))?.trim().to_string();
    let key = pending_key(&opts.dir)?;
    match join(&opts.ca, &token, &key, |_, r| {
        if let Err(IssueError::Retry(e)) = r {
            tracing::warn!(error = %e, "first certificate: retrying");
        }
    })
    .await
    {
        Ok(id) => {
            id.save(&opts.dir)?;
            tracing::info!(serial = %id.serial, identity = %id.uris.join(", "), "obtained the first certificate with the join token");
            Ok(id)
        }
        Err(e) => bail!("the join token was not accepted: {e}"),
    }
}

/// The key the first certificate is asked for: the one in `dir` if a key
/// is there without a valid certificate (an agent restarted while it
/// waited: the CA may have consumed the token's use for it already), else
/// a new one, written there (0600) before it is sent in a CSR.
fn pending_key(dir: &Path) -> Result<KeyPair> {
    let path = dir.join(KEY_FILE);
    if let Ok(pem) = pki::read_file(&path) {
        if let Ok(key) = KeyPair::from_pem(&pem) {
            return Ok(key);
        }
    }
    let key = KeyPair::generate().context("generating a key")?;
    private_dir(dir)?;
    pki::write_file(&path, &key.serialize_pem(), true)?;
    Ok(key)
}

/// `dir`, created if need be, readable by its owner only (0700; a group
/// search bit set by [`proxy_traversable`] is kept).
fn private_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // Only the exact 0710 that `proxy_traversable` sets is kept (a new
        // directory's 0755 is not).
        let search = std::fs::metadata(dir).map_or(0, |m| if m.permissions().mode() & 0o077 == 0o010 { 0o010 } else { 0 });
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700 | search)).with_context(|| format!("chmod {}", dir.display()))?;
    }
    Ok(())
}

/// `dir` (0710, group `gid`): Envoy, run under the proxy's uid/gid, can
/// reach the bootstrap and the SDS socket in it, and read neither the key
/// nor the certificate files (0600, the agent's).
fn proxy_traversable(dir: &Path, gid: u32) -> Result<()> {
    private_dir(dir)?;
    std::os::unix::fs::chown(dir, None, Some(gid)).with_context(|| format!("chgrp {gid} {}", dir.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o710)).with_context(|| format!("chmod {}", dir.display()))
}

/// The first certificate with a join token, for `key`, asked again with
/// the same key while the answer is "try again" (no replica answered, the
/// CA is busy, an answer was lost), after a doubling backoff with jitter
/// (agents started together do not retry together). `attempt` sees each
/// request's duration and result. A refusal ends it.
pub async fn join(ca: &CaClient, token: &str, key: &KeyPair, mut attempt: impl FnMut(Duration, &Result<Identity, IssueError>)) -> Result<Identity, IssueError> {
    let mut backoff = BACKOFF_MIN;
    loop {
        let started = std::time::Instant::now();
        let result = ca.issue_for(key, Some(token), None, None).await;
        attempt(started.elapsed(), &result);
        match result {
            Err(IssueError::Retry(_)) => {
                tokio::time::sleep(jittered(backoff)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            done => return done,
        }
    }
}

/// Between half and all of `d`, at random.
fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::Rng::gen_range(&mut rand::thread_rng(), 0.5..=1.0))
}

/// Renew `current` at about half its life, for as long as the agent runs;
/// each new certificate is saved and published on `tx`.
pub async fn renew(opts: &AgentOptions, mut current: Identity, tx: watch::Sender<Option<Arc<Identity>>>, mut shutdown: watch::Receiver<bool>) {
    let mut due = current.renew_at(unix_now());
    let mut backoff = BACKOFF_MIN;
    loop {
        let wait = Duration::from_secs((due - unix_now()).max(0) as u64);
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(wait) => {}
        }
        match opts.ca.issue(None, Some(&current)).await {
            Ok(id) => {
                if let Err(e) = id.save(&opts.dir) {
                    tracing::error!(error = %format!("{e:#}"), "saving the renewed certificate");
                }
                tracing::info!(serial = %id.serial, previous = %current.serial, not_after = id.not_after, "renewed the certificate");
                current = id;
                tx.send_replace(Some(Arc::new(current.clone())));
                due = current.renew_at(unix_now());
                backoff = BACKOFF_MIN;
            }
            Err(e) => {
                let expired = current.not_after <= unix_now();
                tracing::warn!(error = %e, expired, "renewal failed; retrying in {backoff:?}");
                // A refusal can be a replica that does not know the root
                // yet, or a revoked identity: keep trying, slowly.
                due = unix_now() + jittered(backoff).as_secs().max(1) as i64;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// Run the agent until `shutdown`: the first certificate, the SDS server,
/// renewals; with `registration` the Instance and its lease; with
/// `opts.envoy` Envoy. See the module doc for the order of shutdown. An
/// error (a refused registration, an Envoy that cannot be started) stops
/// everything the same way and is returned.
pub async fn run(opts: AgentOptions, registration: Option<RegistrationPlan>, shutdown: impl std::future::Future<Output = ()>) -> Result<()> {
    // The DNS proxy answers before the rules send queries to it (and before
    // the first certificate: until its first name table it forwards
    // everything, so the host's DNS never waits for the mesh).
    let (names_tx, names_rx) = watch::channel(Arc::new(dns::Names::default()));
    let (dns_stop_tx, dns_stop_rx) = watch::channel(false);
    let dns_serve = match &opts.dns {
        Some(d) => Some(tokio::spawn(dns::serve(d.opts.clone(), dns::bind(&d.opts).await?, names_rx, dns_stop_rx.clone()))),
        None => None,
    };
    // Installed first (as istio-init before the pod's containers), and
    // removed when this returns, whichever way (dropped last).
    let _capture = match &opts.capture {
        Some((rules, backend)) => Some(capture::Installed::install(rules, *backend)?),
        None => None,
    };
    // Envoy under the proxy's uid/gid reaches the SDS socket: the directory
    // is traversable by its group (its files stay 0600, the agent's), the
    // socket is its uid's.
    let proxy_owner = opts.capture.as_ref().map(|(r, _)| (r.proxy_uid, r.proxy_gid));
    if let Some((_, gid)) = proxy_owner {
        proxy_traversable(&opts.dir, gid)?;
    }
    let first = first_identity(&opts).await?;
    let registration = match registration {
        Some(plan) => Some(Arc::new(plan(&first)?)),
        None => None,
    };
    let (tx, rx) = watch::channel(Some(Arc::new(first.clone())));
    let (stop_tx, stop_rx) = watch::channel(false);
    let (envoy_stop_tx, envoy_stop_rx) = watch::channel(false);
    let (sds_stop_tx, sds_stop_rx) = watch::channel(false);
    let xds = opts.xds_socket.as_ref().map(|path| tokio::spawn(xds_proxy::serve(path.clone(), opts.ca.clone(), rx.clone(), sds_stop_rx.clone())));
    let dns_watch =
        opts.dns.as_ref().map(|d| tokio::spawn(dns::nds::watch_names(opts.ca.clone(), rx.clone(), d.node.clone(), d.domain.clone(), names_tx, dns_stop_rx)));
    let sds = opts.sds_socket.as_ref().map(|path| tokio::spawn(sds::serve(path.clone(), rx, sds_stop_rx, proxy_owner)));
    let (pid_tx, _) = watch::channel(0u32);
    let mut envoy_task = opts.envoy.clone().map(|e| {
        let supervisor = envoy::Supervisor { opts: e, pid: pid_tx };
        tokio::spawn(async move { supervisor.run(envoy_stop_rx).await })
    });
    let ready_at = opts.envoy.as_ref().map(|e| e.admin.clone());
    let mut register_task = registration.clone().map(|r| {
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            // With Envoy as a child, register once it is ready.
            if let Some(admin) = ready_at {
                if !envoy::wait_ready(&admin, stop.clone()).await {
                    return Ok(());
                }
            }
            r.run(stop).await
        })
    });
    let renewals = renew(&opts, first, tx, stop_rx);
    tokio::pin!(renewals);
    let mut failure: Option<anyhow::Error> = None;
    tokio::select! {
        _ = shutdown => tracing::info!("shutting down"),
        _ = &mut renewals => {}
        r = async { match register_task.as_mut() { Some(t) => t.await, None => std::future::pending().await } } => {
            register_task = None;
            failure = Some(match r { Ok(Err(e)) => e, Ok(Ok(())) => anyhow!("the registration ended"), Err(e) => anyhow!("the registration: {e}") });
        }
        r = async { match envoy_task.as_mut() { Some(t) => t.await, None => std::future::pending().await } } => {
            envoy_task = None;
            failure = Some(match r { Ok(Err(e)) => e, Ok(Ok(())) => anyhow!("Envoy's supervisor ended"), Err(e) => anyhow!("Envoy's supervisor: {e}") });
        }
    }
    let _ = stop_tx.send(true);
    if let Some(t) = register_task {
        if let Ok(Err(e)) = t.await {
            failure.get_or_insert(e);
        }
    }
    if let Some(r) = &registration {
        r.revoke().await;
    }
    let _ = envoy_stop_tx.send(true);
    if let Some(t) = envoy_task {
        match t.await {
            Ok(Err(e)) => tracing::warn!("Envoy: {e:#}"),
            Err(e) => tracing::warn!("Envoy's supervisor: {e}"),
            Ok(Ok(())) => {}
        }
    }
    let _ = sds_stop_tx.send(true);
    let _ = dns_stop_tx.send(true);
    if let Some(watch) = dns_watch {
        let _ = watch.await;
    }
    if let Some(serve) = dns_serve {
        match serve.await {
            Ok(Err(e)) => tracing::warn!("the DNS proxy: {e:#}"),
            Err(e) => tracing::warn!("the DNS proxy: {e}"),
            Ok(Ok(())) => {}
        }
    }
    for (what, task) in [("the xDS proxy", xds), ("the SDS server", sds)] {
        let Some(s) = task else { continue };
        match s.await {
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(anyhow!("{what}: {e}")),
            Ok(Ok(())) => {}
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_loads_and_checks_the_key() {
        let dir = tempfile::tempdir().unwrap();
        // A CA of the test's own (the mesh CA is server code, which this
        // crate does not link): a root, and a leaf for the key with the
        // workload's SPIFFE id, valid for an hour, as the mesh CA answers.
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, &ca_key);
        let key = KeyPair::generate().unwrap();
        let mut leaf = CertificateParams::default();
        leaf.subject_alt_names = vec![rcgen::SanType::URI("spiffe://cluster.local/ns/a/sa/b".try_into().unwrap())];
        let now = time::OffsetDateTime::now_utc();
        (leaf.not_before, leaf.not_after) = (now, now + time::Duration::hours(1));
        let chain = vec![leaf.signed_by(&key, &issuer).unwrap().pem(), ca_cert.pem()];
        let id = Identity::from_answer(&key, &chain).unwrap();
        assert_eq!(id.uris, ["spiffe://cluster.local/ns/a/sa/b"]);
        let out = dir.path().join("agent");
        id.save(&out).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for f in [KEY_FILE, CHAIN_FILE, ROOT_FILE] {
            assert_eq!(std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777, 0o600, "{f}");
        }
        assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o700);
        // Made traversable for Envoy's gid (--capture), the directory stays
        // so across saves (a renewal), and its files stay 0600.
        proxy_traversable(&out, unsafe { libc::getegid() }).unwrap();
        id.save(&out).unwrap();
        assert_eq!(std::fs::metadata(&out).unwrap().permissions().mode() & 0o777, 0o710);
        assert_eq!(std::fs::metadata(out.join(KEY_FILE)).unwrap().permissions().mode() & 0o777, 0o600);
        let back = Identity::load(&out).unwrap().unwrap();
        assert_eq!(back.serial, id.serial);
        let now = unix_now();
        let at = back.renew_at(now);
        assert!(at >= now + 3600 * 45 / 100 - 2 && at <= now + 3600 * 55 / 100 + 2, "{at} vs {now}");
        // A certificate for another key is refused.
        assert!(Identity::from_answer(&KeyPair::generate().unwrap(), &chain).is_err());
    }
}
