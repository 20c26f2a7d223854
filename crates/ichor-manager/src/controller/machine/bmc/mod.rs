//! A machine's BMC, observed (issue 42): for a machine whose `spec.bmc` names one, its
//! system's power state and health are read at the settled pace (and at once when `spec.bmc`
//! changes) into `status.bmc` and the condition `BmcReachable`. Reads only: nothing is sent
//! that changes the machine.
//!
//! A BMC is a failure domain of its own: each call has the Redfish client's own time limits,
//! and what goes wrong (no Secret, wrong credentials, no answer, an untrusted certificate, an
//! answer not shaped as Redfish) is only `BmcReachable` false with its reason; the rest of the
//! machine's look never waits for it nor fails with it.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ichor_api::TalosMachine;
use kube::runtime::controller::Action;

use crate::Context;

mod act;
mod observe;
pub(crate) mod plan;

/// The machines whose BMC is being read now: one read per machine at a time, each in a task
/// of its own, so a slow or hung BMC holds no reconcile (of its machine or another's).
#[derive(Debug, Default)]
pub struct Reading(Mutex<BTreeSet<String>>);

/// Held while one machine's BMC is read; released on drop (a panicking read included).
struct Slot {
    ctx: Arc<Context>,
    key: String,
}

impl Reading {
    /// A slot for the machine `key`, unless its BMC is being read already.
    fn take(ctx: &Arc<Context>, key: String) -> Option<Slot> {
        // The guard goes before a slot exists: a slot's drop takes the lock.
        let taken = ctx.bmc_reads.0.lock().ok()?.insert(key.clone());
        taken.then(|| Slot {
            ctx: Arc::clone(ctx),
            key,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut set) = self.ctx.bmc_reads.0.lock() {
            set.remove(&self.key);
        }
    }
}

/// Looks at `machine`'s BMC if it is due, after the rest of its look ended with `action`;
/// returns the action, made to come back for the BMC's next read when the look would wait
/// for a change only.
pub(super) async fn look(ctx: &Arc<Context>, machine: &TalosMachine, action: Action) -> Action {
    match wait(ctx, machine).await {
        Some(next) if action == Action::await_change() => Action::requeue(next),
        _ => action,
    }
}

/// Starts reading and recording `machine`'s BMC in a task of its own if a read is due and none
/// runs; how long until its next read (`None`: the machine names no BMC). The read's status
/// write brings the machine's next look.
async fn wait(ctx: &Arc<Context>, machine: &TalosMachine) -> Option<Duration> {
    let Some(spec) = &machine.spec.bmc else {
        // A BMC no longer named: what was read of it goes.
        if let Some(status) = machine.status.as_ref().filter(|s| plan::named(s)) {
            let mut status = status.clone();
            plan::forget(&mut status);
            act::record(ctx, machine, &status).await;
        }
        return None;
    };
    let pace = crate::controller::machine::plan::settled_wait(
        ctx.settings.settled_requeue,
        ctx.metrics.machines(),
        ctx.settings.settled_looks_per_second,
    );
    let generation = machine.metadata.generation;
    if let Some(left) = plan::wait(machine.status.as_ref(), generation, &ctx.now(), pace) {
        return Some(left);
    }
    let key = format!(
        "{}/{}",
        kube::ResourceExt::namespace(machine).unwrap_or_default(),
        kube::ResourceExt::name_any(machine)
    );
    if let Some(slot) = Reading::take(ctx, key) {
        let (machine, spec) = (machine.clone(), spec.clone());
        tokio::spawn(async move {
            read_and_record(&slot.ctx, &machine, &spec).await;
            drop(slot);
        });
    }
    Some(pace)
}

/// Reads `machine`'s BMC (`observe::read`, within its limits) and records what came of it in
/// the machine's BMC status group.
async fn read_and_record(ctx: &Context, machine: &TalosMachine, spec: &ichor_api::bmc::BmcSpec) {
    let read = observe::read(ctx, machine, spec).await;
    if let Err(stop) = &read {
        tracing::info!(
            machine = %kube::ResourceExt::name_any(machine),
            reason = stop.reason,
            "the BMC was not read: {}",
            stop.message
        );
    }
    let mut status = machine.status.clone().unwrap_or_default();
    plan::record(&mut status, &read, machine.metadata.generation, &ctx.now());
    act::record(ctx, machine, &status).await;
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
