//! The removal's pure decisions on the workload side (ADR 0021): what a cordon, drain or Node
//! delete comes to when the workload cluster's API does not answer, and the words that say so.

use ichor_api::machine::RemovalStep;
use ichor_api::names::{annotations, reasons};
use ichor_deleteguard::{Unanswered, unanswered_node_step};

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

#[cfg(test)]
mod tests {
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
}
