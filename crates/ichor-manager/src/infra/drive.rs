//! How each controller runs: [`drive`] runs one until the manager stops, every reconcile under
//! panic containment, with one error policy for all; the manager's stop signal is a
//! `watch::Receiver<bool>` that turns `true` once.

use std::sync::Arc;

use futures::StreamExt as _;
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
/// [`panics::guard`] (named `name`): the one place each controller's reconciles run, so a
/// panic in one never ends a controller.
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
    let run = controller
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(panics::guard(name, reconcile), error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        biased;
        () = run => {}
        () = stopped_unfilled(cache, stop) => {}
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

/// Each controller's limits: at most `settings.concurrency` reconciles at once. Unbounded, a
/// fleet's worth of looks ran together, each holding its Talos connection's buffers and its
/// reconcile's state (`docs/benchmarks/fleet.md`).
pub(crate) fn limits(ctx: &Context) -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency)
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
}
