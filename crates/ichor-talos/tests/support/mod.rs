//! Shared fixtures: the test bundle, rendered configs, client credentials.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::cluster::TalosClusterSpec;
use ichor_api::common::{InstallSpec, Role};
use ichor_render::pki::{self, Role as TalosRole};
use ichor_render::{RenderInput, SecretsBundle, render};
use ichor_talos::Credentials;

/// The renderer's fixed test bundle (contract 1.14).
pub fn bundle() -> SecretsBundle {
    SecretsBundle::from_yaml(include_str!(
        "../../../ichor-render/tests/golden/bundle-1.14.yaml"
    ))
    .expect("the test bundle")
}

/// Another bundle: a different OS CA.
pub fn other_bundle() -> SecretsBundle {
    SecretsBundle::from_yaml(include_str!(
        "../../../ichor-render/tests/golden/bundle-1.13.yaml"
    ))
    .expect("the other test bundle")
}

/// A rendered config for `role` on `talos_version`, installing to `/dev/vda`.
pub fn config(bundle: &SecretsBundle, role: Role, talos_version: &str) -> String {
    let spec: TalosClusterSpec = serde_json::from_value(serde_json::json!({
        "talosVersion": talos_version,
        "kubernetesVersion": "1.36.3",
        "endpoint": "https://127.0.0.1:6443",
        "controlPlane": {"count": 1}
    }))
    .expect("spec");
    let install = InstallSpec {
        disk: Some("/dev/vda".into()),
        ..Default::default()
    };
    let empty = BTreeMap::new();
    render(&RenderInput {
        cluster_name: "lab",
        cluster: &spec,
        role,
        hostname: None,
        install: Some(&install),
        cert_sans: &[],
        node_labels: &empty,
        node_taints: &empty,
        patches: &[],
        bundle,
    })
    .expect("render")
    .yaml
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
