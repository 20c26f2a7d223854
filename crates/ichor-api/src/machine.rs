//! `TalosMachine`: one physical machine, from discovery to removal.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::common::{Condition, InstallSpec, LocalObjectReference, Role};
use crate::config::ConfigPatch;
use crate::drain::DrainRecord;
use crate::names::{conditions, field_managers as fm, labels};
use crate::status::{Group, Owned, group, grouped};

/// The CEL rule locking `approvalState` and `role` once a config was applied.
const APPLIED_LOCK_RULE: &str = "!has(oldSelf.status) || !has(oldSelf.status.appliedConfigHash) || (self.spec.approvalState == oldSelf.spec.approvalState && has(self.spec.role) == has(oldSelf.spec.role) && (!has(self.spec.role) || self.spec.role == oldSelf.spec.role))";

/// A machine Ichor found (or was told about) and may turn into a cluster node.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosMachine",
    plural = "talosmachines",
    shortname = "tm",
    category = "ichor",
    namespaced,
    status = "TalosMachineStatus",
    validation = Rule::new(APPLIED_LOCK_RULE).message("spec.approvalState and spec.role cannot change once the machine's config was applied (status.appliedConfigHash is set): delete the machine to remove it from the cluster"),
    // A cluster's machines are listed by it (`--field-selector spec.clusterRef.name=NAME`).
    selectable = ".spec.clusterRef.name",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#,
    printcolumn = r#"{"name":"Approval","type":"string","jsonPath":".spec.approvalState"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Address","type":"string","jsonPath":".status.address"}"#,
    printcolumn = r#"{"name":"Talos","type":"string","jsonPath":".status.talosVersion"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self.approvalState != 'approved' || has(self.role)").message("an approved machine needs spec.role (controlplane or worker)"),
    validation = Rule::new("self.approvalState != 'approved' || has(self.fingerprint)").message("an approved machine needs a pinned spec.fingerprint (its maintenance-mode certificate, or for an adopted machine its configured-mode one): Ichor never applies to a machine whose certificate it has not pinned"),
    validation = Rule::new("self.approvalState != 'approved' || size(self.endpoints) > 0").message("an approved machine needs at least one address in spec.endpoints")
)]
pub struct TalosMachineSpec {
    /// The TalosCluster this machine belongs to (same namespace). Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.clusterRef is immutable"))]
    pub cluster_ref: LocalObjectReference,
    /// `controlplane` or `worker`. Required to approve; immutable once a config was applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// `pending` (found, untouched), `approved` (Ichor may configure it) or `rejected` (never
    /// touched). Immutable once a config was applied.
    #[serde(default)]
    pub approval_state: ApprovalState,
    /// The machine's Talos API addresses (IPs), as discovered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 45)))]
    #[x_kube(validation = Rule::new("self.all(a, isIP(a))").message("each entry of spec.endpoints must be an IP address"))]
    pub endpoints: Vec<String>,
    /// The pinned certificate fingerprint: base64 of the SHA-256 of the certificate's
    /// SubjectPublicKeyInfo, as `talosctl --cert-fingerprint` takes it. Set from the first
    /// discovery (the maintenance-mode certificate), or for an adopted machine from its
    /// configured-mode certificate (ADR 0028); a different certificate is refused until a
    /// person updates this pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 44), regex(pattern = r"^[A-Za-z0-9+/]{43}=$"))]
    pub fingerprint: Option<String>,
    /// The hostname to give the node (a DNS label). Defaults to a stable Talos-chosen name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63), regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"))]
    pub hostname: Option<String>,
    /// Install settings, overriding the cluster's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallSpec>,
    /// The Image Factory schematic of this machine's installer: replaces its class's and its
    /// cluster's whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schematic: Option<crate::schematic::Schematic>,
    /// Config patches for this machine, applied last (after cluster and class patches).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_patches: Vec<ConfigPatch>,
    /// The machine's BMC (Redfish), if it has one Ichor may read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<crate::bmc::BmcSpec>,
}

impl TalosMachineSpec {
    /// A pending machine of `cluster`, reached at `address` and pinned to `fingerprint` (the
    /// first certificate seen): what discovery records before anyone approves it.
    pub fn pending(cluster: &str, address: &str, fingerprint: &str) -> Self {
        Self {
            cluster_ref: LocalObjectReference {
                name: cluster.to_owned(),
            },
            role: None,
            approval_state: ApprovalState::Pending,
            endpoints: vec![address.to_owned()],
            fingerprint: Some(fingerprint.to_owned()),
            hostname: None,
            install: None,
            schematic: None,
            config_patches: Vec::new(),
            bmc: None,
        }
    }
}

impl TalosMachine {
    /// The record discovery creates for a machine with SMBIOS UUID `uuid`: `spec` (see
    /// [`TalosMachineSpec::pending`]) in `namespace`, labelled with its cluster, its UUID and
    /// Ichor as its manager. The hardware goes to the status afterwards.
    pub fn discovered(namespace: &str, name: &str, uuid: &str, spec: TalosMachineSpec) -> Self {
        let mut machine = Self::new(name, spec);
        machine.metadata.namespace = Some(namespace.to_owned());
        machine.metadata.labels = Some(
            [
                (labels::CLUSTER, machine.spec.cluster_ref.name.as_str()),
                (labels::MACHINE_UUID, uuid),
                (labels::MANAGED_BY, labels::MANAGED_BY_VALUE),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        machine
    }
}

/// Whether Ichor may configure a machine.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalState {
    /// Found; nothing is written to it.
    #[default]
    Pending,
    /// Ichor configures it and joins it to its cluster.
    Approved,
    /// Never touched.
    Rejected,
}

/// Where a machine is in its lifecycle.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
pub enum MachinePhase {
    /// Found in maintenance mode; waiting for approval.
    #[default]
    Pending,
    /// Rejected: never touched.
    Rejected,
    /// Approved; its config is being rendered and checked.
    Approved,
    /// Its config is being applied over the pinned maintenance connection.
    Applying,
    /// Talos is installing to disk and will reboot.
    Installing,
    /// Installed; waiting for the configured (mTLS) API.
    Booting,
    /// Joining the cluster (etcd membership for control planes).
    Joining,
    /// Running and ready.
    Ready,
    /// Being removed from its cluster.
    Removing,
    /// Stopped on an error a person must act on (see conditions).
    Failed,
}

// Its conditions, which its groups share by type, and one struct per field manager (ADR 0020,
// `crate::status`), flattened in.
/// The observed state of a machine.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineStatus {
    /// `Ready`, `ConfigApplied`, `Installed`, `RemovalApproved`, `FingerprintChanged`, `Drained`,
    /// `UpToDate`, `BmcReachable`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The lifecycle's part.
    #[serde(flatten)]
    pub lifecycle: MachineLifecycle,
    /// What discovery saw of the machine.
    #[serde(flatten)]
    pub inventory: MachineInventory,
    /// The config last applied.
    #[serde(flatten)]
    pub applied: MachineApplied,
    /// The reboot for drift in flight.
    #[serde(flatten)]
    pub drift: MachineDrift,
    /// The etcd member as last observed.
    #[serde(flatten)]
    pub etcd: MachineEtcd,
    /// The removal's progress.
    #[serde(flatten)]
    pub removal: MachineRemoval,
    /// The drain before a disruption in flight.
    #[serde(flatten)]
    pub drain: MachineDrain,
    /// The Talos upgrade in flight.
    #[serde(flatten)]
    pub upgrade: MachineUpgrade,
    /// The BMC as last read.
    #[serde(flatten)]
    pub bmc: crate::bmc::MachineBmc,
}

/// The lifecycle's part of a machine's status, with the conditions no other group names.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineLifecycle {
    /// Where the machine is in its lifecycle.
    #[serde(default)]
    pub phase: MachinePhase,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The machine's Kubernetes Node name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node_name: Option<String>,
    /// The machine's etcd member id (16 hex digits), for control planes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub etcd_member_id: Option<String>,
}

/// What discovery saw of a machine, with the condition `FingerprintChanged`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineInventory {
    /// The address Ichor reaches the machine at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 45))]
    pub address: Option<String>,
    /// The fingerprint discovery last saw (compare with `spec.fingerprint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 44))]
    pub observed_fingerprint: Option<String>,
    /// The Talos version the machine runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub talos_version: Option<String>,
    /// The Image Factory schematic ID its installer was built from, as the node reports it
    /// (its `schematic` extension, talos-facts §9.5); unset when its installer has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub schematic: Option<String>,
    /// The system extensions the node runs, as it reports them (talos-facts §9.5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub extensions: Vec<ExtensionInfo>,
    /// Hardware as read in maintenance mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware: Option<HardwareInventory>,
}

/// The config last applied to a machine.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineApplied {
    /// The content hash of the config last applied. Once set, `spec.approvalState` and
    /// `spec.role` are immutable.
    #[serde(
        rename = "appliedConfigHash",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 128))]
    pub config_hash: Option<String>,
}

/// The reboot for drift in flight on a machine.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineDrift {
    /// The config hash being applied with a reboot (drift that cannot apply live), under the
    /// cluster lock held as `drift/<uid>`; cleared once the node is back.
    #[serde(
        rename = "driftReboot",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 128))]
    pub reboot: Option<String>,
    /// The node's boot id when the reboot for drift was sent: the node is back from that
    /// reboot once it answers with another one. Cleared with `driftReboot`.
    #[serde(
        rename = "driftBootId",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(length(max = 64))]
    pub boot_id: Option<String>,
}

/// A control plane's etcd member as last observed.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineEtcd {
    /// The control plane's etcd member as last observed on the node, with the time: the
    /// planner counts an observation older than its limit as unhealthy.
    #[serde(rename = "etcd", default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<EtcdObservation>,
}

/// A machine's removal, with the condition `RemovalApproved`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineRemoval {
    /// Progress of the removal sequence, recorded step by step so a restart resumes it.
    #[serde(rename = "removal", default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RemovalProgress>,
}

/// The drain before a disruption in flight on a machine (ADR 0066).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineDrain {
    /// The drain of the machine's Node before the disruption in flight: set before the
    /// cordon, cleared once the machine is back, Ready and (if Ichor cordoned it) uncordoned.
    #[serde(rename = "drain", default, skip_serializing_if = "Option::is_none")]
    pub record: Option<DrainRecord>,
}

/// A system extension a node runs.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExtensionInfo {
    /// Its name as the node reports it, e.g. `intel-ucode` (no `siderolabs/` prefix).
    #[schemars(length(max = 128))]
    pub name: String,
    /// Its version.
    #[schemars(length(max = 128))]
    pub version: String,
}

/// A machine's Talos upgrade in flight, with the condition `UpToDate` (ADR 0068).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineUpgrade {
    /// The upgrade of the node to the declared Talos version and installer, recorded before
    /// anything is sent, so a restart looks for its effect instead of sending it again;
    /// cleared once the node is back and verified, or the upgrade failed.
    #[serde(rename = "upgrade", default, skip_serializing_if = "Option::is_none")]
    pub record: Option<UpgradeRecord>,
    /// The Kubernetes components the node runs, as last observed while a declared Kubernetes
    /// version rolled out (ADR 0070): what the rollout waits for, node by node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesComponents>,
}

/// The version of each Kubernetes component of a node (`v`-less, e.g. `1.36.4`), where known:
/// the control-plane static pods as their kubelet reports them ready, kube-proxy as configured,
/// the kubelet as its Node reports it.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesComponents {
    /// kube-apiserver (control planes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub api_server: Option<String>,
    /// kube-controller-manager (control planes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub controller_manager: Option<String>,
    /// kube-scheduler (control planes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub scheduler: Option<String>,
    /// kube-proxy's image in the config (control planes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub proxy: Option<String>,
    /// The kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub kubelet: Option<String>,
    /// The control-plane static pods its config turns off (`kube-controller-manager`,
    /// `kube-scheduler`): the rollout does not wait for them on this node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2), inner(length(max = 64)))]
    pub disabled: Vec<String>,
}

/// One node's upgrade: where it goes, where it came from, and how far it went.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeRecord {
    /// The installer image, e.g.
    /// `factory.talos.dev/metal-installer/<schematic ID>:v1.14.2`.
    #[schemars(length(max = 512))]
    pub image: String,
    /// The Talos version the node is to run after it.
    #[schemars(length(max = 64))]
    pub version: String,
    /// The Talos version the node ran before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub from_version: Option<String>,
    /// The node's boot id before it: the node is back from the upgrade's reboot once it
    /// answers with another one.
    #[schemars(length(max = 64))]
    pub boot_id_before: String,
    /// How far it went: intended (a restart sends it again), sent (a restart waits for the
    /// node to go down), went down, verified.
    #[serde(default)]
    pub progress: crate::operation::NodeProgress,
}

/// What the machine classes of its cluster make of a pending machine: the condition
/// `ClassMatched`, and no fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct MachineClassMatch {}

impl Group<TalosMachineStatus> for MachineClassMatch {
    const MANAGER: &'static str = fm::MACHINE_CLASS;
    const CONDITIONS: Owned = Owned::Only(&[conditions::CLASS_MATCHED]);
    fn of(_: &TalosMachineStatus) -> &Self {
        &MachineClassMatch {}
    }
}

group!(
    MachineLifecycle,
    TalosMachineStatus,
    lifecycle,
    fm::MACHINE_LIFECYCLE,
    Owned::Rest
);
group!(
    MachineInventory,
    TalosMachineStatus,
    inventory,
    fm::MACHINE_INVENTORY,
    Owned::Only(&[conditions::FINGERPRINT_CHANGED])
);
group!(
    MachineApplied,
    TalosMachineStatus,
    applied,
    fm::MACHINE_APPLIED,
    Owned::None
);
group!(
    MachineDrift,
    TalosMachineStatus,
    drift,
    fm::MACHINE_DRIFT,
    Owned::None
);
group!(
    MachineEtcd,
    TalosMachineStatus,
    etcd,
    fm::MACHINE_ETCD,
    Owned::None
);
group!(
    MachineRemoval,
    TalosMachineStatus,
    removal,
    fm::MACHINE_REMOVAL,
    Owned::Only(&[conditions::REMOVAL_APPROVED])
);
group!(
    MachineUpgrade,
    TalosMachineStatus,
    upgrade,
    fm::MACHINE_UPGRADE,
    Owned::Only(&[conditions::UP_TO_DATE])
);
group!(
    MachineDrain,
    TalosMachineStatus,
    drain,
    fm::MACHINE_DRAIN,
    Owned::Only(&[conditions::DRAINED])
);
group!(
    crate::bmc::MachineBmc,
    TalosMachineStatus,
    bmc,
    fm::MACHINE_BMC,
    Owned::Only(&[conditions::BMC_REACHABLE])
);
grouped!(
    TalosMachineStatus,
    [
        MachineLifecycle,
        MachineApplied,
        MachineDrift,
        MachineInventory,
        MachineEtcd,
        MachineRemoval,
        MachineDrain,
        MachineUpgrade,
        crate::bmc::MachineBmc,
        MachineClassMatch,
    ]
);

/// A control plane's etcd member as the manager observed it on the node.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EtcdObservation {
    /// Whether the member is a voter (a learner is not). Kept from the last answer while the
    /// node does not answer: a voter that stops answering is still in the member list.
    pub voter: bool,
    /// Whether the node answered and its etcd member reported its status.
    pub healthy: bool,
    /// When it was observed.
    pub observed_at: Time,
}

/// Hardware as read from the machine in maintenance mode.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareInventory {
    /// The SMBIOS system UUID (the machine's identity).
    #[schemars(length(max = 64))]
    pub uuid: String,
    /// SMBIOS manufacturer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub manufacturer: Option<String>,
    /// SMBIOS product name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub product_name: Option<String>,
    /// SMBIOS serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub serial_number: Option<String>,
    /// Block devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub disks: Vec<DiskInfo>,
    /// Network links.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub links: Vec<LinkInfo>,
}

/// One block device.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskInfo {
    /// Device name, e.g. `sda`.
    #[schemars(length(max = 64))]
    pub name: String,
    /// Device path, e.g. `/dev/sda`.
    #[schemars(length(max = 256))]
    pub dev_path: String,
    /// Size in bytes.
    pub size: u64,
    /// Model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub model: Option<String>,
    /// Serial number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub serial: Option<String>,
    /// WWID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub wwid: Option<String>,
    /// Transport, e.g. `nvme`, `sata`, `virtio`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub transport: Option<String>,
    /// Whether the disk spins.
    #[serde(default)]
    pub rotational: bool,
    /// Whether it is read-only.
    #[serde(default)]
    pub readonly: bool,
    /// Whether it is a CD-ROM.
    #[serde(default)]
    pub cdrom: bool,
}

/// One network link.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinkInfo {
    /// Link name, e.g. `eth0`.
    #[schemars(length(max = 64))]
    pub name: String,
    /// Hardware (MAC) address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub hardware_addr: Option<String>,
    /// Operational state, e.g. `up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub operational_state: Option<String>,
    /// Link kind (empty for physical links).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub kind: Option<String>,
    /// Driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub driver: Option<String>,
    /// Speed in Mbit/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speed_mbit: Option<u32>,
}

/// The steps of a removal, in order. Recorded so a restarted manager resumes at the step
/// reached and never repeats one that must not be repeated.
#[derive(
    schemars::JsonSchema,
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
)]
pub enum RemovalStep {
    /// Waiting for the cluster lock and the safety rechecks.
    #[default]
    Pending,
    /// The workload Node was cordoned.
    Cordoned,
    /// The workload Node was drained.
    Drained,
    /// The machine left etcd (control planes).
    EtcdLeft,
    /// Talos was reset (STATE and EPHEMERAL wiped, rebooting to maintenance).
    Reset,
    /// The workload Node object was deleted.
    NodeDeleted,
    /// Done; the finalizer is released.
    Complete,
}

/// Progress of a removal.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RemovalProgress {
    /// The last step completed.
    pub step: RemovalStep,
    /// When the removal started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// Whether the reset was skipped (force removal of an unreachable node).
    #[serde(default)]
    pub reset_skipped: bool,
    /// What the removal is doing or waiting for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// Workload steps skipped by force removal because the workload cluster's API did not
    /// answer (cordon, drain; the Node delete is handed to the TalosCluster).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub skipped: Vec<SkippedStep>,
}

/// A removal step skipped by force removal, with why and when.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SkippedStep {
    /// The step skipped (`Cordoned`, `Drained`, `NodeDeleted`).
    pub step: RemovalStep,
    /// Why, as a condition reason (e.g. `WorkloadAPIUnreachable`).
    #[schemars(length(max = 64))]
    pub reason: String,
    /// What failed, and what happens instead.
    #[schemars(length(max = 1024))]
    pub message: String,
    /// When it was skipped.
    pub at: Time,
}
