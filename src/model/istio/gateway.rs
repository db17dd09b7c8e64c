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

    /// Whether the proxy terminates TLS (and so needs certificates).
    pub fn terminates(&self) -> bool {
        matches!(self.mode(), ServerTlsMode::Simple | ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual)
    }

    /// Whether clients are asked for a certificate, validated against
    /// `caCertificates` (required only with `MUTUAL`).
    pub fn verifies_clients(&self) -> bool {
        matches!(self.mode(), ServerTlsMode::Mutual | ServerTlsMode::OptionalMutual)
    }

    /// The cipher suites given to Envoy: as Istio does, names Envoy does
    /// not know and repeats are dropped (validation warns about both).
    pub fn cipher_suites(&self) -> Vec<&str> {
        let mut seen = BTreeSet::new();
        self.cipher_suites.iter().map(String::as_str).filter(|c| known_cipher_suite(c) && seen.insert(*c)).collect()
    }
}

/// A cipher suite Envoy (BoringSSL) knows by name, `ALL`, or an expression
/// starting with an operator (`-`, `+`, `!`, `[`), which is BoringSSL
/// syntax we pass on without parsing (as Istio does).
fn known_cipher_suite(cipher: &str) -> bool {
    let is_expression = !cipher.starts_with(|c: char| c.is_alphanumeric());
    is_expression || cipher == "ALL" || CIPHER_SUITES.contains(&cipher)
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

/// In Envoy's order (`TlsParameters.TlsProtocol`), so versions compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
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
        if let Some(protocol) = protocol {
            self.check_translatable(protocol, at, r);
        }
        r.ignored_if(self.default_endpoint.is_some(), &at.field("defaultEndpoint"));
    }

    /// Gateways serve HTTP; HTTPS terminated with certificate files or
    /// Secrets (credentialName, credentialNames, caCertCredentialName); TLS
    /// (HTTPS or TLS ports) passed through by SNI (PASSTHROUGH: the
    /// VirtualServices' `tls` routes; AUTO_PASSTHROUGH: the SNI names the
    /// cluster); and TCP by the `tcp` routes. Anything else would be served
    /// as something the user did not ask for (TLS as plaintext, say), so it
    /// is refused.
    fn check_translatable(&self, protocol: Protocol, at: &Path, r: &mut Report) {
        let passthrough = self.tls.as_ref().is_some_and(|t| matches!(t.mode(), ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough));
        if protocol == Protocol::Tls && !passthrough {
            r.unsupported_one(
                &at.field("tls").field("mode"),
                "terminating TLS on a TLS server (then routing TCP)",
                "use PASSTHROUGH to route TLS by SNI, or protocol HTTPS to terminate TLS and route HTTP",
            );
            return;
        }
        if !protocol.is_http() && !protocol.is_tcp() {
            r.unsupported_one(
                &at.field("port").field("protocol"),
                &format!("protocol {} on a gateway", self.port.protocol),
                "gateways serve HTTP, HTTPS, TLS and TCP",
            );
            return;
        }
        let Some(tls) = &self.tls else { return };
        let tls_at = at.field("tls");
        if tls.mode() == ServerTlsMode::IstioMutual {
            // The gateway's own workload certificate, from `lodestar agent`.
            r.warn(
                &tls_at.field("mode"),
                "ISTIO_MUTUAL is served only to gateway proxies with a mesh identity (lodestar agent, node metadata LODESTAR_SDS); others get no listener for this server",
            );
        }
        // Each credential is served over SDS on the gateway's ADS stream,
        // from the Secret of that name in the gateway proxy's namespace
        // (`xds::secrets`): a plain Secret name, nothing else.
        let secret_name = |name: &str, at: &Path, r: &mut Report| {
            if name.contains("://") {
                r.unsupported_one(
                    at,
                    &format!("the credential reference {name:?}"),
                    "name a Secret in the gateway proxy's namespace (ConfigMaps and other namespaces are not served)",
                );
            } else if let Err(why) = crate::resource::check_dns_subdomain(name) {
                r.error(at, format!("must name a Secret in the gateway proxy's namespace: {why}"));
            }
        };
        if let Some(name) = &tls.credential_name {
            secret_name(name, &tls_at.field("credentialName"), r);
        }
        let names_at = tls_at.field("credentialNames");
        // Istio's CRD schema for credentialNames (minItems 1, maxItems 2:
        // an RSA and an ECDSA certificate); Envoy refuses two certificates
        // of one key type, so a name twice is refused here.
        if tls.credential_names.len() > 2 {
            r.error(&names_at, format!("at most 2 credential names (one RSA and one ECDSA certificate), got {}", tls.credential_names.len()));
        }
        for (i, name) in tls.credential_names.iter().enumerate() {
            let at = names_at.index(i);
            secret_name(name, &at, r);
            if tls.credential_names[..i].contains(name) {
                r.error(&at, format!("{name:?} is named twice: each credential is one certificate (one RSA, one ECDSA)"));
            }
        }
        let credential = if tls.credential_name.is_some() { "credentialName" } else { "credentialNames" };
        if let (true, Some(first), Some(_)) = (tls.terminates(), tls.credential_name.as_ref().or(tls.credential_names.first()), &tls.ca_certificates) {
            let from = match &tls.ca_cert_credential_name {
                Some(ca) => format!("the Secret {ca} (caCertCredentialName)"),
                None => format!("the credential (its ca.crt or cacert, or the Secret {first}-cacert), or caCertCredentialName"),
            };
            r.error(&tls_at.field("caCertificates"), format!("cannot be combined with {credential}: the client CA comes from {from}"));
        }
        if let Some(ca) = &tls.ca_cert_credential_name {
            let ca_at = tls_at.field("caCertCredentialName");
            secret_name(ca, &ca_at, r);
            // Istio reads it only where the certificate comes from a
            // credential too (`ApplyCredentialSDSToServerCommonTLSContext`);
            // with certificate files it would be ignored, so it is refused.
            if tls.terminates() && !tls.has_credential_name() {
                r.unsupported_one(
                    &ca_at,
                    "caCertCredentialName with certificate files",
                    "use caCertificates with serverCertificate/tlsCertificates, or caCertCredentialName with credentialName or credentialNames",
                );
            }
        }
        let certs_at = tls_at.field("tlsCertificates");
        for (i, cert) in tls.tls_certificates.iter().enumerate() {
            if cert.ca_certificates.is_some() {
                r.unsupported_one(&certs_at.index(i).field("caCertificates"), "caCertificates per certificate", "use tls.caCertificates");
            }
        }
        r.ignored_if(tls.insecure_skip_verify.is_some(), &tls_at.field("insecureSkipVerify"));
    }
}

impl ServerTlsSettings {
    /// Istio's `validateTLSOptions` (`pkg/config/validation`): one
    /// certificate source, what each mode needs, what it ignores.
    pub(super) fn check(&self, at: &Path, r: &mut Report) {
        let mode = self.mode();
        if matches!(self.min_protocol_version, Some(TlsProtocol::TlsV1_0 | TlsProtocol::TlsV1_1)) && self.cipher_suites.is_empty() {
            r.warn(&at.field("minProtocolVersion"), "TLS versions below TLSV1_2 require setting compatible cipherSuites");
        }
        let mut seen = BTreeSet::new();
        let ciphers_at = at.field("cipherSuites");
        for (i, cipher) in self.cipher_suites.iter().enumerate() {
            if !known_cipher_suite(cipher) {
                r.warn(&ciphers_at.index(i), format!("ignoring invalid cipher suite {cipher:?}"));
            } else if !seen.insert(cipher.as_str()) {
                r.warn(&ciphers_at.index(i), format!("ignoring duplicate cipher suite {cipher:?}"));
            }
        }
        if let (Some(min), Some(max)) = (self.min_protocol_version, self.max_protocol_version) {
            if min != TlsProtocol::TlsAuto && max != TlsProtocol::TlsAuto && min > max {
                r.error(&at.field("minProtocolVersion"), format!("minProtocolVersion {min:?} is above maxProtocolVersion {max:?}"));
            }
        }
        // Envoy refuses the listener over a malformed pin.
        let spki_at = at.field("verifyCertificateSpki");
        for (i, spki) in self.verify_certificate_spki.iter().enumerate() {
            if !is_base64_sha256(spki) {
                r.error(&spki_at.index(i), format!("{spki:?} is not a base64-encoded SHA-256 hash (44 characters)"));
            }
        }
        let hash_at = at.field("verifyCertificateHash");
        for (i, hash) in self.verify_certificate_hash.iter().enumerate() {
            if !is_hex_sha256(hash) {
                r.error(&hash_at.index(i), format!("{hash:?} is not a hex-encoded SHA-256 hash (64 hex digits, optionally colon-separated)"));
            }
        }
        if mode == ServerTlsMode::Simple {
            // SIMPLE asks no client for a certificate: nothing to verify.
            let client_checks = [
                ("caCertificates", self.ca_certificates.is_some()),
                ("caCertCredentialName", self.ca_cert_credential_name.is_some()),
                ("subjectAltNames", !self.subject_alt_names.is_empty()),
                ("verifyCertificateSpki", !self.verify_certificate_spki.is_empty()),
                ("verifyCertificateHash", !self.verify_certificate_hash.is_empty()),
            ];
            for (field, _) in client_checks.iter().filter(|(_, set)| *set) {
                r.warn(&at.field(field), "has no effect with SIMPLE TLS (clients are not asked for a certificate); use MUTUAL or OPTIONAL_MUTUAL");
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
                // Not in Istio's list (it ignores the field here); refused
                // rather than accepted and not acted on.
                ("caCertCredentialName", self.ca_cert_credential_name.is_some()),
            ];
            for (field, _) in provided.iter().filter(|(_, set)| *set) {
                r.error(&at.field(field), format!("ISTIO_MUTUAL TLS cannot have associated {field}"));
            }
            return;
        }
        let passthrough = matches!(mode, ServerTlsMode::Passthrough | ServerTlsMode::AutoPassthrough);
        if passthrough && (self.has_inline_certificates() || self.has_credential_name() || self.ca_cert_credential_name.is_some() || self.ca_crl.is_some()) {
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
            // Istio refuses it with credentialName; with credentialNames its
            // credential path drops the CRL the same way, so it is refused too.
            if self.credential_name.is_some() {
                r.error(&crl_at, "CRL is not supported with credentialName; put the CRL in the credential");
            } else if !self.credential_names.is_empty() {
                r.error(&crl_at, "CRL is not supported with credentialNames");
            }
            if mode == ServerTlsMode::Simple {
                r.error(&crl_at, "CRL is not supported with SIMPLE TLS");
            }
        }
    }
}

/// 32 bytes in standard base64: 43 characters and one `=` of padding.
fn is_base64_sha256(s: &str) -> bool {
    s.len() == 44 && s.ends_with('=') && s.as_bytes()[..43].iter().all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
}

/// 32 bytes in hex, optionally with colons between the bytes (`AB:CD:...`).
fn is_hex_sha256(s: &str) -> bool {
    let digits: Vec<u8> = s.bytes().filter(|b| *b != b':').collect();
    digits.len() == 64 && digits.iter().all(u8::is_ascii_hexdigit)
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
                 "tls": {"mode": "SIMPLE", "serverCertificate": "/etc/certs/tls.crt", "privateKey": "/etc/certs/tls.key"}}
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
    fn what_gateways_cannot_serve_is_refused_not_served_otherwise() {
        let e = errors(json!({"servers": [
            {"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialName": "a-cert"}},
            {"port": {"number": 15443, "name": "d", "protocol": "TLS"}, "hosts": ["*.local"], "tls": {"mode": "ISTIO_MUTUAL"}},
            {"port": {"number": 8443, "name": "f", "protocol": "TLS"}, "hosts": ["f.example.com"],
             "tls": {"mode": "SIMPLE", "serverCertificate": "/c.pem", "privateKey": "/k.pem"}},
            {"port": {"number": 5000, "name": "g", "protocol": "UDP"}, "hosts": ["*"]}
        ]}));
        assert!(!e.iter().any(|e| e.field.starts_with("spec.servers[0]")), "credentialName is served: {e:?}");
        assert!(has(&e, "spec.servers[1].tls.mode", "terminating TLS on a TLS server (then routing TCP) is not supported yet"), "{e:?}");
        assert!(has(&e, "spec.servers[2].tls.mode", "terminating TLS on a TLS server (then routing TCP) is not supported yet"), "{e:?}");
        assert!(has(&e, "spec.servers[3].port.protocol", "protocol UDP on a gateway is not supported yet"), "{e:?}");
        assert!(e.iter().all(|e| !e.reason.contains("invalid")), "{e:?}");
        // Passed through by SNI, or TCP: served.
        let ok = json!({"servers": [
            {"port": {"number": 443, "name": "b", "protocol": "HTTPS"}, "hosts": ["b.example.com"], "tls": {"mode": "PASSTHROUGH"}},
            {"port": {"number": 443, "name": "c", "protocol": "HTTPS"}, "hosts": ["c.example.com"], "tls": {"mode": "AUTO_PASSTHROUGH"}},
            {"port": {"number": 31400, "name": "e", "protocol": "TCP"}, "hosts": ["*"]},
            {"port": {"number": 8443, "name": "f", "protocol": "TLS"}, "hosts": ["f.example.com"], "tls": {"mode": "PASSTHROUGH"}}
        ]});
        assert!(validate("Gateway", &ok).is_ok());
    }

    #[test]
    fn terminated_tls_is_accepted() {
        let spec = json!({"servers": [
            {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"], "tls": {"httpsRedirect": true}},
            {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "SIMPLE", "serverCertificate": "/c.pem", "privateKey": "/k.pem", "minProtocolVersion": "TLSV1_2", "maxProtocolVersion": "TLSV1_3"}},
            {"port": {"number": 8443, "name": "mtls", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "MUTUAL", "serverCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem", "subjectAltNames": ["client.example.com"],
                     "verifyCertificateHash": ["DF:6F:F7:2F:E9:11:65:21:26:8F:64:71:58:E4:5A:22:8D:3B:81:2E:11:CD:A3:9A:CA:6E:59:F0:E4:E3:B2:03"]}},
            {"port": {"number": 9443, "name": "optional", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "OPTIONAL_MUTUAL", "tlsCertificates": [{"serverCertificate": "/rsa.pem", "privateKey": "/rsa.key"}, {"serverCertificate": "/ec.pem", "privateKey": "/ec.key"}], "caCertificates": "/ca.pem"}}
        ]});
        let validated = validate("Gateway", &spec).unwrap();
        assert!(validated.warnings().is_empty(), "{:?}", validated.warnings());
        // SIMPLE asks clients for no certificate: client checks are noted as idle.
        let spec = json!({"servers": [{"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
            "tls": {"mode": "SIMPLE", "serverCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem"}}]});
        let validated = validate("Gateway", &spec).unwrap();
        assert!(validated.warnings().iter().any(|w| w.starts_with("spec.servers[0].tls.caCertificates: has no effect")), "{:?}", validated.warnings());
    }

    #[test]
    fn credential_name() {
        let ok = json!({"servers": [
            {"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialName": "a-cert"}},
            {"port": {"number": 8443, "name": "b", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "MUTUAL", "credentialName": "b-cert"}}
        ]});
        let v = validate("Gateway", &ok).unwrap();
        assert!(v.warnings().is_empty(), "{:?}", v.warnings());
        let e = errors(json!({"servers": [
            {"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialName": "kubernetes://ns/x"}},
            {"port": {"number": 8443, "name": "b", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "MUTUAL", "credentialName": "b", "caCertificates": "/ca.pem"}},
        ]}));
        assert!(has(&e, "spec.servers[0].tls.credentialName", "not supported"), "{e:?}");
        assert!(has(&e, "spec.servers[1].tls.caCertificates", "cannot be combined with credentialName"), "{e:?}");
        let e = errors(json!({"servers": [
            {"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialName": "ns/x"}}]}));
        assert!(has(&e, "spec.servers[0].tls.credentialName", "must name a Secret"), "{e:?}");
    }

    #[test]
    fn credential_names_and_ca_cert_credential_name() {
        let ok = json!({"servers": [
            {"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialNames": ["rsa", "ecdsa"]}},
            {"port": {"number": 8443, "name": "b", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "MUTUAL", "credentialNames": ["rsa", "ecdsa"], "caCertCredentialName": "client-ca"}},
            {"port": {"number": 9443, "name": "c", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "OPTIONAL_MUTUAL", "credentialName": "c", "caCertCredentialName": "c-cacert"}}
        ]});
        let v = validate("Gateway", &ok).unwrap();
        assert!(v.warnings().is_empty(), "{:?}", v.warnings());
        assert_eq!(v.to_json().unwrap(), ok, "accepted unchanged");

        let e = errors(json!({"servers": [
            {"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialNames": ["x", "Bad_Name"]}},
            {"port": {"number": 444, "name": "b", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialNames": ["x", "y", "z"]}},
            {"port": {"number": 445, "name": "c", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialNames": ["x", "x"]}},
            {"port": {"number": 446, "name": "d", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "SIMPLE", "credentialName": "x", "credentialNames": ["y"]}},
            {"port": {"number": 447, "name": "e", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "SIMPLE", "credentialNames": ["y"], "serverCertificate": "/c.pem", "privateKey": "/k.pem"}},
            {"port": {"number": 448, "name": "f", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "MUTUAL", "credentialNames": ["y"], "caCertificates": "/ca.pem"}},
            {"port": {"number": 449, "name": "g", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "MUTUAL", "serverCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem", "caCertCredentialName": "ca"}},
            {"port": {"number": 450, "name": "h", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
             "tls": {"mode": "MUTUAL", "credentialName": "x", "caCertCredentialName": "configmap://istio-system/ca"}},
            {"port": {"number": 451, "name": "i", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "ISTIO_MUTUAL", "caCertCredentialName": "ca"}},
            {"port": {"number": 452, "name": "j", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "MUTUAL", "credentialNames": ["y"], "caCrl": "/crl.pem"}}
        ]}));
        assert!(has(&e, "spec.servers[0].tls.credentialNames[1]", "must name a Secret"), "{e:?}");
        assert!(has(&e, "spec.servers[1].tls.credentialNames", "at most 2"), "{e:?}");
        assert!(has(&e, "spec.servers[2].tls.credentialNames[1]", "named twice"), "{e:?}");
        assert!(!e.iter().any(|e| e.field == "spec.servers[2].tls.credentialNames[0]"), "{e:?}");
        assert!(has(&e, "spec.servers[3].tls", "only one of credentialName, credentialNames"), "{e:?}");
        assert!(has(&e, "spec.servers[4].tls", "only one of credentialName, credentialNames"), "{e:?}");
        assert!(has(&e, "spec.servers[5].tls.caCertificates", "cannot be combined with credentialNames"), "{e:?}");
        assert!(has(&e, "spec.servers[6].tls.caCertCredentialName", "not supported"), "{e:?}");
        assert!(has(&e, "spec.servers[7].tls.caCertCredentialName", "not supported"), "{e:?}");
        assert!(has(&e, "spec.servers[8].tls.caCertCredentialName", "ISTIO_MUTUAL"), "{e:?}");
        assert!(has(&e, "spec.servers[9].tls.caCrl", "not supported with credentialNames"), "{e:?}");

        // SIMPLE asks for no client certificate: the CA has no effect.
        let simple = json!({"servers": [{"port": {"number": 443, "name": "a", "protocol": "HTTPS"}, "hosts": ["a.example.com"],
            "tls": {"mode": "SIMPLE", "credentialName": "x", "caCertCredentialName": "ca"}}]});
        let v = validate("Gateway", &simple).unwrap();
        assert!(v.warnings().iter().any(|w| w.starts_with("spec.servers[0].tls.caCertCredentialName: has no effect")), "{:?}", v.warnings());
    }

    #[test]
    fn istio_mutual_on_https_is_served_with_a_warning() {
        let spec =
            json!({"servers": [{"port": {"number": 8443, "name": "mesh", "protocol": "HTTPS"}, "hosts": ["a.example.com"], "tls": {"mode": "ISTIO_MUTUAL"}}]});
        let v = validate("Gateway", &spec).unwrap();
        assert!(
            v.warnings().iter().any(|w| w.starts_with("spec.servers[0].tls.mode: ISTIO_MUTUAL is served only to gateway proxies with a mesh identity")),
            "{:?}",
            v.warnings()
        );
    }

    #[test]
    fn istio_mutual_rejects_certificates() {
        let e = errors(json!({"servers": [{"port": {"number": 15443, "name": "tls", "protocol": "TLS"}, "hosts": ["*.local"],
            "tls": {"mode": "ISTIO_MUTUAL", "credentialName": "x"}}]}));
        assert!(has(&e, "spec.servers[0].tls.credentialName", "ISTIO_MUTUAL"), "{e:?}");
    }
}
