//! The name table a captured proxy's agent answers DNS from: Istio's NDS
//! resource (`istio.networking.nds.v1.NameTable`), built by translation
//! (`lodestar_translate::dns`) and read by the agent's DNS proxy. A wire
//! type, so both sides share it without the agent knowing translation.

use std::collections::BTreeMap;

/// Istio's `istio.networking.nds.v1.NameTable`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NameTable {
    /// By hostname.
    #[prost(btree_map = "string, message", tag = "1")]
    pub table: BTreeMap<String, NameInfo>,
}

/// Istio's `NameTable.NameInfo`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NameInfo {
    #[prost(string, repeated, tag = "1")]
    pub ips: Vec<String>,
    /// `Kubernetes` for a registry service (short names apply), else
    /// `External` (a ServiceEntry).
    #[prost(string, tag = "2")]
    pub registry: String,
    #[prost(string, tag = "3")]
    pub shortname: String,
    #[prost(string, tag = "4")]
    pub namespace: String,
    /// The other names the proxy may use for it (its search list's).
    #[prost(string, repeated, tag = "5")]
    pub alt_hosts: Vec<String>,
}

impl prost::Name for NameTable {
    const NAME: &'static str = "NameTable";
    const PACKAGE: &'static str = "istio.networking.nds.v1";
    fn type_url() -> String {
        format!("type.googleapis.com/{}.{}", Self::PACKAGE, Self::NAME)
    }
}
