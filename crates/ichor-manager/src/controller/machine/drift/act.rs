//! What the drift rollout writes, one action each and recorded: the cluster lock taken and
//! released, the config sent live or staged, the reboot, the drift intent (`driftReboot`,
//! `driftBootId`) recorded and forgotten, `ConfigApplied` and the Events; and the looks asked of
//! the machines queued behind this one. Nothing here decides whose turn it is.

use ichor_api::cluster::LockHolder;
use ichor_api::machine::{MachineDrift, TalosMachineStatus};
use ichor_api::names::{actions, conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::Rendered;
use ichor_talos::{ApplyMode, TalosClient, TalosError};
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::Rollout;
use crate::controller::machine::act as machine_act;
use crate::controller::machine::plan as machine_plan;
use crate::{Context, Error, Stop, infra::conditions as cond};

/// Takes the cluster lock for this machine's drift. `Some` says why it waits for it.
pub(super) async fn take_drift_lock(
    ctx: &Context,
    (machine, cluster, machines): (&TalosMachine, &TalosCluster, &[TalosMachine]),
    me: &LockHolder,
    rendered: &Rendered,
) -> Result<Option<String>, Error> {
    let outcome = crate::lock::acquire_step(ctx, cluster, machine, machines, me).await?;
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
pub(super) async fn apply_live_once(
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
        machine_act::patch_status::<MachineDrift>(ctx, machine, |s| {
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
pub(super) async fn forget_drift_intent(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
) -> Result<(), Error> {
    let boot = status.drift.boot_id.take();
    if status.drift.reboot.take().is_some() || boot.is_some() {
        machine_act::patch_status::<MachineDrift>(ctx, machine, |s| {
            s.drift = MachineDrift::default()
        })
        .await?;
    }
    Ok(())
}

/// The config went live (or was found running after a restart): kept, recorded, announced.
pub(super) async fn record_live_applied(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
    sent: bool,
) -> Result<(), Error> {
    machine_act::store_applied(ctx, r.machine, &r.rendered.yaml).await?;
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
/// the node before sending it again (`apply_live_once`).
pub(super) async fn record_live_retry(
    ctx: &Context,
    r: &Rollout<'_>,
    status: &mut TalosMachineStatus,
    error: &TalosError,
    unanswered: bool,
) -> Result<(), Error> {
    if !unanswered {
        forget_drift_intent(ctx, r.machine, status).await?;
    }
    crate::lock::release(ctx, r.cluster, &super::drift_holder(r.machine)).await?;
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

/// Stages the config for the reboot; when the node refuses it, the lock (`me`) is released
/// (nothing disruptive started) and the node's answer returned.
pub(super) async fn stage_config(
    ctx: &Context,
    r: &Rollout<'_>,
    me: &LockHolder,
) -> Result<Result<(), TalosError>, Error> {
    let Err(error) = r
        .client
        .apply_configuration(r.rendered.yaml.as_bytes(), ApplyMode::Staged)
        .await
    else {
        return Ok(Ok(()));
    };
    crate::lock::release(ctx, r.cluster, me).await?;
    Ok(Err(error))
}

/// Ends this machine's drift turn, once its status saying it is back and Ready is stored: the
/// lock is released for the next machine, then the intent is forgotten, with an Event. Never
/// the other way round: a machine queued behind this one reads its recorded `Ready` as soon
/// as the lock is free, and a stale `Unready` would send it to wait (ADR 0043). A failure
/// part-way leaves the intent recorded, so the next look ends the turn again.
pub(in super::super) async fn end_turn(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    rendered: &Rendered,
) -> Result<(), Error> {
    crate::lock::release(ctx, cluster, &super::drift_holder(machine)).await?;
    machine_act::patch_status::<MachineDrift>(ctx, machine, |s| s.drift = MachineDrift::default())
        .await?;
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
pub(in super::super) async fn ask_queued(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
) {
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
    let classes = ctx.layers.classes();
    let next = crate::rollout_policy::batch::widest(cluster, &classes, &machines);
    let queued = machine_plan::queued_behind(&machines, waiting, &machine.name_any(), next);
    if !queued.is_empty() {
        tracing::debug!(machine = %machine.name_any(), woken = queued.len(), "waking the machines queued behind it");
        ctx.looks.ask(&queued);
    }
}

/// Cordons and drains the Node before the reboot for drift (ADR 0066). `Some` says what the
/// reboot waits for (pods leaving, a budget, the drain's timeout, the workload API).
pub(super) async fn drain_for_reboot(
    ctx: &Context,
    r: &Rollout<'_>,
) -> Result<Option<Stop>, Error> {
    let purpose = format!("reboot for config {}", r.rendered.hash);
    let disruption =
        crate::drain::Disruption::new(ctx, r.cluster, r.machine, purpose, actions::APPLY);
    Ok(disruption.drain_or_wait().await?.err())
}

/// Once the node is back from its reboot for drift: the cordon Ichor put on its Node is
/// lifted and the drain record cleared (ADR 0066). `false`: the workload API did not answer,
/// and the turn stays open (its intent recorded) so the next look lifts it.
pub(in super::super) async fn lift_cordon(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
) -> Result<bool, Error> {
    let outcome = crate::drain::lift(ctx, cluster, machine, actions::APPLY).await?;
    Ok(matches!(outcome, crate::workload::Outcome::Done(_)))
}

/// Reboots the node into its staged config. The config is kept first, so a failure to keep it
/// never costs a second reboot, and the boot id from before the reboot (`boot`) recorded, so
/// "back" later means back from this reboot; then the reboot, announced. `Some`: the reboot
/// failed, and why.
pub(super) async fn reboot_staged(
    ctx: &Context,
    r: &Rollout<'_>,
    boot: &str,
) -> Result<Option<Stop>, Error> {
    machine_act::store_applied(ctx, r.machine, &r.rendered.yaml).await?;
    machine_act::patch_status::<MachineDrift>(ctx, r.machine, |s| {
        s.drift.boot_id = Some(boot.to_owned());
    })
    .await?;
    if let Err(error) = r.client.reboot().await {
        return Ok(Some(Stop::new(
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
    Ok(None)
}
