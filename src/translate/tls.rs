//! TLS contexts: a gateway server's (downstream: the proxy terminates TLS)
//! and a DestinationRule's (upstream: the proxy originates TLS).
//! Certificates, keys and CA bundles are file paths on the proxy's host,
//! read by Envoy itself, or (a gateway's `credentialName`, `credentialNames`,
//! `caCertCredentialName`) SDS secrets on
//! the proxy's ADS stream, named here and served by `xds` from the
//! store's Secrets. (Mutual TLS with the workload certificates, over the
//! agent's SDS, is `mtls`.)

use crate::model::istio::destination_rule::{ClientTlsMode, ClientTlsSettings};
use crate::model::istio::gateway::{ServerTlsMode, ServerTlsSettings, TlsProtocol};
use crate::model::secret::CA_SUFFIX;
use envoy_types::pb::envoy::config::core::v3::{
    config_source::ConfigSourceSpecifier, data_source::Specifier, AggregatedConfigSource, ApiVersion, ConfigSource, DataSource,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    subject_alt_name_matcher::SanType,
    tls_parameters, CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, SubjectAltNameMatcher, TlsCertificate,
    TlsParameters, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use envoy_types::pb::google::protobuf::BoolValue;

/// What an HTTPS server offers in ALPN: HTTP/2 first, as Istio does.
const ALPN_HTTP: [&str; 2] = ["h2", "http/1.1"];

// The transport socket wrapper is shared with `mtls`: it lives in `util`.
pub use super::util::{transport_socket, TLS_TRANSPORT_SOCKET};

pub fn file(path: &str) -> DataSource {
    DataSource { specifier: Some(Specifier::Filename(path.to_string())), ..Default::default() }
}

/// A gateway server terminating TLS (`SIMPLE`, `MUTUAL`, `OPTIONAL_MUTUAL`,
/// and `ISTIO_MUTUAL` for a proxy with the agent's SDS; validation refuses
/// the other modes on gateways). `MUTUAL` requires a
/// client certificate; `OPTIONAL_MUTUAL` asks for one and validates it if
/// given; `SIMPLE` asks for none.
pub fn downstream(tls: &ServerTlsSettings, trust_domain: &str) -> DownstreamTlsContext {
    if tls.mode() == ServerTlsMode::IstioMutual {
        // The gateway's workload certificate; clients need a mesh
        // certificate, with one of `subjectAltNames` if given, else any
        // identity of this trust domain.
        let sans = if tls.subject_alt_names.is_empty() {
            vec![super::mtls::uri_matcher(MatchPattern::Prefix(format!("spiffe://{trust_domain}/")))]
        } else {
            san_matchers(&tls.subject_alt_names)
        };
        let mut ctx = super::mtls::downstream_with(sans, &ALPN_HTTP);
        if let Some(common) = ctx.common_tls_context.as_mut() {
            common.tls_params = tls_params(tls);
        }
        return ctx;
    }
    if let Some(name) = &tls.credential_name {
        return credential(tls, std::slice::from_ref(name));
    }
    if !tls.credential_names.is_empty() {
        return credential(tls, &tls.credential_names);
    }
    let pair = |cert: Option<&String>, key: Option<&String>| TlsCertificate {
        certificate_chain: cert.map(|c| file(c)),
        private_key: key.map(|k| file(k)),
        ..Default::default()
    };
    let tls_certificates = if tls.tls_certificates.is_empty() {
        vec![pair(tls.server_certificate.as_ref(), tls.private_key.as_ref())]
    } else {
        tls.tls_certificates.iter().map(|c| pair(c.server_certificate.as_ref(), c.private_key.as_ref())).collect()
    };
    let validation = tls.verifies_clients().then(|| CertificateValidationContext {
        trusted_ca: tls.ca_certificates.as_deref().map(file),
        crl: tls.ca_crl.as_deref().map(file),
        match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
        verify_certificate_spki: tls.verify_certificate_spki.clone(),
        verify_certificate_hash: tls.verify_certificate_hash.clone(),
        ..Default::default()
    });
    DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: tls_params(tls),
            tls_certificates,
            alpn_protocols: ALPN_HTTP.iter().map(|p| p.to_string()).collect(),
            validation_context_type: validation.map(ValidationContextType::ValidationContext),
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue { value: tls.mode() == ServerTlsMode::Mutual }),
        ..Default::default()
    }
}

/// An SDS secret on the proxy's ADS stream (`xds` serves it).
pub fn ads_secret(name: &str) -> SdsSecretConfig {
    let source = ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        // Zero: wait for the secret however long (as Istio does), so a
        // listener whose secret is missing keeps warming and never serves
        // without its certificate.
        initial_fetch_timeout: Some(envoy_types::pb::google::protobuf::Duration { seconds: 0, nanos: 0 }),
        ..Default::default()
    };
    SdsSecretConfig { name: name.into(), sds_config: Some(source) }
}

/// A server with `credentialName` (or `credentialNames`): the certificate
/// and key are the SDS secret of that name (one per name, an RSA and an
/// ECDSA one: Envoy presents the one the client's signature algorithms
/// allow); clients (MUTUAL, OPTIONAL_MUTUAL) are validated against the CA
/// bundle [`client_ca_secret`] names, with the server's SAN, SPKI and hash
/// checks as the default context. Only names: no certificate or key is in
/// the listener, so a rotation changes the secret, never the listener.
fn credential(tls: &ServerTlsSettings, names: &[String]) -> DownstreamTlsContext {
    let validation = tls.verifies_clients().then(|| {
        ValidationContextType::CombinedValidationContext(CombinedCertificateValidationContext {
            default_validation_context: Some(CertificateValidationContext {
                match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
                verify_certificate_spki: tls.verify_certificate_spki.clone(),
                verify_certificate_hash: tls.verify_certificate_hash.clone(),
                ..Default::default()
            }),
            validation_context_sds_secret_config: Some(ads_secret(&client_ca_secret(tls, names))),
            ..Default::default()
        })
    });
    DownstreamTlsContext {
        common_tls_context: Some(CommonTlsContext {
            tls_params: tls_params(tls),
            tls_certificate_sds_secret_configs: names.iter().map(|name| ads_secret(name)).collect(),
            alpn_protocols: ALPN_HTTP.iter().map(|p| p.to_string()).collect(),
            validation_context_type: validation,
            ..Default::default()
        }),
        require_client_certificate: Some(BoolValue { value: tls.mode() == ServerTlsMode::Mutual }),
        ..Default::default()
    }
}

/// The SDS name of the client CA bundle of a server with credentials, as
/// Istio picks it (`ApplyCredentialSDSToServerCommonTLSContext`):
/// `caCertCredentialName` if set, else the first credential's `-cacert`.
///
/// `xds::secrets` serves `X-cacert` from the Secret `X-cacert` if there is
/// one, else from Secret X's `cacert`/`ca.crt` (Istio's `GetCaCert`), so
/// `caCertCredentialName: X` is named `X-cacert` here (`X` itself if it
/// already ends so): the name `X` is Secret X's certificate and key, and
/// the Secret X holding only a CA has no such resource.
fn client_ca_secret(tls: &ServerTlsSettings, names: &[String]) -> String {
    match &tls.ca_cert_credential_name {
        Some(ca) if ca.ends_with(CA_SUFFIX) => ca.clone(),
        Some(ca) => format!("{ca}{CA_SUFFIX}"),
        None => format!("{}{CA_SUFFIX}", names.first().map(String::as_str).unwrap_or_default()),
    }
}

/// Protocol versions and cipher suites, if the server sets any (Envoy's
/// defaults otherwise: TLS 1.2 to 1.3, BoringSSL's ciphers).
fn tls_params(tls: &ServerTlsSettings) -> Option<TlsParameters> {
    let version = |v: Option<TlsProtocol>| {
        (match v {
            None | Some(TlsProtocol::TlsAuto) => tls_parameters::TlsProtocol::TlsAuto,
            Some(TlsProtocol::TlsV1_0) => tls_parameters::TlsProtocol::TlSv10,
            Some(TlsProtocol::TlsV1_1) => tls_parameters::TlsProtocol::TlSv11,
            Some(TlsProtocol::TlsV1_2) => tls_parameters::TlsProtocol::TlSv12,
            Some(TlsProtocol::TlsV1_3) => tls_parameters::TlsProtocol::TlSv13,
        }) as i32
    };
    let params = TlsParameters {
        tls_minimum_protocol_version: version(tls.min_protocol_version),
        tls_maximum_protocol_version: version(tls.max_protocol_version),
        cipher_suites: tls.cipher_suites().into_iter().map(String::from).collect(),
        ..Default::default()
    };
    (params != TlsParameters::default()).then_some(params)
}

/// A DestinationRule's TLS origination (`SIMPLE`, `MUTUAL`); `None` for
/// `DISABLE` (validation refuses `ISTIO_MUTUAL`). The server's certificate
/// is verified against `caCertificates` if given (with `subjectAltNames`
/// and `caCrl`, which validation allows only with a CA).
pub fn upstream(tls: &ClientTlsSettings) -> Option<UpstreamTlsContext> {
    let mode = tls.mode?;
    if !matches!(mode, ClientTlsMode::Simple | ClientTlsMode::Mutual) {
        return None;
    }
    let validation = tls.ca_certificates.as_deref().map(|ca| {
        ValidationContextType::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(file(ca)),
            crl: tls.ca_crl.as_deref().map(file),
            match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
            ..Default::default()
        })
    });
    let tls_certificates = match (&tls.client_certificate, &tls.private_key) {
        (Some(cert), Some(key)) if mode == ClientTlsMode::Mutual => {
            vec![TlsCertificate { certificate_chain: Some(file(cert)), private_key: Some(file(key)), ..Default::default() }]
        }
        _ => Vec::new(),
    };
    Some(UpstreamTlsContext {
        sni: tls.sni.clone().unwrap_or_default(),
        common_tls_context: Some(CommonTlsContext { tls_certificates, validation_context_type: validation, ..Default::default() }),
        ..Default::default()
    })
}

/// SIMPLE TLS verified against a CA bundle given inline (a
/// BackendTLSPolicy's, `backend_tls`), with the rule's SNI and names.
pub fn upstream_inline_ca(tls: &ClientTlsSettings, ca_pem: &str) -> UpstreamTlsContext {
    let validation = ValidationContextType::ValidationContext(CertificateValidationContext {
        trusted_ca: Some(DataSource { specifier: Some(Specifier::InlineString(ca_pem.to_string())), ..Default::default() }),
        match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
        ..Default::default()
    });
    UpstreamTlsContext {
        sni: tls.sni.clone().unwrap_or_default(),
        common_tls_context: Some(CommonTlsContext { validation_context_type: Some(validation), ..Default::default() }),
        ..Default::default()
    }
}

/// A DestinationRule's SIMPLE / MUTUAL with `credentialName`, as Istio
/// builds it for gateway proxies: the client certificate (MUTUAL) is the
/// SDS secret of that name, the server's is verified against
/// `<credentialName>-cacert` (`xds::secrets` serves it from the Secret of
/// that name, else the Secret's own CA), with `subjectAltNames` as the
/// default validation context. Only names: a rotation changes the secret,
/// never the cluster.
pub fn upstream_credential(tls: &ClientTlsSettings) -> Option<UpstreamTlsContext> {
    let (mode, name) = (tls.mode?, tls.credential_name.as_deref()?);
    if !matches!(mode, ClientTlsMode::Simple | ClientTlsMode::Mutual) {
        return None;
    }
    let ca = if name.ends_with(CA_SUFFIX) { name.to_string() } else { format!("{name}{CA_SUFFIX}") };
    let validation = ValidationContextType::CombinedValidationContext(CombinedCertificateValidationContext {
        default_validation_context: Some(CertificateValidationContext {
            match_typed_subject_alt_names: san_matchers(&tls.subject_alt_names),
            ..Default::default()
        }),
        validation_context_sds_secret_config: Some(ads_secret(&ca)),
        ..Default::default()
    });
    let certificates = if mode == ClientTlsMode::Mutual { vec![ads_secret(name)] } else { Vec::new() };
    Some(UpstreamTlsContext {
        sni: tls.sni.clone().unwrap_or_default(),
        common_tls_context: Some(CommonTlsContext {
            tls_certificate_sds_secret_configs: certificates,
            validation_context_type: Some(validation),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// Istio's `subjectAltNames` are untyped strings; Envoy's typed matchers
/// name the SAN type, told here by the form: an IP address, a URI
/// (`spiffe://...`: has a scheme), an email address, else a DNS name.
pub fn san_matchers(names: &[String]) -> Vec<SubjectAltNameMatcher> {
    names
        .iter()
        .map(|name| {
            let san_type = if name.parse::<std::net::IpAddr>().is_ok() {
                SanType::IpAddress
            } else if name.contains(':') {
                SanType::Uri
            } else if name.contains('@') {
                SanType::Email
            } else {
                SanType::Dns
            };
            SubjectAltNameMatcher {
                san_type: san_type as i32,
                matcher: Some(StringMatcher { match_pattern: Some(MatchPattern::Exact(name.clone())), ignore_case: false }),
                ..Default::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn san_types_follow_the_form() {
        let names = ["gw.example.com", "spiffe://example.org/ns/a/sa/b", "10.0.0.1", "::1", "ops@example.com"].map(String::from);
        let types: Vec<i32> = san_matchers(&names).iter().map(|m| m.san_type).collect();
        assert_eq!(types, [SanType::Dns, SanType::Uri, SanType::IpAddress, SanType::IpAddress, SanType::Email].map(|t| t as i32));
    }

    #[test]
    fn mutual_requires_and_validates_client_certificates() {
        let tls: ServerTlsSettings = serde_json::from_value(serde_json::json!({
            "mode": "MUTUAL", "serverCertificate": "/c.pem", "privateKey": "/k.pem", "caCertificates": "/ca.pem",
            "subjectAltNames": ["client.example.com"], "minProtocolVersion": "TLSV1_3", "cipherSuites": ["BOGUS", "AES128-SHA", "AES128-SHA"]
        }))
        .unwrap();
        let ctx = downstream(&tls, "cluster.local");
        assert_eq!(ctx.require_client_certificate, Some(BoolValue { value: true }));
        let common = ctx.common_tls_context.unwrap();
        let Some(ValidationContextType::ValidationContext(v)) = common.validation_context_type else { panic!("no validation context") };
        assert_eq!(v.trusted_ca, Some(file("/ca.pem")));
        assert_eq!(v.match_typed_subject_alt_names.len(), 1);
        let params = common.tls_params.unwrap();
        assert_eq!(params.tls_minimum_protocol_version, tls_parameters::TlsProtocol::TlSv13 as i32);
        assert_eq!(params.cipher_suites, ["AES128-SHA"]);

        let simple: ServerTlsSettings =
            serde_json::from_value(serde_json::json!({"mode": "SIMPLE", "serverCertificate": "/c.pem", "privateKey": "/k.pem"})).unwrap();
        let ctx = downstream(&simple, "cluster.local");
        assert_eq!(ctx.require_client_certificate, Some(BoolValue { value: false }));
        let common = ctx.common_tls_context.unwrap();
        assert!(common.validation_context_type.is_none() && common.tls_params.is_none());
    }
}
