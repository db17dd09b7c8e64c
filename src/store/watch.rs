//! Watch: replay history from a revision, then follow live changes.
//!
//! The stream subscribes to live events *before* replaying, so nothing
//! committed in between is missed; live events at or below the replay
//! position are skipped. A watcher that falls behind the broadcast buffer
//! (lagged) silently goes back to reading the persisted history, so a slow
//! watcher costs disk reads, not memory, and never loses an event — unless
//! the history it needs was compacted, which ends the stream with
//! `Code::Compacted` (etcd's ErrCompacted).

use super::state_machine::{StoreReader, WatchMsg};
use crate::error::Error;
use crate::model::Kind;
use crate::state::history::compacted;
use crate::state::Event;
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;

#[derive(Debug, Clone, Default)]
pub struct WatchFilter {
    pub kind: Option<Kind>,
    pub namespace: Option<String>,
    /// Leave out tokens, policies and roles (a watch of every kind by a
    /// caller that may not see them).
    pub skip_acl: bool,
}

impl WatchFilter {
    pub fn matches(&self, e: &Event) -> bool {
        let kind = e.object.key.kind;
        self.kind.is_none_or(|k| k == kind) && self.namespace.as_ref().is_none_or(|ns| *ns == e.object.key.namespace) && !(self.skip_acl && kind.is_acl())
    }
}

/// Whether a watch from `from_revision` can start: `Code::Compacted`
/// (HTTP 410, gRPC OUT_OF_RANGE) naming the oldest revision it could
/// start from if the history after it was compacted away, as etcd
/// refuses a watch below its compact revision. Checked before a stream
/// is answered, so the refusal is the response's status; a watch whose
/// history is compacted while it lags is told in the stream (`watch`).
pub fn check_start(reader: &StoreReader, from_revision: Option<u64>) -> Result<(), Error> {
    let Some(from) = from_revision else { return Ok(()) };
    let applied = reader.current();
    if from < applied.compacted && from < applied.revision() {
        return Err(compacted(from, applied.compacted));
    }
    Ok(())
}

/// Every change with revision > `from_revision`; `None`: changes from now on.
pub fn watch(reader: StoreReader, from_revision: Option<u64>, filter: WatchFilter) -> impl Stream<Item = Result<Event, Error>> {
    async_stream::stream! {
        let mut live = reader.subscribe_events();
        let mut next = from_revision.unwrap_or_else(|| reader.current().revision()) + 1;
        'replay: loop {
            let applied = reader.current();
            if next <= applied.compacted && next <= applied.revision() {
                yield Err(compacted(next - 1, applied.compacted));
                return;
            }
            while next <= applied.revision() {
                match reader.history_from(next) {
                    Ok((events, last)) => {
                        for e in events { if e.revision <= applied.revision() && filter.matches(&e) { yield Ok(e); } }
                        next = last.min(applied.revision()) + 1;
                    }
                    Err(e) => { yield Err(Error::internal(format!("reading watch history: {e}"))); return; }
                }
            }
            loop {
                match live.recv().await {
                    Ok(WatchMsg::Events(events)) => {
                        // A batch holds whole revisions, in order; several
                        // events can share one revision.
                        let mut in_progress = None;
                        for e in events.iter() {
                            if let Some(p) = in_progress {
                                if e.revision > p { next = p + 1; in_progress = None; }
                            }
                            if e.revision < next { continue; }
                            if e.revision > next {
                                // A gap (e.g. a snapshot installed meanwhile): re-read.
                                continue 'replay;
                            }
                            in_progress = Some(e.revision);
                            if filter.matches(e) { yield Ok(e.clone()); }
                        }
                        if let Some(p) = in_progress { next = p + 1; }
                    }
                    Ok(WatchMsg::Reset) | Err(RecvError::Lagged(_)) => continue 'replay,
                    Err(RecvError::Closed) => return,
                }
            }
        }
    }
}
