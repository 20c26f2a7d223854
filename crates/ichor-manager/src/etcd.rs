//! A control plane's etcd member, shared by the machine controller (which records it at every
//! look) and the safety check before a disruptive step (which looks again first): what its
//! node's `EtcdStatus` answer means ([`etcd_answered`]), what is recorded of it
//! ([`etcd_observation`], pure), and the one call that asks ([`etcd_answer`]).

use std::time::Duration;

use ichor_api::machine::EtcdObservation;
use ichor_talos::{Credentials, EtcdStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::infra::clock::elapsed;

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

/// What a control plane's etcd member answers now (`None`: the node does not answer).
pub async fn etcd_answer(address: &str, credentials: &Credentials) -> Option<Etcd> {
    let client = crate::connect(address, credentials).await?;
    Some(etcd_answered(client.etcd_status().await))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ichor_talos::TalosError;

    pub(crate) fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
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

    pub(crate) fn etcd_status(member_id: u64, learner: bool) -> EtcdStatus {
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
}
