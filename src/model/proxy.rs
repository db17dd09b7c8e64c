//! Who a connecting Envoy is, from its xDS `Node`, following Istio's
//! conventions so pilot-agent style bootstraps work unchanged:
//!
//! - `node.id` = `TYPE~IP~NAME.NAMESPACE~NAMESPACE.svc.DOMAIN`, TYPE being
//!   `sidecar` or `router` (a gateway), e.g.
//!   `sidecar~127.0.0.2~productpage-v1.default~default.svc.cluster.local`.
//! - `node.metadata` may carry `LABELS` (a map), `INSTANCE_IPS`
//!   (comma-separated; the first is the proxy's address, winning over the
//!   id's), and `NAMESPACE` and `NAME`, which must be what the id says:
//!   the namespace a proxy's credential is checked against is the one in
//!   its id (NAME.NAMESPACE: the namespace is the part after the last dot). `LODESTAR_SDS: "true"` (set by `lodestar agent`'s
//!   bootstrap) says the proxy has the static cluster `sds-grpc` to a local
//!   SDS server with the secrets `default` and `ROOTCA`: only such a proxy
//!   is given listeners and clusters that use them (mutual TLS), since any
//!   other would NACK them.
//! - `node.metadata.GENERATOR = "grpc"` (Istio's marker for proxyless gRPC
//!   clients) on a `sidecar` id makes the node a `ProxyKind::Grpc`.
//!
//! - `INTERCEPTION_MODE: REDIRECT` (Istio's; set by `lodestar agent
//!   --capture`) says iptables redirects the workload's traffic into the
//!   proxy: it gets Istio's virtual listeners (`translate::capture`).
//!
//! Without capture, the proxy's IP is also the address its listeners bind
//! to, so several Envoys on one host use distinct 127.0.0.x.

use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProxyKind {
    Sidecar,
    /// A gateway proxy (Istio's `router` type), selected by Gateway resources.
    Router,
    /// A proxyless gRPC application (its xDS client is gRPC's): a `sidecar`
    /// node id whose metadata says `GENERATOR: grpc`, as Istio's gRPC
    /// bootstraps do. It gets API listeners named `HOST:PORT`, not
    /// listeners that bind (`translate::grpc`).
    Grpc,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProxyIdentity {
    /// The full node id, as Envoy sent it.
    pub id: String,
    pub kind: ProxyKind,
    /// The proxy's address: where its listeners bind.
    pub ip: String,
    /// Workload name (`productpage-v1`).
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    /// It has a workload identity over SDS (`LODESTAR_SDS` metadata).
    pub sds: bool,
    /// Its workload's traffic is captured into it (`INTERCEPTION_MODE:
    /// REDIRECT`): it gets Istio's virtual listeners (`translate::capture`)
    /// instead of bound ones.
    pub capture: bool,
    /// The stream is a captured proxy's agent asking for its DNS name
    /// table only (`LODESTAR_NAME_TABLE_ONLY` metadata): it is translated
    /// nothing else (`translate::dns::names_only`).
    pub names_only: bool,
    /// Its agent captures DNS and answers from the proxy's name table
    /// (Istio's `DNS_CAPTURE` metadata, set by `lodestar agent
    /// --capture-dns`): services without addresses are matched by their
    /// auto-allocated ones (`translate::dns`), which only its DNS answers.
    pub dns_capture: bool,
    /// `ISTIO_VERSION` from its metadata (EnvoyFilter `match.proxy.proxyVersion`).
    pub istio_version: Option<String>,
    /// Its string-valued metadata (EnvoyFilter `match.proxy.metadata`).
    pub metadata: BTreeMap<String, String>,
}

/// The node metadata key that says a proxy has the agent's SDS cluster.
pub const SDS_METADATA: &str = "LODESTAR_SDS";
/// The node metadata key of the proxy's traffic capture (Istio's), and the
/// value that says iptables REDIRECT captures its workload's traffic.
pub const INTERCEPTION_METADATA: &str = "INTERCEPTION_MODE";
pub const INTERCEPTION_REDIRECT: &str = "REDIRECT";
/// The node metadata key that says the agent captures DNS (Istio's).
pub const DNS_CAPTURE_METADATA: &str = "DNS_CAPTURE";
/// The node metadata key of the agent's DNS stream (`"true"`).
pub const NAME_TABLE_ONLY_METADATA: &str = "LODESTAR_NAME_TABLE_ONLY";

impl ProxyIdentity {
    /// Parse a node id and metadata (the `Node.metadata` Struct as JSON).
    pub fn parse(node_id: &str, metadata: &Value) -> Result<ProxyIdentity, String> {
        let parts: Vec<&str> = node_id.split('~').collect();
        let [kind, ip, name_ns, _domain] = parts.as_slice() else {
            return Err(format!("node id {node_id:?} is not TYPE~IP~NAME.NAMESPACE~NAMESPACE.svc.DOMAIN"));
        };
        let kind = match *kind {
            "sidecar" => ProxyKind::Sidecar,
            "router" => ProxyKind::Router,
            other => return Err(format!("node id {node_id:?}: type {other:?} is not sidecar or router")),
        };
        let kind = match metadata.get("GENERATOR").and_then(Value::as_str) {
            None | Some("") => kind,
            Some("grpc") if kind == ProxyKind::Sidecar => ProxyKind::Grpc,
            Some("grpc") => return Err(format!("node id {node_id:?}: metadata GENERATOR \"grpc\" (a proxyless gRPC client) needs the type sidecar")),
            Some(other) => return Err(format!("node id {node_id:?}: metadata GENERATOR {other:?} is not supported (only \"grpc\")")),
        };
        // The node id names the namespace (a DNS label: the last part), and
        // metadata may repeat it but never say another: streams, their
        // config and NACKs are found by node id, so an id must not name a
        // namespace other than the one its credential was checked for.
        let (name, namespace) = name_ns
            .rsplit_once('.')
            .filter(|(name, ns)| !name.is_empty() && !ns.is_empty())
            .ok_or_else(|| format!("node id {node_id:?}: no namespace (NAME.NAMESPACE in the third part)"))?;
        let meta_str = |k: &str| metadata.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
        for (key, id_says) in [("NAMESPACE", namespace), ("NAME", name)] {
            if let Some(meta) = meta_str(key).filter(|m| *m != id_says) {
                return Err(format!("node id {node_id:?} says {} {id_says:?} but its metadata {key} says {meta:?}", key.to_ascii_lowercase()));
            }
        }
        let ip = meta_str("INSTANCE_IPS").and_then(|ips| ips.split(',').map(str::trim).find(|s| !s.is_empty())).unwrap_or(ip);
        if ip.parse::<std::net::IpAddr>().is_err() {
            return Err(format!("node id {node_id:?}: {ip:?} is not an IP address"));
        }
        let flag = |k: &str| metadata.get(k).is_some_and(|v| v.as_str() == Some("true") || v.as_bool() == Some(true));
        let labels = metadata
            .get("LABELS")
            .and_then(Value::as_object)
            .map(|m| m.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
            .unwrap_or_default();
        Ok(ProxyIdentity {
            id: node_id.to_string(),
            kind,
            ip: ip.to_string(),
            name: name.to_string(),
            namespace: namespace.to_string(),
            labels,
            sds: flag(SDS_METADATA),
            names_only: flag(NAME_TABLE_ONLY_METADATA),
            dns_capture: flag(DNS_CAPTURE_METADATA),
            capture: match meta_str(INTERCEPTION_METADATA) {
                None | Some("NONE") => false,
                Some(INTERCEPTION_REDIRECT) => true,
                Some(other) => return Err(format!("node id {node_id:?}: metadata {INTERCEPTION_METADATA} {other:?} is not supported (REDIRECT or NONE)")),
            },
            istio_version: meta_str("ISTIO_VERSION").map(str::to_string),
            metadata: metadata.as_object().map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect()).unwrap_or_default(),
        })
    }

    /// The node id a bootstrap should use for this identity.
    pub fn node_id(kind: ProxyKind, ip: &str, name: &str, namespace: &str, domain_suffix: &str) -> String {
        let t = match kind {
            ProxyKind::Sidecar | ProxyKind::Grpc => "sidecar",
            ProxyKind::Router => "router",
        };
        format!("{t}~{ip}~{name}.{namespace}~{namespace}.svc.{domain_suffix}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn istio_node_ids() {
        let p =
            ProxyIdentity::parse("sidecar~127.0.0.2~productpage-v1.bookinfo~bookinfo.svc.cluster.local", &json!({"LABELS": {"app": "productpage"}})).unwrap();
        assert_eq!((p.kind, p.ip.as_str(), p.name.as_str(), p.namespace.as_str()), (ProxyKind::Sidecar, "127.0.0.2", "productpage-v1", "bookinfo"));
        assert_eq!(p.labels["app"], "productpage");
        let g = ProxyIdentity::parse("router~127.0.0.9~ingress.istio-system~istio-system.svc.cluster.local", &json!({"INSTANCE_IPS": "127.0.0.10,127.0.0.11"}))
            .unwrap();
        assert_eq!((g.kind, g.ip.as_str()), (ProxyKind::Router, "127.0.0.10"));
        assert!(ProxyIdentity::parse("envoy-1", &json!({})).is_err());
        let grpc = ProxyIdentity::parse("sidecar~127.0.0.3~client.shop~shop.svc.cluster.local", &json!({"GENERATOR": "grpc"})).unwrap();
        assert_eq!(grpc.kind, ProxyKind::Grpc);
        let e = ProxyIdentity::parse("router~127.0.0.3~gw.shop~shop.svc.cluster.local", &json!({"GENERATOR": "grpc"})).unwrap_err();
        assert!(e.contains("GENERATOR"), "{e}");
        assert!(ProxyIdentity::parse("sidecar~127.0.0.3~c.shop~shop.svc.cluster.local", &json!({"GENERATOR": "xds"})).unwrap_err().contains("not supported"));
        assert!(ProxyIdentity::parse("gateway~1.2.3.4~a.b~b.svc.cluster.local", &json!({})).is_err());
        let id = ProxyIdentity::node_id(ProxyKind::Sidecar, "127.0.0.2", "a", "ns", "cluster.local");
        assert_eq!(ProxyIdentity::parse(&id, &json!({})).unwrap().namespace, "ns");
        // Capture: Istio's INTERCEPTION_MODE, REDIRECT or NONE (TPROXY is not served).
        assert!(!ProxyIdentity::parse(&id, &json!({})).unwrap().capture);
        assert!(ProxyIdentity::parse(&id, &json!({"INTERCEPTION_MODE": "REDIRECT"})).unwrap().capture);
        assert!(!ProxyIdentity::parse(&id, &json!({"INTERCEPTION_MODE": "NONE"})).unwrap().capture);
        assert!(ProxyIdentity::parse(&id, &json!({"INTERCEPTION_MODE": "TPROXY"})).unwrap_err().contains("INTERCEPTION_MODE \"TPROXY\""));
    }

    /// The id names the namespace; metadata may not name another (nor
    /// another workload), so ids of two namespaces never collide.
    #[test]
    fn the_node_id_names_the_namespace() {
        let id = "sidecar~127.0.0.2~web.team-b~team-b.svc.cluster.local";
        let e = ProxyIdentity::parse(id, &json!({"NAMESPACE": "team-a"})).unwrap_err();
        assert!(e.contains("namespace \"team-b\"") && e.contains("NAMESPACE says \"team-a\""), "{e}");
        let e = ProxyIdentity::parse(id, &json!({"NAME": "db"})).unwrap_err();
        assert!(e.contains("NAME says \"db\""), "{e}");
        let p = ProxyIdentity::parse(id, &json!({"NAMESPACE": "team-b", "NAME": "web"})).unwrap();
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("web", "team-b"));
        // No namespace in the id: refused, whatever the metadata says.
        assert!(ProxyIdentity::parse("sidecar~127.0.0.2~web~x", &json!({"NAMESPACE": "team-a"})).unwrap_err().contains("no namespace"));
        // A workload name with dots: the namespace is the last part.
        let p = ProxyIdentity::parse(&ProxyIdentity::node_id(ProxyKind::Sidecar, "127.0.0.2", "web.v2", "shop", "cluster.local"), &json!({})).unwrap();
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("web.v2", "shop"));
    }
}
