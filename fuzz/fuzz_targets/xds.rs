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
        c.insert(
            ResourceType::Endpoint,
            XdsResource::with_version::<ClusterLoadAssignment>(format!("outbound|80||s{i}.default.svc.cluster.local"), vec![], version.clone()),
        );
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

/// One stream's requests through its protocol state `stream`, as the
/// server takes them: the first must identify its proxy, and the stream
/// ends once it subscribes to too many names of one type; then a new
/// config is pushed.
fn stream<Req, S>(
    frames: &[u8],
    stream: &mut S,
    node: impl Fn(&Req) -> Option<&envoy_types::pb::envoy::config::core::v3::Node>,
    on_request: impl Fn(&mut S, &Req, &ProxyConfig),
    most_names: impl Fn(&S) -> usize,
    on_config: impl Fn(&mut S, &ProxyConfig),
) where
    Req: prost::Message + Default + lodestar::xds::NameFields,
{
    let (first, second) = (config(0), config(1));
    let mut n = 0;
    requests::<Req>(frames, |req| {
        n += 1;
        if n == 1 && proxy_identity(node(req)).is_err() {
            return false;
        }
        on_request(stream, req, &first);
        most_names(stream) <= MAX_NAMES
    });
    on_config(stream, &second);
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, frames)) = data.split_first() else { return };
    if which & 1 == 0 {
        stream::<DiscoveryRequest, _>(
            frames,
            &mut SotwStream::default(),
            |r| r.node.as_ref(),
            |s, r, c| drop(s.on_request(r, c)),
            SotwStream::most_names,
            |s, c| drop(s.on_config(c)),
        );
    } else {
        stream::<DeltaDiscoveryRequest, _>(
            frames,
            &mut DeltaStream::default(),
            |r| r.node.as_ref(),
            |s, r, c| drop(s.on_request(r, c)),
            DeltaStream::most_names,
            |s, c| drop(s.on_config(c)),
        );
    }
});
