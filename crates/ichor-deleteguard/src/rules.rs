//! The rules: what admission allows, what the controller rechecks, what stays locked.

use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;

use crate::model::{Cluster, Machine, ObjectKind};
use crate::plan::{self, Disruption, RuleSet, Stage};
use crate::verdict::{LockedChange, LockedField, Refusal, RemovalVerdict, Verdict};

/// The etcd quorum of `members` members: a strict majority.
pub fn etcd_quorum(members: usize) -> usize {
    members / 2 + 1
}

/// Admission of a TalosMachine delete: the planner's rules at the door ([`plan::check`] with
/// [`Disruption::Delete`]): the last control plane, etcd quorum, the allow-delete annotation and
/// etcd health as the manager recorded it. `machines` is every TalosMachine of `cluster` (with
/// or without the target).
///
/// A target already being deleted was admitted before and passes again; so does every machine
/// of a cluster torn down ([`Cluster::tearing_down`]: deleted with its annotation).
pub fn check_machine_delete(
    target: &Machine,
    machines: &[Machine],
    cluster: &Cluster,
) -> Result<(), Refusal> {
    check_machine_delete_with(target, machines, cluster, RuleSet::ALL)
}

/// [`check_machine_delete`] with only the rules in `rules` (the model tests disable one at a
/// time).
pub fn check_machine_delete_with(
    target: &Machine,
    machines: &[Machine],
    cluster: &Cluster,
    rules: RuleSet,
) -> Result<(), Refusal> {
    if cluster.tearing_down() || target.deleting {
        return Ok(());
    }
    match plan::check_with(
        target,
        machines,
        cluster,
        &Disruption::Delete,
        Stage::Admission,
        rules,
    ) {
        Verdict::Refuse(refusal) => Err(refusal),
        Verdict::Proceed(_) | Verdict::Wait(_) => Ok(()),
    }
}

/// The controller's recheck of an admitted removal, inside the cluster lock and before its
/// first disruptive step: the planner's rules in the controller, the declared count included.
///
/// `target` is normally being deleted itself; other members being deleted are not counted as
/// remaining. In a cluster torn down every removal proceeds (the teardown orders them); in one
/// deleted without its annotation every rule still holds.
pub fn check_machine_removal(
    target: &Machine,
    machines: &[Machine],
    cluster: &Cluster,
) -> RemovalVerdict {
    plan::check(target, machines, cluster, &Disruption::Delete, Stage::Run)
}

/// Admission of a TalosCluster delete: it needs the allow-delete annotation.
pub fn check_cluster_delete(cluster: &Cluster) -> Result<(), Refusal> {
    if cluster.deleting || cluster.allow_delete {
        return Ok(());
    }
    Err(Refusal::AllowDeleteRequired {
        kind: ObjectKind::TalosCluster,
        name: cluster.name.clone(),
        namespace: cluster.namespace.clone(),
    })
}

/// The manager's own check before it tears a deleted TalosCluster down: the allow-delete
/// annotation, which admission checks too but may never have seen (the webhook unregistered).
/// Unlike [`check_cluster_delete`], a deletion under way is no reason to pass (ADR 0052).
pub fn check_cluster_teardown(cluster: &Cluster) -> Result<(), Refusal> {
    if cluster.allow_delete {
        return Ok(());
    }
    Err(Refusal::DeletedWithoutAllowDelete {
        name: cluster.name.clone(),
        namespace: cluster.namespace.clone(),
    })
}

/// Admission of a TalosMachine update: once a config was applied (in `old`), `approvalState` and
/// `role` may not change. Nothing else is refused, so the webhook configuration's match
/// condition sends only updates that change one of the two (ADR 0063): keep them in step.
pub fn check_machine_update(old: &Machine, new: &Machine) -> Result<(), Refusal> {
    if !old.applied {
        return Ok(());
    }
    let mut changes = Vec::new();
    if old.approval != new.approval {
        changes.push(LockedChange {
            field: LockedField::ApprovalState,
            from: approval_str(old.approval).into(),
            to: approval_str(new.approval).into(),
        });
    }
    if old.role != new.role {
        changes.push(LockedChange {
            field: LockedField::Role,
            from: role_str(old.role).into(),
            to: role_str(new.role).into(),
        });
    }
    if changes.is_empty() {
        return Ok(());
    }
    Err(Refusal::ImmutableOnceApplied {
        name: old.name.clone(),
        changes,
    })
}

/// `spec.approvalState` as written in the API.
fn approval_str(approval: ApprovalState) -> &'static str {
    match approval {
        ApprovalState::Pending => "pending",
        ApprovalState::Approved => "approved",
        ApprovalState::Rejected => "rejected",
    }
}

/// `spec.role` as written in the API.
fn role_str(role: Option<Role>) -> &'static str {
    role.map_or("<unset>", Role::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reasons;

    use crate::fixtures::control_planes;

    fn prod(declared: usize) -> Cluster {
        Cluster::new("prod", declared).in_namespace("infra")
    }

    #[test]
    fn quorum_is_a_strict_majority() {
        let q: Vec<usize> = (1..=7).map(etcd_quorum).collect();
        assert_eq!(q, [1, 2, 2, 3, 3, 4, 4]);
    }

    #[test]
    fn passes_three_to_two() {
        let cps = control_planes(3);
        assert_eq!(check_machine_delete(&cps[0], &cps, &prod(3)), Ok(()));
    }

    #[test]
    fn refuses_two_to_one_with_the_quorum_message() {
        let cps = control_planes(2);
        let refusal = check_machine_delete(&cps[0], &cps, &prod(3)).unwrap_err();
        assert_eq!(refusal.reason(), "QuorumAtRisk");
        assert_eq!(
            refusal.message(),
            "deleting talosmachine cp-1 would take control planes 2 -> 1, below etcd quorum of 2 \
             for 2 members: approve another control plane and wait until its config is applied \
             before removing this one"
        );
    }

    #[test]
    fn refuses_second_delete_at_three_control_planes() {
        let mut cps = control_planes(3);
        assert_eq!(check_machine_delete(&cps[0], &cps, &prod(3)), Ok(()));
        cps[0].deleting = true;
        let refusal = check_machine_delete(&cps[1], &cps, &prod(3)).unwrap_err();
        assert_eq!(refusal.reason(), reasons::QUORUM_AT_RISK);
        let message = refusal.message();
        assert!(
            message.contains("control planes 2 -> 1, below etcd quorum of 2 for 2 members"),
            "{message}"
        );
        assert!(
            message.contains("(1 control plane already being deleted is not counted)"),
            "{message}"
        );
    }

    #[test]
    fn refuses_the_last_control_plane_despite_the_annotation() {
        let cps = control_planes(1);
        assert!(cps[0].allow_delete);
        let refusal = check_machine_delete(&cps[0], &cps, &prod(1)).unwrap_err();
        assert_eq!(refusal.reason(), "LastControlPlane");
        assert_eq!(
            refusal.message(),
            "talosmachine cp-1 is the last control plane of taloscluster prod (control planes \
             1 -> 0): delete the TalosCluster instead"
        );
    }

    #[test]
    fn the_last_one_standing_after_others_are_deleting_is_still_the_last() {
        let mut cps = control_planes(3);
        cps[0].deleting = true;
        cps[1].deleting = true;
        let refusal = check_machine_delete(&cps[2], &cps, &prod(3)).unwrap_err();
        assert_eq!(refusal.reason(), reasons::LAST_CONTROL_PLANE);
    }

    #[test]
    fn refuses_an_approved_control_plane_without_the_annotation() {
        let mut cps = control_planes(3);
        cps[1].allow_delete = false;
        let refusal = check_machine_delete(&cps[1], &cps, &prod(3)).unwrap_err();
        assert_eq!(refusal.reason(), "AllowDeleteRequired");
        assert_eq!(
            refusal.message(),
            "deleting control plane talosmachine cp-2 needs the annotation \
             ichor.maesh.dev/allow-delete: \"true\"; set it with: kubectl annotate talosmachine \
             cp-2 ichor.maesh.dev/allow-delete=true -n infra"
        );
    }

    #[test]
    fn the_annotation_command_takes_the_clusters_namespace_when_the_machine_has_none() {
        let cp = Machine::new("cp-9").control_plane().approved();
        let refusal = check_machine_delete(&cp, &[], &prod(3)).unwrap_err();
        assert!(refusal.message().ends_with(
            "kubectl annotate talosmachine cp-9 ichor.maesh.dev/allow-delete=true -n infra"
        ));
        let refusal = check_machine_delete(&cp, &[], &Cluster::new("prod", 3)).unwrap_err();
        assert!(
            refusal
                .message()
                .ends_with("kubectl annotate talosmachine cp-9 ichor.maesh.dev/allow-delete=true")
        );
    }

    #[test]
    fn quorum_is_reported_before_the_missing_annotation() {
        let mut cps = control_planes(2);
        cps[0].allow_delete = false;
        let refusal = check_machine_delete(&cps[0], &cps, &prod(3)).unwrap_err();
        assert_eq!(refusal.reason(), reasons::QUORUM_AT_RISK);
    }

    #[test]
    fn workers_pending_and_rejected_never_applied_go_without_the_annotation() {
        let cps = control_planes(1);
        let machines = [
            Machine::new("w-1").worker().approved().config_applied(),
            Machine::new("w-2").worker().approved(),
            Machine::new("p-1"),
            Machine::new("p-2").control_plane(),
            Machine::new("r-1").rejected(),
            Machine::new("r-2").control_plane().rejected(),
        ];
        let all: Vec<Machine> = cps.iter().chain(&machines).cloned().collect();
        for m in &machines {
            assert_eq!(
                check_machine_delete(m, &all, &prod(1)),
                Ok(()),
                "{}",
                m.name
            );
            let deleting = m.clone().being_deleted();
            let verdict = check_machine_removal(&deleting, &all, &prod(1));
            assert!(verdict.is_proceed(), "{}: {verdict:?}", m.name);
        }
    }

    #[test]
    fn an_approved_control_plane_not_yet_applied_needs_only_the_annotation() {
        let cps = control_planes(1);
        let new = Machine::new("cp-2").control_plane().approved();
        let all: Vec<Machine> = cps.iter().cloned().chain([new.clone()]).collect();
        assert_eq!(
            check_machine_delete(&new, &all, &prod(1))
                .unwrap_err()
                .reason(),
            reasons::ALLOW_DELETE_REQUIRED
        );
        assert_eq!(
            check_machine_delete(&new.allowing_delete(), &all, &prod(1)),
            Ok(())
        );
    }

    #[test]
    fn an_unapplied_control_plane_does_not_lift_quorum() {
        // Two live members and an approved machine still installing: 2 -> 1, not 3 -> 2.
        let mut all = control_planes(2);
        all.push(Machine::new("cp-3").control_plane().approved());
        let refusal = check_machine_delete(&all[0], &all, &prod(3)).unwrap_err();
        assert!(refusal.message().contains("control planes 2 -> 1"));
    }

    #[test]
    fn a_rejected_but_applied_control_plane_still_counts_and_needs_the_annotation() {
        let mut cps = control_planes(3);
        cps[2].approval = ApprovalState::Rejected;
        cps[2].allow_delete = false;
        assert_eq!(
            check_machine_delete(&cps[2], &cps, &prod(3))
                .unwrap_err()
                .reason(),
            reasons::ALLOW_DELETE_REQUIRED
        );
        cps[0].deleting = true;
        assert_eq!(
            check_machine_delete(&cps[1], &cps, &prod(3))
                .unwrap_err()
                .reason(),
            reasons::QUORUM_AT_RISK
        );
    }

    #[test]
    fn a_delete_already_admitted_passes_again() {
        let cps = control_planes(1);
        let deleting = cps[0].clone().being_deleted();
        assert_eq!(check_machine_delete(&deleting, &cps, &prod(1)), Ok(()));
    }

    #[test]
    fn a_cluster_torn_down_lifts_the_machine_rules() {
        let mut cps = control_planes(1);
        cps[0].allow_delete = false;
        let cluster = prod(1).being_deleted().allowing_delete();
        assert_eq!(check_machine_delete(&cps[0], &cps, &cluster), Ok(()));
        let deleting = cps[0].clone().being_deleted();
        let verdict = check_machine_removal(&deleting, &cps, &cluster);
        assert!(verdict.is_proceed(), "{verdict:?}");
    }

    #[test]
    fn a_cluster_deleted_without_its_annotation_keeps_every_machine_rule() {
        let mut cps = control_planes(1);
        cps[0].allow_delete = false;
        let cluster = prod(1).being_deleted();
        assert_eq!(
            check_machine_delete(&cps[0], &cps, &cluster)
                .unwrap_err()
                .reason(),
            reasons::LAST_CONTROL_PLANE
        );
        let deleting = cps[0].clone().being_deleted();
        let verdict = check_machine_removal(&deleting, &cps, &cluster);
        assert_eq!(verdict.reason(), Some(reasons::LAST_CONTROL_PLANE));
        let three = control_planes(3);
        let mut unannotated = three.clone();
        unannotated[0].allow_delete = false;
        unannotated[0].deleting = true;
        let verdict = check_machine_removal(&unannotated[0], &unannotated, &cluster);
        assert_eq!(verdict.reason(), Some(reasons::ALLOW_DELETE_REQUIRED));
    }

    #[test]
    fn a_teardown_needs_the_annotation_even_once_deleted() {
        let refusal = check_cluster_teardown(&prod(3).being_deleted()).unwrap_err();
        assert_eq!(refusal.reason(), "DeletedWithoutAllowDelete");
        assert_eq!(
            refusal.message(),
            "taloscluster prod was deleted without the annotation ichor.maesh.dev/allow-delete: \
             \"true\", which admission did not check (is the ichor webhook registered?): its \
             teardown waits and no node is touched; to tear it down, set it with: kubectl \
             annotate taloscluster prod ichor.maesh.dev/allow-delete=true -n infra"
        );
        let annotated = prod(3).being_deleted().allowing_delete();
        assert_eq!(check_cluster_teardown(&annotated), Ok(()));
        assert!(annotated.tearing_down());
    }

    #[test]
    fn refuses_a_cluster_delete_without_the_annotation() {
        let refusal = check_cluster_delete(&prod(3)).unwrap_err();
        assert_eq!(refusal.reason(), "AllowDeleteRequired");
        assert_eq!(
            refusal.message(),
            "deleting taloscluster prod needs the annotation ichor.maesh.dev/allow-delete: \
             \"true\"; set it with: kubectl annotate taloscluster prod \
             ichor.maesh.dev/allow-delete=true -n infra"
        );
        assert_eq!(check_cluster_delete(&prod(3).allowing_delete()), Ok(()));
        assert_eq!(check_cluster_delete(&prod(3).being_deleted()), Ok(()));
    }

    #[test]
    fn removal_waits_for_a_replacement_below_the_declared_count() {
        let mut cps = control_planes(3);
        cps[0].deleting = true;
        let verdict = check_machine_removal(&cps[0], &cps, &prod(3));
        assert_eq!(verdict.reason(), Some("AwaitingReplacement"));
        let RemovalVerdict::Wait(wait) = &verdict else {
            panic!("expected a wait, got {verdict:?}");
        };
        assert_eq!(
            wait.message(),
            "removing talosmachine cp-1 would take control planes 3 -> 2, below \
             spec.controlPlane.count 3 of taloscluster prod: waiting for a replacement control \
             plane (approve another machine as controlplane; it resumes once that one is a \
             healthy etcd voter), or lower spec.controlPlane.count"
        );

        // The replacement approved but not yet applied: still waiting.
        cps.push(Machine::new("cp-4").control_plane().approved());
        assert!(matches!(
            check_machine_removal(&cps[0], &cps, &prod(3)),
            RemovalVerdict::Wait(_)
        ));
        // Applied but still installing, never observed: an unhealthy voter, still waiting.
        cps[3].applied = true;
        assert!(matches!(
            check_machine_removal(&cps[0], &cps, &prod(3)),
            RemovalVerdict::Wait(_)
        ));
        // A healthy voter: 3 -> 4 -> 3.
        cps[3] = cps[3].clone().healthy();
        assert!(check_machine_removal(&cps[0], &cps, &prod(3)).is_proceed());
        // Or the declared count lowered.
        cps.pop();
        assert!(check_machine_removal(&cps[0], &cps, &prod(2)).is_proceed());
    }

    #[test]
    fn removal_rechecks_quorum_and_the_last_control_plane() {
        let mut cps = control_planes(3);
        cps[0].deleting = true;
        cps[1].deleting = true;
        let verdict = check_machine_removal(&cps[1], &cps, &prod(1));
        assert_eq!(verdict.reason(), Some(reasons::QUORUM_AT_RISK));
        assert!(
            verdict
                .message()
                .is_some_and(|m| m.contains("control planes 2 -> 1"))
        );
        let one = vec![cps[2].clone().being_deleted()];
        let verdict = check_machine_removal(&one[0], &one, &prod(1));
        assert_eq!(verdict.reason(), Some(reasons::LAST_CONTROL_PLANE));
    }

    #[test]
    fn removal_rechecks_the_annotation() {
        let mut cps = control_planes(3);
        cps[0].deleting = true;
        cps[0].allow_delete = false;
        let verdict = check_machine_removal(&cps[0], &cps, &prod(1));
        assert_eq!(verdict.reason(), Some(reasons::ALLOW_DELETE_REQUIRED));
    }

    #[test]
    fn refuses_flipping_a_live_control_plane_to_rejected() {
        let old = control_planes(1).remove(0);
        let new = old.clone().rejected();
        let refusal = check_machine_update(&old, &new).unwrap_err();
        assert_eq!(refusal.reason(), "ImmutableOnceApplied");
        assert_eq!(
            refusal.message(),
            "spec.approvalState (approved -> rejected) of talosmachine cp-1 cannot change once \
             its config was applied (status.appliedConfigHash is set): delete the machine to \
             remove it from the cluster"
        );
    }

    #[test]
    fn refuses_changing_the_role_of_an_applied_machine() {
        let old = control_planes(1).remove(0);
        let refusal = check_machine_update(&old, &old.clone().worker()).unwrap_err();
        assert!(
            refusal
                .message()
                .starts_with("spec.role (controlplane -> worker) of talosmachine cp-1")
        );
        let mut unset = old.clone();
        unset.role = None;
        unset.approval = ApprovalState::Pending;
        let refusal = check_machine_update(&old, &unset).unwrap_err();
        assert!(refusal.message().starts_with(
            "spec.approvalState (approved -> pending) and spec.role (controlplane -> <unset>)"
        ));
    }

    #[test]
    fn allows_other_updates_and_any_change_before_apply() {
        let old = control_planes(1).remove(0);
        let mut new = old.clone();
        new.allow_delete = false;
        assert_eq!(check_machine_update(&old, &new), Ok(()));
        let pending = Machine::new("m").control_plane().approved();
        assert_eq!(
            check_machine_update(&pending, &pending.clone().rejected().worker()),
            Ok(())
        );
    }

    #[test]
    fn every_reason_is_camel_case() {
        for reason in [
            reasons::ALLOW_DELETE_REQUIRED,
            reasons::LAST_CONTROL_PLANE,
            reasons::QUORUM_AT_RISK,
            reasons::IMMUTABLE_ONCE_APPLIED,
            reasons::AWAITING_REPLACEMENT,
        ] {
            assert!(
                reason.starts_with(|c: char| c.is_ascii_uppercase()),
                "{reason}"
            );
            assert!(
                reason.chars().all(|c| c.is_ascii_alphanumeric()),
                "{reason}"
            );
        }
    }
}
