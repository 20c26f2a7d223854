//! What a sweep writes: a machine created for a UUID found (with its claim and an Event), a
//! known machine's endpoints moved and its observation recorded, and the Warnings for CIDRs
//! outside the namespace's ranges and for a UUID answering with two certificates.

use ichor_api::machine::{MachineInventory, TalosMachineStatus};
use ichor_api::names::{actions, reasons};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineSpec};
use ichor_talos::discovery::Found;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::plan::{machine_name, observation};
use crate::infra::status::{self, Guard};
use crate::{Context, Error};

/// Warns on the cluster that its discovery CIDRs `refused` lie outside its namespace's ranges.
pub(super) async fn report_refused(
    ctx: &Context,
    cluster: &TalosCluster,
    namespace: &str,
    refused: &[String],
) {
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::ADDRESS_NOT_ALLOWED,
        actions::DISCOVER,
        format!(
            "discovery CIDRs {} are not swept: they are not wholly inside the ranges TalosNamespacePolicy {namespace} allows this namespace",
            refused.join(", ")
        ),
    )
    .await;
}

/// Warns on the cluster that `uuid` answers at `addresses` with different certificates.
pub(super) async fn report_conflict(
    ctx: &Context,
    cluster: &TalosCluster,
    uuid: &str,
    addresses: &[String],
) {
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::FINGERPRINT_MISMATCH,
        actions::DISCOVER,
        format!(
            "SMBIOS UUID {uuid} answers at {} with different certificates: not recorded; machines sharing a UUID need it fixed in firmware",
            addresses.join(", ")
        ),
    )
    .await;
}

/// Creates the pending machine for `uuid` and records what was found; its name, or `None` when
/// it already exists.
pub(super) async fn create(
    ctx: &Context,
    machines: &Api<TalosMachine>,
    cluster: &TalosCluster,
    uuid: &str,
    found: &Found,
) -> Result<Option<String>, Error> {
    let name = machine_name(uuid);
    let machine = TalosMachine::discovered(
        &cluster.namespace().unwrap_or_default(),
        &name,
        uuid,
        TalosMachineSpec::pending(
            &cluster.name_any(),
            &found.address.to_string(),
            &found.fingerprint,
        ),
    );
    match machines.create(&PostParams::default(), &machine).await {
        Ok(created) => {
            write_observation(ctx, &created, found).await?;
            ctx.event(
                &created,
                EventType::Normal,
                reasons::DISCOVERED,
                actions::DISCOVER,
                format!(
                    "found in maintenance mode at {} (Talos {}, fingerprint {}); approve it to use it",
                    found.address, found.version, found.fingerprint
                ),
            )
            .await;
            // The namespace that found it in its own ranges holds it from now on (ADR 0054):
            // a machine written by hand elsewhere for the same node is refused.
            let address = found.address.to_string();
            if let Err(refused) =
                crate::claims::take(&ctx.client, &created, uuid, &found.fingerprint, &address)
                    .await?
            {
                refused.warn(ctx, &created, actions::DISCOVER).await;
            }
            Ok(Some(name))
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Moves a recorded machine's endpoints to `endpoint` (when `Some`) and records what was found.
pub(super) async fn update(
    ctx: &Context,
    machines: &Api<TalosMachine>,
    machine: &TalosMachine,
    found: &Found,
    endpoint: Option<String>,
) -> Result<(), Error> {
    if let Some(address) = endpoint {
        machines
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"endpoints": [address]}})),
            )
            .await?;
    }
    write_observation(ctx, machine, found).await
}

/// Records inventory, version and the observed fingerprint; flags a fingerprint different
/// from the pin.
async fn write_observation(
    ctx: &Context,
    machine: &TalosMachine,
    found: &Found,
) -> Result<(), Error> {
    let Some(observed) = observation(machine, found, &ctx.now()) else {
        return Ok(());
    };
    if let Some(message) = observed.newly_changed {
        ctx.event(
            machine,
            EventType::Warning,
            reasons::FINGERPRINT_MISMATCH,
            actions::DISCOVER,
            message,
        )
        .await;
    }
    write_status(ctx, machine, &observed.status).await
}

/// Writes `status` when it differs from the one stored.
async fn write_status(
    ctx: &Context,
    machine: &TalosMachine,
    status: &TalosMachineStatus,
) -> Result<(), Error> {
    // What discovery sees is the inventory group; its copy of the rest may be stale.
    if machine.status.as_ref() != Some(status) {
        let api = Api::<TalosMachine>::namespaced(
            ctx.client.clone(),
            &machine.namespace().unwrap_or_default(),
        );
        status::apply::<MachineInventory, _>(&api, machine, status, Guard::None).await?;
    }
    Ok(())
}
