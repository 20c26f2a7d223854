//! Every small cluster shape (0..=7 control planes, some already being deleted, with pending,
//! rejected, not-yet-applied control planes and workers), every target in it, every declared
//! count: the verdicts match the rules stated in closed form.

use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;
use ichor_deleteguard::{
    Cluster, Machine, Refusal, RemovalVerdict, check_machine_delete, check_machine_removal,
    check_machine_update, reasons,
};

/// What a generated machine is, as the rules are stated for people.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// An approved control plane whose config was applied.
    LiveControlPlane,
    /// The same, already being deleted.
    DeletingControlPlane,
    /// Approved as control plane, config not applied yet.
    UnappliedControlPlane,
    /// Pending, role preset to control plane.
    PendingControlPlane,
    /// Rejected, never applied, role control plane.
    RejectedControlPlane,
    /// An applied worker.
    Worker,
    /// An applied worker being deleted.
    DeletingWorker,
}

fn machine(kind: Kind, i: usize) -> Machine {
    let m = Machine::new(format!("{kind:?}-{i}")).in_namespace("infra");
    match kind {
        Kind::LiveControlPlane => m.control_plane().approved().config_applied().healthy(),
        Kind::DeletingControlPlane => m
            .control_plane()
            .approved()
            .config_applied()
            .healthy()
            .being_deleted(),
        Kind::UnappliedControlPlane => m.control_plane().approved(),
        Kind::PendingControlPlane => m.control_plane(),
        Kind::RejectedControlPlane => m.control_plane().rejected(),
        Kind::Worker => m.worker().approved().config_applied(),
        Kind::DeletingWorker => m.worker().approved().config_applied().being_deleted(),
    }
}

/// One generated cluster.
struct Shape {
    /// Its machines, each with its kind.
    machines: Vec<(Kind, Machine)>,
    /// Applied control planes not being deleted.
    live: usize,
    /// Applied control planes being deleted.
    deleting: usize,
}

/// Every shape.
fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for members in 0..=7 {
        for deleting in 0..=members {
            for unapplied in 0..=1 {
                for pending in 0..=1 {
                    for rejected in 0..=1 {
                        for workers in 0..=2 {
                            for deleting_workers in 0..=1 {
                                let mut ms = Vec::new();
                                let mut add = |kind, n| {
                                    for i in 0..n {
                                        ms.push((kind, machine(kind, i)));
                                    }
                                };
                                add(Kind::LiveControlPlane, members - deleting);
                                add(Kind::DeletingControlPlane, deleting);
                                add(Kind::UnappliedControlPlane, unapplied);
                                add(Kind::PendingControlPlane, pending);
                                add(Kind::RejectedControlPlane, rejected);
                                add(Kind::Worker, workers);
                                add(Kind::DeletingWorker, deleting_workers);
                                out.push(Shape {
                                    machines: ms,
                                    live: members - deleting,
                                    deleting,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The admission rule, stated per kind: a live control plane needs three or more live members
/// (itself included) and the annotation; at one it is the last, at two quorum is at risk.
fn expected_admission(kind: Kind, live: usize, annotated: bool) -> Option<&'static str> {
    match kind {
        Kind::LiveControlPlane if live == 1 => Some(reasons::LAST_CONTROL_PLANE),
        Kind::LiveControlPlane if live == 2 => Some(reasons::QUORUM_AT_RISK),
        Kind::LiveControlPlane | Kind::UnappliedControlPlane if !annotated => {
            Some(reasons::ALLOW_DELETE_REQUIRED)
        }
        _ => None,
    }
}

#[test]
fn admission_matches_the_rules_for_every_small_cluster() {
    let mut checked = 0usize;
    for Shape {
        machines,
        live,
        deleting,
    } in shapes()
    {
        for (kind, target) in &machines {
            for annotated in [false, true] {
                let mut target = target.clone();
                target.allow_delete = annotated;
                let cluster = Cluster::new("prod", 3).in_namespace("infra");
                let got = check_machine_delete(&target, &machines_of(&machines), &cluster);
                let want = if target.deleting {
                    None
                } else {
                    expected_admission(*kind, live, annotated)
                };
                assert_eq!(
                    got.as_ref().err().map(Refusal::reason),
                    want,
                    "{kind:?} live={live} deleting={deleting} annotated={annotated}: {got:?}"
                );
                if let Err(refusal) = &got
                    && refusal.reason() == reasons::QUORUM_AT_RISK
                {
                    let message = refusal.message();
                    let expected = format!(
                        "control planes {live} -> {}, below etcd quorum of {} for {live} members",
                        live - 1,
                        live / 2 + 1
                    );
                    assert!(message.contains(&expected), "{message}");
                    assert_eq!(
                        message.contains("already being deleted"),
                        deleting > 0,
                        "{message}"
                    );
                }
                if let Err(refusal) = &got
                    && refusal.reason() == reasons::ALLOW_DELETE_REQUIRED
                {
                    let command = format!(
                        "kubectl annotate talosmachine {} ichor.maesh.dev/allow-delete=true -n infra",
                        target.name
                    );
                    assert!(refusal.message().contains(&command), "{refusal}");
                }
                // A cluster being torn down lifts every machine rule.
                let teardown = cluster.clone().being_deleted().allowing_delete();
                assert_eq!(
                    check_machine_delete(&target, &machines_of(&machines), &teardown),
                    Ok(())
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

/// The controller's rule for a target being deleted: the admission rules counted with the target
/// among the members, then `live members after >= declared`.
fn expected_removal(
    kind: Kind,
    live_others: usize,
    annotated: bool,
    declared: usize,
) -> Option<&'static str> {
    match kind {
        Kind::LiveControlPlane | Kind::DeletingControlPlane => {
            let before = live_others + 1;
            if before == 1 {
                Some(reasons::LAST_CONTROL_PLANE)
            } else if before == 2 {
                Some(reasons::QUORUM_AT_RISK)
            } else if !annotated {
                Some(reasons::ALLOW_DELETE_REQUIRED)
            } else if before - 1 < declared {
                Some(reasons::AWAITING_REPLACEMENT)
            } else {
                None
            }
        }
        Kind::UnappliedControlPlane if !annotated => Some(reasons::ALLOW_DELETE_REQUIRED),
        _ => None,
    }
}

#[test]
fn removal_matches_the_rules_for_every_small_cluster() {
    let mut checked = 0usize;
    for Shape { machines, live, .. } in shapes() {
        for (kind, target) in &machines {
            let live_others = if *kind == Kind::LiveControlPlane {
                live - 1
            } else {
                live
            };
            for annotated in [false, true] {
                let mut target = target.clone().being_deleted();
                target.allow_delete = annotated;
                for declared in 1..=7 {
                    let cluster = Cluster::new("prod", declared);
                    let got = check_machine_removal(&target, &machines_of(&machines), &cluster);
                    let want = expected_removal(*kind, live_others, annotated, declared);
                    assert_eq!(
                        got.reason(),
                        want,
                        "{kind:?} live={live} annotated={annotated} declared={declared}: {got:?}"
                    );
                    match (&got, want) {
                        (RemovalVerdict::Wait(_), Some(r)) => {
                            assert_eq!(r, reasons::AWAITING_REPLACEMENT)
                        }
                        (RemovalVerdict::Refuse(_), Some(r)) => {
                            assert_ne!(r, reasons::AWAITING_REPLACEMENT)
                        }
                        (RemovalVerdict::Proceed(_), None) => {}
                        other => panic!("verdict kind mismatch: {other:?}"),
                    }
                    // In a teardown every removal goes, a configured control plane once the
                    // configured workers are gone.
                    let teardown = check_machine_removal(
                        &target,
                        &machines_of(&machines),
                        &cluster.clone().being_deleted().allowing_delete(),
                    );
                    let workers_left = machines
                        .iter()
                        .any(|(k, _)| matches!(k, Kind::Worker | Kind::DeletingWorker));
                    let waits = target.is_control_plane() && target.applied && workers_left;
                    assert_eq!(
                        teardown.reason(),
                        waits.then_some(reasons::TEARDOWN_WORKERS_FIRST),
                        "{kind:?} in a teardown: {teardown:?}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 50_000, "{checked}");
}

fn machines_of(machines: &[(Kind, Machine)]) -> Vec<Machine> {
    machines.iter().map(|(_, m)| m.clone()).collect()
}

#[test]
fn approval_and_role_are_locked_exactly_when_applied() {
    let approvals = [
        ApprovalState::Pending,
        ApprovalState::Approved,
        ApprovalState::Rejected,
    ];
    let roles = [None, Some(Role::ControlPlane), Some(Role::Worker)];
    let mut checked = 0;
    for applied in [false, true] {
        for old_approval in approvals {
            for old_role in roles {
                for new_approval in approvals {
                    for new_role in roles {
                        let mut old = Machine::new("m");
                        old.applied = applied;
                        old.approval = old_approval;
                        old.role = old_role;
                        let mut new = old.clone();
                        new.approval = new_approval;
                        new.role = new_role;
                        let changed = old_approval != new_approval || old_role != new_role;
                        let got = check_machine_update(&old, &new);
                        assert_eq!(got.is_err(), applied && changed, "{old:?} -> {new:?}");
                        if let Err(refusal) = got {
                            assert_eq!(refusal.reason(), reasons::IMMUTABLE_ONCE_APPLIED);
                        }
                        checked += 1;
                    }
                }
            }
        }
    }
    assert_eq!(checked, 162);
}
