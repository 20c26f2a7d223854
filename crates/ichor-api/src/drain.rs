//! Draining a node before a disruption: the cluster's settings (`spec.drain`) and what a
//! machine records of the drain in flight (`status.drain`).
//!
//! Before every reboot, upgrade, drift reboot and reset, the machine's Node is cordoned and its
//! pods evicted through the eviction API, so PodDisruptionBudgets hold; DaemonSet and mirror
//! pods stay, as `kubectl drain` leaves them. The Node is uncordoned once the machine is back
//! and Ready, and only if Ichor cordoned it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// How nodes of a cluster are drained before a disruption.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Whether a node is cordoned and drained before a reboot, an upgrade, a drift reboot or a
    /// reset (default true). `false` opts the whole cluster out: its nodes are disrupted with
    /// their pods on them.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// How long the evictions may take, e.g. `10m` (from 10s to 24h). When it runs out, the
    /// disruption waits with `DrainTimedOut` naming the pod and the budget that block, unless
    /// `onTimeout` is `Force`.
    #[serde(default = "default_timeout")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('10s') && duration(self) <= duration('24h')").message("drain.timeout must be a duration from 10s to 24h, e.g. 10m"))]
    pub timeout: String,
    /// What happens when the timeout runs out: `Wait` (the default; nothing is forced, the
    /// evictions go on being retried) or `Force` (the pods left are deleted, bypassing their
    /// budgets, and the disruption goes on).
    #[serde(default)]
    pub on_timeout: DrainTimeoutAction,
    /// Namespaces whose pods are left on the node (beside DaemonSet and mirror pods, which
    /// always are).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 63)))]
    pub skip_namespaces: Vec<String>,
    /// Pods with these labels are left on the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skip_pods: Option<LabelSelector>,
}

fn enabled() -> bool {
    true
}

fn default_timeout() -> String {
    "10m".into()
}

impl Default for DrainSpec {
    fn default() -> Self {
        Self {
            enabled: enabled(),
            timeout: default_timeout(),
            on_timeout: DrainTimeoutAction::default(),
            skip_namespaces: Vec::new(),
            skip_pods: None,
        }
    }
}

/// What a drain does when its timeout runs out.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
pub enum DrainTimeoutAction {
    /// Nothing is forced: the disruption waits, and the evictions are retried.
    #[default]
    Wait,
    /// The pods left are deleted (their budgets bypassed) and the disruption goes on.
    Force,
}

/// The drain in flight on a machine, recorded before its first step so a restarted manager
/// knows when the timeout runs out and whether the cordon is its own to lift.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainRecord {
    /// The disruption the node is drained for, e.g. `upgrade to v1.14.2` or `reboot
    /// (operation weekly-reboot)`.
    #[schemars(length(max = 256))]
    pub purpose: String,
    /// When the drain started: its timeout counts from here.
    pub started_at: Time,
    /// Whether Ichor cordoned the Node (it was schedulable before): only then is it
    /// uncordoned once the machine is back and Ready.
    #[serde(default)]
    pub cordoned: bool,
    /// When every evictable pod had left (or was left by `onTimeout: Force`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_at: Option<Time>,
}
