//! The end-to-end tests: one test binary (as rust-analyzer's slow-tests),
//! so the whole server is linked into one test executable instead of one
//! per file. Each module is one area; `kit` is the shared test kit (real
//! replicas, Envoys, agents and clients; see its doc).
//!
//! Run one area: `cargo nextest run -E 'binary(e2e) and test(/^faults::/)'`
//! or simply `cargo nextest run faults::`.

mod kit;

mod acl;
mod agent;
mod analyze;
mod api;
mod authz;
mod autorevert;
mod backup;
mod capture;
mod churn;
mod cluster;
mod console;
mod credentials;
mod doors_api;
mod doors_edges;
mod doors_tenancy;
mod doors_xds;
mod dryrun;
mod envoyfilter;
mod extauthz;
mod failover;
mod faults;
mod first_run;
mod gateway_api;
mod gateway_status;
mod grpc;
mod ha;
mod history;
mod identity;
mod istio_validation;
mod jwt;
mod listener_set;
mod mtls;
mod nacks;
mod preview;
mod push;
mod readme;
mod registry;
mod retention;
mod security;
mod telemetry;
mod tidy;
mod traffic;
mod translate;
mod upgrade;
mod xds;
mod xdsbench;
