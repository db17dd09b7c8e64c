//! `Secret` (Kubernetes core/v1): a TLS credential for Gateway
//! `credentialName`, in the shape users already have.
//!
//! Input: `type` `kubernetes.io/tls` or `Opaque` (the default), `data`
//! (base64) and/or `stringData` (text; it wins over `data` for the same
//! key, as Kubernetes merges them). Keys are the ones Istio's credential
//! controller (`pilot/pkg/credentials/kube`) reads: the generic `cert`,
//! `key`, `cacert` first, then the TLS secret's `tls.crt`, `tls.key`,
//! `ca.crt`. A secret holds a certificate chain with its key, a CA bundle
//! (for MUTUAL), or both. Every other key is refused as not supported.
//!
//! Stored: `data` keeps the certificate and CA (base64), never the private
//! key: the API seals it (the root's `secrets`, AES-256-GCM) before the write is
//! proposed, into `sealed.<key name>`, and [`check_sealed`] refuses any
//! Secret write that carries a key in the clear. Reads leave `sealed` out
//! ([`redact`]): `get`, `list`, watches and debug output show the
//! certificate and not the key, not even sealed.
//!
//! Metadata: kubectl's `last-applied-configuration` annotation (which
//! `kubectl get secret -o yaml` prints, and which holds the whole Secret,
//! key included) is dropped, with a warning; `managedFields` is dropped
//! for every kind (`resource::parse_resource`). Any other annotation that
//! holds private-key material (a PEM key block, base64 of one, or the key
//! itself) is refused, naming it.
//!
//! Pure: parsing and checks only; no key material is encrypted or
//! decrypted here.

use crate::error::FieldError;
use base64::Engine;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use zeroize::Zeroizing;

/// Where a stored Secret keeps its sealed private key: `sealed.<key name>`.
pub const SEALED_FIELD: &str = "sealed";
pub const TYPE_TLS: &str = "kubernetes.io/tls";
pub const TYPE_OPAQUE: &str = "Opaque";

/// Istio's keys, in the order it reads them (generic first).
pub const CERT_KEYS: [&str; 2] = ["cert", "tls.crt"];
pub const KEY_KEYS: [&str; 2] = ["key", "tls.key"];
pub const CA_KEYS: [&str; 2] = ["cacert", "ca.crt"];

/// The suffix of the SDS name of a credential's CA bundle (Istio's
/// `SdsCaSuffix`): `<credentialName>-cacert`.
pub const CA_SUFFIX: &str = "-cacert";

fn is_key_name(k: &str) -> bool {
    KEY_KEYS.contains(&k)
}

fn known(k: &str) -> bool {
    CERT_KEYS.contains(&k) || KEY_KEYS.contains(&k) || CA_KEYS.contains(&k)
}

fn field(name: &str, key: &str) -> String {
    format!("{name}[{key}]")
}

/// A Secret as written, decoded and checked: every entry by key (PEM
/// text), the private key's entry kept apart and wiped when dropped.
#[derive(Debug)]
pub struct Decoded {
    pub secret_type: String,
    /// Certificate and CA entries (no private key), PEM text.
    pub public: BTreeMap<String, String>,
    /// The private key's entry name and PEM text.
    pub key: Option<(String, Zeroizing<Vec<u8>>)>,
}

/// kubectl's annotation holding the object as last applied: for a
/// Secret, its private key. Never stored on a Secret.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The warnings of a Secret body as written: what is dropped from it.
pub fn warnings(body: &Value) -> Vec<String> {
    match annotations(body).and_then(|a| a.get(LAST_APPLIED)) {
        Some(_) => vec![format!(
            "metadata.annotations.{LAST_APPLIED}: dropped: kubectl's copy of the whole Secret holds its private key, which is only ever stored sealed"
        )],
        None => Vec::new(),
    }
}

fn annotations(body: &Value) -> Option<&Map<String, Value>> {
    body.get("metadata")?.get("annotations")?.as_object()
}

/// Whether `text` holds private-key material: a PEM private key block
/// (`PRIVATE KEY-----`, as in `-----BEGIN EC PRIVATE KEY-----`), the same
/// in base64 (at any of the three alignments, as a copy of `data[tls.key]`
/// carries it), or a line of `key`'s own PEM body (the key's DER in base64,
/// without its armour).
pub fn holds_key_material(text: &str, key: Option<&[u8]>) -> bool {
    const MARKER: &[u8] = b"PRIVATE KEY-----";
    if text.contains(std::str::from_utf8(MARKER).unwrap_or_default()) {
        return true;
    }
    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD;
    let in_base64 = (0..3usize).any(|offset| {
        // Only the characters that depend on the marker's bytes alone.
        let mut bytes = vec![0u8; offset];
        bytes.extend_from_slice(MARKER);
        let encoded = b64.encode(&bytes);
        let (first, last) = ((offset * 8).div_ceil(6), bytes.len() * 8 / 6);
        text.contains(&encoded[first..last])
    });
    in_base64
        || key.is_some_and(|k| String::from_utf8_lossy(k).lines().map(str::trim).filter(|l| l.len() >= 40 && !l.starts_with("-----")).any(|l| text.contains(l)))
}

/// Errors for annotations (other than [`LAST_APPLIED`], dropped) that
/// hold private-key material; never quoting them.
fn annotation_errors(body: &Value, key: Option<&[u8]>) -> Vec<FieldError> {
    annotations(body)
        .into_iter()
        .flatten()
        .filter(|(name, v)| name.as_str() != LAST_APPLIED && v.as_str().is_some_and(|t| holds_key_material(t, key)))
        .map(|(name, _)| {
            FieldError::new(
                format!("metadata.annotations.{name}"),
                "holds private-key material: a Secret's key belongs in data (tls.key or key), where it is sealed; annotations are stored and shown as they are",
            )
        })
        .collect()
}

/// Decode and check a Secret body as written (before sealing): every
/// problem with its field path (`data[tls.key]`, `stringData[cert]`, ...).
pub fn decode(body: &Value) -> Result<Decoded, Vec<FieldError>> {
    let mut errors = Vec::new();
    let secret_type = match body.get("type") {
        None | Some(Value::Null) => TYPE_OPAQUE.to_string(),
        Some(Value::String(t)) if t == TYPE_TLS || t == TYPE_OPAQUE => t.clone(),
        Some(Value::String(t)) => {
            errors.push(FieldError::new("type", format!("type {t:?} is not supported: a Secret here is a TLS credential ({TYPE_TLS} or {TYPE_OPAQUE})")));
            t.clone()
        }
        Some(_) => {
            errors.push(FieldError::new("type", "expected a string"));
            String::new()
        }
    };
    if body.get(SEALED_FIELD).is_some() {
        errors.push(FieldError::new(SEALED_FIELD, "is written by the server (the sealed private key): give the key in data or stringData"));
    }
    match body.get("immutable") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => {}
        Some(_) => errors.push(FieldError::new("immutable", "immutable Secrets are not supported")),
    }
    // Raw bytes by key: data (base64) then stringData (wins).
    let mut raw: BTreeMap<String, (String, Zeroizing<Vec<u8>>)> = BTreeMap::new();
    for (section, base64) in [("data", true), ("stringData", false)] {
        let Some(v) = body.get(section) else { continue };
        let Some(map) = v.as_object() else {
            if !v.is_null() {
                errors.push(FieldError::new(section, "expected a map of key to value"));
            }
            continue;
        };
        for (k, v) in map {
            let at = field(section, k);
            if !known(k) {
                errors.push(FieldError::new(
                    at,
                    "key not supported: a TLS credential has tls.crt, tls.key, ca.crt (or Istio's generic cert, key, cacert)".to_string(),
                ));
                continue;
            }
            let Some(text) = v.as_str() else {
                errors.push(FieldError::new(at, "expected a string"));
                continue;
            };
            let bytes = if base64 {
                match base64::engine::general_purpose::STANDARD.decode(text.trim()) {
                    Ok(b) => Zeroizing::new(b),
                    // The decoder's message names no content.
                    Err(e) => {
                        errors.push(FieldError::new(at, format!("not valid base64: {e}")));
                        continue;
                    }
                }
            } else {
                Zeroizing::new(text.as_bytes().to_vec())
            };
            raw.insert(k.clone(), (at, bytes));
        }
    }
    if raw.is_empty() && errors.is_empty() {
        errors.push(FieldError::new(
            "data",
            "a TLS credential needs a certificate and key (tls.crt and tls.key, or cert and key), or a CA bundle (ca.crt or cacert)",
        ));
    }
    // Istio reads the generic names first; giving both is ambiguous.
    for group in [CERT_KEYS, KEY_KEYS, CA_KEYS] {
        if group.iter().all(|k| raw.contains_key(*k)) {
            errors.push(FieldError::new(field("data", group[1]), format!("give {} or {}, not both", group[0], group[1])));
        }
    }
    let find = |group: [&str; 2]| group.iter().find_map(|k| raw.get(*k).map(|(at, b)| (k.to_string(), at.clone(), b)));
    let cert = find(CERT_KEYS);
    let key = find(KEY_KEYS);
    let ca = find(CA_KEYS);
    // Kubernetes' own rule for its TLS type.
    if secret_type == TYPE_TLS {
        for k in ["tls.crt", "tls.key"] {
            if !raw.contains_key(k) {
                errors.push(FieldError::new(field("data", k), format!("required by type {TYPE_TLS}")));
            }
        }
    }
    match (&cert, &key) {
        (Some(_), None) => errors.push(FieldError::new(field("data", "tls.key"), "a certificate needs its private key (tls.key or key)")),
        (None, Some(_)) => errors.push(FieldError::new(field("data", "tls.crt"), "a private key needs its certificate (tls.crt or cert)")),
        _ => {}
    }
    let mut public = BTreeMap::new();
    let mut chain = Vec::new();
    if let Some((name, at, bytes)) = &cert {
        match certificates(bytes) {
            Ok(c) => chain = c,
            Err(e) => errors.push(FieldError::new(at.clone(), e)),
        }
        public.insert(name.clone(), String::from_utf8_lossy(bytes).into_owned());
    }
    if let Some((name, at, bytes)) = &ca {
        if let Err(e) = certificates(bytes) {
            errors.push(FieldError::new(at.clone(), e));
        }
        public.insert(name.clone(), String::from_utf8_lossy(bytes).into_owned());
    }
    let mut sealed_key = None;
    if let Some((name, at, bytes)) = key {
        match private_key(bytes) {
            Err(e) => errors.push(FieldError::new(at.clone(), e)),
            Ok(k) => {
                if let (Some(leaf), Some((_, cert_at, _))) = (chain.first(), &cert) {
                    if let Err(e) = key_matches(&k, leaf) {
                        errors.push(FieldError::new(at.clone(), format!("{e} (the first certificate of {cert_at})")));
                    }
                }
            }
        }
        sealed_key = Some((name, bytes.clone()));
    }
    errors.extend(annotation_errors(body, sealed_key.as_ref().map(|(_, k)| k.as_slice())));
    if errors.is_empty() {
        Ok(Decoded { secret_type, public, key: sealed_key })
    } else {
        Err(errors)
    }
}

/// The PEM certificates in `bytes` (at least one, nothing else but
/// whitespace between them), or why not.
fn certificates(bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let mut out = Vec::new();
    for c in CertificateDer::pem_slice_iter(bytes) {
        let der = c.map_err(|e| format!("not a PEM certificate: {e}"))?;
        x509_parser::parse_x509_certificate(&der).map_err(|e| format!("a certificate does not parse: {e}"))?;
        out.push(der);
    }
    if out.is_empty() {
        return Err("no PEM certificate (-----BEGIN CERTIFICATE-----) found".into());
    }
    Ok(out)
}

/// A PEM private key (PKCS#8, SEC1 or PKCS#1). The error names no byte of it.
fn private_key(bytes: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM private key (-----BEGIN PRIVATE KEY----- or EC/RSA PRIVATE KEY) found".to_string(),
        _ => "not a usable PEM private key".to_string(),
    })
}

/// Whether `key` is the private key of `leaf` (its public key equals the
/// certificate's): what Envoy would otherwise find only when loading it.
fn key_matches(key: &PrivateKeyDer<'static>, leaf: &CertificateDer<'static>) -> Result<(), String> {
    let signer = rustls::crypto::ring::sign::any_supported_type(key)
        .map_err(|_| "the private key's algorithm is not supported (use ECDSA P-256/P-384, RSA or Ed25519)".to_string())?;
    let spki = signer.public_key().ok_or("the private key's public key cannot be derived")?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| format!("the certificate does not parse: {e}"))?;
    if cert.public_key().raw != spki.as_ref() {
        return Err("the private key does not match the certificate".into());
    }
    Ok(())
}

/// The stored body: the input's metadata (without [`LAST_APPLIED`] and
/// `managedFields`) and type, the certificate and CA as `data` (base64),
/// and the sealed key as `sealed.<key name>`.
pub fn stored_body(input: &Value, decoded: &Decoded, sealed: Option<String>) -> Value {
    let mut out = Map::new();
    for k in ["apiVersion", "kind", "metadata"] {
        if let Some(v) = input.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
        if let Some(a) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
            a.remove(LAST_APPLIED);
            if a.is_empty() {
                meta.remove("annotations");
            }
        }
    }
    out.insert("type".into(), Value::String(decoded.secret_type.clone()));
    let data: Map<String, Value> =
        decoded.public.iter().map(|(k, pem)| (k.clone(), Value::String(base64::engine::general_purpose::STANDARD.encode(pem.as_bytes())))).collect();
    out.insert("data".into(), Value::Object(data));
    if let (Some((name, _)), Some(envelope)) = (&decoded.key, sealed) {
        out.insert(SEALED_FIELD.into(), Value::Object([(name.clone(), Value::String(envelope))].into_iter().collect()));
    }
    Value::Object(out)
}

/// A stored Secret, as the xDS layer reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// The certificate chain, PEM.
    pub cert_chain: Option<String>,
    /// The sealed private key (the root's `secrets` envelope).
    pub sealed_key: Option<String>,
    /// The CA bundle, PEM.
    pub ca: Option<String>,
}

impl Stored {
    pub fn from_body(body: &Value) -> Stored {
        let data = body.get("data").and_then(Value::as_object);
        let entry = |group: [&str; 2]| {
            group.iter().find_map(|k| {
                let b64 = data?.get(*k)?.as_str()?;
                let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
                String::from_utf8(bytes).ok().filter(|s| !s.is_empty())
            })
        };
        let sealed = body.get(SEALED_FIELD).and_then(Value::as_object);
        let sealed_key = KEY_KEYS.iter().find_map(|k| sealed?.get(*k)?.as_str().map(str::to_string));
        Stored { cert_chain: entry(CERT_KEYS), sealed_key, ca: entry(CA_KEYS) }
    }
}

/// Refuse a Secret body that carries a private key anywhere but sealed:
/// `stringData`, or a key entry in `data`. Every write passes here before
/// it is proposed (`Node::write`), so whatever path built it, nothing
/// reaches the raft log, the store or a backup with a key in the clear.
pub fn check_sealed(body: &Value) -> Result<(), String> {
    if body.get("stringData").is_some() {
        return Err("a Secret is stored with its key sealed: stringData must have been converted by the API".into());
    }
    if let Some(data) = body.get("data").and_then(Value::as_object) {
        if data.keys().any(|k| is_key_name(k)) {
            return Err("a Secret is stored with its private key sealed, never in data".into());
        }
    }
    if let Some(name) =
        annotations(body).into_iter().flatten().find_map(|(n, v)| (n == LAST_APPLIED || v.as_str().is_some_and(|t| holds_key_material(t, None))).then_some(n))
    {
        return Err(format!("a Secret is stored without private-key material in its annotations ({name})"));
    }
    Ok(())
}

/// What clients see of a stored Secret: everything but `sealed`.
pub fn redact(out: &mut Value) {
    if let Some(obj) = out.as_object_mut() {
        obj.remove(SEALED_FIELD);
    }
}

/// The associated data a Secret's key is sealed with: its namespace and
/// name, so a sealed key copied into another Secret does not open.
pub fn associated_data(namespace: &str, name: &str) -> Vec<u8> {
    format!("lodestar/secret/{namespace}/{name}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["gw.example.com".into()]).unwrap().self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    fn has(e: &[FieldError], field: &str, reason: &str) -> bool {
        e.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn tls_secret_decodes_and_stores_without_its_key() {
        let (cert, key) = pair();
        let body = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gw", "namespace": "default"},
            "type": "kubernetes.io/tls", "data": {"tls.crt": b64(&cert), "tls.key": b64(&key)}});
        let d = decode(&body).unwrap();
        assert_eq!(d.key.as_ref().unwrap().0, "tls.key");
        let stored = stored_body(&body, &d, Some("ENVELOPE".into()));
        assert!(check_sealed(&stored).is_ok());
        let text = stored.to_string();
        assert!(!text.contains(&b64(&key)) && !text.contains("PRIVATE KEY"), "{text}");
        let s = Stored::from_body(&stored);
        assert_eq!((s.cert_chain.as_deref(), s.sealed_key.as_deref(), s.ca), (Some(cert.as_str()), Some("ENVELOPE"), None));
        let mut out = stored.clone();
        redact(&mut out);
        assert!(out.get(SEALED_FIELD).is_none() && out["data"].get("tls.crt").is_some());
        // The input form itself is refused by the store's check.
        assert!(check_sealed(&body).is_err());
        assert!(check_sealed(&json!({"stringData": {"cert": "x"}})).is_err());
    }

    #[test]
    fn kubectl_annotations_are_dropped_and_keys_in_annotations_refused() {
        let (cert, key) = pair();
        let data = json!({"tls.crt": b64(&cert), "tls.key": b64(&key)});
        let last_applied = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "data": data,
            "metadata": {"name": "gw", "namespace": "default"}})
        .to_string();
        let body = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "data": data,
            "metadata": {"name": "gw", "namespace": "default", "annotations": {LAST_APPLIED: last_applied, "team": "edge"}, "managedFields": [{"manager": "kubectl"}]}});
        assert!(holds_key_material(&last_applied, None), "base64 of a PEM key block");
        let d = decode(&body).unwrap();
        assert_eq!(warnings(&body).len(), 1);
        let stored = stored_body(&body, &d, Some("ENVELOPE".into()));
        assert_eq!(stored["metadata"]["annotations"], json!({"team": "edge"}));
        assert!(stored["metadata"].get("managedFields").is_none());
        check_sealed(&stored).unwrap();
        let text = stored.to_string();
        assert!(!text.contains(&b64(&key)) && !holds_key_material(&text, Some(key.as_bytes())), "{text}");
        // The annotation alone would be refused by the store's last check.
        let mut kept = stored.clone();
        kept["metadata"]["annotations"][LAST_APPLIED] = json!(last_applied);
        assert!(check_sealed(&kept).unwrap_err().contains(LAST_APPLIED));
        // Key material in any other annotation: refused, the field named, nothing quoted.
        let body_text = |ann: Value| json!({"type": "kubernetes.io/tls", "data": data, "metadata": {"name": "gw", "annotations": ann}});
        let pem_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        for (i, ann) in [key.clone(), b64(&key), format!("x{}", b64(&format!("ab{key}"))), pem_body].into_iter().enumerate() {
            let e = decode(&body_text(json!({"note": ann}))).unwrap_err();
            assert!(has(&e, "metadata.annotations.note", "private-key material"), "{i}: {e:?}");
            assert!(e.iter().all(|e| !e.reason.contains("PRIVATE")), "{e:?}");
        }
        // Certificates and ordinary text are fine.
        assert!(decode(&body_text(json!({"cert": cert, "b64": b64(&cert), "note": "rotated by ops"}))).is_ok());
    }

    #[test]
    fn generic_keys_and_string_data() {
        let (cert, key) = pair();
        let (ca, _) = pair();
        let body = json!({"stringData": {"cert": cert, "key": key, "cacert": ca}});
        let d = decode(&body).unwrap();
        assert_eq!(d.secret_type, TYPE_OPAQUE);
        assert_eq!(d.public.keys().collect::<Vec<_>>(), ["cacert", "cert"]);
        // A CA-only secret (`<name>-cacert`).
        assert!(decode(&json!({"data": {"ca.crt": b64(&ca)}})).unwrap().key.is_none());
    }

    #[test]
    fn errors_name_the_field() {
        let (cert, key) = pair();
        let (_, other_key) = pair();
        let e = decode(&json!({"data": {"tls.crt": b64(&cert), "tls.key": b64(&other_key)}})).unwrap_err();
        assert!(has(&e, "data[tls.key]", "does not match the certificate"), "{e:?}");
        let e = decode(&json!({"data": {"tls.crt": b64("garbage"), "tls.key": b64(&key)}})).unwrap_err();
        assert!(has(&e, "data[tls.crt]", "no PEM certificate"), "{e:?}");
        let e =
            decode(&json!({"data": {"tls.crt": b64(&cert), "tls.key": b64("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n")}})).unwrap_err();
        assert!(e.iter().any(|e| e.field == "data[tls.key]"), "{e:?}");
        assert!(e.iter().all(|e| !e.reason.contains("AAAA")), "{e:?}");
        let e = decode(&json!({"data": {"tls.crt": "%%%"}})).unwrap_err();
        assert!(has(&e, "data[tls.crt]", "base64"), "{e:?}");
        let e = decode(&json!({"type": "kubernetes.io/tls", "stringData": {"cert": cert}, "data": {"password": "eA=="}})).unwrap_err();
        assert!(has(&e, "data[password]", "not supported"), "{e:?}");
        assert!(has(&e, "data[tls.key]", "required by type kubernetes.io/tls"), "{e:?}");
        let e = decode(&json!({"type": "kubernetes.io/dockerconfigjson", "data": {}})).unwrap_err();
        assert!(has(&e, "type", "not supported"), "{e:?}");
        let e = decode(&json!({"stringData": {"cert": cert, "tls.crt": cert, "key": key}})).unwrap_err();
        assert!(has(&e, "data[tls.crt]", "not both"), "{e:?}");
        let e = decode(&json!({"sealed": {"tls.key": "x"}, "stringData": {"cacert": cert}})).unwrap_err();
        assert!(has(&e, "sealed", "written by the server"), "{e:?}");
    }
}
