//! A declared Kubernetes version rolls out in `talosctl upgrade-k8s`'s order (ADR 0070): a patch
//! bump, then its revert as a GitOps revert makes, each through kube-apiserver on each control
//! plane in turn, then kube-controller-manager, then kube-scheduler (each node's new pod seen
//! Ready, `StaticPodStatuses`), then each kubelet (its Node's `kubeletVersion`), control planes
//! first, then the bootstrap manifests synced to the workload cluster (kube-proxy's DaemonSet
//! at the new image). No kubelet ever runs ahead of a kube-apiserver, and nothing writes the
//! spec. A control plane whose own patch turns its kube-scheduler off is not waited for there.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ichor_api::TalosCluster;
use ichor_api::names::{conditions, reasons};
use ichor_harness::{SimOptions, SimTarget, Target, specs};
use ichor_talos::{ControlPlaneComponent, TalosClient};
use ichor_testenv::nets::DAY2_KUBERNETES;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, PodSpec};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::cluster::{CLUSTER, kubernetes_rolled_out, ready_target, state_summary};

/// What one look at the cluster saw: per node name, each component's version seen Ready.
type Seen = BTreeMap<String, BTreeMap<&'static str, String>>;

/// The version an image's tag names, `v`-less.
fn tag(image: &str) -> String {
    image
        .rsplit_once(':')
        .map_or("", |(_, t)| t)
        .trim_start_matches('v')
        .to_owned()
}

/// The images of a pod template's containers.
fn images(pod: Option<PodSpec>) -> Vec<String> {
    pod.map(|p| p.containers.into_iter().filter_map(|c| c.image).collect())
        .unwrap_or_default()
}

/// One look: every control plane's Ready static pods, every Ready Node's kubelet.
async fn look(control_planes: &[TalosClient], workload: &kube::Client) -> Seen {
    let mut seen = Seen::new();
    for client in control_planes {
        let Ok(pods) = client.static_pod_statuses().await else {
            continue;
        };
        for pod in pods.iter().filter(|p| p.ready) {
            let (Some(component), Some(container)) = (pod.component, pod.containers.first()) else {
                continue;
            };
            let name = match component {
                ControlPlaneComponent::ApiServer => "kube-apiserver",
                ControlPlaneComponent::ControllerManager => "kube-controller-manager",
                ControlPlaneComponent::Scheduler => "kube-scheduler",
            };
            let node = pod
                .pod
                .strip_prefix(&format!("{name}-"))
                .unwrap_or(&pod.pod)
                .to_owned();
            seen.entry(node)
                .or_default()
                .insert(name, tag(&container.image));
        }
    }
    if let Ok(nodes) = Api::<Node>::all(workload.clone())
        .list(&Default::default())
        .await
    {
        for node in nodes.items {
            let name = node.metadata.name.clone().unwrap_or_default();
            if let Some(info) = node.status.and_then(|s| s.node_info) {
                seen.entry(name).or_default().insert(
                    "kubelet",
                    info.kubelet_version.trim_start_matches('v').to_owned(),
                );
            }
        }
    }
    seen
}

/// The order in which (component, node) first reached `version`, from the looks in turn; and
/// the first look, if any, where a kubelet ran `version` while a kube-apiserver did not.
fn order(looks: &[Seen], version: &str) -> (Vec<(String, String)>, Option<Seen>) {
    let mut reached = Vec::new();
    let mut skew = None;
    for seen in looks {
        for (node, components) in seen {
            for (component, v) in components {
                let step = ((*component).to_owned(), node.clone());
                if v == version && !reached.contains(&step) {
                    reached.push(step);
                }
            }
        }
        let apiservers: Vec<&String> = seen
            .values()
            .filter_map(|c| c.get("kube-apiserver"))
            .collect();
        let kubelet_ahead = seen
            .values()
            .any(|c| c.get("kubelet").is_some_and(|v| v == version));
        if skew.is_none() && kubelet_ahead && apiservers.iter().any(|v| *v != version) {
            skew = Some(seen.clone());
        }
    }
    (reached, skew)
}

/// Declares Kubernetes `version`, waits until it rolled out (the step gone, `VersionRolledOut`
/// true, the accepted version without one before it), sampling the nodes throughout; returns
/// the looks, and the spec's generation the declaration made.
async fn roll_out(
    target: &SimTarget,
    control_planes: &[TalosClient],
    workload: &kube::Client,
    version: &str,
) -> (Vec<Seen>, Option<i64>) {
    let clusters: Api<TalosCluster> = Api::namespaced(target.client(), target.namespace());
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, control_planes, workload) =
            (Arc::clone(&stop), control_planes.to_vec(), workload.clone());
        tokio::spawn(async move {
            let mut looks = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                looks.push(look(&control_planes, &workload).await);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            looks
        })
    };
    let declared = clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": version}})),
        )
        .await
        .expect("declared")
        .metadata
        .generation;
    let done = kubernetes_rolled_out(target, version, Duration::from_secs(240)).await;
    stop.store(true, Ordering::SeqCst);
    let mut looks = sampler.await.expect("sampler");
    if let Err(e) = done {
        panic!("{e}\n{}", state_summary(target));
    }
    looks.push(look(control_planes, workload).await);
    (looks, declared)
}

/// Turns cp-3's kube-scheduler off with a patch of its own machine, and waits until its node
/// runs none (its config applied) while the other control planes still run theirs.
async fn turn_scheduler_off(
    target: &SimTarget,
    control_planes: &[TalosClient],
    workload: &kube::Client,
) {
    let address = target.nodes()[2].addr().ip().to_string();
    let machine = specs::machine_at(target, &address)
        .await
        .expect("cp-3's machine");
    Api::<ichor_api::TalosMachine>::namespaced(target.client(), target.namespace())
        .patch(
            &kube::ResourceExt::name_any(&machine),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [
                {"name": "no-scheduler", "documents": {"KubeSchedulerConfig": {"enabled": false}}}
            ]}})),
        )
        .await
        .expect("patched");
    try_eventually(
        "cp-3 runs no kube-scheduler",
        Duration::from_secs(120),
        || async {
            let seen = look(control_planes, workload).await;
            let schedulers = |node: &str| {
                seen.get(node)
                    .is_some_and(|c| c.contains_key("kube-scheduler"))
            };
            let applied = specs::machine_condition(target, &address, conditions::CONFIG_APPLIED)
                .await
                .is_some_and(|(holds, ..)| holds);
            (applied && !schedulers("cp-3") && schedulers("cp-1") && schedulers("cp-2"))
                .then_some(())
                .ok_or_else(|| format!("{seen:?}"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubernetes_patch_bump_and_its_revert_roll_out_in_upgrade_k8s_order() {
    let target = ready_target(
        SimOptions::new(4, DAY2_KUBERNETES.net(0), "v1.14.1"),
        3,
        3,
        1,
    )
    .await;
    let clusters: Api<TalosCluster> = Api::namespaced(target.client(), target.namespace());
    let credentials = specs::talosconfig_credentials(&target, CLUSTER)
        .await
        .expect("talosconfig");
    let mut control_planes = Vec::new();
    for node in &target.nodes()[..3] {
        let address = node.addr().ip().to_string();
        control_planes.push(
            TalosClient::connect(&address, &credentials)
                .await
                .expect("connect"),
        );
    }
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload client");
    let names: Vec<String> = look(&control_planes, &workload).await.into_keys().collect();
    assert_eq!(
        names,
        ["cp-1", "cp-2", "cp-3", "worker-4"],
        "the nodes as seen"
    );

    let mut generation = None;
    for (version, before) in [("1.36.4", "1.36.3"), ("1.36.3", "1.36.4")] {
        // Before the revert, cp-3's own patch turns its kube-scheduler off: it runs none, and
        // the rollout does not wait for one there (talos-facts §14.2).
        let scheduler_off = version == "1.36.3";
        if scheduler_off {
            turn_scheduler_off(&target, &control_planes, &workload).await;
        }
        let (looks, declared) = roll_out(&target, &control_planes, &workload, version).await;
        generation = declared;
        let first = looks.first().expect("a look");
        assert!(
            first.values().flat_map(|c| c.values()).all(|v| v == before),
            "before {version}: {first:?}"
        );
        let (reached, skew) = order(&looks, version);
        let expected: Vec<(String, String)> = [
            ("kube-apiserver", "cp-1"),
            ("kube-apiserver", "cp-2"),
            ("kube-apiserver", "cp-3"),
            ("kube-controller-manager", "cp-1"),
            ("kube-controller-manager", "cp-2"),
            ("kube-controller-manager", "cp-3"),
            ("kube-scheduler", "cp-1"),
            ("kube-scheduler", "cp-2"),
            ("kube-scheduler", "cp-3"),
            ("kubelet", "cp-1"),
            ("kubelet", "cp-2"),
            ("kubelet", "cp-3"),
            ("kubelet", "worker-4"),
        ]
        .into_iter()
        .filter(|step| !(scheduler_off && *step == ("kube-scheduler", "cp-3")))
        .map(|(c, n)| (c.to_owned(), n.to_owned()))
        .collect();
        assert_eq!(
            reached, expected,
            "the order {version} reached the nodes in"
        );
        assert!(
            skew.is_none(),
            "a kubelet ran ahead of a kube-apiserver: {skew:?}"
        );
        // The bootstrap manifests synced last: kube-proxy's DaemonSet at the new image, CoreDNS
        // at the image Talos 1.14 renders (its own version, not Kubernetes').
        let proxy = Api::<DaemonSet>::namespaced(workload.clone(), "kube-system")
            .get("kube-proxy")
            .await
            .expect("kube-proxy DaemonSet");
        assert_eq!(
            images(proxy.spec.and_then(|s| s.template.spec)),
            [format!("registry.k8s.io/kube-proxy:v{version}")],
            "kube-proxy after {version}"
        );
        let coredns = Api::<Deployment>::namespaced(workload.clone(), "kube-system")
            .get("coredns")
            .await
            .expect("CoreDNS Deployment");
        assert_eq!(
            images(coredns.spec.and_then(|s| s.template.spec)),
            ["registry.k8s.io/coredns/coredns:v1.14.7"],
            "CoreDNS"
        );
    }
    let synced = specs::events_once(&target, reasons::MANIFESTS_SYNCED, Duration::from_secs(30))
        .await
        .expect("ManifestsSynced");
    assert!(!synced.is_empty());
    assert_eq!(
        clusters
            .get(CLUSTER)
            .await
            .expect("cluster")
            .metadata
            .generation,
        generation,
        "no controller wrote the spec since the last declaration"
    );
}
