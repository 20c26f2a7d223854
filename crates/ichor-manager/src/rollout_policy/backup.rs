//! A fresh etcd backup before a control plane is disrupted (`spec.rollout.freshBackup`, ADR
//! 0075). The control plane's turn asks the backup controller for it and waits: the backup is
//! taken from that controller's own reconcile, through the runner the schedule and
//! `etcdSnapshot` operations share (one backup of a cluster at a time, none taken again while
//! the last success is fresh enough), and the turn, looked at again at the progress pace, sees
//! the success (or the failure) in the cluster's status.

use std::time::Duration;

use ichor_api::common::Role;
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use k8s_openapi::jiff::Timestamp;

use super::Governing;
use crate::controller::backup::plan::fresh_success;
use crate::{Context, Error, Stop};

/// How long after a failed backup a rollout asks for the next one.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Why `machine`'s step (`what`) waits for a fresh backup, asking for one when the last is
/// too old; `None` when the policy asks for none or the last success is fresh.
pub(super) fn needed(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    governing: &Governing<'_>,
    what: &str,
) -> Result<Option<Stop>, Error> {
    let Some(fresh) = governing.policy.fresh_backup.as_ref() else {
        return Ok(None);
    };
    if machine.spec.role != Some(Role::ControlPlane) {
        return Ok(None);
    }
    let max_age = match max_age(cluster, &governing.field, &fresh.max_age) {
        Ok(max_age) => max_age,
        Err(stop) => return Ok(Some(stop)),
    };
    let now = ctx.clock.now();
    if fresh_success(cluster, now, max_age).is_some() {
        return Ok(None);
    }
    if let Some(stop) = failed_lately(cluster, now, what) {
        return Ok(Some(stop));
    }
    ctx.fresh_backups.ask(cluster, max_age);
    Ok(Some(Stop::new(
        reasons::WAITING_FOR_FRESH_BACKUP,
        format!(
            "{what} waits for a fresh etcd backup ({}.freshBackup: none successful in the last {}), which is being taken",
            governing.field, fresh.max_age
        ),
    )))
}

/// The declared `maxAge`, read; without `spec.backup` there is nowhere to take it to.
fn max_age(cluster: &TalosCluster, field: &str, text: &str) -> Result<Duration, Stop> {
    if cluster.spec.backup.is_none() {
        return Err(Stop::new(
            reasons::ROLLOUT_POLICY_INVALID,
            format!(
                "{field}.freshBackup needs the cluster's spec.backup, the store the fresh backup is taken to; a control plane's step waits until one is set"
            ),
        ));
    }
    ichor_api::time::parse_duration(&format!("{field}.freshBackup.maxAge"), text).map_err(|e| {
        Stop::new(
            reasons::ROLLOUT_POLICY_INVALID,
            format!("{e}; a control plane's step waits until it reads"),
        )
    })
}

/// A backup that failed less than [`RETRY_AFTER`] before `now`, after the last success: the
/// step waits rather than ask the store again at once.
fn failed_lately(cluster: &TalosCluster, now: Timestamp, what: &str) -> Option<Stop> {
    let record = cluster.status.as_ref()?.backup.record.as_ref()?;
    let failed = record.last_failure.as_ref()?.0;
    if record
        .last_success
        .as_ref()
        .is_some_and(|s| s.taken_at.0 >= failed)
    {
        return None;
    }
    let since: Duration = now
        .duration_since(failed)
        .try_into()
        .unwrap_or(Duration::ZERO);
    if since >= RETRY_AFTER {
        return None;
    }
    let why = cluster
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::BACKED_UP)
        .map_or_else(
            || "see the BackedUp condition".to_owned(),
            |c| format!("{}: {}", c.reason, c.message),
        );
    Some(Stop::new(
        reasons::FRESH_BACKUP_FAILED,
        format!(
            "{what} waits: the fresh backup spec.rollout.freshBackup asks for failed at {failed} ({why}); it is asked for again from {}",
            failed.checked_add(RETRY_AFTER).unwrap_or(failed)
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::backup::{BackupRecord, BackupStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    fn cluster(success: Option<&str>, failure: Option<&str>) -> TalosCluster {
        let mut cluster = TalosCluster::test("lab").build();
        cluster
            .status
            .get_or_insert_with(Default::default)
            .backup
            .record = Some(BackupStatus {
            last_success: success.map(|t| BackupRecord {
                key: "k".into(),
                taken_at: Time(at(t)),
                size: 1,
                sha256: String::new(),
                duration_seconds: 1.0,
                machine: "cp-1".into(),
                operation: None,
            }),
            last_failure: failure.map(|t| Time(at(t))),
            ..Default::default()
        });
        cluster
    }

    #[test]
    fn a_failure_holds_the_next_ask_for_a_minute_unless_a_success_followed_it() {
        let failed = cluster(None, Some("2026-12-07T12:00:00Z"));
        let stop = failed_lately(&failed, at("2026-12-07T12:00:30Z"), "its upgrade").expect("held");
        assert_eq!(stop.reason, reasons::FRESH_BACKUP_FAILED);
        assert!(
            stop.message
                .contains("asked for again from 2026-12-07T12:01:00Z"),
            "{}",
            stop.message
        );
        assert!(failed_lately(&failed, at("2026-12-07T12:01:00Z"), "its upgrade").is_none());
        let recovered = cluster(Some("2026-12-07T12:00:10Z"), Some("2026-12-07T12:00:00Z"));
        assert!(failed_lately(&recovered, at("2026-12-07T12:00:30Z"), "its upgrade").is_none());
    }

    #[test]
    fn a_fresh_backup_needs_a_store_and_an_age_that_reads() {
        let mut c = TalosCluster::test("lab").build();
        let stop = max_age(&c, "spec.rollout", "1h").expect_err("no spec.backup");
        assert_eq!(stop.reason, reasons::ROLLOUT_POLICY_INVALID);
        assert!(
            stop.message.contains("needs the cluster's spec.backup"),
            "{}",
            stop.message
        );
        c.spec.backup = Some(
            serde_json::from_value(serde_json::json!({
                "schedule": "@every 24h",
                "store": {"endpoint": "https://s3.example", "bucket": "b", "credentialsSecretRef": {"name": "s3"}}
            }))
            .expect("backup spec"),
        );
        assert_eq!(
            max_age(&c, "spec.rollout", "1h").expect("reads"),
            Duration::from_secs(3600)
        );
        let stop = max_age(&c, "spec.rollout", "soon").expect_err("does not read");
        assert!(
            stop.message.contains("spec.rollout.freshBackup.maxAge"),
            "{}",
            stop.message
        );
    }
}
