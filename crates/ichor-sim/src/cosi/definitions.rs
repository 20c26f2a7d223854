//! The resource definitions and namespaces a node registers in its COSI state, as Talos
//! v1.14.1 registers them (talos-facts §13.1): each definition here is, field for field, what the
//! Talos resource type declares and COSI's registry fills in (display type, automatic aliases);
//! `tools/talos-conformance resources` checks a running node's against Talos's own types.
//!
//! Only the types the simulator models are registered: a type it does not model is refused as
//! unsupported, never served empty.

use ichor_talos::api::cosi::resource::meta::resource_definition_spec::{PrintColumn, Sensitivity};
use ichor_talos::api::cosi::resource::meta::{NamespaceSpec, ResourceDefinitionSpec};
use prost::Message as _;

use super::Wanted;
use super::store::Res;
use super::yaml::{Fields, Yaml, marshal};

/// COSI's meta namespace, and the owner of everything in it.
const META: &str = "meta";
/// The type of resource definitions.
pub(crate) const DEFINITION_TYPE: &str = "ResourceDefinitions.meta.cosi.dev";
/// The type of namespaces.
pub(crate) const NAMESPACE_TYPE: &str = "Namespaces.meta.cosi.dev";

/// One `ResourceDefinitions.meta.cosi.dev` spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Definition {
    /// The canonical type, e.g. `Disks.block.talos.dev`.
    pub(crate) resource_type: &'static str,
    /// The singular name `talosctl get` prints in its TYPE column.
    pub(crate) display_type: &'static str,
    /// The namespace `talosctl get` looks in by default.
    pub(crate) default_namespace: &'static str,
    /// Human-readable aliases.
    pub(crate) aliases: &'static [&'static str],
    /// Every name the type is matched by, client side.
    pub(crate) all_aliases: &'static [&'static str],
    /// Extra table columns: (name, JSONPath into the YAML spec).
    pub(crate) print_columns: &'static [(&'static str, &'static str)],
    /// Whether reading it needs `os:admin`.
    pub(crate) sensitive: bool,
}

impl Definition {
    /// The resource id of the definition: the lowercased type.
    pub(crate) fn id(&self) -> String {
        self.resource_type.to_lowercase()
    }
}

/// The types Talos v1.14 registers and v1.13 does not (talos-facts §13.1).
const SINCE_1_14: [&str; 2] = [
    "UnattendedInstallStatuses.runtime.talos.dev",
    "ImageFactorySchematics.runtime.talos.dev",
];

/// The definitions a node of this version registers.
pub(crate) fn registered(is_1_14: bool) -> impl Iterator<Item = &'static Definition> {
    DEFINITIONS
        .iter()
        .filter(move |d| is_1_14 || !SINCE_1_14.contains(&d.resource_type))
}

/// The definition whose id (lowercased type) is `type_.to_lowercase()`, as Talos's access
/// policy looks a requested type up.
pub(crate) fn definition(type_: &str, is_1_14: bool) -> Option<&'static Definition> {
    let id = type_.to_lowercase();
    registered(is_1_14).find(|d| d.id() == id)
}

/// The meta resources: every definition and namespace, owned by `meta` (talos-facts §13.1).
pub(crate) fn resources(want: &Wanted, is_1_14: bool) -> Vec<Res> {
    let mut out = Vec::new();
    for d in registered(is_1_14).filter(|_| want.has(DEFINITION_TYPE)) {
        let spec = ResourceDefinitionSpec {
            resource_type: d.resource_type.into(),
            display_type: d.display_type.into(),
            default_namespace: d.default_namespace.into(),
            aliases: d.aliases.iter().map(|a| (*a).to_owned()).collect(),
            all_aliases: d.all_aliases.iter().map(|a| (*a).to_owned()).collect(),
            print_columns: d
                .print_columns
                .iter()
                .map(|(name, path)| PrintColumn {
                    name: (*name).into(),
                    json_path: (*path).into(),
                })
                .collect(),
            sensitivity: if d.sensitive {
                Sensitivity::Sensitive
            } else {
                Sensitivity::NonSensitive
            } as i32,
        };
        let columns = d
            .print_columns
            .iter()
            .map(|(name, path)| {
                Fields::new()
                    .field("name", Yaml::str(*name))
                    .field("jsonPath", Yaml::str(*path))
                    .done()
            })
            .collect();
        let yaml = Fields::new()
            .field("type", Yaml::str(d.resource_type))
            .field("displayType", Yaml::str(d.display_type))
            .field("defaultNamespace", Yaml::str(d.default_namespace))
            .field("aliases", Yaml::strs(d.aliases))
            .field("allAliases", Yaml::strs(d.all_aliases))
            .field("printColumns", Yaml::Seq(columns))
            .omitempty(
                "sensitivity",
                Yaml::str(if d.sensitive { "sensitive" } else { "" }),
            )
            .done();
        out.push(Res::new(
            META,
            DEFINITION_TYPE,
            d.id(),
            META,
            marshal(&yaml),
            spec.encode_to_vec(),
        ));
    }
    for (name, description) in NAMESPACES.iter().filter(|_| want.has(NAMESPACE_TYPE)) {
        let spec = NamespaceSpec {
            description: (*description).into(),
        };
        let yaml = Fields::new()
            .field("description", Yaml::str(*description))
            .done();
        out.push(Res::new(
            META,
            NAMESPACE_TYPE,
            *name,
            META,
            marshal(&yaml),
            spec.encode_to_vec(),
        ));
    }
    out
}

/// Whether `name` is a registered namespace.
pub(crate) fn namespace_exists(name: &str) -> bool {
    NAMESPACES.iter().any(|(n, _)| *n == name)
}

/// The definitions the simulator registers: the types it models.
pub(crate) const DEFINITIONS: &[Definition] = &[
    Definition {
        resource_type: "ResourceDefinitions.meta.cosi.dev",
        display_type: "ResourceDefinition",
        default_namespace: "meta",
        aliases: &["api-resources", "resourcedefinition", "rd", "rds"],
        all_aliases: &[
            "resourcedefinitions",
            "resourcedefinitions.meta",
            "resourcedefinitions.meta.cosi",
            "api-resources",
            "resourcedefinition",
            "rd",
            "rds",
        ],
        print_columns: &[("Aliases", "{.aliases[:]}")],
        sensitive: false,
    },
    Definition {
        resource_type: "Namespaces.meta.cosi.dev",
        display_type: "Namespace",
        default_namespace: "meta",
        aliases: &["ns", "namespace"],
        all_aliases: &[
            "namespaces",
            "namespaces.meta",
            "namespaces.meta.cosi",
            "ns",
            "namespace",
        ],
        print_columns: &[],
        sensitive: false,
    },
    Definition {
        resource_type: "Disks.block.talos.dev",
        display_type: "Disk",
        default_namespace: "runtime",
        aliases: &["disk"],
        all_aliases: &["disks", "disks.block", "disks.block.talos", "disk"],
        print_columns: &[
            ("Size", "{.pretty_size}"),
            ("Read Only", "{.readonly}"),
            ("Transport", "{.transport}"),
            ("Rotational", "{.rotational}"),
            ("WWID", "{.wwid}"),
            ("Model", "{.model}"),
            ("Serial", "{.serial}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "DiscoveredVolumes.block.talos.dev",
        display_type: "DiscoveredVolume",
        default_namespace: "runtime",
        aliases: &["discoveredvolume", "dv", "dvs"],
        all_aliases: &[
            "discoveredvolumes",
            "discoveredvolumes.block",
            "discoveredvolumes.block.talos",
            "discoveredvolume",
            "dv",
            "dvs",
        ],
        print_columns: &[
            ("Type", "{.type}"),
            ("Size", "{.pretty_size}"),
            ("Discovered", "{.name}"),
            ("Label", "{.label}"),
            ("PartitionLabel", "{.partition_label}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "SystemDisks.block.talos.dev",
        display_type: "SystemDisk",
        default_namespace: "runtime",
        aliases: &["systemdisk", "sd", "sds"],
        all_aliases: &[
            "systemdisks",
            "systemdisks.block",
            "systemdisks.block.talos",
            "systemdisk",
            "sd",
            "sds",
        ],
        print_columns: &[("Disk", "{.diskID}")],
        sensitive: false,
    },
    Definition {
        resource_type: "VolumeStatuses.block.talos.dev",
        display_type: "VolumeStatus",
        default_namespace: "runtime",
        aliases: &["volumestatus", "vs"],
        all_aliases: &[
            "volumestatuses",
            "volumestatuses.block",
            "volumestatuses.block.talos",
            "volumestatus",
            "vs",
        ],
        print_columns: &[
            ("Type", "{.type}"),
            ("Phase", "{.phase}"),
            ("Location", "{.location}"),
            ("Size", "{.prettySize}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "Members.cluster.talos.dev",
        display_type: "Member",
        default_namespace: "cluster",
        aliases: &["member"],
        all_aliases: &[
            "members",
            "members.cluster",
            "members.cluster.talos",
            "member",
        ],
        print_columns: &[
            ("Hostname", "{.hostname}"),
            ("Machine Type", "{.machineType}"),
            ("OS", "{.operatingSystem}"),
            ("Addresses", "{.addresses}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "MachineConfigs.config.talos.dev",
        display_type: "MachineConfig",
        default_namespace: "config",
        aliases: &["machineconfig", "mc", "mcs"],
        all_aliases: &[
            "machineconfigs",
            "machineconfigs.config",
            "machineconfigs.config.talos",
            "machineconfig",
            "mc",
            "mcs",
        ],
        print_columns: &[],
        sensitive: true,
    },
    Definition {
        resource_type: "MachineTypes.config.talos.dev",
        display_type: "MachineType",
        default_namespace: "config",
        aliases: &["machinetype", "mt", "mts"],
        all_aliases: &[
            "machinetypes",
            "machinetypes.config",
            "machinetypes.config.talos",
            "machinetype",
            "mt",
            "mts",
        ],
        print_columns: &[("Type", "{@}")],
        sensitive: false,
    },
    Definition {
        resource_type: "EtcdMembers.etcd.talos.dev",
        display_type: "EtcdMember",
        default_namespace: "etcd",
        aliases: &["etcdmember", "em", "ems"],
        all_aliases: &[
            "etcdmembers",
            "etcdmembers.etcd",
            "etcdmembers.etcd.talos",
            "etcdmember",
            "em",
            "ems",
        ],
        print_columns: &[("Member ID", "{.memberID}")],
        sensitive: false,
    },
    Definition {
        resource_type: "SystemInformations.hardware.talos.dev",
        display_type: "SystemInformation",
        default_namespace: "hardware",
        aliases: &["systeminformation", "systeminformation", "si", "sis"],
        all_aliases: &[
            "systeminformations",
            "systeminformations.hardware",
            "systeminformations.hardware.talos",
            "systeminformation",
            "systeminformation",
            "si",
            "sis",
        ],
        print_columns: &[
            ("Manufacturer", "{.manufacturer}"),
            ("ProductName", "{.productName}"),
            ("Version", "{.version}"),
            ("SerialNumber", "{.serialnumber}"),
            ("UUID", "{.uuid}"),
            ("WakeUpType", "{.wakeUpType}"),
            ("SKUNumber", "{.skuNumber}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "Nodenames.kubernetes.talos.dev",
        display_type: "Nodename",
        default_namespace: "k8s",
        aliases: &["nodename"],
        all_aliases: &[
            "nodenames",
            "nodenames.kubernetes",
            "nodenames.kubernetes.talos",
            "nodename",
        ],
        print_columns: &[("Nodename", "{.nodename}")],
        sensitive: false,
    },
    Definition {
        resource_type: "Manifests.kubernetes.talos.dev",
        display_type: "Manifest",
        default_namespace: "controlplane",
        aliases: &["manifest"],
        all_aliases: &[
            "manifests",
            "manifests.kubernetes",
            "manifests.kubernetes.talos",
            "manifest",
        ],
        print_columns: &[],
        sensitive: false,
    },
    Definition {
        resource_type: "StaticPodStatuses.kubernetes.talos.dev",
        display_type: "StaticPodStatus",
        default_namespace: "k8s",
        aliases: &["podstatus", "staticpodstatus", "sps"],
        all_aliases: &[
            "staticpodstatuses",
            "staticpodstatuses.kubernetes",
            "staticpodstatuses.kubernetes.talos",
            "podstatus",
            "staticpodstatus",
            "sps",
        ],
        print_columns: &[("Ready", r#"{.conditions[?(@.type=="Ready")].status}"#)],
        sensitive: false,
    },
    Definition {
        resource_type: "AddressStatuses.net.talos.dev",
        display_type: "AddressStatus",
        default_namespace: "network",
        aliases: &["address", "addresses", "addressstatus", "as"],
        all_aliases: &[
            "addressstatuses",
            "addressstatuses.net",
            "addressstatuses.net.talos",
            "address",
            "addresses",
            "addressstatus",
            "as",
        ],
        print_columns: &[("Address", "{.address}"), ("Link", "{.linkName}")],
        sensitive: false,
    },
    Definition {
        resource_type: "HostnameStatuses.net.talos.dev",
        display_type: "HostnameStatus",
        default_namespace: "network",
        aliases: &["hostname", "hostnamestatus", "hs"],
        all_aliases: &[
            "hostnamestatuses",
            "hostnamestatuses.net",
            "hostnamestatuses.net.talos",
            "hostname",
            "hostnamestatus",
            "hs",
        ],
        print_columns: &[("Hostname", "{.hostname}"), ("Domainname", "{.domainname}")],
        sensitive: false,
    },
    Definition {
        resource_type: "LinkStatuses.net.talos.dev",
        display_type: "LinkStatus",
        default_namespace: "network",
        aliases: &["link", "links", "linkstatus", "ls"],
        all_aliases: &[
            "linkstatuses",
            "linkstatuses.net",
            "linkstatuses.net.talos",
            "link",
            "links",
            "linkstatus",
            "ls",
        ],
        print_columns: &[
            ("Alias", "{.alias}"),
            ("Type", "{.type}"),
            ("Kind", "{.kind}"),
            ("Hw Addr", "{.hardwareAddr}"),
            ("Oper State", "{.operationalState}"),
            ("Link State", "{.linkState}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "NodeAddresses.net.talos.dev",
        display_type: "NodeAddress",
        default_namespace: "network",
        aliases: &["nodeaddress", "na", "nas"],
        all_aliases: &[
            "nodeaddresses",
            "nodeaddresses.net",
            "nodeaddresses.net.talos",
            "nodeaddress",
            "na",
            "nas",
        ],
        print_columns: &[
            ("Addresses", "{.addresses}"),
            ("SortAlgorithm", "{.sortAlgorithm}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "ExtensionStatuses.runtime.talos.dev",
        display_type: "ExtensionStatus",
        default_namespace: "runtime",
        aliases: &["extensions", "extensionstatus", "es"],
        all_aliases: &[
            "extensionstatuses",
            "extensionstatuses.runtime",
            "extensionstatuses.runtime.talos",
            "extensions",
            "extensionstatus",
            "es",
        ],
        print_columns: &[
            ("Name", "{.metadata.name}"),
            ("Version", "{.metadata.version}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "ImageFactorySchematics.runtime.talos.dev",
        display_type: "ImageFactorySchematic",
        default_namespace: "runtime",
        aliases: &["imagefactoryschematic", "ifs"],
        all_aliases: &[
            "imagefactoryschematics",
            "imagefactoryschematics.runtime",
            "imagefactoryschematics.runtime.talos",
            "imagefactoryschematic",
            "ifs",
        ],
        print_columns: &[
            ("Schematic ID", "{.schematicId}"),
            ("Flavor", "{.flavor}"),
            ("API URL", "{.apiUrl}"),
        ],
        sensitive: false,
    },
    Definition {
        resource_type: "MachineStatuses.runtime.talos.dev",
        display_type: "MachineStatus",
        default_namespace: "runtime",
        aliases: &["machinestatus", "ms"],
        all_aliases: &[
            "machinestatuses",
            "machinestatuses.runtime",
            "machinestatuses.runtime.talos",
            "machinestatus",
            "ms",
        ],
        print_columns: &[("Stage", "{.stage}"), ("Ready", "{.status.ready}")],
        sensitive: false,
    },
    Definition {
        resource_type: "UnattendedInstallStatuses.runtime.talos.dev",
        display_type: "UnattendedInstallStatus",
        default_namespace: "runtime",
        aliases: &["unattendedinstallstatus", "uis"],
        all_aliases: &[
            "unattendedinstallstatuses",
            "unattendedinstallstatuses.runtime",
            "unattendedinstallstatuses.runtime.talos",
            "unattendedinstallstatus",
            "uis",
        ],
        print_columns: &[("Phase", "{.phase}")],
        sensitive: false,
    },
    Definition {
        resource_type: "Versions.runtime.talos.dev",
        display_type: "Version",
        default_namespace: "runtime",
        aliases: &["version"],
        all_aliases: &[
            "versions",
            "versions.runtime",
            "versions.runtime.talos",
            "version",
        ],
        print_columns: &[("Name", "{.name}"), ("Version", "{.version}")],
        sensitive: false,
    },
];

/// Every namespace machined registers, with its description.
pub(crate) const NAMESPACES: &[(&str, &str)] = &[
    (
        "meta",
        "Metadata namespace which contains resource and namespace definitions.",
    ),
    ("runtime", "Talos v1alpha1 subsystems glue resources."),
    ("cluster", "Cluster configuration and discovery resources."),
    ("cluster-raw", "Cluster unmerged raw resources."),
    ("config", "Talos node configuration."),
    ("etcd", "etcd resources."),
    ("files", "Files and file-like resources."),
    ("hardware", "Hardware resources."),
    ("k8s", "Kubernetes all node types resources."),
    ("controlplane", "Kubernetes control plane resources."),
    ("kubespan", "KubeSpan resources."),
    ("network", "Networking resources."),
    ("network-config", "Networking configuration resources."),
    ("cri", "CRI Seccomp resources."),
    ("containers", "Talos-managed container resources."),
    ("secrets", "Resources with secret material."),
    ("security", "Security resources."),
    ("perf", "Stats resources."),
    ("storage", "Storage resources."),
];
