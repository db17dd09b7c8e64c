//! Typed model of Istio's `networking.istio.io` API (v1alpha3, v1beta1 and
//! v1 share one spec shape) with Istio-compatible validation.
//!
//! * Spec types mirror the YAML users write: fields are camelCase, unknown
//!   fields are errors, and serialising a parsed spec gives back the fields
//!   the user wrote (absent and empty fields are skipped).
//! * [`validate()`] parses a kind's `spec` and runs the semantic checks of
//!   Istio's own validation (istio/istio `pkg/config/validation`), returning
//!   every problem with the path of its field (`spec.http[0].route[1].weight`).
//! * [`host`] resolves short names and matches wildcard hosts the way Istio
//!   does.
//!
//! This directory refers to its siblings only through `super::`/`self::`
//! so it can be moved into another crate as is.

pub mod authorization_policy;
pub mod common;
pub mod delegate;
pub mod destination_rule;
pub mod duration;
pub mod envoy_filter;
pub mod gateway;
pub mod host;
pub mod mesh_config;
pub mod peer_authentication;
pub mod request_authentication;
pub mod service_entry;
pub mod sidecar;
pub mod telemetry;
pub mod validate;
pub mod virtual_service;
pub mod workload_entry;
pub mod workload_group;

pub use self::authorization_policy::AuthorizationPolicy;
pub use self::destination_rule::DestinationRule;
pub use self::duration::{parse_duration, Duration};
pub use self::envoy_filter::EnvoyFilter;
pub use self::gateway::Gateway;
pub use self::host::{host_matches, hosts_overlap, resolve_short_name};
pub use self::mesh_config::MeshConfig;
pub use self::peer_authentication::PeerAuthentication;
pub use self::request_authentication::RequestAuthentication;
pub use self::service_entry::ServiceEntry;
pub use self::sidecar::Sidecar;
pub use self::telemetry::Telemetry;
pub use self::validate::{drop_unknown_fields, from_value, validate, FieldError, Validated, KINDS};
pub use self::virtual_service::VirtualService;
pub use self::workload_entry::WorkloadEntry;
pub use self::workload_group::WorkloadGroup;
