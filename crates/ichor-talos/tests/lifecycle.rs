//! Applying a config over the pinned maintenance connection: a control plane comes back
//! configured (mutual TLS with the config's OS CA), a worker waits for trustd, and a node
//! refuses configs it cannot load.

mod support;

use ichor_api::common::Role;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Hardware, SimNode};
use ichor_talos::{ApplyMode, TalosClient, TalosError};
use ichor_testenv::wait::eventually;
use support::{WAIT, bundle, config, credentials};

async fn maintenance_node(version: &str) -> (SimNode, TalosClient) {
    let node = SimNode::start_with(
        "127.0.0.1:0".parse().expect("addr"),
        version,
        Hardware::vm(3),
    )
    .await
    .expect("start");
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("pinned connect");
    (node, client)
}

#[tokio::test]
async fn an_applied_control_plane_comes_back_behind_mutual_tls() {
    let b = bundle();
    let (node, maintenance) = maintenance_node("v1.14.1").await;
    let applied = maintenance
        .apply_configuration(
            config(&b, Role::ControlPlane, "v1.14.1").as_bytes(),
            ApplyMode::Reboot,
        )
        .await
        .expect("apply in maintenance");
    assert_eq!(
        applied.mode, "NO_REBOOT",
        "maintenance maps REBOOT to NO_REBOOT"
    );

    let credentials = credentials(&b, TalosRole::Admin);
    let endpoint = node.addr().to_string();
    eventually("the node to serve mutual TLS", WAIT, || async {
        match TalosClient::connect(&endpoint, &credentials).await {
            Ok(client) => client.version().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    // It answers while the installer still runs; the config carried an
    // UnattendedInstallConfig, so it installs.
    eventually("the install", WAIT, || async { node.installed().await }).await;
    node.stop().await;
}

#[tokio::test]
async fn an_applied_worker_waits_for_trustd() {
    let b = bundle();
    let (node, maintenance) = maintenance_node("v1.14.1").await;
    maintenance
        .apply_configuration(
            config(&b, Role::Worker, "v1.14.1").as_bytes(),
            ApplyMode::Auto,
        )
        .await
        .expect("apply");
    eventually("the worker's API to go away", WAIT, || async {
        !node.is_serving().await
    })
    .await;
    node.stop().await;
}

#[tokio::test]
async fn a_node_refuses_configs_it_cannot_load() {
    let b = bundle();
    let (node, maintenance) = maintenance_node("v1.13.9").await;
    let err = maintenance
        .apply_configuration(
            config(&b, Role::ControlPlane, "v1.14.1").as_bytes(),
            ApplyMode::Auto,
        )
        .await
        .expect_err("a 1.13 node cannot load 1.14 documents");
    match err {
        TalosError::Rpc { status, .. } => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument);
            assert!(
                status.message().contains("not registered"),
                "{}",
                status.message()
            );
        }
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let err = maintenance
        .apply_configuration(b"version: v1alpha1\nmachine: [", ApplyMode::Auto)
        .await
        .expect_err("not YAML");
    assert!(
        matches!(err, TalosError::Rpc { ref status, .. } if status.code() == tonic::Code::InvalidArgument),
        "{err:?}"
    );
    assert!(node.is_serving().await, "a refused config changes nothing");
    node.stop().await;
}
