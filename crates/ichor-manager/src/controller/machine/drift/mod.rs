//! A machine's drift: what its objects now render differs from the config it runs. Rolled out
//! one machine at a time in the planner's order, under the cluster lock (ADR 0019, ADR 0043):
//! each machine waits for its turn and the lock, then gets its config live (`NO_REBOOT`), or
//! staged with a reboot when it cannot go live; a config the node refuses halts the rollout.
//! Before that reboot the Node is cordoned and drained (`crate::drain`, ADR 0066), and once the
//! node is back the cordon is lifted before the turn ends.
//! The machine reconcile decides the step (`plan::drift_step`); this folder rolls it out,
//! reading in `observe.rs`, deciding in `plan.rs`, writing in `act.rs`.

use ichor_api::cluster::LockHolder;
use ichor_api::machine::TalosMachineStatus;
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Disruption, DriftHalt, DriftTurn, Stage, drift_turn, halt_stands};
use ichor_render::Rendered;
use ichor_talos::{TalosClient, TalosError};
use kube::ResourceExt as _;

use super::plan::{DriftRefused, drift_refused};
use crate::rollout_policy::{Step, is_policy_hold};
use crate::{Context, Error, Stop, infra::conditions as cond};

pub(super) mod act;
pub(super) mod observe;
pub(super) mod plan;

/// One machine's drift being rolled out: the machine, its cluster, the node's client, the
/// config it gets and the hash of the one it runs, and what the planner and the turn need.
pub(super) struct Rollout<'a> {
    pub(super) machine: &'a TalosMachine,
    pub(super) cluster: &'a TalosCluster,
    pub(super) client: &'a TalosClient,
    pub(super) rendered: &'a Rendered,
    pub(super) applied: &'a str,
    pub(super) credentials: &'a ichor_talos::Credentials,
    pub(super) bundle: &'a ichor_render::SecretsBundle,
    pub(super) sources: &'a crate::layers::Sources,
}

/// The lock holder of a reboot that applies drift.
pub fn drift_holder(machine: &TalosMachine) -> LockHolder {
    LockHolder::Drift(machine.uid().unwrap_or_default())
}

/// Drift: what the objects now render differs from what was applied. It is rolled out one
/// machine at a time in the planner's order, under the cluster lock (ADR 0019): this waits
/// for the machine's turn and the lock, then applies the config live, or staged with a reboot
/// when it cannot go live. Says where that left it.
pub(super) async fn roll_out(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
) -> Result<Rolled, Error> {
    let me = drift_holder(r.machine);
    // The cluster's machines, read once for the turn and the lock, as stored: one disruption
    // at a time under the cluster lock (ADR 0019) counts the machines moving now.
    let machines = crate::cluster_machines_as_stored(ctx, r.cluster).await?;
    let turn = wait_for_turn(
        ctx,
        (r.machine, r.cluster, &machines),
        r.sources,
        r.bundle,
        Step::Change,
    );
    let (waiting, queued) = match turn.await? {
        // The policy holds the machine whose turn it is: looked at again soon, not woken by
        // another's turn.
        Some(held) if is_policy_hold(held.reason) => (Some(held), Rolled::Waits),
        Some(turn) => (Some(turn), Rolled::Queued),
        None => (
            act::take_drift_lock(ctx, (r.machine, r.cluster, &machines), &me, r.rendered)
                .await?
                .map(|queued| Stop::new(reasons::DRIFT_QUEUED, queued)),
            Rolled::Waits,
        ),
    };
    if let Some(stop) = waiting {
        stop.set_condition(
            &mut status.conditions,
            conditions::CONFIG_APPLIED,
            r.machine.metadata.generation,
            &ctx.now(),
        );
        return Ok(queued);
    }
    // The node behind this connection must be the machine: no config goes to another one at
    // its address (ADR 0052).
    let address = super::address(r.machine).unwrap_or_default();
    let checked = crate::identity::check_machine(r.client, r.machine, &address, "config apply");
    let checked = checked.await;
    if crate::identity::held_on(ctx, r.machine, status, conditions::CONFIG_APPLIED, &checked).await
    {
        crate::lock::release(ctx, r.cluster, &me).await?;
        return Ok(Rolled::Waits);
    }
    // The node said this config cannot go live, and its reboot waits: not asked again at
    // every look, only the reboot's own checks. Not while an intent is recorded: the node may
    // run the config already (an answer lost, a look from an older copy), which the live
    // apply looks for first.
    if status.drift.reboot.is_none() && plan::reboot_known_needed(status, &r.rendered.hash) {
        // Boxed, as the other call: the reboot's future (lock, planner, drain, staging) kept
        // twice in this one overflowed a debug build's worker stack.
        Box::pin(live_refused(ctx, r, status, None)).await?;
        return Ok(Rolled::Waits);
    }
    match act::apply_live_once(ctx, r.machine, r.client, r.rendered, status).await? {
        Ok(sent) => {
            act::record_live_applied(ctx, r, status, sent).await?;
            return Ok(Rolled::Live);
        }
        // Anything but "this needs a reboot" (the node busy, a timeout, a refused config)
        // is reported and retried: a transient error never reboots a node. Without an answer
        // the node may run the config already: the intent stays, so the retry looks first.
        Err(error) => match drift_refused(&error) {
            DriftRefused::StageAndReboot => {
                Box::pin(live_refused(ctx, r, status, Some(&error))).await?;
            }
            DriftRefused::Retry => act::record_live_retry(ctx, r, status, &error, false).await?,
            DriftRefused::Unanswered => {
                act::record_live_retry(ctx, r, status, &error, true).await?;
            }
        },
    }
    Ok(Rolled::Waits)
}

/// Where a look left a machine's drift ([`roll_out`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rolled {
    /// It waits for another machine's turn (or a halted rollout), whose end wakes it
    /// (ADR 0071).
    Queued,
    /// Its config runs live now: the node is seen healthy again, and its turn ended, by the
    /// very next look (ADR 0071).
    Live,
    /// Anything else: it waits for the lock, the node, a reboot, or a retry.
    Waits,
}

/// The config cannot go live (the node's `error` just said so, or said so before): it is
/// applied with a reboot under the cluster lock. Recorded as applied with the reboot in
/// flight, or `ConfigApplied` says why the reboot waits.
async fn live_refused(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
    error: Option<&TalosError>,
) -> Result<(), Error> {
    let generation = r.machine.metadata.generation;
    if let Some(error) = error {
        let message = format!(
            "config {} cannot be applied live ({error}); it is applied with a reboot under the cluster lock, one node at a time",
            r.rendered.hash
        );
        cond::set(
            &mut status.conditions,
            conditions::CONFIG_APPLIED,
            false,
            reasons::NEEDS_REBOOT,
            message,
            generation,
            &ctx.now(),
        );
    }
    match reboot_for_drift(ctx, r).await? {
        Err(waiting) => {
            act::forget_drift_intent(ctx, r.machine, status).await?;
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
    // The Node cordoned and drained first (ADR 0066); the lock is kept while it drains: the
    // reboot is under way.
    if let Some(waits) = act::drain_for_reboot(ctx, r).await? {
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
    if let Err(error) = act::stage_config(ctx, r, &me).await? {
        // Refused as a config (not busy, not unreachable): the rollout stops here.
        if drift_refused(&error) == DriftRefused::StageAndReboot {
            let message = error.to_string();
            crate::drift::record_halt(ctx, r.cluster, r.machine, &r.rendered.hash, &message)
                .await?;
        }
        return Ok(Err(plan::staging_refused(&error, &r.rendered.hash)));
    }
    if let Some(failed) = act::reboot_staged(ctx, r, &boot).await? {
        return Ok(Err(failed));
    }
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
    // The reboot starts only inside a maintenance window (ADR 0074); the lock the turn took is
    // given back meanwhile, so nothing else waits on a closed window.
    if let Some(held) =
        crate::rollout_policy::clears(ctx, r.cluster, r.machine, Step::Reboot).await?
    {
        crate::lock::release(ctx, r.cluster, me).await?;
        // Named with its config: the next look knows this config needs a reboot, and does
        // not ask the node to take it live again (`plan::reboot_known_needed`).
        return Ok(Some(Stop::new(
            held.reason,
            format!(
                "config {} needs a reboot: {}",
                r.rendered.hash, held.message
            ),
        )));
    }
    // As stored: one disruption at a time under the cluster lock (ADR 0019) counts the
    // machines moving now.
    let machines = crate::cluster_machines_as_stored(ctx, r.cluster).await?;
    let outcome = crate::lock::acquire_step(ctx, r.cluster, r.machine, &machines, me).await?;
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

/// Why this machine's drift (or upgrade) waits for its turn, or `None` if it is its turn: the
/// planner's order over every machine of the cluster, with their recorded health and the halt
/// recorded on the cluster. A halt that no longer stands (the config fixed, the declared
/// installer changed) is cleared. In its turn, the cluster's rollout policy may still hold
/// `step` (a suspend, a maintenance window, a health gate, a fresh backup; ADRs 0074, 0075).
pub(super) async fn wait_for_turn(
    ctx: &Context,
    (machine, cluster, machines): (&TalosMachine, &TalosCluster, &[TalosMachine]),
    sources: &crate::layers::Sources,
    bundle: &ichor_render::SecretsBundle,
    step: Step,
) -> Result<Option<Stop>, Error> {
    let views = plan::drift_views(cluster, machines, sources, bundle);
    // As stored: the halt a refusal recorded on the cluster, never a cached copy of it.
    let recorded = observe::read_halt(ctx, cluster).await?;
    let halt = recorded.as_ref().map(|h| DriftHalt {
        machine: h.machine.clone(),
        rendered: h.rendered_hash.clone(),
    });
    if let Some(stale) = halt.as_ref().filter(|h| !halt_stands(&views, h)) {
        crate::drift::clear_halt(ctx, cluster, &stale.machine).await?;
    }
    let why = recorded.map(|h| h.message).unwrap_or_default();
    let turn = drift_turn(&views, halt.as_ref());
    let name = machine.name_any();
    let mine = match &turn {
        DriftTurn::Next { machine: next, .. } if *next == name => true,
        DriftTurn::Next { .. } | DriftTurn::WaitForHealthy { .. } => {
            Box::pin(batch_turn(ctx, (machine, cluster, machines), &views)).await?
        }
        DriftTurn::Settled | DriftTurn::Halted { .. } => false,
    };
    if mine {
        return crate::rollout_policy::clears(ctx, cluster, machine, step).await;
    }
    Ok(plan::turn_wait(turn, &name, &why))
}

/// Whether it is `machine`'s turn in a batch of workers (ADR 0077): its policy lets more
/// than one be down, and it is among those that may start beside the steps holding the lock
/// now, in rollout order (or one of them).
async fn batch_turn(
    ctx: &Context,
    (machine, cluster, machines): (&TalosMachine, &TalosCluster, &[TalosMachine]),
    views: &[ichor_deleteguard::DriftMachine],
) -> Result<bool, Error> {
    let classes = ctx.layers.classes();
    let governing = crate::rollout_policy::governing(cluster, machine, &classes);
    let Some(batch) = crate::rollout_policy::batch::Batch::of(machine, machines, governing.policy)
    else {
        return Ok(false);
    };
    let members = crate::lock::in_flight(ctx, cluster, |uid| batch.names.get(uid).cloned()).await?;
    let pending: Vec<String> = views
        .iter()
        .filter(|v| v.drifted() && !v.leaving)
        .map(|v| v.name.clone())
        .collect();
    Ok(batch.turn(&members, &pending))
}
