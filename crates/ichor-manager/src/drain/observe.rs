//! What a drain reads: the machine as stored (its record), whether the Node is schedulable,
//! the pods on it and the PodDisruptionBudgets that may cover them. Nothing here writes.

use ichor_api::TalosMachine;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use super::plan::{Budget, PodView};
use crate::{Context, Error};

/// The machine as stored now (its drain record, never a cached copy of it); `None`: gone.
pub(super) async fn stored(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<Option<TalosMachine>, Error> {
    Ok(Api::<TalosMachine>::namespaced(
        ctx.client.clone(),
        &machine.namespace().unwrap_or_default(),
    )
    .get_opt(&machine.name_any())
    .await?)
}

/// Whether Node `name` is schedulable now; `None`: there is no such Node.
pub(super) async fn schedulable(
    workload: &kube::Client,
    name: &str,
) -> Result<Option<bool>, kube::Error> {
    let node = Api::<Node>::all(workload.clone()).get_opt(name).await?;
    Ok(node.map(|n| !n.spec.and_then(|s| s.unschedulable).unwrap_or(false)))
}

/// The pods on Node `name`.
pub(super) async fn pods_on(
    workload: &kube::Client,
    name: &str,
) -> Result<Vec<PodView>, kube::Error> {
    let fields = ListParams::default().fields(&format!("spec.nodeName={name}"));
    let pods = Api::<Pod>::all(workload.clone()).list(&fields).await?;
    Ok(pods.items.iter().map(PodView::of).collect())
}

/// Every PodDisruptionBudget of the workload cluster.
pub(super) async fn budgets(workload: &kube::Client) -> Result<Vec<Budget>, kube::Error> {
    let budgets = Api::<PodDisruptionBudget>::all(workload.clone())
        .list(&ListParams::default())
        .await?;
    Ok(budgets.items.iter().map(Budget::of).collect())
}
