//! How many configs per second the renderer produces: a contract-1.14 control plane with a
//! typed-document patch and a v1alpha1 patch, from the golden test bundle. Run with `cargo xtask bench render`,
//! which also measures Talos's own generator on the same inputs.

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_api::cluster::TalosClusterSpec;
use ichor_api::common::{InstallSpec, Role};
use ichor_api::config::ConfigPatch;
use ichor_render::{RenderInput, SecretsBundle, render};
use serde_json::json;

fn bench(c: &mut Criterion) {
    let bundle_yaml = include_str!("../tests/golden/bundle-1.14.yaml");
    let bundle = SecretsBundle::from_yaml(bundle_yaml).expect("the test bundle");
    let spec: TalosClusterSpec = serde_json::from_value(json!({
        "talosVersion": "v1.14.1",
        "kubernetesVersion": "1.36.3",
        "endpoint": "https://192.168.10.5:6443",
        "controlPlane": {"count": 3}
    }))
    .expect("spec");
    let install = InstallSpec {
        disk: Some("/dev/sda".into()),
        ..Default::default()
    };
    let patches: Vec<ConfigPatch> = serde_json::from_value(json!([
        {"documents": {"TimeSyncConfig": {"ntp": {"servers": ["time.cloudflare.com"]}}}},
        {"machine": {"certSANs": ["node.lab.internal"]}}
    ]))
    .expect("patches");
    let empty = BTreeMap::new();
    let input = RenderInput {
        cluster_name: "lab",
        cluster: &spec,
        role: Role::ControlPlane,
        hostname: None,
        install: Some(&install),
        cert_sans: &[],
        node_labels: &empty,
        node_taints: &empty,
        patches: &[&patches],
        bundle: &bundle,
    };
    c.bench_function("render_controlplane_1_14", |b| {
        b.iter(|| render(std::hint::black_box(&input)).expect("render"))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
