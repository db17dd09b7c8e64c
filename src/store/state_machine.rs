//! The raft state machine: applies committed entries to the in-memory
//! [`State`], persists the result in sled, and publishes each applied state as
//! an immutable snapshot (`watch` channel) plus its change events (broadcast).
//!
//! sled layout (tree `state`, one tree so that every checkpoint is one
//! atomic `apply_batch`):
//!   `o/<key>`                 ObjectRecord            the current objects
//!   `g/<first BE><last BE>`   Vec<(u64, Vec<EventRecord>)>
//!                                                     watch history of revisions first..=last,
//!                                                     the last `history_limit` revisions
//!   `h/<rev BE>`              Vec<EventRecord>        history of one revision (written by
//!                                                     earlier versions; read, then compacted away)
//!   `a/<rev BE>`              Author                  who made revision `rev` (wire version 2:
//!                                                     `Op::Author`; compacted with the history)
//!   `t/<slot ms BE>`          retention::Mark         when revisions were made (`Command::Stamped`),
//!                                                     one mark a slot; compacted with the history
//!   `m/applied`               AppliedMeta             last applied log id, membership, revision
//!   `m/objects`               u64                     the revision the `o/` objects are at
//!                                                     (absent, as earlier versions wrote it: `m/applied`'s)
//!   `m/dedup`                 Dedup                   applied request ids (`dedup`), as of `m/applied`
//!                                                     (absent: none yet, or written by an earlier version)
//! tree `snapshot`: `current` → StoredSnapshot, the last built or installed one.
//!
//! Write-behind, as etcd's backend batches its bbolt commits: `apply`
//! updates the in-memory state and queues the sled writes, in two streams:
//! - the history (every revision's events, whole objects included) and
//!   `m/applied`, one atomic batch every [`CHECKPOINT_INTERVAL`] or
//!   [`CHECKPOINT_OPS`] queued revisions, whichever comes first;
//! - the objects, coalesced (an object written many times is written once)
//!   for up to [`OBJECTS_INTERVAL`] or [`OBJECTS_MAX`] distinct objects, then
//!   written with `m/objects` in one batch, off the apply path. The history
//!   up to that revision is written first.
//!
//! Loading reads the `o/` objects at `m/objects`, then replays the history
//! chunks after it up to `m/applied`: the history is kept (not compacted)
//! past `m/objects` for this. Everything is written on shutdown. Nothing is
//! lost by a crash in between: the raft log is the durable record, and
//! openraft re-applies it from the `last_applied` of the last checkpoint
//! (or installs the saved snapshot when that is newer, see `open`). Readers
//! never see the difference: they read the in-memory state, and history
//! reads look at the queue first.

use super::codec;
use super::retention::{Mark, Retention, Times};
use super::types::{Author, Command, Entry, Group, LogId, Response, SnapshotMeta, StorageError, StoredMembership, Txn, TxnResult, TypeConfig};
use crate::model::{ResourceKey, StoredObject};
use crate::state::dedup::Dedup;
use crate::state::{Event, EventType, State};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch};

const APPLIED: &[u8] = b"m/applied";
const OBJECTS_AT: &[u8] = b"m/objects";
const DEDUP: &[u8] = b"m/dedup";
const CURRENT_SNAPSHOT: &[u8] = b"current";

/// Longest time applied state waits in memory before it is written to sled.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);
/// Queued revisions that trigger a checkpoint at once.
pub const CHECKPOINT_OPS: usize = 10_000;
/// Longest time a changed object waits before it is written to `o/`.
pub const OBJECTS_INTERVAL: Duration = Duration::from_secs(5);
/// Distinct changed objects that get written to `o/` at the next tick.
pub const OBJECTS_MAX: usize = 20_000;
/// The longest compaction goes unreported in the log.
const COMPACTION_REPORT_INTERVAL: Duration = Duration::from_secs(60);
/// History chunks are cut at about this many encoded bytes.
const CHUNK_BYTES: usize = 64 * 1024;

/// The applied state at one log position: what every reader sees, whole.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub state: State,
    /// Watch history covers revisions `> compacted`.
    pub compacted: u64,
    /// Request ids applied recently, with their results (`dedup`).
    pub dedup: Dedup,
    /// When the retained revisions were made (`retention`).
    pub times: Times,
}

/// An applied snapshot reads as its state: what translation and the
/// other pure steps take (`&State`), without raft's log id.
impl std::ops::Deref for Applied {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl Applied {
    pub fn revision(&self) -> u64 {
        self.state.revision
    }
    pub fn applied_index(&self) -> u64 {
        self.last_applied.map_or(0, |l| l.index)
    }
}

/// What live watchers receive after each apply.
#[derive(Debug, Clone)]
pub enum WatchMsg {
    Events(Arc<Vec<Event>>),
    /// State replaced by a snapshot: history before it is gone.
    Reset,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ObjectRecord {
    key: ResourceKey,
    create_revision: u64,
    mod_revision: u64,
    version: u64,
    body: String,
}

impl ObjectRecord {
    pub(crate) fn from_object(o: &StoredObject) -> Self {
        ObjectRecord { key: o.key.clone(), create_revision: o.create_revision, mod_revision: o.mod_revision, version: o.version, body: o.text().to_string() }
    }
    /// The object, its body kept as text until read (see
    /// `StoredObject::from_stored_text`).
    pub(crate) fn into_object(self) -> Result<StoredObject, serde_json::Error> {
        StoredObject::from_stored_text(self.key, self.create_revision, self.mod_revision, self.version, Arc::from(self.body))
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EventRecord {
    delete: bool,
    object: ObjectRecord,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct AppliedMeta {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    revision: u64,
    compacted: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct SnapshotBody {
    meta: AppliedMeta,
    objects: Vec<ObjectRecord>,
}

#[derive(Debug, Serialize, Deserialize)]
struct StoredSnapshot {
    meta: SnapshotMeta,
    data: Vec<u8>,
}

/// A log position for a log line (`T1-N1-42`; `none`), not its Debug form.
fn log_id(id: &Option<LogId>) -> String {
    id.map_or_else(|| "none".to_string(), |l| l.to_string())
}

fn sm_err(verb: ErrorVerb, e: impl ToString) -> StorageError {
    StorageError::from_io_error(ErrorSubject::StateMachine, verb, std::io::Error::other(e.to_string()))
}

fn snap_err(verb: ErrorVerb, e: impl ToString) -> StorageError {
    StorageError::from_io_error(ErrorSubject::Snapshot(None), verb, std::io::Error::other(e.to_string()))
}

fn object_key(key: &ResourceKey) -> Vec<u8> {
    let mut k = b"o/".to_vec();
    k.extend(codec::encode(key));
    k
}

fn history_key(rev: u64) -> Vec<u8> {
    let mut k = b"h/".to_vec();
    k.extend(rev.to_be_bytes());
    k
}

fn author_key(rev: u64) -> Vec<u8> {
    let mut k = b"a/".to_vec();
    k.extend(rev.to_be_bytes());
    k
}

fn mark_key(slot: u64) -> Vec<u8> {
    let mut k = b"t/".to_vec();
    k.extend(slot.to_be_bytes());
    k
}

fn chunk_key(first: u64, last: u64) -> Vec<u8> {
    let mut k = b"g/".to_vec();
    k.extend(first.to_be_bytes());
    k.extend(last.to_be_bytes());
    k
}

/// The (first, last) revisions of a chunk key.
fn chunk_range(key: &[u8]) -> Option<(u64, u64)> {
    let rest = key.strip_prefix(b"g/")?;
    let first = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let last = u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?);
    Some((first, last))
}

/// The last history chunk that starts at or before `rev` (it holds `rev`
/// if any chunk does).
fn chunk_from(tree: &sled::Tree, rev: u64) -> sled::Result<Option<(sled::IVec, sled::IVec)>> {
    tree.range(chunk_key(0, 0)..=chunk_key(rev, u64::MAX)).next_back().transpose()
}

fn to_events(rev: u64, records: Vec<EventRecord>) -> Result<Vec<Event>, String> {
    records
        .into_iter()
        .map(|r| {
            let kind = if r.delete { EventType::Delete } else { EventType::Put };
            Ok(Event { revision: rev, kind, object: Arc::new(r.object.into_object().map_err(|e| e.to_string())?) })
        })
        .collect()
}

/// Applied state not yet written to sled (see the module doc).
#[derive(Default)]
struct Pending {
    /// Object key → the object, `None` for a delete; the last write wins.
    objects: HashMap<Vec<u8>, Option<Arc<StoredObject>>>,
    /// When the oldest queued object was queued.
    objects_since: Option<Instant>,
    /// The revision of the last applied entry: what `objects` bring `o/` to.
    revision: u64,
    /// The events of each revision, in order: as records to write, and as
    /// events for history reads meanwhile.
    history: Vec<(u64, Vec<EventRecord>, Vec<Event>)>,
    /// Who made each revision that says (`Op::Author`), in order.
    authors: Vec<(u64, Author)>,
    /// Marks of when revisions were made, new or moved, in order.
    marks: Vec<Mark>,
    meta: Option<AppliedMeta>,
    /// The dedup table as of `meta`, when it changed since the last write.
    dedup: Option<Dedup>,
    /// When the oldest queued write was queued.
    since: Option<Instant>,
}

/// The queue and the tree it drains into; shared by the state machine, the
/// readers and the checkpoint timer.
struct Checkpointer {
    tree: sled::Tree,
    pending: Mutex<Pending>,
    /// Held while `o/` is written (or replaced by a snapshot): one writer at
    /// a time, in order. Taken before `pending`, never after.
    objects_writer: Mutex<()>,
    /// The revision `o/` is at in sled (`m/objects`): history after it is
    /// kept, loading replays it.
    objects_at: AtomicU64,
}

impl Checkpointer {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Write the queued history and `m/applied`, in one atomic batch.
    fn flush(&self) -> Result<(), StorageError> {
        let mut p = self.lock();
        self.flush_locked(&mut p)
    }

    /// Write everything queued: the history first, then the objects, each in
    /// one atomic batch. Apply goes on meanwhile: `pending` is only held to
    /// write the history and to take the objects. A write that fails leaves
    /// them queued (a later one must not move `m/objects` past objects that
    /// were never written).
    fn flush_all(&self) -> Result<(), StorageError> {
        let _writer = self.objects_writer.lock().unwrap_or_else(|e| e.into_inner());
        let (objects, revision, since) = {
            let mut p = self.lock();
            self.flush_locked(&mut p)?;
            (std::mem::take(&mut p.objects), p.revision, p.objects_since.take())
        };
        if objects.is_empty() {
            return Ok(());
        }
        let mut batch = sled::Batch::default();
        for (key, object) in &objects {
            match object {
                Some(o) => batch.insert(key.as_slice(), codec::encode(&ObjectRecord::from_object(o))),
                None => batch.remove(key.as_slice()),
            }
        }
        batch.insert(OBJECTS_AT, codec::encode(&revision));
        if let Err(e) = self.tree.apply_batch(batch) {
            let mut p = self.lock();
            for (key, object) in objects {
                // What was queued since is newer: it stays.
                p.objects.entry(key).or_insert(object);
            }
            p.objects_since = since.or(p.objects_since);
            return Err(sm_err(ErrorVerb::Write, e));
        }
        self.objects_at.store(revision, Ordering::Release);
        Ok(())
    }

    /// The queued history and `m/applied`, in one batch; left queued if
    /// the write fails.
    fn flush_locked(&self, p: &mut Pending) -> Result<(), StorageError> {
        let Some(meta) = &p.meta else {
            return Ok(());
        };
        let mut batch = sled::Batch::default();
        let mut chunk: Vec<(u64, &Vec<EventRecord>)> = Vec::new();
        let mut chunk_bytes = 0;
        for (rev, records, _) in &p.history {
            let rev = *rev;
            chunk_bytes += records.iter().map(|r| r.object.body.len() + 64).sum::<usize>();
            chunk.push((rev, records));
            if chunk_bytes >= CHUNK_BYTES {
                batch.insert(chunk_key(chunk[0].0, rev), codec::encode(&chunk));
                chunk.clear();
                chunk_bytes = 0;
            }
        }
        if let (Some(first), Some(last)) = (chunk.first(), chunk.last()) {
            batch.insert(chunk_key(first.0, last.0), codec::encode(&chunk));
        }
        // Compaction: whole chunks at or below `compacted` (chunks are in
        // revision order and do not overlap), and old per-revision keys.
        // Chunks after `o/`'s revision stay: loading replays them.
        let compact = meta.compacted.min(self.objects_at.load(Ordering::Acquire));
        for item in self.tree.range(chunk_key(0, 0)..chunk_key(compact.saturating_add(1), 0)) {
            let (key, _) = item.map_err(|e| sm_err(ErrorVerb::Read, e))?;
            match chunk_range(&key) {
                Some((_, last)) if last <= compact => batch.remove(key),
                _ => break,
            }
        }
        for item in self.tree.range(history_key(0)..=history_key(compact)) {
            batch.remove(item.map_err(|e| sm_err(ErrorVerb::Read, e))?.0);
        }
        for (rev, author) in &p.authors {
            batch.insert(author_key(*rev), codec::encode(author));
        }
        for item in self.tree.range(author_key(0)..=author_key(compact)) {
            batch.remove(item.map_err(|e| sm_err(ErrorVerb::Read, e))?.0);
        }
        for mark in &p.marks {
            batch.insert(mark_key(mark.slot_ms), codec::encode(mark));
        }
        // Marks of compacted revisions, but the last (it dates them).
        let mut before: Option<sled::IVec> = None;
        for item in self.tree.scan_prefix(b"t/") {
            let (key, bytes) = item.map_err(|e| sm_err(ErrorVerb::Read, e))?;
            let mark: Mark = codec::decode(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e))?;
            if mark.revision > compact {
                break;
            }
            if let Some(k) = before.replace(key) {
                batch.remove(k);
            }
        }
        batch.insert(APPLIED, codec::encode(meta));
        if let Some(dedup) = &p.dedup {
            batch.insert(DEDUP, codec::encode(dedup));
        }
        self.tree.apply_batch(batch).map_err(|e| sm_err(ErrorVerb::Write, e))?;
        p.history.clear();
        p.authors.clear();
        p.marks.clear();
        p.meta = None;
        p.dedup = None;
        p.since = None;
        Ok(())
    }

    /// Who made each revision in `from..=to` that says (queued or written).
    fn authors(&self, from: u64, to: u64) -> Result<BTreeMap<u64, Author>, String> {
        let p = self.lock();
        let mut out = BTreeMap::new();
        for item in self.tree.range(author_key(from)..=author_key(to)) {
            let (key, bytes) = item.map_err(|e| e.to_string())?;
            let rev = u64::from_be_bytes(key[2..].try_into().map_err(|_| "a malformed author key".to_string())?);
            out.insert(rev, codec::decode(&bytes).map_err(|e| e.to_string())?);
        }
        out.extend(p.authors.iter().filter(|(r, _)| (from..=to).contains(r)).cloned());
        Ok(out)
    }

    /// The events from revision `rev` on that one read can give (at least
    /// `rev`'s own, if it is still in the history), and the last revision
    /// covered. Looks at the queue and the tree under one lock, so that a
    /// checkpoint moving them in between cannot hide them.
    fn history_from(&self, rev: u64) -> Result<(Vec<Event>, u64), String> {
        let p = self.lock();
        if let Some(i) = p.history.iter().position(|(r, _, _)| *r == rev) {
            let events = p.history[i..].iter().flat_map(|(_, _, e)| e.iter().cloned()).collect();
            return Ok((events, p.history.last().map_or(rev, |h| h.0)));
        }
        let chunk = chunk_from(&self.tree, rev).map_err(|e| e.to_string())?;
        if let Some((key, bytes)) = chunk {
            if let Some((_, last)) = chunk_range(&key).filter(|(first, last)| *first <= rev && rev <= *last) {
                let revisions: Vec<(u64, Vec<EventRecord>)> = codec::decode(&bytes).map_err(|e| e.to_string())?;
                let mut events = Vec::new();
                for (r, records) in revisions.into_iter().filter(|(r, _)| *r >= rev) {
                    events.extend(to_events(r, records)?);
                }
                return Ok((events, last));
            }
        }
        let Some(bytes) = self.tree.get(history_key(rev)).map_err(|e| e.to_string())? else {
            return Ok((Vec::new(), rev));
        };
        Ok((to_events(rev, codec::decode(&bytes).map_err(|e| e.to_string())?)?, rev))
    }
}

/// Checkpoints the queued history every `CHECKPOINT_INTERVAL` when writes
/// stop (a busy state machine checkpoints it as it applies), and the queued
/// objects when they are due, on a blocking thread. Ends with the store.
fn spawn_checkpoint_timer(checkpointer: Weak<Checkpointer>) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return; // no runtime (offline tools): the state machine's drop flushes
    };
    rt.spawn(async move {
        let mut tick = tokio::time::interval(CHECKPOINT_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(c) = checkpointer.upgrade() else { return };
            let (due, objects_due) = {
                let p = c.lock();
                let objects_due = p.objects.len() >= OBJECTS_MAX || p.objects_since.is_some_and(|t| t.elapsed() >= OBJECTS_INTERVAL);
                (p.since.is_some_and(|t| t.elapsed() >= CHECKPOINT_INTERVAL), objects_due)
            };
            if objects_due {
                match tokio::task::spawn_blocking(move || c.flush_all()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "writing the state checkpoint"),
                    Err(e) => tracing::error!(error = %e, "writing the state checkpoint"),
                }
            } else if due {
                if let Err(e) = c.flush() {
                    tracing::error!(error = %e, "writing the state checkpoint");
                }
            }
        }
    });
}

/// Read access shared by the API, xDS and watch streams.
#[derive(Clone)]
pub struct StoreReader {
    checkpointer: Arc<Checkpointer>,
    applied: watch::Receiver<Arc<Applied>>,
    events: broadcast::Sender<WatchMsg>,
}

impl StoreReader {
    /// The latest applied state: one revision, never a mix.
    pub fn current(&self) -> Arc<Applied> {
        self.applied.borrow().clone()
    }
    pub fn subscribe_applied(&self) -> watch::Receiver<Arc<Applied>> {
        self.applied.clone()
    }
    pub fn subscribe_events(&self) -> broadcast::Receiver<WatchMsg> {
        self.events.subscribe()
    }
    /// History from revision `rev` on: the events of `rev` and of the
    /// revisions after it that the same read covers, in order, and the last
    /// revision covered (no events for `rev`: it is not in the history).
    pub fn history_from(&self, rev: u64) -> Result<(Vec<Event>, u64), String> {
        self.checkpointer.history_from(rev)
    }

    /// Who made each revision in `from..=to` that says (`Op::Author`).
    pub fn authors(&self, from: u64, to: u64) -> Result<BTreeMap<u64, Author>, String> {
        self.checkpointer.authors(from, to)
    }

    /// Write everything applied and still queued (history, then objects).
    /// A graceful shutdown calls it before its final sled flush, so that
    /// dropping the state machine later has nothing left to write.
    pub fn checkpoint(&self) -> Result<(), StorageError> {
        self.checkpointer.flush_all()
    }
}

pub struct StateMachine {
    tree: sled::Tree,
    checkpointer: Arc<Checkpointer>,
    snapshots: sled::Tree,
    db: sled::Db,
    current: Arc<Applied>,
    applied_tx: watch::Sender<Arc<Applied>>,
    events: broadcast::Sender<WatchMsg>,
    retention: Retention,
    /// When compaction was last reported, and up to which revision.
    compaction_reported: Option<(Instant, u64)>,
    snapshot_seq: Arc<AtomicU64>,
}

impl StateMachine {
    /// Load the persisted state. If the last saved snapshot is newer than the
    /// persisted applied state (a crash between saving a snapshot and
    /// flushing the state), the state is rebuilt from the snapshot.
    pub fn open(db: &sled::Db, retention: impl Into<Retention>) -> Result<(StateMachine, StoreReader), StorageError> {
        let retention = retention.into();
        let tree = db.open_tree("state").map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let snapshots = db.open_tree("snapshot").map_err(|e| snap_err(ErrorVerb::Read, e))?;
        let (mut applied, mut objects_at, mut replayed) = load_applied(&tree)?;
        if let Some(bytes) = snapshots.get(CURRENT_SNAPSHOT).map_err(|e| snap_err(ErrorVerb::Read, e))? {
            let snap: StoredSnapshot = codec::decode(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?;
            if snap.meta.last_log_id > applied.last_applied {
                tracing::warn!(snapshot = %log_id(&snap.meta.last_log_id), applied = %log_id(&applied.last_applied), "state older than the saved snapshot; restoring from it");
                applied = write_snapshot_state(&tree, &snap.data)?;
                objects_at = applied.state.revision;
                replayed.clear();
            }
        }
        let current = Arc::new(applied);
        let (applied_tx, applied_rx) = watch::channel(current.clone());
        let (events, _) = broadcast::channel(1024);
        // What the replayed history changed is queued for `o/` like any
        // applied change: the next objects checkpoint moves `m/objects` past
        // it, so it must be written with it (it was not, and such objects
        // were lost at the restart after: found by tests/e2e/faults.rs).
        let objects_since = (!replayed.is_empty()).then(Instant::now);
        let pending = Pending { revision: current.state.revision, objects: replayed, objects_since, ..Pending::default() };
        let checkpointer = Arc::new(Checkpointer {
            tree: tree.clone(),
            pending: Mutex::new(pending),
            objects_writer: Mutex::default(),
            objects_at: AtomicU64::new(objects_at),
        });
        spawn_checkpoint_timer(Arc::downgrade(&checkpointer));
        let reader = StoreReader { checkpointer: checkpointer.clone(), applied: applied_rx, events: events.clone() };
        let sm = StateMachine {
            tree,
            checkpointer,
            snapshots,
            db: db.clone(),
            current,
            applied_tx,
            events,
            retention: Retention { revisions: retention.revisions.max(1), ..retention },
            compaction_reported: None,
            snapshot_seq: Arc::new(AtomicU64::new(0)),
        };
        Ok((sm, reader))
    }

    /// Compaction is reported, never silent: the metrics at once, and a
    /// log line at most once a minute (it moves with nearly every write
    /// once the history is full).
    fn report_compaction(&mut self, was: u64, compacted: u64) {
        let m = crate::metrics::metrics();
        m.history_oldest_revision.set(i64::try_from(compacted.saturating_add(1)).unwrap_or(i64::MAX));
        m.history_compacted.inc_by(compacted - was);
        let since = self.compaction_reported.map_or(was, |(_, r)| r);
        if self.compaction_reported.is_some_and(|(at, _)| at.elapsed() < COMPACTION_REPORT_INTERVAL) {
            return;
        }
        tracing::info!(
            compacted_to = compacted,
            dropped = compacted.saturating_sub(since),
            oldest_kept = compacted + 1,
            retention = %self.retention,
            "history compacted: revisions up to {compacted} dropped; the oldest kept is {}",
            compacted + 1
        );
        self.compaction_reported = Some((Instant::now(), compacted));
    }

    fn publish(&mut self, next: Applied, msg: Option<WatchMsg>) {
        self.current = Arc::new(next);
        self.applied_tx.send_replace(self.current.clone());
        if let Some(msg) = msg {
            // No receivers is fine: nobody is watching.
            let _ = self.events.send(msg);
        }
    }
}

/// Objects changed by the history replayed on loading, still to be written
/// to `o/` (`None`: deleted), as `Pending::objects` holds them.
type Replayed = HashMap<Vec<u8>, Option<Arc<StoredObject>>>;

/// The persisted applied state, the revision `o/` is at, and what the
/// history after it changed: the objects, then the history after them
/// replayed up to `m/applied`.
fn load_applied(tree: &sled::Tree) -> Result<(Applied, u64, Replayed), StorageError> {
    let meta: AppliedMeta = match tree.get(APPLIED).map_err(|e| sm_err(ErrorVerb::Read, e))? {
        Some(bytes) => codec::decode(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e))?,
        None => AppliedMeta { last_applied: None, membership: StoredMembership::default(), revision: 0, compacted: 0 },
    };
    let objects_at = match tree.get(OBJECTS_AT).map_err(|e| sm_err(ErrorVerb::Read, e))? {
        Some(bytes) => codec::decode::<u64>(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e))?,
        // A new tree, or one written before `m/objects` (objects and
        // history were written together): recorded now, so that a later
        // `m/applied` written without the objects is never mistaken for it.
        None => {
            tree.insert(OBJECTS_AT, codec::encode(&meta.revision)).map_err(|e| sm_err(ErrorVerb::Write, e))?;
            meta.revision
        }
    };
    let mut state = State { revision: meta.revision, objects: Default::default() };
    for item in tree.scan_prefix(b"o/") {
        let (_, v) = item.map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let rec: ObjectRecord = codec::decode(&v).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let obj = rec.into_object().map_err(|e| sm_err(ErrorVerb::Read, e))?;
        state.objects.insert(Arc::new(obj));
    }
    let mut replayed = objects_at;
    let mut changed = Replayed::new();
    // From the chunk that holds the first revision to replay: the ones
    // before it (kept for watch history) are not read.
    let start = match chunk_from(tree, objects_at.saturating_add(1)).map_err(|e| sm_err(ErrorVerb::Read, e))? {
        Some((key, _)) => key.to_vec(),
        None => chunk_key(0, 0),
    };
    for item in tree.range(start..chunk_key(u64::MAX, 0)) {
        let (key, bytes) = item.map_err(|e| sm_err(ErrorVerb::Read, e))?;
        match chunk_range(&key) {
            Some((_, last)) if last <= objects_at => continue,
            Some(_) => {}
            None => break,
        }
        let revisions: Vec<(u64, Vec<EventRecord>)> = codec::decode(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        for (rev, records) in revisions.into_iter().filter(|(r, _)| *r > objects_at && *r <= meta.revision) {
            if rev != replayed + 1 {
                return Err(sm_err(ErrorVerb::Read, format!("history to replay after revision {replayed} resumes at {rev}")));
            }
            for r in records {
                let key = object_key(&r.object.key);
                if r.delete {
                    state.objects.remove(&r.object.key);
                    changed.insert(key, None);
                } else {
                    let obj = Arc::new(r.object.into_object().map_err(|e| sm_err(ErrorVerb::Read, e))?);
                    state.objects.insert(obj.clone());
                    changed.insert(key, Some(obj));
                }
            }
            replayed = rev;
        }
    }
    if replayed != meta.revision {
        return Err(sm_err(ErrorVerb::Read, format!("objects at revision {objects_at}, history replayed to {replayed}, applied state at {}", meta.revision)));
    }
    let dedup = match tree.get(DEDUP).map_err(|e| sm_err(ErrorVerb::Read, e))? {
        Some(bytes) => codec::decode(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e))?,
        None => Dedup::default(),
    };
    let mut marks = Vec::new();
    for item in tree.scan_prefix(b"t/") {
        marks.push(codec::decode::<Mark>(&item.map_err(|e| sm_err(ErrorVerb::Read, e))?.1).map_err(|e| sm_err(ErrorVerb::Read, e))?);
    }
    let mut times = Times::from_marks(marks);
    times.prune(meta.compacted);
    let applied = Applied { last_applied: meta.last_applied, membership: meta.membership, state, compacted: meta.compacted, dedup, times };
    Ok((applied, objects_at, changed))
}

/// Replace the persisted state with a snapshot body; returns the new state.
fn write_snapshot_state(tree: &sled::Tree, data: &[u8]) -> Result<Applied, StorageError> {
    let (body, dedup): (SnapshotBody, Dedup) = codec::decode_with_trailer(data).map_err(|e| snap_err(ErrorVerb::Read, e))?;
    tree.clear().map_err(|e| sm_err(ErrorVerb::Write, e))?;
    let mut batch = sled::Batch::default();
    let mut state = State { revision: body.meta.revision, objects: Default::default() };
    for rec in body.objects {
        batch.insert(object_key(&rec.key), codec::encode(&rec));
        let obj = rec.into_object().map_err(|e| snap_err(ErrorVerb::Read, e))?;
        state.objects.insert(Arc::new(obj));
    }
    // History before a snapshot is not carried over: watchers must resume
    // from the snapshot's revision.
    let meta = AppliedMeta { compacted: body.meta.revision, ..body.meta };
    batch.insert(APPLIED, codec::encode(&meta));
    batch.insert(OBJECTS_AT, codec::encode(&meta.revision));
    if !dedup.is_empty() {
        batch.insert(DEDUP, codec::encode(&dedup));
    }
    tree.apply_batch(batch).map_err(|e| sm_err(ErrorVerb::Write, e))?;
    Ok(Applied { last_applied: meta.last_applied, membership: meta.membership, state, compacted: meta.compacted, dedup, times: Times::default() })
}

impl Drop for StateMachine {
    /// A graceful shutdown leaves nothing to re-apply.
    fn drop(&mut self) {
        if let Err(e) = self.checkpointer.flush_all() {
            tracing::error!(error = %e, "writing the last state checkpoint");
        }
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok((self.current.last_applied, self.current.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let started = Instant::now();
        let mut next = (*self.current).clone();
        let mut responses = Vec::new();
        let mut all_events = Vec::new();
        let mut pending = self.checkpointer.lock();
        let mut dedup_changed = false;
        for entry in entries {
            next.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => responses.push(Response::None),
                EntryPayload::Membership(m) => {
                    next.membership = StoredMembership::new(Some(entry.log_id), m);
                    responses.push(Response::None);
                }
                EntryPayload::Normal(Command::Batch(txns)) => {
                    let mut results = Vec::with_capacity(txns.len());
                    apply_txns(&mut next, &mut pending, &mut all_events, &txns, &mut results);
                    responses.push(Response::Batch(results));
                }
                EntryPayload::Normal(Command::Groups(groups)) => {
                    responses.push(apply_groups(&mut next, &mut pending, &mut all_events, &groups, entry.log_id.index, &mut dedup_changed));
                }
                // The leader's time, from the entry: never a clock here.
                EntryPayload::Normal(Command::Stamped { unix_ms, groups }) => {
                    responses.push(apply_groups(&mut next, &mut pending, &mut all_events, &groups, entry.log_id.index, &mut dedup_changed));
                    if let Some(mark) = next.times.stamp(unix_ms, next.state.revision, &self.retention) {
                        pending.marks.push(mark);
                    }
                }
            }
        }
        // The watch history keeps what the retention says (`retention`);
        // the checkpoint drops what falls out.
        let was = next.compacted;
        next.compacted = next.compacted.max(next.times.compact_to(next.state.revision, &self.retention));
        next.times.prune(next.compacted);
        pending.meta = Some(AppliedMeta {
            last_applied: next.last_applied,
            membership: next.membership.clone(),
            revision: next.state.revision,
            compacted: next.compacted,
        });
        pending.revision = next.state.revision;
        if dedup_changed {
            pending.dedup = Some(next.dedup.clone());
        }
        if !pending.objects.is_empty() {
            pending.objects_since.get_or_insert_with(Instant::now);
        }
        let since = *pending.since.get_or_insert_with(Instant::now);
        // Not flushed: the log is durable, and after a crash openraft
        // re-applies from the checkpoint's `last_applied`.
        if pending.history.len() >= CHECKPOINT_OPS || since.elapsed() >= CHECKPOINT_INTERVAL {
            self.checkpointer.flush_locked(&mut pending)?;
        }
        drop(pending);
        if next.compacted > was {
            self.report_compaction(was, next.compacted);
        }
        let msg = (!all_events.is_empty()).then(|| WatchMsg::Events(Arc::new(all_events)));
        self.publish(next, msg);
        crate::metrics::metrics().raft_apply_duration.observe(started.elapsed());
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder { applied: self.current.clone(), snapshots: self.snapshots.clone(), db: self.db.clone(), seq: self.snapshot_seq.clone() }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<Cursor<Vec<u8>>>) -> Result<(), StorageError> {
        let data = snapshot.into_inner();
        // Save the snapshot durably first: if we crash while rewriting the
        // state, `open` restores from it.
        let stored = StoredSnapshot { meta: meta.clone(), data };
        self.snapshots.insert(CURRENT_SNAPSHOT, codec::encode(&stored)).map_err(|e| snap_err(ErrorVerb::Write, e))?;
        self.db.flush_async().await.map_err(|e| snap_err(ErrorVerb::Write, e))?;
        // Whatever is queued is older than the snapshot: it replaces all of it.
        let applied = {
            let _writer = self.checkpointer.objects_writer.lock().unwrap_or_else(|e| e.into_inner());
            let mut pending = self.checkpointer.lock();
            let applied = write_snapshot_state(&self.tree, &stored.data)?;
            *pending = Pending { revision: applied.state.revision, ..Pending::default() };
            self.checkpointer.objects_at.store(applied.state.revision, Ordering::Release);
            applied
        };
        self.db.flush_async().await.map_err(|e| sm_err(ErrorVerb::Write, e))?;
        tracing::info!(last_log_id = %log_id(&meta.last_log_id), revision = applied.state.revision, "installed snapshot");
        self.publish(applied, Some(WatchMsg::Reset));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let Some(bytes) = self.snapshots.get(CURRENT_SNAPSHOT).map_err(|e| snap_err(ErrorVerb::Read, e))? else {
            return Ok(None);
        };
        let stored: StoredSnapshot = codec::decode(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?;
        Ok(Some(Snapshot { meta: stored.meta, snapshot: Box::new(Cursor::new(stored.data)) }))
    }
}

/// Apply one entry's groups: each once (`dedup`), in order.
fn apply_groups(next: &mut Applied, pending: &mut Pending, all_events: &mut Vec<Event>, groups: &[Group], index: u64, dedup_changed: &mut bool) -> Response {
    let mut results = Vec::with_capacity(groups.iter().map(|g| g.txns.len()).sum());
    for Group { id, txns } in groups {
        // Applied before: the first time's results, nothing
        // changes. (Same id, different size: not the same
        // group, so it applies; every replica agrees.)
        if let Some(prev) = id.and_then(|id| next.dedup.get(&id)).filter(|prev| prev.len() == txns.len()) {
            results.extend(prev.iter().cloned());
            continue;
        }
        let start = results.len();
        apply_txns(next, pending, all_events, txns, &mut results);
        if let Some(id) = id {
            next.dedup.record(*id, index, Arc::new(results[start..].to_vec()));
            *dedup_changed = true;
        }
    }
    Response::Batch(results)
}

/// Apply transactions in order: results onto `results`, events queued for
/// the checkpoint and for live watchers.
fn apply_txns(next: &mut Applied, pending: &mut Pending, all_events: &mut Vec<Event>, txns: &[Txn], results: &mut Vec<TxnResult>) {
    for txn in txns {
        let (result, events) = next.state.apply_txn(txn);
        if let Some(first) = events.first() {
            let records: Vec<EventRecord> =
                events.iter().map(|e| EventRecord { delete: e.kind == EventType::Delete, object: ObjectRecord::from_object(&e.object) }).collect();
            for e in &events {
                let object = (e.kind == EventType::Put).then(|| e.object.clone());
                pending.objects.insert(object_key(&e.object.key), object);
            }
            pending.history.push((first.revision, records, events.clone()));
            if let Some(author) = txn.author() {
                pending.authors.push((first.revision, author.clone()));
            }
        }
        all_events.extend(events);
        results.push(result);
    }
}

/// The raft snapshot data of an applied state: what `build_snapshot` saves
/// and sends, and `install_snapshot` reads (also how a backup is restored).
/// The dedup table follows the body as a trailer: a snapshot written before
/// it existed reads as an empty table, and an earlier version reading this
/// one ignores it (bincode leaves trailing bytes alone).
pub(crate) fn snapshot_data(applied: &Applied) -> Vec<u8> {
    let body = SnapshotBody {
        meta: AppliedMeta {
            last_applied: applied.last_applied,
            membership: applied.membership.clone(),
            revision: applied.state.revision,
            compacted: applied.compacted,
        },
        objects: applied.state.objects.values().map(|o| ObjectRecord::from_object(o)).collect(),
    };
    codec::encode_with_trailer(&body, &applied.dedup)
}

pub struct SnapshotBuilder {
    applied: Arc<Applied>,
    snapshots: sled::Tree,
    db: sled::Db,
    seq: Arc<AtomicU64>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let applied = &self.applied;
        let data = snapshot_data(applied);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match applied.last_applied {
            Some(l) => format!("{}-{}-{}-{seq}", l.leader_id.term, l.leader_id.node_id, l.index),
            None => format!("0-0-0-{seq}"),
        };
        let meta = SnapshotMeta { last_log_id: applied.last_applied, last_membership: applied.membership.clone(), snapshot_id };
        let stored = StoredSnapshot { meta: meta.clone(), data };
        self.snapshots.insert(CURRENT_SNAPSHOT, codec::encode(&stored)).map_err(|e| snap_err(ErrorVerb::Write, e))?;
        // Durable before openraft may purge the log it covers.
        self.db.flush_async().await.map_err(|e| snap_err(ErrorVerb::Write, e))?;
        tracing::info!(last_log_id = %log_id(&meta.last_log_id), objects = applied.state.objects.len(), bytes = stored.data.len(), "built snapshot");
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(stored.data)) })
    }
}

/// Golden bytes of format version 1 for everything persisted. If this fails
/// after a change, the change broke reading existing data directories: keep
/// the old layout readable (new version byte + old decoder) instead of
/// re-blessing. `LODESTAR_BLESS=1` writes the fixtures for new types only.
#[cfg(test)]
mod fixtures {
    use super::*;
    use crate::model::Kind;
    use crate::store::types::{Op, Txn};
    use openraft::{CommittedLeaderId, Membership, Vote};
    use std::collections::{BTreeMap, BTreeSet};

    use crate::store::codec::check_fixture as check;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn membership() -> StoredMembership {
        let nodes =
            BTreeMap::from([(1, crate::store::NodeInfo { raft_addr: "127.0.0.1:1".into(), api_addr: "127.0.0.1:2".into(), xds_addr: "127.0.0.1:3".into() })]);
        StoredMembership::new(Some(log_id(1, 1)), Membership::new(vec![BTreeSet::from([1])], nodes))
    }

    fn object() -> ObjectRecord {
        ObjectRecord {
            key: ResourceKey::new(Kind::DestinationRule, "default", "reviews"),
            create_revision: 3,
            mod_revision: 7,
            version: 2,
            body: r#"{"apiVersion":"networking.istio.io/v1","kind":"DestinationRule","metadata":{"name":"reviews","namespace":"default"},"spec":{"host":"reviews"}}"#.into(),
        }
    }

    #[test]
    fn format_v1_is_stable() {
        let put = Op::Put { key: object().key, body: object().body.into(), expected_revision: Some(7) };
        let del = Op::Delete { key: ResourceKey::new(Kind::VirtualService, "ns", "x"), expected_revision: None, ignore_missing: true };
        let entry = Entry { log_id: log_id(2, 9), payload: EntryPayload::Normal(Command::Batch(vec![Txn { ops: vec![put, del] }])) };
        check("log_entry", &entry);
        check("vote", &Vote::new_committed(3, 2));
        check("log_id", &log_id(3, 42));
        check("object", &object());
        check("events", &vec![EventRecord { delete: false, object: object() }]);
        let meta = AppliedMeta { last_applied: Some(log_id(2, 9)), membership: membership(), revision: 7, compacted: 2 };
        check("applied_meta", &meta);
        let body = SnapshotBody { meta: meta.clone(), objects: vec![object()] };
        check("snapshot_body", &body);
        let snap = StoredSnapshot {
            meta: SnapshotMeta { last_log_id: Some(log_id(2, 9)), last_membership: membership(), snapshot_id: "2-1-9-0".into() },
            data: codec::encode(&body),
        };
        check("stored_snapshot", &snap);
    }

    /// Wire version 2: a log entry carrying `Op::Author` (a build of
    /// version 1 cannot decode it: the gate keeps it out of the log until
    /// every member runs version 2), and the `a/` record of who made a
    /// revision. A version 1 entry still decodes, and encodes as before
    /// (`format_v1_is_stable`).
    #[test]
    fn format_v2_is_stable() {
        let author = Author { name: "token:0f3c".into(), message: Some("canary 10%".into()) };
        let put = Op::Put { key: object().key, body: object().body.into(), expected_revision: None };
        let txn = Txn { ops: vec![put, Op::Author(author.clone())] };
        let group = crate::store::types::Group { id: Some(crate::store::types::RequestId { origin: 2, seq: 9 }), txns: vec![txn] };
        let entry = Entry { log_id: log_id(4, 11), payload: EntryPayload::Normal(Command::Groups(vec![group])) };
        crate::store::codec::check_fixture_at("log_entry_author", 2, &entry);
        crate::store::codec::check_fixture_at("author", 2, &author);
    }
}

/// Write-behind: history and objects survive checkpoints, reopening and
/// compaction, and reads see queued revisions.
#[cfg(test)]
mod checkpoint_tests {
    use super::*;
    use crate::model::Kind;
    use crate::store::types::{Author, Op, RequestId};
    use openraft::CommittedLeaderId;

    fn put(i: u64, pad: usize) -> Txn {
        let key = ResourceKey::new(Kind::DestinationRule, "ns", format!("dr-{}", i % 7));
        let body = serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": key.name, "namespace": "ns", "annotations": {"seq": i.to_string(), "pad": "x".repeat(pad)}},
            "spec": {"host": "reviews"}});
        Txn { ops: vec![Op::Put { key, body: body.to_string().into(), expected_revision: None }] }
    }

    fn entry(index: u64, txns: Vec<Txn>) -> Entry {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(Command::Batch(txns)) }
    }

    /// Every revision from `from` to the current one, through `history_from`.
    fn replay(reader: &StoreReader, from: u64) -> Vec<u64> {
        let (mut next, mut seen) = (from, Vec::new());
        while next <= reader.current().revision() {
            let (events, last) = reader.history_from(next).unwrap();
            assert!(last >= next);
            seen.extend(events.iter().map(|e| e.revision));
            next = last + 1;
        }
        seen
    }

    #[tokio::test]
    async fn history_and_state_survive_checkpoints_and_reopening() {
        let tmp = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(tmp.path()).open().unwrap();
        let (mut sm, reader) = StateMachine::open(&db, 200).unwrap();
        let mut index = 0;
        // 300 revisions, big enough bodies to cut several chunks, applied in
        // entries of 10: the first ones checkpoint (CHECKPOINT_OPS is not
        // reached, so force one), the last ones stay queued.
        for round in 0..30 {
            index += 1;
            let txns = (0..10).map(|j| put(round * 10 + j, 2048)).collect();
            sm.apply([entry(index, txns)]).await.unwrap();
            if round == 20 {
                sm.checkpointer.flush().unwrap();
            }
        }
        assert_eq!(reader.current().revision(), 300);
        assert!(!sm.checkpointer.lock().history.is_empty(), "the last rounds are still queued");
        assert!(sm.tree.scan_prefix(b"g/").count() > 1, "history went out in several chunks");
        // Compacted: the oldest 100 are gone, the rest replay in order, from
        // chunks and from the queue.
        assert_eq!(reader.current().compacted, 100);
        assert_eq!(replay(&reader, 101), (101..=300).collect::<Vec<_>>());
        assert_eq!(replay(&reader, 250), (250..=300).collect::<Vec<_>>());

        // Closing writes the queue: reopening finds the same state and history.
        let objects = reader.current().state.objects.clone();
        drop((sm, reader));
        let (sm, reader) = StateMachine::open(&db, 200).unwrap();
        let applied = reader.current();
        assert_eq!((applied.revision(), applied.last_applied.map(|l| l.index)), (300, Some(30)));
        assert_eq!(applied.state.objects, objects);
        assert_eq!(replay(&reader, 101), (101..=300).collect::<Vec<_>>());
        // The next checkpoint removes the compacted chunks (they were kept
        // until the objects were written).
        let mut sm = sm;
        sm.apply([entry(31, vec![put(300, 10)])]).await.unwrap();
        sm.checkpointer.flush().unwrap();
        let first_chunk = sm.tree.scan_prefix(b"g/").next().unwrap().unwrap().0;
        assert!(chunk_range(&first_chunk).unwrap().1 > 101, "compacted chunks were removed");
        assert_eq!(replay(&reader, 102), (102..=301).collect::<Vec<_>>());
    }

    /// Who made a revision (`Op::Author`, wire version 2) is kept beside
    /// the history, survives reopening, and goes with it when compacted; a
    /// transaction that changes nothing records nobody.
    #[tokio::test]
    async fn authors_are_kept_with_the_history() {
        let tmp = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(tmp.path()).open().unwrap();
        let (mut sm, reader) = StateMachine::open(&db, 5).unwrap();
        let authored = |i: u64, who: &str| {
            let mut txn = put(i, 10);
            txn.ops.push(Op::Author(Author { name: who.into(), message: (i == 2).then(|| "canary".into()) }));
            txn
        };
        sm.apply([entry(1, vec![put(0, 10), authored(1, "token:a"), authored(2, "token:b")])]).await.unwrap();
        // The same body again: no revision, no author.
        sm.apply([entry(2, vec![authored(2, "token:c")])]).await.unwrap();
        let names = |reader: &StoreReader| reader.authors(0, 100).unwrap().into_iter().map(|(r, a)| (r, a.name, a.message)).collect::<Vec<_>>();
        let want = vec![(2, "token:a".to_string(), None), (3, "token:b".to_string(), Some("canary".to_string()))];
        assert_eq!(names(&reader), want, "queued");
        drop((sm, reader));
        let (mut sm, reader) = StateMachine::open(&db, 5).unwrap();
        assert_eq!(names(&reader), want, "written and read back");
        // Ten more revisions: the history keeps 5, and the authors with it.
        for i in 0..10 {
            sm.apply([entry(3 + i, vec![put(7 * (i + 1) + 3, 10 + i as usize)])]).await.unwrap();
        }
        sm.checkpointer.flush_all().unwrap();
        assert_eq!(names(&reader), vec![], "compacted with the history");
    }

    fn groups(index: u64, groups: Vec<(Option<u64>, Vec<Txn>)>) -> Entry {
        let groups = groups.into_iter().map(|(seq, txns)| Group { id: seq.map(|seq| RequestId { origin: 2, seq }), txns }).collect();
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(Command::Groups(groups)) }
    }

    /// A group applied again (a retried forward that also made it into the
    /// log the first time) changes nothing and answers with the first
    /// results: in the same entry, in a later one, after reopening, and on
    /// a replica that got the state by snapshot.
    #[tokio::test]
    async fn a_request_id_applies_once() {
        let tmp = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(tmp.path().join("a")).open().unwrap();
        let (mut sm, reader) = StateMachine::open(&db, 100).unwrap();
        let first = sm.apply([groups(1, vec![(Some(7), vec![put(1, 10), put(2, 10)]), (None, vec![put(3, 10)])])]).await.unwrap();
        assert_eq!(reader.current().revision(), 3);
        // Again, twice in one entry, beside a new group: only the new one applies.
        let again =
            sm.apply([groups(2, vec![(Some(7), vec![put(1, 10), put(2, 10)]), (Some(8), vec![put(4, 10)]), (Some(8), vec![put(4, 10)])])]).await.unwrap();
        assert_eq!(reader.current().revision(), 4, "only group 8 changed anything, once");
        let (Response::Batch(first), Response::Batch(again)) = (&first[0], &again[0]) else { panic!("batch responses") };
        assert_eq!(again[..2], first[..2], "the retry gets the first attempt's results");
        assert_eq!(again[2], again[3]);
        // Without an id, a group always applies.
        sm.apply([groups(3, vec![(None, vec![put(1, 11)])])]).await.unwrap();
        assert_eq!(reader.current().revision(), 5);

        // Checkpointed and reopened: still remembered.
        sm.checkpointer.flush().unwrap();
        drop((sm, reader));
        let (mut sm, reader) = StateMachine::open(&db, 100).unwrap();
        sm.apply([groups(4, vec![(Some(7), vec![put(1, 10), put(2, 10)])])]).await.unwrap();
        assert_eq!(reader.current().revision(), 5, "remembered across a restart");

        // A replica that installs this state as a snapshot decides the same.
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let db2 = sled::Config::new().path(tmp.path().join("b")).open().unwrap();
        let (mut other, other_reader) = StateMachine::open(&db2, 100).unwrap();
        other.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
        assert_eq!(other_reader.current().dedup, reader.current().dedup);
        other.apply([groups(5, vec![(Some(8), vec![put(4, 10)]), (Some(9), vec![put(5, 10)])])]).await.unwrap();
        sm.apply([groups(5, vec![(Some(8), vec![put(4, 10)]), (Some(9), vec![put(5, 10)])])]).await.unwrap();
        assert_eq!(other_reader.current().revision(), 6);
        assert_eq!(reader.current().revision(), 6);
        // And after its own restart (the table came from the snapshot).
        drop((other, other_reader));
        let (_, other_reader) = StateMachine::open(&db2, 100).unwrap();
        assert_eq!(other_reader.current().dedup, reader.current().dedup);
    }

    /// A snapshot written before the dedup table existed reads as an empty
    /// table; one with a table reads back whole.
    #[test]
    fn snapshot_data_with_and_without_the_dedup_trailer() {
        let mut applied = Applied::default();
        applied.state.revision = 3;
        let old = codec::encode(&SnapshotBody {
            meta: AppliedMeta { last_applied: None, membership: StoredMembership::default(), revision: 3, compacted: 0 },
            objects: Vec::new(),
        });
        let (body, dedup): (SnapshotBody, Dedup) = codec::decode_with_trailer(&old).unwrap();
        assert_eq!((body.meta.revision, dedup.is_empty()), (3, true));
        applied.dedup.record(RequestId { origin: 1, seq: 5 }, 9, Arc::new(vec![Err(crate::error::Error::invalid("x"))]));
        let (_, dedup): (SnapshotBody, Dedup) = codec::decode_with_trailer(&snapshot_data(&applied)).unwrap();
        assert_eq!(dedup, applied.dedup);
        // What an earlier version reads: the body alone.
        let body: SnapshotBody = codec::decode(&snapshot_data(&applied)).unwrap();
        assert_eq!(body.meta.revision, 3);
    }

    fn delete(i: u64) -> Txn {
        Txn {
            ops: vec![Op::Delete {
                key: ResourceKey::new(Kind::DestinationRule, "ns", format!("dr-{}", i % 7)),
                expected_revision: None,
                ignore_missing: false,
            }],
        }
    }

    /// A crash with the objects written at one revision and the history at a
    /// later one: reopening replays the history after the objects, and keeps
    /// it (not compacted) until the objects catch up. What the replay changed
    /// is written with the next objects: after another restart the objects
    /// are whole (they were not: the replayed changes were never written to
    /// `o/`, and were lost once `m/objects` moved past them; found by the
    /// fault runs, a registry Instance missing on one replica).
    #[tokio::test]
    async fn objects_behind_the_history_are_replayed_after_a_crash() {
        let tmp = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(tmp.path()).open().unwrap();
        let (mut sm, reader) = StateMachine::open(&db, 5).unwrap();
        for i in 0..20 {
            sm.apply([entry(i + 1, vec![put(i, 100)])]).await.unwrap();
        }
        sm.checkpointer.flush_all().unwrap();
        assert_eq!(sm.checkpointer.objects_at.load(Ordering::Acquire), 20);
        // Overwrites and deletes after the objects: only in the history.
        for i in 20..40 {
            let txn = if i % 5 == 0 { delete(i) } else { put(i, 100) };
            sm.apply([entry(i + 1, vec![txn])]).await.unwrap();
        }
        sm.checkpointer.flush().unwrap();
        assert_eq!(decode_u64(&sm.tree.get(OBJECTS_AT).unwrap().unwrap()), 20);
        assert_eq!(reader.current().compacted, 35);
        assert!(
            sm.tree.scan_prefix(b"g/").any(|c| chunk_range(&c.unwrap().0).unwrap().0 <= 21),
            "the history after the objects' revision is kept past `compacted`"
        );
        let expected = reader.current();
        // Crash: nothing else is written.
        std::mem::forget(sm);
        drop(reader);
        let (sm, reader) = StateMachine::open(&db, 5).unwrap();
        let applied = reader.current();
        assert_eq!((applied.revision(), applied.last_applied.map(|l| l.index)), (40, Some(40)));
        assert_eq!(applied.state.objects, expected.state.objects);
        assert_eq!(applied.compacted, 35);
        assert_eq!(sm.checkpointer.objects_at.load(Ordering::Acquire), 20);

        // Once the objects are written, the history is compacted as usual.
        let mut sm = sm;
        sm.apply([entry(41, vec![put(41, 100)])]).await.unwrap();
        sm.checkpointer.flush_all().unwrap();
        sm.apply([entry(42, vec![put(42, 100)])]).await.unwrap();
        sm.checkpointer.flush().unwrap();
        assert_eq!(decode_u64(&sm.tree.get(OBJECTS_AT).unwrap().unwrap()), 41);
        assert!(sm.tree.scan_prefix(b"g/").all(|c| chunk_range(&c.unwrap().0).unwrap().1 > 37), "compacted to 37");
        let expected = reader.current();
        // Another crash: the objects at 41 and the history after them are
        // all there is.
        std::mem::forget(sm);
        drop(reader);
        let (_sm, reader) = StateMachine::open(&db, 5).unwrap();
        assert_eq!(reader.current().revision(), 42);
        assert_eq!(reader.current().state.objects, expected.state.objects);
    }

    fn decode_u64(bytes: &[u8]) -> u64 {
        codec::decode(bytes).unwrap()
    }
}
