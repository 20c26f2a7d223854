//! Removing a machine: the finalizer's work. A never-configured machine has nothing to undo.
//! A configured one is removed inside the cluster lock, step by recorded step, so a restart
//! resumes at the step reached: recheck (ichor-deleteguard), cordon and drain its Node in the
//! workload cluster, leave etcd (a failed leave stops the removal), verify through a peer,
//! reset naming STATE and EPHEMERAL with a reboot, delete the Node, release the finalizer. The
//! leave and the reset go to the node only once it reported the machine's SMBIOS UUID (ADR
//! 0052); in a cluster deleted without its allow-delete annotation a removal keeps every rule.
//!
//! A workload step (cordon, drain, Node delete) whose workload API does not answer waits, or,
//! with the force-remove annotation, is skipped and recorded; the Node delete then goes to the
//! TalosCluster, which runs it once the API answers again (ADR 0021).

use std::time::Duration;

use ichor_api::cluster::{ClusterTombstones, LockHolder, Tombstone};
use ichor_api::common::Role;
use ichor_api::machine::{
    MachineLifecycle, MachinePhase, MachineRemoval, RemovalProgress, RemovalStep, SkippedStep,
    TalosMachineStatus,
};
use ichor_api::names::{actions, annotations, conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Disruption, Machine, Stage, Verdict};
use ichor_deleteguard::{next_removal_step, removal_completes_transition};
use ichor_talos::{ResetOptions, TalosClient};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use crate::identity::Checked;
use crate::infra::status::{self, Guard};
use crate::{Context, Error, Stop, lock, secrets, workload};
use plan::Unreached;

mod plan;

fn machines_api(ctx: &Context, machine: &TalosMachine) -> Api<TalosMachine> {
    Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default())
}

async fn release_finalizer(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    // Its removal done, the machine's claim on its node goes first (ADR 0054).
    crate::claims::release(&ctx.client, machine).await?;
    crate::infra::finalizer::remove(
        &machines_api(ctx, machine),
        machine,
        finalizers::MACHINE_REMOVAL,
    )
    .await
}

async fn record(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    step: RemovalStep,
    message: String,
) -> Result<TalosMachineStatus, Error> {
    let progress = status
        .removal
        .progress
        .get_or_insert_with(|| RemovalProgress {
            started_at: Some(ctx.now()),
            ..Default::default()
        });
    progress.step = step;
    progress.message = Some(message);
    status.lifecycle.phase = MachinePhase::Removing;
    // The phase is the lifecycle's (ADR 0020), which does not run on a machine being deleted.
    let api = machines_api(ctx, machine);
    status::apply::<MachineRemoval, _>(&api, machine, &status, Guard::None).await?;
    status::apply::<MachineLifecycle, _>(&api, machine, &status, Guard::None).await?;
    Ok(status)
}

/// Records a removal that waits: `RemovalApproved` false and the removal's message say why,
/// with a Warning Event when the message is new.
async fn waiting(
    ctx: &Context,
    machine: &TalosMachine,
    status: TalosMachineStatus,
    stop: Stop,
) -> Result<Action, Error> {
    let mut status = status;
    let step = status
        .removal
        .progress
        .as_ref()
        .map(|r| r.step)
        .unwrap_or_default();
    let first = status
        .removal
        .progress
        .as_ref()
        .and_then(|r| r.message.as_deref())
        != Some(stop.message.as_str());
    stop.set_condition(
        &mut status.conditions,
        conditions::REMOVAL_APPROVED,
        machine.metadata.generation,
        &ctx.now(),
    );
    record(ctx, machine, status, step, stop.message.clone()).await?;
    if first {
        tracing::info!(machine = %machine.name_any(), reason = stop.reason, message = %stop.message, "removal waits");
        stop.warn(ctx, machine, actions::REMOVE).await;
    }
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// What the removal of one machine needs, read once per reconcile.
struct Scene<'a> {
    ctx: &'a Context,
    machine: &'a TalosMachine,
    cluster: TalosCluster,
    status: TalosMachineStatus,
    address: String,
    credentials: ichor_talos::Credentials,
    /// The cluster is being torn down: workload steps are skipped, and the last control plane
    /// is reset without a graceful leave.
    teardown: bool,
    force: bool,
}

/// The outcome of one step: done (with what to record) or waiting (with a reason).
enum Step {
    Done {
        message: String,
        reset_skipped: bool,
    },
    /// Waiting: the removal's condition and Event say why.
    Wait(Stop),
    /// A workload step the workload API did not answer, skipped by force removal.
    Skipped {
        /// The Warning Event's reason.
        reason: &'static str,
        /// What was skipped and why.
        message: String,
    },
}

fn done(message: impl Into<String>) -> Result<Step, Error> {
    Ok(Step::Done {
        message: message.into(),
        reset_skipped: false,
    })
}

fn wait(reason: &'static str, message: impl Into<String>) -> Result<Step, Error> {
    Ok(Step::Wait(Stop::new(reason, message)))
}

/// Drives a deleted machine's removal one step per reconcile.
pub async fn advance(ctx: &Context, cached: &TalosMachine) -> Result<Action, Error> {
    // The cache lags this manager's own writes: a removal decides on the machine as stored now.
    // A removal that has just finished (its finalizer released, the object gone) must never
    // run again from a stale copy: it would take the cluster lock for a machine that no longer
    // exists, and every other action would wait for that hold to expire.
    let fresh = machines_api(ctx, cached)
        .get_opt(&cached.name_any())
        .await?;
    let machine = match entry(cached, fresh) {
        Entry::Idle => return Ok(Action::await_change()),
        Entry::Release(machine) => {
            release_finalizer(ctx, &machine).await?;
            return Ok(Action::await_change());
        }
        Entry::Undo(machine) => machine,
    };
    let machine = &machine;
    let clusters: Api<TalosCluster> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    let Some(cluster) = clusters.get_opt(&machine.spec.cluster_ref.name).await? else {
        release_finalizer(ctx, machine).await?;
        return Ok(Action::await_change());
    };
    let status = machine.status.clone().unwrap_or_default();
    let holder = holder(machine);
    let (next, credentials) = match admit(ctx, machine, &cluster, &status, &holder).await? {
        Admission::Go { next, credentials } => (next, credentials),
        Admission::Hold(stop) => return waiting(ctx, machine, status, stop).await,
    };
    let scene = Scene::new(ctx, machine, cluster, status, credentials);
    let outcome = scene.run(next).await?;
    scene.conclude(outcome, next, &holder).await
}

/// Where a removal starts, read from the machine as stored now.
#[derive(Debug)]
enum Entry {
    /// Nothing to do: the machine is gone, replaced (another uid), or its finalizer released.
    Idle,
    /// Never configured: nothing to undo on the node, the finalizer goes.
    Release(TalosMachine),
    /// Configured: its removal is undone step by step.
    Undo(TalosMachine),
}

/// Where the removal of `cached` starts, from `fresh`, the machine as stored now.
fn entry(cached: &TalosMachine, fresh: Option<TalosMachine>) -> Entry {
    let Some(machine) = fresh.filter(|fresh| fresh.uid() == cached.uid()) else {
        return Entry::Idle;
    };
    if !crate::infra::finalizer::has(&machine, finalizers::MACHINE_REMOVAL) {
        return Entry::Idle;
    }
    // Never configured: nothing to undo on the node.
    if machine
        .status
        .as_ref()
        .is_none_or(|s| s.applied.config_hash.is_none())
    {
        return Entry::Release(machine);
    }
    Entry::Undo(machine)
}

/// Whether this reconcile runs the removal's next step.
enum Admission {
    /// Inside the cluster lock and cleared by the planner: `next` runs with `credentials`.
    Go {
        /// The step to run.
        next: RemovalStep,
        /// The cluster's Talos credentials.
        credentials: ichor_talos::Credentials,
    },
    /// The removal waits, and says why.
    Hold(Stop),
}

/// Takes the cluster lock, reads the cluster's credentials and, where it decides, asks the
/// planner: whether the next step runs now.
async fn admit(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: &TalosMachineStatus,
    holder: &LockHolder,
) -> Result<Admission, Error> {
    // As stored: the lock (one disruption at a time, ADR 0019) and the planner's quorum rule
    // count the machines as they are now.
    let all = crate::cluster_machines_as_stored(ctx, cluster).await?;
    let done_step = status
        .removal
        .progress
        .as_ref()
        .map(|r| r.step)
        .unwrap_or_default();
    let outcome = take_lock(ctx, machine, cluster, &all, holder, done_step).await?;
    if !outcome.held() {
        return Ok(Admission::Hold(Stop::new(
            reasons::WAITING_FOR_LOCK,
            outcome.message(),
        )));
    }
    let next = next_removal_step(done_step, machine.spec.role.unwrap_or(Role::Worker));
    let bundle = match secrets::bundle(ctx, cluster).await? {
        Ok(b) => b,
        Err(problem) => {
            return Ok(Admission::Hold(problem.into()));
        }
    };
    let credentials = ctx.node_credentials(cluster, &bundle)?;
    // The planner decides before the removal starts and again right before the etcd leave.
    if let Some(stage) = planner_stage(done_step, next) {
        let verdict = crate::safety::check(
            ctx,
            machine,
            cluster,
            &all,
            &credentials,
            &Disruption::Delete,
            stage,
        )
        .await?;
        if let Some(hold) = answer(ctx, machine, cluster, holder, recheck(&verdict, stage)).await? {
            return Ok(hold);
        }
    }
    Ok(Admission::Go { next, credentials })
}

/// Tries the cluster lock for this removal, `done_step` being the last step recorded.
async fn take_lock(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    all: &[TalosMachine],
    holder: &LockHolder,
    done_step: RemovalStep,
) -> Result<lock::Outcome, Error> {
    let inputs: Vec<Machine> = all.iter().map(Machine::from).collect();
    let target = Machine::from(machine);
    let guard_cluster = Cluster::from(cluster);
    let moving = lock::transitioning(cluster, all);
    let completes = removal_completes_transition(done_step, &target, &inputs, &guard_cluster);
    // One disruptive action per cluster: the lock's holder is this removal.
    lock::acquire(ctx, cluster, holder, moving, completes).await
}

/// When the planner is asked: before the removal starts (`Run`) and right before the etcd
/// leave (`Act`); `None` between.
fn planner_stage(done: RemovalStep, next: RemovalStep) -> Option<Stage> {
    match (done, next) {
        (RemovalStep::Pending, _) => Some(Stage::Run),
        (_, RemovalStep::EtcdLeft) => Some(Stage::Act),
        _ => None,
    }
}

/// What the removal does with the planner's verdict.
#[derive(Debug, PartialEq, Eq)]
enum Recheck {
    /// The removal starts: a Normal Event with this message says why.
    Starts(String),
    /// The removal goes on.
    Continues,
    /// The removal waits.
    Holds {
        /// The condition reason.
        reason: &'static str,
        /// The condition message.
        message: String,
        /// Whether the cluster lock is let go meanwhile (the removal has not started).
        release_lock: bool,
    },
}

/// Reads the planner's `verdict` at `stage`.
fn recheck(verdict: &Verdict, stage: Stage) -> Recheck {
    match verdict {
        Verdict::Proceed(why) if stage == Stage::Run => {
            Recheck::Starts(format!("the removal starts: {why}"))
        }
        Verdict::Proceed(_) => Recheck::Continues,
        verdict => Recheck::Holds {
            reason: verdict.reason().unwrap_or(reasons::QUORUM_AT_RISK),
            message: verdict.message().unwrap_or_default(),
            release_lock: stage == Stage::Run,
        },
    }
}

/// Acts on the planner's answer: the start's Event, or the hold (`Some`).
async fn answer(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    holder: &LockHolder,
    recheck: Recheck,
) -> Result<Option<Admission>, Error> {
    match recheck {
        Recheck::Starts(message) => {
            ctx.event(
                machine,
                EventType::Normal,
                reasons::REMOVAL,
                actions::REMOVE,
                message,
            )
            .await;
            Ok(None)
        }
        Recheck::Continues => Ok(None),
        Recheck::Holds {
            reason,
            message,
            release_lock,
        } => {
            if release_lock {
                // Not ours to go yet: let other actions have the lock meanwhile.
                lock::release(ctx, cluster, holder).await?;
            }
            Ok(Some(Admission::Hold(Stop::new(reason, message))))
        }
    }
}

/// What recording a step done means.
#[derive(Debug, PartialEq, Eq)]
struct Completion {
    /// The step recorded.
    step: RemovalStep,
    /// Whether the reset is recorded as skipped.
    reset_skipped: bool,
    /// Whether the step is recorded in `status.removal.skipped` (a workload step skipped).
    skipped: bool,
    /// The Event's type.
    event_type: EventType,
    /// The Event's reason.
    reason: &'static str,
    /// Whether the removal ends with it (reservation, lock and finalizer released).
    finishes: bool,
}

/// What recording `next` done means; a step that could not reset the node is recorded as the
/// Reset step, skipped, with a Warning; a workload step skipped (`skipped`: the Event's reason)
/// is recorded done and skipped, with a Warning.
fn completion(next: RemovalStep, reset_skipped: bool, skipped: Option<&'static str>) -> Completion {
    let step = if reset_skipped {
        RemovalStep::Reset
    } else {
        next
    };
    let (event_type, reason) = match (reset_skipped, skipped) {
        (true, _) => (EventType::Warning, reasons::RESET_SKIPPED),
        (false, Some(reason)) => (EventType::Warning, reason),
        (false, None) => (EventType::Normal, reasons::REMOVAL),
    };
    Completion {
        step,
        reset_skipped,
        skipped: skipped.is_some() && !reset_skipped,
        event_type,
        reason,
        finishes: matches!(step, RemovalStep::NodeDeleted | RemovalStep::Complete),
    }
}

/// Notes in `status` what `done` records beyond the step: the reset skipped, or a workload step
/// skipped (with `message`, at `now`).
fn note_skips(status: &mut TalosMachineStatus, done: &Completion, message: &str, now: Time) {
    if !done.reset_skipped && !done.skipped {
        return;
    }
    let progress = status
        .removal
        .progress
        .get_or_insert_with(|| RemovalProgress {
            started_at: Some(now.clone()),
            ..Default::default()
        });
    if done.reset_skipped {
        // The node could not be reset: the Reset step is recorded as skipped.
        progress.reset_skipped = true;
    }
    if done.skipped && !progress.skipped.iter().any(|s| s.step == done.step) {
        progress.skipped.push(SkippedStep {
            step: done.step,
            reason: reasons::WORKLOAD_API_UNREACHABLE.to_owned(),
            message: message.to_owned(),
            at: now,
        });
    }
}

/// The lock holder of a machine's removal.
pub fn holder(machine: &TalosMachine) -> LockHolder {
    LockHolder::Removal(machine.uid().unwrap_or_default())
}

impl<'a> Scene<'a> {
    /// The scene of `machine`'s removal from `cluster`.
    fn new(
        ctx: &'a Context,
        machine: &'a TalosMachine,
        cluster: TalosCluster,
        status: TalosMachineStatus,
        credentials: ichor_talos::Credentials,
    ) -> Self {
        Self {
            ctx,
            machine,
            // Torn down only with the cluster's annotation: a cluster deleted without it
            // (admission bypassed) keeps every step of a removal (ADR 0052).
            teardown: Cluster::from(&cluster).tearing_down(),
            cluster,
            address: crate::controller::machine::address(machine).unwrap_or_default(),
            credentials,
            force: machine
                .annotations()
                .get(annotations::FORCE_REMOVE)
                .map(String::as_str)
                == Some(annotations::TRUE),
            status,
        }
    }

    /// Runs the step `next`.
    async fn run(&self, next: RemovalStep) -> Result<Step, Error> {
        match next {
            RemovalStep::Cordoned => self.cordon().await,
            RemovalStep::Drained => self.drain().await,
            RemovalStep::EtcdLeft => self.leave_etcd().await,
            RemovalStep::Reset => self.reset().await,
            RemovalStep::NodeDeleted => self.delete_node().await,
            RemovalStep::Pending | RemovalStep::Complete => done("done"),
        }
    }

    /// Records the outcome of the step `next`: the wait, or the step done with its Event; the
    /// last step ends the removal.
    async fn conclude(
        self,
        outcome: Step,
        next: RemovalStep,
        holder: &LockHolder,
    ) -> Result<Action, Error> {
        let Scene {
            ctx,
            machine,
            cluster,
            mut status,
            ..
        } = self;
        let (message, reset_skipped, skipped) = match outcome {
            Step::Wait(stop) => return waiting(ctx, machine, status, stop).await,
            Step::Done {
                message,
                reset_skipped,
            } => (message, reset_skipped, None),
            Step::Skipped { reason, message } => (message, false, Some(reason)),
        };
        let done = completion(next, reset_skipped, skipped);
        note_skips(&mut status, &done, &message, ctx.now());
        ctx.event(
            machine,
            done.event_type,
            done.reason,
            actions::REMOVE,
            message.clone(),
        )
        .await;
        tracing::info!(machine = %machine.name_any(), step = ?done.step, %message, "removal step done");
        record(ctx, machine, status, done.step, message).await?;
        if done.finishes {
            finish(ctx, machine, &cluster, holder).await?;
            return Ok(Action::await_change());
        }
        Ok(Action::requeue(Duration::from_millis(50)))
    }

    /// The workload side of this machine's node.
    fn node(&self) -> workload::NodeSteps<'_> {
        workload::NodeSteps {
            ctx: self.ctx,
            cluster: &self.cluster,
            machine: self.machine,
        }
    }

    async fn cordon(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("cordon skipped: the cluster is being deleted");
        }
        let outcome = self.node().cordon().await?;
        self.workload_step(RemovalStep::Cordoned, outcome).await
    }

    async fn drain(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("drain skipped: the cluster is being deleted");
        }
        let outcome = self.node().drain().await?;
        self.workload_step(RemovalStep::Drained, outcome).await
    }

    /// What the workload step `step` came to: an unanswered one waits, or with force is skipped
    /// (the Node delete handed to the TalosCluster first).
    async fn workload_step(
        &self,
        step: RemovalStep,
        outcome: workload::Outcome,
    ) -> Result<Step, Error> {
        let workload::Outcome::Unreachable(detail) = outcome else {
            return Ok(outcome.into());
        };
        let node = self.node();
        let name = node.node_name().unwrap_or_default();
        match plan::unreached(step, self.force, node.endpoint(), &name, &detail) {
            Unreached::Wait(message) => wait(reasons::WORKLOAD_API_UNREACHABLE, message),
            Unreached::Skip {
                event_reason,
                message,
            } => Ok(Step::Skipped {
                reason: event_reason,
                message,
            }),
            Unreached::Defer {
                event_reason,
                message,
            } => {
                crate::node_deletes::defer(self.ctx, &self.cluster, &name, self.machine).await?;
                Ok(Step::Skipped {
                    reason: event_reason,
                    message,
                })
            }
        }
    }

    /// The member id recorded while the machine was followed.
    fn recorded_member(&self) -> Option<u64> {
        self.status
            .lifecycle
            .etcd_member_id
            .as_deref()
            .and_then(|id| u64::from_str_radix(id, 16).ok())
    }

    async fn peers(&self) -> Result<Vec<TalosClient>, Error> {
        let mut clients = Vec::new();
        for address in peer_addresses(self.ctx, self.machine).await? {
            if let Some(client) = crate::connect(&address, &self.credentials).await {
                clients.push(client);
            }
        }
        Ok(clients)
    }

    /// Whether a healthy peer confirms `member` is gone (`None`: no peer answered).
    async fn gone_from_etcd(&self, member: u64) -> Result<Option<bool>, Error> {
        for peer in self.peers().await? {
            if let Ok(members) = peer.etcd_members(false).await {
                return Ok(Some(!members.iter().any(|m| m.id == member)));
            }
        }
        Ok(None)
    }

    async fn leave_etcd(&self) -> Result<Step, Error> {
        let peers_left = !peer_addresses(self.ctx, self.machine).await?.is_empty();
        if self.teardown && !peers_left {
            return done("the last control plane: no etcd leave, the reset follows");
        }
        let client = match crate::connect(&self.address, &self.credentials).await {
            Some(client) => match client.machine_status().await {
                Ok(_) => Some(client),
                Err(_) => None,
            },
            None => None,
        };
        let Some(client) = client else {
            return self.force_remove().await;
        };
        if let Some(step) = self.not_this_machine(&client).await {
            return step;
        }
        let member = match client.etcd_status().await {
            Ok(status) => {
                if status.leader == status.member_id {
                    let _ = client.etcd_forfeit_leadership().await;
                }
                if let Err(error) = client.etcd_leave().await {
                    return wait(
                        reasons::ETCD_LEAVE_FAILED,
                        format!(
                            "the etcd leave failed, so the removal stopped (fail closed): {error}; fix the node or its etcd, then it retries"
                        ),
                    );
                }
                Some(status.member_id)
            }
            // No member answers on the node: a leave already done before a restart, or a
            // member that runs and fails. Peers still listing the recorded member tell the
            // second: it cannot leave by itself, only a healthy peer can remove it.
            Err(_) => match self.recorded_member() {
                Some(member) if self.gone_from_etcd(member).await? == Some(false) => {
                    return self.remove_unhealthy(member).await;
                }
                other => other,
            },
        };
        let Some(member) = member else {
            return done("not an etcd member: nothing to leave");
        };
        match self.gone_from_etcd(member).await? {
            Some(true) => done(format!(
                "left etcd (member {member:016x}), verified through a peer"
            )),
            Some(false) => wait(
                reasons::ETCD_LEAVE_UNVERIFIED,
                format!("a peer still lists member {member:016x}"),
            ),
            None => wait(
                reasons::ETCD_LEAVE_UNVERIFIED,
                "no healthy peer answers to confirm the member left etcd",
            ),
        }
    }

    /// Before the etcd leave: whether the node is the machine (its SMBIOS UUID, ADR 0052).
    /// `Some` is the step when it is not told to be: a wait, or with the force annotation its
    /// removal through a peer, as for a node that does not answer.
    async fn not_this_machine(&self, client: &TalosClient) -> Option<Result<Step, Error>> {
        let step = "etcd leave";
        match crate::identity::check_machine(client, self.machine, &self.address, step).await {
            Checked::Verified => None,
            Checked::Refused(_) | Checked::Unread(_) if self.force => {
                Some(self.force_remove().await)
            }
            // Anything but `Verified` holds.
            other => other.hold().map(|stop| Ok(Step::Wait(stop))),
        }
    }

    /// An unreachable control plane: removed through a healthy peer only with the force
    /// annotation; its reset is skipped, recorded, and a tombstone remembers it.
    async fn force_remove(&self) -> Result<Step, Error> {
        if !self.force {
            return wait(
                reasons::NODE_UNREACHABLE,
                format!(
                    "{} does not answer, so it cannot leave etcd; to remove it through a healthy peer (skipping its reset), set {}=true",
                    self.address,
                    annotations::FORCE_REMOVE
                ),
            );
        }
        let Some(member) = self.recorded_member() else {
            return wait(
                reasons::NODE_UNREACHABLE,
                "no etcd member id was recorded for this machine: it cannot be removed by id",
            );
        };
        if let Some(waiting) = self.remove_through_peer(member).await? {
            return Ok(waiting);
        }
        self.tombstone(Some(member)).await?;
        Ok(Step::Done {
            message: format!(
                "{} was unreachable: member {member:016x} removed through a peer ({}); its reset was SKIPPED, and a tombstone resets it if it answers again",
                self.address,
                annotations::FORCE_REMOVE
            ),
            reset_skipped: true,
        })
    }

    /// A control plane that answers while its etcd member does not (the planner's exception):
    /// removed by id through a healthy peer, only with the force annotation; its reset follows
    /// as usual, since the node answers.
    async fn remove_unhealthy(&self, member: u64) -> Result<Step, Error> {
        if !self.force {
            return wait(
                reasons::ETCD_UNHEALTHY,
                format!(
                    "{} answers but its etcd member {member:016x} does not, so it cannot leave etcd; to remove it through a healthy peer, set {}=true",
                    self.address,
                    annotations::FORCE_REMOVE
                ),
            );
        }
        if let Some(waiting) = self.remove_through_peer(member).await? {
            return Ok(waiting);
        }
        done(format!(
            "its etcd member {member:016x} did not answer: removed through a healthy peer ({})",
            annotations::FORCE_REMOVE
        ))
    }

    /// Removes `member` by id through the first healthy peer that answers, and verifies it is
    /// gone. `Some` is the wait when it could not (yet).
    async fn remove_through_peer(&self, member: u64) -> Result<Option<Step>, Error> {
        let mut removed = false;
        for peer in self.peers().await? {
            let Ok(members) = peer.etcd_members(false).await else {
                continue;
            };
            if members.iter().any(|m| m.id == member)
                && let Err(error) = peer.etcd_remove_member(member).await
            {
                return wait(
                    reasons::ETCD_LEAVE_FAILED,
                    format!("removing member {member:016x} through a peer failed: {error}"),
                )
                .map(Some);
            }
            removed = true;
            break;
        }
        if !removed {
            return wait(
                reasons::ETCD_LEAVE_UNVERIFIED,
                "no healthy peer answers to remove the member",
            )
            .map(Some);
        }
        match self.gone_from_etcd(member).await? {
            Some(true) => Ok(None),
            _ => wait(
                reasons::ETCD_LEAVE_UNVERIFIED,
                format!("no peer confirms member {member:016x} is gone yet"),
            )
            .map(Some),
        }
    }

    async fn tombstone(&self, member: Option<u64>) -> Result<(), Error> {
        let clusters: Api<TalosCluster> = Api::namespaced(
            self.ctx.client.clone(),
            &self.cluster.namespace().unwrap_or_default(),
        );
        loop {
            let Some(fresh) = clusters.get_opt(&self.cluster.name_any()).await? else {
                return Ok(());
            };
            let mut stones = fresh
                .status
                .as_ref()
                .map(|s| s.tombstones.list.clone())
                .unwrap_or_default();
            if stones.iter().any(|t| t.address == self.address) {
                return Ok(());
            }
            stones.push(Tombstone {
                machine: self.machine.name_any(),
                address: self.address.clone(),
                etcd_member_id: member.map(|m| format!("{m:016x}")),
                uuid: crate::identity::recorded_uuid(self.machine),
                removed_at: self.ctx.now(),
            });
            let mut status = fresh.status.clone().unwrap_or_default();
            status.tombstones.list = stones;
            match status::apply::<ClusterTombstones, _>(&clusters, &fresh, &status, Guard::Version)
                .await
            {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.is_conflict() => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    async fn reset(&self) -> Result<Step, Error> {
        if self
            .status
            .removal
            .progress
            .as_ref()
            .is_some_and(|r| r.reset_skipped)
        {
            return done("reset skipped (force removal)");
        }
        match TalosClient::connect(&self.address, &self.credentials).await {
            Ok(client) => match self.identified(&client).await? {
                Some(not_sent) => Ok(not_sent),
                None => self.send_reset(&client).await,
            },
            Err(error) => self.reset_unreachable(&error.to_string()).await,
        }
    }

    /// Before the reset: whether the node is the machine (its SMBIOS UUID, ADR 0052). `Some`
    /// is the step when it is not told to be, or does not tell: a wait, or with the force
    /// annotation the reset skipped and a tombstone left for the machine.
    async fn identified(&self, client: &TalosClient) -> Result<Option<Step>, Error> {
        match crate::identity::check_machine(client, self.machine, &self.address, "reset").await {
            Checked::Verified => Ok(None),
            // With the force annotation, a node that does not tell its UUID counts as one that
            // does not answer: its reset is skipped.
            Checked::Unread(message) if self.force => {
                self.reset_unreachable(&message).await.map(Some)
            }
            Checked::Refused(refusal) if self.force => {
                self.tombstone(self.recorded_member()).await?;
                Ok(Some(Step::Done {
                    message: format!(
                        "{refusal}; its reset was SKIPPED ({}), and a tombstone resets the machine if it answers there again",
                        annotations::FORCE_REMOVE
                    ),
                    reset_skipped: true,
                }))
            }
            // Anything but `Verified` holds.
            other => Ok(other.hold().map(Step::Wait)),
        }
    }

    /// Sends the reset to the machine's node, or finds it done already.
    async fn send_reset(&self, client: &TalosClient) -> Result<Step, Error> {
        match client
            .reset(ResetOptions {
                graceful: false,
                reboot: true,
            })
            .await
        {
            Ok(()) => {
                done("reset (STATE and EPHEMERAL wiped); the node reboots into maintenance mode")
            }
            Err(error) => {
                if crate::in_maintenance(&self.address, self.ctx.settings.sweep)
                    .await
                    .is_some()
                {
                    return done("already reset: the node answers in maintenance mode");
                }
                wait(reasons::RESET_FAILED, format!("the reset failed: {error}"))
            }
        }
    }

    /// The node did not answer for its reset (`error`): done if it is back in maintenance
    /// mode, skipped with the force annotation, else a wait.
    async fn reset_unreachable(&self, error: &str) -> Result<Step, Error> {
        // A reset sent before a restart: the node is back in maintenance mode.
        if crate::in_maintenance(&self.address, self.ctx.settings.sweep)
            .await
            .is_some()
        {
            return done("already reset: the node answers in maintenance mode");
        }
        if self.force {
            self.tombstone(self.recorded_member()).await?;
            return Ok(Step::Done {
                message: format!(
                    "{} is unreachable: its reset was SKIPPED ({}), and a tombstone resets it if it answers again",
                    self.address,
                    annotations::FORCE_REMOVE
                ),
                reset_skipped: true,
            });
        }
        wait(
            reasons::NODE_UNREACHABLE,
            format!(
                "{} does not answer for its reset: {error}; set {}=true to skip the reset",
                self.address,
                annotations::FORCE_REMOVE
            ),
        )
    }

    async fn delete_node(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("Node deletion skipped: the cluster is being deleted");
        }
        let outcome = self.node().delete().await?;
        self.workload_step(RemovalStep::NodeDeleted, outcome).await
    }
}

impl From<workload::Outcome> for Step {
    fn from(outcome: workload::Outcome) -> Self {
        match outcome {
            workload::Outcome::Done(message) => Self::Done {
                message,
                reset_skipped: false,
            },
            workload::Outcome::Wait(stop) => Self::Wait(stop),
            workload::Outcome::Unreachable(detail) => Self::Wait(Stop::new(
                reasons::WORKLOAD_API_UNREACHABLE,
                format!("the workload cluster's API does not answer: {detail}"),
            )),
        }
    }
}

/// The last step: the reservation and the lock go, then the finalizer.
async fn finish(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    holder: &LockHolder,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let uid = machine.uid().unwrap_or_default();
    let reservations: Vec<_> = ichor_api::reservation::reservations(cluster)
        .into_iter()
        .filter(|r| r.uid != uid)
        .collect();
    Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::REMOVAL_RESERVATIONS: ichor_api::reservation::annotation_value(&reservations)}}})),
        )
        .await?;
    lock::release(ctx, cluster, holder).await?;
    release_finalizer(ctx, machine).await
}

/// Addresses of the other configured control planes of the machine's cluster.
async fn peer_addresses(ctx: &Context, machine: &TalosMachine) -> Result<Vec<String>, Error> {
    Ok(machines_api(ctx, machine)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|m| {
            m.spec.cluster_ref.name == machine.spec.cluster_ref.name
                && m.name_any() != machine.name_any()
                && m.spec.role == Some(Role::ControlPlane)
                && m.metadata.deletion_timestamp.is_none()
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.applied.config_hash.is_some())
        })
        .filter_map(|m| m.status.and_then(|s| s.inventory.address))
        .collect())
}

#[cfg(test)]
mod tests {
    use ichor_api::TalosMachineSpec;
    use ichor_deleteguard::{Justification, Leave, Refusal, Wait};

    use super::*;

    /// A machine with `uid`, its removal finalizer set or not, configured or not.
    fn machine(uid: &str, finalizer: bool, configured: bool) -> TalosMachine {
        let mut machine = TalosMachine::new("m", TalosMachineSpec::pending("c", "10.0.0.1", "f"));
        machine.metadata.uid = Some(uid.into());
        machine.metadata.finalizers =
            finalizer.then(|| vec![finalizers::MACHINE_REMOVAL.to_owned()]);
        machine.status = Some(TalosMachineStatus {
            applied: ichor_api::machine::MachineApplied {
                config_hash: configured.then(|| "h".to_owned()),
            },
            ..TalosMachineStatus::default()
        });
        machine
    }

    /// The planner's go-ahead on deleting `m`.
    fn proceed() -> Verdict {
        Verdict::Proceed(Justification {
            target: "m".into(),
            action: "deleting",
            voters: 3,
            voters_after: 2,
            healthy_left: 2,
            declared: 3,
            leave: Leave::Graceful,
            teardown: false,
        })
    }

    #[test]
    fn a_removal_runs_only_for_the_same_machine_still_holding_its_finalizer() {
        let cached = machine("u1", true, true);
        assert!(matches!(entry(&cached, None), Entry::Idle), "gone");
        assert!(
            matches!(entry(&cached, Some(machine("u2", true, true))), Entry::Idle),
            "a new machine of the same name is not this removal's"
        );
        assert!(
            matches!(
                entry(&cached, Some(machine("u1", false, true))),
                Entry::Idle
            ),
            "finalizer already released"
        );
        assert!(matches!(
            entry(&cached, Some(machine("u1", true, true))),
            Entry::Undo(_)
        ));
    }

    #[test]
    fn a_machine_never_configured_only_releases_its_finalizer() {
        let cached = machine("u1", true, true);
        assert!(matches!(
            entry(&cached, Some(machine("u1", true, false))),
            Entry::Release(_)
        ));
        let mut bare = machine("u1", true, false);
        bare.status = None;
        assert!(matches!(entry(&cached, Some(bare)), Entry::Release(_)));
    }

    #[test]
    fn the_planner_is_asked_at_the_start_and_right_before_the_etcd_leave() {
        let asked = |role| {
            let mut done = RemovalStep::Pending;
            let mut stages = Vec::new();
            while done != RemovalStep::Complete {
                let next = next_removal_step(done, role);
                if let Some(stage) = planner_stage(done, next) {
                    stages.push((next, stage));
                }
                done = next;
            }
            stages
        };
        assert_eq!(
            asked(Role::ControlPlane),
            [
                (RemovalStep::Cordoned, Stage::Run),
                (RemovalStep::EtcdLeft, Stage::Act)
            ]
        );
        assert_eq!(asked(Role::Worker), [(RemovalStep::Cordoned, Stage::Run)]);
    }

    #[test]
    fn a_go_ahead_announces_the_start_once() {
        let Recheck::Starts(message) = recheck(&proceed(), Stage::Run) else {
            panic!("a removal cleared at the start starts");
        };
        assert!(
            message.starts_with("the removal starts: deleting talosmachine m"),
            "{message}"
        );
        assert_eq!(recheck(&proceed(), Stage::Act), Recheck::Continues);
    }

    #[test]
    fn a_hold_at_the_start_lets_the_lock_go_and_one_before_the_leave_keeps_it() {
        let refused = Verdict::Refuse(Refusal::LastControlPlane {
            name: "m".into(),
            cluster: "c".into(),
        });
        assert_eq!(
            recheck(&refused, Stage::Run),
            Recheck::Holds {
                reason: reasons::LAST_CONTROL_PLANE,
                message: refused.message().unwrap_or_default(),
                release_lock: true,
            }
        );
        let waits = Verdict::Wait(Wait::TeardownWorkersFirst {
            name: "m".into(),
            workers: 2,
        });
        assert_eq!(
            recheck(&waits, Stage::Act),
            Recheck::Holds {
                reason: reasons::TEARDOWN_WORKERS_FIRST,
                message: waits.message().unwrap_or_default(),
                release_lock: false,
            }
        );
    }

    #[test]
    fn a_step_done_is_recorded_with_a_normal_event_and_the_node_delete_finishes() {
        for (next, finishes) in [
            (RemovalStep::Cordoned, false),
            (RemovalStep::EtcdLeft, false),
            (RemovalStep::Reset, false),
            (RemovalStep::NodeDeleted, true),
            (RemovalStep::Complete, true),
        ] {
            assert_eq!(
                completion(next, false, None),
                Completion {
                    step: next,
                    reset_skipped: false,
                    skipped: false,
                    event_type: EventType::Normal,
                    reason: reasons::REMOVAL,
                    finishes,
                },
                "{next:?}"
            );
        }
    }

    #[test]
    fn a_skipped_reset_is_recorded_as_the_reset_step_with_a_warning() {
        for next in [RemovalStep::EtcdLeft, RemovalStep::Reset] {
            assert_eq!(
                completion(next, true, None),
                Completion {
                    step: RemovalStep::Reset,
                    reset_skipped: true,
                    skipped: false,
                    event_type: EventType::Warning,
                    reason: reasons::RESET_SKIPPED,
                    finishes: false,
                },
                "{next:?}"
            );
        }
    }

    #[test]
    fn a_skipped_workload_step_is_recorded_done_and_skipped_with_a_warning() {
        for (next, finishes) in [
            (RemovalStep::Cordoned, false),
            (RemovalStep::Drained, false),
            (RemovalStep::NodeDeleted, true),
        ] {
            let reason = if next == RemovalStep::NodeDeleted {
                reasons::NODE_DELETE_DEFERRED
            } else {
                reasons::NODE_STEP_SKIPPED
            };
            let done = completion(next, false, Some(reason));
            assert_eq!(
                done,
                Completion {
                    step: next,
                    reset_skipped: false,
                    skipped: true,
                    event_type: EventType::Warning,
                    reason,
                    finishes,
                },
                "{next:?}"
            );
            let mut status = TalosMachineStatus::default();
            let at = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            note_skips(&mut status, &done, "skipped", at.clone());
            note_skips(&mut status, &done, "skipped", at.clone());
            let removal = status.removal.progress.expect("progress");
            assert_eq!(
                removal.skipped,
                [SkippedStep {
                    step: next,
                    reason: reasons::WORKLOAD_API_UNREACHABLE.to_owned(),
                    message: "skipped".to_owned(),
                    at,
                }],
                "recorded once"
            );
            assert!(!removal.reset_skipped);
        }
    }

    #[test]
    fn a_step_done_notes_no_skip() {
        let mut status = TalosMachineStatus::default();
        let at = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        note_skips(
            &mut status,
            &completion(RemovalStep::Drained, false, None),
            "m",
            at,
        );
        assert!(status.removal.progress.is_none());
    }
}
