//! History retention: how far back the watch history (and with it
//! `history`, `diff` and `rollback`) reaches. At least
//! `history_revisions` revisions or every revision younger than
//! `history_max_age_s`, whichever keeps more.
//!
//! Age is read from the log, never from a clock: the leader stamps each
//! entry it proposes with its time (`Command::Stamped`), and the state
//! machine keeps a coarse index of when revisions were made ([`Times`]):
//! one mark per slot of time that had writes (a hundredth of the age, at
//! most a minute), (the last revision made in it, its time). A mark says
//! "every revision up to this one was made at or before this time", so a
//! decision by age errs on the side of keeping (by less than a slot).
//! Pure: every replica applying the same log with the same settings
//! decides the same.

use serde::{Deserialize, Serialize};

/// The retention settings (`ServerConfig::retention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep at least this many revisions (at least 1).
    pub revisions: u64,
    /// And every revision made less than this long ago (0: by count only).
    pub max_age_ms: u64,
}

/// By count only (what tests and offline tools use).
impl From<u64> for Retention {
    fn from(revisions: u64) -> Retention {
        Retention { revisions, max_age_ms: 0 }
    }
}

impl Retention {
    /// The slot of time one mark stands for: a hundredth of the age, at
    /// least 10 ms, at most a minute (30 days: 43,200 marks at most).
    pub fn mark_ms(&self) -> u64 {
        (self.max_age_ms / 100).clamp(10, MARK_MS)
    }
}

impl std::fmt::Display for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.max_age_ms {
            0 => write!(f, "the last {} revisions", self.revisions),
            ms => write!(f, "the last {} revisions or {} s, whichever is more", self.revisions, ms / 1000),
        }
    }
}

/// The longest slot of time one mark stands for.
pub const MARK_MS: u64 = 60_000;

/// A mark: every revision up to `revision` was made at or before `at_ms`
/// (the leader's Unix milliseconds), in the slot that starts at
/// `slot_ms` (its key in the state tree, `t/`). Persisted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub slot_ms: u64,
    pub revision: u64,
    pub at_ms: u64,
}

/// When the retained revisions were made, coarsely (see the module doc).
/// A persistent vector: the applied state is cloned for every apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Times {
    marks: imbl::Vector<Mark>,
    /// The latest stamp applied (0: none yet, the cluster writes no
    /// stamps, or they were all compacted away before a restart).
    now_ms: u64,
}

impl Times {
    /// Marks read back from the store, oldest first.
    pub fn from_marks(marks: impl IntoIterator<Item = Mark>) -> Times {
        let marks: imbl::Vector<Mark> = marks.into_iter().collect();
        let now_ms = marks.back().map_or(0, |m| m.at_ms);
        Times { marks, now_ms }
    }

    /// An entry stamped `unix_ms` was applied and the store is at
    /// `revision`. Time never goes back here (a new leader's clock may be
    /// behind the last one's). Returns the mark written or updated, to
    /// persist (None: nothing changed).
    pub fn stamp(&mut self, unix_ms: u64, revision: u64, r: &Retention) -> Option<Mark> {
        let at_ms = unix_ms.max(self.now_ms);
        self.now_ms = at_ms;
        let slot_ms = at_ms - at_ms % r.mark_ms();
        match self.marks.back_mut() {
            _ if revision == 0 => None,
            Some(last) if last.revision == revision => None,
            Some(last) if last.slot_ms == slot_ms => {
                *last = Mark { slot_ms, revision, at_ms };
                Some(*last)
            }
            _ => {
                self.marks.push_back(Mark { slot_ms, revision, at_ms });
                self.marks.back().copied()
            }
        }
    }

    /// The latest stamp applied (0: none).
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// The revision the history may be compacted to (it and every one
    /// before it dropped) at `revision`: the lesser of what each rule
    /// would drop. By count only while no stamp was applied.
    pub fn compact_to(&self, revision: u64, r: &Retention) -> u64 {
        let by_count = revision.saturating_sub(r.revisions.max(1));
        if r.max_age_ms == 0 || self.now_ms == 0 {
            return by_count;
        }
        let cutoff = self.now_ms.saturating_sub(r.max_age_ms);
        let older = self.marks.iter().take_while(|m| m.at_ms < cutoff).last().map_or(0, |m| m.revision);
        by_count.min(older)
    }

    /// Forget the marks of compacted revisions but the last (it still
    /// dates them): they can no longer move the compaction.
    pub fn prune(&mut self, compacted: u64) {
        while self.marks.get(1).is_some_and(|m| m.revision <= compacted) {
            self.marks.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 3600 * 1000;

    #[test]
    fn keeps_whichever_rule_keeps_more() {
        let r = Retention { revisions: 10, max_age_ms: 30 * DAY };
        let mut t = Times::default();
        // No stamp yet (a cluster of version 1): by count.
        assert_eq!(t.compact_to(100, &r), 90);
        // 100 revisions on day 0, then one a day for 40 days.
        let day0 = 1_000 * DAY;
        t.stamp(day0, 100, &r);
        for d in 1..=40 {
            t.stamp(day0 + d * DAY, 100 + d, &r);
        }
        // Day 40: revisions made before day 10 are older than 30 days
        // (revision 109 on day 9); the last 10 revisions are 131..=140.
        assert_eq!(t.compact_to(140, &r), 109, "age keeps more than the count");
        // With a retention of 100 revisions the count keeps more.
        assert_eq!(t.compact_to(140, &Retention { revisions: 100, max_age_ms: 30 * DAY }), 40);
        // By count only.
        assert_eq!(t.compact_to(140, &Retention::from(10)), 130);
        // Pruned to the compaction, the decision is the same.
        t.prune(109);
        assert_eq!(t.compact_to(140, &r), 109);
        assert_eq!(t.len(), 32);
    }

    #[test]
    fn one_mark_a_slot_and_time_never_goes_back() {
        let r = Retention { revisions: 1, max_age_ms: 30 * DAY };
        assert_eq!((r.mark_ms(), Retention { revisions: 1, max_age_ms: 4000 }.mark_ms()), (MARK_MS, 40));
        let mut t = Times::default();
        assert_eq!(t.stamp(5 * MARK_MS, 0, &r), None, "no revision yet: no mark");
        assert_eq!(t.stamp(5 * MARK_MS + 1, 1, &r), Some(Mark { slot_ms: 5 * MARK_MS, revision: 1, at_ms: 5 * MARK_MS + 1 }));
        t.stamp(5 * MARK_MS + 500, 7, &r);
        assert_eq!(t.len(), 1, "the same minute: one mark, moved to the last revision and time");
        assert_eq!(t.stamp(5 * MARK_MS + 600, 7, &r), None, "no new revision");
        // A new leader whose clock is behind: the stamp counts as now.
        assert_eq!(t.stamp(MARK_MS, 8, &r), Some(Mark { slot_ms: 5 * MARK_MS, revision: 8, at_ms: 5 * MARK_MS + 600 }));
        t.stamp(6 * MARK_MS, 9, &r);
        assert_eq!(t.len(), 2);
        assert_eq!(Times::from_marks(t.marks.iter().copied()), t);
        // Revision 9 (made at minute 6) is younger than 1 s as of minute 6;
        // revisions up to 8 are not.
        assert_eq!(t.compact_to(9, &Retention { revisions: 1, max_age_ms: 1000 }), 8);
    }
}

/// The state machine keeps what the settings say, from the stamps in the
/// log, across reopening and a snapshot install.
#[cfg(test)]
mod state_machine_tests {
    use super::*;
    use crate::model::{Kind, ResourceKey};
    use crate::store::state_machine::{StateMachine, StoreReader};
    use crate::store::types::{Command, Entry, Group, LogId, Op, Txn};
    use openraft::storage::RaftStateMachine;
    use openraft::{CommittedLeaderId, EntryPayload, RaftSnapshotBuilder};

    const MIN: u64 = 60_000;

    fn put(i: u64) -> Txn {
        let key = ResourceKey::new(Kind::DestinationRule, "ns", format!("dr-{i}"));
        let body = serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": key.name, "namespace": "ns"}, "spec": {"host": "reviews"}});
        Txn { ops: vec![Op::Put { key, body: body.to_string().into(), expected_revision: None }] }
    }

    /// Entry `index`, stamped at minute `minute`, making one revision.
    fn stamped(index: u64, minute: u64) -> Entry {
        let groups = vec![Group { id: None, txns: vec![put(index)] }];
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(Command::Stamped { unix_ms: minute * MIN, groups }) }
    }

    fn oldest(reader: &StoreReader) -> u64 {
        reader.current().compacted + 1
    }

    #[tokio::test]
    async fn by_count_or_age_whichever_keeps_more_across_reopening_and_snapshots() {
        let tmp = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(tmp.path().join("a")).open().unwrap();
        // At least 5 revisions, or 10 minutes.
        let retention = Retention { revisions: 5, max_age_ms: 10 * MIN };
        let (mut sm, reader) = StateMachine::open(&db, retention).unwrap();
        // 20 revisions within minute 100: all younger than 10 minutes.
        for i in 1..=20 {
            sm.apply([stamped(i, 100)]).await.unwrap();
        }
        assert_eq!((reader.current().revision(), oldest(&reader)), (20, 1), "age keeps more than the count");
        // Reopened: the marks come back from the store.
        reader.checkpoint().unwrap();
        drop((sm, reader));
        let (mut sm, reader) = StateMachine::open(&db, retention).unwrap();
        assert_eq!(oldest(&reader), 1);
        // Minute 111: revisions 1..=20 are now older than 10 minutes, and
        // the count keeps the last 5 (17..=21).
        sm.apply([stamped(21, 111)]).await.unwrap();
        assert_eq!(oldest(&reader), 17, "without the marks read back, nothing would be old enough to drop");
        // More in minute 111 and 112: the count decides while they are young.
        for i in 22..=30 {
            sm.apply([stamped(i, 111 + i % 2)]).await.unwrap();
        }
        assert_eq!(oldest(&reader), 21, "minute 112: 1..=20 are old, 21.. young: the age keeps 21..=30, more than the count");
        sm.apply([stamped(31, 125)]).await.unwrap();
        assert_eq!(oldest(&reader), 27, "minute 125: everything before is old; the last 5 stay");
        reader.checkpoint().unwrap();
        let (events, _) = reader.history_from(27).unwrap();
        assert_eq!(events.first().map(|e| e.revision), Some(27));

        // A replica that installs a snapshot keeps history from its revision
        // on, and retains as the others do from there.
        let snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let db2 = sled::Config::new().path(tmp.path().join("b")).open().unwrap();
        let (mut other, other_reader) = StateMachine::open(&db2, retention).unwrap();
        other.install_snapshot(&snap.meta, snap.snapshot).await.unwrap();
        assert_eq!(oldest(&other_reader), 32, "history from the snapshot's revision");
        for i in 32..=40 {
            other.apply([stamped(i, 126)]).await.unwrap();
            sm.apply([stamped(i, 126)]).await.unwrap();
        }
        assert_eq!((oldest(&other_reader), oldest(&reader)), (32, 31), "minute 126: what is younger than 10 minutes is kept on both");
        other.apply([stamped(41, 140)]).await.unwrap();
        sm.apply([stamped(41, 140)]).await.unwrap();
        assert_eq!((oldest(&other_reader), oldest(&reader)), (37, 37), "then both keep the last 5");
    }

    /// Wire version 2: a stamped entry and a mark, as persisted.
    #[test]
    fn format_is_stable() {
        let groups = vec![Group { id: Some(crate::store::types::RequestId { origin: 2, seq: 9 }), txns: vec![put(1)] }];
        let payload = EntryPayload::Normal(Command::Stamped { unix_ms: 1_790_000_000_000, groups });
        let entry = Entry { log_id: LogId::new(CommittedLeaderId::new(4, 1), 12), payload };
        crate::store::codec::check_fixture_at("log_entry_stamped", 2, &entry);
        crate::store::codec::check_fixture_at("mark", 2, &Mark { slot_ms: 1_789_999_980_000, revision: 7, at_ms: 1_790_000_000_000 });
    }

    /// Unstamped entries (a cluster not yet at version 2) are kept by count.
    #[tokio::test]
    async fn without_stamps_by_count() {
        let tmp = tempfile::tempdir().unwrap();
        let db = sled::Config::new().path(tmp.path()).open().unwrap();
        let (mut sm, reader) = StateMachine::open(&db, Retention { revisions: 5, max_age_ms: 10 * MIN }).unwrap();
        for i in 1..=20 {
            let entry = Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), i), payload: EntryPayload::Normal(Command::Batch(vec![put(i)])) };
            sm.apply([entry]).await.unwrap();
        }
        assert_eq!(oldest(&reader), 16);
    }
}
