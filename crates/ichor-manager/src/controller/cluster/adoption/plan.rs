//! Adopting a running Talos cluster, the pure part: what a node's live machine config says
//! about its cluster ([`LiveFacts::read`]), and whether a set of nodes may be adopted into a
//! TalosCluster ([`judge`]): every node answered, all with the bundle's OS CA, all in one
//! cluster, and the TalosCluster's immutable facts (endpoint, networks, CNI, kube-proxy,
//! versions) what the nodes run. Adoption is all-or-nothing: any refusal records nothing.
//! Nothing here does I/O.

use ichor_api::TalosClusterSpec;
use ichor_api::cluster::{CniPreset, KubeProxyMode};
use ichor_api::names::reasons;
use serde_json::Value;

use crate::Stop;

/// What a node's live `v1alpha1` config says about the node and its cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveFacts {
    /// `machine.type`: `controlplane` (or `init`) or `worker`.
    pub machine_type: String,
    /// `cluster.controlPlane.endpoint`.
    pub endpoint: String,
    /// `cluster.clusterName`.
    pub cluster_name: String,
    /// `cluster.network.podSubnets` (Talos's default when unset).
    pub pod_subnets: Vec<String>,
    /// `cluster.network.serviceSubnets` (Talos's default when unset).
    pub service_subnets: Vec<String>,
    /// `cluster.network.dnsDomain` (Talos's default when unset).
    pub dns_domain: String,
    /// The built-in CNI: `cluster.network.cni.name` (`flannel` when unset), or on a 1.14
    /// control plane `flannel` when a `KubeFlannelCNIConfig` document is there and `none`
    /// otherwise; unknown on a 1.14 worker, which carries neither (talos-facts §4.4, §4.5).
    pub cni: Option<String>,
    /// Whether kube-proxy is off: `cluster.proxy.disabled`, or on a 1.14 control plane a
    /// `KubeProxyConfig` with `enabled: false` or none at all; unknown on a 1.14 worker.
    pub kube_proxy_disabled: Option<bool>,
    /// The kubelet image's tag without its `v` (`machine.kubelet.image`), if it has one.
    pub kubernetes_version: Option<String>,
    /// The fingerprint of the OS CA the node trusts (`machine.ca.crt`), as bundles are
    /// fingerprinted (`sha256:` of the PEM).
    pub os_ca_fingerprint: String,
}

/// Why a node could not be read for adoption: it is not a configured Talos node that answers,
/// or its live config does not say what adoption needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unread {
    /// The endpoint is no IPv4 address.
    #[error("not an IPv4 address")]
    NotIpv4,
    /// The node answers in maintenance mode.
    #[error("in maintenance mode, not a configured node: nothing to adopt")]
    InMaintenance,
    /// Nothing answers.
    #[error("no Talos API answers on port 50000")]
    Silent,
    /// The connection or a call failed, in the client's words.
    #[error("{0}")]
    Failed(String),
    /// The node answered, but its config, version or UUID could not be read.
    #[error("answered, but its config could not be read: {0}")]
    Unreadable(Box<Unread>),
    /// The live config is no YAML.
    #[error("the live config is not YAML: {0}")]
    NotYaml(String),
    /// The live config has no `v1alpha1` document.
    #[error("the live config has no v1alpha1 document")]
    NoV1alpha1,
    /// A field adoption needs is missing or empty.
    #[error("the live config has no {0}")]
    Missing(&'static str),
    /// `machine.ca.crt` is not base64.
    #[error("machine.ca.crt is not base64")]
    CaNotBase64,
}

impl From<&str> for Unread {
    fn from(text: &str) -> Self {
        Self::Failed(text.to_owned())
    }
}

/// Talos's network defaults (`talosctl gen config`; `pkg/machinery/constants`).
const DEFAULT_POD_SUBNET: &str = "10.244.0.0/16";
const DEFAULT_SERVICE_SUBNET: &str = "10.96.0.0/12";
const DEFAULT_DNS_DOMAIN: &str = "cluster.local";

impl LiveFacts {
    /// Reads the facts from a node's live config (multi-document YAML), saying what is missing.
    pub fn read(yaml: &str) -> Result<Self, Unread> {
        let documents: Vec<Value> =
            serde_saphyr::from_multiple(yaml).map_err(|err| Unread::NotYaml(err.to_string()))?;
        let config = documents
            .iter()
            .find(|d| d["version"].as_str() == Some("v1alpha1"))
            .ok_or(Unread::NoV1alpha1)?;
        let text = |value: &Value, path: &'static str| -> Result<String, Unread> {
            value
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or(Unread::Missing(path))
        };
        // Contract 1.14 moves the cluster's settings into documents of their own
        // (talos-facts §4.4): read those when the v1alpha1 document does not carry them.
        let doc = |kind: &str| documents.iter().find(|d| d["kind"].as_str() == Some(kind));
        let kube_cluster = doc("KubeClusterConfig");
        let network = doc("KubeNetworkConfig").unwrap_or(&config["cluster"]["network"]);
        let machine_type = text(&config["machine"]["type"], "machine.type")?;
        let control_plane = matches!(machine_type.as_str(), "controlplane" | "init");
        let ca = text(&config["machine"]["ca"]["crt"], "machine.ca.crt")?;
        let pem = decode_base64(&ca).ok_or(Unread::CaNotBase64)?;
        let endpoint = match kube_cluster {
            Some(k) => text(&k["endpoint"], "KubeClusterConfig endpoint")?,
            None => text(
                &config["cluster"]["controlPlane"]["endpoint"],
                "cluster.controlPlane.endpoint",
            )?,
        };
        let cluster_name =
            kube_cluster.map_or(&config["cluster"]["clusterName"], |k| &k["clusterName"]);
        let kubelet_image =
            doc("KubeletConfig").map_or(&config["machine"]["kubelet"]["image"], |k| &k["image"]);
        let (cni, kube_proxy_disabled) =
            builtins(&documents, config, kube_cluster.is_some(), control_plane);
        Ok(Self {
            machine_type,
            endpoint,
            cluster_name: cluster_name.as_str().unwrap_or_default().to_owned(),
            pod_subnets: list(&network["podSubnets"], DEFAULT_POD_SUBNET),
            service_subnets: list(&network["serviceSubnets"], DEFAULT_SERVICE_SUBNET),
            dns_domain: network["dnsDomain"]
                .as_str()
                .unwrap_or(DEFAULT_DNS_DOMAIN)
                .to_owned(),
            cni,
            kube_proxy_disabled,
            kubernetes_version: kubelet_image
                .as_str()
                .and_then(|image| image.rsplit_once(':'))
                .map(|(_, tag)| tag.trim_start_matches('v').to_owned()),
            os_ca_fingerprint: ichor_render::config_hash(String::from_utf8_lossy(&pem).trim()),
        })
    }

    /// Whether the node is a control plane.
    pub fn is_control_plane(&self) -> bool {
        matches!(self.machine_type.as_str(), "controlplane" | "init")
    }
}

/// The built-in CNI and whether kube-proxy is off, where the config says (see [`LiveFacts`]).
fn builtins(
    documents: &[Value],
    config: &Value,
    kube_documents: bool,
    control_plane: bool,
) -> (Option<String>, Option<bool>) {
    let doc = |kind: &str| documents.iter().find(|d| d["kind"].as_str() == Some(kind));
    match (kube_documents, control_plane) {
        (false, _) => (
            Some(
                config["cluster"]["network"]["cni"]["name"]
                    .as_str()
                    .unwrap_or("flannel")
                    .to_owned(),
            ),
            Some(
                config["cluster"]["proxy"]["disabled"]
                    .as_bool()
                    .unwrap_or(false),
            ),
        ),
        (true, true) => (
            Some(
                if doc("KubeFlannelCNIConfig").is_some() {
                    "flannel"
                } else {
                    "none"
                }
                .to_owned(),
            ),
            Some(doc("KubeProxyConfig").is_none_or(|p| p["enabled"].as_bool() == Some(false))),
        ),
        (true, false) => (None, None),
    }
}

/// A list of strings, or `default` alone when there is none.
fn list(value: &Value, default: &str) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect()
        })
        .filter(|items: &Vec<String>| !items.is_empty())
        .unwrap_or_else(|| vec![default.to_owned()])
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
}

/// A node as observed for adoption.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The endpoint the person gave.
    pub address: String,
    /// What it answered: its live facts and running Talos version, or why it could not be read.
    pub answer: Result<(LiveFacts, String), Unread>,
    /// When it presented a certificate the bundle's CA did not issue: that certificate's SPKI
    /// fingerprint.
    pub untrusted: Option<String>,
}

/// A TalosCluster field that contradicts what the nodes run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contradiction {
    /// The field, as written in the spec (`spec.endpoint`).
    pub field: &'static str,
    /// What the spec says.
    pub spec: String,
    /// What the nodes run.
    pub live: String,
}

impl std::fmt::Display for Contradiction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is {:?} but the nodes run {:?}",
            self.field, self.spec, self.live
        )
    }
}

/// Why the nodes are not adopted. Nothing is recorded for any of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Some endpoints did not answer with the bundle's credentials.
    #[error("not adopted: {}", .0.join("; "))]
    Unreachable(Vec<String>),
    /// The nodes trust another OS CA than the bundle's.
    #[error(
        "not adopted: the bundle's OS CA is {bundle}, and {address} {node}: give the bundle the cluster was made with"
    )]
    BundleMismatch {
        /// The bundle's fingerprint.
        bundle: String,
        /// The first node that differs.
        address: String,
        /// What it trusts or presents instead, with its fingerprint.
        node: String,
    },
    /// The nodes are not all of one cluster.
    #[error(
        "not adopted: {address} belongs to another cluster ({what}) than {first}: adopt one cluster's nodes only"
    )]
    OtherCluster {
        /// The node that differs.
        address: String,
        /// The first node.
        first: String,
        /// What differs.
        what: String,
    },
    /// No node is a control plane.
    #[error("not adopted: none of the endpoints is a control plane")]
    NoControlPlane,
    /// An endpoint is outside the address ranges the namespace's TalosNamespacePolicy allows
    /// (the policy's sentence): no node is contacted (ADR 0054).
    #[error("not adopted: {0}")]
    AddressNotAllowed(String),
    /// The spec contradicts the nodes.
    #[error("not adopted: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Contradicts(Vec<Contradiction>),
}

impl Refusal {
    /// The refusal as `Adopted` and its Event say it.
    pub fn stop(&self) -> Stop {
        let reason = match self {
            Self::BundleMismatch { .. } => reasons::ADOPTION_BUNDLE_MISMATCH,
            Self::Contradicts(_) => reasons::ADOPTION_CONTRADICTS_SPEC,
            Self::AddressNotAllowed(_) => reasons::ADDRESS_NOT_ALLOWED,
            Self::Unreachable(_) | Self::OtherCluster { .. } | Self::NoControlPlane => {
                reasons::ADOPTION_REFUSED
            }
        };
        Stop::new(reason, self.to_string())
    }
}

/// The nodes, judged adoptable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoptable {
    /// Each node's address and whether it is a control plane, in the order given.
    pub nodes: Vec<(String, bool)>,
}

/// Judges whether `observed` may be adopted into a cluster with `spec` and the bundle whose
/// fingerprint is `bundle`.
pub fn judge(
    spec: &TalosClusterSpec,
    bundle: &str,
    observed: &[Observed],
) -> Result<Adoptable, Refusal> {
    certified_by(bundle, observed)?;
    let unreachable: Vec<String> = observed
        .iter()
        .filter_map(|o| {
            o.answer
                .as_ref()
                .err()
                .map(|why| format!("{}: {why}", o.address))
        })
        .collect();
    if !unreachable.is_empty() {
        return Err(Refusal::Unreachable(unreachable));
    }
    let nodes: Vec<(&str, &LiveFacts, &str)> = observed
        .iter()
        .filter_map(|o| {
            o.answer
                .as_ref()
                .ok()
                .map(|(f, v)| (o.address.as_str(), f, v.as_str()))
        })
        .collect();
    if let Some((address, facts, _)) = nodes.iter().find(|(_, f, _)| f.os_ca_fingerprint != bundle)
    {
        return Err(Refusal::BundleMismatch {
            bundle: bundle.to_owned(),
            address: (*address).to_owned(),
            node: format!("trusts the OS CA {}", facts.os_ca_fingerprint),
        });
    }
    let Some((first_address, first, _)) = nodes.first().copied() else {
        return Err(Refusal::Unreachable(vec!["no endpoints were given".into()]));
    };
    one_cluster(first_address, first, &nodes[1..])?;
    if !nodes.iter().any(|(_, f, _)| f.is_control_plane()) {
        return Err(Refusal::NoControlPlane);
    }
    let running = nodes.iter().map(|(_, _, v)| *v).collect::<Vec<_>>();
    let control_plane = nodes
        .iter()
        .find(|(_, f, _)| f.is_control_plane())
        .map_or(first, |(_, f, _)| *f);
    let contradictions = contradictions(spec, control_plane, &running);
    if !contradictions.is_empty() {
        return Err(Refusal::Contradicts(contradictions));
    }
    Ok(Adoptable {
        nodes: nodes
            .iter()
            .map(|(a, f, _)| ((*a).to_owned(), f.is_control_plane()))
            .collect(),
    })
}

/// Refuses a node that presented a certificate the bundle's CA did not issue.
fn certified_by(bundle: &str, observed: &[Observed]) -> Result<(), Refusal> {
    match observed
        .iter()
        .find_map(|o| o.untrusted.as_ref().map(|f| (&o.address, f)))
    {
        Some((address, presented)) => Err(Refusal::BundleMismatch {
            bundle: bundle.to_owned(),
            address: address.clone(),
            node: format!(
                "presents a certificate that CA did not issue (SPKI fingerprint {presented})"
            ),
        }),
        None => Ok(()),
    }
}

/// Refuses nodes that are not of the first node's cluster (another endpoint or name).
fn one_cluster(
    first_address: &str,
    first: &LiveFacts,
    others: &[(&str, &LiveFacts, &str)],
) -> Result<(), Refusal> {
    for (address, facts, _) in others {
        let what = if facts.endpoint != first.endpoint {
            format!("endpoint {}", facts.endpoint)
        } else if facts.cluster_name != first.cluster_name {
            format!("cluster name {}", facts.cluster_name)
        } else {
            continue;
        };
        return Err(Refusal::OtherCluster {
            address: (*address).to_owned(),
            first: first_address.to_owned(),
            what,
        });
    }
    Ok(())
}

/// The CNI the nodes run, as the spec would name it: cilium and none both render
/// `cni.name: none`, so either matches a node without a built-in CNI.
fn live_cni(spec: CniPreset, live: &str) -> String {
    if (live == "flannel") == (spec == CniPreset::Flannel) {
        spec.as_str().to_owned()
    } else {
        live.to_owned()
    }
}

/// The spec's immutable facts that differ from what the nodes run (`running`: each node's
/// Talos version).
pub fn contradictions(
    spec: &TalosClusterSpec,
    live: &LiveFacts,
    running: &[&str],
) -> Vec<Contradiction> {
    let mut out = Vec::new();
    let mut check = |field: &'static str, spec: String, live: String| {
        if spec != live {
            out.push(Contradiction { field, spec, live });
        }
    };
    check(
        "spec.endpoint",
        spec.endpoint.clone(),
        live.endpoint.clone(),
    );
    check(
        "spec.network.podSubnets",
        spec.network.pod_subnets.join(","),
        live.pod_subnets.join(","),
    );
    check(
        "spec.network.serviceSubnets",
        spec.network.service_subnets.join(","),
        live.service_subnets.join(","),
    );
    check(
        "spec.network.dnsDomain",
        spec.network.dns_domain.clone(),
        live.dns_domain.clone(),
    );
    if let Some(cni) = &live.cni {
        check(
            "spec.cni.preset",
            spec.cni.preset.as_str().to_owned(),
            live_cni(spec.cni.preset, cni),
        );
    }
    let proxy = |disabled: bool| if disabled { "disabled" } else { "enabled" }.to_owned();
    if let Some(disabled) = live.kube_proxy_disabled {
        check(
            "spec.kubeProxy",
            proxy(spec.kube_proxy == KubeProxyMode::Disabled),
            proxy(disabled),
        );
    }
    if let Some(version) = &live.kubernetes_version {
        check(
            "spec.kubernetesVersion",
            spec.kubernetes_version.trim_start_matches('v').to_owned(),
            version.clone(),
        );
    }
    let contract = minor(&spec.talos_version);
    if let Some(older) = running.iter().find(|v| minor(v) < contract) {
        check(
            "spec.talosVersion",
            spec.talos_version.clone(),
            (*older).to_owned(),
        );
    }
    out
}

/// `(major, minor)` of a version like `v1.14.1`.
fn minor(version: &str) -> (u32, u32) {
    let mut parts = version.trim_start_matches('v').split('.');
    let mut next = || {
        parts
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_default()
    };
    (next(), next())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CA_PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----";

    fn config(kind: &str, endpoint: &str, ca: &str) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        format!(
            "version: v1alpha1\nmachine:\n  type: {kind}\n  ca:\n    crt: {ca}\n  kubelet:\n    image: ghcr.io/siderolabs/kubelet:v1.36.3\ncluster:\n  clusterName: lab\n  controlPlane:\n    endpoint: {endpoint}\n  network:\n    dnsDomain: cluster.local\n---\napiVersion: v1alpha1\nkind: HostnameConfig\nhostname: x\n"
        )
    }

    fn spec() -> TalosClusterSpec {
        TalosClusterSpec::new("v1.14.0", "1.36.3", "https://10.0.0.10:6443", 1)
    }

    fn node(address: &str, yaml: &str) -> Observed {
        Observed {
            address: address.into(),
            answer: LiveFacts::read(yaml).map(|f| (f, "v1.14.1".to_owned())),
            untrusted: None,
        }
    }

    #[test]
    fn a_live_config_says_what_the_node_and_its_cluster_are() {
        let facts = LiveFacts::read(&config("controlplane", "https://10.0.0.10:6443", CA_PEM))
            .expect("read");
        assert!(facts.is_control_plane());
        assert_eq!(facts.endpoint, "https://10.0.0.10:6443");
        assert_eq!(facts.pod_subnets, ["10.244.0.0/16"], "Talos's default");
        assert_eq!(facts.cni.as_deref(), Some("flannel"));
        assert_eq!(facts.kubernetes_version.as_deref(), Some("1.36.3"));
        assert_eq!(facts.os_ca_fingerprint, ichor_render::config_hash(CA_PEM));
        assert!(LiveFacts::read("version: v1alpha1\nmachine: {}\n").is_err());
    }

    #[test]
    fn a_contract_1_14_config_carries_its_cluster_in_documents_of_their_own() {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(CA_PEM);
        let head = format!(
            "version: v1alpha1\nmachine:\n  type: TYPE\n  ca:\n    crt: {ca}\ncluster:\n  token: t\n"
        );
        let kube = "---\napiVersion: v1alpha1\nkind: KubeClusterConfig\nclusterName: lab\nendpoint: https://10.0.0.10:6443\n---\napiVersion: v1alpha1\nkind: KubeletConfig\nimage: ghcr.io/siderolabs/kubelet:v1.36.3\n---\napiVersion: v1alpha1\nkind: KubeNetworkConfig\ndnsDomain: cluster.local\npodSubnets:\n  - 10.10.0.0/16\n";
        let cp_only = "---\napiVersion: v1alpha1\nkind: KubeFlannelCNIConfig\nbackendType: vxlan\n---\napiVersion: v1alpha1\nkind: KubeProxyConfig\nimage: registry.k8s.io/kube-proxy:v1.36.3\n";
        let cp = LiveFacts::read(&format!(
            "{}{kube}{cp_only}",
            head.replace("TYPE", "controlplane")
        ))
        .expect("a control plane");
        assert_eq!(cp.endpoint, "https://10.0.0.10:6443");
        assert_eq!(cp.cluster_name, "lab");
        assert_eq!(cp.pod_subnets, ["10.10.0.0/16"]);
        assert_eq!(cp.service_subnets, ["10.96.0.0/12"], "Talos's default");
        assert_eq!(cp.kubernetes_version.as_deref(), Some("1.36.3"));
        assert_eq!(cp.cni.as_deref(), Some("flannel"));
        assert_eq!(cp.kube_proxy_disabled, Some(false));
        let worker = LiveFacts::read(&format!("{}{kube}", head.replace("TYPE", "worker")))
            .expect("a worker");
        assert_eq!(
            (worker.cni, worker.kube_proxy_disabled),
            (None, None),
            "unknown on a worker"
        );
        let bare = LiveFacts::read(&format!("{}{kube}", head.replace("TYPE", "controlplane")))
            .expect("a control plane without a CNI or kube-proxy");
        assert_eq!(bare.cni.as_deref(), Some("none"));
        assert_eq!(bare.kube_proxy_disabled, Some(true));
    }

    #[test]
    fn adoption_is_all_or_nothing_and_names_what_stops_it() {
        let bundle = ichor_render::config_hash(CA_PEM);
        let cp = config("controlplane", "https://10.0.0.10:6443", CA_PEM);
        let worker = config("worker", "https://10.0.0.10:6443", CA_PEM);
        let ok = judge(
            &spec(),
            &bundle,
            &[node("10.0.0.1", &cp), node("10.0.0.2", &worker)],
        )
        .expect("adoptable");
        assert_eq!(
            ok.nodes,
            [
                ("10.0.0.1".to_owned(), true),
                ("10.0.0.2".to_owned(), false)
            ]
        );

        let down = Observed {
            address: "10.0.0.3".into(),
            answer: Err("connection refused".into()),
            untrusted: None,
        };
        let refused = judge(&spec(), &bundle, &[node("10.0.0.1", &cp), down]).expect_err("down");
        assert!(
            refused.to_string().contains("10.0.0.3: connection refused"),
            "{refused}"
        );

        let other_ca = config("worker", "https://10.0.0.10:6443", "another CA");
        let Err(Refusal::BundleMismatch {
            bundle: b,
            node: theirs,
            ..
        }) = judge(
            &spec(),
            &bundle,
            &[node("10.0.0.1", &cp), node("10.0.0.4", &other_ca)],
        )
        else {
            panic!("another CA is refused");
        };
        assert_eq!(b, bundle);
        assert!(
            theirs.contains(&ichor_render::config_hash("another CA")),
            "{theirs}"
        );
    }

    #[test]
    fn a_node_the_bundles_ca_did_not_certify_is_a_bundle_mismatch() {
        let bundle = ichor_render::config_hash(CA_PEM);
        let cp = config("controlplane", "https://10.0.0.10:6443", CA_PEM);
        let worker = config("worker", "https://10.0.0.10:6443", CA_PEM);
        let stranger = Observed {
            address: "10.0.0.6".into(),
            answer: Err("handshake refused".into()),
            untrusted: Some("SPKI".into()),
        };
        let Err(refusal @ Refusal::BundleMismatch { .. }) =
            judge(&spec(), &bundle, &[node("10.0.0.1", &cp), stranger])
        else {
            panic!("a node the bundle's CA did not certify is refused");
        };
        assert!(refusal.to_string().contains(&bundle), "{refusal}");
        assert!(refusal.to_string().contains("SPKI"), "{refusal}");

        let elsewhere = config("worker", "https://10.9.9.9:6443", CA_PEM);
        assert!(matches!(
            judge(
                &spec(),
                &bundle,
                &[node("10.0.0.1", &cp), node("10.0.0.5", &elsewhere)]
            ),
            Err(Refusal::OtherCluster { .. })
        ));
        assert_eq!(
            judge(&spec(), &bundle, &[node("10.0.0.2", &worker)]),
            Err(Refusal::NoControlPlane)
        );
    }

    #[test]
    fn a_spec_that_contradicts_the_nodes_is_refused_naming_each_field() {
        let bundle = ichor_render::config_hash(CA_PEM);
        let cp = config("controlplane", "https://10.0.0.10:6443", CA_PEM);
        let mut wrong = spec();
        wrong.endpoint = "https://10.0.0.99:6443".into();
        wrong.kubernetes_version = "1.35.0".into();
        let Err(Refusal::Contradicts(found)) = judge(&wrong, &bundle, &[node("10.0.0.1", &cp)])
        else {
            panic!("a contradicting spec is refused");
        };
        let fields: Vec<&str> = found.iter().map(|c| c.field).collect();
        assert_eq!(fields, ["spec.endpoint", "spec.kubernetesVersion"]);
        let mut newer = spec();
        newer.talos_version = "v1.15.0".into();
        let Err(Refusal::Contradicts(found)) = judge(&newer, &bundle, &[node("10.0.0.1", &cp)])
        else {
            panic!("a contract newer than the nodes is refused");
        };
        assert_eq!(found[0].field, "spec.talosVersion");
    }
}
