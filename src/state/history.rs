//! The mesh at an earlier revision, from the current state and the watch
//! history after it (pure): what `lodestar history`, `diff` and `rollback`
//! read.
//!
//! The history holds every event after the compacted revision, and a
//! delete's event holds the object's last state. So, for an object that
//! changed after revision R, its state at R is: the object a delete after R
//! removed (its last state, written at or before R); absent, if the first
//! change after R created it; else the last version written at or before R
//! (an event in the history, or the history does not reach back to it, and
//! the answer says which revision is the oldest it does reach).

use super::{Event, EventType, State};
use crate::error::{Code, Error};
use crate::model::{ResourceKey, StoredObject};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The retained history: every event after `compacted`, in order.
pub struct History<'a> {
    pub compacted: u64,
    pub events: &'a [Event],
}

/// Objects at a revision: each changed object's state then (`None`: it did
/// not exist); an object missing from the map is as it is now.
pub type AtRevision = BTreeMap<ResourceKey, Option<Arc<StoredObject>>>;

impl History<'_> {
    /// The state at `rev` of every object that changed after it.
    pub fn changed_since(&self, now: &State, rev: u64) -> Result<AtRevision, Error> {
        if rev > now.revision {
            return Err(Error::field("revision", format!("revision {rev} is after the current revision {}", now.revision)));
        }
        if rev < self.compacted {
            return Err(compacted(rev, self.compacted));
        }
        let split = self.events.partition_point(|e| e.revision <= rev);
        let (before, after) = self.events.split_at(split);
        let mut out = AtRevision::new();
        for e in after {
            let key = &e.object.key;
            if out.contains_key(key) {
                continue;
            }
            let then = match e.kind {
                EventType::Delete => Some(e.object.clone()),
                EventType::Put if e.object.create_revision == e.revision => None,
                EventType::Put => match before.iter().rev().find(|b| b.object.key == *key) {
                    Some(b) if b.kind == EventType::Put => Some(b.object.clone()),
                    // Deleted, then created again after `rev`: that Put was
                    // a create, handled above; a delete here means absent.
                    Some(_) => None,
                    None => {
                        return Err(Error::new(
                            Code::Compacted,
                            format!(
                                "{} {}/{} at revision {rev} was written before the oldest revision kept in the history ({}): it cannot be restored",
                                key.kind.name(),
                                key.namespace,
                                key.name,
                                self.compacted + 1
                            ),
                        ))
                    }
                },
            };
            out.insert(key.clone(), then);
        }
        Ok(out)
    }

    /// The revisions after `from` that changed an object `filter` accepts,
    /// newest first, at most `limit`: (revision, its events).
    pub fn revisions(&self, from: u64, filter: impl Fn(&ResourceKey) -> bool, limit: usize) -> Vec<(u64, Vec<&Event>)> {
        let mut out: Vec<(u64, Vec<&Event>)> = Vec::new();
        for e in self.events.iter().rev().filter(|e| e.revision > from && filter(&e.object.key)) {
            if let Some((_, evs)) = out.last_mut().filter(|(r, _)| *r == e.revision) {
                evs.insert(0, e);
            } else if out.len() == limit {
                break;
            } else {
                out.push((e.revision, vec![e]));
            }
        }
        out
    }
}

/// Etcd's ErrCompacted, as watches answer it.
pub fn compacted(rev: u64, oldest: u64) -> Error {
    Error::new(Code::Compacted, format!("revision {rev} has been compacted; the oldest available is {oldest}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;
    use crate::txn::{Op, Txn};

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new(Kind::DestinationRule, "default", name)
    }

    fn put(state: &mut State, events: &mut Vec<Event>, name: &str, tag: &str) {
        let body = format!(
            r#"{{"apiVersion":"networking.istio.io/v1","kind":"DestinationRule","metadata":{{"name":"{name}","namespace":"default","labels":{{"tag":"{tag}"}}}},"spec":{{"host":"{name}"}}}}"#
        );
        let (r, ev) = state.apply_txn(&Txn { ops: vec![Op::Put { key: key(name), body: body.into(), expected_revision: None }] });
        r.unwrap();
        events.extend(ev);
    }

    fn delete(state: &mut State, events: &mut Vec<Event>, name: &str) {
        let (r, ev) = state.apply_txn(&Txn { ops: vec![Op::Delete { key: key(name), expected_revision: None, ignore_missing: false }] });
        r.unwrap();
        events.extend(ev);
    }

    fn tag(o: &Option<Arc<StoredObject>>) -> Option<String> {
        o.as_ref().map(|o| o.body()["metadata"]["labels"]["tag"].as_str().unwrap().to_string())
    }

    #[test]
    fn the_state_at_a_revision_from_the_history() {
        let (mut s, mut ev) = (State::default(), Vec::new());
        put(&mut s, &mut ev, "a", "1"); // 1
        put(&mut s, &mut ev, "b", "1"); // 2
        put(&mut s, &mut ev, "a", "2"); // 3
        delete(&mut s, &mut ev, "b"); // 4
        put(&mut s, &mut ev, "c", "1"); // 5
        put(&mut s, &mut ev, "b", "new"); // 6: created again
        let h = History { compacted: 0, events: &ev };
        let at2 = h.changed_since(&s, 2).unwrap();
        assert_eq!(tag(&at2[&key("a")]), Some("1".into()), "a was at version 1 at revision 2");
        assert_eq!(tag(&at2[&key("b")]), Some("1".into()), "b's delete event holds its state at 2");
        assert_eq!(at2[&key("c")], None, "c did not exist at 2");
        let at4 = h.changed_since(&s, 4).unwrap();
        assert_eq!((at4.get(&key("a")), at4[&key("b")].is_none(), at4[&key("c")].is_none()), (None, true, true), "{at4:?}");
        assert!(h.changed_since(&s, 6).unwrap().is_empty());
        assert!(h.changed_since(&s, 7).is_err());
        // History compacted up to 2: revision 1 is gone; 2 still answers
        // for b (its delete holds it) but not for a (last written at 1).
        let kept: Vec<Event> = ev.iter().filter(|e| e.revision > 2).cloned().collect();
        let h = History { compacted: 2, events: &kept };
        assert_eq!(h.changed_since(&s, 1).unwrap_err().code, Code::Compacted);
        let err = h.changed_since(&s, 2).unwrap_err();
        assert!(err.message.contains("DestinationRule default/a at revision 2 was written before the oldest revision kept"), "{}", err.message);
        assert!(h.changed_since(&s, 3).is_ok());
        // Revisions touching b, newest first.
        let h = History { compacted: 0, events: &ev };
        let revs: Vec<u64> = h.revisions(0, |k| k.name == "b", 10).iter().map(|(r, _)| *r).collect();
        assert_eq!(revs, vec![6, 4, 2]);
        assert_eq!(h.revisions(0, |_| true, 2).len(), 2);
    }
}
