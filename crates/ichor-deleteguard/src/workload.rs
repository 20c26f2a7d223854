//! A removal's workload steps (cordon, drain, Node delete) when the workload cluster's API does
//! not answer (ADR 0021): the removal fails closed and waits, unless the machine carries the
//! force-remove annotation; then the cordon and the drain are skipped (recorded) and the Node
//! delete is handed to the TalosCluster, which runs it once the API answers again — if the
//! Node is still the removed machine's.

use ichor_api::machine::RemovalStep;

/// What a removal does with a workload step the workload API did not answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unanswered {
    /// Wait, saying how to proceed: restore the API, or force the removal.
    Wait,
    /// Skip the step, and record it skipped.
    Skip,
    /// Record the step done and hand the Node delete to the TalosCluster.
    Defer,
}

/// What a removal does when the workload API does not answer its step `step`: without `force`
/// it waits (fail closed); with it, the cordon and the drain are skipped and the Node delete is
/// deferred. Any other step does not talk to the workload API and waits.
pub fn unanswered_node_step(step: RemovalStep, force: bool) -> Unanswered {
    match step {
        _ if !force => Unanswered::Wait,
        RemovalStep::Cordoned | RemovalStep::Drained => Unanswered::Skip,
        RemovalStep::NodeDeleted => Unanswered::Defer,
        RemovalStep::Pending
        | RemovalStep::EtcdLeft
        | RemovalStep::Reset
        | RemovalStep::Complete => Unanswered::Wait,
    }
}

/// What becomes of a deferred Node delete once the workload API answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeferredDelete {
    /// The Node is the removed machine's: delete it.
    Delete,
    /// No such Node any more: nothing to do.
    Gone,
    /// The Node is kept and the deferred delete dropped: it is another node's now.
    Kept(Kept),
}

/// Why a deferred Node delete is dropped without deleting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kept {
    /// The Node was created at or after the removal deferred its delete: a node that joined
    /// since, under the same name.
    RegisteredAfter,
    /// A live TalosMachine of the cluster records this Node as its own.
    Claimed {
        /// That machine.
        machine: String,
    },
}

/// Whether the deferred delete of a Node runs: `created` is the Node's creation time as the
/// workload API answers it (`None`: no such Node), `since` when the removal deferred it, both in
/// seconds, and `claimed_by` a live machine whose status names the Node. A Node that may be
/// another node's is never deleted.
pub fn deferred_node_delete(
    created: Option<i64>,
    since: i64,
    claimed_by: Option<&str>,
) -> DeferredDelete {
    let Some(created) = created else {
        return DeferredDelete::Gone;
    };
    if let Some(machine) = claimed_by {
        return DeferredDelete::Kept(Kept::Claimed {
            machine: machine.to_owned(),
        });
    }
    if created >= since {
        return DeferredDelete::Kept(Kept::RegisteredAfter);
    }
    DeferredDelete::Delete
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

    #[test]
    fn without_force_every_unanswered_step_waits() {
        for step in ALL_STEPS {
            assert_eq!(
                unanswered_node_step(step, false),
                Unanswered::Wait,
                "{step:?}"
            );
        }
    }

    #[test]
    fn with_force_the_cordon_and_drain_are_skipped_and_the_node_delete_deferred() {
        let decided: Vec<_> = ALL_STEPS
            .into_iter()
            .map(|step| (step, unanswered_node_step(step, true)))
            .collect();
        assert_eq!(
            decided,
            [
                (RemovalStep::Pending, Unanswered::Wait),
                (RemovalStep::Cordoned, Unanswered::Skip),
                (RemovalStep::Drained, Unanswered::Skip),
                (RemovalStep::EtcdLeft, Unanswered::Wait),
                (RemovalStep::Reset, Unanswered::Wait),
                (RemovalStep::NodeDeleted, Unanswered::Defer),
                (RemovalStep::Complete, Unanswered::Wait),
            ]
        );
    }

    #[test]
    fn a_node_registered_before_the_removal_and_claimed_by_no_one_is_deleted() {
        assert_eq!(
            deferred_node_delete(Some(100), 200, None),
            DeferredDelete::Delete
        );
    }

    #[test]
    fn a_node_already_gone_needs_nothing() {
        assert_eq!(deferred_node_delete(None, 200, None), DeferredDelete::Gone);
        assert_eq!(
            deferred_node_delete(None, 200, Some("w-2")),
            DeferredDelete::Gone
        );
    }

    #[test]
    fn a_node_registered_since_the_removal_is_kept() {
        for created in [200, 201, 10_000] {
            assert_eq!(
                deferred_node_delete(Some(created), 200, None),
                DeferredDelete::Kept(Kept::RegisteredAfter),
                "created at {created}"
            );
        }
    }

    #[test]
    fn a_node_another_live_machine_claims_is_kept_whenever_it_was_created() {
        for created in [100, 300] {
            assert_eq!(
                deferred_node_delete(Some(created), 200, Some("w-2")),
                DeferredDelete::Kept(Kept::Claimed {
                    machine: "w-2".into()
                })
            );
        }
    }
}
