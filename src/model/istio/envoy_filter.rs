//! `networking.istio.io/v1alpha3` `EnvoyFilter`: patches to the Envoy
//! config generated for the workloads it selects (Istio's escape hatch).
//!
//! Validation follows Istio's (`pkg/config/validation/envoyfilter` and the
//! CRD schema): a workload selector without `*`, every patch with an
//! `applyTo`, a `patch.operation`, a value unless it is REMOVE, a valid
//! `proxyVersion` RE2, the matcher its `applyTo` needs, and a value that
//! builds into the Envoy type of its `applyTo` — here strictly: an unknown
//! `@type` or a field Envoy's message does not have is an error naming
//! its path (Istio only warns on unknown fields; Envoy would drop them
//! silently or NACK). The patch engine is `translate::envoyfilter`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

use super::super::envoy_api;
use super::common::{Labels, WorkloadSelector};
use super::validate::{check_labels, check_regex, check_selector_labels, Path, Report};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvoyFilter {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    /// Gateway API gateways and waypoints only (refused: Lodestar has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_patches: Vec<ConfigPatch>,
    /// Lower first; default 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ConfigPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply_to: Option<ApplyTo>,
    #[serde(default, rename = "match", skip_serializing_if = "Option::is_none")]
    pub match_: Option<ObjectMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<Patch>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ApplyTo {
    Invalid,
    Listener,
    FilterChain,
    NetworkFilter,
    HttpFilter,
    RouteConfiguration,
    VirtualHost,
    HttpRoute,
    Cluster,
    ExtensionConfig,
    Bootstrap,
    ListenerFilter,
}

impl ApplyTo {
    /// The Envoy message a patch value of this kind is.
    pub fn message(self) -> Option<&'static str> {
        Some(match self {
            ApplyTo::Listener => "envoy.config.listener.v3.Listener",
            ApplyTo::FilterChain => "envoy.config.listener.v3.FilterChain",
            ApplyTo::NetworkFilter => "envoy.config.listener.v3.Filter",
            ApplyTo::ListenerFilter => "envoy.config.listener.v3.ListenerFilter",
            ApplyTo::HttpFilter => "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter",
            ApplyTo::RouteConfiguration => "envoy.config.route.v3.RouteConfiguration",
            ApplyTo::VirtualHost => "envoy.config.route.v3.VirtualHost",
            ApplyTo::HttpRoute => "envoy.config.route.v3.Route",
            ApplyTo::Cluster => "envoy.config.cluster.v3.Cluster",
            ApplyTo::ExtensionConfig => "envoy.config.core.v3.TypedExtensionConfig",
            ApplyTo::Bootstrap | ApplyTo::Invalid => return None,
        })
    }

    /// Kinds where Istio keeps INSERT_*; elsewhere they become ADD.
    pub fn ordered(self) -> bool {
        matches!(self, ApplyTo::HttpFilter | ApplyTo::NetworkFilter | ApplyTo::HttpRoute | ApplyTo::ListenerFilter)
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PatchContext {
    #[default]
    Any,
    SidecarInbound,
    SidecarOutbound,
    Gateway,
    Waypoint,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ObjectMatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<PatchContext>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listener: Option<ListenerMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_configuration: Option<RouteConfigurationMatch>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterMatch>,
    /// Waypoints only (refused: Lodestar has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waypoint: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProxyMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub proxy_version: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ListenerMatch {
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub port_number: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_chain: Option<FilterChainMatch>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub listener_filter: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilterChainMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sni: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub transport_protocol: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub application_protocols: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterMatch>,
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub destination_port: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FilterMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sub_filter: Option<SubFilterMatch>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SubFilterMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteConfigurationMatch {
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub port_number: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub port_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gateway: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<VirtualHostMatch>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VirtualHostMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<RouteMatch>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RouteMatch {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<RouteAction>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RouteAction {
    #[default]
    Any,
    Route,
    Redirect,
    DirectResponse,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterMatch {
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub port_number: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub service: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subset: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Patch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_class: Option<FilterClass>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Operation {
    Invalid,
    Merge,
    Add,
    Remove,
    InsertBefore,
    InsertAfter,
    InsertFirst,
    Replace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FilterClass {
    Unspecified,
    Authn,
    Authz,
    Stats,
}

/// Filter names istiod no longer matches (since 1.19 names are literal):
/// Istio's admission warns on them.
const DEPRECATED_NAMES: [(&str, &str); 4] = [
    ("envoy.http_connection_manager", "envoy.filters.network.http_connection_manager"),
    ("envoy.router", "envoy.filters.http.router"),
    ("envoy.tcp_proxy", "envoy.filters.network.tcp_proxy"),
    ("envoy.lua", "envoy.filters.http.lua"),
];

pub const HCM: &str = "envoy.filters.network.http_connection_manager";

/// The warning istiod returns for every EnvoyFilter.
pub const WARNING: &str =
    "EnvoyFilter exposes internal implementation details that may change at any time. Prefer other APIs if possible, and exercise extreme caution, especially around upgrades.";

impl EnvoyFilter {
    pub fn selector(&self) -> Option<&Labels> {
        self.workload_selector.as_ref().map(|s| &s.labels)
    }

    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        r.warn(at, WARNING);
        if let Some(sel) = &self.workload_selector {
            let sel_at = at.field("workloadSelector").field("labels");
            check_selector_labels(r, &sel_at, &sel.labels);
            check_labels(r, &sel_at, &sel.labels);
            if sel.labels.is_empty() {
                r.warn(&sel_at, "a workload selector with no labels applies to every workload in the namespace");
            }
        }
        if !self.target_refs.is_empty() {
            r.error(&at.field("targetRefs"), "targetRefs attach to Gateway API gateways and waypoints, which Lodestar does not have; use workloadSelector");
        }
        for (i, p) in self.config_patches.iter().enumerate() {
            p.check(&at.field("configPatches").index(i), r);
        }
    }
}

impl ConfigPatch {
    /// The operation as istiod runs it: INSERT_* on kinds without order
    /// become ADD.
    pub fn operation(&self) -> Option<Operation> {
        let op = self.patch.as_ref()?.operation?;
        let insert = matches!(op, Operation::InsertBefore | Operation::InsertAfter | Operation::InsertFirst);
        Some(if insert && !self.apply_to?.ordered() { Operation::Add } else { op })
    }

    pub fn context(&self) -> PatchContext {
        self.match_.as_ref().and_then(|m| m.context).unwrap_or_default()
    }

    fn check(&self, at: &Path, r: &mut Report) {
        let m = self.match_.as_ref();
        if m.and_then(|m| m.context) == Some(PatchContext::Waypoint) || m.is_some_and(|m| m.waypoint.is_some()) {
            r.error(&at.field("match"), "waypoint patches apply to waypoints, which Lodestar does not have");
            return;
        }
        let apply_at = at.field("applyTo");
        let apply_to = match self.apply_to {
            None | Some(ApplyTo::Invalid) => {
                r.error(&apply_at, "applyTo is required (LISTENER, FILTER_CHAIN, NETWORK_FILTER, HTTP_FILTER, ROUTE_CONFIGURATION, VIRTUAL_HOST, HTTP_ROUTE, CLUSTER, LISTENER_FILTER, EXTENSION_CONFIG)");
                return;
            }
            Some(ApplyTo::Bootstrap) => {
                r.error(
                    &apply_at,
                    "BOOTSTRAP is refused: istiod applies it nowhere (since 1.21; it is accepted and ignored), and in Lodestar a bootstrap is written once when a proxy starts (`lodestar bootstrap`, `lodestar agent`), so a later change to this EnvoyFilter would never reach running proxies; edit the bootstrap itself instead",
                );
                return;
            }
            Some(a) => a,
        };
        let patch_at = at.field("patch");
        let Some(patch) = &self.patch else {
            r.error(&patch_at, "patch is required");
            return;
        };
        let op_at = patch_at.field("operation");
        let op = match patch.operation {
            None | Some(Operation::Invalid) => {
                r.error(&op_at, "operation is required (MERGE, ADD, REMOVE, INSERT_BEFORE, INSERT_AFTER, INSERT_FIRST, REPLACE)");
                return;
            }
            Some(op) => op,
        };
        if let Some(proxy) = m.and_then(|m| m.proxy.as_ref()) {
            if !proxy.proxy_version.is_empty() {
                check_regex(r, &at.field("match").field("proxy").field("proxyVersion"), &proxy.proxy_version);
            }
        }
        if patch.filter_class.is_some_and(|c| c != FilterClass::Unspecified) {
            r.warn(&patch_at.field("filterClass"), "not used by istiod (nor by Lodestar): the operation alone places the filter");
        }
        if apply_to == ApplyTo::ExtensionConfig && op != Operation::Add {
            r.warn(&op_at, "has no effect: istiod (and Lodestar) serve only the extension configs EXTENSION_CONFIG patches ADD");
        }
        self.check_match(apply_to, at, r);
        let value_at = patch_at.field("value");
        match (&patch.value, op) {
            (None, Operation::Remove) => {}
            (None, _) => r.error(&value_at, "value is required for every operation but REMOVE"),
            (Some(value), _) => {
                if let Some(message) = apply_to.message() {
                    if let Err((path, reason)) = envoy_api::message_from_json(message, value) {
                        let field = if path.is_empty() { value_at.clone() } else { value_at.field(&path) };
                        r.error(&field, format!("{reason} (the value is a {message})"));
                    } else if apply_to == ApplyTo::ExtensionConfig && op == Operation::Add {
                        check_extension_config(value, &value_at, r);
                    }
                }
            }
        }
    }

    /// Istio's applyTo/match consistency (only when an object matcher is given).
    fn check_match(&self, apply_to: ApplyTo, at: &Path, r: &mut Report) {
        let Some(m) = &self.match_ else { return };
        let match_at = at.field("match");
        let has_object = m.listener.is_some() || m.route_configuration.is_some() || m.cluster.is_some();
        if !has_object {
            return;
        }
        match apply_to {
            ApplyTo::Listener | ApplyTo::FilterChain | ApplyTo::NetworkFilter | ApplyTo::HttpFilter => {
                let Some(l) = &m.listener else {
                    r.error(&match_at.field("listener"), format!("{apply_to:?} patches need a listener match"));
                    return;
                };
                let l_at = match_at.field("listener");
                if !l.port_name.is_empty() {
                    r.warn(&l_at.field("portName"), "not implemented by istiod (nor by Lodestar): it matches any port name");
                }
                if let Some(f) = l.filter_chain.as_ref().and_then(|fc| fc.filter.as_ref()) {
                    let f_at = l_at.field("filterChain").field("filter");
                    if matches!(apply_to, ApplyTo::Listener | ApplyTo::FilterChain) {
                        r.warn(&f_at, "filter match has no effect on LISTENER and FILTER_CHAIN patches");
                    }
                    if f.name.is_empty() {
                        r.error(&f_at.field("name"), "filter match needs a name");
                    }
                    deprecated_name(r, &f_at.field("name"), &f.name);
                    if let Some(sub) = &f.sub_filter {
                        let sub_at = f_at.field("subFilter");
                        if apply_to != ApplyTo::HttpFilter {
                            r.error(&sub_at, "subFilter is only for HTTP_FILTER patches");
                        } else if f.name != HCM && f.name != "envoy.http_connection_manager" {
                            r.error(&sub_at, format!("subFilter needs filter.name {HCM}"));
                        }
                        if sub.name.is_empty() {
                            r.error(&sub_at.field("name"), "subFilter match needs a name");
                        }
                        deprecated_name(r, &sub_at.field("name"), &sub.name);
                    }
                }
            }
            ApplyTo::RouteConfiguration | ApplyTo::VirtualHost | ApplyTo::HttpRoute if m.route_configuration.is_none() => {
                r.error(&match_at.field("routeConfiguration"), format!("{apply_to:?} patches need a routeConfiguration match"));
            }
            ApplyTo::Cluster if m.cluster.is_none() => r.error(&match_at.field("cluster"), "CLUSTER patches need a cluster match"),
            _ => {}
        }
    }
}

/// An ECDS resource needs the name filters ask for and a typed_config
/// (Envoy NACKs either missing).
fn check_extension_config(value: &Value, at: &Path, r: &mut Report) {
    if value.get("name").and_then(Value::as_str).is_none_or(str::is_empty) {
        r.error(&at.field("name"), "an extension config needs the name its filters' config_discovery asks for");
    }
    if value.get("typed_config").or_else(|| value.get("typedConfig")).is_none_or(Value::is_null) {
        r.error(&at.field("typed_config"), "an extension config needs a typed_config");
    }
}

fn deprecated_name(r: &mut Report, at: &Path, name: &str) {
    if let Some((_, new)) = DEPRECATED_NAMES.iter().find(|(old, _)| *old == name) {
        r.warn(
            at,
            format!("using deprecated filter name {name:?}; use {new:?} instead (names are compared literally: this one matches nothing Lodestar generates)"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use serde_json::{json, Value};

    fn ecds(op: &str, value: Value) -> Value {
        json!({"configPatches": [{"applyTo": "EXTENSION_CONFIG", "patch": {"operation": op, "value": value}}]})
    }

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("EnvoyFilter", &spec).expect_err("spec should be invalid")
    }

    const LUA: &str = "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua";

    #[test]
    fn extension_configs_need_a_name_and_a_typed_config() {
        let ok = validate("EnvoyFilter", &ecds("ADD", json!({"name": "x", "typed_config": {"@type": LUA}}))).unwrap();
        assert!(!ok.warnings().iter().any(|w| w.contains("no effect")), "{:?}", ok.warnings());
        let e = errors(ecds("ADD", json!({"typed_config": {"@type": LUA}})));
        assert!(e.iter().any(|e| e.field == "spec.configPatches[0].patch.value.name"), "{e:?}");
        let e = errors(ecds("ADD", json!({"name": "x"})));
        assert!(e.iter().any(|e| e.field == "spec.configPatches[0].patch.value.typed_config"), "{e:?}");
        let e = errors(ecds("ADD", json!({"name": "x", "typed_config": {"@type": LUA, "nope": 1}})));
        assert!(e.iter().any(|e| e.field == "spec.configPatches[0].patch.value.typed_config.nope"), "{e:?}");
        // Other operations: accepted, as istiod does, with a warning that they do nothing.
        let merged = validate("EnvoyFilter", &ecds("MERGE", json!({"name": "x", "typed_config": {"@type": LUA}}))).unwrap();
        assert!(merged.warnings().iter().any(|w| w.contains("spec.configPatches[0].patch.operation") && w.contains("no effect")), "{:?}", merged.warnings());
    }

    #[test]
    fn bootstrap_is_refused_saying_why() {
        let e = errors(json!({"configPatches": [{"applyTo": "BOOTSTRAP", "patch": {"operation": "MERGE", "value": {}}}]}));
        assert!(e.iter().any(|e| e.field == "spec.configPatches[0].applyTo" && e.reason.contains("never reach running proxies")), "{e:?}");
    }
}
