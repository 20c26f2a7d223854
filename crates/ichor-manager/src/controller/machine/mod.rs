//! The machine reconciler: from approved to Ready. Pending and rejected machines are never
//! contacted (discovery's reads are all they get). An approved machine is checked (version,
//! hardware, pin), gets its config over the pinned maintenance connection, and is then
//! followed over mutual TLS; drift is applied live with `NO_REBOOT`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ichor_api::cluster::LockHolder;
use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, MachineDrift, MachinePhase, TalosMachineStatus};
use ichor_api::names::controllers;
use ichor_api::names::{actions, conditions, reasons, secrets as secret_names};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{
    Disruption, DriftHalt, DriftMachine, DriftTurn, Stage, drift_turn, halt_stands,
};
use ichor_render::Rendered;
use ichor_talos::{ApplyMode, TalosClient, TalosError};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::controller::cluster;
use crate::infra::shared::Changes;
use crate::{Context, Error, Stop, infra::conditions as cond};

mod act;
mod observe;
mod pacing;
pub(crate) mod plan;
pub mod removal;

pub(crate) use act::{forget_config, record_hash};
pub use pacing::Looks;
pub(crate) use pacing::lock;

use plan::{Blocked, DriftRefused, DriftStep, InstallVerdict, NodeView, drift_refused, standing};

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
    )
    .with_config(crate::infra::drive::limits(&ctx));
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
    match look(&machine, &ctx).await {
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
    ctx.metrics.reconciled("TalosMachine", started.elapsed());
    if result.is_ok() {
        ctx.reconciled_ok(&*machine);
    }
    result
}

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

/// An approved machine: observes its cluster and secrets bundle, plans whether it can be
/// configured (role, config, address), then applies its first config or follows it.
async fn approved(machine: &TalosMachine, ctx: &Context) -> Result<Action, Error> {
    let status = machine.status.clone().unwrap_or_default();
    let (cluster, bundle) = match observe::read_cluster_and_bundle(ctx, machine).await? {
        Ok(found) => found,
        Err(stop) => return act::record_blocked(ctx, machine, status, stop).await,
    };
    let sources = ctx.layers.sources().await?;
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
        Err(detail) => return act::record_unreachable(ctx, machine, status, &detail).await,
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

const ADOPTED: &str =
    "the node already answers with this cluster's CA: recording the earlier apply";

/// How a configured machine is reached, and the bundle its cluster's configs render from.
struct Reach<'a> {
    address: &'a str,
    credentials: &'a ichor_talos::Credentials,
    bundle: &'a ichor_render::SecretsBundle,
    sources: &'a crate::layers::Sources,
}

/// After the apply: follows install, boot and join over mutual TLS; applies drift live.
/// Observes the node, plans the drift step, acts on it, then reports where the machine stands.
async fn follow(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    mut status: TalosMachineStatus,
    rendered: &Rendered,
    reach: &Reach<'_>,
) -> Result<Action, Error> {
    // Checked by the caller: an approved machine has a role.
    let role = machine.spec.role.unwrap_or(Role::Worker);
    // Drift is a multi-step flow (apply, or lock + stage + reboot, then back): decide it on
    // the machine as stored now, not on a cache that may lag this manager's own writes.
    if status.applied.config_hash.as_deref() != Some(rendered.hash.as_str())
        || status.drift.reboot.is_some()
    {
        let Some(fresh) = observe::read_stored(ctx, machine).await? else {
            return Ok(Action::await_change());
        };
        status = fresh.status.unwrap_or_default();
    }
    let client = crate::connect(reach.address, reach.credentials).await;
    let answers = match &client {
        Some(client) => observe::ask_node(client, role).await,
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
    let boot = boot_after_drift_reboot(client.as_ref(), &status).await;
    let step = plan::drift_step(&status, view, boot.as_deref(), &rendered.hash, role);
    let step = plan::hold_adopted(machine, cluster, &mut status, step, &ctx.now());
    let turn_over = step == DriftStep::Back;
    match (step, &client) {
        (DriftStep::RollOut { applied }, Some(client)) => {
            let rollout = Rollout {
                machine,
                cluster,
                client,
                rendered,
                applied: &applied,
                credentials: reach.credentials,
                bundle: reach.bundle,
                sources: reach.sources,
            };
            roll_out(ctx, &rollout, &mut status).await?;
        }
        (DriftStep::Back, _) => drift_back(ctx, machine, &mut status, rendered),
        (DriftStep::Settled, _) => {
            let message = format!("config {} applied", rendered.hash);
            plan::config_applied(&mut status, machine, message, &ctx.now());
        }
        (DriftStep::RollOut { .. } | DriftStep::Idle, _) => {}
    }
    let at = Stand {
        role,
        view,
        address: reach.address,
        rendered,
    };
    report(ctx, machine, cluster, status, &at, turn_over).await
}

/// Reports where the machine stands ([`stand`]); then a machine back from its drift turn ends
/// it ([`end_turn`]), and one whose turn ended or that became Ready wakes the machines queued
/// behind it ([`ask_queued`]). In that order: the next machine's turn, and every machine
/// queued, read what this look stored (ADR 0043).
async fn report(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: TalosMachineStatus,
    at: &Stand<'_>,
    turn_over: bool,
) -> Result<Action, Error> {
    let (action, became_ready) = stand(ctx, machine, status, at).await?;
    if turn_over {
        end_turn(ctx, machine, cluster, at.rendered).await?;
    }
    if turn_over || became_ready {
        ask_queued(ctx, machine, cluster).await;
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

/// What a look found a configured machine at: its role, what its node answered, where it is
/// reached, and the config rendered for it.
struct Stand<'a> {
    role: Role,
    view: Option<NodeView>,
    address: &'a str,
    rendered: &'a Rendered,
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
    let next = if plan::settled(judged.ready, &status, &at.rendered.hash) {
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
/// The node's boot id now, read only while a reboot for drift is in flight (it tells that
/// reboot done from not begun).
async fn boot_after_drift_reboot(
    client: Option<&TalosClient>,
    status: &TalosMachineStatus,
) -> Option<String> {
    status.drift.boot_id.as_ref()?;
    client?.boot_id().await.ok()
}

/// One machine's drift being rolled out: the machine, its cluster, the node's client, the
/// config it gets and the hash of the one it runs, and what the planner and the turn need.
struct Rollout<'a> {
    machine: &'a TalosMachine,
    cluster: &'a TalosCluster,
    client: &'a TalosClient,
    rendered: &'a Rendered,
    applied: &'a str,
    credentials: &'a ichor_talos::Credentials,
    bundle: &'a ichor_render::SecretsBundle,
    sources: &'a crate::layers::Sources,
}

/// Drift: what the objects now render differs from what was applied. It is rolled out one
/// machine at a time in the planner's order, under the cluster lock (ADR 0019): this waits
/// for the machine's turn and the lock, then applies the config live, or staged with a reboot
/// when it cannot go live.
async fn roll_out(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
) -> Result<(), Error> {
    let me = drift_holder(r.machine);
    // The cluster's machines, read once for the turn and the lock, as stored: one disruption
    // at a time under the cluster lock (ADR 0019) counts the machines moving now.
    let machines = crate::cluster_machines_as_stored(ctx, r.cluster).await?;
    let waiting = match drift_wait(ctx, r, &machines).await? {
        Some(turn) => Some(turn),
        None => drift_lock(ctx, r.cluster, &machines, &me, r.rendered)
            .await?
            .map(|queued| Stop::new(reasons::DRIFT_QUEUED, queued)),
    };
    if let Some(stop) = waiting {
        stop.set_condition(
            &mut status.conditions,
            conditions::CONFIG_APPLIED,
            r.machine.metadata.generation,
            &ctx.now(),
        );
        return Ok(());
    }
    // The node behind this connection must be the machine: no config goes to another one at
    // its address (ADR 0052).
    let address = address(r.machine).unwrap_or_default();
    let checked = crate::identity::check_machine(r.client, r.machine, &address, "config apply");
    let checked = checked.await;
    if crate::identity::held_on(ctx, r.machine, status, conditions::CONFIG_APPLIED, &checked).await
    {
        crate::lock::release(ctx, r.cluster, &me).await?;
        return Ok(());
    }
    match apply_live_once(ctx, r.machine, r.client, r.rendered, status).await? {
        Ok(sent) => live_applied(ctx, r, status, sent).await,
        // Anything but "this needs a reboot" (the node busy, a timeout, a refused config)
        // is reported and retried: a transient error never reboots a node. Without an answer
        // the node may run the config already: the intent stays, so the retry looks first.
        Err(error) => match drift_refused(&error) {
            DriftRefused::StageAndReboot => live_refused(ctx, r, status, &error).await,
            DriftRefused::Retry => live_retried(ctx, r, status, &error, false).await,
            DriftRefused::Unanswered => live_retried(ctx, r, status, &error, true).await,
        },
    }
}

/// The config went live (or was found running after a restart): kept, recorded, announced.
async fn live_applied(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
    sent: bool,
) -> Result<(), Error> {
    act::store_applied(ctx, r.machine, &r.rendered.yaml).await?;
    // The lock and `driftReboot` are kept until the node is seen healthy again
    // (`DriftStep::Back`, next time).
    status.applied.config_hash = Some(r.rendered.hash.clone());
    let how = if sent {
        "applied live (NO_REBOOT)"
    } else {
        "found running after a restart (not sent again)"
    };
    ctx.event(
        r.machine,
        EventType::Normal,
        reasons::DRIFT_APPLIED,
        actions::APPLY,
        format!("config {} {how}, replacing {}", r.rendered.hash, r.applied),
    )
    .await;
    Ok(())
}

/// The node did not take the config live for a passing reason, or did not answer: the lock is
/// released and `ConfigApplied` says it is retried. The intent is forgotten when the node
/// refused; kept (`unanswered`) when it may have taken the config, so the retry looks for it on
/// the node before sending it again ([`apply_live_once`]).
async fn live_retried(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
    error: &TalosError,
    unanswered: bool,
) -> Result<(), Error> {
    if !unanswered {
        forget_drift_intent(ctx, r.machine, status).await?;
    }
    crate::lock::release(ctx, r.cluster, &drift_holder(r.machine)).await?;
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_APPLIED,
        false,
        reasons::DRIFT_NOT_APPLIED,
        format!(
            "config {} was not applied live: {error}; it is retried",
            r.rendered.hash
        ),
        r.machine.metadata.generation,
        &ctx.now(),
    );
    Ok(())
}

/// The config cannot go live: it is applied with a reboot under the cluster lock. Recorded as
/// applied with the reboot in flight, or `ConfigApplied` says why the reboot waits.
async fn live_refused(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
    error: &TalosError,
) -> Result<(), Error> {
    let message = format!(
        "config {} cannot be applied live ({error}); it is applied with a reboot under the cluster lock, one node at a time",
        r.rendered.hash
    );
    let generation = r.machine.metadata.generation;
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_APPLIED,
        false,
        reasons::NEEDS_REBOOT,
        message,
        generation,
        &ctx.now(),
    );
    match reboot_for_drift(ctx, r).await? {
        Err(waiting) => {
            forget_drift_intent(ctx, r.machine, status).await?;
            waiting.set_condition(
                &mut status.conditions,
                conditions::CONFIG_APPLIED,
                generation,
                &ctx.now(),
            );
        }
        Ok(boot) => {
            status.applied.config_hash = Some(r.rendered.hash.clone());
            status.drift.reboot = Some(r.rendered.hash.clone());
            status.drift.boot_id = Some(boot);
        }
    }
    Ok(())
}

/// The reboot for drift is done (or the live apply seen through): the node is back and
/// healthy, and `ConfigApplied` says so. The turn ends once that is stored ([`end_turn`]).
fn drift_back(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
    rendered: &Rendered,
) {
    let message = format!(
        "config {} applied; the node is healthy again",
        rendered.hash
    );
    plan::config_applied(status, machine, message, &ctx.now());
}

/// Ends this machine's drift turn, once its status saying it is back and Ready is stored: the
/// lock is released for the next machine, then the intent is forgotten, with an Event. Never
/// the other way round: a machine queued behind this one reads its recorded `Ready` as soon
/// as the lock is free, and a stale `Unready` would send it to wait (ADR 0043). A failure
/// part-way leaves the intent recorded, so the next look ends the turn again.
async fn end_turn(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    rendered: &Rendered,
) -> Result<(), Error> {
    crate::lock::release(ctx, cluster, &drift_holder(machine)).await?;
    act::patch_status::<MachineDrift>(ctx, machine, |s| s.drift = MachineDrift::default()).await?;
    ctx.event(
        machine,
        EventType::Normal,
        reasons::DRIFT_APPLIED,
        actions::APPLY,
        format!(
            "config {} rolled out; the node is healthy again and the next machine may go",
            rendered.hash
        ),
    )
    .await;
    Ok(())
}

/// Asks a look now at the machines queued behind this one (`plan::queued_behind`): they wait
/// on what this look just stored (its turn over, or it Ready), and neither that write nor the
/// lock's best-effort mirror is sure to wake them. Best effort too: a machine missed is looked
/// at at its own pace, the progress pace while its drift waits (ADR 0043).
async fn ask_queued(ctx: &Context, machine: &TalosMachine, cluster: &TalosCluster) {
    let machines = match crate::cluster_machines(ctx, cluster).await {
        Ok(machines) => machines,
        Err(error) => {
            tracing::debug!(%error, machine = %machine.name_any(), "queued machines not woken this time");
            return;
        }
    };
    let waiting = cluster
        .status
        .as_ref()
        .and_then(|s| s.lock.mirror.as_ref())
        .map(|l| l.waiting.as_slice())
        .unwrap_or_default();
    let queued = plan::queued_behind(&machines, waiting, &machine.name_any());
    if !queued.is_empty() {
        tracing::debug!(machine = %machine.name_any(), woken = queued.len(), "waking the machines queued behind it");
        ctx.looks.ask(&queued);
    }
}

/// Why this machine's drift waits for its turn, or `None` if it is its
/// turn: the planner's order over every machine of the cluster, with their recorded health and
/// the halt recorded on the cluster. A halt that no longer stands (the config fixed) is cleared.
async fn drift_wait(
    ctx: &Context,
    r: &Rollout<'_>,
    machines: &[TalosMachine],
) -> Result<Option<Stop>, Error> {
    let (machine, cluster) = (r.machine, r.cluster);
    let views: Vec<DriftMachine> = machines
        .iter()
        .filter_map(|m| drift_view(cluster, m, r.sources, r.bundle))
        .collect();
    let fresh = Api::<TalosCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    )
    .get_opt(&cluster.name_any())
    .await?;
    let recorded = fresh
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.drift.halt.clone());
    let halt = recorded.as_ref().map(|h| DriftHalt {
        machine: h.machine.clone(),
        rendered: h.rendered_hash.clone(),
    });
    if let Some(stale) = halt.as_ref().filter(|h| !halt_stands(&views, h)) {
        crate::drift::clear_halt(ctx, cluster, &stale.machine).await?;
    }
    let name = machine.name_any();
    Ok(match drift_turn(&views, halt.as_ref()) {
        DriftTurn::Settled => None,
        DriftTurn::Next { machine, .. } if machine == name => None,
        DriftTurn::Next { machine, .. } => Some(Stop::new(
            reasons::DRIFT_QUEUED,
            format!(
                "its changed config waits for its turn: {machine} takes its own first (control planes, then workers, each by name; one machine at a time)"
            ),
        )),
        DriftTurn::WaitForHealthy { machine } => Some(Stop::new(
            reasons::DRIFT_QUEUED,
            format!(
                "its changed config waits until {machine} is healthy again (Ready, and for a control plane a healthy etcd voter): one machine at a time, each healthy before the next"
            ),
        )),
        DriftTurn::Halted { machine } => {
            let why = recorded.map(|h| h.message).unwrap_or_default();
            Some(Stop::new(
                reasons::DRIFT_HALTED,
                format!(
                    "the drift rollout stopped at {machine}, which refused its changed config ({why}); no other machine gets it until a change renders {machine}'s config differently: fix the patch"
                ),
            ))
        }
    })
}

/// What the drift rollout needs to know of `machine` (`None`: not an approved machine with a
/// role, or its config does not render, so it is no drift target).
fn drift_view(
    cluster: &TalosCluster,
    machine: &TalosMachine,
    sources: &crate::layers::Sources,
    bundle: &ichor_render::SecretsBundle,
) -> Option<DriftMachine> {
    let role = machine.spec.role?;
    if machine.spec.approval_state != ApprovalState::Approved {
        return None;
    }
    let status = machine.status.clone().unwrap_or_default();
    let rendered = render_for(cluster, machine, role, sources, bundle).ok()?;
    Some(DriftMachine {
        name: machine.name_any(),
        role,
        rendered: rendered.hash,
        applied: status.applied.config_hash.clone(),
        healthy: cond::is_true(&status.conditions, conditions::READY),
        leaving: machine.metadata.deletion_timestamp.is_some() || status.removal.progress.is_some(),
    })
}

/// Takes the cluster lock for this machine's drift. `Some` says why it waits for it.
async fn drift_lock(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    me: &LockHolder,
    rendered: &Rendered,
) -> Result<Option<String>, Error> {
    let moving = crate::lock::transitioning(cluster, machines);
    let outcome = crate::lock::acquire(ctx, cluster, me, moving, false).await?;
    Ok((!outcome.held()).then(|| {
        format!(
            "config {} is next to roll out here: {}",
            rendered.hash,
            outcome.message()
        )
    }))
}

/// Applies drift live, once across restarts: the intent (`driftReboot`, the hash) is recorded
/// before the call, and when a restart finds it recorded, a dry run looks for the config on the
/// node first and sends it only if the node does not run it. `Ok(true)`: sent now;
/// `Ok(false)`: found running; `Err`: what the node answered.
async fn apply_live_once(
    ctx: &Context,
    machine: &TalosMachine,
    client: &TalosClient,
    rendered: &Rendered,
    status: &mut TalosMachineStatus,
) -> Result<Result<bool, TalosError>, Error> {
    if status.drift.reboot.as_deref() == Some(rendered.hash.as_str()) {
        match client.runs_config(rendered.yaml.as_bytes()).await {
            Ok(true) => return Ok(Ok(false)),
            Ok(false) => {}
            Err(error) => return Ok(Err(error)),
        }
    } else {
        act::patch_status::<MachineDrift>(ctx, machine, |s| {
            s.drift.reboot = Some(rendered.hash.clone());
        })
        .await?;
        status.drift.reboot = Some(rendered.hash.clone());
    }
    Ok(client
        .apply_configuration(rendered.yaml.as_bytes(), ApplyMode::NoReboot)
        .await
        .map(|_| true))
}

/// Clears the drift intent (`driftReboot`): this machine's turn is over, its config not applied
/// (a refusal, a wait) or applied and the node healthy again.
async fn forget_drift_intent(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
) -> Result<(), Error> {
    let boot = status.drift.boot_id.take();
    if status.drift.reboot.take().is_some() || boot.is_some() {
        act::patch_status::<MachineDrift>(ctx, machine, |s| s.drift = MachineDrift::default())
            .await?;
    }
    Ok(())
}

/// The lock holder of a reboot that applies drift.
pub fn drift_holder(machine: &TalosMachine) -> LockHolder {
    LockHolder::Drift(machine.uid().unwrap_or_default())
}

/// Applies drift that cannot go live: under the cluster lock, staged, then a reboot.
/// `Err` says why it waits; `Ok` means the reboot was sent, and holds the
/// node's boot id from before it, recorded as `driftBootId`: the node is back from this
/// reboot once it answers with another one. A refused staging releases the lock: nothing
/// disruptive started.
async fn reboot_for_drift(ctx: &Context, r: &Rollout<'_>) -> Result<Result<String, Stop>, Error> {
    let me = drift_holder(r.machine);
    if let Some(waits) = reboot_cleared(ctx, r, &me).await? {
        return Ok(Err(waits));
    }
    let boot = match r.client.boot_id().await {
        Ok(boot) => boot,
        Err(error) => {
            crate::lock::release(ctx, r.cluster, &me).await?;
            return Ok(Err(Stop::new(
                reasons::NEEDS_REBOOT,
                format!(
                    "config {} needs a reboot, which waits: the node does not tell its boot id, by which the reboot is seen: {error}",
                    r.rendered.hash
                ),
            )));
        }
    };
    if let Some(refused) = stage(ctx, r, &me).await? {
        return Ok(Err(refused));
    }
    // Staged: the node boots into it. Kept before the reboot, so a failure to keep it never
    // costs a second reboot; the boot id too, so "back" later means back from this reboot.
    act::store_applied(ctx, r.machine, &r.rendered.yaml).await?;
    act::patch_status::<MachineDrift>(ctx, r.machine, |s| s.drift.boot_id = Some(boot.clone()))
        .await?;
    if let Err(error) = r.client.reboot().await {
        return Ok(Err(Stop::new(
            reasons::NEEDS_REBOOT,
            format!("the reboot for config {} failed: {error}", r.rendered.hash),
        )));
    }
    ctx.event(
        r.machine,
        EventType::Normal,
        reasons::REBOOT_FOR_DRIFT,
        actions::APPLY,
        format!(
            "config {} staged (replacing {}); rebooting under the cluster lock",
            r.rendered.hash, r.applied
        ),
    )
    .await;
    Ok(Ok(boot))
}

/// Takes the cluster lock for the reboot (`me`) and asks the planner. `Some` says why the
/// reboot waits; when the planner holds it, the lock is given back.
async fn reboot_cleared(
    ctx: &Context,
    r: &Rollout<'_>,
    me: &LockHolder,
) -> Result<Option<Stop>, Error> {
    let namespace = r.cluster.namespace().unwrap_or_default();
    // As stored: one disruption at a time under the cluster lock (ADR 0019) counts the
    // machines moving now.
    let machines = crate::cluster_machines_as_stored(ctx, r.cluster).await?;
    let moving = crate::lock::transitioning(r.cluster, &machines);
    let outcome = crate::lock::acquire(ctx, r.cluster, me, moving, false).await?;
    if !outcome.held() {
        return Ok(Some(Stop::new(
            reasons::NEEDS_REBOOT,
            format!(
                "config {} needs a reboot: {} (namespace {namespace})",
                r.rendered.hash,
                outcome.message()
            ),
        )));
    }
    // The planner: a reboot is a restart, held while a voter is unhealthy.
    let plan = crate::safety::check(
        ctx,
        r.machine,
        r.cluster,
        &machines,
        r.credentials,
        &Disruption::Restart,
        Stage::Run,
    )
    .await?;
    if !plan.is_proceed() {
        crate::lock::release(ctx, r.cluster, me).await?;
        return Ok(Some(Stop::new(
            plan.reason().unwrap_or(reasons::ETCD_UNHEALTHY),
            format!(
                "config {} needs a reboot, which waits: {}",
                r.rendered.hash,
                plan.message().unwrap_or_default()
            ),
        )));
    }
    Ok(None)
}

/// Stages the config for the reboot. `Some` says why it was not staged: the lock (`me`) is
/// released, and a refusal of the config itself halts the rollout.
async fn stage(ctx: &Context, r: &Rollout<'_>, me: &LockHolder) -> Result<Option<Stop>, Error> {
    let Err(error) = r
        .client
        .apply_configuration(r.rendered.yaml.as_bytes(), ApplyMode::Staged)
        .await
    else {
        return Ok(None);
    };
    crate::lock::release(ctx, r.cluster, me).await?;
    // Refused as a config (not busy, not unreachable): the rollout stops here.
    if drift_refused(&error) == DriftRefused::StageAndReboot {
        let message = error.to_string();
        crate::drift::record_halt(ctx, r.cluster, r.machine, &r.rendered.hash, &message).await?;
        return Ok(Some(Stop::new(
            reasons::DRIFT_HALTED,
            format!(
                "the node refused config {}: {message}; the drift rollout stops here and no other machine gets it until the patch is fixed",
                r.rendered.hash
            ),
        )));
    }
    Ok(Some(Stop::new(
        reasons::DRIFT_NOT_APPLIED,
        format!(
            "config {} was not applied: the node refused it staged too: {error}; it is retried",
            r.rendered.hash
        ),
    )))
}
