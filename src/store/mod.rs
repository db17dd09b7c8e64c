//! The replicated store: openraft over sled. The pure state it applies to
//! is `crate::state` (re-exported here at its old paths).
//!
//! - `types`: the raft type config and the commands in the log.
//! - `codec`: the versioned encoding of everything persisted or sent to peers.
//! - `log_store`: the raft log in sled, with group-commit fsync.
//! - `state_machine`: applies entries, persists them, publishes snapshots.
//! - `watch`: history replay plus live changes.
//! - `retention`: how far back the history reaches (count and age).
//! - `backup`: backup files (one revision, checksummed) and offline restore
//!   into a new cluster's data directory.

pub mod backup;
pub mod codec;
pub mod log_store;
pub mod retention;
pub mod state_machine;
pub mod types;
pub mod watch;

// The pure state moved to `crate::state`; its old paths stay.
pub use crate::state::{self, dedup, objects, Event, EventType, State};
pub use state_machine::{Applied, StoreReader};
pub use types::{Command, NodeId, NodeInfo, Op, Raft, Txn, TxnOk, TypeConfig};

/// sled's page cache when nothing else is asked (`store_cache_bytes`).
pub const DEFAULT_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Create a replica's data directory, its owner's only (0700, and any
/// parent it has to create): it holds the store, the management token, the
/// TLS keys and the mesh CA. One that exists is used as it is, with a
/// warning when others may read it.
pub fn create_data_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    if !dir.exists() {
        return std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir);
    }
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(dir = %dir.display(), mode = format!("{:o}", mode & 0o777), "the data directory may be read by other users (chmod 700 it)");
    }
    Ok(())
}

/// Open a replica's sled database (`DATA_DIR/db`): the raft log, raft
/// metadata, state machine and snapshots. One process at a time.
/// `cache_bytes` bounds sled's page cache: the applied state is in memory
/// already (`StoreReader`), so the cache only serves the log and writes
/// (sled's own default is 1 GiB; `benches/RESULTS.md`, issue 33).
pub fn open_db(data_dir: &std::path::Path, cache_bytes: u64) -> sled::Result<sled::Db> {
    sled::Config::new().path(data_dir.join("db")).mode(sled::Mode::HighThroughput).cache_capacity(cache_bytes).open()
}
