//! The Kubernetes components of a control plane as its Talos API reports them (talos-facts
//! §14): the kubelet's status of each control-plane static pod (`StaticPodStatuses`), and the
//! bootstrap manifests Talos renders from the config (`Manifests`). What a Kubernetes upgrade
//! follows node by node, and what it syncs to the cluster afterwards.
//!
//! Both specs are Kubernetes objects in their unstructured form; a node's reply that is not
//! the shape Talos writes is an error naming the resource, never a panic or a silent default.

use serde_json::Value;

use crate::client::{TalosClient, TalosError};

/// The COSI type of static pod statuses (namespace `k8s`).
const STATIC_POD_STATUS: &str = "StaticPodStatuses.kubernetes.talos.dev";
/// The COSI type of bootstrap manifests (namespace `controlplane`).
const MANIFEST: &str = "Manifests.kubernetes.talos.dev";

/// A control-plane component Talos runs as a static pod (talos-facts §14.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ControlPlaneComponent {
    /// `kube-apiserver` (config `cluster.apiServer`).
    ApiServer,
    /// `kube-controller-manager` (config `cluster.controllerManager`).
    ControllerManager,
    /// `kube-scheduler` (config `cluster.scheduler`).
    Scheduler,
}

impl ControlPlaneComponent {
    /// Every component, in the order Talos renders and upgrades them.
    pub const ALL: [Self; 3] = [Self::ApiServer, Self::ControllerManager, Self::Scheduler];

    /// The static pod's (and its container's) name, e.g. `kube-apiserver`.
    pub fn pod_name(self) -> &'static str {
        match self {
            Self::ApiServer => "kube-apiserver",
            Self::ControllerManager => "kube-controller-manager",
            Self::Scheduler => "kube-scheduler",
        }
    }

    /// The machine config key under `cluster` that holds its image, e.g. `apiServer`.
    pub fn config_key(self) -> &'static str {
        match self {
            Self::ApiServer => "apiServer",
            Self::ControllerManager => "controllerManager",
            Self::Scheduler => "scheduler",
        }
    }

    /// The component whose static pod a kubelet pod name (`<pod>-<nodename>`) is.
    pub fn from_kubelet_pod_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| {
            name.strip_prefix(c.pod_name())
                .is_some_and(|rest| rest.len() > 1 && rest.starts_with('-'))
        })
    }
}

/// One container of a static pod, as the kubelet reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    /// The container's name.
    pub name: String,
    /// The image it runs, as the kubelet reports it (e.g.
    /// `registry.k8s.io/kube-apiserver:v1.37.0`).
    pub image: String,
    /// Whether it passes its readiness probe.
    pub ready: bool,
}

/// The kubelet's status of one static pod (`StaticPodStatuses.kubernetes.talos.dev`,
/// talos-facts §14.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPodStatus {
    /// The resource id: `<namespace>/<pod>`, e.g. `kube-system/kube-apiserver-cp-1`.
    pub id: String,
    /// The pod's name as the kubelet names it: the static pod's name, `-`, the node name.
    pub pod: String,
    /// The control-plane component, when the pod is one of Talos's.
    pub component: Option<ControlPlaneComponent>,
    /// The pod phase: `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`.
    pub phase: String,
    /// Whether the pod's `Ready` condition is `True`.
    pub ready: bool,
    /// Its containers.
    pub containers: Vec<ContainerState>,
}

impl StaticPodStatus {
    /// Whether the pod runs `image` in every container and is ready: what a component's
    /// upgrade on one node waits for.
    pub fn runs_ready(&self, image: &str) -> bool {
        self.ready
            && self.phase == "Running"
            && !self.containers.is_empty()
            && self.containers.iter().all(|c| c.image == image)
    }
}

/// One bootstrap manifest (`Manifests.kubernetes.talos.dev`, talos-facts §14.4).
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Its id, e.g. `10-kube-proxy`: the order Talos applies manifests in.
    pub id: String,
    /// Its Kubernetes objects, each a JSON object with `apiVersion`, `kind` and `metadata`.
    pub objects: Vec<Value>,
}

/// A string at `key` of `object`, which must be one when present.
fn optional_str(object: &Value, key: &str, what: &str) -> Result<String, String> {
    match &object[key] {
        Value::Null => Ok(String::new()),
        Value::String(s) => Ok(s.clone()),
        other => Err(format!("{what}: {key} is not a string: {other}")),
    }
}

/// Decodes one `StaticPodStatus` spec: Talos writes the pod's Kubernetes `PodStatus` as a
/// mapping (talos-facts §14.1).
pub fn decode_static_pod_status(id: &str, spec: &Value) -> Result<StaticPodStatus, String> {
    let what = format!("StaticPodStatus {id:?}");
    if !spec.is_object() {
        return Err(format!("{what}: the pod status is not a mapping: {spec}"));
    }
    let pod = id.split_once('/').map_or(id, |(_, name)| name).to_owned();
    let phase = optional_str(spec, "phase", &what)?;
    let conditions = match &spec["conditions"] {
        Value::Null => &[][..],
        Value::Array(items) => items.as_slice(),
        other => return Err(format!("{what}: conditions is not a list: {other}")),
    };
    let mut ready = false;
    for condition in conditions {
        if !condition.is_object() {
            return Err(format!("{what}: a condition is not a mapping: {condition}"));
        }
        if condition["type"] == "Ready" {
            ready = optional_str(condition, "status", &what)? == "True";
        }
    }
    let containers = match &spec["containerStatuses"] {
        Value::Null => Vec::new(),
        Value::Array(items) => items
            .iter()
            .map(|c| {
                if !c.is_object() {
                    return Err(format!("{what}: a container status is not a mapping: {c}"));
                }
                let ready = match &c["ready"] {
                    Value::Null => false,
                    Value::Bool(b) => *b,
                    other => return Err(format!("{what}: ready is not a bool: {other}")),
                };
                Ok(ContainerState {
                    name: optional_str(c, "name", &what)?,
                    image: optional_str(c, "image", &what)?,
                    ready,
                })
            })
            .collect::<Result<_, _>>()?,
        other => return Err(format!("{what}: containerStatuses is not a list: {other}")),
    };
    Ok(StaticPodStatus {
        id: id.to_owned(),
        component: ControlPlaneComponent::from_kubelet_pod_name(&pod),
        pod,
        phase,
        ready,
        containers,
    })
}

/// Decodes one `Manifest` spec: Talos writes the list of its objects (talos-facts §14.4).
pub fn decode_manifest(id: &str, spec: &Value) -> Result<Manifest, String> {
    let items = match spec {
        Value::Null => &[][..],
        Value::Array(items) => items.as_slice(),
        other => return Err(format!("Manifest {id:?}: the spec is not a list: {other}")),
    };
    let objects = items
        .iter()
        .map(|o| {
            if o.is_object() && o["kind"].is_string() && o["apiVersion"].is_string() {
                Ok(o.clone())
            } else {
                Err(format!(
                    "Manifest {id:?}: an item is not a Kubernetes object: {o}"
                ))
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Manifest {
        id: id.to_owned(),
        objects,
    })
}

impl TalosClient {
    /// The kubelet's status of every static pod on the node (talos-facts §14.1): one per
    /// control-plane component on a control plane whose static pods run, none on a worker.
    /// Reads `StaticPodStatuses.kubernetes.talos.dev` in namespace `k8s` (os:reader). Talos
    /// refreshes them from the kubelet every 15 seconds.
    pub async fn static_pod_statuses(&self) -> Result<Vec<StaticPodStatus>, TalosError> {
        self.list_specs("k8s", STATIC_POD_STATUS)
            .await?
            .into_iter()
            .map(|(id, spec)| {
                decode_static_pod_status(&id, &spec).map_err(|e| self.node_error("COSI List", e))
            })
            .collect()
    }

    /// The bootstrap manifests the node renders from its config, sorted by id (talos-facts
    /// §14.4, §14.5): on control planes only. Reads `Manifests.kubernetes.talos.dev` in
    /// namespace `controlplane` (os:reader).
    pub async fn manifests(&self) -> Result<Vec<Manifest>, TalosError> {
        let mut out: Vec<Manifest> = self
            .list_specs("controlplane", MANIFEST)
            .await?
            .into_iter()
            .map(|(id, spec)| {
                decode_manifest(&id, &spec).map_err(|e| self.node_error("COSI List", e))
            })
            .collect::<Result<_, _>>()?;
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_pod_status_gives_its_component_images_and_readiness() {
        let spec = json!({
            "phase": "Running",
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "Ready", "status": "True"},
            ],
            "containerStatuses": [
                {"name": "kube-apiserver", "image": "registry.k8s.io/kube-apiserver:v1.37.0", "ready": true},
            ],
        });
        let status = decode_static_pod_status("kube-system/kube-apiserver-cp-1", &spec).unwrap();
        assert_eq!(status.pod, "kube-apiserver-cp-1");
        assert_eq!(status.component, Some(ControlPlaneComponent::ApiServer));
        assert!(status.ready);
        assert!(status.runs_ready("registry.k8s.io/kube-apiserver:v1.37.0"));
        assert!(!status.runs_ready("registry.k8s.io/kube-apiserver:v1.37.1"));
    }

    #[test]
    fn a_pending_pod_without_containers_is_not_ready() {
        let status =
            decode_static_pod_status("kube-system/kube-scheduler-n", &json!({"phase": "Pending"}))
                .unwrap();
        assert_eq!(status.component, Some(ControlPlaneComponent::Scheduler));
        assert!(!status.ready);
        assert!(status.containers.is_empty());
        assert!(!status.runs_ready(""));
    }

    #[test]
    fn components_are_known_by_their_pod_name_prefix() {
        assert_eq!(
            ControlPlaneComponent::from_kubelet_pod_name("kube-controller-manager-cp-1"),
            Some(ControlPlaneComponent::ControllerManager)
        );
        assert_eq!(
            ControlPlaneComponent::from_kubelet_pod_name("kube-apiserver"),
            None
        );
        assert_eq!(
            ControlPlaneComponent::from_kubelet_pod_name("etcd-cp-1"),
            None
        );
    }

    #[test]
    fn a_node_reply_of_another_shape_is_an_error_naming_the_resource() {
        let bad = [
            json!("text"),
            json!({"conditions": "Ready"}),
            json!({"containerStatuses": [{"image": 5}]}),
            json!({"containerStatuses": [{"ready": "yes"}]}),
        ];
        for spec in bad {
            let e = decode_static_pod_status("kube-system/x", &spec).unwrap_err();
            assert!(e.starts_with("StaticPodStatus \"kube-system/x\""), "{e}");
        }
        for spec in [
            json!({"items": []}),
            json!(["text"]),
            json!([{"kind": "Pod"}]),
        ] {
            let e = decode_manifest("10-kube-proxy", &spec).unwrap_err();
            assert!(e.starts_with("Manifest \"10-kube-proxy\""), "{e}");
        }
    }

    #[test]
    fn a_manifest_is_the_list_of_its_objects() {
        let spec = json!([
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "kube-proxy"}},
        ]);
        let manifest = decode_manifest("10-kube-proxy", &spec).unwrap();
        assert_eq!(manifest.objects.len(), 1);
        assert_eq!(
            decode_manifest("x", &Value::Null).unwrap().objects,
            Vec::<Value>::new()
        );
    }
}
