//! The operation's pure decisions: what was observed (the operation, its nodes' steps, the
//! nodes' answers) in, what to do next out. No I/O here; the reconcile and `Node` act on them.

use std::time::Duration;

use ichor_api::names::{annotations, reasons};
use ichor_api::operation::{
    NoTargets, NodeStep, OperationAction, OperationPhase, TalosOperation, TalosOperationSpec,
    TalosOperationStatus,
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

/// The version an installer image carries (`…/installer:v1.14.1` → `v1.14.1`).
pub fn image_version(image: &str) -> Option<String> {
    let tag = image.rsplit(':').next()?;
    (tag.starts_with('v') && !tag.contains('/') && !image.contains('@')).then(|| tag.to_owned())
}

/// How long ago `at` was at `now` (zero when unknown).
pub(super) fn elapsed_since(at: Option<&Time>, now: Timestamp) -> Duration {
    at.map(|t| crate::infra::clock::elapsed(t.0, now))
        .unwrap_or_default()
}

/// What the operation's action does to a node, as the planner judges it (`None`: nothing that
/// can cost etcd quorum).
pub(super) fn disruption(operation: &TalosOperation) -> Option<Disruption> {
    match operation.spec.action {
        OperationAction::Reset => Some(Disruption::Reset {
            operation: operation.name_any(),
            allow_delete: annotation_true(
                operation.metadata.annotations.as_ref(),
                annotations::ALLOW_DELETE,
            ),
        }),
        OperationAction::Reboot
        | OperationAction::Upgrade
        | OperationAction::EtcdDefrag
        | OperationAction::UpgradeKubernetes => Some(Disruption::Restart),
        OperationAction::EtcdSnapshot => None,
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
        lock::Outcome::Busy(_) => Some(reasons::WAITING_FOR_LOCK),
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
    action: OperationAction,
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
    let name = &status.run.nodes[index].machine;
    match machines.iter().find(|m| &m.name_any() == name) {
        Some(machine) => NextNode::At { index, machine },
        None => NextNode::End {
            succeeded: false,
            reason: reasons::NO_TARGETS,
            message: format!("TalosMachine {name} is gone"),
        },
    }
}

/// For the actions that changed a version, which are declared now (ADR 0068): what the
/// operation ends with, naming the field to change instead.
pub(super) fn declared_instead(action: OperationAction) -> Option<&'static str> {
    match action {
        OperationAction::Upgrade => Some(
            "versions are declared: set the TalosCluster's spec.talosVersion (and spec.schematic); every node is upgraded to it, one at a time; this operation touched nothing",
        ),
        OperationAction::UpgradeKubernetes => Some(
            "versions are declared: set the TalosCluster's spec.kubernetesVersion; every node follows it, one at a time; this operation touched nothing",
        ),
        _ => None,
    }
}

/// The installer image an upgrade names (empty when the spec names none).
pub(super) fn upgrade_image(operation: &TalosOperation) -> String {
    operation
        .spec
        .upgrade
        .as_ref()
        .map(|u| u.image.clone())
        .unwrap_or_default()
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

/// Whether an upgrade to the image's version `target` was sent before a restart and is done:
/// the node runs `target` and ran another version (or none recorded) before.
pub(super) fn upgraded_already(
    target: Option<&str>,
    running: Option<&str>,
    before: Option<&str>,
) -> bool {
    target.is_some_and(|target| running == Some(target) && before != Some(target))
}

/// The node's answer to the action sent: `None` goes on to look for its effect (`step` says it
/// was sent); a refusal fails the operation.
pub(super) fn answered(
    action: OperationAction,
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

/// What a node is drained for before the operation's action (ADR 0066), recorded on its
/// machine: `reboot (operation weekly)`. `None`: the action disrupts no pod (a snapshot, a
/// defragment, a Kubernetes upgrade applied without a reboot).
pub(super) fn drain_purpose(operation: &TalosOperation) -> Option<String> {
    let name = operation.name_any();
    match operation.spec.action {
        OperationAction::Reboot => Some(format!("reboot (operation {name})")),
        OperationAction::Upgrade => Some(format!(
            "upgrade to {} (operation {name})",
            upgrade_image(operation)
        )),
        OperationAction::Reset => Some(format!("reset (operation {name})")),
        OperationAction::EtcdSnapshot
        | OperationAction::EtcdDefrag
        | OperationAction::UpgradeKubernetes => None,
    }
}

/// Whether the action restarts the node, which is then followed by its boot id.
pub(super) fn restarts(action: OperationAction) -> bool {
    matches!(action, OperationAction::Reboot | OperationAction::Upgrade)
}

/// The step `action` sends over mutual TLS that the node's identity is checked for first (ADR
/// 0052), as a noun: everything that reboots, wipes or applies. `None`: a snapshot or a
/// defragment, which change nothing on the node that a wrong target could lose.
pub(super) fn identity_checked(action: OperationAction) -> Option<&'static str> {
    match action {
        OperationAction::Reboot => Some("reboot"),
        OperationAction::Upgrade => Some("upgrade"),
        OperationAction::Reset => Some("reset"),
        OperationAction::UpgradeKubernetes => Some("config apply"),
        OperationAction::EtcdSnapshot | OperationAction::EtcdDefrag => None,
    }
}

/// Whether a node that answers running with boot id `now` has rebooted since it had
/// `before`: only a different id says so (an id that could not be read says nothing).
pub(super) fn rebooted(before: Option<&str>, now: Option<&str>) -> bool {
    matches!((before, now), (Some(before), Some(now)) if before != now)
}

/// After an upgrade to `image`, the node back on `version`: `Some` (the step failed, the
/// operation fails) when it rolled back, i.e. it does not run the image's version or, for an
/// image without a version tag, still runs the version it ran before.
pub(super) fn rolled_back(step: &mut NodeStep, image: &str, version: &str) -> Option<Verdict> {
    let rolled_back = match image_version(image) {
        Some(target) => version != target,
        None => step.version_before.as_deref() == Some(version),
    };
    if !rolled_back {
        return None;
    }
    step.phase = OperationPhase::Failed;
    let message = format!(
        "after the upgrade to {image} the node runs {version} (before: {}): it rolled back; the operation stops and is not retried",
        step.version_before.as_deref().unwrap_or("unknown")
    );
    step.message = Some(message.clone());
    Some(Verdict::fail(reasons::UPGRADE_ROLLED_BACK, message))
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
    fn every_action_that_reboots_wipes_or_applies_checks_the_node_first() {
        use ichor_api::operation::OperationAction as A;
        for action in [A::Reboot, A::Upgrade, A::Reset, A::UpgradeKubernetes] {
            assert!(super::identity_checked(action).is_some(), "{action:?}");
        }
        for action in [A::EtcdSnapshot, A::EtcdDefrag] {
            assert_eq!(super::identity_checked(action), None, "{action:?}");
        }
    }

    use super::*;

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
        let next = next_node(OperationAction::Reboot, &status, &machines);
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
        let next = next_node(OperationAction::Upgrade, &status, &machines);
        assert!(
            matches!(
                &next,
                NextNode::End { succeeded: true, reason, message }
                    if *reason == reasons::COMPLETED && message == "Upgrade done on 2 node(s)"
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
        let next = next_node(OperationAction::Reboot, &status, &machines);
        assert!(
            matches!(
                &next,
                NextNode::End { succeeded: false, reason, message }
                    if *reason == reasons::NO_TARGETS && message == "TalosMachine b is gone"
            ),
            "{next:?}"
        );
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
        assert!(restarts(OperationAction::Reboot) && restarts(OperationAction::Upgrade));
        assert!(!restarts(OperationAction::Reset) && !restarts(OperationAction::EtcdDefrag));
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
    fn an_upgrade_is_found_done_only_on_the_target_it_did_not_run_before() {
        let target = Some("v1.14.1");
        assert!(upgraded_already(target, Some("v1.14.1"), Some("v1.13.9")));
        assert!(upgraded_already(target, Some("v1.14.1"), None));
        // Already on the target before: nothing says it was sent, it is sent.
        assert!(!upgraded_already(target, Some("v1.14.1"), Some("v1.14.1")));
        assert!(!upgraded_already(target, Some("v1.13.9"), Some("v1.13.9")));
        // The node does not tell its version, or the image names none.
        assert!(!upgraded_already(target, None, Some("v1.13.9")));
        assert!(!upgraded_already(None, Some("v1.14.1"), Some("v1.13.9")));
    }

    #[test]
    fn an_accepted_action_is_recorded_sent_and_goes_on() {
        let mut step = NodeStep::default();
        assert_eq!(answered(OperationAction::Reboot, &mut step, Ok(())), None);
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
            answered(OperationAction::Reset, &mut step, refused),
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
    fn an_upgrade_names_its_image_or_none() {
        let upgrade = TalosOperation::test("up", OperationAction::Upgrade)
            .image("ghcr.io/siderolabs/installer:v1.14.1")
            .build();
        assert_eq!(
            upgrade_image(&upgrade),
            "ghcr.io/siderolabs/installer:v1.14.1"
        );
        let reboot = TalosOperation::test("rb", OperationAction::Reboot).build();
        assert_eq!(upgrade_image(&reboot), "");
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

    /// A running upgrade step, from `before` (when recorded).
    fn upgraded_from(before: Option<&str>) -> NodeStep {
        NodeStep {
            machine: "cp-1".into(),
            phase: OperationPhase::Running,
            version_before: before.map(str::to_owned),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_on_the_images_version_did_not_roll_back() {
        let mut step = upgraded_from(Some("v1.13.9"));
        let image = "ghcr.io/siderolabs/installer:v1.14.1";
        assert_eq!(rolled_back(&mut step, image, "v1.14.1"), None);
        assert_eq!(step, upgraded_from(Some("v1.13.9")));
    }

    #[test]
    fn a_node_on_another_version_than_the_images_rolled_back_and_fails() {
        let mut step = upgraded_from(Some("v1.13.9"));
        let image = "ghcr.io/siderolabs/installer:v1.14.1";
        let Some(Verdict::Fail(Stop { reason, message })) =
            rolled_back(&mut step, image, "v1.13.9")
        else {
            panic!("a rollback fails the operation");
        };
        assert_eq!(reason, reasons::UPGRADE_ROLLED_BACK);
        assert_eq!(
            message,
            "after the upgrade to ghcr.io/siderolabs/installer:v1.14.1 the node runs v1.13.9 (before: v1.13.9): it rolled back; the operation stops and is not retried"
        );
        assert_eq!(step.phase, OperationPhase::Failed);
        assert_eq!(step.message.as_deref(), Some(message.as_str()));
    }

    #[test]
    fn without_a_version_tag_a_rollback_is_the_version_from_before() {
        let image = "registry.local:5000/installer";
        let mut same = upgraded_from(Some("v1.13.9"));
        assert!(rolled_back(&mut same, image, "v1.13.9").is_some());
        assert_eq!(same.phase, OperationPhase::Failed);
        let mut moved = upgraded_from(Some("v1.13.9"));
        assert_eq!(rolled_back(&mut moved, image, "v1.14.1"), None);
        let mut unknown = upgraded_from(None);
        assert_eq!(rolled_back(&mut unknown, image, "v1.14.1"), None);
    }

    #[test]
    fn a_rollback_from_an_unrecorded_version_says_unknown() {
        let mut step = upgraded_from(None);
        let image = "ghcr.io/siderolabs/installer:v1.14.1";
        let Some(Verdict::Fail(Stop { message, .. })) = rolled_back(&mut step, image, "v1.13.9")
        else {
            panic!("a rollback fails the operation");
        };
        assert!(message.contains("(before: unknown)"), "{message}");
    }

    #[test]
    fn image_tags_give_the_version_to_verify() {
        assert_eq!(
            image_version("ghcr.io/siderolabs/installer:v1.14.1").as_deref(),
            Some("v1.14.1")
        );
        assert_eq!(
            image_version("registry.local:5000/installer:v1.13.9").as_deref(),
            Some("v1.13.9")
        );
        assert_eq!(image_version("registry.local:5000/installer"), None);
        assert_eq!(image_version("installer@sha256:abcd"), None);
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
    fn reboots_upgrades_and_resets_drain_and_nothing_else_does() {
        let purpose = |action| {
            drain_purpose(
                &TalosOperation::test("weekly", action)
                    .cluster("lab")
                    .build(),
            )
        };
        assert_eq!(
            purpose(OperationAction::Reboot).as_deref(),
            Some("reboot (operation weekly)")
        );
        assert_eq!(
            purpose(OperationAction::Reset).as_deref(),
            Some("reset (operation weekly)")
        );
        assert!(purpose(OperationAction::Upgrade).is_some_and(|p| p.starts_with("upgrade to ")));
        for quiet in [
            OperationAction::EtcdSnapshot,
            OperationAction::EtcdDefrag,
            OperationAction::UpgradeKubernetes,
        ] {
            assert_eq!(purpose(quiet), None, "{quiet:?}");
        }
    }
}
