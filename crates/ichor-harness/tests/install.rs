//! Installs that wait, fail or never end, seen by the real `ichor-manager` on simulated Talos
//! nodes (what Talos reports: crates/ichor-sim/docs/install-failures.md; what to do:
//! docs/troubleshooting.md). Each reaches its condition on the machine, then the recovery Talos
//! allows brings it to Ready: on 1.14 a disk attached to a pending install and the cause of a
//! failing one fixed (Talos's own retry installs), a hung install power-cycled; on 1.13 the node
//! back in maintenance mode on a new certificate, applied again only once a person updates
//! `spec.fingerprint`.

use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::machine::MachinePhase;
use ichor_api::names::{conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{Fault, Timings};
use ichor_testenv::nets::INSTALL;
use ichor_testenv::wait::try_eventually;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const CLUSTER: &str = "lab";

/// How long each condition may take to show.
const SHOW: Duration = Duration::from_secs(60);

/// Installs long enough that the manager (requeue 300 ms) sees each phase of 1.14's retries,
/// and the countdown before 1.13 reboots after its failed install.
fn timings() -> Timings {
    Timings {
        install: Duration::from_millis(800),
        reboot: Duration::from_millis(500),
        ..Timings::default()
    }
}

/// A target of `nodes` nodes on `127.0.<net>.x` running `version`, its manager's install stall
/// limit a few seconds.
async fn target(nodes: u8, net: u8, version: &str) -> SimTarget {
    SimTarget::up(SimOptions {
        timings: timings(),
        install_stall_seconds: Some(4),
        ..SimOptions::new(nodes, net, version)
    })
    .await
    .expect("sim target")
}

/// Creates the cluster (declaring `control_planes`) and waits until every node is discovered.
async fn discovered(target: &SimTarget, version: &str, control_planes: usize) {
    let all = target.node_endpoints().len();
    specs::discovered_cluster(target, version, control_planes, all)
        .await
        .expect("cluster discovered");
}

/// Waits until the `Ready` condition of the machine at `address` has `reason`; its message.
async fn ready_reason(target: &SimTarget, address: &str, reason: &str) -> String {
    let shown = try_eventually(
        &format!("{address}: Ready reason {reason}"),
        SHOW,
        || async {
            specs::machine_condition(target, address, conditions::READY)
                .await
                .filter(|(_, r, _)| r == reason)
                .map(|(_, _, message)| message)
        },
    )
    .await;
    match shown {
        Ok(message) => message,
        Err(e) => panic!("{e}: {}", specs::summary(target).await),
    }
}

async fn machine(target: &SimTarget, address: &str) -> TalosMachine {
    specs::machine_at(target, address).await.expect("machine")
}

async fn phase(target: &SimTarget, address: &str) -> MachinePhase {
    machine(target, address)
        .await
        .status
        .map(|s| s.lifecycle.phase)
        .unwrap_or_default()
}

/// The Warning Events about the machine at `address` with `reason`, counted once there is one:
/// the manager publishes an Event after the status write it explains, which the spec saw first.
async fn warnings(target: &SimTarget, address: &str, reason: &str) -> usize {
    let name = machine(target, address).await.name_any();
    let count = || async {
        specs::events_with_reason(target, reason)
            .await
            .into_iter()
            .filter(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
            })
            .count()
    };
    let shown = try_eventually(
        &format!("{address}: a Warning Event {reason}"),
        SHOW,
        || async {
            let n = count().await;
            (n > 0).then_some(n)
        },
    )
    .await;
    shown.unwrap_or(0)
}

/// Updates the pin of the machine at `address` to `fingerprint`, as a person does after
/// checking the new certificate.
async fn repin(target: &SimTarget, address: &str, fingerprint: &str) {
    let name = machine(target, address).await.name_any();
    Api::<TalosMachine>::namespaced(target.client(), target.namespace())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fingerprint": fingerprint}})),
        )
        .await
        .expect("update spec.fingerprint");
}

/// Changes an annotation of the machine at `address` that means nothing to the manager: a
/// change, and so a reconcile.
async fn poke_machine(target: &SimTarget, address: &str, poke: u64) {
    let name = machine(target, address).await.name_any();
    Api::<TalosMachine>::namespaced(target.client(), target.namespace())
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"test.ichor.maesh.dev/poke": poke.to_string()}}})),
        )
        .await
        .expect("annotate");
}

/// The node back in maintenance mode on `fingerprint`: `InstallFailed` says to update
/// `spec.fingerprint` to it, and nothing is applied while the pin is the old one.
async fn failed_back_in_maintenance(target: &SimTarget, address: &str, fingerprint: &str) {
    let applies = target
        .nodes()
        .iter()
        .find(|n| n.addr().ip().to_string() == address)
        .map(ichor_sim::SimNode::config_applies);
    let message = try_eventually(
        &format!("{address}: InstallFailed naming the new certificate"),
        SHOW,
        || async {
            specs::machine_condition(target, address, conditions::READY)
                .await
                .filter(|(_, r, m)| r == reasons::INSTALL_FAILED && m.contains(fingerprint))
                .map(|(_, _, m)| m)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        message.contains("update spec.fingerprint"),
        "the message says how to approve it again: {message}"
    );
    assert_eq!(phase(target, address).await, MachinePhase::Failed);
    // The manager gets its chances to apply again (a stop waits for a change: two changes
    // that mean nothing, each a reconcile): it does not, and the failure stays shown.
    let seen = target
        .manager_reconciles("TalosMachine")
        .await
        .expect("metrics");
    for poke in 0..2u64 {
        poke_machine(target, address, poke).await;
        try_eventually("a reconcile", SHOW, || async {
            target
                .manager_reconciles("TalosMachine")
                .await
                .is_ok_and(|n| n > seen + poke)
        })
        .await
        .expect("reconciled");
    }
    let after = target
        .nodes()
        .iter()
        .find(|n| n.addr().ip().to_string() == address)
        .map(ichor_sim::SimNode::config_applies);
    assert_eq!(after, applies, "nothing applied to a changed certificate");
    let (_, reason, _) = specs::machine_condition(target, address, conditions::READY)
        .await
        .expect("Ready");
    assert_eq!(reason, reasons::INSTALL_FAILED);
    let pinned = machine(target, address).await.spec.fingerprint;
    assert_ne!(
        pinned.as_deref(),
        Some(fingerprint),
        "the pin is never moved"
    );
}

/// 1.14: a pending install (no disk) shows `InstallPending` at once and installs once the disk
/// is attached; a failing one shows `InstallFailed` (phase `Failed`, a Warning Event) while
/// Talos retries, and its retry installs once the cause is fixed; a hung one shows
/// `InstallStalled` past the limit, and after a power cycle it is `InstallFailed` until its new
/// certificate is approved, then installs. All three end Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_failing_and_hung_1_14_installs_show_and_recover() {
    let version = "v1.14.1";
    let target = target(3, INSTALL.net(0), version).await;
    discovered(&target, version, 3).await;
    let [pending, failing, hung] = [0, 1, 2].map(|i| target.nodes()[i].clone());
    let address = |n: &ichor_sim::SimNode| n.addr().ip().to_string();
    pending
        .inject(Fault::DisksDetached(true))
        .await
        .expect("detach");
    failing
        .inject(Fault::InstallFails(true))
        .await
        .expect("fault");
    hung.inject(Fault::InstallHangs(true)).await.expect("fault");
    specs::approve_shape(&target, 3, 0).await.expect("approve");

    let why = ready_reason(&target, &address(&pending), reasons::INSTALL_PENDING).await;
    assert!(why.contains("no disk matched the selector"), "{why}");
    let why = ready_reason(&target, &address(&failing), reasons::INSTALL_FAILED).await;
    assert!(why.contains(ichor_sim::INSTALLER_FAILED), "{why}");
    assert_eq!(
        phase(&target, &address(&failing)).await,
        MachinePhase::Failed
    );
    assert_eq!(
        warnings(&target, &address(&failing), reasons::INSTALL_FAILED).await,
        1,
        "one Warning Event"
    );
    let why = ready_reason(&target, &address(&hung), reasons::INSTALL_STALLED).await;
    assert!(why.contains("past the limit of 4s"), "{why}");

    // The fixes: the disk attached; the installer's cause gone (Talos's next attempt
    // installs); the hung installer power-cycled, its new certificate approved.
    pending
        .inject(Fault::DisksDetached(false))
        .await
        .expect("attach");
    failing
        .inject(Fault::InstallFails(false))
        .await
        .expect("clear");
    hung.inject(Fault::InstallHangs(false))
        .await
        .expect("clear");
    let before = hung.fingerprint();
    hung.reboot().await.expect("power cycle");
    let after = hung.fingerprint();
    assert_ne!(before, after, "a new certificate in maintenance mode");
    failed_back_in_maintenance(&target, &address(&hung), &after).await;
    repin(&target, &address(&hung), &after).await;

    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(180)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    for node in [&pending, &failing, &hung] {
        let (installed, reason, _) =
            specs::machine_condition(&target, &address(node), conditions::INSTALLED)
                .await
                .expect("Installed");
        assert!(installed && reason == reasons::INSTALLED, "{reason}");
    }
    target.down().await;
}

/// 1.13: a failed install sequence reboots the node into maintenance mode on a new
/// certificate: `InstallFailed`, phase `Failed`, a Warning Event, and nothing applied until
/// `spec.fingerprint` is updated; then the config is applied again and the machine is Ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_1_13_install_waits_for_its_new_certificate_then_installs() {
    let version = "v1.13.9";
    let target = target(1, INSTALL.net(1), version).await;
    discovered(&target, version, 1).await;
    let node = target.nodes()[0].clone();
    let address = node.addr().ip().to_string();
    let before = node.fingerprint();
    node.inject(Fault::InstallFails(true)).await.expect("fault");
    specs::approve_shape(&target, 1, 0).await.expect("approve");
    // Its configured API served while it installed; the failure reboots it into
    // maintenance mode, on a certificate of its own again.
    try_eventually("the node back in maintenance mode", SHOW, || async {
        node.fingerprint() != before
            && node.is_serving().await
            && node.stage().await == ichor_sim::Stage::Maintenance
    })
    .await
    .expect("rebooted");
    let after = node.fingerprint();
    failed_back_in_maintenance(&target, &address, &after).await;
    assert_eq!(
        warnings(&target, &address, reasons::INSTALL_FAILED).await,
        1,
        "one Warning Event"
    );
    // The cause fixed, the new certificate checked and approved: applied again, installed.
    node.inject(Fault::InstallFails(false))
        .await
        .expect("clear");
    repin(&target, &address, &after).await;
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(120)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    target.down().await;
}
