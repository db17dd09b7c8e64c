//! The raft state machine: applies committed entries to the in-memory
//! [`State`], persists the result in sled, and publishes each applied state as
//! an immutable snapshot (`watch` channel) plus its change events (broadcast).
//!
//! sled layout (tree `state`, one tree so that every apply is one atomic
//! `apply_batch`):
//!   `o/<key>`     ObjectRecord       the current objects
//!   `h/<rev BE>`  Vec<EventRecord>   watch history, the last `history_limit` revisions
//!   `m/applied`   AppliedMeta        last applied log id, membership, revision
//! tree `snapshot`: `current` → StoredSnapshot, the last built or installed one.

use super::codec;
use super::state::{Event, EventType, State};
use super::types::{Command, Entry, LogId, Op, Response, SnapshotMeta, StorageError, StoredMembership, Txn, TypeConfig};
use crate::model::{ResourceKey, StoredObject};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{broadcast, watch};

const APPLIED: &[u8] = b"m/applied";
const CURRENT_SNAPSHOT: &[u8] = b"current";

/// The applied state at one log position: what every reader sees, whole.
#[derive(Debug, Clone, Default)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub state: State,
    /// Watch history covers revisions `> compacted`.
    pub compacted: u64,
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
        ObjectRecord { key: o.key.clone(), create_revision: o.create_revision, mod_revision: o.mod_revision, version: o.version, body: o.body.to_string() }
    }
    /// The record of an object `txn` just wrote. A put's body is the op's
    /// text, which the object's body was parsed from: the same JSON, without
    /// serializing the parsed value again on every replica.
    fn applied(o: &StoredObject, txn: &Txn) -> Self {
        let body = txn.ops.iter().find_map(|op| match op {
            Op::Put { key, body, .. } if *key == o.key => Some(body.clone()),
            _ => None,
        });
        match body {
            Some(body) => ObjectRecord { key: o.key.clone(), create_revision: o.create_revision, mod_revision: o.mod_revision, version: o.version, body },
            None => ObjectRecord::from_object(o),
        }
    }
    pub(crate) fn into_object(self) -> Result<StoredObject, serde_json::Error> {
        Ok(StoredObject::new(self.key, self.create_revision, self.mod_revision, self.version, serde_json::from_str(&self.body)?))
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

/// Read access shared by the API, xDS and watch streams.
#[derive(Clone)]
pub struct StoreReader {
    tree: sled::Tree,
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
    /// The events of one revision from the persisted history.
    pub fn history(&self, rev: u64) -> Result<Vec<Event>, String> {
        let Some(bytes) = self.tree.get(history_key(rev)).map_err(|e| e.to_string())? else {
            return Ok(Vec::new());
        };
        let records: Vec<EventRecord> = codec::decode(&bytes).map_err(|e| e.to_string())?;
        records
            .into_iter()
            .map(|r| {
                let kind = if r.delete { EventType::Delete } else { EventType::Put };
                Ok(Event { revision: rev, kind, object: Arc::new(r.object.into_object().map_err(|e| e.to_string())?) })
            })
            .collect()
    }
}

pub struct StateMachine {
    tree: sled::Tree,
    snapshots: sled::Tree,
    db: sled::Db,
    current: Arc<Applied>,
    applied_tx: watch::Sender<Arc<Applied>>,
    events: broadcast::Sender<WatchMsg>,
    history_limit: u64,
    snapshot_seq: Arc<AtomicU64>,
}

impl StateMachine {
    /// Load the persisted state. If the last saved snapshot is newer than the
    /// persisted applied state (a crash between saving a snapshot and
    /// flushing the state), the state is rebuilt from the snapshot.
    pub fn open(db: &sled::Db, history_limit: u64) -> Result<(StateMachine, StoreReader), StorageError> {
        let tree = db.open_tree("state").map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let snapshots = db.open_tree("snapshot").map_err(|e| snap_err(ErrorVerb::Read, e))?;
        let mut applied = load_applied(&tree)?;
        if let Some(bytes) = snapshots.get(CURRENT_SNAPSHOT).map_err(|e| snap_err(ErrorVerb::Read, e))? {
            let snap: StoredSnapshot = codec::decode(&bytes).map_err(|e| snap_err(ErrorVerb::Read, e))?;
            if snap.meta.last_log_id > applied.last_applied {
                tracing::warn!(snapshot = ?snap.meta.last_log_id, applied = ?applied.last_applied, "state older than the saved snapshot; restoring from it");
                applied = write_snapshot_state(&tree, &snap.data)?;
            }
        }
        let current = Arc::new(applied);
        let (applied_tx, applied_rx) = watch::channel(current.clone());
        let (events, _) = broadcast::channel(1024);
        let reader = StoreReader { tree: tree.clone(), applied: applied_rx, events: events.clone() };
        let sm = StateMachine {
            tree,
            snapshots,
            db: db.clone(),
            current,
            applied_tx,
            events,
            history_limit: history_limit.max(1),
            snapshot_seq: Arc::new(AtomicU64::new(0)),
        };
        Ok((sm, reader))
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

fn load_applied(tree: &sled::Tree) -> Result<Applied, StorageError> {
    let Some(bytes) = tree.get(APPLIED).map_err(|e| sm_err(ErrorVerb::Read, e))? else {
        return Ok(Applied::default());
    };
    let meta: AppliedMeta = codec::decode(&bytes).map_err(|e| sm_err(ErrorVerb::Read, e))?;
    let mut state = State { revision: meta.revision, objects: Default::default() };
    for item in tree.scan_prefix(b"o/") {
        let (_, v) = item.map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let rec: ObjectRecord = codec::decode(&v).map_err(|e| sm_err(ErrorVerb::Read, e))?;
        let obj = rec.into_object().map_err(|e| sm_err(ErrorVerb::Read, e))?;
        state.objects.insert(obj.key.clone(), Arc::new(obj));
    }
    Ok(Applied { last_applied: meta.last_applied, membership: meta.membership, state, compacted: meta.compacted })
}

/// Replace the persisted state with a snapshot body; returns the new state.
fn write_snapshot_state(tree: &sled::Tree, data: &[u8]) -> Result<Applied, StorageError> {
    let body: SnapshotBody = codec::decode(data).map_err(|e| snap_err(ErrorVerb::Read, e))?;
    tree.clear().map_err(|e| sm_err(ErrorVerb::Write, e))?;
    let mut batch = sled::Batch::default();
    let mut state = State { revision: body.meta.revision, objects: Default::default() };
    for rec in body.objects {
        batch.insert(object_key(&rec.key), codec::encode(&rec));
        let obj = rec.into_object().map_err(|e| snap_err(ErrorVerb::Read, e))?;
        state.objects.insert(obj.key.clone(), Arc::new(obj));
    }
    // History before a snapshot is not carried over: watchers must resume
    // from the snapshot's revision.
    let meta = AppliedMeta { compacted: body.meta.revision, ..body.meta };
    batch.insert(APPLIED, codec::encode(&meta));
    tree.apply_batch(batch).map_err(|e| sm_err(ErrorVerb::Write, e))?;
    Ok(Applied { last_applied: meta.last_applied, membership: meta.membership, state, compacted: meta.compacted })
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
        let mut next = (*self.current).clone();
        let mut batch = sled::Batch::default();
        let mut responses = Vec::new();
        let mut all_events = Vec::new();
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
                    for txn in &txns {
                        let (result, events) = next.state.apply_txn(txn);
                        if let Some(first) = events.first() {
                            let records: Vec<EventRecord> = events
                                .iter()
                                .map(|e| EventRecord { delete: e.kind == EventType::Delete, object: ObjectRecord::applied(&e.object, txn) })
                                .collect();
                            batch.insert(history_key(first.revision), codec::encode(&records));
                            for (e, rec) in events.iter().zip(records) {
                                match e.kind {
                                    EventType::Put => batch.insert(object_key(&e.object.key), codec::encode(&rec.object)),
                                    EventType::Delete => batch.remove(object_key(&e.object.key)),
                                }
                            }
                        }
                        all_events.extend(events);
                        results.push(result);
                    }
                    responses.push(Response::Batch(results));
                }
            }
        }
        // Trim the watch history to the last `history_limit` revisions.
        let new_compacted = next.state.revision.saturating_sub(self.history_limit);
        for rev in (next.compacted + 1)..=new_compacted {
            batch.remove(history_key(rev));
        }
        next.compacted = next.compacted.max(new_compacted);
        let meta =
            AppliedMeta { last_applied: next.last_applied, membership: next.membership.clone(), revision: next.state.revision, compacted: next.compacted };
        batch.insert(APPLIED, codec::encode(&meta));
        // Not flushed here: the log is durable, and after a crash openraft
        // re-applies from the persisted `last_applied`.
        self.tree.apply_batch(batch).map_err(|e| sm_err(ErrorVerb::Write, e))?;
        let msg = (!all_events.is_empty()).then(|| WatchMsg::Events(Arc::new(all_events)));
        self.publish(next, msg);
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
        let applied = write_snapshot_state(&self.tree, &stored.data)?;
        self.db.flush_async().await.map_err(|e| sm_err(ErrorVerb::Write, e))?;
        tracing::info!(last_log_id = ?meta.last_log_id, revision = applied.state.revision, "installed snapshot");
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

/// The raft snapshot data of an applied state: what `build_snapshot` saves
/// and sends, and `install_snapshot` reads (also how a backup is restored).
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
    codec::encode(&body)
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
        tracing::info!(last_log_id = ?meta.last_log_id, objects = applied.state.objects.len(), bytes = stored.data.len(), "built snapshot");
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
    use std::path::PathBuf;

    fn dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec")
    }

    fn check<T: Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(name: &str, value: &T) {
        let path = dir().join(format!("{name}.v1.hex"));
        let bytes = codec::encode(value);
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        if !path.exists() && std::env::var("LODESTAR_BLESS").is_ok() {
            std::fs::write(&path, format!("{hex}\n")).unwrap();
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("missing fixture {}", path.display()));
        let stored = stored.trim();
        let raw: Vec<u8> = (0..stored.len()).step_by(2).map(|i| u8::from_str_radix(&stored[i..i + 2], 16).unwrap()).collect();
        let decoded: T = codec::decode(&raw).unwrap_or_else(|e| panic!("{name}: stored bytes no longer decode: {e}"));
        assert_eq!(format!("{decoded:?}"), format!("{value:?}"), "{name}: stored bytes decode to something else");
        assert_eq!(hex, stored, "{name}: encoding changed");
    }

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
        let put = Op::Put { key: object().key, body: object().body, expected_revision: Some(7) };
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
}
