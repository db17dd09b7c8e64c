//! The raft log and raft metadata (vote, committed, last purged) in sled.
//!
//! Durability: `append` writes the entries into the `raft_log` tree and hands
//! the completion callback to a single flusher thread. The flusher takes every
//! callback queued so far, calls `flush` once (one fsync for all of them), and
//! then completes them in order. That is group commit: under load many
//! appends share one fsync, and openraft only counts an entry towards the
//! quorum after its callback fired, i.e. after it is on disk. The flusher is
//! a thread blocking in sled's `flush` rather than a task awaiting
//! `flush_async`, which would add a hop through sled's thread pool to every
//! group commit.

use super::codec;
use super::types::{Entry, LogId, NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogId, Vote};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use tokio::sync::mpsc;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";

#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    flusher: mpsc::UnboundedSender<LogFlushed<TypeConfig>>,
}

fn io_err(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::error::Error + 'static) -> StorageError {
    StorageError::from_io_error(subject, verb, std::io::Error::other(e.to_string()))
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Read, e)
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    io_err(ErrorSubject::Logs, ErrorVerb::Write, e)
}

impl LogStore {
    pub fn open(db: &sled::Db) -> Result<LogStore, sled::Error> {
        let log = db.open_tree("raft_log")?;
        let meta = db.open_tree("raft_meta")?;
        let (tx, rx) = mpsc::unbounded_channel();
        let flush_db = db.clone();
        std::thread::Builder::new().name("lodestar-log-flush".into()).spawn(move || flusher(flush_db, rx))?;
        Ok(LogStore { db: db.clone(), log, meta, flusher: tx })
    }

    fn get_meta<T: serde::de::DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, StorageError> {
        match self.meta.get(key).map_err(read_err)? {
            None => Ok(None),
            Some(v) => Ok(Some(codec::decode(&v).map_err(read_err)?)),
        }
    }

    async fn put_meta_durable<T: serde::Serialize>(&self, key: &[u8], value: &T) -> Result<(), StorageError> {
        self.meta.insert(key, codec::encode(value)).map_err(write_err)?;
        self.db.flush_async().await.map_err(write_err)?;
        Ok(())
    }
}

/// The log of a restored replica (`store::backup`): empty, purged up to
/// `log_id` (the restored snapshot's) and committed up to it. Written
/// directly rather than through a `LogStore`, whose flusher thread would keep
/// the database open after the restore returns.
pub(crate) fn write_restored(db: &sled::Db, log_id: LogId) -> sled::Result<()> {
    let meta = db.open_tree("raft_meta")?;
    meta.insert(LAST_PURGED, codec::encode(&log_id))?;
    meta.insert(COMMITTED, codec::encode(&Some(log_id)))?;
    Ok(())
}

/// Runs until every `LogStore` clone (and so every sender) is gone.
fn flusher(db: sled::Db, mut rx: mpsc::UnboundedReceiver<LogFlushed<TypeConfig>>) {
    let mut pending = Vec::new();
    while let Some(first) = rx.blocking_recv() {
        pending.push(first);
        while let Ok(more) = rx.try_recv() {
            pending.push(more);
        }
        let result = db.flush().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string()));
        for cb in pending.drain(..) {
            cb.log_io_completed(result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string())));
        }
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(&mut self, range: RB) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        let mut out = Vec::new();
        for item in self.log.range(index_key(start)..) {
            let (k, v) = item.map_err(read_err)?;
            let idx = u64::from_be_bytes(k.as_ref().try_into().map_err(|_| read_err(std::io::Error::other("bad log key")))?);
            if !range.contains(&idx) {
                break;
            }
            out.push(codec::decode::<Entry>(&v).map_err(read_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(LAST_PURGED)?;
        let last = match self.log.last().map_err(read_err)? {
            Some((_, v)) => Some(*codec::decode::<Entry>(&v).map_err(read_err)?.get_log_id()),
            None => last_purged,
        };
        Ok(LogState { last_purged_log_id: last_purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.put_meta_durable(VOTE, vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.get_meta(VOTE)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // Not flushed on its own: it rides along with the next log flush. After
        // a crash openraft recomputes the commit index with its peers.
        self.meta.insert(COMMITTED, codec::encode(&committed)).map_err(write_err)?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.get_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        // One insert per entry, not an `apply_batch`: sled writes out (and
        // syncs) its IO buffer twice around every batch to pin it, which
        // cost two small synchronous writes per append on the raft core
        // task. Atomicity is not needed here: sled recovers its log in
        // order, so a crash keeps a prefix of these entries, and raft only
        // counts them once the flush below has made all of them durable.
        for entry in entries {
            self.log.insert(index_key(entry.get_log_id().index), codec::encode(&entry)).map_err(write_err)?;
        }
        // The flusher only stops when the store is dropped, and then raft is gone too.
        let _ = self.flusher.send(callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut batch = sled::Batch::default();
        for item in self.log.range(index_key(log_id.index)..) {
            batch.remove(item.map_err(read_err)?.0);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        self.db.flush_async().await.map_err(write_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.put_meta_durable(LAST_PURGED, &log_id).await?;
        let mut batch = sled::Batch::default();
        for item in self.log.range(..=index_key(log_id.index)) {
            batch.remove(item.map_err(read_err)?.0);
        }
        self.log.apply_batch(batch).map_err(write_err)?;
        Ok(())
    }
}
