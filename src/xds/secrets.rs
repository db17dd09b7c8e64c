//! SDS on the ADS stream: the store's Secrets as Envoy `Secret`s, for the
//! gateways whose listeners name them (`translate::tls`: `credentialName`,
//! `credentialNames`, `caCertCredentialName`).
//!
//! The one place a sealed private key is opened. Rules (as Istio's SDS
//! for gateways):
//! - only a gateway proxy (`ProxyKind::Router`) gets secrets, and only
//!   those of its own namespace (its identity is authenticated: ACLs on)
//!   and, as `NS/NAME`, those of namespace NS that a ReferenceGrant there
//!   lets its namespace's Gateways or ListenerSets use (as Istio's SDS
//!   checks Gateway API grants),
//!   and only if its credential is a gateway's: a proxy token made with
//!   `--gateway`, or a certificate identity a Role lets read secrets in
//!   the namespace (`auth::Principal::may_have_secrets`, checked by the
//!   server at the stream's start and at every revision);
//! - never over a plaintext connection (`--insecure`): nothing is served,
//!   and the stream says why once in the log;
//! - a secret that is missing (or does not open) is not served: Envoy
//!   keeps the listener warming (its fetch timeout is zero).
//!
//! Names, as Istio's: `NAME` is the certificate and key of Secret NAME;
//! `NAME-cacert` is a CA bundle, from the Secret `NAME-cacert` if there is
//! one, else from Secret NAME's `cacert`/`ca.crt`.
//!
//! Versions hash the stored object (the sealed envelope, not the key), so
//! they are the same on every replica and say nothing about the key. A
//! change to a Secret changes only its SDS resources: the listener keeps
//! its version, and Envoy rotates the certificate without draining.

use super::resources::{fnv1a, ResourceMap, XdsResource};
use crate::model::proxy::{ProxyIdentity, ProxyKind};
use crate::model::secret::{Stored, CA_SUFFIX};
use crate::model::{gateway_api, Kind, ResourceKey, TypedSpec};
use crate::store::Applied;
use envoy_types::pb::envoy::config::core::v3::{data_source::Specifier, DataSource};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{secret, CertificateValidationContext, Secret, TlsCertificate};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// What opens a Secret's sealed private key: the cluster secrets key (the
/// root's `secrets::SecretsKey` implements it). The xDS side holds no key
/// material and knows no cipher, only this call.
pub trait Unseal: Send + Sync + 'static {
    /// The private key of Secret `namespace/name` from its stored envelope,
    /// or why not (saying nothing of the content).
    fn open(&self, namespace: &str, name: &str, envelope: &str) -> Result<zeroize::Zeroizing<Vec<u8>>, String>;
}

/// Why a stream gets no secrets, or `Ok` if it may have its namespace's.
pub fn eligible(proxy: &ProxyIdentity, tls: bool, authenticated: bool, key: Option<&Arc<dyn Unseal>>) -> Result<Arc<dyn Unseal>, &'static str> {
    if proxy.kind != ProxyKind::Router {
        return Err("only gateway proxies (node type router) are served secrets");
    }
    if !tls {
        return Err("secrets (private keys) are never sent over a plaintext xDS connection");
    }
    if !authenticated {
        return Err("secrets are served only to authenticated proxies (ACLs on), which may read only their own namespace's");
    }
    key.cloned().ok_or("this replica has no cluster secrets key")
}

/// The Secrets (key, revision) a map was built from, and the map.
type Built = (Vec<(ResourceKey, u64)>, Arc<ResourceMap>);

/// What a stream serves from: the key, and the last map built with the
/// objects it was built from (a Secret unchanged is not opened again).
pub struct SecretSource {
    key: Arc<dyn Unseal>,
    namespace: String,
    cache: Mutex<Option<Built>>,
}

impl SecretSource {
    pub fn new(key: Arc<dyn Unseal>, proxy: &ProxyIdentity) -> SecretSource {
        SecretSource { key, namespace: proxy.namespace.clone(), cache: Mutex::new(None) }
    }

    /// The SDS resources of the proxy's namespace at `applied`, and, as
    /// `NS/NAME`, the Secrets of other namespaces a ReferenceGrant there
    /// lets the Gateways (or ListenerSets) of the proxy's namespace use
    /// (`ReferenceGrant::lets_gateways_read_secret`, the rule translation
    /// programs listeners by).
    pub fn resources(&self, applied: &Applied) -> Arc<ResourceMap> {
        let objects = &applied.state.objects;
        let in_ns = |ns: String| {
            let start = ResourceKey::new(Kind::Secret, ns.as_str(), "");
            objects.range(start..).take_while(move |(k, _)| k.kind == Kind::Secret && k.namespace == ns)
        };
        let mut chosen: Vec<(&ResourceKey, &Arc<crate::model::StoredObject>)> = in_ns(self.namespace.clone()).collect();
        // The grants (their revisions count: a grant removed takes its
        // Secrets away) and the Secrets they give.
        let mut grants = Vec::new();
        let start = ResourceKey::new(Kind::ReferenceGrant, "", "");
        for (k, o) in objects.range(start..).take_while(|(k, _)| k.kind == Kind::ReferenceGrant) {
            if k.namespace == self.namespace {
                continue;
            }
            let Ok(typed) = o.typed() else { continue };
            let TypedSpec::GatewayApi(gateway_api::Spec::ReferenceGrant(g)) = typed.as_ref() else { continue };
            let granted: Vec<_> = in_ns(k.namespace.to_string()).filter(|(s, _)| g.lets_gateways_read_secret(&self.namespace, &s.name)).collect();
            if !granted.is_empty() {
                grants.push((k, o.mod_revision));
                chosen.extend(granted);
            }
        }
        chosen.sort_by(|a, b| a.0.cmp(b.0));
        chosen.dedup_by(|a, b| a.0 == b.0);
        let fingerprint: Vec<(ResourceKey, u64)> =
            chosen.iter().map(|(k, o)| ((*k).clone(), o.mod_revision)).chain(grants.iter().map(|(k, r)| ((*k).clone(), *r))).collect();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, map)) = cache.as_ref() {
            if *seen == fingerprint {
                return map.clone();
            }
        }
        let mut map = ResourceMap::new();
        let mut by_ns: BTreeMap<&str, BTreeMap<&str, (Stored, u64)>> = BTreeMap::new();
        for (k, o) in &chosen {
            by_ns.entry(k.namespace.as_str()).or_default().insert(k.name.as_str(), (Stored::from_body(o.body()), fnv1a(o.text().as_bytes())));
        }
        for (ns, stored) in &by_ns {
            // The proxy's own Secrets by their name; others' as `NS/NAME`.
            let sds_name = |name: &str| if *ns == self.namespace { name.to_string() } else { gateway_api::cross_namespace_secret(ns, name) };
            for (name, (s, version)) in stored {
                if let (Some(chain), Some(envelope)) = (&s.cert_chain, &s.sealed_key) {
                    match self.key.open(ns, name, envelope) {
                        Ok(key) => {
                            let cert =
                                TlsCertificate { certificate_chain: Some(inline(chain.as_bytes())), private_key: Some(inline(&key)), ..Default::default() };
                            let sds = sds_name(name);
                            let secret = Secret { name: sds.clone(), r#type: Some(secret::Type::TlsCertificate(cert)) };
                            map.insert(sds.clone(), Arc::new(XdsResource::with_version::<Secret>(sds, prost::Message::encode_to_vec(&secret), hex(*version))));
                        }
                        // Says nothing of the content.
                        Err(why) => tracing::warn!(secret = %format!("{ns}/{name}"), why, "a Secret's key does not open; not served"),
                    }
                }
                // `NAME-cacert`: the Secret of that name wins over NAME's CA.
                if let Some(ca) = &s.ca {
                    let ca_name = if name.ends_with(CA_SUFFIX) && s.sealed_key.is_none() { name.to_string() } else { format!("{name}{CA_SUFFIX}") };
                    let own = ca_name == *name;
                    if own || !stored.contains_key(ca_name.as_str()) {
                        let v = CertificateValidationContext { trusted_ca: Some(inline(ca.as_bytes())), ..Default::default() };
                        let sds = sds_name(&ca_name);
                        let secret = Secret { name: sds.clone(), r#type: Some(secret::Type::ValidationContext(v)) };
                        map.insert(sds.clone(), Arc::new(XdsResource::with_version::<Secret>(sds, prost::Message::encode_to_vec(&secret), hex(*version))));
                    }
                }
            }
        }
        let map = Arc::new(map);
        *cache = Some((fingerprint, map.clone()));
        map
    }
}

fn inline(bytes: &[u8]) -> DataSource {
    DataSource { specifier: Some(Specifier::InlineBytes(bytes.to_vec())), ..Default::default() }
}

fn hex(v: u64) -> String {
    format!("{v:016x}")
}
