//! One watch of a kind for the whole manager ([`Shared`]): its objects in one cache every
//! controller reads, and each change handed to every controller that subscribed, as kube's
//! `Controller::for_shared_stream` and `watches_shared_stream` take it.
//!
//! kube-runtime's own shared reflector (`reflector::store_shared`) hands out neither a delete
//! (kube-rs/kube#1590) nor an object deleted before its subscriber read it from the cache; a
//! controller mapping a machine to its cluster must see both, so the fan-out is this module's:
//! each object as the watch yielded it, deletes included.

use std::sync::{Arc, Mutex, PoisonError};

use futures::channel::mpsc;
use futures::future::BoxFuture;
use futures::{FutureExt as _, Stream, StreamExt as _};
use kube::Resource;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};

/// What a subscriber is handed of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Changes {
    /// Objects created or changed (what a controller's own kind triggers, as
    /// `Controller::new`'s watch does).
    Applied,
    /// Objects created, changed or deleted (what a related kind triggers, as
    /// `Controller::watches` does).
    Touched,
}

/// A change as handed to subscribers: the object, and whether it was deleted.
type Change<K> = (Arc<K>, bool);

/// One watch of `K` shared by the manager: the cache ([`Shared::store`]) and the subscribers.
pub(crate) struct Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store: Store<K>,
    writer: Mutex<Option<Writer<K>>>,
    subscribers: Arc<Mutex<Vec<mpsc::UnboundedSender<Change<K>>>>>,
}

impl<K> Default for Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn default() -> Self {
        let (store, writer) = reflector::store();
        Self {
            store,
            writer: Mutex::new(Some(writer)),
            subscribers: Arc::default(),
        }
    }
}

impl<K> std::fmt::Debug for Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
{
    /// The cache of every `K` the watch saw; ready once the watch listed them all.
    pub(crate) fn store(&self) -> Store<K> {
        self.store.clone()
    }

    /// The changes from now on, as `Changes` says; what the cache already holds comes first
    /// (as a change), so a subscriber that comes late misses nothing it could act on.
    pub(crate) fn subscribe(&self, changes: Changes) -> impl Stream<Item = Arc<K>> + Send + use<K> {
        let (tx, rx) = mpsc::unbounded();
        let mut subscribers = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for object in self.store.state() {
            let _ = tx.unbounded_send((object, false));
        }
        subscribers.push(tx);
        drop(subscribers);
        rx.filter_map(move |(object, deleted)| {
            let wanted = !deleted || changes == Changes::Touched;
            std::future::ready(wanted.then_some(object))
        })
    }

    /// The watch filling the cache from `events` and handing each change to the subscribers,
    /// for the caller to run as long as the manager does; `None` once it was taken.
    pub(crate) fn watch(
        &self,
        events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    ) -> Option<BoxFuture<'static, ()>> {
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?;
        let (subscribers, store) = (Arc::clone(&self.subscribers), self.store());
        let watch = reflector::reflector(writer, events.default_backoff())
            .for_each(move |event| {
                hand_out(&subscribers, &store, event);
                std::future::ready(())
            })
            .boxed();
        Some(watch)
    }
}

/// Hands the objects of `event` to every subscriber still listening, once the cache has them:
/// each applied object, each deleted one (marked so), and every cached object when a listing
/// is complete (the objects of a listing reach the cache only then).
fn hand_out<K>(
    subscribers: &Mutex<Vec<mpsc::UnboundedSender<Change<K>>>>,
    store: &Store<K>,
    event: Result<watcher::Event<K>, watcher::Error>,
) where
    K: Resource<DynamicType = ()> + Clone,
{
    let changes: Vec<Change<K>> = match event {
        Ok(watcher::Event::Apply(object)) => vec![(Arc::new(object), false)],
        Ok(watcher::Event::Delete(object)) => vec![(Arc::new(object), true)],
        Ok(watcher::Event::InitDone) => store.state().into_iter().map(|o| (o, false)).collect(),
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => return,
        Err(error) => {
            tracing::warn!(%error, kind = %K::kind(&()), "shared watch failed; retrying");
            return;
        }
    };
    let mut subscribers = subscribers.lock().unwrap_or_else(PoisonError::into_inner);
    subscribers.retain(|tx| {
        changes
            .iter()
            .all(|(object, deleted)| tx.unbounded_send((Arc::clone(object), *deleted)).is_ok())
    });
}

/// What `receiver` is sent from now on, as a stream (for a controller's `reconcile_on`): a
/// message dropped because the channel lagged is skipped (its object keeps its own pace), and
/// the stream ends when every sender is gone.
pub fn broadcast_stream<T: Clone + Send + 'static>(
    receiver: tokio::sync::broadcast::Receiver<T>,
) -> impl Stream<Item = T> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move {
        loop {
            match receiver.recv().await {
                Ok(item) => return Some((item, receiver)),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ichor_api::TalosMachine;

    use super::*;

    fn machine(name: &str) -> TalosMachine {
        TalosMachine::test(name).namespace("a").build()
    }

    fn names(objects: &[Arc<TalosMachine>]) -> Vec<String> {
        objects
            .iter()
            .map(|m| m.metadata.name.clone().unwrap_or_default())
            .collect()
    }

    async fn next(
        stream: &mut (impl Stream<Item = Arc<TalosMachine>> + Unpin),
        count: usize,
    ) -> Vec<Arc<TalosMachine>> {
        let mut got = Vec::new();
        while got.len() < count {
            let one = tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .expect("a change in time")
                .expect("the stream goes on");
            got.push(one);
        }
        got
    }

    #[tokio::test]
    async fn every_subscriber_sees_each_change_and_only_the_touched_ones_see_deletes() {
        let shared = Shared::<TalosMachine>::default();
        let mut own = Box::pin(shared.subscribe(Changes::Applied));
        let mut related = Box::pin(shared.subscribe(Changes::Touched));
        let (events, rx) = mpsc::unbounded();
        let watch = shared.watch(rx.map(Ok)).expect("the first watch");
        assert!(
            shared.watch(futures::stream::empty()).is_none(),
            "one watch"
        );
        tokio::spawn(watch);
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(machine("m1")),
            watcher::Event::InitDone,
            watcher::Event::Apply(machine("m2")),
            watcher::Event::Delete(machine("m1")),
            watcher::Event::Apply(machine("m3")),
        ] {
            events.unbounded_send(event).expect("the watch listens");
        }
        assert_eq!(names(&next(&mut own, 3).await), ["m1", "m2", "m3"]);
        assert_eq!(
            names(&next(&mut related, 4).await),
            ["m1", "m2", "m1", "m3"]
        );
        let mut cached = names(&shared.store().state());
        cached.sort();
        assert_eq!(cached, ["m2", "m3"], "the cache has what the watch saw");
        // A subscriber that comes late is handed what the cache holds first.
        let mut late = Box::pin(shared.subscribe(Changes::Touched));
        let mut first = names(&next(&mut late, 2).await);
        first.sort();
        assert_eq!(first, ["m2", "m3"]);
        events
            .unbounded_send(watcher::Event::Apply(machine("m4")))
            .expect("the watch listens");
        assert_eq!(names(&next(&mut late, 1).await), ["m4"]);
    }
}
