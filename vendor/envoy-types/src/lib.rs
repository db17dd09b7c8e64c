#![doc = include_str!("../README.md")]
#![warn(missing_debug_implementations, rust_2018_idioms)]
#![allow(missing_docs, rustdoc::invalid_html_tags, rustdoc::bare_urls)]

#[rustfmt::skip]
#[allow(clippy::all)]
mod generated;

/// Compiled protobuf types
pub mod pb {
    pub use crate::generated::*;
}

/// Convenience mod for `ext_authz` server implementation
#[cfg(feature = "grpc")]
pub mod ext_authz;
pub mod util;

#[cfg(feature = "grpc")]
mod sealed {
    pub trait Sealed {}
}
