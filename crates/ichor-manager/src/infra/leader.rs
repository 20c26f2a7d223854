//! Leader election on a `coordination.k8s.io` Lease (why our own: docs/adr/0015): each
//! replica has its own identity (its pod name); only the holder runs the controllers. Every
//! replica is Ready, leader or standby. A leader that cannot renew in time, or finds the lease
//! taken, stops.
//!
//! The decisions are pure functions of the observed Lease and the time ([`decide`],
//! [`expired`], [`renewal_overdue`]); [`try_acquire`] observes, decides and writes once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, PostParams};

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This replica's identity.
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the holder renews (and others retry).
    pub retry: Duration,
}

/// Whether a lease has run out at `now`: renewed longer ago than its duration, or never
/// renewed at all. Checked (`ichor_api::time::lease_expired`): a lease whose end is past the
/// last representable time (a `renewTime` in the year 9999) has not run out, so its holder
/// keeps it and the others stand by until it is deleted; a negative duration counts as zero.
pub fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    ichor_api::time::lease_expired(spec, now)
}

/// What a replica does with the Lease it observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecision {
    /// There is no Lease: create it, holding it.
    Create,
    /// It holds the Lease: renew it.
    Renew,
    /// Another holder's lease ran out (or has no holder): take it over.
    TakeOver,
    /// Another replica holds a current lease: stand by.
    StandBy,
}

/// Decides what `identity` does with the observed Lease spec at `now`.
pub fn decide(observed: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> LeaseDecision {
    let Some(spec) = observed else {
        return LeaseDecision::Create;
    };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => LeaseDecision::Renew,
        Some(holder) if !holder.is_empty() && !expired(spec, now) => LeaseDecision::StandBy,
        _ => LeaseDecision::TakeOver,
    }
}

/// Whether a leader last renewed at `renewed` must stop at `now`: two thirds of the lease's
/// duration passed without a renewal. It stops then, a third of a term before its lease can
/// run out and another replica may lead, so its in-flight work ends before anyone else acts.
pub fn renewal_overdue(renewed: Instant, now: Instant, duration: Duration) -> bool {
    now.saturating_duration_since(renewed) >= duration * 2 / 3
}

/// The Lease spec `identity` writes at `now`, over what it observed (`None` when creating).
fn claimed(
    observed: Option<&LeaseSpec>,
    settings: &LeaseSettings,
    decision: LeaseDecision,
    now: Timestamp,
) -> LeaseSpec {
    let mut spec = observed.cloned().unwrap_or_default();
    if decision != LeaseDecision::Renew {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(match observed {
            None => 0,
            Some(old) => old.lease_transitions.unwrap_or(0).saturating_add(1),
        });
    }
    spec.holder_identity = Some(settings.identity.clone());
    spec.lease_duration_seconds =
        Some(i32::try_from(settings.duration.as_secs()).unwrap_or(i32::MAX));
    spec.renew_time = Some(MicroTime(now));
    spec
}

/// Tries once to take or renew the lease; returns whether this replica holds it.
pub async fn try_acquire(
    client: &kube::Client,
    settings: &LeaseSettings,
) -> Result<bool, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let observed = leases.get_opt(&settings.name).await?;
    try_acquire_observed(client, settings, observed).await
}

/// Tries once to take or renew the lease, as `observed` just now (`None`: there was none), so
/// a caller that read it to decide reads it once; returns whether this replica holds it. A
/// write over a copy another writer has changed since conflicts, and this replica does not
/// hold it.
pub async fn try_acquire_observed(
    client: &kube::Client,
    settings: &LeaseSettings,
    observed: Option<Lease>,
) -> Result<bool, kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let now = Timestamp::now();
    let observed_spec = observed
        .as_ref()
        .map(|l| l.spec.clone().unwrap_or_default());
    let decision = decide(observed_spec.as_ref(), &settings.identity, now);
    let spec = claimed(observed_spec.as_ref(), settings, decision, now);
    let written = match (decision, observed) {
        (LeaseDecision::StandBy, _) => return Ok(false),
        (_, None) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(settings.name.clone()),
                    namespace: Some(settings.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec),
            };
            leases.create(&PostParams::default(), &lease).await
        }
        (_, Some(mut lease)) => {
            lease.spec = Some(spec);
            // The resourceVersion read above makes a concurrent taker's write conflict.
            leases
                .replace(&settings.name, &PostParams::default(), &lease)
                .await
        }
    };
    match written {
        Ok(_) => Ok(true),
        // Another replica created or wrote it first.
        Err(kube::Error::Api(status)) if status.is_already_exists() || status.is_conflict() => {
            Ok(false)
        }
        Err(error) => Err(error),
    }
}

/// Runs `work` while keeping the lease of `settings` renewed every third of its duration, so a
/// long step (an image pull, a defragment, an upload) cannot outlive it. If a renewal finds the
/// lease held by another, renewing stops (the work, started under the lease, still finishes;
/// the caller's next turn sees the loss).
pub async fn renewed_while<F: std::future::Future>(
    client: &kube::Client,
    settings: LeaseSettings,
    work: F,
) -> F::Output {
    let period = settings.duration / 3;
    let client = client.clone();
    let renewer = tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
            match try_acquire(&client, &settings).await {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(lease = %settings.name, holder = %settings.identity, "the lease was taken by another while a long step ran");
                    return;
                }
                Err(error) => {
                    tracing::warn!(%error, lease = %settings.name, "renewing the lease failed; retrying")
                }
            }
        }
    });
    let output = work.await;
    renewer.abort();
    output
}

/// Waits until this replica holds the lease.
pub async fn acquire(client: &kube::Client, settings: &LeaseSettings) {
    loop {
        match try_acquire(client, settings).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "leader election failed; retrying"),
        }
        tokio::time::sleep(settings.retry).await;
    }
}

/// Renews the lease until a renewal fails to land within the lease duration, or another
/// replica holds it; then returns (the caller stops leading).
pub async fn hold(client: &kube::Client, settings: &LeaseSettings) {
    let mut renewed = Instant::now();
    loop {
        tokio::time::sleep(settings.retry).await;
        match try_acquire(client, settings).await {
            Ok(true) => renewed = Instant::now(),
            Ok(false) => {
                tracing::error!("the lease was taken by another replica");
                return;
            }
            Err(error) => tracing::warn!(%error, "lease renewal failed"),
        }
        if renewal_overdue(renewed, Instant::now(), settings.duration) {
            tracing::error!("the lease could not be renewed in time");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-01-01T00:00:00Z plus `offset_seconds`.
    fn at(offset_seconds: i64) -> Timestamp {
        Timestamp::from_second(1_767_225_600 + offset_seconds).expect("a time")
    }

    fn held_by(holder: &str, renewed: i64, seconds: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(at(renewed))),
            lease_duration_seconds: Some(seconds),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_runs_out_once_its_duration_has_passed_since_the_renewal() {
        let spec = held_by("a", 0, 15);
        assert!(!expired(&spec, at(0)));
        assert!(!expired(&spec, at(15)), "still current at the last instant");
        assert!(expired(&spec, at(16)));
        assert!(expired(&LeaseSpec::default(), at(0)), "never renewed");
    }

    /// `renewTime + leaseDuration` overflowed (a panic) on a Lease renewed in the year 9999.
    #[test]
    fn a_lease_renewed_in_the_year_9999_is_current_not_a_panic() {
        for seconds in [15, i32::MAX] {
            let spec = LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::MAX)),
                ..held_by("a", 0, seconds)
            };
            assert!(!expired(&spec, at(0)));
            assert_eq!(decide(Some(&spec), "b", at(0)), LeaseDecision::StandBy);
            assert_eq!(decide(Some(&spec), "a", at(0)), LeaseDecision::Renew);
        }
        assert!(!expired(&held_by("a", 0, i32::MAX), at(60 * 365 * 86_400)));
    }

    #[test]
    fn a_negative_lease_duration_runs_out_at_the_renewal() {
        for seconds in [-1, i32::MIN] {
            let spec = held_by("a", 0, seconds);
            assert!(!expired(&spec, at(0)));
            assert!(expired(&spec, at(1)));
            assert_eq!(decide(Some(&spec), "b", at(1)), LeaseDecision::TakeOver);
        }
    }

    /// The settings of replica `identity` for the Lease `ns/l`: 15 s, retried every 3 s.
    fn settings_of(identity: &str) -> LeaseSettings {
        LeaseSettings {
            namespace: "ns".into(),
            name: "l".into(),
            identity: identity.into(),
            duration: Duration::from_secs(15),
            retry: Duration::from_secs(3),
        }
    }

    #[test]
    fn a_takeover_of_a_lease_at_the_most_transitions_counts_no_further() {
        let settings = settings_of("b");
        let mut old = held_by("a", 0, 15);
        old.lease_transitions = Some(i32::MAX);
        let taken = claimed(Some(&old), &settings, LeaseDecision::TakeOver, at(20));
        assert_eq!(taken.lease_transitions, Some(i32::MAX));
    }

    #[test]
    fn a_replica_renews_its_own_lease_and_stands_by_for_a_current_one() {
        let spec = held_by("a", 0, 15);
        assert_eq!(decide(Some(&spec), "a", at(5)), LeaseDecision::Renew);
        assert_eq!(decide(Some(&spec), "b", at(5)), LeaseDecision::StandBy);
        assert_eq!(
            decide(Some(&spec), "a", at(60)),
            LeaseDecision::Renew,
            "its own lease, even late: it renews (hold decides whether it was too late)"
        );
    }

    #[test]
    fn a_replica_takes_over_a_lease_that_ran_out_or_has_no_holder() {
        assert_eq!(
            decide(Some(&held_by("a", 0, 15)), "b", at(16)),
            LeaseDecision::TakeOver
        );
        assert_eq!(
            decide(Some(&held_by("", 0, 15)), "b", at(1)),
            LeaseDecision::TakeOver,
            "a released lease"
        );
        assert_eq!(decide(None, "b", at(0)), LeaseDecision::Create);
    }

    #[test]
    fn a_takeover_counts_a_transition_and_a_renewal_does_not() {
        let settings = settings_of("b");
        let mut old = held_by("a", 0, 15);
        old.lease_transitions = Some(2);
        let taken = claimed(Some(&old), &settings, LeaseDecision::TakeOver, at(20));
        assert_eq!(taken.holder_identity.as_deref(), Some("b"));
        assert_eq!(taken.lease_transitions, Some(3));
        assert_eq!(taken.acquire_time, Some(MicroTime(at(20))));
        let renewed = claimed(Some(&taken), &settings, LeaseDecision::Renew, at(23));
        assert_eq!(renewed.lease_transitions, Some(3));
        assert_eq!(renewed.acquire_time, Some(MicroTime(at(20))));
        assert_eq!(renewed.renew_time, Some(MicroTime(at(23))));
        let created = claimed(None, &settings, LeaseDecision::Create, at(0));
        assert_eq!(created.lease_transitions, Some(0));
    }

    #[test]
    fn a_leader_stops_a_third_of_a_term_before_its_lease_can_run_out() {
        let renewed = Instant::now();
        let duration = Duration::from_secs(15);
        assert!(!renewal_overdue(
            renewed,
            renewed + Duration::from_secs(9),
            duration
        ));
        assert!(renewal_overdue(
            renewed,
            renewed + Duration::from_secs(10),
            duration
        ));
    }
}
