//! The replicated store: openraft over sled.
//!
//! - `types`: the raft type config and the commands in the log.
//! - `codec`: the versioned encoding of everything persisted or sent to peers.
//! - `state`: the pure in-memory state and transaction semantics.
//! - `log_store`: the raft log in sled, with group-commit fsync.
//! - `state_machine`: applies entries, persists them, publishes snapshots.
//! - `watch`: history replay plus live changes.

pub mod codec;
pub mod log_store;
pub mod state;
pub mod state_machine;
pub mod types;
pub mod watch;

pub use state::{Event, EventType, State};
pub use state_machine::{Applied, StoreReader};
pub use types::{Command, NodeId, NodeInfo, Op, Raft, Txn, TxnOk, TypeConfig};
