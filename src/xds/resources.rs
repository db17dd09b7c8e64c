//! What the server serves, as it sees it: translation's output types
//! (`translate::resources`, re-exported here), and the generator as the
//! server calls it, on one applied store snapshot.
//!
//! Every translation generator (`translate::resources::Generator`, which
//! takes the pure `state::State`) is one of these; a test may implement
//! this one directly to serve what it wants.

use crate::model::proxy::ProxyIdentity;
use crate::store::Applied;
use crate::translate::jwt::KeyCell;
pub use crate::translate::resources::*;
use std::sync::Arc;

/// Generation, as the xDS server sees it: a pure function of one proxy and
/// one applied store snapshot.
pub trait Generator: Send + Sync + 'static {
    fn generate(&self, proxy: &ProxyIdentity, applied: &Applied) -> Result<ProxyConfig, String>;

    /// A proxy's stream ended: drop whatever was kept for it.
    fn forget(&self, _proxy_id: &str) {}

    /// Where the generator reads fetched JWT key sets, if it uses them
    /// (see `translate::resources::Generator::key_cell`).
    fn key_cell(&self) -> Option<Arc<KeyCell>> {
        None
    }

    /// A scratch copy for previews (`translate::resources::Generator::fork`).
    fn fork(&self) -> Option<Box<dyn crate::translate::resources::Generator>> {
        None
    }

    /// The mesh it builds from `applied` (`translate::resources::Generator::mesh`).
    fn mesh(&self, _applied: &Applied) -> Option<Arc<crate::translate::mesh::Mesh>> {
        None
    }
}

/// Translation serves on the snapshot's state (no raft log id reaches it).
impl<T: crate::translate::resources::Generator> Generator for T {
    #[inline]
    fn generate(&self, proxy: &ProxyIdentity, applied: &Applied) -> Result<ProxyConfig, String> {
        crate::translate::resources::Generator::generate(self, proxy, &applied.state)
    }

    fn forget(&self, proxy_id: &str) {
        crate::translate::resources::Generator::forget(self, proxy_id)
    }

    fn key_cell(&self) -> Option<Arc<KeyCell>> {
        crate::translate::resources::Generator::key_cell(self)
    }

    fn fork(&self) -> Option<Box<dyn crate::translate::resources::Generator>> {
        crate::translate::resources::Generator::fork(self)
    }

    fn mesh(&self, applied: &Applied) -> Option<Arc<crate::translate::mesh::Mesh>> {
        crate::translate::resources::Generator::mesh(self, &applied.state)
    }
}
