//! BackendTLSPolicy (Gateway API) → Istio DestinationRules that originate
//! TLS, as Istio's controller does, and the policies' status. Pure; run by
//! `gateway_api::translate` (it knows which parents send to which hosts).
//!
//! - One rule per targeted service (`backendtlspolicy.<host>`, in the
//!   policy's namespace, labelled [`POLICY_LABEL`]): `trafficPolicy.tls`
//!   from the policy that targets the whole service, a `portLevelSettings`
//!   entry for each policy that targets one port (`sectionName`: the
//!   port's name). Two policies for one service port: the oldest wins, the
//!   other is `Conflicted`.
//! - TLS is `SIMPLE`: `sni` is `validation.hostname`, the certificate must
//!   carry `subjectAltNames` (Hostname: a DNS name; URI) or else that
//!   hostname. The CA:
//!   - `caCertificateRefs` (Secrets of the policy's namespace, key
//!     `ca.crt` or `cacert`): `credentialName` = [`CA_PREFIX`]`<ns>/<policy>`,
//!     a name only these rules carry (validation refuses it in stored
//!     rules); the bundle (every referenced CA, concatenated) is in
//!     [`BackendCas`], which `cluster` inlines for gateways and sidecars
//!     alike (a CA is public; `xds::secrets` serves gateways only).
//!   - `wellKnownCACertificates: System`: `caCertificates` =
//!     [`SYSTEM_CA_BUNDLE`] on the proxy's host.
//!
//!   A policy none of whose CA references resolves still has its rule:
//!   the cluster is closed (no endpoints), never plaintext.
//! - Status: per ancestor (each Gateway, or mesh parent Service, whose
//!   routes send to a targeted service), `Accepted` and `ResolvedRefs`.

use super::gateway_api::{condition, generated, Ancestors, BackendKind, Backends, Output};
use super::mesh::Config;
use crate::model::gateway_api::{BackendTlsPolicy, PolicyTargetRef};
use crate::model::istio::DestinationRule;
use crate::model::{Kind, ResourceKey, StoredObject};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The `credentialName` prefix of a rule generated from a policy with
/// `caCertificateRefs`: `backendtlspolicy://<namespace>/<policy>`.
pub use crate::model::gateway_api::BACKEND_CA_PREFIX as CA_PREFIX;
/// The CA bundle `wellKnownCACertificates: System` names (Debian's and
/// Ubuntu's; where Envoy runs).
pub const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// A generated DestinationRule carries this label = its first policy.
pub const POLICY_LABEL: &str = "gateway.networking.k8s.io/backend-tls-policy";

/// The CA bundles of the generated rules, by `credentialName`, and every
/// Secret (namespace, name) the policies name (read or looked for): a
/// change to one of them rebuilds the mesh.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackendCas {
    pub bundles: BTreeMap<String, String>,
    pub secrets: BTreeSet<(String, String)>,
}

/// The rule of one service: the oldest policy, and the TLS for the whole
/// service and per port.
struct HostRule<'a> {
    source: &'a StoredObject,
    whole: Option<Value>,
    ports: BTreeMap<u32, Value>,
}

pub fn translate(policies: &[(&StoredObject, &BackendTlsPolicy)], ancestors: &Ancestors, backends: &dyn Backends, out: &mut Output) {
    let mut policies = policies.to_vec();
    policies.sort_by(|(a, _), (b, _)| (a.create_revision, &a.key).cmp(&(b.create_revision, &b.key)));
    let mut rules: BTreeMap<(String, String), HostRule> = BTreeMap::new();
    for (obj, p) in policies {
        let ns = obj.key.namespace.as_str();
        let gen = obj.version;
        let v = &p.validation;
        // The CA: every referenced Secret's, concatenated.
        let mut tls = json!({"mode": "SIMPLE", "sni": v.hostname});
        let sans: Vec<&str> = v.subject_alt_names.iter().filter_map(|s| s.hostname.as_deref().or(s.uri.as_deref())).collect();
        tls["subjectAltNames"] = if sans.is_empty() { json!([v.hostname]) } else { json!(sans) };
        let mut refs = (true, "ResolvedRefs", String::new());
        if v.well_known_ca_certificates.is_some() {
            tls["caCertificates"] = json!(SYSTEM_CA_BUNDLE);
        } else {
            let credential = format!("{CA_PREFIX}{ns}/{}", obj.key.name);
            let mut bundle = String::new();
            for r in &v.ca_certificate_refs {
                out.backend_cas.secrets.insert((ns.to_string(), r.name.clone()));
                match backends.ca_bundle(ns, &r.name) {
                    Some(pem) => bundle.push_str(pem.trim_end()),
                    None => {
                        refs = (false, "InvalidCACertificateRef", format!("Secret {ns}/{} not found, or it has no ca.crt", r.name));
                        continue;
                    }
                }
                bundle.push('\n');
            }
            if !bundle.is_empty() {
                out.backend_cas.bundles.insert(credential.clone(), bundle);
            }
            tls["credentialName"] = json!(credential);
        }
        let no_ca = v.well_known_ca_certificates.is_none() && !out.backend_cas.bundles.contains_key(&format!("{CA_PREFIX}{ns}/{}", obj.key.name));
        // Targets: each service port (or the whole service) once.
        let mut accepted = if no_ca {
            condition("Accepted", false, "NoValidCACertificate", "no CA certificate reference resolves: connections to the targets fail", gen)
        } else {
            condition("Accepted", true, "Accepted", "", gen)
        };
        let mut hosts = Vec::new();
        for t in &p.target_refs {
            let Some((host, port)) = target(backends, ns, t) else {
                let why = format!("{} {ns}/{}{} not found", t.kind, t.name, t.section_name.as_deref().map(|s| format!(" (port {s})")).unwrap_or_default());
                accepted = condition("Accepted", false, "TargetNotFound", &why, gen);
                continue;
            };
            hosts.push(host.clone());
            let rule = rules.entry((ns.to_string(), host)).or_insert_with(|| HostRule { source: obj, whole: None, ports: BTreeMap::new() });
            let slot = match port {
                Some(port) => rule.ports.entry(port).or_insert(Value::Null),
                None => rule.whole.get_or_insert(Value::Null),
            };
            if slot.is_null() {
                *slot = tls.clone();
            } else {
                accepted = condition("Accepted", false, "Conflicted", "an older BackendTLSPolicy targets the same service port", gen);
            }
        }
        let conditions = json!([accepted, condition("ResolvedRefs", refs.0, refs.1, &refs.2, gen)]);
        let mut seen = BTreeSet::new();
        let status: Vec<Value> = hosts
            .iter()
            .flat_map(|h| ancestors.get(h).into_iter().flatten())
            .filter(|a| seen.insert(*a))
            .take(16)
            .map(|(controller, (group, kind, namespace, name))| {
                json!({"ancestorRef": {"group": group, "kind": kind, "namespace": namespace, "name": name}, "controllerName": controller, "conditions": conditions})
            })
            .collect();
        out.status.insert(obj.key.clone(), json!({"ancestors": status}));
    }
    for ((ns, host), rule) in rules {
        let mut traffic = json!({});
        if let Some(tls) = rule.whole {
            traffic["tls"] = tls;
        }
        if !rule.ports.is_empty() {
            traffic["portLevelSettings"] = rule.ports.into_iter().map(|(n, tls)| json!({"port": {"number": n}, "tls": tls})).collect();
        }
        let name = format!("backendtlspolicy.{host}");
        match serde_json::from_value::<DestinationRule>(json!({"host": host, "trafficPolicy": traffic})) {
            Ok(spec) => {
                let label = (POLICY_LABEL, rule.source.key.name.as_str());
                let dr: Arc<Config<DestinationRule>> = generated(rule.source, Kind::DestinationRule, &name, label, spec);
                out.destination_rules.push(dr);
            }
            Err(e) => out.skipped.push((ResourceKey::new(Kind::DestinationRule, ns.as_str(), &name), format!("generated DestinationRule: {e}"))),
        }
    }
}

/// A target's hostname, and its port number if it names one.
fn target(backends: &dyn Backends, ns: &str, t: &PolicyTargetRef) -> Option<(String, Option<u32>)> {
    let kind = || if t.kind == "ServiceEntry" { BackendKind::ServiceEntry } else { BackendKind::Service };
    let host = backends.hostname(kind(), ns, &t.name)?;
    match &t.section_name {
        Some(s) => Some((host, Some(backends.port_named(kind(), ns, &t.name, s)?))),
        None => Some((host, None)),
    }
}
