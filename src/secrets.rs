//! The cluster secrets key: seals the private keys of `Secret`s before
//! they are proposed, opens them where xDS serves them.
//!
//! - The key: 32 random bytes in `secrets.key` (0600) beside the mesh CA
//!   (`mesh_ca_dir`, or `<data_dir>/mesh-ca`), made with the mesh CA
//!   (`ca::create_dir`) and shared by the members exactly as the mesh CA
//!   directory is. It never travels: not in raft, not in a backup.
//! - Sealing: AES-256-GCM (`ring::aead`), a random 96-bit nonce per seal,
//!   the Secret's namespace and name as associated data (a sealed key
//!   moved to another Secret does not open). The envelope is
//!   `v1:` + base64(nonce | ciphertext | tag).
//! - The API seals ([`seal_txn`]) before proposing, so the raft log, the
//!   store and backups hold only the envelope, and applying stays
//!   deterministic (every replica stores the same bytes). Re-applying
//!   the same Secret keeps the envelope already stored (it would
//!   otherwise differ by its nonce and count as a change).

use crate::error::{Error, FieldError, Result};
use crate::model::secret::{self, Decoded};
use crate::model::Kind;
use crate::store::types::{Op, Txn};
use crate::store::Applied;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// The file, in the mesh CA directory.
pub const KEY_FILE: &str = "secrets.key";
const KEY_LEN: usize = 32;
const ENVELOPE_PREFIX: &str = "v1:";

/// The cluster secrets key. Its Debug prints nothing of it.
pub struct SecretsKey {
    key: LessSafeKey,
    path: PathBuf,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretsKey({})", self.path.display())
    }
}

/// Write a new random key to `dir/secrets.key` (0600); refuses to
/// overwrite one.
pub fn create(dir: &Path) -> std::result::Result<(), String> {
    let path = dir.join(KEY_FILE);
    if path.exists() {
        return Err(format!("{}: a secrets key already exists; not overwriting it", path.display()));
    }
    let mut bytes = Zeroizing::new([0u8; KEY_LEN]);
    SystemRandom::new().fill(&mut bytes[..]).map_err(|_| "no randomness for the secrets key".to_string())?;
    let text = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&bytes[..]) + "\n");
    crate::tls::pki::write_file(&path, &text, true).map_err(|e| e.to_string())
}

impl SecretsKey {
    /// Load `dir/secrets.key`; `Ok(None)` when there is none.
    pub fn load(dir: &Path) -> std::result::Result<Option<SecretsKey>, String> {
        let path = dir.join(KEY_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let text = Zeroizing::new(std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?);
        let bytes = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(text.trim())
                .map_err(|_| format!("{}: not a base64 key (32 bytes; remove it to have a new one made only if no Secret is stored)", path.display()))?,
        );
        if bytes.len() != KEY_LEN {
            return Err(format!("{}: the key is {} bytes, not {KEY_LEN}", path.display(), bytes.len()));
        }
        let key = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| format!("{}: not an AES-256 key", path.display()))?;
        Ok(Some(SecretsKey { key: LessSafeKey::new(key), path }))
    }

    /// Seal `plaintext` for the Secret `namespace/name`.
    pub fn seal(&self, namespace: &str, name: &str, plaintext: &[u8]) -> Result<String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new().fill(&mut nonce).map_err(|_| Error::internal("no randomness to seal a key"))?;
        let mut buf = Zeroizing::new(plaintext.to_vec());
        let aad = secret::associated_data(namespace, name);
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(&aad), &mut *buf)
            .map_err(|_| Error::internal("sealing a key failed"))?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Ok(format!("{ENVELOPE_PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(out)))
    }

    /// Open an envelope sealed for `namespace/name`. The error says
    /// nothing of the content.
    pub fn open(&self, namespace: &str, name: &str, envelope: &str) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
        let body = envelope.strip_prefix(ENVELOPE_PREFIX).ok_or("not a sealed key (unknown envelope version)")?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(body).map_err(|_| "a sealed key that is not base64")?;
        if bytes.len() < NONCE_LEN {
            return Err("a sealed key that is too short".into());
        }
        let (nonce, sealed) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| "a sealed key with a bad nonce")?;
        let mut buf = Zeroizing::new(sealed.to_vec());
        let aad = secret::associated_data(namespace, name);
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(&aad), &mut buf)
            .map_err(|_| "the sealed key does not open with this cluster's secrets key (another key, or moved from another Secret)".to_string())?;
        Ok(Zeroizing::new(plain.to_vec()))
    }
}

/// How the xDS server opens the keys it serves over SDS (`xds::secrets`).
impl crate::xds::secrets::Unseal for SecretsKey {
    fn open(&self, namespace: &str, name: &str, envelope: &str) -> std::result::Result<Zeroizing<Vec<u8>>, String> {
        SecretsKey::open(self, namespace, name, envelope)
    }
}

/// Replace every Secret put of `txn` (the body as written: data,
/// stringData) by its stored form, the private key sealed. `current`: the
/// state the request is checked against; a Secret whose content is what is
/// stored keeps its envelope (so the write is `unchanged`).
pub fn seal_txn(key: Option<&SecretsKey>, txn: &mut Txn, current: &Applied) -> Result<()> {
    let mut errors = Vec::new();
    for (i, op) in txn.ops.iter_mut().enumerate() {
        let Op::Put { key: k, body, .. } = op else { continue };
        if k.kind != Kind::Secret {
            continue;
        }
        let input: serde_json::Value = serde_json::from_str(body).map_err(|e| Error::internal(format!("a validated body does not parse: {e}")))?;
        let decoded = secret::decode(&input).map_err(Error::invalid_fields)?;
        let sealed = match (&decoded.key, key) {
            (None, _) => None,
            (Some(_), None) => {
                errors.push(FieldError::new(
                    format!("resources[{i}].data"),
                    "this cluster has no secrets key, so it cannot store a private key: put secrets.key beside the mesh CA (mesh_ca_dir) on every member",
                ));
                continue;
            }
            (Some((_, plaintext)), Some(sk)) => Some(reuse(sk, current, k, &input, &decoded).map_or_else(|| sk.seal(&k.namespace, &k.name, plaintext), Ok)?),
        };
        let stored = secret::stored_body(&input, &decoded, sealed);
        *body = crate::model::json_text(&stored).into();
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::invalid_fields(errors))
    }
}

/// The envelope already stored for `k`, if the stored Secret has the same
/// content as the one written (same key once opened, same everything else).
fn reuse(sk: &SecretsKey, current: &Applied, k: &crate::model::ResourceKey, input: &serde_json::Value, decoded: &Decoded) -> Option<String> {
    let stored = current.state.get(k)?;
    let envelope = secret::Stored::from_body(stored.body()).sealed_key?;
    let (_, plaintext) = decoded.key.as_ref()?;
    let opened = sk.open(&k.namespace, &k.name, &envelope).ok()?;
    if opened.as_slice() != plaintext.as_slice() {
        return None;
    }
    let candidate = secret::stored_body(input, decoded, Some(envelope.clone()));
    (crate::model::json_text(&candidate).as_str() == &**stored.text()).then_some(envelope)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_opens_and_binds_to_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        assert!(SecretsKey::load(dir.path()).unwrap().is_none());
        create(dir.path()).unwrap();
        assert!(create(dir.path()).is_err());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode() & 0o777, 0o600);
        let k = SecretsKey::load(dir.path()).unwrap().unwrap();
        let a = k.seal("ns", "gw", b"-----BEGIN PRIVATE KEY-----").unwrap();
        let b = k.seal("ns", "gw", b"-----BEGIN PRIVATE KEY-----").unwrap();
        assert_ne!(a, b, "a random nonce per seal");
        assert!(!a.contains("PRIVATE"));
        assert_eq!(k.open("ns", "gw", &a).unwrap().as_slice(), b"-----BEGIN PRIVATE KEY-----");
        assert!(k.open("ns", "other", &a).is_err(), "bound to its Secret");
        assert!(k.open("other", "gw", &a).is_err());
        let other = tempfile::tempdir().unwrap();
        create(other.path()).unwrap();
        assert!(SecretsKey::load(other.path()).unwrap().unwrap().open("ns", "gw", &a).is_err());
        assert!(!format!("{k:?}").contains(&std::fs::read_to_string(dir.path().join(KEY_FILE)).unwrap().trim().to_string()));
    }
}
