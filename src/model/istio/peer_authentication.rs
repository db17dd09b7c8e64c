//! `security.istio.io` `PeerAuthentication` (v1beta1 and v1 share one
//! shape): whether a workload's inbound accepts plaintext, mutual TLS, or
//! both, for the whole workload or per port.
//!
//! Which policy applies to a workload, and how the levels combine, is
//! [`compose`] (Istio's `ComposePeerAuthentication`): the oldest mesh-wide
//! policy (root namespace, no selector), then the oldest namespace-wide
//! one, then the oldest workload policy (a selector, not in the root
//! namespace); each level's mode, unless `UNSET`, replaces the one before;
//! the default is `PERMISSIVE`. A port of `portLevelMtls` whose mode is
//! `UNSET` takes the workload's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::common::MatchLabelsSelector;
use super::validate::{check_labels, check_port, check_selector_labels, Path, Report};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PeerAuthentication {
    /// The workloads it applies to; none (or no labels): every workload of
    /// its namespace, or of the mesh in the root namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<MatchLabelsSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtls: Option<MutualTls>,
    /// Port (the workload's inbound port) → its own mode. Only with a
    /// selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_level_mtls: Option<BTreeMap<u32, MutualTls>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MutualTls {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MtlsMode>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    /// Inherit from the level above (`PERMISSIVE` at the top).
    #[default]
    Unset,
    /// Plaintext only.
    Disable,
    /// Mutual TLS or plaintext.
    Permissive,
    /// Mutual TLS only.
    Strict,
}

impl MutualTls {
    fn mode(m: Option<&MutualTls>) -> MtlsMode {
        m.and_then(|m| m.mode).unwrap_or_default()
    }
}

impl PeerAuthentication {
    pub fn match_labels(&self) -> Option<&BTreeMap<String, String>> {
        self.selector.as_ref().map(|s| &s.match_labels).filter(|l| !l.is_empty())
    }

    /// Istio's `ValidatePeerAuthentication` (`pkg/config/validation`):
    /// port-level settings only on a workload policy (a non-empty
    /// selector), a `portLevelMtls` that is given must not be empty, no
    /// port 0 (and here: every port a valid port number), and the
    /// selector's labels as `ValidateWorkloadSelector` checks them.
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        if let Some(sel) = &self.selector {
            let sel_at = at.field("selector").field("matchLabels");
            check_selector_labels(r, &sel_at, &sel.match_labels);
            check_labels(r, &sel_at, &sel.match_labels);
        }
        let ports_at = at.field("portLevelMtls");
        if let Some(ports) = &self.port_level_mtls {
            if self.match_labels().is_none() {
                r.error(&ports_at, "mesh/namespace peer authentication cannot have port level mTLS (portLevelMtls needs a selector with labels)");
            }
            if ports.is_empty() {
                r.error(&ports_at, "port level mTLS, if defined, must have at least one element");
            }
            for port in ports.keys() {
                let port_at = ports_at.key(&port.to_string());
                if *port == 0 {
                    r.error(&port_at, "port cannot be 0");
                } else {
                    check_port(r, &port_at, *port);
                }
            }
        }
    }
}

/// A workload's effective inbound mTLS: a mode, and modes for some ports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EffectiveMtls {
    pub mode: MtlsMode,
    pub per_port: BTreeMap<u32, MtlsMode>,
}

impl EffectiveMtls {
    /// The mode for an inbound port: never `Unset`.
    pub fn for_port(&self, port: u32) -> MtlsMode {
        self.per_port.get(&port).copied().unwrap_or(self.mode)
    }
}

/// One policy as composition sees it.
pub struct Candidate<'a> {
    pub namespace: &'a str,
    /// Creation order (older first wins a tie within a level).
    pub created: (u64, &'a str),
    pub spec: &'a PeerAuthentication,
}

/// Istio's `ComposePeerAuthentication` over the policies that select one
/// workload (already scoped: root namespace or its own, selector matching).
pub fn compose(root_namespace: &str, policies: &[Candidate<'_>]) -> EffectiveMtls {
    let oldest = |pick: &dyn Fn(&Candidate<'_>) -> bool| policies.iter().filter(|c| pick(c)).min_by_key(|c| c.created);
    let mesh = oldest(&|c| c.spec.match_labels().is_none() && c.namespace == root_namespace);
    let namespace = oldest(&|c| c.spec.match_labels().is_none() && c.namespace != root_namespace);
    // A policy with a selector in the root namespace is not a workload
    // policy in Istio's composition (and not a mesh one either).
    let workload = oldest(&|c| c.spec.match_labels().is_some() && c.namespace != root_namespace);
    let mut mode = MtlsMode::Permissive;
    for level in [mesh, namespace, workload].into_iter().flatten() {
        let m = MutualTls::mode(level.spec.mtls.as_ref());
        if m != MtlsMode::Unset {
            mode = m;
        }
    }
    let per_port = workload
        .and_then(|w| w.spec.port_level_mtls.as_ref())
        .map(|ports| ports.iter().map(|(p, m)| (*p, Some(m).map(|m| MutualTls::mode(Some(m))).filter(|m| *m != MtlsMode::Unset).unwrap_or(mode))).collect())
        .unwrap_or_default();
    EffectiveMtls { mode, per_port }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn errors(v: serde_json::Value) -> Vec<(String, String)> {
        match super::super::validate("PeerAuthentication", &v) {
            Ok(_) => Vec::new(),
            Err(e) => e.into_iter().map(|e| (e.field, e.reason)).collect(),
        }
    }

    #[test]
    fn validation_mirrors_istio() {
        assert!(errors(json!({})).is_empty(), "an empty policy is valid (PERMISSIVE)");
        assert!(errors(json!({"mtls": {"mode": "STRICT"}})).is_empty());
        assert!(errors(json!({"selector": {"matchLabels": {"app": "a"}}, "portLevelMtls": {"8080": {"mode": "DISABLE"}}})).is_empty());
        let e = errors(json!({"portLevelMtls": {"8080": {"mode": "DISABLE"}}}));
        assert!(e.iter().any(|(f, r)| f == "spec.portLevelMtls" && r.contains("cannot have port level mTLS")), "{e:?}");
        let e = errors(json!({"selector": {"matchLabels": {}}, "portLevelMtls": {"8080": {}}}));
        assert!(e.iter().any(|(f, _)| f == "spec.portLevelMtls"), "an empty selector is no workload selector: {e:?}");
        let e = errors(json!({"selector": {"matchLabels": {"app": "a"}}, "portLevelMtls": {}}));
        assert!(e.iter().any(|(f, r)| f == "spec.portLevelMtls" && r.contains("at least one element")), "{e:?}");
        let e = errors(json!({"selector": {"matchLabels": {"app": "a"}}, "portLevelMtls": {"0": {}, "70000": {}}}));
        assert!(e.iter().any(|(f, r)| f.contains("portLevelMtls") && f.contains('0') && r.contains("port cannot be 0")), "{e:?}");
        assert!(e.iter().any(|(f, r)| f.contains("70000") && r.contains("1..65535")), "{e:?}");
        let e = errors(json!({"mtls": {"mode": "OPTIONAL"}}));
        assert!(e.iter().any(|(f, _)| f == "spec.mtls.mode"), "an unknown mode is refused: {e:?}");
        let e = errors(json!({"mtls": {"mode": "STRICT", "extra": 1}}));
        assert!(e.iter().any(|(f, _)| f.starts_with("spec.mtls")), "an unknown field is refused: {e:?}");
        let e = errors(json!({"selector": {"matchLabels": {"app": "*"}}}));
        assert!(e.iter().any(|(_, r)| r.contains("wildcard")), "{e:?}");
    }

    fn pa(v: serde_json::Value) -> PeerAuthentication {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn precedence_workload_namespace_mesh() {
        let mesh = pa(json!({"mtls": {"mode": "STRICT"}}));
        let ns = pa(json!({"mtls": {"mode": "UNSET"}}));
        let wl = pa(json!({"selector": {"matchLabels": {"app": "a"}}, "portLevelMtls": {"8080": {"mode": "DISABLE"}, "9090": {}}}));
        let c = |namespace, rev, spec| Candidate { namespace, created: (rev, "x"), spec };
        assert_eq!(compose("istio-system", &[]).mode, MtlsMode::Permissive);
        let got = compose("istio-system", &[c("istio-system", 1, &mesh), c("shop", 2, &ns), c("shop", 3, &wl)]);
        assert_eq!(got.mode, MtlsMode::Strict, "UNSET inherits from the mesh");
        assert_eq!(got.for_port(8080), MtlsMode::Disable);
        assert_eq!(got.for_port(9090), MtlsMode::Strict, "an UNSET port inherits the workload's mode");
        let disable = pa(json!({"mtls": {"mode": "DISABLE"}}));
        let older = pa(json!({"mtls": {"mode": "PERMISSIVE"}}));
        let got = compose("istio-system", &[c("istio-system", 1, &mesh), c("shop", 5, &disable), c("shop", 4, &older)]);
        assert_eq!(got.mode, MtlsMode::Permissive, "the oldest namespace policy wins");
        // A selector in the root namespace is ignored.
        let root_sel = pa(json!({"selector": {"matchLabels": {"app": "a"}}, "mtls": {"mode": "DISABLE"}}));
        assert_eq!(compose("istio-system", &[c("istio-system", 1, &mesh), c("istio-system", 2, &root_sel)]).mode, MtlsMode::Strict);
    }
}
