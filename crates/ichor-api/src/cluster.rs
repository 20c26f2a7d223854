//! `TalosCluster`: one workload cluster Ichor builds and manages.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::backup::{BackupSpec, BackupStatus, RestoreSpec, RestoreStatus};
use crate::common::{Condition, InstallSpec, LocalObjectReference};
use crate::config::ConfigPatch;
use crate::drain::DrainSpec;
use crate::names::{conditions, field_managers as fm};
use crate::rollout::RolloutPolicy;
use crate::rules;
use crate::schematic::{ImageFactorySpec, Schematic};
use crate::status::{Owned, group, grouped};

/// The desired state of a Talos cluster.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosCluster",
    plural = "talosclusters",
    shortname = "tc",
    category = "ichor",
    namespaced,
    status = "TalosClusterStatus",
    printcolumn = r#"{"name":"Talos","type":"string","jsonPath":".spec.talosVersion"}"#,
    printcolumn = r#"{"name":"Kubernetes","type":"string","jsonPath":".spec.kubernetesVersion"}"#,
    printcolumn = r#"{"name":"Endpoint","type":"string","jsonPath":".spec.endpoint"}"#,
    printcolumn = r#"{"name":"Control planes","type":"string","jsonPath":".status.controlPlanes.summary"}"#,
    printcolumn = r#"{"name":"Workers","type":"string","jsonPath":".status.workers.summary"}"#,
    printcolumn = r#"{"name":"Up to date","type":"string","jsonPath":".status.rollout.summary"}"#,
    // Why a version rollout waits, if it does: a window, a suspend, a gate, a backup, a halt.
    printcolumn = r#"{"name":"Rollout","type":"string","jsonPath":".status.conditions[?(@.type==\"VersionRolledOut\")].reason"}"#,
    printcolumn = r#"{"name":"Config","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"ConfigRolledOut\")].reason"}"#,
    printcolumn = r#"{"name":"In flight","type":"string","priority":1,"jsonPath":".status.rollout.inFlightMachines"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    // Names Ichor publishes under for this cluster (ADR 0053); a reference an object already
    // had is left to the manager, which never writes a Secret it did not create.
    validation = Rule::new(SECRETS_REF_NOT_PUBLISHED).optional_old_self(true).message("spec.secretsRef.name must not be <cluster>-kubeconfig, <cluster>-talosconfig or end in -applied-config: Ichor publishes its own Secrets under those names; name the bundle Secret otherwise, e.g. <cluster>-secrets (the name used when secretsRef is unset)")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!(self.cni.preset == 'flannel' && self.kubeProxy == 'disabled')").message("cni.preset flannel needs kubeProxy: enabled (flannel relies on kube-proxy); choose cilium or none to run without kube-proxy"),
    validation = Rule::new(rules::subnets_disjoint("self.network.podSubnets", "self.network.serviceSubnets")).message("network.podSubnets and network.serviceSubnets must not overlap"),
    validation = Rule::new(rules::discovery_disjoint_from_network()).message("discovery.cidrs must not overlap network.podSubnets or network.serviceSubnets"),
    validation = Rule::new("!has(self.restoreFrom) || has(self.secretsRef)").message("restoreFrom needs secretsRef: the secrets bundle of the cluster the backup was taken from"),
    validation = Rule::new("has(self.restoreFrom) == has(oldSelf.restoreFrom)").message("restoreFrom is set only when the cluster is created, and then kept"),
    validation = Rule::new("!has(self.adopt) || has(self.secretsRef)").message("adopt needs secretsRef: the secrets bundle of the running cluster"),
    validation = Rule::new("!(has(self.adopt) && has(self.restoreFrom))").message("adopt and restoreFrom exclude each other: adopt takes a running cluster as it is"),
    validation = Rule::new("has(self.adopt) == has(oldSelf.adopt)").message("adopt is set only when the cluster is created, and then kept"),
    validation = Rule::new("!has(self.rollout) || !has(self.rollout.freshBackup) || has(self.backup)").message("rollout.freshBackup needs spec.backup: the store the fresh backup is taken to")
)]
pub struct TalosClusterSpec {
    /// The Talos version contract configs are rendered for, and the installer tag, e.g.
    /// `v1.14.0`. Nodes running an older Talos are refused before anything is applied.
    #[schemars(
        length(max = 32),
        regex(pattern = r"^v1\.(1[3-9]|[2-9][0-9])\.[0-9]+(-[0-9A-Za-z.]+)?$")
    )]
    pub talos_version: String,
    /// The Kubernetes version the cluster runs, e.g. `1.36.3`.
    #[schemars(
        length(max = 32),
        regex(pattern = r"^v?1\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$")
    )]
    pub kubernetes_version: String,
    /// The Kubernetes API endpoint every node joins through, e.g. `https://10.0.0.10:6443`
    /// (a load balancer or VIP in front of the control planes). Required: there is no default.
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() == 'https' && url(self).getHostname() != ''").message("endpoint must be an https:// URL naming the Kubernetes API, e.g. https://10.0.0.10:6443"))]
    pub endpoint: String,
    /// The control-plane shape.
    pub control_plane: ControlPlaneSpec,
    /// Pod and service networks of the workload cluster.
    #[serde(default)]
    pub network: NetworkSpec,
    /// The CNI deployed with the cluster.
    #[serde(default)]
    pub cni: CniSpec,
    /// Whether kube-proxy runs. Switching it on an existing cluster needs the
    /// `ichor.maesh.dev/confirm-kube-proxy-switch: "true"` annotation.
    #[serde(default)]
    pub kube_proxy: KubeProxyMode,
    /// Finds maintenance-mode machines by sweeping address ranges. Discovery only reads: nothing
    /// is written to a machine before a person approves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery: Option<DiscoverySpec>,
    /// The Secret (same namespace) holding the cluster's secrets bundle, in `talosctl gen
    /// secrets` format under the key `secrets.yaml`. Generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_ref: Option<LocalObjectReference>,
    /// Install defaults for the cluster's machines (each machine may override them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallSpec>,
    /// The Image Factory schematic every machine's installer is built with: system
    /// extensions, kernel arguments, META values. A TalosMachineClass's or a TalosMachine's
    /// own replaces it whole. Unset: the factory's empty schematic. Changing it upgrades every
    /// node it reaches to the same Talos version with the new installer, one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schematic: Option<Schematic>,
    /// The Image Factory installers come from and schematics are registered with.
    #[serde(default)]
    pub image_factory: ImageFactorySpec,
    /// How a node is drained before a reboot, an upgrade, a drift reboot or a reset.
    #[serde(default)]
    pub drain: DrainSpec,
    /// How rollouts (versions, schematics, config changes) reach the nodes: a suspend,
    /// maintenance windows, health gates, a fresh backup first, how many workers at once.
    /// Unset: each runs at once, one node at a time.
    #[serde(default, skip_serializing_if = "RolloutPolicy::is_default")]
    pub rollout: RolloutPolicy,
    /// Config patches applied to every machine of the cluster, first (then class, then machine).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_patches: Vec<ConfigPatch>,
    /// Scheduled etcd backups to an S3-compatible object store. `etcdSnapshot` operations
    /// back up to it too, and are refused without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,
    /// Restores etcd from a backup: the first control plane bootstraps from the snapshot, the
    /// others join it. Set only when the cluster is created, with the `secretsRef` of the
    /// cluster the backup was taken from; runs once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("restoreFrom cannot change once set"))]
    pub restore_from: Option<RestoreSpec>,
    /// Adopts a running Talos cluster without touching its nodes: their live configs are read
    /// (with `secretsRef`'s bundle), checked against this spec, and recorded as the machines'
    /// applied configs. Set only when the cluster is created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("adopt cannot change once set"))]
    pub adopt: Option<AdoptSpec>,
}

/// The CEL rule keeping `spec.secretsRef` off the names Ichor publishes Secrets under for the
/// cluster: `<cluster>-kubeconfig`, `<cluster>-talosconfig` and a machine's
/// `<machine>-applied-config` (ADR 0053). A reference the object already had passes.
pub const SECRETS_REF_NOT_PUBLISHED: &str = "!has(self.spec.secretsRef) \
    || (oldSelf.hasValue() && has(oldSelf.value().spec.secretsRef) \
        && oldSelf.value().spec.secretsRef.name == self.spec.secretsRef.name) \
    || !(self.spec.secretsRef.name == self.metadata.name + '-kubeconfig' \
        || self.spec.secretsRef.name == self.metadata.name + '-talosconfig' \
        || self.spec.secretsRef.name.endsWith('-applied-config'))";

/// The running cluster to adopt.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdoptSpec {
    /// The Talos API addresses (IPs) of every node of the cluster, control planes and workers.
    #[schemars(length(min = 1, max = 64), inner(length(max = 45)))]
    #[x_kube(validation = Rule::new("self.all(a, isIP(a))").message("each entry of adopt.endpoints must be an IP address"))]
    pub endpoints: Vec<String>,
}

impl TalosClusterSpec {
    /// A cluster running Talos `talos_version` and Kubernetes `kubernetes_version` behind
    /// `endpoint`, with `control_planes` control planes; every other field at its default.
    pub fn new(
        talos_version: &str,
        kubernetes_version: &str,
        endpoint: &str,
        control_planes: i32,
    ) -> Self {
        Self {
            talos_version: talos_version.to_owned(),
            kubernetes_version: kubernetes_version.to_owned(),
            endpoint: endpoint.to_owned(),
            control_plane: ControlPlaneSpec {
                count: control_planes,
            },
            network: NetworkSpec::default(),
            cni: CniSpec::default(),
            kube_proxy: KubeProxyMode::default(),
            discovery: None,
            secrets_ref: None,
            install: None,
            schematic: None,
            image_factory: ImageFactorySpec::default(),
            drain: DrainSpec::default(),
            rollout: RolloutPolicy::default(),
            config_patches: Vec::new(),
            backup: None,
            restore_from: None,
            adopt: None,
        }
    }
}

/// The control-plane shape.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ControlPlaneSpec {
    /// How many control planes the cluster should have (etcd members). Odd counts (1, 3, 5)
    /// keep etcd's fault tolerance; a removal never takes the cluster below this count.
    #[schemars(range(min = 1, max = 9))]
    pub count: i32,
}

/// Pod and service networks.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// Pod CIDRs, e.g. `10.244.0.0/16`.
    #[serde(default = "default_pod_subnets")]
    #[schemars(length(min = 1, max = 2), inner(length(max = 43)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each entry of network.podSubnets must be a CIDR, e.g. 10.244.0.0/16"))]
    pub pod_subnets: Vec<String>,
    /// Service CIDRs, e.g. `10.96.0.0/12`.
    #[serde(default = "default_service_subnets")]
    #[schemars(length(min = 1, max = 2), inner(length(max = 43)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each entry of network.serviceSubnets must be a CIDR, e.g. 10.96.0.0/12"))]
    pub service_subnets: Vec<String>,
    /// The cluster DNS domain.
    #[serde(default = "default_dns_domain")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
    )]
    pub dns_domain: String,
}

fn default_pod_subnets() -> Vec<String> {
    vec!["10.244.0.0/16".into()]
}

fn default_service_subnets() -> Vec<String> {
    vec!["10.96.0.0/12".into()]
}

fn default_dns_domain() -> String {
    "cluster.local".into()
}

impl Default for NetworkSpec {
    fn default() -> Self {
        Self {
            pod_subnets: default_pod_subnets(),
            service_subnets: default_service_subnets(),
            dns_domain: default_dns_domain(),
        }
    }
}

/// The CNI deployed with the cluster.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.preset == oldSelf.preset").message("cni.preset is immutable: a running cluster's CNI cannot be swapped in place"))]
pub struct CniSpec {
    /// `flannel` (Talos's built-in CNI), `cilium` or `none` (no built-in CNI: install one
    /// yourself; nodes stay NotReady until you do).
    #[serde(default)]
    pub preset: CniPreset,
}

/// The CNI presets.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum CniPreset {
    /// Talos's built-in flannel (vxlan).
    #[default]
    Flannel,
    /// No built-in CNI; Cilium is installed afterwards.
    Cilium,
    /// No CNI at all.
    None,
}

impl CniPreset {
    /// The value as written in the API (`flannel`, `cilium`, `none`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Flannel => "flannel",
            Self::Cilium => "cilium",
            Self::None => "none",
        }
    }
}

/// A name that is not a CNI preset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCniPreset(pub String);

impl std::fmt::Display for UnknownCniPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "unknown CNI preset {:?}: flannel, cilium or none",
            self.0
        )
    }
}

impl std::error::Error for UnknownCniPreset {}

impl std::str::FromStr for CniPreset {
    type Err = UnknownCniPreset;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        [Self::Flannel, Self::Cilium, Self::None]
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| UnknownCniPreset(name.to_owned()))
    }
}

/// Whether kube-proxy runs.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum KubeProxyMode {
    /// kube-proxy runs on every node.
    #[default]
    Enabled,
    /// No kube-proxy (the CNI replaces it).
    Disabled,
}

/// Where and how often to look for maintenance-mode machines.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiscoverySpec {
    /// IPv4 ranges to sweep on port 50000, at most 4, each no larger than a /24.
    #[schemars(length(min = 1, max = 4), inner(length(max = 18)))]
    #[x_kube(
        validation = Rule::new("self.all(c, isCIDR(c))").message("each discovery CIDR must be in CIDR notation, e.g. 192.168.10.0/24"),
        validation = Rule::new("self.all(c, !isCIDR(c) || cidr(c).ip().family() == 4)").message("discovery CIDRs must be IPv4"),
        validation = Rule::new("self.all(c, !isCIDR(c) || cidr(c).prefixLength() >= 24)").message("each discovery CIDR must be no larger than a /24 (prefix length 24 to 32)")
    )]
    pub cidrs: Vec<String>,
    /// Time between sweeps, e.g. `5m` (at least 10s, at most 24h).
    #[serde(default = "default_discovery_interval")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s') && duration(self) <= duration('24h')").message("discovery.interval must be a duration from 10s to 24h, e.g. 5m"))]
    pub interval: String,
}

fn default_discovery_interval() -> String {
    "5m".into()
}

// Its conditions, which its groups share by type, and one struct per field manager (ADR 0020,
// `crate::status`), flattened in.
/// The observed state of a Talos cluster.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosClusterStatus {
    /// `Ready`, `Bootstrapped`, `SecretsReady`, `Transitioning`, `ConfigRolledOut`,
    /// `VersionRolledOut`, `BackedUp`, `Restored`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The cluster reconcile's part.
    #[serde(flatten)]
    pub core: ClusterCore,
    /// The cluster lock's mirror.
    #[serde(flatten)]
    pub lock: ClusterLock,
    /// Nodes force-removed while unreachable.
    #[serde(flatten)]
    pub tombstones: ClusterTombstones,
    /// Nodes whose delete waits for the workload API.
    #[serde(flatten)]
    pub node_deletes: ClusterNodeDeletes,
    /// Where the drift rollout stopped.
    #[serde(flatten)]
    pub drift: ClusterDrift,
    /// What the backups have done.
    #[serde(flatten)]
    pub backup: ClusterBackup,
    /// The restore the cluster was created with.
    #[serde(flatten)]
    pub restore: ClusterRestore,
}

/// The cluster reconcile's part of a cluster's status, with the conditions no other group
/// names.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCore {
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Control-plane counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_planes: Option<MachineCounts>,
    /// Worker counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<MachineCounts>,
    /// The one machine chosen to bootstrap etcd, recorded before the call is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapRecord>,
    /// The fingerprint (`sha256:` of its PEM) of the OS CA of the bundle this cluster was
    /// built with, recorded when it first used one: another bundle under that name is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 80))]
    pub bundle_fingerprint: Option<String>,
    /// The Secret holding the secrets bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub secrets_secret: Option<String>,
    /// The Secret holding an `os:admin` talosconfig for the cluster's nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub talosconfig_secret: Option<String>,
    /// The Secret holding an admin kubeconfig for the workload cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub kubeconfig_secret: Option<String>,
    /// When the published credentials' certificates expire (each is renewed at two thirds of
    /// its lifetime, and re-minted when what it points at changes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsStatus>,
    /// The adoption this cluster was created with: recorded once its nodes were adopted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adoption: Option<AdoptionStatus>,
    /// How far the declared Talos version and schematic rolled out (ADR 0068).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The versions the nodes are brought to: the declared ones once the manager found they
    /// follow the version rules, or the first step towards them when both change (ADR 0069).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_versions: Option<AcceptedVersions>,
}

/// The versions a cluster's nodes are brought to (ADR 0069): what the manager renders and
/// upgrades with, whatever the spec declares, until a declaration passes the version rules.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcceptedVersions {
    /// The Talos version.
    #[schemars(length(max = 64))]
    pub talos_version: String,
    /// The Kubernetes version.
    #[schemars(length(max = 64))]
    pub kubernetes_version: String,
    /// The Kubernetes version the nodes ran before `kubernetesVersion` was accepted, kept until
    /// that rolled out (ADR 0070): the version of what was not seen yet, and a Talos change
    /// waits meanwhile if the new Talos does not support it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubernetes_from: Option<String>,
}

/// How far the declared Talos version and schematic rolled out over the cluster's configured
/// nodes.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The Talos version declared.
    #[schemars(length(max = 64))]
    pub talos_version: String,
    /// Nodes running it (and their declared schematic).
    pub up_to_date: i32,
    /// Configured nodes.
    pub total: i32,
    /// `upToDate/total`, for `kubectl get`.
    #[schemars(length(max = 32))]
    pub summary: String,
    /// The machine being upgraded now, if one is (the first, when a batch is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub in_flight: Option<String>,
    /// Every machine whose rollout step (an upgrade, a config change) is in flight now: the
    /// one holding the cluster lock, or a batch of workers (ADR 0077).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000), inner(length(max = 253)))]
    pub in_flight_machines: Vec<String>,
    /// Configured nodes still to be upgraded, not in flight.
    #[serde(default)]
    pub waiting: i32,
    /// What rolls out and the field that asked for it, e.g. `Talos v1.14.2
    /// (spec.talosVersion)`, `config of 2 machine(s) (patches of the cluster, a class or a
    /// machine)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), inner(length(max = 256)))]
    pub changes: Vec<String>,
    /// What the rollout waits on, if the rollout policy holds it: the reason and the machine
    /// held, e.g. `OutsideMaintenanceWindow at w-2` (the conditions say more).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 320))]
    pub waits_on: Option<String>,
    /// The machine the rollout stopped at (a refused config, a failed or rolled-back
    /// upgrade), until the spec changes or the step is retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub halted_at: Option<String>,
    /// Where a Kubernetes version rolling out stands (ADR 0070), e.g. `kube-apiserver on
    /// cp-2`: the component and node next or in flight, in `talosctl upgrade-k8s`'s order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 320))]
    pub kubernetes_step: Option<String>,
}

/// The cluster lock's mirror in a cluster's status.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLock {
    /// The action holding the cluster lock, and those waiting for it.
    #[serde(rename = "lock", default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<LockStatus>,
}

/// Nodes force-removed while unreachable.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterTombstones {
    /// Nodes force-removed while unreachable, so never reset: if one answers again with the
    /// cluster's credentials, it is reset before anything else.
    #[serde(rename = "tombstones", default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub list: Vec<Tombstone>,
}

/// Node deletes handed over by forced removals (ADR 0021).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterNodeDeletes {
    /// Nodes of force-removed machines whose Kubernetes Node could not be deleted because the
    /// workload cluster's API did not answer: deleted once it answers again (ADR 0021).
    #[serde(
        rename = "pendingNodeDeletes",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 64))]
    pub pending: Vec<PendingNodeDelete>,
}

/// Where a cluster's drift rollout stopped.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDrift {
    /// Where the drift rollout stopped: the machine that refused its changed config. No other
    /// machine gets drift until a change renders that machine's config differently.
    #[serde(rename = "driftHalt", default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<DriftHaltStatus>,
}

/// What a cluster's backups have done, with the condition `BackedUp` (ADR 0026).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterBackup {
    /// What the scheduled and on-demand backups have done.
    #[serde(rename = "backup", default, skip_serializing_if = "Option::is_none")]
    pub record: Option<BackupStatus>,
}

/// The restore a cluster was created with, with the condition `Restored` (ADR 0026).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRestore {
    /// The restore this cluster was created with: recorded before its bootstrap.
    #[serde(rename = "restore", default, skip_serializing_if = "Option::is_none")]
    pub record: Option<RestoreStatus>,
}

group!(
    ClusterCore,
    TalosClusterStatus,
    core,
    fm::CLUSTER_STATUS,
    Owned::Rest
);
group!(
    ClusterLock,
    TalosClusterStatus,
    lock,
    fm::CLUSTER_LOCK,
    Owned::None
);
group!(
    ClusterTombstones,
    TalosClusterStatus,
    tombstones,
    fm::CLUSTER_TOMBSTONES,
    Owned::None
);
group!(
    ClusterDrift,
    TalosClusterStatus,
    drift,
    fm::CLUSTER_DRIFT,
    Owned::None
);
group!(
    ClusterNodeDeletes,
    TalosClusterStatus,
    node_deletes,
    fm::CLUSTER_NODE_DELETES,
    Owned::None
);
group!(
    ClusterBackup,
    TalosClusterStatus,
    backup,
    fm::BACKUP_STATUS,
    Owned::Only(&[conditions::BACKED_UP])
);
group!(
    ClusterRestore,
    TalosClusterStatus,
    restore,
    fm::RESTORE_STATUS,
    Owned::Only(&[conditions::RESTORED])
);
grouped!(
    TalosClusterStatus,
    [
        ClusterCore,
        ClusterLock,
        ClusterTombstones,
        ClusterDrift,
        ClusterNodeDeletes,
        ClusterBackup,
        ClusterRestore,
    ]
);

/// What an adoption recorded.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdoptionStatus {
    /// When the nodes were adopted.
    pub adopted_at: Time,
    /// The TalosMachines recorded for them.
    #[schemars(length(max = 64), inner(length(max = 253)))]
    pub machines: Vec<String>,
}

/// When the published credentials expire.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsStatus {
    /// When the client certificate of the published kubeconfig expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_expires_at: Option<Time>,
    /// When the client certificate of the published talosconfig expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub talosconfig_expires_at: Option<Time>,
}

/// The machine that stopped a drift rollout, and why.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftHaltStatus {
    /// The TalosMachine that refused.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// The hash of the config it refused, or the installer image its upgrade failed with.
    #[schemars(length(max = 512))]
    pub rendered_hash: String,
    /// What the node answered.
    #[schemars(length(max = 2048))]
    pub message: String,
    /// When it refused.
    pub at: Time,
}

/// A node removed without its reset.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Tombstone {
    /// The TalosMachine it was.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// Its Talos API address.
    #[schemars(length(max = 256))]
    pub address: String,
    /// Its etcd member id (16 hex digits), removed through a peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub etcd_member_id: Option<String>,
    /// Its SMBIOS UUID as recorded for the machine: the node answering at the address is reset
    /// only if it reports this one (ADR 0052). A tombstone without one (written before it was
    /// recorded) resets nothing, and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uuid: Option<String>,
    /// When it was removed.
    pub removed_at: Time,
}

/// A Kubernetes Node to delete once the workload cluster's API answers again.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingNodeDelete {
    /// The Node's name.
    #[schemars(length(max = 253))]
    pub node: String,
    /// The TalosMachine it belonged to.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// When the machine's removal handed the delete over: a Node of that name registered
    /// after this is another node's, and is kept.
    pub since: Time,
}

/// Machine counts of one role.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineCounts {
    /// Declared in the spec (control planes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declared: Option<i32>,
    /// Approved machines of this role.
    pub approved: i32,
    /// Machines of this role that are ready.
    pub ready: i32,
    /// `ready/approved` (or `ready/declared`), for `kubectl get`.
    #[schemars(length(max = 32))]
    pub summary: String,
}

/// The machine chosen to bootstrap etcd.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapRecord {
    /// The TalosMachine's name.
    #[schemars(length(max = 253))]
    pub machine_name: String,
    /// The TalosMachine's UID.
    #[schemars(length(max = 64))]
    pub machine_uid: String,
    /// When the machine was chosen.
    pub chosen_at: Time,
    /// When the bootstrap was confirmed done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

/// The action holding (or waiting for) a cluster lock. Written `removal/<machine uid>`,
/// `operation/<name>`, `drift/<machine uid>` or `upgrade/<machine uid>`: the lock Lease's
/// holder identity.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum LockHolder {
    /// The removal of a TalosMachine, by UID.
    Removal(String),
    /// A TalosOperation, by name.
    Operation(String),
    /// The drift of a TalosMachine's config that needs a reboot, by the machine's UID.
    Drift(String),
    /// The Talos upgrade of a TalosMachine's node (a declared version or schematic), by the
    /// machine's UID.
    Upgrade(String),
    /// A batch of workers' steps (drifts, upgrades) held together under
    /// `spec.rollout.maxUnavailable`, by the cluster's UID; its members are in
    /// `status.lock.batch`.
    Batch(String),
}

impl LockHolder {
    /// The kind and the object it names.
    fn parts(&self) -> (&'static str, &str) {
        match self {
            Self::Removal(id) => ("removal", id),
            Self::Operation(name) => ("operation", name),
            Self::Drift(id) => ("drift", id),
            Self::Upgrade(id) => ("upgrade", id),
            Self::Batch(id) => ("batch", id),
        }
    }
}

impl std::fmt::Display for LockHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, id) = self.parts();
        write!(f, "{kind}/{id}")
    }
}

/// A lock holder that is not `removal/…`, `operation/…`, `drift/…`, `upgrade/…` or `batch/…`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "lock holder {0:?} is not removal/<uid>, operation/<name>, drift/<uid>, upgrade/<uid> or batch/<uid>"
)]
pub struct UnknownHolder(pub String);

impl std::str::FromStr for LockHolder {
    type Err = UnknownHolder;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parsed = match s.split_once('/') {
            Some(("removal", id)) if !id.is_empty() => Self::Removal(id.to_owned()),
            Some(("operation", name)) if !name.is_empty() => Self::Operation(name.to_owned()),
            // `reboot-for-drift/` is how a drift reboot held the lock before this type.
            Some(("drift" | "reboot-for-drift", id)) if !id.is_empty() => {
                Self::Drift(id.to_owned())
            }
            Some(("upgrade", id)) if !id.is_empty() => Self::Upgrade(id.to_owned()),
            Some(("batch", id)) if !id.is_empty() => Self::Batch(id.to_owned()),
            _ => return Err(UnknownHolder(s.to_owned())),
        };
        Ok(parsed)
    }
}

impl TryFrom<String> for LockHolder {
    type Error = UnknownHolder;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<LockHolder> for String {
    fn from(holder: LockHolder) -> Self {
        holder.to_string()
    }
}

impl schemars::JsonSchema for LockHolder {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LockHolder".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "`removal/<machine uid>`, `operation/<name>`, `drift/<machine uid>`, `upgrade/<machine uid>` or `batch/<cluster uid>`.",
            "type": "string",
            "maxLength": 320,
            "pattern": "^(removal|operation|drift|upgrade|batch)/.+$",
        })
    }
}

/// The cluster lock as seen by the controller.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    /// The action holding the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<LockHolder>,
    /// When the holder took the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
    /// Actions waiting for the lock, in arrival order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub waiting: Vec<LockHolder>,
    /// While a batch of workers holds the lock (`batch/<cluster uid>`): its members' steps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub batch: Vec<LockHolder>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secrets_ref_rule_names_the_applied_config_suffix_ichor_publishes_under() {
        let suffix = crate::names::secrets::APPLIED_CONFIG_SUFFIX;
        assert!(
            SECRETS_REF_NOT_PUBLISHED.contains(&format!("endsWith('{suffix}')")),
            "{SECRETS_REF_NOT_PUBLISHED}"
        );
    }

    #[test]
    fn lock_holders_read_back_as_written_and_refuse_other_words() {
        for holder in [
            LockHolder::Removal("0b7c".into()),
            LockHolder::Operation("reboot-all".into()),
            LockHolder::Drift("9f1e".into()),
        ] {
            assert_eq!(holder.to_string().parse::<LockHolder>(), Ok(holder.clone()));
            let json = serde_json::to_value(&holder).unwrap();
            assert_eq!(json, serde_json::json!(holder.to_string()));
        }
        assert_eq!(
            "reboot-for-drift/9f1e".parse(),
            Ok(LockHolder::Drift("9f1e".into()))
        );
        assert_eq!(
            "upgrade/9f1e".parse(),
            Ok(LockHolder::Upgrade("9f1e".into()))
        );
        for bad in ["", "removal/", "upgrade/", "reboot/x", "operation"] {
            assert_eq!(bad.parse::<LockHolder>(), Err(UnknownHolder(bad.into())));
        }
        let status: LockStatus = serde_json::from_value(
            serde_json::json!({"holder": "operation/up", "waiting": ["removal/u1"]}),
        )
        .unwrap();
        assert_eq!(status.holder, Some(LockHolder::Operation("up".into())));
        assert_eq!(status.waiting, vec![LockHolder::Removal("u1".into())]);
    }
}
