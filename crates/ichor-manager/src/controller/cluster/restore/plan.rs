//! The restore's decisions: which step it is at ([`step`], from what the status records), what
//! the bootstrap does about it ([`Gate`]), and whether a backup read through is the one its
//! record describes.

use ichor_api::backup::RestoreStatus;
use ichor_api::cluster::BootstrapRecord;
use ichor_api::names::reasons;

use crate::Stop;
use crate::controller::backup::plan::{Digest, Digests, Record};

/// What the restore of a cluster does now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The cluster has no `spec.restoreFrom`: bootstrap as usual.
    NotRequested,
    /// Find and check the backup before anything else.
    Check,
    /// The backup was checked: the first control plane bootstraps from it.
    Recover,
    /// Restored: nothing more to do.
    Done,
    /// Refused, with the `Restored` condition's reason and why: no bootstrap.
    Refuse(Stop),
}

/// Decides the restore's step from what the status records.
pub fn step(
    requested: bool,
    restore: Option<&RestoreStatus>,
    bootstrap: Option<&BootstrapRecord>,
) -> Step {
    if !requested {
        return Step::NotRequested;
    }
    if restore.is_some_and(|r| r.completed_at.is_some()) {
        return Step::Done;
    }
    if let Some(done) = bootstrap.filter(|b| b.completed_at.is_some()) {
        return Step::Refuse(Stop::new(
            reasons::RESTORE_REFUSED_BOOTSTRAPPED,
            format!(
                "etcd was bootstrapped on {} without the restore: a restore goes only into a cluster whose etcd was never bootstrapped",
                done.machine_name
            ),
        ));
    }
    match restore {
        None => Step::Check,
        Some(_) => Step::Recover,
    }
}

/// What the bootstrap does about a restore.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// Bootstrap as usual.
    Plain,
    /// Bootstrap from the recorded backup.
    Restore(RestoreStatus),
    /// Do not bootstrap (refused, or the backup failed its check).
    Hold,
}

/// A store over plain http refused, as the restore says it.
pub(super) fn plain_http(message: String) -> Stop {
    Stop {
        reason: reasons::STORE_PLAIN_HTTP_REFUSED,
        message: format!("restoreFrom: {message}"),
    }
}

/// What a backup read through was, checked against its record: the object as stored first (a
/// changed object is named so, whatever it holds), then the snapshot in it.
pub(super) fn checked(
    key: &str,
    record: &Record,
    object: Digest,
    snapshot: Result<Digest, Stop>,
) -> Result<Digests, Stop> {
    let mismatch = |why: &dyn std::fmt::Display| Stop {
        reason: reasons::RESTORE_CHECKSUM_MISMATCH,
        message: format!("{key}: {why}: it changed since it was written"),
    };
    if record.covers_object() && (object.size != record.size || object.sha256 != record.sha256) {
        return Err(mismatch(&format!(
            "the object reads as {} bytes with sha256 {}, and the record says {} bytes with sha256 {}",
            object.size, object.sha256, record.size, record.sha256
        )));
    }
    let digests = Digests {
        object,
        snapshot: snapshot?,
    };
    record.verify(&digests).map_err(|why| mismatch(&why))?;
    Ok(digests)
}

/// Whether the backup uploaded read as `read` (its vouched SHA-256) is the one `recorded` when
/// it was checked: one that changed meanwhile is refused, and nothing is bootstrapped.
pub(super) fn uploaded_as_checked(recorded: &RestoreStatus, read: &str) -> Result<(), Stop> {
    if read != recorded.sha256 {
        return Err(Stop {
            reason: reasons::RESTORE_CHECKSUM_MISMATCH,
            message: format!(
                "{} read as sha256 {read} while uploading, and {} when it was checked: it changed; nothing was bootstrapped",
                recorded.key, recorded.sha256
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn restore(completed: bool) -> RestoreStatus {
        RestoreStatus {
            key: "k".into(),
            size: 1,
            sha256: "00".into(),
            checked_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            completed_at: completed.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
        }
    }

    fn bootstrap(completed: bool) -> BootstrapRecord {
        BootstrapRecord {
            machine_name: "cp-1".into(),
            machine_uid: "u".into(),
            chosen_at: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            completed_at: completed.then_some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
        }
    }

    #[test]
    fn a_restore_is_checked_then_recovered_once_and_never_into_a_bootstrapped_cluster() {
        assert_eq!(step(false, None, None), Step::NotRequested);
        assert_eq!(step(true, None, None), Step::Check);
        assert_eq!(step(true, Some(&restore(false)), None), Step::Recover);
        assert_eq!(
            step(true, Some(&restore(false)), Some(&bootstrap(false))),
            Step::Recover,
            "chosen, not yet called"
        );
        assert_eq!(
            step(true, Some(&restore(true)), Some(&bootstrap(true))),
            Step::Done,
            "recorded: never again"
        );
        let Step::Refuse(Stop { reason, message }) = step(true, None, Some(&bootstrap(true)))
        else {
            panic!("a bootstrapped cluster is refused");
        };
        assert_eq!(reason, reasons::RESTORE_REFUSED_BOOTSTRAPPED);
        assert!(message.contains("cp-1"), "{message}");
    }

    #[test]
    fn an_upload_that_read_otherwise_than_it_was_checked_is_refused() {
        assert_eq!(uploaded_as_checked(&restore(false), "00"), Ok(()));
        let Err(Stop { reason, message }) = uploaded_as_checked(&restore(false), "ff") else {
            panic!("a changed backup is refused");
        };
        assert_eq!(reason, reasons::RESTORE_CHECKSUM_MISMATCH);
        assert!(message.contains("nothing was bootstrapped"), "{message}");
    }
}
