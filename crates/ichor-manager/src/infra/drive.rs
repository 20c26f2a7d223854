//! How each controller runs: [`drive`] runs one until the manager stops, every reconcile under
//! panic containment, with one error policy for all; the manager's stop signal is a
//! `watch::Receiver<bool>` that turns `true` once.

use std::sync::Arc;

use futures::{FutureExt as _, StreamExt as _};
use kube::Resource;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;

use super::panics;
use crate::{Category, Context, Error, error};

/// What a failed reconcile leads to: an object a person must fix waits for a change (with a
/// Warning Event saying why), a transient fault backs off per object, a bug is logged as an
/// error (and published) and retried slowly, a panic (caught, and already logged) is published
/// and retried after its object's backoff (`panics`).
pub(crate) fn error_policy<K>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    ctx.metrics.error(error.reason());
    let name = object.meta().name.clone().unwrap_or_default();
    let category = error.category();
    let action = match category {
        Category::UserFix => {
            tracing::warn!(%name, %error, "reconcile failed; waiting for a change");
            Action::await_change()
        }
        Category::Transient => {
            let delay = ctx.backoff.next(&error::key(&*object));
            tracing::warn!(%name, %error, ?delay, "reconcile failed; retrying");
            return Action::requeue(delay);
        }
        Category::Bug => {
            tracing::error!(%name, %error, "reconcile failed on a broken invariant");
            Action::requeue(error::BUG_REQUEUE)
        }
        Category::Panicked => Action::requeue(error.retry_after().unwrap_or(error::BUG_REQUEUE)),
    };
    let (reason, note) = (error.reason(), error.to_string());
    tokio::spawn(async move {
        ctx.event(
            &*object,
            EventType::Warning,
            reason,
            ichor_api::names::actions::RECONCILE,
            note,
        )
        .await;
    });
    action
}

/// Resolves once the manager is told to stop.
pub(crate) async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Runs `controller` until the manager stops, every reconcile of it under
/// [`panics::guarded`] (named `name`) and in its turn ([`Turns`]): the one place each
/// controller's reconciles run, so a panic in one never ends a controller.
pub(crate) async fn drive<K, F, Fut>(
    name: &'static str,
    controller: Controller<K>,
    reconcile: F,
    ctx: Arc<Context>,
    stop: tokio::sync::watch::Receiver<bool>,
) where
    K: panics::Reconciled + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let cache = controller.store();
    let turns = Arc::new(Turns::new(
        ctx.settings.concurrency,
        cache.clone(),
        stop.clone(),
        ctx.metrics.waiting(name),
    ));
    let in_turn = move |object: Arc<K>, ctx: Arc<Context>| {
        let turns = Arc::clone(&turns);
        // Only the reference waits: the copy in hand is read again when the turn comes.
        let object = kube::runtime::reflector::ObjectRef::from_obj(&*object);
        async move {
            match turns.wait(&object).await {
                // Boxed only now: the reconcile's own state (the largest part of this future)
                // is allocated when its turn comes, not by every reconcile waiting for one.
                Some((latest, _turn)) => {
                    Box::pin(panics::guarded(name, reconcile, latest, ctx)).await
                }
                // Gone meanwhile, or the manager stops: nothing to look at.
                None => Ok(Action::await_change()),
            }
        }
        .boxed()
    };
    let run = controller
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(in_turn, error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        biased;
        () = run => {}
        () = stopped_unfilled(cache, stop) => {}
    }
}

/// The turns of one controller's reconciles: at most `concurrency` run at once, and the others
/// wait in the order they became due (a FIFO semaphore). kube's own limit holds the waiting
/// objects in a set and starts whichever it finds first, so under a fleet's load one machine
/// waited 40 s while others were looked at again and again (`docs/benchmarks/fleet.md`). A
/// reconcile that waited takes its object from the cache as it is when its turn comes. kube's
/// own limit is left off (its default). Unbounded, a fleet's worth of looks ran together, each
/// holding its Talos connection's buffers and its reconcile's state (ADR 0038); a reconcile
/// waiting for its turn holds neither.
pub(crate) struct Turns<K: kube::Resource + 'static>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    permits: Arc<tokio::sync::Semaphore>,
    cache: kube::runtime::reflector::Store<K>,
    stop: tokio::sync::watch::Receiver<bool>,
    waiting: prometheus_client::metrics::gauge::Gauge,
}

impl<K> Turns<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    /// Turns for `concurrency` reconciles at once (at least one) of objects from `cache`,
    /// given up when `stop` turns true; the reconciles waiting for one are counted in
    /// `waiting`.
    pub(crate) fn new(
        concurrency: u16,
        cache: kube::runtime::reflector::Store<K>,
        stop: tokio::sync::watch::Receiver<bool>,
        waiting: prometheus_client::metrics::gauge::Gauge,
    ) -> Self {
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(usize::from(concurrency.max(1)))),
            cache,
            stop,
            waiting,
        }
    }

    /// Waits for `object`'s turn; returns the object as the cache holds it then, with the turn
    /// (held until dropped). `None` when the object left the cache or the manager stops first.
    pub(crate) async fn wait(
        &self,
        object: &kube::runtime::reflector::ObjectRef<K>,
    ) -> Option<(Arc<K>, tokio::sync::OwnedSemaphorePermit)> {
        let turn = {
            // Counted while it waits, however the wait ends (the future may be dropped).
            let _waiting = Waiting::on(&self.waiting);
            tokio::select! {
                biased;
                () = stopped(self.stop.clone()) => return None,
                permit = Arc::clone(&self.permits).acquire_owned() => permit.ok()?,
            }
        };
        let latest = self.cache.get(object)?;
        Some((latest, turn))
    }
}

/// Resolves once the manager is told to stop while `cache` has not filled yet. kube's graceful
/// shutdown never ends then: its runner starts no reconcile before the cache is filled, and
/// once shutting down it no longer polls the watch that would fill it. Nothing ran, so there
/// is nothing to wait for. A cache that filled leaves the graceful shutdown to end by itself.
async fn stopped_unfilled<K>(
    cache: kube::runtime::reflector::Store<K>,
    stop: tokio::sync::watch::Receiver<bool>,
) where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    stopped(stop).await;
    if futures::FutureExt::now_or_never(cache.wait_until_ready()).is_none() {
        return;
    }
    std::future::pending::<()>().await;
}

/// One reconcile counted in a gauge while it waits for its turn.
struct Waiting<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Waiting<'a> {
    /// Counts one more in `gauge` until dropped.
    fn on(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Runs `work` until it ends or the manager stops.
pub(crate) async fn until_stopped(
    work: impl std::future::Future<Output = ()>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::select! {
        () = work => {}
        () = stopped(stop) => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ichor_api::TalosCluster;
    use ichor_api::names::controllers;
    use kube::runtime::reflector::ObjectRef;

    use super::*;
    use crate::Settings;

    #[tokio::test]
    async fn a_panicked_reconcile_is_retried_after_its_backoff() {
        let ctx = Arc::new(Context::nowhere(Settings::default()));
        let cluster = Arc::new(TalosCluster::test("lab").namespace("a").build());
        let error = Error::Panicked {
            controller: controllers::CLUSTER,
            message: "overflow".into(),
            retry: Duration::from_secs(8),
        };
        assert_eq!(
            error_policy(cluster, &error, Arc::clone(&ctx)),
            Action::requeue(Duration::from_secs(8))
        );
        assert!(
            ctx.metrics
                .render()
                .contains("ichor_reconcile_errors_total{reason=\"ReconcilePanicked\"} 1")
        );
    }

    /// A store holding `objects`, as a watch would fill it.
    fn store_of(objects: &[TalosCluster]) -> kube::runtime::reflector::Store<TalosCluster> {
        let (store, mut writer) = kube::runtime::reflector::store::<TalosCluster>();
        for object in objects {
            writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object.clone()));
        }
        store
    }

    #[tokio::test]
    async fn reconciles_take_their_turns_in_the_order_they_came() {
        let names = ["a", "b", "c", "d"];
        let clusters: Vec<TalosCluster> = names
            .iter()
            .map(|n| TalosCluster::test(n).namespace("ns").build())
            .collect();
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let turns = Arc::new(Turns::new(
            1,
            store_of(&clusters),
            stopped,
            Default::default(),
        ));
        // The first holds the only turn; the others queue behind it in the order they asked.
        let (first, held) = turns
            .wait(&ObjectRef::from_obj(&clusters[0]))
            .await
            .expect("a turn");
        assert_eq!(first.metadata.name.as_deref(), Some("a"));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiting = Vec::new();
        // Asked in reverse name order, so that no other order (by name, by hash) passes.
        for cluster in clusters[1..].iter().rev() {
            let (turns, order, cluster) = (Arc::clone(&turns), Arc::clone(&order), cluster.clone());
            waiting.push(tokio::spawn(async move {
                let wanted = ObjectRef::from_obj(&cluster);
                let (object, _turn) = turns.wait(&wanted).await.expect("a turn");
                order
                    .lock()
                    .expect("order")
                    .push(object.metadata.name.clone());
                tokio::task::yield_now().await;
            }));
            // Each waits in the semaphore's queue before the next asks.
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        assert!(
            order.lock().expect("order").is_empty(),
            "none ran before its turn"
        );
        assert_eq!(turns.waiting.get(), 3, "the waiting are counted");
        drop(held);
        for task in waiting {
            task.await.expect("task");
        }
        let ran: Vec<_> = order
            .lock()
            .expect("order")
            .iter()
            .flatten()
            .cloned()
            .collect();
        assert_eq!(ran, ["d", "c", "b"]);
        assert_eq!(turns.waiting.get(), 0);
    }

    #[tokio::test]
    async fn a_turn_gives_the_cached_object_as_it_is_then_and_nothing_for_one_gone_or_at_stop() {
        let old = TalosCluster::test("a").namespace("ns").build();
        let mut newer = old.clone();
        newer.metadata.resource_version = Some("2".into());
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let turns = Turns::new(
            1,
            store_of(std::slice::from_ref(&newer)),
            stopped,
            Default::default(),
        );
        let old = ObjectRef::from_obj(&old);
        let (latest, turn) = turns.wait(&old).await.expect("a turn");
        assert_eq!(latest.metadata.resource_version.as_deref(), Some("2"));
        drop(turn);
        let gone = TalosCluster::test("gone").namespace("ns").build();
        assert!(turns.wait(&ObjectRef::from_obj(&gone)).await.is_none());
        // Stopping gives up a wait, even one whose turn never came.
        let held = turns.wait(&old).await.expect("a turn");
        stop.send(true).expect("stop");
        assert!(turns.wait(&old).await.is_none());
        drop(held);
    }
}
