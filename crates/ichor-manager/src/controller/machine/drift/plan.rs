//! The drift rollout's pure decisions: what the planner needs to know of each machine, what
//! its answer on whose turn it is means for this machine, and what `ConfigApplied` says when
//! a machine is back from its turn.

use ichor_api::machine::{ApprovalState, TalosMachineStatus};
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{DriftMachine, DriftTurn};
use ichor_render::Rendered;
use ichor_talos::TalosError;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;

use crate::Stop;
use crate::controller::machine::plan::{DriftRefused, config_applied, drift_refused};
use crate::infra::conditions as cond;

/// What the drift rollout needs to know of each of `machines` that is a drift target.
pub(super) fn drift_views(
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    sources: &crate::layers::Sources,
    bundle: &ichor_render::SecretsBundle,
) -> Vec<DriftMachine> {
    machines
        .iter()
        .filter_map(|m| drift_view(cluster, m, sources, bundle))
        .collect()
}

/// What the drift rollout needs to know of `machine` (`None`: not an approved machine with a
/// role, or its config does not render, so it is no drift target).
fn drift_view(
    cluster: &TalosCluster,
    machine: &TalosMachine,
    sources: &crate::layers::Sources,
    bundle: &ichor_render::SecretsBundle,
) -> Option<DriftMachine> {
    let role = machine.spec.role?;
    if machine.spec.approval_state != ApprovalState::Approved {
        return None;
    }
    let status = machine.status.clone().unwrap_or_default();
    let rendered = super::super::render_for(cluster, machine, role, sources, bundle).ok()?;
    let upgrade = super::super::upgrade::plan::upgrade_image(cluster, &status, &rendered);
    Some(DriftMachine {
        name: machine.name_any(),
        role,
        rendered: rendered.hash,
        applied: status.applied.config_hash.clone(),
        healthy: cond::is_true(&status.conditions, conditions::READY),
        leaving: machine.metadata.deletion_timestamp.is_some() || status.removal.progress.is_some(),
        upgrade,
    })
}

/// The reboot for drift is done (or the live apply seen through): the node is back and
/// healthy, and `ConfigApplied` says so. The turn ends once that is stored (`act::end_turn`).
pub(in super::super) fn drift_back(
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
    rendered: &Rendered,
    now: &Time,
) {
    let message = format!(
        "config {} applied; the node is healthy again",
        rendered.hash
    );
    config_applied(status, machine, message, now);
}

/// Why a machine waits for another machine's turn: said without naming that machine, so the
/// message holds until its own turn comes, and the end of each turn need wake only the machine
/// next (ADR 0071); the cluster's `status.lock` and `status.rollout.inFlight` name the machine
/// in its turn.
pub(in super::super) const TURN_WAIT: &str = "waits for its turn: control planes one at a time, then workers, as many at once as spec.rollout.maxUnavailable lets be down (default one), by name, each healthy again (Ready, and for a control plane a healthy etcd voter) before the next; the cluster's status.lock names the steps in their turn";

/// Why machine `name`'s drift (or upgrade) waits, by the planner's `turn` (`None`: it is its
/// turn, or no machine drifted); `why` is what the node that halted the rollout answered.
pub(super) fn turn_wait(turn: DriftTurn, name: &str, why: &str) -> Option<Stop> {
    match turn {
        DriftTurn::Settled => None,
        DriftTurn::Next { machine, .. } if machine == name => None,
        DriftTurn::Next { .. } | DriftTurn::WaitForHealthy { .. } => Some(Stop::new(
            reasons::DRIFT_QUEUED,
            format!("its changed config {TURN_WAIT}"),
        )),
        DriftTurn::Halted { machine } => Some(Stop::new(
            reasons::DRIFT_HALTED,
            format!(
                "the drift rollout stopped at {machine}, which refused its changed config ({why}); no other machine gets it until a change renders {machine}'s config differently: fix the patch"
            ),
        )),
    }
}

/// Why the reboot for config `hash` does not go when the node refused it staged (`error`): a
/// refusal of the config itself halts the rollout; anything else is retried.
pub(super) fn staging_refused(error: &TalosError, hash: &str) -> Stop {
    if drift_refused(error) == DriftRefused::StageAndReboot {
        return Stop::new(
            reasons::DRIFT_HALTED,
            format!(
                "the node refused config {hash}: {error}; the drift rollout stops here and no other machine gets it until the patch is fixed"
            ),
        );
    }
    Stop::new(
        reasons::DRIFT_NOT_APPLIED,
        format!(
            "config {hash} was not applied: the node refused it staged too: {error}; it is retried"
        ),
    )
}

/// Whether the node already said config `hash` cannot go live, and its reboot waits (for the
/// lock, or the rollout policy: a window, a gate, a fresh backup): `ConfigApplied` says so
/// for this very config. The live apply is then not asked again at every look; the reboot's
/// own checks run instead.
pub(super) fn reboot_known_needed(status: &TalosMachineStatus, hash: &str) -> bool {
    let this_config = format!("config {hash} ");
    status.conditions.iter().any(|c| {
        c.type_ == conditions::CONFIG_APPLIED
            && (c.reason == reasons::NEEDS_REBOOT
                || crate::rollout_policy::is_policy_hold(&c.reason))
            && c.message.starts_with(&this_config)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reboot_known_needed_is_this_configs_and_waits_on_the_lock_or_the_policy() {
        let with = |reason: &str, message: &str| {
            let mut status = TalosMachineStatus::default();
            cond::set(
                &mut status.conditions,
                conditions::CONFIG_APPLIED,
                false,
                reason,
                message.to_owned(),
                None,
                &Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            );
            status
        };
        let held = with(
            reasons::OUTSIDE_MAINTENANCE_WINDOW,
            "config sha256:b needs a reboot: the reboot its changed config needs waits: outside every maintenance window",
        );
        assert!(reboot_known_needed(&held, "sha256:b"));
        assert!(
            !reboot_known_needed(&held, "sha256:c"),
            "another config: tried live"
        );
        let refused = with(
            reasons::NEEDS_REBOOT,
            "config sha256:b cannot be applied live (…)",
        );
        assert!(reboot_known_needed(&refused, "sha256:b"));
        // A planner's wait or a retry: the live apply is asked again.
        let retry = with(
            reasons::DRIFT_NOT_APPLIED,
            "config sha256:b was not applied",
        );
        assert!(!reboot_known_needed(&retry, "sha256:b"));
        assert!(!reboot_known_needed(
            &TalosMachineStatus::default(),
            "sha256:b"
        ));
    }

    #[test]
    fn a_machine_waits_only_for_another_machines_turn() {
        let next = |machine: &str| DriftTurn::Next {
            machine: machine.to_owned(),
            justification: String::new(),
        };
        assert_eq!(turn_wait(DriftTurn::Settled, "w-1", ""), None);
        assert_eq!(turn_wait(next("w-1"), "w-1", ""), None);
        let queued = turn_wait(next("cp-1"), "w-1", "").expect("waits for cp-1");
        assert_eq!(queued.reason, reasons::DRIFT_QUEUED);
        let sick = DriftTurn::WaitForHealthy {
            machine: "cp-1".to_owned(),
        };
        assert_eq!(
            turn_wait(sick, "w-1", ""),
            Some(queued),
            "one message whose turn or health it waits for: it holds until its own turn"
        );
    }

    #[test]
    fn a_halted_rollout_names_the_machine_and_what_its_node_answered() {
        let halted = DriftTurn::Halted {
            machine: "cp-1".to_owned(),
        };
        let stop = turn_wait(halted, "w-1", "unknown field").expect("halted");
        assert_eq!(stop.reason, reasons::DRIFT_HALTED);
        assert!(
            stop.message.contains("stopped at cp-1") && stop.message.contains("(unknown field)"),
            "{}",
            stop.message
        );
    }
}
