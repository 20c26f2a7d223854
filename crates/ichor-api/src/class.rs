//! `TalosMachineClass`: an opt-in approval policy for pending machines.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::common::{Condition, InstallSpec, LocalObjectReference, Role};
use crate::config::ConfigPatch;
use crate::names::field_managers as fm;
use crate::status::{Owned, group, grouped};

/// Approves pending machines of its cluster that match hardware qualifiers, giving them a role,
/// install settings and patches. Creating a class is the opt-in: without one, every machine
/// waits for a person. A class never moves a machine to another cluster, never approves a
/// machine whose certificate changed or that was rejected, never approves past `maxMachines`
/// or past the cluster's declared control-plane count, and never unapproves a machine.
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
    /// The TalosCluster whose pending machines this class approves (same namespace). Only
    /// machines discovered for this cluster match.
    pub cluster_ref: LocalObjectReference,
    /// The role matching machines get.
    pub role: Role,
    /// What a pending machine must have to match. Every qualifier set must hold.
    pub qualifiers: Qualifiers,
    /// At most this many machines approved by this class (counting those it approved
    /// before); further matches stay pending. No limit when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_machines: Option<i32>,
    /// Install settings for matching machines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install: Option<InstallSpec>,
    /// The Image Factory schematic of matching machines' installers (a GPU class's drivers,
    /// for instance): replaces the cluster's whole; a machine's own replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schematic: Option<crate::schematic::Schematic>,
    /// Config patches for matching machines (after the cluster's, before the machine's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub config_patches: Vec<ConfigPatch>,
    /// The rollout policy of the machines this class approved, in place of the cluster's
    /// `spec.rollout` (its windows, gates, fresh backup, `holdLiveChanges`); a suspend of
    /// either stops them. Unset: the cluster's applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutPolicy>,
}

/// Hardware qualifiers, evaluated against the inventory recorded at discovery; at least one
/// must be set. Every qualifier set must hold; a list holds when any of its entries does. The
/// disk qualifiers (`minDiskSize`, `diskModels`, `diskTypes`) must all hold for one and the
/// same (non-CD) disk.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("size(self.uuids) > 0 || has(self.minDiskSize) || size(self.macAddresses) > 0 || size(self.cidrs) > 0 || size(self.diskModels) > 0 || size(self.diskTypes) > 0 || size(self.talosVersions) > 0").message("set at least one qualifier: uuids, minDiskSize, diskModels, diskTypes, macAddresses, cidrs or talosVersions"))]
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
    /// The machine has a disk whose model matches one of these patterns (`*` matches any
    /// run of characters; case-sensitive), e.g. `Samsung SSD 9*`.
    #[serde(default)]
    #[schemars(length(max = 32), inner(length(min = 1, max = 128)))]
    pub disk_models: Vec<String>,
    /// The machine has a disk of one of these types.
    #[serde(default)]
    #[schemars(length(max = 3))]
    pub disk_types: Vec<DiskType>,
    /// The machine runs a Talos version with one of these prefixes, whole components only:
    /// `v1.14` matches `v1.14.1`, not `v1.140.0`.
    #[serde(default)]
    #[schemars(length(max = 16), inner(length(min = 2, max = 32)))]
    #[x_kube(validation = Rule::new("self.all(v, v.matches('^v[0-9]+(\\\\.[0-9]+){0,2}$'))").message("talosVersions entries must look like v1, v1.14 or v1.14.1"))]
    pub talos_versions: Vec<String>,
}

/// A disk's type, from its recorded transport and rotation.
#[derive(schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskType {
    /// Transport `nvme`.
    Nvme,
    /// Not NVMe, not rotational.
    Ssd,
    /// Rotational.
    Hdd,
}

/// The observed state of a class.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosMachineClassStatus {
    /// Problems with the class (e.g. its cluster does not exist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The machines the class matched.
    #[serde(flatten)]
    pub matches: ClassMatches,
}

/// The machines a class matched, with every condition of the class.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClassMatches {
    /// How many machines this class approved.
    #[serde(default)]
    pub matched_machines: i32,
    /// The machines this class approved, by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024), inner(length(max = 253)))]
    pub machines: Vec<String>,
    /// Pending machines this class matches but has not approved (see each machine's
    /// `ClassMatched` condition for why), by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024), inner(length(max = 253)))]
    pub waiting: Vec<String>,
}

group!(
    ClassMatches,
    TalosMachineClassStatus,
    matches,
    fm::CLASS_STATUS,
    Owned::Rest
);
grouped!(TalosMachineClassStatus, [ClassMatches]);

impl Qualifiers {
    /// Whether a machine with this recorded inventory (`status.hardware`, the address it was
    /// discovered at, the Talos version it runs) matches: every qualifier set holds. A machine
    /// with no recorded hardware matches no hardware qualifier.
    pub fn matches(&self, status: &crate::machine::TalosMachineStatus) -> bool {
        let hardware = status.inventory.hardware.as_ref();
        let uuid_ok = self.uuids.is_empty()
            || hardware.is_some_and(|h| self.uuids.iter().any(|u| u.eq_ignore_ascii_case(&h.uuid)));
        let mac_ok = self.mac_addresses.is_empty()
            || hardware.is_some_and(|h| {
                h.links.iter().any(|l| {
                    l.hardware_addr.as_deref().is_some_and(|mac| {
                        self.mac_addresses
                            .iter()
                            .any(|m| m.eq_ignore_ascii_case(mac))
                    })
                })
            });
        let cidr_ok = self.cidrs.is_empty()
            || status
                .inventory
                .address
                .as_deref()
                .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                .is_some_and(|ip| self.cidrs.iter().any(|c| cidr_contains(c, ip)));
        let version_ok = self.talos_versions.is_empty()
            || status
                .inventory
                .talos_version
                .as_deref()
                .is_some_and(|v| self.talos_versions.iter().any(|p| version_has_prefix(v, p)));
        let disks_ok = !self.has_disk_qualifiers()
            || hardware.is_some_and(|h| h.disks.iter().any(|d| self.disk_matches(d)));
        uuid_ok && mac_ok && cidr_ok && version_ok && disks_ok
    }

    fn has_disk_qualifiers(&self) -> bool {
        self.min_disk_size.is_some() || !self.disk_models.is_empty() || !self.disk_types.is_empty()
    }

    /// Whether one disk satisfies every disk qualifier at once (CD-ROMs never do).
    fn disk_matches(&self, disk: &crate::machine::DiskInfo) -> bool {
        if disk.cdrom {
            return false;
        }
        let size_ok = self
            .min_disk_size
            .as_deref()
            .is_none_or(|q| crate::common::quantity_bytes(q).is_some_and(|min| disk.size >= min));
        let model_ok = self.disk_models.is_empty()
            || disk.model.as_deref().is_some_and(|m| {
                self.disk_models
                    .iter()
                    .any(|p| crate::glob::matches(p, m.trim()))
            });
        let kind = DiskType::of(disk);
        let type_ok = self.disk_types.is_empty() || self.disk_types.contains(&kind);
        size_ok && model_ok && type_ok
    }
}

impl DiskType {
    /// The type of a recorded disk: NVMe by transport, else HDD when rotational, else SSD.
    pub fn of(disk: &crate::machine::DiskInfo) -> Self {
        if disk.transport.as_deref() == Some("nvme") {
            Self::Nvme
        } else if disk.rotational {
            Self::Hdd
        } else {
            Self::Ssd
        }
    }
}

/// Whether `version` (e.g. `v1.14.1`) starts with `prefix` (e.g. `v1.14`) at a component
/// boundary.
fn version_has_prefix(version: &str, prefix: &str) -> bool {
    version == prefix
        || version
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
}

/// Whether the CIDR `cidr` (e.g. `10.0.0.0/24`) contains `ip`; an invalid CIDR contains nothing.
pub(crate) fn cidr_contains(cidr: &str, ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let Some((net, bits)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>()) else {
        return false;
    };
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) if bits <= 32 => {
            let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) if bits <= 128 => {
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::{
        DiskInfo, HardwareInventory, LinkInfo, MachineInventory, TalosMachineStatus,
    };

    fn status() -> TalosMachineStatus {
        TalosMachineStatus {
            inventory: MachineInventory {
                address: Some("10.0.0.7".into()),
                talos_version: Some("v1.14.1".into()),
                hardware: Some(HardwareInventory {
                    uuid: "AAAA-1".into(),
                    disks: vec![
                        DiskInfo {
                            name: "sr0".into(),
                            size: 1 << 40,
                            cdrom: true,
                            ..Default::default()
                        },
                        DiskInfo {
                            name: "nvme0n1".into(),
                            size: 500 << 30,
                            model: Some("Samsung SSD 990 PRO ".into()),
                            transport: Some("nvme".into()),
                            ..Default::default()
                        },
                        DiskInfo {
                            name: "sda".into(),
                            size: 4 << 40,
                            model: Some("WDC WD40".into()),
                            rotational: true,
                            transport: Some("sata".into()),
                            ..Default::default()
                        },
                    ],
                    links: vec![LinkInfo {
                        name: "eth0".into(),
                        hardware_addr: Some("52:54:00:aa:bb:cc".into()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn every_qualifier_set_must_hold() {
        let s = status();
        let q = |f: &dyn Fn(&mut Qualifiers)| {
            let mut q = Qualifiers::default();
            f(&mut q);
            q.matches(&s)
        };
        assert!(q(&|q| q.uuids = vec!["aaaa-1".into()]));
        assert!(!q(&|q| q.uuids = vec!["bbbb".into()]));
        assert!(q(&|q| q.mac_addresses = vec!["52:54:00:aa:bb:cc".into()]));
        assert!(q(&|q| q.cidrs = vec!["10.0.0.0/24".into()]));
        assert!(!q(
            &|q| q.cidrs = vec!["10.0.1.0/24".into(), "nonsense".into()]
        ));
        assert!(q(&|q| q.talos_versions = vec!["v1.14".into()]));
        assert!(!q(&|q| q.talos_versions = vec!["v1.1".into()]));
        assert!(q(&|q| q.min_disk_size = Some("4Ti".into())));
        assert!(
            !q(&|q| q.min_disk_size = Some("5Ti".into())),
            "the CD-ROM never counts"
        );
        assert!(q(&|q| q.disk_models = vec!["Samsung SSD 9*".into()]));
        assert!(q(&|q| q.disk_types = vec![DiskType::Hdd]));
        assert!(!q(&|q| q.disk_types = vec![DiskType::Ssd]));
        // The disk qualifiers hold for one and the same disk.
        assert!(q(&|q| {
            q.disk_types = vec![DiskType::Nvme];
            q.min_disk_size = Some("400Gi".into());
        }));
        assert!(!q(&|q| {
            q.disk_types = vec![DiskType::Nvme];
            q.min_disk_size = Some("1Ti".into());
        }));
        // All sets must hold.
        assert!(!q(&|q| {
            q.uuids = vec!["aaaa-1".into()];
            q.cidrs = vec!["192.168.0.0/16".into()];
        }));
        assert!(
            !Qualifiers {
                uuids: vec!["aaaa-1".into()],
                ..Default::default()
            }
            .matches(&TalosMachineStatus::default()),
            "no inventory, no match"
        );
    }
}
