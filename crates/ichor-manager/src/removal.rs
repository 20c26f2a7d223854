//! Removing a machine: the finalizer's work. A never-configured machine has nothing to undo.
//! A configured one is removed inside the cluster lock, step by recorded step, so a restart
//! resumes at the step reached: recheck (ichor-deleteguard), cordon and drain its Node in the
//! workload cluster, leave etcd (a failed leave stops the removal), verify through a peer,
//! reset naming STATE and EPHEMERAL with a reboot, delete the Node, release the finalizer.

use std::time::Duration;

use ichor_api::cluster::{LockHolder, Tombstone};
use ichor_api::common::Role;
use ichor_api::machine::{MachinePhase, RemovalProgress, RemovalStep, TalosMachineStatus};
use ichor_api::names::{actions, annotations, conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Disruption, Machine, Stage, Verdict};
use ichor_deleteguard::{next_removal_step, removal_completes_transition};
use ichor_talos::{ResetOptions, TalosClient};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use crate::{Context, Error, conditions as cond, lock, secrets, workload};

fn machines_api(ctx: &Context, machine: &TalosMachine) -> Api<TalosMachine> {
    Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default())
}

async fn release_finalizer(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    crate::finalizer::remove(
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
    let progress = status.removal.get_or_insert_with(|| RemovalProgress {
        started_at: Some(ctx.now()),
        ..Default::default()
    });
    progress.step = step;
    progress.message = Some(message);
    status.phase = MachinePhase::Removing;
    crate::status::write(&machines_api(ctx, machine), machine, &status).await?;
    Ok(status)
}

async fn waiting(
    ctx: &Context,
    machine: &TalosMachine,
    status: TalosMachineStatus,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let mut status = status;
    let step = status.removal.as_ref().map(|r| r.step).unwrap_or_default();
    let first =
        status.removal.as_ref().and_then(|r| r.message.as_deref()) != Some(message.as_str());
    cond::set(
        &mut status.conditions,
        conditions::REMOVAL_APPROVED,
        false,
        reason,
        message.clone(),
        machine.metadata.generation,
        &ctx.now(),
    );
    record(ctx, machine, status, step, message.clone()).await?;
    if first {
        tracing::info!(machine = %machine.name_any(), reason, %message, "removal waits");
        ctx.event(
            machine,
            EventType::Warning,
            reason,
            actions::REMOVE,
            message,
        )
        .await;
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
    Wait {
        reason: String,
        message: String,
    },
}

fn done(message: impl Into<String>) -> Result<Step, Error> {
    Ok(Step::Done {
        message: message.into(),
        reset_skipped: false,
    })
}

fn wait(reason: &str, message: impl Into<String>) -> Result<Step, Error> {
    Ok(Step::Wait {
        reason: reason.to_owned(),
        message: message.into(),
    })
}

/// Drives a deleted machine's removal one step per reconcile.
pub async fn reconcile(ctx: &Context, cached: &TalosMachine) -> Result<Action, Error> {
    // The cache lags this manager's own writes: a removal decides on the machine as stored now.
    // A removal that has just finished (its finalizer released, the object gone) must never
    // run again from a stale copy: it would take the cluster lock for a machine that no longer
    // exists, and every other action would wait for that hold to expire.
    let Some(machine) = machines_api(ctx, cached)
        .get_opt(&cached.name_any())
        .await?
        .filter(|fresh| fresh.uid() == cached.uid())
    else {
        return Ok(Action::await_change());
    };
    let machine = &machine;
    if !crate::finalizer::has(machine, finalizers::MACHINE_REMOVAL) {
        return Ok(Action::await_change());
    }
    let status = machine.status.clone().unwrap_or_default();
    let namespace = machine.namespace().unwrap_or_default();
    let cluster_name = machine.spec.cluster_ref.name.clone();
    let holder = holder(machine);
    // Never configured: nothing to undo on the node.
    if status.applied_config_hash.is_none() {
        release_finalizer(ctx, machine).await?;
        return Ok(Action::await_change());
    }
    let clusters: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(cluster) = clusters.get_opt(&cluster_name).await? else {
        release_finalizer(ctx, machine).await?;
        return Ok(Action::await_change());
    };
    let all = crate::cluster_machines(ctx, &cluster).await?;
    let inputs: Vec<Machine> = all.iter().map(Machine::from).collect();
    let target = Machine::from(machine);
    let guard_cluster = Cluster::from(&cluster);
    let moving = lock::transitioning(&cluster, &all);
    let done_step = status.removal.as_ref().map(|r| r.step).unwrap_or_default();
    let completes = removal_completes_transition(done_step, &target, &inputs, &guard_cluster);
    // One disruptive action per cluster: the lock's holder is this removal.
    let outcome = lock::acquire(ctx, &cluster, &holder, moving, completes).await?;
    if !outcome.held() {
        return waiting(
            ctx,
            machine,
            status,
            reasons::WAITING_FOR_LOCK,
            outcome.message(),
        )
        .await;
    }
    let role = machine.spec.role.unwrap_or(Role::Worker);
    let next = next_removal_step(done_step, role);
    let bundle = match secrets::bundle(&ctx.client, &cluster).await? {
        Ok(b) => b,
        Err(problem) => {
            return waiting(ctx, machine, status, problem.reason(), problem.to_string()).await;
        }
    };
    let credentials = crate::credentials(&bundle)?;
    // The planner decides before the removal starts and again right before the etcd leave.
    let stage = match (done_step, next) {
        (RemovalStep::Pending, _) => Some(Stage::Run),
        (_, RemovalStep::EtcdLeft) => Some(Stage::Act),
        _ => None,
    };
    if let Some(stage) = stage {
        let verdict = crate::observe::plan(
            ctx,
            machine,
            &cluster,
            &all,
            &credentials,
            &Disruption::Delete,
            stage,
        )
        .await?;
        match verdict {
            Verdict::Proceed(why) if stage == Stage::Run => {
                ctx.event(
                    machine,
                    EventType::Normal,
                    reasons::REMOVAL,
                    actions::REMOVE,
                    format!("the removal starts: {why}"),
                )
                .await;
            }
            Verdict::Proceed(_) => {}
            verdict => {
                let reason = verdict.reason().unwrap_or(reasons::QUORUM_AT_RISK);
                let message = verdict.message().unwrap_or_default();
                if stage == Stage::Run {
                    // Not ours to go yet: let other actions have the lock meanwhile.
                    lock::release(ctx, &cluster, &holder).await?;
                }
                return waiting(ctx, machine, status, reason, message).await;
            }
        }
    }
    let scene = Scene {
        ctx,
        machine,
        teardown: cluster.metadata.deletion_timestamp.is_some(),
        cluster,
        address: crate::machine::address(machine).unwrap_or_default(),
        credentials,
        force: machine
            .annotations()
            .get(annotations::FORCE_REMOVE)
            .map(String::as_str)
            == Some(annotations::TRUE),
        status,
    };
    let outcome = match next {
        RemovalStep::Cordoned => scene.cordon().await?,
        RemovalStep::Drained => scene.drain().await?,
        RemovalStep::EtcdLeft => scene.leave_etcd().await?,
        RemovalStep::Reset => scene.reset().await?,
        RemovalStep::NodeDeleted => scene.delete_node().await?,
        RemovalStep::Pending | RemovalStep::Complete => done("done")?,
    };
    let Scene {
        cluster,
        mut status,
        ..
    } = scene;
    match outcome {
        Step::Wait { reason, message } => waiting(ctx, machine, status, &reason, message).await,
        Step::Done {
            message,
            reset_skipped,
        } => {
            let mut next = next;
            if reset_skipped {
                // The node could not be reset: the Reset step is recorded as skipped.
                next = RemovalStep::Reset;
                if let Some(progress) = status.removal.as_mut() {
                    progress.reset_skipped = true;
                } else {
                    status.removal = Some(RemovalProgress {
                        started_at: Some(ctx.now()),
                        reset_skipped: true,
                        ..Default::default()
                    });
                }
                ctx.event(
                    machine,
                    EventType::Warning,
                    reasons::RESET_SKIPPED,
                    actions::REMOVE,
                    message.clone(),
                )
                .await;
            } else {
                ctx.event(
                    machine,
                    EventType::Normal,
                    reasons::REMOVAL,
                    actions::REMOVE,
                    message.clone(),
                )
                .await;
            }
            tracing::info!(machine = %machine.name_any(), step = ?next, %message, "removal step done");
            record(ctx, machine, status, next, message).await?;
            if matches!(next, RemovalStep::NodeDeleted | RemovalStep::Complete) {
                finish(ctx, machine, &cluster, &holder).await?;
                return Ok(Action::await_change());
            }
            Ok(Action::requeue(Duration::from_millis(50)))
        }
    }
}

/// The lock holder of a machine's removal.
pub fn holder(machine: &TalosMachine) -> LockHolder {
    LockHolder::Removal(machine.uid().unwrap_or_default())
}

impl Scene<'_> {
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
        Ok(self.node().cordon().await?.into())
    }

    async fn drain(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("drain skipped: the cluster is being deleted");
        }
        Ok(self.node().drain().await?.into())
    }

    /// The member id recorded while the machine was followed.
    fn recorded_member(&self) -> Option<u64> {
        self.status
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
                .map(|s| s.tombstones.clone())
                .unwrap_or_default();
            if stones.iter().any(|t| t.address == self.address) {
                return Ok(());
            }
            stones.push(Tombstone {
                machine: self.machine.name_any(),
                address: self.address.clone(),
                etcd_member_id: member.map(|m| format!("{m:016x}")),
                removed_at: self.ctx.now(),
            });
            let mut status = fresh.status.clone().unwrap_or_default();
            status.tombstones = stones;
            match crate::status::write_checked(&clusters, &fresh, &status).await {
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
            .as_ref()
            .is_some_and(|r| r.reset_skipped)
        {
            return done("reset skipped (force removal)");
        }
        match TalosClient::connect(&self.address, &self.credentials).await {
            Ok(client) => match client
                .reset(ResetOptions {
                    graceful: false,
                    reboot: true,
                })
                .await
            {
                Ok(()) => done(
                    "reset (STATE and EPHEMERAL wiped); the node reboots into maintenance mode",
                ),
                Err(error) => {
                    if crate::in_maintenance(&self.address, self.ctx.settings.sweep)
                        .await
                        .is_some()
                    {
                        return done("already reset: the node answers in maintenance mode");
                    }
                    wait(reasons::RESET_FAILED, format!("the reset failed: {error}"))
                }
            },
            Err(error) => {
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
        }
    }

    async fn delete_node(&self) -> Result<Step, Error> {
        if self.teardown {
            return done("Node deletion skipped: the cluster is being deleted");
        }
        Ok(self.node().delete().await?.into())
    }
}

impl From<workload::Outcome> for Step {
    fn from(outcome: workload::Outcome) -> Self {
        match outcome {
            workload::Outcome::Done(message) => Self::Done {
                message,
                reset_skipped: false,
            },
            workload::Outcome::Wait { reason, message } => Self::Wait {
                reason: reason.to_owned(),
                message,
            },
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
                    .is_some_and(|s| s.applied_config_hash.is_some())
        })
        .filter_map(|m| m.status.and_then(|s| s.address))
        .collect())
}
