//! Wire versions and the cluster version: what lets replicas of two
//! adjacent releases run side by side during a rolling upgrade.
//!
//! A build reads and writes the wire versions [`MIN`]`..=`[`MAX`] (the
//! format of log entries, snapshots and peer messages: `store::codec`,
//! `node::messages`). The cluster version is the highest version every
//! member (voters and learners: a learner is sent the log too) supports:
//! the least of their `max`, never lower than the highest cluster version
//! this replica has seen (etcd's cluster version does not go down
//! either). Each replica works it out on its own, from a
//! `ForwardRequest::Version` it sends every member every
//! [`REFRESH_INTERVAL`]; a replica of version 1 cannot decode that request
//! and answers "undecodable peer payload", which counts as version 1. A
//! member that does not answer keeps its last known versions; one never
//! heard from counts as version 1.
//!
//! It is not a raft entry: proposing one would itself be a log entry an
//! older member cannot read, and the apply path does not depend on it (the
//! gate below runs before a write is proposed; what it lets through applies
//! the same on every replica). The highest cluster version seen is kept
//! in the data directory (`cluster-version`), so a restarted replica does
//! not forget that the cluster was raised.
//!
//! The gate: a write whose kinds or features need a newer cluster version
//! ([`KINDS`], [`FEATURES`]) is refused with FAILED_PRECONDITION before it
//! is proposed, naming what needs it and which members are behind. New log
//! entry shapes, kinds and peer messages go in those tables.
//!
//! Joining: the leader asks a replica for its versions before adding it
//! as a learner, and refuses one that cannot run at the cluster version
//! ([`admit_joiner`]); a member checks itself as well ([`refused`]).

use super::messages::PeerVersion;
use super::{ForwardReply, ForwardRequest, PeerError};
use crate::error::{Error, Result};
use crate::model::Kind;
use crate::store::types::{NodeId, Op, Txn};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// The oldest wire version this build reads and writes.
pub const MIN: u32 = 1;
/// The newest wire version this build reads and writes. Version 1: the
/// release at commit 7a825a0 (nothing was versioned before it). Version
/// 2: `ForwardRequest::Version`, and [`Feature::Author`] and
/// [`Feature::Stamp`] in the log.
pub const MAX: u32 = 2;

/// What a replica of wire version 1 answers a request it cannot decode
/// (`peer::decode_payload`'s INVALID_ARGUMENT message).
pub const V1_ANSWER: &str = "undecodable peer payload";

/// How often a replica asks every member for its versions.
pub const REFRESH_INTERVAL: Duration = Duration::from_secs(1);

/// Kinds added after version 1, and the cluster version they need: an
/// older replica cannot decode a log entry that names them (`Kind` is a
/// bincode enum). Register a new kind here.
pub const KINDS: &[(Kind, u32)] = &[
    (Kind::GrpcRoute, 2),
    (Kind::TcpRoute, 2),
    (Kind::TlsRoute, 2),
    (Kind::MeshConfig, 2),
    (Kind::Telemetry, 2),
    (Kind::EnvoyFilter, 2),
    (Kind::BackendTlsPolicy, 2),
    (Kind::ListenerSet, 2),
];

/// Log entry shapes and other features added after version 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// `Op::Author`: who made a change (the token's name), shown by
    /// `history`. Added to writes only once the cluster runs version 2;
    /// before, the history shows no author.
    Author,
    /// A change message (`apply --message`), carried by `Op::Author`: a
    /// write that asks for one is refused until the cluster runs version 2.
    ChangeMessage,
    /// `Command::Stamped`: the leader's time in each entry it proposes,
    /// which history retention by age reads. Written only once the
    /// cluster runs version 2 (version 2 was not released without it);
    /// before, history is kept by count alone.
    Stamp,
    /// `Op::Status`: a status write that keeps the object's generation
    /// (the Gateway API status, `gateway_status`). Written only once the
    /// cluster runs version 2; before, that status is not stored.
    StatusOnly,
}

/// Each feature, its name in errors, and the cluster version it needs.
pub const FEATURES: &[(Feature, &str, u32)] = &[
    (Feature::Author, "recording the author of a change", 2),
    (Feature::ChangeMessage, "a change message", 2),
    (Feature::Stamp, "the time of a write in the log", 2),
    (Feature::StatusOnly, "a status write that keeps the generation", 2),
];

/// The cluster version a kind needs (1 for every kind not in [`KINDS`]).
pub fn kind_since(kind: Kind) -> u32 {
    since_in(KINDS, kind)
}

fn since_in(kinds: &[(Kind, u32)], kind: Kind) -> u32 {
    kinds.iter().find(|(k, _)| *k == kind).map_or(1, |(_, v)| *v)
}

/// The cluster version a feature needs, and its name.
pub fn feature_since(feature: Feature) -> (&'static str, u32) {
    FEATURES.iter().find(|(f, _, _)| *f == feature).map(|(_, name, v)| (*name, *v)).expect("every feature is in FEATURES")
}

/// What in `txn` needs the newest cluster version, and that version (1:
/// nothing beyond version 1).
pub fn required(txn: &Txn) -> (String, u32) {
    required_in(KINDS, txn)
}

fn required_in(kinds: &[(Kind, u32)], txn: &Txn) -> (String, u32) {
    let mut need = (String::new(), 1);
    for op in &txn.ops {
        let (what, v) = match op {
            Op::Author(a) if a.message.is_some() => {
                let (name, v) = feature_since(Feature::ChangeMessage);
                (name.to_string(), v)
            }
            Op::Author(_) => {
                let (name, v) = feature_since(Feature::Author);
                (name.to_string(), v)
            }
            Op::Status { .. } => {
                let (name, v) = feature_since(Feature::StatusOnly);
                (name.to_string(), v)
            }
            op => match op.key() {
                Some(key) => (format!("the kind {}", key.kind.name()), since_in(kinds, key.kind)),
                None => continue,
            },
        };
        if v > need.1 {
            need = (what, v);
        }
    }
    need
}

/// This build's versions: [`MIN`]`..=`[`MAX`], or, for tests of builds
/// that do not exist yet, `LODESTAR_TEST_WIRE_VERSIONS=MIN-MAX`.
pub fn this_build() -> (u32, u32) {
    let parsed = std::env::var("LODESTAR_TEST_WIRE_VERSIONS").ok().and_then(|v| {
        let (a, b) = v.split_once('-')?;
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    });
    parsed.filter(|(a, b)| a <= b && *a >= 1).unwrap_or((MIN, MAX))
}

/// A member's versions as this replica knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Known {
    pub min: u32,
    pub max: u32,
    /// Answered the last time it was asked.
    pub current: bool,
}

/// The cluster version and who holds it back, as this replica sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterVersion {
    pub version: u32,
    /// Members whose newest version is below this build's `max`:
    /// (id, their max; 1 when never heard from).
    pub behind: Vec<(NodeId, u32)>,
    /// Members that cannot run at the cluster version: (id, why).
    pub incompatible: Vec<(NodeId, String)>,
}

impl ClusterVersion {
    fn members_behind(&self) -> String {
        if self.behind.is_empty() {
            return "none".into();
        }
        self.behind.iter().map(|(id, v)| format!("replica {id} (version {v})")).collect::<Vec<_>>().join(", ")
    }
}

/// Every member's versions, and the highest cluster version seen.
pub struct Versions {
    pub id: NodeId,
    pub min: u32,
    pub max: u32,
    /// `DATA_DIR/cluster-version` (none in unit tests).
    floor_file: Option<PathBuf>,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    members: BTreeMap<NodeId, Known>,
    /// The highest cluster version seen (here or by a member), up to
    /// this build's `max`.
    floor: u32,
    /// The highest cluster version a member reported.
    reported: u32,
}

impl Versions {
    /// `data_dir`: where the highest cluster version seen is kept.
    pub fn new(id: NodeId, data_dir: Option<PathBuf>) -> Versions {
        let (min, max) = this_build();
        let floor_file = data_dir.map(|d| d.join("cluster-version"));
        let floor = floor_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).and_then(|t| t.trim().parse().ok()).unwrap_or(0);
        Versions { id, min, max, floor_file, inner: Mutex::new(Inner { members: BTreeMap::new(), floor, reported: 0 }) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What this replica says of itself to a peer.
    pub fn hello(&self, members: &[NodeId]) -> PeerVersion {
        PeerVersion { id: self.id, min: self.min, max: self.max, cluster: self.cluster(members).version }
    }

    /// What this replica knows of member `id`.
    pub fn known(&self, id: NodeId) -> Option<Known> {
        if id == self.id {
            return Some(Known { min: self.min, max: self.max, current: true });
        }
        self.lock().members.get(&id).copied()
    }

    /// Record what a member said (in a request or an answer).
    pub fn heard(&self, v: &PeerVersion) {
        if v.id == self.id {
            return;
        }
        let mut inner = self.lock();
        inner.members.insert(v.id, Known { min: v.min, max: v.max, current: true });
        inner.reported = inner.reported.max(v.cluster);
        // A member that saw the cluster at a version this build supports
        // raises the floor; one beyond it is not adopted (`admitted`
        // refuses to serve then).
        if v.cluster <= self.max {
            self.raise_floor(&mut inner, v.cluster);
        }
    }

    /// A member answered as a replica of version 1 does.
    pub fn heard_v1(&self, id: NodeId) {
        self.lock().members.insert(id, Known { min: 1, max: 1, current: true });
    }

    /// A member did not answer: its last known versions stay.
    pub fn unreachable(&self, id: NodeId) {
        if let Some(k) = self.lock().members.get_mut(&id) {
            k.current = false;
        }
    }

    fn raise_floor(&self, inner: &mut Inner, version: u32) {
        if version <= inner.floor {
            return;
        }
        inner.floor = version;
        if let Some(f) = &self.floor_file {
            let tmp = f.with_extension("tmp");
            let written = std::fs::write(&tmp, format!("{version}\n")).and_then(|_| std::fs::rename(&tmp, f));
            if let Err(e) = written {
                tracing::warn!(file = %f.display(), error = %e, "could not record the cluster version");
            }
        }
        tracing::info!(version, "the cluster version is now {version}");
    }

    /// The cluster version over `members` (voters and learners; this
    /// replica included if it is one): the least of their newest
    /// versions, not below the highest version seen. Raises (and records)
    /// that highest version. With no members known (a replica waiting to
    /// join), the highest seen (at least 1): a joiner must not take its
    /// own versions for the cluster's.
    pub fn cluster(&self, members: &[NodeId]) -> ClusterVersion {
        let mut inner = self.lock();
        let max_of = |id: NodeId| if id == self.id { self.max } else { inner.members.get(&id).map_or(1, |k| k.max) };
        let least = members.iter().map(|&id| max_of(id)).min().unwrap_or(0);
        let behind: Vec<(NodeId, u32)> = members.iter().map(|&id| (id, max_of(id))).filter(|(_, v)| *v < self.max).collect();
        let version = least.max(inner.floor).max(1);
        let range_of = |id: NodeId| if id == self.id { (self.min, self.max) } else { inner.members.get(&id).map_or((1, 1), |k| (k.min, k.max)) };
        let incompatible = members
            .iter()
            .filter_map(|&id| {
                let (min, max) = range_of(id);
                why_not(min, max, version).map(|why| (id, why))
            })
            .collect();
        if least > inner.floor {
            self.raise_floor(&mut inner, least);
        }
        ClusterVersion { version, behind, incompatible }
    }

    /// The gate: `Ok` when the cluster runs at least the version `txn`
    /// needs, else FAILED_PRECONDITION saying what needs which version and
    /// who holds the cluster back.
    pub fn check(&self, txn: &Txn, members: &[NodeId]) -> Result<()> {
        let (what, need) = required(txn);
        let c = self.cluster(members);
        if c.version >= need {
            return Ok(());
        }
        Err(Error::failed_precondition(format!(
            "{what} needs cluster version {need}, and the cluster runs version {}: members not upgraded yet: {}; upgrade every replica first (ops/upgrade.md)",
            c.version,
            c.members_behind()
        )))
    }
}

/// Why a build of versions `min..=max` cannot run in a cluster at
/// `cluster` (None: it can).
pub fn why_not(min: u32, max: u32, cluster: u32) -> Option<String> {
    if max < cluster {
        Some(format!("it supports wire versions {min}..{max}, older than the cluster version {cluster}: it cannot read what the cluster writes"))
    } else if min > cluster {
        Some(format!(
            "it supports wire versions {min}..{max}, newer than the cluster version {cluster}: upgrade one version at a time (every replica to the release between first)"
        ))
    } else {
        None
    }
}

/// Ask every other member for its versions once (answers recorded).
pub async fn refresh(node: &super::Node) {
    let members = node.members();
    let ids: Vec<NodeId> = members.iter().map(|(id, _, _)| *id).collect();
    let hello = ForwardRequest::Version(node.versions().hello(&ids));
    let asks = members.into_iter().filter(|(id, _, _)| *id != node.id).map(|(id, info, _)| {
        let hello = &hello;
        async move { (id, node.peers().forward(id, &info.raft_addr, hello, Duration::from_millis(800)).await) }
    });
    for (id, answer) in futures::future::join_all(asks).await {
        match answer {
            Ok(Ok(ForwardReply::Version(v))) => node.versions().heard(&PeerVersion { id, ..v }),
            // What a replica of version 1 answers (checked against the
            // previous release by tests/e2e/upgrade.rs).
            Err(PeerError::Failed { msg, .. }) if msg.contains(V1_ANSWER) => node.versions().heard_v1(id),
            Ok(Ok(_)) | Ok(Err(_)) | Err(_) => node.versions().unreachable(id),
        }
    }
}

/// Before replica `id` (raft address `raft_addr`) is added as a learner:
/// ask it for its versions, and refuse it (FAILED_PRECONDITION, saying
/// why) when they do not include the cluster version: a learner is sent
/// the log, so one older than the cluster could not decode it (a replica
/// of version 1 answers as such). One that has not answered within
/// [`JOINER_WAIT`] is refused too (UNAVAILABLE: start it first), so
/// nothing unchecked joins. A member already is not asked again.
pub async fn admit_joiner(node: &super::Node, id: NodeId, raft_addr: &str) -> Result<()> {
    if node.member_ids().contains(&id) {
        return Ok(());
    }
    let hello = ForwardRequest::Version(node.versions().hello(&node.member_ids()));
    let deadline = tokio::time::Instant::now() + JOINER_WAIT;
    let said = loop {
        match node.peers().forward(id, raft_addr, &hello, Duration::from_secs(1)).await {
            Ok(Ok(ForwardReply::Version(v))) => break PeerVersion { id, ..v },
            Err(PeerError::Failed { msg, .. }) if msg.contains(V1_ANSWER) => break PeerVersion { id, min: 1, max: 1, cluster: 1 },
            answer if tokio::time::Instant::now() >= deadline => {
                tracing::warn!(id, raft_addr, ?answer, "the joining replica did not say its versions: not added");
                return Err(Error::unavailable(format!(
                    "replica {id} at {raft_addr} did not say its wire versions within {JOINER_WAIT:?}: start it first (`lodestar server --join`), then add it"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(300)).await,
        }
    };
    let cluster = node.cluster_version().version;
    match why_not(said.min, said.max, cluster) {
        // Known from now on: a new learner is not counted as version 1
        // until the next refresh.
        None => {
            node.versions().heard(&said);
            Ok(())
        }
        Some(why) => Err(Error::failed_precondition(format!(
            "replica {id} cannot join: {why}; run a release that supports wire version {cluster} on it (ops/upgrade.md)"
        ))),
    }
}

/// How long [`admit_joiner`] waits for the joiner to answer.
pub const JOINER_WAIT: Duration = Duration::from_secs(5);

/// Keep every member's versions current until `stop`.
pub async fn keep_current(node: std::sync::Arc<super::Node>, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        refresh(&node).await;
        tokio::select! {
            _ = tokio::time::sleep(REFRESH_INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// A replica whose versions do not include the cluster version: it
/// stops (`server`), and the process exits with [`REFUSED_EXIT_CODE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// The exit code of a replica that refused to serve (`EX_CONFIG`: a
/// supervisor restarting it would get the same answer).
pub const REFUSED_EXIT_CODE: i32 = 78;

/// Resolves, with why, once this replica learns that its versions do not
/// include the cluster version the other members run at (it is older
/// than the cluster, or two versions ahead); never while they do. Waits
/// for a member to answer; a lone replica is never refused.
pub async fn refused(node: std::sync::Arc<super::Node>) -> String {
    loop {
        refresh(&node).await;
        if let Some(answer) = admission(&node) {
            match answer {
                Ok(()) => return std::future::pending().await,
                Err(why) => return why,
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `Some(Ok)`: this replica may serve; `Some(Err(why))`: it may not;
/// `None`: no other member has answered yet.
fn admission(node: &super::Node) -> Option<std::result::Result<(), String>> {
    let v = node.versions();
    let members = node.members();
    if members.iter().all(|(id, _, _)| *id == node.id) {
        return if members.is_empty() { None } else { Some(Ok(())) };
    }
    let others: Vec<NodeId> = members.iter().filter(|(id, _, _)| *id != node.id).map(|(id, _, _)| *id).collect();
    if !others.iter().any(|id| v.known(*id).is_some_and(|k| k.current)) {
        return None;
    }
    // The cluster's version without this replica: what the others run at.
    let least = others.iter().map(|id| v.known(*id).map_or(1, |k| k.max)).min().unwrap_or(v.max);
    let cluster = {
        let inner = v.lock();
        least.max(inner.reported).max(inner.floor)
    };
    Some(match why_not(v.min, v.max, cluster) {
        None => Ok(()),
        Some(why) => Err(format!("replica {} refuses to serve: {why}", node.id)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ResourceKey;
    use crate::state::txn::Author;

    fn versions() -> Versions {
        Versions { id: 1, min: 1, max: 2, floor_file: None, inner: Default::default() }
    }

    fn put() -> Op {
        Op::Put { key: ResourceKey::new(Kind::VirtualService, "default", "a"), body: "{}".into(), expected_revision: None }
    }

    #[test]
    fn the_cluster_runs_at_the_least_newest_version_and_never_goes_down() {
        let v = versions();
        // Never heard from: version 1.
        assert_eq!(v.cluster(&[1, 2, 3]).version, 1);
        assert_eq!(v.cluster(&[1, 2, 3]).behind, vec![(2, 1), (3, 1)]);
        v.heard(&PeerVersion { id: 2, min: 1, max: 2, cluster: 1 });
        v.heard_v1(3);
        assert_eq!(v.cluster(&[1, 2, 3]).version, 1);
        v.heard(&PeerVersion { id: 3, min: 1, max: 2, cluster: 1 });
        assert_eq!(v.cluster(&[1, 2, 3]), ClusterVersion { version: 2, behind: vec![], incompatible: vec![] });
        // Unreachable keeps the last known; rolled back after the raise:
        // the cluster stays at 2 and says who cannot follow.
        v.unreachable(2);
        assert_eq!(v.cluster(&[1, 2, 3]).version, 2);
        v.heard_v1(3);
        let c = v.cluster(&[1, 2, 3]);
        assert_eq!((c.version, c.incompatible.len()), (2, 1), "{c:?}");
        assert!(c.incompatible[0].1.contains("older than the cluster version 2"), "{c:?}");
    }

    /// A replica that knows no voters yet (waiting to join) runs at the
    /// version it has seen, not at its own: joining a cluster of version 1,
    /// it must not write version 2.
    #[test]
    fn a_joiner_does_not_take_its_own_version_for_the_clusters() {
        let v = versions();
        assert_eq!(v.cluster(&[]).version, 1);
        assert_eq!(v.hello(&[]).cluster, 1);
        v.heard_v1(2);
        assert_eq!(v.cluster(&[2, 1]).version, 1);
        // A lone voter is the whole cluster.
        assert_eq!(versions().cluster(&[1]).version, 2);
    }

    #[test]
    fn the_gate_names_the_feature_the_version_and_who_is_behind() {
        let v = versions();
        let plain = Txn { ops: vec![put()] };
        assert!(v.check(&plain, &[1, 2]).is_ok());
        let authored = Txn { ops: vec![put(), Op::Author(Author { name: "ci".into(), message: Some("canary".into()) })] };
        let e = v.check(&authored, &[1, 2]).unwrap_err();
        assert_eq!(e.code, crate::error::Code::FailedPrecondition);
        assert!(e.message.contains("a change message needs cluster version 2, and the cluster runs version 1"), "{}", e.message);
        assert!(e.message.contains("replica 2 (version 1)"), "{}", e.message);
        v.heard(&PeerVersion { id: 2, min: 1, max: 2, cluster: 1 });
        assert!(v.check(&authored, &[1, 2]).is_ok());
    }

    /// A kind registered in the table (as the lead registers new kinds)
    /// needs its version; a delete of it too (the entry names the kind).
    #[test]
    fn a_registered_kind_needs_its_version() {
        let table = [(Kind::Sidecar, 2)];
        let key = ResourceKey::new(Kind::Sidecar, "default", "s");
        let del = Txn { ops: vec![put(), Op::Delete { key, expected_revision: None, ignore_missing: true }] };
        assert_eq!(required_in(&table, &del), ("the kind Sidecar".to_string(), 2));
        assert_eq!(required_in(&table, &Txn { ops: vec![put()] }).1, 1);
        assert_eq!(required(&del).1, 1, "not registered in KINDS");
    }

    /// The kinds version 1 (7a825a0) knew are the first 23 variants;
    /// every later one needs version 2 (an older replica cannot decode an
    /// entry that names it), so none may be left out of [`KINDS`].
    #[test]
    fn every_kind_added_after_version_1_is_gated() {
        for (i, kind) in Kind::ALL.iter().enumerate() {
            let want = if i < 23 { 1 } else { 2 };
            assert_eq!(kind_since(*kind), want, "{kind:?}: add it to KINDS with the version that added it");
        }
    }

    #[test]
    fn bad_combinations() {
        assert_eq!(why_not(1, 2, 1), None);
        assert_eq!(why_not(1, 2, 2), None);
        assert!(why_not(3, 4, 2).unwrap().contains("newer than the cluster version 2"));
        assert!(why_not(1, 1, 2).unwrap().contains("older than the cluster version 2"));
    }
}
