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

/// The bytes a Kubernetes quantity such as `100Gi`, `1.5Ti`, `500G` or `1048576` stands for;
/// `None` for anything else (negative, exponent forms, milli units, overflow).
pub fn quantity_bytes(quantity: &str) -> Option<u64> {
    let text = quantity.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let multiplier: u64 = match suffix {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut bytes = whole.checked_mul(multiplier)?;
    if !fraction.is_empty() {
        let digits: u32 = fraction.len().try_into().ok()?;
        let scale = 10u128.checked_pow(digits)?;
        let part: u128 = fraction.parse().ok()?;
        let extra = part.checked_mul(u128::from(multiplier))? / scale;
        bytes = bytes.checked_add(u64::try_from(extra).ok()?)?;
    }
    Some(bytes)
}

#[cfg(test)]
mod quantity_tests {
    use super::quantity_bytes;

    #[test]
    fn quantities_read_as_bytes() {
        assert_eq!(quantity_bytes("100Gi"), Some(100 << 30));
        assert_eq!(quantity_bytes("1.5Ki"), Some(1536));
        assert_eq!(quantity_bytes("500G"), Some(500_000_000_000));
        assert_eq!(quantity_bytes("1048576"), Some(1 << 20));
        assert_eq!(quantity_bytes(".5Mi"), Some(512 << 10));
        for bad in [
            "",
            "Gi",
            "10gb",
            "-1Gi",
            "1e9",
            "100m",
            "1.2.3Gi",
            "99999999999Ei",
        ] {
            assert_eq!(quantity_bytes(bad), None, "{bad}");
        }
    }
}
