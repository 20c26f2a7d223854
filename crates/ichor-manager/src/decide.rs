//! Pure decisions: what a machine's observations mean, whether a node's version is acceptable,
//! and which machine bootstraps etcd. No I/O here; the reconcilers observe and act.

use std::time::Duration;

use ichor_api::common::Role;
use ichor_api::machine::{EtcdObservation, MachinePhase};
use ichor_api::names::reasons;
use ichor_talos::{ApplyRefusal, EtcdStatus, Stage, TalosError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// A node's etcd membership, as its local member reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Etcd {
    /// A voter with this member id.
    Voter(u64),
    /// A learner (joined, not promoted yet).
    Learner(u64),
    /// A voter with this member id that answers with errors (an alarm such as NOSPACE, or no
    /// leader): a voter, not a healthy one.
    Failing(u64),
    /// No member runs (not bootstrapped, or not joined yet).
    NotMember,
}

/// What a configured node shows over mutual TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView {
    /// Its stage.
    pub stage: Stage,
    /// Its etcd membership (control planes).
    pub etcd: Etcd,
}

/// Where an applied machine stands, with the reason and message for its `Ready` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Standing {
    /// The phase.
    pub phase: MachinePhase,
    /// Whether it counts as Ready.
    pub ready: bool,
    /// Condition reason.
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
}

/// Judges an applied machine. Control-plane join progress is judged by stage `running` and
/// etcd voter membership, not by `ready`: with CNI `none` or Cilium not installed yet,
/// `nodeReady` stays unmet (talos-facts §8.3). A worker's API arriving late is a normal wait:
/// it needs trustd on a bootstrapped control plane (§5).
pub fn standing(role: Role, api: Option<NodeView>) -> Standing {
    let Some(view) = api else {
        return Standing {
            phase: MachinePhase::Booting,
            ready: false,
            reason: reasons::WAITING_FOR_NODE_API,
            message: match role {
                Role::Worker => "installed; the worker's API comes up once it gets its certificate from trustd on a bootstrapped control plane".into(),
                Role::ControlPlane => "installing or rebooting; waiting for the node's API with mutual TLS".into(),
            },
        };
    };
    if view.stage != Stage::Running {
        return Standing {
            phase: MachinePhase::Booting,
            ready: false,
            reason: reasons::BOOTING,
            message: format!("the node is in stage {:?}", view.stage),
        };
    }
    match (role, view.etcd) {
        (Role::Worker, _) => Standing {
            phase: MachinePhase::Ready,
            ready: true,
            reason: reasons::RUNNING,
            message: "the worker is running".into(),
        },
        (Role::ControlPlane, Etcd::Voter(id)) => Standing {
            phase: MachinePhase::Ready,
            ready: true,
            reason: reasons::ETCD_VOTER,
            message: format!("running; etcd voter {id:016x}"),
        },
        (Role::ControlPlane, Etcd::Failing(id)) => Standing {
            phase: MachinePhase::Ready,
            ready: false,
            reason: reasons::ETCD_UNHEALTHY,
            message: format!(
                "running; etcd voter {id:016x} reports errors (an alarm, or no leader): see `talosctl etcd status` and `talosctl etcd alarm list`"
            ),
        },
        (Role::ControlPlane, Etcd::Learner(id)) => Standing {
            phase: MachinePhase::Joining,
            ready: false,
            reason: reasons::ETCD_LEARNER,
            message: format!("joined etcd as learner {id:016x}; waiting for promotion"),
        },
        (Role::ControlPlane, Etcd::NotMember) => Standing {
            phase: MachinePhase::Joining,
            ready: false,
            reason: reasons::WAITING_FOR_ETCD,
            message: "running; etcd waits for the cluster's bootstrap or for joining".into(),
        },
    }
}

/// What a control plane's `EtcdStatus` answer says of its member. An error is not a member
/// that answers: none runs yet, it has left, or it runs and fails (a hung or crashed member:
/// Talos asks the local member, and that call fails). The answer alone cannot tell these
/// apart; [`etcd_observation`] keeps a known voter a voter, unhealthy. A member that answers
/// with errors (`EtcdMemberStatus.errors`, field 8, talos-facts "Etcd messages": etcd's
/// `maintenanceServer.Status` lists "etcdserver: no leader" and each alarm there) is a failing
/// voter.
pub fn etcd_answered<E>(answer: Result<EtcdStatus, E>) -> Etcd {
    match answer {
        Ok(status) if status.learner => Etcd::Learner(status.member_id),
        Ok(status) if !status.errors.is_empty() => Etcd::Failing(status.member_id),
        Ok(status) => Etcd::Voter(status.member_id),
        Err(_) => Etcd::NotMember,
    }
}

/// How old an unchanged etcd observation may be before it is recorded again: writing the time
/// at every look would change the object at every reconcile, and each change starts another.
pub const OBSERVATION_REFRESH: Duration = Duration::from_secs(30);

/// A control plane's etcd member as observed now, from what its node answered (`None`: it did
/// not answer) and the last observation. A voter stays a voter while it does not answer or its
/// member fails: it is still in the member list, and the planner must count it, unhealthy. An
/// unchanged observation younger than [`OBSERVATION_REFRESH`] is kept as it was.
pub fn etcd_observation(
    previous: Option<&EtcdObservation>,
    answered: Option<Etcd>,
    now: Timestamp,
) -> EtcdObservation {
    let was_voter = previous.is_some_and(|p| p.voter);
    let (voter, healthy) = match answered {
        Some(Etcd::Voter(_)) => (true, true),
        Some(Etcd::Failing(_)) => (true, false),
        Some(Etcd::Learner(_) | Etcd::NotMember) | None => (was_voter, false),
    };
    if let Some(previous) = previous
        && previous.voter == voter
        && previous.healthy == healthy
        && previous.observed_at.0 <= now
        && elapsed(previous.observed_at.0, now) < OBSERVATION_REFRESH
    {
        return previous.clone();
    }
    EtcdObservation {
        voter,
        healthy,
        observed_at: Time(now),
    }
}

/// `vMAJOR.MINOR.PATCH` as numbers (pre-release suffixes ignored).
fn numbers(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Whether a node running `node` may get a config rendered for contract `contract`: its
/// minor must be at least the contract's (an older Talos cannot load newer documents).
pub fn version_supported(node: &str, contract: &str) -> bool {
    match (numbers(node), numbers(contract)) {
        (Some((a, b, _)), Some((c, d, _))) => (a, b) >= (c, d),
        _ => false,
    }
}

/// What to do about drift a node refused to apply live with `NO_REBOOT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftRefused {
    /// The change may need a reboot: stage it and reboot under the cluster lock. The staged
    /// apply is validated like the live one, so a config that is invalid (rather than not
    /// applicable live) is refused there, before any reboot.
    StageAndReboot,
    /// The node refused it for a passing reason (busy, or it does not serve the call): it did
    /// not take the config. Report it and retry; a transient error never reboots a node.
    Retry,
    /// No answer came (no connection, a timeout, another code): the node may have taken the
    /// config all the same. Report it and retry, keeping the intent, so the next attempt looks
    /// for the config on the node before it sends it again (a config is applied once).
    Unanswered,
}

/// Decides on a refused `NO_REBOOT` apply by its gRPC code, never its text. Talos ≤ 1.13
/// refuses a change it cannot apply immediately with `InvalidArgument`, the code it also
/// gives an invalid config (talos-facts §11.1 step 9, and steps 5 and 8); `FailedPrecondition`
/// means another apply is in progress or the node is rebooting (§11.1 steps 2 and 3, §5).
pub fn drift_refused(error: &TalosError) -> DriftRefused {
    match error.apply_refusal() {
        ApplyRefusal::NotLive => DriftRefused::StageAndReboot,
        ApplyRefusal::Busy | ApplyRefusal::Unsupported => DriftRefused::Retry,
        ApplyRefusal::NotAnswered => DriftRefused::Unanswered,
    }
}

/// Whether a cluster last swept at `last` (with its generation then) is due for a sweep at
/// `now`: never swept, its interval passed, or its spec changed since.
pub fn sweep_due(
    last: Option<(Timestamp, Option<i64>)>,
    generation: Option<i64>,
    interval: Duration,
    now: Timestamp,
) -> bool {
    match last {
        None => true,
        Some((at, swept_generation)) => {
            swept_generation != generation || elapsed(at, now) >= interval
        }
    }
}

/// The time from `then` to `now` (zero if `now` is earlier).
pub fn elapsed(then: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(then)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: tonic::Code) -> TalosError {
        TalosError::Rpc {
            method: "ApplyConfiguration",
            endpoint: "10.0.0.1".into(),
            status: tonic::Status::new(code, "the text is never read"),
        }
    }

    #[test]
    fn only_a_not_live_refusal_leads_to_a_staged_reboot() {
        assert_eq!(
            drift_refused(&refused(tonic::Code::InvalidArgument)),
            DriftRefused::StageAndReboot
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::FailedPrecondition)),
            DriftRefused::Retry,
            "another apply in progress"
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::Unimplemented)),
            DriftRefused::Retry,
            "not served"
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::Unavailable)),
            DriftRefused::Unanswered
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::DeadlineExceeded)),
            DriftRefused::Unanswered,
            "the call's limit passed: the node may have applied it"
        );
        let timeout = TalosError::ConnectTimeout {
            endpoint: "10.0.0.1".into(),
            seconds: 10,
        };
        assert_eq!(drift_refused(&timeout), DriftRefused::Unanswered);
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    #[test]
    fn a_sweep_is_due_after_its_interval_or_a_spec_change() {
        let interval = Duration::from_secs(300);
        let swept = Some((at("2026-12-03T10:00:00Z"), Some(4)));
        assert!(sweep_due(
            None,
            Some(4),
            interval,
            at("2026-12-03T10:00:00Z")
        ));
        assert!(!sweep_due(
            swept,
            Some(4),
            interval,
            at("2026-12-03T10:04:59Z")
        ));
        assert!(sweep_due(
            swept,
            Some(4),
            interval,
            at("2026-12-03T10:05:00Z")
        ));
        assert!(
            sweep_due(swept, Some(5), interval, at("2026-12-03T10:00:01Z")),
            "a spec change sweeps at once"
        );
        assert!(
            !sweep_due(swept, Some(4), interval, at("2026-12-03T09:00:00Z")),
            "a clock that went back is no reason to sweep"
        );
    }

    #[test]
    fn join_progress_is_judged_by_voting_not_readiness() {
        let running = |etcd| {
            Some(NodeView {
                stage: Stage::Running,
                etcd,
            })
        };
        assert!(standing(Role::ControlPlane, running(Etcd::Voter(1))).ready);
        assert_eq!(
            standing(Role::ControlPlane, running(Etcd::Learner(1))).phase,
            MachinePhase::Joining
        );
        assert!(!standing(Role::ControlPlane, running(Etcd::NotMember)).ready);
        assert!(standing(Role::Worker, running(Etcd::NotMember)).ready);
        assert_eq!(
            standing(Role::Worker, None).reason,
            reasons::WAITING_FOR_NODE_API
        );
    }

    #[test]
    fn a_voter_stays_a_voter_while_it_does_not_answer() {
        let now = at("2026-12-03T10:00:00Z");
        let voter = etcd_observation(None, Some(Etcd::Voter(7)), now);
        assert!(voter.voter && voter.healthy);
        assert_eq!(voter.observed_at, Time(now));
        for silent in [None, Some(Etcd::NotMember)] {
            let later = etcd_observation(Some(&voter), silent, now);
            assert!(later.voter && !later.healthy, "{silent:?}");
        }
        // Unchanged and recent: kept as it was, so recording it changes nothing.
        let soon = now + std::time::Duration::from_secs(29);
        assert_eq!(
            etcd_observation(Some(&voter), Some(Etcd::Voter(7)), soon),
            voter
        );
        let later = now + OBSERVATION_REFRESH;
        assert_eq!(
            etcd_observation(Some(&voter), Some(Etcd::Voter(7)), later).observed_at,
            Time(later)
        );
        let joining = etcd_observation(None, Some(Etcd::Learner(8)), now);
        assert!(!joining.voter && !joining.healthy);
        let installing = etcd_observation(None, None, now);
        assert!(!installing.voter && !installing.healthy);
    }

    fn etcd_status(member_id: u64, learner: bool) -> EtcdStatus {
        EtcdStatus {
            member_id,
            leader: 1,
            learner,
            raft_index: 10,
            raft_term: 2,
            db_size: 4096,
            errors: Vec::new(),
        }
    }

    /// What Talos answers when the node's own member does not: its local client's call times
    /// out (`Server.EtcdStatus`).
    fn member_fails() -> Result<EtcdStatus, TalosError> {
        Err(TalosError::Rpc {
            method: "EtcdStatus",
            endpoint: "10.0.0.3".into(),
            status: tonic::Status::deadline_exceeded(
                "failed to query etcd status: context deadline exceeded",
            ),
        })
    }

    #[test]
    fn a_voter_whose_member_fails_while_its_node_answers_stays_a_voter_unhealthy() {
        let now = at("2026-12-03T10:00:00Z");
        let ok = || Ok::<_, TalosError>(etcd_status(7, false));
        let voter = etcd_observation(None, Some(etcd_answered(ok())), now);
        assert!(voter.voter && voter.healthy);

        // The node answers, its member does not: recorded at once as an unhealthy voter,
        // never as "not a member".
        let soon = now + Duration::from_secs(1);
        let sick = etcd_observation(Some(&voter), Some(etcd_answered(member_fails())), soon);
        assert!(sick.voter && !sick.healthy, "{sick:?}");
        assert_eq!(
            sick.observed_at,
            Time(soon),
            "a change is recorded when seen"
        );
        let later = now + Duration::from_secs(45);
        let still = etcd_observation(Some(&sick), Some(etcd_answered(member_fails())), later);
        assert!(still.voter && !still.healthy, "{still:?}");

        // Once its member answers again, it is a healthy voter again.
        let back = etcd_observation(Some(&still), Some(etcd_answered(ok())), later);
        assert!(back.voter && back.healthy, "{back:?}");

        // A control plane never seen a voter is not made one by a failing answer.
        let never = etcd_observation(None, Some(etcd_answered(member_fails())), now);
        assert!(!never.voter && !never.healthy);
        assert_eq!(
            etcd_answered(Ok::<_, TalosError>(etcd_status(8, true))),
            Etcd::Learner(8)
        );
    }

    #[test]
    fn a_member_answering_with_an_alarm_is_a_failing_voter_not_ready() {
        let now = at("2026-12-03T10:00:00Z");
        let mut alarmed = etcd_status(7, false);
        alarmed.errors = vec!["memberID:7 alarm:NOSPACE".into()];
        let answer = etcd_answered(Ok::<_, TalosError>(alarmed));
        assert_eq!(answer, Etcd::Failing(7));
        let seen = etcd_observation(None, Some(answer), now);
        assert!(seen.voter && !seen.healthy, "{seen:?}");
        let judged = standing(
            Role::ControlPlane,
            Some(NodeView {
                stage: Stage::Running,
                etcd: answer,
            }),
        );
        assert!(!judged.ready);
        assert_eq!(judged.reason, reasons::ETCD_UNHEALTHY);
    }

    #[test]
    fn older_talos_than_the_contract_is_refused() {
        assert!(version_supported("v1.14.1", "v1.14.0"));
        assert!(version_supported("v1.15.0", "v1.14.0"));
        assert!(!version_supported("v1.13.9", "v1.14.0"));
        assert!(version_supported("v1.13.9", "v1.13.0"));
        assert!(!version_supported("garbage", "v1.13.0"));
    }
}
