//! The removal's pure decisions: where a removal starts (`entry`), when the planner is asked and
//! what its verdict means (`planner_stage`, `recheck`), what recording a step done means
//! (`completion`, `note_skips`), and on the workload side (ADR 0021) what a cordon, drain or
//! Node delete comes to when the workload cluster's API does not answer, and the words that
//! say so.

use ichor_api::TalosMachine;
use ichor_api::machine::{RemovalProgress, RemovalStep, SkippedStep, TalosMachineStatus};
use ichor_api::names::{annotations, finalizers, reasons};
use ichor_deleteguard::{Stage, Unanswered, Verdict, unanswered_node_step};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use crate::{Stop, workload};

/// How much of a failure's text goes into a message (status messages are bounded).
const DETAIL_MAX: usize = 300;

/// What the removal does with a workload step the workload API did not answer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Unreached {
    /// It waits (condition reason `WorkloadAPIUnreachable`), with this message.
    Wait(String),
    /// The step is skipped: recorded in `status.removal.skipped` and in a Warning Event with
    /// `event_reason`.
    Skip {
        /// The Event's reason.
        event_reason: &'static str,
        /// What was skipped and why.
        message: String,
    },
    /// The Node delete goes to the TalosCluster first, then is recorded as a skip.
    Defer {
        /// The Event's reason.
        event_reason: &'static str,
        /// What was deferred and why.
        message: String,
    },
}

/// The step in words: `the cordon of Node w-1`.
fn what(step: RemovalStep, node: &str) -> String {
    let action = match step {
        RemovalStep::Cordoned => "cordon",
        RemovalStep::Drained => "drain",
        RemovalStep::NodeDeleted => "deletion",
        _ => "workload step",
    };
    format!("the {action} of Node {node}")
}

/// `detail`, cut to [`DETAIL_MAX`] characters.
fn short(detail: &str) -> String {
    if detail.chars().count() <= DETAIL_MAX {
        return detail.to_owned();
    }
    let cut: String = detail.chars().take(DETAIL_MAX).collect();
    format!("{cut}…")
}

/// What the workload step `step` on Node `node` comes to when the API at `endpoint` did not
/// answer (`detail`): the decision is ichor-deleteguard's, the words are here.
pub(super) fn unreached(
    step: RemovalStep,
    force: bool,
    endpoint: &str,
    node: &str,
    detail: &str,
) -> Unreached {
    let what = what(step, node);
    let api = format!(
        "the workload cluster's API at {endpoint} does not answer ({})",
        short(detail)
    );
    let force_key = annotations::FORCE_REMOVE;
    match unanswered_node_step(step, force) {
        Unanswered::Wait => Unreached::Wait(format!(
            "{api}, so {what} cannot run and the removal waits; restore the API, or set {force_key}=true on the TalosMachine to skip the cordon and drain (recorded) and delete the Node once the API answers again"
        )),
        Unanswered::Skip => Unreached::Skip {
            event_reason: reasons::NODE_STEP_SKIPPED,
            message: format!("{what} was SKIPPED ({force_key}): {api}"),
        },
        Unanswered::Defer => Unreached::Defer {
            event_reason: reasons::NODE_DELETE_DEFERRED,
            message: format!(
                "{what} is DEFERRED ({force_key}): {api}; the TalosCluster deletes the Node once the API answers again"
            ),
        },
    }
}

/// The outcome of one step: done (with what to record) or waiting (with a reason).
pub(super) enum Step {
    Done {
        /// What was done, for the Event and the removal's message.
        message: String,
        /// Whether the node's reset was skipped (force removal).
        reset_skipped: bool,
    },
    /// Waiting: the removal's condition and Event say why.
    Wait(Stop),
    /// A workload step the workload API did not answer, skipped by force removal.
    Skipped {
        /// The Warning Event's reason.
        reason: &'static str,
        /// What was skipped and why.
        message: String,
    },
}

impl From<workload::Outcome> for Step {
    fn from(outcome: workload::Outcome) -> Self {
        match outcome {
            workload::Outcome::Done(message) => Self::Done {
                message,
                reset_skipped: false,
            },
            workload::Outcome::Wait(stop) => Self::Wait(stop),
            workload::Outcome::Unreachable(detail) => Self::Wait(Stop::new(
                reasons::WORKLOAD_API_UNREACHABLE,
                format!("the workload cluster's API does not answer: {detail}"),
            )),
        }
    }
}

/// Where a removal starts, read from the machine as stored now.
#[derive(Debug)]
pub(super) enum Entry {
    /// Nothing to do: the machine is gone, replaced (another uid), or its finalizer released.
    Idle,
    /// Never configured: nothing to undo on the node, the finalizer goes.
    Release(TalosMachine),
    /// Configured: its removal is undone step by step.
    Undo(TalosMachine),
}

/// Where the removal of `cached` starts, from `fresh`, the machine as stored now.
pub(super) fn entry(cached: &TalosMachine, fresh: Option<TalosMachine>) -> Entry {
    let Some(machine) = fresh.filter(|fresh| fresh.uid() == cached.uid()) else {
        return Entry::Idle;
    };
    if !crate::infra::finalizer::has(&machine, finalizers::MACHINE_REMOVAL) {
        return Entry::Idle;
    }
    // Never configured: nothing to undo on the node.
    if machine
        .status
        .as_ref()
        .is_none_or(|s| s.applied.config_hash.is_none())
    {
        return Entry::Release(machine);
    }
    Entry::Undo(machine)
}

/// When the planner is asked: before the removal starts (`Run`) and right before the etcd
/// leave (`Act`); `None` between.
pub(super) fn planner_stage(done: RemovalStep, next: RemovalStep) -> Option<Stage> {
    match (done, next) {
        (RemovalStep::Pending, _) => Some(Stage::Run),
        (_, RemovalStep::EtcdLeft) => Some(Stage::Act),
        _ => None,
    }
}

/// What the removal does with the planner's verdict.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Recheck {
    /// The removal starts: a Normal Event with this message says why.
    Starts(String),
    /// The removal goes on.
    Continues,
    /// The removal waits.
    Holds {
        /// Why, as the user sees it.
        stop: Stop,
        /// Whether the cluster lock is let go meanwhile (the removal has not started).
        release_lock: bool,
    },
}

/// Reads the planner's `verdict` at `stage`.
pub(super) fn recheck(verdict: &Verdict, stage: Stage) -> Recheck {
    match verdict {
        Verdict::Proceed(why) if stage == Stage::Run => {
            Recheck::Starts(format!("the removal starts: {why}"))
        }
        Verdict::Proceed(_) => Recheck::Continues,
        verdict => Recheck::Holds {
            stop: Stop::new(
                verdict.reason().unwrap_or(reasons::QUORUM_AT_RISK),
                verdict.message().unwrap_or_default(),
            ),
            release_lock: stage == Stage::Run,
        },
    }
}

/// What recording a step done means.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Completion {
    /// The step recorded.
    pub(super) step: RemovalStep,
    /// Whether the reset is recorded as skipped.
    pub(super) reset_skipped: bool,
    /// Whether the step is recorded in `status.removal.skipped` (a workload step skipped).
    pub(super) skipped: bool,
    /// The Event's type.
    pub(super) event_type: EventType,
    /// The Event's reason.
    pub(super) reason: &'static str,
    /// Whether the removal ends with it (reservation, lock and finalizer released).
    pub(super) finishes: bool,
}

/// What recording `next` done means; a step that could not reset the node is recorded as the
/// Reset step, skipped, with a Warning; a workload step skipped (`skipped`: the Event's reason)
/// is recorded done and skipped, with a Warning.
pub(super) fn completion(
    next: RemovalStep,
    reset_skipped: bool,
    skipped: Option<&'static str>,
) -> Completion {
    let step = if reset_skipped {
        RemovalStep::Reset
    } else {
        next
    };
    let (event_type, reason) = match (reset_skipped, skipped) {
        (true, _) => (EventType::Warning, reasons::RESET_SKIPPED),
        (false, Some(reason)) => (EventType::Warning, reason),
        (false, None) => (EventType::Normal, reasons::REMOVAL),
    };
    Completion {
        step,
        reset_skipped,
        skipped: skipped.is_some() && !reset_skipped,
        event_type,
        reason,
        finishes: matches!(step, RemovalStep::NodeDeleted | RemovalStep::Complete),
    }
}

/// Notes in `status` what `done` records beyond the step: the reset skipped, or a workload step
/// skipped (with `message`, at `now`).
pub(super) fn note_skips(
    status: &mut TalosMachineStatus,
    done: &Completion,
    message: &str,
    now: Time,
) {
    if !done.reset_skipped && !done.skipped {
        return;
    }
    let progress = status
        .removal
        .progress
        .get_or_insert_with(|| RemovalProgress {
            started_at: Some(now.clone()),
            ..Default::default()
        });
    if done.reset_skipped {
        // The node could not be reset: the Reset step is recorded as skipped.
        progress.reset_skipped = true;
    }
    if done.skipped && !progress.skipped.iter().any(|s| s.step == done.step) {
        progress.skipped.push(SkippedStep {
            step: done.step,
            reason: reasons::WORKLOAD_API_UNREACHABLE.to_owned(),
            message: message.to_owned(),
            at: now,
        });
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::TalosMachineSpec;
    use ichor_api::common::Role;
    use ichor_deleteguard::{Justification, Leave, Refusal, Wait, next_removal_step};

    use super::*;

    const ENDPOINT: &str = "https://10.0.0.10:6443";

    #[test]
    fn without_force_each_node_step_waits_naming_the_endpoint_and_both_ways_on() {
        for (step, words) in [
            (RemovalStep::Cordoned, "the cordon of Node w-1"),
            (RemovalStep::Drained, "the drain of Node w-1"),
            (RemovalStep::NodeDeleted, "the deletion of Node w-1"),
        ] {
            let Unreached::Wait(message) =
                unreached(step, false, ENDPOINT, "w-1", "connection refused")
            else {
                panic!("{step:?} waits without force");
            };
            assert!(message.contains(ENDPOINT), "{message}");
            assert!(message.contains(words), "{message}");
            assert!(message.contains("connection refused"), "{message}");
            assert!(message.contains("restore the API"), "{message}");
            assert!(
                message.contains(&format!("{}=true", annotations::FORCE_REMOVE)),
                "{message}"
            );
        }
    }

    #[test]
    fn with_force_the_cordon_and_drain_are_skipped_with_a_warning() {
        for step in [RemovalStep::Cordoned, RemovalStep::Drained] {
            let outcome = unreached(step, true, ENDPOINT, "w-1", "timed out");
            let Unreached::Skip {
                event_reason,
                message,
            } = outcome
            else {
                panic!("{step:?} is skipped with force: {outcome:?}");
            };
            assert_eq!(event_reason, reasons::NODE_STEP_SKIPPED);
            assert!(message.contains("SKIPPED"), "{message}");
            assert!(message.contains(ENDPOINT), "{message}");
        }
    }

    #[test]
    fn with_force_the_node_delete_is_deferred_to_the_cluster() {
        let outcome = unreached(RemovalStep::NodeDeleted, true, ENDPOINT, "w-1", "refused");
        let Unreached::Defer {
            event_reason,
            message,
        } = outcome
        else {
            panic!("the Node delete is deferred: {outcome:?}");
        };
        assert_eq!(event_reason, reasons::NODE_DELETE_DEFERRED);
        assert!(
            message.contains("the deletion of Node w-1 is DEFERRED"),
            "{message}"
        );
    }

    #[test]
    fn a_long_failure_is_cut_so_the_message_fits_its_status_field() {
        let detail = "x".repeat(5000);
        let Unreached::Wait(message) =
            unreached(RemovalStep::Drained, false, ENDPOINT, "w-1", &detail)
        else {
            panic!("waits");
        };
        assert!(message.chars().count() <= 1024, "{}", message.len());
    }

    /// A machine with `uid`, its removal finalizer set or not, configured or not.
    fn machine(uid: &str, finalizer: bool, configured: bool) -> TalosMachine {
        let mut machine = TalosMachine::new("m", TalosMachineSpec::pending("c", "10.0.0.1", "f"));
        machine.metadata.uid = Some(uid.into());
        machine.metadata.finalizers =
            finalizer.then(|| vec![finalizers::MACHINE_REMOVAL.to_owned()]);
        machine.status = Some(TalosMachineStatus {
            applied: ichor_api::machine::MachineApplied {
                config_hash: configured.then(|| "h".to_owned()),
            },
            ..TalosMachineStatus::default()
        });
        machine
    }

    /// The planner's go-ahead on deleting `m`.
    fn proceed() -> Verdict {
        Verdict::Proceed(Justification {
            target: "m".into(),
            action: "deleting",
            voters: 3,
            voters_after: 2,
            healthy_left: 2,
            declared: 3,
            leave: Leave::Graceful,
            teardown: false,
        })
    }

    #[test]
    fn a_removal_runs_only_for_the_same_machine_still_holding_its_finalizer() {
        let cached = machine("u1", true, true);
        assert!(matches!(entry(&cached, None), Entry::Idle), "gone");
        assert!(
            matches!(entry(&cached, Some(machine("u2", true, true))), Entry::Idle),
            "a new machine of the same name is not this removal's"
        );
        assert!(
            matches!(
                entry(&cached, Some(machine("u1", false, true))),
                Entry::Idle
            ),
            "finalizer already released"
        );
        assert!(matches!(
            entry(&cached, Some(machine("u1", true, true))),
            Entry::Undo(_)
        ));
    }

    #[test]
    fn a_machine_never_configured_only_releases_its_finalizer() {
        let cached = machine("u1", true, true);
        assert!(matches!(
            entry(&cached, Some(machine("u1", true, false))),
            Entry::Release(_)
        ));
        let mut bare = machine("u1", true, false);
        bare.status = None;
        assert!(matches!(entry(&cached, Some(bare)), Entry::Release(_)));
    }

    #[test]
    fn the_planner_is_asked_at_the_start_and_right_before_the_etcd_leave() {
        let asked = |role| {
            let mut done = RemovalStep::Pending;
            let mut stages = Vec::new();
            while done != RemovalStep::Complete {
                let next = next_removal_step(done, role);
                if let Some(stage) = planner_stage(done, next) {
                    stages.push((next, stage));
                }
                done = next;
            }
            stages
        };
        assert_eq!(
            asked(Role::ControlPlane),
            [
                (RemovalStep::Cordoned, Stage::Run),
                (RemovalStep::EtcdLeft, Stage::Act)
            ]
        );
        assert_eq!(asked(Role::Worker), [(RemovalStep::Cordoned, Stage::Run)]);
    }

    #[test]
    fn a_go_ahead_announces_the_start_once() {
        let Recheck::Starts(message) = recheck(&proceed(), Stage::Run) else {
            panic!("a removal cleared at the start starts");
        };
        assert!(
            message.starts_with("the removal starts: deleting talosmachine m"),
            "{message}"
        );
        assert_eq!(recheck(&proceed(), Stage::Act), Recheck::Continues);
    }

    #[test]
    fn a_hold_at_the_start_lets_the_lock_go_and_one_before_the_leave_keeps_it() {
        let refused = Verdict::Refuse(Refusal::LastControlPlane {
            name: "m".into(),
            cluster: "c".into(),
        });
        assert_eq!(
            recheck(&refused, Stage::Run),
            Recheck::Holds {
                stop: Stop::new(
                    reasons::LAST_CONTROL_PLANE,
                    refused.message().unwrap_or_default()
                ),
                release_lock: true,
            }
        );
        let waits = Verdict::Wait(Wait::TeardownWorkersFirst {
            name: "m".into(),
            workers: 2,
        });
        assert_eq!(
            recheck(&waits, Stage::Act),
            Recheck::Holds {
                stop: Stop::new(
                    reasons::TEARDOWN_WORKERS_FIRST,
                    waits.message().unwrap_or_default()
                ),
                release_lock: false,
            }
        );
    }

    #[test]
    fn a_step_done_is_recorded_with_a_normal_event_and_the_node_delete_finishes() {
        for (next, finishes) in [
            (RemovalStep::Cordoned, false),
            (RemovalStep::EtcdLeft, false),
            (RemovalStep::Reset, false),
            (RemovalStep::NodeDeleted, true),
            (RemovalStep::Complete, true),
        ] {
            assert_eq!(
                completion(next, false, None),
                Completion {
                    step: next,
                    reset_skipped: false,
                    skipped: false,
                    event_type: EventType::Normal,
                    reason: reasons::REMOVAL,
                    finishes,
                },
                "{next:?}"
            );
        }
    }

    #[test]
    fn a_skipped_reset_is_recorded_as_the_reset_step_with_a_warning() {
        for next in [RemovalStep::EtcdLeft, RemovalStep::Reset] {
            assert_eq!(
                completion(next, true, None),
                Completion {
                    step: RemovalStep::Reset,
                    reset_skipped: true,
                    skipped: false,
                    event_type: EventType::Warning,
                    reason: reasons::RESET_SKIPPED,
                    finishes: false,
                },
                "{next:?}"
            );
        }
    }

    #[test]
    fn a_skipped_workload_step_is_recorded_done_and_skipped_with_a_warning() {
        for (next, finishes) in [
            (RemovalStep::Cordoned, false),
            (RemovalStep::Drained, false),
            (RemovalStep::NodeDeleted, true),
        ] {
            let reason = if next == RemovalStep::NodeDeleted {
                reasons::NODE_DELETE_DEFERRED
            } else {
                reasons::NODE_STEP_SKIPPED
            };
            let done = completion(next, false, Some(reason));
            assert_eq!(
                done,
                Completion {
                    step: next,
                    reset_skipped: false,
                    skipped: true,
                    event_type: EventType::Warning,
                    reason,
                    finishes,
                },
                "{next:?}"
            );
            let mut status = TalosMachineStatus::default();
            let at = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
            note_skips(&mut status, &done, "skipped", at.clone());
            note_skips(&mut status, &done, "skipped", at.clone());
            let removal = status.removal.progress.expect("progress");
            assert_eq!(
                removal.skipped,
                [SkippedStep {
                    step: next,
                    reason: reasons::WORKLOAD_API_UNREACHABLE.to_owned(),
                    message: "skipped".to_owned(),
                    at,
                }],
                "recorded once"
            );
            assert!(!removal.reset_skipped);
        }
    }

    #[test]
    fn a_step_done_notes_no_skip() {
        let mut status = TalosMachineStatus::default();
        let at = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        note_skips(
            &mut status,
            &completion(RemovalStep::Drained, false, None),
            "m",
            at,
        );
        assert!(status.removal.progress.is_none());
    }
}
