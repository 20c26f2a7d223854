//! Drift rollout: a changed config reaches the machines of a cluster one at a time, in one
//! order, each only while every other machine is healthy, and the first refusal stops it.
//!
//! Drift is a config that renders differently from what a machine last applied (a cluster-wide
//! `configPatches` edit, a machine's own patch, a Kubernetes version), or a node that runs
//! another Talos than the cluster declares (its version, or its installer's schematic): an
//! upgrade, rolled out in the same order, one machine at a time (ADR 0068). It is disruptive even
//! when it applies live: one bad patch that reached every control plane at once could take the
//! whole control plane down. So the machine whose turn it is ([`drift_turn`]) applies under
//! the cluster lock, as a removal or an operation does, and the next waits until it is healthy
//! again. A first apply to a newly approved machine is not drift and is not ordered here.
//!
//! The order (ADR 0019): control planes first, then workers, each group by name. Control planes
//! first because a worker's kubelet and its Talos services follow the control plane's versions,
//! and because a bad control-plane patch then stops at the first control plane, where etcd's
//! health between control planes catches it, before any worker took it.

use ichor_api::common::Role;

/// One machine of the cluster as the rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftMachine {
    /// `metadata.name`.
    pub name: String,
    /// `spec.role`.
    pub role: Role,
    /// The hash of the config rendered for it now.
    pub rendered: String,
    /// The hash it last applied; `None` if it was never configured (a first apply, not drift).
    pub applied: Option<String>,
    /// Whether it is healthy as last recorded: Ready, and for a control plane a healthy etcd
    /// voter.
    pub healthy: bool,
    /// Whether it is leaving (being deleted or removed): never a drift target, never waited for.
    pub leaving: bool,
    /// The installer image it is to be upgraded with, when its node runs another Talos version
    /// or schematic than declared (or its upgrade is in flight).
    pub upgrade: Option<String>,
}

impl DriftMachine {
    /// A healthy machine of `role` that applied `applied` and now renders `rendered`.
    pub fn new(name: impl Into<String>, role: Role, applied: &str, rendered: &str) -> Self {
        Self {
            name: name.into(),
            role,
            rendered: rendered.to_owned(),
            applied: Some(applied.to_owned()),
            healthy: true,
            leaving: false,
            upgrade: None,
        }
    }

    /// The same machine, its node to be upgraded with `image`.
    #[must_use]
    pub fn upgrading(mut self, image: &str) -> Self {
        self.upgrade = Some(image.to_owned());
        self
    }

    /// The same machine, recorded unhealthy.
    #[must_use]
    pub fn unhealthy(mut self) -> Self {
        self.healthy = false;
        self
    }

    /// The same machine, leaving the cluster.
    #[must_use]
    pub fn leaving(mut self) -> Self {
        self.leaving = true;
        self
    }

    /// Whether its rendered config differs from the one it applied, or its node is to be
    /// upgraded.
    pub fn drifted(&self) -> bool {
        !self.leaving
            && self
                .applied
                .as_ref()
                .is_some_and(|a| *a != self.rendered || self.upgrade.is_some())
    }
}

/// Where a rollout stopped: the machine that refused and the config (hash) it refused, or
/// the installer image its upgrade failed with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriftHalt {
    /// The machine that refused.
    pub machine: String,
    /// The rendered config hash it refused, or the installer image its upgrade failed with.
    pub rendered: String,
}

/// Whose turn it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriftTurn {
    /// No machine drifted.
    Settled,
    /// `machine` applies next, under the cluster lock.
    Next {
        /// The machine.
        machine: String,
        /// Why now: its place in the order and the others' health.
        justification: String,
    },
    /// The rollout waits until `machine`, recorded unhealthy, is healthy again.
    WaitForHealthy {
        /// The machine waited for.
        machine: String,
    },
    /// The rollout stopped at `machine`, which refused the config it still renders; a change
    /// that renders it differently (the patch fixed) resumes the rollout.
    Halted {
        /// The machine that refused.
        machine: String,
    },
}

/// The order drift is rolled out in: control planes, then workers, each by name.
fn order(machine: &DriftMachine) -> (u8, &str) {
    let group = match machine.role {
        Role::ControlPlane => 0,
        Role::Worker => 1,
    };
    (group, machine.name.as_str())
}

/// Whether `halt` still stands: its machine is there, still drifted, and still renders the
/// config it refused (or is still to be upgraded with the installer that failed). A halt that
/// no longer stands is to be cleared.
pub fn halt_stands(machines: &[DriftMachine], halt: &DriftHalt) -> bool {
    machines.iter().any(|m| {
        m.name == halt.machine
            && m.drifted()
            && (m.rendered == halt.rendered || m.upgrade.as_ref() == Some(&halt.rendered))
    })
}

/// Whose turn it is to apply its drifted config, given every machine of the cluster and the
/// halt recorded, if any.
pub fn drift_turn(machines: &[DriftMachine], halt: Option<&DriftHalt>) -> DriftTurn {
    if let Some(halt) = halt.filter(|h| halt_stands(machines, h)) {
        return DriftTurn::Halted {
            machine: halt.machine.clone(),
        };
    }
    let Some(next) = machines
        .iter()
        .filter(|m| m.drifted())
        .min_by(|a, b| order(a).cmp(&order(b)))
    else {
        return DriftTurn::Settled;
    };
    // Every other machine healthy again before the next starts. The next one itself may be
    // unhealthy: its drift may be the fix.
    let mut others = machines
        .iter()
        .filter(|m| !m.leaving && m.applied.is_some() && m.name != next.name);
    if let Some(sick) = others.clone().find(|m| !m.healthy) {
        return DriftTurn::WaitForHealthy {
            machine: sick.name.clone(),
        };
    }
    let healthy = others.by_ref().count();
    let left = machines.iter().filter(|m| m.drifted()).count();
    DriftTurn::Next {
        machine: next.name.clone(),
        justification: format!(
            "first of {left} drifted machine(s) in rollout order (control planes, then workers, by name); the {healthy} other configured machine(s) are healthy"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(name: &str, applied: &str, rendered: &str) -> DriftMachine {
        DriftMachine::new(name, Role::ControlPlane, applied, rendered)
    }

    fn worker(name: &str, applied: &str, rendered: &str) -> DriftMachine {
        DriftMachine::new(name, Role::Worker, applied, rendered)
    }

    fn next_of(turn: &DriftTurn) -> Option<&str> {
        match turn {
            DriftTurn::Next { machine, .. } => Some(machine),
            _ => None,
        }
    }

    #[test]
    fn nothing_drifted_is_settled_and_a_first_apply_is_not_drift() {
        let mut never = worker("w-0", "h1", "h1");
        never.applied = None;
        never.rendered = "h2".into();
        assert_eq!(
            drift_turn(&[cp("cp-1", "h1", "h1"), never], None),
            DriftTurn::Settled
        );
    }

    #[test]
    fn control_planes_go_first_then_workers_each_by_name() {
        let mut machines = vec![
            worker("a-worker", "h1", "h2"),
            cp("cp-2", "h1", "h2"),
            cp("cp-1", "h1", "h2"),
        ];
        for expected in ["cp-1", "cp-2", "a-worker"] {
            let turn = drift_turn(&machines, None);
            assert_eq!(next_of(&turn), Some(expected), "{turn:?}");
            let done = machines.iter_mut().find(|m| m.name == expected).unwrap();
            done.applied = Some(done.rendered.clone());
        }
        assert_eq!(drift_turn(&machines, None), DriftTurn::Settled);
    }

    #[test]
    fn the_next_waits_until_every_other_machine_is_healthy_again() {
        let machines = [
            cp("cp-1", "h2", "h2").unhealthy(),
            cp("cp-2", "h1", "h2"),
            worker("w-1", "h1", "h2"),
        ];
        assert_eq!(
            drift_turn(&machines, None),
            DriftTurn::WaitForHealthy {
                machine: "cp-1".into()
            }
        );
    }

    #[test]
    fn an_unhealthy_machine_may_take_its_own_drift_which_may_be_the_fix() {
        let machines = [cp("cp-1", "h1", "h2").unhealthy(), cp("cp-2", "h2", "h2")];
        assert_eq!(next_of(&drift_turn(&machines, None)), Some("cp-1"));
    }

    #[test]
    fn leaving_machines_are_neither_targets_nor_waited_for() {
        let machines = [
            cp("cp-0", "h1", "h2").unhealthy().leaving(),
            cp("cp-1", "h1", "h2"),
        ];
        assert_eq!(next_of(&drift_turn(&machines, None)), Some("cp-1"));
    }

    #[test]
    fn upgrades_take_turns_in_the_same_order_and_a_failed_one_halts_until_the_image_changes() {
        let image = "factory.talos.dev/metal-installer/abc:v1.14.2";
        let mut machines = vec![
            worker("w-1", "h1", "h1").upgrading(image),
            cp("cp-1", "h1", "h1").upgrading(image),
            cp("cp-2", "h1", "h1"),
        ];
        assert_eq!(next_of(&drift_turn(&machines, None)), Some("cp-1"));
        let halt = DriftHalt {
            machine: "cp-1".into(),
            rendered: image.into(),
        };
        assert_eq!(
            drift_turn(&machines, Some(&halt)),
            DriftTurn::Halted {
                machine: "cp-1".into()
            },
            "no other node is upgraded with an installer that failed"
        );
        let fixed = "factory.talos.dev/metal-installer/abc:v1.14.3";
        for m in machines.iter_mut().filter(|m| m.upgrade.is_some()) {
            m.upgrade = Some(fixed.into());
        }
        assert!(!halt_stands(&machines, &halt));
        machines[1].upgrade = None;
        assert_eq!(next_of(&drift_turn(&machines, Some(&halt))), Some("w-1"));
    }

    #[test]
    fn a_refusal_stops_the_rollout_until_the_config_renders_differently() {
        let halt = DriftHalt {
            machine: "cp-1".into(),
            rendered: "bad".into(),
        };
        let stopped = [cp("cp-1", "h1", "bad"), cp("cp-2", "h1", "bad")];
        assert_eq!(
            drift_turn(&stopped, Some(&halt)),
            DriftTurn::Halted {
                machine: "cp-1".into()
            },
            "no other machine gets the refused config"
        );
        let fixed = [cp("cp-1", "h1", "good"), cp("cp-2", "h1", "good")];
        assert!(!halt_stands(&fixed, &halt));
        assert_eq!(next_of(&drift_turn(&fixed, Some(&halt))), Some("cp-1"));
        let reverted = [cp("cp-1", "h1", "h1"), cp("cp-2", "h1", "h1")];
        assert_eq!(drift_turn(&reverted, Some(&halt)), DriftTurn::Settled);
    }
}
