//! What a removal writes, one step at a time and recorded: its progress and phase, its wait
//! (`RemovalApproved` and a Warning), the cluster lock, each step's calls to the workload
//! cluster (cordon, drain, Node delete) and to Talos (etcd leave, removal through a peer,
//! reset), tombstones, the reservation and the finalizer. A step's reads that tell its next
//! call (is the node the machine, did the member leave) run within the step, in its order.

use std::time::Duration;

use ichor_api::cluster::{ClusterTombstones, LockHolder, Tombstone};
use ichor_api::machine::{
    MachineLifecycle, MachinePhase, MachineRemoval, RemovalProgress, RemovalStep,
    TalosMachineStatus,
};
use ichor_api::names::{actions, annotations, conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Machine, removal_completes_transition};
use ichor_talos::{ResetOptions, TalosClient};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use super::plan::{self, Recheck, Step, Unreached, completion, note_skips};
use super::{Scene, observe};
use crate::identity::Checked;
use crate::infra::status::{self, Guard};
use crate::{Context, Error, Stop, lock, workload};

/// Releases the machine's removal finalizer, its claim on its node first.
pub(super) async fn release_finalizer(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    // Its removal done, the machine's claim on its node goes first (ADR 0054).
    crate::claims::release(&ctx.client, machine).await?;
    crate::infra::finalizer::remove(
        &super::machines_api(ctx, machine),
        machine,
        finalizers::MACHINE_REMOVAL,
    )
    .await
}

/// Records the removal at `step` with `message` (its progress, and the phase `Removing`).
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
    let api = super::machines_api(ctx, machine);
    status::apply::<MachineRemoval, _>(&api, machine, &status, Guard::None).await?;
    status::apply::<MachineLifecycle, _>(&api, machine, &status, Guard::None).await?;
    Ok(status)
}

/// Records a removal that waits: `RemovalApproved` false and the removal's message say why,
/// with a Warning Event when the message is new.
pub(super) async fn waiting(
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

/// A step done, saying `message`.
fn done(message: impl Into<String>) -> Result<Step, Error> {
    Ok(Step::Done {
        message: message.into(),
        reset_skipped: false,
    })
}

/// A step that waits for `reason`, saying `message`.
fn wait(reason: &'static str, message: impl Into<String>) -> Result<Step, Error> {
    Ok(Step::Wait(Stop::new(reason, message)))
}

/// Tries the cluster lock for this removal, `done_step` being the last step recorded.
pub(super) async fn take_lock(
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

/// Acts on the planner's answer: the start's Event, or the hold (`Some`).
pub(super) async fn answer(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    holder: &LockHolder,
    recheck: Recheck,
) -> Result<Option<super::Admission>, Error> {
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
        Recheck::Holds { stop, release_lock } => {
            if release_lock {
                // Not ours to go yet: let other actions have the lock meanwhile.
                lock::release(ctx, cluster, holder).await?;
            }
            Ok(Some(super::Admission::Hold(stop)))
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

impl Scene<'_> {
    /// Runs the step `next`.
    pub(super) async fn run(&self, next: RemovalStep) -> Result<Step, Error> {
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
    pub(super) async fn conclude(
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

    /// Cordons the machine's Node (skipped while the cluster is torn down).
    async fn cordon(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("cordon skipped: the cluster is being deleted");
        }
        let outcome = self.node().cordon().await?;
        self.workload_step(RemovalStep::Cordoned, outcome).await
    }

    /// Drains the machine's Node (skipped while the cluster is torn down).
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

    /// Leaves etcd from the node itself, verified through a peer; a node or a member that
    /// does not answer is removed through a peer only with the force annotation.
    async fn leave_etcd(&self) -> Result<Step, Error> {
        let peers_left = !observe::peer_addresses(self.ctx, self.machine)
            .await?
            .is_empty();
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

    /// Records a tombstone for the machine's address on its cluster: a node that answers there
    /// again is reset.
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

    /// Resets the node (STATE and EPHEMERAL, then a reboot), once it is told to be the machine.
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

    /// Deletes the machine's Node (skipped while the cluster is torn down).
    async fn delete_node(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("Node deletion skipped: the cluster is being deleted");
        }
        let outcome = self.node().delete().await?;
        self.workload_step(RemovalStep::NodeDeleted, outcome).await
    }
}
