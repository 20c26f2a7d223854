//! Draining a machine's Node before a disruption (ADR 0066): before a reboot, an upgrade, a
//! drift reboot or a reset, the Node is cordoned and its pods evicted through the eviction API,
//! so PodDisruptionBudgets hold; DaemonSet and mirror pods stay (as `kubectl drain` leaves
//! them), and so do the pods `spec.drain.skipNamespaces` and `skipPods` name.
//!
//! The drain is recorded on the machine (`status.drain`, its own status group) before the
//! cordon: its purpose, its start (its timeout counts from there) and whether the Node was
//! schedulable before, so a restarted manager resumes it and knows whether the cordon is
//! Ichor's to lift. Once the machine is back, [`lift`] uncordons the Node (only then) and
//! clears the record. A removal runs the same eviction pass ([`pass`]) as its own recorded
//! step, without a record or a timeout (its skip-drain annotation is the way on).
//!
//! Reading lives in `observe.rs`, the decisions (which pods go, which budgets block, timed out
//! or not) in `plan.rs`, the writes in `act.rs`.

use ichor_api::drain::{DrainRecord, DrainSpec};
use ichor_api::machine::TalosMachineStatus;
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use kube::runtime::events::EventType;

use crate::infra::conditions as cond;
use crate::workload::{self, NodeSteps, Outcome};
use crate::{Context, Error, Stop};

mod act;
mod observe;
pub mod plan;

use plan::{Left, Limit, Verdict};

/// What a disruption says when the cluster opts out of the drain.
const DRAIN_OFF: &str =
    "the drain is off (spec.drain.enabled: false): the Node is neither cordoned nor drained";

/// The longest purpose a record keeps (the API's limit).
const PURPOSE_MAX: usize = 256;

/// A workload call's answer, or the step's outcome when it did not reach the API (ADR 0021).
macro_rules! reach {
    ($call:expr) => {
        match $call {
            Ok(value) => value,
            Err(error) => return workload::unreachable(error),
        }
    };
}

/// One pass of evictions on Node `node`: the pods `spec` evicts are evicted (those leaving
/// already are not again), and the pods it still waits for are returned, with the budgets that
/// cover them. Shared by every disruption and by the removal's drain step.
pub async fn pass(
    workload: &kube::Client,
    node: &str,
    spec: &DrainSpec,
) -> Result<Vec<Left>, kube::Error> {
    let pods = observe::pods_on(workload, node).await?;
    let to_evict: Vec<_> = pods
        .iter()
        .filter(|p| plan::evicted(spec, p) && !p.leaving)
        .collect();
    if !pods.iter().any(|p| plan::evicted(spec, p)) {
        return Ok(Vec::new());
    }
    let refused = act::evict(workload, &to_evict).await?;
    let after = observe::pods_on(workload, node).await?;
    if !after.iter().any(|p| plan::evicted(spec, p)) {
        return Ok(Vec::new());
    }
    let budgets = observe::budgets(workload).await?;
    Ok(plan::left(spec, &after, &refused, &budgets))
}

/// A disruption a machine's Node is drained for.
pub struct Disruption<'a> {
    ctx: &'a Context,
    cluster: &'a TalosCluster,
    machine: &'a TalosMachine,
    purpose: String,
    action: &'static str,
}

impl<'a> Disruption<'a> {
    /// The disruption of `machine` (of `cluster`) for `purpose` (`reboot (operation weekly)`),
    /// its Events published for `action` (a constant of `ichor_api::names::actions`).
    pub fn new(
        ctx: &'a Context,
        cluster: &'a TalosCluster,
        machine: &'a TalosMachine,
        purpose: impl Into<String>,
        action: &'static str,
    ) -> Self {
        let mut purpose: String = purpose.into();
        if purpose.len() > PURPOSE_MAX {
            let mut end = PURPOSE_MAX;
            while !purpose.is_char_boundary(end) {
                end -= 1;
            }
            purpose.truncate(end);
        }
        Self {
            ctx,
            cluster,
            machine,
            purpose,
            action,
        }
    }

    fn steps(&self) -> NodeSteps<'_> {
        NodeSteps {
            ctx: self.ctx,
            cluster: self.cluster,
            machine: self.machine,
        }
    }

    /// [`Disruption::drain`] for a disruption that cannot skip its drain: `Ok` once the Node is
    /// drained (or the drain is off, or forced), with what was done; `Err` what the disruption
    /// waits for (pods leaving, a budget, the timeout, or the workload API not answering, which
    /// it waits for too, ADR 0021).
    pub async fn drain_or_wait(&self) -> Result<Result<String, Stop>, Error> {
        let outcome = self.steps().waiting_for_api(self.drain().await?);
        Ok(match outcome {
            Outcome::Done(message) => Ok(message),
            Outcome::Wait(stop) => Err(stop),
            Outcome::Unreachable(detail) => {
                Err(Stop::new(reasons::WORKLOAD_API_UNREACHABLE, detail))
            }
        })
    }

    /// Cordons and drains the machine's Node, one pass per call: `Done` once drained (or the
    /// drain is off, or forced at its timeout), so the disruption may go; `Wait` while pods
    /// are leaving, blocked or timed out; `Unreachable` when the workload API does not answer,
    /// for the caller to decide (ADR 0021).
    pub async fn drain(&self) -> Result<Outcome, Error> {
        if !self.cluster.spec.drain.enabled {
            return Ok(Outcome::Done(DRAIN_OFF.into()));
        }
        let Some(node) = self.steps().node_name() else {
            return Ok(workload::no_node_name("drain"));
        };
        let Some(client) = workload::client(self.ctx, self.cluster).await else {
            return Ok(workload::no_workload());
        };
        let Some(stored) = observe::stored(self.ctx, self.machine).await? else {
            return Ok(Outcome::Done("the machine is gone".into()));
        };
        let status = stored.status.unwrap_or_default();
        let record = match plan::resumes(status.drain.record.as_ref(), &self.purpose) {
            Some(record) => record.clone(),
            None => {
                // Read before the cordon, and recorded before it: whether the cordon is ours.
                let Some(schedulable) = reach!(observe::schedulable(&client, &node).await) else {
                    return Ok(Outcome::Done(format!(
                        "Node {node} is not there: nothing to drain"
                    )));
                };
                let now = self.ctx.now();
                let record = plan::record_for(
                    status.drain.record.as_ref(),
                    &self.purpose,
                    schedulable,
                    &now,
                );
                self.start(&status, &record, &node).await?;
                record
            }
        };
        reach!(act::set_unschedulable(&client, &node, true).await);
        if record.drained_at.is_some() {
            return Ok(Outcome::Done(format!(
                "Node {node} is cordoned and drained"
            )));
        }
        self.evict(&client, &node, &status, record).await
    }

    /// Evicts the Node's pods once and records what that came to.
    async fn evict(
        &self,
        client: &kube::Client,
        node: &str,
        status: &TalosMachineStatus,
        record: DrainRecord,
    ) -> Result<Outcome, Error> {
        let spec = &self.cluster.spec.drain;
        let left = reach!(pass(client, node, spec).await);
        let limit = Limit::of(spec, &record.started_at, self.ctx.clock.now());
        match plan::judge(node, &left, &limit) {
            Verdict::Drained => {
                let message = format!("Node {node} is cordoned and drained for {}", record.purpose);
                self.drained(status, record, reasons::DRAINED, message.clone())
                    .await?;
                Ok(Outcome::Done(message))
            }
            Verdict::Wait(stop) => {
                let warn = stop.reason != reasons::DRAINING;
                self.set(status, Some(record), false, &stop, warn).await?;
                Ok(Outcome::Wait(stop))
            }
            Verdict::Force { pods, message } => {
                reach!(act::delete(client, &pods).await);
                self.drained(status, record, reasons::DRAIN_TIMED_OUT, message.clone())
                    .await?;
                Ok(Outcome::Done(message))
            }
        }
    }

    /// Records the drain's start (before the cordon), with an Event.
    async fn start(
        &self,
        status: &TalosMachineStatus,
        record: &DrainRecord,
        node: &str,
    ) -> Result<(), Error> {
        let spec = &self.cluster.spec.drain;
        let stop = Stop::new(
            reasons::DRAINING,
            format!(
                "cordoning and draining Node {node} for {} (timeout {}, onTimeout {:?})",
                record.purpose, spec.timeout, spec.on_timeout
            ),
        );
        self.set(status, Some(record.clone()), false, &stop, false)
            .await
    }

    /// Records the Node drained (`reason` `Drained`, or `DrainTimedOut` when forced).
    async fn drained(
        &self,
        status: &TalosMachineStatus,
        mut record: DrainRecord,
        reason: &'static str,
        message: String,
    ) -> Result<(), Error> {
        record.drained_at = Some(self.ctx.now());
        let forced = reason == reasons::DRAIN_TIMED_OUT;
        self.set(
            status,
            Some(record),
            true,
            &Stop::new(reason, message),
            forced,
        )
        .await
    }

    /// Writes the record and `Drained` (`holds`, with `stop`'s reason and message); an Event
    /// when the condition says something new (a Warning when `warn`).
    async fn set(
        &self,
        status: &TalosMachineStatus,
        record: Option<DrainRecord>,
        holds: bool,
        stop: &Stop,
        warn: bool,
    ) -> Result<(), Error> {
        let new = !status.conditions.iter().any(|c| {
            c.type_ == conditions::DRAINED && c.reason == stop.reason && c.message == stop.message
        });
        let now = self.ctx.now();
        let generation = self.machine.metadata.generation;
        act::write(self.ctx, self.machine, |s| {
            s.drain.record.clone_from(&record);
            cond::set(
                &mut s.conditions,
                conditions::DRAINED,
                holds,
                stop.reason,
                stop.message.clone(),
                generation,
                &now,
            );
        })
        .await?;
        if new {
            let kind = if warn {
                EventType::Warning
            } else {
                EventType::Normal
            };
            self.ctx
                .event(
                    self.machine,
                    kind,
                    stop.reason,
                    self.action,
                    stop.message.clone(),
                )
                .await;
        }
        Ok(())
    }
}

/// Once the machine is back and Ready after its disruption: its Node is uncordoned when the
/// record says Ichor cordoned it, then the record and `Drained` are cleared. `Done` with what
/// was done (nothing, without a record); `Unreachable` when the workload API does not answer
/// (the record stays, so the next call lifts it).
pub async fn lift(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    action: &str,
) -> Result<Outcome, Error> {
    let Some(stored) = observe::stored(ctx, machine).await? else {
        return Ok(Outcome::Done("the machine is gone".into()));
    };
    let Some(record) = stored.status.and_then(|s| s.drain.record) else {
        return Ok(Outcome::Done("no drain recorded".into()));
    };
    let steps = NodeSteps {
        ctx,
        cluster,
        machine,
    };
    let Some(node) = steps.node_name().filter(|_| record.cordoned) else {
        // Cordoned before the drain (someone else's), or no Node: left as it is.
        forget(ctx, machine).await?;
        return Ok(Outcome::Done(format!(
            "the drain for {} is over; the Node was not cordoned by it, and is left as it is",
            record.purpose
        )));
    };
    let Some(client) = workload::client(ctx, cluster).await else {
        return Ok(workload::no_workload());
    };
    reach!(act::set_unschedulable(&client, &node, false).await);
    forget(ctx, machine).await?;
    let message = format!(
        "Node {node} uncordoned: the machine is back after {}",
        record.purpose
    );
    ctx.event(
        machine,
        EventType::Normal,
        reasons::UNCORDONED,
        action,
        message.clone(),
    )
    .await;
    Ok(Outcome::Done(message))
}

/// Clears the machine's drain record and `Drained` without lifting a cordon: after a reset,
/// whose Node is deleted (the node comes back in maintenance mode and joins anew).
pub async fn forget(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    act::write(ctx, machine, |s| {
        s.drain.record = None;
        s.conditions.retain(|c| c.type_ != conditions::DRAINED);
    })
    .await
}
