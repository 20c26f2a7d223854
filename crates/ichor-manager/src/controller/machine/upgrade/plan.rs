//! The upgrade's pure decisions: whether a node runs what its cluster declares, and what its
//! node answering after the upgrade's reboot means.

use std::time::Duration;

use ichor_api::machine::UpgradeRecord;
use ichor_api::names::reasons;
use k8s_openapi::jiff::Timestamp;

use crate::Stop;

/// How long a node may take to go down after its upgrade's reboot was sent, and then to come
/// back healthy.
pub(super) const NODE_PATIENCE: Duration = crate::controller::operation::NODE_PATIENCE;

pub(crate) use ichor_render::upgrade::{Target, same_version, target, upgrade_image};

/// How long ago `since` was, at `now` (zero for a time in the future or none).
pub(super) fn elapsed(since: Option<&Timestamp>, now: Timestamp) -> Duration {
    since
        .and_then(|s| now.duration_since(*s).try_into().ok())
        .unwrap_or_default()
}

/// What the node's answers after the upgrade was sent mean.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum After {
    /// Not down yet, or not back yet: wait, saying why.
    Wait(String),
    /// The node is back on the declared version (and schematic): done.
    Verified(String),
    /// The upgrade failed on this node: the rollout stops here.
    Failed(Stop),
}

/// What the node is seen doing after the upgrade was sent (`since` ago): its boot id now
/// (`None`: it does not answer), whether it is healthy (running, and a control plane a voter),
/// the version and schematic it reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen<'a> {
    /// Its boot id, if it answered it.
    pub boot: Option<&'a str>,
    /// Whether it is running (and for a control plane a healthy etcd voter).
    pub healthy: bool,
    /// The Talos version it reports.
    pub version: Option<&'a str>,
    /// The schematic ID it reports.
    pub schematic: Option<&'a str>,
    /// How long ago the upgrade was sent.
    pub since: Duration,
}

/// Judges the node after its upgrade was sent: it must go down (another boot id) within
/// [`NODE_PATIENCE`], come back healthy within twice that, on the declared version and
/// schematic. Back on the version it ran before, Talos rolled it back.
pub(super) fn after(record: &UpgradeRecord, seen: &Seen<'_>, wanted: Option<&str>) -> After {
    let rebooted = seen.boot.is_some_and(|b| b != record.boot_id_before);
    if !rebooted && !record.progress.went_down() {
        return not_down(record, seen.since);
    }
    let (true, Some(version)) = (seen.healthy, seen.version) else {
        if seen.since > NODE_PATIENCE * 2 {
            return After::Failed(Stop::new(
                reasons::UPGRADE_FAILED,
                format!(
                    "the node did not come back healthy in the {}s after its upgrade to {} was sent; the rollout stops here",
                    (NODE_PATIENCE * 2).as_secs(),
                    record.image
                ),
            ));
        }
        return After::Wait(format!(
            "upgrading to Talos {}: the node rebooted; waiting for it to come back healthy",
            record.version
        ));
    };
    back(record, version, seen.schematic, wanted)
}

/// The node not seen going down yet, `since` after the upgrade was sent.
fn not_down(record: &UpgradeRecord, since: Duration) -> After {
    if since > NODE_PATIENCE {
        return After::Failed(Stop::new(
            reasons::UPGRADE_FAILED,
            format!(
                "the node was never seen going down in the {}s after its upgrade to {} was sent (its boot id is still {}); the rollout stops here",
                NODE_PATIENCE.as_secs(),
                record.image,
                record.boot_id_before
            ),
        ));
    }
    After::Wait(format!(
        "upgrading to Talos {} with {}: waiting for the node to reboot",
        record.version, record.image
    ))
}

/// The node back and healthy on `version`, reporting `schematic`: verified, or rolled back, or
/// on something else than declared.
fn back(
    record: &UpgradeRecord,
    version: &str,
    schematic: Option<&str>,
    wanted: Option<&str>,
) -> After {
    if !same_version(version, &record.version) {
        let rolled_back = record
            .from_version
            .as_deref()
            .is_some_and(|before| same_version(version, before));
        let (reason, what) = if rolled_back {
            (reasons::UPGRADE_ROLLED_BACK, "Talos rolled it back")
        } else {
            (reasons::UPGRADE_FAILED, "not the declared version")
        };
        return After::Failed(Stop::new(
            reason,
            format!(
                "after its upgrade to {} the node runs Talos {version} ({what}; before: {}); the rollout stops here and is not retried until spec.talosVersion or the schematic changes",
                record.image,
                record.from_version.as_deref().unwrap_or("unknown")
            ),
        ));
    }
    if let (Some(wanted), Some(reported)) = (wanted, schematic)
        && wanted != reported
    {
        return After::Failed(Stop::new(
            reasons::UPGRADE_FAILED,
            format!(
                "after its upgrade to {} the node reports schematic {reported}, not {wanted}; the rollout stops here",
                record.image
            ),
        ));
    }
    After::Verified(format!(
        "runs Talos {version}{}, upgraded from {} with {}",
        schematic
            .map(|s| format!(" (schematic {s})"))
            .unwrap_or_default(),
        record
            .from_version
            .as_deref()
            .unwrap_or("an unknown version"),
        record.image
    ))
}

#[cfg(test)]
mod tests {
    use ichor_api::operation::NodeProgress;

    use super::*;

    fn record() -> UpgradeRecord {
        UpgradeRecord {
            image: "factory.talos.dev/metal-installer/abc:v1.14.2".into(),
            version: "v1.14.2".into(),
            from_version: Some("v1.14.1".into()),
            boot_id_before: "boot-1".into(),
            progress: NodeProgress::Sent {
                sent_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    "2026-12-06T10:00:00Z".parse().unwrap(),
                ),
            },
        }
    }

    fn seen<'a>(boot: &'a str, version: &'a str, since: u64) -> Seen<'a> {
        Seen {
            boot: Some(boot),
            healthy: true,
            version: Some(version),
            schematic: Some("abc"),
            since: Duration::from_secs(since),
        }
    }

    #[test]
    fn the_node_must_go_down_come_back_and_run_the_declared_version() {
        let r = record();
        assert!(matches!(
            after(&r, &seen("boot-1", "v1.14.1", 10), Some("abc")),
            After::Wait(_)
        ));
        assert!(matches!(
            after(&r, &seen("boot-1", "v1.14.1", 400), Some("abc")),
            After::Failed(s) if s.reason == reasons::UPGRADE_FAILED && s.message.contains("never seen going down")
        ));
        let mut down = seen("boot-2", "v1.14.2", 30);
        down.healthy = false;
        assert!(matches!(after(&r, &down, Some("abc")), After::Wait(_)));
        down.since = Duration::from_secs(700);
        assert!(matches!(after(&r, &down, Some("abc")), After::Failed(_)));
        assert!(matches!(
            after(&r, &seen("boot-2", "v1.14.2", 60), Some("abc")),
            After::Verified(m) if m.contains("runs Talos v1.14.2 (schematic abc), upgraded from v1.14.1")
        ));
    }

    #[test]
    fn back_on_the_old_version_is_a_rollback_and_another_schematic_a_failure() {
        let r = record();
        assert!(matches!(
            after(&r, &seen("boot-2", "v1.14.1", 60), Some("abc")),
            After::Failed(s) if s.reason == reasons::UPGRADE_ROLLED_BACK
        ));
        assert!(matches!(
            after(&r, &seen("boot-2", "v1.14.2", 60), Some("def")),
            After::Failed(s) if s.reason == reasons::UPGRADE_FAILED && s.message.contains("reports schematic abc, not def")
        ));
        assert!(matches!(
            after(&r, &seen("boot-2", "1.14.2", 60), None),
            After::Verified(_)
        ));
    }
}
