//! The last step of a Kubernetes rollout (ADR 0070): once every node runs the new version, the
//! bootstrap manifests the first control plane renders (`Manifests`, talos-facts §14.4) are
//! synced to the workload cluster server-side, as `talosctl upgrade-k8s` does (§9.7): a node
//! only ever creates them, so kube-proxy's DaemonSet and CoreDNS would keep the old images.

use ichor_api::TalosCluster;
use ichor_api::TalosMachine;
use ichor_api::cluster::TalosClusterStatus;
use kube::ResourceExt as _;

use crate::kubernetes_steps::{self, Step};
use crate::{Context, Error};

/// What the sync came to, when one was due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Synced {
    /// Every object applied: how many.
    Done(usize),
    /// It could not be done now: why.
    Failed(String),
}

/// The address of the first configured control plane (by name), which the manifests are
/// read from.
fn first_control_plane(machines: &[TalosMachine], cluster: &TalosCluster) -> Option<String> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let members = kubernetes_steps::members(machines, &namespace, &name);
    let mut control_planes: Vec<&str> = members
        .iter()
        .filter(|m| m.control_plane && m.configured)
        .map(|m| m.name)
        .collect();
    control_planes.sort_unstable();
    let first = control_planes.first()?;
    machines
        .iter()
        .find(|m| m.name_any() == *first)
        .and_then(|m| m.status.as_ref())
        .and_then(|s| s.inventory.address.clone())
}

/// Syncs the bootstrap manifests when the Kubernetes rollout `status` records has reached them
/// (`None` when it has not, or none runs).
pub(super) async fn sync_when_due(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &TalosClusterStatus,
    machines: &[TalosMachine],
    bundle: &ichor_render::SecretsBundle,
) -> Result<Option<Synced>, Error> {
    let Some(accepted) = status
        .core
        .accepted_versions
        .as_ref()
        .filter(|a| a.kubernetes_from.is_some())
    else {
        return Ok(None);
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let members = kubernetes_steps::members(machines, &namespace, &cluster.name_any());
    if kubernetes_steps::step(&accepted.kubernetes_version, &members) != Step::Manifests {
        return Ok(None);
    }
    let Some(address) = first_control_plane(machines, cluster) else {
        return Ok(Some(Synced::Failed(
            "no configured control plane has an address to read the manifests from".into(),
        )));
    };
    let credentials = ctx.node_credentials(cluster, bundle)?;
    let Some(client) = crate::connect(&address, &credentials).await else {
        return Ok(Some(Synced::Failed(format!(
            "the control plane at {address} did not answer"
        ))));
    };
    let manifests = match client.manifests().await {
        Ok(manifests) => manifests,
        Err(error) => {
            return Ok(Some(Synced::Failed(format!(
                "reading the manifests of the control plane at {address}: {error}"
            ))));
        }
    };
    let Some(workload) = crate::workload::client(ctx, cluster).await else {
        return Ok(Some(Synced::Failed(
            "the workload cluster's API cannot be reached".into(),
        )));
    };
    Ok(Some(
        match crate::workload::manifests::sync(&workload, &manifests).await {
            Ok(synced) => Synced::Done(synced.applied.len()),
            Err(error) => Synced::Failed(error.to_string()),
        },
    ))
}
