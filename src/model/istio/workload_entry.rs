//! `WorkloadEntry`: a workload outside Kubernetes (a VM, a bare-metal host),
//! also used inline as the endpoints of a `ServiceEntry`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::common::Labels;
use super::host;
use super::validate::{check_labels, check_port, check_port_name, check_unix_address, Path, Report};

/// Prefix of an endpoint address that is a Unix domain socket.
pub const UNIX_ADDRESS_PREFIX: &str = "unix://";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadEntry {
    /// IP address, DNS name (for DNS-resolved ServiceEntries) or
    /// `unix:///path`; may be empty only when `network` says the workload
    /// is reached through that network's gateway.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    /// Service port name to the workload's port number, when they differ.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u32>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// `region/zone/subzone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub locality: Option<String>,
    /// Load-balancing weight relative to other endpoints of the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
}

/// What an endpoint address may be, which depends on where it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AddressRule {
    /// A standalone WorkloadEntry or a DNS-resolved ServiceEntry endpoint:
    /// an IP, a DNS name or a Unix socket.
    IpOrHostname,
    /// A STATIC ServiceEntry endpoint: the proxy connects to it as is, so
    /// an IP (or a Unix socket).
    IpOnly,
}

impl WorkloadEntry {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        self.check_as(at, r, AddressRule::IpOrHostname, None);
    }

    /// Validates the entry; `service_ports` (the port names of the owning
    /// ServiceEntry) restricts which `ports` keys are allowed.
    pub(super) fn check_as(&self, at: &Path, r: &mut Report, rule: AddressRule, service_ports: Option<&BTreeSet<&str>>) {
        let address_at = at.field("address");
        if self.address.is_empty() {
            if self.network.is_none() {
                r.error(&address_at, "address is required");
            } else {
                r.warn(&address_at, "address is unset: the workload is reached through its network's gateway");
            }
        } else if let Some(path) = self.address.strip_prefix(UNIX_ADDRESS_PREFIX) {
            r.check(&address_at, check_unix_address(path));
            if !self.ports.is_empty() {
                r.error(&at.field("ports"), format!("unix endpoint {} must not include ports", self.address));
            }
        } else if !host::is_ip_address(&self.address) {
            match rule {
                AddressRule::IpOnly => r.error(&address_at, format!("endpoint address {:?} is not a valid IP address", self.address)),
                AddressRule::IpOrHostname => {
                    if host::check_fqdn(&self.address).is_err() {
                        r.error(&address_at, format!("endpoint address {:?} is not a valid FQDN or an IP address", self.address));
                    }
                }
            }
        }

        let ports_at = at.field("ports");
        for (name, number) in &self.ports {
            let port_at = ports_at.key(name);
            r.check(&port_at, check_port_name(name));
            check_port(r, &port_at, *number);
            if service_ports.is_some_and(|known| !known.contains(name.as_str())) {
                r.error(&port_at, format!("endpoint port {name:?} is not defined by the service entry"));
            }
        }
        check_labels(r, &at.field("labels"), &self.labels);
        if let Some(locality) = &self.locality {
            if locality.split('/').count() > 3 || locality.split('/').any(str::is_empty) {
                r.error(&at.field("locality"), format!("locality {locality:?} must be region[/zone[/subzone]]"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("WorkloadEntry", &spec).expect_err("spec should be invalid")
    }

    #[test]
    fn vm_entry_round_trips() {
        let spec = json!({
            "address": "10.0.0.5",
            "ports": {"http": 8080},
            "labels": {"app": "details", "version": "vm"},
            "network": "vm-net",
            "locality": "us-east1/us-east1-b",
            "weight": 10,
            "serviceAccount": "details"
        });
        let validated = validate("WorkloadEntry", &spec).unwrap();
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn hostnames_and_sockets_are_allowed() {
        assert!(validate("WorkloadEntry", &json!({"address": "vm1.corp.example.com"})).is_ok());
        assert!(validate("WorkloadEntry", &json!({"address": "unix:///var/run/app.sock"})).is_ok());
        let warned = validate("WorkloadEntry", &json!({"network": "remote"})).unwrap();
        assert_eq!(warned.warnings().len(), 1);
    }

    #[test]
    fn bad_entries() {
        let e = errors(json!({"ports": {"http": 0, "Bad_Name": 80}, "weight": 1}));
        assert!(e.iter().any(|e| e.field == "spec.address" && e.reason.contains("required")), "{e:?}");
        assert!(e.iter().any(|e| e.field == "spec.ports.http" && e.reason.contains("1..65535")), "{e:?}");
        assert!(e.iter().any(|e| e.field == "spec.ports.Bad_Name" && e.reason.contains("port name")), "{e:?}");
        let e = errors(json!({"address": "unix://relative.sock", "ports": {"http": 80}}));
        assert_eq!(e.len(), 2, "{e:?}");
        let e = errors(json!({"address": "10.0.0.1", "weight": -1}));
        assert_eq!(e[0].field, "spec.weight");
    }
}
