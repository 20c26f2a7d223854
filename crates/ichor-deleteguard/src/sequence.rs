//! The removal sequence and the cluster lock: which step follows which, which steps must never
//! run twice, when a cluster is transitioning, and who may hold the lock.
//!
//! Pure decisions over plain inputs. Reading the Lease, performing a step and recording it are
//! the caller's; the safety rechecks of a removal live in `rules`.

use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, RemovalStep};

use crate::model::{Cluster, Machine};

/// The step a removal performs after `done`, the last step recorded: Pending → Cordoned →
/// Drained → EtcdLeft (control planes only) → Reset → NodeDeleted → Complete, which stays.
pub fn next_removal_step(done: RemovalStep, role: Role) -> RemovalStep {
    match (done, role) {
        (RemovalStep::Pending, _) => RemovalStep::Cordoned,
        (RemovalStep::Cordoned, _) => RemovalStep::Drained,
        (RemovalStep::Drained, Role::ControlPlane) => RemovalStep::EtcdLeft,
        (RemovalStep::Drained | RemovalStep::EtcdLeft, _) => RemovalStep::Reset,
        (RemovalStep::Reset, _) => RemovalStep::NodeDeleted,
        (RemovalStep::NodeDeleted | RemovalStep::Complete, _) => RemovalStep::Complete,
    }
}

/// What a teardown deletes next (ADR 0009), by name: machines never configured at once
/// (nothing on their nodes to undo), then every configured worker, then the configured control
/// planes one at a time in name order, each once the one before is gone. Machines already being
/// deleted are not named again.
pub fn teardown_next(machines: &[Machine]) -> Vec<String> {
    let mut next: Vec<String> = machines
        .iter()
        .filter(|m| !m.applied && !m.deleting)
        .map(|m| m.name.clone())
        .collect();
    let configured_workers: Vec<&Machine> = machines
        .iter()
        .filter(|m| m.applied && !m.is_control_plane())
        .collect();
    if configured_workers.is_empty() {
        let mut control_planes: Vec<&Machine> = machines
            .iter()
            .filter(|m| m.applied && m.is_control_plane())
            .collect();
        control_planes.sort_by(|a, b| a.name.cmp(&b.name));
        if !control_planes.iter().any(|m| m.deleting)
            && let Some(first) = control_planes.first()
        {
            next.push(first.name.clone());
        }
    } else {
        next.extend(
            configured_workers
                .iter()
                .filter(|m| !m.deleting)
                .map(|m| m.name.clone()),
        );
    }
    next
}

/// Whether `step` must never run twice (leaving etcd, resetting the node): after a restart that
/// lost the record, the caller checks whether it was already done and records it instead.
pub fn is_once_only(step: RemovalStep) -> bool {
    matches!(step, RemovalStep::EtcdLeft | RemovalStep::Reset)
}

/// Whether a cluster is transitioning: its declared control-plane count is even, or the
/// approved control planes differ from it.
pub fn transitioning(declared_control_planes: usize, approved_control_planes: usize) -> bool {
    declared_control_planes.is_multiple_of(2) || approved_control_planes != declared_control_planes
}

/// The approved control planes among `machines`, being deleted or not, applied or not: the
/// count [`transitioning`] compares with the declared one.
pub fn approved_control_planes(machines: &[Machine]) -> usize {
    machines
        .iter()
        .filter(|m| is_approved_control_plane(m))
        .count()
}

/// Whether removing `target` completes the cluster's transition: always in a cluster torn
/// down ([`Cluster::tearing_down`]); otherwise when `target` is an approved control plane and the approved control
/// planes that exist (`target` and those being deleted included) outnumber the declared count.
///
/// `machines` may or may not include `target`; entries named like it are ignored.
pub fn completes_transition(target: &Machine, machines: &[Machine], cluster: &Cluster) -> bool {
    if cluster.tearing_down() {
        return true;
    }
    if !is_approved_control_plane(target) {
        return false;
    }
    let others = machines
        .iter()
        .filter(|m| m.name != target.name && is_approved_control_plane(m))
        .count();
    others + 1 > cluster.declared_control_planes
}

/// Whether a removal whose last recorded step is `done` may take the lock while the cluster is
/// transitioning: one that has started always may (stopping half-way — cordoned, or out of
/// etcd — helps no transition), a new one when [`completes_transition`] says so.
pub fn removal_completes_transition(
    done: RemovalStep,
    target: &Machine,
    machines: &[Machine],
    cluster: &Cluster,
) -> bool {
    done > RemovalStep::Pending || completes_transition(target, machines, cluster)
}

/// Whether `machine` is a control plane whose approval state is `approved`.
fn is_approved_control_plane(machine: &Machine) -> bool {
    machine.is_control_plane() && machine.approval == ApprovalState::Approved
}

/// The cluster lock as read from its Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockView {
    /// The action holding it (e.g. `removal/<machine uid>`).
    pub holder: String,
    /// Whether the hold ran out without renewal (its manager stopped).
    pub expired: bool,
}

/// What an action does about the cluster lock.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockDecision {
    /// The lock is free (or expired): take it.
    Take,
    /// The action holds it already (perhaps from before a restart): carry on and renew it.
    Keep,
    /// Another action holds it: wait.
    Busy {
        /// The action holding it.
        holder: String,
    },
    /// The lock is free but the cluster is transitioning and this action does not complete the
    /// transition: wait.
    RefusedWhileTransitioning,
}

impl LockDecision {
    /// Whether the action holds the lock after this decision (`Take` or `Keep`).
    pub fn holds(&self) -> bool {
        matches!(self, Self::Take | Self::Keep)
    }
}

/// Whether the action `me` may hold the cluster lock, given the lock as read (`None`: free).
///
/// An action already holding it keeps it, transitioning or not, expired or not: the identity is
/// the action's, so a restarted manager resumes what it started. A lock held by another action
/// and not expired is busy. A free or expired lock is taken, except while `transitioning` by an
/// action that does not complete the transition.
pub fn lock_decision(
    current: Option<&LockView>,
    me: &str,
    transitioning: bool,
    completes_transition: bool,
) -> LockDecision {
    match current {
        Some(lock) if lock.holder == me => LockDecision::Keep,
        Some(lock) if !lock.expired => LockDecision::Busy {
            holder: lock.holder.clone(),
        },
        _ if transitioning && !completes_transition => LockDecision::RefusedWhileTransitioning,
        _ => LockDecision::Take,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_STEPS: [RemovalStep; 7] = [
        RemovalStep::Pending,
        RemovalStep::Cordoned,
        RemovalStep::Drained,
        RemovalStep::EtcdLeft,
        RemovalStep::Reset,
        RemovalStep::NodeDeleted,
        RemovalStep::Complete,
    ];

    fn walk(role: Role) -> Vec<RemovalStep> {
        let mut steps = vec![RemovalStep::Pending];
        while steps.last() != Some(&RemovalStep::Complete) {
            assert!(steps.len() <= ALL_STEPS.len(), "no end: {steps:?}");
            steps.push(next_removal_step(steps[steps.len() - 1], role));
        }
        steps
    }

    #[test]
    fn a_control_plane_walks_every_step_in_order() {
        assert_eq!(walk(Role::ControlPlane), ALL_STEPS);
    }

    #[test]
    fn a_worker_skips_the_etcd_leave() {
        let steps = walk(Role::Worker);
        let expected: Vec<RemovalStep> = ALL_STEPS
            .into_iter()
            .filter(|s| *s != RemovalStep::EtcdLeft)
            .collect();
        assert_eq!(steps, expected);
    }

    #[test]
    fn every_step_moves_forward_until_complete_which_stays() {
        for role in [Role::ControlPlane, Role::Worker] {
            for step in ALL_STEPS {
                let next = next_removal_step(step, role);
                if step == RemovalStep::Complete {
                    assert_eq!(next, RemovalStep::Complete);
                } else {
                    assert!(next > step, "{step:?} -> {next:?} for {role:?}");
                }
            }
        }
        // A worker recorded at EtcdLeft (not reachable, but recorded state is data) goes on.
        assert_eq!(
            next_removal_step(RemovalStep::EtcdLeft, Role::Worker),
            RemovalStep::Reset
        );
    }

    #[test]
    fn only_the_etcd_leave_and_the_reset_are_once_only() {
        let once: Vec<RemovalStep> = ALL_STEPS.into_iter().filter(|s| is_once_only(*s)).collect();
        assert_eq!(once, [RemovalStep::EtcdLeft, RemovalStep::Reset]);
    }

    #[test]
    fn transitioning_on_an_even_count_or_a_mismatch() {
        assert!(!transitioning(1, 1));
        assert!(!transitioning(3, 3));
        assert!(!transitioning(5, 5));
        assert!(transitioning(2, 2), "even declared count");
        assert!(transitioning(4, 4), "even declared count");
        assert!(transitioning(0, 0), "even declared count");
        assert!(transitioning(3, 4), "one more approved: a removal pending");
        assert!(
            transitioning(3, 2),
            "one fewer approved: a replacement pending"
        );
        assert!(transitioning(5, 3), "declared count raised");
    }

    fn cp(name: &str) -> Machine {
        Machine::new(name)
            .control_plane()
            .approved()
            .config_applied()
    }

    #[test]
    fn counts_approved_control_planes_whatever_their_progress() {
        let machines = [
            cp("cp-1"),
            cp("cp-2").being_deleted(),
            Machine::new("cp-3").control_plane().approved(),
            Machine::new("cp-4")
                .control_plane()
                .rejected()
                .config_applied(),
            Machine::new("cp-5").control_plane(),
            Machine::new("w-1").worker().approved().config_applied(),
        ];
        assert_eq!(approved_control_planes(&machines), 3);
        assert_eq!(approved_control_planes(&[]), 0);
    }

    #[test]
    fn removing_a_surplus_control_plane_completes_the_transition() {
        let cluster = Cluster::new("prod", 3);
        let mut machines: Vec<Machine> = (1..=4).map(|i| cp(&format!("cp-{i}"))).collect();
        machines[0].deleting = true;
        // 4 approved, 3 declared: removing any approved control plane moves toward 3.
        assert!(completes_transition(&machines[0], &machines, &cluster));
        assert!(completes_transition(&machines[1], &machines, &cluster));
        // The target counts whether or not the list holds it.
        assert!(completes_transition(&machines[0], &machines[1..], &cluster));
        // 3 approved, 3 declared: removing one moves away.
        machines.pop();
        assert!(!completes_transition(&machines[0], &machines, &cluster));
        // Raised to 5: removing moves further away.
        assert!(!completes_transition(
            &machines[1],
            &machines,
            &Cluster::new("prod", 5)
        ));
        // Lowered to 1: removing moves toward it.
        assert!(completes_transition(
            &machines[1],
            &machines,
            &Cluster::new("prod", 1)
        ));
    }

    #[test]
    fn workers_and_unapproved_machines_do_not_complete_a_transition() {
        let cluster = Cluster::new("prod", 1);
        let mut machines: Vec<Machine> = (1..=3).map(|i| cp(&format!("cp-{i}"))).collect();
        let worker = Machine::new("w-1").worker().approved().config_applied();
        let rejected = Machine::new("cp-9")
            .control_plane()
            .rejected()
            .config_applied();
        machines.push(worker.clone());
        machines.push(rejected.clone());
        assert!(!completes_transition(&worker, &machines, &cluster));
        assert!(!completes_transition(&rejected, &machines, &cluster));
    }

    #[test]
    fn a_started_removal_may_always_finish() {
        let cluster = Cluster::new("c", 3);
        let worker = Machine::new("w").worker().approved().config_applied();
        assert!(!removal_completes_transition(
            RemovalStep::Pending,
            &worker,
            &[],
            &cluster
        ));
        assert!(removal_completes_transition(
            RemovalStep::Cordoned,
            &worker,
            &[],
            &cluster
        ));
    }

    #[test]
    fn a_teardown_completes_everything() {
        let cluster = Cluster::new("prod", 3).being_deleted().allowing_delete();
        let worker = Machine::new("w-1").worker().approved().config_applied();
        assert!(completes_transition(&worker, &[], &cluster));
        assert!(completes_transition(&cp("cp-1"), &[cp("cp-1")], &cluster));
    }

    #[test]
    fn a_teardown_takes_the_unconfigured_then_workers_then_control_planes_one_by_one() {
        let pending = Machine::new("p-1");
        let w1 = Machine::new("w-1").worker().approved().config_applied();
        let w2 = Machine::new("w-2").worker().approved().config_applied();
        let machines = vec![cp("cp-2"), cp("cp-1"), pending, w1.clone(), w2.clone()];
        assert_eq!(teardown_next(&machines), ["p-1", "w-1", "w-2"]);
        let machines = vec![cp("cp-2"), cp("cp-1"), w1.being_deleted(), w2];
        assert_eq!(teardown_next(&machines), ["w-2"], "workers first");
        let machines = vec![cp("cp-2"), cp("cp-1")];
        assert_eq!(teardown_next(&machines), ["cp-1"]);
        let machines = vec![cp("cp-2"), cp("cp-1").being_deleted()];
        assert!(teardown_next(&machines).is_empty(), "one at a time");
        assert!(teardown_next(&[]).is_empty());
    }

    fn held(holder: &str, expired: bool) -> LockView {
        LockView {
            holder: holder.into(),
            expired,
        }
    }

    #[test]
    fn the_holder_keeps_the_lock_even_expired_or_transitioning() {
        for expired in [false, true] {
            for transitioning in [false, true] {
                for completes in [false, true] {
                    let lock = held("removal/a", expired);
                    let decision =
                        lock_decision(Some(&lock), "removal/a", transitioning, completes);
                    assert_eq!(decision, LockDecision::Keep);
                    assert!(decision.holds());
                }
            }
        }
    }

    #[test]
    fn a_lock_held_by_another_action_is_busy_until_it_expires() {
        for transitioning in [false, true] {
            for completes in [false, true] {
                let lock = held("operation/x", false);
                let decision = lock_decision(Some(&lock), "removal/a", transitioning, completes);
                assert_eq!(
                    decision,
                    LockDecision::Busy {
                        holder: "operation/x".into()
                    }
                );
                assert!(!decision.holds());
            }
        }
    }

    #[test]
    fn a_free_or_expired_lock_is_taken_unless_refused_while_transitioning() {
        let expired = held("operation/x", true);
        for current in [None, Some(&expired)] {
            assert_eq!(
                lock_decision(current, "removal/a", false, false),
                LockDecision::Take
            );
            assert_eq!(
                lock_decision(current, "removal/a", false, true),
                LockDecision::Take
            );
            assert_eq!(
                lock_decision(current, "removal/a", true, true),
                LockDecision::Take
            );
            let refused = lock_decision(current, "removal/a", true, false);
            assert_eq!(refused, LockDecision::RefusedWhileTransitioning);
            assert!(!refused.holds());
        }
        assert!(LockDecision::Take.holds());
    }
}
