//! `AuthorizationPolicy` (security.istio.io v1beta1 and v1): who may call a
//! workload, enforced by Envoy's RBAC filters on its inbound listeners
//! (`translate::authz`).
//!
//! Validation mirrors Istio's `ValidateAuthorizationPolicy`
//! (pkg/config/validation) and `pkg/config/security` (attribute keys, IPs,
//! ports, path templates), with every error at its field path. What Istio
//! accepts and Lodestar cannot enforce is refused as "not supported":
//! `targetRef(s)` (Kubernetes Gateway API references). `CUSTOM` names an
//! ext_authz provider of the MeshConfig (`translate::extauthz`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::common::MatchLabelsSelector;
use super::validate::{check_policy_target, Path, Report};

/// The annotation that makes a policy a dry run: evaluated and counted
/// (Envoy's shadow rules), never enforced.
pub const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthorizationPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<MatchLabelsSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub target_refs: Vec<Value>,
    /// `None` (absent) and `Some([])` differ for DENY: Istio refuses a DENY
    /// without `rules`. For ALLOW both mean "deny everything".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<Rule>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Action {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Allow => "ALLOW",
            Action::Deny => "DENY",
            Action::Audit => "AUDIT",
            Action::Custom => "CUSTOM",
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Provider {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Rule {
    /// `None` (absent) matches any source; `Some([])` is refused (Istio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<From>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Vec<To>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub when: Vec<Condition>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct From {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Source {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub request_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_request_principals: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_namespaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_service_accounts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote_ip_blocks: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_remote_ip_blocks: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct To {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Operation {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_methods: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_paths: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Condition {
    #[serde(default)]
    pub key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_values: Vec<String>,
}

/// The `when` keys Istio documents (pkg/config/security), and which of them
/// only an HTTP request has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attribute {
    RequestHeader(String),
    SourceIp,
    RemoteIp,
    SourceNamespace,
    SourcePrincipal,
    SourceServiceAccount,
    RequestPrincipal,
    RequestAudiences,
    RequestPresenter,
    /// `request.auth.claims[a][b]`: the path into the token's payload.
    RequestClaim(Vec<String>),
    DestinationIp,
    DestinationPort,
    ConnectionSni,
    /// `experimental.envoy.filters.NAME[KEY]`: dynamic metadata.
    EnvoyFilter {
        filter: String,
        key: String,
    },
}

impl Attribute {
    pub fn parse(key: &str) -> Result<Attribute, String> {
        Ok(match key {
            "source.ip" => Attribute::SourceIp,
            "remote.ip" => Attribute::RemoteIp,
            "source.namespace" => Attribute::SourceNamespace,
            "source.principal" => Attribute::SourcePrincipal,
            "source.serviceAccount" => Attribute::SourceServiceAccount,
            "request.auth.principal" => Attribute::RequestPrincipal,
            "request.auth.audiences" => Attribute::RequestAudiences,
            "request.auth.presenter" => Attribute::RequestPresenter,
            "destination.ip" => Attribute::DestinationIp,
            "destination.port" => Attribute::DestinationPort,
            "connection.sni" => Attribute::ConnectionSni,
            k if k.starts_with("request.headers") => {
                let names = bracketed(&k["request.headers".len()..]).ok_or_else(|| format!("bad key ({k}): should have format request.headers[NAME]"))?;
                match names.as_slice() {
                    [one] => Attribute::RequestHeader(one.clone()),
                    _ => return Err(format!("bad key ({k}): should have format request.headers[NAME]")),
                }
            }
            k if k.starts_with("request.auth.claims") => {
                let names =
                    bracketed(&k["request.auth.claims".len()..]).ok_or_else(|| format!("bad key ({k}): should have format request.auth.claims[NAME]"))?;
                Attribute::RequestClaim(names)
            }
            k if k.starts_with("experimental.envoy.filters.") => {
                let rest = &k["experimental.".len()..];
                let (filter, key) = rest
                    .strip_suffix(']')
                    .and_then(|r| r.split_once('['))
                    .filter(|(f, k)| !f.is_empty() && !k.is_empty() && !k.contains(['[', ']']))
                    .ok_or_else(|| format!("bad key ({k}): should have format experimental.envoy.filters.NAME[KEY]"))?;
                Attribute::EnvoyFilter { filter: filter.to_string(), key: key.to_string() }
            }
            other => return Err(format!("unknown attribute: {other}")),
        })
    }

    /// Whether only an HTTP request carries it (on a TCP port an ALLOW rule
    /// using it matches nothing and a DENY rule ignores it).
    pub fn http_only(&self) -> bool {
        matches!(
            self,
            Attribute::RequestHeader(_) | Attribute::RequestPrincipal | Attribute::RequestAudiences | Attribute::RequestPresenter | Attribute::RequestClaim(_)
        )
    }
}

/// `[a]` or `[a][b]...` (one or more non-empty names); `None` otherwise.
fn bracketed(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let inner = rest.strip_prefix('[')?;
        let end = inner.find(']')?;
        let name = &inner[..end];
        if name.is_empty() || name.contains('[') {
            return None;
        }
        out.push(name.to_string());
        rest = &inner[end + 1..];
    }
    (!out.is_empty()).then_some(out)
}

/// An IP address or CIDR block (`security.ValidateIPs`).
pub fn check_ip_block(v: &str) -> Result<(), String> {
    if v.contains('/') {
        let (ip, len) = v.split_once('/').unwrap_or_default();
        let ip: std::net::IpAddr = ip.parse().map_err(|_| format!("bad CIDR range ({v})"))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        match len.parse::<u8>() {
            Ok(n) if n <= max => Ok(()),
            _ => Err(format!("bad CIDR range ({v})")),
        }
    } else {
        v.parse::<std::net::IpAddr>().map(|_| ()).map_err(|_| format!("bad IP address ({v})"))
    }
}

/// A port number 0..=65535 (`security.ValidatePorts`).
pub fn check_port_value(v: &str) -> Result<(), String> {
    match v.parse::<u32>() {
        Ok(p) if p <= 65535 => Ok(()),
        _ => Err(format!("bad port ({v}): must be a number in 0..65535")),
    }
}

/// Istio's path templates (`{*}` one segment, `{**}` any number, last):
/// `security.CheckValidPathTemplate`.
pub fn contains_path_template(p: &str) -> bool {
    p.contains("{*}") || p.contains("{**}")
}

fn check_path_template(p: &str) -> Result<(), String> {
    if !contains_path_template(p) {
        return Ok(());
    }
    let segments: Vec<&str> = p.split('/').collect();
    for (i, seg) in segments.iter().enumerate() {
        let is_glob = *seg == "{*}" || *seg == "{**}";
        if !is_glob && (seg.contains('{') || seg.contains('}') || seg.contains('*')) {
            return Err(format!("invalid or unsupported path {p}, found in {{*}} or {{**}}: each operator must be a whole path segment"));
        }
        if *seg == "{**}" && i != segments.len() - 1 {
            return Err(format!("invalid or unsupported path {p}, found in {{**}}: it must be the last path segment"));
        }
    }
    if !p.starts_with('/') {
        return Err(format!("invalid or unsupported path {p}: a path template must start with /"));
    }
    Ok(())
}

/// The `*` forms a string value may use (`prefix*`, `*suffix`, `*`).
fn check_wildcard(v: &str) -> Result<(), String> {
    let inner = v.strip_prefix('*').unwrap_or(v);
    let inner = inner.strip_suffix('*').unwrap_or(inner);
    if v != "*" && (inner.contains('*') || (v.starts_with('*') && v.ends_with('*') && v.len() > 1)) {
        return Err(format!("{v:?}: only a leading or a trailing * is supported (prefix*, *suffix or *)"));
    }
    Ok(())
}

fn check_values(r: &mut Report, at: &Path, values: &[String], check: impl Fn(&str) -> Result<(), String>) {
    for (i, v) in values.iter().enumerate() {
        if v.is_empty() {
            // security.CheckEmptyValues
            r.error(&at.index(i), "empty value is not allowed");
            continue;
        }
        r.check(&at.index(i), check(v));
    }
}

/// `ns/name` or `name` (Istio's `security.CheckServiceAccount`).
fn check_service_account(v: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("invalid service account {v:?}: {why}"));
    if v.contains('*') {
        return bad("wildcards are not supported");
    }
    match v.split('/').collect::<Vec<_>>().as_slice() {
        [sa] if !sa.is_empty() => Ok(()),
        [ns, sa] if !ns.is_empty() && !sa.is_empty() => Ok(()),
        _ => bad("expected NAME or NAMESPACE/NAME"),
    }
}

impl AuthorizationPolicy {
    pub fn action(&self) -> Action {
        self.action.unwrap_or_default()
    }

    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        // validateOneOfSelectorType, validateWorkloadSelector,
        // validatePolicyTargetReference(s).
        check_policy_target(r, at, self.selector.as_ref(), self.target_ref.is_some(), !self.target_refs.is_empty());
        let action = self.action();
        match action {
            Action::Custom => {
                // Istio: CUSTOM needs rules and provider.name (an
                // extensionProvider of the MeshConfig, `translate::extauthz`).
                if self.rules.is_none() {
                    r.error(&at.field("rules"), "CUSTOM action without `rules` is meaningless as it will never be triggered, add an empty rule `{}` if you want it be triggered for every request");
                } else if self.provider.as_ref().is_none_or(|p| p.name.is_empty()) {
                    r.error(&at.field("provider").field("name"), "`provider.name` must not be empty");
                }
            }
            _ if self.provider.is_some() => {
                r.error(&at.field("provider"), format!("`provider` must not be with non CUSTOM action, found {}", action.name()));
            }
            _ => {}
        }
        if action == Action::Deny && self.rules.is_none() {
            r.error(&at.field("rules"), "DENY action without `rules` is meaningless as it will never be triggered, add an empty rule `{}` if you want it be triggered for every request");
        }
        for (i, rule) in self.rules.iter().flatten().enumerate() {
            rule.check(&at.field("rules").index(i), r, action);
        }
    }
}

impl Rule {
    fn check(&self, at: &Path, r: &mut Report, action: Action) {
        let (mut tcp_in_from, mut tcp_in_to, mut from_exists, mut to_exists) = (false, false, false, false);
        if self.from.as_ref().is_some_and(|f| f.is_empty()) {
            r.error(&at.field("from"), "`from` must not be empty");
        }
        for (i, from) in self.from.iter().flatten().enumerate() {
            let at = at.field("from").index(i).field("source");
            let Some(s) = &from.source else {
                r.error(&at, "`from.source` must not be nil");
                continue;
            };
            from_exists = true;
            if (s.principals.len() + s.not_principals.len() + s.namespaces.len() + s.not_namespaces.len() > 0)
                && (s.service_accounts.len() + s.not_service_accounts.len() > 0)
            {
                r.error(&at.field("serviceAccounts"), "cannot set serviceAccounts with namespaces or principals");
            }
            let lists: [(&str, &Vec<String>); 12] = [
                ("principals", &s.principals),
                ("notPrincipals", &s.not_principals),
                ("requestPrincipals", &s.request_principals),
                ("notRequestPrincipals", &s.not_request_principals),
                ("namespaces", &s.namespaces),
                ("notNamespaces", &s.not_namespaces),
                ("serviceAccounts", &s.service_accounts),
                ("notServiceAccounts", &s.not_service_accounts),
                ("ipBlocks", &s.ip_blocks),
                ("notIpBlocks", &s.not_ip_blocks),
                ("remoteIpBlocks", &s.remote_ip_blocks),
                ("notRemoteIpBlocks", &s.not_remote_ip_blocks),
            ];
            if lists.iter().all(|(_, l)| l.is_empty()) {
                r.error(&at, "`from.source` must not be empty");
            }
            for (name, list) in lists {
                let f = at.field(name);
                match name {
                    "ipBlocks" | "notIpBlocks" | "remoteIpBlocks" | "notRemoteIpBlocks" => check_values(r, &f, list, check_ip_block),
                    "serviceAccounts" | "notServiceAccounts" => check_values(r, &f, list, check_service_account),
                    _ => check_values(r, &f, list, check_wildcard),
                }
            }
            if action == Action::Custom {
                // CUSTOM runs before authentication (Istio's validation).
                for (name, list) in &lists {
                    if matches!(
                        *name,
                        "principals"
                            | "notPrincipals"
                            | "requestPrincipals"
                            | "notRequestPrincipals"
                            | "namespaces"
                            | "notNamespaces"
                            | "serviceAccounts"
                            | "notServiceAccounts"
                    ) && !list.is_empty()
                    {
                        r.error(&at.field(name), format!("{name} is not supported with action CUSTOM (it is evaluated before authentication)"));
                    }
                }
            }
            tcp_in_from |= [&s.principals, &s.not_principals, &s.namespaces, &s.not_namespaces, &s.ip_blocks, &s.not_ip_blocks]
                .iter()
                .chain([&s.remote_ip_blocks, &s.not_remote_ip_blocks, &s.service_accounts, &s.not_service_accounts].iter())
                .any(|l| !l.is_empty());
        }
        if self.to.as_ref().is_some_and(|t| t.is_empty()) {
            r.error(&at.field("to"), "`to` must not be empty");
        }
        for (i, to) in self.to.iter().flatten().enumerate() {
            let at = at.field("to").index(i).field("operation");
            let Some(op) = &to.operation else {
                r.error(&at, "`to.operation` must not be nil");
                continue;
            };
            to_exists = true;
            let lists: [(&str, &Vec<String>); 8] = [
                ("hosts", &op.hosts),
                ("notHosts", &op.not_hosts),
                ("ports", &op.ports),
                ("notPorts", &op.not_ports),
                ("methods", &op.methods),
                ("notMethods", &op.not_methods),
                ("paths", &op.paths),
                ("notPaths", &op.not_paths),
            ];
            if lists.iter().all(|(_, l)| l.is_empty()) {
                r.error(&at, "`to.operation` must not be empty");
            }
            for (name, list) in lists {
                let f = at.field(name);
                match name {
                    "ports" | "notPorts" => check_values(r, &f, list, check_port_value),
                    "paths" | "notPaths" => check_values(r, &f, list, |p| if contains_path_template(p) { check_path_template(p) } else { check_wildcard(p) }),
                    _ => check_values(r, &f, list, check_wildcard),
                }
            }
            tcp_in_to |= !op.ports.is_empty() || !op.not_ports.is_empty();
        }
        for (i, c) in self.when.iter().enumerate() {
            let at = at.field("when").index(i);
            if c.key.is_empty() {
                r.error(&at.field("key"), "`key` must not be empty");
                continue;
            }
            if c.values.is_empty() && c.not_values.is_empty() {
                r.error(&at, format!("at least one of `values` or `notValues` must be set for key {}", c.key));
                continue;
            }
            // security.ValidateAttribute
            let attr = match Attribute::parse(&c.key) {
                Ok(a) => a,
                Err(e) => {
                    r.error(&at.field("key"), e);
                    continue;
                }
            };
            if action == Action::Custom
                && (c.key.starts_with("request.auth.")
                    || matches!(c.key.as_str(), "source.namespace" | "source.principal" | "source.serviceAccount" | "source.trustDomain"))
            {
                r.error(&at.field("key"), format!("{} is not supported with action CUSTOM (it is evaluated before authentication)", c.key));
            }
            let check: fn(&str) -> Result<(), String> = match attr {
                Attribute::SourceIp | Attribute::RemoteIp | Attribute::DestinationIp => check_ip_block,
                Attribute::DestinationPort => check_port_value,
                Attribute::SourceServiceAccount => check_service_account,
                _ => check_wildcard,
            };
            check_values(r, &at.field("values"), &c.values, check);
            check_values(r, &at.field("notValues"), &c.not_values, check);
        }
        if action == Action::Deny && ((from_exists && !to_exists && !tcp_in_from) || (to_exists && !tcp_in_to)) {
            r.warn(
                at,
                "configured AuthorizationPolicy will deny all traffic to TCP ports under its scope due to the use of only HTTP attributes in a DENY rule; it is recommended to explicitly specify the port",
            );
        }
    }
}

/// A workload as the store knows it (a Sidecar's selector, a registry
/// Instance, a WorkloadEntry, a Gateway's selector): enough to tell whether
/// a policy can apply to anything.
#[derive(Debug, Clone, Default)]
pub struct Workload {
    pub namespace: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// Inbound ports, when known (a Sidecar's `ingress`), each with whether
    /// it is HTTP.
    pub ports: Vec<(u32, bool)>,
}

impl AuthorizationPolicy {
    /// Apply-time warnings about a valid policy that cannot do what it
    /// seems to: it selects no workload the store knows, or a rule can
    /// never match on the inbound ports of the workloads it selects.
    pub fn lint(&self, ns: &str, root_ns: &str, workloads: &[Workload]) -> Vec<String> {
        let labels = self.selector.as_ref().map(|s| &s.match_labels);
        let selected: Vec<&Workload> = workloads.iter().filter(|w| super::common::policy_applies(ns, labels, root_ns, &w.namespace, &w.labels)).collect();
        let mut out = Vec::new();
        if selected.is_empty() {
            let scope = if ns == root_ns { "in any namespace".to_string() } else { format!("in namespace {ns}") };
            let what = labels.map_or("no workload".to_string(), |l| {
                format!("no workload labelled {}", l.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
            });
            out.push(format!("spec.selector: selects nothing yet: {what} {scope} is known (Sidecar, Instance, WorkloadEntry or Gateway)"));
            return out;
        }
        let ports: Vec<(u32, bool)> = selected.iter().flat_map(|w| w.ports.iter().copied()).collect();
        if ports.is_empty() {
            return out;
        }
        for (i, rule) in self.rules.iter().flatten().enumerate() {
            let ops: Vec<&Operation> = rule.to.iter().flatten().filter_map(|t| t.operation.as_ref()).collect();
            let listed: Vec<u32> = ops.iter().flat_map(|o| o.ports.iter()).filter_map(|p| p.parse().ok()).collect();
            if !listed.is_empty() && !listed.iter().any(|p| ports.iter().any(|(q, _)| q == p)) {
                let have: Vec<String> = ports.iter().map(|(p, _)| p.to_string()).collect();
                out.push(format!("spec.rules[{i}]: can never match: the workloads it selects listen on port(s) {} only", have.join(", ")));
                continue;
            }
            let http_fields = ops.iter().any(|o| {
                !(o.hosts.is_empty()
                    && o.not_hosts.is_empty()
                    && o.methods.is_empty()
                    && o.not_methods.is_empty()
                    && o.paths.is_empty()
                    && o.not_paths.is_empty())
            }) || rule
                .from
                .iter()
                .flatten()
                .filter_map(|f| f.source.as_ref())
                .any(|s| !s.request_principals.is_empty() || !s.not_request_principals.is_empty())
                || rule.when.iter().any(|c| Attribute::parse(&c.key).is_ok_and(|a| a.http_only()));
            if self.action() == Action::Allow && http_fields && ports.iter().all(|(_, http)| !http) {
                out.push(format!("spec.rules[{i}]: can never match: it uses HTTP fields and the workloads it selects have TCP ports only"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use serde_json::json;

    fn errors(spec: serde_json::Value) -> Vec<FieldError> {
        validate("AuthorizationPolicy", &spec).err().unwrap_or_default()
    }

    fn has(errs: &[FieldError], field: &str, reason: &str) -> bool {
        errs.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn documented_examples_are_accepted() {
        for spec in [
            json!({}),
            json!({"action": "ALLOW", "rules": [{}]}),
            json!({"selector": {"matchLabels": {"app": "httpbin"}}, "action": "DENY", "rules": [{"from": [{"source": {"notNamespaces": ["foo"]}}]}]}),
            json!({"rules": [{"from": [{"source": {"principals": ["cluster.local/ns/default/sa/sleep"]}}, {"source": {"namespaces": ["test"]}}],
                "to": [{"operation": {"methods": ["GET"], "paths": ["/info*"]}}, {"operation": {"methods": ["POST"], "paths": ["/data"]}}],
                "when": [{"key": "request.auth.claims[iss]", "values": ["https://accounts.google.com"]}]}]}),
            json!({"rules": [{"from": [{"source": {"ipBlocks": ["1.2.3.4", "5.6.7.0/24"], "requestPrincipals": ["*"]}}],
                "to": [{"operation": {"ports": ["8080"], "notPaths": ["/healthz"], "paths": ["/api/{*}/x/{**}"]}}],
                "when": [{"key": "request.headers[x-token]", "notValues": ["bad"]}, {"key": "destination.port", "values": ["80"]},
                         {"key": "request.auth.claims[nested][groups]", "values": ["admin"]}, {"key": "connection.sni", "values": ["*.example.com"]}]}]}),
            json!({"action": "AUDIT", "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]}),
        ] {
            assert_eq!(errors(spec.clone()), vec![], "{spec}");
        }
    }

    #[test]
    fn istio_refusals_name_the_field() {
        let e = errors(json!({"action": "DENY"}));
        assert!(has(&e, "spec.rules", "DENY action without `rules`"), "{e:?}");
        let e = errors(json!({"rules": [{"from": [], "to": [{"operation": {}}]}]}));
        assert!(has(&e, "spec.rules[0].from", "must not be empty"), "{e:?}");
        assert!(has(&e, "spec.rules[0].to[0].operation", "`to.operation` must not be empty"), "{e:?}");
        let e = errors(json!({"rules": [{"from": [{"source": {}}, {}]}]}));
        assert!(has(&e, "spec.rules[0].from[0].source", "`from.source` must not be empty"), "{e:?}");
        assert!(has(&e, "spec.rules[0].from[1].source", "must not be nil"), "{e:?}");
        let e = errors(json!({"rules": [{"from": [{"source": {"ipBlocks": ["1.2.3.4/33", "x"], "principals": [""]}}],
            "to": [{"operation": {"ports": ["70000"], "paths": ["/a/{**}/b"]}}]}]}));
        assert!(has(&e, "spec.rules[0].from[0].source.ipBlocks[0]", "bad CIDR"), "{e:?}");
        assert!(has(&e, "spec.rules[0].from[0].source.ipBlocks[1]", "bad IP"), "{e:?}");
        assert!(has(&e, "spec.rules[0].from[0].source.principals[0]", "empty value"), "{e:?}");
        assert!(has(&e, "spec.rules[0].to[0].operation.ports[0]", "bad port"), "{e:?}");
        assert!(has(&e, "spec.rules[0].to[0].operation.paths[0]", "last path segment"), "{e:?}");
        let e = errors(json!({"rules": [{"when": [{"key": "request.headers", "values": ["a"]}, {"key": "source.ip", "values": ["nope"]},
            {"key": "foo.bar", "values": ["x"]}, {"key": "source.ip"}]}]}));
        assert!(has(&e, "spec.rules[0].when[0].key", "request.headers[NAME]"), "{e:?}");
        assert!(has(&e, "spec.rules[0].when[1].values[0]", "bad IP"), "{e:?}");
        assert!(has(&e, "spec.rules[0].when[2].key", "unknown attribute"), "{e:?}");
        assert!(has(&e, "spec.rules[0].when[3]", "at least one of `values` or `notValues`"), "{e:?}");
        let e = errors(json!({"action": "ALLOW", "provider": {"name": "x"}, "rules": [{}]}));
        assert!(has(&e, "spec.provider", "non CUSTOM"), "{e:?}");
        let e = errors(json!({"selector": {"matchLabels": {"app": "*"}}}));
        assert!(has(&e, "spec.selector.matchLabels.app", "wildcard"), "{e:?}");
        let e = errors(json!({"rules": [{"from": [{"source": {"serviceAccounts": ["a/b/c"], "namespaces": ["x"]}}]}]}));
        assert!(has(&e, "spec.rules[0].from[0].source.serviceAccounts", "cannot set serviceAccounts"), "{e:?}");
        assert!(has(&e, "spec.rules[0].from[0].source.serviceAccounts[0]", "NAMESPACE/NAME"), "{e:?}");
    }

    #[test]
    fn what_lodestar_cannot_enforce_is_refused_as_not_supported() {
        assert!(errors(json!({"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{}]})).is_empty());
        let e = errors(
            json!({"action": "CUSTOM", "provider": {"name": "opa"}, "rules": [{"from": [{"source": {"principals": ["a"]}}], "when": [{"key": "request.auth.claims[iss]", "values": ["x"]}]}]}),
        );
        assert!(has(&e, "spec.rules[0].from[0].source.principals", "not supported with action CUSTOM"), "{e:?}");
        assert!(has(&e, "spec.rules[0].when[0].key", "not supported with action CUSTOM"), "{e:?}");
        let e = errors(json!({"targetRefs": [{"kind": "Gateway", "group": "gateway.networking.k8s.io", "name": "gw"}]}));
        assert!(has(&e, "spec.targetRefs", "not supported"), "{e:?}");
        let e = errors(json!({"action": "ALLOW", "rules": [{"to": [{"operation": {"paths": ["/a*b"]}}]}]}));
        assert!(has(&e, "spec.rules[0].to[0].operation.paths[0]", "leading or a trailing"), "{e:?}");
    }

    #[test]
    fn lint_finds_policies_that_cannot_apply() {
        use super::{AuthorizationPolicy, Workload};
        let web = Workload { namespace: "shop".into(), labels: [("app".into(), "web".into())].into(), ports: vec![(8080, true)] };
        let db = Workload { namespace: "shop".into(), labels: [("app".into(), "db".into())].into(), ports: vec![(5432, false)] };
        let p = |v: serde_json::Value| -> AuthorizationPolicy { serde_json::from_value(v).unwrap() };
        let all = [web, db];
        let w = p(json!({"selector": {"matchLabels": {"app": "nope"}}})).lint("shop", "istio-system", &all);
        assert!(w[0].contains("selects nothing yet: no workload labelled app=nope in namespace shop"), "{w:?}");
        assert!(p(json!({"rules": [{}]})).lint("shop", "istio-system", &all).is_empty());
        let w =
            p(json!({"selector": {"matchLabels": {"app": "web"}}, "rules": [{"to": [{"operation": {"ports": ["9090"]}}]}]})).lint("shop", "istio-system", &all);
        assert!(w[0].contains("spec.rules[0]: can never match") && w[0].contains("8080"), "{w:?}");
        let w =
            p(json!({"selector": {"matchLabels": {"app": "db"}}, "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]})).lint("shop", "istio-system", &all);
        assert!(w[0].contains("TCP ports only"), "{w:?}");
        // Mesh-wide: any namespace.
        assert!(p(json!({"selector": {"matchLabels": {"app": "web"}}})).lint("istio-system", "istio-system", &all).is_empty());
    }

    #[test]
    fn a_deny_with_only_http_fields_warns_about_tcp_ports() {
        let v = validate("AuthorizationPolicy", &json!({"action": "DENY", "rules": [{"to": [{"operation": {"methods": ["GET"]}}]}]})).unwrap();
        assert!(v.warnings().iter().any(|w| w.contains("deny all traffic to TCP ports")), "{:?}", v.warnings());
    }
}
