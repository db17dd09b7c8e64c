//! ACLs at run time: [`Acl`] (the index of the current revision, cached;
//! the management credential; what the API and the xDS port ask) and the
//! audit log (`audit`). The pure part (principals, permissions, the index,
//! tokens) is `state::access`, re-exported here at its old paths.

pub mod acl;
pub mod audit;

pub use crate::state::access::*;
pub use crate::state::access::{index, token};
pub use acl::Acl;
