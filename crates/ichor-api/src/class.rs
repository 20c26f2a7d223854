//! `TalosMachineClass`: an opt-in approval policy for pending machines.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::common::{Condition, InstallSpec, LocalObjectReference, Role};
use crate::config::ConfigPatch;

/// Approves pending machines that match hardware qualifiers, giving them a role, a cluster and
/// patches. Creating a class is the opt-in: without one, every machine waits for a person.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosMachineClass",
    plural = "talosmachineclasses",
    shortname = "tmc",
    category = "ichor",
    namespaced,
    status = "TalosMachineClassStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Role","type":"string","jsonPath":".spec.role"}"#,
    printcolumn = r#"{"name":"Matched","type":"integer","jsonPath":".status.matchedMachines"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineClassSpec {
    /// The TalosCluster matching machines join (same namespace).
    pub cluster_ref: LocalObjectReference,
    /// The role matching machines get.
    pub role: Role,
    /// What a pending machine must have to match. Every qualifier set must hold.
    pub qualifiers: Qualifiers,
    /// Install settings for matching machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallSpec>,
    /// Config patches for matching machines (after the cluster's, before the machine's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_patches: Vec<ConfigPatch>,
}

/// Hardware qualifiers; at least one must be set.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("size(self.uuids) > 0 || has(self.minDiskSize) || size(self.macAddresses) > 0 || size(self.cidrs) > 0").message("set at least one qualifier: uuids, minDiskSize, macAddresses or cidrs"))]
pub struct Qualifiers {
    /// SMBIOS UUIDs of machines to match.
    #[serde(default)]
    #[schemars(length(max = 256), inner(length(max = 64)))]
    pub uuids: Vec<String>,
    /// The machine has a (non-CD) disk at least this large, e.g. `100Gi`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("minDiskSize must be a quantity, e.g. 100Gi"))]
    pub min_disk_size: Option<String>,
    /// The machine has a link with one of these MAC addresses.
    #[serde(default)]
    #[schemars(length(max = 256), inner(length(max = 17)))]
    #[x_kube(validation = Rule::new("self.all(m, m.matches('^([0-9a-f]{2}:){5}[0-9a-f]{2}$'))").message("macAddresses must be lowercase colon-separated MAC addresses, e.g. 52:54:00:12:34:56"))]
    pub mac_addresses: Vec<String>,
    /// The machine was discovered at an address inside one of these CIDRs.
    #[serde(default)]
    #[schemars(length(max = 8), inner(length(max = 43)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("each qualifier CIDR must be in CIDR notation, e.g. 192.168.10.0/24"))]
    pub cidrs: Vec<String>,
}

/// The observed state of a class.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineClassStatus {
    /// How many machines this class approved.
    #[serde(default)]
    pub matched_machines: i32,
    /// Problems with the class (e.g. its cluster does not exist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
