//! Lodestar: an Envoy control plane. Istio's traffic rules and a service
//! registry live in a raft-replicated store; every replica serves them to
//! Envoys over xDS.
//!
//! # Layout
//! Lowest layer first; a module imports only from layers above it in this
//! list (the root modules also from each other), never in a circle
//! (`tests/e2e/tidy.rs` keeps both). Workspace crates of their own,
//! re-exported here under these names: `proto` (`proto/Cargo.toml`);
//! `model` (with `error`), `state` and `translate` (`src/X/Cargo.toml`),
//! with no IO crate in their dependency trees; `tls`, `client` and `agent`,
//! with no server code in theirs (no `lodestar`, store or translation).
//! - [`error`]: the one error vocabulary (codes as HTTP and gRPC numbers);
//!   the model crate's.
//! - [`metrics`]: Prometheus metrics (Istio's pilot names where they match).
//! - [`proto`]: generated protobuf code (API, peer, Istio CA).
//! - [`model`]: pure domain types: kinds, resources, keys, selectors,
//!   validation. Knows no IO crate.
//! - [`state`]: the replicated state as a pure value: objects, transactions
//!   and `apply_txn` (deterministic), dedup; the pure ACL side
//!   (`state::access`: principals, permissions, the index, tokens). Knows
//!   no IO crate.
//! - [`logging`]: the log lines (text on terminals in colour, or JSON),
//!   every field escaped (clients' text cannot forge lines).
//! - [`translate`]: the push path's pure step: the [`mesh`] index of one
//!   `state::State` and its translation into one proxy's Envoy resources
//!   (`translate::resources`: `ProxyConfig`, the `Generator` trait;
//!   `translate::json`: proto-JSON). Knows no IO crate.
//! - [`analyze`]: `lodestar analyze` (istioctl analyze's checks and
//!   codes) over one `State`, the mesh index its model; pure.
//! - [`store`]: openraft over sled: log, state machine, versioned codec,
//!   immutable applied snapshots (`Applied` reads as a `State`), watch.
//! - [`node`]: the core of a replica: batched writes, forwarding to the
//!   leader, linearizable reads, membership. Reaches its peers through the
//!   `node::Transport` trait.
//! - [`tls`]: TLS on the ports: the generated CA and certificates,
//!   reloadable rustls configurations, the accept path (counted through
//!   `tls::conn::ConnCounters`), dialling peers.
//! - [`xds`]: the ADS server and its streams (SotW, delta, SDS, sync
//!   status). Reaches admission, fencing, the mesh CA and the secrets key
//!   only through traits it defines (`Admission`, `Fence`,
//!   `WorkloadCerts`, `secrets::Unseal`).
//! - [`client`]: what the CLI, the agent and lodestar-bench talk to
//!   replicas with: the REST and gRPC clients, `client.toml`.
//! - [`agent`]: `lodestar agent`, a workload's certificate and its SDS
//!   server for Envoy; Envoy as a child; traffic capture (iptables), the
//!   DNS proxy (its name table is `model::dns`). No server code.
//!
//! The root (wiring; imports all of the above):
//! - [`server`]: starts a replica's ports and shuts it down; first-start
//!   files (`server::bootstrap`).
//! - [`replica`]: the node with its helpers, as the API, xDS and peer
//!   service see it; implements `xds::server::Fence`.
//! - [`api`]: REST (axum) and gRPC (tonic) client APIs, thin, one error map
//!   each, one authorization check for both.
//! - [`auth`]: ACLs at run time: the cached index, the management
//!   credential, the audit log; implements `xds::server::Admission`.
//! - [`ca`]: the mesh CA: workload certificates (SPIFFE ids), Istio's
//!   CSR service on the xDS port, join tokens.
//! - [`secrets`]: the cluster secrets key; Secrets' private keys sealed
//!   before they are proposed, opened only where xDS serves them (SDS).
//! - [`ha`]: readiness, fencing reconnecting Envoys, spreading streams.
//! - [`health`]: registry health at run time: TTLs, leases, probes.
//! - [`gateway_status`]: the leader writes the Gateway API status.
//! - [`peer`]: raft peer RPCs and forwarding over tonic (trusted peers
//!   only); implements `node::Transport`.
//! - [`jwks`]: fetches RequestAuthentication `jwksUri` key sets for
//!   translation.
//! - [`adapters`]: sources outside the API (a watched directory) fed into the store.
//! - [`config`]: server settings (TOML + flags).
//! - [`cli`]: the `lodestar` command line (the replica and client commands).
//!
//! The load generators are a separate binary, `lodestar-bench`
//! (`src/bin/lodestar-bench/`), a client of this library's public API.

pub mod adapters;
pub use lodestar_agent as agent;
pub mod analyze;
pub mod api;
pub mod auth;
pub mod ca;
pub mod cli;
pub use lodestar_client as client;
pub mod config;
pub mod gateway_status;
pub mod ha;
pub mod health;
pub mod jwks;
pub mod logging;
// The pure crates (src/model, src/state, src/translate: workspace members
// with no IO crate in their dependency tree), under their module names.
pub use lodestar_model as model;
pub use lodestar_model::error;
pub use lodestar_state as state;
pub use lodestar_translate as translate;
// The mesh index is translation's input: it lives there; its old path stays.
pub use translate::mesh;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod replica;
pub mod secrets;
pub mod server;
// openraft's StorageError (224 bytes) is the error type its storage traits
// require; boxing it in our helpers would only add conversions.
#[allow(clippy::result_large_err)]
pub mod store;
pub use lodestar_tls as tls;
pub mod xds;

/// Generated protobuf code (the `lodestar-proto` crate, proto/).
pub use lodestar_proto as proto;
