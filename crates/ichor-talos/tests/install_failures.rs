//! Installs that fail or never end, as Talos reports them (crates/ichor-sim/docs/
//! install-failures.md), seen through the client: 1.13's failed install sequence in the event
//! log (read over mutual TLS, which the node serves once the config is in) and the node back
//! in maintenance mode; 1.14's unattended-install status `failed` with
//! the installer's error, retried by Talos until it completes; an install stuck `installing`;
//! and, each time, the recovery Talos allows reaching a running node.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::common::Role;
use ichor_sim::{Fault, Hardware, INSTALLER_FAILED, NodeSpec, SimNode, Timings};
use ichor_talos::{ApplyMode, Stage, TalosClient};
use ichor_testenv::nets::TALOS_INSTALL_FAILURES;
use ichor_testenv::wait::eventually;
use support::{NodeConfig, WAIT, admin, bundle_for, node_config};

/// How long the event log may stay quiet before its backlog counts as read.
const QUIET: Duration = Duration::from_millis(200);

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from((TALOS_INSTALL_FAILURES.ip(0, host), 50000))
}

/// A control plane's config for `version`, installing to the VM's disk: `machine.install` on
/// 1.13, an `UnattendedInstallConfig` with a reboot on 1.14.
fn cp_config(b: &ichor_render::SecretsBundle, host: u8, version: &str) -> String {
    node_config(
        b,
        &NodeConfig {
            role: Role::ControlPlane,
            talos_version: version,
            endpoint_host: &addr(host).ip().to_string(),
            hostname: Some("cp-1"),
            cni: "flannel",
            install: true,
        },
    )
}

/// A node in maintenance mode whose installs take long enough to be seen, as does the
/// countdown before machined reboots after a fatal error (10 s on a real node).
async fn maintenance_node(host: u8, version: &str) -> SimNode {
    SimNode::spawn(NodeSpec {
        timings: Timings {
            install: Duration::from_millis(400),
            reboot: Duration::from_secs(2),
            ..Timings::default()
        },
        hardware: Hardware::vm(u32::from(host)),
        ..NodeSpec::new(addr(host), version)
    })
    .await
    .expect("start")
}

async fn pinned(node: &SimNode) -> TalosClient {
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect in maintenance mode")
}

/// Waits for the node to answer in maintenance mode again, on a new certificate.
async fn back_in_maintenance(node: &SimNode, before: &str) -> TalosClient {
    eventually("the node back in maintenance mode", WAIT, || async {
        node.is_serving().await
            && node.stage().await == Stage::Maintenance
            && node.fingerprint() != before
    })
    .await;
    pinned(node).await
}

#[tokio::test]
async fn a_failed_1_13_install_reports_the_fatal_install_sequence_then_returns_to_maintenance() {
    let b = bundle_for(61);
    let node = maintenance_node(1, "v1.13.9").await;
    node.inject(Fault::InstallFails(true)).await.expect("fault");
    let before = node.fingerprint();
    let client = pinned(&node).await;
    let config = cp_config(&b, 1, "v1.13.9");
    client
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("the checks pass: accepted");
    // The config is complete: the maintenance service is gone, the configured API serves
    // while the install sequence runs.
    let client = admin(&b, node.addr()).await;
    eventually("the install stage", WAIT, || async {
        client
            .machine_status()
            .await
            .is_ok_and(|s| s.stage == Stage::Installing)
    })
    .await;
    let expected = format!(
        "sequence failed: error running phase 2 in install sequence: task 1/1: failed, {INSTALLER_FAILED}"
    );
    // Between the failure and the reboot: the stage is rebooting and this boot's event log
    // holds the install sequence's FATAL error.
    eventually("the install failure", WAIT, || async {
        client
            .install_failure(QUIET)
            .await
            .is_ok_and(|f| f.as_deref() == Some(expected.as_str()))
    })
    .await;
    let failures = client.sequence_failures(QUIET).await.expect("events");
    assert!(
        failures
            .iter()
            .any(|f| f.sequence == "install" && f.fatal && f.message == expected),
        "{failures:?}"
    );
    assert_eq!(
        node.install_failure().await.as_deref(),
        Some(expected.as_str())
    );
    assert!(!node.installed().await);

    // machined reboots by itself; the config lived in memory only.
    let again = back_in_maintenance(&node, &before).await;
    assert_eq!(again.install_failure(QUIET).await.expect("events"), None);

    // The fix, then the same config applied again in maintenance mode: it installs and runs.
    node.inject(Fault::InstallFails(false))
        .await
        .expect("clear");
    again
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted again");
    eventually("installed", WAIT, || async { node.installed().await }).await;
    let admin = admin(&b, node.addr()).await;
    eventually("running", WAIT, || async {
        admin
            .machine_status()
            .await
            .is_ok_and(|s| s.stage == Stage::Running)
    })
    .await;
    node.stop().await;
}

#[tokio::test]
async fn a_failed_1_14_unattended_install_reports_failed_and_completes_once_fixed() {
    let b = bundle_for(62);
    let node = maintenance_node(2, "v1.14.1").await;
    node.inject(Fault::InstallFails(true)).await.expect("fault");
    pinned(&node)
        .await
        .apply_configuration(cp_config(&b, 2, "v1.14.1").as_bytes(), ApplyMode::Auto)
        .await
        .expect("the checks pass: accepted");
    // The config is applied: the node answers with mutual TLS, booting, while the install
    // fails (and is tried again by Talos, phase installing in between).
    let client = admin(&b, node.addr()).await;
    eventually("the failed phase", WAIT, || async {
        client
            .unattended_install()
            .await
            .is_ok_and(|s| s.is_some_and(|s| s.phase == "failed"))
    })
    .await;
    let status = client
        .unattended_install()
        .await
        .expect("read")
        .expect("status");
    if status.phase == "failed" {
        assert_eq!(status.error, INSTALLER_FAILED);
    }
    assert_eq!(
        client.machine_status().await.expect("status").stage,
        Stage::Booting
    );
    assert!(!node.installed().await);
    let refused = client
        .bootstrap(Duration::from_millis(200))
        .await
        .expect_err("the CRI waits for the install");
    assert_eq!(
        refused.code(),
        Some(tonic::Code::FailedPrecondition),
        "{refused}"
    );
    // Still failing later: Talos keeps trying while the cause holds.
    eventually("installing again", WAIT, || async {
        client
            .unattended_install()
            .await
            .is_ok_and(|s| s.is_some_and(|s| s.phase == "installing" && s.error.is_empty()))
    })
    .await;
    eventually("failed again", WAIT, || async {
        node.unattended_install().await == Some(("failed", INSTALLER_FAILED.to_owned()))
    })
    .await;

    // A config can be applied meanwhile, over mutual TLS as os:admin (1.14: NO_REBOOT); the
    // controller takes it at its next attempt.
    let applied = client
        .apply_configuration(cp_config(&b, 2, "v1.14.1").as_bytes(), ApplyMode::NoReboot)
        .await
        .expect("applied while the install fails");
    assert_eq!(applied.mode, "NO_REBOOT");

    // The cause fixed: the next attempt installs, the node reboots into the installed system.
    node.inject(Fault::InstallFails(false))
        .await
        .expect("clear");
    eventually("installed", WAIT, || async { node.installed().await }).await;
    eventually("running, installed", WAIT, || async {
        node.stage().await == Stage::Running
            && node.unattended_install().await == Some(("installed", String::new()))
    })
    .await;
    let client = admin(&b, node.addr()).await;
    assert_eq!(
        client.machine_status().await.expect("status").stage,
        Stage::Running
    );
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap once installed");
    node.stop().await;
}

#[tokio::test]
async fn a_hung_install_stays_installing_and_a_power_cycle_lets_a_new_apply_finish() {
    let b = bundle_for(63);
    for (host, version) in [(3u8, "v1.13.9"), (4u8, "v1.14.1")] {
        let node = maintenance_node(host, version).await;
        node.inject(Fault::InstallHangs(true)).await.expect("fault");
        let before = node.fingerprint();
        let client = pinned(&node).await;
        let config = cp_config(&b, host, version);
        client
            .apply_configuration(config.as_bytes(), ApplyMode::Auto)
            .await
            .expect("accepted");
        // Served over mutual TLS once the config is in: 1.13's install sequence shows stage
        // installing, 1.14's unattended install stage booting with phase installing.
        let client = admin(&b, node.addr()).await;
        let stage = if version == "v1.14.1" {
            Stage::Booting
        } else {
            Stage::Installing
        };
        eventually("installing", WAIT, || async {
            client
                .machine_status()
                .await
                .is_ok_and(|s| s.stage == stage)
        })
        .await;
        // The installer's time is up and it has not returned: still installing.
        eventually("the install's time up", WAIT, || async {
            node.installs_run() >= 1
        })
        .await;
        let status = client.machine_status().await.expect("status");
        assert_eq!(status.stage, stage, "{version}");
        if version == "v1.14.1" {
            let install = client
                .unattended_install()
                .await
                .expect("read")
                .expect("status");
            assert_eq!(
                (install.phase.as_str(), install.error.as_str()),
                ("installing", "")
            );
        }
        assert_eq!(client.install_failure(QUIET).await.expect("events"), None);
        assert!(!node.installed().await);
        assert_eq!(node.installs_run(), 1, "one attempt, still running");

        // Clearing the cause does not unstick a hung installer: a power cycle does, and the
        // config, in memory only, has to be applied again.
        node.inject(Fault::InstallHangs(false))
            .await
            .expect("clear");
        node.reboot().await.expect("power cycle");
        let again = back_in_maintenance(&node, &before).await;
        again
            .apply_configuration(config.as_bytes(), ApplyMode::Auto)
            .await
            .expect("accepted again");
        eventually("installed", WAIT, || async { node.installed().await }).await;
        eventually("running", WAIT, || async {
            node.stage().await == Stage::Running
        })
        .await;
        node.stop().await;
    }
}
