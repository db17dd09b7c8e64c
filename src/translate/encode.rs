//! Deterministic encoding of route configurations.
//!
//! prost encodes protobuf `map` fields from a `HashMap`, whose iteration
//! order changes from map to map, so two encodings of the same route with a
//! fault *and* a CORS per-filter config could differ byte for byte, and so
//! would their versions. Here each message is encoded without its
//! `typed_per_filter_config` map, and the map's entries are appended sorted
//! by key. Protobuf decoders accept fields in any order, and the order among
//! repeated elements (routes, virtual hosts) is kept.

use envoy_types::pb::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost};
use envoy_types::pb::google::protobuf::Any;
use prost::encoding::{encode_key, encode_varint, WireType};
use prost::Message;
use std::collections::{BTreeMap, HashMap};

/// Field numbers in envoy.config.route.v3.
const RC_VIRTUAL_HOSTS: u32 = 2;
const VH_ROUTES: u32 = 3;
const VH_TYPED_PER_FILTER_CONFIG: u32 = 15;
const ROUTE_TYPED_PER_FILTER_CONFIG: u32 = 13;

pub(super) fn put_len_delimited(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    encode_key(field, WireType::LengthDelimited, out);
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn put_sorted_map(field: u32, map: &HashMap<String, Any>, out: &mut Vec<u8>) {
    put_sorted_messages(field, map, out)
}

/// A protobuf `map<string, M>` field, entries sorted by key.
pub(super) fn put_sorted_messages<M: Message>(field: u32, map: &HashMap<String, M>, out: &mut Vec<u8>) {
    let sorted: BTreeMap<&String, &M> = map.iter().collect();
    for (k, v) in sorted {
        let mut entry = Vec::new();
        put_len_delimited(1, k.as_bytes(), &mut entry);
        put_len_delimited(2, &v.encode_to_vec(), &mut entry);
        put_len_delimited(field, &entry, out);
    }
}

/// A protobuf `map<string, Message>` field's entries, sorted by key (for
/// messages other than routes with maps: `jwt::jwt_authn_any`).
pub fn put_sorted_message_map<M: Message>(field: u32, map: &HashMap<String, M>, out: &mut Vec<u8>) {
    let sorted: BTreeMap<&String, &M> = map.iter().collect();
    for (k, v) in sorted {
        let mut entry = Vec::new();
        put_len_delimited(1, k.as_bytes(), &mut entry);
        put_len_delimited(2, &v.encode_to_vec(), &mut entry);
        put_len_delimited(field, &entry, out);
    }
}

fn route_bytes(r: &Route) -> Vec<u8> {
    let mut bare = r.clone();
    let map = std::mem::take(&mut bare.typed_per_filter_config);
    let mut out = bare.encode_to_vec();
    put_sorted_map(ROUTE_TYPED_PER_FILTER_CONFIG, &map, &mut out);
    out
}

pub fn virtual_host_bytes(vh: &VirtualHost) -> Vec<u8> {
    let mut bare = vh.clone();
    let routes = std::mem::take(&mut bare.routes);
    let map = std::mem::take(&mut bare.typed_per_filter_config);
    let mut out = bare.encode_to_vec();
    for r in &routes {
        put_len_delimited(VH_ROUTES, &route_bytes(r), &mut out);
    }
    put_sorted_map(VH_TYPED_PER_FILTER_CONFIG, &map, &mut out);
    out
}

/// A RouteConfiguration from already-encoded virtual hosts (they can be
/// cached and shared: assembling is a copy).
pub fn route_configuration_from_parts(rc_without_vhosts: &RouteConfiguration, vhosts: &[impl AsRef<[u8]>]) -> Vec<u8> {
    let mut out = rc_without_vhosts.encode_to_vec();
    for vh in vhosts {
        put_len_delimited(RC_VIRTUAL_HOSTS, vh.as_ref(), &mut out);
    }
    out
}

pub fn route_configuration_bytes(rc: &RouteConfiguration) -> Vec<u8> {
    let mut bare = rc.clone();
    let vhosts: Vec<Vec<u8>> = std::mem::take(&mut bare.virtual_hosts).iter().map(virtual_host_bytes).collect();
    route_configuration_from_parts(&bare, &vhosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_bytes_whatever_the_map_order_and_decodes_back() {
        let mut r = Route { name: "r".into(), ..Default::default() };
        for k in ["b", "a", "c", "envoy.filters.http.fault", "envoy.filters.http.cors"] {
            r.typed_per_filter_config.insert(k.into(), Any { type_url: format!("t/{k}"), value: vec![1, 2] });
        }
        let rc = RouteConfiguration {
            name: "80".into(),
            virtual_hosts: vec![VirtualHost { name: "v".into(), routes: vec![r.clone(), r], ..Default::default() }],
            ..Default::default()
        };
        let a = route_configuration_bytes(&rc);
        for _ in 0..20 {
            let mut copy = rc.clone();
            // Rebuild the maps: a fresh HashMap gets a fresh iteration order.
            for vh in &mut copy.virtual_hosts {
                for r in &mut vh.routes {
                    r.typed_per_filter_config = r.typed_per_filter_config.clone().into_iter().collect();
                }
            }
            assert_eq!(route_configuration_bytes(&copy), a);
        }
        assert_eq!(RouteConfiguration::decode(a.as_slice()).unwrap(), rc);
    }
}
