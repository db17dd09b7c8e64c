//! A linearizability checker for one key's history: a register that holds
//! a value and its modRevision (or nothing), written by blind writes,
//! compare-and-set (by revision), deletes, and read.
//!
//! Wing & Gong's search with Lowe's memoization (as in Lowe, "Testing for
//! linearizability", 2017, and porcupine): walk the calls in invocation
//! order, linearize a pending call when the model allows its result, undo
//! when some operation's return is reached before it was linearized, and
//! never revisit a (set of linearized operations, state) pair. An
//! operation whose outcome is unknown (timeout, 5xx) may take effect at
//! any point after its call, or never: its return is at infinity.

use std::collections::HashSet;

/// Values are unique per write (client and sequence number), so a value
/// names the write that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Stored {
    pub value: String,
    /// None after a write whose answer was lost: some revision.
    pub revision: Option<u64>,
}

pub type State = Option<Stored>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<T> {
    Ok(T),
    /// The precondition failed (CAS: 409; delete: 404). Nothing changed.
    Refused,
    /// Timed out or failed in a way that does not say whether it applied.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Read(Option<(String, u64)>),
    /// A blind write; Ok(revision it produced).
    Write(String, Outcome<u64>),
    /// Write if the key's modRevision is `expect` (0: absent).
    Cas {
        expect: u64,
        value: String,
        outcome: Outcome<u64>,
    },
    Delete(Outcome<()>),
}

#[derive(Debug, Clone)]
pub struct Call {
    pub op: Op,
    pub client: usize,
    /// Invocation and completion, in any monotonic unit (µs since start).
    pub start: u64,
    /// None: no answer (indeterminate); the same as `Outcome::Unknown`.
    pub end: Option<u64>,
}

impl Call {
    fn indeterminate(&self) -> bool {
        self.end.is_none() || matches!(&self.op, Op::Write(_, Outcome::Unknown) | Op::Cas { outcome: Outcome::Unknown, .. } | Op::Delete(Outcome::Unknown))
    }
}

/// Whether a CAS expecting `expect` may succeed, and may be refused, in
/// `state`.
fn cas_may(state: &State, expect: u64) -> (bool, bool) {
    match state {
        None => (expect == 0, expect != 0),
        Some(Stored { revision: Some(r), .. }) => (*r == expect, *r != expect),
        // Written by an operation whose answer was lost: some revision.
        Some(Stored { revision: None, .. }) => (expect != 0, true),
    }
}

/// The model: the state after `op` from `state`, if `op`'s result is
/// possible there.
pub fn step(state: &State, op: &Op) -> Option<State> {
    match op {
        Op::Read(None) => state.is_none().then_some(None),
        Op::Read(Some((v, r))) => match state {
            Some(s) if &s.value == v && s.revision.is_none_or(|sr| sr == *r) => Some(Some(Stored { value: v.clone(), revision: Some(*r) })),
            _ => None,
        },
        Op::Write(v, Outcome::Ok(r)) => Some(Some(Stored { value: v.clone(), revision: Some(*r) })),
        Op::Write(v, _) => Some(Some(Stored { value: v.clone(), revision: None })),
        Op::Cas { expect, value, outcome } => {
            let (may_hold, may_fail) = cas_may(state, *expect);
            match outcome {
                Outcome::Ok(r) => may_hold.then(|| Some(Stored { value: value.clone(), revision: Some(*r) })),
                Outcome::Unknown => may_hold.then(|| Some(Stored { value: value.clone(), revision: None })),
                Outcome::Refused => may_fail.then(|| state.clone()),
            }
        }
        Op::Delete(Outcome::Refused) => state.is_none().then_some(None),
        Op::Delete(_) => state.is_some().then_some(None),
    }
}

/// Linearizable from `init`? Err: an explanation: the call that no order
/// could place where the search got furthest, the register's state there,
/// and the calls overlapping it.
pub fn check(init: State, calls: &[Call]) -> Result<(), String> {
    // Events: (time, is_return, call index); calls before returns at the
    // same instant (the more permissive order). Unknown outcomes return at
    // infinity.
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(calls.len() * 2);
    for (i, c) in calls.iter().enumerate() {
        events.push((c.start, false, i));
        let end = if c.indeterminate() { u64::MAX } else { c.end.expect("determinate") };
        events.push((end, true, i));
    }
    events.sort();
    // A doubly linked list over the events, so that linearizing a call
    // lifts its call and return out, and undoing puts them back.
    let n = events.len();
    let mut next: Vec<usize> = (1..=n).collect(); // n = end
    let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { usize::MAX } else { i - 1 }).collect();
    let mut head = 0usize; // n when empty
    let mut ret_of = vec![0usize; calls.len()];
    for (pos, e) in events.iter().enumerate() {
        if e.1 {
            ret_of[e.2] = pos;
        }
    }
    let unlink = |pos: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>, head: &mut usize| {
        let (p, nx) = (prev[pos], next[pos]);
        if p == usize::MAX {
            *head = nx;
        } else {
            next[p] = nx;
        }
        if nx != n {
            prev[nx] = p;
        }
    };
    let relink = |pos: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>, head: &mut usize| {
        let (p, nx) = (prev[pos], next[pos]);
        if p == usize::MAX {
            *head = pos;
        } else {
            next[p] = pos;
        }
        if nx != n {
            prev[nx] = pos;
        }
    };
    let mut linearized = vec![false; calls.len()];
    let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
    let key = |lin: &[bool]| -> Vec<u64> {
        let mut bits = vec![0u64; lin.len().div_ceil(64)];
        for (i, &b) in lin.iter().enumerate() {
            if b {
                bits[i / 64] |= 1 << (i % 64);
            }
        }
        bits
    };
    // (call position, state before it)
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state = init;
    let mut entry = head;
    // The deepest point the search reached: how many calls were ordered,
    // the state then, and the call whose answer could not be explained.
    let mut deepest: Option<(usize, State, usize)> = None;
    loop {
        if head == n {
            return Ok(());
        }
        if entry == n {
            // Only possible past every return: cannot happen (returns end the list).
            unreachable!("walked past the last return");
        }
        let (_, is_return, i) = events[entry];
        if !is_return {
            let attempt = step(&state, &calls[i].op);
            let mut advanced = false;
            if let Some(new_state) = attempt {
                linearized[i] = true;
                if seen.insert((key(&linearized), new_state.clone())) {
                    stack.push((entry, std::mem::replace(&mut state, new_state)));
                    unlink(entry, &mut next, &mut prev, &mut head);
                    unlink(ret_of[i], &mut next, &mut prev, &mut head);
                    entry = head;
                    advanced = true;
                } else {
                    linearized[i] = false;
                }
            }
            if !advanced {
                entry = next[entry];
            }
        } else if calls[i].indeterminate() {
            // Every determinate call is linearized (their returns all come
            // earlier); the rest may never have happened.
            return Ok(());
        } else {
            if deepest.as_ref().is_none_or(|d| stack.len() > d.0) {
                deepest = Some((stack.len(), state.clone(), i));
            }
            let Some((call_pos, old)) = stack.pop() else {
                let (ordered, state, i) = deepest.expect("set above");
                return Err(explain(calls, ordered, &state, i));
            };
            let j = events[call_pos].2;
            linearized[j] = false;
            state = old;
            relink(ret_of[j], &mut next, &mut prev, &mut head);
            relink(call_pos, &mut next, &mut prev, &mut head);
            entry = next[call_pos];
        }
    }
}

/// The anomaly: the call that no order could place once the search had
/// ordered the most calls, the state then, and the calls that overlap it.
fn explain(calls: &[Call], ordered: usize, state: &State, i: usize) -> String {
    let c = &calls[i];
    let end = c.end.unwrap_or(u64::MAX);
    let mut text = format!(
        "not linearizable: after ordering {ordered} of {} calls (the register then: {state:?}), no order explains client {}'s {:?} (called at {} us, answered at {} us). The calls overlapping it:",
        calls.len(),
        c.client,
        c.op,
        c.start,
        end
    );
    for (j, o) in calls.iter().enumerate().filter(|(_, o)| o.start <= end && o.end.unwrap_or(u64::MAX) >= c.start).take(12) {
        let mark = if j == i { " <-" } else { "" };
        text.push_str(&format!("\n    client {} {:?} [{} us .. {:?}]{mark}", o.client, o.op, o.start, o.end));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(client: usize, start: u64, end: u64, op: Op) -> Call {
        Call { op, client, start, end: Some(end) }
    }
    fn w(v: &str, r: u64) -> Op {
        Op::Write(v.into(), Outcome::Ok(r))
    }
    fn r(v: &str, rev: u64) -> Op {
        Op::Read(Some((v.into(), rev)))
    }

    #[test]
    fn sequential_and_concurrent_histories_that_are_linearizable() {
        // Sequential.
        let h = vec![call(0, 0, 1, w("a", 1)), call(1, 2, 3, r("a", 1)), call(0, 4, 5, Op::Delete(Outcome::Ok(()))), call(1, 6, 7, Op::Read(None))];
        check(None, &h).unwrap();
        // A read overlapping a write may see either value.
        let h = vec![call(0, 0, 1, w("a", 1)), call(0, 2, 10, w("b", 2)), call(1, 3, 4, r("a", 1)), call(1, 5, 6, r("b", 2))];
        check(None, &h).unwrap();
        // CAS on the revision read; a refused CAS with a stale revision.
        let h = vec![
            call(0, 0, 1, w("a", 1)),
            call(1, 2, 3, r("a", 1)),
            call(1, 4, 5, Op::Cas { expect: 1, value: "b".into(), outcome: Outcome::Ok(2) }),
            call(0, 6, 7, Op::Cas { expect: 1, value: "c".into(), outcome: Outcome::Refused }),
            call(0, 8, 9, r("b", 2)),
        ];
        check(None, &h).unwrap();
        // A lost answer: the write may have happened (seen later) ...
        let h = vec![Call { op: Op::Write("a".into(), Outcome::Unknown), client: 0, start: 0, end: None }, call(1, 5, 6, r("a", 3))];
        check(None, &h).unwrap();
        // ... or not.
        let h = vec![Call { op: Op::Write("a".into(), Outcome::Unknown), client: 0, start: 0, end: None }, call(1, 5, 6, Op::Read(None))];
        check(None, &h).unwrap();
    }

    #[test]
    fn catches_histories_that_are_not_linearizable() {
        // A stale read: the write finished before the read began.
        let h = vec![call(0, 0, 1, w("a", 1)), call(0, 2, 3, w("b", 2)), call(1, 4, 5, r("a", 1))];
        let e = check(None, &h).unwrap_err();
        assert!(e.contains(r#"no order explains client 1's Read(Some(("a", 1)))"#) && e.contains("after ordering 2 of 3"), "{e}");
        // A lost acknowledged write: read as absent after it was acknowledged.
        let h = vec![call(0, 0, 1, w("a", 1)), call(1, 2, 3, Op::Read(None))];
        assert!(check(None, &h).is_err());
        // Two CAS succeed on the same revision (a write applied on top of
        // a state it did not see).
        let h = vec![
            call(0, 0, 1, w("a", 1)),
            call(1, 2, 5, Op::Cas { expect: 1, value: "b".into(), outcome: Outcome::Ok(2) }),
            call(2, 2, 5, Op::Cas { expect: 1, value: "c".into(), outcome: Outcome::Ok(3) }),
        ];
        assert!(check(None, &h).is_err());
        // Reads that go back in time: b then a, sequentially, after both writes.
        let h = vec![call(0, 0, 10, w("a", 1)), call(1, 0, 10, w("b", 2)), call(2, 11, 12, r("b", 2)), call(2, 13, 14, r("a", 1))];
        assert!(check(None, &h).is_err());
        // A write applied twice: seen, overwritten, then seen again.
        let h = vec![call(0, 0, 1, w("a", 1)), call(0, 2, 3, w("b", 2)), call(1, 4, 5, r("b", 2)), call(1, 6, 7, r("a", 3))];
        assert!(check(None, &h).is_err());
        // A refused CAS whose revision did match.
        let h = vec![call(0, 0, 1, w("a", 1)), call(1, 2, 3, Op::Cas { expect: 1, value: "b".into(), outcome: Outcome::Refused })];
        assert!(check(None, &h).is_err());
        // A delete of something that is there, refused as missing.
        let h = vec![call(0, 0, 1, w("a", 1)), call(1, 2, 3, Op::Delete(Outcome::Refused))];
        assert!(check(None, &h).is_err());
    }

    /// Many concurrent operations (the memoization keeps this tractable).
    #[test]
    fn a_long_concurrent_history_checks_quickly() {
        let mut h = Vec::new();
        let mut rev = 0;
        for round in 0..200u64 {
            let t = round * 10;
            rev += 1;
            h.push(call(0, t, t + 8, w(&format!("v{round}"), rev)));
            for c in 1..5 {
                // Reads overlapping the write see the old or the new value.
                let (v, rv) = if c % 2 == 0 && round > 0 { (format!("v{}", round - 1), rev - 1) } else { (format!("v{round}"), rev) };
                h.push(call(c, t + 1, t + 9, r(&v, rv)));
            }
        }
        check(None, &h).unwrap();
    }
}
