//! Tearing a deleted cluster down (ADR 0009): machines never configured go at once, then the
//! workers, then the control planes one by one, the last one reset without a graceful leave.
//! Each removal runs the removal sequence under the cluster lock. The bundle Secret stays.
//!
//! The flow is [`tear_down`]: the pass is [`plan::teardown`]'s decision (pure), over the
//! machines as stored; `act` deletes and records.

mod act;
mod plan;

use ichor_api::TalosCluster;
use ichor_api::names::finalizers;
use kube::runtime::controller::Action;

use crate::{Context, Error};
use plan::Teardown;

/// Tears the deleted `cluster` down, one pass at a time; its finalizer goes once no machine is
/// left.
pub(super) async fn tear_down(ctx: &Context, cluster: &TalosCluster) -> Result<Action, Error> {
    if !crate::infra::finalizer::has(cluster, finalizers::CLUSTER_REMOVAL) {
        return Ok(Action::await_change());
    }
    // Admission may never have seen this delete (the webhook unregistered): the annotation is
    // checked here too, and nothing is touched without it (ADR 0052).
    let view = ichor_deleteguard::Cluster::from(cluster);
    if let Err(refusal) = ichor_deleteguard::check_cluster_teardown(&view) {
        act::record_held(ctx, cluster, &refusal).await?;
        // Adding the annotation changes the TalosCluster, whose watch reconciles it again.
        return Ok(Action::await_change());
    }
    // As stored: the teardown ends (and the bundle goes) only once no machine is left, not
    // once the cache saw none.
    let machines = crate::cluster_machines_as_stored(ctx, cluster).await?;
    match plan::teardown(&machines) {
        Teardown::Finished => {
            act::finish_teardown(ctx, cluster).await?;
            Ok(Action::await_change())
        }
        Teardown::Remove {
            delete,
            workers,
            control_planes,
        } => {
            act::delete_machines(ctx, cluster, &delete).await?;
            act::record_tearing_down(ctx, cluster, (workers, control_planes)).await?;
            Ok(Action::requeue(ctx.settings.progress_requeue))
        }
    }
}
