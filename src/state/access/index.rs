//! The ACL objects of one revision, indexed for authentication: tokens by
//! the SHA-256 of their secret, policies and roles by name, roles by the
//! certificate identities they list. Built from the objects alone (pure);
//! the root's `auth::Acl` keeps one per replica and rebuilds it when they change.

use crate::model::acl::{AclSpec, Policy, ProxyBinding, Revocation, RoleSpec};
use crate::model::{StoredObject, TypedSpec};
use std::collections::HashMap;
use std::sync::Arc;

/// A stored token, as authentication needs it.
#[derive(Debug, Clone)]
pub struct TokenEntry {
    pub accessor: String,
    pub expires_at: Option<u64>,
    pub policies: Vec<String>,
    pub roles: Vec<String>,
    /// A proxy token's identity.
    pub proxy: Option<ProxyBinding>,
}

#[derive(Debug, Default)]
pub struct AclIndex {
    /// The objects this was built from, in key order: an index is current
    /// for a revision whose ACL objects are these very objects.
    objects: Vec<Arc<StoredObject>>,
    tokens: HashMap<[u8; 32], TokenEntry>,
    policies: HashMap<String, Arc<Policy>>,
    roles: HashMap<String, RoleSpec>,
    identities: HashMap<String, Vec<String>>,
    /// Workload join tokens (mesh CA), by hash: never API credentials.
    join_tokens: HashMap<[u8; 32], Arc<StoredObject>>,
    /// The mesh CA's deny list (CertificateRevocation objects, by name).
    revocations: Vec<(String, Revocation, Option<String>)>,
}

/// What the deny list needs of a mesh certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// Its SPIFFE id.
    pub spiffe_id: String,
    /// Its serial, as `model::acl::normalize_serial` writes it.
    pub serial: String,
    /// When it was signed (unix seconds).
    pub issued_at: i64,
    /// Its notAfter (unix seconds).
    pub not_after: i64,
}

impl AclIndex {
    /// From the ACL objects of one revision. Objects that fail their
    /// validation (data from an incompatible version) grant nothing.
    pub fn build(objects: impl Iterator<Item = Arc<StoredObject>>) -> AclIndex {
        let mut idx = AclIndex::default();
        for obj in objects {
            let name = obj.key.name.to_string();
            match obj.typed().map(|t| t.as_ref()) {
                Ok(TypedSpec::Acl(AclSpec::Policy(p))) => {
                    idx.policies.insert(name, Arc::new(p.clone()));
                }
                Ok(TypedSpec::Acl(AclSpec::Role(r))) => {
                    for id in &r.identities {
                        idx.identities.entry(id.clone()).or_default().push(name.clone());
                    }
                    idx.roles.insert(name, r.clone());
                }
                Ok(TypedSpec::Acl(AclSpec::Revocation(r))) => {
                    let reason = obj.body().pointer("/spec/reason").and_then(|v| v.as_str()).map(str::to_string);
                    idx.revocations.push((name, r.clone(), reason));
                }
                Ok(TypedSpec::Acl(AclSpec::Token(t))) if t.spec.join.is_some() => {
                    idx.join_tokens.insert(t.secret_hash, obj.clone());
                }
                Ok(TypedSpec::Acl(AclSpec::Token(t))) => {
                    let entry = TokenEntry {
                        accessor: name,
                        expires_at: t.expires_at,
                        policies: t.spec.policies.clone(),
                        roles: t.spec.roles.clone(),
                        proxy: t.spec.proxy.clone(),
                    };
                    idx.tokens.insert(t.secret_hash, entry);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(object = %obj.key, error = e, "an ACL object that does not validate grants nothing"),
            }
            idx.objects.push(obj);
        }
        idx
    }

    /// Whether these are the objects the index was built from (the same
    /// allocations: an unchanged object is shared between revisions).
    pub fn built_from<'a>(&self, mut objects: impl Iterator<Item = &'a Arc<StoredObject>>) -> bool {
        self.objects.iter().all(|o| objects.next().is_some_and(|n| Arc::ptr_eq(o, n))) && objects.next().is_none()
    }

    pub fn token(&self, hash: &[u8; 32]) -> Option<&TokenEntry> {
        self.tokens.get(hash)
    }

    /// A workload join token by the hash of its secret: the stored object
    /// (its spec and `status.used`, and the revision a use is written at).
    pub fn join_token(&self, hash: &[u8; 32]) -> Option<&Arc<StoredObject>> {
        self.join_tokens.get(hash)
    }

    /// Why the deny list refuses this certificate (naming the
    /// CertificateRevocation and its reason), if it does.
    pub fn revoked(&self, cert: &CertFacts) -> Option<String> {
        let (name, _, reason) = self.revocations.iter().find(|(_, r, _)| match r {
            Revocation::Serial(s) => *s == cert.serial,
            Revocation::Identity { spiffe_id, issued_before } => {
                // Times are whole seconds: a certificate signed in the
                // revocation's second is revoked too.
                *spiffe_id == cert.spiffe_id && issued_before.is_none_or(|t| cert.issued_at <= i64::try_from(t).unwrap_or(i64::MAX))
            }
        })?;
        let reason = reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        Some(format!("certificate {} of {} is revoked (CertificateRevocation {name}{reason})", cert.serial, cert.spiffe_id))
    }

    /// Whether every certificate of this SPIFFE id is refused, new ones
    /// too (a revocation with no `issuedBefore`): the CA signs none.
    pub fn banned(&self, spiffe_id: &str) -> Option<String> {
        let (name, _, reason) =
            self.revocations.iter().find(|(_, r, _)| matches!(r, Revocation::Identity { spiffe_id: id, issued_before: None } if id == spiffe_id))?;
        let reason = reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default();
        Some(format!("{spiffe_id} is revoked (CertificateRevocation {name}{reason}): the mesh CA signs no certificate for it"))
    }

    pub fn has_policy(&self, name: &str) -> bool {
        self.policies.contains_key(name)
    }

    pub fn has_role(&self, name: &str) -> bool {
        self.roles.contains_key(name)
    }

    /// A token's policies and its roles' policies (names that resolve to
    /// nothing grant nothing).
    pub fn token_policies(&self, t: &TokenEntry) -> Vec<Arc<Policy>> {
        self.resolve(t.policies.iter().chain(t.roles.iter().filter_map(|r| self.roles.get(r)).flat_map(|r| &r.policies)))
    }

    /// The policies of every role that lists this certificate identity.
    pub fn identity_policies(&self, identity: &str) -> Vec<Arc<Policy>> {
        let roles = self.identities.get(identity).into_iter().flatten().filter_map(|r| self.roles.get(r));
        self.resolve(roles.flat_map(|r| &r.policies))
    }

    fn resolve<'a>(&self, names: impl Iterator<Item = &'a String>) -> Vec<Arc<Policy>> {
        let mut out: Vec<Arc<Policy>> = Vec::new();
        for p in names.filter_map(|n| self.policies.get(n)) {
            if !out.iter().any(|o| Arc::ptr_eq(o, p)) {
                out.push(p.clone());
            }
        }
        out
    }
}
