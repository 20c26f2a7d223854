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
            schematic: None,
            oldest_running: None,
            kubernetes: None,
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

/// A patch adding Kubernetes node labels, in the contract's shape.
fn labels_patch(contract: Contract, name: &str, labels: Value) -> Value {
    match contract {
        Contract::V1_13 => json!({"name": name, "machine": {"nodeLabels": labels}}),
        Contract::V1_14 => {
            json!({"name": name, "documents": {"KubeNodeConfig": {"labels": labels}}})
        }
    }
}

/// The volumes of a TalosStorage render into `UserVolumeConfig` documents Talos's strict
/// validation accepts, on both contracts, sizes in bytes; a class's patches go between the
/// cluster's and the machine's, and can adjust a volume.
#[test]
fn user_volumes_and_class_patches_pass_talos_strict_validation() {
    use ichor_api::storage::{Filesystem, UserVolume};
    use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass, TalosStorage};
    use ichor_render::MachineLayers;

    for contract in CONTRACTS {
        let version = match contract {
            Contract::V1_13 => "v1.13.9",
            Contract::V1_14 => "v1.14.1",
        };
        let cluster: TalosCluster = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosCluster",
            "metadata": {"name": "lab", "namespace": "ns"},
            "spec": {"talosVersion": version, "kubernetesVersion": "1.36.3",
                     "endpoint": "https://10.0.0.10:6443", "controlPlane": {"count": 1}}
        }))
        .expect("cluster");
        let machine: TalosMachine = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachine",
            "metadata": {"name": "m1", "namespace": "ns",
                         "labels": {"ichor.maesh.dev/class": "fast", "pool": "a"}},
            "spec": {"clusterRef": {"name": "lab"}, "approvalState": "approved", "role": "worker",
                     "endpoints": ["10.0.0.21"], "fingerprint": "x",
                     "configPatches": [labels_patch(contract, "m", json!({"by": "machine"}))]}
        }))
        .expect("machine");
        let class: TalosMachineClass = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachineClass",
            "metadata": {"name": "fast", "namespace": "ns"},
            "spec": {"clusterRef": {"name": "lab"}, "role": "worker", "qualifiers": {"uuids": ["u"]},
                     "configPatches": [labels_patch(contract, "c", json!({"by": "class", "tier": "fast"}))]}
        }))
        .expect("class");
        let volume =
            |name: &str, fs: Filesystem, min: Option<&str>, max: Option<&str>| UserVolume {
                name: name.into(),
                disk_selector: "disk.transport == 'nvme' && !system_disk".into(),
                min_size: min.map(Into::into),
                max_size: max.map(Into::into),
                filesystem: fs,
            };
        let mut storage = TalosStorage::new(
            "data",
            ichor_api::TalosStorageSpec {
                cluster_ref: ichor_api::common::LocalObjectReference { name: "lab".into() },
                machine_selector: serde_json::from_value(json!({"matchLabels": {"pool": "a"}}))
                    .ok(),
                volumes: vec![
                    volume("data", Filesystem::Xfs, Some("100Gi"), Some("500Gi")),
                    volume("scratch-1", Filesystem::Ext4, Some("1.5Gi"), None),
                ],
            },
        );
        storage.metadata.namespace = Some("ns".into());
        let classes = [class];
        let storages = [storage];
        let layers = MachineLayers::of(&machine, &classes, &storages).expect("layers");
        assert!(layers.class.is_some(), "the labelled class is found");
        let rendered = ichor_render::render_machine(
            &cluster,
            &machine,
            Role::Worker,
            &layers,
            &bundle(contract),
        )
        .expect("render");
        let volumes: Vec<&Value> = rendered
            .documents
            .iter()
            .filter(|d| d["kind"] == "UserVolumeConfig")
            .collect();
        assert_eq!(volumes.len(), 2, "{contract:?}");
        assert_eq!(volumes[0]["name"], "data");
        assert_eq!(volumes[0]["provisioning"]["minSize"], "107374182400");
        assert_eq!(volumes[0]["provisioning"]["maxSize"], "536870912000");
        assert_eq!(volumes[1]["filesystem"]["type"], "ext4");
        assert_eq!(volumes[1]["provisioning"]["minSize"], "1610612736");
        let labels = match contract {
            Contract::V1_13 => rendered.documents[0]["machine"]["nodeLabels"].clone(),
            Contract::V1_14 => rendered
                .documents
                .iter()
                .find(|d| d["kind"] == "KubeNodeConfig")
                .map(|d| d["labels"].clone())
                .expect("a KubeNodeConfig"),
        };
        assert_eq!(labels["tier"], "fast", "the class's patch");
        assert_eq!(labels["by"], "machine", "the machine's patch goes last");
        let (ok, out) = run_oracle(contract, &["validate"], rendered.yaml.as_bytes());
        assert!(
            ok,
            "{contract:?}: Talos refuses the volumes: {out}\n{}",
            rendered.yaml
        );

        // Another storage giving the machine a volume of the same name is refused, naming both.
        let mut twin = storages[0].clone();
        twin.metadata.name = Some("twin".into());
        let both = [storages[0].clone(), twin];
        let err = MachineLayers::of(&machine, &classes, &both).expect_err("a conflict");
        assert!(err.to_string().contains("data and twin"), "{err}");
    }
}
