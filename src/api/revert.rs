//! Cluster-wide revert on NACK (`revert_on_nack`): a revision that a proxy
//! of this replica rejects within `revert_on_nack_window_s` of its write is
//! rolled back by a forward revision, as `apply --revert-on-nack` does per
//! write: the same rollback (`history::rollback_txn` to the revision
//! before, of the objects the rejected revision wrote), the same write
//! path (`apply_authorized`: audited, authored, with a change message
//! naming the NACK).
//!
//! Nothing is reverted, or left alone, silently: each decision is a log
//! line, a count in `lodestar_nack_reverts_total{result}` and an event on
//! `GET /v1/nacks` ([`RevertEvent`]). Left alone: a revision outside the
//! window, one this task wrote (a revert that is rejected too is not
//! reverted again), and one whose objects someone changed since (a
//! revert would undo that change too). A revision already reverted (by
//! another replica, whose proxies rejected it too) is let be quietly: the
//! objects are as they were before it.

use super::history::{self, Filter, RollbackRequest};
use super::Caller;
use crate::error::{Error, Result};
use crate::replica::Replica;
use crate::state::access::{Principal, Who};
use crate::state::EventType;
use crate::xds::status::NackEvent;
use serde::Serialize;
use std::collections::{BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{broadcast, watch};

/// What the revert did about a NACKed revision: an event on `GET /v1/nacks`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RevertEvent {
    /// The revision a proxy rejected.
    pub revision: u64,
    /// `reverted`, `not_reverted` or `failed`.
    pub result: &'static str,
    /// The new revision that restores the objects (when reverted).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reverted_by: Option<u64>,
    /// Why not, or what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The proxy whose NACK started it (NAME.NAMESPACE).
    pub proxy: String,
}

/// Every replica's revert decisions as they are made (nobody listening:
/// dropped).
pub fn events() -> &'static broadcast::Sender<RevertEvent> {
    static BUS: OnceLock<broadcast::Sender<RevertEvent>> = OnceLock::new();
    BUS.get_or_init(|| broadcast::channel(64).0)
}

/// Revisions remembered as decided (a NACK per proxy and type comes for
/// each): this many, the oldest forgotten first.
const DECIDED_KEPT: usize = 1024;

/// Watch this replica's NACKs until `stop`; revert what the setting says.
pub async fn run(replica: Arc<Replica>, mut stop: watch::Receiver<bool>) {
    let window = Duration::from_secs(replica.config.revert_on_nack_window_s);
    let mut nacks = replica.sync.subscribe_nacks();
    let mut applied = replica.node.reader().subscribe_applied();
    // When each recent revision was applied here: (first revision of a
    // published state, when), within the window; what was applied before
    // this task started counts as old (None).
    let mut seen: VecDeque<(u64, Option<Instant>)> = VecDeque::from([(applied.borrow_and_update().revision(), None)]);
    let mut decided: BTreeSet<u64> = BTreeSet::new();
    let who = author(&replica);
    tracing::info!(window_s = window.as_secs(), "revert_on_nack: a revision a proxy rejects within the window is rolled back");
    loop {
        let nack = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                note_applied(&mut applied, &mut seen, window);
                continue;
            }
            nack = nacks.recv() => match nack {
                Ok(n) => n,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "revert_on_nack: NACK events missed (too many at once); those revisions are not reverted");
                    continue;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        // A NACK can be picked before the state change that preceded it.
        note_applied(&mut applied, &mut seen, window);
        let Ok(revision) = nack.rejected_version.parse::<u64>() else { continue };
        if !decided.insert(revision) {
            continue;
        }
        if decided.len() > DECIDED_KEPT {
            decided.pop_first();
        }
        // Applied here within the window: the first state at or after it
        // (an earlier revision than every one remembered is older).
        let recent = seen.front().is_some_and(|(first, _)| *first <= revision)
            && seen.iter().find(|(r, _)| *r >= revision).is_some_and(|(_, at)| at.is_some_and(|at| at.elapsed() <= window));
        let event = if recent {
            match revert(&replica, &who, revision, &nack).await {
                Ok(Outcome::Reverted(by)) => done(revision, &nack, "reverted", Some(by), None),
                Ok(Outcome::AlreadyReverted) => {
                    tracing::debug!(revision, "revert_on_nack: already reverted");
                    continue;
                }
                Ok(Outcome::Left(why)) => done(revision, &nack, "not_reverted", None, Some(why)),
                Err(e) => done(revision, &nack, "failed", None, Some(e.message)),
            }
        } else {
            done(revision, &nack, "not_reverted", None, Some(format!("rejected more than {} s after it was written", window.as_secs())))
        };
        let _ = events().send(event);
    }
}

/// Remember when the revision now applied was first seen here, and
/// forget what is older than the window.
/// The newest entry stays (its time says when the revision now applied
/// came), so a NACK long after the last write is not taken for a recent one.
fn note_applied(applied: &mut watch::Receiver<Arc<crate::store::Applied>>, seen: &mut VecDeque<(u64, Option<Instant>)>, window: Duration) {
    let revision = applied.borrow_and_update().revision();
    if seen.back().is_none_or(|(r, _)| *r < revision) {
        seen.push_back((revision, Some(Instant::now())));
    }
    while seen.len() > 1 && seen.front().is_some_and(|(_, at)| at.is_none_or(|at| at.elapsed() > window)) {
        seen.pop_front();
    }
}

/// Log and count a decision; the event for it.
fn done(revision: u64, nack: &NackEvent, result: &'static str, reverted_by: Option<u64>, reason: Option<String>) -> RevertEvent {
    crate::metrics::metrics().nack_reverts.with(&[result]).inc();
    match (&reverted_by, &reason) {
        (Some(by), _) => {
            tracing::warn!(revision, reverted_by = by, proxy = %nack.proxy, r#type = nack.type_short, "revert_on_nack: revision {revision} was rejected; revision {by} restores what it changed")
        }
        (None, reason) => {
            tracing::warn!(revision, result, reason = reason.as_deref().unwrap_or(""), proxy = %nack.proxy, r#type = nack.type_short, "revert_on_nack: revision {revision} was rejected and is NOT reverted")
        }
    }
    RevertEvent { revision, result, reverted_by, reason, proxy: nack.proxy.clone() }
}

enum Outcome {
    Reverted(u64),
    AlreadyReverted,
    Left(String),
}

/// Who the reverts are written as (the author `history` shows:
/// `replica:<id>/revert-on-nack`, a name no caller's credential has).
fn author(replica: &Replica) -> Principal {
    let mut p = Principal::anonymous();
    p.who = Who::Replica { id: replica.node.id, task: "revert-on-nack" };
    p
}

/// Roll back the objects `revision` wrote to their state before it, as
/// one new revision, unless someone changed them since.
async fn revert(replica: &Arc<Replica>, who: &Principal, revision: u64, nack: &NackEvent) -> Result<Outcome> {
    let (applied, events) = history::read(&replica.node).await?;
    let authors = history::authors(&replica.node, &applied).await?;
    if authors.get(&revision).is_some_and(|a| a.name == who.who.audit_name()) {
        return Ok(Outcome::Left("it is a revert itself".into()));
    }
    let wrote: Vec<_> = events.iter().filter(|e| e.revision == revision).collect();
    if wrote.is_empty() {
        return Ok(Outcome::Left(format!("no change at revision {revision} in the history (compacted, or not a store revision)")));
    }
    let before = crate::state::history::History { compacted: applied.compacted, events: &events }.changed_since(&applied.state, revision - 1)?;
    let (mut already, mut resources) = (true, Vec::new());
    for e in &wrote {
        let key = &e.object.key;
        let now = applied.state.get(key);
        let then = before.get(key).cloned().flatten();
        let untouched = match (now, e.kind) {
            (Some(o), EventType::Put) => o.mod_revision == revision,
            (None, EventType::Delete) => true,
            _ => false,
        };
        let as_before = now.map(|o| o.body()) == then.as_ref().map(|o| o.body());
        if !untouched && !as_before {
            return Ok(Outcome::Left(format!("{} {}/{} changed after it", key.kind.name(), key.namespace, key.name)));
        }
        already &= as_before;
        resources.push(Filter { kind: Some(key.kind.name().to_string()), namespace: Some(key.namespace.to_string()), name: Some(key.name.to_string()) });
    }
    if already {
        return Ok(Outcome::AlreadyReverted);
    }
    let (txn, warnings) = history::rollback_txn(&applied, &events, &RollbackRequest { revision: revision - 1, resources })?;
    let message = message(revision, nack);
    let caller =
        Caller { acl: replica.acl.clone(), principal: who.clone(), op: "revert-on-nack".into(), message: None }.with_message(Some(&message), "message")?;
    match super::apply_authorized(&caller, replica, txn, warnings, false, None).await? {
        super::ApplyOutcome::Written(w) => Ok(Outcome::Reverted(w.revision)),
        super::ApplyOutcome::Preview(_) => Err(Error::internal("a revert answered a preview")),
    }
}

/// The change message of a revert: the revision, the proxy, Envoy's error
/// (printable, cut to the longest message).
fn message(revision: u64, nack: &NackEvent) -> String {
    let text = format!("revert of revision {revision}: {} rejected it ({}): {}", nack.proxy, nack.type_short, nack.error);
    let mut out: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut cut = out.len().min(crate::state::txn::MAX_MESSAGE_BYTES);
    while !out.is_char_boundary(cut) {
        cut -= 1;
    }
    out.truncate(cut);
    out
}
