//! A machine's BMC, observed (issue 42): for a machine whose `spec.bmc` names one, its
//! system's power state and health are read at the settled pace (and at once when `spec.bmc`
//! changes) into `status.bmc` and the condition `BmcReachable`. Reads only: nothing is sent
//! that changes the machine.
//!
//! A BMC is a failure domain of its own: each call has the Redfish client's own time limits,
//! and what goes wrong (no Secret, wrong credentials, no answer, an untrusted certificate, an
//! answer not shaped as Redfish) is only `BmcReachable` false with its reason; the rest of the
//! machine's look never waits for it nor fails with it.

use std::time::Duration;

use ichor_api::TalosMachine;
use kube::runtime::controller::Action;

use crate::Context;

mod act;
mod observe;
pub(crate) mod plan;

/// Looks at `machine`'s BMC if it is due, after the rest of its look ended with `action`;
/// returns the action, made to come back for the BMC's next read when the look would wait
/// for a change only.
pub(super) async fn look(ctx: &Context, machine: &TalosMachine, action: Action) -> Action {
    match wait(ctx, machine).await {
        Some(next) if action == Action::await_change() => Action::requeue(next),
        _ => action,
    }
}

/// Reads and records `machine`'s BMC if it is due; how long until its next read (`None`: the
/// machine names no BMC).
async fn wait(ctx: &Context, machine: &TalosMachine) -> Option<Duration> {
    let Some(spec) = &machine.spec.bmc else {
        // A BMC no longer named: what was read of it goes.
        if let Some(status) = machine.status.as_ref().filter(|s| plan::named(s)) {
            let mut status = status.clone();
            plan::forget(&mut status);
            act::record(ctx, machine, &status).await;
        }
        return None;
    };
    let now = ctx.now();
    let mut status = machine.status.clone().unwrap_or_default();
    let pace = crate::controller::machine::plan::settled_wait(
        ctx.settings.settled_requeue,
        ctx.metrics.machines(),
        ctx.settings.settled_looks_per_second,
    );
    let generation = machine.metadata.generation;
    if let Some(left) = plan::wait(machine.status.as_ref(), generation, &now, pace) {
        return Some(left);
    }
    let read = observe::read(ctx, machine, spec).await;
    if let Err(stop) = &read {
        tracing::info!(
            machine = %kube::ResourceExt::name_any(machine),
            reason = stop.reason,
            "the BMC was not read: {}",
            stop.message
        );
    }
    plan::record(&mut status, &read, generation, &ctx.now());
    act::record(ctx, machine, &status).await;
    Some(pace)
}

#[cfg(test)]
mod tests {
    use ichor_api::names::reasons;

    #[test]
    fn every_bmc_reason_has_a_troubleshooting_row() {
        let page = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/troubleshooting.md"
        ))
        .expect("docs/troubleshooting.md");
        let own = [
            reasons::BMC_OBSERVED,
            reasons::BMC_CREDENTIALS_MISSING,
            reasons::BMC_CA_MISSING,
            reasons::BMC_SYSTEM_NOT_FOUND,
            reasons::BMC_UUID_MISMATCH,
        ];
        for reason in reasons::BMC_CLIENT.into_iter().chain(own) {
            assert!(
                page.contains(&format!("| `{reason}` |")),
                "docs/troubleshooting.md has no row for {reason}"
            );
        }
    }
}
