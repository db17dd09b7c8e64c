//! Token secrets and accessor ids, and the Token objects the token API
//! writes. A secret is 256 random bits from the OS, shown once as 64 hex
//! digits; the store keeps only its SHA-256.
//!
//! Hashes are compared by lookup (a hash map keyed by the SHA-256), not
//! byte by byte against a secret: timing can at most tell something about
//! a hash, which does not help find a preimage.

use crate::model::acl::{format_rfc3339, hex, JoinBinding, ProxyBinding, TokenSpec, TokenType, HASH_PREFIX, SECRET_HASH_FIELD};
use crate::model::kinds::{ACL_GROUP, CLUSTER_NAMESPACE};
use rand::RngCore;
use serde_json::{json, Value};

pub fn hash_secret(secret: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, secret.as_bytes());
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The hash as a Token stores it: `sha256:<hex>`.
pub fn hash_text(secret: &str) -> String {
    format!("{HASH_PREFIX}{}", hex(&hash_secret(secret)))
}

/// A new secret: 32 bytes from the OS's generator, as 64 hex digits.
pub fn new_secret() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    hex(&b)
}

/// A new accessor id: a random (version 4) UUID. Public: it names the
/// token in listings and the audit log.
pub fn new_accessor() -> String {
    let mut b = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut b);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// What a new token is given.
#[derive(Debug, Clone, Default)]
pub struct NewToken {
    pub description: Option<String>,
    pub policies: Vec<String>,
    pub roles: Vec<String>,
    /// Lifetime in seconds; none: never expires.
    pub ttl_secs: Option<u64>,
    /// A proxy token's identity; none: a client token.
    pub proxy: Option<ProxyBinding>,
    /// A workload join token's binding (type `join`).
    pub join: Option<JoinBinding>,
}

/// A token just made: the object to store and the secret to show once.
pub struct Minted {
    pub accessor: String,
    pub secret: String,
    pub expires_at: Option<String>,
    /// The Token resource (kind, metadata, spec with the hash).
    pub document: Value,
}

impl std::fmt::Debug for Minted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Minted").field("accessor", &self.accessor).field("secret", &"<redacted>").finish()
    }
}

/// A new token at `now` (unix seconds): fresh accessor and secret.
pub fn mint(req: NewToken, now: u64) -> Minted {
    let (accessor, secret) = (new_accessor(), new_secret());
    let expires_at = req.ttl_secs.map(|t| format_rfc3339(now.saturating_add(t)));
    let spec = TokenSpec {
        token_type: match (&req.proxy, &req.join) {
            (Some(_), _) => TokenType::Proxy,
            (None, Some(_)) => TokenType::Join,
            (None, None) => TokenType::Client,
        },
        description: req.description,
        policies: req.policies,
        roles: req.roles,
        proxy: req.proxy,
        created_at: Some(format_rfc3339(now)),
        expires_at: expires_at.clone(),
        secret_hash: hash_text(&secret),
        join: req.join.map(Box::new),
    };
    let spec = serde_json::to_value(&spec).expect("a token spec serializes");
    debug_assert!(spec.get(SECRET_HASH_FIELD).is_some());
    let document = json!({
        "apiVersion": format!("{ACL_GROUP}/v1"),
        "kind": "Token",
        "metadata": {"name": accessor, "namespace": CLUSTER_NAMESPACE},
        "spec": spec,
    });
    Minted { accessor, secret, expires_at, document }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_validate_and_hold_no_secret() {
        let m = mint(NewToken { policies: vec!["p".into()], ttl_secs: Some(3600), ..Default::default() }, 1_800_000_000);
        assert_eq!(m.secret.len(), 64);
        assert_eq!(m.accessor.len(), 36);
        let text = m.document.to_string();
        assert!(!text.contains(&m.secret));
        assert!(text.contains(&hash_text(&m.secret)));
        let r = crate::model::parse_resource(m.document.clone(), "default").unwrap();
        assert_eq!(r.key.namespace, CLUSTER_NAMESPACE);
        crate::model::validate_spec(&r).unwrap();
        assert_eq!(m.expires_at.as_deref(), Some("2027-01-15T09:00:00Z"));
        assert!(!format!("{m:?}").contains(&m.secret));
        assert_ne!(new_secret(), new_secret());
    }

    #[test]
    fn sha256() {
        assert_eq!(hash_text("abc"), "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
