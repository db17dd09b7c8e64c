//! The push trigger between the store and the ADS streams: which applied
//! revisions are pushed, and when.
//!
//! Adaptive debounce: a change that arrives when nothing was pushed in the
//! last `debounce` is pushed at once (an isolated change on an idle cluster
//! waits for nothing; Istio's fixed 100 ms debounce does). A change that
//! arrives sooner is held, with any that follow, and pushed `debounce`
//! after the previous push. So a burst costs at most one push per
//! `debounce` (every stream regenerates once for many writes, the last
//! state wins), and no change waits longer than `debounce`. Streams that
//! are still busy with a previous push coalesce further on their own: they
//! always take the newest pushed revision.

use crate::metrics::metrics;
use crate::store::Applied;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Start the debouncer: the returned channel carries the revisions to push.
/// A revision that changed only statuses (`Op::Status`, which translation
/// never reads: `state::Objects::spec_diff`) is no push: the streams are not
/// woken, and `sync` learns that it leaves every config as the last pushed
/// revision's (so `wait` for it is answered by that one's ACKs).
pub fn debounce(mut applied: watch::Receiver<Arc<Applied>>, window: Duration, sync: super::SyncRegistry) -> watch::Receiver<Arc<Applied>> {
    let first = applied.borrow_and_update().clone();
    publish_time(first.revision());
    let (tx, rx) = watch::channel(first);
    tokio::spawn(async move {
        let mut last_push: Option<Instant> = None;
        loop {
            if applied.changed().await.is_err() {
                return; // the store is gone
            }
            let (last, next) = (tx.borrow().clone(), applied.borrow_and_update().clone());
            if status_only(&last, &next) {
                sync.same_config(last.revision(), next.revision());
                continue;
            }
            let held_since = Instant::now();
            if let Some(at) = last_push.filter(|at| at.elapsed() < window) {
                // A burst: hold until `window` after the previous push,
                // taking whatever else arrives meanwhile.
                tokio::time::sleep_until((at + window).into()).await;
            }
            let next = applied.borrow_and_update().clone();
            metrics().debounce_time.observe(held_since.elapsed());
            metrics().push_triggers.inc();
            publish_time(next.revision());
            last_push = Some(Instant::now());
            if tx.send(next).is_err() {
                return; // nobody listens: the server stopped
            }
        }
    });
    rx
}

/// Whether `next` differs from `last` (a newer revision) only by statuses
/// that keep the generation: no config can differ between them.
fn status_only(last: &Applied, next: &Applied) -> bool {
    next.revision() > last.revision() && last.state.objects.spec_diff(&next.state.objects).next().is_none()
}

/// When recent revisions were handed to the streams (for the convergence
/// histogram: publish → ACK).
fn clock() -> &'static Mutex<VecDeque<(u64, Instant)>> {
    static CLOCK: OnceLock<Mutex<VecDeque<(u64, Instant)>>> = OnceLock::new();
    CLOCK.get_or_init(Default::default)
}

fn publish_time(revision: u64) {
    let mut c = clock().lock().unwrap_or_else(|e| e.into_inner());
    if c.back().is_some_and(|(r, _)| *r >= revision) {
        return;
    }
    if c.len() >= 1024 {
        c.pop_front();
    }
    c.push_back((revision, Instant::now()));
}

/// When `revision` was pushed, if it is recent.
pub fn published_at(revision: u64) -> Option<Instant> {
    let c = clock().lock().unwrap_or_else(|e| e.into_inner());
    c.iter().rev().find(|(r, _)| *r == revision).map(|(_, at)| *at)
}
