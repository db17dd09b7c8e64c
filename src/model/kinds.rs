//! The kinds the store accepts, and the kubectl-style names that select them.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Every kind the store holds. The order of variants is part of the persisted
/// format (see `store::codec`): append new kinds at the end, never reorder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Kind {
    VirtualService,
    DestinationRule,
    ServiceEntry,
    Gateway,
    Sidecar,
    WorkloadEntry,
    /// Registry: a service declared explicitly (hostname, ports, protocols).
    Service,
    /// Registry: one endpoint of a service (address, ports, labels, locality,
    /// weight, health check, health status).
    Instance,
    /// Registry: a lease that owns instances and expires without keepalives.
    Lease,
    /// ACL: rules granting verbs over kinds and namespaces (`model::acl`).
    Policy,
    /// ACL: a named set of policies, bound to tokens and to client
    /// certificate identities.
    Role,
    /// ACL: a credential's accessor id, policies, roles, expiry and the
    /// SHA-256 of its secret. Created only by the token API.
    Token,
    /// security.istio.io: who may call a workload (RBAC on its inbound).
    AuthorizationPolicy,
    /// security.istio.io: which JWTs a workload accepts (`jwt_authn`).
    RequestAuthentication,
    /// security.istio.io: whether a workload's inbound requires mutual TLS.
    PeerAuthentication,
    /// networking.istio.io: the template of instances that register
    /// themselves (`lodestar agent`).
    WorkloadGroup,
    /// core/v1 `Secret` (Kubernetes' shape): a TLS certificate and key (and
    /// CA) for Gateway `credentialName`. The key is stored sealed
    /// (the root's `secrets`), never in the clear (`model::secret`).
    Secret,
    /// ACL: the mesh CA's deny list, one entry per object: a SPIFFE id
    /// (its certificates signed before a time, or all) or a certificate
    /// serial (`model::acl::RevocationSpec`).
    CertificateRevocation,
    /// gateway.networking.k8s.io (`model::gateway_api`): who serves the
    /// Gateways that name it.
    GatewayClass,
    /// gateway.networking.k8s.io Gateway: listeners of an ingress proxy.
    /// Its name clashes with Istio's Gateway: on the command line and in
    /// URLs it is `gtw` or `gateways.gateway.networking.k8s.io`.
    KubeGateway,
    HttpRoute,
    ReferenceGrant,
    /// core/v1 `Namespace`: only its labels matter (Gateway listeners'
    /// `allowedRoutes.namespaces.selector`). Cluster-scoped: only who may
    /// write the cluster namespace labels namespaces.
    Namespace,
    /// gateway.networking.k8s.io GRPCRoute, TCPRoute and TLSRoute.
    GrpcRoute,
    TcpRoute,
    TlsRoute,
    /// Istio's mesh config (`model::istio::mesh_config`): one per mesh,
    /// named `default`, cluster-scoped.
    MeshConfig,
    /// telemetry.istio.io: access logging and tracing.
    Telemetry,
    /// networking.istio.io/v1alpha3: patches to the generated Envoy config
    /// (`model::istio::envoy_filter`, `translate::envoyfilter`).
    EnvoyFilter,
    /// gateway.networking.k8s.io BackendTLSPolicy: TLS from proxies to a
    /// Service's (or ServiceEntry's) ports, validated against a CA.
    BackendTlsPolicy,
    /// gateway.networking.k8s.io ListenerSet (GEP-1713): listeners added to
    /// a Gateway that allows them (`spec.allowedListeners`).
    ListenerSet,
}

pub const ISTIO_GROUP: &str = "networking.istio.io";
pub const SECURITY_GROUP: &str = "security.istio.io";
pub const REGISTRY_GROUP: &str = "registry.lodestar.io";
pub const ACL_GROUP: &str = "acl.lodestar.io";
/// Kubernetes' core group: its apiVersion is the bare version (`v1`).
pub const CORE_GROUP: &str = "";
pub const GATEWAY_API_GROUP: &str = "gateway.networking.k8s.io";
pub const TELEMETRY_GROUP: &str = "telemetry.istio.io";
/// Lodestar's own group for Istio's mesh config (a ConfigMap body in Istio).
pub const MESH_GROUP: &str = "mesh.lodestar.io";

/// Where cluster-scoped kinds (the ACL kinds) are stored: every key has a
/// namespace, and theirs is always this one. Input may leave it out.
pub const CLUSTER_NAMESPACE: &str = "lodestar-system";

struct KindInfo {
    kind: Kind,
    name: &'static str,
    plural: &'static str,
    short: &'static [&'static str],
    group: &'static str,
    versions: &'static [&'static str],
}

const ISTIO_VERSIONS: &[&str] = &["v1alpha3", "v1beta1", "v1"];
const SECURITY_VERSIONS: &[&str] = &["v1beta1", "v1"];
const REGISTRY_VERSIONS: &[&str] = &["v1"];
const ACL_VERSIONS: &[&str] = &["v1"];
const CORE_VERSIONS: &[&str] = &["v1"];
/// The standard channel serves v1 and still v1beta1 for these kinds.
const GATEWAY_API_VERSIONS: &[&str] = &["v1beta1", "v1"];
/// GRPCRoute was v1alpha2 before it reached v1.
const GRPC_ROUTE_VERSIONS: &[&str] = &["v1alpha2", "v1"];
/// TCPRoute and TLSRoute are in the experimental channel.
const L4_ROUTE_VERSIONS: &[&str] = &["v1alpha2", "v1alpha3"];
/// BackendTLSPolicy reached v1 in the standard channel; v1alpha3 has the
/// same fields.
const BACKEND_TLS_VERSIONS: &[&str] = &["v1alpha3", "v1"];
const TELEMETRY_VERSIONS: &[&str] = &["v1alpha1", "v1"];
const MESH_VERSIONS: &[&str] = &["v1"];

const KINDS: &[KindInfo] = &[
    KindInfo { kind: Kind::VirtualService, name: "VirtualService", plural: "virtualservices", short: &["vs"], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::DestinationRule, name: "DestinationRule", plural: "destinationrules", short: &["dr"], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::ServiceEntry, name: "ServiceEntry", plural: "serviceentries", short: &["se"], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::Gateway, name: "Gateway", plural: "gateways", short: &["gw"], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::Sidecar, name: "Sidecar", plural: "sidecars", short: &[], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::WorkloadEntry, name: "WorkloadEntry", plural: "workloadentries", short: &["we"], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::Service, name: "Service", plural: "services", short: &["svc"], group: REGISTRY_GROUP, versions: REGISTRY_VERSIONS },
    KindInfo { kind: Kind::Instance, name: "Instance", plural: "instances", short: &["inst"], group: REGISTRY_GROUP, versions: REGISTRY_VERSIONS },
    KindInfo { kind: Kind::Lease, name: "Lease", plural: "leases", short: &[], group: REGISTRY_GROUP, versions: REGISTRY_VERSIONS },
    KindInfo { kind: Kind::Policy, name: "Policy", plural: "policies", short: &[], group: ACL_GROUP, versions: ACL_VERSIONS },
    KindInfo { kind: Kind::Role, name: "Role", plural: "roles", short: &[], group: ACL_GROUP, versions: ACL_VERSIONS },
    KindInfo { kind: Kind::Token, name: "Token", plural: "tokens", short: &[], group: ACL_GROUP, versions: ACL_VERSIONS },
    KindInfo {
        kind: Kind::AuthorizationPolicy,
        name: "AuthorizationPolicy",
        plural: "authorizationpolicies",
        short: &["ap"],
        group: SECURITY_GROUP,
        versions: SECURITY_VERSIONS,
    },
    KindInfo {
        kind: Kind::RequestAuthentication,
        name: "RequestAuthentication",
        plural: "requestauthentications",
        short: &["ra"],
        group: SECURITY_GROUP,
        versions: SECURITY_VERSIONS,
    },
    KindInfo {
        kind: Kind::PeerAuthentication,
        name: "PeerAuthentication",
        plural: "peerauthentications",
        short: &["pa"],
        group: SECURITY_GROUP,
        versions: SECURITY_VERSIONS,
    },
    KindInfo { kind: Kind::WorkloadGroup, name: "WorkloadGroup", plural: "workloadgroups", short: &["wg"], group: ISTIO_GROUP, versions: ISTIO_VERSIONS },
    KindInfo { kind: Kind::Secret, name: "Secret", plural: "secrets", short: &[], group: CORE_GROUP, versions: CORE_VERSIONS },
    KindInfo {
        kind: Kind::CertificateRevocation,
        name: "CertificateRevocation",
        plural: "certificaterevocations",
        short: &["certrevocation"],
        group: ACL_GROUP,
        versions: ACL_VERSIONS,
    },
    KindInfo {
        kind: Kind::GatewayClass,
        name: "GatewayClass",
        plural: "gatewayclasses",
        short: &["gc"],
        group: GATEWAY_API_GROUP,
        versions: GATEWAY_API_VERSIONS,
    },
    KindInfo {
        kind: Kind::KubeGateway,
        name: "Gateway",
        plural: "gateways.gateway.networking.k8s.io",
        short: &["gtw"],
        group: GATEWAY_API_GROUP,
        versions: GATEWAY_API_VERSIONS,
    },
    KindInfo { kind: Kind::HttpRoute, name: "HTTPRoute", plural: "httproutes", short: &[], group: GATEWAY_API_GROUP, versions: GATEWAY_API_VERSIONS },
    KindInfo {
        kind: Kind::ReferenceGrant,
        name: "ReferenceGrant",
        plural: "referencegrants",
        short: &["refgrant"],
        group: GATEWAY_API_GROUP,
        versions: GATEWAY_API_VERSIONS,
    },
    KindInfo { kind: Kind::Namespace, name: "Namespace", plural: "namespaces", short: &["ns"], group: CORE_GROUP, versions: CORE_VERSIONS },
    KindInfo { kind: Kind::GrpcRoute, name: "GRPCRoute", plural: "grpcroutes", short: &[], group: GATEWAY_API_GROUP, versions: GRPC_ROUTE_VERSIONS },
    KindInfo { kind: Kind::TcpRoute, name: "TCPRoute", plural: "tcproutes", short: &[], group: GATEWAY_API_GROUP, versions: L4_ROUTE_VERSIONS },
    KindInfo { kind: Kind::TlsRoute, name: "TLSRoute", plural: "tlsroutes", short: &[], group: GATEWAY_API_GROUP, versions: L4_ROUTE_VERSIONS },
    KindInfo { kind: Kind::MeshConfig, name: "MeshConfig", plural: "meshconfigs", short: &["mc"], group: MESH_GROUP, versions: MESH_VERSIONS },
    KindInfo { kind: Kind::Telemetry, name: "Telemetry", plural: "telemetries", short: &["telemetry"], group: TELEMETRY_GROUP, versions: TELEMETRY_VERSIONS },
    // Istio serves EnvoyFilter as v1alpha3 only.
    KindInfo { kind: Kind::EnvoyFilter, name: "EnvoyFilter", plural: "envoyfilters", short: &[], group: ISTIO_GROUP, versions: &["v1alpha3"] },
    KindInfo {
        kind: Kind::BackendTlsPolicy,
        name: "BackendTLSPolicy",
        plural: "backendtlspolicies",
        short: &["btlspolicy"],
        group: GATEWAY_API_GROUP,
        versions: BACKEND_TLS_VERSIONS,
    },
    // Standard channel since v1.5.0 (the experimental XListenerSet is
    // another group).
    KindInfo { kind: Kind::ListenerSet, name: "ListenerSet", plural: "listenersets", short: &["lset"], group: GATEWAY_API_GROUP, versions: &["v1"] },
];

impl Kind {
    pub const ALL: [Kind; 31] = [
        Kind::VirtualService,
        Kind::DestinationRule,
        Kind::ServiceEntry,
        Kind::Gateway,
        Kind::Sidecar,
        Kind::WorkloadEntry,
        Kind::Service,
        Kind::Instance,
        Kind::Lease,
        Kind::Policy,
        Kind::Role,
        Kind::Token,
        Kind::AuthorizationPolicy,
        Kind::RequestAuthentication,
        Kind::PeerAuthentication,
        Kind::WorkloadGroup,
        Kind::Secret,
        Kind::CertificateRevocation,
        Kind::GatewayClass,
        Kind::KubeGateway,
        Kind::HttpRoute,
        Kind::ReferenceGrant,
        Kind::Namespace,
        Kind::GrpcRoute,
        Kind::TcpRoute,
        Kind::TlsRoute,
        Kind::MeshConfig,
        Kind::Telemetry,
        Kind::EnvoyFilter,
        Kind::BackendTlsPolicy,
        Kind::ListenerSet,
    ];

    fn info(self) -> &'static KindInfo {
        // KINDS lists every variant exactly once (checked by a test).
        KINDS.iter().find(|k| k.kind == self).expect("every kind is in KINDS")
    }

    /// The `kind:` value as written in YAML, e.g. `VirtualService`.
    pub fn name(self) -> &'static str {
        self.info().name
    }
    pub fn plural(self) -> &'static str {
        self.info().plural
    }
    pub fn group(self) -> &'static str {
        self.info().group
    }
    pub fn versions(self) -> &'static [&'static str] {
        self.info().versions
    }
    /// The apiVersion the store writes back on output when none is known,
    /// e.g. `networking.istio.io/v1`.
    pub fn default_api_version(self) -> String {
        let info = self.info();
        let version = info.versions[info.versions.len() - 1];
        if info.group.is_empty() {
            return version.to_string();
        }
        format!("{}/{}", info.group, version)
    }

    /// Exact `kind:` field value (case-sensitive, as Kubernetes does).
    /// `Gateway` is Istio's here; [`Kind::from_kind_and_api_version`]
    /// tells the two Gateways apart.
    pub fn from_kind_field(s: &str) -> Option<Kind> {
        KINDS.iter().find(|k| k.name == s).map(|k| k.kind)
    }

    /// The kind a document's `kind:` and `apiVersion:` name: the one of
    /// that name in the apiVersion's group, else the first of that name.
    pub fn from_kind_and_api_version(s: &str, api_version: Option<&str>) -> Option<Kind> {
        let group = api_version.and_then(|v| v.split_once('/')).map(|(g, _)| g);
        KINDS.iter().find(|k| k.name == s && group.is_some_and(|g| g == k.group)).or_else(|| KINDS.iter().find(|k| k.name == s)).map(|k| k.kind)
    }

    /// Gateway API kinds (`gateway.networking.k8s.io`).
    pub fn is_gateway_api(self) -> bool {
        self.group() == GATEWAY_API_GROUP
    }

    /// kubectl-style lookup: singular, plural or short name, any case.
    pub fn from_cli_name(s: &str) -> Option<Kind> {
        let lower = s.to_ascii_lowercase();
        KINDS
            .iter()
            .find(|k| {
                k.name.eq_ignore_ascii_case(&lower)
                    || k.plural == lower
                    || k.short.contains(&lower.as_str())
                    // `virtualservices.networking.istio.io`, as kubectl accepts.
                    || (!k.group.is_empty() && lower.strip_suffix(k.group).and_then(|r| r.strip_suffix('.')).is_some_and(|r| r == k.plural || r == k.name.to_ascii_lowercase()))
            })
            .map(|k| k.kind)
    }

    /// Istio's own kinds: `networking.istio.io`, `security.istio.io` and
    /// `telemetry.istio.io`.
    pub fn is_istio(self) -> bool {
        self.group() == ISTIO_GROUP || self.group() == SECURITY_GROUP || self.group() == TELEMETRY_GROUP
    }

    /// Tokens, policies, roles and certificate revocations: what
    /// authorization reads. They never
    /// affect translation, and every verb on them needs `admin` on the
    /// cluster (see `auth`).
    pub fn is_acl(self) -> bool {
        self.group() == ACL_GROUP
    }

    /// Kinds whose objects all live in [`CLUSTER_NAMESPACE`]: the ACL
    /// kinds, GatewayClasses and Namespaces (cluster-scoped in Kubernetes).
    pub fn is_cluster_scoped(self) -> bool {
        self.is_acl() || matches!(self, Kind::GatewayClass | Kind::Namespace | Kind::MeshConfig)
    }

    /// Where an object of this kind lives when the input names no namespace.
    pub fn default_namespace(self) -> &'static str {
        if self.is_cluster_scoped() {
            CLUSTER_NAMESPACE
        } else {
            super::DEFAULT_NAMESPACE
        }
    }

    /// Names accepted on the command line, for error messages.
    pub fn cli_names_help() -> String {
        KINDS
            .iter()
            .map(|k| {
                let mut names = vec![k.name.to_ascii_lowercase(), k.plural.to_string()];
                names.extend(k.short.iter().map(|s| s.to_string()));
                names.join("|")
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_listed_once() {
        for k in Kind::ALL {
            assert_eq!(KINDS.iter().filter(|i| i.kind == k).count(), 1, "{k:?}");
        }
        assert_eq!(KINDS.len(), Kind::ALL.len());
    }

    #[test]
    fn cli_names() {
        for (name, kind) in [
            ("vs", Kind::VirtualService),
            ("VirtualService", Kind::VirtualService),
            ("virtualservices", Kind::VirtualService),
            ("VIRTUALSERVICE", Kind::VirtualService),
            ("virtualservices.networking.istio.io", Kind::VirtualService),
            ("dr", Kind::DestinationRule),
            ("se", Kind::ServiceEntry),
            ("gw", Kind::Gateway),
            ("sidecar", Kind::Sidecar),
            ("we", Kind::WorkloadEntry),
            ("svc", Kind::Service),
            ("instances", Kind::Instance),
            ("policy", Kind::Policy),
            ("roles", Kind::Role),
            ("Token", Kind::Token),
            ("secrets", Kind::Secret),
            ("Secret", Kind::Secret),
            ("certificaterevocations", Kind::CertificateRevocation),
            ("gtw", Kind::KubeGateway),
            ("gateways.gateway.networking.k8s.io", Kind::KubeGateway),
            ("gateway.gateway.networking.k8s.io", Kind::KubeGateway),
            ("httproutes", Kind::HttpRoute),
            ("HTTPRoute", Kind::HttpRoute),
            ("referencegrants", Kind::ReferenceGrant),
            ("gatewayclass", Kind::GatewayClass),
            ("lset", Kind::ListenerSet),
            ("listenerset", Kind::ListenerSet),
        ] {
            assert_eq!(Kind::from_cli_name(name), Some(kind), "{name}");
        }
        assert_eq!(Kind::from_cli_name("pods"), None);
        assert_eq!(Kind::from_kind_field("virtualservice"), None);
        assert_eq!(Kind::from_cli_name("secrets."), None);
        assert_eq!(Kind::Secret.default_api_version(), "v1");
        assert_eq!(Kind::from_cli_name("gateways"), Some(Kind::Gateway));
        assert_eq!(Kind::from_kind_and_api_version("Gateway", Some("gateway.networking.k8s.io/v1")), Some(Kind::KubeGateway));
        assert_eq!(Kind::from_kind_and_api_version("Gateway", Some("networking.istio.io/v1")), Some(Kind::Gateway));
    }
}
