//! The table of applied request ids: part of the replicated state, so that
//! a group of writes sent twice (a follower re-forwarding to a new leader a
//! batch the old one may already have put in the log) is applied once, and
//! the second copy answers with the first one's results.
//!
//! Deterministic: it changes only as entries apply, and it travels with
//! the state (checkpointed with `m/applied`, carried in snapshots), so
//! every replica decides "duplicate" the same way for the same log.
//!
//! Bounded: per origin replica the last [`WINDOW`] groups, and at most
//! [`MAX_ORIGINS`] origins (the one that recorded least recently, by log
//! index, goes first). A replica keeps one batch in flight and sends it
//! again only until it has an answer, so a copy of a group can follow the
//! first within a few entries of its origin's: the window is far larger.

use super::txn::{NodeId, RequestId, TxnResult};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Groups remembered per origin replica.
pub const WINDOW: usize = 64;
/// Origin replicas remembered.
pub const MAX_ORIGINS: usize = 64;

/// Cloned with every applied state: shares everything until a write
/// records a group.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Dedup {
    origins: Arc<BTreeMap<NodeId, Arc<Window>>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Window {
    /// Log index of the entry that last recorded a group here.
    last_index: u64,
    /// (seq, the group's results), oldest first.
    groups: VecDeque<(u64, Arc<Vec<TxnResult>>)>,
}

impl Dedup {
    /// The results a group with this id had, if it was applied (and is
    /// still remembered).
    pub fn get(&self, id: &RequestId) -> Option<&Arc<Vec<TxnResult>>> {
        self.origins.get(&id.origin)?.groups.iter().find(|(seq, _)| *seq == id.seq).map(|(_, r)| r)
    }

    /// Remember a group applied by the entry at `index`.
    pub fn record(&mut self, id: RequestId, index: u64, results: Arc<Vec<TxnResult>>) {
        let origins = Arc::make_mut(&mut self.origins);
        let window = Arc::make_mut(origins.entry(id.origin).or_default());
        window.last_index = index;
        window.groups.push_back((id.seq, results));
        while window.groups.len() > WINDOW {
            window.groups.pop_front();
        }
        while origins.len() > MAX_ORIGINS {
            let oldest = origins.iter().min_by_key(|(origin, w)| (w.last_index, **origin)).map(|(origin, _)| *origin);
            match oldest {
                Some(o) => origins.remove(&o),
                None => break,
            };
        }
    }

    pub fn is_empty(&self) -> bool {
        self.origins.is_empty()
    }

    /// Groups remembered, over all origins.
    pub fn len(&self) -> usize {
        self.origins.values().map(|w| w.groups.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::TxnOk;

    fn results(revision: u64) -> Arc<Vec<TxnResult>> {
        Arc::new(vec![Ok(TxnOk { revision, items: Vec::new() })])
    }

    #[test]
    fn remembers_the_last_window_per_origin_and_the_most_recent_origins() {
        let mut d = Dedup::default();
        for seq in 0..(WINDOW as u64 + 5) {
            d.record(RequestId { origin: 1, seq }, seq, results(seq));
        }
        assert!(d.get(&RequestId { origin: 1, seq: 4 }).is_none(), "fell out of the window");
        assert_eq!(d.get(&RequestId { origin: 1, seq: 5 }), Some(&results(5)));
        assert!(d.get(&RequestId { origin: 2, seq: 5 }).is_none(), "another origin's number is another id");
        assert_eq!(d.len(), WINDOW);

        // Origins beyond the bound: the least recently recorded goes.
        for origin in 2..=(MAX_ORIGINS as u64 + 1) {
            d.record(RequestId { origin, seq: 0 }, 1000 + origin, results(origin));
        }
        assert!(d.get(&RequestId { origin: 1, seq: 5 }).is_none(), "origin 1 recorded least recently");
        assert!(d.get(&RequestId { origin: 2, seq: 0 }).is_some());

        // A clone is a snapshot: recording into one leaves the other alone.
        let before = d.clone();
        d.record(RequestId { origin: 9, seq: 7 }, 5000, results(7));
        assert!(before.get(&RequestId { origin: 9, seq: 7 }).is_none());
        assert!(d.get(&RequestId { origin: 9, seq: 7 }).is_some());
    }
}
