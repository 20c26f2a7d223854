//! A node's COSI state for one boot, kept as Talos's in-memory state keeps it (talos-facts
//! §13.2): one collection per (namespace, type), each resource with a version counter that
//! starts at 1 and grows by one on every change of its content, created and updated times, and
//! a history of the last 1024 events (with bookmarks) that watches read from.
//!
//! What the node has is computed from its state and handed to [`Store::sync`], which diffs it
//! against what the store holds, as Talos's controllers only write when a resource changed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::watch;

/// How many past events a collection keeps (`inmem.WithHistoryMaxCapacity(1024)`).
pub(crate) const CAPACITY: i64 = 1024;

/// How far from the oldest kept event a tail or bookmark may start
/// (`inmem.WithHistoryGap(4)`).
const GAP: i64 = 4;

/// A resource as the node has it: everything but the metadata the store keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Res {
    pub(crate) namespace: String,
    pub(crate) type_: &'static str,
    pub(crate) id: String,
    /// The controller that writes it (`meta` for COSI's own, empty for machined's direct
    /// writes).
    pub(crate) owner: &'static str,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) annotations: BTreeMap<String, String>,
    /// The spec as YAML (`yaml_spec`).
    pub(crate) yaml: String,
    /// The spec as protobuf (`proto_spec`).
    pub(crate) proto: Vec<u8>,
}

impl Res {
    /// A resource with no labels or annotations.
    pub(crate) fn new(
        namespace: &str,
        type_: &'static str,
        id: impl Into<String>,
        owner: &'static str,
        yaml: String,
        proto: Vec<u8>,
    ) -> Self {
        Self {
            namespace: namespace.to_owned(),
            type_,
            id: id.into(),
            owner,
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            yaml,
            proto,
        }
    }
}

/// A resource in the store, with its version and times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) res: Res,
    pub(crate) version: u64,
    pub(crate) created: SystemTime,
    pub(crate) updated: SystemTime,
}

/// What happened to a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Created,
    Updated,
    Destroyed,
}

/// One event of a collection's history.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) kind: Kind,
    /// The resource after the event (the last state, for a destroyed one).
    pub(crate) resource: Arc<Stored>,
    /// The resource before an update.
    pub(crate) old: Option<Arc<Stored>>,
    /// Its position in the collection's history.
    pub(crate) pos: i64,
}

#[derive(Debug, Default)]
struct Collection {
    storage: BTreeMap<String, Arc<Stored>>,
    history: VecDeque<Event>,
    write_pos: i64,
}

impl Collection {
    fn publish(&mut self, kind: Kind, resource: Arc<Stored>, old: Option<Arc<Stored>>) {
        self.history.push_back(Event {
            kind,
            resource,
            old,
            pos: self.write_pos,
        });
        if self.history.len() > usize::try_from(CAPACITY).unwrap_or(usize::MAX) {
            self.history.pop_front();
        }
        self.write_pos += 1;
    }
}

/// Why a watch cannot go on from where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Overrun {
    pub(crate) write_pos: i64,
    pub(crate) pos: i64,
}

/// The COSI state of one boot.
#[derive(Debug)]
pub(crate) struct Store {
    collections: Mutex<BTreeMap<(String, &'static str), Collection>>,
    /// Bumped after every change, for watches to wake up.
    changed: watch::Sender<u64>,
    /// The random prefix of this boot's bookmarks (Talos's `bookmarkCookie`).
    cookie: [u8; 8],
    /// The types open watches watch (with how many watches each); while there are any, the
    /// node's state is polled for changes of them.
    watched: Mutex<BTreeMap<&'static str, usize>>,
    /// Whether the poller runs.
    pub(crate) polling: AtomicBool,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            collections: Mutex::default(),
            changed: watch::channel(0).0,
            cookie: rand::random(),
            watched: Mutex::default(),
            polling: AtomicBool::new(false),
        }
    }
}

impl Store {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, &'static str), Collection>> {
        self.collections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Makes the store hold exactly `desired` for every type in `types`: a new resource is
    /// created at version 1, a changed one updated (version + 1), a missing one destroyed.
    pub(crate) fn sync(&self, types: &[&'static str], desired: Vec<Res>) {
        let now = SystemTime::now();
        let mut wanted: BTreeMap<(String, &'static str), BTreeMap<String, Res>> = BTreeMap::new();
        for res in desired {
            wanted
                .entry((res.namespace.clone(), res.type_))
                .or_default()
                .insert(res.id.clone(), res);
        }
        let mut collections = self.lock();
        let mut touched = false;
        for ((_, type_), collection) in collections.iter_mut() {
            if !types.contains(type_) {
                continue;
            }
            let key_matches = |r: &Res| {
                wanted
                    .get(&(r.namespace.clone(), r.type_))
                    .is_some_and(|w| w.contains_key(&r.id))
            };
            let gone: Vec<String> = collection
                .storage
                .values()
                .filter(|s| !key_matches(&s.res))
                .map(|s| s.res.id.clone())
                .collect();
            for id in gone {
                if let Some(last) = collection.storage.remove(&id) {
                    collection.publish(Kind::Destroyed, last, None);
                    touched = true;
                }
            }
        }
        for (key, resources) in wanted {
            if !types.contains(&key.1) {
                continue;
            }
            let collection = collections.entry(key).or_default();
            for (id, res) in resources {
                match collection.storage.get(&id) {
                    Some(current) if current.res == res => {}
                    Some(current) => {
                        let old = Arc::clone(current);
                        let new = Arc::new(Stored {
                            res,
                            version: old.version + 1,
                            created: old.created,
                            updated: now,
                        });
                        collection.storage.insert(id, Arc::clone(&new));
                        collection.publish(Kind::Updated, new, Some(old));
                        touched = true;
                    }
                    None => {
                        let new = Arc::new(Stored {
                            res,
                            version: 1,
                            created: now,
                            updated: now,
                        });
                        collection.storage.insert(id, Arc::clone(&new));
                        collection.publish(Kind::Created, new, None);
                        touched = true;
                    }
                }
            }
        }
        drop(collections);
        if touched {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// One resource.
    pub(crate) fn get(&self, namespace: &str, type_: &str, id: &str) -> Option<Arc<Stored>> {
        self.lock()
            .iter()
            .find(|((ns, t), _)| ns == namespace && *t == type_)
            .and_then(|(_, c)| c.storage.get(id).cloned())
    }

    /// Every resource of a type in a namespace, sorted by id.
    pub(crate) fn list(&self, namespace: &str, type_: &str) -> Vec<Arc<Stored>> {
        self.lock()
            .iter()
            .find(|((ns, t), _)| ns == namespace && *t == type_)
            .map(|(_, c)| c.storage.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The list and the position a watch starting now reads from, taken together.
    pub(crate) fn snapshot(&self, namespace: &str, type_: &str) -> (Vec<Arc<Stored>>, i64) {
        let collections = self.lock();
        collections
            .iter()
            .find(|((ns, t), _)| ns == namespace && *t == type_)
            .map_or((Vec::new(), 0), |(_, c)| {
                (c.storage.values().cloned().collect(), c.write_pos)
            })
    }

    /// The events of a collection from `pos` on, or the overrun when some of them are gone.
    pub(crate) fn since(
        &self,
        namespace: &str,
        type_: &str,
        pos: i64,
    ) -> Result<Vec<Event>, Overrun> {
        let collections = self.lock();
        let Some((_, c)) = collections
            .iter()
            .find(|((ns, t), _)| ns == namespace && *t == type_)
        else {
            return Ok(Vec::new());
        };
        if c.write_pos - pos > CAPACITY {
            return Err(Overrun {
                write_pos: c.write_pos,
                pos,
            });
        }
        Ok(c.history.iter().filter(|e| e.pos >= pos).cloned().collect())
    }

    /// Where a watch of the whole type replaying the last `tail` events starts.
    pub(crate) fn tail_kind(&self, namespace: &str, type_: &str, tail: i64) -> i64 {
        let (_, write_pos) = self.snapshot(namespace, type_);
        (write_pos - tail.min(CAPACITY - GAP)).max(0)
    }

    /// Where a watch of one resource replaying its last `tail` events starts.
    pub(crate) fn tail_id(&self, namespace: &str, type_: &str, id: &str, tail: i64) -> i64 {
        let collections = self.lock();
        let Some((_, c)) = collections
            .iter()
            .find(|((ns, t), _)| ns == namespace && *t == type_)
        else {
            return 0;
        };
        let min = (c.write_pos - CAPACITY + GAP).max(0);
        let mut pos = c.write_pos;
        let mut found = 0;
        for event in c.history.iter().rev() {
            if pos <= min || found >= tail {
                break;
            }
            if event.resource.res.id == id {
                found += 1;
            }
            pos -= 1;
        }
        pos
    }

    /// The position after a bookmark, if the bookmark is one of this boot's and still in the
    /// history (`lowest` is -1 for a watch of the whole type, 0 for one resource).
    pub(crate) fn after_bookmark(
        &self,
        namespace: &str,
        type_: &str,
        bookmark: &[u8],
        lowest: i64,
    ) -> Option<i64> {
        if bookmark.len() != 16 || bookmark[..8] != self.cookie {
            return None;
        }
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bookmark[8..]);
        let pos = i64::from_be_bytes(raw);
        let (_, write_pos) = self.snapshot(namespace, type_);
        (pos >= write_pos - CAPACITY + GAP && pos >= lowest && pos < write_pos).then_some(pos + 1)
    }

    /// The bookmark of a history position.
    pub(crate) fn bookmark(&self, pos: i64) -> Vec<u8> {
        let mut out = self.cookie.to_vec();
        out.extend_from_slice(&pos.to_be_bytes());
        out
    }

    /// A receiver that sees every change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The version of one resource.
    pub(crate) fn version(&self, namespace: &str, type_: &str, id: &str) -> Option<u64> {
        self.get(namespace, type_, id).map(|s| s.version)
    }

    fn watched_lock(&self) -> MutexGuard<'_, BTreeMap<&'static str, usize>> {
        self.watched
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records a watch of `type_` (until [`Store::unwatch`]).
    pub(crate) fn watch(&self, type_: &'static str) {
        *self.watched_lock().entry(type_).or_default() += 1;
    }

    /// Records the end of a watch of `type_`.
    pub(crate) fn unwatch(&self, type_: &'static str) {
        let mut watched = self.watched_lock();
        if let Some(n) = watched.get_mut(type_) {
            *n -= 1;
            if *n == 0 {
                watched.remove(type_);
            }
        }
    }

    /// The types open watches watch.
    pub(crate) fn watched(&self) -> Vec<&'static str> {
        self.watched_lock().keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "Things.test.talos.dev";

    fn res(id: &str, yaml: &str) -> Res {
        Res::new("ns", T, id, "test.Controller", yaml.to_owned(), Vec::new())
    }

    #[test]
    fn versions_count_changes_and_only_changes() {
        let store = Store::default();
        store.sync(&[T], vec![res("a", "x: 1\n")]);
        store.sync(&[T], vec![res("a", "x: 1\n")]);
        assert_eq!(store.version("ns", T, "a"), Some(1));
        store.sync(&[T], vec![res("a", "x: 2\n"), res("b", "y\n")]);
        assert_eq!(store.version("ns", T, "a"), Some(2));
        let a = store.get("ns", T, "a").expect("a");
        assert!(a.updated >= a.created);
        store.sync(&[T], vec![res("b", "y\n")]);
        assert_eq!(store.get("ns", T, "a"), None);
        let kinds: Vec<(Kind, String, i64)> = store
            .since("ns", T, 0)
            .expect("history")
            .into_iter()
            .map(|e| (e.kind, e.resource.res.id.clone(), e.pos))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (Kind::Created, "a".into(), 0),
                (Kind::Updated, "a".into(), 1),
                (Kind::Created, "b".into(), 2),
                (Kind::Destroyed, "a".into(), 3),
            ]
        );
    }

    #[test]
    fn syncs_only_the_types_named() {
        let store = Store::default();
        store.sync(&[T], vec![res("a", "x\n")]);
        store.sync(&["Others.test.talos.dev"], Vec::new());
        assert_eq!(store.list("ns", T).len(), 1);
    }

    #[test]
    fn bookmarks_are_this_stores_and_in_range() {
        let store = Store::default();
        for n in 0..3 {
            store.sync(&[T], vec![res("a", &format!("{n}\n"))]);
        }
        let bookmark = store.bookmark(1);
        assert_eq!(store.after_bookmark("ns", T, &bookmark, 0), Some(2));
        assert_eq!(store.after_bookmark("ns", T, &store.bookmark(3), 0), None);
        assert_eq!(
            Store::default().after_bookmark("ns", T, &bookmark, 0),
            None,
            "another boot's bookmark"
        );
        assert_eq!(store.tail_id("ns", T, "a", 2), 1);
        assert_eq!(store.tail_kind("ns", T, 10), 0);
    }

    #[test]
    fn an_overrun_watch_is_told() {
        let store = Store::default();
        for n in 0..(CAPACITY + 2) {
            store.sync(&[T], vec![res("a", &format!("{n}\n"))]);
        }
        assert!(store.since("ns", T, 0).is_err());
        assert!(store.since("ns", T, 2).is_ok());
    }
}
