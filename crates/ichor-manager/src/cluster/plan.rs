//! The cluster reconciler's pure decisions: what to do next, from what was observed. No I/O
//! here; the bootstrap and teardown orders themselves are ichor-deleteguard's.

use std::fmt::Display;

use ichor_api::TalosMachine;
use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;
use ichor_api::names::reasons;
use ichor_talos::Bootstrapped;

use crate::Error;

/// Whether `machine` may bootstrap etcd: an approved control plane that was given its config.
pub(super) fn bootstrap_candidate(machine: &TalosMachine) -> bool {
    machine.spec.approval_state == ApprovalState::Approved
        && machine.spec.role == Some(Role::ControlPlane)
        && machine
            .status
            .as_ref()
            .is_some_and(|s| s.applied_config_hash.is_some())
}

/// Where a bootstrap candidate is asked: the address recorded in status, else its first endpoint.
pub(super) fn bootstrap_address(machine: &TalosMachine) -> String {
    machine
        .status
        .as_ref()
        .and_then(|s| s.address.clone())
        .or_else(|| machine.spec.endpoints.first().cloned())
        .unwrap_or_default()
}

/// The connection kept for `name` while its candidacy was observed; the planner chose it as
/// reachable, so none kept is a broken invariant.
pub(super) fn kept_connection<C>(
    clients: Vec<(String, Option<C>)>,
    name: &str,
) -> Result<C, Error> {
    clients
        .into_iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, c)| c)
        .ok_or_else(|| {
            Error::Invariant(format!(
                "bootstrap chose {name} as reachable, but no connection to it is kept"
            ))
        })
}

/// The `Bootstrapped` condition (holds, reason, message) once Bootstrap on `name` answered:
/// etcd bootstrapped now or before is done; a failure is pending, with its cause.
pub(super) fn bootstrap_answered<E: Display>(
    name: &str,
    answer: &Result<Bootstrapped, E>,
) -> (bool, &'static str, String) {
    match answer {
        Ok(Bootstrapped::Now) => (
            true,
            reasons::BOOTSTRAPPED,
            format!("etcd bootstrapped on {name}"),
        ),
        Ok(Bootstrapped::Already) => (
            true,
            reasons::BOOTSTRAPPED,
            format!("etcd was already bootstrapped on {name}"),
        ),
        Err(error) => (
            false,
            reasons::BOOTSTRAP_PENDING,
            format!("bootstrap on {name} not done yet: {error}"),
        ),
    }
}

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
            .is_some_and(|s| s.applied_config_hash.is_some())
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
    use ichor_api::machine::TalosMachineStatus;

    use super::*;

    /// A machine that was configured with its cluster's bundle.
    fn configured(builder: ichor_api::testing::MachineBuilder) -> TalosMachine {
        builder
            .status(TalosMachineStatus {
                applied_config_hash: Some("abc".into()),
                ..Default::default()
            })
            .build()
    }

    #[test]
    fn only_an_approved_configured_control_plane_may_bootstrap() {
        let cp = || TalosMachine::test("cp-1").control_plane().approved();
        assert!(bootstrap_candidate(&configured(cp())));
        assert!(!bootstrap_candidate(&cp().build()), "never configured");
        assert!(!bootstrap_candidate(&configured(
            TalosMachine::test("w-1").worker().approved()
        )));
        assert!(!bootstrap_candidate(&configured(
            TalosMachine::test("cp-2").control_plane()
        )));
    }

    #[test]
    fn a_candidate_is_asked_at_its_recorded_address_before_its_endpoint() {
        let machine = TalosMachine::test("cp-1").at("10.5.0.2");
        assert_eq!(bootstrap_address(&machine.clone().build()), "10.5.0.2");
        let moved = machine.status(TalosMachineStatus {
            address: Some("10.5.0.9".into()),
            ..Default::default()
        });
        assert_eq!(bootstrap_address(&moved.build()), "10.5.0.9");
    }

    #[test]
    fn the_call_uses_the_connection_kept_for_the_chosen_machine() {
        let clients = || vec![("cp-1".to_owned(), None), ("cp-2".to_owned(), Some(2))];
        assert_eq!(kept_connection(clients(), "cp-2").ok(), Some(2));
        assert!(matches!(
            kept_connection(clients(), "cp-1"),
            Err(Error::Invariant(_))
        ));
        assert!(matches!(
            kept_connection(clients(), "cp-3"),
            Err(Error::Invariant(_))
        ));
    }

    #[test]
    fn bootstrapped_now_or_before_is_done_and_a_failure_is_pending() {
        let now: Result<_, &str> = Ok(Bootstrapped::Now);
        assert_eq!(
            bootstrap_answered("cp-1", &now),
            (
                true,
                reasons::BOOTSTRAPPED,
                "etcd bootstrapped on cp-1".into()
            )
        );
        let (done, reason, message) =
            bootstrap_answered::<&str>("cp-1", &Ok(Bootstrapped::Already));
        assert!(done);
        assert_eq!(reason, reasons::BOOTSTRAPPED);
        assert!(message.contains("already"), "{message}");
        let (done, reason, message) = bootstrap_answered("cp-1", &Err("etcd not ready"));
        assert!(!done);
        assert_eq!(reason, reasons::BOOTSTRAP_PENDING);
        assert!(message.ends_with("etcd not ready"), "{message}");
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
