//! `ServiceEntry`: adds a service (typically one outside the mesh) to the
//! service registry.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::common::{Protocol, WorkloadSelector, SUPPORTED_PROTOCOLS};
use super::host;
use super::validate::{check_export_to, check_port, check_port_name, check_selector_labels, Path, Report};
use super::workload_entry::{AddressRule, WorkloadEntry};

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceEntry {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    /// Virtual IPs (or CIDRs) of the service, for TCP traffic that carries
    /// no host name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<ServicePort>,
    /// Defaults to `MESH_EXTERNAL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<Location>,
    /// Defaults to `NONE`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<WorkloadEntry>,
    /// Selects WorkloadEntries (and pods) as endpoints instead of `endpoints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload_selector: Option<WorkloadSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub export_to: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
}

impl ServiceEntry {
    /// The effective resolution (protobuf's default is `NONE`).
    pub fn resolution(&self) -> Resolution {
        self.resolution.unwrap_or(Resolution::None)
    }

    /// The effective location (protobuf's default is `MESH_EXTERNAL`).
    pub fn location(&self) -> Location {
        self.location.unwrap_or(Location::MeshExternal)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServicePort {
    #[serde(default, skip_serializing_if = "super::common::is_zero")]
    pub number: u32,
    /// Empty means "sniff the protocol".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Port on the endpoints, when it differs from `number`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

impl ServicePort {
    /// The declared protocol; `None` when it is absent or empty (Istio
    /// sniffs those; the service model takes them from the port name).
    pub fn protocol(&self) -> Option<Protocol> {
        self.protocol.as_deref().filter(|p| !p.is_empty()).and_then(Protocol::parse)
    }

    /// The protocol as written, `None` when absent or empty.
    pub fn protocol_name(&self) -> Option<&str> {
        self.protocol.as_deref().filter(|p| !p.is_empty())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Location {
    MeshExternal,
    MeshInternal,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Resolution {
    /// Forward to whatever address the caller connected to.
    None,
    /// Use the `endpoints` addresses.
    Static,
    /// Resolve endpoints (or hosts) by DNS, connecting to all addresses.
    Dns,
    /// Resolve by DNS, using only the first address.
    DnsRoundRobin,
    /// Parsed so Istio configs load, but rejected by validation.
    DynamicDns,
}

impl ServiceEntry {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let resolution = self.resolution();
        let resolution_at = at.field("resolution");
        let hosts_at = at.field("hosts");
        if self.hosts.is_empty() {
            r.error(&hosts_at, "service entry must have at least one host");
        }
        for (i, h) in self.hosts.iter().enumerate() {
            let host_at = hosts_at.index(i);
            if h == "*" {
                r.error(&host_at, "the wildcard host * is not allowed in a service entry");
            } else if let Err(e) = host::check_wildcard_domain(h) {
                r.error(&host_at, e);
            } else if let Err(e) = host::check_no_partial_wildcard(h) {
                r.warn(&host_at, e);
            }
        }

        let addresses_at = at.field("addresses");
        let mut has_cidr = false;
        for (i, address) in self.addresses.iter().enumerate() {
            has_cidr |= address.contains('/');
            r.check(&addresses_at.index(i), host::check_ip_subnet(address));
        }
        if has_cidr && !matches!(resolution, Resolution::None | Resolution::Static) {
            r.error(&addresses_at, "CIDR addresses are allowed only for NONE/STATIC resolution types");
        }

        let ports_at = at.field("ports");
        // Istio's ValidateServiceEntry has no "at least one port" check: an
        // entry without ports names hosts (for a Sidecar's egress, say) but
        // gets no listener or cluster of its own.
        if self.ports.is_empty() {
            r.warn(&ports_at, "no ports: the hosts get no listener or cluster until a port is declared");
        }
        let mut names = BTreeSet::new();
        let mut numbers = BTreeSet::new();
        for (i, port) in self.ports.iter().enumerate() {
            let port_at = ports_at.index(i);
            let name_at = port_at.field("name");
            if port.name.is_empty() {
                r.error(&name_at, "port name is required");
            } else {
                r.check(&name_at, check_port_name(&port.name));
                if !names.insert(port.name.as_str()) {
                    r.error(&name_at, format!("port name {:?} already defined", port.name));
                }
            }
            let number_at = port_at.field("number");
            check_port(r, &number_at, port.number);
            if !numbers.insert(port.number) {
                r.error(&number_at, format!("port {} already defined", port.number));
            }
            if let Some(target) = port.target_port {
                check_port(r, &port_at.field("targetPort"), target);
            }
            // Istio's ValidateProtocol: an empty protocol means "sniff it"
            // and is valid (served here from the port name, else as TCP).
            if let Some(protocol) = port.protocol.as_deref().filter(|p| !p.is_empty() && Protocol::parse(p).is_none()) {
                r.error(&port_at.field("protocol"), format!("unsupported protocol {protocol:?}; supported protocols are {SUPPORTED_PROTOCOLS}"));
            }
        }

        if let Some(selector) = &self.workload_selector {
            let selector_at = at.field("workloadSelector");
            check_selector_labels(r, &selector_at.field("labels"), &selector.labels);
            if !self.endpoints.is_empty() {
                r.error(&selector_at, "only one of workloadSelector or endpoints is allowed in a service entry");
            }
        }

        let endpoints_at = at.field("endpoints");
        match resolution {
            Resolution::None => {
                // Lodestar's own: Istio serves NONE as an original-destination
                // passthrough, which needs traffic capture (iptables) to know
                // where a connection was going. Captured proxies get it; a
                // proxy that binds real addresses has nothing to pass
                // through to: say so at apply instead of accepting silently.
                r.warn(
                    &at.field("resolution"),
                    "resolution NONE (passthrough) is served only to proxies that capture traffic (lodestar agent --capture): a proxy without capture does not know a connection's original destination, so it gets no listener or cluster for these hosts; for those, use STATIC with endpoints, or DNS",
                );
                if !self.endpoints.is_empty() {
                    r.error(&endpoints_at, "no endpoints should be provided for resolution type NONE");
                }
                if self.workload_selector.is_some() {
                    r.warn(&at.field("workloadSelector"), "workloadSelector should not be set when resolution is NONE");
                }
            }
            Resolution::Static => {
                // With nothing to forward to, a STATIC entry black-holes its hosts.
                if self.endpoints.is_empty() && self.workload_selector.is_none() {
                    r.error(&endpoints_at, "resolution STATIC needs endpoints (or a workloadSelector)");
                }
                for (i, endpoint) in self.endpoints.iter().enumerate() {
                    endpoint.check_as(&endpoints_at.index(i), r, AddressRule::IpOnly, Some(&names));
                }
            }
            Resolution::Dns | Resolution::DnsRoundRobin => {
                if self.endpoints.is_empty() {
                    // The hosts themselves are resolved, so they must be real names.
                    for (i, h) in self.hosts.iter().enumerate() {
                        if let Err(e) = host::check_fqdn(h) {
                            r.error(
                                &hosts_at.index(i),
                                format!("hosts must be resolvable DNS names (no wildcards) when resolution is DNS and no endpoints are given: {e}"),
                            );
                        }
                    }
                }
                if resolution == Resolution::DnsRoundRobin && self.endpoints.len() > 1 {
                    r.error(&endpoints_at, "there must only be 0 or 1 endpoint for resolution DNS_ROUND_ROBIN");
                }
                for (i, endpoint) in self.endpoints.iter().enumerate() {
                    endpoint.check_as(&endpoints_at.index(i), r, AddressRule::IpOrHostname, Some(&names));
                }
            }
            Resolution::DynamicDns => r.unsupported(&resolution_at, "DYNAMIC_DNS resolution"),
        }

        // With plain TCP the proxy cannot tell hosts apart (no Host header,
        // no SNI), so several hosts on one TCP port are ambiguous unless the
        // original destination address is used as is (NONE).
        if resolution != Resolution::None && self.hosts.len() > 1 {
            let opaque = self.ports.iter().any(|p| p.protocol().is_none_or(|proto| !proto.is_http() && !proto.is_tls()));
            if opaque {
                r.error(&hosts_at, "multiple hosts provided with non-HTTP, non-TLS ports");
            }
        }

        check_export_to(r, &at.field("exportTo"), &self.export_to, true);
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("ServiceEntry", &spec).expect_err("spec should be invalid")
    }

    fn has(errors: &[FieldError], field: &str, reason: &str) -> bool {
        errors.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn external_api_round_trips() {
        let spec = json!({
            "hosts": ["api.example.com"],
            "ports": [{"number": 443, "name": "https", "protocol": "TLS"}],
            "location": "MESH_EXTERNAL",
            "resolution": "DNS"
        });
        let validated = validate("ServiceEntry", &spec).unwrap();
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn needs_hosts_but_not_ports() {
        let e = errors(json!({"resolution": "DNS"}));
        assert!(has(&e, "spec.hosts", "at least one host"));
        assert!(!e.iter().any(|e| e.field == "spec.ports"), "{e:?}");
        let ok = validate("ServiceEntry", &json!({"hosts": ["api.example.com"], "resolution": "DNS"})).unwrap();
        assert!(ok.warnings().iter().any(|w| w.contains("no ports")), "{:?}", ok.warnings());
    }

    #[test]
    fn empty_protocol_is_sniffed_not_refused() {
        let spec = json!({"hosts": ["api.example.com"], "ports": [{"number": 8080, "name": "http", "protocol": ""}, {"number": 9000, "name": "db"}]});
        assert!(validate("ServiceEntry", &spec).is_ok());
    }

    #[test]
    fn duplicate_ports() {
        let e = errors(json!({"hosts": ["a.example.com"], "ports": [
            {"number": 80, "name": "http", "protocol": "HTTP"},
            {"number": 80, "name": "http", "protocol": "SOAP"}
        ]}));
        assert!(has(&e, "spec.ports[1].name", "already defined"), "{e:?}");
        assert!(has(&e, "spec.ports[1].number", "already defined"), "{e:?}");
        assert!(has(&e, "spec.ports[1].protocol", "unsupported protocol"), "{e:?}");
    }

    #[test]
    fn static_needs_ip_endpoints() {
        let e = errors(json!({"hosts": ["db.internal"], "ports": [{"number": 5432, "name": "tcp-pg", "protocol": "TCP"}],
            "resolution": "STATIC"}));
        assert!(has(&e, "spec.endpoints", "needs endpoints"), "{e:?}");
        let e = errors(json!({"hosts": ["db.internal"], "ports": [{"number": 5432, "name": "tcp-pg", "protocol": "TCP"}],
            "resolution": "STATIC", "endpoints": [{"address": "db1.internal"}, {"address": "10.0.0.1", "ports": {"other": 5432}}]}));
        assert!(has(&e, "spec.endpoints[0].address", "not a valid IP"), "{e:?}");
        assert!(has(&e, "spec.endpoints[1].ports.other", "not defined by the service entry"), "{e:?}");
    }

    #[test]
    fn dns_endpoints_may_be_hostnames() {
        let spec = json!({"hosts": ["api.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DNS", "endpoints": [{"address": "us.api.example.com"}, {"address": "10.1.1.1"}]});
        assert!(validate("ServiceEntry", &spec).is_ok());
    }

    #[test]
    fn none_with_endpoints_and_wildcard_dns() {
        let e = errors(json!({"hosts": ["*.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "endpoints": [{"address": "10.0.0.1"}]}));
        assert!(has(&e, "spec.endpoints", "resolution type NONE"), "{e:?}");
        let e = errors(json!({"hosts": ["*.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "resolution": "DNS"}));
        assert!(has(&e, "spec.hosts[0]", "resolvable DNS names"), "{e:?}");
    }

    #[test]
    fn none_is_stored_with_a_warning_that_only_captured_proxies_get_it() {
        let spec = json!({"hosts": ["*.example.com"], "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]});
        let ok = validate("ServiceEntry", &spec).unwrap();
        assert!(
            ok.warnings().iter().any(|w| w.starts_with("spec.resolution: resolution NONE") && w.contains("served only to proxies that capture traffic")),
            "{:?}",
            ok.warnings()
        );
        let dns = json!({"hosts": ["api.example.com"], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}], "resolution": "DNS"});
        assert!(validate("ServiceEntry", &dns).unwrap().warnings().is_empty());
    }

    #[test]
    fn multiple_hosts_on_tcp() {
        let e = errors(json!({"hosts": ["a.example.com", "b.example.com"], "ports": [{"number": 9000, "name": "tcp", "protocol": "TCP"}],
            "resolution": "DNS"}));
        assert!(has(&e, "spec.hosts", "multiple hosts"), "{e:?}");
    }

    #[test]
    fn export_to_none_is_allowed() {
        let spec = json!({"hosts": ["a.example.com"], "ports": [{"number": 80, "name": "http"}], "exportTo": ["~"]});
        assert!(validate("ServiceEntry", &spec).is_ok());
    }
}
