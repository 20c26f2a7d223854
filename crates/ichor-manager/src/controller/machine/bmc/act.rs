//! What the BMC look writes: the machine's `status.bmc` group (its own field manager, so no
//! other writer's fields are touched), and an Event when `BmcReachable` changes its reason.
//! A failure to write is logged and left to the next look: nothing else of the look waits on it.

use ichor_api::TalosMachine;
use ichor_api::bmc::MachineBmc;
use ichor_api::machine::TalosMachineStatus;
use ichor_api::names::{actions, conditions};
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::plan;
use crate::Context;
use crate::infra::status::{self, Guard};

/// Writes `status`'s BMC group for `machine`, and announces a change of reachability (a
/// Warning Event for a new reason it is not reachable, a Normal one once it is again).
pub(super) async fn record(ctx: &Context, machine: &TalosMachine, status: &TalosMachineStatus) {
    let api = super::super::api(ctx, machine);
    if let Err(error) = status::apply::<MachineBmc, _>(&api, machine, status, Guard::None).await {
        tracing::warn!(
            machine = %machine.name_any(),
            error = %error,
            "writing status.bmc failed; the next look writes it again"
        );
        return;
    }
    if plan::same_reachability(machine.status.as_ref(), status) {
        return;
    }
    let Some(condition) = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::BMC_REACHABLE)
    else {
        return;
    };
    let type_ = if plan::reachable(status) {
        EventType::Normal
    } else {
        EventType::Warning
    };
    ctx.event(
        machine,
        type_,
        &condition.reason,
        actions::READ_BMC,
        condition.message.clone(),
    )
    .await;
}
