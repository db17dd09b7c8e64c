//! `Sidecar`: narrows what a workload's proxy listens on and which services
//! it can reach.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::common::{Destination, Protocol, WorkloadSelector, SUPPORTED_PROTOCOLS};
use super::destination_rule::ConnectionPoolSettings;
use super::gateway::{Port, ServerTlsSettings};
use super::host::{self, HostScope};
use super::validate::{check_port, check_port_name, check_selector_labels, check_unix_address, Path, Report};
use super::workload_entry::UNIX_ADDRESS_PREFIX;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Sidecar {
    /// Workloads the Sidecar applies to; all of the namespace if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<IngressListener>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<EgressListener>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inbound_connection_pool: Option<ConnectionPoolSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IngressListener {
    pub port: Port,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<CaptureMode>,
    /// Where accepted traffic goes: `127.0.0.1:PORT`, `0.0.0.0:PORT`,
    /// `[::1]:PORT`, `[::]:PORT` or `unix:///path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection_pool: Option<ConnectionPoolSettings>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EgressListener {
    /// Absent for the catch-all listener, which must come last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<Port>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_mode: Option<CaptureMode>,
    /// `namespace/dnsName` of the services reachable through this listener.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CaptureMode {
    /// Whatever the workload's environment does (iptables in Kubernetes).
    Default,
    Iptables,
    /// No redirection: the application talks to the listener directly.
    None,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OutboundTrafficPolicy {
    /// `REGISTRY_ONLY` when unset (protobuf's default); when the whole
    /// policy is absent, the mesh-wide default applies instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<OutboundMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_proxy: Option<Destination>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundMode {
    RegistryOnly,
    AllowAny,
}

// ---------------------------------------------------------------------------
// Validation (after istio/istio ValidateSidecar).
// ---------------------------------------------------------------------------

impl Sidecar {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        if let Some(selector) = &self.workload_selector {
            check_selector_labels(r, &at.field("workloadSelector").field("labels"), &selector.labels);
        }
        if self.ingress.is_empty() && self.egress.is_empty() && self.outbound_traffic_policy.is_none() && self.inbound_connection_pool.is_none() {
            r.error(at, "sidecar: empty configuration provided");
            return;
        }

        let ingress_at = at.field("ingress");
        let mut ingress_ports = BTreeSet::new();
        for (i, listener) in self.ingress.iter().enumerate() {
            let listener_at = ingress_at.index(i);
            listener.check(&listener_at, r);
            if !ingress_ports.insert(listener.port.number()) {
                r.error(&listener_at.field("port").field("number"), "sidecar: ports on IP bound listeners must be unique");
            }
        }
        if let Some(pool) = &self.inbound_connection_pool {
            let pool_at = at.field("inboundConnectionPool");
            pool.check(&pool_at, r);
            r.ignored(&pool_at);
        }

        let egress_at = at.field("egress");
        let mut egress_ports = BTreeSet::new();
        let mut sockets = BTreeSet::new();
        for (i, listener) in self.egress.iter().enumerate() {
            let listener_at = egress_at.index(i);
            match &listener.port {
                // Only the last listener may omit its port: it catches
                // everything the others did not.
                None if i + 1 != self.egress.len() => {
                    r.error(&listener_at.field("port"), "sidecar: the egress listener with empty port should be the last listener in the list")
                }
                None => {}
                Some(port) => {
                    listener.check_port_and_bind(&listener_at, port, r);
                    let bind = listener.bind.as_deref().unwrap_or_default();
                    let unique = if port.number() == 0 { sockets.insert(bind) } else { egress_ports.insert(port.number()) };
                    if !unique {
                        r.error(&listener_at.field("port"), "sidecar: egress listener ports must be unique");
                    }
                }
            }
            listener.check_hosts(&listener_at.field("hosts"), r);
        }

        if let Some(policy) = &self.outbound_traffic_policy {
            policy.check(&at.field("outboundTrafficPolicy"), r);
        }
    }
}

impl IngressListener {
    /// Where the listener forwards: `defaultEndpoint`, or when it is unset
    /// the application on loopback at the listener's port. (Istio then
    /// forwards to the instance's own address, which iptables redirects to
    /// the application; without traffic capture the proxy itself holds that
    /// address and port, so the application is reached on 127.0.0.1.)
    pub fn default_endpoint(&self) -> String {
        match self.default_endpoint.as_deref().filter(|e| !e.is_empty()) {
            Some(endpoint) => endpoint.to_string(),
            None => format!("127.0.0.1:{}", self.port.number()),
        }
    }

    fn check(&self, at: &Path, r: &mut Report) {
        let port_at = at.field("port");
        check_listener_port(r, &port_at, &self.port);
        check_port(r, &port_at.field("number"), self.port.number());
        if let Some(bind) = self.bind.as_deref().filter(|b| !host::is_ip_address(b)) {
            r.error(&at.field("bind"), format!("{bind} is not a valid IP address"));
        }

        let endpoint_at = at.field("defaultEndpoint");
        // Istio's ValidateSidecar checks defaultEndpoint only when it is
        // set (it is optional since Istio 1.18); unset, the application is
        // reached on loopback at the listener's port (`default_endpoint()`).
        if let Some(endpoint) = self.default_endpoint.as_deref().filter(|e| !e.is_empty()) {
            match endpoint.strip_prefix(UNIX_ADDRESS_PREFIX) {
                Some(path) => r.check(&endpoint_at, check_unix_address(path)),
                None => r.check(&endpoint_at, check_default_endpoint(endpoint)),
            }
        }

        if let Some(tls) = &self.tls {
            let tls_at = at.field("tls");
            r.ignored(&tls_at);
            if !tls.subject_alt_names.is_empty() {
                r.error(&tls_at.field("subjectAltNames"), "sidecar: subjectAltNames is not supported in ingress tls");
            }
            if tls.https_redirect.is_some_and(|b| b) {
                r.error(&tls_at.field("httpsRedirect"), "sidecar: httpsRedirect is not supported");
            }
            if tls.credential_name.is_some() || !tls.credential_names.is_empty() {
                r.error(&tls_at, "sidecar: credentialName is not currently supported");
            }
            if !tls.tls_certificates.is_empty() {
                r.error(&tls_at.field("tlsCertificates"), "sidecar: tlsCertificates is not currently supported");
            }
            if let Some(mode) = tls.mode.filter(|m| matches!(m, super::gateway::ServerTlsMode::IstioMutual | super::gateway::ServerTlsMode::AutoPassthrough)) {
                r.error(&tls_at.field("mode"), format!("cannot set mode to {mode:?} in sidecar ingress tls"));
            }
            if !Protocol::parse(&self.port.protocol).is_some_and(Protocol::is_tls) {
                r.error(&tls_at, "server cannot have TLS settings for non HTTPS/TLS ports");
            }
            tls.check(&tls_at, r);
        }
        if let Some(pool) = &self.connection_pool {
            let pool_at = at.field("connectionPool");
            pool.check(&pool_at, r);
            r.ignored(&pool_at);
        }
    }
}

/// `127.0.0.1:PORT`, `0.0.0.0:PORT`, `[::1]:PORT` or `[::]:PORT`: the
/// application is reached on loopback or on the instance IP, never on an
/// arbitrary address (the proxy would become an open relay).
fn check_default_endpoint(endpoint: &str) -> Result<(), String> {
    let usage = "sidecar: defaultEndpoint must be of form 127.0.0.1:<port>, 0.0.0.0:<port>, [::1]:<port>, [::]:<port> or unix://<path>";
    let Some((address, port)) = endpoint.rsplit_once(':') else {
        return Err(usage.to_string());
    };
    if !matches!(address, "127.0.0.1" | "0.0.0.0" | "[::1]" | "[::]" | "") {
        return Err(usage.to_string());
    }
    match port.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(()),
        Ok(n) => Err(format!("sidecar: defaultEndpoint port {n} must be in the range 1..65535")),
        Err(_) => Err(format!("sidecar: defaultEndpoint port {port:?} is not a number")),
    }
}

/// Checks shared by ingress and egress listener ports.
fn check_listener_port(r: &mut Report, port_at: &Path, port: &Port) {
    if !port.name.is_empty() {
        r.check(&port_at.field("name"), check_port_name(&port.name));
    }
    if !port.protocol.is_empty() && Protocol::parse(&port.protocol).is_none() {
        r.error(&port_at.field("protocol"), format!("unsupported protocol {:?}; supported protocols are {SUPPORTED_PROTOCOLS}", port.protocol));
    }
    if port.target_port.is_some_and(|p| p > 0) {
        r.error(&port_at.field("targetPort"), "targetPort has no impact on Sidecars");
    }
}

impl EgressListener {
    fn check_port_and_bind(&self, at: &Path, port: &Port, r: &mut Report) {
        let port_at = at.field("port");
        check_listener_port(r, &port_at, port);
        let bind_at = at.field("bind");
        let bind = self.bind.as_deref().unwrap_or_default();
        if port.number() == 0 {
            // Port 0 means the listener is a Unix domain socket.
            match bind.strip_prefix(UNIX_ADDRESS_PREFIX) {
                Some(path) => r.check(&bind_at, check_unix_address(path)),
                None => r.error(&bind_at, "sidecar: ports with 0 value must have a unix domain socket bind address"),
            }
            if !matches!(self.capture_mode, None | Some(CaptureMode::Default) | Some(CaptureMode::None)) {
                r.error(&at.field("captureMode"), "sidecar: captureMode must be DEFAULT/NONE for unix domain socket listeners");
            }
        } else {
            check_port(r, &port_at.field("number"), port.number());
            if !bind.is_empty() && !host::is_ip_address(bind) {
                r.error(&bind_at, format!("{bind} is not a valid IP address"));
            }
        }
    }

    fn check_hosts(&self, at: &Path, r: &mut Report) {
        if self.hosts.is_empty() {
            r.error(at, "sidecar: egress listener must contain at least one host");
            return;
        }
        // Per namespace, the names already selected, to flag redundant
        // entries (`ns/a` twice, or `ns/a` next to `ns/*`).
        let mut selected: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (i, h) in self.hosts.iter().enumerate() {
            let host_at = at.index(i);
            for e in host::check_namespace_slash_host(h, HostScope::Sidecar) {
                r.error(&host_at, e);
            }
            let Some((namespace, name)) = h.split_once('/') else {
                continue;
            };
            if namespace.starts_with('~') {
                continue;
            }
            let names = selected.entry(namespace).or_default();
            let redundant = if name == "*" { !names.is_empty() } else { names.contains(name) || names.contains("*") };
            if redundant {
                r.warn(&host_at, format!("duplicated egress host {h:?}"));
            }
            names.insert(name);
        }
        if selected.get("*").is_some_and(|names| names.contains("*")) && selected.len() > 1 {
            r.warn(at, "`*/*` selects all services; the other hosts are redundant");
        }
    }
}

impl OutboundTrafficPolicy {
    fn check(&self, at: &Path, r: &mut Report) {
        let Some(proxy) = &self.egress_proxy else {
            return;
        };
        let proxy_at = at.field("egressProxy");
        if self.mode != Some(OutboundMode::AllowAny) {
            r.error(&proxy_at, "sidecar: egressProxy must be set only with ALLOW_ANY outboundTrafficPolicy mode");
            return;
        }
        r.check(&proxy_at.field("host"), host::check_fqdn(&proxy.host));
        if proxy.port.is_none() {
            r.error(&proxy_at.field("port"), "sidecar: egressProxy port is required");
        }
        proxy.check(&proxy_at, r);
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use super::*;
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("Sidecar", &spec).expect_err("spec should be invalid")
    }

    fn has(errors: &[FieldError], field: &str, reason: &str) -> bool {
        errors.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn capture_mode_none_round_trips() {
        let spec = json!({
            "workloadSelector": {"labels": {"app": "productpage"}},
            "ingress": [{"port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                         "defaultEndpoint": "127.0.0.1:8080", "captureMode": "NONE"}],
            "egress": [{"port": {"number": 3306, "protocol": "MYSQL", "name": "mysql"},
                        "bind": "127.0.0.1", "captureMode": "NONE", "hosts": ["*/mysql.foo.com"]},
                       {"hosts": ["./*", "istio-system/*"]}],
            "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}
        });
        let validated = validate("Sidecar", &spec).unwrap();
        assert!(validated.warnings().is_empty(), "{:?}", validated.warnings());
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn empty_sidecar() {
        let e = errors(json!({"workloadSelector": {"labels": {"app": "x"}}}));
        assert!(has(&e, "spec", "empty configuration"));
    }

    #[test]
    fn egress_hosts_need_namespace() {
        let e = errors(json!({"egress": [{"hosts": ["foo.example.com", "prod/reviews"]}]}));
        assert!(has(&e, "spec.egress[0].hosts[0]", "namespace/dnsName"), "{e:?}");
        assert!(has(&e, "spec.egress[0].hosts[1]", "short name"), "{e:?}");
    }

    #[test]
    fn catch_all_egress_must_be_last() {
        let e = errors(json!({"egress": [{"hosts": ["./*"]}, {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["./*"]}]}));
        assert!(has(&e, "spec.egress[0].port", "should be the last"), "{e:?}");
    }

    #[test]
    fn ingress_needs_default_endpoint_of_loopback_form() {
        let e = errors(json!({"ingress": [
            {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}},
            {"port": {"number": 9081, "protocol": "HTTP", "name": "http2"}, "defaultEndpoint": "10.0.0.1:8080"},
            {"port": {"number": 9082, "protocol": "HTTP", "name": "http3"}, "defaultEndpoint": "127.0.0.1:http"}
        ]}));
        assert!(!e.iter().any(|e| e.field == "spec.ingress[0].defaultEndpoint"), "unset is allowed: {e:?}");
        assert!(has(&e, "spec.ingress[1].defaultEndpoint", "must be of form"), "{e:?}");
        assert!(has(&e, "spec.ingress[2].defaultEndpoint", "not a number"), "{e:?}");
        assert!(check_default_endpoint("[::1]:8080").is_ok());
        assert!(check_default_endpoint("0.0.0.0:8080").is_ok());
    }

    #[test]
    fn unix_socket_egress() {
        let ok = json!({"egress": [{"port": {"number": 0, "name": "uds", "protocol": "HTTP"}, "bind": "unix:///var/run/egress.sock",
            "captureMode": "NONE", "hosts": ["*/*"]}]});
        assert!(validate("Sidecar", &ok).is_ok());
        let e = errors(json!({"egress": [{"port": {"number": 0, "name": "uds", "protocol": "HTTP"}, "bind": "127.0.0.1",
            "captureMode": "IPTABLES", "hosts": ["*/*"]}]}));
        assert!(has(&e, "spec.egress[0].bind", "unix domain socket"), "{e:?}");
        assert!(has(&e, "spec.egress[0].captureMode", "DEFAULT/NONE"), "{e:?}");
    }

    #[test]
    fn egress_proxy_needs_allow_any() {
        let e =
            errors(json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY", "egressProxy": {"host": "proxy.corp.example.com", "port": {"number": 3128}}}}));
        assert!(has(&e, "spec.outboundTrafficPolicy.egressProxy", "ALLOW_ANY"), "{e:?}");
        let ok = json!({"outboundTrafficPolicy": {"mode": "ALLOW_ANY", "egressProxy": {"host": "proxy.corp.example.com", "port": {"number": 3128}}}});
        assert!(validate("Sidecar", &ok).is_ok());
    }

    #[test]
    fn duplicate_egress_hosts_warn() {
        let spec = json!({"egress": [{"hosts": ["prod/*", "prod/a.example.com"]}]});
        let validated = validate("Sidecar", &spec).unwrap();
        assert_eq!(validated.warnings().len(), 1, "{:?}", validated.warnings());
    }
}
