//! The mesh CA: workload certificates for Envoys and their agents, apart
//! from the cluster CA that secures Lodestar's own ports (`tls`).
//!
//! Where the signing key lives: in a directory of files on every replica,
//! Istio's `cacerts` layout ([`CA_CERT`], [`CA_KEY`], [`CERT_CHAIN`],
//! [`ROOT_CERT`]), never in the replicated store. A single node generates a
//! self-signed root there on its first start; the members of a cluster are
//! all given the same directory (`lodestar tls ca create --mesh --dir DIR`,
//! or an operator's root/intermediate), as they are given the cluster CA.
//! So every replica can sign, and the key never crosses the network, a raft
//! message or a backup.
//!
//! A workload certificate: a P-256 (or the CSR's RSA/ECDSA) public key from
//! the CSR, and nothing else from it: the SPIFFE id
//! `spiffe://<trust domain>/ns/<namespace>/sa/<service account>` is the
//! caller's authenticated identity ([`WorkloadId`]), the extended key
//! usages are serverAuth and clientAuth, the lifetime the requested one
//! capped at the configured maximum (default 24 h).
//!
//! A host certificate ([`HostId`], SPIRE's node SVID): the identity of a
//! host agent that asks for the certificates of the workloads registered
//! on its host (ztunnel's model). Its SPIFFE id is
//! `spiffe://<trust domain>/lodestar/host/<name>`, outside the `/ns/.../sa/...`
//! shape on purpose: nothing that accepts workloads parses it as one (the
//! xDS port's certificate authentication, `spiffe_namespace`, the mesh
//! mTLS listeners, which require the `spiffe://<td>/ns/` prefix, and so
//! AuthorizationPolicy principals), and its only extended key usage is
//! clientAuth: it is no server.
//!
//! - [`service`]: Istio's `IstioCertificateService` on the xDS port, with
//!   the join-token and certificate authentication of callers.
//! - [`hosts`]: which workloads are registered on a host.

pub mod hosts;
pub mod service;

use crate::error::{Error, Result};
use crate::tls::pki::{self, PkiError};
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use time::OffsetDateTime;

/// The signing certificate (the root itself when self-signed).
pub const CA_CERT: &str = "ca-cert.pem";
/// The signing key (0600).
pub const CA_KEY: &str = "ca-key.pem";
/// The chain from the signing certificate up to the root.
pub const CERT_CHAIN: &str = "cert-chain.pem";
/// The root workloads trust.
pub const ROOT_CERT: &str = "root-cert.pem";

/// A workload certificate starts this long before it was signed, for
/// clocks a little behind the CA's.
const BACKDATE: Duration = Duration::from_secs(60);

/// A workload's identity: a namespace and a service account.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WorkloadId {
    pub namespace: String,
    pub service_account: String,
}

impl WorkloadId {
    /// `NS/SA`, both DNS labels.
    pub fn parse(s: &str) -> std::result::Result<WorkloadId, String> {
        let (ns, sa) = s.split_once('/').ok_or_else(|| format!("{s:?}: expected NAMESPACE/SERVICE_ACCOUNT"))?;
        crate::model::resource::check_dns_label(ns).map_err(|e| format!("namespace {ns:?}: {e}"))?;
        crate::model::resource::check_dns_subdomain(sa).map_err(|e| format!("service account {sa:?}: {e}"))?;
        Ok(WorkloadId { namespace: ns.into(), service_account: sa.into() })
    }

    pub fn spiffe(&self, trust_domain: &str) -> String {
        format!("spiffe://{trust_domain}/ns/{}/sa/{}", self.namespace, self.service_account)
    }

    /// The identity a SPIFFE id names, if it is one of `trust_domain`.
    pub fn from_spiffe(uri: &str, trust_domain: &str) -> Option<WorkloadId> {
        let path = uri.strip_prefix("spiffe://")?.strip_prefix(trust_domain)?.strip_prefix("/ns/")?;
        let (ns, sa) = path.split_once("/sa/")?;
        WorkloadId::parse(&format!("{ns}/{sa}")).ok()
    }
}

impl std::fmt::Display for WorkloadId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.service_account)
    }
}

/// The path of a host's SPIFFE id, after the trust domain.
pub const HOST_PATH: &str = "/lodestar/host/";

/// A host agent's identity: the host's name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostId(pub String);

impl HostId {
    /// A DNS subdomain of at most 63 characters (so that it fits a label
    /// value: WorkloadEntries name their host in `lodestar.io/host`).
    pub fn parse(s: &str) -> std::result::Result<HostId, String> {
        crate::model::registry::check_host_name(s).map_err(|e| format!("host {s:?}: {e}"))?;
        Ok(HostId(s.to_string()))
    }

    pub fn spiffe(&self, trust_domain: &str) -> String {
        format!("spiffe://{trust_domain}{HOST_PATH}{}", self.0)
    }

    pub fn from_spiffe(uri: &str, trust_domain: &str) -> Option<HostId> {
        HostId::parse(uri.strip_prefix("spiffe://")?.strip_prefix(trust_domain)?.strip_prefix(HOST_PATH)?).ok()
    }
}

impl std::fmt::Display for HostId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host {}", self.0)
    }
}

/// Whom a mesh certificate names: a workload, or a host agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MeshIdentity {
    Workload(WorkloadId),
    Host(HostId),
}

impl MeshIdentity {
    pub fn spiffe(&self, trust_domain: &str) -> String {
        match self {
            MeshIdentity::Workload(w) => w.spiffe(trust_domain),
            MeshIdentity::Host(h) => h.spiffe(trust_domain),
        }
    }

    pub fn from_spiffe(uri: &str, trust_domain: &str) -> Option<MeshIdentity> {
        WorkloadId::from_spiffe(uri, trust_domain).map(MeshIdentity::Workload).or_else(|| HostId::from_spiffe(uri, trust_domain).map(MeshIdentity::Host))
    }
}

impl std::fmt::Display for MeshIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MeshIdentity::Workload(w) => write!(f, "workload {w}"),
            MeshIdentity::Host(h) => h.fmt(f),
        }
    }
}

/// The mesh CA of a replica: what it signs with, from its directory,
/// reloaded when the files change ([`MeshCa::watch`], every
/// `tls_reload_interval_ms`, as the cluster TLS is): a replaced CA signs
/// the next certificate, without a restart. Files caught mid-replacement
/// (a key that does not match its certificate yet) keep the previous CA
/// until they load.
pub struct MeshCa {
    dir: PathBuf,
    pub trust_domain: String,
    pub default_ttl: Duration,
    pub max_ttl: Duration,
    current: RwLock<(Arc<Signer>, crate::tls::Stamps)>,
}

/// One load of the CA's files.
struct Signer {
    issuer: Issuer<'static, KeyPair>,
    /// PEMs after the leaf in every answer: the intermediates, then the root.
    chain: Vec<String>,
    root_pem: String,
    /// Checks a renewing workload's certificate against the root(s): every
    /// certificate in root-cert.pem, so a rotation can trust the old root
    /// and the new one for a while.
    verifier: Arc<dyn ClientCertVerifier>,
    /// Unix seconds: when the root and the signing certificate expire.
    root_expiry: i64,
    ca_expiry: i64,
    /// The signing certificate's subject, for the log.
    subject: String,
}

fn pem_certs(path: &Path) -> std::result::Result<Vec<String>, PkiError> {
    let text = pki::read_file(path)?;
    let mut out = Vec::new();
    for der in CertificateDer::pem_slice_iter(text.as_bytes()) {
        let der = der.map_err(|e| PkiError::File { path: path.into(), msg: e.to_string() })?;
        out.push(pem_of(&der));
    }
    Ok(out)
}

fn pem_of(der: &[u8]) -> String {
    pem::encode_config(&pem::Pem::new("CERTIFICATE", der.to_vec()), pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF))
}

/// A PEM certificate's expiry (unix seconds) and subject.
fn expiry_and_subject(pem: &str) -> Option<(i64, String)> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    Some((cert.validity().not_after.timestamp(), cert.subject().to_string()))
}

/// The CA's files, as their modification stamps are taken.
fn files(dir: &Path) -> [PathBuf; 4] {
    [CA_CERT, CA_KEY, CERT_CHAIN, ROOT_CERT].map(|f| dir.join(f))
}

impl Signer {
    fn load(dir: &Path) -> std::result::Result<Signer, PkiError> {
        let file_err = |p: &Path, msg: String| PkiError::File { path: p.to_path_buf(), msg };
        let (cert_path, key_path, root_path) = (dir.join(CA_CERT), dir.join(CA_KEY), dir.join(ROOT_CERT));
        let ca_pem = pki::read_file(&cert_path)?;
        let key = KeyPair::from_pem(&pki::read_file(&key_path)?).map_err(|e| file_err(&key_path, format!("reading the CA key: {e}")))?;
        // rcgen takes any key: one that is not the certificate's (files caught
        // mid-replacement) would sign certificates that verify nowhere.
        let spki = CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .ok()
            .and_then(|der| x509_parser::parse_x509_certificate(&der).ok().map(|(_, c)| c.public_key().raw.to_vec()));
        if spki.as_deref() != Some(rcgen::PublicKeyData::subject_public_key_info(&key).as_slice()) {
            return Err(file_err(&key_path, format!("not the key of the CA certificate {}", cert_path.display())));
        }
        let issuer = Issuer::from_ca_cert_pem(&ca_pem, key).map_err(|e| file_err(&cert_path, format!("not a CA certificate for this key: {e}")))?;
        let roots = pem_certs(&root_path)?;
        let root_pem = roots.first().cloned().ok_or_else(|| file_err(&root_path, "no certificate in the file".into()))?;
        let chain_path = dir.join(CERT_CHAIN);
        let mut chain = if chain_path.exists() { pem_certs(&chain_path)? } else { Vec::new() };
        if chain.is_empty() {
            chain = pem_certs(&cert_path)?;
        }
        // The answer ends with the root, once.
        chain.retain(|c| *c != root_pem);
        chain.push(root_pem.clone());
        let store = crate::tls::roots_from_pem(&root_path).map_err(|e| file_err(&root_path, e.to_string()))?;
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(store)).build().map_err(|e| file_err(&root_path, e.to_string()))?;
        let root_expiry = expiry_and_subject(&root_pem).map_or(0, |e| e.0);
        let (ca_expiry, subject) = expiry_and_subject(&ca_pem).unwrap_or_default();
        Ok(Signer { issuer, chain, root_pem, verifier, root_expiry, ca_expiry, subject })
    }
}

impl MeshCa {
    /// Load the CA in `dir` (Istio's `cacerts` layout). `cert-chain.pem`
    /// may be missing or empty for a self-signed root.
    pub fn load(dir: &Path, trust_domain: &str, default_ttl: Duration, max_ttl: Duration) -> std::result::Result<MeshCa, PkiError> {
        let stamps = crate::tls::stamps_of(files(dir).iter().map(PathBuf::as_path));
        let signer = Signer::load(dir)?;
        Ok(MeshCa { dir: dir.to_path_buf(), trust_domain: trust_domain.to_string(), default_ttl, max_ttl, current: RwLock::new((Arc::new(signer), stamps)) })
    }

    fn signer(&self) -> Arc<Signer> {
        self.current.read().unwrap_or_else(|p| p.into_inner()).0.clone()
    }

    /// Load the files again if any changed since the last load; on a
    /// failure the previous CA stays (and the next check tries again).
    pub fn reload_if_changed(&self) -> std::result::Result<bool, PkiError> {
        let now = crate::tls::stamps_of(files(&self.dir).iter().map(PathBuf::as_path));
        if self.current.read().unwrap_or_else(|p| p.into_inner()).1 == now {
            return Ok(false);
        }
        let signer = Signer::load(&self.dir)?;
        let subject = signer.subject.clone();
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = (Arc::new(signer), now);
        self.publish_expiry();
        tracing::info!(dir = %self.dir.display(), issuer = %subject, "mesh CA: reloaded the CA files; new certificates are signed by it");
        Ok(true)
    }

    /// Check the files every `every` until shutdown.
    pub async fn watch(self: Arc<Self>, every: Duration, shutdown: tokio::sync::watch::Receiver<bool>) {
        crate::tls::poll_reload(every, shutdown, "mesh CA", move || self.reload_if_changed().map_err(|e| e.to_string())).await
    }

    /// The root's and the signing certificate's expiry, as metrics.
    pub fn publish_expiry(&self) {
        let (signer, m) = (self.signer(), crate::metrics::metrics());
        m.ca_root_expiry.set(signer.root_expiry);
        m.ca_cert_chain_expiry.set(signer.ca_expiry);
    }

    /// The root certificate (PEM) workloads trust.
    pub fn root_pem(&self) -> String {
        self.signer().root_pem.clone()
    }

    /// Parse a PEM certificate request and check its signature (proof of
    /// the private key) and its key type. Before authentication, so that a
    /// bad request costs no join token use.
    pub fn parse_csr(csr_pem: &str) -> Result<CertificateSigningRequestParams> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| Error::field("csr", format!("not a usable PEM certificate request: {e}")))?;
        let alg = csr.public_key.algorithm();
        let allowed =
            [&rcgen::PKCS_ECDSA_P256_SHA256, &rcgen::PKCS_ECDSA_P384_SHA384, &rcgen::PKCS_RSA_SHA256, &rcgen::PKCS_RSA_SHA384, &rcgen::PKCS_RSA_SHA512];
        if !allowed.contains(&alg) {
            return Err(Error::field("csr", format!("key algorithm {alg:?} is not accepted; use ECDSA P-256 (or P-384, or RSA)")));
        }
        Ok(csr)
    }

    /// Sign a certificate for `id` with the public key of `csr_pem`,
    /// valid for `ttl` (none or zero: the default; capped at the maximum):
    /// the PEM chain, leaf first, root last. Nothing but the key is taken
    /// from the CSR.
    pub fn sign(&self, csr_pem: &str, id: &WorkloadId, ttl: Option<Duration>) -> Result<Vec<String>> {
        self.sign_parsed(&MeshCa::parse_csr(csr_pem)?, &MeshIdentity::Workload(id.clone()), ttl)
    }

    /// The same for a parsed CSR and any mesh identity: a host's
    /// certificate is for client authentication only.
    pub fn sign_parsed(&self, csr: &CertificateSigningRequestParams, id: &MeshIdentity, ttl: Option<Duration>) -> Result<Vec<String>> {
        let ttl = ttl.filter(|t| !t.is_zero()).unwrap_or(self.default_ttl).min(self.max_ttl);
        let spiffe = id.spiffe(&self.trust_domain);
        let mut params = CertificateParams::default();
        // Istio's workload certificates have an empty subject; the SAN is the identity.
        params.distinguished_name = DistinguishedName::new();
        params.subject_alt_names = vec![SanType::URI(spiffe.as_str().try_into().map_err(|e| Error::internal(format!("SPIFFE id {spiffe}: {e}")))?)];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = match id {
            MeshIdentity::Workload(_) => vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
            MeshIdentity::Host(_) => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.use_authority_key_identifier_extension = true;
        params.serial_number = Some(pki::serial());
        let now = OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + ttl;
        let signer = self.signer();
        let cert = params.signed_by(&csr.public_key, &signer.issuer).map_err(|e| Error::internal(format!("signing: {e}")))?;
        let mut chain = Vec::with_capacity(signer.chain.len() + 1);
        chain.push(cert.pem());
        chain.extend(signer.chain.iter().cloned());
        Ok(chain)
    }

    /// The identity (workload or host) of a certificate chain (leaf first)
    /// that this CA's root verifies now, or why not.
    pub fn verify(&self, chain: &[CertificateDer<'static>]) -> std::result::Result<MeshIdentity, String> {
        let (leaf, intermediates) = chain.split_first().ok_or("no certificate")?;
        self.signer()
            .verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| format!("not a current certificate of the mesh CA: {e}"))?;
        let cert = crate::tls::conn::PeerCert::parse(leaf).ok_or("the certificate does not parse")?;
        cert.uris
            .iter()
            .find_map(|u| MeshIdentity::from_spiffe(u, &self.trust_domain))
            .ok_or_else(|| format!("the certificate names no workload or host of trust domain {}", self.trust_domain))
    }

    /// The identity of a workload certificate chain: as [`Self::verify`],
    /// and a host's certificate is refused (it is no workload).
    pub fn verify_workload(&self, chain: &[CertificateDer<'static>]) -> std::result::Result<WorkloadId, String> {
        match self.verify(chain)? {
            MeshIdentity::Workload(w) => Ok(w),
            MeshIdentity::Host(h) => Err(format!("the certificate of {h} is no workload identity")),
        }
    }
}

/// The xDS port's check of a client certificate naming a SPIFFE id.
impl crate::xds::server::WorkloadCerts for MeshCa {
    fn verify_workload(&self, chain: &[CertificateDer<'static>]) -> std::result::Result<crate::state::access::index::CertFacts, String> {
        MeshCa::verify_workload(self, chain)?;
        chain.first().and_then(|c| cert_facts(c)).ok_or_else(|| "the certificate does not parse".into())
    }
}

/// What the deny list (`auth::index::AclIndex::revoked`) and the xDS
/// port's expiry timer need of a mesh certificate (DER): its SPIFFE id,
/// serial, signing time (the mesh CA backdates `notBefore` by
/// [`BACKDATE`]) and expiry. None if it does not parse or names no SPIFFE id.
pub fn cert_facts(der: &[u8]) -> Option<crate::state::access::index::CertFacts> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let spiffe_id = cert.subject_alternative_name().ok()??.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::URI(u) if u.starts_with("spiffe://") => Some(u.to_string()),
        _ => None,
    })?;
    let serial = crate::model::acl::normalize_serial(&crate::model::acl::hex(cert.raw_serial()))?;
    let validity = cert.validity();
    let issued_at = validity.not_before.timestamp().saturating_add(BACKDATE.as_secs() as i64);
    Some(crate::state::access::index::CertFacts { spiffe_id, serial, issued_at, not_after: validity.not_after.timestamp() })
}

/// Create a self-signed mesh root in `dir` in Istio's layout (the root
/// signs workloads itself, as Istio's self-signed CA does); refuses to
/// overwrite one.
pub fn create_dir(dir: &Path, trust_domain: &str) -> std::result::Result<(), PkiError> {
    let key_path = dir.join(CA_KEY);
    if key_path.exists() || dir.join(CA_CERT).exists() {
        return Err(PkiError::File { path: key_path, msg: "a mesh CA already exists here; not overwriting it".into() });
    }
    // Istio's self-signed root: O=<trust domain>.
    let (cert, key) = pki::new_ca_named(&[(DnType::OrganizationName, trust_domain), (DnType::CommonName, "Lodestar mesh root CA")])?;
    pki::write_file(&key_path, &key, true)?;
    for name in [CA_CERT, ROOT_CERT, CERT_CHAIN] {
        pki::write_file(&dir.join(name), &cert, false)?;
    }
    // The cluster secrets key lives and travels with the mesh CA.
    if !dir.join(crate::secrets::KEY_FILE).exists() {
        crate::secrets::create(dir).map_err(|msg| PkiError::File { path: dir.join(crate::secrets::KEY_FILE), msg })?;
    }
    Ok(())
}

/// The mesh CA directory this replica signs from, creating it when it
/// may: `mesh_ca_dir` as configured (it must hold a CA); else
/// `<data_dir>/mesh-ca`, generated on a single node's first start. A
/// cluster of several members without `mesh_ca_dir` has no mesh CA (they
/// would not agree on one): None, and the CSR service says so.
pub fn ensure_dir(config: &crate::config::ServerConfig) -> std::result::Result<Option<PathBuf>, PkiError> {
    if let Some(dir) = &config.mesh_ca_dir {
        if !dir.join(CA_KEY).exists() {
            return Err(PkiError::File {
                path: dir.join(CA_KEY),
                msg: "mesh_ca_dir holds no CA: make one with `lodestar tls ca create --mesh --dir DIR` (the same for every member), or put Istio's cacerts files there".into(),
            });
        }
        return Ok(Some(dir.clone()));
    }
    let dir = config.data_dir.join("mesh-ca");
    if dir.join(CA_KEY).exists() {
        // A CA generated here before Secrets existed: a single node may
        // add the secrets key the same way.
        if !dir.join(crate::secrets::KEY_FILE).exists() && config.initial_members.len() <= 1 && !config.join {
            crate::secrets::create(&dir).map_err(|msg| PkiError::File { path: dir.join(crate::secrets::KEY_FILE), msg })?;
        }
        return Ok(Some(dir));
    }
    if config.initial_members.len() > 1 || config.join {
        return Ok(None);
    }
    create_dir(&dir, &config.trust_domain)?;
    tracing::info!(dir = %dir.display(), trust_domain = %config.trust_domain, "generated a new mesh CA root (first start)");
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::PublicKeyData;

    fn ca(dir: &Path) -> MeshCa {
        create_dir(dir, "example.org").unwrap();
        MeshCa::load(dir, "example.org", Duration::from_secs(3600), Duration::from_secs(7200)).unwrap()
    }

    fn csr(key: &KeyPair, uri: &str) -> String {
        let mut p = CertificateParams::default();
        p.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        p.serialize_request(key).unwrap().pem().unwrap()
    }

    #[test]
    fn workload_ids() {
        let id = WorkloadId::parse("shop/cart").unwrap();
        assert_eq!(id.spiffe("cluster.local"), "spiffe://cluster.local/ns/shop/sa/cart");
        assert_eq!(WorkloadId::from_spiffe("spiffe://cluster.local/ns/shop/sa/cart", "cluster.local"), Some(id));
        assert_eq!(WorkloadId::from_spiffe("spiffe://other/ns/shop/sa/cart", "cluster.local"), None);
        assert_eq!(WorkloadId::from_spiffe("spiffe://cluster.local/ns/Shop/sa/cart", "cluster.local"), None);
        assert!(WorkloadId::parse("shop").unwrap_err().contains("NAMESPACE/SERVICE_ACCOUNT"));
        assert!(WorkloadId::parse("a/b/c").is_err());
    }

    #[test]
    fn signs_the_callers_identity_whatever_the_csr_asks() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let key = KeyPair::generate().unwrap();
        let chain = ca
            .sign(&csr(&key, "spiffe://example.org/ns/kube-system/sa/admin"), &WorkloadId::parse("shop/cart").unwrap(), Some(Duration::from_secs(86400)))
            .unwrap();
        assert_eq!(chain.len(), 2);
        assert_eq!(chain[1], ca.root_pem());
        let der = CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let uris: Vec<String> = cert
            .subject_alternative_name()
            .unwrap()
            .unwrap()
            .value
            .general_names
            .iter()
            .filter_map(|n| match n {
                x509_parser::extensions::GeneralName::URI(u) => Some(u.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(uris, ["spiffe://example.org/ns/shop/sa/cart"]);
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && eku.client_auth);
        // Capped at the maximum (2 h), plus the backdating.
        let life = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert_eq!(life, 7200 + 60);
        assert_eq!(cert.public_key().raw, key.subject_public_key_info());
        // Renewal: the leaf verifies against the root and names the workload.
        assert_eq!(ca.verify_workload(&[der.into_owned()]).unwrap(), WorkloadId::parse("shop/cart").unwrap());
    }

    #[test]
    fn host_certificates_are_no_workload_identity() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let host = HostId::parse("node-a.dc1").unwrap();
        assert_eq!(host.spiffe("example.org"), "spiffe://example.org/lodestar/host/node-a.dc1");
        assert_eq!(MeshIdentity::from_spiffe("spiffe://example.org/lodestar/host/node-a.dc1", "example.org"), Some(MeshIdentity::Host(host.clone())));
        assert_eq!(MeshIdentity::from_spiffe("spiffe://other/lodestar/host/node-a", "example.org"), None);
        assert!(HostId::parse("Node_A").is_err());
        assert!(HostId::parse(&"a".repeat(64)).is_err());
        // Not a workload path: nothing that parses workloads sees one.
        assert_eq!(WorkloadId::from_spiffe(&host.spiffe("example.org"), "example.org"), None);
        assert_eq!(crate::auth::spiffe_namespace(&host.spiffe("example.org")), None);
        let key = KeyPair::generate().unwrap();
        let csr = MeshCa::parse_csr(&csr(&key, "spiffe://example.org/ns/a/sa/b")).unwrap();
        let chain = ca.sign_parsed(&csr, &MeshIdentity::Host(host.clone()), None).unwrap();
        let der = CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap().into_owned();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth, "a host certificate is no server");
        assert_eq!(ca.verify(std::slice::from_ref(&der)).unwrap(), MeshIdentity::Host(host));
        assert!(ca.verify_workload(&[der]).unwrap_err().contains("no workload identity"));
    }

    #[test]
    fn refuses_bad_csrs_and_foreign_certificates() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let id = WorkloadId::parse("a/b").unwrap();
        let e = ca.sign("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n", &id, None).unwrap_err();
        assert_eq!(e.code, crate::error::Code::InvalidArgument);
        // A certificate from another CA is no workload identity.
        let other = tempfile::tempdir().unwrap();
        let other = super::tests::ca(other.path());
        let chain = other.sign(&csr(&KeyPair::generate().unwrap(), "x:y"), &id, None).unwrap();
        let der = CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap().into_owned();
        assert!(ca.verify_workload(&[der]).unwrap_err().contains("mesh CA"));
        assert!(create_dir(dir.path(), "example.org").is_err());
        let key_mode = std::fs::metadata(dir.path().join(CA_KEY)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(key_mode.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn replaced_files_sign_after_a_reload() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca(dir.path());
        let old_root = ca.root_pem();
        assert!(!ca.reload_if_changed().unwrap(), "nothing changed");
        let id = WorkloadId::parse("a/b").unwrap();
        let key = KeyPair::generate().unwrap();
        // A half-written replacement (the new certificate, the old key) keeps the old CA.
        let other = tempfile::tempdir().unwrap();
        create_dir(other.path(), "example.org").unwrap();
        std::fs::copy(other.path().join(CA_CERT), dir.path().join(CA_CERT)).unwrap();
        assert!(ca.reload_if_changed().is_err());
        assert_eq!(ca.sign(&csr(&key, "x:y"), &id, None).unwrap().last(), Some(&old_root));
        for f in [CA_KEY, CERT_CHAIN, ROOT_CERT] {
            std::fs::copy(other.path().join(f), dir.path().join(f)).unwrap();
        }
        assert!(ca.reload_if_changed().unwrap());
        let new_root = std::fs::read_to_string(other.path().join(ROOT_CERT)).unwrap();
        assert_eq!(ca.root_pem().trim(), new_root.trim());
        let chain = ca.sign(&csr(&key, "x:y"), &id, None).unwrap();
        assert_eq!(chain.last().map(|r| r.trim()), Some(new_root.trim()));
        // Verified by the new root, and the old CA's certificates no longer are.
        let der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).unwrap().into_owned();
        assert_eq!(ca.verify_workload(&[der(&chain[0])]).unwrap(), id);
    }

    #[test]
    fn pem_encoding_round_trips() {
        for n in 0..7 {
            let data: Vec<u8> = (0..100 + n).map(|i| (i * 7) as u8).collect();
            let pem = pem_of(&data);
            let back = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
            assert_eq!(back.as_ref(), &data[..]);
        }
    }
}
