//! Patches, version contracts, the hardware check and client credentials.

mod support;

use std::collections::BTreeMap;

use ichor_api::cluster::{CniPreset, TalosClusterSpec};
use ichor_api::common::{DiskSelector, InstallSpec, Role};
use ichor_api::config::ConfigPatch;
use ichor_api::machine::{DiskInfo, HardwareInventory, LinkInfo};
use ichor_render::hardware::{self, HardwareMismatch};
use ichor_render::{
    Contract, RenderError, RenderInput, Rendered, SecretsBundle, credentials, render,
};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::{Case, bundle, cluster_spec};

fn case(contract: Contract, role: Role) -> Case {
    Case {
        name: "test".into(),
        contract,
        role,
        cni: CniPreset::Flannel,
        patched: false,
    }
}

fn patches(v: Value) -> Vec<ConfigPatch> {
    serde_json::from_value(v).expect("patches")
}

struct Fixture {
    spec: TalosClusterSpec,
    bundle: SecretsBundle,
    role: Role,
    install: Option<InstallSpec>,
}

impl Fixture {
    fn new(contract: Contract) -> Self {
        Self {
            spec: cluster_spec(&case(contract, Role::ControlPlane)),
            bundle: bundle(contract),
            role: Role::ControlPlane,
            install: None,
        }
    }

    fn render(&self, layers: [&[ConfigPatch]; 3]) -> Result<Rendered, RenderError> {
        let empty = BTreeMap::new();
        render(&RenderInput {
            cluster_name: "lab",
            cluster: &self.spec,
            role: self.role,
            hostname: None,
            install: self.install.as_ref(),
            schematic: None,
            oldest_running: None,
            kubernetes: None,
            cert_sans: &[],
            node_labels: &empty,
            node_taints: &empty,
            patches: &layers,
            bundle: &self.bundle,
        })
    }

    fn render_err(&self, layers: [&[ConfigPatch]; 3]) -> String {
        self.render(layers).expect_err("refused").to_string()
    }
}

fn document<'a>(rendered: &'a Rendered, kind: &str) -> &'a Value {
    rendered
        .documents
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} document"))
}

#[test]
fn patch_layers_apply_cluster_then_class_then_machine() {
    let f = Fixture::new(Contract::V1_14);
    let layer =
        |v: &str| patches(json!([{"documents": {"KubeNodeConfig": {"labels": {"tier": v}}}}]));
    let (c, k, m) = (layer("cluster"), layer("class"), layer("machine"));
    let out = f.render([&c, &k, &m]).expect("render");
    assert_eq!(
        document(&out, "KubeNodeConfig")["labels"]["tier"],
        "machine"
    );
    let out = f.render([&c, &k, &[]]).expect("render");
    assert_eq!(document(&out, "KubeNodeConfig")["labels"]["tier"], "class");
}

#[test]
fn render_machine_takes_the_machines_install_and_patches_over_the_clusters() {
    let f = Fixture::new(Contract::V1_14);
    let mut spec = f.spec.clone();
    spec.install = Some(InstallSpec {
        disk: Some("/dev/sda".into()),
        ..Default::default()
    });
    spec.config_patches = patches(
        json!([{"documents": {"KubeNodeConfig": {"labels": {"tier": "cluster", "zone": "a"}}}}]),
    );
    let cluster = ichor_api::TalosCluster::new("lab", spec.clone());
    let machine = ichor_api::TalosMachine::test("m1")
        .namespace("ns")
        .hostname("cp-1")
        .install_disk("/dev/nvme0n1")
        .patch(
            patches(json!([{"documents": {"KubeNodeConfig": {"labels": {"tier": "machine"}}}}]))
                .remove(0),
        )
        .build();
    let out = ichor_render::render_machine(
        &cluster,
        &machine,
        Role::ControlPlane,
        &ichor_render::MachineLayers::default(),
        &f.bundle,
    )
    .expect("render");
    let labels = &document(&out, "KubeNodeConfig")["labels"];
    assert_eq!(labels["tier"], "machine");
    assert_eq!(labels["zone"], "a");
    assert_eq!(document(&out, "HostnameConfig")["hostname"], "cp-1");
    assert_eq!(
        document(&out, "UnattendedInstallConfig")["provisioning"]["diskSelector"]["match"],
        "disk.dev_path == \"/dev/nvme0n1\""
    );
    assert_eq!(document(&out, "KubeClusterConfig")["clusterName"], "lab");
    // The same inputs through `render` give the same bytes.
    let empty = BTreeMap::new();
    let install = machine.spec.install.clone();
    let direct = render(&RenderInput {
        cluster_name: "lab",
        cluster: &spec,
        role: Role::ControlPlane,
        hostname: Some("cp-1"),
        install: install.as_ref(),
        schematic: None,
        oldest_running: None,
        kubernetes: None,
        cert_sans: &[],
        node_labels: &empty,
        node_taints: &empty,
        patches: &[&spec.config_patches, &machine.spec.config_patches],
        bundle: &f.bundle,
    })
    .expect("render");
    assert_eq!(out.yaml, direct.yaml);
    assert_eq!(out.hash, direct.hash);
    assert_eq!(ichor_render::config_hash(&out.yaml), out.hash);
}

#[test]
fn named_documents_merge_by_name_or_are_added() {
    let f = Fixture::new(Contract::V1_14);
    let p = patches(json!([
        {"documents": {"LinkConfig": [{"name": "eth0", "mtu": 9000}, {"name": "eth1", "up": true}]}},
        {"documents": {"LinkConfig": [{"name": "eth0", "up": true}]}}
    ]));
    let out = f.render([&p, &[], &[]]).expect("render");
    let links: Vec<&Value> = out
        .documents
        .iter()
        .filter(|d| d["kind"] == "LinkConfig")
        .collect();
    assert_eq!(links.len(), 2);
    assert_eq!(links[0]["mtu"], 9000);
    assert_eq!(links[0]["up"], true);
    assert_eq!(links[0]["apiVersion"], "v1alpha1");
}

#[test]
fn patches_never_set_secret_fields() {
    let f = Fixture::new(Contract::V1_13);
    let err = f.render_err([
        &patches(json!([{"name": "steal", "machine": {"token": "abcdef.0123456789abcdef"}}])),
        &[],
        &[],
    ]);
    assert!(err.contains("cluster patch 0 (\"steal\")"), "{err}");
    assert!(err.contains("machine.token"), "{err}");
    assert!(err.contains("secret"), "{err}");
    assert!(
        !err.contains("0123456789abcdef"),
        "the value never appears: {err}"
    );

    let err = f.render_err([
        &[],
        &[],
        &patches(json!([{"cluster": {"etcd": {"ca": {"key": "x"}}}}])),
    ]);
    assert!(
        err.contains("machine patch 0") && err.contains("cluster.etcd.ca.key"),
        "{err}"
    );

    let err = f.render_err([
        &patches(json!([{"jsonPatch": [{"op": "replace", "path": "/cluster", "value": {}}]}])),
        &[],
        &[],
    ]);
    assert!(err.contains("reaches a secret field"), "{err}");

    let f = Fixture::new(Contract::V1_14);
    let err = f.render_err([
        &patches(json!([{"documents": {"DiscoveryIdentityConfig": {"clusterSecret": "s"}}}])),
        &[],
        &[],
    ]);
    assert!(err.contains("documents.DiscoveryIdentityConfig"), "{err}");
    let err = f.render_err([
        &patches(
            json!([{"documents": {"KubeServiceAccountConfig": {"issuer": {"privateKey": "k"}}}}]),
        ),
        &[],
        &[],
    ]);
    assert!(
        err.contains("documents.KubeServiceAccountConfig.issuer.privateKey"),
        "{err}"
    );
    // Neighbours of secrets are fine.
    f.render([&patches(json!([{"machine": {"certSANs": ["a.example"]}, "cluster": {"etcd": {"advertisedSubnets": ["10.0.0.0/24"]}}}])), &[], &[]])
        .expect("legitimate neighbours apply");
}

/// Found by fuzzing (`fuzz/fuzz_targets/config_patch.rs`): a strategic value that is not an
/// object replaces everything below it, so a scalar, a list or `null` over an object holding a
/// secret removed the secret, and a section that is not an object replaced the whole section.
#[test]
fn strategic_values_never_replace_or_remove_a_subtree_holding_secrets() {
    for contract in [Contract::V1_13, Contract::V1_14] {
        let f = Fixture::new(contract);
        for patch in [
            json!([{"machine": {"ca": null}}]),
            json!([{"machine": {"ca": "x"}}]),
            json!([{"cluster": {"etcd": []}}]),
            json!([{"cluster": {"aggregatorCA": 1}}]),
            json!([{"machine": []}]),
            json!([{"cluster": "x"}]),
            // The input the fuzzer found.
            json!([{"name": "time-servers", "cluster": "documen"}]),
        ] {
            let err = f.render_err([&patches(patch.clone()), &[], &[]]);
            assert!(err.contains("secret"), "{patch}: {err}");
        }
        // A non-object value where no secret lies below is still a plain replacement.
        f.render([
            &patches(json!([{"machine": {"certSANs": null, "features": {"rbac": true}}}])),
            &[],
            &[],
        ])
        .expect("no secret below");
    }
}

/// Found by fuzzing: an RFC 6902 value is a whole subtree, so a user-supplied secret field
/// inside an `add` or `replace` value (a WireGuard key in a new interface) is refused like one
/// named by the operation's path.
#[test]
fn json_patch_values_carry_no_user_secret_fields() {
    let f = Fixture::new(Contract::V1_13);
    let err = f.render_err([
        &patches(json!([{"jsonPatch": [{"op": "add", "path": "/machine/network", "value": {"interfaces": [
            {"interface": "wg0", "wireguard": {"privateKey": "cGxhbnRlZA=="}}
        ]}}]}])),
        &[],
        &[],
    ]);
    assert!(err.contains("reaches a secret field"), "{err}");
    assert!(
        !err.contains("cGxhbnRlZA=="),
        "the value never appears: {err}"
    );
    let err = f.render_err([
        &patches(
            json!([{"jsonPatch": [{"op": "add", "path": "/machine/registries", "value":
                {"config": {"r.example": {"auth": {"password": "hunter2"}}}}
            }]}]),
        ),
        &[],
        &[],
    ]);
    assert!(err.contains("reaches a secret field"), "{err}");
    f.render([&patches(json!([{"jsonPatch": [{"op": "add", "path": "/machine/network", "value": {"interfaces": [
        {"interface": "eth0", "mtu": 9000}
    ]}}]}])), &[], &[]])
        .expect("an interface without secrets");
}

#[test]
fn contract_1_14_refuses_legacy_fields_naming_the_document_to_use() {
    let f = Fixture::new(Contract::V1_14);
    let err = f.render_err([
        &[],
        &[],
        &patches(json!([{"name": "disk", "machine": {"install": {"disk": "/dev/nvme0n1"}}}])),
    ]);
    assert!(err.contains("machine.install"), "{err}");
    assert!(err.contains("UnattendedInstallConfig"), "{err}");
    let err = f.render_err([&patches(json!([{"jsonPatch": [{"op": "add", "path": "/cluster/proxy", "value": {"disabled": true}}]}])), &[], &[]]);
    assert!(err.contains("KubeProxyConfig"), "{err}");
    // The same legacy field is the way to do it on 1.13.
    let f13 = Fixture::new(Contract::V1_13);
    let out = f13
        .render([
            &[],
            &[],
            &patches(json!([{"machine": {"install": {"wipe": true}}}])),
        ])
        .expect("1.13 takes machine.install");
    assert_eq!(out.documents[0]["machine"]["install"]["wipe"], true);
    let err = f13.render_err([
        &patches(json!([{"documents": {"KubeProxyConfig": {"enabled": false}}}])),
        &[],
        &[],
    ]);
    assert!(err.contains("needs contract v1.14"), "{err}");
}

#[test]
fn json_patch_errors_name_the_operation() {
    let f = Fixture::new(Contract::V1_13);
    let err = f.render_err([
        &patches(json!([{"name": "bad", "jsonPatch": [
            {"op": "add", "path": "/machine/certSANs/-", "value": "ok"},
            {"op": "remove", "path": "/machine/nope"}
        ]}])),
        &[],
        &[],
    ]);
    assert!(
        err.contains("cluster patch 0 (\"bad\")") && err.contains("jsonPatch[1]"),
        "{err}"
    );
    let err = f.render_err([
        &patches(json!([{"jsonPatch": [{"op": "add", "path": "/machine/env"}]}])),
        &[],
        &[],
    ]);
    assert!(err.contains("need a value"), "{err}");
}

#[test]
fn unsupported_contracts_and_inputs_are_refused_clearly() {
    let mut f = Fixture::new(Contract::V1_14);
    f.spec.talos_version = "v1.12.4".into();
    let err = f.render_err([&[], &[], &[]]);
    assert!(
        err.contains("v1.12.4") && err.contains("contracts v1.13 and v1.14"),
        "{err}"
    );

    let mut f = Fixture::new(Contract::V1_13);
    f.install = Some(InstallSpec {
        disk_selector: Some(DiskSelector {
            match_: Some("disk.size > 1u".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = f.render_err([&[], &[], &[]]);
    assert!(
        err.contains("install.diskSelector.match") && err.contains("v1.14"),
        "{err}"
    );

    let mut f = Fixture::new(Contract::V1_14);
    f.install = Some(InstallSpec {
        disk_selector: Some(DiskSelector {
            size: Some(">= 10GB".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = f.render_err([&[], &[], &[]]);
    assert!(err.contains("CEL expression"), "{err}");
}

#[test]
fn contract_1_14_never_renders_machine_install() {
    let f = Fixture::new(Contract::V1_14);
    let out = f.render([&[], &[], &[]]).expect("render");
    assert!(out.documents[0]["machine"].get("install").is_none());
    let install = document(&out, "UnattendedInstallConfig");
    assert_eq!(install["reboot"], true);
    assert_eq!(
        install["provisioning"]["diskSelector"]["match"],
        "disk.dev_path == \"/dev/sda\""
    );
}

fn disk(name: &str, gb: u64, transport: &str, rotational: bool) -> DiskInfo {
    DiskInfo {
        name: name.into(),
        dev_path: format!("/dev/{name}"),
        size: gb * 1_000_000_000,
        transport: Some(transport.into()),
        rotational,
        ..Default::default()
    }
}

fn inventory() -> HardwareInventory {
    HardwareInventory {
        uuid: "4c4c4544-0042-3510-8050-b4c04f4e4d32".into(),
        disks: vec![
            DiskInfo {
                cdrom: true,
                ..disk("sr0", 1, "sata", false)
            },
            disk("vda", 64, "virtio", false),
            disk("nvme0n1", 512, "nvme", false),
        ],
        links: vec![LinkInfo {
            name: "eth0".into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn hardware_check_finds_the_install_disk_or_says_what_is_there() {
    let mut f = Fixture::new(Contract::V1_14);
    let select = |expr: &str| InstallSpec {
        disk_selector: Some(DiskSelector {
            match_: Some(expr.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    f.install = Some(select("disk.size > 100u * GB && disk.transport == 'nvme'"));
    hardware::check(&f.render([&[], &[], &[]]).expect("render"), &inventory())
        .expect("the NVMe disk matches");

    f.install = Some(select("disk.size > 1u * TB"));
    let problems = hardware::check(&f.render([&[], &[], &[]]).expect("render"), &inventory())
        .expect_err("no such disk");
    let text = problems[0].to_string();
    assert!(
        text.contains("/dev/vda 64 GB") && text.contains("/dev/sr0 (cd)"),
        "{text}"
    );

    f.install = Some(select("disk.size >"));
    let problems = hardware::check(&f.render([&[], &[], &[]]).expect("render"), &inventory())
        .expect_err("bad CEL");
    assert!(
        matches!(problems[0], HardwareMismatch::InvalidSelector { .. }),
        "{problems:?}"
    );

    f.install = Some(InstallSpec {
        disk: Some("/dev/sr0".into()),
        ..Default::default()
    });
    let problems = hardware::check(&f.render([&[], &[], &[]]).expect("render"), &inventory())
        .expect_err("a CD is no install disk");
    assert!(problems[0].to_string().contains("/dev/sr0"), "{problems:?}");

    let mut f13 = Fixture::new(Contract::V1_13);
    f13.install = Some(InstallSpec {
        disk_selector: Some(DiskSelector {
            size: Some(">= 500GB".into()),
            type_: Some("nvme".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    hardware::check(&f13.render([&[], &[], &[]]).expect("render"), &inventory())
        .expect("1.13 selector matches");
}

#[test]
fn hardware_check_reports_links_the_machine_lacks() {
    let mut f = Fixture::new(Contract::V1_14);
    f.install = Some(InstallSpec {
        disk: Some("/dev/vda".into()),
        ..Default::default()
    });
    let p = patches(json!([{"documents": {
        "LinkConfig": [{"name": "eth0", "mtu": 9000}, {"name": "eth9", "up": true}],
        "VLANConfig": [{"name": "eth0.10", "vlanID": 10, "parent": "eth0"}],
        "DHCPv4Config": [{"name": "eth0.10"}]
    }}]));
    let problems = hardware::check(&f.render([&[], &[], &p]).expect("render"), &inventory())
        .expect_err("eth9 is missing");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].to_string().contains("eth9")
            && problems[0].to_string().contains("it has: eth0")
    );
}

#[test]
fn credentials_carry_the_right_identities() {
    let b = bundle(Contract::V1_14);
    let talosconfig = credentials::talosconfig(
        &b,
        "lab",
        &["192.168.10.21".into()],
        &["192.168.10.21".into()],
    )
    .expect("talosconfig");
    let parsed: Value = serde_saphyr::from_str(&talosconfig.0).expect("yaml");
    assert_eq!(parsed["context"], "lab");
    let ctx = &parsed["contexts"]["lab"];
    assert_eq!(ctx["endpoints"], json!(["192.168.10.21"]));
    let crt = base64_pem(ctx["crt"].as_str().expect("crt"));
    assert!(crt.contains("BEGIN CERTIFICATE"));
    assert!(
        !format!("{talosconfig:?}").contains("BEGIN"),
        "Debug hides the key"
    );

    let kubeconfig =
        credentials::admin_kubeconfig(&b, "lab", "https://192.168.10.5:6443").expect("kubeconfig");
    let parsed: Value = serde_saphyr::from_str(&kubeconfig.0).expect("yaml");
    assert_eq!(
        parsed["clusters"][0]["cluster"]["server"],
        "https://192.168.10.5:6443"
    );
    let cert = base64_pem(
        parsed["users"][0]["user"]["client-certificate-data"]
            .as_str()
            .expect("cert"),
    );
    let der = pem::parse(&cert).expect("pem").contents().to_vec();
    let (_, x509) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let orgs: Vec<_> = x509
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .collect();
    assert_eq!(orgs, ["system:masters"]);
    let ca_der = pem::parse(&b.certs.k8s.crt.0)
        .expect("pem")
        .contents()
        .to_vec();
    let (_, ca) = x509_parser::parse_x509_certificate(&ca_der).expect("ca");
    assert_eq!(
        x509.issuer(),
        ca.subject(),
        "signed by the cluster's Kubernetes CA"
    );
}

fn base64_pem(b64: &str) -> String {
    use base64::Engine as _;
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .expect("base64"),
    )
    .expect("utf8")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn rendering_is_deterministic_for_any_inputs(
        name in "[a-z][a-z0-9-]{0,20}",
        hostname in proptest::option::of("[a-z][a-z0-9-]{0,20}"),
        label in "[a-z]{1,10}",
        worker in any::<bool>(),
        v14 in any::<bool>(),
    ) {
        let contract = if v14 { Contract::V1_14 } else { Contract::V1_13 };
        let spec = cluster_spec(&case(contract, Role::Worker));
        let b = bundle(contract);
        let labels: BTreeMap<String, String> = [(format!("example.com/{label}"), label.clone())].into();
        let empty = BTreeMap::new();
        let input = RenderInput {
            cluster_name: &name,
            cluster: &spec,
            role: if worker { Role::Worker } else { Role::ControlPlane },
            hostname: hostname.as_deref(),
            install: None,
            schematic: None,
            oldest_running: None,
            kubernetes: None,
            cert_sans: &[],
            node_labels: &labels,
            node_taints: &empty,
            patches: &[],
            bundle: &b,
        };
        let first = render(&input).expect("render");
        let second = render(&input).expect("render");
        prop_assert_eq!(&first.yaml, &second.yaml);
        prop_assert_eq!(&first.hash, &second.hash);
        prop_assert!(first.yaml.contains(&name));
    }

    #[test]
    fn secret_values_never_reach_debug_or_error_text(secret in "[a-z0-9]{6}\\.[a-z0-9]{16}") {
        let f = Fixture::new(Contract::V1_13);
        for patch in [
            json!([{"machine": {"token": secret}}]),
            json!([{"cluster": {"secret": secret}}]),
            json!([{"jsonPatch": [{"op": "replace", "path": "/cluster/token", "value": secret}]}]),
        ] {
            let err = f.render([&patches(patch), &[], &[]]).expect_err("refused");
            let text = format!("{err} {err:?}");
            prop_assert!(!text.contains(&secret));
        }
        let rendered = f.render([&[], &[], &[]]).expect("render");
        let debug = format!("{rendered:?} {:?}", f.bundle);
        prop_assert!(!debug.contains(&f.bundle.trustd_info.token.0));
        prop_assert!(!debug.contains(&f.bundle.cluster.secret.0));
        prop_assert!(!debug.contains(&f.bundle.certs.os.key.0));
    }
}

#[test]
fn the_contract_never_runs_ahead_of_the_oldest_talos_a_node_runs() {
    let spec = TalosClusterSpec::new("v1.14.2", "1.36.3", "https://10.0.0.10:6443", 3);
    let bundle = bundle(Contract::V1_13);
    let at = |oldest: Option<&str>| {
        render(&RenderInput {
            oldest_running: oldest,
            kubernetes: None,
            ..RenderInput::plain("lab", &spec, Role::Worker, &bundle)
        })
        .expect("render")
    };
    let mid_upgrade = at(Some("v1.13.9"));
    assert_eq!(mid_upgrade.contract, Contract::V1_13);
    assert!(
        mid_upgrade.yaml.contains("install:"),
        "machine.install on 1.13"
    );
    // The installer is the declared version's: a node installs what the cluster declares.
    assert!(
        mid_upgrade.yaml.contains(&format!(
            "factory.talos.dev/metal-installer/{}:v1.14.2",
            ichor_render::schematic::EMPTY_ID
        )),
        "{}",
        mid_upgrade.yaml
    );
    assert_eq!(at(Some("v1.14.2")).contract, Contract::V1_14);
    assert_eq!(
        at(Some("v1.15.0")).contract,
        Contract::V1_14,
        "never ahead of the declared"
    );
    assert_eq!(at(None).contract, Contract::V1_14);
    assert_eq!(at(Some("garbage")).contract, Contract::V1_14);
}

#[test]
fn a_kubernetes_rollout_holds_each_component_at_its_own_version() {
    let held = ichor_api::machine::KubernetesComponents {
        api_server: Some("1.36.4".into()),
        controller_manager: Some("1.36.3".into()),
        scheduler: None,
        proxy: Some("1.36.3".into()),
        kubelet: Some("v1.36.3".into()),
        disabled: Vec::new(),
    };
    for contract in [Contract::V1_13, Contract::V1_14] {
        let talos = if contract == Contract::V1_13 {
            "v1.13.9"
        } else {
            "v1.14.2"
        };
        let spec = TalosClusterSpec::new(talos, "1.36.4", "https://10.0.0.10:6443", 3);
        let bundle = bundle(contract);
        let rendered = render(&RenderInput {
            kubernetes: Some(&held),
            ..RenderInput::plain("lab", &spec, Role::ControlPlane, &bundle)
        })
        .expect("render");
        for image in [
            "registry.k8s.io/kube-apiserver:v1.36.4",
            "registry.k8s.io/kube-controller-manager:v1.36.3",
            "registry.k8s.io/kube-scheduler:v1.36.4",
            "registry.k8s.io/kube-proxy:v1.36.3",
            "ghcr.io/siderolabs/kubelet:v1.36.3",
        ] {
            assert!(
                rendered.yaml.contains(image),
                "{contract:?}: {image} in\n{}",
                rendered.yaml
            );
        }
        let plain = render(&RenderInput::plain(
            "lab",
            &spec,
            Role::ControlPlane,
            &bundle,
        ))
        .expect("render");
        assert!(plain.yaml.contains("ghcr.io/siderolabs/kubelet:v1.36.4"));
        assert_ne!(plain.hash, rendered.hash);
    }
}

#[test]
fn a_static_pod_is_turned_off_by_its_typed_document_else_by_v1alpha1() {
    let f = Fixture::new(Contract::V1_14);
    let disabled = |out: &Rendered| ichor_render::disabled_static_pods(&out.documents);
    let plain = f.render([&[], &[], &[]]).expect("render");
    assert!(disabled(&plain).is_empty(), "both run unless turned off");
    let off = patches(json!([{"documents": {"KubeSchedulerConfig": {"enabled": false}}}]));
    let out = f.render([&off, &[], &[]]).expect("render");
    assert_eq!(disabled(&out), ["kube-scheduler"]);
    // Without the typed document, v1alpha1's field decides (talos-facts §14.2).
    let f = Fixture::new(Contract::V1_13);
    let off =
        patches(json!([{"machine": {"controlPlane": {"controllerManager": {"disabled": true}}}}]));
    let out = f.render([&off, &[], &[]]).expect("render");
    assert_eq!(disabled(&out), ["kube-controller-manager"]);
    // A typed document that says nothing leaves it on, whatever v1alpha1 says.
    let mut typed = out.documents.clone();
    typed.push(
        json!({"apiVersion": "v1alpha1", "kind": "KubeControllerManagerConfig", "image": "x"}),
    );
    assert!(ichor_render::disabled_static_pods(&typed).is_empty());
}
