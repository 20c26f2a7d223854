//! The cluster's rollout policy (`spec.rollout`, ADRs 0074 and 0075) where a rollout's step
//! starts: a machine's turn (its config change or its upgrade), and the reboot a config change
//! that cannot go live needs. The rules are `ichor_deleteguard::rollout`'s and `::gates`';
//! this reads the spec, the workload cluster's objects and the backups, and says why a step
//! waits: [`holds`] for what the spec and the clock alone decide (a suspend, the windows),
//! [`clears`] for that and then the health gates and a fresh backup.
//!
//! A step under way is never held: a suspend, a window closing or a gate failing stops only
//! the next start.

mod backup;
mod gates;

use ichor_api::names::reasons;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::rollout::{Window, window_open};
use k8s_openapi::jiff::Timestamp;

use crate::{Context, Error, Stop};

/// What is about to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A machine's turn: its changed config, tried live first.
    Change,
    /// A machine's turn for an upgrade (a version or a schematic): a reboot.
    Upgrade,
    /// The reboot a changed config that cannot go live needs.
    Reboot,
}

/// The reasons a step waits for by the rollout policy.
const HOLDS: [&str; 6] = [
    reasons::ROLLOUT_SUSPENDED,
    reasons::OUTSIDE_MAINTENANCE_WINDOW,
    reasons::ROLLOUT_POLICY_INVALID,
    reasons::HEALTH_GATE_FAILING,
    reasons::WAITING_FOR_FRESH_BACKUP,
    reasons::FRESH_BACKUP_FAILED,
];

/// The rollout policy's reason that `reason` is, if it is one: a machine held by it is looked
/// at again at the progress pace (not queued behind another machine), and its cluster's
/// rollout conditions say it.
pub fn policy_reason(reason: &str) -> Option<&'static str> {
    HOLDS.into_iter().find(|r| *r == reason)
}

/// Whether a wait of `reason` is the rollout policy's ([`policy_reason`]).
pub fn is_policy_hold(reason: &str) -> bool {
    policy_reason(reason).is_some()
}

/// Why `machine`'s `step` waits by the cluster's rollout policy now; `None` lets it start.
/// First [`holds`] (a suspend, the windows); then, for a step a window would hold, the health
/// gates over the workload cluster; then, for a control plane's upgrade or reboot, a fresh
/// etcd backup, asked of the backup controller when the last is too old.
pub async fn clears(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    step: Step,
) -> Result<Option<Stop>, Error> {
    if let Some(held) = holds(cluster, step, ctx.now().0) {
        return Ok(Some(held));
    }
    if !disrupts(cluster, step) {
        return Ok(None);
    }
    let what = step.what();
    // Boxed: its futures (discovery, a list) would otherwise sit in every machine reconcile's.
    if let Some(failing) = Box::pin(gates::failing(ctx, cluster, what)).await {
        return Ok(Some(failing));
    }
    if step == Step::Change {
        return Ok(None);
    }
    backup::needed(ctx, cluster, machine, what)
}

impl Step {
    /// What waits, for a message.
    fn what(self) -> &'static str {
        match self {
            Self::Change => "its changed config (spec.rollout.holdLiveChanges)",
            Self::Upgrade => "its upgrade",
            Self::Reboot => "the reboot its changed config needs",
        }
    }
}

/// Whether `step` is one a window holds: a reboot or an upgrade, and a live change when the
/// policy holds those too.
fn disrupts(cluster: &TalosCluster, step: Step) -> bool {
    match step {
        Step::Upgrade | Step::Reboot => true,
        Step::Change => cluster.spec.rollout.hold_live_changes,
    }
}

/// Why `step` waits by the cluster's rollout policy at `now`; `None` lets it start.
pub fn holds(cluster: &TalosCluster, step: Step, now: Timestamp) -> Option<Stop> {
    let policy = &cluster.spec.rollout;
    if policy.suspend && step != Step::Reboot {
        return Some(Stop::new(
            reasons::ROLLOUT_SUSPENDED,
            "spec.rollout.suspend is true: no node starts its change until it is false (a node in flight finishes)",
        ));
    }
    if !disrupts(cluster, step) || policy.maintenance_windows.is_empty() {
        return None;
    }
    let windows = match read_windows(cluster) {
        Ok(windows) => windows,
        Err(stop) => return Some(stop),
    };
    let Err(next) = window_open(&windows, now) else {
        return None;
    };
    let when = match next {
        Some((at, window)) => format!("the next opens at {at} ({window})"),
        None => "no window's schedule names a later time".to_owned(),
    };
    Some(Stop::new(
        reasons::OUTSIDE_MAINTENANCE_WINDOW,
        format!(
            "{} waits: outside every maintenance window of spec.rollout; {when}",
            step.what()
        ),
    ))
}

/// The cluster's maintenance windows, read; the first that does not read names its field.
fn read_windows(cluster: &TalosCluster) -> Result<Vec<Window>, Stop> {
    cluster
        .spec
        .rollout
        .maintenance_windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let duration =
                ichor_api::time::parse_duration("duration", &w.duration).map_err(|e| e.to_string());
            duration
                .and_then(|d| {
                    Window::parse(&w.schedule, d, &w.time_zone).map_err(|e| e.to_string())
                })
                .map_err(|problem| {
                    Stop::new(
                        reasons::ROLLOUT_POLICY_INVALID,
                        format!(
                            "spec.rollout.maintenanceWindows[{i}]: {problem}; every step a window holds waits until it reads"
                        ),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::rollout::MaintenanceWindow;

    fn cluster(windows: &[(&str, &str, &str)], suspend: bool, hold_live: bool) -> TalosCluster {
        let mut cluster = TalosCluster::test("c").build();
        cluster.spec.rollout.suspend = suspend;
        cluster.spec.rollout.hold_live_changes = hold_live;
        cluster.spec.rollout.maintenance_windows = windows
            .iter()
            .map(|(schedule, duration, zone)| MaintenanceWindow {
                schedule: (*schedule).into(),
                duration: (*duration).into(),
                time_zone: (*zone).into(),
            })
            .collect();
        cluster
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    #[test]
    fn no_policy_holds_nothing() {
        let c = cluster(&[], false, false);
        for step in [Step::Change, Step::Upgrade, Step::Reboot] {
            assert!(holds(&c, step, at("2026-12-07T12:00:00Z")).is_none());
        }
    }

    #[test]
    fn a_suspend_holds_each_turn_but_not_the_reboot_of_a_node_in_flight() {
        let c = cluster(&[], true, false);
        let stop = holds(&c, Step::Upgrade, at("2026-12-07T12:00:00Z")).expect("held");
        assert_eq!(stop.reason, reasons::ROLLOUT_SUSPENDED);
        assert!(holds(&c, Step::Change, at("2026-12-07T12:00:00Z")).is_some());
        assert!(holds(&c, Step::Reboot, at("2026-12-07T12:00:00Z")).is_none());
    }

    #[test]
    fn outside_every_window_disruptions_wait_and_live_changes_go_unless_held() {
        let c = cluster(&[("0 22 * * *", "4h", "Europe/Berlin")], false, false);
        let noon = at("2026-12-07T12:00:00Z");
        let stop = holds(&c, Step::Upgrade, noon).expect("held");
        assert_eq!(stop.reason, reasons::OUTSIDE_MAINTENANCE_WINDOW);
        assert!(
            stop.message
                .contains("the next opens at 2026-12-07T21:00:00Z"),
            "{}",
            stop.message
        );
        assert!(holds(&c, Step::Reboot, noon).is_some());
        assert!(holds(&c, Step::Change, noon).is_none());
        let held = cluster(&[("0 22 * * *", "4h", "Europe/Berlin")], false, true);
        assert!(holds(&held, Step::Change, noon).is_some());
        // Inside: 22:30 in Berlin.
        assert!(holds(&c, Step::Upgrade, at("2026-12-07T21:30:00Z")).is_none());
    }

    #[test]
    fn a_window_that_does_not_read_names_its_field_and_holds() {
        for (window, field) in [
            (("61 * * * *", "4h", "UTC"), "schedule \"61 * * * *\""),
            (
                ("0 1 * * *", "4h", "Mars/Olympus"),
                "timeZone \"Mars/Olympus\"",
            ),
            (("0 1 * * *", "soon", "UTC"), "duration \"soon\""),
        ] {
            let c = cluster(&[("0 22 * * *", "4h", "UTC"), window], false, false);
            let stop = holds(&c, Step::Upgrade, at("2026-12-07T22:30:00Z")).expect("held");
            assert_eq!(stop.reason, reasons::ROLLOUT_POLICY_INVALID);
            assert!(
                stop.message
                    .starts_with("spec.rollout.maintenanceWindows[1]: ")
                    && stop.message.contains(field),
                "{}",
                stop.message
            );
        }
    }
}
