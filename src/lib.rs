//! Lodestar: an Envoy control plane. Istio's traffic rules and a service
//! registry live in a raft-replicated store; every replica serves them to
//! Envoys over xDS.
//!
//! # Layout
//! - [`analyze`]: `lodestar analyze` (istioctl analyze's checks and
//!   codes) over one store state; pure.
//! - [`model`]: pure domain types: kinds, resources, keys, selectors,
//!   validation. Knows no IO crate.
//! - [`store`]: openraft over sled: log, state machine, versioned codec,
//!   immutable applied snapshots, watch.
//! - [`node`]: the core of a replica: batched writes, forwarding to the
//!   leader, linearizable reads, membership. Knows none of the helpers
//!   below; reaches its peers through the `node::Transport` trait.
//! - [`ha`]: readiness, fencing reconnecting Envoys, spreading streams.
//! - [`health`]: registry health at run time: TTLs, leases, probes.
//! - [`replica`]: the node with its helpers, as the API, xDS and peer
//!   service see it (status, peer requests for the helpers, waiting for
//!   proxies).
//! - [`peer`]: raft peer RPCs and forwarding over tonic (trusted peers
//!   only); implements `node::Transport`.
//! - [`api`]: REST (axum) and gRPC (tonic) client APIs, thin, one error map
//!   each, one authorization check for both.
//! - [`auth`]: ACLs: tokens, policies, roles, certificate identities; the
//!   permission check (pure) and the audit log.
//! - [`ca`]: the mesh CA: workload certificates (SPIFFE ids), Istio's
//!   CSR service on the xDS port, join tokens.
//! - [`secrets`]: the cluster secrets key; Secrets' private keys sealed
//!   before they are proposed, opened only where xDS serves them (SDS).
//! - [`agent`]: `lodestar agent`, a workload's certificate and its SDS
//!   server for Envoy.
//! - [`adapters`]: sources outside the API (a watched directory) fed into the store.
//! - [`logging`]: the log, every field escaped (clients' text cannot forge lines).
//! - [`metrics`]: Prometheus metrics (Istio's pilot names where they match).
//! - [`tls`]: TLS on the ports: the generated CA and certificates,
//!   reloadable rustls configurations, the accept path, dialling peers.
//! - [`server`]: starts a replica's ports and shuts it down.
//! - [`config`]: server settings (TOML + flags).
//! - [`logging`]: the binary's log lines (text on terminals in colour, or
//!   JSON).
//! - [`cli`]: the `lodestar` command line (the replica and client commands).
//! - [`error`]: the one error vocabulary.
//!
//! The load generators are a separate binary, `lodestar-bench`
//! (`src/bin/lodestar-bench/`), a client of this library's public API.

pub mod adapters;
pub mod agent;
pub mod analyze;
pub mod api;
pub mod auth;
pub mod ca;
pub mod cli;
pub mod config;
pub mod error;
pub mod ha;
pub mod health;
pub mod jwks;
pub mod logging;
pub mod mesh;
pub mod metrics;
pub mod model;
pub mod node;
pub mod peer;
pub mod replica;
pub mod secrets;
pub mod server;
// openraft's StorageError (224 bytes) is the error type its storage traits
// require; boxing it in our helpers would only add conversions.
#[allow(clippy::result_large_err)]
pub mod store;
pub mod tls;
pub mod translate;
pub mod xds;

/// Generated protobuf code.
pub mod proto {
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
}
