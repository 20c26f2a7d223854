//! Node operations against simulated nodes: workers reaching their API through trustd,
//! forwarding with the `node` key, readiness by CNI, install stages, apply modes on configured
//! nodes, reset (and the empty partition list that bricks), reboot, upgrade, wipe, services,
//! and the run-time faults and gates.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Fault, Hardware, NodeSpec, SimNode, Timings};
use ichor_talos::{ApplyMode, ResetOptions, Stage, TalosClient};
use ichor_testenv::nets::TALOS_OPERATIONS;
use ichor_testenv::wait::eventually;
use support::{NodeConfig, WAIT, admin, bundle_for, credentials, node_config};

fn addr(net: u8, host: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, net, host], 50000))
}

fn cp_config(b: &ichor_render::SecretsBundle, net: u8, cni: &str, version: &str) -> String {
    node_config(
        b,
        &NodeConfig {
            role: Role::ControlPlane,
            talos_version: version,
            endpoint_host: &addr(net, 1).ip().to_string(),
            hostname: Some("cp-1"),
            cni,
            install: true,
        },
    )
}

fn worker_config(b: &ichor_render::SecretsBundle, endpoint: &str) -> String {
    node_config(
        b,
        &NodeConfig {
            role: Role::Worker,
            talos_version: "v1.14.1",
            endpoint_host: endpoint,
            hostname: Some("worker-1"),
            cni: "flannel",
            install: true,
        },
    )
}

async fn configured(net: u8, host: u8, config: &str) -> SimNode {
    SimNode::start_configured(
        addr(net, host),
        "v1.14.1",
        Hardware::vm(u32::from(host)),
        config,
    )
    .await
    .expect("start")
}

/// Waits until `worker` has begun two more attempts at its certificate from trustd than
/// `since` (the second began after the first had ended, so it saw the cluster as it was when
/// `since` was read), or has its API (and tries no more).
async fn two_more_trustd_attempts(worker: &SimNode, since: usize) {
    eventually("two more trustd attempts", WAIT, || async {
        worker.trustd_attempts() >= since + 2 || worker.is_serving().await
    })
    .await;
}

#[tokio::test]
async fn a_worker_gets_its_api_only_after_bootstrap_through_the_endpoint_with_its_token() {
    let b = bundle_for(40);
    let cp = configured(
        TALOS_OPERATIONS.net(0),
        1,
        &cp_config(&b, TALOS_OPERATIONS.net(0), "flannel", "v1.14.1"),
    )
    .await;
    let worker = configured(
        TALOS_OPERATIONS.net(0),
        2,
        &worker_config(&b, &TALOS_OPERATIONS.ip(0, 1).to_string()),
    )
    .await;
    let mut wrong_token = b.clone();
    wrong_token.trustd_info.token = ichor_render::bundle::Secret("abcdef.0123456789abcdef".into());
    let stranger = configured(
        TALOS_OPERATIONS.net(0),
        3,
        &worker_config(&wrong_token, &TALOS_OPERATIONS.ip(0, 1).to_string()),
    )
    .await;
    let lost = configured(
        TALOS_OPERATIONS.net(0),
        4,
        &worker_config(&b, &TALOS_OPERATIONS.ip(0, 99).to_string()),
    )
    .await;

    two_more_trustd_attempts(&worker, worker.trustd_attempts()).await;
    assert!(
        !worker.is_serving().await,
        "no API before the cluster is bootstrapped"
    );

    let cp_client = admin(&b, cp.addr()).await;
    cp_client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    let worker_client = admin(&b, worker.addr()).await;
    assert_eq!(
        worker_client.hostname().await.expect("hostname"),
        "worker-1"
    );
    let err = worker_client
        .etcd_members(false)
        .await
        .expect_err("etcd lives on control planes");
    assert_eq!(err.code(), Some(tonic::Code::Unimplemented), "{err}");

    // The cluster is bootstrapped and trustd answers (the worker got its API).
    let (stranger_since, lost_since) = (stranger.trustd_attempts(), lost.trustd_attempts());
    two_more_trustd_attempts(&stranger, stranger_since).await;
    two_more_trustd_attempts(&lost, lost_since).await;
    assert!(!stranger.is_serving().await, "trustd refuses a wrong token");
    assert!(
        !lost.is_serving().await,
        "a wrong endpoint leaves a worker without an API"
    );
    for node in [cp, worker, stranger, lost] {
        node.stop().await;
    }
}

#[tokio::test]
async fn calls_are_forwarded_with_the_node_key_and_refused_in_maintenance() {
    let b = bundle_for(41);
    let cp1 = configured(
        TALOS_OPERATIONS.net(1),
        1,
        &cp_config(&b, TALOS_OPERATIONS.net(1), "flannel", "v1.14.1"),
    )
    .await;
    let config2 = node_config(
        &b,
        &NodeConfig {
            role: Role::ControlPlane,
            talos_version: "v1.14.1",
            endpoint_host: &TALOS_OPERATIONS.ip(1, 1).to_string(),
            hostname: Some("cp-2"),
            cni: "flannel",
            install: true,
        },
    );
    let cp2 = configured(TALOS_OPERATIONS.net(1), 2, &config2).await;
    let maintenance = SimNode::start(addr(TALOS_OPERATIONS.net(1), 3), "v1.14.1")
        .await
        .expect("start");

    let through = admin(&b, cp1.addr())
        .await
        .for_node(&TALOS_OPERATIONS.ip(1, 2).to_string());
    assert_eq!(through.hostname().await.expect("forwarded"), "cp-2");
    let by_name = admin(&b, cp1.addr()).await.for_node("cp-2");
    assert_eq!(by_name.hostname().await.expect("by hostname"), "cp-2");

    let reader = TalosClient::connect(&cp1.addr().to_string(), &credentials(&b, TalosRole::Reader))
        .await
        .expect("connect");
    let err = reader
        .for_node(&TALOS_OPERATIONS.ip(1, 2).to_string())
        .reboot()
        .await
        .expect_err("the caller's role travels with the call");
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied), "{err}");

    let pinned = TalosClient::connect_maintenance(
        &maintenance.addr().to_string(),
        &maintenance.fingerprint(),
    )
    .await
    .expect("pinned");
    let err = pinned
        .for_node(&TALOS_OPERATIONS.ip(1, 1).to_string())
        .version()
        .await
        .expect_err("maintenance mode does not forward");
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied));
    assert!(err.to_string().contains("no request forwarding"), "{err}");
    for node in [cp1, cp2, maintenance] {
        node.stop().await;
    }
}

#[tokio::test]
async fn ready_needs_a_cni() {
    let b = bundle_for(42);
    let cp = configured(
        TALOS_OPERATIONS.net(2),
        1,
        &cp_config(&b, TALOS_OPERATIONS.net(2), "none", "v1.14.1"),
    )
    .await;
    let client = admin(&b, cp.addr()).await;
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    let status = client.machine_status().await.expect("status");
    assert_eq!(status.stage, Stage::Running);
    assert!(!status.ready, "CNI none: the kubelet never reports Ready");
    assert!(
        status.unmet.iter().any(|(name, _)| name == "nodeReady"),
        "{status:?}"
    );
    cp.set_cni(true).await.expect("install a CNI");
    let status = client.machine_status().await.expect("status");
    assert!(status.ready, "{status:?}");
    cp.stop().await;
}

#[tokio::test]
async fn install_stages_per_version() {
    let b = bundle_for(43);
    let timings = Timings {
        install: Duration::from_millis(600),
        ..Timings::default()
    };
    for (host, version) in [(1u8, "v1.13.9"), (2u8, "v1.14.1")] {
        let node = SimNode::spawn(NodeSpec {
            timings,
            hardware: Hardware::vm(u32::from(host)),
            ..NodeSpec::new(addr(TALOS_OPERATIONS.net(3), host), version)
        })
        .await
        .expect("start");
        let pinned =
            TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
                .await
                .expect("pinned");
        assert_eq!(pinned.unattended_install().await.expect("read"), None);
        pinned
            .apply_configuration(
                cp_config(&b, TALOS_OPERATIONS.net(3), "flannel", version).as_bytes(),
                ApplyMode::Auto,
            )
            .await
            .expect("apply");
        // The config is in: the configured API serves while the installer runs, 1.13 in
        // stage installing, 1.14 booting with its unattended install phase installing.
        let client = admin(&b, node.addr()).await;
        let stage = if version == "v1.14.1" {
            Stage::Booting
        } else {
            Stage::Installing
        };
        eventually("the install stage", WAIT, || async {
            client
                .machine_status()
                .await
                .is_ok_and(|s| s.stage == stage)
        })
        .await;
        if version == "v1.14.1" {
            let install = client
                .unattended_install()
                .await
                .expect("read")
                .expect("1.14 reports the unattended install");
            assert_eq!(install.phase, "installing");
        }
        eventually("installed", WAIT, || async { node.installed().await }).await;
        let client = admin(&b, node.addr()).await;
        eventually("running", WAIT, || async {
            client
                .machine_status()
                .await
                .is_ok_and(|s| s.stage == Stage::Running)
        })
        .await;
        if version == "v1.14.1" {
            let install = client
                .unattended_install()
                .await
                .expect("read")
                .expect("status");
            assert_eq!(install.phase, "installed", "after the reboot");
        }
        node.stop().await;
    }
}

#[tokio::test]
async fn apply_modes_on_configured_nodes_follow_the_version() {
    let b = bundle_for(44);
    let cp14 = configured(
        TALOS_OPERATIONS.net(4),
        1,
        &cp_config(&b, TALOS_OPERATIONS.net(4), "flannel", "v1.14.1"),
    )
    .await;
    let client = admin(&b, cp14.addr()).await;
    let config = cp_config(&b, TALOS_OPERATIONS.net(4), "flannel", "v1.14.1");
    let err = client
        .apply_configuration(config.as_bytes(), ApplyMode::Reboot)
        .await
        .expect_err("1.14 refuses REBOOT");
    assert_eq!(err.code(), Some(tonic::Code::Unimplemented));
    let applied = client
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("auto");
    assert_eq!(applied.mode, "NO_REBOOT", "1.14 resolves AUTO to NO_REBOOT");
    let staged = client
        .apply_configuration(config.as_bytes(), ApplyMode::Staged)
        .await
        .expect("staged");
    assert_eq!(staged.mode, "STAGED");
    let err = client
        .apply_configuration(
            b"version: v1alpha1\nmachine: {type: bogus}\n",
            ApplyMode::Auto,
        )
        .await
        .expect_err("invalid");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    let worker = worker_config(&b, &TALOS_OPERATIONS.ip(4, 1).to_string());
    let err = client
        .apply_configuration(worker.as_bytes(), ApplyMode::Auto)
        .await
        .expect_err("the machine type is fixed");
    assert_eq!(err.code(), Some(tonic::Code::InvalidArgument), "{err}");
    let reader = TalosClient::connect(
        &cp14.addr().to_string(),
        &credentials(&b, TalosRole::Reader),
    )
    .await
    .expect("connect");
    let err = reader
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect_err("admin only once configured");
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied));
    cp14.stop().await;
}

#[tokio::test]
async fn a_dry_run_tells_whether_the_node_runs_a_config_and_changes_nothing() {
    let b = bundle_for(44);
    let config = cp_config(&b, TALOS_OPERATIONS.net(4), "flannel", "v1.14.1");
    let node = configured(TALOS_OPERATIONS.net(4), 2, &config).await;
    let client = admin(&b, node.addr()).await;
    assert!(
        client
            .runs_config(config.as_bytes())
            .await
            .expect("dry run"),
        "the config it booted with"
    );
    let other = cp_config(&b, TALOS_OPERATIONS.net(4), "none", "v1.14.1");
    assert!(
        !client.runs_config(other.as_bytes()).await.expect("dry run"),
        "another config"
    );
    assert_eq!(node.config_applies(), 0, "a dry run changes nothing");
    client
        .apply_configuration(other.as_bytes(), ApplyMode::NoReboot)
        .await
        .expect("apply");
    assert_eq!(node.config_applies(), 1);
    assert!(client.runs_config(other.as_bytes()).await.expect("dry run"));
    node.stop().await;
}

#[tokio::test]
async fn reset_returns_to_maintenance_and_an_empty_partition_list_bricks() {
    let b = bundle_for(45);
    let cp = configured(
        TALOS_OPERATIONS.net(5),
        1,
        &cp_config(&b, TALOS_OPERATIONS.net(5), "flannel", "v1.14.1"),
    )
    .await;
    let client = admin(&b, cp.addr()).await;
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    let configured_fingerprint = cp.fingerprint();
    client
        .reset(ResetOptions {
            graceful: false,
            reboot: true,
        })
        .await
        .expect("reset");
    eventually("maintenance mode", WAIT, || async {
        cp.fingerprint() != configured_fingerprint
            && TalosClient::connect_maintenance(&cp.addr().to_string(), &cp.fingerprint())
                .await
                .is_ok()
    })
    .await;
    let pinned = TalosClient::connect_maintenance(&cp.addr().to_string(), &cp.fingerprint())
        .await
        .expect("pinned");
    assert_eq!(
        pinned.machine_status().await.expect("status").stage,
        Stage::Maintenance
    );
    assert_eq!(
        cp.etcd_member_id().await,
        None,
        "EPHEMERAL held the etcd data"
    );
    cp.stop().await;

    // Talos's own request with no partitions named: everything is wiped.
    let doomed = configured(
        TALOS_OPERATIONS.net(5),
        2,
        &cp_config(&b, TALOS_OPERATIONS.net(5), "flannel", "v1.14.1"),
    )
    .await;
    let client = admin(&b, doomed.addr()).await;
    ichor_talos::api::machine::machine_service_client::MachineServiceClient::new(client.channel())
        .reset(ichor_talos::api::machine::ResetRequest {
            graceful: false,
            reboot: true,
            ..Default::default()
        })
        .await
        .expect("reset with an empty list");
    eventually("silence", WAIT, || async { !doomed.is_serving().await }).await;
    // The power cycle returns once the node has booted as far as it can (a node with something
    // to boot is serving by then): the positive signal that it had its chance.
    doomed.reboot().await.expect("power cycle");
    assert!(!doomed.is_serving().await, "nothing left to boot");
    doomed.stop().await;
}

#[tokio::test]
async fn reboot_and_upgrade_through_the_lifecycle_service() {
    let b = bundle_for(46);
    let cp = configured(46, 1, &cp_config(&b, 46, "flannel", "v1.14.1")).await;
    let client = admin(&b, cp.addr()).await;
    let image = "ghcr.io/siderolabs/installer:v1.14.2";
    let err = client.upgrade(image).await.expect_err("not pulled");
    assert_eq!(err.code(), Some(tonic::Code::Internal), "{err}");
    assert!(
        err.to_string().contains("not found in containerd store"),
        "{err}"
    );
    assert_eq!(client.pull_image(image).await.expect("pull"), image);
    client.upgrade(image).await.expect("upgrade");
    // The upgrade installs to disk; the node runs the new version after the reboot the
    // caller asks for (talos-facts §10.9).
    assert_eq!(client.version().await.expect("version"), "v1.14.1");
    client.reboot().await.expect("reboot into the upgrade");
    eventually("the new version", WAIT, || async {
        cp.talos_version() == "v1.14.2"
            && TalosClient::connect(&cp.addr().to_string(), &credentials(&b, TalosRole::Admin))
                .await
                .is_ok()
    })
    .await;
    let client = admin(&b, cp.addr()).await;
    assert_eq!(client.version().await.expect("version"), "v1.14.2");

    cp.inject(Fault::UpgradeRollback(true))
        .await
        .expect("fault");
    let next = "ghcr.io/siderolabs/installer:v1.14.3";
    client.pull_image(next).await.expect("pull");
    client.upgrade(next).await.expect("upgrade accepted");
    client.reboot().await.expect("reboot into the upgrade");
    eventually("the reboot", WAIT, || async { !cp.is_serving().await }).await;
    let client = admin(&b, cp.addr()).await;
    assert_eq!(
        client.version().await.expect("version"),
        "v1.14.2",
        "the upgrade came back on the old version"
    );

    client.reboot().await.expect("reboot");
    eventually("down", WAIT, || async { !cp.is_serving().await }).await;
    let client = admin(&b, cp.addr()).await;
    assert_eq!(client.hostname().await.expect("hostname"), "cp-1");
    cp.stop().await;
}

#[tokio::test]
async fn wipe_in_maintenance_and_services() {
    let node = SimNode::start(addr(47, 1), "v1.14.1").await.expect("start");
    let pinned = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("pinned");
    pinned
        .wipe(&["vda"])
        .await
        .expect("os:reader may wipe in maintenance");
    let err = pinned.wipe(&["nvme9n9"]).await.expect_err("no such device");
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");
    let services = pinned.services().await.expect("services");
    assert!(services.iter().any(|s| s.id == "apid" && s.healthy));
    assert!(
        !services.iter().any(|s| s.id == "etcd"),
        "no etcd in maintenance"
    );
    node.stop().await;
}

#[tokio::test]
async fn partitions_slowness_and_gates() {
    let b = bundle_for(48);
    let cp = configured(48, 1, &cp_config(&b, 48, "flannel", "v1.14.1")).await;
    let client = admin(&b, cp.addr()).await;

    cp.inject(Fault::Partition).await.expect("partition");
    let hung = tokio::time::timeout(Duration::from_millis(300), client.version()).await;
    assert!(hung.is_err(), "a partitioned node never answers");
    cp.inject(Fault::Heal).await.expect("heal");
    client.version().await.expect("answers again");

    cp.inject(Fault::Slow(Duration::from_millis(300)))
        .await
        .expect("slow");
    let started = std::time::Instant::now();
    client.version().await.expect("slow answer");
    assert!(started.elapsed() >= Duration::from_millis(300));
    cp.inject(Fault::Slow(Duration::ZERO)).await.expect("fast");

    let gate = cp.gate("Bootstrap");
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.bootstrap(Duration::from_secs(5)).await }
    });
    gate.arrived(1).await;
    assert_eq!(cp.calls("Bootstrap"), 0, "its handler has not run");
    assert!(!call.is_finished(), "held at the gate");
    assert_eq!(cp.etcd_member_id().await, None);
    gate.release();
    call.await.expect("join").expect("bootstrap after the gate");
    assert!(cp.etcd_member_id().await.is_some());

    cp.stop().await;
}

#[tokio::test]
async fn a_reply_gate_holds_the_answer_after_the_node_acted() {
    let b = bundle_for(49);
    let cp = configured(49, 1, &cp_config(&b, 49, "flannel", "v1.14.1")).await;
    let client = admin(&b, cp.addr()).await;
    // A Bootstrap refused inside the not-ready window would reach the reply gate too.
    eventually("bootstrap available", WAIT, || async {
        cp.bootstrap_available().await
    })
    .await;
    let gate = cp.gate_reply("Bootstrap");
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.bootstrap(Duration::from_secs(5)).await }
    });
    gate.arrived(1).await;
    assert!(
        cp.etcd_member_id().await.is_some(),
        "the bootstrap happened"
    );
    assert!(!call.is_finished(), "its reply is held");
    gate.release();
    assert_eq!(
        call.await.expect("join").expect("bootstrap"),
        ichor_talos::Bootstrapped::Now
    );
    cp.stop().await;
}
