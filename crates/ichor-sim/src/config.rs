//! What the simulator reads from an applied machine config (talos-facts §4): enough to act as
//! the node would — its type, its TLS identity, its cluster identity and how it reaches the
//! control plane — from either contract's layout (§8.2).

use base64::Engine as _;
use serde_json::Value;

use crate::SimError;

/// The machine type (`machine.type`, talos-facts §4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineType {
    /// A control-plane node: etcd, trustd and the Kubernetes control plane.
    ControlPlane,
    /// A worker.
    Worker,
}

/// The facts of an applied config the simulator acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AppliedConfig {
    /// The full config as applied.
    pub(crate) yaml: String,
    /// Its documents, parsed once: what the node's resources and volume manager read at
    /// every look (a thousand nodes parsing their configs at every COSI call held the
    /// simulator's core in the fleet benchmark).
    pub(crate) documents: std::sync::Arc<Vec<Value>>,
    pub(crate) machine_type: MachineType,
    /// Whether the config tells the node to install (talos-facts §5, §8.2).
    pub(crate) install: bool,
    /// The installer image, if any (`machine.install.image` or the unattended installer).
    pub(crate) install_image: String,
    /// Whether a reboot follows the install: always on contract 1.13; on 1.14 only with
    /// `reboot: true` or an installer image (talos-facts §5).
    pub(crate) reboot_after_install: bool,
    pub(crate) os_ca_crt: String,
    /// Empty on workers: they have no OS CA key (talos-facts §5).
    pub(crate) os_ca_key: String,
    pub(crate) accepted_cas: Vec<String>,
    /// `machine.token`, which trustd checks (talos-facts §1.5).
    pub(crate) machine_token: String,
    /// The cluster identity: `cluster.id` and `cluster.secret` (1.13) or the
    /// `DiscoveryIdentityConfig` document (1.14).
    pub(crate) cluster_id: String,
    pub(crate) cluster_secret: String,
    /// The host of the control-plane endpoint (`cluster.controlPlane.endpoint` on 1.13,
    /// `KubeClusterConfig.endpoint` on 1.14).
    pub(crate) endpoint_host: String,
    /// The configured hostname, if any.
    pub(crate) hostname: Option<String>,
    /// Whether the config carries the etcd CA (Bootstrap refuses without one, talos-facts §5).
    pub(crate) has_etcd_ca: bool,
    /// Whether the config deploys a CNI: anything but `none` on 1.13 (flannel is the
    /// default), a `KubeFlannelCNIConfig` document on 1.14 (talos-facts §8.3).
    pub(crate) deploys_cni: bool,
}

/// Base64 of PEM, as the v1alpha1 document writes `crt` and `key` (talos-facts §4.2).
fn pem_field(value: &Value, path: &str) -> Result<String, SimError> {
    let text = value.as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| SimError::InvalidConfig(format!("{path} is not base64")))?;
    String::from_utf8(bytes).map_err(|_| SimError::InvalidConfig(format!("{path} is not PEM")))
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_owned()
}

/// The host part of an `https://host:port` URL.
fn url_host(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or_default();
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or_default().to_owned();
    }
    authority.split(':').next().unwrap_or_default().to_owned()
}

impl AppliedConfig {
    /// Reads a multi-document config.
    pub(crate) fn parse(yaml: &str) -> Result<Self, SimError> {
        let documents: Vec<Value> = serde_saphyr::from_multiple(yaml)
            .map_err(|e| SimError::InvalidConfig(format!("not a YAML document stream: {e}")))?;
        let v1alpha1 = documents
            .iter()
            .find(|d| d["version"] == "v1alpha1" && d.get("kind").is_none())
            .ok_or_else(|| SimError::InvalidConfig("no v1alpha1 document".into()))?;
        let kind = |name: &str| documents.iter().find(|d| d["kind"] == name);
        let machine = &v1alpha1["machine"];
        let cluster = &v1alpha1["cluster"];
        // `machine.ParseType`: an empty type and the legacy `join` mean worker (talos-facts
        // §4.2, §11.4).
        let machine_type = match machine["type"].as_str().unwrap_or_default() {
            "controlplane" | "init" => MachineType::ControlPlane,
            "worker" | "join" | "" => MachineType::Worker,
            other => {
                return Err(SimError::InvalidConfig(format!(
                    "unknown machine type {other:?}"
                )));
            }
        };
        let accepted_cas = machine["acceptedCAs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|ca| pem_field(&ca["crt"], "machine.acceptedCAs[].crt"))
            .collect::<Result<_, _>>()?;
        // Install instructions: machine.install on contract 1.13, UnattendedInstallConfig on
        // 1.14, which reboots after the install as `reboot` says, or, unset, when an installer
        // image is given (talos-facts §5, §8.2, §11.7).
        let legacy_install = machine.get("install").filter(|i| !i.is_null());
        let unattended = kind("UnattendedInstallConfig");
        let (install, install_image, reboot_after_install) = match (legacy_install, unattended) {
            (Some(i), _) => (true, text(&i["image"]), true),
            (None, Some(u)) => {
                let image = text(&u["installer"]["image"]);
                let reboot = u["reboot"].as_bool().unwrap_or(!image.is_empty());
                (true, image, reboot)
            }
            (None, None) => (false, String::new(), false),
        };
        let identity = kind("DiscoveryIdentityConfig");
        let cluster_id = identity
            .map(|d| text(&d["clusterID"]))
            .unwrap_or_else(|| text(&cluster["id"]));
        let cluster_secret = identity
            .map(|d| text(&d["clusterSecret"]))
            .unwrap_or_else(|| text(&cluster["secret"]));
        let endpoint = kind("KubeClusterConfig")
            .map(|d| text(&d["endpoint"]))
            .unwrap_or_else(|| text(&cluster["controlPlane"]["endpoint"]));
        let hostname = kind("HostnameConfig")
            .map(|d| text(&d["hostname"]))
            .or_else(|| machine["network"]["hostname"].as_str().map(str::to_owned))
            .filter(|h| !h.is_empty());
        let deploys_cni = if kind("KubeClusterConfig").is_some() {
            kind("KubeFlannelCNIConfig").is_some()
        } else {
            cluster["network"]["cni"]["name"]
                .as_str()
                .unwrap_or("flannel")
                != "none"
        };
        let os_ca_key = match machine["ca"]["key"].as_str() {
            None | Some("") => String::new(),
            Some(_) => pem_field(&machine["ca"]["key"], "machine.ca.key")?,
        };
        let mut config = Self {
            yaml: yaml.to_owned(),
            documents: std::sync::Arc::default(),
            machine_type,
            install,
            install_image,
            reboot_after_install,
            os_ca_crt: pem_field(&machine["ca"]["crt"], "machine.ca.crt")?,
            os_ca_key,
            accepted_cas,
            machine_token: text(&machine["token"]),
            cluster_id,
            cluster_secret,
            endpoint_host: url_host(&endpoint),
            hostname,
            has_etcd_ca: cluster["etcd"]["ca"]["crt"]
                .as_str()
                .is_some_and(|c| !c.is_empty()),
            deploys_cni,
        };
        config.documents = std::sync::Arc::new(documents);
        Ok(config)
    }

    /// The identity etcd members and the discovery service share (talos-facts §5: members
    /// are found through the cluster's discovery data, keyed by cluster id and secret).
    pub(crate) fn cluster_identity(&self) -> String {
        format!("{}/{}", self.cluster_id, self.cluster_secret)
    }

    /// Whether this is a control plane.
    pub(crate) fn is_control_plane(&self) -> bool {
        self.machine_type == MachineType::ControlPlane
    }
}

#[cfg(test)]
mod tests {
    use super::url_host;

    #[test]
    fn endpoint_hosts() {
        assert_eq!(url_host("https://192.168.10.5:6443"), "192.168.10.5");
        assert_eq!(url_host("https://[fd00::1]:6443"), "fd00::1");
        assert_eq!(url_host("https://cp.lab.internal:6443/"), "cp.lab.internal");
    }
}
