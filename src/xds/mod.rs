//! The xDS side: what is served (`resources`: translation's output types,
//! and the `Generator` as the server calls it; the proto-JSON rendering is
//! `translate::json`), the ADS server (`server`; `service` is its gRPC service with
//! small codec buffers; the per-stream protocol state is in
//! `sotw` and `delta`), and who is in sync (`status`, served at
//! `GET /debug/syncz`), and what one credential, source or stream may
//! hold (`limits`). `secrets` adds a gateway's SDS secrets to its
//! config after translation (the one place a sealed key is opened).
//! The server reaches the replica only through traits defined here
//! (`server::Fence`, `server::WorkloadCerts`, `secrets::Unseal`), as
//! go-control-plane's server calls its callbacks.
//!
//! Every replica serves ADS from its own applied store state. Revisions are
//! identical on every replica for the same state, so an Envoy that fails
//! over to another replica sees the same versions.

mod delta;
pub mod limits;
pub mod push;
pub mod resources;
pub mod secrets;
pub mod server;
mod service;
mod session;
mod sotw;
pub mod status;

use crate::translate::mesh::MeshConfig;
use crate::translate::Translator;
use resources::Generator;
use std::sync::Arc;

pub use status::SyncRegistry;
// The JSON rendering of what is served is translation's
// (`translate::json`); its old path stays.
pub use crate::translate::json;

// What a stream does with a request's bytes, without a socket: framing and
// limits (`decode_frame`), the proxy's identity from its node
// (`server::proxy_identity`), and the protocol state. Public for the fuzz
// target `fuzz/fuzz_targets/xds.rs`.
pub use delta::DeltaStream;
pub use service::{decode_frame, Decoded, NameFields, MAX_NAMES};
pub use sotw::SotwStream;

/// The generator a replica serves with (`server::run`): translation of the
/// Istio config and registry in the applied store state.
pub fn default_generator(mesh: MeshConfig) -> Arc<dyn Generator> {
    Arc::new(Translator::new(mesh))
}
