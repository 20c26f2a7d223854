//! Our bundles and configs against Talos's own code (fingerprints: ichor-talos's
//! `tests/talos_client.rs`) (the oracles under
//! `tools/talos-oracle-*`, built by `cargo xtask oracles`).

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::cluster::CniPreset;
use ichor_api::common::{InstallSpec, Role};
use ichor_render::bundle::Secret;
use ichor_render::{Contract, RenderInput, SecretsBundle, pki, render};
use serde_json::{Value, json};
use support::{Case, bundle, bundle_yaml, cluster_spec, run_oracle};

const CONTRACTS: [Contract; 2] = [Contract::V1_13, Contract::V1_14];

#[test]
fn talos_loads_and_validates_the_bundles_we_generate() {
    for contract in CONTRACTS {
        let generated = SecretsBundle::generate(contract).expect("generate");
        let yaml = generated.to_yaml().expect("yaml");
        let (ok, out) = run_oracle(contract, &["bundle"], yaml.as_bytes());
        assert!(ok, "{contract:?}: Talos refuses our bundle: {out}");
    }
    // The oracle can say no: a bundle with a malformed token is refused.
    let mut broken = bundle(Contract::V1_14);
    broken.certs.os.crt = ichor_render::bundle::Pem("not a certificate".into());
    broken.trustd_info.token = Secret("x".into());
    let yaml = broken.to_yaml().expect("yaml");
    let (ok, _) = run_oracle(Contract::V1_14, &["bundle"], yaml.as_bytes());
    assert!(!ok, "Talos must refuse a broken bundle");
}

#[test]
fn we_parse_and_validate_bundles_talos_generates() {
    for contract in CONTRACTS {
        let (ok, yaml) = run_oracle(contract, &["secrets"], b"");
        assert!(ok, "{contract:?}: {yaml}");
        let parsed = SecretsBundle::from_yaml(&yaml)
            .unwrap_or_else(|e| panic!("{contract:?}: a talosctl-made bundle parses: {e}"));
        // And we can sign with its CAs.
        pki::client_certificate(&parsed, "ichor", pki::Role::Admin, Duration::from_secs(60))
            .expect("sign with Talos's OS CA");
        ichor_render::credentials::admin_kubeconfig(&parsed, "lab", "https://10.0.0.1:6443")
            .expect("sign with Talos's Kubernetes CA");
    }
}

/// Talos patches that make its generator match a CNI preset / kube-proxy setting.
fn talos_patches(case: &Case) -> Vec<String> {
    let cp = case.role == Role::ControlPlane;
    match (case.contract, case.cni) {
        (_, CniPreset::Flannel) => vec![],
        (Contract::V1_13, CniPreset::None) => {
            vec!["cluster:\n  network:\n    cni:\n      name: none\n".into()]
        }
        (Contract::V1_13, CniPreset::Cilium) if cp => vec![
            "cluster:\n  network:\n    cni:\n      name: none\n  proxy:\n    disabled: true\n"
                .into(),
        ],
        (Contract::V1_13, CniPreset::Cilium) => {
            vec!["cluster:\n  network:\n    cni:\n      name: none\n".into()]
        }
        (Contract::V1_14, _) if !cp => vec![],
        (Contract::V1_14, CniPreset::None) => {
            vec!["apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n".into()]
        }
        (Contract::V1_14, CniPreset::Cilium) => vec![
            "apiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\n$patch: delete\n".into(),
            "apiVersion: v1alpha1\nkind: KubeProxyConfig\nenabled: false\n".into(),
        ],
    }
}

/// The identity of a document in a stream: its kind (or `v1alpha1`) and name.
fn key(document: &Value) -> String {
    match document["kind"].as_str() {
        Some(kind) => format!("{kind}/{}", document["name"].as_str().unwrap_or_default()),
        None => "v1alpha1".into(),
    }
}

fn parse_stream(yaml: &str) -> BTreeMap<String, Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("a YAML stream");
    docs.into_iter().map(|d| (key(&d), d)).collect()
}

/// Differences from Talos's generator that are on purpose, removed before comparing.
fn drop_intended_differences(contract: Contract, ours: &mut BTreeMap<String, Value>) {
    if contract == Contract::V1_14
        && let Some(install) = ours.get_mut("UnattendedInstallConfig/")
    {
        // Ichor asks for the reboot explicitly (talos-facts §8.2); Talos's generator leaves it
        // implied by `installer.image`.
        install.as_object_mut().expect("object").remove("reboot");
    }
}

#[test]
fn talos_generator_agrees_with_our_configs() {
    let mut mismatches = Vec::new();
    for case in support::cases().into_iter().filter(|c| !c.patched) {
        let b = bundle(case.contract);
        let spec = cluster_spec(&case);
        let install = InstallSpec {
            disk: Some("/dev/sda".into()),
            ..Default::default()
        };
        let empty = BTreeMap::new();
        let ours = render(&RenderInput {
            cluster_name: "lab",
            cluster: &spec,
            role: case.role,
            hostname: None,
            install: Some(&install),
            cert_sans: &[],
            node_labels: &empty,
            node_taints: &empty,
            patches: &[],
            bundle: &b,
        })
        .expect("render");
        let installer = ours.documents.iter().find_map(|d| {
            d["installer"]["image"]
                .as_str()
                .or(d["machine"]["install"]["image"].as_str())
                .map(str::to_owned)
        });
        let request = json!({
            "bundle": bundle_yaml(case.contract),
            "clusterName": "lab",
            "endpoint": spec.endpoint,
            "kubernetesVersion": spec.kubernetes_version,
            "role": case.role.as_str(),
            "installDisk": "/dev/sda",
            "installImage": installer,
            "podSubnets": spec.network.pod_subnets,
            "serviceSubnets": spec.network.service_subnets,
            "dnsDomain": spec.network.dns_domain,
            "patches": talos_patches(&case),
        });
        let (ok, talos_yaml) =
            run_oracle(case.contract, &["generate"], request.to_string().as_bytes());
        assert!(ok, "{}: Talos's generator failed: {talos_yaml}", case.name);
        let talos = parse_stream(&talos_yaml);
        let mut ours = parse_stream(&ours.yaml);
        drop_intended_differences(case.contract, &mut ours);
        let kinds: std::collections::BTreeSet<&String> = talos.keys().chain(ours.keys()).collect();
        for kind in kinds {
            let (t, o) = (
                talos.get(kind).unwrap_or(&Value::Null),
                ours.get(kind).unwrap_or(&Value::Null),
            );
            let mut paths = Vec::new();
            diff_paths(t, o, kind, &mut paths);
            for path in paths {
                mismatches.push(format!("{}: {path}", case.name));
            }
        }
    }
    assert!(
        mismatches.is_empty(),
        "configs differ from Talos's generator:\n{}",
        mismatches.join("\n")
    );
}

/// The paths at which `talos` and `ours` differ, with both values (secrets never differ in a
/// passing run, and these are test-only bundles).
fn diff_paths(talos: &Value, ours: &Value, path: &str, out: &mut Vec<String>) {
    match (talos, ours) {
        (Value::Object(t), Value::Object(o)) => {
            let keys: std::collections::BTreeSet<&String> = t.keys().chain(o.keys()).collect();
            for k in keys {
                diff_paths(
                    t.get(k).unwrap_or(&Value::Null),
                    o.get(k).unwrap_or(&Value::Null),
                    &format!("{path}.{k}"),
                    out,
                );
            }
        }
        (t, o) if t != o => out.push(format!("{path}: talos {t} / ours {o}")),
        _ => {}
    }
}
