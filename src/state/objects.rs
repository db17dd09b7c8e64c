//! Every stored object by key, as a persistent (copy-on-write) ordered set.
//!
//! A clone is O(1) and shares structure, so each applied revision is its own
//! snapshot, and two revisions diff in time proportional to what changed.
//!
//! The set holds `Arc<StoredObject>` ordered by the object's own key, not a
//! map from a copied key to the object: a write copies the B-tree nodes on
//! its path, and a node's entry is then one pointer (one reference count to
//! bump when copied, one to drop when the old revision goes) instead of a
//! key with two shared names plus the pointer (48 bytes, three counts).
//! `cargo bench --bench apply` (`apply_publish`) measures it.

use crate::model::{ResourceKey, StoredObject};
use imbl::OrdSet;
use std::borrow::Borrow;
use std::cmp::Ordering;
use std::ops::RangeBounds;
use std::sync::Arc;

/// Equal when they hold equal objects under the same keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Objects(OrdSet<Entry>);

/// An object in the set. Ordered (and looked up) by its key alone, since
/// keys are unique in the set; equal only when it holds the same or an
/// equal object, which is what `diff` needs to report a changed object
/// under an unchanged key.
#[derive(Clone)]
struct Entry(Arc<StoredObject>);

impl Borrow<ResourceKey> for Entry {
    fn borrow(&self) -> &ResourceKey {
        &self.0.key
    }
}

impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.key.cmp(&other.0.key)
    }
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl Eq for Entry {}

/// How one key differs between two revisions ([`Objects::diff`]).
pub enum Change<'a> {
    Added(&'a Arc<StoredObject>),
    Updated { old: &'a Arc<StoredObject>, new: &'a Arc<StoredObject> },
    Removed(&'a Arc<StoredObject>),
}

impl<'a> Change<'a> {
    pub fn key(&self) -> &'a ResourceKey {
        match self {
            Change::Added(o) | Change::Updated { new: o, .. } | Change::Removed(o) => &o.key,
        }
    }

    /// The object before the change, if there was one.
    pub fn before(&self) -> Option<&'a Arc<StoredObject>> {
        match self {
            Change::Updated { old: o, .. } | Change::Removed(o) => Some(o),
            Change::Added(_) => None,
        }
    }

    /// The object after the change, if it still exists.
    pub fn after(&self) -> Option<&'a Arc<StoredObject>> {
        match self {
            Change::Added(o) | Change::Updated { new: o, .. } => Some(o),
            Change::Removed(_) => None,
        }
    }
}

impl Objects {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, key: &ResourceKey) -> Option<&Arc<StoredObject>> {
        self.0.get(key).map(|e| &e.0)
    }

    pub fn contains_key(&self, key: &ResourceKey) -> bool {
        self.0.contains(key)
    }

    /// Insert under the object's own key; returns the object it replaced.
    pub fn insert(&mut self, object: Arc<StoredObject>) -> Option<Arc<StoredObject>> {
        self.0.insert(Entry(object)).map(|e| e.0)
    }

    pub fn remove(&mut self, key: &ResourceKey) -> Option<Arc<StoredObject>> {
        self.0.remove(key).map(|e| e.0)
    }

    /// In key order (kind, namespace, name).
    pub fn iter(&self) -> impl Iterator<Item = (&ResourceKey, &Arc<StoredObject>)> + '_ {
        self.0.iter().map(|e| (&e.0.key, &e.0))
    }

    pub fn keys(&self) -> impl Iterator<Item = &ResourceKey> + '_ {
        self.0.iter().map(|e| &e.0.key)
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<StoredObject>> + '_ {
        self.0.iter().map(|e| &e.0)
    }

    pub fn range<R: RangeBounds<ResourceKey>>(&self, range: R) -> impl Iterator<Item = (&ResourceKey, &Arc<StoredObject>)> + '_ {
        self.0.range(range).map(|e| (&e.0.key, &e.0))
    }

    /// What changed from `self` to `new`, in key order. Subtrees the two
    /// share are skipped without being visited.
    pub fn diff<'a>(&'a self, new: &'a Objects) -> impl Iterator<Item = Change<'a>> + 'a {
        use imbl::ordset::DiffItem;
        self.0.diff(&new.0).map(|d| match d {
            DiffItem::Add(n) => Change::Added(&n.0),
            DiffItem::Update { old, new } => Change::Updated { old: &old.0, new: &new.0 },
            DiffItem::Remove(o) => Change::Removed(&o.0),
        })
    }
}

impl Objects {
    /// As [`Objects::diff`], without the changes that wrote only a status
    /// that keeps the generation (`Op::Status`,
    /// `StoredObject::status_only_change`): what translation reads.
    pub fn spec_diff<'a>(&'a self, new: &'a Objects) -> impl Iterator<Item = Change<'a>> + 'a {
        self.diff(new).filter(|c| !matches!(c, Change::Updated { old, new } if StoredObject::status_only_change(old, new)))
    }
}

impl FromIterator<Arc<StoredObject>> for Objects {
    fn from_iter<I: IntoIterator<Item = Arc<StoredObject>>>(iter: I) -> Self {
        Objects(iter.into_iter().map(Entry).collect())
    }
}

impl std::fmt::Debug for Objects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Kind;
    use serde_json::json;

    fn object(name: &str, rev: u64) -> Arc<StoredObject> {
        let key = ResourceKey::new(Kind::VirtualService, "default", name);
        Arc::new(StoredObject::new(key, rev, rev, 1, json!({"spec": {"rev": rev}})))
    }

    #[test]
    fn lookups_and_order_follow_the_objects_keys() {
        let mut objects = Objects::default();
        assert!(objects.insert(object("b", 1)).is_none());
        assert!(objects.insert(object("a", 2)).is_none());
        let replaced = objects.insert(object("b", 3)).expect("b was there");
        assert_eq!(replaced.mod_revision, 1);
        assert_eq!(objects.len(), 2);
        let names: Vec<_> = objects.iter().map(|(k, o)| (k.name.to_string(), o.mod_revision)).collect();
        assert_eq!(names, [("a".to_string(), 2), ("b".to_string(), 3)]);
        let b = ResourceKey::new(Kind::VirtualService, "default", "b");
        assert_eq!(objects.get(&b).map(|o| o.mod_revision), Some(3));
        assert_eq!(objects.range(b.clone()..).count(), 1);
        assert_eq!(objects.remove(&b).map(|o| o.mod_revision), Some(3));
        assert!(!objects.contains_key(&b));
    }

    #[test]
    fn diff_reports_objects_changed_under_the_same_key() {
        let old: Objects = (0..200).map(|i| object(&format!("vs-{i:03}"), 1)).collect();
        let mut new = old.clone();
        new.insert(object("vs-007", 2));
        new.remove(&ResourceKey::new(Kind::VirtualService, "default", "vs-100"));
        new.insert(object("vs-999", 3));
        // Equal content under the same key is no change, as with a map.
        new.insert(object("vs-150", 1));
        let changes: Vec<_> = old
            .diff(&new)
            .map(|c| match c {
                Change::Added(o) => format!("+{}", o.key.name),
                Change::Updated { old, new } => format!("~{} {}->{}", new.key.name, old.mod_revision, new.mod_revision),
                Change::Removed(o) => format!("-{}", o.key.name),
            })
            .collect();
        assert_eq!(changes, ["~vs-007 1->2", "-vs-100", "+vs-999"]);
    }
}
