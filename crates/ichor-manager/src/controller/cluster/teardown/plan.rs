//! The teardown's decision: which machines of a deleted cluster go in this pass (the order
//! itself is ichor-deleteguard's), and what is left to say.

use ichor_api::TalosMachine;
use ichor_api::common::Role;

/// One teardown pass of a deleted cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Teardown {
    /// No machine is left: the finalizer goes (the bundle Secret stays).
    Finished,
    /// Machines are left: delete `delete` now and report what is left.
    Remove {
        /// The machines to delete now, in the planner's order.
        delete: Vec<String>,
        /// Configured workers left.
        workers: usize,
        /// Configured control planes left.
        control_planes: usize,
    },
}

/// The next teardown pass over the cluster's `machines`.
pub(super) fn teardown(machines: &[TalosMachine]) -> Teardown {
    if machines.is_empty() {
        return Teardown::Finished;
    }
    let configured = |m: &TalosMachine| {
        m.status
            .as_ref()
            .is_some_and(|s| s.applied.config_hash.is_some())
    };
    let is_cp = |m: &TalosMachine| m.spec.role == Some(Role::ControlPlane);
    let workers = machines
        .iter()
        .filter(|m| configured(m) && !is_cp(m))
        .count();
    let control_planes = machines
        .iter()
        .filter(|m| configured(m) && is_cp(m))
        .count();
    // The order is the planner's: unconfigured at once, workers, control planes one by one.
    let inputs: Vec<ichor_deleteguard::Machine> = machines
        .iter()
        .map(ichor_deleteguard::Machine::from)
        .collect();
    Teardown::Remove {
        delete: ichor_deleteguard::teardown_next(&inputs),
        workers,
        control_planes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine that was configured with its cluster's bundle.
    fn configured(builder: ichor_api::testing::MachineBuilder) -> TalosMachine {
        builder.applied("abc").build()
    }

    #[test]
    fn teardown_removes_workers_before_control_planes_and_finishes_with_none_left() {
        assert_eq!(teardown(&[]), Teardown::Finished);
        let machines = [
            configured(TalosMachine::test("cp-2").control_plane().approved()),
            configured(TalosMachine::test("cp-1").control_plane().approved()),
            configured(TalosMachine::test("w-1").worker().approved()),
            TalosMachine::test("new").build(),
        ];
        assert_eq!(
            teardown(&machines),
            Teardown::Remove {
                delete: vec!["new".into(), "w-1".into()],
                workers: 1,
                control_planes: 2,
            }
        );
        assert_eq!(
            teardown(&machines[..2]),
            Teardown::Remove {
                delete: vec!["cp-1".into()],
                workers: 0,
                control_planes: 2,
            },
            "control planes one by one, by name"
        );
    }
}
