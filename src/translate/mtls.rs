//! Mutual TLS between Envoys with the workloads' mesh certificates.
//!
//! Certificates never appear in the config: every context names the SDS
//! secrets of `lodestar agent` on the proxy's host (`default`: the
//! workload's certificate and key; `ROOTCA`: the mesh root), fetched over
//! the bootstrap's static cluster `sds-grpc`. So only a proxy that says it
//! has that cluster (`ProxyIdentity::sds`) gets any of this; a rotation
//! changes a secret, never a listener or a cluster.
//!
//! - Server side ([`inbound_mode`], [`downstream`]): the PeerAuthentication
//!   mode of an inbound port decides its filter chains (see
//!   `inbound::sidecar_ingress`).
//! - Client side ([`upstream`], [`UpstreamMtls`]): DestinationRule
//!   `ISTIO_MUTUAL`, or auto-mTLS when the rule sets no TLS: mutual TLS to
//!   the endpoints that have an identity (endpoint metadata `tlsMode:
//!   istio`, matched by the cluster's `transport_socket_matches`),
//!   plaintext to the others, in one cluster, as Istio does.

use crate::mesh::{Instance, Mesh, Service};
use crate::model::istio::peer_authentication::{compose, Candidate, EffectiveMtls, MtlsMode};
use crate::model::proxy::ProxyIdentity;
use envoy_types::pb::envoy::config::core::v3::{
    api_config_source::ApiType, config_source::ConfigSourceSpecifier, grpc_service::EnvoyGrpc, grpc_service::TargetSpecifier, ApiConfigSource, ApiVersion,
    ConfigSource, GrpcService, Metadata,
};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    common_tls_context::{CombinedCertificateValidationContext, ValidationContextType},
    subject_alt_name_matcher::SanType,
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, SubjectAltNameMatcher, UpstreamTlsContext,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{string_matcher::MatchPattern, StringMatcher};
use envoy_types::pb::google::protobuf::{value::Kind as ValueKind, BoolValue, Struct, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The SDS secret names and cluster of `lodestar agent` (`agent::sds`).
pub const CERT_SECRET: &str = "default";
pub const ROOT_SECRET: &str = "ROOTCA";
pub const SDS_CLUSTER: &str = "sds-grpc";

/// The ALPN a mesh client offers, and what a PERMISSIVE inbound port's
/// mutual TLS chain matches (Istio's in-mesh protocols), so TLS that an
/// application speaks itself still reaches the plaintext chain.
pub const MESH_ALPN: [&str; 5] = ["istio", "istio-peer-exchange", "istio-http/1.0", "istio-http/1.1", "istio-h2"];

/// The endpoint metadata namespace `transport_socket_matches` read.
pub const TRANSPORT_SOCKET_MATCH: &str = "envoy.transport_socket_match";

fn sds(name: &str) -> SdsSecretConfig {
    let source = ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::ApiConfigSource(ApiConfigSource {
            api_type: ApiType::Grpc as i32,
            transport_api_version: ApiVersion::V3 as i32,
            grpc_services: vec![GrpcService {
                target_specifier: Some(TargetSpecifier::EnvoyGrpc(EnvoyGrpc { cluster_name: SDS_CLUSTER.into(), ..Default::default() })),
                ..Default::default()
            }],
            ..Default::default()
        })),
        ..Default::default()
    };
    SdsSecretConfig { name: name.into(), sds_config: Some(source) }
}

pub(super) fn uri_matcher(pattern: MatchPattern) -> SubjectAltNameMatcher {
    SubjectAltNameMatcher {
        san_type: SanType::Uri as i32,
        matcher: Some(StringMatcher { match_pattern: Some(pattern), ignore_case: false }),
        ..Default::default()
    }
}

/// The workload certificate, and peers validated against the mesh root
/// with `sans` (URI SAN matchers) required of them.
fn common(sans: Vec<SubjectAltNameMatcher>, alpn: &[&str]) -> CommonTlsContext {
    CommonTlsContext {
        tls_certificate_sds_secret_configs: vec![sds(CERT_SECRET)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(CombinedCertificateValidationContext {
            default_validation_context: Some(CertificateValidationContext { match_typed_subject_alt_names: sans, ..Default::default() }),
            validation_context_sds_secret_config: Some(sds(ROOT_SECRET)),
            ..Default::default()
        })),
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// An inbound port's mutual TLS: the workload certificate, a client
/// certificate required, issued by the mesh root to a workload of this
/// trust domain (which identity is the authorization policy's business).
/// Workloads only: the prefix is `spiffe://TD/ns/`, so a host agent's
/// certificate (`spiffe://TD/lodestar/host/NAME`, `ca::HostId`), which the
/// same root signs, is refused in the handshake and never reaches an
/// authorization policy (where `principals: ["*"]` would accept it).
pub fn downstream(trust_domain: &str) -> DownstreamTlsContext {
    downstream_with(vec![uri_matcher(MatchPattern::Prefix(format!("spiffe://{trust_domain}/ns/")))], &[])
}

/// The workload certificate, a client certificate required and checked
/// against the mesh root and `sans`, offering `alpn`: a sidecar's inbound
/// port, or a gateway server's ISTIO_MUTUAL.
pub fn downstream_with(sans: Vec<SubjectAltNameMatcher>, alpn: &[&str]) -> DownstreamTlsContext {
    DownstreamTlsContext { common_tls_context: Some(common(sans, alpn)), require_client_certificate: Some(BoolValue { value: true }), ..Default::default() }
}

/// Mutual TLS to a mesh endpoint: `sni`, and one of `sans` (exact URI SANs,
/// the destination's SPIFFE ids) required of the server's certificate.
pub fn upstream(sni: &str, sans: &[String]) -> UpstreamTlsContext {
    let matchers = sans.iter().map(|s| uri_matcher(MatchPattern::Exact(s.clone()))).collect();
    UpstreamTlsContext { sni: sni.to_string(), common_tls_context: Some(common(matchers, &MESH_ALPN[..1])), ..Default::default() }
}

/// Istio's SNI for mesh mTLS: `outbound_.PORT_.SUBSET_.HOST`.
pub fn mesh_sni(port: u32, subset: &str, host: &str) -> String {
    format!("outbound_.{port}_.{subset}_.{host}")
}

pub fn spiffe_id(trust_domain: &str, namespace: &str, service_account: &str) -> String {
    format!("spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}")
}

/// The SPIFFE ids of a service's instances that have one, sorted.
pub fn service_identities(svc: &Service, trust_domain: &str) -> Vec<String> {
    let ids: BTreeSet<String> = svc.instances.iter().filter_map(|i| i.service_account.as_deref().map(|sa| spiffe_id(trust_domain, &i.namespace, sa))).collect();
    ids.into_iter().collect()
}

/// The effective PeerAuthentication of a workload in `namespace` with
/// `labels` (Istio's scoping, then `compose`).
pub fn effective(mesh: &Mesh, namespace: &str, labels: &BTreeMap<String, String>) -> EffectiveMtls {
    let root = &mesh.config.root_namespace;
    let candidates: Vec<Candidate<'_>> = mesh
        .peer_authentications
        .iter()
        .filter(|p| crate::model::istio::common::policy_applies(&p.key.namespace, p.spec.match_labels(), root, namespace, labels))
        .map(|p| Candidate { namespace: &p.key.namespace, created: (p.create_revision, p.key.name.as_str()), spec: &p.spec })
        .collect();
    compose(root, &candidates)
}

/// What an inbound port of `proxy` serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inbound {
    /// Plaintext only (DISABLE, or PERMISSIVE on a proxy without SDS).
    Plaintext,
    /// Mutual TLS and plaintext, told apart by `tls_inspector`.
    Permissive,
    /// Mutual TLS only.
    Strict,
    /// STRICT on a proxy without a workload identity: nothing can be
    /// served as asked, so the port gets no listener (closed, never open
    /// in plaintext).
    Refused,
}

pub fn inbound_mode(mesh: &Mesh, proxy: &ProxyIdentity, port: u32) -> Inbound {
    match (effective(mesh, &proxy.namespace, &proxy.labels).for_port(port), proxy.sds) {
        (MtlsMode::Strict, true) => Inbound::Strict,
        (MtlsMode::Strict, false) => Inbound::Refused,
        (MtlsMode::Disable, _) | (_, false) => Inbound::Plaintext,
        (_, true) => Inbound::Permissive,
    }
}

/// How a client proxy's cluster reaches a service's endpoints.
pub struct UpstreamMtls<'a> {
    pub mesh: &'a Mesh,
    /// The client has the SDS secrets.
    pub client_sds: bool,
    /// The client is a gateway proxy: it is served its namespace's Secrets
    /// (`xds::secrets`), so a DestinationRule's `credentialName` applies.
    pub gateway: bool,
    /// The client's traffic is captured: a `resolution: NONE` service's
    /// cluster sends to the original destination.
    pub capture: bool,
}

impl UpstreamMtls<'_> {
    /// Auto-mTLS for one endpoint: it has an identity, and its own inbound
    /// policy on that port is not DISABLE (a DISABLE server takes only
    /// plaintext, so Istio's clients send it plaintext).
    pub fn endpoint_is_mesh(&self, i: &Instance, port: u32) -> bool {
        self.client_sds && i.service_account.is_some() && effective(self.mesh, &i.namespace, &i.labels).for_port(port) != MtlsMode::Disable
    }

    /// A fingerprint of what [`Self::endpoint_is_mesh`] reads besides the
    /// service: whether the client has SDS and the PeerAuthentications.
    pub fn fingerprint(&self) -> u64 {
        if !self.client_sds {
            return 0;
        }
        let mut text = String::new();
        for p in &self.mesh.peer_authentications {
            text.push_str(&format!("{}|{}|{};", p.key, p.create_revision, p.mod_revision));
        }
        crate::resources::fnv1a(text.as_bytes()) | 1
    }
}

/// `tlsMode: istio`: what marks a mesh endpoint, and what the match reads.
fn tls_mode_istio() -> Struct {
    Struct { fields: [("tlsMode".to_string(), Value { kind: Some(ValueKind::StringValue("istio".into())) })].into_iter().collect() }
}

/// The metadata that marks an endpoint for the mutual TLS transport socket.
pub fn mesh_endpoint_metadata() -> Metadata {
    Metadata { filter_metadata: [(TRANSPORT_SOCKET_MATCH.to_string(), tls_mode_istio())].into_iter().collect(), ..Default::default() }
}

/// The `transport_socket_matches` entry for mesh endpoints.
pub fn mesh_socket_match(sni: &str, sans: &[String]) -> envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch {
    envoy_types::pb::envoy::config::cluster::v3::cluster::TransportSocketMatch {
        name: "tlsMode-istio".into(),
        r#match: Some(tls_mode_istio()),
        transport_socket: Some(super::util::transport_socket(&upstream(sni, sans))),
    }
}
