//! DNS for captured proxies, as Istio's agent DNS proxy
//! (`ISTIO_META_DNS_CAPTURE`, `DNS_AUTO_ALLOCATE`) has it, in the pure
//! layer: the name table a proxy's agent answers from, and the virtual IPs
//! allocated to services that declare none.
//!
//! - [`auto_vips`]: a service without `addresses` (a registry Service, or
//!   a ServiceEntry that is not `resolution: NONE` and whose host is not a
//!   wildcard) gets an address in 240.240.0.0/16 (Istio's class E range),
//!   derived from its hostname (FNV-1a), so every replica and every
//!   revision agrees. A collision takes the next free address, in hostname
//!   order: a host keeps its address unless a new host hashing to the same
//!   one sorts before it.
//! - [`name_table`]: the names a proxy may resolve (the services its
//!   Sidecar's egress lets it reach), each with its addresses and the short
//!   forms Kubernetes' search list gives (`reviews`, `reviews.shop`,
//!   `reviews.shop.svc` for a proxy in `shop`), served over xDS as Istio's
//!   NDS resource (`istio.networking.nds.v1.NameTable`, the same fields).
//!   A wildcard host (`*.example.com`) is in it, as Istio's, only with
//!   declared addresses: the agent answers every name under it with them.
//!   Without (wildcards get no allocated address, and `resolution: NONE`
//!   or DNS ones rarely declare one) its names are the upstream
//!   resolver's, and the connection to the real address is dispatched by
//!   its original destination (the port's `0.0.0.0_PORT` listener).

use crate::mesh::{Mesh, Resolution, Service};
use crate::model::proxy::ProxyIdentity;
use crate::resources::{ProxyConfig, ResourceType, XdsResource};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

/// The range auto-allocated addresses come from (Istio's): 240.240.0.0/16.
pub const AUTO_VIP_PREFIX: [u8; 2] = [240, 240];
/// The NDS resource's name (one table per proxy).
pub const NAME_TABLE: &str = "";

pub use crate::model::dns::{NameInfo, NameTable};

/// Does this service get an auto-allocated address (when it has none)?
pub fn wants_auto_vip(svc: &Service) -> bool {
    svc.addresses.is_empty() && !svc.hostname.starts_with('*') && svc.resolution != Resolution::Passthrough
}

/// The address of `host` in 240.240.0.0/16 before collisions: never the
/// network's first or last address.
fn slot(host: &str) -> u16 {
    (crate::resources::fnv1a(host.as_bytes()) % 65534) as u16 + 1
}

/// Addresses for `hosts` (deduplicated, in hostname order): each its hash
/// slot, else the next free one (see the module doc). At most 65,534.
pub fn auto_vips<'a>(hosts: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, Ipv4Addr> {
    let hosts: BTreeSet<&str> = hosts.into_iter().collect();
    let mut taken: BTreeSet<u16> = BTreeSet::new();
    let mut out = BTreeMap::new();
    for host in hosts {
        if taken.len() >= 65534 {
            break;
        }
        let mut s = slot(host);
        while !taken.insert(s) {
            s = if s >= 65534 { 1 } else { s + 1 };
        }
        out.insert(host.to_string(), Ipv4Addr::new(AUTO_VIP_PREFIX[0], AUTO_VIP_PREFIX[1], (s >> 8) as u8, s as u8));
    }
    out
}

/// The short forms of `hostname` (`NAME.NS.svc.SUFFIX`) for a proxy in
/// `proxy_ns`: `NAME.NS`, `NAME.NS.svc`, and `NAME` in its own namespace.
fn alt_hosts(hostname: &str, namespace: &str, proxy_ns: &str, suffix: &str) -> Vec<String> {
    let tail = format!(".{namespace}.svc.{suffix}");
    let Some(name) = hostname.strip_suffix(&tail).filter(|n| !n.is_empty() && !n.contains('.')) else { return Vec::new() };
    let mut out = vec![format!("{name}.{namespace}"), format!("{name}.{namespace}.svc")];
    if namespace == proxy_ns {
        out.insert(0, name.to_string());
    }
    out
}

/// The addresses a service's name resolves to, IPv4 and IPv6 (the agent
/// answers A with the first, AAAA with the second): its virtual IPs
/// (declared or allocated; a CIDR is none), else, for a `resolution:
/// NONE` one with ports (headless), its instances' addresses, as Istio's
/// `BuildNameTable`.
fn name_ips(svc: &Service) -> Vec<String> {
    let is_ip = |a: &&str| a.parse::<IpAddr>().is_ok();
    let mut ips: Vec<String> = svc.vips(true).filter(is_ip).map(str::to_string).collect();
    if ips.is_empty() && svc.resolution == Resolution::Passthrough && !svc.ports.is_empty() {
        let mut seen = BTreeSet::new();
        ips = svc.instances.iter().map(|i| i.address.as_str()).filter(is_ip).filter(|a| seen.insert(*a)).map(str::to_string).collect();
    }
    ips
}

/// The name table of a proxy in `proxy_ns` that may reach `services`:
/// every one with an address ([`name_ips`]).
pub fn name_table<'a>(services: impl IntoIterator<Item = &'a Service>, proxy_ns: &str, suffix: &str) -> NameTable {
    let mut table = BTreeMap::new();
    for svc in services {
        let ips = name_ips(svc);
        if ips.is_empty() {
            continue;
        }
        let alt = alt_hosts(&svc.hostname, &svc.namespace, proxy_ns, suffix);
        let info = NameInfo {
            ips,
            registry: if alt.is_empty() { "External" } else { "Kubernetes" }.into(),
            shortname: alt.first().filter(|_| svc.namespace == proxy_ns).cloned().unwrap_or_default(),
            namespace: svc.namespace.clone(),
            alt_hosts: alt,
        };
        table.insert(svc.hostname.clone(), info);
    }
    NameTable { table }
}

/// Insert `services`' name table into `cfg` (a captured proxy's).
pub fn insert_name_table<'a>(cfg: &mut ProxyConfig, services: impl IntoIterator<Item = &'a Service>, proxy: &ProxyIdentity, mesh: &Mesh) {
    let table = name_table(services, &proxy.namespace, &mesh.config.domain_suffix);
    cfg.insert(ResourceType::NameTable, XdsResource::new(NAME_TABLE, &table));
}

/// The config of a names-only stream (the agent's DNS proxy): the name
/// table of what the proxy's Sidecar lets it reach, nothing else.
pub fn names_only(mesh: &Mesh, proxy: &ProxyIdentity) -> ProxyConfig {
    let sc = super::scope::sidecar_for(mesh, proxy);
    let scope = super::scope::ProxyScope::new(mesh, proxy, sc.map(|s| s.as_ref()));
    let plans = super::scope::egress_plans(&scope, proxy, sc.map(|s| s.as_ref()));
    let mut reachable: BTreeMap<&str, &Service> = BTreeMap::new();
    for plan in &plans {
        reachable.extend(plan.services.iter().map(|(k, v)| (k.as_str(), v.as_ref())));
    }
    let mut cfg = ProxyConfig { revision: mesh.revision, ..Default::default() };
    insert_name_table(&mut cfg, reachable.into_values(), proxy, mesh);
    cfg
}

/// An encoded table as JSON (`/debug/config_dump`), Istio's field names.
pub fn table_json(any: &envoy_types::pb::google::protobuf::Any) -> Result<serde_json::Value, String> {
    let t = <NameTable as prost::Message>::decode(any.value.as_slice()).map_err(|e| format!("decoding the name table: {e}"))?;
    let table: serde_json::Map<String, serde_json::Value> = t
        .table
        .into_iter()
        .map(|(k, v)| {
            (k, serde_json::json!({"ips": v.ips, "registry": v.registry, "shortname": v.shortname, "namespace": v.namespace, "altHosts": v.alt_hosts}))
        })
        .collect();
    Ok(serde_json::json!({"table": table}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_vips_are_stable_and_distinct() {
        let a = auto_vips(["db.example.com", "cache.example.com", "db.example.com"]);
        assert_eq!(a.len(), 2);
        assert_ne!(a["db.example.com"], a["cache.example.com"]);
        for ip in a.values() {
            assert_eq!(&ip.octets()[..2], &AUTO_VIP_PREFIX);
            assert!(ip.octets()[2..] != [0, 0] && ip.octets()[2..] != [255, 255], "{ip}");
        }
        // The same hosts give the same addresses, whatever else is there.
        let b = auto_vips(["cache.example.com", "zzz.example.com", "db.example.com"]);
        assert_eq!(a["db.example.com"], b["db.example.com"]);
        assert_eq!(a["cache.example.com"], b["cache.example.com"]);
        // Golden: the address is the hostname's hash, not an order.
        let s = slot("db.example.com");
        assert_eq!(a["db.example.com"], Ipv4Addr::new(240, 240, (s >> 8) as u8, s as u8));
    }

    #[test]
    fn collisions_take_the_next_free_address_in_host_order() {
        // Find two hosts with one slot: the first in order keeps it.
        let mut by_slot: BTreeMap<u16, String> = BTreeMap::new();
        let (x, y) = (0..200_000)
            .find_map(|i| {
                let h = format!("h{i}.example.com");
                by_slot.insert(slot(&h), h.clone()).map(|other| (other, h))
            })
            .unwrap();
        let (first, second) = if x < y { (x, y) } else { (y, x) };
        let v = auto_vips([second.as_str(), first.as_str()]);
        let s = slot(&first);
        assert_eq!(v[&first], Ipv4Addr::new(240, 240, (s >> 8) as u8, s as u8));
        let n = if s >= 65534 { 1 } else { s + 1 };
        assert_eq!(v[&second], Ipv4Addr::new(240, 240, (n >> 8) as u8, n as u8));
    }

    fn se(host: &str, addresses: &[&str], resolution: Resolution) -> Service {
        Service {
            hostname: host.into(),
            namespace: "shop".into(),
            ports: Vec::new(),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            mesh_external: true,
            resolution,
            export_to: Vec::new(),
            instances: Vec::new(),
            sources: Vec::new(),
            created: 0,
            auto_address: None,
        }
    }

    #[test]
    fn wildcard_hosts_are_named_only_with_declared_addresses() {
        let with = se("*.api.example", &["198.18.1.50", "198.18.9.0/24"], Resolution::Passthrough);
        let without = se("*.cdn.example", &[], Resolution::Passthrough);
        assert!(!wants_auto_vip(&without) && !wants_auto_vip(&se("*.x.example", &[], Resolution::Static)));
        let t = name_table([&with, &without], "shop", "cluster.local");
        assert_eq!(t.table.keys().collect::<Vec<_>>(), ["*.api.example"]);
        let info = &t.table["*.api.example"];
        // The CIDR is no answer (Istio leaves it out too).
        assert_eq!((info.ips.as_slice(), info.registry.as_str(), info.alt_hosts.len()), (&["198.18.1.50".to_string()][..], "External", 0));
    }

    #[test]
    fn short_names_by_namespace() {
        assert_eq!(alt_hosts("reviews.shop.svc.cluster.local", "shop", "shop", "cluster.local"), ["reviews", "reviews.shop", "reviews.shop.svc"]);
        assert_eq!(alt_hosts("reviews.shop.svc.cluster.local", "shop", "web", "cluster.local"), ["reviews.shop", "reviews.shop.svc"]);
        assert!(alt_hosts("db.example.com", "shop", "shop", "cluster.local").is_empty());
    }

    /// IPv6 addresses are named as IPv4 ones (the agent answers AAAA with
    /// them); a headless (`resolution: NONE`) service without addresses
    /// is named with its instances' addresses, as Istio's; golden: the
    /// table as the agent receives it (config_dump's JSON).
    #[test]
    fn ipv6_and_headless_instances_are_named() {
        let instance = |address: &str| crate::mesh::Instance {
            address: address.into(),
            ports: BTreeMap::new(),
            default_port: None,
            labels: BTreeMap::new(),
            locality: String::new(),
            weight: 1,
            health: crate::mesh::Health::Healthy,
            source: None,
            namespace: "shop".into(),
            service_account: None,
        };
        let port = crate::mesh::ServicePort::new("tcp", 5432, Some("TCP"), None);
        let dual = se("db.example.com", &["198.18.2.1", "fd00::2:1", "fd00::/64"], Resolution::Static);
        let v6 = se("v6.example.com", &["fd00::6"], Resolution::Static);
        let mut headless = se("pg.example.com", &[], Resolution::Passthrough);
        headless.ports = vec![port.clone()];
        headless.instances = vec![instance("198.18.3.1"), instance("fd00::3:1"), instance("198.18.3.1"), instance("pg-0.example.com")];
        // Headless without ports: not named (Istio's too).
        let mut portless = se("noports.example.com", &[], Resolution::Passthrough);
        portless.instances = vec![instance("198.18.4.1")];
        // A STATIC one without addresses nor allocation: not named by its
        // instances (they are not what its name means).
        let mut unallocated = se("static.example.com", &[], Resolution::Static);
        unallocated.ports = vec![port];
        unallocated.instances = vec![instance("198.18.5.1")];
        let t = name_table([&dual, &v6, &headless, &portless, &unallocated], "shop", "cluster.local");
        let any = envoy_types::pb::google::protobuf::Any { type_url: String::new(), value: prost::Message::encode_to_vec(&t) };
        let want = serde_json::json!({"table": {
            "db.example.com": {"ips": ["198.18.2.1", "fd00::2:1"], "registry": "External", "shortname": "", "namespace": "shop", "altHosts": []},
            "pg.example.com": {"ips": ["198.18.3.1", "fd00::3:1"], "registry": "External", "shortname": "", "namespace": "shop", "altHosts": []},
            "v6.example.com": {"ips": ["fd00::6"], "registry": "External", "shortname": "", "namespace": "shop", "altHosts": []},
        }});
        assert_eq!(table_json(&any).unwrap(), want);
    }
}
