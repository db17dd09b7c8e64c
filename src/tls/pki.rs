//! The cluster's certificates: a CA, and a certificate for each replica
//! that names its member id and its addresses. Generated with rcgen (P-256,
//! no OpenSSL), written as PEM; private keys are written 0600 and never
//! leave the machine they were made on.
//!
//! A replica's certificate carries the DNS name `member-<id>.lodestar`
//! (its identity on the raft port: a peer checks it names the member it
//! dialled, and the raft service checks it names the member a request
//! claims to come from), `localhost`, and the IPs and names of its
//! addresses, for clients of the API and xDS ports.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use time::OffsetDateTime;

/// The DNS name that identifies member `id` in its certificate.
pub fn member_name(id: u64) -> String {
    format!("member-{id}.lodestar")
}

/// The member id a certificate's DNS name identifies, if it is one.
pub fn member_of(dns_name: &str) -> Option<u64> {
    dns_name.strip_prefix("member-")?.strip_suffix(".lodestar")?.parse().ok()
}

const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
const CERT_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);

/// File names in a CA directory (`lodestar tls ca create --dir`) and in a
/// replica's `<data-dir>/tls/`.
pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca-key.pem";
pub const CERT: &str = "server.pem";
pub const KEY: &str = "server-key.pem";

#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("{path}: {msg}")]
    File { path: PathBuf, msg: String },
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

fn file_err(path: &Path, e: impl std::fmt::Display) -> PkiError {
    PkiError::File { path: path.to_path_buf(), msg: e.to_string() }
}

/// A random positive 128-bit serial.
pub fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive
    SerialNumber::from_slice(&bytes)
}

fn validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    // A little back-dating absorbs clock skew between the replicas.
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + lifetime;
}

/// A new self-signed CA: (certificate PEM, key PEM).
pub fn new_ca(common_name: &str) -> Result<(String, String), PkiError> {
    new_ca_named(&[(DnType::CommonName, common_name), (DnType::OrganizationName, "Lodestar")])
}

/// A new self-signed CA (10 years) with this subject: (certificate PEM, key PEM).
pub fn new_ca_named(subject: &[(DnType, &str)]) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    for (t, v) in subject {
        params.distinguished_name.push(t.clone(), *v);
    }
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.serial_number = Some(serial());
    validity(&mut params, CA_LIFETIME);
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A certificate for member `id`, valid for `hosts` (IPs or DNS names)
/// besides its member name, signed by the CA: (certificate chain PEM, key
/// PEM). Server and client auth: replicas are both on the raft port.
pub fn issue_member(ca_cert_pem: &str, ca_key_pem: &str, id: u64, hosts: &[String]) -> Result<(String, String), PkiError> {
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, member_name(id));
    params.distinguished_name.push(DnType::OrganizationName, "Lodestar");
    let mut names = vec![member_name(id), "localhost".to_string()];
    names.extend(hosts.iter().cloned());
    names.sort();
    names.dedup();
    for name in names {
        params.subject_alt_names.push(match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.as_str().try_into()?),
        });
    }
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(serial());
    validity(&mut params, CERT_LIFETIME);
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Write `contents` to `path` atomically (a temp file renamed over it),
/// 0600 when it is a key or a credential.
pub fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), PkiError> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| file_err(dir, e))?;
    let tmp = path.with_extension("tmp");
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(if private { 0o600 } else { 0o644 });
    }
    let mut f = opts.open(&tmp).map_err(|e| file_err(&tmp, e))?;
    f.write_all(contents.as_bytes()).and_then(|_| f.sync_all()).map_err(|e| file_err(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| file_err(path, e))
}

pub fn read_file(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|e| file_err(path, e))
}

/// Create a CA in `dir` (`ca.pem`, `ca-key.pem`); refuses to overwrite one.
pub fn create_ca_dir(dir: &Path, common_name: &str) -> Result<(), PkiError> {
    let (cert, key) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if cert.exists() || key.exists() {
        return Err(file_err(&cert, "a CA already exists here; not overwriting it"));
    }
    let (cert_pem, key_pem) = new_ca(common_name)?;
    write_file(&key, &key_pem, true)?;
    write_file(&cert, &cert_pem, false)
}
