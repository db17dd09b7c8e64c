//! `WorkloadGroup`: the template of workloads that register themselves
//! (Istio's VM auto-registration). Lodestar's `lodestar agent
//! --workload-group NS/NAME` reads it and registers its host as a registry
//! Instance built from the template (see `lodestar agent`, `agent::register`).
//!
//! Validation mirrors Istio's `ValidateWorkloadGroup` and
//! `validateReadinessProbe` (`pkg/config/validation`): a template is
//! required, `metadata.labels` must be valid labels, the probe's numbers
//! non-negative, its port in range, its scheme http or https, its headers
//! valid names, `exec.command` non-empty. On top of that, what Lodestar
//! does not enforce is refused by name rather than accepted and ignored:
//! the probe runs on the replicas as the Instance's health check, which
//! knows HTTP GET (plain http, no headers) and TCP connects, so `exec`,
//! `grpc`, `httpGet.scheme: HTTPS` and `httpGet.httpHeaders` are "not
//! supported" (`initialDelaySeconds` delays the first probe, as the
//! check's `initialDelay`); the template's `address` is
//! filled in by each agent (`--address`), and `network` has no meaning for
//! a registry Instance.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::common::Labels;
use super::validate::{check_labels, check_port, check_port_name, Path, Report};
use super::workload_entry::WorkloadEntry;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadGroup {
    /// Labels and annotations every registered workload gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<GroupMetadata>,
    /// The workload, less its address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<WorkloadEntry>,
    /// How a registered workload's readiness is checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ReadinessProbe>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupMetadata {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Istio's `ReadinessProbe` (numbers as i64 so that a negative one is
/// reported by name, as Istio does, instead of failing to parse).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReadinessProbe {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success_threshold: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_get: Option<HttpProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_socket: Option<TcpProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecProbe>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grpc: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpProbe {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    pub port: u32,
    /// Default: the workload's address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub scheme: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_headers: Vec<ProbeHeader>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProbeHeader {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TcpProbe {
    /// Default: the workload's address.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub host: String,
    pub port: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExecProbe {
    #[serde(default)]
    pub command: Vec<String>,
}

/// The health check a probe becomes, in the registry's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeCheck {
    /// `http://HOST:PORT/PATH`, or None for a TCP check.
    pub http: Option<String>,
    /// `HOST:PORT` for a TCP check.
    pub tcp: Option<String>,
    pub interval_s: Option<u32>,
    pub initial_delay_s: Option<u32>,
    pub timeout_s: Option<u32>,
    pub healthy_threshold: Option<u32>,
    pub unhealthy_threshold: Option<u32>,
}

impl WorkloadGroup {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        // Istio: "template is required".
        match &self.template {
            None => r.error(&at.field("template"), "template is required"),
            Some(t) => check_template(t, &at.field("template"), r),
        }
        // Istio: metadata labels must be valid labels. Annotations are free
        // text (Kubernetes annotations); they are copied onto each instance.
        if let Some(m) = &self.metadata {
            check_labels(r, &at.field("metadata").field("labels"), &m.labels);
            for key in m.annotations.keys() {
                if key.is_empty() {
                    r.error(&at.field("metadata").field("annotations"), "empty annotation key");
                }
            }
        }
        if let Some(p) = &self.probe {
            p.check(&at.field("probe"), r);
        }
    }

    /// The group's labels over the template's (Istio's auto-registration:
    /// node labels > group metadata labels > template labels; the node's
    /// are added by the caller).
    pub fn labels(&self) -> Labels {
        let mut out = self.template.as_ref().map(|t| t.labels.clone()).unwrap_or_default();
        if let Some(m) = &self.metadata {
            out.extend(m.labels.clone());
        }
        out
    }
}

/// The template is a WorkloadEntry without its address (Istio skips
/// `validateWorkloadEntry` for it because the address is filled in at
/// registration; its ports and labels are checked here as a WorkloadEntry's).
fn check_template(t: &WorkloadEntry, at: &Path, r: &mut Report) {
    if !t.address.is_empty() {
        r.error(&at.field("address"), "must be empty: each registering workload gives its own address (lodestar agent --address)");
    }
    if t.network.is_some() {
        r.unsupported_one(&at.field("network"), "network", "registered workloads are reached at their address");
    }
    for (name, number) in &t.ports {
        let port_at = at.field("ports").key(name);
        r.check(&port_at, check_port_name(name));
        check_port(r, &port_at, *number);
    }
    check_labels(r, &at.field("labels"), &t.labels);
    if let Some(locality) = &t.locality {
        if locality.split('/').count() > 3 || locality.split('/').any(str::is_empty) {
            r.error(&at.field("locality"), format!("locality {locality:?} must be region[/zone[/subzone]]"));
        }
    }
    if let Some(sa) = &t.service_account {
        if sa.is_empty() || sa.len() > 253 || !sa.split('.').all(super::host::is_dns1123_label) {
            r.error(&at.field("serviceAccount"), format!("{sa:?} is not a valid service account name"));
        }
    }
}

impl ReadinessProbe {
    fn check(&self, at: &Path, r: &mut Report) {
        // Istio's validateReadinessProbe: every number non-negative.
        for (name, v) in [
            ("periodSeconds", self.period_seconds),
            ("initialDelaySeconds", self.initial_delay_seconds),
            ("timeoutSeconds", self.timeout_seconds),
            ("successThreshold", self.success_threshold),
            ("failureThreshold", self.failure_threshold),
        ] {
            if let Some(v) = v {
                if v < 0 {
                    r.error(&at.field(name), format!("{name} must be non-negative"));
                } else if v > i64::from(u32::MAX) {
                    r.error(&at.field(name), format!("{v} is too large"));
                }
            }
        }
        let methods = [self.http_get.is_some(), self.tcp_socket.is_some(), self.exec.is_some(), self.grpc.is_some()].iter().filter(|m| **m).count();
        if methods == 0 {
            // Istio: an unknown (here: absent) health check method.
            r.error(at, "one of httpGet, tcpSocket, exec is required");
        } else if methods > 1 {
            r.error(at, "only one of httpGet, tcpSocket, exec, grpc may be set");
        }
        if let Some(h) = &self.http_get {
            let at = at.field("httpGet");
            check_port(r, &at.field("port"), h.port);
            // Istio: the scheme is "HTTP" or "HTTPS" (Kubernetes' URIScheme).
            match h.scheme.as_str() {
                "" | "HTTP" => {}
                "HTTPS" => r.unsupported_one(&at.field("scheme"), "scheme HTTPS", "the replicas probe plain http:// only; use a tcpSocket probe"),
                other => r.error(&at.field("scheme"), format!("httpGet.scheme must be one of \"HTTPS\", \"HTTP\", not {other:?}")),
            }
            for (i, hd) in h.http_headers.iter().enumerate() {
                // Istio's ValidateProbeHeaderName: a valid HTTP header name.
                if hd.name.is_empty() || !hd.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)) {
                    r.error(&at.field("httpHeaders").index(i).field("name"), format!("invalid header name {:?}", hd.name));
                }
            }
            if !h.http_headers.is_empty() {
                r.unsupported_one(&at.field("httpHeaders"), "httpHeaders", "the replicas' HTTP checks send no custom headers");
            }
            if !h.path.is_empty() && !h.path.starts_with('/') {
                r.error(&at.field("path"), format!("path {:?} must start with /", h.path));
            }
        }
        if let Some(t) = &self.tcp_socket {
            check_port(r, &at.field("tcpSocket").field("port"), t.port);
        }
        if let Some(e) = &self.exec {
            if e.command.is_empty() {
                r.error(&at.field("exec").field("command"), "exec.command is required");
            }
            r.unsupported_one(&at.field("exec"), "exec", "probes run on the replicas (httpGet or tcpSocket), not on the workload's host");
        }
        if self.grpc.is_some() {
            r.unsupported_one(&at.field("grpc"), "grpc", "use httpGet or tcpSocket");
        }
    }

    /// The registry health check this probe becomes for a workload at
    /// `address`. Errors (field path, reason) for what the checker cannot
    /// do; validation refuses those already, this is for stored groups
    /// written before that.
    pub fn to_check(&self, address: &str) -> Result<ProbeCheck, String> {
        let host = |h: &str| {
            let h = if h.is_empty() { address } else { h };
            if h.contains(':') {
                format!("[{h}]")
            } else {
                h.to_string()
            }
        };
        let secs = |v: Option<i64>| v.filter(|v| *v > 0).map(|v| v.min(i64::from(u32::MAX)) as u32);
        let mut out = ProbeCheck {
            http: None,
            tcp: None,
            interval_s: secs(self.period_seconds),
            initial_delay_s: secs(self.initial_delay_seconds),
            timeout_s: secs(self.timeout_seconds),
            healthy_threshold: secs(self.success_threshold),
            unhealthy_threshold: secs(self.failure_threshold),
        };
        if self.exec.is_some() {
            return Err("spec.probe.exec: not supported: probes run on the replicas (httpGet or tcpSocket)".into());
        }
        if self.grpc.is_some() {
            return Err("spec.probe.grpc: not supported: use httpGet or tcpSocket".into());
        }
        if let Some(h) = &self.http_get {
            if !matches!(h.scheme.as_str(), "" | "HTTP") {
                return Err(format!("spec.probe.httpGet.scheme: {:?} is not supported (plain HTTP only)", h.scheme));
            }
            if !h.http_headers.is_empty() {
                return Err("spec.probe.httpGet.httpHeaders: not supported".into());
            }
            let path = if h.path.is_empty() { "/" } else { h.path.as_str() };
            out.http = Some(format!("http://{}:{}{path}", host(&h.host), h.port));
        } else if let Some(t) = &self.tcp_socket {
            out.tcp = Some(format!("{}:{}", host(&t.host), t.port));
        } else {
            return Err("spec.probe: no httpGet or tcpSocket".into());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError, Validated};
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("WorkloadGroup", &spec).expect_err("spec should be invalid")
    }

    fn has(e: &[FieldError], field: &str, reason: &str) -> bool {
        e.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn a_group_round_trips_and_its_probe_becomes_a_check() {
        let spec = json!({
            "metadata": {"labels": {"app": "web"}, "annotations": {"team": "shop"}},
            "template": {"ports": {"http": 8080}, "labels": {"version": "v1"}, "serviceAccount": "web", "weight": 3, "locality": "eu/west"},
            "probe": {"periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3, "httpGet": {"path": "/ready", "port": 8080}}
        });
        let v = validate("WorkloadGroup", &spec).unwrap();
        assert_eq!(v.to_json().unwrap(), spec);
        let Validated::WorkloadGroup { spec: g, .. } = v else { panic!() };
        assert_eq!(g.labels().into_iter().collect::<Vec<_>>(), [("app".to_string(), "web".to_string()), ("version".into(), "v1".into())]);
        let c = g.probe.as_ref().unwrap().to_check("10.0.0.5").unwrap();
        assert_eq!(c.http.as_deref(), Some("http://10.0.0.5:8080/ready"));
        assert_eq!((c.interval_s, c.timeout_s, c.unhealthy_threshold, c.healthy_threshold), (Some(2), Some(1), Some(3), None));
        let tcp: super::ReadinessProbe = serde_json::from_value(json!({"tcpSocket": {"port": 15000}})).unwrap();
        assert_eq!(tcp.to_check("fd00::1").unwrap().tcp.as_deref(), Some("[fd00::1]:15000"));
    }

    #[test]
    fn bad_groups_name_the_field() {
        assert!(has(&errors(json!({})), "spec.template", "template is required"));
        let e = errors(json!({
            "metadata": {"labels": {"bad key!": "x"}},
            "template": {"address": "10.0.0.1", "network": "n1", "ports": {"http": 0}},
            "probe": {"periodSeconds": -1, "failureThreshold": -2, "httpGet": {"port": 70000, "scheme": "FTP"}}
        }));
        for (field, reason) in [
            ("spec.metadata.labels[\"bad key!\"]", "invalid label key"),
            ("spec.template.address", "must be empty"),
            ("spec.template.network", "not supported"),
            ("spec.template.ports.http", "1..65535"),
            ("spec.probe.periodSeconds", "non-negative"),
            ("spec.probe.failureThreshold", "non-negative"),
            ("spec.probe.httpGet.port", "1..65535"),
            ("spec.probe.httpGet.scheme", "must be one of"),
        ] {
            assert!(has(&e, field, reason), "{field}: {e:?}");
        }
        // Valid in Istio, not enforced here: refused as not supported.
        for (probe, field) in [
            (json!({"exec": {"command": ["true"]}}), "spec.probe.exec"),
            (json!({"grpc": {"port": 9000}}), "spec.probe.grpc"),
            (json!({"httpGet": {"port": 80, "scheme": "HTTPS"}}), "spec.probe.httpGet.scheme"),
            (json!({"httpGet": {"port": 80, "httpHeaders": [{"name": "x-a", "value": "b"}]}}), "spec.probe.httpGet.httpHeaders"),
        ] {
            let e = errors(json!({"template": {}, "probe": probe}));
            assert!(has(&e, field, "not supported"), "{field}: {e:?}");
        }
        assert!(has(&errors(json!({"template": {}, "probe": {"exec": {}}})), "spec.probe.exec.command", "required"));
        assert!(has(&errors(json!({"template": {}, "probe": {"periodSeconds": 1}})), "spec.probe", "one of httpGet"));
        assert!(has(
            &errors(json!({"template": {}, "probe": {"httpGet": {"port": 1, "httpHeaders": [{"name": "bad header"}]}}})),
            "spec.probe.httpGet.httpHeaders[0].name",
            "invalid header name"
        ));
        // initialDelaySeconds is honoured: it delays the first probe.
        assert!(validate("WorkloadGroup", &json!({"template": {}, "probe": {"initialDelaySeconds": 5, "tcpSocket": {"port": 80}}})).is_ok());
        let e = errors(json!({"template": {}, "extra": 1}));
        assert!(e.iter().any(|e| e.field.starts_with("spec") && e.reason.contains("unknown field")), "{e:?}");
    }
}
