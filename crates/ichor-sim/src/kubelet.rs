//! The kubelet of a node: the version it runs, from the running config's kubelet image, and
//! the control-plane static pods it runs (talos-facts §14.1–§14.3): which pods the running
//! config gives, with which image, and how the kubelet replaces a pod whose image changed.
//! The node's observer follows the config every tick; the COSI service reads the result as
//! `StaticPodStatuses.kubernetes.talos.dev`.
//!
//! A pod exists while the node runs as a control plane with its kubelet running and its etcd
//! member healthy (Talos renders the static pods only then, and removes them otherwise). Its
//! status follows [`crate::Timings::static_pod`] (`d`): a new pod is not reported for `d`,
//! then runs unready for `d`, then is ready; a pod whose image changed is reported as the old
//! pod for `d`, then as the new one, unready for `d`, then ready.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::apply::{Minor, default_k8s};
use crate::{Node, Stage};

/// The control-plane components, in the order Talos renders them: (static pod name, the
/// v1alpha1 `cluster` key, the 1.14 document kind, the image repository of the default).
pub(crate) const COMPONENTS: [(&str, &str, &str, &str); 3] = [
    (
        "kube-apiserver",
        "apiServer",
        "KubeAPIServerConfig",
        "registry.k8s.io/kube-apiserver",
    ),
    (
        "kube-controller-manager",
        "controllerManager",
        "KubeControllerManagerConfig",
        "registry.k8s.io/kube-controller-manager",
    ),
    (
        "kube-scheduler",
        "scheduler",
        "KubeSchedulerConfig",
        "registry.k8s.io/kube-scheduler",
    ),
];

/// One run of a pod: its image, container and start time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    /// The container's image, as the config names it.
    pub(crate) image: String,
    /// The container's id in the CRI (64 hex digits).
    pub(crate) container_id: String,
    /// When the pod started.
    pub(crate) started: SystemTime,
}

/// One static pod.
#[derive(Debug, Clone)]
pub(crate) struct Pod {
    /// The pod of the current config.
    pub(crate) current: Run,
    /// The pod it replaces, still reported until the kubelet has switched.
    pub(crate) previous: Option<Run>,
    /// When the current pod was asked for.
    since: Instant,
}

/// How a pod is reported now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reported {
    /// The pod name (without the node name).
    pub(crate) name: &'static str,
    /// The run reported.
    pub(crate) run: Run,
    /// Whether its container passes its readiness probe.
    pub(crate) ready: bool,
    /// When it became ready (or started, while not).
    pub(crate) transition: SystemTime,
}

/// The static pods of one boot, by pod name.
#[derive(Debug, Default)]
pub(crate) struct StaticPods {
    pods: BTreeMap<&'static str, Pod>,
}

impl StaticPods {
    /// The pods as the kubelet reports them now, `delay` being [`crate::Timings::static_pod`].
    pub(crate) fn reported(&self, delay: Duration) -> Vec<Reported> {
        let now = Instant::now();
        self.pods
            .iter()
            .filter_map(|(name, pod)| {
                let age = now.saturating_duration_since(pod.since);
                if age < delay {
                    return pod.previous.as_ref().map(|run| Reported {
                        name,
                        run: run.clone(),
                        ready: true,
                        transition: run.started,
                    });
                }
                let ready = age >= delay * 2;
                Some(Reported {
                    name,
                    run: pod.current.clone(),
                    ready,
                    transition: if ready {
                        pod.current.started + delay
                    } else {
                        pod.current.started
                    },
                })
            })
            .collect()
    }
}

/// A container id: 64 hex digits, from the pod, image and time.
fn container_id(seed: &str) -> String {
    let mut state = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (0..4)
        .map(|_| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            format!("{:016x}", z ^ (z >> 31))
        })
        .collect()
}

/// The v1alpha1 document of a config, if it has one.
fn v1alpha1(documents: &[Value]) -> Option<&Value> {
    documents
        .iter()
        .find(|d| d["version"] == "v1alpha1" && d.get("kind").is_none())
}

/// An image as the config names it, an absent or empty one being Talos's default,
/// `<repository>:v<DefaultKubernetesVersion>` (talos-facts §14.2).
fn image_or_default(value: &Value, repository: &str, minor: Minor) -> String {
    value.as_str().filter(|s| !s.is_empty()).map_or_else(
        || format!("{repository}:v{}", default_k8s(minor)),
        str::to_owned,
    )
}

/// The image of a component and whether it runs, from the config documents (talos-facts
/// §14.2): a 1.14 document of its kind first, else v1alpha1's `cluster.<key>.image`, else
/// `<repository>:v<DefaultKubernetesVersion>`; the controller manager and the scheduler are
/// off with `enabled: false` in their document or `machine.controlPlane.<key>.disabled`.
pub(crate) fn component_image(
    documents: &[Value],
    minor: Minor,
    (_, key, kind, repository): (&str, &str, &str, &str),
) -> Option<String> {
    if let Some(doc) = documents.iter().find(|d| d["kind"] == kind) {
        if doc["enabled"] == false {
            return None;
        }
        return Some(image_or_default(&doc["image"], repository, minor));
    }
    let v1alpha1 = v1alpha1(documents)?;
    if key != "apiServer" && v1alpha1["machine"]["controlPlane"][key]["disabled"] == true {
        return None;
    }
    Some(image_or_default(
        &v1alpha1["cluster"][key]["image"],
        repository,
        minor,
    ))
}

/// The repository of the default kubelet image (Talos's `constants.KubeletImage`).
const KUBELET_REPOSITORY: &str = "ghcr.io/siderolabs/kubelet";

/// The kubelet's image, from the config documents (talos-facts §14.2): a 1.14 `KubeletConfig`
/// document first, else v1alpha1's `machine.kubelet.image`, else
/// `ghcr.io/siderolabs/kubelet:v<DefaultKubernetesVersion>`; none without either document.
pub(crate) fn kubelet_image(documents: &[Value], minor: Minor) -> Option<String> {
    let image = match documents.iter().find(|d| d["kind"] == "KubeletConfig") {
        Some(doc) => &doc["image"],
        None => &v1alpha1(documents)?["machine"]["kubelet"]["image"],
    };
    Some(image_or_default(image, KUBELET_REPOSITORY, minor))
}

/// The version a kubelet of `image` reports in its Node's `status.nodeInfo.kubeletVersion`:
/// the image's tag without a digest and without the `-fat`/`-slim` variant suffix, which
/// `talosctl upgrade-k8s` keeps in the image and leaves out of the version it waits for
/// (talos-facts §14.2, §9.7); none for an image without a tag.
pub(crate) fn kubelet_version(image: &str) -> Option<String> {
    let reference = image.split_once('@').map_or(image, |(name, _)| name);
    let (_, tag) = reference.rsplit_once(':')?;
    if tag.is_empty() || tag.contains('/') {
        return None;
    }
    let tag = ["-fat", "-slim"]
        .iter()
        .find_map(|suffix| tag.strip_suffix(suffix))
        .unwrap_or(tag);
    Some(tag.to_owned())
}

impl Node {
    /// The Talos minor whose rules and defaults apply to this node.
    fn minor(&self) -> Minor {
        if self.shared.is_1_14() {
            Minor::V14
        } else {
            Minor::V13
        }
    }

    /// The version of the kubelet the running config gives (its image's tag, see
    /// [`kubelet_version`]); none before the node runs a config.
    pub(crate) fn kubelet_version(&self) -> Option<String> {
        let config = self.running.as_ref()?;
        kubelet_version(&kubelet_image(&config.documents, self.minor())?)
    }

    /// The pods the running config gives now: none unless the node runs as a control plane
    /// with its kubelet running and its etcd member healthy.
    fn wanted_static_pods(&self) -> Vec<(&'static str, String)> {
        let Some(config) = &self.running else {
            return Vec::new();
        };
        let etcd_healthy = self.etcd.is_some_and(|d| {
            !self.etcd_stopped
                && self.shared.etcd_running.load(Ordering::SeqCst) == d.cluster
                && !self.shared.etcd_unhealthy.load(Ordering::SeqCst)
        });
        if self.stage != Stage::Running
            || !config.is_control_plane()
            || !self.service_running("kubelet")
            || !etcd_healthy
        {
            return Vec::new();
        }
        let minor = self.minor();
        COMPONENTS
            .iter()
            .filter_map(|c| component_image(&config.documents, minor, *c).map(|i| (c.0, i)))
            .collect()
    }

    /// Follows the running config: a pod whose image changed is replaced, a pod no longer
    /// wanted goes, a new one starts.
    pub(crate) fn observe_static_pods(&mut self) {
        let wanted = self.wanted_static_pods();
        let unchanged = wanted.len() == self.static_pods.pods.len()
            && wanted.iter().all(|(name, image)| {
                self.static_pods
                    .pods
                    .get(name)
                    .is_some_and(|p| p.current.image == *image)
            });
        if unchanged {
            return;
        }
        let now = (Instant::now(), SystemTime::now());
        let boot = self.boot_id.clone();
        let pods = &mut self.static_pods.pods;
        pods.retain(|name, _| wanted.iter().any(|(w, _)| w == name));
        for (name, image) in wanted {
            let run = || Run {
                container_id: container_id(&format!("{boot}/{name}/{image}/{:?}", now.0)),
                image: image.clone(),
                started: now.1,
            };
            match pods.get_mut(name) {
                Some(pod) if pod.current.image == image => {}
                Some(pod) => {
                    let old = std::mem::replace(&mut pod.current, run());
                    // A pod replaced again before the kubelet switched is still the first.
                    if now.0.saturating_duration_since(pod.since) >= self.timings.static_pod {
                        pod.previous = Some(old);
                    }
                    pod.since = now.0;
                }
                None => {
                    pods.insert(
                        name,
                        Pod {
                            current: run(),
                            previous: None,
                            since: now.0,
                        },
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn kubelet_image_prefers_the_document_then_v1alpha1_then_the_default() {
        let v1alpha1 = json!({"version": "v1alpha1", "machine": {"kubelet": {"image": "ghcr.io/siderolabs/kubelet:v1.35.1"}}});
        let document = json!({"apiVersion": "v1alpha1", "kind": "KubeletConfig", "image": "ghcr.io/siderolabs/kubelet:v1.36.2"});
        assert_eq!(
            kubelet_image(&[v1alpha1.clone(), document], Minor::V14).as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.36.2")
        );
        assert_eq!(
            kubelet_image(std::slice::from_ref(&v1alpha1), Minor::V14).as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.35.1")
        );
        let bare = json!({"version": "v1alpha1", "machine": {"type": "worker"}});
        assert_eq!(
            kubelet_image(std::slice::from_ref(&bare), Minor::V13).as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.36.3")
        );
        assert_eq!(
            kubelet_image(&[bare], Minor::V14).as_deref(),
            Some("ghcr.io/siderolabs/kubelet:v1.37.0")
        );
        assert_eq!(kubelet_image(&[], Minor::V14), None);
    }

    #[test]
    fn kubelet_version_is_the_tag_without_digest_or_variant() {
        for (image, version) in [
            ("ghcr.io/siderolabs/kubelet:v1.36.3", Some("v1.36.3")),
            ("ghcr.io/siderolabs/kubelet:v1.36.3-fat", Some("v1.36.3")),
            ("ghcr.io/siderolabs/kubelet:v1.36.3-slim", Some("v1.36.3")),
            (
                "registry.local:5000/kubelet:v1.37.0@sha256:0123",
                Some("v1.37.0"),
            ),
            ("registry.local:5000/kubelet", None),
            ("kubelet", None),
        ] {
            assert_eq!(kubelet_version(image).as_deref(), version, "{image}");
        }
    }
}
