//! A rollout's forecast: the batches a change reaches the machines in, in order, and what holds
//! it now. `kubectl ichor plan` prints it for a reviewer before a change is merged.
//!
//! Nothing here decides a second time. [`forecast`](crate::forecast::forecast) drives [`rollout::decide`] as the
//! manager's looks would, batch after batch, assuming each batch ends healthy: a machine in
//! flight ends, a machine recorded unhealthy is waited for (and named) and then taken as
//! healthy again, and the policy's holds that only time or a person lifts (a suspend, a closed
//! window, a halt) are lifted, after being reported (a [`Hold`](crate::forecast::Hold) each). The machines come in as the
//! drift rollout sees them ([`DriftMachine`]): a machine the change leaves as it is has no
//! step, and a machine never configured is no member of the rollout, as [`crate::drift_turn`]
//! has it.
//!
//! What the forecast cannot know is left to the caller: the health gates' results (they read
//! the workload cluster), how old the last backup will be when a control plane's turn comes,
//! and whether a node takes a changed config live (the node decides).

use jiff::Timestamp;

use crate::drift::{DriftHalt, DriftMachine, halt_stands};
use crate::rollout::{
    self, Backups, Change, Decision, Facts, Policy, RolloutMachine, Window, window_open,
};
use ichor_api::common::Role;

/// One machine as the forecast sees it: as the drift rollout does, with what its step does to
/// its node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    /// The machine: its role, the config rendered for it after the change and the one it
    /// applied, its health, whether it leaves, the upgrade it needs.
    pub drift: DriftMachine,
    /// What its step does to its node, if it drifted: live, or disruptive (an upgrade, a
    /// reboot, a restarted service).
    pub change: Change,
    /// Whether its step started and has not ended.
    pub in_flight: bool,
    /// The value of the policy's failure-domain label on it, if any.
    pub failure_domain: Option<String>,
}

impl Planned {
    /// `drift`, whose step (if it drifted) does `change`, not in flight, in no failure domain.
    pub fn new(drift: DriftMachine, change: Change) -> Self {
        Self {
            drift,
            change,
            in_flight: false,
            failure_domain: None,
        }
    }

    /// The same machine, in failure domain `domain`.
    #[must_use]
    pub fn in_domain(mut self, domain: &str) -> Self {
        self.failure_domain = Some(domain.to_owned());
        self
    }

    /// The same machine, its step in flight.
    #[must_use]
    pub fn in_flight(mut self) -> Self {
        self.in_flight = true;
        self
    }

    /// The machine as [`rollout::decide`] takes it.
    fn view(&self) -> RolloutMachine {
        let d = &self.drift;
        RolloutMachine {
            name: d.name.clone(),
            role: d.role,
            change: d.drifted().then_some(self.change),
            in_flight: self.in_flight,
            healthy: d.healthy && !self.in_flight,
            // Never configured: no drift target, never waited for (as `drift_turn` has it).
            leaving: d.leaving || d.applied.is_none(),
            failure_domain: self.failure_domain.clone(),
        }
    }
}

/// One batch: machines that start together once the batch before ended healthy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Its machines, in rollout order.
    pub machines: Vec<String>,
    /// The machines it waits for first: in flight, or recorded unhealthy (the forecast takes
    /// them as healthy again afterwards).
    pub waits_for: Vec<String>,
    /// Whether its start is one a maintenance window (and so the health gates) holds: a
    /// disruptive step, or a live one under `holdLiveChanges`.
    pub held: bool,
    /// Whether it disrupts a control plane under a fresh-backup policy, on a cluster that
    /// backs up: a backup no older than the policy's age comes first.
    pub fresh_backup: bool,
}

/// The batch of `names` starting on `view`, after the machines `waits_for` names.
fn batch(
    view: &[RolloutMachine],
    names: &[String],
    inputs: &Inputs<'_>,
    waits_for: &mut Vec<String>,
) -> Batch {
    let members: Vec<&RolloutMachine> = view.iter().filter(|m| names.contains(&m.name)).collect();
    let disrupts_control_plane = members
        .iter()
        .any(|m| m.role == Role::ControlPlane && m.change == Some(Change::Disruptive));
    Batch {
        machines: names.to_vec(),
        waits_for: std::mem::take(waits_for),
        held: members.iter().any(|m| held(inputs.policy, m.change)),
        fresh_backup: inputs.policy.fresh_backup.is_some()
            && inputs.backups.configured
            && disrupts_control_plane,
    }
}

/// What holds the rollout now, beyond the order: lifted by time or by a person.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// The rollout stopped at `machine`, which refused its change; the change forecast does
    /// not lift it (it still renders what was refused).
    Halted {
        /// The machine that refused.
        machine: String,
    },
    /// The policy is suspended: the machines in flight finish, no other starts.
    Suspended,
    /// A batch a window holds is to start, and every window is closed now.
    OutsideWindow {
        /// When the next window opens, if any schedule names a later time.
        opens: Option<Timestamp>,
        /// That window, as written.
        window: Option<String>,
    },
}

/// The forecast of a rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forecast {
    /// What [`rollout::decide`] says now, on the facts as given.
    pub now: Decision,
    /// The batches, in order.
    pub batches: Vec<Batch>,
    /// What holds the rollout now.
    pub holds: Vec<Hold>,
    /// The machine of a recorded halt that no longer stands (the change renders its config
    /// differently, or changes its installer): the rollout resumes.
    pub halt_lifted: Option<String>,
}

/// What the forecast is made from.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    /// Every machine of the cluster.
    pub machines: &'a [Planned],
    /// The rollout policy.
    pub policy: &'a Policy,
    /// The halt recorded on the cluster, if any.
    pub halt: Option<&'a DriftHalt>,
    /// The backups.
    pub backups: Backups,
    /// Now.
    pub now: Timestamp,
}

/// Whether the policy holds `change` for a window (as `rollout::decide` judges it).
fn held(policy: &Policy, change: Option<Change>) -> bool {
    match change {
        Some(Change::Disruptive) => true,
        Some(Change::Live) => policy.hold_live_changes,
        None => false,
    }
}

/// The forecast: what [`rollout::decide`] says now, then the batches it starts one after
/// another with every hold lifted and each batch ending healthy, and the holds it lifted.
pub fn forecast(inputs: &Inputs<'_>) -> Forecast {
    let drifts: Vec<DriftMachine> = inputs.machines.iter().map(|p| p.drift.clone()).collect();
    let standing = inputs.halt.filter(|h| halt_stands(&drifts, h));
    let halt_lifted = inputs
        .halt
        .filter(|_| standing.is_none())
        .map(|h| h.machine.clone());
    let view: Vec<RolloutMachine> = inputs.machines.iter().map(Planned::view).collect();
    let now = rollout::decide(&Facts {
        machines: &view,
        policy: inputs.policy,
        halted: standing.map(|h| h.machine.as_str()),
        gates: &[],
        backups: inputs.backups,
        now: inputs.now,
    });
    let batches = batches(view, inputs);
    let holds = holds(inputs, standing, &batches);
    Forecast {
        now,
        batches,
        holds,
        halt_lifted,
    }
}

/// The batches [`rollout::decide`] starts one after another, on `view`, with the suspend, the
/// windows, the gates, the backup and the halt lifted, each batch ending healthy.
fn batches(mut view: Vec<RolloutMachine>, inputs: &Inputs<'_>) -> Vec<Batch> {
    let free = Policy {
        windows: Vec::new(),
        suspended: false,
        fresh_backup: None,
        ..inputs.policy.clone()
    };
    let mut batches = Vec::new();
    let mut waits_for = Vec::new();
    // Each turn of the loop starts a batch or ends a wait, each at most once per machine.
    for _ in 0..=2 * view.len() {
        let decision = rollout::decide(&Facts {
            machines: &view,
            policy: &free,
            halted: None,
            gates: &[],
            backups: Backups::default(),
            now: inputs.now,
        });
        let (names, step_ends) = match decision {
            Decision::Start { machines, .. } => {
                batches.push(batch(&view, &machines, inputs, &mut waits_for));
                (machines, true)
            }
            Decision::InFlight { in_flight } => {
                waits_for.extend(in_flight.iter().cloned());
                (in_flight, true)
            }
            Decision::WaitForHealthy { machine } => {
                waits_for.push(machine.clone());
                (vec![machine], false)
            }
            // Nothing left; the other answers cannot come with every hold lifted.
            _ => break,
        };
        let mut moved = false;
        for m in view.iter_mut().filter(|m| names.contains(&m.name)) {
            // Healthy again; a step started or in flight ends.
            if step_ends {
                m.change = None;
                m.in_flight = false;
            }
            m.healthy = true;
            moved = true;
        }
        if !moved {
            break;
        }
    }
    batches
}

/// What holds the rollout now: the halt that stands, a suspend with something to roll out, and
/// closed windows when a batch they hold is to start.
fn holds(inputs: &Inputs<'_>, standing: Option<&DriftHalt>, batches: &[Batch]) -> Vec<Hold> {
    let mut holds = Vec::new();
    if let Some(halt) = standing {
        holds.push(Hold::Halted {
            machine: halt.machine.clone(),
        });
    }
    if inputs.policy.suspended && !batches.is_empty() {
        holds.push(Hold::Suspended);
    }
    if batches.iter().any(|b| b.held)
        && let Err(next) = window_open(&inputs.policy.windows, inputs.now)
    {
        holds.push(Hold::OutsideWindow {
            opens: next.map(|(at, _)| at),
            window: next.map(|(_, w): (Timestamp, &Window)| w.to_string()),
        });
    }
    holds
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::drift::{DriftTurn, drift_turn};
    use crate::rollout::MaxUnavailable;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    /// A machine of `role` whose config changes (`h1` applied, `h2` rendered), its step `change`.
    fn changed(name: &str, role: Role, change: Change) -> Planned {
        Planned::new(DriftMachine::new(name, role, "h1", "h2"), change)
    }

    fn cp(name: &str) -> Planned {
        changed(name, Role::ControlPlane, Change::Disruptive)
    }

    fn worker(name: &str) -> Planned {
        changed(name, Role::Worker, Change::Disruptive)
    }

    /// A machine the change leaves as it is.
    fn same(name: &str, role: Role) -> Planned {
        Planned::new(DriftMachine::new(name, role, "h1", "h1"), Change::Live)
    }

    fn run(machines: &[Planned], policy: &Policy) -> Forecast {
        forecast(&Inputs {
            machines,
            policy,
            halt: None,
            backups: Backups::default(),
            now: at("2026-12-07T12:00:00Z"),
        })
    }

    fn order(f: &Forecast) -> Vec<Vec<&str>> {
        f.batches
            .iter()
            .map(|b| b.machines.iter().map(String::as_str).collect())
            .collect()
    }

    #[test]
    fn control_planes_go_one_at_a_time_before_any_worker() {
        let machines = [worker("w-2"), cp("cp-2"), worker("w-1"), cp("cp-1")];
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(5),
            ..Policy::default()
        };
        let f = run(&machines, &policy);
        assert_eq!(order(&f), [vec!["cp-1"], vec!["cp-2"], vec!["w-1", "w-2"]]);
        assert_eq!(f.now.starts(), ["cp-1"]);
        assert!(f.holds.is_empty());
    }

    #[test]
    fn max_unavailable_two_gives_batches_of_two_workers() {
        let machines = [
            cp("cp-1"),
            worker("w-1"),
            worker("w-2"),
            worker("w-3"),
            worker("w-4"),
            worker("w-5"),
        ];
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(2),
            ..Policy::default()
        };
        assert_eq!(
            order(&run(&machines, &policy)),
            [
                vec!["cp-1"],
                vec!["w-1", "w-2"],
                vec!["w-3", "w-4"],
                vec!["w-5"]
            ]
        );
    }

    #[test]
    fn failure_domains_split_batches() {
        let machines = [
            cp("cp-1"),
            worker("w-1").in_domain("a"),
            worker("w-2").in_domain("a"),
            worker("w-3").in_domain("b"),
            worker("w-4").in_domain("b"),
        ];
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(3),
            spread_failure_domains: true,
            ..Policy::default()
        };
        assert_eq!(
            order(&run(&machines, &policy)),
            [vec!["cp-1"], vec!["w-1", "w-3"], vec!["w-2", "w-4"]]
        );
    }

    #[test]
    fn an_unhealthy_machine_is_waited_for_and_named_before_the_next_batch() {
        let mut sick = same("w-0", Role::Worker);
        sick.drift.healthy = false;
        let machines = [cp("cp-1"), sick, worker("w-1"), worker("w-2")];
        let f = run(&machines, &Policy::default());
        assert_eq!(
            f.now,
            Decision::WaitForHealthy {
                machine: "w-0".into()
            }
        );
        assert_eq!(order(&f), [vec!["cp-1"], vec!["w-1"], vec!["w-2"]]);
        assert_eq!(f.batches[0].waits_for, ["w-0"]);
        assert!(f.batches[1].waits_for.is_empty());
        // A machine in flight is waited for too, then ends.
        let machines = [cp("cp-1").in_flight(), cp("cp-2"), worker("w-1")];
        let f = run(&machines, &Policy::default());
        assert!(matches!(f.now, Decision::InFlight { .. }), "{:?}", f.now);
        assert_eq!(order(&f), [vec!["cp-2"], vec!["w-1"]]);
        assert_eq!(f.batches[0].waits_for, ["cp-1"]);
    }

    #[test]
    fn with_one_at_a_time_the_order_is_the_drift_turns() {
        let mut machines = vec![
            worker("b"),
            same("a", Role::Worker),
            cp("cp-3"),
            worker("a2"),
            cp("cp-1"),
            same("cp-2", Role::ControlPlane),
        ];
        let f = run(&machines, &Policy::default());
        let mut turns = Vec::new();
        while let DriftTurn::Next { machine, .. } = drift_turn(
            &machines.iter().map(|p| p.drift.clone()).collect::<Vec<_>>(),
            None,
        ) {
            let done = machines
                .iter_mut()
                .find(|p| p.drift.name == machine)
                .expect("a machine");
            done.drift.applied = Some(done.drift.rendered.clone());
            turns.push(vec![machine]);
        }
        let forecast: Vec<Vec<String>> = f.batches.iter().map(|b| b.machines.clone()).collect();
        assert_eq!(forecast, turns);
        assert_eq!(turns.len(), 4);
    }

    #[test]
    fn machines_leaving_or_never_configured_get_nothing_and_hold_nothing() {
        let mut fresh = worker("w-0");
        fresh.drift.applied = None;
        fresh.drift.healthy = false;
        let mut leaving = cp("cp-0");
        leaving.drift.leaving = true;
        leaving.drift.healthy = false;
        let machines = [leaving, cp("cp-1"), fresh, worker("w-1")];
        let f = run(&machines, &Policy::default());
        assert_eq!(order(&f), [vec!["cp-1"], vec!["w-1"]]);
        assert!(f.batches.iter().all(|b| b.waits_for.is_empty()));
    }

    #[test]
    fn a_suspend_a_closed_window_and_a_standing_halt_are_holds() {
        let nightly = Window::parse("0 22 * * *", Duration::from_secs(4 * 3600), "UTC").unwrap();
        let policy = Policy {
            windows: vec![nightly],
            suspended: true,
            ..Policy::default()
        };
        let machines = [cp("cp-1"), worker("w-1")];
        let halt = DriftHalt {
            machine: "cp-1".into(),
            rendered: "h2".into(),
        };
        let f = forecast(&Inputs {
            machines: &machines,
            policy: &policy,
            halt: Some(&halt),
            backups: Backups::default(),
            now: at("2026-12-07T12:00:00Z"),
        });
        assert_eq!(
            f.holds,
            [
                Hold::Halted {
                    machine: "cp-1".into()
                },
                Hold::Suspended,
                Hold::OutsideWindow {
                    opens: Some(at("2026-12-07T22:00:00Z")),
                    window: Some("0 22 * * * (UTC) for 4h".into()),
                },
            ]
        );
        assert_eq!(
            f.now,
            Decision::Halted {
                machine: "cp-1".into()
            }
        );
        // The order is forecast all the same, as it goes once the holds are lifted.
        assert_eq!(order(&f), [vec!["cp-1"], vec!["w-1"]]);
        assert!(f.batches.iter().all(|b| b.held));
        assert_eq!(f.halt_lifted, None);
    }

    #[test]
    fn a_change_that_renders_the_halted_config_differently_lifts_the_halt() {
        let halt = DriftHalt {
            machine: "cp-1".into(),
            rendered: "bad".into(),
        };
        let machines = [cp("cp-1"), worker("w-1")];
        let f = forecast(&Inputs {
            machines: &machines,
            policy: &Policy::default(),
            halt: Some(&halt),
            backups: Backups::default(),
            now: at("2026-12-07T12:00:00Z"),
        });
        assert_eq!(f.halt_lifted.as_deref(), Some("cp-1"));
        assert!(f.holds.is_empty());
        assert_eq!(f.now.starts(), ["cp-1"]);
    }

    #[test]
    fn live_changes_are_not_held_by_a_closed_window_unless_the_policy_says_so() {
        let nightly = Window::parse("0 22 * * *", Duration::from_secs(4 * 3600), "UTC").unwrap();
        let mut policy = Policy {
            windows: vec![nightly],
            ..Policy::default()
        };
        let machines = [
            changed("cp-1", Role::ControlPlane, Change::Live),
            changed("w-1", Role::Worker, Change::Live),
        ];
        let f = run(&machines, &policy);
        assert!(f.holds.is_empty());
        assert!(f.batches.iter().all(|b| !b.held));
        assert_eq!(f.now.starts(), ["cp-1"]);
        policy.hold_live_changes = true;
        let f = run(&machines, &policy);
        assert!(matches!(f.holds[..], [Hold::OutsideWindow { .. }]));
        assert!(matches!(f.now, Decision::OutsideWindow { .. }));
    }

    #[test]
    fn a_disrupted_control_plane_asks_a_fresh_backup_where_the_cluster_backs_up() {
        let policy = Policy {
            fresh_backup: Some(Duration::from_secs(3600)),
            ..Policy::default()
        };
        let machines = [
            cp("cp-1"),
            changed("cp-2", Role::ControlPlane, Change::Live),
            worker("w-1"),
        ];
        let backups = Backups {
            configured: true,
            last_success: None,
            running: false,
        };
        let f = forecast(&Inputs {
            machines: &machines,
            policy: &policy,
            halt: None,
            backups,
            now: at("2026-12-07T12:00:00Z"),
        });
        let fresh: Vec<bool> = f.batches.iter().map(|b| b.fresh_backup).collect();
        assert_eq!(fresh, [true, false, false]);
        assert!(matches!(f.now, Decision::NeedsBackup { request: true, .. }));
        let f = run(&machines, &policy);
        assert!(f.batches.iter().all(|b| !b.fresh_backup));
    }

    #[test]
    fn nothing_changed_forecasts_nothing() {
        let machines = [same("cp-1", Role::ControlPlane), same("w-1", Role::Worker)];
        let policy = Policy {
            suspended: true,
            ..Policy::default()
        };
        let f = run(&machines, &policy);
        assert_eq!(f.now, Decision::Settled);
        assert!(f.batches.is_empty());
        assert!(f.holds.is_empty());
    }
}
