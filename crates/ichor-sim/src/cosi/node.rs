//! The resources of a node's lifecycle and configuration (talos-facts §3, §13.6): machine
//! status, version, unattended install, machine config and type, the local etcd member, the
//! cluster members discovery finds, and the Kubernetes node name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ichor_talos::api::common::NetIp;
use ichor_talos::api::resource::config::{MachineConfigSpec, MachineTypeSpec};
use ichor_talos::api::resource::definitions::cluster::{ControlPlane, MemberSpec as ClusterMember};
use ichor_talos::api::resource::definitions::etcd::MemberSpec as EtcdMember;
use ichor_talos::api::resource::definitions::k8s::NodenameSpec;
use ichor_talos::api::resource::definitions::runtime::{
    MachineStatusSpec, MachineStatusStatus, UnattendedInstallStatusSpec, UnmetCondition,
    VersionSpec,
};
use prost::Message as _;
use serde_json::Value;

use super::Wanted;
use super::store::{Res, Store};
use super::yaml::{Fields, Yaml, marshal};
use crate::config::AppliedConfig;
use crate::network::{Shared, network};
use crate::{Node, Stage};

const MACHINE_STATUS: &str = "MachineStatuses.runtime.talos.dev";
const VERSION: &str = "Versions.runtime.talos.dev";
const UNATTENDED_INSTALL: &str = "UnattendedInstallStatuses.runtime.talos.dev";
const MACHINE_CONFIG: &str = "MachineConfigs.config.talos.dev";
const MACHINE_TYPE: &str = "MachineTypes.config.talos.dev";
const ETCD_MEMBER: &str = "EtcdMembers.etcd.talos.dev";
const CLUSTER_MEMBER: &str = "Members.cluster.talos.dev";
const NODENAME: &str = "Nodenames.kubernetes.talos.dev";

/// The types synced after the others, because they record another resource's version
/// (`Nodename.hostnameVersion` is the HostnameStatus version).
pub(crate) const SECOND_PASS: [&str; 1] = [NODENAME];

/// The type the second pass records versions of.
pub(crate) use super::network::HOSTNAME_STATUS;

/// What the node's lifecycle resources read from its config: the documents, parsed.
struct ConfigView {
    documents: std::sync::Arc<Vec<Value>>,
}

impl ConfigView {
    fn new(config: &AppliedConfig) -> Self {
        Self {
            documents: std::sync::Arc::clone(&config.documents),
        }
    }

    fn v1alpha1(&self) -> Option<&Value> {
        self.documents
            .iter()
            .find(|d| d["version"] == "v1alpha1" && d.get("kind").is_none())
    }

    fn kind(&self, kind: &str) -> Option<&Value> {
        self.documents.iter().find(|d| d["kind"] == kind)
    }

    /// `machine.type` as `machine.Type` writes it: `init`, `controlplane`, `worker`.
    fn machine_type(&self) -> &str {
        match self
            .v1alpha1()
            .and_then(|d| d["machine"]["type"].as_str())
            .unwrap_or_default()
        {
            "init" => "init",
            "controlplane" => "controlplane",
            _ => "worker",
        }
    }

    /// Whether the discovery service registry is on: a `DiscoveryServiceConfig` document
    /// (1.14), or `cluster.discovery.enabled` without the service registry disabled.
    fn discovery(&self) -> bool {
        if self.kind("DiscoveryServiceConfig").is_some() {
            return true;
        }
        self.v1alpha1().is_some_and(|d| {
            let discovery = &d["cluster"]["discovery"];
            discovery["enabled"] == true && discovery["registries"]["service"]["disabled"] != true
        })
    }

    /// `registerWithFQDN` and `skipNodeRegistration` (KubeNodeConfig on 1.14, machine.kubelet
    /// before).
    fn kubelet_flag(&self, name: &str) -> bool {
        self.kind("KubeNodeConfig").is_some_and(|d| d[name] == true)
            || self
                .v1alpha1()
                .is_some_and(|d| d["machine"]["kubelet"][name] == true)
    }
}

/// The config the node runs (or, during a maintenance-mode install, the one just applied):
/// Talos's `v1alpha1` MachineConfig.
fn active(node: &Node) -> Option<&Arc<AppliedConfig>> {
    node.running.as_ref().or(node.persisted.as_ref())
}

/// The readiness checks a node has not met (talos-facts §3 "Readiness checks", §8.3): a
/// control plane's etcd service, and `nodeReady`, which needs a bootstrapped cluster with a
/// CNI.
pub(crate) fn unmet_conditions(node: &Node, shared: &Shared) -> Vec<UnmetCondition> {
    let Some(config) = &node.running else {
        return Vec::new();
    };
    let mut unmet = Vec::new();
    let net = network();
    let cluster_id = if config.is_control_plane() {
        let running = shared.etcd_running.load(Ordering::SeqCst);
        if running == 0 || shared.etcd_unhealthy.load(Ordering::SeqCst) {
            unmet.push(UnmetCondition {
                name: "services".into(),
                reason: "service \"etcd\" is not healthy".into(),
            });
        }
        running
    } else {
        net.control_plane_at(&config.endpoint_host, &config.cluster_identity())
            .map_or(0, |cp| cp.shared.etcd_running.load(Ordering::SeqCst))
    };
    match net.cluster(cluster_id).filter(|c| net.has_quorum(c)) {
        None => unmet.push(UnmetCondition {
            name: "nodeReady".into(),
            reason: "node is not registered in Kubernetes yet".into(),
        }),
        Some(c) if !c.cni_present => unmet.push(UnmetCondition {
            name: "nodeReady".into(),
            reason: "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady".into(),
        }),
        Some(_) => {}
    }
    unmet
}

fn machine_status(node: &Node, shared: &Shared) -> Res {
    let unmet = unmet_conditions(node, shared);
    let ready = node.stage == Stage::Running && node.running.is_some() && unmet.is_empty();
    let (stage_number, stage_name) = crate::stage_wire(node.stage);
    let yaml = Fields::new()
        .field("stage", Yaml::str(stage_name))
        .field(
            "status",
            Fields::new()
                .field("ready", Yaml::Bool(ready))
                .field(
                    "unmetConditions",
                    Yaml::Seq(
                        unmet
                            .iter()
                            .map(|u| {
                                Fields::new()
                                    .field("name", Yaml::str(&u.name))
                                    .field("reason", Yaml::str(&u.reason))
                                    .done()
                            })
                            .collect(),
                    ),
                )
                .done(),
        )
        .done();
    let spec = MachineStatusSpec {
        stage: stage_number,
        status: Some(MachineStatusStatus {
            ready,
            unmet_conditions: unmet,
        }),
    };
    Res::new(
        "runtime",
        MACHINE_STATUS,
        "machine",
        "runtime.MachineStatusController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )
}

fn machine_config(id: &str, config: &AppliedConfig) -> Res {
    // The spec is the config exactly as submitted: YAML as one string, protobuf as bytes
    // (talos-facts §13.4).
    let spec = MachineConfigSpec {
        yaml_marshalled: config.yaml.clone().into_bytes(),
    };
    let mut res = Res::new(
        "config",
        MACHINE_CONFIG,
        id,
        "",
        marshal(&Yaml::str(&config.yaml)),
        spec.encode_to_vec(),
    );
    res.annotations = BTreeMap::from([("talos.dev/yaml-spec".to_owned(), "1".to_owned())]);
    res
}

/// A Talos node id (base62, 43 characters), stable for a node of a cluster: the simulator has
/// no STATE partition to keep a random one in, so it derives one from the node's address and
/// the cluster id.
fn node_id(seed: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    // FNV-1a, then splitmix64.
    let mut state = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (0..43)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            char::from(ALPHABET[usize::try_from(z % 62).unwrap_or(0)])
        })
        .collect()
}

/// A member as discovery reports it (`cluster.MemberController`).
struct Member {
    nodename: String,
    node_id: String,
    address: std::net::IpAddr,
    hostname: String,
    machine_type: String,
    version: String,
}

fn cluster_member(m: &Member) -> Res {
    let (type_number, control_plane) = match m.machine_type.as_str() {
        "init" => (1, true),
        "controlplane" => (2, true),
        _ => (3, false),
    };
    let os = format!("Talos ({})", m.version);
    let spec = ClusterMember {
        node_id: m.node_id.clone(),
        addresses: vec![NetIp {
            ip: match m.address {
                std::net::IpAddr::V4(v4) => v4.octets().to_vec(),
                std::net::IpAddr::V6(v6) => v6.octets().to_vec(),
            },
        }],
        hostname: m.hostname.clone(),
        machine_type: type_number,
        operating_system: os.clone(),
        control_plane: control_plane.then_some(ControlPlane {
            api_server_port: 6443,
        }),
    };
    let mut yaml = Fields::new()
        .field("nodeId", Yaml::str(&m.node_id))
        .field("addresses", Yaml::strs(&[m.address.to_string()]))
        .field("hostname", Yaml::str(&m.hostname))
        .field("machineType", Yaml::str(&m.machine_type))
        .field("operatingSystem", Yaml::str(os));
    if control_plane {
        yaml = yaml.field(
            "controlPlane",
            Fields::new().field("port", Yaml::int(6443)).done(),
        );
    }
    Res::new(
        "cluster",
        CLUSTER_MEMBER,
        m.nodename.clone(),
        "cluster.MemberController",
        marshal(&yaml.done()),
        spec.encode_to_vec(),
    )
}

/// The members discovery finds: this node and every configured node of the same cluster
/// identity that has the discovery service on too (talos-facts §13.6).
fn members(node: &Node, shared: &Shared, config: &AppliedConfig, view: &ConfigView) -> Vec<Res> {
    if !view.discovery() {
        return Vec::new();
    }
    let identity = config.cluster_identity();
    let hostname = node.hostname();
    let mut found = vec![Member {
        nodename: hostname.to_lowercase(),
        node_id: node_id(&format!("{}/{}", shared.addr.ip(), config.cluster_id)),
        address: shared.addr.ip(),
        hostname,
        machine_type: view.machine_type().to_owned(),
        version: shared.talos_version(),
    }];
    let net = network();
    for entry in net.nodes.values() {
        if entry.shared.addr == shared.addr || !entry.shared.reachable() {
            continue;
        }
        let Some(peer) = &entry.config else { continue };
        let peer_view = ConfigView::new(peer);
        if peer.cluster_identity() != identity || !peer_view.discovery() {
            continue;
        }
        found.push(Member {
            nodename: entry.hostname.to_lowercase(),
            node_id: node_id(&format!("{}/{}", entry.shared.addr.ip(), peer.cluster_id)),
            address: entry.shared.addr.ip(),
            hostname: entry.hostname.clone(),
            machine_type: peer_view.machine_type().to_owned(),
            version: entry.shared.talos_version(),
        });
    }
    found.iter().map(cluster_member).collect()
}

/// The node's lifecycle and configuration resources, but for [`SECOND_PASS`].
pub(crate) fn resources(node: &Node, shared: &Shared, want: &Wanted) -> Vec<Res> {
    let mut out = Vec::new();
    if want.has(MACHINE_STATUS) {
        out.push(machine_status(node, shared));
    }
    if want.has(VERSION) {
        out.push(version(shared));
    }
    if want.has(UNATTENDED_INSTALL) {
        out.extend(unattended_install(node));
    }
    let config = active(node);
    let view = config
        .filter(|_| want.has(MACHINE_TYPE) || want.has(CLUSTER_MEMBER))
        .map(|c| ConfigView::new(c));
    if want.has(MACHINE_TYPE) {
        out.push(machine_type(view.as_ref()));
    }
    if want.has(MACHINE_CONFIG) {
        out.extend(machine_configs(node));
    }
    if want.has(ETCD_MEMBER) {
        out.extend(etcd_member(node, shared));
    }
    if want.has(CLUSTER_MEMBER)
        && let (Some(config), Some(view)) = (node.running.as_ref(), view.as_ref())
    {
        out.extend(members(node, shared, config, view));
    }
    out
}

fn version(shared: &Shared) -> Res {
    let version = VersionSpec {
        version: shared.talos_version(),
        name: "Talos".into(),
    };
    Res::new(
        "runtime",
        VERSION,
        "version",
        "runtime.VersionController",
        marshal(
            &Fields::new()
                .field("name", Yaml::str(&version.name))
                .field("version", Yaml::str(&version.version))
                .done(),
        ),
        version.encode_to_vec(),
    )
}

/// 1.14's unattended install reports its phase and, pending, why (talos-facts §3, §8.2,
/// §11.7); every YAML key is omitted when empty (the zero phase, pending, included).
fn unattended_install(node: &Node) -> Option<Res> {
    node.unattended.as_ref().map(|(image, phase)| {
        let (number, name) = phase.wire();
        let spec = UnattendedInstallStatusSpec {
            image: image.clone(),
            phase: number,
            error: node.unattended_error(*phase),
        };
        let yaml = Fields::new()
            .omitempty("image", Yaml::str(image))
            .omitempty("phase", Yaml::str(if number == 0 { "" } else { name }))
            .omitempty("error", Yaml::str(spec.error.clone()))
            .done();
        Res::new(
            "runtime",
            UNATTENDED_INSTALL,
            "unattended-install",
            "runtime.UnattendedInstallController",
            marshal(&yaml),
            spec.encode_to_vec(),
        )
    })
}

/// MachineTypeController: `unknown` until a config sets it.
fn machine_type(view: Option<&ConfigView>) -> Res {
    let machine_type = view.map_or("unknown", ConfigView::machine_type);
    let type_number = match machine_type {
        "init" => 1,
        "controlplane" => 2,
        "worker" => 3,
        _ => 0,
    };
    Res::new(
        "config",
        MACHINE_TYPE,
        "machine-type",
        "config.MachineTypeController",
        marshal(&Yaml::str(machine_type)),
        MachineTypeSpec {
            machine_type: type_number,
        }
        .encode_to_vec(),
    )
}

/// The active config, and the persistent one while they differ.
fn machine_configs(node: &Node) -> Vec<Res> {
    let mut out = Vec::new();
    if let Some(config) = active(node) {
        out.push(machine_config("v1alpha1", config));
    }
    // The persistent config differs from the active one only until the next boot: a staged
    // config, or the one applied in maintenance mode.
    if let Some(staged) = &node.staged {
        out.push(machine_config("persistent", staged));
    } else if node.running.is_none()
        && let Some(persisted) = &node.persisted
    {
        out.push(machine_config("persistent", persisted));
    }
    out
}

/// The local etcd member, while the node's etcd runs and is healthy (`etcd.MemberController`
/// destroys it while the etcd service is not healthy).
fn etcd_member(node: &Node, shared: &Shared) -> Option<Res> {
    let data = node.etcd.filter(|d| {
        !node.etcd_stopped
            && shared.etcd_running.load(Ordering::SeqCst) == d.cluster
            && !shared.etcd_unhealthy.load(Ordering::SeqCst)
    })?;
    let member_id = format!("{:016x}", data.member);
    Some(Res::new(
        "etcd",
        ETCD_MEMBER,
        "local",
        "etcd.MemberController",
        marshal(
            &Fields::new()
                .field("memberID", Yaml::str(&member_id))
                .done(),
        ),
        EtcdMember { member_id }.encode_to_vec(),
    ))
}

/// The resources of [`SECOND_PASS`]: the Kubernetes node name, which records the version of
/// the HostnameStatus it was computed from.
pub(crate) fn dependent(node: &Node, store: &Store) -> Vec<Res> {
    let Some(config) = active(node) else {
        return Vec::new();
    };
    let Some(hostname_version) =
        store.version("network", "HostnameStatuses.net.talos.dev", "hostname")
    else {
        return Vec::new();
    };
    let view = ConfigView::new(config);
    // HostnameStatus.FQDN() is the hostname when there is no domain name.
    let nodename = node.hostname().to_lowercase();
    let skip = view.kubelet_flag("skipNodeRegistration");
    let spec = NodenameSpec {
        nodename: nodename.clone(),
        hostname_version: hostname_version.to_string(),
        skip_node_registration: skip,
    };
    let yaml = Fields::new()
        .field("nodename", Yaml::str(&nodename))
        .field("hostnameVersion", Yaml::str(hostname_version.to_string()))
        .field("skipNodeRegistration", Yaml::Bool(skip))
        .done();
    vec![Res::new(
        "k8s",
        NODENAME,
        "nodename",
        "k8s.NodenameController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )]
}
