//! The bytes an xDS stream receives, through everything the server does
//! with them short of the socket: gRPC framing and the per-request limits
//! (`decode_frame`: compression flag, size, names counted on the wire
//! before decoding), the proxy's identity from the first request's node
//! (id and metadata), and the stream's protocol state (subscriptions,
//! nonces, ACK/NACK, the per-type names limit), answered from a small
//! config and then from a changed one. The first byte picks state of the
//! world or delta; the rest is a sequence of framed requests. A request
//! the server would refuse ends the input as it would end the stream.
#![no_main]

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::config::listener::v3::Listener;
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use libfuzzer_sys::fuzz_target;
use lodestar::xds::resources::{ProxyConfig, ResourceType, XdsResource};
use lodestar::xds::server::proxy_identity;
use lodestar::xds::{decode_frame, Decoded, DeltaStream, SotwStream, MAX_NAMES};

/// A config with a few resources of each type; `generation` changes some
/// of their versions and drops one, as a new revision would.
fn config(generation: u64) -> ProxyConfig {
    let mut c = ProxyConfig { revision: 7 + generation, ..Default::default() };
    for i in 0..3u64 {
        let v = if i == 0 { generation } else { 0 };
        if generation > 0 && i == 2 {
            continue;
        }
        let version = format!("{v}");
        c.insert(ResourceType::Cluster, XdsResource::with_version::<Cluster>(format!("outbound|80||s{i}.default.svc.cluster.local"), vec![], version.clone()));
        c.insert(ResourceType::Endpoint, XdsResource::with_version::<ClusterLoadAssignment>(format!("outbound|80||s{i}.default.svc.cluster.local"), vec![], version.clone()));
        c.insert(ResourceType::Listener, XdsResource::with_version::<Listener>(format!("0.0.0.0_{}", 8080 + i), vec![], version.clone()));
        c.insert(ResourceType::Route, XdsResource::with_version::<RouteConfiguration>(format!("{}", 8080 + i), vec![], version));
    }
    c
}

/// The requests framed in `bytes`, as a stream would take them: stops
/// where the server would end the stream (a refused frame, a node it
/// cannot identify, too many names) or the bytes run out.
fn requests<Req: prost::Message + Default + lodestar::xds::NameFields>(mut bytes: &[u8], mut each: impl FnMut(&Req) -> bool) {
    while let Ok(Decoded::Request(req, used)) = decode_frame::<Req>(bytes) {
        bytes = &bytes[used..];
        if !each(&req) {
            return;
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, frames)) = data.split_first() else { return };
    let (first, second) = (config(0), config(1));
    let mut n = 0;
    if which & 1 == 0 {
        let mut stream = SotwStream::default();
        requests::<DiscoveryRequest>(frames, |req| {
            n += 1;
            if n == 1 && proxy_identity(req.node.as_ref()).is_err() {
                return false;
            }
            let _ = stream.on_request(req, &first);
            stream.most_names() <= MAX_NAMES
        });
        let _ = stream.on_config(&second);
    } else {
        let mut stream = DeltaStream::default();
        requests::<DeltaDiscoveryRequest>(frames, |req| {
            n += 1;
            if n == 1 && proxy_identity(req.node.as_ref()).is_err() {
                return false;
            }
            let _ = stream.on_request(req, &first);
            stream.most_names() <= MAX_NAMES
        });
        let _ = stream.on_config(&second);
    }
});
