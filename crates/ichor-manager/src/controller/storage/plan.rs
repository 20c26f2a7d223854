//! The storage reconciler's pure decisions: the status a storage gets from what was seen of
//! its machines' volumes.

use ichor_api::TalosStorage;
use ichor_api::names::reasons;
use ichor_api::storage::{MachineVolumes, ObservedVolume, TalosStorageStatus};
use ichor_talos::UserVolumeStatus;

/// What was seen of one selected machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// Not configured yet (or not reachable): its volumes cannot be read.
    NotConfigured,
    /// Its config cannot carry this storage's volumes (a name given twice).
    Conflict(String),
    /// What the node reports.
    Volumes(Vec<UserVolumeStatus>),
}

/// What was found across the machines: volumes ready, and what failed, waits or conflicts.
#[derive(Default)]
struct Tally {
    ready: i32,
    failed: Vec<String>,
    pending: Vec<String>,
    conflicts: Vec<String>,
}

/// The storage's volumes on `machine` as reported (a volume not reported yet shows
/// `waiting`), counted into `tally`.
fn observed(
    storage: &TalosStorage,
    machine: &str,
    reported: &[UserVolumeStatus],
    tally: &mut Tally,
) -> Vec<ObservedVolume> {
    let mut out = Vec::new();
    for volume in &storage.spec.volumes {
        let found = reported.iter().find(|r| r.name == volume.name);
        let seen = ObservedVolume {
            name: volume.name.clone(),
            phase: found.map_or_else(|| "waiting".to_owned(), |r| r.phase.clone()),
            size: found.and_then(|r| r.size.clone()),
            location: found.and_then(|r| r.location.clone()),
        };
        match seen.phase.as_str() {
            "ready" => tally.ready += 1,
            "failed" => tally.failed.push(format!(
                "{machine}/{}: {}",
                volume.name,
                found.and_then(|r| r.error.clone()).unwrap_or_default()
            )),
            phase => tally
                .pending
                .push(format!("{machine}/{} ({phase})", volume.name)),
        }
        out.push(seen);
    }
    out
}

/// The status a storage gets from what was seen of its machines (by name): for each machine,
/// the storage's volumes as reported, how many are ready, and `Ready`'s reason and message.
pub fn plan(
    storage: &TalosStorage,
    seen: &[(String, Seen)],
) -> (TalosStorageStatus, bool, &'static str, String) {
    let mut status = TalosStorageStatus::default();
    let mut tally = Tally::default();
    for (machine, what) in seen {
        let volumes = match what {
            Seen::NotConfigured => {
                tally
                    .pending
                    .push(format!("{machine} (not configured yet)"));
                Vec::new()
            }
            Seen::Conflict(message) => {
                tally.conflicts.push(format!("{machine}: {message}"));
                Vec::new()
            }
            Seen::Volumes(reported) => observed(storage, machine, reported, &mut tally),
        };
        status.volumes.machines.push(MachineVolumes {
            machine: machine.clone(),
            volumes,
        });
    }
    status.volumes.volume_count = Some(tally.ready);
    let (holds, reason, message) = if !tally.conflicts.is_empty() {
        (false, reasons::VOLUME_CONFLICT, tally.conflicts.join("; "))
    } else if !tally.failed.is_empty() {
        (
            false,
            reasons::VOLUME_FAILED,
            format!(
                "Talos reports failed volumes: {} (check the diskSelector against the machine's disks: kubectl ichor describe machine)",
                tally.failed.join("; ")
            ),
        )
    } else if !tally.pending.is_empty() {
        (
            false,
            reasons::VOLUMES_PENDING,
            format!("waiting for {}", tally.pending.join(", ")),
        )
    } else {
        (
            true,
            reasons::VOLUMES_READY,
            format!("{} volumes ready on {} machines", tally.ready, seen.len()),
        )
    };
    (status, holds, reason, message)
}

#[cfg(test)]
mod tests {
    use ichor_api::common::LocalObjectReference;
    use ichor_api::storage::{Filesystem, TalosStorageSpec, UserVolume};

    use super::*;

    fn storage() -> TalosStorage {
        TalosStorage::new(
            "data",
            TalosStorageSpec {
                cluster_ref: LocalObjectReference { name: "lab".into() },
                machine_selector: None,
                volumes: ["a", "b"]
                    .map(|n| UserVolume {
                        name: n.into(),
                        disk_selector: "!system_disk".into(),
                        min_size: Some("1Gi".into()),
                        max_size: None,
                        filesystem: Filesystem::Xfs,
                    })
                    .to_vec(),
            },
        )
    }

    fn volume(name: &str, phase: &str) -> UserVolumeStatus {
        UserVolumeStatus {
            name: name.into(),
            phase: phase.into(),
            size: Some("1.1 GB".into()),
            location: Some("/dev/vdb1".into()),
            error: (phase == "failed").then(|| "no disks matched selector for volume".into()),
        }
    }

    #[test]
    fn ready_only_when_every_volume_is_ready_on_every_machine() {
        let all = vec![(
            "m1".to_owned(),
            Seen::Volumes(vec![volume("a", "ready"), volume("b", "ready")]),
        )];
        let (status, holds, reason, _) = plan(&storage(), &all);
        assert!(holds);
        assert_eq!(reason, reasons::VOLUMES_READY);
        assert_eq!(status.volumes.volume_count, Some(2));
        assert_eq!(
            status.volumes.machines[0].volumes[1].location.as_deref(),
            Some("/dev/vdb1")
        );

        let missing = vec![
            ("m1".to_owned(), Seen::Volumes(vec![volume("a", "ready")])),
            ("m2".to_owned(), Seen::NotConfigured),
        ];
        let (status, holds, reason, message) = plan(&storage(), &missing);
        assert!(!holds);
        assert_eq!(reason, reasons::VOLUMES_PENDING);
        assert!(
            message.contains("m1/b (waiting)") && message.contains("m2"),
            "{message}"
        );
        assert_eq!(status.volumes.machines[0].volumes[1].phase, "waiting");
    }

    #[test]
    fn a_failed_volume_and_a_conflict_are_named() {
        let failed = vec![(
            "m1".to_owned(),
            Seen::Volumes(vec![volume("a", "ready"), volume("b", "failed")]),
        )];
        let (_, holds, reason, message) = plan(&storage(), &failed);
        assert!(!holds);
        assert_eq!(reason, reasons::VOLUME_FAILED);
        assert!(message.contains("m1/b: no disks matched"), "{message}");
        let conflict = vec![("m1".to_owned(), Seen::Conflict("x and y".into()))];
        assert_eq!(plan(&storage(), &conflict).2, reasons::VOLUME_CONFLICT);
    }
}
