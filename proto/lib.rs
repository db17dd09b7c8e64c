//! Generated protobuf code: Lodestar's API (`lodestar/api/v1`), the
//! replicas' peer protocol (`lodestar/peer/v1`) and Istio's certificate
//! service (`istio/v1/auth`), clients and servers.

pub mod api {
    tonic::include_proto!("lodestar.api.v1");
}
pub mod peer {
    tonic::include_proto!("lodestar.peer.v1");
}
/// Istio's certificate service (`proto/istio/v1/auth/istioca.proto`).
pub mod istio_ca {
    tonic::include_proto!("istio.v1.auth");
}
include!(concat!(env!("OUT_DIR"), "/grpc_methods.rs"));
