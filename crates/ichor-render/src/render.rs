//! Machine-config rendering: cluster spec + machine spec + secrets bundle + patches → the exact
//! multi-document YAML applied to a node, per version contract (talos-facts §4.5, §8.2).
//!
//! Contract 1.13 renders the classic v1alpha1 document (with `machine.install`) and a
//! `HostnameConfig`; contract 1.14 renders a slim v1alpha1 document and typed documents
//! (`KubeClusterConfig`, `KubeNetworkConfig`, `KubeProxyConfig`, `UnattendedInstallConfig`, …),
//! never a legacy `machine.install`. The shapes follow what Talos's own generator emits for the
//! same inputs; `tests/oracle.rs` checks that against Talos's code.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ichor_api::cluster::{CniPreset, KubeProxyMode, TalosClusterSpec};
use ichor_api::common::{InstallSpec, Role};
use ichor_api::config::ConfigPatch;
use ichor_api::machine::KubernetesComponents;
use ichor_api::schematic::Schematic;
use ichor_api::storage::{Filesystem, UserVolume};
use serde_json::{Map, Value, json};

use crate::Contract;
use crate::bundle::SecretsBundle;
use crate::patch::{self, PatchError};
use crate::schematic;

/// Talos 1.13's default installer repository (talos-facts §4.7).
const GHCR_INSTALLER: &str = "ghcr.io/siderolabs/installer";
/// The disk Talos installs to when nothing else is said (talos-facts §4.7).
const DEFAULT_INSTALL_DISK: &str = "/dev/sda";

/// What went wrong rendering a config.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The cluster's Talos version has no supported contract.
    #[error(transparent)]
    UnsupportedVersion(#[from] crate::UnsupportedVersion),
    /// An input cannot be expressed on this contract.
    #[error("{field}: {reason}")]
    Input {
        /// The spec field at fault, e.g. `install.diskSelector.match`.
        field: &'static str,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A patch could not be applied.
    #[error(transparent)]
    Patch(#[from] PatchError),
    /// Two TalosStorages give the machine a volume of the same name.
    #[error(
        "TalosStorages {first} and {second} both give this machine a volume named {volume}: rename one, or narrow a machineSelector"
    )]
    VolumeConflict {
        /// The volume name.
        volume: String,
        /// The storage that gave it first (by name).
        first: String,
        /// The other storage.
        second: String,
    },
    /// The schematic's ID cannot be computed exactly.
    #[error(transparent)]
    Schematic(#[from] schematic::SchematicError),
    /// The documents could not be serialized.
    #[error("cannot serialize the rendered config: {0}")]
    Serialize(String),
}

/// Everything a machine's config is rendered from.
#[derive(Debug, Clone, Copy)]
pub struct RenderInput<'a> {
    /// The cluster's name (the TalosCluster's name).
    pub cluster_name: &'a str,
    /// The cluster spec.
    pub cluster: &'a TalosClusterSpec,
    /// The machine's role.
    pub role: Role,
    /// The machine's hostname; Talos picks a stable one when absent.
    pub hostname: Option<&'a str>,
    /// Install settings: the machine's, else the class's, else the cluster's.
    pub install: Option<&'a InstallSpec>,
    /// The Image Factory schematic of the machine's installer: the machine's, else the
    /// class's, else the cluster's (`None`: the factory's empty schematic).
    pub schematic: Option<&'a Schematic>,
    /// The oldest Talos a node of the cluster runs, when one reports its version: the config
    /// contract never runs ahead of it (talos-facts §9.9).
    pub oldest_running: Option<&'a str>,
    /// The version of each Kubernetes component the config names where it is not the
    /// cluster's (a Kubernetes rollout stepping through the nodes); `None`: all the cluster's.
    pub kubernetes: Option<&'a KubernetesComponents>,
    /// Extra certificate SANs for the node's Talos API.
    pub cert_sans: &'a [String],
    /// Kubernetes labels for the node, beside the role's own.
    pub node_labels: &'a BTreeMap<String, String>,
    /// Kubernetes taints for the node (`key: value:Effect` or `key: Effect`), beside the role's.
    pub node_taints: &'a BTreeMap<String, String>,
    /// Patch layers in application order: cluster, class, machine.
    pub patches: &'a [&'a [ConfigPatch]],
    /// The cluster's secrets.
    pub bundle: &'a SecretsBundle,
}

impl<'a> RenderInput<'a> {
    /// The input for a machine of `role` with nothing of its own: no hostname, install
    /// settings, certificate SANs, labels, taints or patches. Set any of them with struct
    /// update syntax.
    pub fn plain(
        cluster_name: &'a str,
        cluster: &'a TalosClusterSpec,
        role: Role,
        bundle: &'a SecretsBundle,
    ) -> Self {
        static NONE: BTreeMap<String, String> = BTreeMap::new();
        Self {
            cluster_name,
            cluster,
            role,
            hostname: None,
            install: None,
            schematic: None,
            oldest_running: None,
            kubernetes: None,
            cert_sans: &[],
            node_labels: &NONE,
            node_taints: &NONE,
            patches: &[],
            bundle,
        }
    }
}

/// A rendered config: its documents, its bytes and their content hash.
#[derive(Clone, PartialEq)]
pub struct Rendered {
    /// The contract it was rendered for.
    pub contract: Contract,
    /// The documents, in order (the v1alpha1 document first).
    pub documents: Vec<Value>,
    /// The multi-document YAML applied to the node.
    pub yaml: String,
    /// `sha256:<hex>` of `yaml`, for drift detection.
    pub hash: String,
    /// The installer the machine installs and upgrades with ([`installer_image`]).
    pub installer: Installer,
}

/// The installer a machine installs and upgrades with, and what its node proves of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installer {
    /// The image.
    pub image: String,
    /// The Image Factory schematic ID it was built from, when Ichor derived it from a
    /// schematic (the node then reports that ID, talos-facts §9.5); `None` for an explicit
    /// `install.image`, which opts out of schematic verification, and for Talos 1.13's
    /// default installer, which carries no schematic.
    pub schematic: Option<String>,
}

impl std::fmt::Debug for Rendered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The documents hold the cluster's secrets.
        f.debug_struct("Rendered")
            .field("contract", &self.contract)
            .field("documents", &self.documents.len())
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

fn input_error(field: &'static str, reason: impl Into<String>) -> RenderError {
    RenderError::Input {
        field,
        reason: reason.into(),
    }
}

fn b64(text: &str) -> String {
    STANDARD.encode(text.as_bytes())
}

/// A typed document with its header.
/// The control-plane static pods a config turns off, by their Kubernetes names
/// (`kube-controller-manager`, `kube-scheduler`), as Talos decides (talos-facts §14.2): the
/// typed document's `enabled: false` where the config has that document, else v1alpha1's
/// `machine.controlPlane.{controllerManager,scheduler}.disabled: true`. `kube-apiserver`
/// always runs on a control plane.
pub fn disabled_static_pods(documents: &[Value]) -> Vec<&'static str> {
    [
        (
            "KubeControllerManagerConfig",
            "controllerManager",
            "kube-controller-manager",
        ),
        ("KubeSchedulerConfig", "scheduler", "kube-scheduler"),
    ]
    .into_iter()
    .filter(|(kind, field, _)| {
        let typed = documents
            .iter()
            .find(|d| d.get("kind").and_then(Value::as_str) == Some(kind));
        match typed {
            Some(document) => document.get("enabled").and_then(Value::as_bool) == Some(false),
            None => documents.iter().any(|d| {
                d.pointer(&format!("/machine/controlPlane/{field}/disabled"))
                    .and_then(Value::as_bool)
                    == Some(true)
            }),
        }
    })
    .map(|(_, _, name)| name)
    .collect()
}

fn doc(kind: &str, body: Value) -> Value {
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!("v1alpha1"));
    out.insert("kind".into(), json!(kind));
    if let Value::Object(fields) = body {
        out.extend(fields);
    }
    Value::Object(out)
}

/// `vX.Y.Z` for image tags from a Kubernetes version written with or without the `v`.
fn k8s_tag(version: &str) -> String {
    format!("v{}", version.trim_start_matches('v'))
}

/// The image tag of each Kubernetes component a config names: the cluster's version, unless
/// the input holds a component at another one while a Kubernetes rollout steps through the
/// nodes (talos-facts §9.7).
struct Tags {
    api_server: String,
    controller_manager: String,
    scheduler: String,
    proxy: String,
    kubelet: String,
}

impl Tags {
    /// The tags `input` renders with.
    fn of(input: &RenderInput<'_>) -> Self {
        let held = input.kubernetes;
        let tag = |pick: fn(&KubernetesComponents) -> Option<&String>| {
            k8s_tag(
                held.and_then(pick)
                    .map_or(input.cluster.kubernetes_version.as_str(), String::as_str),
            )
        };
        Self {
            api_server: tag(|k| k.api_server.as_ref()),
            controller_manager: tag(|k| k.controller_manager.as_ref()),
            scheduler: tag(|k| k.scheduler.as_ref()),
            proxy: tag(|k| k.proxy.as_ref()),
            kubelet: tag(|k| k.kubelet.as_ref()),
        }
    }
}

/// Renders a machine's config: the documents of `input.role` for the contract of
/// `input.cluster.talos_version`, then the patch layers in order. Deterministic: the same
/// input gives the same bytes and hash.
///
/// ```
/// use std::collections::BTreeMap;
///
/// use ichor_api::cluster::TalosClusterSpec;
/// use ichor_api::common::Role;
/// use ichor_api::config::ConfigPatch;
/// use ichor_render::{Contract, RenderError, RenderInput, SecretsBundle, render};
///
/// let cluster: TalosClusterSpec = serde_json::from_value(serde_json::json!({
///     "talosVersion": "v1.14.1",
///     "kubernetesVersion": "1.36.3",
///     "endpoint": "https://10.0.0.10:6443",
///     "controlPlane": {"count": 3},
/// }))?;
/// let bundle = SecretsBundle::generate(Contract::V1_14)?;
/// // A typed-document patch: a label on the worker's Kubernetes node.
/// let label: ConfigPatch = serde_json::from_value(serde_json::json!({
///     "documents": {"KubeNodeConfig": {"labels": {"tier": "edge"}}},
/// }))?;
/// let labels = [label];
/// let none = BTreeMap::new();
/// let input = RenderInput {
///     cluster_name: "lab",
///     cluster: &cluster,
///     role: Role::Worker,
///     hostname: None,
///     install: None,
///     schematic: None,
///     oldest_running: None,
///     kubernetes: None,
///     cert_sans: &[],
///     node_labels: &none,
///     node_taints: &none,
///     patches: &[&labels],
///     bundle: &bundle,
/// };
/// let rendered = render(&input)?;
/// assert_eq!(render(&input)?.yaml, rendered.yaml, "same input, same bytes");
/// let node = rendered
///     .documents
///     .iter()
///     .find(|d| d["kind"] == "KubeNodeConfig")
///     .expect("a KubeNodeConfig document");
/// assert_eq!(node["labels"]["tier"], "edge");
///
/// // On contract 1.14 `machine.install` is replaced by UnattendedInstallConfig: refused.
/// let legacy: ConfigPatch = serde_json::from_value(serde_json::json!({
///     "machine": {"install": {"disk": "/dev/sdb"}},
/// }))?;
/// let legacy = [legacy];
/// let refused = render(&RenderInput { patches: &[&legacy], ..input });
/// assert!(matches!(refused, Err(RenderError::Patch(_))), "{refused:?}");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn render(input: &RenderInput<'_>) -> Result<Rendered, RenderError> {
    render_with_volumes(input, &[])
}

/// [`render()`], with user volumes: one `UserVolumeConfig` document per volume (both
/// contracts have the kind, talos-facts §4.4; its fields: crates/ichor-sim/docs/user-volumes.md),
/// in the order given, after the role's documents and before the patches, so a patch can
/// still adjust them.
pub fn render_with_volumes(
    input: &RenderInput<'_>,
    volumes: &[&UserVolume],
) -> Result<Rendered, RenderError> {
    let contract = contract_in_force(input)?;
    let mut documents = match contract {
        Contract::V1_13 => render_1_13(input)?,
        Contract::V1_14 => render_1_14(input)?,
    };
    for volume in volumes {
        documents.push(user_volume(volume)?);
    }
    for (layer, patches) in ["cluster", "class", "machine"].iter().zip(input.patches) {
        for (index, p) in patches.iter().enumerate() {
            patch::apply(&mut documents, contract, layer, index, p)?;
        }
    }
    let yaml = to_yaml(&documents)?;
    let hash = config_hash(&yaml);
    let installer = installer(input)?;
    Ok(Rendered {
        installer,
        contract,
        documents,
        yaml,
        hash,
    })
}

/// The contract a config is rendered for: the cluster's Talos version's, but never ahead of
/// the oldest Talos a node of the cluster runs (talos-facts §9.9: a config for a newer
/// contract is refused by an older Talos). A node older than every contract Ichor renders
/// leaves the declared one in force (it is refused before its first apply).
pub fn contract_in_force(input: &RenderInput<'_>) -> Result<Contract, RenderError> {
    let declared = Contract::from_version(&input.cluster.talos_version)?;
    let running = input
        .oldest_running
        .and_then(|version| Contract::from_version(version).ok());
    Ok(running.map_or(declared, |running| running.min(declared)))
}

/// The content hash of a config's YAML, `sha256:<hex>`, as [`Rendered::hash`] and
/// `status.appliedConfigHash` carry it.
pub fn config_hash(yaml: &str) -> String {
    format!(
        "sha256:{}",
        hex(ring::digest::digest(&ring::digest::SHA256, yaml.as_bytes()).as_ref())
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Serializes documents as one YAML stream.
pub fn to_yaml(documents: &[Value]) -> Result<String, RenderError> {
    let mut out = String::new();
    for (i, document) in documents.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let text =
            serde_saphyr::to_string(document).map_err(|e| RenderError::Serialize(e.to_string()))?;
        out.push_str(&text);
        if !text.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

fn is_cp(input: &RenderInput<'_>) -> bool {
    input.role == Role::ControlPlane
}

fn hostname_doc(input: &RenderInput<'_>) -> Value {
    match input.hostname {
        Some(name) => doc("HostnameConfig", json!({"auto": "off", "hostname": name})),
        None => doc("HostnameConfig", json!({"auto": "stable"})),
    }
}

/// The installer image a machine installs (and upgrades) with: `install.image` when set (its
/// builder's own, opting out of schematics); else the factory's installer for the schematic
/// and the cluster's Talos version (talos-facts §9.4), but for a declared Talos 1.13 without a
/// schematic, whose default installer is `ghcr.io/siderolabs/installer` (§4.7; Talos 1.14 no
/// longer publishes it, §9.4, so the declared version decides, not the contract in force).
pub fn installer_image(input: &RenderInput<'_>) -> Result<String, RenderError> {
    Ok(installer(input)?.image)
}

/// The installer image with the schematic it was derived from (see [`installer_image`]).
fn installer(input: &RenderInput<'_>) -> Result<Installer, RenderError> {
    if let Some(image) = input.install.and_then(|i| i.image.clone()) {
        return Ok(Installer {
            image,
            schematic: None,
        });
    }
    let tag = &input.cluster.talos_version;
    let declared = Contract::from_version(tag)?;
    let schematic = match (input.schematic, declared) {
        (None, Contract::V1_13) => {
            return Ok(Installer {
                image: format!("{GHCR_INSTALLER}:{tag}"),
                schematic: None,
            });
        }
        (None, _) => schematic::EMPTY_ID.to_owned(),
        (Some(declared), _) => schematic::id(declared)?,
    };
    Ok(Installer {
        image: schematic::installer_image(&input.cluster.image_factory, &schematic, tag),
        schematic: Some(schematic),
    })
}

/// The schematic a machine's installer is built with: its own, else its class's, else its
/// cluster's (the most specific one applies whole, ADR 0067).
pub fn machine_schematic<'a>(
    cluster: &'a ichor_api::TalosCluster,
    machine: &'a ichor_api::TalosMachine,
    layers: &MachineLayers<'a>,
) -> Option<&'a Schematic> {
    machine
        .spec
        .schematic
        .as_ref()
        .or_else(|| layers.class.and_then(|c| c.spec.schematic.as_ref()))
        .or(cluster.spec.schematic.as_ref())
}

fn wipe(input: &RenderInput<'_>) -> bool {
    input.install.and_then(|i| i.wipe).unwrap_or(false)
}

/// The v1alpha1 document of contract 1.13 (talos-facts §4.2, §4.5).
fn render_1_13(input: &RenderInput<'_>) -> Result<Vec<Value>, RenderError> {
    let b = input.bundle;
    let cluster = input.cluster;
    let cp = is_cp(input);
    let tags = Tags::of(input);

    let mut install = Map::new();
    let selector = input.install.and_then(|i| i.disk_selector.as_ref());
    match (input.install.and_then(|i| i.disk.clone()), selector) {
        (Some(disk), _) => {
            install.insert("disk".into(), json!(disk));
        }
        (None, Some(selector)) => {
            if selector.match_.is_some() {
                return Err(input_error(
                    "install.diskSelector.match",
                    "a CEL disk selector needs contract v1.14 or later; on v1.13 use size, model, serial, type, busPath or wwid",
                ));
            }
            let mut fields = Map::new();
            for (key, value) in [
                ("size", &selector.size),
                ("model", &selector.model),
                ("serial", &selector.serial),
                ("type", &selector.type_),
                ("busPath", &selector.bus_path),
                ("wwid", &selector.wwid),
            ] {
                if let Some(v) = value {
                    fields.insert(key.into(), json!(v));
                }
            }
            install.insert("diskSelector".into(), Value::Object(fields));
        }
        (None, None) => {
            install.insert("disk".into(), json!(DEFAULT_INSTALL_DISK));
        }
    }
    install.insert("image".into(), json!(installer_image(input)?));
    install.insert("wipe".into(), json!(wipe(input)));
    install.insert("grubUseUKICmdline".into(), json!(true));

    let mut machine = json!({
        "type": input.role.as_str(),
        "token": b.trustd_info.token.0,
        "ca": {"crt": b64(&b.certs.os.crt.0), "key": if cp { b64(&b.certs.os.key.0) } else { String::new() }},
        "certSANs": input.cert_sans,
        "kubelet": {
            "image": format!("ghcr.io/siderolabs/kubelet:{}", tags.kubelet),
            "defaultRuntimeSeccompProfileEnabled": true,
            "disableManifestsDirectory": true
        },
        "install": install,
        "features": {
            "diskQuotaSupport": true,
            "kubePrism": {"enabled": true, "port": 7445},
            "hostDNS": {"enabled": true, "forwardKubeDNSToHost": true}
        }
    });
    let mut labels = input.node_labels.clone();
    if cp {
        labels.insert(
            "node.kubernetes.io/exclude-from-external-load-balancers".into(),
            String::new(),
        );
    }
    if !labels.is_empty() {
        machine["nodeLabels"] = json!(labels);
    }
    if !input.node_taints.is_empty() {
        machine["nodeTaints"] = json!(input.node_taints);
    }

    let mut network = json!({
        "dnsDomain": cluster.network.dns_domain,
        "podSubnets": cluster.network.pod_subnets,
        "serviceSubnets": cluster.network.service_subnets
    });
    if cluster.cni.preset != CniPreset::Flannel {
        network["cni"] = json!({"name": "none"});
    }
    let mut spec = json!({
        "id": b.cluster.id.0,
        "secret": b.cluster.secret.0,
        "controlPlane": {"endpoint": cluster.endpoint},
        "clusterName": input.cluster_name,
        "network": network,
        "token": b.secrets.bootstrap_token.0,
        "ca": {"crt": b64(&b.certs.k8s.crt.0), "key": if cp { b64(&b.certs.k8s.key.0) } else { String::new() }},
        "discovery": {"enabled": true, "registries": {"kubernetes": {"disabled": true}, "service": {}}}
    });
    if cp {
        let extra = json!({
            "secretboxEncryptionSecret": b.secrets.secretbox_encryption_secret.0,
            "aggregatorCA": {"crt": b64(&b.certs.k8s_aggregator.crt.0), "key": b64(&b.certs.k8s_aggregator.key.0)},
            "serviceAccount": {"key": b64(&b.certs.k8s_service_account.key.0)},
            "apiServer": {
                "image": format!("registry.k8s.io/kube-apiserver:{}", tags.api_server),
                "admissionControl": [{"name": "PodSecurity", "configuration": pod_security()}],
                "auditPolicy": audit_policy()
            },
            "controllerManager": {"image": format!("registry.k8s.io/kube-controller-manager:{}", tags.controller_manager)},
            "proxy": kube_proxy_1_13(cluster, &tags.proxy),
            "scheduler": {"image": format!("registry.k8s.io/kube-scheduler:{}", tags.scheduler)},
            "etcd": {"ca": {"crt": b64(&b.certs.etcd.crt.0), "key": b64(&b.certs.etcd.key.0)}}
        });
        merge_objects(&mut spec, extra);
    }
    let v1alpha1 = json!({
        "version": "v1alpha1",
        "debug": false,
        "persist": true,
        "machine": machine,
        "cluster": spec
    });
    Ok(vec![v1alpha1, hostname_doc(input)])
}

fn kube_proxy_1_13(cluster: &TalosClusterSpec, k8s: &str) -> Value {
    match cluster.kube_proxy {
        KubeProxyMode::Enabled => json!({"image": format!("registry.k8s.io/kube-proxy:{k8s}")}),
        KubeProxyMode::Disabled => {
            json!({"image": format!("registry.k8s.io/kube-proxy:{k8s}"), "disabled": true})
        }
    }
}

fn merge_objects(target: &mut Value, extra: Value) {
    if let (Value::Object(t), Value::Object(e)) = (target, extra) {
        t.extend(e);
    }
}

fn pod_security() -> Value {
    json!({
        "apiVersion": "pod-security.admission.config.k8s.io/v1alpha1",
        "kind": "PodSecurityConfiguration",
        "defaults": {
            "audit": "restricted", "audit-version": "latest",
            "enforce": "baseline", "enforce-version": "latest",
            "warn": "restricted", "warn-version": "latest"
        },
        "exemptions": {"namespaces": ["kube-system"], "runtimeClasses": [], "usernames": []}
    })
}

fn audit_policy() -> Value {
    json!({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [{"level": "Metadata"}]})
}

/// The CEL disk selector of contract 1.14.
fn disk_match(input: &RenderInput<'_>) -> Result<String, RenderError> {
    let install = input.install;
    if let Some(disk) = install.and_then(|i| i.disk.as_deref()) {
        return Ok(format!("disk.dev_path == \"{disk}\""));
    }
    match install.and_then(|i| i.disk_selector.as_ref()) {
        Some(selector) => {
            let legacy = [
                &selector.size,
                &selector.model,
                &selector.serial,
                &selector.type_,
                &selector.bus_path,
                &selector.wwid,
            ];
            if legacy.iter().any(|f| f.is_some()) {
                return Err(input_error(
                    "install.diskSelector",
                    "size, model, serial, type, busPath and wwid select disks on contract v1.13 only; on v1.14 write a CEL expression in install.diskSelector.match, e.g. disk.size > 100u * GB",
                ));
            }
            selector.match_.clone().ok_or_else(|| {
                input_error(
                    "install.diskSelector.match",
                    "an empty disk selector selects nothing",
                )
            })
        }
        None => Ok(format!("disk.dev_path == \"{DEFAULT_INSTALL_DISK}\"")),
    }
}

/// The documents of contract 1.14 (talos-facts §4.4, §4.5, §8.2).
fn render_1_14(input: &RenderInput<'_>) -> Result<Vec<Value>, RenderError> {
    let b = input.bundle;
    let cluster = input.cluster;
    let cp = is_cp(input);
    let tags = Tags::of(input);

    let mut cluster_section = json!({"token": b.secrets.bootstrap_token.0});
    if cp {
        cluster_section["etcd"] =
            json!({"ca": {"crt": b64(&b.certs.etcd.crt.0), "key": b64(&b.certs.etcd.key.0)}});
    }
    let v1alpha1 = json!({
        "version": "v1alpha1",
        "debug": false,
        "persist": true,
        "machine": {
            "type": input.role.as_str(),
            "token": b.trustd_info.token.0,
            "ca": {"crt": b64(&b.certs.os.crt.0), "key": if cp { b64(&b.certs.os.key.0) } else { String::new() }},
            "certSANs": input.cert_sans,
            "features": {"diskQuotaSupport": true}
        },
        "cluster": cluster_section
    });

    let mut docs = vec![
        v1alpha1,
        doc(
            "DiscoveryServiceConfig",
            json!({"name": "default", "endpoint": "https://discovery.talos.dev/"}),
        ),
        doc(
            "DiscoveryIdentityConfig",
            json!({"clusterID": b.cluster.id.0, "clusterSecret": b.cluster.secret.0}),
        ),
        doc(
            "UnattendedInstallConfig",
            json!({
                "installer": {"image": installer_image(input)?},
                "provisioning": {"diskSelector": {"match": disk_match(input)?}, "wipe": wipe(input)},
                "reboot": true
            }),
        ),
        doc(
            "ResolverConfig",
            json!({"hostDNS": {"enabled": true, "forwardKubeDNSToHost": true}}),
        ),
        doc(
            "VolumeConfig",
            json!({"name": "EPHEMERAL", "mount": {"secure": true}}),
        ),
        doc("FilesystemTrimConfig", json!({"interval": "168h0m0s"})),
        doc("SecurityProfileConfig", json!({"workloadIsolation": true})),
        hostname_doc(input),
        doc(
            "KubeClusterConfig",
            json!({"clusterName": input.cluster_name, "endpoint": cluster.endpoint}),
        ),
    ];
    let mut labels = input.node_labels.clone();
    let mut taints = input.node_taints.clone();
    if cp {
        labels.insert(
            "node-role.kubernetes.io/control-plane".into(),
            String::new(),
        );
        labels.insert(
            "node.kubernetes.io/exclude-from-external-load-balancers".into(),
            String::new(),
        );
        taints.insert(
            "node-role.kubernetes.io/control-plane".into(),
            "NoSchedule".into(),
        );
    }
    let mut node = json!({"nodeIP": {}});
    if !labels.is_empty() {
        node["labels"] = json!(labels);
    }
    if !taints.is_empty() {
        node["taints"] = json!(taints);
    }
    docs.push(doc("KubeNodeConfig", node));
    docs.push(doc(
        "KubeletConfig",
        json!({"image": format!("ghcr.io/siderolabs/kubelet:{}", tags.kubelet), "config": {}, "defaultRuntimeSeccompProfileEnabled": true}),
    ));
    docs.push(doc(
        "KubeNetworkConfig",
        json!({
            "dnsDomain": cluster.network.dns_domain,
            "podSubnets": cluster.network.pod_subnets,
            "serviceSubnets": cluster.network.service_subnets
        }),
    ));
    if cp {
        docs.push(doc(
            "KubeAPIServerCAConfig",
            json!({"issuingCA": {"cert": b.certs.k8s.crt.0, "key": b.certs.k8s.key.0}}),
        ));
    } else {
        docs.push(doc(
            "KubeAPIServerCAConfig",
            json!({"acceptedCAs": [b.certs.k8s.crt.0]}),
        ));
    }
    docs.push(doc("KubePrismConfig", json!({"port": 7445})));
    if cp {
        docs.extend(control_plane_1_14(input, &tags));
    }
    Ok(docs)
}

fn control_plane_1_14(input: &RenderInput<'_>, tags: &Tags) -> Vec<Value> {
    let b = input.bundle;
    let cluster = input.cluster;
    let mut docs = vec![
        doc(
            "KubeAggregatorCAConfig",
            json!({"issuingCA": {"cert": b.certs.k8s_aggregator.crt.0, "key": b.certs.k8s_aggregator.key.0}}),
        ),
        doc(
            "KubeAdmissionControlConfig",
            json!({"name": "PodSecurity", "configuration": pod_security()}),
        ),
        doc(
            "KubeAuditPolicyConfig",
            json!({"configuration": audit_policy()}),
        ),
        doc(
            "KubeAuthenticationConfig",
            json!({"configuration": {
                "anonymous": {"conditions": [{"path": "/livez"}, {"path": "/readyz"}, {"path": "/healthz"}], "enabled": true},
                "jwt": []
            }}),
        ),
        doc(
            "KubeAuthorizerConfig",
            json!({"name": "node", "type": "Node"}),
        ),
        doc(
            "KubeAuthorizerConfig",
            json!({"name": "rbac", "type": "RBAC"}),
        ),
        doc(
            "KubeEtcdEncryptionConfig",
            json!({"config": {"resources": [{
                "providers": [{"secretbox": {"keys": [{"name": "key2", "secret": b.secrets.secretbox_encryption_secret.0}]}}],
                "resources": ["secrets"]
            }]}}),
        ),
        doc(
            "KubeServiceAccountConfig",
            json!({"issuer": {"privateKey": b.certs.k8s_service_account.key.0, "issuerURL": cluster.endpoint}}),
        ),
        doc(
            "KubeAPIServerConfig",
            json!({"image": format!("registry.k8s.io/kube-apiserver:{}", tags.api_server)}),
        ),
        doc(
            "KubeControllerManagerConfig",
            json!({"image": format!("registry.k8s.io/kube-controller-manager:{}", tags.controller_manager)}),
        ),
        doc(
            "KubeSchedulerConfig",
            json!({"image": format!("registry.k8s.io/kube-scheduler:{}", tags.scheduler), "config": {}}),
        ),
    ];
    let proxy = match cluster.kube_proxy {
        KubeProxyMode::Enabled => {
            json!({"image": format!("registry.k8s.io/kube-proxy:{}", tags.proxy), "config": {}})
        }
        KubeProxyMode::Disabled => {
            json!({"enabled": false, "image": format!("registry.k8s.io/kube-proxy:{}", tags.proxy), "config": {}})
        }
    };
    docs.push(doc("KubeProxyConfig", proxy));
    if cluster.cni.preset == CniPreset::Flannel {
        docs.push(doc(
            "KubeFlannelCNIConfig",
            json!({"backendType": "vxlan", "backendPort": 4789}),
        ));
    }
    docs.push(doc("KubeCoreDNSConfig", json!({"enabled": true})));
    docs
}

/// The one `UserVolumeConfig` document of `volume`: a partition volume on a disk its CEL
/// selector matches, sizes in bytes (Talos's `ByteSize` reads a plain number as bytes,
/// `pkg/machinery/config/types/block/byte_size.go`), mounted at `/var/mnt/<name>`.
fn user_volume(volume: &UserVolume) -> Result<Value, RenderError> {
    let size =
        |field: &'static str, quantity: &Option<String>| -> Result<Option<u64>, RenderError> {
            quantity
                .as_deref()
                .map(|q| {
                    ichor_api::common::quantity_bytes(q).ok_or_else(|| RenderError::Input {
                        field,
                        reason: format!("{q:?} is not a size in bytes, e.g. 10Gi"),
                    })
                })
                .transpose()
        };
    let min = size("volumes[].minSize", &volume.min_size)?;
    let max = size("volumes[].maxSize", &volume.max_size)?;
    if min.is_none() && max.is_none() {
        return Err(RenderError::Input {
            field: "volumes[].minSize",
            reason: format!(
                "volume {:?} needs minSize or maxSize (Talos refuses a partition volume with neither)",
                volume.name
            ),
        });
    }
    let mut provisioning = serde_json::Map::new();
    provisioning.insert(
        "diskSelector".into(),
        json!({"match": volume.disk_selector}),
    );
    if let Some(min) = min {
        provisioning.insert("minSize".into(), json!(min.to_string()));
    }
    if let Some(max) = max {
        provisioning.insert("maxSize".into(), json!(max.to_string()));
    }
    let filesystem = match volume.filesystem {
        Filesystem::Xfs => "xfs",
        Filesystem::Ext4 => "ext4",
    };
    let document = doc(
        "UserVolumeConfig",
        json!({
            "name": volume.name,
            "provisioning": provisioning,
            "filesystem": {"type": filesystem},
        }),
    );
    Ok(document)
}

/// What a machine's config is rendered from beyond its cluster and itself.
#[derive(Debug, Clone, Default)]
pub struct MachineLayers<'a> {
    /// The TalosMachineClass that approved it (`ichor.maesh.dev/class`): its patches go
    /// between the cluster's and the machine's.
    pub class: Option<&'a ichor_api::TalosMachineClass>,
    /// The user volumes the cluster's TalosStorages give it, in order.
    pub volumes: Vec<&'a UserVolume>,
    /// The oldest Talos a node of the cluster runs, if one reports its version: the config
    /// contract never runs ahead of it ([`contract_in_force`]).
    pub oldest_running: Option<&'a str>,
    /// The Kubernetes component versions a rollout holds the machine at, if it does.
    pub kubernetes: Option<&'a KubernetesComponents>,
}

impl<'a> MachineLayers<'a> {
    /// The layers of `machine`: the class its `ichor.maesh.dev/class` label names, when that
    /// class is among `classes` and belongs to the machine's cluster; and the volumes of every
    /// storage among `storages` that selects it, storages by name. A volume name given twice is
    /// refused, naming both storages: neither renders on this machine.
    pub fn of(
        machine: &ichor_api::TalosMachine,
        classes: impl IntoIterator<Item = &'a ichor_api::TalosMachineClass>,
        storages: impl IntoIterator<Item = &'a ichor_api::TalosStorage>,
    ) -> Result<Self, RenderError> {
        let label = machine
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ichor_api::names::labels::CLASS));
        let class = label.and_then(|name| {
            classes.into_iter().find(|c| {
                c.metadata.name.as_ref() == Some(name)
                    && c.metadata.namespace == machine.metadata.namespace
                    && c.spec.cluster_ref.name == machine.spec.cluster_ref.name
            })
        });
        let mut selecting: Vec<&ichor_api::TalosStorage> = storages
            .into_iter()
            .filter(|s| s.selects(machine))
            .collect();
        selecting.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let mut volumes: Vec<&UserVolume> = Vec::new();
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        for storage in selecting {
            let owner = storage.metadata.name.as_deref().unwrap_or_default();
            for volume in &storage.spec.volumes {
                if let Some(first) = owners.insert(&volume.name, owner) {
                    return Err(RenderError::VolumeConflict {
                        volume: volume.name.clone(),
                        first: first.to_owned(),
                        second: owner.to_owned(),
                    });
                }
                volumes.push(volume);
            }
        }
        Ok(Self {
            class,
            volumes,
            oldest_running: None,
            kubernetes: None,
        })
    }
}

/// Renders the config `machine` gets from `cluster` with `role`: the machine's install settings
/// over the cluster's, the user volumes of `layers`, then the cluster's, the class's and the
/// machine's patches. The manager applies exactly this; `kubectl ichor render` shows it.
pub fn render_machine(
    cluster: &ichor_api::TalosCluster,
    machine: &ichor_api::TalosMachine,
    role: Role,
    layers: &MachineLayers<'_>,
    bundle: &SecretsBundle,
) -> Result<Rendered, RenderError> {
    let empty = BTreeMap::new();
    let install = machine
        .spec
        .install
        .as_ref()
        .or(cluster.spec.install.as_ref());
    let schematic = machine_schematic(cluster, machine, layers);
    let class_patches: &[ConfigPatch] = layers
        .class
        .map_or(&[], |c| c.spec.config_patches.as_slice());
    render_with_volumes(
        &RenderInput {
            cluster_name: cluster.metadata.name.as_deref().unwrap_or_default(),
            cluster: &cluster.spec,
            role,
            hostname: machine.spec.hostname.as_deref(),
            install,
            schematic,
            oldest_running: layers.oldest_running,
            kubernetes: layers.kubernetes,
            cert_sans: &[],
            node_labels: &empty,
            node_taints: &empty,
            patches: &[
                &cluster.spec.config_patches,
                class_patches,
                &machine.spec.config_patches,
            ],
            bundle,
        },
        &layers.volumes,
    )
}
