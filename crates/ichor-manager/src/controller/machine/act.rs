//! What the machine reconcile writes, one action each and recorded: its status (each group it
//! changes, or one group read fresh and checked against its version), its Events, its
//! applied-config Secret, its finalizer, and the first config sent to the node. Nothing here
//! decides; the reconcile (`mod.rs`) does, with `plan.rs`.

use std::collections::BTreeMap;

use ichor_api::TalosMachine;
use ichor_api::machine::{
    MachineApplied, MachineDrift, MachineEtcd, MachineInventory, MachineLifecycle, MachinePhase,
    MachineRemoval, TalosMachineStatus,
};
use ichor_api::names::{actions, conditions, labels, reasons, secrets as secret_names};
use ichor_api::status::Group;
use ichor_render::Rendered;
use ichor_talos::{ApplyMode, TalosClient};
use k8s_openapi::ByteString;
use kube::ResourceExt as _;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::plan::{self, Blocked};
use super::{APPLIED_WHAT, api, applied_config_secret};
use crate::infra::status::{self, Guard};
use crate::{Context, Error, infra::conditions as cond};

/// Writes `status` of `machine` when it changed: each group this reconcile changes, and the
/// phase gauge. Changed from the newest copy this look knows: the one it last read or wrote as
/// stored (`Looks::stored`), else the cached one; a group this look already wrote (a drift
/// intent before its apply) is not sent again.
pub(super) async fn write_status(
    ctx: &Context,
    machine: &TalosMachine,
    status: &TalosMachineStatus,
) -> Result<(), Error> {
    let kept = ctx.looks.stored(machine);
    let newest = kept.as_ref().unwrap_or(machine);
    if newest.status.as_ref() == Some(status) {
        return Ok(());
    }
    // The groups this reconcile changes; each is sent only if it did. Each is its own writer's
    // alone (ADR 0020), so the copy compared with needs no version check.
    let api = api(ctx, machine);
    let written = [
        status::apply_returning::<MachineLifecycle, _>(&api, newest, status, Guard::None).await?,
        status::apply_returning::<MachineInventory, _>(&api, newest, status, Guard::None).await?,
        status::apply_returning::<MachineApplied, _>(&api, newest, status, Guard::None).await?,
        status::apply_returning::<MachineDrift, _>(&api, newest, status, Guard::None).await?,
        status::apply_returning::<MachineEtcd, _>(&api, newest, status, Guard::None).await?,
        status::apply_returning::<MachineRemoval, _>(&api, newest, status, Guard::None).await?,
    ];
    // The last copy stored is the look's newest (`patch_status`'s base).
    if let Some(last) = written.into_iter().flatten().last() {
        ctx.looks.wrote(last);
    }
    ctx.metrics
        .phase(&machine.name_any(), status.lifecycle.phase);
    Ok(())
}

/// A machine not approved: its phase, and `Ready` False saying why (`AwaitingApproval` or
/// `Rejected`), as the docs list.
pub(super) async fn set_phase(
    ctx: &Context,
    machine: &TalosMachine,
    phase: MachinePhase,
) -> Result<(), Error> {
    let mut status = machine.status.clone().unwrap_or_default();
    status.lifecycle.phase = phase;
    let (reason, message) = if phase == MachinePhase::Rejected {
        (
            reasons::REJECTED,
            "rejected: Ichor never writes to it; set spec.approvalState: approved with a spec.role to use it",
        )
    } else {
        (
            reasons::AWAITING_APPROVAL,
            "found in maintenance mode; nothing is written to it until it is approved (spec.approvalState: approved with a spec.role)",
        )
    };
    cond::set(
        &mut status.conditions,
        conditions::READY,
        false,
        reason,
        message,
        machine.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, machine, &status).await
}

/// Stops on a problem a person must fix: condition, Event, and a wait for a change. A failed
/// install stays what `Ready` says while the first apply waits for the new certificate to be
/// confirmed.
pub(super) async fn record_blocked(
    ctx: &Context,
    machine: &TalosMachine,
    status: TalosMachineStatus,
    stop: Blocked,
) -> Result<Action, Error> {
    let stop = plan::keep_install_failure(&status, stop);
    record_stop(ctx, machine, status, stop).await?;
    Ok(Action::requeue(ctx.settings.settled_requeue))
}

/// Records a stop: phase, `Ready` false with its reason and message, and a Warning Event the
/// first time for that reason.
pub(super) async fn record_stop(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    stop: Blocked,
) -> Result<(), Error> {
    let Blocked { phase, stop } = stop;
    let first = !status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.reason == stop.reason);
    status.lifecycle.phase = phase;
    stop.set_condition(
        &mut status.conditions,
        conditions::READY,
        machine.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, machine, &status).await?;
    if first {
        stop.warn(ctx, machine, actions::RECONCILE).await;
    }
    Ok(())
}

/// Keeps the exact config applied to `machine` in its applied-config Secret (owned by the
/// machine, so collected with it), for `kubectl ichor render --diff`. Called before the hash is
/// recorded, so a recorded hash has its config stored; readers still compare the stored
/// config's hash with `status.appliedConfigHash` (a staged config whose reboot failed is kept
/// but not recorded).
pub(super) async fn store_applied(
    ctx: &Context,
    machine: &TalosMachine,
    yaml: &str,
) -> Result<(), Error> {
    let name = applied_config_secret(machine);
    let labels = BTreeMap::from([
        (labels::MACHINE.to_owned(), machine.name_any()),
        (
            labels::CLUSTER.to_owned(),
            machine.spec.cluster_ref.name.clone(),
        ),
        (
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        ),
    ]);
    let data = BTreeMap::from([(
        secret_names::APPLIED_CONFIG_KEY.to_owned(),
        ByteString(yaml.as_bytes().to_vec()),
    )]);
    // Only a Secret Ichor created for this machine is written (ADR 0053); a name held by
    // another is an error that names it, retried until the name is free.
    crate::secrets::publish(ctx, machine, (&name, APPLIED_WHAT), labels, data)
        .await?
        .map_err(Error::from)
}

/// Sends the first config over the maintenance connection: `Applying` is recorded first, then
/// the config is applied and recorded (or the node's refusal blocks).
pub(super) async fn send_first(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    rendered: &Rendered,
    client: &TalosClient,
    version: String,
    address: &str,
) -> Result<Action, Error> {
    status.lifecycle.phase = MachinePhase::Applying;
    status.inventory.talos_version = Some(version);
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_APPLIED,
        false,
        reasons::APPLYING,
        format!(
            "applying config {} over the pinned maintenance connection",
            rendered.hash
        ),
        machine.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, machine, &status).await?;
    if let Err(error) = client
        .apply_configuration(rendered.yaml.as_bytes(), ApplyMode::Auto)
        .await
    {
        let stop = Blocked::new(
            MachinePhase::Applying,
            reasons::APPLY_FAILED,
            format!("the node refused the config: {error}"),
        );
        return record_blocked(ctx, machine, status, stop).await;
    }
    let note = format!("applied config {} to {address}", rendered.hash);
    announce_applied(ctx, machine, status, rendered, note).await
}

/// Records `rendered` applied: kept in the applied-config Secret, then its hash recorded and
/// the install underway.
pub(super) async fn record_applied(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    rendered: &Rendered,
) -> Result<(), Error> {
    store_applied(ctx, machine, &rendered.yaml).await?;
    status.applied.config_hash = Some(rendered.hash.clone());
    plan::installing(
        &mut status,
        format!("config {} applied", rendered.hash),
        machine.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, machine, &status).await
}

/// Records an applied config (ours now, or an earlier one found on the node) with an Event.
pub(super) async fn announce_applied(
    ctx: &Context,
    machine: &TalosMachine,
    status: TalosMachineStatus,
    rendered: &Rendered,
    note: String,
) -> Result<Action, Error> {
    ctx.event(
        machine,
        EventType::Normal,
        reasons::CONFIG_APPLIED,
        actions::APPLY,
        note,
    )
    .await;
    record_applied(ctx, machine, status, rendered).await?;
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// Records that the node did not answer (`Ready` false, `NodeUnreachable`, with `detail`); looked
/// at again at the progress pace.
pub(super) async fn record_unreachable(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    detail: &str,
) -> Result<Action, Error> {
    cond::set(
        &mut status.conditions,
        conditions::READY,
        false,
        reasons::NODE_UNREACHABLE,
        format!("the node did not answer: {detail}"),
        machine.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, machine, &status).await?;
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// Changes the machine's status as stored with `change`, and applies group `G` of it, checked
/// against the version of the copy changed: the copy the look in flight last read or wrote as
/// stored (`Looks::stored`), else one read now; retried on a fresh copy when another write
/// came first.
pub(crate) async fn patch_status<G: Group<TalosMachineStatus>>(
    ctx: &Context,
    machine: &TalosMachine,
    change: impl Fn(&mut TalosMachineStatus),
) -> Result<(), Error> {
    let api = api(ctx, machine);
    let mut attempts = 0;
    let mut kept = ctx.looks.stored(machine);
    loop {
        // A kept copy is sent even when it holds the change already: only the apiserver tells
        // whether it is still the current version, and nothing is skipped on an older one.
        let written = match kept.take() {
            Some(copy) => {
                let mut status = copy.status.clone().unwrap_or_default();
                change(&mut status);
                status::send::<G, _>(&api, &copy, &status, Guard::Version)
                    .await
                    .map(Some)
            }
            None => {
                let fresh = api.get(&machine.name_any()).await?;
                let mut status = fresh.status.clone().unwrap_or_default();
                change(&mut status);
                status::apply_returning::<G, _>(&api, &fresh, &status, Guard::Version).await
            }
        };
        match written {
            Err(kube::Error::Api(s)) if s.is_conflict() && attempts < 5 => attempts += 1,
            Ok(written) => {
                if let Some(written) = written {
                    ctx.looks.wrote(written);
                }
                return Ok(());
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// After a reset by an operation: the node is back in maintenance mode with a new certificate,
/// nothing of the old config is on it. The pin stays, so it is never re-applied silently.
pub(crate) async fn forget_config(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    patch_status::<MachineApplied>(ctx, machine, |s| s.applied.config_hash = None).await?;
    patch_status::<MachineEtcd>(ctx, machine, |s| s.etcd.observed = None).await?;
    patch_status::<MachineLifecycle>(ctx, machine, |s| {
        s.lifecycle.etcd_member_id = None;
        s.lifecycle.phase = MachinePhase::Approved;
    })
    .await?;
    ctx.event(
        machine,
        EventType::Warning,
        reasons::RESET,
        actions::OPERATE,
        "reset by a TalosOperation: back in maintenance mode with a new certificate; approve it again by updating spec.fingerprint after checking it".into(),
    )
    .await;
    Ok(())
}

/// Keeps an adopted node's live config as its applied baseline: in its applied-config Secret,
/// then its hash, with a Normal Event saying nothing was applied.
pub(super) async fn record_baseline(
    ctx: &Context,
    machine: &TalosMachine,
    live: &str,
) -> Result<(), Error> {
    store_applied(ctx, machine, live).await?;
    let hash = ichor_render::config_hash(live);
    patch_status::<MachineApplied>(ctx, machine, |s| s.applied.config_hash = Some(hash.clone()))
        .await?;
    ctx.event(
        machine,
        EventType::Normal,
        reasons::ADOPTED,
        actions::RECONCILE,
        format!("adopted: its live config {hash} is the applied baseline; nothing was applied"),
    )
    .await;
    Ok(())
}

/// Holds the machine's removal finalizer, until the removal sequence has finished (issue: safe
/// removal).
pub(super) async fn add_removal_finalizer(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<(), Error> {
    crate::infra::finalizer::add(
        &api(ctx, machine),
        machine,
        ichor_api::names::finalizers::MACHINE_REMOVAL,
    )
    .await
}

/// Announces the machine becoming Ready, with a Normal Event saying where it stands.
pub(super) async fn announce_ready(ctx: &Context, machine: &TalosMachine, message: String) {
    ctx.event(
        machine,
        EventType::Normal,
        reasons::READY,
        actions::RECONCILE,
        message,
    )
    .await;
}
