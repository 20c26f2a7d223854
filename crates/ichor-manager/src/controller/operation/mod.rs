//! TalosOperation: a day-2 action on one machine or a selection, run one node at a time under
//! the cluster lock (held as `operation/<name>`). Control planes go first, one by one, with
//! etcd health checked before each. Every node's step is recorded before and after the action
//! is sent, so a restarted manager looks for the action's effect instead of sending it blindly;
//! each reconcile goes on from the operation as stored, never from the controller's cached copy,
//! which can be behind those records (ADR 0055).
//! Versions are declared (ADR 0068): an `upgrade` or `upgradeKubernetes` operation, which the
//! CRD refuses now, ends before it starts (`VersionsDeclared`), touching nothing. A reboot or a
//! reset goes to a node only once it reported the machine's SMBIOS UUID; another machine at
//! the address fails the operation (ADR 0052). Before a reboot or a reset the node's Node is
//! cordoned and drained (`crate::drain`, ADR 0066), and after a reboot it is uncordoned once
//! the node is verified.
//!
//! What the reconcile reads is `observe`'s, what it decides `plan`'s, what it writes or sends
//! `act`'s; this module runs them in order, for the operation and then for its next node.

use std::sync::Arc;
use std::time::Duration;

use ichor_api::cluster::LockHolder;
use ichor_api::common::Role;
use ichor_api::names::{controllers, reasons};
use ichor_api::operation::{
    NodeProgress, NodeStep, OperationPhase, TalosOperation, TalosOperationStatus,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::Stage as PlanStage;
use ichor_talos::Credentials;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

use crate::{Context, Error, Stop, secrets, workload};
use plan::{Run, Verdict};

mod act;
mod observe;
mod plan;

pub use observe::NotHealthy;

/// How long a node may take to go down after a reboot was sent, and to come back.
pub(crate) const NODE_PATIENCE: Duration = Duration::from_secs(300);

/// The lock holder of an operation.
pub fn holder(operation: &TalosOperation) -> LockHolder {
    LockHolder::Operation(operation.name_any())
}

/// The TalosOperation controller.
pub(crate) async fn run_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let controller = Controller::new(
        Api::<TalosOperation>::all(ctx.client.clone()),
        watcher::Config::default(),
    );
    crate::infra::drive::drive(controllers::OPERATION, controller, reconcile, ctx, stop).await;
}

/// Reconciles one TalosOperation.
pub async fn reconcile(operation: Arc<TalosOperation>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&operation, &ctx).await;
    ctx.metrics.reconciled("TalosOperation", started.elapsed());
    if result.is_ok() {
        ctx.reconciled_ok(&*operation);
    }
    result
}

/// The operation's API, in its namespace.
fn api(ctx: &Context, operation: &TalosOperation) -> Api<TalosOperation> {
    Api::namespaced(
        ctx.client.clone(),
        &operation.namespace().unwrap_or_default(),
    )
}

/// Observes the operation (as stored), its cluster and machines, takes the cluster lock and
/// reads the secrets bundle, then moves the next node's step on.
async fn reconcile_inner(cached: &TalosOperation, ctx: &Context) -> Result<Action, Error> {
    // Safety rule (ADR 0055): a disruptive action is sent on the operation's status as stored,
    // never on the controller's cached copy. That copy can be a write or two behind this
    // manager's own status writes (the intent, then the action recorded sent): a step it still
    // shows Intended (or Pending) would be sent again, a second reboot or defragment.
    // Reconciles of one object never overlap, so the one before this has written all it will;
    // one GET sees it, and everything below (the decision to send, the statuses written) goes
    // on from it.
    let Some(stored) = observe::read_stored(ctx, cached).await? else {
        return Ok(Action::await_change());
    };
    let operation = &stored;
    let mut status = operation.status.clone().unwrap_or_default();
    if plan::is_over(&status) {
        return Ok(Action::await_change());
    }
    // Versions are declared (ADR 0068): an upgrade made an operation before the CRD refused
    // them ends here, touching nothing, as does one whose cluster is not there to act on.
    let observed = match plan::runnable(operation.spec.action) {
        Ok(action) => observe::read_cluster(ctx, operation, &mut status)
            .await?
            .map(|observed| (action, observed)),
        Err(stop) => Err(stop),
    };
    let (action, observe::Observed { cluster, machines }) = match observed {
        Ok(observed) => observed,
        Err(stop) => {
            return act::end(
                ctx,
                operation,
                None,
                status,
                false,
                stop.reason,
                stop.message,
            )
            .await;
        }
    };
    let outcome = act::take_lock(ctx, operation, &status, &cluster, &machines).await?;
    if let Some(reason) = plan::lock_wait(&outcome) {
        let stop = Stop::new(reason, outcome.message());
        return act::record_wait(ctx, operation, status, OperationPhase::Waiting, stop).await;
    }
    act::start(ctx, operation, &mut status).await?;
    let bundle = match secrets::bundle(ctx, &cluster).await? {
        Ok(b) => b,
        Err(problem) => {
            let stop = problem.into();
            return act::record_wait(ctx, operation, status, OperationPhase::Running, stop).await;
        }
    };
    run_next(ctx, operation, action, &cluster, &machines, &bundle, status).await
}

/// Under the lock: moves the first node not done on by one step, or ends the operation once
/// every node is done (or the next one's machine is gone).
async fn run_next(
    ctx: &Context,
    operation: &TalosOperation,
    action: Run,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    bundle: &ichor_render::SecretsBundle,
    mut status: TalosOperationStatus,
) -> Result<Action, Error> {
    let credentials = ctx.node_credentials(cluster, bundle)?;
    let (index, machine) = match plan::next_node(action, &status, machines) {
        plan::NextNode::At { index, machine } => (index, machine),
        plan::NextNode::End {
            succeeded,
            reason,
            message,
        } => {
            return act::end(
                ctx,
                operation,
                Some(cluster),
                status,
                succeeded,
                reason,
                message,
            )
            .await;
        }
    };
    let name = status.run.nodes[index].machine.clone();
    let node = Node {
        ctx,
        operation,
        action,
        cluster,
        machine,
        machines,
        role: machine.spec.role.unwrap_or(Role::Worker),
        address: observe::address(machine),
        credentials,
    };
    let step = status.run.nodes[index].clone();
    let (step, verdict) = node.advance(step).await?;
    status.run.nodes[index] = step;
    status.run.progress = Some(plan::progress(&status.run.nodes));
    conclude(ctx, operation, cluster, status, &name, verdict).await
}

/// Acts on what the node's step came to: the status written and the next node soon, a wait
/// (the lock released while the planner holds the node), or the operation's end.
async fn conclude(
    ctx: &Context,
    operation: &TalosOperation,
    cluster: &TalosCluster,
    status: TalosOperationStatus,
    name: &str,
    verdict: Verdict,
) -> Result<Action, Error> {
    match verdict {
        Verdict::Next => {
            act::write_status(ctx, operation, &status).await?;
            Ok(Action::requeue(Duration::from_millis(50)))
        }
        Verdict::Wait(stop) => {
            act::record_wait(ctx, operation, status, OperationPhase::Running, stop).await
        }
        Verdict::Held(stop) => act::hold(ctx, operation, cluster, status, stop).await,
        Verdict::Fail(stop) => {
            act::end(
                ctx,
                operation,
                Some(cluster),
                status,
                false,
                stop.reason,
                format!("{name}: {}", stop.message),
            )
            .await
        }
    }
}

/// One node of the operation, with what reading it and acting on it take.
struct Node<'a> {
    ctx: &'a Context,
    operation: &'a TalosOperation,
    /// The operation's action, one the controller runs.
    action: Run,
    cluster: &'a TalosCluster,
    machine: &'a TalosMachine,
    machines: &'a [TalosMachine],
    role: Role,
    address: String,
    credentials: Credentials,
}

impl Node<'_> {
    /// Moves one node's step on: check, record the intent, send, record it sent, wait for the
    /// effect, verify.
    async fn advance(&self, mut step: NodeStep) -> Result<(NodeStep, Verdict), Error> {
        if (step.phase == OperationPhase::Pending || step.phase == OperationPhase::Waiting)
            && let Some(verdict) = self.prepare(&mut step).await?
        {
            return Ok((step, verdict));
        }
        if step.progress.is_intended()
            && let Some(verdict) = self.send_recorded(&mut step).await?
        {
            return Ok((step, verdict));
        }
        let verdict = self.follow(&mut step).await?;
        Ok((step, verdict))
    }

    /// Before anything is sent: the planner's check, the node answering, a reset's Node taken
    /// away, then the intent recorded. `Some` stops here.
    async fn prepare(&self, step: &mut NodeStep) -> Result<Option<Verdict>, Error> {
        let action = self.action;
        if let Some(verdict) = self.check(step).await? {
            return Ok(Some(verdict));
        }
        let Some(client) = observe::up(&self.address, &self.credentials).await else {
            step.phase = OperationPhase::Waiting;
            return Ok(Some(Verdict::wait(
                reasons::NODE_UNREACHABLE,
                format!("{} is not running", self.address),
            )));
        };
        // Before a reboot or a reset, the Node is cordoned and drained (ADR 0066).
        let drained = match plan::drain_purpose(self.operation, action) {
            Some(purpose) => match self.drain_node(purpose).await? {
                Ok(message) => Some(message),
                Err(stop) => {
                    step.phase = OperationPhase::Waiting;
                    step.message = Some(stop.message.clone());
                    return Ok(Some(Verdict::Wait(stop)));
                }
            },
            None => None,
        };
        step.version_before = client.version().await.ok();
        if plan::restarts(action) {
            // Read before the action, so a later look tells the reboot by a new boot id.
            match client.boot_id().await {
                Ok(id) => step.boot_id_before = Some(id),
                Err(error) => {
                    step.phase = OperationPhase::Waiting;
                    return Ok(Some(Verdict::wait(
                        reasons::NODE_UNREACHABLE,
                        format!(
                            "{} does not tell its boot id, by which its reboot is seen: {error}",
                            self.address
                        ),
                    )));
                }
            }
        }
        step.phase = OperationPhase::Running;
        step.message = Some(match drained {
            Some(drained) => format!("{action:?}: sending ({drained})"),
            None => format!("{action:?}: sending"),
        });
        step.progress = NodeProgress::Intended;
        // Record the intent before sending.
        self.record(step).await?;
        Ok(None)
    }

    /// The planner, on every control plane's etcd member looked at now (for an action that can
    /// cost etcd quorum); the members looked at are recorded on their machines, so this is not
    /// a pure read. `Some` holds or refuses the node.
    async fn check(&self, step: &mut NodeStep) -> Result<Option<Verdict>, Error> {
        let Some(disruption) = plan::disruption(self.operation, self.action) else {
            return Ok(None);
        };
        let verdict = crate::safety::check(
            self.ctx,
            self.machine,
            self.cluster,
            self.machines,
            &self.credentials,
            &disruption,
            PlanStage::Run,
        )
        .await?;
        Ok(plan::planner_verdict(
            verdict,
            step,
            &self.machine.name_any(),
        ))
    }

    /// Sends the intended action and records it sent. `Some` stops here.
    async fn send_recorded(&self, step: &mut NodeStep) -> Result<Option<Verdict>, Error> {
        // A defragment or a snapshot may run for minutes: the lock is renewed meanwhile.
        let sent = crate::lock::renewed_while(
            self.ctx,
            self.cluster,
            &holder(self.operation),
            self.send(step),
        )
        .await?;
        if sent.is_some() {
            return Ok(sent);
        }
        if step.progress.is_intended() {
            step.progress = NodeProgress::Sent {
                sent_at: self.ctx.now(),
            };
        }
        self.record(step).await?;
        Ok(None)
    }

    /// `progress`, verified now.
    fn verified(&self, progress: &NodeProgress) -> NodeProgress {
        progress.clone().verified(self.ctx.now())
    }

    /// After sending: the node goes down (reboot, reset) and comes back healthy.
    async fn follow(&self, step: &mut NodeStep) -> Result<Verdict, Error> {
        if step.phase == OperationPhase::Succeeded {
            return Ok(Verdict::Next);
        }
        let since = plan::elapsed_since(step.progress.sent_at(), self.ctx.clock.now());
        match self.action {
            Run::Reset => self.follow_reset(step, since).await,
            Run::Reboot => self.follow_restart(step, since).await,
            Run::EtcdDefrag => self.follow_health(step, since).await,
            Run::EtcdSnapshot => Ok(Verdict::Next),
        }
    }

    /// After a reset: the node back in maintenance mode loses its Node, and the machine its
    /// config.
    async fn follow_reset(&self, step: &mut NodeStep, since: Duration) -> Result<Verdict, Error> {
        if crate::in_maintenance(&self.address, self.ctx.settings.sweep)
            .await
            .is_none()
        {
            return Ok(plan::not_yet(
                since,
                "waiting for the node to reach maintenance mode",
                "the node did not come back in maintenance mode after its reset",
            ));
        }
        // As after a removal, the Node goes; then the machine forgets its config.
        let deleted = self.node().delete().await?;
        if let workload::Outcome::Wait(stop) = self.node().waiting_for_api(deleted) {
            return Ok(Verdict::Wait(stop));
        }
        crate::controller::machine::forget_config(self.ctx, self.machine).await?;
        // Its Node deleted, nothing is left to uncordon: the drain record goes (ADR 0066).
        crate::drain::forget(self.ctx, self.machine).await?;
        step.phase = OperationPhase::Succeeded;
        step.progress = self.verified(&step.progress);
        step.message = Some("reset: back in maintenance mode, its Node deleted".into());
        Ok(Verdict::Next)
    }

    /// After a reboot: the node is seen going down, then comes back healthy.
    async fn follow_restart(&self, step: &mut NodeStep, since: Duration) -> Result<Verdict, Error> {
        let action = self.action;
        if !step.progress.went_down() {
            if !self.rebooted_since(step).await {
                return Ok(plan::not_yet(
                    since,
                    format!("waiting for {} to go down", self.address),
                    "the node was never seen going down after the action was sent",
                ));
            }
            step.progress = step.progress.clone().down(self.ctx.now());
            step.message = Some(format!("{action:?}: the node went down"));
            self.record(step).await?;
        }
        let version = match observe::healthy(&self.address, &self.credentials, self.role).await {
            Ok(v) => v,
            Err(problem) => {
                return Ok(plan::not_yet(
                    since,
                    problem.to_string(),
                    problem.to_string(),
                ));
            }
        };
        step.version_after = Some(version.clone());
        // Back and healthy: the cordon Ichor put on its Node is lifted (ADR 0066).
        if let Err(stop) = self.lift_cordon().await? {
            return Ok(Verdict::Wait(stop));
        }
        step.phase = OperationPhase::Succeeded;
        step.progress = self.verified(&step.progress);
        step.message = Some(format!("{action:?}: back and healthy on {version}"));
        Ok(Verdict::Next)
    }

    /// After a defragment: the node answers healthy.
    async fn follow_health(&self, step: &mut NodeStep, since: Duration) -> Result<Verdict, Error> {
        let action = self.action;
        match observe::healthy(&self.address, &self.credentials, self.role).await {
            Ok(version) => {
                step.version_after = Some(version);
                step.phase = OperationPhase::Succeeded;
                step.progress = self.verified(&step.progress);
                step.message = Some(format!("{action:?}: done, node healthy"));
                Ok(Verdict::Next)
            }
            Err(problem) => Ok(plan::not_yet(
                since,
                problem.to_string(),
                problem.to_string(),
            )),
        }
    }
}
