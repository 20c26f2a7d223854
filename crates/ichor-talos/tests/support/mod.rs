//! Shared fixtures: the test bundle, rendered configs, client credentials.

#![allow(dead_code)]

use std::time::Duration;

use ichor_api::TalosCluster;
use ichor_api::common::{InstallSpec, Role};
use ichor_render::pki::{self, Role as TalosRole};
use ichor_render::{RenderInput, SecretsBundle, render};
use ichor_talos::Credentials;

/// How long the simulated nodes get for what a test waits for.
pub const WAIT: Duration = Duration::from_secs(10);

/// The renderer's fixed test bundle (contract 1.14).
pub fn bundle() -> SecretsBundle {
    SecretsBundle::from_yaml(include_str!(
        "../../../ichor-render/tests/golden/bundle-1.14.yaml"
    ))
    .expect("the test bundle")
}

/// The test bundle with a cluster identity of its own: nodes of one cluster identity find
/// each other (as through the discovery service), so each test's cluster gets its own.
pub fn bundle_for(cluster: u8) -> SecretsBundle {
    use base64::Engine as _;
    let mut b = bundle();
    let id = base64::engine::general_purpose::STANDARD.encode([cluster; 32]);
    b.cluster.id = ichor_render::bundle::Secret(id.clone());
    b.cluster.secret = ichor_render::bundle::Secret(id);
    b
}

/// Another bundle: a different OS CA.
pub fn other_bundle() -> SecretsBundle {
    SecretsBundle::from_yaml(include_str!(
        "../../../ichor-render/tests/golden/bundle-1.13.yaml"
    ))
    .expect("the other test bundle")
}

/// A rendered config for `role` on `talos_version`, installing to `/dev/vda`, with the
/// endpoint on `127.0.0.1`.
pub fn config(bundle: &SecretsBundle, role: Role, talos_version: &str) -> String {
    node_config(
        bundle,
        &NodeConfig {
            role,
            talos_version,
            endpoint_host: "127.0.0.1",
            hostname: None,
            cni: "flannel",
            install: true,
        },
    )
}

/// Credentials with `role`, from the bundle's OS CA.
pub fn credentials(bundle: &SecretsBundle, role: TalosRole) -> Credentials {
    let issued = pki::client_certificate(bundle, "ichor", role, Duration::from_secs(3600))
        .expect("client certificate");
    Credentials {
        ca_pem: bundle.certs.os.crt.0.clone(),
        cert_pem: issued.cert_pem,
        key_pem: issued.key_pem,
    }
}

/// How a node of a test cluster is rendered.
pub struct NodeConfig<'a> {
    /// The role.
    pub role: Role,
    /// The Talos version (selects the contract).
    pub talos_version: &'a str,
    /// The control-plane endpoint's host (an IP of a simulated control plane).
    pub endpoint_host: &'a str,
    /// The hostname.
    pub hostname: Option<&'a str>,
    /// The CNI preset: `flannel`, `cilium` or `none`.
    pub cni: &'a str,
    /// Install to `/dev/vda`.
    pub install: bool,
}

/// A rendered config for one node of a test cluster.
pub fn node_config(bundle: &SecretsBundle, node: &NodeConfig<'_>) -> String {
    let spec = TalosCluster::test("lab")
        .talos(node.talos_version)
        .endpoint(&format!("https://{}:6443", node.endpoint_host))
        .control_planes(3)
        .cni(node.cni.parse().expect("a CNI preset"))
        .spec();
    let install = InstallSpec {
        disk: Some("/dev/vda".into()),
        ..Default::default()
    };
    render(&RenderInput {
        hostname: node.hostname,
        install: node.install.then_some(&install),
        schematic: None,
        oldest_running: None,
        kubernetes: None,
        ..RenderInput::plain("lab", &spec, node.role, bundle)
    })
    .expect("render")
    .yaml
}

/// An admin client for a configured node, once it answers with mutual TLS.
pub async fn admin(bundle: &SecretsBundle, addr: std::net::SocketAddr) -> ichor_talos::TalosClient {
    let credentials = credentials(bundle, TalosRole::Admin);
    let endpoint = addr.to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(client) = ichor_talos::TalosClient::connect(&endpoint, &credentials).await
            && client.version().await.is_ok()
        {
            return client;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{endpoint} never answered with mutual TLS"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
