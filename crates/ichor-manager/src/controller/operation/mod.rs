//! TalosOperation: a day-2 action on one machine or a selection, run one node at a time under
//! the cluster lock (held as `operation/<name>`). Control planes go first, one by one, with
//! etcd health checked before each. Every node's step is recorded before and after the action
//! is sent, so a restarted manager looks for the action's effect instead of sending it blindly;
//! each reconcile goes on from the operation as stored, never from the controller's cached copy,
//! which can be behind those records (ADR 0055).
//! After an upgrade the running version is verified: a node back on its old version fails the
//! operation, which is never retried. A reboot, an upgrade, a reset or a Kubernetes upgrade goes
//! to a node only once it reported the machine's SMBIOS UUID; another machine at the address
//! fails the operation (ADR 0052).

use std::sync::Arc;
use std::time::Duration;

use ichor_api::cluster::LockHolder;
use ichor_api::common::Role;
use ichor_api::names::controllers;
use ichor_api::names::{actions, annotations, conditions, reasons};
use ichor_api::operation::{
    NodeProgress, NodeStep, OperationAction, OperationPhase, TalosOperation, TalosOperationStatus,
};
use ichor_api::operation::{OperationBackup, OperationRun};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Disruption, Stage as PlanStage, annotation_true};
use ichor_talos::{ApplyMode, Credentials, ResetOptions, Stage, TalosClient, TalosError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use serde_json::json;

use crate::infra::status::{self, Guard};
use crate::{Context, Error, Stop, infra::conditions as cond, lock, secrets, workload};

mod plan;

/// How long a node may take to go down after a reboot or an upgrade was sent, and to come back.
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
    )
    .with_config(crate::infra::drive::limits(&ctx));
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

fn api(ctx: &Context, operation: &TalosOperation) -> Api<TalosOperation> {
    Api::namespaced(
        ctx.client.clone(),
        &operation.namespace().unwrap_or_default(),
    )
}

async fn write(
    ctx: &Context,
    operation: &TalosOperation,
    status: &TalosOperationStatus,
) -> Result<(), Error> {
    status::apply::<OperationRun, _>(&api(ctx, operation), operation, status, Guard::None).await?;
    Ok(())
}

/// Records a waiting state (the operation has not failed).
async fn waiting(
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
    write(ctx, operation, &status).await?;
    if first {
        tracing::info!(operation = %operation.name_any(), reason = stop.reason, message = %stop.message, "operation waits");
        stop.note(ctx, operation, actions::OPERATE).await;
    }
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// Ends the operation: failed or succeeded, never retried.
async fn end(
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
    write(ctx, operation, &status).await?;
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

fn progress(nodes: &[NodeStep]) -> String {
    let done = nodes
        .iter()
        .filter(|n| n.phase == OperationPhase::Succeeded)
        .count();
    format!("{done}/{}", nodes.len())
}

/// The version an installer image carries (`…/installer:v1.14.1` → `v1.14.1`).
pub fn image_version(image: &str) -> Option<String> {
    let tag = image.rsplit(':').next()?;
    (tag.starts_with('v') && !tag.contains('/') && !image.contains('@')).then(|| tag.to_owned())
}

fn address(machine: &TalosMachine) -> String {
    crate::controller::machine::address(machine).unwrap_or_default()
}

/// Whether the node answers with its configured API, running (a rebooting node does not).
async fn up(address: &str, credentials: &Credentials) -> Option<TalosClient> {
    let client = crate::connect(address, credentials).await?;
    let status = client.machine_status().await.ok()?;
    (status.stage == Stage::Running).then_some(client)
}

/// Why a node is not back and healthy yet.
#[derive(Debug, thiserror::Error)]
pub enum NotHealthy {
    /// The configured API does not answer in stage running.
    #[error("{0} is not running yet")]
    NotRunning(String),
    /// A control plane came back as a learner.
    #[error("{0} is back as an etcd learner")]
    Learner(String),
    /// A control plane's etcd member answers with errors (an alarm, or no leader).
    #[error("etcd on {address} reports errors: {errors}")]
    EtcdErrors {
        /// The node.
        address: String,
        /// What the member reports.
        errors: String,
    },
    /// A control plane's etcd does not answer.
    #[error("etcd on {address} is not back: {source}")]
    EtcdNotBack {
        /// The node.
        address: String,
        /// The node's error.
        #[source]
        source: TalosError,
    },
    /// The node does not report its version.
    #[error("{address} does not report its version: {source}")]
    NoVersion {
        /// The node.
        address: String,
        /// The node's error.
        #[source]
        source: TalosError,
    },
}

/// Whether the node is back and healthy for its role; its version if so.
async fn healthy(
    address: &str,
    credentials: &Credentials,
    role: Role,
) -> Result<String, NotHealthy> {
    let Some(client) = up(address, credentials).await else {
        return Err(NotHealthy::NotRunning(address.to_owned()));
    };
    if role == Role::ControlPlane {
        match client.etcd_status().await {
            Ok(s) if s.learner => return Err(NotHealthy::Learner(address.to_owned())),
            Ok(s) if !s.errors.is_empty() => {
                return Err(NotHealthy::EtcdErrors {
                    address: address.to_owned(),
                    errors: s.errors.join("; "),
                });
            }
            Ok(_) => {}
            Err(source) => {
                return Err(NotHealthy::EtcdNotBack {
                    address: address.to_owned(),
                    source,
                });
            }
        }
    }
    client
        .version()
        .await
        .map_err(|source| NotHealthy::NoVersion {
            address: address.to_owned(),
            source,
        })
}

/// How long ago `at` was at `now` (zero when unknown).
fn elapsed_since(at: Option<&Time>, now: Timestamp) -> Duration {
    at.map(|t| crate::infra::clock::elapsed(t.0, now))
        .unwrap_or_default()
}

/// Observes the operation (as stored), its cluster and machines, takes the cluster lock and
/// reads the secrets bundle, then moves the next node's step on.
async fn reconcile_inner(cached: &TalosOperation, ctx: &Context) -> Result<Action, Error> {
    // Safety rule (ADR 0055): a disruptive action is sent on the operation's status as stored,
    // never on the controller's cached copy. That copy can be a write or two behind this
    // manager's own status writes (the intent, then the action recorded sent): a step it still
    // shows Intended (or Pending) would be sent again, a second reboot, defragment or
    // Kubernetes upgrade. Reconciles of one object never overlap, so the one before this has
    // written all it will; one GET sees it, and everything below (the decision to send, the
    // statuses written) goes on from it.
    let Some(stored) = api(ctx, cached).get_opt(&cached.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let operation = &stored;
    let mut status = operation.status.clone().unwrap_or_default();
    if plan::is_over(&status) {
        return Ok(Action::await_change());
    }
    let Observed { cluster, machines } = match observe(ctx, operation, &mut status).await? {
        Ok(observed) => observed,
        Err(stop) => {
            return end(
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
    let outcome = take_lock(ctx, operation, &status, &cluster, &machines).await?;
    if let Some(reason) = plan::lock_wait(&outcome) {
        let stop = Stop::new(reason, outcome.message());
        return waiting(ctx, operation, status, OperationPhase::Waiting, stop).await;
    }
    start(ctx, operation, &cluster, &mut status).await?;
    let bundle = match secrets::bundle(ctx, &cluster).await? {
        Ok(b) => b,
        Err(problem) => {
            let stop = problem.into();
            return waiting(ctx, operation, status, OperationPhase::Running, stop).await;
        }
    };
    run_next(ctx, operation, &cluster, &machines, &bundle, status).await
}

/// What a reconcile acts on: the operation's cluster and that cluster's machines.
struct Observed {
    /// The TalosCluster of `spec.clusterRef`.
    cluster: TalosCluster,
    /// Its machines.
    machines: Vec<TalosMachine>,
}

/// Reads the operation's cluster and its machines, and chooses the operation's nodes on its
/// first run. The inner `Err` says why it has nothing to act on.
async fn observe(
    ctx: &Context,
    operation: &TalosOperation,
    status: &mut TalosOperationStatus,
) -> Result<Result<Observed, Stop>, Error> {
    let namespace = operation.namespace().unwrap_or_default();
    let cluster_name = operation.spec.cluster_ref.name.clone();
    let Some(cluster) = Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&cluster_name)
        .await?
    else {
        return Ok(Err(Stop::new(
            reasons::NO_TARGETS,
            format!(
                "TalosCluster {cluster_name} (spec.clusterRef) does not exist in namespace {namespace}"
            ),
        )));
    };
    if let Some(refused) = plan::refusal(operation, &cluster) {
        return Ok(Err(refused));
    }
    // As stored, as the cluster is (ADR 0055): the operation's nodes go one at a time under
    // the cluster lock (ADR 0019), which counts the machines moving now.
    let machines = crate::cluster_machines_as_stored(ctx, &cluster).await?;
    if let Err(problem) = plan::choose_targets(status, &operation.spec, &machines) {
        return Ok(Err(Stop::new(reasons::NO_TARGETS, problem.to_string())));
    }
    Ok(Ok(Observed { cluster, machines }))
}

/// Takes the cluster lock for the operation, or keeps it.
async fn take_lock(
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
    let completes = resets_a_surplus_control_plane(operation, status, cluster, machines);
    lock::acquire(ctx, cluster, &me, moving, completes).await
}

/// Marks the operation running; its first start is recorded and announced (and an
/// `upgradeKubernetes` sets the cluster's version then).
async fn start(
    ctx: &Context,
    operation: &TalosOperation,
    cluster: &TalosCluster,
    status: &mut TalosOperationStatus,
) -> Result<(), Error> {
    // Waiting (for the lock, or held by the planner) and running again: only the first start
    // is recorded and announced.
    status.run.phase = OperationPhase::Running;
    if status.run.started_at.is_some() {
        return Ok(());
    }
    status.run.started_at = Some(ctx.now());
    if operation.spec.action == OperationAction::UpgradeKubernetes {
        set_kubernetes_version(ctx, operation, cluster).await?;
    }
    write(ctx, operation, status).await?;
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

/// Under the lock: moves the first node not done on by one step, or ends the operation once
/// every node is done (or the next one's machine is gone).
async fn run_next(
    ctx: &Context,
    operation: &TalosOperation,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    bundle: &ichor_render::SecretsBundle,
    mut status: TalosOperationStatus,
) -> Result<Action, Error> {
    let credentials = ctx.node_credentials(cluster, bundle)?;
    let (index, machine) = match plan::next_node(operation.spec.action, &status, machines) {
        plan::NextNode::At { index, machine } => (index, machine),
        plan::NextNode::End {
            succeeded,
            reason,
            message,
        } => {
            return end(
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
        cluster,
        machine,
        machines,
        role: machine.spec.role.unwrap_or(Role::Worker),
        address: address(machine),
        credentials,
        bundle,
    };
    let step = status.run.nodes[index].clone();
    let (step, verdict) = node.advance(step).await?;
    status.run.nodes[index] = step;
    status.run.progress = Some(progress(&status.run.nodes));
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
            write(ctx, operation, &status).await?;
            Ok(Action::requeue(Duration::from_millis(50)))
        }
        Verdict::Wait { reason, message } => {
            let stop = Stop::new(reason, message);
            waiting(ctx, operation, status, OperationPhase::Running, stop).await
        }
        Verdict::Held { reason, message } => {
            lock::release(ctx, cluster, &holder(operation)).await?;
            let stop = Stop::new(reason, message);
            waiting(ctx, operation, status, OperationPhase::Waiting, stop).await
        }
        Verdict::Fail { reason, message } => {
            end(
                ctx,
                operation,
                Some(cluster),
                status,
                false,
                reason,
                format!("{name}: {message}"),
            )
            .await
        }
    }
}

/// Whether the operation is a reset whose next node is an approved control plane while the
/// approved ones outnumber the declared count (taking it out moves toward the declared count),
/// or whose next node's reset has started: stopping half-way helps no transition, as for a
/// started removal (`removal_completes_transition`).
fn resets_a_surplus_control_plane(
    operation: &TalosOperation,
    status: &TalosOperationStatus,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
) -> bool {
    if operation.spec.action != OperationAction::Reset {
        return false;
    }
    let Some(next) = status
        .run
        .nodes
        .iter()
        .find(|n| n.phase != OperationPhase::Succeeded)
    else {
        return false;
    };
    if next.phase == OperationPhase::Running || !next.progress.is_intended() {
        return true;
    }
    let inputs: Vec<ichor_deleteguard::Machine> = machines
        .iter()
        .map(ichor_deleteguard::Machine::from)
        .collect();
    inputs.iter().any(|m| {
        m.name == next.machine
            && ichor_deleteguard::completes_transition(
                m,
                &inputs,
                &ichor_deleteguard::Cluster::from(cluster),
            )
    })
}

/// `upgradeKubernetes` records its version in the cluster's spec first (under the lock, so
/// drift waits); the nodes then get it one at a time.
async fn set_kubernetes_version(
    ctx: &Context,
    operation: &TalosOperation,
    cluster: &TalosCluster,
) -> Result<(), Error> {
    let Some(target) = &operation.spec.upgrade_kubernetes else {
        return Ok(());
    };
    let version = target.version.trim_start_matches('v');
    if cluster.spec.kubernetes_version.trim_start_matches('v') == version {
        return Ok(());
    }
    Api::<TalosCluster>::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"resourceVersion": cluster.resource_version()},
                "spec": {"kubernetesVersion": version},
            })),
        )
        .await?;
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::KUBERNETES_VERSION,
        actions::OPERATE,
        format!(
            "{} sets spec.kubernetesVersion {} -> {version}; nodes follow one at a time",
            holder(operation),
            cluster.spec.kubernetes_version
        ),
    )
    .await;
    Ok(())
}

/// What one node's step came to.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// This node is done: go on to the next.
    Next,
    /// Not yet.
    Wait {
        reason: &'static str,
        message: String,
    },
    /// The planner holds the next node before anything was sent to it: the lock is released
    /// meanwhile, so the action that can end the hold (a replacement's removal, the removal of
    /// the unhealthy member) is not locked out by this wait.
    Held {
        reason: &'static str,
        message: String,
    },
    /// The operation fails here.
    Fail {
        reason: &'static str,
        message: String,
    },
}

fn wait(reason: &'static str, message: impl Into<String>) -> Result<Verdict, Error> {
    Ok(Verdict::Wait {
        reason,
        message: message.into(),
    })
}

fn fail(reason: &'static str, message: impl Into<String>) -> Result<Verdict, Error> {
    Ok(Verdict::Fail {
        reason,
        message: message.into(),
    })
}

struct Node<'a> {
    ctx: &'a Context,
    operation: &'a TalosOperation,
    cluster: &'a TalosCluster,
    machine: &'a TalosMachine,
    machines: &'a [TalosMachine],
    role: Role,
    address: String,
    credentials: Credentials,
    bundle: &'a ichor_render::SecretsBundle,
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
        let action = self.operation.spec.action;
        if let Some(verdict) = self.check(step).await? {
            return Ok(Some(verdict));
        }
        let Some(client) = up(&self.address, &self.credentials).await else {
            step.phase = OperationPhase::Waiting;
            return Ok(Some(wait(
                reasons::NODE_UNREACHABLE,
                format!("{} is not running", self.address),
            )?));
        };
        if action == OperationAction::Reset
            && let Some(Stop { reason, message }) = self.take_node_away().await?
        {
            step.phase = OperationPhase::Waiting;
            step.message = Some(message.clone());
            return Ok(Some(Verdict::Wait { reason, message }));
        }
        step.version_before = client.version().await.ok();
        if plan::restarts(action) {
            // Read before the action, so a later look tells the reboot by a new boot id.
            match client.boot_id().await {
                Ok(id) => step.boot_id_before = Some(id),
                Err(error) => {
                    step.phase = OperationPhase::Waiting;
                    return Ok(Some(wait(
                        reasons::NODE_UNREACHABLE,
                        format!(
                            "{} does not tell its boot id, by which its reboot is seen: {error}",
                            self.address
                        ),
                    )?));
                }
            }
        }
        step.phase = OperationPhase::Running;
        step.message = Some(format!("{action:?}: sending"));
        step.progress = NodeProgress::Intended;
        // Record the intent before sending.
        self.record(step).await?;
        Ok(None)
    }

    /// The planner, on every control plane's etcd member looked at now (for an action that can
    /// cost etcd quorum). `Some` holds or refuses the node.
    async fn check(&self, step: &mut NodeStep) -> Result<Option<Verdict>, Error> {
        let Some(disruption) = self.disruption() else {
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
        // A pull, an upgrade, a defragment or a snapshot may run for minutes: the lock is
        // renewed meanwhile.
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

    async fn record(&self, step: &NodeStep) -> Result<(), Error> {
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
        write(self.ctx, self.operation, &status).await
    }

    /// The workload side of this node.
    fn node(&self) -> workload::NodeSteps<'_> {
        workload::NodeSteps {
            ctx: self.ctx,
            cluster: self.cluster,
            machine: self.machine,
        }
    }

    /// Before a reset, as before a removal: the Node is cordoned and drained. `Some` says what
    /// it waits for.
    async fn take_node_away(&self) -> Result<Option<Stop>, Error> {
        for outcome in [self.node().cordon().await?, self.node().drain().await?] {
            if let workload::Outcome::Wait(stop) = self.node().waiting_for_api(outcome) {
                return Ok(Some(stop));
            }
        }
        Ok(None)
    }

    /// What the action does to the node, as the planner judges it (`None`: nothing that can
    /// cost etcd quorum).
    fn disruption(&self) -> Option<Disruption> {
        match self.operation.spec.action {
            OperationAction::Reset => Some(Disruption::Reset {
                operation: self.operation.name_any(),
                allow_delete: annotation_true(
                    self.operation.metadata.annotations.as_ref(),
                    annotations::ALLOW_DELETE,
                ),
            }),
            OperationAction::Reboot
            | OperationAction::Upgrade
            | OperationAction::EtcdDefrag
            | OperationAction::UpgradeKubernetes => Some(Disruption::Restart),
            OperationAction::EtcdSnapshot => None,
        }
    }

    /// Sends the action (looking first for its effect, after a restart). `Some` stops here.
    async fn send(&self, step: &mut NodeStep) -> Result<Option<Verdict>, Error> {
        let action = self.operation.spec.action;
        if action == OperationAction::Reset
            && crate::in_maintenance(&self.address, self.ctx.settings.sweep)
                .await
                .is_some()
        {
            return Ok(None);
        }
        let Some(client) = crate::connect(&self.address, &self.credentials).await else {
            return Ok(Some(Verdict::Wait {
                reason: reasons::NODE_UNREACHABLE,
                message: format!("{} does not answer", self.address),
            }));
        };
        // The node behind this connection must be the machine (ADR 0052): another one at its
        // address fails the operation, and nothing is sent.
        if let Some(step) = plan::identity_checked(action) {
            let checked =
                crate::identity::check_machine(&client, self.machine, &self.address, step).await;
            match checked {
                crate::identity::Checked::Verified => {}
                crate::identity::Checked::Refused(refusal) => {
                    return fail(refusal.reason(), refusal.message()).map(Some);
                }
                crate::identity::Checked::Unread(message) => {
                    return wait(reasons::NODE_UNREACHABLE, message).map(Some);
                }
            }
        }
        let sent = match action {
            OperationAction::Reboot => {
                self.forfeit_leadership(&client).await;
                client.reboot().await
            }
            OperationAction::Upgrade => return self.send_upgrade(&client, step).await,
            OperationAction::Reset => {
                client
                    .reset(ResetOptions {
                        graceful: true,
                        reboot: true,
                    })
                    .await
            }
            OperationAction::EtcdSnapshot => return self.back_up(step).await.map(Some),
            OperationAction::EtcdDefrag => client.etcd_defragment().await,
            OperationAction::UpgradeKubernetes => return self.send_kubernetes(&client, step).await,
        };
        Ok(plan::answered(action, step, sent))
    }

    /// A control plane hands its etcd leadership on before it goes down (best effort).
    async fn forfeit_leadership(&self, client: &TalosClient) {
        if self.role == Role::ControlPlane {
            let _ = client.etcd_forfeit_leadership().await;
        }
    }

    /// Sends an upgrade (the image pulled, installed, then the reboot), unless the node already
    /// runs the image's version: then it was sent before a restart and went down since.
    async fn send_upgrade(
        &self,
        client: &TalosClient,
        step: &mut NodeStep,
    ) -> Result<Option<Verdict>, Error> {
        let image = plan::upgrade_image(self.operation);
        let running = client.version().await.ok();
        if plan::upgraded_already(
            image_version(&image).as_deref(),
            running.as_deref(),
            step.version_before.as_deref(),
        ) {
            // Sent before a restart and already done.
            let now = self.ctx.now();
            step.progress = NodeProgress::WentDown {
                sent_at: now.clone(),
                down_at: now,
            };
            return Ok(None);
        }
        self.forfeit_leadership(client).await;
        // The lifecycle upgrade installs to disk and does not reboot: the reboot is a
        // separate call, as talosctl makes it (talos-facts §10.9).
        let sent = match client.pull_image(&image).await {
            Ok(_) => match client.upgrade(&image).await {
                Ok(()) => client.reboot().await,
                Err(error) => Err(error),
            },
            Err(error) => Err(error),
        };
        Ok(plan::answered(OperationAction::Upgrade, step, sent))
    }

    /// Sends a Kubernetes upgrade: the machine's config, rendered for the cluster's (new)
    /// version, applied without a reboot, and its hash recorded.
    async fn send_kubernetes(
        &self,
        client: &TalosClient,
        step: &mut NodeStep,
    ) -> Result<Option<Verdict>, Error> {
        let sources = self.ctx.layers.sources().await?;
        let rendered = match crate::controller::machine::render_for(
            self.cluster,
            self.machine,
            self.role,
            &sources,
            self.bundle,
        ) {
            Ok(r) => r,
            Err(problem) => {
                return Ok(Some(Verdict::Fail {
                    reason: reasons::INVALID_PATCH,
                    message: format!("the config cannot be rendered: {problem}"),
                }));
            }
        };
        let sent = match client
            .apply_configuration(rendered.yaml.as_bytes(), ApplyMode::NoReboot)
            .await
        {
            Ok(_) => {
                crate::controller::machine::record_hash(self.ctx, self.machine, &rendered).await?;
                Ok(())
            }
            Err(error) => Err(error),
        };
        Ok(plan::answered(
            OperationAction::UpgradeKubernetes,
            step,
            sent,
        ))
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
            None => wait(
                reasons::WAITING_FOR_LOCK,
                "another backup of the cluster is running",
            ),
            Some(Err(failure)) => fail(failure.reason, failure.message),
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

    /// After sending: the node goes down (reboot, upgrade, reset) and comes back healthy.
    async fn follow(&self, step: &mut NodeStep) -> Result<Verdict, Error> {
        if step.phase == OperationPhase::Succeeded {
            return Ok(Verdict::Next);
        }
        let since = elapsed_since(step.progress.sent_at(), self.ctx.clock.now());
        match self.operation.spec.action {
            OperationAction::Reset => self.follow_reset(step, since).await,
            OperationAction::Reboot | OperationAction::Upgrade => {
                self.follow_restart(step, since).await
            }
            OperationAction::EtcdDefrag | OperationAction::UpgradeKubernetes => {
                self.follow_health(step, since).await
            }
            OperationAction::EtcdSnapshot => Ok(Verdict::Next),
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
        if let workload::Outcome::Wait(Stop { reason, message }) =
            self.node().waiting_for_api(deleted)
        {
            return wait(reason, message);
        }
        crate::controller::machine::forget_config(self.ctx, self.machine).await?;
        step.phase = OperationPhase::Succeeded;
        step.progress = self.verified(&step.progress);
        step.message = Some("reset: back in maintenance mode, its Node deleted".into());
        Ok(Verdict::Next)
    }

    /// After a reboot or an upgrade: the node is seen going down, then comes back healthy (on
    /// the upgrade's version).
    async fn follow_restart(&self, step: &mut NodeStep, since: Duration) -> Result<Verdict, Error> {
        let action = self.operation.spec.action;
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
        let version = match healthy(&self.address, &self.credentials, self.role).await {
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
        if action == OperationAction::Upgrade
            && let Some(verdict) =
                plan::rolled_back(step, &plan::upgrade_image(self.operation), &version)
        {
            return Ok(verdict);
        }
        step.phase = OperationPhase::Succeeded;
        step.progress = self.verified(&step.progress);
        step.message = Some(format!("{action:?}: back and healthy on {version}"));
        Ok(Verdict::Next)
    }

    /// Whether the node went down since the action was sent, on one look: it does not answer
    /// running now, or it answers with another boot id than before the action (back already).
    async fn rebooted_since(&self, step: &NodeStep) -> bool {
        let Some(client) = up(&self.address, &self.credentials).await else {
            return true;
        };
        let now = client.boot_id().await.ok();
        plan::rebooted(step.boot_id_before.as_deref(), now.as_deref())
    }

    /// After a defragment or a Kubernetes upgrade: the node answers healthy.
    async fn follow_health(&self, step: &mut NodeStep, since: Duration) -> Result<Verdict, Error> {
        let action = self.operation.spec.action;
        match healthy(&self.address, &self.credentials, self.role).await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_tags_give_the_version_to_verify() {
        assert_eq!(
            image_version("ghcr.io/siderolabs/installer:v1.14.1").as_deref(),
            Some("v1.14.1")
        );
        assert_eq!(
            image_version("registry.local:5000/installer:v1.13.9").as_deref(),
            Some("v1.13.9")
        );
        assert_eq!(image_version("registry.local:5000/installer"), None);
        assert_eq!(image_version("installer@sha256:abcd"), None);
    }
}
