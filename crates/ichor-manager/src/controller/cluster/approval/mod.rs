//! TalosMachineClass, the opt-in approval policy: observe a cluster's classes and machines,
//! plan which pending machines a class approves (pure, [`plan::plan`]), then act: approve them
//! (spec, role and class labels, an Event), say on every other matched machine why it waits
//! (`ClassMatched`), and write each class's status.
//!
//! Runs in the cluster reconciler, so one cluster's approvals are decided one at a time: two
//! classes cannot both take the last control-plane place. An approval is decided on the
//! machines as stored, so a view older than the last approval cannot grant a place twice.
//!
//! The flow is [`apply_classes`]: the classes read from the shared cache, [`plan::plan`]
//! decides, `act` writes.

mod act;
pub mod plan;

use ichor_api::machine::ApprovalState;
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass};
use kube::ResourceExt as _;

pub use plan::{Plan, Verdict, plan};

use crate::{Context, Error};

/// Applies the classes of `cluster` (from the cache) to its pending machines: observes, plans,
/// and acts on the plan.
pub async fn apply_classes(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
) -> Result<(), Error> {
    let sources = ctx.layers.sources().await?;
    let classes: Vec<&TalosMachineClass> = sources.classes.iter().map(AsRef::as_ref).collect();
    let mut plan = plan(cluster, &classes, machines);
    // An approval counts against the declared control planes and each class's `maxMachines`:
    // it is decided on the machines as stored, since the cache may not hold this controller's
    // last approval yet (a reconcile woken by another machine's change can run first).
    let stored;
    let machines = if plan.verdicts.values().any(Verdict::approves) {
        stored = crate::cluster_machines_as_stored(ctx, cluster).await?;
        plan = self::plan(cluster, &classes, &stored);
        &stored[..]
    } else {
        machines
    };
    for machine in machines {
        let Some(verdict) = plan.verdicts.get(&machine.name_any()) else {
            if machine.spec.approval_state == ApprovalState::Pending {
                act::forget_match(ctx, machine).await?;
            }
            continue;
        };
        match verdict {
            Verdict::Approve { class, role } => {
                let Some(class) = classes.iter().find(|c| &c.name_any() == class) else {
                    continue;
                };
                act::approve(ctx, machine, class, *role).await?;
            }
            Verdict::Wait {
                reason, message, ..
            } => act::record_match(ctx, machine, false, reason, message).await?,
        }
    }
    for (name, role) in &plan.role_labels {
        if plan.verdicts.contains_key(name) {
            continue;
        }
        act::label_role(ctx, cluster, name, *role).await?;
    }
    for class in classes
        .iter()
        .filter(|c| plan.statuses.contains_key(&c.name_any()))
    {
        let new = plan.statuses[&class.name_any()].clone();
        act::write_class_status(ctx, class, new).await?;
    }
    Ok(())
}
