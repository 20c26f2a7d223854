//! How many configs per second the renderer produces: a contract-1.14 control plane with a
//! typed-document patch and a v1alpha1 patch, from the golden test bundle. Run with `cargo xtask bench render`,
//! which also measures Talos's own generator on the same inputs.
//!
//! Beside it, the pure work of one machine reconcile over a hostile object: a config rendered
//! for a `diskSelector` with many stars, checked against a node that reports long non-ASCII
//! disk models (the glob once backtracked exponentially and sliced by byte there).

use std::collections::BTreeMap;

use criterion::{Criterion, criterion_group, criterion_main};
use ichor_api::cluster::TalosClusterSpec;
use ichor_api::common::DiskSelector;
use ichor_api::common::{InstallSpec, Role};
use ichor_api::config::ConfigPatch;
use ichor_api::machine::{DiskInfo, HardwareInventory};
use ichor_render::{RenderInput, SecretsBundle, hardware, render};
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
        schematic: None,
        oldest_running: None,
        kubernetes: None,
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

/// Render and hardware check for a selector built to be slow: 24 stars before a `b` that no
/// model has, against 16 disks whose 256-character models start with a multi-byte character.
fn hostile(c: &mut Criterion) {
    let bundle = SecretsBundle::from_yaml(include_str!("../tests/golden/bundle-1.14.yaml"))
        .expect("the test bundle");
    let stars = "*a".repeat(24) + "b";
    let inventory = HardwareInventory {
        disks: (0..16)
            .map(|i| DiskInfo {
                name: format!("sd{i}"),
                dev_path: format!("/dev/sd{i}"),
                size: 500_000_000_000,
                model: Some(format!("ø{}", "a".repeat(254))),
                serial: Some(format!("ß{}", "a".repeat(254))),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let empty = BTreeMap::new();
    for (name, version, selector) in [
        (
            "hostile_selector_1_13",
            "v1.13.4",
            DiskSelector {
                model: Some(stars.clone()),
                serial: Some(stars.clone()),
                ..Default::default()
            },
        ),
        (
            "hostile_selector_1_14",
            "v1.14.1",
            DiskSelector {
                match_: Some(format!(
                    "glob({stars:?}, disk.model) || glob({stars:?}, disk.serial)"
                )),
                ..Default::default()
            },
        ),
    ] {
        let spec: TalosClusterSpec = serde_json::from_value(json!({
            "talosVersion": version,
            "kubernetesVersion": "1.36.3",
            "endpoint": "https://192.168.10.5:6443",
            "controlPlane": {"count": 3}
        }))
        .expect("spec");
        let install = InstallSpec {
            disk_selector: Some(selector),
            ..Default::default()
        };
        let input = RenderInput {
            cluster_name: "lab",
            cluster: &spec,
            role: Role::Worker,
            hostname: None,
            install: Some(&install),
            schematic: None,
            oldest_running: None,
            kubernetes: None,
            cert_sans: &[],
            node_labels: &empty,
            node_taints: &empty,
            patches: &[],
            bundle: &bundle,
        };
        c.bench_function(name, |b| {
            b.iter(|| {
                let rendered = render(std::hint::black_box(&input)).expect("render");
                // No disk matches: the check must say so, quickly.
                hardware::check(&rendered, std::hint::black_box(&inventory))
                    .expect_err("no disk matches the hostile selector")
            })
        });
    }
}

criterion_group!(benches, bench, hostile);
criterion_main!(benches);
