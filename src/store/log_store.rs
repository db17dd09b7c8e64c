//! The raft log and raft metadata (vote, committed, last purged) in sled.
//!
//! Durability: `append` writes the entries into the `raft_log` tree and hands
//! the completion callback to a single flusher thread. The flusher takes every
//! callback queued so far, calls `flush` once (one fsync for all of them), and
//! then completes them in order. That is group commit: under load many
//! appends share one fsync, and openraft only counts an entry towards the
//! quorum after its callback fired, i.e. after it is on disk. A leader
//! replicates the entry meanwhile (our openraft patch, `vendor/openraft`):
//! its fsync and its followers' overlap. The flusher is
//! a thread blocking in sled's `flush` rather than a task awaiting
//! `flush_async`, which would add a hop through sled's thread pool to every
//! group commit.
//!
//! Purging is two steps. `purge` makes the new `last_purged` durable and
//! trims the in-memory tail, and raft moves on; a purger thread then removes
//! the purged entries from the tree, a few hundred per batch. Removing them
//! costs sled a rewrite of every leaf they sat in (about 0.5 s of CPU per
//! replica for the 10,000 entries of a snapshot at 64 clients), which raft's
//! core task used to wait for. Nothing reads below `last_purged` (raft never
//! asks, and `get_log_state` ignores what is left there), and an entry that
//! a crash left behind is removed at the next open.
//!
//! The newest entries are also kept in memory, as appended (`Tail`): raft
//! reads each one back right after appending it, once per follower to
//! replicate it and once to apply it, and serving those from sled meant a
//! tree walk and a decode each time. The tail always ends at the last
//! entry in sled (truncate and purge trim both), so a read that starts
//! inside it is answered from it alone.

use super::codec;
use super::types::{Entry, LogId, NodeId, StorageError, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{ErrorSubject, ErrorVerb, RaftLogId, Vote};
use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// Bounds of the in-memory tail: entries, and their encoded bytes.
const TAIL_MAX_ENTRIES: usize = 4096;
const TAIL_MAX_BYTES: usize = 64 << 20;

const VOTE: &[u8] = b"vote";
const COMMITTED: &[u8] = b"committed";
const LAST_PURGED: &[u8] = b"last_purged";
/// Entries the purger removes per sled batch.
const PURGE_BATCH: usize = 256;

#[derive(Clone)]
pub struct LogStore {
    db: sled::Db,
    log: sled::Tree,
    meta: sled::Tree,
    flusher: mpsc::UnboundedSender<LogFlushed<TypeConfig>>,
    /// Indexes up to which the purger removes entries from the tree.
    purger: std::sync::mpsc::Sender<u64>,
    /// One past the last purged index: reads start no lower.
    first_kept: Arc<AtomicU64>,
    tail: Arc<Mutex<Tail>>,
}

/// The newest entries, contiguous, ending at the last one in sled; each
/// with its encoded size.
#[derive(Default)]
struct Tail {
    entries: VecDeque<(Entry, usize)>,
    bytes: usize,
}

impl Tail {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.get_log_id().index)
    }

    fn push(&mut self, entry: Entry, size: usize) {
        let index = entry.get_log_id().index;
        if self.entries.back().is_some_and(|(e, _)| e.get_log_id().index + 1 != index) {
            self.clear();
        }
        self.entries.push_back((entry, size));
        self.bytes += size;
        while self.entries.len() > TAIL_MAX_ENTRIES || self.bytes > TAIL_MAX_BYTES {
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some((_, size)) = self.entries.pop_front() {
            self.bytes -= size;
        }
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Drops `index` and everything after it (truncation).
    fn truncate_from(&mut self, index: u64) {
        while self.entries.back().is_some_and(|(e, _)| e.get_log_id().index >= index) {
            let (_, size) = self.entries.pop_back().expect("checked");
            self.bytes -= size;
        }
    }

    /// Drops `index` and everything before it (purge).
    fn purge_to(&mut self, index: u64) {
        while self.first_index().is_some_and(|i| i <= index) {
            self.pop_front();
        }
    }

    /// Entries from `start` on that `range` holds, if the tail has `start`.
    fn read(&self, start: u64, range: &impl RangeBounds<u64>) -> Option<Vec<Entry>> {
        let first = self.first_index()?;
        if start < first {
            return None;
        }
        let skip = usize::try_from(start - first).ok()?;
        Some(self.entries.iter().skip(skip).map(|(e, _)| e).take_while(|e| range.contains(&e.get_log_id().index)).cloned().collect())
    }
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
    /// Open the log's trees and start its flusher and purger threads. A
    /// `last_purged` that cannot be read fails the open: the log's start
    /// would be unknown.
    pub fn open(db: &sled::Db) -> Result<LogStore, StorageError> {
        let log = db.open_tree("raft_log").map_err(read_err)?;
        let meta = db.open_tree("raft_meta").map_err(read_err)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let flush_db = db.clone();
        std::thread::Builder::new().name("lodestar-log-flush".into()).spawn(move || flusher(flush_db, rx)).map_err(write_err)?;
        let (purger, purges) = std::sync::mpsc::channel();
        let purge_log = log.clone();
        std::thread::Builder::new().name("lodestar-log-purge".into()).spawn(move || purge_loop(purge_log, purges)).map_err(write_err)?;
        let store = LogStore { db: db.clone(), log, meta, flusher: tx, purger, first_kept: Default::default(), tail: Default::default() };
        // Entries a crash left behind below `last_purged`.
        if let Some(last_purged) = store.get_meta::<LogId>(LAST_PURGED)? {
            store.first_kept.store(last_purged.index + 1, Ordering::Release);
            let _ = store.purger.send(last_purged.index);
        }
        Ok(store)
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

/// Removes entries up to each index it receives, oldest first, in batches
/// of `PURGE_BATCH`. Runs until every `LogStore` clone is gone. A failed
/// removal is logged and left: the entries stay unread below `last_purged`
/// and the next purge or open retries.
fn purge_loop(log: sled::Tree, purges: std::sync::mpsc::Receiver<u64>) {
    while let Ok(mut upto) = purges.recv() {
        while let Ok(later) = purges.try_recv() {
            upto = upto.max(later);
        }
        if let Err(e) = remove_upto(&log, upto) {
            tracing::warn!(upto, "removing purged raft log entries: {e}");
        }
    }
}

/// Each batch's scan starts after the last key the previous one removed,
/// not at the front of the tree again.
fn remove_upto(log: &sled::Tree, upto: u64) -> sled::Result<()> {
    let mut from = [0u8; 8];
    loop {
        let mut batch = sled::Batch::default();
        let mut last = None;
        for item in log.range(from..=index_key(upto)).take(PURGE_BATCH) {
            let (key, _) = item?;
            last = Some(key_index(&key).unwrap_or(upto));
            batch.remove(key);
        }
        let Some(last) = last else { return Ok(()) };
        log.apply_batch(batch)?;
        if last >= upto {
            return Ok(());
        }
        from = index_key(last + 1);
    }
}

fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

/// The index a log key holds; None for a key of another length.
fn key_index(key: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(key.try_into().ok()?))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(&mut self, range: RB) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        // Purged entries the purger has not removed yet are not read.
        let start = start.max(self.first_kept.load(Ordering::Acquire));
        if let Some(entries) = self.tail.lock().unwrap_or_else(|p| p.into_inner()).read(start, &range) {
            return Ok(entries);
        }
        let mut out = Vec::new();
        for item in self.log.range(index_key(start)..) {
            let (k, v) = item.map_err(read_err)?;
            let idx = key_index(&k).ok_or_else(|| read_err(std::io::Error::other("bad log key")))?;
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
        // What the purger has yet to remove (below last_purged) does not count.
        let last = match self.log.last().map_err(read_err)? {
            Some((_, v)) => Some(*codec::decode::<Entry>(&v).map_err(read_err)?.get_log_id()).max(last_purged),
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
        // Not flushed on its own: it rides along with the next log flush. It
        // may lag after a crash: a follower learns the commit index from the
        // leader again, and a restarted leader starts as a follower (our
        // openraft patch). It never gets ahead of this log on disk: a leader
        // may commit an entry before its own flush of it (its followers hold
        // it), but the entry was inserted first, and sled recovers a prefix
        // of its writes in order.
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
            let bytes = codec::encode(&entry);
            let size = bytes.len();
            if let Err(e) = self.log.insert(index_key(entry.get_log_id().index), bytes) {
                // What sled holds now is unknown: read it from there.
                self.tail.lock().unwrap_or_else(|p| p.into_inner()).clear();
                return Err(write_err(e));
            }
            self.tail.lock().unwrap_or_else(|p| p.into_inner()).push(entry, size);
        }
        // The flusher only stops when the store is dropped, and then raft is gone too.
        let _ = self.flusher.send(callback);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.tail.lock().unwrap_or_else(|p| p.into_inner()).truncate_from(log_id.index);
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
        self.tail.lock().unwrap_or_else(|p| p.into_inner()).purge_to(log_id.index);
        self.first_kept.fetch_max(log_id.index + 1, Ordering::AcqRel);
        // The purger thread lives as long as any clone of this store.
        let _ = self.purger.send(log_id.index);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::state_machine::StateMachine;
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::{CommittedLeaderId, EntryPayload};

    /// A store on a fresh sled database in a temporary directory.
    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
        async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
            let dir = tempfile::tempdir().map_err(read_err)?;
            let db = crate::store::open_db(dir.path(), crate::store::DEFAULT_CACHE_BYTES).map_err(read_err)?;
            let log = LogStore::open(&db)?;
            let (sm, _reader) = StateMachine::open(&db, 1000).map_err(read_err)?;
            Ok((dir, log, sm))
        }
    }

    /// openraft's own conformance suite for log storage and state machine
    /// (appends, reads, truncation, purge, membership, snapshots).
    #[test]
    fn openraft_storage_suite() {
        Suite::test_all(Builder).unwrap();
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// Writes entries straight into the tree, as appends (or a crash) leave them.
    fn put(store: &LogStore, indexes: impl IntoIterator<Item = u64>) {
        for i in indexes {
            store.log.insert(index_key(i), codec::encode(&blank(i))).unwrap();
        }
    }

    fn keys_upto(store: &LogStore, upto: u64) -> usize {
        store.log.range(..=index_key(upto)).count()
    }

    async fn until_removed(store: &LogStore, upto: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while keys_upto(store, upto) > 0 {
            assert!(std::time::Instant::now() < deadline, "purged entries still in the tree after 10 s");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    /// `purge` returns before the entries leave the tree; the purger removes
    /// them after. Meanwhile nothing below `last_purged` is read or counted,
    /// and entries a crash left there are removed when the store opens again.
    #[tokio::test]
    async fn purged_entries_are_never_read_and_leave_the_tree_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::open_db(dir.path(), crate::store::DEFAULT_CACHE_BYTES).unwrap();
        let mut store = LogStore::open(&db).unwrap();
        put(&store, 1..=1000);

        store.purge(log_id(700)).await.unwrap();
        let read: Vec<u64> = store.try_get_log_entries(0..=1000).await.unwrap().iter().map(|e| e.log_id.index).collect();
        assert_eq!(read, (701..=1000).collect::<Vec<_>>());
        let state = store.get_log_state().await.unwrap();
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(700)), Some(log_id(1000))));
        until_removed(&store, 700).await;
        assert_eq!(store.log.len(), 300);

        // Everything purged: the last log id is the purged one, whatever is left.
        store.purge(log_id(1000)).await.unwrap();
        let state = store.get_log_state().await.unwrap();
        assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(1000)), Some(log_id(1000))));
        until_removed(&store, 1000).await;

        // A crash left entries below last_purged: opening again removes them.
        put(&store, 990..=1000);
        drop(store);
        let mut store = LogStore::open(&db).unwrap();
        assert!(store.try_get_log_entries(0..=1000).await.unwrap().is_empty());
        until_removed(&store, 1000).await;
        assert!(store.log.is_empty());
    }

    /// An unreadable `last_purged` fails the open instead of being taken
    /// for "nothing purged" (the log would seem to start at 0).
    #[test]
    fn an_unreadable_last_purged_fails_the_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::store::open_db(dir.path(), crate::store::DEFAULT_CACHE_BYTES).unwrap();
        db.open_tree("raft_meta").unwrap().insert(LAST_PURGED, b"not a log id".as_slice()).unwrap();
        let err = LogStore::open(&db).err().expect("open fails");
        assert!(err.to_string().contains("read"), "{err}");
    }

    fn blank(index: u64) -> Entry {
        Entry { log_id: log_id(index), payload: EntryPayload::Blank }
    }

    fn read(tail: &Tail, range: impl RangeBounds<u64>) -> Option<Vec<u64>> {
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        };
        tail.read(start, &range).map(|v| v.iter().map(|e| e.log_id.index).collect())
    }

    /// The tail answers exactly the reads that start inside it, stays
    /// bounded, and follows truncation, purge and a gap.
    #[test]
    fn the_in_memory_tail() {
        let mut tail = Tail::default();
        let n = TAIL_MAX_ENTRIES as u64 + 100;
        for i in 1..=n {
            tail.push(blank(i), 10);
        }
        let first = n - TAIL_MAX_ENTRIES as u64 + 1;
        assert_eq!((tail.first_index(), tail.entries.len(), tail.bytes), (Some(first), TAIL_MAX_ENTRIES, TAIL_MAX_ENTRIES * 10));
        assert_eq!(read(&tail, first - 1..), None, "starts before the tail: read from sled");
        assert_eq!(read(&tail, first..first + 3), Some(vec![first, first + 1, first + 2]));
        assert_eq!(read(&tail, n - 1..=n + 5), Some(vec![n - 1, n]));
        assert_eq!(read(&tail, n + 1..), Some(vec![]));
        tail.truncate_from(n - 10);
        assert_eq!(read(&tail, n - 12..), Some(vec![n - 12, n - 11]));
        tail.push(blank(n - 10), 10);
        assert_eq!(read(&tail, n - 11..), Some(vec![n - 11, n - 10]));
        tail.purge_to(first + 5);
        assert_eq!(read(&tail, first + 5..first + 7), None);
        assert_eq!(read(&tail, first + 6..first + 8), Some(vec![first + 6, first + 7]));
        // Not contiguous: start over from the new entry.
        tail.push(blank(n + 5), 10);
        assert_eq!((tail.first_index(), tail.bytes), (Some(n + 5), 10));
        let huge = TAIL_MAX_BYTES / 2 + 1;
        tail.push(blank(n + 6), huge);
        tail.push(blank(n + 7), huge);
        assert_eq!((tail.first_index(), tail.bytes), (Some(n + 7), huge), "bounded by bytes");
    }
}
