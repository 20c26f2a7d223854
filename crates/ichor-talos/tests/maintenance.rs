//! The client against a simulated node in maintenance mode: the certificate pin is the only
//! trust, a rebooted node (new certificate) is refused with the fingerprint it showed, and
//! maintenance mode grants only os:reader.

use ichor_sim::SimNode;
use ichor_talos::api::machine::ResetRequest;
use ichor_talos::api::machine::machine_service_client::MachineServiceClient;
use ichor_talos::{TalosClient, TalosError};

async fn node() -> SimNode {
    SimNode::start("127.0.0.1:0".parse().expect("addr"), "v1.14.1")
        .await
        .expect("start a simulated node")
}

#[tokio::test]
async fn a_pinned_maintenance_connection_reads_the_version() {
    let node = node().await;
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect with the right pin");
    assert_eq!(client.version().await.expect("version"), "v1.14.1");
    node.stop().await;
}

#[tokio::test]
async fn a_rebooted_node_is_refused_with_the_fingerprint_it_showed() {
    let node = node().await;
    let pinned = node.fingerprint().to_owned();
    node.reboot().await.expect("reboot");
    let observed = node.fingerprint().to_owned();
    assert_ne!(
        pinned, observed,
        "the maintenance certificate is regenerated on every boot"
    );
    match TalosClient::connect_maintenance(&node.addr().to_string(), &pinned).await {
        Err(TalosError::FingerprintMismatch {
            pinned: p,
            observed: o,
            ..
        }) => {
            assert_eq!(p, pinned);
            assert_eq!(o, observed);
        }
        other => panic!("expected FingerprintMismatch, got {other:?}"),
    }
    let message = TalosClient::connect_maintenance(&node.addr().to_string(), &pinned)
        .await
        .expect_err("still refused")
        .to_string();
    assert!(
        message.contains(&observed) && message.contains(&pinned),
        "{message}"
    );
    TalosClient::connect_maintenance(&node.addr().to_string(), &observed)
        .await
        .expect("the new pin connects");
    node.stop().await;
}

#[tokio::test]
async fn maintenance_mode_refuses_admin_methods() {
    let node = node().await;
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect");
    let mut raw = MachineServiceClient::new(client.channel());
    let status = raw
        .reset(ResetRequest::default())
        .await
        .expect_err("reset needs os:admin");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    node.stop().await;
}

#[tokio::test]
async fn the_inventory_and_stage_are_read_as_os_reader() {
    let hardware = ichor_sim::Hardware::vm(42);
    let node = SimNode::start_with(
        "127.0.0.1:0".parse().expect("addr"),
        "v1.13.9",
        hardware.clone(),
    )
    .await
    .expect("start");
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect");
    let inventory = client.inventory().await.expect("inventory");
    assert_eq!(inventory.uuid, hardware.uuid);
    let disks: Vec<(&str, &str, bool)> = inventory
        .disks
        .iter()
        .map(|d| (d.name.as_str(), d.dev_path.as_str(), d.cdrom))
        .collect();
    assert_eq!(
        disks,
        [("sr0", "/dev/sr0", true), ("vda", "/dev/vda", false)]
    );
    assert_eq!(inventory.disks[1].size, 100_000_000_000);
    assert_eq!(inventory.links.len(), 1);
    assert_eq!(inventory.links[0].name, "eth0");
    assert_eq!(
        inventory.links[0].hardware_addr,
        hardware.links[0].hardware_addr
    );
    let status = client.machine_status().await.expect("machine status");
    assert_eq!(status.stage, ichor_talos::Stage::Maintenance);
    assert!(!status.ready);
    node.stop().await;
}

#[tokio::test]
async fn a_node_presenting_another_certificate_is_refused_with_it() {
    let node = node().await;
    let pinned = node.fingerprint().to_owned();
    let other = node
        .inject(ichor_sim::Fault::DifferentCertificate)
        .await
        .expect("inject");
    match TalosClient::connect_maintenance(&node.addr().to_string(), &pinned).await {
        Err(TalosError::FingerprintMismatch { observed, .. }) => assert_eq!(observed, other),
        other => panic!("expected FingerprintMismatch, got {other:?}"),
    }
    node.stop().await;
}

#[tokio::test]
async fn a_certificate_whose_key_does_not_match_fails_the_handshake() {
    let node = node().await;
    let pinned = node.fingerprint().to_owned();
    // The right certificate, so the pin matches; but the handshake is signed with another key.
    node.inject(ichor_sim::Fault::MismatchedKey)
        .await
        .expect("inject");
    match TalosClient::connect_maintenance(&node.addr().to_string(), &pinned).await {
        Err(TalosError::Connect { .. }) => {}
        other => panic!("expected the handshake to fail, got {other:?}"),
    }
    node.stop().await;
}
