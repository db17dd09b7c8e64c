//! What the xDS server serves: for one proxy at one store revision, every
//! resource by type and name. Built by a [`Generator`] (translation), sent by
//! the ADS server. The split keeps translation pure and the server generic.

use crate::model::proxy::ProxyIdentity;
use crate::state::State;
use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::TypedExtensionConfig;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::Secret;
use envoy_types::pb::google::protobuf::Any;
use prost::{Message, Name};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The resource types, in make-before-break push order: clusters before
/// the endpoints that fill them, secrets before the listeners that name
/// them, listeners before the routes they name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ResourceType {
    Cluster,
    Endpoint,
    Listener,
    Route,
    /// SDS on the ADS stream: a gateway's `credentialName` certificates.
    /// Added to a config by the xDS layer (`xds::secrets`), never by
    /// translation, and never shown in debug output.
    Secret,
    /// Istio's NDS (`istio.networking.nds.v1.NameTable`): the names a
    /// captured proxy's agent answers in DNS (`translate::dns`). Only the
    /// agent's DNS stream subscribes to it; Envoy never does.
    NameTable,
    /// ECDS (`envoy.config.core.v3.TypedExtensionConfig`): the filter
    /// configs EnvoyFilter `EXTENSION_CONFIG` ADD patches define, asked for
    /// by name by filters with `config_discovery` (`translate::envoyfilter`).
    ExtensionConfig,
}

impl ResourceType {
    /// Extension configs before the listeners whose filters name them.
    pub const PUSH_ORDER: [ResourceType; 7] = [
        ResourceType::Cluster,
        ResourceType::Endpoint,
        ResourceType::Secret,
        ResourceType::ExtensionConfig,
        ResourceType::Listener,
        ResourceType::Route,
        ResourceType::NameTable,
    ];

    pub fn type_url(self) -> String {
        match self {
            ResourceType::Cluster => Cluster::type_url(),
            ResourceType::Endpoint => ClusterLoadAssignment::type_url(),
            ResourceType::Listener => Listener::type_url(),
            ResourceType::Route => RouteConfiguration::type_url(),
            ResourceType::Secret => Secret::type_url(),
            ResourceType::NameTable => <super::dns::NameTable as prost::Name>::type_url(),
            ResourceType::ExtensionConfig => TypedExtensionConfig::type_url(),
        }
    }

    pub fn from_type_url(url: &str) -> Option<ResourceType> {
        Self::PUSH_ORDER.into_iter().find(|t| t.type_url() == url)
    }

    /// LDS and CDS may be requested with no names (wildcard); EDS, RDS and
    /// SDS (and ECDS) are always requested by name.
    pub fn wildcard_allowed(self) -> bool {
        matches!(self, ResourceType::Cluster | ResourceType::Listener | ResourceType::NameTable)
    }

    pub fn short(self) -> &'static str {
        match self {
            ResourceType::Cluster => "CDS",
            ResourceType::Endpoint => "EDS",
            ResourceType::Listener => "LDS",
            ResourceType::Route => "RDS",
            ResourceType::Secret => "SDS",
            ResourceType::NameTable => "NDS",
            ResourceType::ExtensionConfig => "ECDS",
        }
    }
}

/// One named, encoded resource. `version` is a hash of the encoded bytes, so
/// it is identical on every replica for identical content, and an unchanged
/// resource keeps its version across revisions (delta xDS sends nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct XdsResource {
    /// Shared: every stream that tracks what its client has (delta's known
    /// versions) holds this name, not a copy of it.
    pub name: Arc<str>,
    pub version: String,
    pub any: Any,
}

impl XdsResource {
    pub fn new<M: Message + Name>(name: impl Into<String>, message: &M) -> XdsResource {
        Self::from_encoded::<M>(name, message.encode_to_vec())
    }

    /// From bytes already encoded as an `M` (by a deterministic encoder).
    pub fn from_encoded<M: Name>(name: impl Into<String>, value: Vec<u8>) -> XdsResource {
        let version = format!("{:016x}", fnv1a(&value));
        Self::with_version::<M>(name, value, version)
    }

    /// With a version the caller derived from the content (it must change
    /// whenever the bytes do, and be the same on every replica).
    pub fn with_version<M: Name>(name: impl Into<String>, value: Vec<u8>, version: String) -> XdsResource {
        XdsResource { name: Arc::from(name.into()), version, any: Any { type_url: M::type_url(), value } }
    }
}

/// FNV-1a, 64 bit: stable across builds and platforms (unlike std's hasher).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub type ResourceMap = BTreeMap<String, Arc<XdsResource>>;

/// Everything one proxy should have at one store revision.
#[derive(Debug, Clone, Default)]
pub struct ProxyConfig {
    pub revision: u64,
    /// Behind `Arc`s so that an incremental translation shares every type
    /// it did not change with the previous config.
    pub resources: BTreeMap<ResourceType, Arc<ResourceMap>>,
}

impl ProxyConfig {
    pub fn of(&self, t: ResourceType) -> Option<&ResourceMap> {
        self.resources.get(&t).map(|m| m.as_ref())
    }

    pub fn insert(&mut self, t: ResourceType, r: XdsResource) {
        self.insert_shared(t, Arc::new(r));
    }

    /// Insert a resource shared with other configs (a translation cache).
    pub fn insert_shared(&mut self, t: ResourceType, r: Arc<XdsResource>) {
        Arc::make_mut(self.resources.entry(t).or_default()).insert(r.name.to_string(), r);
    }
}

/// Translation, as the xDS server sees it: a pure function of one proxy and
/// one store state (a revision and its objects; no raft log id).
pub trait Generator: Send + Sync + 'static {
    fn generate(&self, proxy: &ProxyIdentity, state: &State) -> Result<ProxyConfig, String>;

    /// A proxy's stream ended: drop whatever was kept for it.
    fn forget(&self, _proxy_id: &str) {}

    /// A scratch copy for previews (`apply --dry-run`): it starts from
    /// what this one keeps per proxy (so a hypothetical revision is
    /// translated incrementally from each proxy's served config), and
    /// nothing done with it reaches this one. `None`: no such copy.
    fn fork(&self) -> Option<Box<dyn Generator>> {
        None
    }

    /// Where the generator reads the key sets fetched from RequestAuthentication
    /// `jwksUri`s, if it uses them: the replica runs a fetcher writing there
    /// (the root's `jwks` fetcher) and has the streams regenerate when they change.
    fn key_cell(&self) -> Option<std::sync::Arc<crate::jwt::KeyCell>> {
        None
    }

    /// The mesh it builds from `state` (once per revision, shared by every
    /// proxy), if it builds one: the Gateway API status writer reads its
    /// status there (the root's `gateway_status`) instead of building a
    /// second mesh of its own. `None`: no such mesh.
    fn mesh(&self, _state: &State) -> Option<std::sync::Arc<crate::mesh::Mesh>> {
        None
    }
}
