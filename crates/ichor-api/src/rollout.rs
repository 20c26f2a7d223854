//! How a cluster's rollouts reach its nodes (`spec.rollout`): the policy a team declares over
//! every change that goes one node at a time (a Talos or Kubernetes version, a schematic, a
//! config change, live or with a reboot).
//!
//! A suspend stops the next node from starting (the one in flight finishes); maintenance
//! windows let a step that reboots, upgrades, drains or restarts a service start only inside
//! one. The rules are `ichor_deleteguard::rollout`'s, pure, so `kubectl ichor` answers as the
//! manager does.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The rollout policy of a cluster.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// Suspends every rollout: the node in flight finishes, no other starts until this is
    /// false again. Set by a person or by GitOps; Ichor never writes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
    /// Maintenance windows. A step that reboots, upgrades, drains or restarts a service starts
    /// only inside one (a step under way finishes after it closes). None: at any time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub maintenance_windows: Vec<MaintenanceWindow>,
    /// Whether a config change Talos applies live (no restart) waits for a window too
    /// (default false: it goes at once).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold_live_changes: bool,
}

impl RolloutPolicy {
    /// Whether nothing is set: every rollout runs at once, as it comes.
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A maintenance window: opens at each time `schedule` names in `timeZone`, for `duration`.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When it opens: a five-field cron expression (minute hour day-of-month month
    /// day-of-week), e.g. `0 22 * * 1-5` for 22:00 on weekdays.
    #[schemars(length(min = 9, max = 128))]
    pub schedule: String,
    /// How long it stays open, e.g. `4h` (from 1m to 168h), in elapsed time: a window across
    /// a daylight-saving change lasts as long as any other.
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('168h')").message("maintenanceWindows[].duration must be a duration from 1m to 168h, e.g. 4h"))]
    pub duration: String,
    /// The IANA time zone the schedule is read in, e.g. `Europe/Berlin` (default `UTC`).
    #[serde(default = "utc")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
}

fn utc() -> String {
    "UTC".into()
}
