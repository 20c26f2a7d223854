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
//!
//! `advance` is the flow: it reads in `observe.rs`, decides in `plan.rs`, writes in `act.rs`.

use ichor_api::cluster::LockHolder;
use ichor_api::common::Role;
use ichor_api::machine::{RemovalStep, TalosMachineStatus};
use ichor_api::names::{annotations, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Disruption, next_removal_step};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::Action;

use crate::{Context, Error, Stop, secrets, workload};
use plan::Entry;

mod act;
mod observe;
mod plan;

fn machines_api(ctx: &Context, machine: &TalosMachine) -> Api<TalosMachine> {
    Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default())
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

    /// The workload side of this machine's node.
    fn node(&self) -> workload::NodeSteps<'_> {
        workload::NodeSteps {
            ctx: self.ctx,
            cluster: &self.cluster,
            machine: self.machine,
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
}

/// Drives a deleted machine's removal one step per reconcile.
pub async fn advance(ctx: &Context, cached: &TalosMachine) -> Result<Action, Error> {
    // The cache lags this manager's own writes: a removal decides on the machine as stored now.
    // A removal that has just finished (its finalizer released, the object gone) must never
    // run again from a stale copy: it would take the cluster lock for a machine that no longer
    // exists, and every other action would wait for that hold to expire.
    let fresh = observe::read_stored(ctx, cached).await?;
    let machine = match plan::entry(cached, fresh) {
        Entry::Idle => return Ok(Action::await_change()),
        Entry::Release(machine) => {
            act::release_finalizer(ctx, &machine).await?;
            return Ok(Action::await_change());
        }
        Entry::Undo(machine) => machine,
    };
    let machine = &machine;
    let Some(cluster) = observe::read_cluster(ctx, machine).await? else {
        act::release_finalizer(ctx, machine).await?;
        return Ok(Action::await_change());
    };
    let status = machine.status.clone().unwrap_or_default();
    let holder = holder(machine);
    let (next, credentials) = match admit(ctx, machine, &cluster, &status, &holder).await? {
        Admission::Go { next, credentials } => (next, credentials),
        Admission::Hold(stop) => return act::waiting(ctx, machine, status, stop).await,
    };
    let scene = Scene::new(ctx, machine, cluster, status, credentials);
    let outcome = scene.run(next).await?;
    scene.conclude(outcome, next, &holder).await
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
    let outcome = act::take_lock(ctx, machine, cluster, &all, holder, done_step).await?;
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
    if let Some(stage) = plan::planner_stage(done_step, next) {
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
        let recheck = plan::recheck(&verdict, stage);
        if let Some(hold) = act::answer(ctx, machine, cluster, holder, recheck).await? {
            return Ok(hold);
        }
    }
    Ok(Admission::Go { next, credentials })
}

/// The lock holder of a machine's removal.
pub fn holder(machine: &TalosMachine) -> LockHolder {
    LockHolder::Removal(machine.uid().unwrap_or_default())
}
