//! How a cluster's rollouts reach its nodes (`spec.rollout`): the policy a team declares over
//! every change that goes one node at a time (a Talos or Kubernetes version, a schematic, a
//! config change, live or with a reboot).
//!
//! A suspend stops the next node from starting (the one in flight finishes); maintenance
//! windows let a step that reboots, upgrades, drains or restarts a service start only inside
//! one; health gates must hold over the team's own workload objects before each node; and a
//! control plane is disrupted only after a fresh etcd backup. The rules are
//! `ichor_deleteguard::rollout`'s and `::gates`', pure, so `kubectl ichor` answers as the
//! manager does.

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
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
    /// Health gates: CEL expressions over objects of the workload cluster, each of which must
    /// hold before a node's step starts (a step a window would hold). A gate never reads a
    /// Secret.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(g, self.exists_one(h, h.name == g.name))").message("healthGates[].name must be unique"))]
    pub health_gates: Vec<HealthGate>,
    /// A fresh etcd backup before a control plane is disrupted (needs `spec.backup`): the
    /// rollout asks for one itself when the last successful backup is older than `maxAge`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fresh_backup: Option<FreshBackup>,
    /// How many workers may be down at once: a count (`2`) or a percentage of the cluster's
    /// workers (`25%`, rounded down), at least one either way (default 1). Control planes
    /// always go one at a time. Workers down for any reason count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')").message("maxUnavailable must be a count of at least 1 or a percentage from 1% to 100%, e.g. 2 or 25%"))]
    pub max_unavailable: Option<IntOrString>,
    /// A label key on the TalosMachines naming their failure domain, e.g.
    /// `topology.kubernetes.io/zone`: no two workers with the same value of it are disrupted
    /// together (a worker without the label shares a domain with no other). Unset: no such
    /// rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 317),
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
        )
    )]
    pub failure_domain_label: Option<String>,
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
    #[schemars(length(min = 9, max = 128), regex(pattern = r"^[^ ]+( [^ ]+){4}$"))]
    pub schedule: String,
    /// How long it stays open, e.g. `4h` (from 1m to 168h), in elapsed time: a window across
    /// a daylight-saving change lasts as long as any other.
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('168h')").message("maintenanceWindows[].duration must be a duration from 1m to 168h, e.g. 4h"))]
    pub duration: String,
    /// The IANA time zone the schedule is read in, e.g. `Europe/Berlin` (default `UTC`).
    #[serde(default = "utc")]
    #[schemars(
        length(min = 1, max = 64),
        regex(pattern = r"^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+){0,2}$")
    )]
    pub time_zone: String,
}

fn utc() -> String {
    "UTC".into()
}

/// A health gate: `expression` must be true for every object of `kind` (in `namespace`, with
/// `labelSelector`) in the workload cluster before a node's step starts. It fails when no
/// object matches: a gate that reads nothing proves nothing.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(self.apiVersion == 'v1' && self.kind == 'Secret')").message("healthGates[].kind: a health gate never reads a Secret"))]
pub struct HealthGate {
    /// The gate's name, shown when it holds a rollout.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// The objects' API version, e.g. `apps/v1` or `ceph.rook.io/v1`.
    #[schemars(length(min = 2, max = 128))]
    pub api_version: String,
    /// The objects' kind, e.g. `Deployment`.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
    /// The namespace to read in; every namespace (or a cluster-scoped kind) when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
    /// A label selector narrowing the objects, e.g. `app=web,tier!=canary`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 256))]
    pub label_selector: Option<String>,
    /// A CEL expression over each object as `object`, true when it is healthy, e.g.
    /// `object.status.availableReplicas == object.spec.replicas`. Its estimated cost is
    /// limited as Kubernetes limits a validation rule's.
    #[schemars(length(min = 1, max = 2048))]
    pub expression: String,
}

/// How fresh the last etcd backup must be before a control plane is disrupted.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FreshBackup {
    /// The oldest a successful backup may be, e.g. `1h` (from 1m to 720h).
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m') && duration(self) <= duration('720h')").message("freshBackup.maxAge must be a duration from 1m to 720h, e.g. 1h"))]
    pub max_age: String,
}
