//! What a drain writes: the machine's drain record and `Drained` condition (its own status
//! group, `ichor-manager/drain`), the Node's cordon and its lifting, the evictions and, when a
//! timeout is forced, the deletions. Nothing here decides.

use std::collections::BTreeSet;

use ichor_api::TalosMachine;
use ichor_api::machine::{MachineDrain, TalosMachineStatus};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, EvictParams, Patch, PatchParams};
use serde_json::json;

use super::plan::PodView;
use crate::{Context, Error};

/// Changes the machine's drain group as stored with `change` and applies it.
pub(super) async fn write(
    ctx: &Context,
    machine: &TalosMachine,
    change: impl Fn(&mut TalosMachineStatus),
) -> Result<(), Error> {
    crate::controller::machine::patch_status::<MachineDrain>(ctx, machine, change).await
}

/// Sets Node `name` unschedulable (a cordon) or schedulable again; a Node that is not there is
/// left so.
pub(super) async fn set_unschedulable(
    workload: &kube::Client,
    name: &str,
    unschedulable: bool,
) -> Result<(), kube::Error> {
    let nodes: Api<Node> = Api::all(workload.clone());
    let Some(node) = nodes.get_opt(name).await? else {
        return Ok(());
    };
    if node.spec.and_then(|s| s.unschedulable).unwrap_or(false) == unschedulable {
        return Ok(());
    }
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await?;
    Ok(())
}

/// Evicts each of `pods` through the eviction API, so PodDisruptionBudgets hold; returns the
/// pods (`namespace/name`) whose eviction a budget refused (429). A pod gone already is done.
pub(super) async fn evict(
    workload: &kube::Client,
    pods: &[&PodView],
) -> Result<BTreeSet<String>, kube::Error> {
    let mut refused = BTreeSet::new();
    for pod in pods {
        let api: Api<Pod> = Api::namespaced(workload.clone(), &pod.namespace);
        match api.evict(&pod.name, &EvictParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s))
                if s.reason == kube::core::response::reason::TOO_MANY_REQUESTS || s.code == 429 =>
            {
                refused.insert(pod.key());
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(refused)
}

/// Deletes the pods `keys` (`namespace/name`), bypassing their budgets: `onTimeout: Force`.
pub(super) async fn delete(workload: &kube::Client, keys: &[String]) -> Result<(), kube::Error> {
    for key in keys {
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let api: Api<Pod> = Api::namespaced(workload.clone(), namespace);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
