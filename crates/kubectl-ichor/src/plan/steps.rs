//! The report's parts from the prediction and the forecast: each machine's step, the batches
//! with what stands before each (drains, windows, gates, a fresh backup), the holds now, and
//! the notes on what the plan cannot know.

use std::collections::BTreeSet;

use ichor_api::common::Role;
use ichor_api::names::reasons;
use ichor_api::rollout::RolloutPolicy;
use ichor_deleteguard::forecast::{Forecast, Hold};
use ichor_deleteguard::rollout::{Change, Decision, Policy, window_open};

use super::policy::age;
use super::predict::{How, Observed, Predicted, Step};
use super::report::{BatchStep, HoldNow, MachineStep};

/// The policy governing a machine: where it is declared, as written, and as read.
pub type Governing<'a> = (String, &'a RolloutPolicy, Policy);

/// Whether the cluster drains its Nodes before a disruption (`spec.drain.enabled`).
fn drains(o: &Observed<'_>) -> bool {
    o.changed.spec.drain.enabled
}

/// What one machine gets.
pub fn machine_step(p: &Predicted<'_>, policy: &str, o: &Observed<'_>) -> MachineStep {
    let (change, how, drain, detail) = described(p, o);
    let detail = if p.already {
        format!("{detail} (a change already rolling out)")
    } else {
        detail
    };
    MachineStep {
        name: p.drift.name.clone(),
        role: p.drift.role.as_str().to_owned(),
        change: change.to_owned(),
        how: how.to_owned(),
        predicted: matches!(p.step, Step::Config(_)),
        upgrade_to: match &p.step {
            Step::Upgrade { image, .. } => Some(image.clone()),
            _ => None,
        },
        config_changes: matches!(
            p.step,
            Step::Config(_) | Step::Restart | Step::Upgrade { config: true, .. }
        ),
        drain: drain.to_owned(),
        policy: policy.to_owned(),
        detail,
    }
}

/// A machine's step in words: its change, how it reaches the node, whether its Node is
/// drained, and a sentence.
fn described(
    p: &Predicted<'_>,
    o: &Observed<'_>,
) -> (&'static str, &'static str, &'static str, String) {
    let running = p
        .machine
        .status
        .as_ref()
        .and_then(|s| s.inventory.talos_version.clone())
        .unwrap_or_else(|| "an unreported version".to_owned());
    let drain = |yes: &'static str| if drains(o) { yes } else { "no" };
    match &p.step {
        Step::Nothing => ("none", "none", "no", "nothing changes".to_owned()),
        Step::Config(How::Live) => (
            "config",
            "live",
            "no",
            format!(
                "its config changes; predicted live: the node runs Talos {running}, which applies every change live (talos-facts §5); the node decides: if it refuses, the config is staged and the node rebooted, after a drain"
            ),
        ),
        Step::Config(How::NodeDecides) => (
            "config",
            "node-decides",
            drain("if-it-reboots"),
            format!(
                "its config changes; the node decides: Talos {running} applies it live when it can, else the config is staged and the node rebooted, after a drain"
            ),
        ),
        Step::Upgrade { image, config } => (
            "upgrade",
            "reboot",
            drain("yes"),
            format!(
                "upgraded to Talos {} with {image}{}: its Node cordoned and drained, then the node rebooted into it",
                o.changed.spec.talos_version,
                if *config { " (its changed config applied first)" } else { "" }
            ),
        ),
        Step::Restart => (
            "restart",
            "restart",
            "no",
            "its config changes with the Kubernetes version: applied live, restarting its Kubernetes components in talosctl upgrade-k8s's order (ADR 0070)".to_owned(),
        ),
    }
}

/// The batches, with what stands before each.
pub fn batches(
    f: &Forecast,
    machines: &[MachineStep],
    governing: &[Governing<'_>],
    cluster: &Policy,
) -> Vec<BatchStep> {
    f.batches
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let members: Vec<usize> = machines
                .iter()
                .enumerate()
                .filter(|(_, m)| b.machines.contains(&m.name))
                .map(|(i, _)| i)
                .collect();
            let gates: BTreeSet<String> = members
                .iter()
                .filter(|_| b.held)
                .flat_map(|i| governing[*i].1.health_gates.iter())
                .map(|g| format!("{} ({} {})", g.name, g.kind, g.api_version))
                .collect();
            let upgrades_control_plane = members.iter().any(|i| {
                machines[*i].role == Role::ControlPlane.as_str() && machines[*i].change == "upgrade"
            });
            BatchStep {
                number: i + 1,
                machines: b.machines.clone(),
                waits_for: b.waits_for.clone(),
                drains: members
                    .iter()
                    .filter(|i| machines[**i].drain != "no")
                    .map(|i| machines[*i].name.clone())
                    .collect(),
                // Held by a window only where one is declared.
                window: b.held && members.iter().any(|i| !governing[*i].2.windows.is_empty()),
                gates: gates.into_iter().collect(),
                // Asked where a control plane's upgrade or reboot starts, not for a
                // Kubernetes restart (ADR 0075).
                fresh_backup: cluster
                    .fresh_backup
                    .filter(|_| b.fresh_backup && upgrades_control_plane)
                    .map(|d| format!("no older than {}", age(d))),
            }
        })
        .collect()
}

/// Whether `step` under `policy` is one a window (and so the gates) holds.
fn held(step: &Step, policy: &Policy) -> bool {
    match step.change() {
        Change::Disruptive => true,
        Change::Live => !matches!(step, Step::Nothing) && policy.hold_live_changes,
    }
}

/// A closed window of `policy`, declared at `field`, as a hold.
fn window_hold(policy: &Policy, field: &str, o: &Observed<'_>) -> Option<HoldNow> {
    let Err(next) = window_open(&policy.windows, o.now) else {
        return None;
    };
    let when = match next {
        Some((at, window)) => format!("the next opens at {at} ({window})"),
        None => "no window's schedule names a later time".to_owned(),
    };
    Some(HoldNow {
        reason: reasons::OUTSIDE_MAINTENANCE_WINDOW.to_owned(),
        message: format!(
            "the steps a window holds wait: outside every maintenance window of {field}; {when}"
        ),
        until: next.map(|(at, _)| at.to_string()),
    })
}

/// What holds the rollout now: the forecast's holds for the cluster's policy, each class
/// policy's own, and why the first batch cannot start at once.
pub fn holds(
    f: &Forecast,
    predicted: &[Predicted<'_>],
    governing: &[Governing<'_>],
    o: &Observed<'_>,
) -> Vec<HoldNow> {
    let mut holds: Vec<HoldNow> = Vec::new();
    let held_by = |field: &str| {
        predicted
            .iter()
            .zip(governing)
            .any(|(p, g)| g.0 == field && held(&p.step, &g.2))
    };
    for hold in &f.holds {
        holds.extend(match hold {
            Hold::Halted { machine } => Some(halted(machine, o)),
            Hold::Suspended => Some(HoldNow {
                reason: reasons::ROLLOUT_SUSPENDED.to_owned(),
                message: "spec.rollout.suspend is true: no machine starts its step until it is false (a machine in flight finishes)".to_owned(),
                until: None,
            }),
            Hold::OutsideWindow { .. } if held_by("spec.rollout") => {
                governing.iter().find(|g| g.0 == "spec.rollout").and_then(|g| window_hold(&g.2, &g.0, o))
            }
            Hold::OutsideWindow { .. } => None,
        });
    }
    let mut seen = BTreeSet::new();
    for (field, _, policy) in governing.iter().filter(|g| g.0 != "spec.rollout") {
        if !held_by(field) || !seen.insert(field.clone()) {
            continue;
        }
        if policy.suspended {
            holds.push(HoldNow {
                reason: reasons::ROLLOUT_SUSPENDED.to_owned(),
                message: format!(
                    "{field}.suspend is true: its machines start no step until it is false"
                ),
                until: None,
            });
        }
        holds.extend(window_hold(policy, field, o));
    }
    holds.extend(first_batch_wait(&f.now, o));
    holds
}

/// The halt recorded at `machine`, which the change does not lift.
fn halted(machine: &str, o: &Observed<'_>) -> HoldNow {
    let said = o
        .live
        .status
        .as_ref()
        .and_then(|s| s.drift.halt.as_ref())
        .map(|h| h.message.clone())
        .unwrap_or_default();
    HoldNow {
        reason: reasons::DRIFT_HALTED.to_owned(),
        message: format!(
            "the rollout stopped at {machine}, which refused its change ({said}); this change does not render {machine}'s config (or installer) differently, so it stays stopped: fix what {machine} refused"
        ),
        until: None,
    }
}

/// Why the first batch does not start at once, beyond the policy's holds.
fn first_batch_wait(now: &Decision, o: &Observed<'_>) -> Option<HoldNow> {
    let (reason, message) = match now {
        Decision::NeedsBackup { last_success, .. } => {
            let last = last_success.map_or_else(|| "none".to_owned(), |t| t.to_string());
            let max = o
                .changed
                .spec
                .rollout
                .fresh_backup
                .as_ref()
                .map(|f| f.max_age.clone())
                .unwrap_or_default();
            (
                reasons::WAITING_FOR_FRESH_BACKUP,
                format!(
                    "a control plane is disrupted first and the last successful backup ({last}) is older than spec.rollout.freshBackup.maxAge ({max}): the rollout takes a backup first"
                ),
            )
        }
        Decision::WaitForHealthy { machine } => (
            reasons::DRIFT_QUEUED,
            format!(
                "the first batch waits for {machine} to be healthy again (Ready, and for a control plane a healthy etcd voter)"
            ),
        ),
        Decision::InFlight { in_flight } => (
            reasons::DRIFT_QUEUED,
            format!(
                "{} in flight: the next batch starts once it ends healthy",
                in_flight.join(", ")
            ),
        ),
        _ => return None,
    };
    Some(HoldNow {
        reason: reason.to_owned(),
        message,
        until: None,
    })
}

/// What the plan cannot know, and what else a reviewer should read.
pub fn notes(
    predicted: &[Predicted<'_>],
    f: &Forecast,
    gates: bool,
    o: &Observed<'_>,
) -> Vec<String> {
    let mut notes = Vec::new();
    let any = |pick: fn(&Step) -> bool| predicted.iter().any(|p| pick(&p.step));
    if any(|s| matches!(s, Step::Config(How::Live))) {
        notes.push("live is a prediction: Talos 1.14 and newer apply every config change live (AUTO resolves to NO_REBOOT: talos-facts §5, docs/talos-facts.md §11.1 step 9); the node decides, and one that refuses gets the config staged and is rebooted after a drain, when the rollout policy lets a reboot start".to_owned());
    }
    if any(|s| matches!(s, Step::Config(How::NodeDecides))) {
        notes.push("node-decides: Talos 1.13 and older apply a change live only when it can be applied at once (CanApplyImmediate, docs/talos-facts.md §11.1 step 9), which cannot be known before the node is asked".to_owned());
    }
    if any(|s| matches!(s, Step::Restart)) {
        notes.push("a Kubernetes version rolls out component by component (talosctl upgrade-k8s's order, ADR 0070): each machine's config is applied more than once, in the batches' order".to_owned());
    }
    if o.live.spec.talos_version != o.changed.spec.talos_version
        && o.live.spec.kubernetes_version != o.changed.spec.kubernetes_version
    {
        notes.push("both versions change: the manager takes one step at a time (ADR 0069), Talos first unless only Kubernetes first stays inside Talos's support matrix; the plan shows where both lead".to_owned());
    }
    if let Some(machine) = &f.halt_lifted {
        notes.push(format!("the rollout stopped at {machine} resumes: this change renders its config (or installer) differently"));
    }
    if f.batches.len() > 1 {
        notes.push("each batch is forecast assuming the one before ends healthy".to_owned());
    }
    if gates {
        notes.push("health gates are listed, not evaluated: they read the workload cluster, which plan does not reach; a failing gate holds the batch it is listed for".to_owned());
    }
    notes.push("the apiserver's own checks (the CRD's rules, the kube-proxy switch policy) are not run here: `kubectl apply --dry-run=server -f FILE` runs them".to_owned());
    notes
}
