//! A reconcile that panics, on the sim target with the real binaries (ADR 0049). The tests'
//! build of `ichor-manager` (its `testing` feature) panics in the cluster controller's
//! reconcile of a TalosCluster marked `ichor.maesh.dev/test-panic-in: cluster`. Two marked
//! clusters sit in a namespace of their own while a cluster in the spec's namespace is brought
//! to Ready by the same controller. The panics are counted in
//! `ichor_reconcile_panics_total{controller="cluster"}`, shown on each marked object (the
//! `ReconcilePanicked` condition, counting the panics in a row, and a Warning Event whose
//! series counts them) and retried after waits that double (each count's arrival timed by a
//! watch of the condition); the manager keeps its process and its `/healthz`; a marked cluster
//! whose mark is removed is reconciled again and loses its condition.
//!
//! Run with the tests' build of the binaries: `cargo test --workspace` builds them so; by hand,
//! `cargo build -p ichor-manager --features testing -p ichor-webhook -p ichor-sim` first.

use std::time::Duration;

use futures::StreamExt as _;
use ichor_api::TalosCluster;
use ichor_api::common::{Condition, ConditionStatus};
use ichor_api::names::{annotations, conditions, controllers, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::nets::PANICS;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt as _, watcher};
use serde_json::json;
use tokio::time::Instant;

/// The namespace of the marked clusters (the spec's own cluster is in the target's).
const HOSTILE: &str = "hostile";
/// A marked cluster that stays marked: its retries are timed.
const STUCK: &str = "stuck";
/// A marked cluster whose mark is removed after its second panic.
const FLAKY: &str = "flaky";
/// How much later one watch event may arrive than the next after the panics they report: the
/// waits are lower bounds, and this is their tolerance.
const WATCH_SLACK: Duration = Duration::from_millis(250);
/// How long a marked cluster's panics are watched for: five waits from the first seen (1 s to
/// 16 s when the watch starts at once), and room for a late start.
const WATCH_LIMIT: Duration = Duration::from_secs(120);

fn hostile_clusters(target: &SimTarget) -> Api<TalosCluster> {
    Api::namespaced(target.client(), HOSTILE)
}

/// Creates a cluster marked to panic in the cluster controller, in [`HOSTILE`]: no discovery,
/// an endpoint in the spec's own net where nothing listens.
async fn create_marked(target: &SimTarget, name: &str) {
    let cluster = TalosCluster::test(name)
        .namespace(HOSTILE)
        .endpoint(&format!("https://{}:6443", PANICS.ip(0, 250)))
        .annotation(annotations::TEST_PANIC_IN, controllers::CLUSTER)
        .build();
    hostile_clusters(target)
        .create(&PostParams::default(), &cluster)
        .await
        .expect("a marked cluster");
}

/// The `ReconcilePanicked` condition of `cluster`, if it shows one.
fn panic_condition(cluster: &TalosCluster) -> Option<&Condition> {
    cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::RECONCILE_PANICKED)
}

/// How many panics in a row a `ReconcilePanicked` message counts (`... panicked (3 in a row)`).
fn in_a_row(message: &str) -> Option<u32> {
    let (before, _) = message.split_once(" in a row)")?;
    before.rsplit_once('(')?.1.parse().ok()
}

/// The Warning Event of `name`'s panics in [`HOSTILE`] (repeated panics are one Event with a
/// growing series).
async fn panic_event(target: &SimTarget, name: &str) -> Option<Event> {
    Api::<Event>::namespaced(target.client(), HOSTILE)
        .list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|e| {
            e.reason.as_deref() == Some(reasons::RECONCILE_PANICKED)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
}

/// The manager's `ichor_reconcile_panics_total` of `controller`.
async fn panics_counted(target: &SimTarget, controller: &str) -> u64 {
    let text = target
        .manager_metrics()
        .await
        .expect("the manager's metrics");
    let series = format!("ichor_reconcile_panics_total{{controller=\"{controller}\"}}");
    text.lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// Watches `name`'s condition until `done(first, count)` holds of the count of panics in a row
/// it first showed and the latest; returns each count as it arrived, with when (each panic
/// writes its count into the condition's message).
async fn panics_arriving(
    target: &SimTarget,
    name: &str,
    done: fn(u32, u32) -> bool,
) -> Vec<(u32, Instant)> {
    let watch = watcher(
        hostile_clusters(target),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .applied_objects();
    let mut watch = std::pin::pin!(watch);
    let mut seen: Vec<(u32, Instant)> = Vec::new();
    let arrived = tokio::time::timeout(WATCH_LIMIT, async {
        while let Some(event) = watch.next().await {
            let Ok(cluster) = event else { continue };
            let Some(count) = panic_condition(&cluster).and_then(|c| in_a_row(&c.message)) else {
                continue;
            };
            if seen.last().is_none_or(|(c, _)| *c != count) {
                seen.push((count, Instant::now()));
            }
            if seen.first().is_some_and(|(first, _)| done(*first, count)) {
                return;
            }
        }
    })
    .await;
    if arrived.is_err() {
        panic!(
            "{name} did not count enough panics in a row within {WATCH_LIMIT:?} (seen {seen:?}); \
             is ichor-manager built with its `testing` feature (`cargo build -p ichor-manager \
             --features testing`)?\n{}",
            target.manager_log_tail()
        );
    }
    seen
}

/// The flaky cluster, unmarked after its second panic, is reconciled again: its status
/// written by the cluster controller and its `ReconcilePanicked` condition gone.
async fn flaky_recovers(target: &SimTarget) {
    panics_arriving(target, FLAKY, |_, count| count >= 2).await;
    hostile_clusters(target)
        .patch(
            FLAKY,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::TEST_PANIC_IN: null}}})),
        )
        .await
        .expect("unmarked");
    try_eventually(
        "the unmarked cluster reconciled, its panic condition gone",
        Duration::from_secs(60),
        || async {
            let cluster = hostile_clusters(target).get(FLAKY).await.ok()?;
            let reconciled = cluster
                .status
                .as_ref()
                .is_some_and(|s| s.core.observed_generation.is_some());
            (reconciled && panic_condition(&cluster).is_none()).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", target.manager_log_tail()));
}

/// The stuck cluster's panics are spaced by waits that double from a second (each seen as it
/// arrived, the first left out: it may predate the watch); its condition and Event say so.
async fn stuck_backs_off(target: &SimTarget) {
    // The first count seen is left out (it may predate the watch); three waits after it are
    // timed.
    let seen = panics_arriving(target, STUCK, |first, count| count >= first + 4).await;
    let spacing: Vec<(u32, Duration)> = seen[1..]
        .windows(2)
        .map(|w| (w[0].0, w[1].1 - w[0].1))
        .collect();
    eprintln!("panics of {STUCK}: after the n-th in a row, the next came after {spacing:?}");
    assert!(spacing.len() >= 3, "too few panics seen live: {seen:?}");
    for (count, gap) in &spacing {
        let wait = Duration::from_secs(1 << (count - 1));
        assert!(
            *gap + WATCH_SLACK >= wait,
            "the retry after panic {count} came {gap:?} later, sooner than its {wait:?}: {seen:?}"
        );
    }
    let cluster = hostile_clusters(target).get(STUCK).await.expect("stuck");
    let condition = panic_condition(&cluster).expect("the ReconcilePanicked condition");
    assert_eq!(condition.status, ConditionStatus::True);
    assert_eq!(condition.reason, reasons::RECONCILE_PANICKED);
    assert!(
        condition
            .message
            .starts_with("The cluster controller's reconcile")
            && condition
                .message
                .contains("test panic in the cluster controller")
            && condition.message.len() < 400,
        "{}",
        condition.message
    );
    let event = try_eventually("the panic's Event", Duration::from_secs(30), || async {
        panic_event(target, STUCK).await
    })
    .await
    .expect("a Warning Event");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("the cluster controller panicked") && note.contains("retried in"),
        "{note}"
    );
}

/// The manager's `/healthz` and last log lines, for a failure message.
async fn what_the_manager_says(target: &SimTarget) -> String {
    format!(
        "/healthz: {:?}\n{}",
        target.manager_health().await,
        target.manager_log_tail()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_is_contained_while_another_namespace_converges() {
    // A Lease long enough that no late renewal restarts the manager: its pid must not change.
    let options = SimOptions {
        lease_seconds: 30,
        ..SimOptions::new(1, PANICS.net(0), "v1.14.1")
    };
    let target = SimTarget::up(options).await.expect("sim target");
    let pid = target.manager_pid().expect("the manager runs");
    Api::<Namespace>::all(target.client())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(HOSTILE.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("the hostile namespace");
    create_marked(&target, STUCK).await;
    create_marked(&target, FLAKY).await;

    // The spec's own cluster, reconciled by the same controller meanwhile.
    let converges = async {
        let (shape, _) = match specs::discovered_cluster(&target, "v1.14.1", 1, 1).await {
            Ok(found) => found,
            Err(error) => panic!(
                "discovery: {error}\n{}",
                what_the_manager_says(&target).await
            ),
        };
        specs::approve_all(&target, &shape).await.expect("approved");
        if let Err(error) = specs::wait_ready(&target, &shape.name, Duration::from_secs(180)).await
        {
            panic!(
                "{error}: {}\n{}",
                specs::summary(&target).await,
                what_the_manager_says(&target).await
            );
        }
    };
    tokio::join!(converges, flaky_recovers(&target), stuck_backs_off(&target));

    // Still panicking on schedule, counted, reported, and the same healthy process throughout.
    let stuck = hostile_clusters(&target).get(STUCK).await.expect("stuck");
    let in_row = panic_condition(&stuck)
        .and_then(|c| in_a_row(&c.message))
        .expect("still panicking");
    let counted = panics_counted(&target, controllers::CLUSTER).await;
    assert!(
        counted >= u64::from(in_row) + 2,
        "{counted} panics counted; {in_row} of {STUCK} in a row, and 2 of {FLAKY}"
    );
    let series = panic_event(&target, STUCK)
        .await
        .and_then(|e| e.series)
        .map_or(1, |s| s.count);
    assert!(
        series >= 2,
        "the Event counts the repeated panics: {series}"
    );
    assert_eq!(target.manager_pid(), Some(pid), "the manager was restarted");
    assert_eq!(target.manager_lease_restarts(), 0);
    let (code, body) = target.manager_health().await.expect("/healthz");
    assert_eq!((code, body.as_str()), (200, "ok"));
    target.down().await;
}
