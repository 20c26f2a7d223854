//! Shared fixtures: the golden cases, the fixed bundles, and the Talos oracles.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ichor_api::TalosCluster;
use ichor_api::cluster::{CniPreset, KubeProxyMode, TalosClusterSpec};
use ichor_api::common::{DiskSelector, InstallSpec, Role};
use ichor_api::config::ConfigPatch;
use ichor_render::{Contract, RenderInput, Rendered, SecretsBundle, render};
use serde_json::{Value, json};

/// The folder of golden files.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The fixed test bundle of a contract.
pub fn bundle(contract: Contract) -> SecretsBundle {
    let name = match contract {
        Contract::V1_13 => "bundle-1.13.yaml",
        Contract::V1_14 => "bundle-1.14.yaml",
    };
    let text = std::fs::read_to_string(golden_dir().join(name)).expect("read the test bundle");
    SecretsBundle::from_yaml(&text).expect("the test bundle is valid")
}

/// The bundle file's YAML, as the oracle loads it.
pub fn bundle_yaml(contract: Contract) -> String {
    bundle(contract).to_yaml().expect("yaml")
}

/// One golden case.
#[derive(Debug, Clone)]
pub struct Case {
    /// The file stem, e.g. `1.14-controlplane-flannel-plain`.
    pub name: String,
    /// The contract.
    pub contract: Contract,
    /// The role.
    pub role: Role,
    /// The CNI preset (kube-proxy is off with cilium).
    pub cni: CniPreset,
    /// Whether the patch set is applied.
    pub patched: bool,
}

/// Every golden case: contract × role × CNI × patch set.
pub fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    for contract in [Contract::V1_13, Contract::V1_14] {
        for role in [Role::ControlPlane, Role::Worker] {
            for cni in [CniPreset::Flannel, CniPreset::Cilium, CniPreset::None] {
                for patched in [false, true] {
                    let version = match contract {
                        Contract::V1_13 => "1.13",
                        Contract::V1_14 => "1.14",
                    };
                    let cni_name = match cni {
                        CniPreset::Flannel => "flannel",
                        CniPreset::Cilium => "cilium-no-kube-proxy",
                        CniPreset::None => "none",
                    };
                    let patches = if patched { "patched" } else { "plain" };
                    out.push(Case {
                        name: format!("{version}-{}-{cni_name}-{patches}", role.as_str()),
                        contract,
                        role,
                        cni,
                        patched,
                    });
                }
            }
        }
    }
    out
}

/// The cluster spec of a case.
pub fn cluster_spec(case: &Case) -> TalosClusterSpec {
    let talos_version = match case.contract {
        Contract::V1_13 => "v1.13.9",
        Contract::V1_14 => "v1.14.1",
    };
    // Cilium runs without kube-proxy; flannel needs it; none keeps it.
    let kube_proxy = if case.cni == CniPreset::Cilium {
        KubeProxyMode::Disabled
    } else {
        KubeProxyMode::Enabled
    };
    TalosCluster::test("lab")
        .talos(talos_version)
        .control_planes(3)
        .cni(case.cni)
        .kube_proxy(kube_proxy)
        .spec()
}

/// The cluster, class and machine patch layers of a case.
pub fn patches(case: &Case) -> [Vec<ConfigPatch>; 3] {
    if !case.patched {
        return [vec![], vec![], vec![]];
    }
    let parse = |v: Value| -> Vec<ConfigPatch> { serde_json::from_value(v).expect("patches") };
    match case.contract {
        Contract::V1_13 => [
            parse(
                json!([{"name": "time", "machine": {"time": {"servers": ["time.cloudflare.com"]}}}]),
            ),
            parse(
                json!([{"name": "sysctl", "machine": {"sysctls": {"vm.max_map_count": "262144"}}}]),
            ),
            parse(json!([
                {"name": "san", "jsonPatch": [{"op": "add", "path": "/machine/certSANs/-", "value": "node.lab.internal"}]},
                {"name": "mtu", "machine": {"network": {"interfaces": [{"interface": "eth0", "dhcp": true, "mtu": 9000}]}}}
            ])),
        ],
        Contract::V1_14 => [
            parse(
                json!([{"name": "time", "documents": {"TimeSyncConfig": {"ntp": {"servers": ["time.cloudflare.com"]}}}}]),
            ),
            parse(
                json!([{"name": "pool", "documents": {"KubeNodeConfig": {"labels": {"node.example.com/pool": "bulk"}}}}]),
            ),
            parse(json!([
                {"name": "san", "jsonPatch": [{"op": "add", "path": "/machine/certSANs/-", "value": "node.lab.internal"}]},
                {"name": "mtu", "documents": {"LinkConfig": [{"name": "eth0", "mtu": 9000}]}}
            ])),
        ],
    }
}

/// The install settings of a case: a path when plain, a selector when patched.
pub fn install(case: &Case) -> InstallSpec {
    if !case.patched {
        return InstallSpec {
            disk: Some("/dev/sda".into()),
            ..Default::default()
        };
    }
    let selector = match case.contract {
        Contract::V1_13 => DiskSelector {
            size: Some(">= 100GB".into()),
            ..Default::default()
        },
        Contract::V1_14 => DiskSelector {
            match_: Some("disk.size > 100u * GB && !disk.rotational".into()),
            ..Default::default()
        },
    };
    InstallSpec {
        disk_selector: Some(selector),
        ..Default::default()
    }
}

/// Renders a case.
pub fn render_case(case: &Case) -> Rendered {
    let bundle = bundle(case.contract);
    let spec = cluster_spec(case);
    let install = install(case);
    let [cluster, class, machine] = patches(case);
    let hostname = case.patched.then_some("node-1");
    let sans = vec!["10.0.0.21".to_owned()];
    let labels = BTreeMap::new();
    let taints = BTreeMap::new();
    render(&RenderInput {
        cluster_name: "lab",
        cluster: &spec,
        role: case.role,
        hostname,
        install: Some(&install),
        schematic: None,
        oldest_running: None,
        kubernetes: None,
        cert_sans: &sans,
        node_labels: &labels,
        node_taints: &taints,
        patches: &[&cluster, &class, &machine],
        bundle: &bundle,
    })
    .unwrap_or_else(|e| panic!("{} renders: {e}", case.name))
}

/// The oracle binary of a contract; panics with how to build it when it is missing.
pub fn oracle(contract: Contract) -> PathBuf {
    let name = match contract {
        Contract::V1_13 => "talos-oracle-1.13",
        Contract::V1_14 => "talos-oracle-1.14",
    };
    let path = ichor_testenv::assets::oracles_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask oracles` (or `cargo xtask test`) to build the Talos oracles",
        path.display()
    );
    path
}

/// Runs an oracle command with `input` on stdin: (success, stdout).
pub fn run_oracle(contract: Contract, args: &[&str], input: &[u8]) -> (bool, String) {
    let mut child = Command::new(oracle(contract))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the oracle");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input)
        .expect("write to the oracle");
    let output = child.wait_with_output().expect("oracle output");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        text.push_str(&String::from_utf8_lossy(&output.stderr));
    }
    (output.status.success(), text)
}
