//! What an operation's reconcile does, one action at a time, each recorded: its status
//! written (a wait, a node's step, its end), the cluster lock taken, its start announced, and
//! the action sent to a node. Nothing here decides what comes next.

use ichor_api::common::Role;
use ichor_api::names::{actions, conditions, reasons};
use ichor_api::operation::{
    NodeStep, OperationBackup, OperationPhase, OperationRun, TalosOperation, TalosOperationStatus,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::{ResetOptions, TalosClient};
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::plan::{self, Run, Verdict, progress};
use super::{Node, api, holder};
use crate::infra::status::{self, Guard};
use crate::{Context, Error, Stop, infra::conditions as cond, lock, workload};

/// A workload step's outcome, an unreachable API made a wait already: done (with its
/// message) or what it waits for.
fn settled(outcome: workload::Outcome) -> Result<String, Stop> {
    match outcome {
        workload::Outcome::Done(message) => Ok(message),
        workload::Outcome::Wait(stop) => Err(stop),
        workload::Outcome::Unreachable(detail) => {
            Err(Stop::new(reasons::WORKLOAD_API_UNREACHABLE, detail))
        }
    }
}

/// Writes the operation's run group of its status.
pub(super) async fn write_status(
    ctx: &Context,
    operation: &TalosOperation,
    status: &TalosOperationStatus,
) -> Result<(), Error> {
    status::apply::<OperationRun, _>(&api(ctx, operation), operation, status, Guard::None).await?;
    Ok(())
}

/// Records a waiting state (the operation has not failed).
pub(super) async fn record_wait(
    ctx: &Context,
    operation: &TalosOperation,
    mut status: TalosOperationStatus,
    phase: OperationPhase,
    stop: Stop,
) -> Result<Action, Error> {
    let first = !status.conditions.iter().any(|c| {
        c.type_ == conditions::SUCCEEDED && c.reason == stop.reason && c.message == stop.message
    });
    status.run.phase = phase;
    stop.set_condition(
        &mut status.conditions,
        conditions::SUCCEEDED,
        operation.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, operation, &status).await?;
    if first {
        tracing::info!(operation = %operation.name_any(), reason = stop.reason, message = %stop.message, "operation waits");
        stop.note(ctx, operation, actions::OPERATE).await;
    }
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// Records a hold by the planner: the cluster lock released meanwhile, and the operation
/// waiting.
pub(super) async fn hold(
    ctx: &Context,
    operation: &TalosOperation,
    cluster: &TalosCluster,
    status: TalosOperationStatus,
    stop: Stop,
) -> Result<Action, Error> {
    lock::release(ctx, cluster, &holder(operation)).await?;
    record_wait(ctx, operation, status, OperationPhase::Waiting, stop).await
}

/// Ends the operation: failed or succeeded, never retried.
pub(super) async fn end(
    ctx: &Context,
    operation: &TalosOperation,
    cluster: Option<&TalosCluster>,
    mut status: TalosOperationStatus,
    succeeded: bool,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    status.run.phase = if succeeded {
        OperationPhase::Succeeded
    } else {
        OperationPhase::Failed
    };
    status.run.completed_at = Some(ctx.now());
    status.run.progress = Some(progress(&status.run.nodes));
    cond::set(
        &mut status.conditions,
        conditions::SUCCEEDED,
        succeeded,
        reason,
        message.clone(),
        operation.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, operation, &status).await?;
    if let Some(cluster) = cluster {
        lock::release(ctx, cluster, &holder(operation)).await?;
    }
    let kind = if succeeded {
        EventType::Normal
    } else {
        EventType::Warning
    };
    tracing::info!(operation = %operation.name_any(), succeeded, reason, %message, "operation ended");
    ctx.event(operation, kind, reason, actions::OPERATE, message)
        .await;
    Ok(Action::await_change())
}

/// Takes the cluster lock for the operation, or keeps it.
pub(super) async fn take_lock(
    ctx: &Context,
    operation: &TalosOperation,
    status: &TalosOperationStatus,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
) -> Result<lock::Outcome, Error> {
    // The lock: an operation completes no transition, but a reset of a surplus control plane
    // does, as its removal would.
    let moving = lock::transitioning(cluster, machines);
    let me = holder(operation);
    let completes = plan::resets_a_surplus_control_plane(operation, status, cluster, machines);
    lock::acquire(ctx, cluster, &me, moving, completes).await
}

/// Marks the operation running; its first start is recorded and announced.
pub(super) async fn start(
    ctx: &Context,
    operation: &TalosOperation,
    status: &mut TalosOperationStatus,
) -> Result<(), Error> {
    // Waiting (for the lock, or held by the planner) and running again: only the first start
    // is recorded and announced.
    status.run.phase = OperationPhase::Running;
    if status.run.started_at.is_some() {
        return Ok(());
    }
    status.run.started_at = Some(ctx.now());
    write_status(ctx, operation, status).await?;
    ctx.event(
        operation,
        EventType::Normal,
        reasons::STARTED,
        actions::OPERATE,
        format!(
            "{:?} on {} node(s), one at a time",
            operation.spec.action,
            status.run.nodes.len()
        ),
    )
    .await;
    Ok(())
}

impl Node<'_> {
    /// Records `step` in the operation's status as stored.
    pub(super) async fn record(&self, step: &NodeStep) -> Result<(), Error> {
        let api = api(self.ctx, self.operation);
        let Some(fresh) = api.get_opt(&self.operation.name_any()).await? else {
            return Ok(());
        };
        let mut status = fresh.status.unwrap_or_default();
        if let Some(slot) = status
            .run
            .nodes
            .iter_mut()
            .find(|n| n.machine == step.machine)
        {
            *slot = step.clone();
        } else {
            status.run.nodes.push(step.clone());
        }
        status.run.progress = Some(progress(&status.run.nodes));
        write_status(self.ctx, self.operation, &status).await
    }

    /// The workload side of this node.
    pub(super) fn node(&self) -> workload::NodeSteps<'_> {
        workload::NodeSteps {
            ctx: self.ctx,
            cluster: self.cluster,
            machine: self.machine,
        }
    }

    /// Before a reboot or a reset: the Node cordoned and drained for `purpose`
    /// (ADR 0066). `Ok` says how that went; `Err` what the disruption waits for (pods leaving,
    /// a budget, the timeout run out, the workload API).
    pub(super) async fn drain_node(&self, purpose: String) -> Result<Result<String, Stop>, Error> {
        let disruption = crate::drain::Disruption::new(
            self.ctx,
            self.cluster,
            self.machine,
            purpose,
            actions::OPERATE,
        );
        disruption.drain_or_wait().await
    }

    /// Once the node is back and verified after a reboot: its Node uncordoned if
    /// Ichor cordoned it, and the drain record cleared. `Err` says what that waits for.
    pub(super) async fn lift_cordon(&self) -> Result<Result<String, Stop>, Error> {
        let outcome =
            crate::drain::lift(self.ctx, self.cluster, self.machine, actions::OPERATE).await?;
        Ok(settled(self.node().waiting_for_api(outcome)))
    }

    /// Sends the action (looking first for its effect, after a restart). `Some` stops here.
    pub(super) async fn send(&self, step: &mut NodeStep) -> Result<Option<Verdict>, Error> {
        let action = self.action;
        if action == Run::Reset
            && crate::in_maintenance(&self.address, self.ctx.settings.sweep)
                .await
                .is_some()
        {
            return Ok(None);
        }
        let Some(client) = crate::connect(&self.address, &self.credentials).await else {
            return Ok(Some(Verdict::wait(
                reasons::NODE_UNREACHABLE,
                format!("{} does not answer", self.address),
            )));
        };
        // The node behind this connection must be the machine (ADR 0052): another one at its
        // address fails the operation, and nothing is sent.
        if let Some(step) = plan::identity_checked(action) {
            let checked =
                crate::identity::check_machine(&client, self.machine, &self.address, step).await;
            match checked {
                crate::identity::Checked::Verified => {}
                crate::identity::Checked::Refused(refusal) => {
                    return Ok(Some(Verdict::fail(refusal.reason(), refusal.message())));
                }
                crate::identity::Checked::Unread(message) => {
                    return Ok(Some(Verdict::wait(reasons::NODE_UNREACHABLE, message)));
                }
            }
        }
        let sent = match action {
            Run::Reboot => {
                self.forfeit_leadership(&client).await;
                client.reboot().await
            }
            Run::Reset => {
                client
                    .reset(ResetOptions {
                        graceful: true,
                        reboot: true,
                    })
                    .await
            }
            Run::EtcdSnapshot => return self.back_up(step).await.map(Some),
            Run::EtcdDefrag => client.etcd_defragment().await,
        };
        Ok(plan::answered(action, step, sent))
    }

    /// A control plane hands its etcd leadership on before it goes down (best effort).
    async fn forfeit_leadership(&self, client: &TalosClient) {
        if self.role == Role::ControlPlane {
            let _ = client.etcd_forfeit_leadership().await;
        }
    }

    /// Backs the cluster's etcd up from this control plane to `spec.backup` (the backup
    /// controller's runner: one backup at a time per cluster), and names the object in the
    /// operation's status.
    async fn back_up(&self, step: &mut NodeStep) -> Result<Verdict, Error> {
        let trigger = crate::controller::backup::Trigger::Operation {
            operation: self.operation.name_any(),
            machine: self.machine.name_any(),
        };
        match Box::pin(crate::controller::backup::run(
            self.ctx,
            self.cluster,
            trigger,
        ))
        .await?
        {
            None => Ok(Verdict::wait(
                reasons::WAITING_FOR_LOCK,
                "another backup of the cluster is running",
            )),
            Some(Err(failure)) => Ok(Verdict::fail(failure.reason, failure.message)),
            Some(Ok(record)) => {
                // The key is this group's alone, set once: applied from the copy at hand.
                let mut status = self.operation.status.clone().unwrap_or_default();
                status.backup.key = Some(record.key.clone());
                let api = api(self.ctx, self.operation);
                status::apply::<OperationBackup, _>(&api, self.operation, &status, Guard::None)
                    .await?;
                step.phase = OperationPhase::Succeeded;
                step.message = Some(format!(
                    "backed up {} bytes (sha256 {}) to {}",
                    record.size, record.sha256, record.key
                ));
                Ok(Verdict::Next)
            }
        }
    }
}
