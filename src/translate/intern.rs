//! Sharing identical translation output across proxies.
//!
//! Proxies with the same inputs (namespace, Sidecar, labels) get byte for
//! byte the same route tables, virtual hosts and resource maps. Translation
//! stays per proxy and pure; what it produced is then looked up here by a
//! content hash, and when an equal value is already alive (held by another
//! proxy's config) that one is kept instead. An idle replica's memory then
//! grows with the distinct configs, not with the proxies holding them.
//!
//! Entries are weak: a value lives as long as some config holds it. Dead
//! entries are swept whenever the table has doubled since the last sweep.

use crate::resources::{ResourceMap, XdsResource};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, OnceLock, Weak};

pub struct Interner<T: ?Sized> {
    table: Mutex<Table<T>>,
}

struct Table<T: ?Sized> {
    buckets: HashMap<u64, Vec<Weak<T>>>,
    entries: usize,
    sweep_at: usize,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner { table: Mutex::new(Table { buckets: HashMap::new(), entries: 0, sweep_at: 1024 }) }
    }
}

impl<T: ?Sized> Interner<T> {
    /// `value`, or an equal value (`same`) already interned under `hash`.
    pub fn intern(&self, hash: u64, value: Arc<T>, same: impl Fn(&T, &T) -> bool) -> Arc<T> {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = t.buckets.entry(hash).or_default();
        for w in bucket.iter() {
            if let Some(existing) = w.upgrade() {
                if Arc::ptr_eq(&existing, &value) || same(&existing, &value) {
                    return existing;
                }
            }
        }
        bucket.retain(|w| w.strong_count() > 0);
        bucket.push(Arc::downgrade(&value));
        t.entries += 1;
        if t.entries >= t.sweep_at {
            t.buckets.retain(|_, b| {
                b.retain(|w| w.strong_count() > 0);
                !b.is_empty()
            });
            t.entries = t.buckets.values().map(Vec::len).sum();
            t.sweep_at = (t.entries * 2).max(1024);
        }
        value
    }

    #[cfg(test)]
    fn live(&self) -> usize {
        let t = self.table.lock().unwrap();
        t.buckets.values().flatten().filter(|w| w.strong_count() > 0).count()
    }
}

fn std_hash(v: &impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

/// Encoded virtual hosts (their content hash is computed anyway).
pub fn bytes(hash: u64, b: Arc<Vec<u8>>) -> Arc<Vec<u8>> {
    static I: OnceLock<Interner<Vec<u8>>> = OnceLock::new();
    I.get_or_init(Default::default).intern(hash, b, |a, b| a == b)
}

/// A virtual host's domains.
pub fn domains(d: Arc<Vec<String>>) -> Arc<Vec<String>> {
    static I: OnceLock<Interner<Vec<String>>> = OnceLock::new();
    I.get_or_init(Default::default).intern(std_hash(&*d), d, |a, b| a == b)
}

/// A resource; its version is a hash of its content.
pub fn resource(r: Arc<XdsResource>) -> Arc<XdsResource> {
    static I: OnceLock<Interner<XdsResource>> = OnceLock::new();
    I.get_or_init(Default::default).intern(std_hash(&(&r.name, &r.version)), r, |a, b| a == b)
}

/// A whole type's resources: proxies that see the same services share the
/// map (its keys included), not just its values.
pub fn map(m: Arc<ResourceMap>) -> Arc<ResourceMap> {
    static I: OnceLock<Interner<ResourceMap>> = OnceLock::new();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (k, v) in m.iter() {
        k.hash(&mut h);
        v.version.hash(&mut h);
    }
    I.get_or_init(Default::default)
        .intern(h.finish(), m, |a, b| a.len() == b.len() && a.iter().zip(b.iter()).all(|((ka, va), (kb, vb))| ka == kb && (Arc::ptr_eq(va, vb) || va == vb)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_values_are_shared_and_dead_ones_forgotten() {
        let i: Interner<Vec<u8>> = Interner::default();
        let a = i.intern(1, Arc::new(vec![1, 2]), |x, y| x == y);
        let b = i.intern(1, Arc::new(vec![1, 2]), |x, y| x == y);
        assert!(Arc::ptr_eq(&a, &b));
        // Same hash, different content: both kept.
        let c = i.intern(1, Arc::new(vec![3]), |x, y| x == y);
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(i.live(), 2);
        drop((a, b));
        assert_eq!(i.live(), 1);
        // A new value after the old one died is stored anew.
        let d = i.intern(1, Arc::new(vec![1, 2]), |x, y| x == y);
        assert_eq!(*d, vec![1, 2]);
        assert_eq!(i.live(), 2);
    }
}
