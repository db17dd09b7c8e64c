//! A replica's ACL state at run time: whether ACLs are on, the hash of the
//! initial management token, the index of the ACL objects at the applied
//! revision, and the audit log.
//!
//! Tokens are looked up in this replica's applied state: no raft round
//! trip. A token deleted (revoked) at revision R is refused here as soon as
//! this replica has applied R.

use super::audit::{AuditEvent, AuditLog};
use super::index::AclIndex;
use super::{Credentials, Principal, Refusal};
use crate::model::{Kind, ResourceKey, StoredObject};
use crate::store::state_machine::StoreReader;
use crate::store::Applied;
use std::sync::{Arc, Mutex};

pub struct Acl {
    /// `acl_enabled`: off, every request is anonymous and allowed.
    pub enabled: bool,
    /// This replica's id, for the audit log.
    replica: u64,
    management: Option<[u8; 32]>,
    reader: StoreReader,
    /// The index and the revision it was last found current at.
    /// (An observer's is never used.)
    cache: Mutex<(u64, Arc<AclIndex>)>,
    audit: Option<AuditLog>,
    /// The mesh's domain suffix: which hostnames a namespace owns
    /// (`NAME.NS.svc.SUFFIX`, `mesh::hosts`), checked on every write.
    pub domain_suffix: String,
}

/// Secrets shorter than this are refused in `initial_management_token_file`.
const MIN_SECRET_LEN: usize = 16;

/// What the ACLs take from the server's settings
/// (`config::ServerConfig::acl_options`).
#[derive(Debug, Clone, Default)]
pub struct AclOptions {
    /// `acl_enabled`.
    pub enabled: bool,
    /// This replica's id, for the audit log.
    pub replica: u64,
    pub initial_management_token_file: Option<std::path::PathBuf>,
    /// Where the audit log goes (`audit_log`, resolved); `None`: stderr.
    pub audit_log: Option<std::path::PathBuf>,
    pub domain_suffix: String,
}

impl Acl {
    /// From the configuration: reads the initial management token file and
    /// starts the audit log writer (both only when ACLs are on).
    pub fn start(config: &AclOptions, reader: StoreReader) -> Result<Arc<Acl>, String> {
        let mut management = None;
        let mut audit = None;
        if config.enabled {
            if let Some(path) = &config.initial_management_token_file {
                let text = std::fs::read_to_string(path).map_err(|e| format!("initial_management_token_file {}: {e}", path.display()))?;
                let secret = text.trim();
                if secret.len() < MIN_SECRET_LEN {
                    return Err(format!("initial_management_token_file {}: the token must be at least {MIN_SECRET_LEN} characters", path.display()));
                }
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt;
                    if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                        tracing::warn!(file = %path.display(), "initial_management_token_file is readable by other users");
                    }
                }
                management = Some(super::token::hash_secret(secret));
            }
            let path = config.audit_log.clone();
            let to = path.as_ref().map_or("stderr".into(), |p| p.display().to_string());
            audit = Some(AuditLog::start(path.as_deref()).map_err(|e| format!("audit_log {to}: {e}"))?);
            tracing::info!(to = %to, "audit log (one JSON line per write and refusal)");
        }
        let applied = reader.current();
        let index = Arc::new(AclIndex::build(acl_objects(&applied).cloned()));
        let domain_suffix = config.domain_suffix.clone();
        Ok(Arc::new(Acl {
            enabled: config.enabled,
            replica: config.replica,
            management,
            reader,
            cache: Mutex::new((applied.revision(), index)),
            audit,
            domain_suffix,
        }))
    }

    /// For the local observer address (`metrics_addr`), which serves only
    /// read-only routes: everyone is allowed, nothing is audited.
    pub fn observer(&self) -> Arc<Acl> {
        Arc::new(Acl {
            enabled: false,
            replica: self.replica,
            management: None,
            reader: self.reader.clone(),
            cache: Mutex::new((0, Arc::default())),
            audit: None,
            domain_suffix: self.domain_suffix.clone(),
        })
    }

    /// The index at `applied`: the cached one while the ACL objects are
    /// the same allocations (most revisions change none), else rebuilt.
    pub fn index_at(&self, applied: &Applied) -> Arc<AclIndex> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if cache.0 != applied.revision() {
            if !cache.1.built_from(acl_objects(applied)) {
                cache.1 = Arc::new(AclIndex::build(acl_objects(applied).cloned()));
            }
            cache.0 = applied.revision();
        }
        cache.1.clone()
    }

    /// The index at this replica's applied revision.
    pub fn index(&self) -> Arc<AclIndex> {
        self.index_at(&self.reader.current())
    }

    /// Who the credentials stand for, now, at the applied revision.
    pub fn authenticate(&self, creds: &Credentials) -> Result<Principal, Refusal> {
        if !self.enabled {
            return Ok(Principal::anonymous());
        }
        super::authenticate(&self.index(), self.management.as_ref(), creds, unix_now())
    }

    /// Whether this replica has an initial management token (from
    /// `initial_management_token_file`, or generated on a single node).
    pub fn has_management_token(&self) -> bool {
        self.management.is_some()
    }

    /// Queue an audit event (ACLs on only).
    pub fn audit(&self, mut event: AuditEvent) {
        if let Some(a) = &self.audit {
            event.replica = self.replica;
            a.record(event);
        }
    }
}

/// The xDS port's admission of streams (`xds::server::Admission`).
impl crate::xds::server::Admission for Acl {
    fn enabled(&self) -> bool {
        self.enabled
    }

    fn authenticate(&self, creds: &Credentials) -> Result<Principal, Refusal> {
        Acl::authenticate(self, creds)
    }

    fn revoked(&self, cert: &super::index::CertFacts) -> Option<String> {
        self.index().revoked(cert)
    }

    fn refused(&self, who: &str, proxy: Option<&str>, reason: &str) {
        let mut event = AuditEvent::new(who.to_string(), "xDS stream", "denied");
        event.resources = proxy.map(|p| vec![format!("proxy/{p}")]).unwrap_or_default();
        event.reason = Some(reason.to_string());
        self.audit(event);
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The ACL objects of a revision, in key order: Policy, Role and Token sort
/// together, CertificateRevocation (added later) after every other kind.
pub fn acl_objects(applied: &Applied) -> impl Iterator<Item = &Arc<StoredObject>> + '_ {
    let from = |kind: Kind| applied.state.objects.range(ResourceKey::new(kind, "", "")..).take_while(|(k, _)| k.kind.is_acl()).map(|(_, o)| o);
    from(Kind::Policy).chain(from(Kind::CertificateRevocation))
}
