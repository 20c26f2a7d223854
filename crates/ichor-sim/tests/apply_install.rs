//! What an accepted apply sets off, as Talos does it (talos-facts §11.7, §11.8): the install
//! disk is checked against the simulated disks (1.13: the install fails and the node returns
//! to maintenance; 1.14: the unattended install stays pending with Talos's reason), and a dry
//! run answers Talos's summary and changes nothing, in maintenance and configured mode.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_sim::{Fault, Hardware, SimNode, Stage};
use ichor_talos::api::machine::ApplyConfigurationRequest;
use ichor_talos::api::machine::apply_configuration_request::Mode;
use ichor_talos::api::machine::machine_service_client::MachineServiceClient;
use ichor_talos::{ApplyMode, TalosClient};
use ichor_testenv::nets::SIM_APPLY_INSTALL;
use ichor_testenv::wait::eventually;

/// How long the simulated node gets for what a test waits for.
const WAIT: Duration = Duration::from_secs(10);

/// A golden config installing to the VM's disk (`vda`) instead of `/dev/sda`.
fn to_vda(config: &str) -> String {
    config.replace("/dev/sda", "/dev/vda")
}

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from((SIM_APPLY_INSTALL.ip(0, host), 0))
}

async fn pinned(node: &SimNode) -> TalosClient {
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect in maintenance mode")
}

async fn dry_run(client: &TalosClient, config: &str, mode: Mode) -> (i32, String) {
    let reply = MachineServiceClient::new(client.channel())
        .apply_configuration(ApplyConfigurationRequest {
            data: config.as_bytes().to_vec(),
            mode: mode as i32,
            dry_run: true,
            try_mode_timeout: None,
        })
        .await
        .expect("a dry run")
        .into_inner();
    let first = reply.messages.first().expect("one message");
    assert!(first.warnings.is_empty(), "a dry run carries no warnings");
    (first.mode, first.mode_details.clone())
}

#[tokio::test]
async fn a_1_13_install_to_a_missing_disk_fails_and_the_node_returns_to_maintenance() {
    let node = SimNode::start_with(addr(31), "v1.13.9", Hardware::vm(31))
        .await
        .expect("start");
    let before = node.fingerprint();
    let config = support::golden("1.13-controlplane-flannel-plain.yaml");
    assert!(
        config.contains("disk: /dev/sda"),
        "installs to /dev/sda, which the VM lacks"
    );
    // Talos does not check a disk path at apply time: the apply is accepted.
    pinned(&node)
        .await
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted");
    eventually("the install to fail", WAIT, || async {
        node.install_failure().await.is_some()
    })
    .await;
    assert_eq!(
        node.install_failure().await.as_deref(),
        Some(
            "sequence failed: error running phase 2 in install sequence: task 1/1: failed, lstat /dev/sda: no such file or directory"
        )
    );
    eventually("the node back in maintenance mode", WAIT, || async {
        node.stage().await == Stage::Maintenance && node.is_serving().await
    })
    .await;
    assert!(!node.installed().await);
    assert_ne!(
        node.fingerprint(),
        before,
        "a new boot, a new maintenance certificate"
    );
    // The same config with the disk the machine has installs.
    pinned(&node)
        .await
        .apply_configuration(to_vda(&config).as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted");
    eventually("the install", WAIT, || async { node.installed().await }).await;
    let client = support::admin("bundle-1.13.yaml", &node).await;
    assert_eq!(
        client.machine_status().await.expect("status").stage,
        Stage::Running
    );
    node.stop().await;
}

#[tokio::test]
async fn a_1_14_unattended_install_without_a_matching_disk_stays_pending() {
    let node = SimNode::start_with(addr(32), "v1.14.1", Hardware::vm(32))
        .await
        .expect("start");
    let config = support::golden("1.14-controlplane-flannel-plain.yaml");
    assert!(config.contains(r#"disk.dev_path == "/dev/sda""#));
    pinned(&node)
        .await
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted");
    let client = support::admin("bundle-1.14.yaml", &node).await;
    let status = client
        .unattended_install()
        .await
        .expect("read")
        .expect("1.14 reports the unattended install");
    assert_eq!(
        (status.phase.as_str(), status.error.as_str()),
        ("pending", "no disk matched the selector")
    );
    assert_eq!(
        node.unattended_install().await,
        Some(("pending", "no disk matched the selector".to_owned()))
    );
    assert_eq!(
        client.machine_status().await.expect("status").stage,
        Stage::Booting
    );
    assert!(!node.installed().await);
    let err = client
        .bootstrap(Duration::from_millis(200))
        .await
        .expect_err("the CRI waits for the install");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    // A selector the machine matches, applied live: the controller installs, then reboots.
    client
        .apply_configuration(to_vda(&config).as_bytes(), ApplyMode::NoReboot)
        .await
        .expect("accepted");
    eventually("the install", WAIT, || async { node.installed().await }).await;
    eventually("the installed system running", WAIT, || async {
        node.unattended_install().await == Some(("installed", String::new()))
            && node.stage().await == Stage::Running
    })
    .await;
    node.stop().await;
}

#[tokio::test]
async fn a_pending_install_installs_once_its_disk_is_attached() {
    let node = SimNode::start_with(addr(36), "v1.14.1", Hardware::vm(36))
        .await
        .expect("start");
    node.inject(Fault::DisksDetached(true))
        .await
        .expect("detach");
    let config = to_vda(&support::golden("1.14-controlplane-flannel-plain.yaml"));
    pinned(&node)
        .await
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted");
    let client = support::admin("bundle-1.14.yaml", &node).await;
    let status = client
        .unattended_install()
        .await
        .expect("read")
        .expect("1.14 reports the unattended install");
    assert_eq!(
        (status.phase.as_str(), status.error.as_str()),
        ("pending", "no disk matched the selector")
    );
    assert!(!node.installed().await);
    // The disk attached: Talos's controller watches the disks and installs, then reboots.
    node.inject(Fault::DisksDetached(false))
        .await
        .expect("attach");
    eventually("the install", WAIT, || async { node.installed().await }).await;
    eventually("the installed system running", WAIT, || async {
        node.unattended_install().await == Some(("installed", String::new()))
            && node.stage().await == Stage::Running
    })
    .await;
    node.stop().await;
}

#[tokio::test]
async fn a_dry_run_answers_talos_summary_and_changes_nothing() {
    let node = SimNode::start_with(addr(33), "v1.14.1", Hardware::vm(33))
        .await
        .expect("start");
    let fingerprint = node.fingerprint();
    let config = to_vda(&support::golden("1.14-controlplane-flannel-plain.yaml"));
    let maintenance = pinned(&node).await;
    let (mode, details) = dry_run(&maintenance, &config, Mode::Auto).await;
    assert_eq!(mode, Mode::NoReboot as i32);
    let lines = config.lines().count() + config.matches("\n---\n").count();
    assert!(
        details.starts_with(
            "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n@@ -0,0 +1,"
        ),
        "{details}"
    );
    assert!(
        details.lines().filter(|l| l.starts_with('+')).count() > lines / 2,
        "every line is new"
    );
    // The dry run's reply is the signal: the node handled it, and applied nothing.
    assert_eq!(
        node.calls("ApplyConfiguration"),
        1,
        "the dry run was handled"
    );
    assert_eq!(node.stage().await, Stage::Maintenance, "nothing applied");
    assert_eq!(node.fingerprint(), fingerprint);
    assert!(!node.installed().await);
    // Configured: the same config is no change; a new hostname is one; STAGED is named.
    node.stop().await;
    let node = SimNode::start_configured(addr(34), "v1.14.1", Hardware::vm(34), &config)
        .await
        .expect("start configured");
    let client = support::admin("bundle-1.14.yaml", &node).await;
    let hostname = node.hostname().await;
    let (_, same) = dry_run(&client, &config, Mode::NoReboot).await;
    assert_eq!(
        same,
        "Dry run summary:\nApplied configuration without a reboot (skipped in dry-run).\nConfig diff:\n\nNo changes."
    );
    let renamed = config.replace("auto: stable", "hostname: renamed-node");
    assert_ne!(renamed, config);
    let (mode, changed) = dry_run(&client, &renamed, Mode::Staged).await;
    assert_eq!(mode, Mode::Staged as i32);
    assert!(
        changed.starts_with("Dry run summary:\nStaged configuration to be applied after the next reboot (skipped in dry-run).\nConfig diff:\n\n--- a\n+++ b\n@@ "),
        "{changed}"
    );
    assert!(
        changed.contains("\n-auto: stable\n") && changed.contains("\n+hostname: renamed-node\n"),
        "{changed}"
    );
    assert_eq!(node.hostname().await, hostname, "nothing applied");
    // 1.14 refuses REBOOT before it validates, dry run or not.
    let reply = MachineServiceClient::new(client.channel())
        .apply_configuration(ApplyConfigurationRequest {
            data: renamed.into_bytes(),
            mode: Mode::Reboot as i32,
            dry_run: true,
            try_mode_timeout: None,
        })
        .await
        .expect_err("REBOOT");
    assert_eq!(reply.code(), tonic::Code::Unimplemented);
    assert_eq!(
        reply.message(),
        "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_replaced_board_reports_its_own_uuid_and_keeps_the_config_on_disk() {
    let config = to_vda(&support::golden("1.14-controlplane-flannel-plain.yaml"));
    let node = SimNode::start_configured(addr(35), "v1.14.1", Hardware::vm(35), &config)
        .await
        .expect("start configured");
    let client = support::admin("bundle-1.14.yaml", &node).await;
    let old = client.system_uuid().await.expect("uuid");
    assert_eq!(old, Hardware::vm(35).uuid);
    let new = "5a1a0000-0000-4000-8000-0000000000ff";
    node.replace_board(new).await.expect("replace the board");
    // The same credentials still answer at the same address: only the identity changed.
    let client = support::admin("bundle-1.14.yaml", &node).await;
    assert_eq!(client.system_uuid().await.expect("uuid"), new);
    assert!(node.installed().await, "the disks kept what they held");
    node.stop().await;
}
