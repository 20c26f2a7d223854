//! A machine's part in a Kubernetes rollout (ADR 0070). While its cluster rolls a Kubernetes
//! version out, each look records what the node runs: its control-plane static pods as their
//! kubelet reports them Ready (`StaticPodStatuses`, talos-facts §14.1) and its kubelet as its
//! Node reports it (`status.nodeInfo.kubeletVersion` of a Ready Node, as `talosctl upgrade-k8s`
//! waits for, §9.7), and the static pods its config turns off (§14.2). The rollout's steps
//! (`crate::kubernetes_steps`) wait on these records.
//! Once no rollout runs, the record is cleared.

use ichor_api::TalosCluster;
use ichor_api::TalosMachine;
use ichor_api::common::Role;
use ichor_api::machine::{KubernetesComponents, MachineUpgrade, TalosMachineStatus};
use ichor_render::Rendered;
use ichor_talos::{ControlPlaneComponent, TalosClient};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::Api;

use crate::kubernetes_steps::{self, Step};
use crate::{Context, Error};

/// The version an image's tag names, `v`-less (`registry.k8s.io/kube-apiserver:v1.36.4` →
/// `1.36.4`); `None` without a tag.
fn tag_version(image: &str) -> Option<String> {
    let (_, tag) = image.rsplit_once(':')?;
    (!tag.contains('/')).then(|| tag.trim_start_matches('v').to_owned())
}

/// What the node runs of Kubernetes: its Ready control-plane static pods (for a control plane
/// that answers) and the kubelet version its Ready Node reports (when the workload API
/// answers).
async fn seen(
    ctx: &Context,
    cluster: &TalosCluster,
    (role, rendered): (Role, &Rendered),
    client: Option<&TalosClient>,
    status: &TalosMachineStatus,
) -> KubernetesComponents {
    let mut seen = KubernetesComponents::default();
    if role == Role::ControlPlane {
        // What its config turns off never runs there (talos-facts §14.2).
        seen.disabled = ichor_render::disabled_static_pods(&rendered.documents)
            .into_iter()
            .map(str::to_owned)
            .collect();
    }
    if role == Role::ControlPlane
        && let Some(client) = client
        && let Ok(pods) = client.static_pod_statuses().await
    {
        for pod in pods.iter().filter(|p| p.ready && p.phase == "Running") {
            let version = pod.containers.first().and_then(|c| tag_version(&c.image));
            let field = match pod.component {
                Some(ControlPlaneComponent::ApiServer) => &mut seen.api_server,
                Some(ControlPlaneComponent::ControllerManager) => &mut seen.controller_manager,
                Some(ControlPlaneComponent::Scheduler) => &mut seen.scheduler,
                None => continue,
            };
            *field = version;
        }
    }
    if let Some(name) = status.lifecycle.node_name.as_deref()
        && let Some(workload) = crate::workload::client(ctx, cluster).await
        && let Ok(Some(node)) = Api::<Node>::all(workload).get_opt(name).await
    {
        let node_status = node.status.unwrap_or_default();
        let ready = node_status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if ready {
            seen.kubelet = node_status
                .node_info
                .map(|i| i.kubelet_version.trim_start_matches('v').to_owned());
        }
    }
    seen
}

/// Records what the node runs while its cluster rolls a Kubernetes version out (clears the
/// record otherwise). Returns whether this machine is where the rollout stands, so its next
/// look comes soon.
pub(super) async fn look(
    ctx: &Context,
    (cluster, machine): (&TalosCluster, &TalosMachine),
    (role, rendered): (Role, &Rendered),
    client: Option<&TalosClient>,
    status: &mut TalosMachineStatus,
) -> Result<bool, Error> {
    let target = cluster
        .status
        .as_ref()
        .and_then(|s| s.core.accepted_versions.as_ref())
        .filter(|a| a.kubernetes_from.is_some())
        .map(|a| a.kubernetes_version.clone());
    let now = match &target {
        Some(_) => Some(seen(ctx, cluster, (role, rendered), client, status).await),
        None => None,
    };
    if now != status.upgrade.kubernetes {
        let record = now.clone();
        super::act::patch_status::<MachineUpgrade>(ctx, machine, move |s| {
            s.upgrade.kubernetes.clone_from(&record);
        })
        .await?;
        status.upgrade.kubernetes = now;
    }
    let Some(target) = target else {
        return Ok(false);
    };
    let machines = ctx.machines.store().state();
    let me = machine.name_any();
    let mut members = kubernetes_steps::members(
        machines.iter().map(AsRef::as_ref),
        &machine.namespace().unwrap_or_default(),
        &machine.spec.cluster_ref.name,
    );
    // This look's own record, which the cache may not hold yet.
    for member in members.iter_mut().filter(|m| m.name == me) {
        member.running = status.upgrade.kubernetes.as_ref();
    }
    Ok(matches!(
        kubernetes_steps::step(&target, &members),
        Step::Component { machine, .. } if machine == me
    ))
}

#[cfg(test)]
mod tests {
    use super::tag_version;

    #[test]
    fn an_image_tag_names_the_version() {
        assert_eq!(
            tag_version("registry.k8s.io/kube-apiserver:v1.36.4").as_deref(),
            Some("1.36.4")
        );
        assert_eq!(
            tag_version("registry.local:5000/kube-apiserver:v1.36.4").as_deref(),
            Some("1.36.4")
        );
        assert_eq!(tag_version("registry.local:5000/kube-apiserver"), None);
    }
}
