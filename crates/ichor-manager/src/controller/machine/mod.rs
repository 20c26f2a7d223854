//! The machine reconciler: from approved to Ready. Pending and rejected machines are never
//! contacted (discovery's reads are all they get). An approved machine is checked (version,
//! hardware, pin), gets its config over the pinned maintenance connection, and is then
//! followed over mutual TLS; drift is applied live with `NO_REBOOT`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, MachinePhase, TalosMachineStatus};
use ichor_api::names::controllers;
use ichor_api::names::{conditions, reasons, secrets as secret_names};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::Rendered;
use ichor_talos::{TalosClient, TalosError};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::controller::cluster;
use crate::infra::shared::Changes;
use crate::{Context, Error, infra::conditions as cond};

mod act;
pub(crate) mod bmc;
mod drift;
mod kubernetes;
mod observe;
mod pacing;
pub(crate) mod plan;
pub mod removal;
mod upgrade;

pub(crate) use act::{forget_config, patch_status};
pub use drift::drift_holder;
pub use pacing::Looks;
pub(crate) use pacing::lock;
pub use upgrade::upgrade_holder;

use plan::{Blocked, DriftStep, InstallVerdict, NodeView, standing};

/// The machines of cluster `cluster` in `namespace`, from the machine cache: what a change of
/// one of its classes or storages re-renders.
fn machines_of(
    known: &kube::runtime::reflector::Store<TalosMachine>,
    namespace: Option<String>,
    cluster: &str,
) -> Vec<ObjectRef<TalosMachine>> {
    known
        .state()
        .into_iter()
        .filter(|m| m.spec.cluster_ref.name == cluster && m.namespace() == namespace)
        .map(|m| ObjectRef::from_obj(&*m))
        .collect()
}

/// What each cluster's machines were last woken for ([`cluster::machines_see`]'s digest, by
/// namespace and name): a cluster event that changes none of it wakes no machine (ADR 0029).
#[derive(Debug, Default)]
struct Woken(Mutex<BTreeMap<(Option<String>, String), u64>>);

impl Woken {
    /// Whether `cluster`'s machines are to be woken: its digest differs from the last one
    /// they were woken for (which it then becomes).
    fn again(&self, cluster: &TalosCluster) -> bool {
        let digest = cluster::machines_see(cluster);
        let key = (cluster.namespace(), cluster.name_any());
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.insert(key, digest) != Some(digest)
    }
}

/// The TalosMachine controller: a change of its cluster (patches, versions), of a class or of
/// a storage of its cluster (patches, volumes) re-renders each machine of that cluster; a
/// machine whose drift turn ends, or that becomes Ready, wakes the machines queued behind it.
pub(crate) async fn run_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let client = ctx.client.clone();
    // The machines from the manager's one machine watch (`Context::machines`).
    let controller = Controller::for_shared_stream(
        ctx.machines.subscribe(Changes::Applied),
        ctx.machines.store(),
    );
    // The machine gauge is counted from this cache at scrape time: a deleted machine leaves
    // it, so it leaves the gauge.
    ctx.metrics.watch_machines(ctx.machines.store());
    let (by_cluster, by_class, by_storage) = (
        ctx.machines.store(),
        ctx.machines.store(),
        ctx.machines.store(),
    );
    let woken = Woken::default();
    let (wake_c, wake_m, wake_s) = (Arc::clone(&ctx), Arc::clone(&ctx), Arc::clone(&ctx));
    let controller = controller
        // The looks one machine asks of others: the end of a drift turn wakes the machines
        // queued behind it (ADR 0043).
        .reconcile_on(ctx.looks.asked())
        .watches_shared_stream(
            ctx.clusters.subscribe(Changes::Touched),
            move |c: Arc<TalosCluster>| {
                if !woken.again(&c) {
                    return Vec::new();
                }
                wake_c.woke(machines_of(&by_cluster, c.namespace(), &c.name_any()))
            },
        )
        .watches(
            Api::<ichor_api::TalosMachineClass>::all(client.clone()),
            watcher::Config::default(),
            move |c: ichor_api::TalosMachineClass| {
                wake_m.woke(machines_of(
                    &by_class,
                    c.namespace(),
                    &c.spec.cluster_ref.name,
                ))
            },
        )
        .watches(
            Api::<ichor_api::TalosStorage>::all(client),
            watcher::Config::default(),
            move |s: ichor_api::TalosStorage| {
                wake_s.woke(machines_of(
                    &by_storage,
                    s.namespace(),
                    &s.spec.cluster_ref.name,
                ))
            },
        );
    crate::infra::drive::drive(controllers::MACHINE, controller, reconcile, ctx, stop).await;
}

/// Reconciles one TalosMachine: an echo of its own last look waits for that look's due time
/// (counted apart, as skipped); any other reconcile looks.
pub async fn reconcile(machine: Arc<TalosMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    if let Some(wait) = ctx.looks.echo(&machine, std::time::Instant::now()) {
        ctx.metrics.skipped("TalosMachine");
        return Ok(Action::requeue(wait));
    }
    let seen = (plan::looked_at(&machine), plan::standing_at(&machine));
    let progress = ctx.settings.progress_requeue;
    let looked = look(&machine, &ctx).await;
    ctx.looks.look_ended(&machine);
    match looked {
        Ok(action) => Ok(ctx.looks.record(&machine, seen, action, progress)),
        Err(error) => {
            ctx.looks
                .record(&machine, seen, Action::await_change(), progress);
            Err(error)
        }
    }
}

/// One look at a TalosMachine.
async fn look(machine: &Arc<TalosMachine>, ctx: &Arc<Context>) -> Result<Action, Error> {
    let (machine, ctx) = (Arc::clone(machine), Arc::clone(ctx));
    let started = std::time::Instant::now();
    if machine.metadata.deletion_timestamp.is_some() {
        let result = removal::advance(&ctx, &machine).await;
        ctx.metrics.reconciled("TalosMachine", started.elapsed());
        if result.is_ok() {
            ctx.reconciled_ok(&*machine);
        }
        return result;
    }
    let result = match machine.spec.approval_state {
        ApprovalState::Pending => {
            act::set_phase(&ctx, &machine, MachinePhase::Pending).await?;
            Ok(Action::await_change())
        }
        ApprovalState::Rejected => {
            // A rejected machine releases the claim it may hold (ADR 0054), once.
            if machine.status.as_ref().map(|s| s.lifecycle.phase) != Some(MachinePhase::Rejected) {
                crate::claims::release(&ctx.client, &machine).await?;
            }
            act::set_phase(&ctx, &machine, MachinePhase::Rejected).await?;
            Ok(Action::await_change())
        }
        ApprovalState::Approved => approved(&machine, &ctx).await,
    };
    // The BMC, read after the rest and whatever came of it: its failures are its own.
    // Boxed, as the lock's steps are (ADR 0078): its state stays off the reconcile's stack.
    let result = match result {
        Ok(action) => Ok(Box::pin(bmc::look(&ctx, &machine, action)).await),
        Err(error) => {
            Box::pin(bmc::look(&ctx, &machine, Action::await_change())).await;
            Err(error)
        }
    };
    ctx.metrics.reconciled("TalosMachine", started.elapsed());
    if result.is_ok() {
        ctx.reconciled_ok(&*machine);
    }
    result
}

/// An approved machine: observes its cluster and secrets bundle, plans whether it can be
/// configured (role, config, address), then applies its first config or follows it.
async fn approved(machine: &TalosMachine, ctx: &Context) -> Result<Action, Error> {
    let status = machine.status.clone().unwrap_or_default();
    let (cluster, bundle) = match observe::read_cluster_and_bundle(ctx, machine).await? {
        Ok(found) => found,
        Err(stop) => return act::record_blocked(ctx, machine, status, stop).await,
    };
    // The contract never runs ahead of the oldest Talos the cluster's nodes run (§9.9).
    let machines = ctx.machines.store().state();
    let sources = ctx
        .layers
        .sources()
        .await?
        .running(&machines, machine)
        .stepping(&cluster, &machines, machine);
    let (rendered, address) = match plan::configurable(machine, &cluster, &sources, &bundle) {
        Ok(target) => target,
        Err(stop) => return act::record_blocked(ctx, machine, status, stop).await,
    };
    // The namespace's address ranges (ADR 0054), before anything reaches the node: read as
    // stored before the first apply (the rule: nothing is configured outside the ranges), from
    // the watch's cache at a configured machine's looks (ADR 0062).
    let namespace = machine.namespace().unwrap_or_default();
    let read = if status.applied.config_hash.is_none() {
        crate::claims::Read::AsStored
    } else {
        crate::claims::Read::Cached
    };
    if let Some(refused) = crate::claims::address_refused(ctx, &namespace, &address, read).await? {
        let stop = Blocked {
            phase: MachinePhase::Approved,
            stop: refused,
        };
        return act::record_blocked(ctx, machine, status, stop).await;
    }
    let credentials = ctx.node_credentials(&cluster, &bundle)?;
    act::add_removal_finalizer(ctx, machine).await?;
    let reach = Reach {
        address: &address,
        credentials: &credentials,
        bundle: &bundle,
        sources: &sources,
    };
    if status.applied.config_hash.is_none() {
        // The applied config is kept before its hash is recorded: a name another Secret
        // holds stops the first apply before anything reaches the node (ADR 0053).
        let name = applied_config_secret(machine);
        if let Err(taken) =
            crate::secrets::writable(&ctx.client, machine, (&name, APPLIED_WHAT)).await?
        {
            let stop = Blocked::new(
                status.lifecycle.phase,
                reasons::SECRET_NAME_TAKEN,
                taken.to_string(),
            );
            // Looked at again soon, as the cluster does: it goes on once the name is free.
            act::record_stop(ctx, machine, status, stop).await?;
            return Ok(Action::requeue(ctx.settings.progress_requeue));
        }
        if plan::adopted(machine) {
            return adopt_baseline(ctx, machine, status, &reach).await;
        }
        apply_first(ctx, machine, &cluster, status, &rendered, &reach).await
    } else {
        follow(ctx, machine, &cluster, status, &rendered, &reach).await
    }
}

/// An adopted machine's first look: its live config becomes its applied baseline (kept in its
/// applied-config Secret, its hash recorded), read over mutual TLS; nothing is written to the
/// node. Drift from what Ichor renders is then held until the cluster opts in.
async fn adopt_baseline(
    ctx: &Context,
    machine: &TalosMachine,
    status: TalosMachineStatus,
    reach: &Reach<'_>,
) -> Result<Action, Error> {
    match observe::read_live_config(reach).await {
        Ok(live) => act::record_baseline(ctx, machine, &live).await?,
        Err(unread) => {
            return act::record_unreachable(ctx, machine, status, &unread.to_string()).await;
        }
    }
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// The first apply, over the pinned maintenance connection.
async fn apply_first(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: TalosMachineStatus,
    rendered: &Rendered,
    reach: &Reach<'_>,
) -> Result<Action, Error> {
    // The cache can lag our own status writes: never apply twice on a stale view.
    if observe::applied_since(ctx, machine).await? {
        return Ok(Action::requeue(ctx.settings.progress_requeue));
    }
    let pinned = match plan::first_apply_checks(machine, &status, rendered) {
        Ok(pinned) => pinned,
        Err(stop) => return act::record_blocked(ctx, machine, status, stop).await,
    };
    let client = match TalosClient::connect_maintenance(reach.address, &pinned).await {
        Ok(c) => c,
        Err(error) => {
            return not_connected(ctx, machine, status, rendered, reach, &pinned, error).await;
        }
    };
    let version = match client.version().await {
        Ok(v) => v,
        Err(error) => {
            return act::record_unreachable(ctx, machine, status, &error.to_string()).await;
        }
    };
    if let Some(stop) = plan::too_old(&version, &cluster.spec.talos_version) {
        return act::record_blocked(ctx, machine, status, stop).await;
    }
    // The node's own SMBIOS UUID, read over the pinned connection, claimed for this machine
    // alone before anything is written to the node (ADR 0054).
    let inventory = match client.inventory().await {
        Ok(inventory) => inventory,
        Err(error) => {
            return act::record_unreachable(ctx, machine, status, &error.to_string()).await;
        }
    };
    let uuid = &inventory.uuid;
    if let Err(refused) =
        crate::claims::hold(&ctx.client, machine, uuid, &pinned, reach.address).await?
    {
        let stop = Blocked {
            phase: MachinePhase::Approved,
            stop: refused,
        };
        return act::record_blocked(ctx, machine, status, stop).await;
    }
    // The installer's schematic is registered with its factory before the node pulls it
    // (ADR 0067); until the factory takes it, nothing is applied, and it is retried.
    if let Some(stop) = schematic_registered(ctx, cluster, machine, reach.sources, rendered).await {
        let stop = Blocked::new(status.lifecycle.phase, stop.reason, stop.message);
        act::record_stop(ctx, machine, status, stop).await?;
        return Ok(Action::requeue(ctx.settings.progress_requeue));
    }
    // The UUID claimed is the one recorded for the machine (a machine written by hand has
    // none), which every later step over mutual TLS checks the node against (ADR 0052).
    let mut status = status;
    if status.inventory.hardware.as_ref().map(|h| &h.uuid) != Some(uuid) {
        status.inventory.hardware =
            Some(crate::controller::cluster::discovery::hardware(&inventory));
    }
    act::send_first(
        ctx,
        machine,
        status,
        rendered,
        &client,
        version,
        reach.address,
    )
    .await
}

/// The pinned maintenance connection failed: an earlier apply is recorded if the node already
/// answers with this cluster's CA; otherwise another certificate blocks, anything else is
/// reported unreachable.
async fn not_connected(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    rendered: &Rendered,
    reach: &Reach<'_>,
    pinned: &str,
    error: TalosError,
) -> Result<Action, Error> {
    // Before concluding anything, see whether the node is already configured with
    // this cluster's CA: a previous run applied and was interrupted before recording.
    if observe::already_ours(reach.address, reach.credentials).await {
        return act::announce_applied(ctx, machine, status, rendered, ADOPTED.into()).await;
    }
    match error {
        TalosError::FingerprintMismatch { observed, .. } => {
            status.inventory.observed_fingerprint = Some(observed.clone());
            let stop = plan::fingerprint_presented(reach.address, &observed, pinned);
            act::record_blocked(ctx, machine, status, stop).await
        }
        error => act::record_unreachable(ctx, machine, status, &error.to_string()).await,
    }
}

/// After the apply: follows install, boot and join over mutual TLS; applies drift live.
/// Observes the node, plans the drift step, acts on it, then reports where the machine stands.
async fn follow(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: TalosMachineStatus,
    rendered: &Rendered,
    reach: &Reach<'_>,
) -> Result<Action, Error> {
    // Checked by the caller: an approved machine has a role.
    let role = machine.spec.role.unwrap_or(Role::Worker);
    let Some(mut status) = to_decide_on(ctx, machine, cluster, status, rendered).await? else {
        return Ok(Action::await_change());
    };
    let client = crate::connect(reach.address, reach.credentials).await;
    let answers = match &client {
        Some(client) => observe::ask_node(client, role, &status).await,
        None => None,
    };
    plan::record_answers(&mut status, role, answers.as_ref(), ctx.clock.now());
    let view = answers.map(|a| a.view);
    if !cond::is_true(&status.conditions, conditions::INSTALLED)
        && let Some(stopped) =
            install_step(ctx, machine, &mut status, reach, client.as_ref(), view).await?
    {
        return Ok(stopped);
    }
    let boot = drift::observe::read_boot_id_while_rebooting(client.as_ref(), &status).await;
    let step = plan::drift_step(&status, view, boot.as_deref(), &rendered.hash, role);
    let step = plan::hold_adopted(machine, cluster, &mut status, step, &ctx.now());
    let turn_over = step == DriftStep::Back;
    let config_still = matches!(step, DriftStep::Idle | DriftStep::Settled);
    let here = Look {
        machine,
        cluster,
        rendered,
        reach,
    };
    let rolled = drift_act(ctx, &here, step, client.as_ref(), &mut status).await?;
    // The node's Talos, once no config is rolling out to it: upgraded to what the cluster
    // declares, in the same turns (ADR 0068).
    let node = Node {
        client: client.as_ref(),
        view,
        role,
    };
    let turn = upgrade_step(ctx, &here, node, &mut status, config_still).await?;
    // Where a Kubernetes rollout stands on this node (ADR 0070): looked at again soon while the
    // rollout waits on it.
    let stepping_here = kubernetes::look(
        ctx,
        (cluster, machine),
        (role, rendered),
        client.as_ref(),
        &mut status,
    )
    .await?;
    let at = Stand {
        role,
        view,
        address: reach.address,
        rendered,
        turn_queued: rolled == drift::Rolled::Queued || turn == upgrade::Turn::Queued,
    };
    let next = next_step(cluster, &status, rendered, (rolled, turn_over));
    let upgraded = turn == upgrade::Turn::Ended;
    let action = report(ctx, machine, cluster, status, &at, (turn_over, upgraded)).await?;
    Ok(match next {
        Some(now) => now,
        None if stepping_here => Action::requeue(ctx.settings.progress_requeue),
        None => action,
    })
}

/// A turn's next step goes at once when nothing on the node is to be waited for (ADR 0071):
/// a config that runs live (`rolled`) is seen back by the next look, and an upgrade due after
/// the drift part of the turn (`turn_over`) starts with it.
fn next_step(
    cluster: &TalosCluster,
    status: &TalosMachineStatus,
    rendered: &Rendered,
    (rolled, turn_over): (drift::Rolled, bool),
) -> Option<Action> {
    let at_once = rolled == drift::Rolled::Live
        || (turn_over && upgrade::plan::target(cluster, status, rendered).is_some());
    at_once.then(|| Action::requeue(std::time::Duration::ZERO))
}

/// The status a look decides on. Drift and upgrades are multi-step flows (apply, or lock +
/// stage + reboot, then back; lock + install + reboot, then back): while one is under way or
/// due, they are decided on the machine as stored now, not on a cache that may lag this
/// manager's own writes. `None`: the machine is gone.
async fn to_decide_on(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: TalosMachineStatus,
    rendered: &Rendered,
) -> Result<Option<TalosMachineStatus>, Error> {
    if !in_flight(cluster, &status, rendered) {
        return Ok(Some(status));
    }
    let Some(fresh) = observe::read_stored(ctx, machine).await? else {
        return Ok(None);
    };
    // The base of this look's writes checked against the version (`act::patch_status`).
    ctx.looks.keep_stored(&fresh);
    Ok(Some(fresh.status.unwrap_or_default()))
}

/// A configured machine's look: the machine, its cluster, the config rendered for it and how
/// its node is reached.
struct Look<'a> {
    machine: &'a TalosMachine,
    cluster: &'a TalosCluster,
    rendered: &'a Rendered,
    reach: &'a Reach<'a>,
}

/// Acts on the drift step: rolls the changed config out, records it back, or settled; says
/// where that left the drift.
async fn drift_act(
    ctx: &Context,
    look: &Look<'_>,
    step: DriftStep,
    client: Option<&TalosClient>,
    status: &mut TalosMachineStatus,
) -> Result<drift::Rolled, Error> {
    let Look {
        machine,
        cluster,
        rendered,
        reach,
    } = *look;
    match (step, client) {
        (DriftStep::RollOut { applied }, Some(client)) => {
            let rollout = drift::Rollout {
                machine,
                cluster,
                client,
                rendered,
                applied: &applied,
                credentials: reach.credentials,
                bundle: reach.bundle,
                sources: reach.sources,
            };
            return drift::roll_out(ctx, &rollout, status).await;
        }
        (DriftStep::Back, _) => {
            drift::plan::drift_back(machine, status, rendered, &ctx.now());
        }
        (DriftStep::Settled, _) => {
            let message = format!("config {} applied", rendered.hash);
            plan::config_applied(status, machine, message, &ctx.now());
        }
        (DriftStep::RollOut { .. } | DriftStep::Idle, _) => {}
    }
    Ok(drift::Rolled::Waits)
}

/// Registers the schematic `rendered`'s installer is built from with its factory, before the
/// installer is used (ADR 0067): `Some` says why it is not usable yet. The empty schematic,
/// the factory's default, and an installer not derived from a schematic need nothing.
pub(crate) async fn schematic_registered(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    sources: &crate::layers::Sources,
    rendered: &Rendered,
) -> Option<crate::Stop> {
    let id = rendered.installer.schematic.as_deref()?;
    // A machine whose layers do not render never got here: its config did not render either.
    let layers = sources.layers_for(machine).ok()?;
    let schematic = ichor_render::machine_schematic(cluster, machine, &layers)?;
    crate::factory::register(&ctx.factories, &cluster.spec.image_factory, schematic, id)
        .await
        .err()
}

/// Whether a drift or an upgrade is under way or due: decided on the machine as stored.
fn in_flight(cluster: &TalosCluster, status: &TalosMachineStatus, rendered: &Rendered) -> bool {
    status.applied.config_hash.as_deref() != Some(rendered.hash.as_str())
        || status.drift.reboot.is_some()
        || status.upgrade.record.is_some()
        || upgrade::plan::target(cluster, status, rendered).is_some()
}

/// The node of a configured machine as this look found it.
struct Node<'a> {
    client: Option<&'a TalosClient>,
    view: Option<NodeView>,
    role: Role,
}

/// Moves the machine's upgrade on (`upgrade::advance`) unless its changed config rolls out
/// first (`config_still` false, or a drift reboot in flight), which its `UpToDate` then says
/// when an upgrade is due after it; where its upgrade turn stands.
async fn upgrade_step(
    ctx: &Context,
    look: &Look<'_>,
    node: Node<'_>,
    status: &mut TalosMachineStatus,
    config_still: bool,
) -> Result<upgrade::Turn, Error> {
    let Look {
        machine,
        cluster,
        rendered,
        reach,
    } = *look;
    let healthy = node.view.is_some_and(|v| {
        v.stage == ichor_talos::Stage::Running
            && (node.role == Role::Worker || matches!(v.etcd, crate::etcd::Etcd::Voter(_)))
    });
    let u = upgrade::Upgrade {
        machine,
        cluster,
        client: node.client,
        rendered,
        role: node.role,
        address: reach.address,
        healthy,
        credentials: reach.credentials,
        bundle: reach.bundle,
        sources: reach.sources,
    };
    if !config_still || status.drift.reboot.is_some() {
        upgrade::behind_config(ctx, &u, status).await?;
        return Ok(upgrade::Turn::Other);
    }
    upgrade::advance(ctx, &u, status).await
}

/// Reports where the machine stands ([`stand`]); then a machine back from its drift turn ends
/// it (`drift::act::end_turn`), and one whose drift or upgrade turn ended or that became Ready
/// wakes the machines queued behind it (`drift::act::ask_queued`). In that order: the next
/// machine's turn, and every machine queued, read what this look stored (ADR 0043).
async fn report(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: TalosMachineStatus,
    at: &Stand<'_>,
    (turn_over, upgraded): (bool, bool),
) -> Result<Action, Error> {
    let (action, became_ready) = stand(ctx, machine, status, at).await?;
    // Back from its turn: the cordon of a drain for its reboot is lifted first (ADR 0066); a
    // workload API that does not answer keeps the turn open for the next look.
    let turn_over = turn_over && drift::act::lift_cordon(ctx, machine, cluster).await?;
    if turn_over {
        drift::act::end_turn(ctx, machine, cluster, at.rendered).await?;
    }
    if turn_over || upgraded || became_ready {
        drift::act::ask_queued(ctx, machine, cluster).await;
    }
    Ok(action)
}

/// The install of a machine not yet `Installed`: observes it, judges it, and either records it
/// installed (or underway) for the usual judgement (`None`), or stops there and says when to
/// look again (pending, failed, stalled, or back in maintenance mode).
async fn install_step(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
    reach: &Reach<'_>,
    client: Option<&TalosClient>,
    view: Option<NodeView>,
) -> Result<Option<Action>, Error> {
    let pinned = machine.spec.fingerprint.clone().unwrap_or_default();
    let seen = observe::read_install_seen(ctx, reach.address, &pinned, client, view).await;
    let limit = ctx.settings.install_stall_limit;
    let generation = machine.metadata.generation;
    match plan::install_verdict(status, &seen, &pinned, ctx.clock.now(), limit) {
        InstallVerdict::Installed(message) => {
            plan::installed(status, message, generation, &ctx.now());
            Ok(None)
        }
        InstallVerdict::Underway => Ok(None),
        InstallVerdict::Stopped(stop) => {
            act::record_stop(ctx, machine, status.clone(), stop).await?;
            Ok(Some(Action::requeue(ctx.settings.progress_requeue)))
        }
        InstallVerdict::Uninstalled { stop, fingerprint } => {
            // Nothing of the config is on the node: the first apply starts over, once the
            // new certificate is confirmed (spec.fingerprint); the pin is never moved here.
            status.applied.config_hash = None;
            status.inventory.observed_fingerprint = Some(fingerprint);
            act::record_stop(ctx, machine, status.clone(), stop).await?;
            Ok(Some(Action::requeue(ctx.settings.progress_requeue)))
        }
    }
}

/// Reports where the machine stands (phase, address, `Ready`), announces it becoming Ready,
/// and says when to look again, and whether it became Ready just now.
async fn stand(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    at: &Stand<'_>,
) -> Result<(Action, bool), Error> {
    let judged = standing(at.role, at.view);
    let generation = machine.metadata.generation;
    let became_ready =
        plan::record_standing(&mut status, &judged, at.address, generation, &ctx.now());
    act::write_status(ctx, machine, &status).await?;
    if became_ready {
        act::announce_ready(ctx, machine, judged.message).await;
    }
    let settled = if at.turn_queued {
        plan::settled_but_for_its_turn(judged.ready, &status)
    } else {
        plan::settled(judged.ready, &status, &at.rendered.hash)
    };
    let next = if settled {
        plan::settled_wait(
            ctx.settings.settled_requeue,
            ctx.metrics.machines(),
            ctx.settings.settled_looks_per_second,
        )
    } else {
        ctx.settings.progress_requeue
    };
    Ok((Action::requeue(next), became_ready))
}

/// How a configured machine is reached, and the bundle its cluster's configs render from.
struct Reach<'a> {
    address: &'a str,
    credentials: &'a ichor_talos::Credentials,
    bundle: &'a ichor_render::SecretsBundle,
    sources: &'a crate::layers::Sources,
}

/// What a look found a configured machine at: its role, what its node answered, where it is
/// reached, and the config rendered for it.
struct Stand<'a> {
    role: Role,
    view: Option<NodeView>,
    address: &'a str,
    rendered: &'a Rendered,
    /// Its drift or upgrade waits for another machine's turn, whose end wakes it (ADR 0071).
    turn_queued: bool,
}

const ADOPTED: &str =
    "the node already answers with this cluster's CA: recording the earlier apply";

fn api(ctx: &Context, machine: &TalosMachine) -> Api<TalosMachine> {
    Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default())
}

/// The machine's address: observed, else the first endpoint.
/// Where the machine is reached: the address recorded in status, or its first endpoint.
pub(crate) fn address(machine: &TalosMachine) -> Option<String> {
    machine
        .status
        .as_ref()
        .and_then(|s| s.inventory.address.clone())
        .or_else(|| machine.spec.endpoints.first().cloned())
}

/// The config `machine` gets from `cluster` (the one pure function `kubectl ichor render`
/// calls too).
pub(crate) fn render_for(
    cluster: &TalosCluster,
    machine: &TalosMachine,
    role: Role,
    sources: &crate::layers::Sources,
    bundle: &ichor_render::SecretsBundle,
) -> Result<Rendered, ichor_render::RenderError> {
    let layers = sources.layers_for(machine)?;
    ichor_render::render_machine(cluster, machine, role, &layers, bundle)
}

/// The name of the Secret holding the config last applied to `machine`.
pub(crate) fn applied_config_secret(machine: &TalosMachine) -> String {
    format!(
        "{}{}",
        machine.name_any(),
        secret_names::APPLIED_CONFIG_SUFFIX
    )
}

/// What the applied-config Secret holds, for a refusal.
const APPLIED_WHAT: &str = "the applied config";
