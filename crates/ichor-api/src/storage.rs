//! `TalosStorage`: storage intent for a cluster's machines, rendered into volume documents.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::common::{Condition, LocalObjectReference};
use crate::names::field_managers as fm;
use crate::status::{Owned, group, grouped};

/// User volumes to provision on a cluster's machines.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosStorage",
    plural = "talosstorages",
    shortname = "tst",
    category = "ichor",
    namespaced,
    status = "TalosStorageStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Volumes","type":"integer","jsonPath":".status.volumeCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.volumes.all(v, self.volumes.exists_one(w, w.name == v.name))").message("volume names must be unique"))]
pub struct TalosStorageSpec {
    /// The TalosCluster (same namespace).
    pub cluster_ref: LocalObjectReference,
    /// Machines this applies to; all of the cluster's machines when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_selector: Option<LabelSelector>,
    /// The user volumes, by name.
    #[schemars(length(min = 1, max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Vec<UserVolume>,
}

impl TalosStorage {
    /// Whether this storage gives `machine` its volumes: same namespace and cluster, and the
    /// machine's labels match `spec.machineSelector` (every machine of the cluster when absent).
    pub fn selects(&self, machine: &crate::TalosMachine) -> bool {
        self.metadata.namespace == machine.metadata.namespace
            && self.spec.cluster_ref.name == machine.spec.cluster_ref.name
            && self.spec.machine_selector.as_ref().is_none_or(|s| {
                crate::operation::selects(s, &machine.metadata.labels.clone().unwrap_or_default())
            })
    }
}

/// One user volume (a `UserVolumeConfig` document), mounted at `/var/mnt/<name>`.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.minSize) || !has(self.maxSize) || quantity(self.minSize).compareTo(quantity(self.maxSize)) <= 0").message("minSize must not exceed maxSize"))]
#[x_kube(validation = Rule::new("has(self.minSize) || has(self.maxSize)").message("set minSize or maxSize (Talos needs at least one for a partition volume)"))]
#[x_kube(validation = Rule::new("!has(self.maxSize) || (has(oldSelf.maxSize) && quantity(self.maxSize).compareTo(quantity(oldSelf.maxSize)) >= 0)").message("a volume cannot shrink: maxSize may only grow or be removed (Talos never shrinks a partition)"))]
pub struct UserVolume {
    /// The volume's name (lowercase letters, digits and dashes).
    #[schemars(
        length(min = 1, max = 34),
        regex(pattern = r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
    )]
    pub name: String,
    /// A CEL expression over `disk` choosing where the volume goes, e.g.
    /// `disk.transport == 'nvme' && !system_disk`.
    #[schemars(length(min = 1, max = 1024))]
    pub disk_selector: String,
    /// The smallest acceptable size, e.g. `10Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("minSize must be a quantity, e.g. 10Gi"))]
    pub min_size: Option<String>,
    /// The largest size to take, e.g. `100Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("maxSize must be a quantity, e.g. 100Gi"))]
    pub max_size: Option<String>,
    /// The filesystem.
    #[serde(default)]
    pub filesystem: Filesystem,
}

/// Filesystems a user volume may have.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Filesystem {
    /// XFS (Talos's default).
    #[default]
    Xfs,
    /// ext4.
    Ext4,
}

/// The observed state of storage intent.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosStorageStatus {
    /// `Ready` and the reasons volumes are missing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The volumes provisioned.
    #[serde(flatten)]
    pub volumes: StorageVolumes,
}

/// The volumes a TalosStorage provisioned, with every condition of the storage.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageVolumes {
    /// How many volumes are provisioned across machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_count: Option<i32>,
    /// Observed volumes per machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub machines: Vec<MachineVolumes>,
}

group!(
    StorageVolumes,
    TalosStorageStatus,
    volumes,
    fm::STORAGE_STATUS,
    Owned::Rest
);
grouped!(TalosStorageStatus, [StorageVolumes]);

/// The volumes observed on one machine.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineVolumes {
    /// The TalosMachine.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// Its volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub volumes: Vec<ObservedVolume>,
}

/// One volume as Talos reports it.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObservedVolume {
    /// The volume's name.
    #[schemars(length(max = 64))]
    pub name: String,
    /// Talos's phase for it, e.g. `ready`.
    #[schemars(length(max = 32))]
    pub phase: String,
    /// Its size, e.g. `100 GB`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub size: Option<String>,
    /// Where it lives, e.g. `/dev/nvme0n1p1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub location: Option<String>,
}
