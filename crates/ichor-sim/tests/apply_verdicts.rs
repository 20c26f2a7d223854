//! The simulator applies configs as Talos applies them (talos-facts §11): every golden config
//! of ichor-render, and a few hundred seeded mutations of them, are sent both to a simulated
//! node in maintenance mode and to Talos's own apply-time validation (the `apply` command of
//! tools/talos-oracle-1.13 and -1.14, which runs what machined's ApplyConfiguration runs, against
//! the same disks). The accept/refuse verdicts must match on every one, and so must the
//! refusal messages, except where a third-party parser writes them (YAML and CEL syntax errors),
//! where the verdict and the message's start must.
//!
//! The oracles are found through ICHOR_ORACLES_DIR (as the render tests find them); a missing
//! oracle fails the test with the command that builds it.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ichor_sim::{Hardware, SimNode, Stage};
use ichor_talos::TalosClient;
use ichor_talos::api::machine::ApplyConfigurationRequest;
use ichor_talos::api::machine::apply_configuration_request::Mode;
use ichor_talos::api::machine::machine_service_client::MachineServiceClient;
use ichor_testenv::nets::SIM_APPLY_VERDICTS;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Value, json};

/// The seed of the mutations by default (`ICHOR_TEST_SEED` replaces it): fixed, so a failure
/// reproduces.
const SEED: u64 = 0x1c40_0016;
/// How many mutations each golden config gets.
const PER_GOLDEN: usize = 20;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../ichor-render/tests/golden")
}

fn oracle(minor: &str) -> PathBuf {
    let dir = ichor_testenv::assets::oracles_dir();
    let path = dir.join(format!("talos-oracle-{minor}"));
    assert!(
        path.is_file(),
        "{} is missing: build it with `cd tools/talos-oracle-{minor} && go build -o {} .` \
         (or run `cargo xtask oracles`), and point ICHOR_ORACLES_DIR at its folder",
        path.display(),
        path.display()
    );
    path
}

/// The disks of the simulated machine, as the oracle's request names them.
fn oracle_disks(hardware: &Hardware) -> Value {
    Value::Array(
        hardware
            .disks
            .iter()
            .map(|d| {
                json!({
                    "id": d.name,
                    "devPath": format!("/dev/{}", d.name),
                    "size": d.size,
                    "cdrom": d.cdrom,
                    "transport": d.transport,
                    "model": d.model,
                    "serial": d.serial,
                })
            })
            .collect(),
    )
}

/// Talos's verdict: `Ok(warnings)` or `Err(message)`.
fn talos_verdict(minor: &str, config: &str, hardware: &Hardware) -> Result<Value, String> {
    let request = json!({
        "config": config,
        "maintenance": true,
        "installed": false,
        "disks": oracle_disks(hardware),
    });
    let mut child = Command::new(oracle(minor))
        .arg("apply")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the oracle");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(request.to_string().as_bytes())
        .expect("write to the oracle");
    let output = child.wait_with_output().expect("oracle output");
    assert!(
        output.status.code() != Some(2),
        "the oracle failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: Value = serde_json::from_slice(&output.stdout).expect("the oracle's JSON");
    if result["ok"] == true {
        Ok(result)
    } else {
        Err(result["error"].as_str().unwrap_or_default().to_owned())
    }
}

/// The simulator's verdict on a dry run (machined validates before it looks at `dry_run`).
async fn sim_verdict(client: &TalosClient, config: &str) -> Result<String, String> {
    let reply = MachineServiceClient::new(client.channel())
        .apply_configuration(ApplyConfigurationRequest {
            data: config.as_bytes().to_vec(),
            mode: Mode::Auto as i32,
            dry_run: true,
            try_mode_timeout: None,
        })
        .await;
    match reply {
        Ok(reply) => Ok(reply
            .into_inner()
            .messages
            .first()
            .map(|m| m.mode_details.clone())
            .unwrap_or_default()),
        Err(status) => {
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "a refusal is InvalidArgument: {status:?}"
            );
            Err(status.message().to_owned())
        }
    }
}

/// One config to judge.
struct Case {
    name: String,
    minor: &'static str,
    text: String,
    /// Compare only the verdict and the message's first line (a third-party parser's text).
    loose: bool,
}

fn parse(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple(text).expect("a golden config is YAML")
}

fn render(docs: &[Value]) -> String {
    docs.iter()
        .map(|d| serde_saphyr::to_string(d).expect("YAML"))
        .collect::<Vec<_>>()
        .join("---\n")
}

fn v1(docs: &mut [Value]) -> Option<&mut Value> {
    docs.iter_mut().find(|d| d.get("kind").is_none())
}

fn doc<'a>(docs: &'a mut [Value], kind: &str) -> Option<&'a mut Value> {
    docs.iter_mut().find(|d| d["kind"] == kind)
}

/// Sets (or with `None` removes) the value at a dotted path, creating maps on the way;
/// `None` when a removal finds nothing to remove.
fn put(root: &mut Value, path: &str, value: Option<Value>) -> Option<()> {
    let mut keys: Vec<&str> = path.split('.').collect();
    let last = keys.pop()?;
    let mut node = root;
    for key in keys {
        if value.is_none() && node.get(key).is_none() {
            return None;
        }
        if !node[key].is_object() {
            node[key] = json!({});
        }
        node = node.get_mut(key)?;
    }
    let map = node.as_object_mut()?;
    match value {
        Some(v) => {
            map.insert(last.to_owned(), v);
            Some(())
        }
        None => map.remove(last).map(|_| ()),
    }
}

type Mutation = fn(&mut Vec<Value>, &mut StdRng, &str) -> Option<String>;

/// Picks one of `values`.
fn pick<'a>(rng: &mut StdRng, values: &[&'a str]) -> &'a str {
    values.choose(rng).copied().unwrap_or_default()
}

/// The mutations: each changes one thing and says what; `None` when it does not apply.
const MUTATIONS: &[(&str, Mutation)] = &[
    ("remove a required section", |docs, rng, _| {
        let path = pick(
            rng,
            &[
                "machine",
                "cluster",
                "machine.ca",
                "machine.type",
                "machine.ca.key",
                "machine.ca.crt",
            ],
        );
        put(v1(docs)?, path, None)?;
        Some(format!("without {path}"))
    }),
    ("machine type", |docs, rng, _| {
        let t = pick(
            rng,
            &[
                "master",
                "Worker",
                "init",
                "join",
                "",
                "controlplanes",
                "worker",
                "controlplane",
            ],
        );
        put(v1(docs)?, "machine.type", Some(json!(t)))?;
        Some(format!("machine.type {t:?}"))
    }),
    ("token format", |docs, rng, _| {
        let path = pick(rng, &["machine.token", "cluster.token"]);
        let value = pick(rng, &["not-a-token", "", "ABCDEF.0123456789abcdef", "x"]);
        put(v1(docs)?, path, Some(json!(value)))?;
        Some(format!("{path} {value:?}"))
    }),
    ("CA", |docs, rng, _| {
        let path = pick(rng, &["machine.ca.crt", "machine.ca.key"]);
        let value = pick(rng, &["%%%notbase64", "bm90IGEgcGVt", "LS0tCg=="]);
        put(v1(docs)?, path, Some(json!(value)))?;
        Some(format!("{path} {value:?}"))
    }),
    ("endpoint URL", |docs, rng, minor| {
        let value = pick(
            rng,
            &[
                "not a url",
                "192.168.10.5:6443",
                "ftp://1.2.3.4:6443",
                "https://",
                "https://host:99999",
                "https://[fd00::1]:6443",
                "http://10.0.0.1",
                "https://cp.lab.internal:6443/",
            ],
        );
        if minor == "1.13" {
            put(
                v1(docs)?,
                "cluster.controlPlane.endpoint",
                Some(json!(value)),
            )?;
            Some(format!("cluster.controlPlane.endpoint {value:?}"))
        } else {
            put(
                doc(docs, "KubeClusterConfig")?,
                "endpoint",
                Some(json!(value)),
            )?;
            Some(format!("KubeClusterConfig.endpoint {value:?}"))
        }
    }),
    ("endpoint removed", |docs, rng, minor| {
        if minor == "1.13" {
            let path = pick(
                rng,
                &["cluster.controlPlane", "cluster.controlPlane.endpoint"],
            );
            put(v1(docs)?, path, None)?;
            Some(format!("without {path}"))
        } else {
            let field = pick(rng, &["endpoint", "clusterName"]);
            put(doc(docs, "KubeClusterConfig")?, field, None)?;
            Some(format!("KubeClusterConfig without {field}"))
        }
    }),
    ("CNI name", |docs, rng, minor| {
        let name = pick(rng, &["calico", "custom", "none", "", "flannel"]);
        if minor == "1.13" {
            put(v1(docs)?, "cluster.network.cni.name", Some(json!(name)))?;
            Some(format!("cluster.network.cni.name {name:?}"))
        } else {
            put(
                doc(docs, "KubeFlannelCNIConfig")?,
                "backendType",
                Some(json!(name)),
            )?;
            Some(format!("KubeFlannelCNIConfig.backendType {name:?}"))
        }
    }),
    ("subnets", |docs, rng, minor| {
        let which = pick(rng, &["podSubnets", "serviceSubnets"]);
        let value = pick(
            rng,
            &[
                "not-a-cidr",
                "10.96.0.0/40",
                "10.0.0.0/8",
                "10.244.0.1/16",
                "fc00:db8:10::/56",
                "10.96.0.0/30",
                "300.1.1.0/24",
            ],
        );
        if minor == "1.13" {
            put(
                v1(docs)?,
                &format!("cluster.network.{which}"),
                Some(json!([value])),
            )?;
            Some(format!("cluster.network.{which} [{value}]"))
        } else {
            put(doc(docs, "KubeNetworkConfig")?, which, Some(json!([value])))?;
            Some(format!("KubeNetworkConfig.{which} [{value}]"))
        }
    }),
    ("DNS domain", |docs, rng, minor| {
        let value = pick(
            rng,
            &["bad..domain!", "cluster.local.", "example_internal", "-x"],
        );
        if minor == "1.13" {
            put(v1(docs)?, "cluster.network.dnsDomain", Some(json!(value)))?;
        } else {
            put(
                doc(docs, "KubeNetworkConfig")?,
                "dnsDomain",
                Some(json!(value)),
            )?;
        }
        Some(format!("dnsDomain {value:?}"))
    }),
    ("install disk path", |docs, rng, minor| {
        let value = pick(
            rng,
            &[
                "sda",
                "",
                "/dev/nvme9n9",
                "/dev/vda",
                "/dev/sr0",
                "/dev/sda",
            ],
        );
        if minor == "1.13" {
            let v = v1(docs)?;
            put(v, "machine.install.diskSelector", None);
            put(v, "machine.install.disk", Some(json!(value)))?;
            Some(format!("machine.install.disk {value:?}"))
        } else {
            let matcher = format!("disk.dev_path == {value:?}");
            put(
                doc(docs, "UnattendedInstallConfig")?,
                "provisioning.diskSelector.match",
                Some(json!(matcher)),
            )?;
            Some(format!("UnattendedInstallConfig match {matcher}"))
        }
    }),
    ("install disk selector", |docs, rng, minor| {
        if minor == "1.13" {
            let selector = pick(
                rng,
                &[
                    r#"{"size": "> 10TB"}"#,
                    r#"{"size": ">= 50GB"}"#,
                    r#"{"name": "x"}"#,
                    r#"{"type": "floppy"}"#,
                    r#"{"type": "ssd"}"#,
                    r#"{"size": "big"}"#,
                    r#"{"model": "QEMU*"}"#,
                    r#"{"serial": "SIM*"}"#,
                    r#"{"type": "nvme"}"#,
                    r#"{"size": "100GB"}"#,
                ],
            );
            let selector: Value = serde_json::from_str(selector).expect("selector");
            let v = v1(docs)?;
            put(v, "machine.install.disk", None);
            put(v, "machine.install.diskSelector", Some(selector.clone()))?;
            Some(format!("machine.install.diskSelector {selector}"))
        } else {
            let matcher = pick(
                rng,
                &[
                    "disk.size > 100",
                    "disk.size > 100 * GB",
                    "disk.nosuch == 1",
                    "disk.size",
                    "foo == 1",
                    "disk.size >= 100u * GB && !disk.rotational",
                    "disk.transport == \"virtio\"",
                    "glob(\"/dev/v*\", disk.dev_path)",
                    "!disk.cdrom && disk.size >= 10u * GiB",
                    "disk.dev_path ==",
                    "system_disk",
                    "disk.model.contains(\"Q\")",
                ],
            );
            put(
                doc(docs, "UnattendedInstallConfig")?,
                "provisioning.diskSelector.match",
                Some(json!(matcher)),
            )?;
            Some(format!("UnattendedInstallConfig match {matcher}"))
        }
    }),
    ("install section", |docs, rng, minor| {
        if minor == "1.13" {
            match rng.random_range(0..3) {
                0 => {
                    put(v1(docs)?, "machine.install", None)?;
                    Some("without machine.install".into())
                }
                1 => {
                    put(
                        v1(docs)?,
                        "machine.install.extraKernelArgs",
                        Some(json!(["console=ttyS0"])),
                    )?;
                    Some("machine.install.extraKernelArgs with grubUseUKICmdline".into())
                }
                _ => {
                    put(v1(docs)?, "machine.install.image", Some(json!("")))?;
                    Some("machine.install.image \"\"".into())
                }
            }
        } else {
            match rng.random_range(0..4) {
                0 => {
                    docs.retain(|d| d["kind"] != "UnattendedInstallConfig");
                    Some("without UnattendedInstallConfig".into())
                }
                1 => {
                    put(
                        doc(docs, "UnattendedInstallConfig")?,
                        "installer.image",
                        None,
                    )?;
                    Some("UnattendedInstallConfig without installer.image".into())
                }
                2 => {
                    put(doc(docs, "UnattendedInstallConfig")?, "provisioning", None)?;
                    Some("UnattendedInstallConfig without provisioning".into())
                }
                _ => {
                    put(
                        doc(docs, "UnattendedInstallConfig")?,
                        "reboot",
                        Some(json!(false)),
                    )?;
                    Some("UnattendedInstallConfig reboot false".into())
                }
            }
        }
    }),
    ("Kubernetes images", |docs, rng, minor| {
        let image = pick(
            rng,
            &[
                "ghcr.io/siderolabs/kubelet:v1.20.0",
                "ghcr.io/siderolabs/kubelet",
                "ghcr.io/siderolabs/kubelet:v1.36.3",
                "ghcr.io/siderolabs/kubelet:v1.40.0",
                "ghcr.io/siderolabs/kubelet:latest",
            ],
        );
        if minor == "1.13" {
            put(v1(docs)?, "machine.kubelet.image", Some(json!(image)))?;
            Some(format!("machine.kubelet.image {image}"))
        } else {
            put(doc(docs, "KubeletConfig")?, "image", Some(json!(image)))?;
            Some(format!("KubeletConfig.image {image}"))
        }
    }),
    ("control-plane image", |docs, rng, minor| {
        let image = pick(
            rng,
            &[
                "registry.k8s.io/kube-apiserver:v1.40.0",
                "registry.k8s.io/kube-apiserver:v1.29.0",
                "registry.k8s.io/kube-apiserver",
                "",
            ],
        );
        if minor == "1.13" {
            put(v1(docs)?, "cluster.apiServer.image", Some(json!(image)))?;
        } else {
            put(
                doc(docs, "KubeAPIServerConfig")?,
                "image",
                Some(json!(image)),
            )?;
        }
        Some(format!("kube-apiserver image {image:?}"))
    }),
    ("node labels and taints", |docs, rng, minor| {
        let (key, value) = match rng.random_range(0..3) {
            0 => ("nodeLabels", json!({"bad label": "x"})),
            1 => (
                "nodeTaints",
                json!({"node.example.com/t": "value:Sometimes"}),
            ),
            _ => ("nodeLabels", json!({"node.example.com/ok": "fine"})),
        };
        if minor == "1.13" {
            put(v1(docs)?, &format!("machine.{key}"), Some(value.clone()))?;
            Some(format!("machine.{key} {value}"))
        } else {
            let field = if key == "nodeLabels" {
                "labels"
            } else {
                "taints"
            };
            put(doc(docs, "KubeNodeConfig")?, field, Some(value.clone()))?;
            Some(format!("KubeNodeConfig.{field} {value}"))
        }
    }),
    ("unknown key", |docs, rng, _| {
        let path = pick(rng, &["machine.foo", "cluster.foo", "foo"]);
        put(v1(docs)?, path, Some(json!("bar")))?;
        Some(format!("{path}: bar"))
    }),
    ("persist", |docs, rng, _| {
        let value = rng.random_bool(0.5);
        put(v1(docs)?, "persist", Some(json!(value)))?;
        Some(format!("persist {value}"))
    }),
    ("inline manifests", |docs, _, _| {
        put(
            v1(docs)?,
            "cluster.inlineManifests",
            Some(json!([{"name": "a", "contents": "x"}, {"name": "a", "contents": "y"}])),
        )?;
        Some("duplicate inline manifests".into())
    }),
    ("etcd", |docs, rng, _| {
        let v = v1(docs)?;
        v.get("cluster")?.get("etcd")?;
        if rng.random_bool(0.5) {
            put(v, "cluster.etcd.advertisedSubnets", Some(json!(["bad"])))?;
            Some("cluster.etcd.advertisedSubnets [bad]".into())
        } else {
            put(v, "cluster.etcd.ca", None)?;
            Some("cluster.etcd without ca".into())
        }
    }),
    ("discovery", |docs, rng, minor| {
        if minor == "1.13" {
            let v = v1(docs)?;
            match rng.random_range(0..3) {
                0 => {
                    put(
                        v,
                        "cluster.discovery.registries.service.endpoint",
                        Some(json!("::bad")),
                    )?;
                    Some("discovery endpoint ::bad".into())
                }
                1 => {
                    put(v, "cluster.id", None)?;
                    Some("without cluster.id".into())
                }
                _ => {
                    put(
                        v,
                        "cluster.discovery.registries.service.endpoint",
                        Some(json!("https://d.example.com/path")),
                    )?;
                    Some("discovery endpoint with a path".into())
                }
            }
        } else {
            let value = pick(
                rng,
                &["ftp://x", "not a url", "grpc://d.example.com:443", ""],
            );
            put(
                doc(docs, "DiscoveryServiceConfig")?,
                "endpoint",
                Some(json!(value)),
            )?;
            Some(format!("DiscoveryServiceConfig.endpoint {value:?}"))
        }
    }),
    ("hostname", |docs, rng, _| {
        let hostname = doc(docs, "HostnameConfig")?;
        match rng.random_range(0..3) {
            0 => {
                put(hostname, "auto", Some(json!("bogus")))?;
                Some("HostnameConfig.auto bogus".into())
            }
            1 => {
                put(hostname, "hostname", Some(json!("node-x")))?;
                Some("HostnameConfig.hostname node-x".into())
            }
            _ => {
                put(hostname, "auto", None);
                put(hostname, "hostname", None);
                Some("HostnameConfig without auto or hostname".into())
            }
        }
    }),
    ("unknown document kind", |docs, rng, _| {
        let added = match rng.random_range(0..4) {
            0 => json!({"apiVersion": "v1alpha1", "kind": "FooConfig"}),
            1 => json!({"apiVersion": "v1alpha2", "kind": "HostnameConfig", "auto": "stable"}),
            2 => json!({"kind": "HostnameConfig", "auto": "stable"}),
            _ => json!({"apiVersion": "v1alpha1", "auto": "stable"}),
        };
        let what = format!("an added document {added}");
        docs.push(added);
        Some(what)
    }),
    ("duplicated document", |docs, rng, _| {
        let kinds: Vec<Value> = docs
            .iter()
            .filter(|d| d.get("kind").is_some())
            .cloned()
            .collect();
        let copy = kinds.choose(rng)?.clone();
        let what = format!("a second {}", copy["kind"]);
        docs.push(copy);
        Some(what)
    }),
    ("document of a later release", |docs, rng, minor| {
        if minor != "1.13" {
            return None;
        }
        let added = match rng.random_range(0..2) {
            0 => {
                json!({"apiVersion": "v1alpha1", "kind": "UnattendedInstallConfig", "installer": {"image": "ghcr.io/siderolabs/installer:v1.13.9"}, "provisioning": {"diskSelector": {"match": "disk.dev_path == \"/dev/vda\""}}})
            }
            _ => {
                json!({"apiVersion": "v1alpha1", "kind": "KubeClusterConfig", "clusterName": "lab", "endpoint": "https://192.168.10.5:6443"})
            }
        };
        let what = format!("a 1.14 document {}", added["kind"]);
        docs.push(added);
        Some(what)
    }),
    ("document removed", |docs, rng, _| {
        let kinds: Vec<String> = docs
            .iter()
            .filter_map(|d| d["kind"].as_str().map(str::to_owned))
            .collect();
        let kind = kinds.choose(rng)?.clone();
        docs.retain(|d| d["kind"] != kind.as_str());
        Some(format!("without {kind}"))
    }),
    ("document field", |docs, rng, minor| {
        if minor == "1.13" {
            return None;
        }
        let (kind, field, value): (&str, &str, Option<Value>) = [
            (
                "KubeNetworkConfig",
                "podSubnets",
                Some(json!(["10.244.0.0/16", "fc00::/56"])),
            ),
            (
                "DiscoveryIdentityConfig",
                "clusterSecret",
                Some(json!("short")),
            ),
            ("DiscoveryIdentityConfig", "clusterID", None),
            ("KubeProxyConfig", "mode", Some(json!("bogus"))),
            ("KubeProxyConfig", "mode", Some(json!("ipvs"))),
            ("KubePrismConfig", "port", Some(json!(0))),
            ("KubeletConfig", "image", None),
            (
                "ResolverConfig",
                "nameservers",
                Some(json!([{"address": "not-ip"}])),
            ),
            ("TimeSyncConfig", "bootTimeout", Some(json!("-1s"))),
            ("LinkConfig", "name", None),
            ("VolumeConfig", "name", Some(json!("DATA"))),
            (
                "VolumeConfig",
                "provisioning",
                Some(json!({"diskSelector": {"match": "disk.nosuch"}})),
            ),
            ("KubeAuthorizerConfig", "type", Some(json!("ABAC"))),
            ("KubeEtcdEncryptionConfig", "config", None),
            ("KubeServiceAccountConfig", "issuer", None),
        ]
        .choose(rng)?
        .clone();
        put(doc(docs, kind)?, field, value.clone())?;
        Some(format!("{kind}.{field} {value:?}"))
    }),
    ("legacy field with its replacement", |docs, rng, minor| {
        let options: &[(&str, &str)] = if minor == "1.13" {
            &[
                ("machine.network.hostname", r#""node-x""#),
                ("machine.features.stableHostname", "true"),
                ("machine.network.nameservers", r#"["1.1.1.1"]"#),
            ]
        } else {
            &[
                ("machine.install", r#"{"disk": "/dev/vda"}"#),
                (
                    "cluster.controlPlane",
                    r#"{"endpoint": "https://192.168.10.5:6443"}"#,
                ),
                ("cluster.clusterName", r#""lab""#),
                ("cluster.network", r#"{"dnsDomain": "cluster.local"}"#),
                ("cluster.id", r#""abc""#),
                ("cluster.discovery", r#"{"enabled": true}"#),
                (
                    "machine.kubelet",
                    r#"{"image": "ghcr.io/siderolabs/kubelet:v1.36.3"}"#,
                ),
                ("machine.features.hostDNS", r#"{"enabled": true}"#),
                ("machine.network.nameservers", r#"["1.1.1.1"]"#),
                ("machine.time", r#"{"servers": ["pool.ntp.org"]}"#),
                ("cluster.proxy", r#"{"disabled": true}"#),
                ("cluster.coreDNS", r#"{"disabled": true}"#),
                (
                    "machine.features.kubePrism",
                    r#"{"enabled": true, "port": 7445}"#,
                ),
                ("cluster.allowSchedulingOnControlPlanes", "true"),
                (
                    "cluster.apiServer",
                    r#"{"image": "registry.k8s.io/kube-apiserver:v1.36.3"}"#,
                ),
                ("cluster.ca", r#"{"crt": "LS0tCg==", "key": ""}"#),
                ("machine.nodeLabels", r#"{"a": "b"}"#),
                ("machine.network.hostname", r#""node-x""#),
                ("cluster.secretboxEncryptionSecret", r#""c2VjcmV0""#),
            ]
        };
        let (path, value) = options.choose(rng)?;
        put(
            v1(docs)?,
            path,
            Some(serde_json::from_str(value).expect("value")),
        )?;
        Some(format!("legacy {path} = {value}"))
    }),
    ("control-plane document on a worker", |docs, _, minor| {
        if minor == "1.13" || v1(docs)?["machine"]["type"] != "worker" {
            return None;
        }
        docs.push(json!({"apiVersion": "v1alpha1", "kind": "KubeSchedulerConfig", "image": "registry.k8s.io/kube-scheduler:v1.36.3"}));
        Some("a KubeSchedulerConfig on a worker".into())
    }),
    ("host DNS", |docs, _, minor| {
        if minor == "1.13" {
            put(
                v1(docs)?,
                "machine.features.hostDNS",
                Some(json!({"enabled": false, "forwardKubeDNSToHost": true})),
            )?;
        } else {
            put(
                doc(docs, "ResolverConfig")?,
                "hostDNS",
                Some(json!({"enabled": false, "forwardKubeDNSToHost": true})),
            )?;
        }
        Some("hostDNS forwarding without hostDNS".into())
    }),
    ("network interface", |docs, rng, minor| {
        if minor != "1.13" {
            return None;
        }
        let v = v1(docs)?;
        let interface = v
            .get_mut("machine")?
            .get_mut("network")?
            .get_mut("interfaces")?
            .get_mut(0)?;
        if rng.random_bool(0.5) {
            interface.as_object_mut()?.remove("interface")?;
            Some("an interface without a name".into())
        } else {
            interface["addresses"] = json!(["10.0.0.5/33"]);
            Some("an interface address 10.0.0.5/33".into())
        }
    }),
];

/// Every golden config, and `PER_GOLDEN` seeded mutations of each.
fn cases() -> Vec<Case> {
    // The seed comes from `ichor_testenv::rng` (printed, `ICHOR_TEST_SEED` replays another);
    // the mutations keep rand's StdRng, whose sequence for SEED the verdicts were settled on.
    let mut rng = StdRng::seed_from_u64(ichor_testenv::rng::seed(SEED));
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .expect("the golden folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("1.1"))
        })
        .collect();
    files.sort();
    assert_eq!(files.len(), 24, "the golden configs");
    let mut out = Vec::new();
    for file in files {
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("stem")
            .to_owned();
        let minor: &'static str = if stem.starts_with("1.13") {
            "1.13"
        } else {
            "1.14"
        };
        let text = std::fs::read_to_string(&file).expect("read a golden config");
        out.push(Case {
            name: stem.clone(),
            minor,
            text: text.clone(),
            loose: false,
        });
        let golden = parse(&text);
        let mut made = 0;
        let mut attempts = 0;
        while made < PER_GOLDEN && attempts < PER_GOLDEN * 20 {
            attempts += 1;
            let (kind, mutate) = MUTATIONS.choose(&mut rng).expect("mutations");
            let mut docs = golden.clone();
            let Some(what) = mutate(&mut docs, &mut rng, minor) else {
                continue;
            };
            made += 1;
            // CEL syntax errors are written by cel-go's ANTLR parser.
            let loose = what.ends_with("disk.dev_path ==");
            out.push(Case {
                name: format!("{stem}: {kind}: {what}"),
                minor,
                text: render(&docs),
                loose,
            });
        }
    }
    // Whole-text mutations: the document stream itself.
    for (minor, golden) in [
        ("1.13", "1.13-worker-flannel-plain.yaml"),
        ("1.14", "1.14-worker-flannel-plain.yaml"),
    ] {
        let text = std::fs::read_to_string(golden_dir().join(golden)).expect("read");
        for (what, changed, loose) in [
            (
                "a scalar document",
                format!("{text}---\njust a string\n"),
                false,
            ),
            ("a list document", format!("{text}---\n- a\n- b\n"), false),
            ("an empty document", format!("{text}---\n"), false),
            (
                "broken YAML",
                format!("{text}---\nmachine: [unclosed\n"),
                true,
            ),
            ("nothing at all", String::new(), false),
            (
                "only version and machine.type",
                "version: v1alpha1\nmachine:\n  type: controlplane\n".into(),
                false,
            ),
        ] {
            out.push(Case {
                name: format!("{golden}: {what}"),
                minor,
                text: changed,
                loose,
            });
        }
    }
    out
}

fn first_line(s: &str) -> &str {
    s.split([':', '\n']).next().unwrap_or_default()
}

async fn maintenance_node(minor: &str, host: u8) -> SimNode {
    let version = if minor == "1.13" {
        "v1.13.9"
    } else {
        "v1.14.1"
    };
    let addr = SocketAddr::from((SIM_APPLY_VERDICTS.ip(0, host), 0));
    SimNode::start_with(addr, version, Hardware::vm(u32::from(host)))
        .await
        .expect("start a node")
}

async fn pinned(node: &SimNode) -> TalosClient {
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect in maintenance mode")
}

#[tokio::test]
async fn verdicts_match_talos_on_every_golden_config_and_mutation() {
    let cases = cases();
    assert!(cases.len() > 300, "a few hundred cases, {}", cases.len());
    let n13 = maintenance_node("1.13", 11).await;
    let n14 = maintenance_node("1.14", 12).await;
    let (c13, c14) = (pinned(&n13).await, pinned(&n14).await);
    let mut mismatches = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for case in &cases {
        let (node, client) = if case.minor == "1.13" {
            (&n13, &c13)
        } else {
            (&n14, &c14)
        };
        let talos = talos_verdict(case.minor, &case.text, node.hardware());
        let sim = sim_verdict(client, &case.text).await;
        match (&talos, &sim) {
            (Ok(_), Ok(_)) => accepted += 1,
            (Err(t), Err(s)) if t == s || (case.loose && first_line(t) == first_line(s)) => {
                refused += 1;
            }
            _ => mismatches.push(format!(
                "{}\n  Talos:     {:?}\n  simulator: {:?}",
                case.name,
                talos.map(|_| "accepted".to_owned()),
                sim.map(|_| "accepted".to_owned())
            )),
        }
    }
    assert_eq!(
        n13.stage().await,
        Stage::Maintenance,
        "dry runs change nothing"
    );
    assert_eq!(
        n14.stage().await,
        Stage::Maintenance,
        "dry runs change nothing"
    );
    assert!(
        mismatches.is_empty(),
        "{} of {} verdicts differ from Talos's:\n{}",
        mismatches.len(),
        cases.len(),
        mismatches.join("\n")
    );
    eprintln!(
        "{} cases: {accepted} accepted, {refused} refused, as Talos",
        cases.len()
    );
    if std::env::var_os("APPLY_VERDICTS_LIST").is_some() {
        for case in &cases {
            eprintln!("{}", case.name);
        }
    }
    assert!(
        accepted > 40 && refused > 100,
        "both verdicts are exercised: {accepted} accepted, {refused} refused"
    );
    n13.stop().await;
    n14.stop().await;
}

#[tokio::test]
async fn a_refused_config_changes_nothing() {
    for (minor, host) in [("1.13", 21u8), ("1.14", 22u8)] {
        let node = maintenance_node(minor, host).await;
        let fingerprint = node.fingerprint();
        let client = pinned(&node).await;
        let config = "version: v1alpha1\nmachine:\n  type: controlplane\n";
        let talos = talos_verdict(minor, config, node.hardware()).expect_err("Talos refuses it");
        let err = client
            .apply_configuration(config.as_bytes(), ichor_talos::ApplyMode::Auto)
            .await
            .expect_err("the simulator refuses it");
        let ichor_talos::TalosError::Rpc { status, .. } = &err else {
            panic!("an RPC refusal: {err}");
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{err}");
        assert_eq!(status.message(), talos, "Talos's message");
        // The node reached its verdict before it answered, and took nothing: no boot, no
        // install was set off that could change the node later.
        assert_eq!(node.calls("ApplyConfiguration"), 1, "the call was handled");
        assert_eq!(node.config_applies(), 0, "nothing set off");
        assert_eq!(node.stage().await, Stage::Maintenance);
        assert_eq!(
            node.fingerprint(),
            fingerprint,
            "the same boot, the same certificate"
        );
        assert!(!node.installed().await);
        // The node still takes a config Talos accepts.
        let good = std::fs::read_to_string(
            golden_dir().join(format!("{minor}-controlplane-flannel-patched.yaml")),
        )
        .expect("read");
        assert!(talos_verdict(minor, &good, node.hardware()).is_ok());
        pinned(&node)
            .await
            .apply_configuration(good.as_bytes(), ichor_talos::ApplyMode::Auto)
            .await
            .expect("a valid config is accepted after a refused one");
        assert_eq!(node.config_applies(), 1, "the valid config is taken");
        node.stop().await;
    }
}

#[tokio::test]
async fn warnings_come_back_as_talos_gives_them() {
    type Edit = fn(&mut Vec<Value>) -> Option<()>;
    let edits: [(&str, &str, Edit); 4] = [
        ("1.14", "1.14-worker-flannel-plain.yaml", |docs| {
            put(
                doc(docs, "UnattendedInstallConfig")?,
                "installer.image",
                None,
            )
        }),
        ("1.13", "1.13-worker-none-plain.yaml", |docs| {
            put(v1(docs)?, "machine.type", Some(json!("")))
        }),
        ("1.14", "1.14-controlplane-flannel-patched.yaml", |docs| {
            put(doc(docs, "KubeProxyConfig")?, "mode", Some(json!("ipvs")))
        }),
        ("1.13", "1.13-controlplane-flannel-plain.yaml", |docs| {
            put(v1(docs)?, "cluster.network.cni.name", Some(json!("custom")))
        }),
    ];
    for (i, (minor, golden, edit)) in edits.into_iter().enumerate() {
        let mut docs = parse(&std::fs::read_to_string(golden_dir().join(golden)).expect("read"));
        edit(&mut docs).expect("the edit applies");
        let config = render(&docs);
        let node = maintenance_node(minor, 41 + u8::try_from(i).expect("small")).await;
        let talos = talos_verdict(minor, &config, node.hardware()).expect("Talos accepts it");
        let expected: Vec<String> = talos["warnings"]
            .as_array()
            .expect("Talos warns")
            .iter()
            .map(|w| w.as_str().expect("text").to_owned())
            .collect();
        let applied = pinned(&node)
            .await
            .apply_configuration(config.as_bytes(), ichor_talos::ApplyMode::Auto)
            .await
            .expect("the simulator accepts it");
        assert_eq!(applied.warnings, expected, "{golden}");
        node.stop().await;
    }
}

/// A `UserVolumeConfig` appended to a golden config, the way its checks are exercised below.
fn with_user_volume(minor: &str, documents: &str) -> String {
    let golden =
        std::fs::read_to_string(golden_dir().join(format!("{minor}-worker-flannel-plain.yaml")))
            .expect("read");
    format!("{}\n---\n{documents}", golden.trim_end())
}

/// The user volume documents whose verdicts are compared: valid ones, and each check of
/// `UserVolumeConfigV1Alpha1` (decode, Validate, the container) failing alone or together.
const USER_VOLUMES: &[&str] = &[
    "name: data\nprovisioning:\n  diskSelector:\n    match: disk.transport == 'virtio'\n  minSize: 1GiB\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: '!system_disk'\n  maxSize: 50%\nfilesystem:\n  type: ext4\n",
    "name: EPHEMERAL\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n  maxSize: -10GiB\n  grow: true\n",
    "name: \"\"\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n",
    "provisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n",
    "name: a_b\nprovisioning:\n  minSize: 1GiB\n",
    "name: abcdefghijabcdefghijabcdefghijabcde\nprovisioning:\n  diskSelector:\n    match: 'true'\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 2GiB\n  maxSize: 1GiB\nfilesystem:\n  type: vfat\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nfilesystem:\n  type: btrfs\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nfilesystem:\n  type: ext4\n  projectQuotaSupport: true\n",
    "name: data\nvolumeType: tmpfs\n",
    "name: data\nvolumeType: bogus\n",
    "name: data\nvolumeType: directory\n",
    "name: data\nvolumeType: directory\nmount:\n  secure: false\nfilesystem:\n  type: xfs\n",
    "name: data\nvolumeType: directory\nmount:\n  disableAccessTime: true\nprovisioning:\n  grow: false\n",
    "name: data\nvolumeType: Disk\nprovisioning:\n  diskSelector:\n    match: 'true'\nfilesystem:\n  type: XFS\n",
    "name: data\nvolumeType: disk\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n  grow: true\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: disk.size > 120\n  minSize: -1GiB\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: big\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  maxSize: 150%\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  maxSize: x%\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  maxSize: 12XB\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  maxSize: 1GiB\n  minSize: 50%\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nencryption:\n  provider: luks3\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nencryption:\n  provider: luks2\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nencryption:\n  cipher: aes-xts-plain64\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nencryption:\n  provider: luks2\n  keys:\n    - slot: 0\n    - slot: 0\n      tpm:\n        options:\n          pcrs: [24]\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nencryption:\n  provider: luks2\n  keys:\n    - slot: 0\n      nodeID: {}\n    - slot: 1\n      static:\n        passphrase: x\n        foo: 1\n      bar: 2\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n  foo: 1\nbar: 2\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nfilesystem:\n  type: xfs\n  xfs:\n    minAllocationGroupSize: 1GiB\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nfilesystem:\n  type: ext4\n  xfs: {}\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\ntrim:\n  interval: -1s\nscrub:\n  interval: 5s\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\ntrim:\n  interval: bogus\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\nscrub:\n  enabled: true\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n",
    "name: data\nprovisioning:\n  diskSelector:\n    match: 'true'\n  minSize: 1GiB\n---\napiVersion: v1alpha1\nkind: ExistingVolumeConfig\nname: data\ndiscovery:\n  volumeSelector:\n    match: volume.partition_label == 'x'\n",
];

#[tokio::test]
async fn user_volume_verdicts_match_talos() {
    let mut mismatches = Vec::new();
    let (mut accepted, mut refused) = (0, 0);
    for (minor, host) in [("1.13", 1u8), ("1.14", 2u8)] {
        let version = if minor == "1.13" {
            "v1.13.9"
        } else {
            "v1.14.1"
        };
        let addr = SocketAddr::from((SIM_APPLY_VERDICTS.ip(1, host), 0));
        let node = SimNode::start_with(addr, version, Hardware::vm(u32::from(host) + 170))
            .await
            .expect("start a node");
        let client = pinned(&node).await;
        for documents in USER_VOLUMES {
            let text = with_user_volume(
                minor,
                &format!("apiVersion: v1alpha1\nkind: UserVolumeConfig\n{documents}"),
            );
            let talos = talos_verdict(minor, &text, node.hardware());
            let sim = sim_verdict(&client, &text).await;
            match (&talos, &sim) {
                (Ok(_), Ok(_)) => accepted += 1,
                (Err(t), Err(s)) if t == s => refused += 1,
                _ => mismatches.push(format!(
                    "{minor} {documents:?}\n  Talos:     {:?}\n  simulator: {:?}",
                    talos.map(|_| "accepted".to_owned()),
                    sim.map(|_| "accepted".to_owned())
                )),
            }
        }
        node.stop().await;
    }
    assert!(
        mismatches.is_empty(),
        "{} verdicts differ from Talos's:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    assert!(
        accepted >= 8 && refused >= 40,
        "both verdicts are exercised: {accepted} accepted, {refused} refused"
    );
}
