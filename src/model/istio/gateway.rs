//! `Gateway`: listeners on a standalone (ingress or egress) proxy.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::common::{Labels, Protocol, SUPPORTED_PROTOCOLS};
use super::host::{self, HostScope};
use super::validate::{check_labels, check_port, check_unix_address, Path, Report};
use super::workload_entry::UNIX_ADDRESS_PREFIX;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Gateway {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<Server>,
    /// Labels of the gateway proxies this configuration applies to.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub selector: Labels,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Server {
    pub port: Port,
    /// IP (or `unix://` socket) to listen on; all interfaces by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bind: Option<String>,
    /// `[namespace/]host`: hosts exposed, and which namespaces' routes may bind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTlsSettings>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A listener port, as used by Gateway servers and Sidecar listeners.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Port {
    /// 0 (or absent) only for listeners bound to a Unix socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub protocol: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Deprecated; has no effect on Gateways or Sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_port: Option<u32>,
}

impl Port {
    pub fn number(&self) -> u32 {
        self.number.unwrap_or(0)
    }
}

/// TLS terminated (or passed through) by a listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServerTlsSettings {
    /// Answer plain HTTP with a redirect to HTTPS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_redirect: Option<bool>,
    /// Defaults to `PASSTHROUGH`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ServerTlsMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_crl: Option<String>,
    /// Name of a secret holding the certificate, key (and CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credential_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_credential_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_certificates: Vec<TlsCertificate>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subject_alt_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verify_certificate_spki: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verify_certificate_hash: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_protocol_version: Option<TlsProtocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_protocol_version: Option<TlsProtocol>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cipher_suites: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
}

impl ServerTlsSettings {
    /// The effective mode (protobuf's default is `PASSTHROUGH`).
    pub fn mode(&self) -> ServerTlsMode {
        self.mode.unwrap_or(ServerTlsMode::Passthrough)
    }

    fn has_inline_certificates(&self) -> bool {
        self.server_certificate.is_some() || self.private_key.is_some() || self.ca_certificates.is_some() || !self.tls_certificates.is_empty()
    }

    fn has_credential_name(&self) -> bool {
        self.credential_name.is_some() || !self.credential_names.is_empty()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TlsCertificate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_certificate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_certificates: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ServerTlsMode {
    /// Forward the TLS stream untouched, routing on SNI.
    Passthrough,
    Simple,
    Mutual,
    AutoPassthrough,
    IstioMutual,
    OptionalMutual,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum TlsProtocol {
    #[serde(rename = "TLS_AUTO")]
    TlsAuto,
    #[serde(rename = "TLSV1_0")]
    TlsV1_0,
    #[serde(rename = "TLSV1_1")]
    TlsV1_1,
    #[serde(rename = "TLSV1_2")]
    TlsV1_2,
    #[serde(rename = "TLSV1_3")]
    TlsV1_3,
}

/// Cipher suites Envoy (BoringSSL) knows by name.
const CIPHER_SUITES: [&str; 15] = [
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
];

// ---------------------------------------------------------------------------
// Validation (after istio/istio ValidateGateway and validateTLSOptions).
// ---------------------------------------------------------------------------

impl Gateway {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let servers_at = at.field("servers");
        if self.servers.is_empty() {
            r.error(&servers_at, "gateway must have at least one server");
        }
        let mut port_names = BTreeSet::new();
        for (i, server) in self.servers.iter().enumerate() {
            let server_at = servers_at.index(i);
            server.check(&server_at, r);
            // Port names name the listeners' route configurations.
            if !server.port.name.is_empty() && !port_names.insert(server.port.name.as_str()) {
                r.error(&server_at.field("port").field("name"), format!("port names in servers must be unique: duplicate name {:?}", server.port.name));
            }
        }
        check_labels(r, &at.field("selector"), &self.selector);
    }
}

impl Server {
    fn check(&self, at: &Path, r: &mut Report) {
        let hosts_at = at.field("hosts");
        if self.hosts.is_empty() {
            r.error(&hosts_at, "server must have at least one host");
        }
        for (i, h) in self.hosts.iter().enumerate() {
            for e in host::check_namespace_slash_host(h, HostScope::Gateway) {
                r.error(&hosts_at.index(i), e);
            }
        }

        let port_at = at.field("port");
        let bind = self.bind.as_deref().unwrap_or_default();
        let unix_bind = bind.strip_prefix(UNIX_ADDRESS_PREFIX);
        let protocol = Protocol::parse(&self.port.protocol);
        if protocol.is_none() {
            r.error(&port_at.field("protocol"), format!("invalid protocol {:?}, supported protocols are {SUPPORTED_PROTOCOLS}", self.port.protocol));
        }
        if self.port.number() > 0 || unix_bind.is_none() {
            check_port(r, &port_at.field("number"), self.port.number());
        }
        if self.port.target_port.is_some_and(|p| p > 0) {
            r.error(&port_at.field("targetPort"), "targetPort has no impact on Gateways");
        }
        if self.port.name.is_empty() {
            r.error(&port_at.field("name"), "port name must be set");
        }

        let bind_at = at.field("bind");
        match unix_bind {
            Some(path) => {
                r.check(&bind_at, check_unix_address(path));
                if self.port.number() != 0 {
                    r.error(&port_at.field("number"), "port number must be 0 for unix domain socket");
                }
            }
            None if !bind.is_empty() && !host::is_ip_address(bind) => {
                r.error(&bind_at, format!("{bind} is not a valid IP address"));
            }
            None => {}
        }

        let tls_at = at.field("tls");
        if let Some(tls) = &self.tls {
            tls.check(&tls_at, r);
            if tls.https_redirect == Some(true) && protocol.is_some_and(|p| !p.is_http()) {
                r.warn(&tls_at.field("httpsRedirect"), "httpsRedirect should only be used with HTTP servers");
            }
        }
        if let Some(protocol) = protocol {
            match &self.tls {
                None if protocol.is_tls() => {
                    r.error(&tls_at, "server must have TLS settings for HTTPS/TLS protocols");
                }
                Some(tls) if !protocol.is_tls() => {
                    // A plain HTTP server may carry `tls` only to ask for an
                    // HTTPS redirect.
                    let redirect_only = matches!(tls.mode(), ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough)
                        && tls.server_certificate.is_none()
                        && tls.private_key.is_none()
                        && tls.ca_certificates.is_none();
                    if !protocol.is_http() {
                        r.error(&tls_at, "server cannot have TLS settings for non HTTPS/TLS ports");
                    } else if !redirect_only {
                        r.error(&tls_at, "server cannot have TLS settings for plain text HTTP ports");
                    }
                }
                _ => {}
            }
        }
        r.ignored_if(self.default_endpoint.is_some(), &at.field("defaultEndpoint"));
    }
}

impl ServerTlsSettings {
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let mode = self.mode();
        if matches!(self.min_protocol_version, Some(TlsProtocol::TlsV1_0 | TlsProtocol::TlsV1_1)) && self.cipher_suites.is_empty() {
            r.warn(&at.field("minProtocolVersion"), "TLS versions below TLSV1_2 require setting compatible cipherSuites");
        }
        let mut seen = BTreeSet::new();
        let ciphers_at = at.field("cipherSuites");
        for (i, cipher) in self.cipher_suites.iter().enumerate() {
            // Expressions starting with an operator (`-`, `+`, `!`, `[`) are
            // BoringSSL syntax we do not parse.
            let is_expression = !cipher.starts_with(|c: char| c.is_alphanumeric());
            if !is_expression && cipher != "ALL" && !CIPHER_SUITES.contains(&cipher.as_str()) {
                r.warn(&ciphers_at.index(i), format!("ignoring invalid cipher suite {cipher:?}"));
            } else if !seen.insert(cipher.as_str()) {
                r.warn(&ciphers_at.index(i), format!("ignoring duplicate cipher suite {cipher:?}"));
            }
        }

        if mode == ServerTlsMode::IstioMutual {
            // ISTIO_MUTUAL uses the mesh's own certificates.
            let provided = [
                ("serverCertificate", self.server_certificate.is_some()),
                ("privateKey", self.private_key.is_some()),
                ("caCertificates", self.ca_certificates.is_some()),
                ("tlsCertificates", !self.tls_certificates.is_empty()),
                ("credentialName", self.credential_name.is_some()),
                ("credentialNames", !self.credential_names.is_empty()),
            ];
            for (field, _) in provided.iter().filter(|(_, set)| *set) {
                r.error(&at.field(field), format!("ISTIO_MUTUAL TLS cannot have associated {field}"));
            }
            return;
        }
        let passthrough = matches!(mode, ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough);
        if passthrough && (self.has_inline_certificates() || self.has_credential_name() || self.ca_crl.is_some()) {
            r.warn(at, format!("{mode:?} mode does not use certificates, they will be ignored"));
        }

        let sources = [
            self.server_certificate.is_some() && self.private_key.is_some(),
            self.credential_name.is_some(),
            !self.credential_names.is_empty(),
            !self.tls_certificates.is_empty(),
        ];
        if sources.iter().filter(|s| **s).count() > 1 {
            r.error(at, "only one of credentialName, credentialNames, serverCertificate/privateKey or tlsCertificates should be specified");
        }

        let terminates = matches!(mode, ServerTlsMode::Simple | ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual);
        // With a credential name, certificates come from the secret store
        // and nothing else is needed here.
        if terminates && !self.has_credential_name() {
            let prefix = if mode == ServerTlsMode::Simple { "SIMPLE TLS" } else { "MUTUAL TLS" };
            if mode != ServerTlsMode::Simple && self.ca_certificates.as_deref().is_none_or(str::is_empty) {
                r.error(&at.field("caCertificates"), format!("{prefix} requires a client CA bundle"));
            }
            if self.tls_certificates.len() > 2 {
                r.warn(&at.field("tlsCertificates"), format!("{prefix} can support up to 2 server certificates"));
            }
            if self.tls_certificates.is_empty() {
                if self.server_certificate.as_deref().is_none_or(str::is_empty) {
                    r.error(&at.field("serverCertificate"), format!("{prefix} requires a server certificate"));
                }
                if self.private_key.as_deref().is_none_or(str::is_empty) {
                    r.error(&at.field("privateKey"), format!("{prefix} requires a private key"));
                }
            }
            let certs_at = at.field("tlsCertificates");
            for (i, cert) in self.tls_certificates.iter().enumerate() {
                let cert_at = certs_at.index(i);
                if cert.server_certificate.as_deref().is_none_or(str::is_empty) {
                    r.error(&cert_at.field("serverCertificate"), format!("{prefix} requires a server certificate"));
                }
                if cert.private_key.as_deref().is_none_or(str::is_empty) {
                    r.error(&cert_at.field("privateKey"), format!("{prefix} requires a private key"));
                }
            }
        }
        if self.ca_crl.is_some() {
            let crl_at = at.field("caCrl");
            if self.credential_name.is_some() {
                r.error(&crl_at, "CRL is not supported with credentialName; put the CRL in the credential");
            }
            if mode == ServerTlsMode::Simple {
                r.error(&crl_at, "CRL is not supported with SIMPLE TLS");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::validate::{validate, FieldError};
    use serde_json::{json, Value};

    fn errors(spec: Value) -> Vec<FieldError> {
        validate("Gateway", &spec).expect_err("spec should be invalid")
    }

    fn has(errors: &[FieldError], field: &str, reason: &str) -> bool {
        errors.iter().any(|e| e.field == field && e.reason.contains(reason))
    }

    #[test]
    fn ingress_round_trips() {
        let spec = json!({
            "selector": {"istio": "ingressgateway"},
            "servers": [
                {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tls": {"httpsRedirect": true}},
                {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["bookinfo/*.example.com"],
                 "tls": {"mode": "SIMPLE", "credentialName": "example-cert"}}
            ]
        });
        let validated = validate("Gateway", &spec).unwrap();
        assert!(validated.warnings().is_empty(), "{:?}", validated.warnings());
        assert_eq!(validated.to_json().unwrap(), spec);
    }

    #[test]
    fn servers_need_hosts_and_valid_ports() {
        let e = errors(json!({"servers": [{"port": {"number": 0, "protocol": "SOAP"}, "hosts": []}]}));
        assert!(has(&e, "spec.servers[0].hosts", "at least one host"), "{e:?}");
        assert!(has(&e, "spec.servers[0].port.protocol", "invalid protocol"), "{e:?}");
        assert!(has(&e, "spec.servers[0].port.number", "1..65535"), "{e:?}");
        assert!(has(&e, "spec.servers[0].port.name", "must be set"), "{e:?}");
        let e = errors(json!({"servers": [{"hosts": ["*"]}]}));
        assert!(has(&e, "spec.servers[0]", "missing field `port`"), "{e:?}");
    }

    #[test]
    fn https_needs_tls_and_certificates() {
        let e = errors(json!({"servers": [
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.com"]},
            {"port": {"number": 8443, "name": "mtls", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "MUTUAL", "serverCertificate": "/c.pem"}}
        ]}));
        assert!(has(&e, "spec.servers[0].tls", "must have TLS settings"), "{e:?}");
        assert!(has(&e, "spec.servers[1].tls.caCertificates", "client CA bundle"), "{e:?}");
        assert!(has(&e, "spec.servers[1].tls.privateKey", "private key"), "{e:?}");
    }

    #[test]
    fn duplicate_port_names() {
        let e = errors(json!({"servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["a.example.com"]},
            {"port": {"number": 8080, "name": "http", "protocol": "HTTP"}, "hosts": ["b.example.com"]}
        ]}));
        assert!(has(&e, "spec.servers[1].port.name", "must be unique"), "{e:?}");
    }

    #[test]
    fn unix_socket_listener() {
        let spec = json!({"servers": [{"port": {"number": 0, "name": "uds", "protocol": "HTTP"}, "bind": "unix:///var/run/gw.sock", "hosts": ["*"]}]});
        assert!(validate("Gateway", &spec).is_ok());
        let e = errors(json!({"servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "bind": "not-an-ip", "hosts": ["*"]}]}));
        assert!(has(&e, "spec.servers[0].bind", "not a valid IP"), "{e:?}");
    }

    #[test]
    fn istio_mutual_rejects_certificates() {
        let e = errors(json!({"servers": [{"port": {"number": 15443, "name": "tls", "protocol": "TLS"}, "hosts": ["*.local"],
            "tls": {"mode": "ISTIO_MUTUAL", "credentialName": "x"}}]}));
        assert!(has(&e, "spec.servers[0].tls.credentialName", "ISTIO_MUTUAL"), "{e:?}");
    }
}
