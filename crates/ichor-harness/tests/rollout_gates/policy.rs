//! The rollout policy where a step starts (ADRs 0074, 0076), with the real `ichor-manager` and
//! simulated nodes: a suspend set while the control plane's upgrade is in flight lets that
//! upgrade finish and starts no other node, the next worker saying `RolloutSuspended`; lifted,
//! the cluster's worker rolls out while the worker a TalosMachineClass approved stays on its
//! old version, held by the class's own window (`OutsideMaintenanceWindow`, naming the
//! class). And a closed window holds the reboot a config that cannot go live needs, then a
//! Kubernetes version's step (a restart), each saying so with nothing sent to the node; once
//! a window opens a few seconds later, both roll out, nothing having moved before it opened.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ichor_api::class::{Qualifiers, TalosMachineClassSpec};
use ichor_api::common::{LocalObjectReference, Role};
use ichor_api::names::{conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::Fault;
use ichor_testenv::nets::ROLLOUT_GATES;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::{RoundMode, SignedDuration, Span, Timestamp, TimestampRound, Unit, civil};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::patch_spec;
use crate::support::cluster::{
    CLUSTER, cluster_says, every_machine_applied, kubernetes_rolled_out, ready_target,
    state_summary,
};

/// The TalosMachineClass with a rollout policy of its own.
const CLASS: &str = "gpu";

/// A yearly maintenance window closed now: an hour from 12:00 UTC on a day about half a year
/// ahead (at most the 28th, which every month has); and when it next opens.
fn closed_window() -> (serde_json::Value, Timestamp) {
    let ahead = Timestamp::now()
        .to_zoned(TimeZone::UTC)
        .checked_add(Span::new().days(182))
        .expect("a date ahead");
    let (month, day) = (ahead.month(), ahead.day().min(28));
    let opens = civil::date(ahead.year(), month, day)
        .at(12, 0, 0, 0)
        .to_zoned(TimeZone::UTC)
        .expect("in UTC")
        .timestamp();
    let window =
        json!({"schedule": format!("0 12 {day} {month} *"), "duration": "1h", "timeZone": "UTC"});
    (window, opens)
}

/// A daily window of ten minutes opening at the next whole minute at least `lead` from now
/// (UTC); and when it opens.
fn window_opening_after(lead: Duration) -> (serde_json::Value, Timestamp) {
    let opens = Timestamp::now()
        .checked_add(SignedDuration::try_from(lead).expect("lead"))
        .expect("time")
        .round(
            TimestampRound::new()
                .smallest(Unit::Minute)
                .mode(RoundMode::Ceil),
        )
        .expect("rounded");
    let utc = opens.to_zoned(TimeZone::UTC);
    let schedule = format!("{} {} * * *", utc.minute(), utc.hour());
    (
        json!({"schedule": schedule, "duration": "10m", "timeZone": "UTC"}),
        opens,
    )
}

/// Every node's count of calls to `method`, in node order.
fn calls(target: &SimTarget, method: &str) -> Vec<usize> {
    target.nodes().iter().map(|n| n.calls(method)).collect()
}

/// Waits until the machine at `address` says `reason` in its condition `type_`; returns the
/// condition's message.
async fn machine_says(target: &SimTarget, address: &str, type_: &str, reason: &str) -> String {
    try_eventually(
        &format!("{address}'s {type_} saying {reason}"),
        Duration::from_secs(120),
        || async {
            let seen = specs::machine_condition(target, address, type_).await;
            match seen {
                Some((_, r, message)) if r == reason => Ok(message),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)))
}

/// Waits until node `i` runs `version` and its machine says it runs what is declared.
async fn upgraded(target: &SimTarget, i: usize, version: &str) {
    let address = target.node_endpoints()[i].clone();
    try_eventually(
        &format!("{address} on {version}"),
        Duration::from_secs(120),
        || async {
            let running = target.nodes()[i].talos_version();
            let up = specs::machine_condition(target, &address, conditions::UP_TO_DATE).await;
            match up {
                Some((true, reason, _))
                    if reason == reasons::RUNS_DECLARED && running == version =>
                {
                    Ok(())
                }
                other => Err(format!("runs {running}, {other:?}")),
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

/// The names of the machines the Events with `reason` are about.
async fn regarding(target: &SimTarget, reason: &str) -> Vec<String> {
    specs::events_with_reason(target, reason)
        .await
        .into_iter()
        .filter_map(|e| e.regarding.and_then(|r| r.name))
        .collect()
}

/// A suspend mid-rollout (ADR 0074) and a class's own policy (ADR 0076): the control plane's
/// upgrade is held at its node while `spec.rollout.suspend` is set, then finishes; the worker
/// whose turn comes next says `RolloutSuspended` and gets nothing. Lifted, that worker rolls
/// out, and the worker the class approved, whose class declares a window closed now, says
/// `OutsideMaintenanceWindow` naming the class's policy, and gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suspend_stops_the_rollout_after_the_node_in_flight_and_a_class_window_holds_its_worker()
{
    let target = SimTarget::up(SimOptions::new(3, ROLLOUT_GATES.net(2), "v1.14.1"))
        .await
        .expect("sim target");
    let endpoints = target.node_endpoints();
    let shape = Shape {
        control_planes: 1,
        ..Shape::new("v1.14.1", "flannel")
    };
    specs::create_cluster(&target, &shape)
        .await
        .expect("cluster");
    specs::wait_discovered(&target, 3)
        .await
        .expect("discovered");
    specs::approve(&target, &endpoints[0], true, "cp-1")
        .await
        .expect("cp-1 approved");
    specs::approve(&target, &endpoints[1], false, "worker-2")
        .await
        .expect("worker-2 approved");
    // The class approves the third node (by MAC), last by name, and declares its own policy:
    // one window, closed now.
    let (closed, next_opening) = closed_window();
    let class = TalosMachineClass::new(
        CLASS,
        TalosMachineClassSpec {
            cluster_ref: LocalObjectReference {
                name: CLUSTER.into(),
            },
            role: Role::Worker,
            qualifiers: Qualifiers {
                mac_addresses: vec![target.nodes()[2].hardware().links[0].hardware_addr.clone()],
                ..Default::default()
            },
            max_machines: None,
            install: None,
            schematic: None,
            config_patches: Vec::new(),
            rollout: Some(
                serde_json::from_value(json!({"maintenanceWindows": [closed]})).expect("policy"),
            ),
        },
    );
    Api::<TalosMachineClass>::namespaced(target.client(), target.namespace())
        .create(&PostParams::default(), &class)
        .await
        .expect("class");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(180)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    target
        .kubelets_registered(CLUSTER)
        .await
        .expect("Nodes registered");
    let classed = specs::machine_at(&target, &endpoints[2])
        .await
        .expect("the class's machine");
    assert_eq!(
        classed.labels().get(labels::CLASS).map(String::as_str),
        Some(CLASS),
        "approved by the class"
    );
    let (upgrades, reboots) = (calls(&target, "Upgrade"), calls(&target, "Reboot"));

    // The control plane goes first; its upgrade reaches its node and is held there.
    let in_flight = target.nodes()[0].gate("Upgrade");
    patch_spec(&target, json!({"talosVersion": "v1.14.2"})).await;
    if tokio::time::timeout(Duration::from_secs(120), in_flight.arrived(1))
        .await
        .is_err()
    {
        panic!(
            "the control plane's upgrade never reached its node\n{}",
            state_summary(&target)
        );
    }
    // Suspended while it is in flight: it finishes, on the declared version.
    patch_spec(&target, json!({"rollout": {"suspend": true}})).await;
    in_flight.release();
    upgraded(&target, 0, "v1.14.2").await;
    // The worker whose turn came waits, saying why (on `ConfigApplied`: a version's changed
    // config, its installer image, goes before its upgrade); no other node was upgraded.
    let message = machine_says(
        &target,
        &endpoints[1],
        conditions::CONFIG_APPLIED,
        reasons::ROLLOUT_SUSPENDED,
    )
    .await;
    assert!(
        message.contains("spec.rollout.suspend is true"),
        "{message}"
    );
    cluster_says(&target, reasons::ROLLOUT_SUSPENDED).await;
    let delta = |now: Vec<usize>, before: &[usize]| -> Vec<usize> {
        now.iter().zip(before).map(|(a, b)| a - b).collect()
    };
    assert_eq!(
        delta(calls(&target, "Upgrade"), &upgrades),
        [1, 0, 0],
        "only the node in flight was upgraded while suspended"
    );

    // Lifted: the cluster's worker rolls out; the class's worker is held by its class's
    // window, which the class names, and nothing reaches it.
    patch_spec(&target, json!({"rollout": {"suspend": false}})).await;
    upgraded(&target, 1, "v1.14.2").await;
    let message = machine_says(
        &target,
        &endpoints[2],
        conditions::UP_TO_DATE,
        reasons::OUTSIDE_MAINTENANCE_WINDOW,
    )
    .await;
    for part in [
        format!(
            "its upgrade waits: outside every maintenance window of TalosMachineClass {CLASS} spec.rollout;"
        ),
        format!("the next opens at {next_opening}"),
    ] {
        assert!(message.contains(&part), "{message} lacks {part}");
    }
    cluster_says(&target, reasons::OUTSIDE_MAINTENANCE_WINDOW).await;
    assert_eq!(
        delta(calls(&target, "Upgrade"), &upgrades),
        [1, 1, 0],
        "each of the cluster's nodes upgraded once, the class's not"
    );
    assert_eq!(
        delta(calls(&target, "Reboot"), &reboots)[2],
        0,
        "the class's worker not rebooted"
    );
    assert_eq!(target.nodes()[2].talos_version(), "v1.14.1");
    assert!(
        !regarding(&target, reasons::DRAINING)
            .await
            .contains(&classed.name_any()),
        "the class's worker not drained"
    );
    assert!(
        !regarding(&target, reasons::UPGRADING)
            .await
            .contains(&classed.name_any()),
        "no upgrade announced for the class's worker"
    );
    target.down().await;
}

/// What one look saw: when, the control plane's configs taken, and each node's reboots.
type Sample = (Timestamp, usize, Vec<usize>);

/// Looks every 20 ms, until `stop` is set, at the configs the control plane (node 0) took
/// and each node's reboots.
fn sample(target: &SimTarget, stop: &Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Sample>> {
    let (nodes, stop) = (target.nodes().to_vec(), Arc::clone(stop));
    tokio::spawn(async move {
        let mut samples = Vec::new();
        while !stop.load(Ordering::SeqCst) {
            let reboots = nodes.iter().map(|n| n.calls("Reboot")).collect();
            samples.push((Timestamp::now(), nodes[0].config_applies(), reboots));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        samples
    })
}

/// A closed window holds what disrupts (ADR 0074): a worker's changed config that its node
/// will not take live waits for its reboot, saying so with the config, and is not rebooted;
/// a Kubernetes version's first step, on the control plane, waits too, as a restart, and its
/// config is not sent. A window opening a few seconds later lets both go: the worker is
/// rebooted into its config and Kubernetes rolls out, neither having moved before it opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_window_holds_a_drift_reboot_and_a_kubernetes_step_until_it_opens() {
    let target = ready_target(SimOptions::new(2, ROLLOUT_GATES.net(3), "v1.14.1"), 1, 1, 1).await;
    let endpoints = target.node_endpoints();
    let (closed, next_opening) = closed_window();
    patch_spec(
        &target,
        json!({"rollout": {"maintenanceWindows": [closed]}}),
    )
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(&target, &stop);
    let (applies, reboots) = (target.nodes()[0].config_applies(), calls(&target, "Reboot"));

    // The worker takes no config live: a patch of its own needs a reboot, which waits.
    target.nodes()[1]
        .inject(Fault::RequireReboot(true))
        .await
        .expect("fault");
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let worker = specs::machine_at(&target, &endpoints[1])
        .await
        .expect("the worker's machine");
    machines
        .patch(
            &worker.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [
                {"name": "san", "machine": {"certSANs": ["window.example.internal"]}}
            ]}})),
        )
        .await
        .expect("the worker's patch");
    let message = machine_says(
        &target,
        &endpoints[1],
        conditions::CONFIG_APPLIED,
        reasons::OUTSIDE_MAINTENANCE_WINDOW,
    )
    .await;
    let hash = message
        .strip_prefix("config ")
        .and_then(|m| m.split_once(' '))
        .map(|(hash, _)| hash.to_owned())
        .unwrap_or_else(|| panic!("no config named: {message}"));
    for part in [
        format!(
            "config {hash} needs a reboot: the reboot its changed config needs waits: outside every maintenance window of spec.rollout;"
        ),
        format!("the next opens at {next_opening}"),
    ] {
        assert!(message.contains(&part), "{message} lacks {part}");
    }
    let applied = machines
        .get(&worker.name_any())
        .await
        .expect("worker")
        .status
        .and_then(|s| s.applied.config_hash);
    assert_ne!(applied.as_deref(), Some(hash.as_str()), "the new config");
    cluster_says(&target, reasons::OUTSIDE_MAINTENANCE_WINDOW).await;
    assert_eq!(calls(&target, "Reboot"), reboots, "no node rebooted");

    // A Kubernetes patch bump: its first step, kube-apiserver on the control plane, restarts
    // a component, so it waits for a window too; its config is not sent.
    patch_spec(&target, json!({"kubernetesVersion": "1.36.4"})).await;
    let message = machine_says(
        &target,
        &endpoints[0],
        conditions::CONFIG_APPLIED,
        reasons::OUTSIDE_MAINTENANCE_WINDOW,
    )
    .await;
    for part in [
        "its changed config, which restarts a Kubernetes component (a Kubernetes version rolls out) waits: outside every maintenance window of spec.rollout;".to_owned(),
        format!("the next opens at {next_opening}"),
    ] {
        assert!(message.contains(&part), "{message} lacks {part}");
    }
    let step = Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.core.rollout)
        .and_then(|r| r.kubernetes_step);
    assert!(
        step.as_deref()
            .is_some_and(|s| s.starts_with("kube-apiserver")),
        "{step:?}"
    );
    assert_eq!(
        target.nodes()[0].config_applies(),
        applies,
        "no config sent to the control plane"
    );
    assert_eq!(calls(&target, "Reboot"), reboots, "no node rebooted");

    // A window opening a few seconds from now: both go once it opens.
    let (window, opens) = window_opening_after(Duration::from_secs(3));
    patch_spec(
        &target,
        json!({"rollout": {"maintenanceWindows": [window]}}),
    )
    .await;
    kubernetes_rolled_out(&target, "1.36.4", Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    try_eventually(
        "the worker rebooted into its config",
        Duration::from_secs(120),
        || async {
            calls(&target, "Reboot")[1] > reboots[1] && every_machine_applied(&target).await
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    stop.store(true, Ordering::SeqCst);
    let samples = sampler.await.expect("sampler");

    // Nothing moved before the window opened: every look before it saw no config taken by
    // the control plane and no reboot; and every step was announced after it opened.
    let before: Vec<&Sample> = samples.iter().filter(|(at, ..)| *at < opens).collect();
    assert!(!before.is_empty(), "looked before {opens}");
    for (at, taken, rebooted) in before {
        assert_eq!(
            (*taken, rebooted),
            (applies, &reboots),
            "at {at}, before the window opened at {opens}"
        );
    }
    for reason in [
        reasons::DRIFT_APPLIED,
        reasons::REBOOT_FOR_DRIFT,
        reasons::DRAINING,
    ] {
        for event in specs::events_with_reason(&target, reason).await {
            let at = event.event_time.as_ref().expect("an eventTime").0;
            assert!(
                at >= opens,
                "{reason} at {at}, before the window opened at {opens}: {:?}",
                event.note
            );
        }
    }
    assert!(
        target.nodes()[0].config_applies() > applies,
        "the control plane took its new configs"
    );
    assert_eq!(
        calls(&target, "Reboot")[0],
        reboots[0],
        "the control plane's steps went live"
    );
    for node in target.nodes() {
        let kubelet = node.kubelet_version().await.unwrap_or_default();
        assert_eq!(kubelet.trim_start_matches('v'), "1.36.4", "{}", node.addr());
    }
    target.down().await;
}
