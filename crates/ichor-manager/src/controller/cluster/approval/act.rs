//! What class approval writes: a machine approved (spec, role and class labels, an Event), a
//! role label, a machine's `ClassMatched` condition (set, or dropped), a class's status. Each
//! write is skipped when nothing changed.

use ichor_api::class::{ClassMatches, TalosMachineClassStatus};
use ichor_api::common::Role;
use ichor_api::machine::MachineClassMatch;
use ichor_api::names::{actions, conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::error::Error;
use crate::infra::conditions as cond;
use crate::infra::status::Guard;
use crate::{Context, infra::status};

/// Labels machine `name` with its role, so selectors (operations, storages) can use it.
pub(super) async fn label_role(
    ctx: &Context,
    cluster: &TalosCluster,
    name: &str,
    role: Role,
) -> Result<(), Error> {
    let mut marks = serde_json::Map::new();
    marks.insert(labels::ROLE.into(), json!(role.as_str()));
    let api: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    match api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": marks}})),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Approves `machine` as `class` says: role and class labels, `spec.approvalState`, the role
/// and (when the machine has none) the class's install settings, checked against the version
/// read; then `ClassMatched` and an Event. A machine changed meanwhile is left to the next
/// reconcile.
pub(super) async fn approve(
    ctx: &Context,
    machine: &TalosMachine,
    class: &TalosMachineClass,
    role: Role,
) -> Result<(), Error> {
    let name = class.name_any();
    let mut spec = json!({"approvalState": "approved", "role": role});
    if machine.spec.install.is_none()
        && let Some(install) = &class.spec.install
    {
        spec["install"] = serde_json::to_value(install)?;
    }
    let mut marks = serde_json::Map::new();
    marks.insert(labels::CLASS.into(), json!(name));
    marks.insert(labels::ROLE.into(), json!(role.as_str()));
    let patch = json!({
        "metadata": {"resourceVersion": machine.resource_version(), "labels": marks},
        "spec": spec,
    });
    let api: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    match api
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.is_conflict() => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    let message = format!("approved by TalosMachineClass {name} as {}", role.as_str());
    ctx.event(
        machine,
        EventType::Normal,
        reasons::APPROVED_BY_CLASS,
        actions::RECONCILE,
        message.clone(),
    )
    .await;
    record_match(ctx, machine, true, reasons::APPROVED_BY_CLASS, &message).await
}

/// Drops the `ClassMatched` condition of a pending machine no class matches any more (a
/// class narrowed or deleted), so it does not say why it waits for a class that is gone.
pub(super) async fn forget_match(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    let mut status = machine.status.clone().unwrap_or_default();
    let before = status.conditions.len();
    status
        .conditions
        .retain(|c| c.type_ != conditions::CLASS_MATCHED);
    if status.conditions.len() == before {
        return Ok(());
    }
    let api: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    status::apply::<MachineClassMatch, _>(&api, machine, &status, Guard::None).await?;
    Ok(())
}

/// Writes the machine's `ClassMatched` condition (its own field manager), when it changed.
pub(super) async fn record_match(
    ctx: &Context,
    machine: &TalosMachine,
    holds: bool,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let mut status = machine.status.clone().unwrap_or_default();
    let before = status.conditions.clone();
    cond::set(
        &mut status.conditions,
        conditions::CLASS_MATCHED,
        holds,
        reason,
        message,
        machine.metadata.generation,
        &ctx.now(),
    );
    if status.conditions == before {
        return Ok(());
    }
    let api: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    status::apply::<MachineClassMatch, _>(&api, machine, &status, Guard::None).await?;
    Ok(())
}

/// Writes a class's status: what it approved, what waits, and `Ready`.
pub(super) async fn write_class_status(
    ctx: &Context,
    class: &TalosMachineClass,
    mut new: TalosMachineClassStatus,
) -> Result<(), Error> {
    let old = class.status.clone().unwrap_or_default();
    new.conditions = old.conditions.clone();
    cond::set(
        &mut new.conditions,
        conditions::READY,
        true,
        reasons::CLASS_ACTIVE,
        format!(
            "approves pending machines of TalosCluster {} that match; {} approved, {} waiting",
            class.spec.cluster_ref.name,
            new.matches.machines.len(),
            new.matches.waiting.len()
        ),
        class.metadata.generation,
        &ctx.now(),
    );
    if old.conditions == new.conditions
        && old.matches.machines == new.matches.machines
        && old.matches.waiting == new.matches.waiting
        && old.matches.matched_machines == new.matches.matched_machines
    {
        return Ok(());
    }
    let api: Api<TalosMachineClass> =
        Api::namespaced(ctx.client.clone(), &class.namespace().unwrap_or_default());
    status::apply::<ClassMatches, _>(&api, class, &new, Guard::None).await?;
    Ok(())
}
