//! Backups: the whole applied state at one revision as a self-checking
//! file, and an offline restore of such a file into the data directory of a
//! replica of a NEW cluster (like `etcdutl snapshot restore`).
//!
//! # File format 1
//!
//! ```text
//! offset  size
//!      0     8  magic "LDSTSNAP"
//!      8     1  file format: 1
//!      9     8  revision (u64, big-endian)
//!     17     8  payload length (u64, big-endian)
//!     25     4  CRC-32 (IEEE) of bytes 0..25 followed by the payload (big-endian)
//!     29     …  payload: codec::encode(BackupBody) = [codec version] ++ bincode
//! ```
//!
//! The header can be read without decoding the payload; the checksum covers
//! the header fields and the payload, so a flipped bit anywhere but in the
//! checksum itself is detected (and a flipped checksum fails the check too).
//! `BackupBody` is persisted: it follows the codec's rules (fields and enum
//! variants only appended; `tests/fixtures/codec/backup_file.v1.hex` pins
//! the bytes).
//!
//! # Restore and raft
//!
//! A restored data directory must look, to openraft, like a replica of an
//! already initialised cluster whose whole history is one snapshot, not like
//! a pristine node: `Raft::initialize` only works on an empty log, and it puts
//! the membership at log index 0, so a replica added later would replicate
//! the log from index 0 and never see the restored objects (and would count
//! revisions from 0: revisions would differ between replicas).
//!
//! So `restore` writes, for every founding member alike:
//! - a raft snapshot at the log id [`restored_log_id`] (term 0, node 0,
//!   index 1) holding the objects, the revision, and the new membership
//!   (every `--initial-member` a voter), installed through the state
//!   machine's own `install_snapshot`: the state tree then holds the objects,
//!   `last_applied` = that log id, `compacted` = the revision (no watch
//!   history before it);
//! - a raft log purged up to that log id, committed = that log id, no vote.
//!
//! At start openraft sees the node as initialised (it has a last log id), is
//! a voter of the stored membership, and elects a leader at term 1 as usual;
//! `server::initialise` does nothing. New entries start at index 2, on top
//! of the restored revision: the first write gets revision + 1 on every
//! replica, so revisions stay identical everywhere. A replica added later
//! (`add-node`) needs entries from index ≤ 1, which are purged, so the leader
//! sends it the snapshot. Index 1 rather than 0: a replica wrongly started
//! pristine with the same member list initialises its own log at index 0;
//! its log id there cannot match index 1, so the leader sends it the
//! snapshot instead of appending to an empty state.
//!
//! Every founding member must be restored from the same file (with its own
//! id and the same member list): they must hold the same snapshot at the same
//! log id, as replicas of one log.

use super::codec;
use super::state_machine::{self, Applied, ObjectRecord, StateMachine};
use super::types::{LogId, NodeId, NodeInfo, SnapshotMeta, StoredMembership};
use crate::model::StoredObject;
use crate::state::{Objects, State};
use anyhow::{bail, Context};
use openraft::storage::RaftStateMachine;
use openraft::{CommittedLeaderId, Membership};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::path::Path;
use std::sync::Arc;

pub const MAGIC: &[u8; 8] = b"LDSTSNAP";
/// The file format this build writes and reads.
pub const FILE_FORMAT: u8 = 1;
const HEADER_LEN: usize = 29;

/// The log id of the snapshot a restored replica starts from.
pub fn restored_log_id() -> LogId {
    LogId::new(CommittedLeaderId::new(0, 0), 1)
}

/// Where and when a backup was taken (informational).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupSource {
    /// The replica that served it.
    pub node_id: NodeId,
    /// That replica's applied log index at the time.
    pub applied_index: u64,
    /// Milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    pub lodestar_version: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct BackupBody {
    revision: u64,
    source: BackupSource,
    objects: Vec<ObjectRecord>,
}

/// A decoded and checked backup.
#[derive(Debug, Clone)]
pub struct Backup {
    pub revision: u64,
    pub source: BackupSource,
    /// In key order.
    pub objects: Vec<Arc<StoredObject>>,
    /// Size of the file in bytes.
    pub size: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BackupError {
    #[error("not a Lodestar snapshot file (it does not start with the {:?} header)", String::from_utf8_lossy(MAGIC))]
    NotASnapshot,
    #[error("snapshot file format {0} is not supported: this lodestar reads format {FILE_FORMAT} (was it written by a newer lodestar?)")]
    Format(u8),
    #[error("truncated snapshot file: {expected} bytes expected, {actual} present")]
    Truncated { expected: u64, actual: u64 },
    #[error("corrupt snapshot file: {0} unexpected bytes after the payload")]
    Trailing(u64),
    #[error("corrupt snapshot file: checksum mismatch (stored {stored:08x}, computed {computed:08x})")]
    Checksum { stored: u32, computed: u32 },
    #[error("corrupt snapshot file: the payload does not decode: {0}")]
    Payload(String),
    #[error("inconsistent snapshot file: {0}")]
    Invalid(String),
}

/// The backup file of `applied`, served by replica `node_id`.
pub fn encode(applied: &Applied, node_id: NodeId) -> Vec<u8> {
    let created_unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let body = BackupBody {
        revision: applied.revision(),
        source: BackupSource { node_id, applied_index: applied.applied_index(), created_unix_ms, lodestar_version: env!("CARGO_PKG_VERSION").to_string() },
        objects: applied.state.objects.values().map(|o| ObjectRecord::from_object(o)).collect(),
    };
    encode_body(&body)
}

fn encode_body(body: &BackupBody) -> Vec<u8> {
    let payload = codec::encode(body);
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(MAGIC);
    out.push(FILE_FORMAT);
    out.extend_from_slice(&body.revision.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    let crc = crc32(&[&out, &payload]);
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The revision in a file's header, without checking the rest.
pub fn peek_revision(bytes: &[u8]) -> Result<u64, BackupError> {
    header(bytes).map(|h| h.revision)
}

struct Header {
    revision: u64,
    payload_len: u64,
    crc: u32,
}

fn header(bytes: &[u8]) -> Result<Header, BackupError> {
    if !bytes.starts_with(MAGIC) {
        return Err(BackupError::NotASnapshot);
    }
    if bytes.len() < HEADER_LEN {
        return Err(BackupError::Truncated { expected: HEADER_LEN as u64, actual: bytes.len() as u64 });
    }
    if bytes[8] != FILE_FORMAT {
        return Err(BackupError::Format(bytes[8]));
    }
    let u64_at = |i: usize| u64::from_be_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    Ok(Header { revision: u64_at(9), payload_len: u64_at(17), crc: u32::from_be_bytes(bytes[25..29].try_into().expect("4 bytes")) })
}

/// Check a backup file (magic, format, length, checksum, contents) and
/// decode it.
pub fn decode(bytes: &[u8]) -> Result<Backup, BackupError> {
    let h = header(bytes)?;
    let payload = &bytes[HEADER_LEN..];
    let actual = payload.len() as u64;
    if actual < h.payload_len {
        // Saturating: the header's length is whatever the file says.
        return Err(BackupError::Truncated { expected: (HEADER_LEN as u64).saturating_add(h.payload_len), actual: bytes.len() as u64 });
    }
    if actual > h.payload_len {
        return Err(BackupError::Trailing(actual - h.payload_len));
    }
    let computed = crc32(&[&bytes[..25], payload]);
    if computed != h.crc {
        return Err(BackupError::Checksum { stored: h.crc, computed });
    }
    let body: BackupBody = codec::decode(payload).map_err(|e| BackupError::Payload(e.to_string()))?;
    if body.revision != h.revision {
        return Err(BackupError::Invalid(format!("header revision {} but payload revision {}", h.revision, body.revision)));
    }
    let mut objects: Vec<Arc<StoredObject>> = Vec::with_capacity(body.objects.len());
    for rec in body.objects {
        let o = rec.into_object().map_err(|e| BackupError::Invalid(format!("an object's body is not JSON: {e}")))?;
        let key = &o.key;
        if o.create_revision == 0 || o.create_revision > o.mod_revision || o.mod_revision > body.revision || o.version == 0 {
            return Err(BackupError::Invalid(format!(
                "{key}: creationRevision {} / modRevision {} / generation {} do not fit revision {}",
                o.create_revision, o.mod_revision, o.version, body.revision
            )));
        }
        if let Some(prev) = objects.last() {
            if prev.key >= o.key {
                return Err(BackupError::Invalid(format!("{key}: objects out of order or duplicated")));
            }
        }
        objects.push(Arc::new(o));
    }
    Ok(Backup { revision: body.revision, source: body.source, objects, size: bytes.len() })
}

impl Backup {
    /// Object counts by kind name.
    pub fn kind_counts(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for o in &self.objects {
            *out.entry(o.key.kind.name()).or_insert(0) += 1;
        }
        out
    }
}

/// Fail unless `dir` is missing or an empty directory.
pub fn check_new_data_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!("data directory {} is not empty: restore creates a new data directory (move the old one away, or pick another path)", dir.display());
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => bail!("{} exists and is not a directory", dir.display()),
        Err(e) => Err(e).with_context(|| format!("reading {}", dir.display())),
    }
}

/// Write a new data directory for replica `id` of a new cluster whose voters
/// are `members`, holding `backup`'s objects at its revision. See the module
/// docs for what openraft finds there. Refuses a non-empty `data_dir`; on
/// failure removes what it created.
pub async fn restore(backup: &Backup, data_dir: &Path, id: NodeId, members: BTreeMap<NodeId, NodeInfo>) -> anyhow::Result<()> {
    if !members.contains_key(&id) {
        bail!("node {id} is not one of the members {:?}", members.keys().collect::<Vec<_>>());
    }
    check_new_data_dir(data_dir)?;
    let created = !data_dir.exists();
    super::create_data_dir(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let result = write_restored(backup, data_dir, members).await;
    if result.is_err() {
        let _ = if created { std::fs::remove_dir_all(data_dir) } else { std::fs::remove_dir_all(data_dir.join("db")) };
    }
    result
}

async fn write_restored(backup: &Backup, data_dir: &Path, members: BTreeMap<NodeId, NodeInfo>) -> anyhow::Result<()> {
    let db = super::open_db(data_dir, super::DEFAULT_CACHE_BYTES).with_context(|| format!("creating the store in {}", data_dir.display()))?;
    let log_id = restored_log_id();
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let membership = StoredMembership::new(Some(log_id), Membership::new(vec![voters], members));
    let objects: Objects = backup.objects.iter().cloned().collect();
    let applied = Applied {
        last_applied: Some(log_id),
        membership: membership.clone(),
        state: State { revision: backup.revision, objects },
        compacted: backup.revision,
        dedup: Default::default(),
        times: Default::default(),
    };
    let data = state_machine::snapshot_data(&applied);
    let meta = SnapshotMeta { last_log_id: Some(log_id), last_membership: membership, snapshot_id: format!("restored-{}", backup.revision) };
    // The same path as a follower installing a leader's snapshot: the
    // snapshot is saved, then the state tree is rewritten from it.
    let (mut sm, _reader) = StateMachine::open(&db, 1)?;
    sm.install_snapshot(&meta, Box::new(Cursor::new(data))).await?;
    drop(sm);
    // The log before the snapshot is gone: replicas that need it get the
    // snapshot. Committed up to it, so nothing is re-applied.
    super::log_store::write_restored(&db, log_id)?;
    db.flush_async().await?;
    Ok(())
}

/// CRC-32 (IEEE 802.3, as in zlib and gzip) of the concatenated parts.
pub fn crc32(parts: &[&[u8]]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for part in parts {
        for &b in *part {
            crc = TABLE[((crc ^ b as u32) & 0xFF) as usize] ^ (crc >> 8);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Kind, ResourceKey};
    use crate::store::log_store::LogStore;
    use openraft::storage::RaftLogStorage;
    use serde_json::json;
    use std::path::PathBuf;

    fn object(kind: Kind, name: &str, create: u64, modr: u64, version: u64) -> StoredObject {
        let body =
            json!({"apiVersion": "networking.istio.io/v1", "kind": kind.name(), "metadata": {"name": name, "namespace": "default"}, "spec": {"host": name}});
        StoredObject::new(ResourceKey::new(kind, "default", name), create, modr, version, body)
    }

    /// Two objects, in key order.
    fn objects() -> Vec<StoredObject> {
        let mut v = vec![object(Kind::DestinationRule, "reviews", 3, 7, 2), object(Kind::VirtualService, "reviews", 9, 9, 1)];
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    fn body() -> BackupBody {
        BackupBody {
            revision: 9,
            source: BackupSource { node_id: 2, applied_index: 14, created_unix_ms: 1_700_000_000_000, lodestar_version: "0.1.0".into() },
            objects: objects().iter().map(ObjectRecord::from_object).collect(),
        }
    }

    #[test]
    fn crc32_check_value() {
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
        assert_eq!(crc32(&[b"1234", b"56789"]), 0xCBF4_3926);
        assert_eq!(crc32(&[]), 0);
    }

    #[test]
    fn round_trip() {
        let bytes = encode_body(&body());
        assert_eq!(peek_revision(&bytes), Ok(9));
        let b = decode(&bytes).unwrap();
        assert_eq!((b.revision, b.objects.len(), b.size), (9, 2, bytes.len()));
        assert_eq!(b.source.node_id, 2);
        assert_eq!(b.objects.iter().map(|o| (**o).clone()).collect::<Vec<_>>(), objects());
        assert_eq!(b.kind_counts().get("VirtualService"), Some(&1));
    }

    #[test]
    fn encode_reads_one_applied_state() {
        let mut state = State { revision: 5, objects: Default::default() };
        let o = object(Kind::VirtualService, "a", 2, 5, 3);
        state.objects.insert(Arc::new(o.clone()));
        let applied = Applied { state, ..Default::default() };
        let b = decode(&encode(&applied, 3)).unwrap();
        assert_eq!((b.revision, b.source.node_id), (5, 3));
        assert_eq!(b.objects.iter().map(|o| (**o).clone()).collect::<Vec<_>>(), vec![o]);
    }

    #[test]
    fn damage_is_detected() {
        let good = encode_body(&body());
        // Every single flipped bit, in the header or the payload, fails.
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            assert!(decode(&bad).is_err(), "flipped byte {i} went unnoticed");
        }
        let mut bad = good.clone();
        bad[HEADER_LEN + 5] ^= 1;
        assert!(matches!(decode(&bad), Err(BackupError::Checksum { .. })));
        assert!(matches!(decode(&good[..good.len() - 1]), Err(BackupError::Truncated { .. })));
        assert!(matches!(decode(&good[..10]), Err(BackupError::Truncated { .. })));
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(decode(&longer).unwrap_err(), BackupError::Trailing(1));
        let mut v2 = good.clone();
        v2[8] = 2;
        assert_eq!(decode(&v2).unwrap_err(), BackupError::Format(2));
        assert_eq!(decode(b"apiVersion: v1\nkind: List\n").unwrap_err(), BackupError::NotASnapshot);
        assert_eq!(decode(b"").unwrap_err(), BackupError::NotASnapshot);
        // A length near u64::MAX in the header is truncation, not an
        // overflow (found by fuzz/fuzz_targets/decoders.rs).
        let mut huge = good.clone();
        huge[17..25].copy_from_slice(&u64::MAX.to_be_bytes());
        assert_eq!(decode(&huge).unwrap_err(), BackupError::Truncated { expected: u64::MAX, actual: good.len() as u64 });
    }

    #[test]
    fn inconsistent_contents_are_refused() {
        let mut b = body();
        b.revision = 8; // an object is at modRevision 9
        assert!(matches!(decode(&encode_body(&b)), Err(BackupError::Invalid(_))));
        let mut b = body();
        b.objects.swap(0, 1);
        assert!(matches!(decode(&encode_body(&b)), Err(BackupError::Invalid(_))));
    }

    /// The bytes of format 1 (see `state_machine::fixtures`): if this fails,
    /// existing backup files no longer restore.
    #[test]
    fn file_format_v1_is_stable() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/codec/backup_file.v1.hex");
        let hex: String = encode_body(&body()).iter().map(|b| format!("{b:02x}")).collect();
        if !path.exists() && std::env::var("LODESTAR_BLESS").is_ok() {
            std::fs::write(&path, format!("{hex}\n")).unwrap();
        }
        let stored = std::fs::read_to_string(&path).unwrap_or_else(|_| panic!("missing fixture {}", path.display()));
        let stored = stored.trim();
        let raw: Vec<u8> = (0..stored.len()).step_by(2).map(|i| u8::from_str_radix(&stored[i..i + 2], 16).unwrap()).collect();
        let b = decode(&raw).expect("stored backup file no longer decodes");
        assert_eq!((b.revision, b.objects.len(), b.source.applied_index), (9, 2, 14));
        assert_eq!(hex, stored, "backup file encoding changed");
    }

    #[tokio::test]
    async fn restore_writes_an_initialised_data_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let b = decode(&encode_body(&body())).unwrap();
        let info = |n: u16| NodeInfo { raft_addr: format!("127.0.0.1:{n}"), api_addr: "127.0.0.1:1".into(), xds_addr: "127.0.0.1:2".into() };
        let members = BTreeMap::from([(1, info(10)), (2, info(20))]);
        let dir = tmp.path().join("n1");
        restore(&b, &dir, 1, members.clone()).await.unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700, "a data dir is its owner's only");

        // sled releases its file lock when its flusher thread lets go of
        // the store, shortly after the last handle is dropped: in the same
        // process, opening it again may wait for that.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let db = loop {
            match super::super::open_db(&dir, super::super::DEFAULT_CACHE_BYTES) {
                Ok(db) => break db,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => panic!("reopening the restored store: {e}"),
            }
        };
        let (mut sm, reader) = StateMachine::open(&db, 10).unwrap();
        let applied = reader.current();
        assert_eq!((applied.revision(), applied.compacted, applied.last_applied), (9, 9, Some(restored_log_id())));
        assert_eq!(applied.state.objects.len(), 2);
        assert_eq!(applied.membership.membership().voter_ids().collect::<Vec<_>>(), vec![1, 2]);
        let snap = sm.get_current_snapshot().await.unwrap().expect("a snapshot for new members");
        assert_eq!(snap.meta.last_log_id, Some(restored_log_id()));
        let mut log = LogStore::open(&db).unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!((st.last_purged_log_id, st.last_log_id), (Some(restored_log_id()), Some(restored_log_id())));
        assert_eq!(log.read_vote().await.unwrap(), None);
        drop((sm, reader, log, db));

        // Not into a non-empty directory, and not for a node outside the members.
        let err = restore(&b, &dir, 1, members.clone()).await.unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        let err = restore(&b, &tmp.path().join("n3"), 3, members).await.unwrap_err().to_string();
        assert!(err.contains("not one of the members"), "{err}");
        assert!(!tmp.path().join("n3").exists());
    }
}
