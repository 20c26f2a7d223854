//! A panic in a reconcile, contained (ADR 0049): every controller runs its reconciles through
//! [`guarded`] (from `infra::drive`), which catches a panic and turns it into [`Error::Panicked`]. The panic is counted
//! (`ichor_reconcile_panics_total{controller}`), shown on the object (the `ReconcilePanicked`
//! condition here, a Warning Event from the error policy) and retried after a backoff per
//! object that doubles from [`FIRST_RETRY`] to [`RETRY_CAP`]; no other trigger runs it sooner.
//! The process, the controller and every other object go on. The condition is removed once the
//! controller reconciles the object again.
//!
//! Not here: a controller or task that stops altogether (`crate::infra::tasks`).

use std::any::Any;
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use ichor_api::common::Condition;
use ichor_api::names::{conditions, reasons};
use ichor_api::status::Panicked;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt as _};
use tokio::time::Instant;

use crate::infra::status::{self, Grouped, Guard};
use crate::{Context, Error};

/// How long an object waits after its first panic.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest an object waits between two panicking reconciles.
pub const RETRY_CAP: Duration = Duration::from_secs(300);
/// The most characters of a panic's message shown on an object.
pub const MESSAGE_LIMIT: usize = 160;

/// The wait after `count` panics in a row: [`FIRST_RETRY`] doubled each time, at most
/// [`RETRY_CAP`]. Without jitter: a panic is one object's bug, not a fleet's stampede.
pub fn retry_after(count: u32) -> Duration {
    let doublings = count.saturating_sub(1).min(31);
    FIRST_RETRY.saturating_mul(1u32 << doublings).min(RETRY_CAP)
}

/// A panic's message as an object may show it: the first line of a text payload, printable
/// ASCII only (anything else is `?`), at most [`MESSAGE_LIMIT`] characters. A payload can
/// carry input from anywhere (a node's disk model, a Lease's time): it never reaches a status
/// or an Event whole.
pub fn summary(payload: &(dyn Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    let line = text.lines().next().unwrap_or_default();
    let mut short: String = line
        .chars()
        .take(MESSAGE_LIMIT)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect();
    if line.chars().nth(MESSAGE_LIMIT).is_some() {
        short.push_str("...");
    }
    short
}

/// One object's panics in a row under one controller.
#[derive(Debug, Clone, Copy)]
struct Streak {
    count: u32,
    until: Instant,
}

/// The objects whose reconciles panicked, by controller, kind, namespace and name: how many
/// times in a row, and until when they wait.
#[derive(Debug, Default)]
pub struct Panics {
    objects: Mutex<HashMap<String, Streak>>,
}

impl Panics {
    fn objects(&self) -> std::sync::MutexGuard<'_, HashMap<String, Streak>> {
        self.objects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records another panic of `key` at `now`: how many in a row, and the wait before the
    /// next reconcile.
    pub fn record(&self, key: &str, now: Instant) -> (u32, Duration) {
        let mut objects = self.objects();
        let count = objects.get(key).map_or(0, |s| s.count).saturating_add(1);
        let wait = retry_after(count);
        objects.insert(
            key.to_owned(),
            Streak {
                count,
                until: now + wait,
            },
        );
        (count, wait)
    }

    /// How long `key` still waits at `now` after its last panic; none once it may run.
    pub fn waiting(&self, key: &str, now: Instant) -> Option<Duration> {
        self.objects()
            .get(key)
            .map(|s| s.until.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }

    /// Forgets `key`'s panics (it reconciled); whether it had any.
    pub fn forget(&self, key: &str) -> bool {
        self.objects().remove(key).is_some()
    }
}

/// What a controller reconciles: an object of a namespaced kind whose status is written in
/// groups.
pub trait Reconciled:
    Grouped<Status: Send + Sync>
    + Resource<Scope = k8s_openapi::NamespaceResourceScope>
    + Send
    + Sync
    + 'static
{
}

impl<K> Reconciled for K where
    K: Grouped<Status: Send + Sync>
        + Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Send
        + Sync
        + 'static
{
}

/// Runs `reconcile` of `object` unless a panic of it still waits; catches a panic, counts it,
/// shows it on the object and returns it as [`Error::Panicked`]; removes the condition once the
/// reconcile succeeds again.
pub async fn guarded<K, F, Fut>(
    controller: &'static str,
    reconcile: F,
    object: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error>
where
    K: Reconciled,
    F: Fn(Arc<K>, Arc<Context>) -> Fut,
    Fut: Future<Output = Result<Action, Error>>,
{
    let key = format!("{controller}/{}", crate::error::key(&*object));
    // Another trigger (a watch event, its own condition written) does not cut the wait short.
    if let Some(left) = ctx.panics.waiting(&key, Instant::now()) {
        return Ok(Action::requeue(left));
    }
    let run = AssertUnwindSafe(async {
        #[cfg(feature = "testing")]
        panic_if_marked(controller, &*object);
        reconcile(Arc::clone(&object), Arc::clone(&ctx)).await
    });
    match run.catch_unwind().await {
        Ok(Ok(action)) => {
            let had = ctx.panics.forget(&key);
            if had || shown(&*object, controller).is_some() {
                show(&ctx, &*object, None).await;
            }
            Ok(action)
        }
        Ok(Err(error)) => Err(error),
        Err(payload) => {
            let message = summary(&*payload);
            let (count, retry) = ctx.panics.record(&key, Instant::now());
            ctx.metrics.reconcile_panicked(controller);
            tracing::error!(
                controller,
                object = %key,
                %message,
                count,
                ?retry,
                "a reconcile panicked; caught, retried after its backoff"
            );
            let note = format!(
                "{} reconcile of this object panicked ({count} in a row): {message}. Retried in \
                 {retry:?}. This is a bug in Ichor: report it with the manager's log.",
                prefix(controller)
            );
            show(&ctx, &*object, Some(note)).await;
            Err(Error::Panicked {
                controller,
                message,
                retry,
            })
        }
    }
}

/// How the condition's message starts for `controller`: what tells whose panic it shows.
fn prefix(controller: &str) -> String {
    format!("The {controller} controller's")
}

/// The `ReconcilePanicked` condition `object` carries for `controller`, if any.
fn shown<'k, K: Grouped>(object: &'k K, controller: &str) -> Option<&'k Condition> {
    object.conditions_of().iter().find(|c| {
        c.type_ == conditions::RECONCILE_PANICKED && c.message.starts_with(&prefix(controller))
    })
}

/// `object`'s status with `ReconcilePanicked` set to `note` (true), or removed when none.
fn with_condition<K: Grouped>(
    object: &K,
    note: Option<String>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Result<K::Status, serde_json::Error> {
    let mut status = serde_json::to_value(object.status_of())?;
    if !status.is_object() {
        status = serde_json::json!({});
    }
    let mut list: Vec<Condition> = match status.get("conditions") {
        Some(value) => serde_json::from_value(value.clone())?,
        None => Vec::new(),
    };
    match note {
        Some(note) => crate::infra::conditions::set(
            &mut list,
            conditions::RECONCILE_PANICKED,
            true,
            reasons::RECONCILE_PANICKED,
            note,
            object.meta().generation,
            now,
        ),
        None => list.retain(|c| c.type_ != conditions::RECONCILE_PANICKED),
    }
    status["conditions"] = serde_json::to_value(list)?;
    serde_json::from_value(status)
}

/// Writes `ReconcilePanicked` on `object` (`note`), or removes it (none), with its own field
/// manager; a failure is logged: the retry comes either way.
async fn show<K: Reconciled>(ctx: &Context, object: &K, note: Option<String>) {
    let new = match with_condition(object, note, &ctx.now()) {
        Ok(new) => new,
        Err(error) => {
            tracing::warn!(%error, "cannot build the ReconcilePanicked condition");
            return;
        }
    };
    let api = Api::<K>::namespaced(ctx.client.clone(), &object.namespace().unwrap_or_default());
    if let Err(error) = status::apply::<Panicked, _>(&api, object, &new, Guard::None).await {
        tracing::warn!(%error, name = %object.name_any(), "cannot write the ReconcilePanicked condition");
    }
}

/// Test-only (the `testing` feature): panics in `controller`'s reconcile of an object carrying
/// `ichor.maesh.dev/test-panic-in: <controller>`.
#[cfg(feature = "testing")]
fn panic_if_marked<K: Resource>(controller: &str, object: &K) {
    let marked = object
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ichor_api::names::annotations::TEST_PANIC_IN))
        .is_some_and(|value| value == controller);
    assert!(
        !marked,
        "test panic in the {controller} controller (annotation {})",
        ichor_api::names::annotations::TEST_PANIC_IN
    );
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use ichor_api::TalosCluster;
    use ichor_api::common::ConditionStatus;

    use super::*;

    #[test]
    fn the_wait_doubles_from_a_second_to_five_minutes() {
        let waits: Vec<u64> = (1..=11).map(|n| retry_after(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(retry_after(u32::MAX), RETRY_CAP);
        assert_eq!(retry_after(0), FIRST_RETRY);
    }

    #[test]
    fn a_message_is_one_short_printable_line() {
        let payload: Box<dyn Any + Send> =
            Box::new("byte index 3 is not a char boundary of `é\u{202e}x`\nsecond line".to_owned());
        assert_eq!(
            summary(&*payload),
            "byte index 3 is not a char boundary of `??x`"
        );
        let long: Box<dyn Any + Send> = Box::new("x".repeat(1000));
        let short = summary(&*long);
        assert_eq!(short.len(), MESSAGE_LIMIT + 3, "{short}");
        let static_str: Box<dyn Any + Send> = Box::new("overflow");
        assert_eq!(summary(&*static_str), "overflow");
        let other: Box<dyn Any + Send> = Box::new(42_u8);
        assert_eq!(summary(&*other), "a panic without a message");
    }

    #[test]
    fn each_object_waits_its_own_backoff_and_forgets_it_once_reconciled() {
        let panics = Panics::default();
        let start = Instant::now();
        assert_eq!(panics.record("cluster/a", start), (1, FIRST_RETRY));
        assert_eq!(panics.waiting("cluster/a", start), Some(FIRST_RETRY));
        assert_eq!(
            panics.waiting("cluster/b", start),
            None,
            "another object runs"
        );
        let later = start + FIRST_RETRY;
        assert_eq!(panics.waiting("cluster/a", later), None, "its wait is over");
        assert_eq!(panics.record("cluster/a", later).1, 2 * FIRST_RETRY);
        assert!(panics.forget("cluster/a"));
        assert!(!panics.forget("cluster/a"));
        assert_eq!(panics.record("cluster/a", later), (1, FIRST_RETRY));
    }

    #[test]
    fn the_condition_is_set_and_removed_without_touching_the_others() {
        let mut cluster = TalosCluster::test("lab").build();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let note = format!("{} reconcile of this object panicked", prefix("cluster"));
        let mut status = with_condition(&cluster, Some(note), &now).expect("status");
        crate::infra::conditions::set(
            &mut status.conditions,
            conditions::READY,
            true,
            reasons::RECONCILED,
            "",
            None,
            &now,
        );
        cluster.status = Some(status);
        assert!(shown(&cluster, "cluster").is_some_and(|c| c.status == ConditionStatus::True));
        assert!(shown(&cluster, "backup").is_none(), "another controller's");
        let cleared = with_condition(&cluster, None, &now).expect("status");
        let types: Vec<&str> = cleared
            .conditions
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(types, [conditions::READY]);
        // Every kind's status reads back from the conditions alone.
        for kind in [
            serde_json::to_value(
                with_condition(
                    &ichor_api::TalosMachine::test("m").build(),
                    Some("x".into()),
                    &now,
                )
                .expect("machine"),
            ),
            serde_json::to_value(
                with_condition(
                    &ichor_api::TalosOperation::test(
                        "o",
                        ichor_api::operation::OperationAction::Reboot,
                    )
                    .build(),
                    Some("x".into()),
                    &now,
                )
                .expect("operation"),
            ),
        ] {
            assert!(kind.expect("json")["conditions"][0]["type"] == "ReconcilePanicked");
        }
    }

    static RUNS: AtomicUsize = AtomicUsize::new(0);

    async fn panicking(cluster: Arc<TalosCluster>, _ctx: Arc<Context>) -> Result<Action, Error> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        if cluster.name_any() == "bad" {
            panic!("overflow adding a duration to a time");
        }
        Ok(Action::await_change())
    }

    fn ctx() -> Arc<Context> {
        // A client to an address nothing listens on: the condition write fails, and is logged.
        Arc::new(Context::nowhere(crate::Settings::default()))
    }

    #[tokio::test]
    async fn a_panic_is_caught_counted_and_held_back_while_other_objects_reconcile() {
        let ctx = ctx();
        let reconcile = |object, ctx| guarded("cluster", panicking, object, ctx);
        let bad = Arc::new(TalosCluster::test("bad").namespace("a").build());
        let good = Arc::new(TalosCluster::test("good").namespace("b").build());
        let error = reconcile(Arc::clone(&bad), Arc::clone(&ctx))
            .await
            .expect_err("the panic is an error");
        assert!(
            matches!(&error, Error::Panicked { controller: "cluster", message, retry }
                if message == "overflow adding a duration to a time" && *retry == FIRST_RETRY),
            "{error:?}"
        );
        assert_eq!(error.category(), crate::Category::Panicked);
        assert_eq!(error.reason(), reasons::RECONCILE_PANICKED);
        assert!(
            ctx.metrics
                .render()
                .contains("ichor_reconcile_panics_total{controller=\"cluster\"} 1")
        );
        let runs = RUNS.load(Ordering::SeqCst);
        // Triggered again at once (its condition written, a watch event): it waits.
        let held = reconcile(Arc::clone(&bad), Arc::clone(&ctx))
            .await
            .expect("held back");
        assert_ne!(held, Action::await_change());
        assert_eq!(
            RUNS.load(Ordering::SeqCst),
            runs,
            "not run again before its time"
        );
        // Another object of the same controller goes on.
        let ok = reconcile(good, Arc::clone(&ctx)).await.expect("reconciled");
        assert_eq!(ok, Action::await_change());
        assert_eq!(RUNS.load(Ordering::SeqCst), runs + 1);
    }
}
