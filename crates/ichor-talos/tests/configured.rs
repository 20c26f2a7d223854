//! The client against a simulated configured node: mutual TLS with the applied config's OS
//! CA, roles from the client certificate, other CAs refused.

mod support;

use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::SecretsBundle;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Hardware, SimNode};
use ichor_talos::TalosClient;
use ichor_talos::api::machine::ResetRequest;
use ichor_talos::api::machine::machine_service_client::MachineServiceClient;
use support::{bundle, config, credentials, other_bundle};

async fn control_plane(bundle: &SecretsBundle) -> SimNode {
    SimNode::start_configured(
        "127.0.0.1:0".parse().expect("addr"),
        "v1.14.1",
        Hardware::vm(7),
        &config(bundle, Role::ControlPlane, "v1.14.1"),
    )
    .await
    .expect("start a configured node")
}

#[tokio::test]
async fn an_admin_certificate_from_the_os_ca_reaches_a_configured_node() {
    let b = bundle();
    let node = control_plane(&b).await;
    let client = TalosClient::connect(&node.addr().to_string(), &credentials(&b, TalosRole::Admin))
        .await
        .expect("mTLS connect");
    assert_eq!(client.version().await.expect("version"), "v1.14.1");
    node.stop().await;
}

#[tokio::test]
async fn roles_are_enforced_per_method() {
    let b = bundle();
    let node = control_plane(&b).await;
    let reader = TalosClient::connect(
        &node.addr().to_string(),
        &credentials(&b, TalosRole::Reader),
    )
    .await
    .expect("mTLS connect");
    reader
        .version()
        .await
        .expect("a reader may read the version");
    let status = MachineServiceClient::new(reader.channel())
        .reset(ResetRequest::default())
        .await
        .expect_err("reset needs os:admin");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "not authorized",
        "machined's refusal (talos-facts §10.6)"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_client_certificate_from_another_ca_is_refused() {
    let b = bundle();
    let node = control_plane(&b).await;
    let other = other_bundle();
    let mut wrong = credentials(&other, TalosRole::Admin);
    // Trust the node's real CA, but present a certificate it did not sign.
    wrong.ca_pem = b.certs.os.crt.0.clone();
    let result = match TalosClient::connect(&node.addr().to_string(), &wrong).await {
        Ok(client) => client.version().await.map(drop),
        Err(error) => Err(error),
    };
    assert!(
        result.is_err(),
        "a foreign client certificate must not be served"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_maintenance_client_cannot_talk_to_a_configured_node_without_credentials() {
    let b = bundle();
    let node = control_plane(&b).await;
    let result =
        match TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint()).await
        {
            Ok(client) => client.version().await.map(drop),
            Err(error) => Err(error),
        };
    assert!(
        result.is_err(),
        "a configured node requires a client certificate"
    );
    node.stop().await;
}

#[tokio::test]
async fn discovery_classifies_a_configured_node_without_reading_it() {
    let b = bundle();
    let node = control_plane(&b).await;
    let config = ichor_talos::discovery::SweepConfig {
        port: node.addr().port(),
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let outcome = ichor_talos::discovery::probe("127.0.0.1".parse().expect("ip"), config).await;
    match outcome {
        Some(ichor_talos::discovery::ProbeOutcome::Configured { fingerprint }) => {
            assert_eq!(fingerprint, node.fingerprint());
        }
        other => panic!("expected Configured, got {other:?}"),
    }
    node.stop().await;
}
