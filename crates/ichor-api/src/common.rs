//! Types shared by several resources: conditions, references, roles, install settings.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A Kubernetes-style condition: one observed aspect of an object's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The aspect this condition reports, e.g. `Ready` or `ConfigApplied`.
    #[schemars(length(min = 1, max = 64))]
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// A CamelCase word naming the cause, e.g. `FingerprintMismatch`.
    #[schemars(length(min = 1, max = 64))]
    pub reason: String,
    /// What happened and what a person can do about it, in a sentence.
    #[schemars(length(max = 2048))]
    #[serde(default)]
    pub message: String,
    /// When `status` last changed.
    pub last_transition_time: Time,
    /// The `metadata.generation` this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status of a [`Condition`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known yet.
    #[default]
    Unknown,
}

/// What a machine is for in its cluster.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Runs etcd and the Kubernetes control plane.
    #[serde(rename = "controlplane")]
    ControlPlane,
    /// Runs workloads.
    #[default]
    Worker,
}

impl Role {
    /// The value as written in the API (`controlplane`, `worker`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ControlPlane => "controlplane",
            Self::Worker => "worker",
        }
    }
}

/// A reference to an object in the same namespace, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
pub struct LocalObjectReference {
    /// The object's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// How Talos is installed to disk: which disk, which installer image.
///
/// Exactly one of `disk` and `diskSelector` may be set. On contract 1.13 they render into
/// `machine.install`; on 1.14 into an `UnattendedInstallConfig` document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("!(has(self.disk) && has(self.diskSelector))").message("set install.disk or install.diskSelector, not both"))]
pub struct InstallSpec {
    /// The install disk's device path, e.g. `/dev/sda` or `/dev/nvme0n1`.
    #[schemars(length(max = 256), regex(pattern = r"^/dev/[A-Za-z0-9/_.:-]+$"))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<String>,
    /// Chooses the install disk by its properties instead of its path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_selector: Option<DiskSelector>,
    /// The installer image; defaults to the official installer for the cluster's `talosVersion`.
    #[schemars(length(max = 512))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Wipe the install disk before installing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wipe: Option<bool>,
}

/// Chooses the install disk by its properties.
///
/// On contract 1.14 `match` is a CEL expression over `disk` (e.g. `disk.size > 100u * GB &&
/// !disk.rotational`); the other fields are the 1.13 `machine.install.diskSelector` fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskSelector {
    /// A CEL expression over `disk` (contract 1.14 and later).
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub match_: Option<String>,
    /// Disk size, e.g. `>= 100GB` or `4GB` (contract 1.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub size: Option<String>,
    /// Disk model, glob allowed (contract 1.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub model: Option<String>,
    /// Disk serial number (contract 1.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub serial: Option<String>,
    /// Disk type: `ssd`, `hdd`, `nvme` or `sd` (contract 1.13).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub type_: Option<String>,
    /// Disk bus path (contract 1.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub bus_path: Option<String>,
    /// Disk WWID (contract 1.13).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub wwid: Option<String>,
}
