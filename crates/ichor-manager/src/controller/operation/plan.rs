//! The operation's pure decisions: what was observed (the operation, its nodes' steps, the
//! nodes' answers) in, what to do next out. No I/O here; the reconcile and `Node` act on them.

use std::time::Duration;

use ichor_api::names::{annotations, reasons};
use ichor_api::operation::{
    NoTargets, NodeStep, OperationAction, OperationPhase, TalosOperation, TalosOperationSpec,
    TalosOperationStatus, configured,
};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::Verdict as Plan;
use ichor_deleteguard::{Disruption, annotation_true};
use ichor_talos::TalosError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use super::NODE_PATIENCE;
use crate::{Stop, lock};

/// What one node's step came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// This node is done: go on to the next.
    Next,
    /// Not yet.
    Wait(Stop),
    /// The planner holds the next node before anything was sent to it: the lock is released
    /// meanwhile, so the action that can end the hold (a replacement's removal, the removal of
    /// the unhealthy member) is not locked out by this wait.
    Held(Stop),
    /// The operation fails here.
    Fail(Stop),
}

impl Verdict {
    /// Not yet, for `reason`, saying `message`.
    pub(super) fn wait(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Wait(Stop::new(reason, message))
    }

    /// The operation fails here, for `reason`, saying `message`.
    pub(super) fn fail(reason: &'static str, message: impl Into<String>) -> Self {
        Self::Fail(Stop::new(reason, message))
    }
}

/// The operation's progress as `done/all` nodes.
pub(super) fn progress(nodes: &[NodeStep]) -> String {
    let done = nodes
        .iter()
        .filter(|n| n.phase == OperationPhase::Succeeded)
        .count();
    format!("{done}/{}", nodes.len())
}

/// How long ago `at` was at `now` (zero when unknown).
pub(super) fn elapsed_since(at: Option<&Time>, now: Timestamp) -> Duration {
    at.map(|t| crate::infra::clock::elapsed(t.0, now))
        .unwrap_or_default()
}

/// An action the controller runs on nodes: every one but the two that changed a version,
/// which are declared now (ADR 0068) and end the operation before it starts ([`runnable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Run {
    /// A reboot.
    Reboot,
    /// A reset to maintenance mode.
    Reset,
    /// An etcd snapshot to the cluster's backup store.
    EtcdSnapshot,
    /// An etcd defragment.
    EtcdDefrag,
}

/// The action the operation runs, or, for one that changed a version, what the operation ends
/// with instead (`VersionsDeclared`), naming the field to change: the CRD refuses them now,
/// and an operation made before that touches nothing.
pub(super) fn runnable(action: OperationAction) -> Result<Run, Stop> {
    let declared = |message: &str| Err(Stop::new(reasons::VERSIONS_DECLARED, message));
    match action {
        OperationAction::Reboot => Ok(Run::Reboot),
        OperationAction::Reset => Ok(Run::Reset),
        OperationAction::EtcdSnapshot => Ok(Run::EtcdSnapshot),
        OperationAction::EtcdDefrag => Ok(Run::EtcdDefrag),
        OperationAction::Upgrade => declared(
            "versions are declared: set the TalosCluster's spec.talosVersion (and spec.schematic); every node is upgraded to it, one at a time; this operation touched nothing",
        ),
        OperationAction::UpgradeKubernetes => declared(
            "versions are declared: set the TalosCluster's spec.kubernetesVersion; every node follows it, one at a time; this operation touched nothing",
        ),
    }
}

/// What the operation's `action` does to a node, as the planner judges it (`None`: nothing
/// that can cost etcd quorum).
pub(super) fn disruption(operation: &TalosOperation, action: Run) -> Option<Disruption> {
    match action {
        Run::Reset => Some(Disruption::Reset {
            operation: operation.name_any(),
            allow_delete: annotation_true(
                operation.metadata.annotations.as_ref(),
                annotations::ALLOW_DELETE,
            ),
        }),
        Run::Reboot | Run::EtcdDefrag => Some(Disruption::Restart),
        Run::EtcdSnapshot => None,
    }
}

/// Whether the operation is a reset whose next node is an approved control plane while the
/// approved ones outnumber the declared count (taking it out moves toward the declared count),
/// or whose next node's reset has started: stopping half-way helps no transition, as for a
/// started removal (`removal_completes_transition`).
pub(super) fn resets_a_surplus_control_plane(
    operation: &TalosOperation,
    status: &TalosOperationStatus,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
) -> bool {
    if operation.spec.action != OperationAction::Reset {
        return false;
    }
    let Some(next) = status
        .run
        .nodes
        .iter()
        .find(|n| n.phase != OperationPhase::Succeeded)
    else {
        return false;
    };
    if next.phase == OperationPhase::Running || !next.progress.is_intended() {
        return true;
    }
    let inputs: Vec<ichor_deleteguard::Machine> = machines
        .iter()
        .map(ichor_deleteguard::Machine::from)
        .collect();
    inputs.iter().any(|m| {
        m.name == next.machine
            && ichor_deleteguard::completes_transition(
                m,
                &inputs,
                &ichor_deleteguard::Cluster::from(cluster),
            )
    })
}

/// Whether the operation ended (succeeded or failed): it is never run again.
pub(super) fn is_over(status: &TalosOperationStatus) -> bool {
    matches!(
        status.run.phase,
        OperationPhase::Succeeded | OperationPhase::Failed
    )
}

/// The operation's nodes, chosen once among its cluster's `machines` (while none are recorded);
/// later reconciles keep the ones recorded.
pub(super) fn choose_targets(
    status: &mut TalosOperationStatus,
    spec: &TalosOperationSpec,
    machines: &[TalosMachine],
) -> Result<(), NoTargets> {
    if !status.run.nodes.is_empty() {
        return Ok(());
    }
    status.run.nodes = spec
        .targets(machines)?
        .into_iter()
        .map(|machine| NodeStep {
            machine,
            ..Default::default()
        })
        .collect();
    status.run.progress = Some(progress(&status.run.nodes));
    Ok(())
}

/// Why the operation waits for the cluster lock (`None`: it holds it).
pub(super) fn lock_wait(outcome: &lock::Outcome) -> Option<&'static str> {
    match outcome {
        lock::Outcome::Held => None,
        lock::Outcome::Busy(_) | lock::Outcome::Full(_) => Some(reasons::WAITING_FOR_LOCK),
        lock::Outcome::Transitioning => Some(reasons::CLUSTER_TRANSITIONING),
    }
}

/// What comes next among the operation's nodes, in their recorded order.
#[derive(Debug)]
pub(super) enum NextNode<'m> {
    /// The first node not done, at `index` among the status's nodes, and its machine.
    At {
        /// Its place in `status.nodes`.
        index: usize,
        /// Its TalosMachine.
        machine: &'m TalosMachine,
    },
    /// The operation ends: every node is done, or the next node's TalosMachine is gone.
    End {
        /// Whether it succeeded.
        succeeded: bool,
        /// The condition reason.
        reason: &'static str,
        /// The condition message.
        message: String,
    },
}

/// The first node not done and its machine among `machines`, or how the operation ends.
pub(super) fn next_node<'m>(
    action: Run,
    status: &TalosOperationStatus,
    machines: &'m [TalosMachine],
) -> NextNode<'m> {
    let Some(index) = status
        .run
        .nodes
        .iter()
        .position(|n| n.phase != OperationPhase::Succeeded)
    else {
        return NextNode::End {
            succeeded: true,
            reason: reasons::COMPLETED,
            message: format!("{action:?} done on {} node(s)", status.run.nodes.len()),
        };
    };
    let step = &status.run.nodes[index];
    let name = &step.machine;
    match machines.iter().find(|m| &m.name_any() == name) {
        // A node nothing was sent to yet is acted on only while its machine is still one the
        // operation would choose: one removed meanwhile (being deleted, or reset and found
        // again in maintenance mode under the same name, not approved) is no longer the
        // cluster's node, and nothing is written to it.
        Some(machine) if step.progress.is_intended() && !configured(machine) => NextNode::End {
            succeeded: false,
            reason: reasons::NO_TARGETS,
            message: format!(
                "TalosMachine {name} left the cluster (removed, or not approved and configured) \
                 before the action was sent to it; nothing was sent"
            ),
        },
        Some(machine) => NextNode::At { index, machine },
        None => NextNode::End {
            succeeded: false,
            reason: reasons::NO_TARGETS,
            message: format!("TalosMachine {name} is gone"),
        },
    }
}

/// The planner's verdict on the node before anything is sent to it: `None` goes ahead; a wait
/// holds the node (its step waiting, the lock released meanwhile); a refusal fails the
/// operation.
pub(super) fn planner_verdict(plan: Plan, step: &mut NodeStep, machine: &str) -> Option<Verdict> {
    match plan {
        Plan::Proceed(_) => None,
        Plan::Wait(hold) => {
            step.phase = OperationPhase::Waiting;
            step.message = Some(hold.message());
            Some(Verdict::Held(Stop::new(
                hold.reason(),
                format!("before {machine}: {hold}"),
            )))
        }
        Plan::Refuse(refusal) => Some(Verdict::fail(refusal.reason(), refusal.message())),
    }
}

/// The node's answer to the action sent: `None` goes on to look for its effect (`step` says it
/// was sent); a refusal fails the operation.
pub(super) fn answered(
    action: Run,
    step: &mut NodeStep,
    sent: Result<(), TalosError>,
) -> Option<Verdict> {
    match sent {
        Ok(()) => {
            step.message = Some(format!("{action:?}: sent"));
            None
        }
        Err(error) => Some(Verdict::fail(
            reasons::ACTION_FAILED,
            format!("the node refused {action:?}: {error}"),
        )),
    }
}

/// A node not there yet, `since` the action was sent: a wait while within `NODE_PATIENCE`, the
/// operation's failure after.
pub(super) fn not_yet(
    since: Duration,
    waiting: impl Into<String>,
    failing: impl Into<String>,
) -> Verdict {
    if since > NODE_PATIENCE {
        Verdict::fail(reasons::NODE_NOT_HEALTHY, failing)
    } else {
        Verdict::wait(reasons::NODE_NOT_HEALTHY, waiting)
    }
}

/// What a node is drained for before the operation's `action` (ADR 0066), recorded on its
/// machine: `reboot (operation weekly)`. `None`: the action disrupts no pod (a snapshot, a
/// defragment).
pub(super) fn drain_purpose(operation: &TalosOperation, action: Run) -> Option<String> {
    let name = operation.name_any();
    match action {
        Run::Reboot => Some(format!("reboot (operation {name})")),
        Run::Reset => Some(format!("reset (operation {name})")),
        Run::EtcdSnapshot | Run::EtcdDefrag => None,
    }
}

/// Whether the action restarts the node, which is then followed by its boot id.
pub(super) fn restarts(action: Run) -> bool {
    action == Run::Reboot
}

/// The step `action` sends over mutual TLS that the node's identity is checked for first (ADR
/// 0052), as a noun: everything that reboots or wipes. `None`: a snapshot or a defragment,
/// which change nothing on the node that a wrong target could lose.
pub(super) fn identity_checked(action: Run) -> Option<&'static str> {
    match action {
        Run::Reboot => Some("reboot"),
        Run::Reset => Some("reset"),
        Run::EtcdSnapshot | Run::EtcdDefrag => None,
    }
}

/// Whether a node that answers running with boot id `now` has rebooted since it had
/// `before`: only a different id says so (an id that could not be read says nothing).
pub(super) fn rebooted(before: Option<&str>, now: Option<&str>) -> bool {
    matches!((before, now), (Some(before), Some(now)) if before != now)
}

/// Why the operation is refused before it starts, if it is: an `etcdSnapshot` backs up to the
/// cluster's `spec.backup` store, so a cluster without one refuses it.
pub(super) fn refusal(operation: &TalosOperation, cluster: &TalosCluster) -> Option<Stop> {
    (operation.spec.action == OperationAction::EtcdSnapshot && cluster.spec.backup.is_none())
        .then(|| {
            Stop::new(
                reasons::BACKUP_NOT_CONFIGURED,
                format!(
                    "etcdSnapshot backs etcd up to the cluster's spec.backup store, and TalosCluster {} sets none: add spec.backup (an S3-compatible bucket), then create the operation again",
                    cluster.metadata.name.as_deref().unwrap_or_default()
                ),
            )
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_action_that_reboots_or_wipes_checks_the_node_first() {
        use super::Run;
        for action in [Run::Reboot, Run::Reset] {
            assert!(super::identity_checked(action).is_some(), "{action:?}");
        }
        for action in [Run::EtcdSnapshot, Run::EtcdDefrag] {
            assert_eq!(super::identity_checked(action), None, "{action:?}");
        }
    }

    #[test]
    fn the_actions_that_changed_a_version_are_not_run_and_name_the_field_instead() {
        use ichor_api::operation::OperationAction as A;
        for (action, field) in [
            (A::Upgrade, "spec.talosVersion"),
            (A::UpgradeKubernetes, "spec.kubernetesVersion"),
        ] {
            let stop = super::runnable(action).expect_err("declared instead");
            assert_eq!(stop.reason, reasons::VERSIONS_DECLARED);
            assert!(stop.message.contains(field), "{stop:?}");
        }
        for (action, run) in [
            (A::Reboot, super::Run::Reboot),
            (A::Reset, super::Run::Reset),
            (A::EtcdSnapshot, super::Run::EtcdSnapshot),
            (A::EtcdDefrag, super::Run::EtcdDefrag),
        ] {
            assert_eq!(super::runnable(action), Ok(run));
        }
    }

    use super::*;
    use ichor_api::operation::NodeProgress;

    /// A status with these nodes, in this order.
    fn status_with(nodes: &[(&str, OperationPhase)]) -> TalosOperationStatus {
        TalosOperationStatus {
            run: ichor_api::operation::OperationRun {
                nodes: nodes
                    .iter()
                    .map(|(machine, phase)| NodeStep {
                        machine: (*machine).into(),
                        phase: *phase,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn only_a_succeeded_or_failed_operation_is_over() {
        let at = |phase| TalosOperationStatus {
            run: ichor_api::operation::OperationRun {
                phase,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(is_over(&at(OperationPhase::Succeeded)));
        assert!(is_over(&at(OperationPhase::Failed)));
        assert!(!is_over(&at(OperationPhase::Pending)));
        assert!(!is_over(&at(OperationPhase::Waiting)));
        assert!(!is_over(&at(OperationPhase::Running)));
    }

    /// A worker approved and configured (its config applied), so operations may target it.
    fn configured(name: &str) -> TalosMachine {
        let mut machine = TalosMachine::test(name).worker().approved().build();
        machine.status = Some(ichor_api::machine::TalosMachineStatus {
            applied: ichor_api::machine::MachineApplied {
                config_hash: Some("hash".into()),
            },
            ..Default::default()
        });
        machine
    }

    #[test]
    fn targets_are_chosen_once_with_their_progress() {
        let machines = [configured("w-1"), configured("w-2")];
        let spec = TalosOperation::test("rb", OperationAction::Reboot)
            .machine("w-2")
            .build()
            .spec;
        let mut status = TalosOperationStatus::default();
        assert_eq!(choose_targets(&mut status, &spec, &machines), Ok(()));
        assert_eq!(
            status.run.nodes,
            status_with(&[("w-2", OperationPhase::Pending)]).run.nodes
        );
        assert_eq!(status.run.progress.as_deref(), Some("0/1"));
        // Recorded nodes stay, whatever the machines are now.
        let mut recorded = status_with(&[("w-1", OperationPhase::Succeeded)]);
        assert_eq!(choose_targets(&mut recorded, &spec, &[]), Ok(()));
        assert_eq!(recorded, status_with(&[("w-1", OperationPhase::Succeeded)]));
    }

    #[test]
    fn no_target_is_the_operations_problem_and_records_nothing() {
        let spec = TalosOperation::test("rb", OperationAction::Reboot)
            .machine("w-9")
            .build()
            .spec;
        let mut status = TalosOperationStatus::default();
        assert_eq!(
            choose_targets(&mut status, &spec, &[configured("w-1")]),
            Err(NoTargets::UnknownMachine {
                name: "w-9".into(),
                cluster: ichor_api::testing::CLUSTER.into(),
            })
        );
        assert_eq!(status, TalosOperationStatus::default());
    }

    #[test]
    fn the_lock_held_goes_on_and_otherwise_says_why_it_waits() {
        assert_eq!(lock_wait(&lock::Outcome::Held), None);
        assert_eq!(
            lock_wait(&lock::Outcome::Busy(None)),
            Some(reasons::WAITING_FOR_LOCK)
        );
        assert_eq!(
            lock_wait(&lock::Outcome::Transitioning),
            Some(reasons::CLUSTER_TRANSITIONING)
        );
    }

    #[test]
    fn the_next_node_is_the_first_not_succeeded_in_the_recorded_order() {
        let machines = [configured("a"), configured("b"), configured("c")];
        let status = status_with(&[
            ("c", OperationPhase::Succeeded),
            ("b", OperationPhase::Waiting),
            ("a", OperationPhase::Pending),
        ]);
        let next = next_node(Run::Reboot, &status, &machines);
        assert!(
            matches!(next, NextNode::At { index: 1, machine } if std::ptr::eq(machine, &machines[1])),
            "{next:?}"
        );
    }

    #[test]
    fn every_node_succeeded_completes_the_operation() {
        let status = status_with(&[
            ("a", OperationPhase::Succeeded),
            ("b", OperationPhase::Succeeded),
        ]);
        let machines = [configured("a")];
        let next = next_node(Run::Reboot, &status, &machines);
        assert!(
            matches!(
                &next,
                NextNode::End { succeeded: true, reason, message }
                    if *reason == reasons::COMPLETED && message == "Reboot done on 2 node(s)"
            ),
            "{next:?}"
        );
    }

    #[test]
    fn a_next_node_whose_machine_is_gone_fails_the_operation() {
        let status = status_with(&[
            ("a", OperationPhase::Succeeded),
            ("b", OperationPhase::Running),
        ]);
        let machines = [configured("a")];
        let next = next_node(Run::Reboot, &status, &machines);
        assert!(
            matches!(
                &next,
                NextNode::End { succeeded: false, reason, message }
                    if *reason == reasons::NO_TARGETS && message == "TalosMachine b is gone"
            ),
            "{next:?}"
        );
    }

    #[test]
    fn a_next_node_removed_before_anything_was_sent_ends_the_operation_and_sends_nothing() {
        let status = status_with(&[
            ("a", OperationPhase::Succeeded),
            ("b", OperationPhase::Waiting),
        ]);
        // Removed, then found again in maintenance mode under the same name: pending approval.
        let found_again = TalosMachine::test("b").build();
        let mut deleting = configured("b");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        for b in [found_again, deleting] {
            let machines = [configured("a"), b];
            let next = next_node(Run::Reboot, &status, &machines);
            assert!(
                matches!(
                    &next,
                    NextNode::End { succeeded: false, reason, message }
                        if *reason == reasons::NO_TARGETS && message.contains("TalosMachine b left the cluster")
                ),
                "{next:?}"
            );
        }
        // Once the action was sent, its effect is followed whatever the machine shows now (a
        // reset takes its config away).
        let mut sent = status.clone();
        sent.run.nodes[1].progress = NodeProgress::Sent {
            sent_at: Time(Timestamp::UNIX_EPOCH),
        };
        let machines = [configured("a"), TalosMachine::test("b").build()];
        assert!(matches!(
            next_node(Run::Reboot, &sent, &machines),
            NextNode::At { index: 1, .. }
        ));
    }

    /// A node step not started.
    fn pending(machine: &str) -> NodeStep {
        NodeStep {
            machine: machine.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_new_boot_id_says_a_node_that_answers_has_rebooted() {
        assert!(rebooted(Some("a"), Some("b")));
        assert!(!rebooted(Some("a"), Some("a")), "the same boot");
        assert!(!rebooted(Some("a"), None), "an id not read says nothing");
        assert!(!rebooted(None, Some("b")), "no id from before the action");
        assert!(restarts(Run::Reboot));
        assert!(
            !restarts(Run::Reset) && !restarts(Run::EtcdDefrag) && !restarts(Run::EtcdSnapshot)
        );
    }

    #[test]
    fn the_planner_going_ahead_leaves_the_step_to_be_sent() {
        let proceed = Plan::Proceed(ichor_deleteguard::Justification {
            target: "cp-1".into(),
            action: "restarting",
            voters: 3,
            voters_after: 3,
            healthy_left: 2,
            declared: 3,
            leave: ichor_deleteguard::Leave::Stays,
            teardown: false,
        });
        let mut step = pending("cp-1");
        assert_eq!(planner_verdict(proceed, &mut step, "cp-1"), None);
        assert_eq!(step, pending("cp-1"));
    }

    #[test]
    fn a_planner_wait_holds_the_node_and_says_before_which_machine() {
        let hold = ichor_deleteguard::Wait::TeardownWorkersFirst {
            name: "cp-1".into(),
            workers: 2,
        };
        let mut step = pending("cp-1");
        assert_eq!(
            planner_verdict(Plan::Wait(hold.clone()), &mut step, "cp-1"),
            Some(Verdict::Held(Stop {
                reason: hold.reason(),
                message: format!("before cp-1: {hold}"),
            }))
        );
        assert_eq!(step.phase, OperationPhase::Waiting);
        assert_eq!(step.message, Some(hold.message()));
    }

    #[test]
    fn a_planner_refusal_fails_the_operation_and_leaves_the_step() {
        let refusal = ichor_deleteguard::Refusal::LastControlPlane {
            name: "cp-1".into(),
            cluster: "lab".into(),
        };
        let mut step = pending("cp-1");
        assert_eq!(
            planner_verdict(Plan::Refuse(refusal.clone()), &mut step, "cp-1"),
            Some(Verdict::Fail(Stop {
                reason: refusal.reason(),
                message: refusal.message(),
            }))
        );
        assert_eq!(step, pending("cp-1"));
    }

    #[test]
    fn an_accepted_action_is_recorded_sent_and_goes_on() {
        let mut step = NodeStep::default();
        assert_eq!(answered(Run::Reboot, &mut step, Ok(())), None);
        assert_eq!(step.message.as_deref(), Some("Reboot: sent"));
    }

    #[test]
    fn a_refused_action_fails_the_operation_with_the_nodes_error() {
        let mut step = NodeStep {
            message: Some("Reset: sending".into()),
            ..Default::default()
        };
        let refused = Err(TalosError::ConnectTimeout {
            endpoint: "10.0.0.5".into(),
            seconds: 10,
        });
        assert_eq!(
            answered(Run::Reset, &mut step, refused),
            Some(Verdict::Fail(Stop {
                reason: reasons::ACTION_FAILED,
                message:
                    "the node refused Reset: connecting to 10.0.0.5 did not complete within 10 s"
                        .into(),
            }))
        );
        assert_eq!(step.message.as_deref(), Some("Reset: sending"));
    }

    #[test]
    fn a_node_not_there_yet_waits_until_its_patience_runs_out_then_fails() {
        let wait = |message: &str| {
            Verdict::Wait(Stop {
                reason: reasons::NODE_NOT_HEALTHY,
                message: message.into(),
            })
        };
        assert_eq!(not_yet(Duration::ZERO, "w", "f"), wait("w"));
        assert_eq!(not_yet(NODE_PATIENCE, "w", "f"), wait("w"));
        assert_eq!(
            not_yet(NODE_PATIENCE + Duration::from_secs(1), "w", "f"),
            Verdict::Fail(Stop {
                reason: reasons::NODE_NOT_HEALTHY,
                message: "f".into(),
            })
        );
    }

    #[test]
    fn an_etcd_snapshot_is_refused_on_a_cluster_without_backups() {
        let snapshot = TalosOperation::test("snap", OperationAction::EtcdSnapshot).build();
        let reboot = TalosOperation::test("boot", OperationAction::Reboot).build();
        let mut cluster = TalosCluster::test("lab").build();
        let crate::Stop { reason, message } = refusal(&snapshot, &cluster).expect("refused");
        assert_eq!(reason, reasons::BACKUP_NOT_CONFIGURED);
        assert!(message.contains("spec.backup"), "{message}");
        assert_eq!(refusal(&reboot, &cluster), None);
        cluster.spec.backup = Some(serde_json::from_value(serde_json::json!({
            "schedule": "@every 1h",
            "store": {"endpoint": "https://s3.example.com", "bucket": "b", "credentialsSecretRef": {"name": "s3"}}
        })).expect("a backup spec"));
        assert_eq!(refusal(&snapshot, &cluster), None);
    }

    #[test]
    fn reboots_and_resets_drain_and_nothing_else_does() {
        let operation = TalosOperation::test("weekly", OperationAction::Reboot)
            .cluster("lab")
            .build();
        let purpose = |action| drain_purpose(&operation, action);
        assert_eq!(
            purpose(Run::Reboot).as_deref(),
            Some("reboot (operation weekly)")
        );
        assert_eq!(
            purpose(Run::Reset).as_deref(),
            Some("reset (operation weekly)")
        );
        for quiet in [Run::EtcdSnapshot, Run::EtcdDefrag] {
            assert_eq!(purpose(quiet), None, "{quiet:?}");
        }
    }
}
