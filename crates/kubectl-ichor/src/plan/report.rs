//! What `plan` prints: one [`Report`], as a table for a person or as JSON (`--output json`,
//! its shape documented in `docs/plugin.md` and kept stable: fields are only ever added).

use serde::Serialize;

/// The version of the JSON shape.
pub const SHAPE: &str = "ichor.maesh.dev/plan/v1";

/// The plan of one change to one TalosCluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// [`SHAPE`].
    pub shape: String,
    /// The TalosCluster.
    pub cluster: String,
    /// Its namespace.
    pub namespace: String,
    /// When windows were judged (RFC 3339).
    pub at: String,
    /// The spec fields the change touches, e.g. `spec.talosVersion: v1.14.1 -> v1.14.2`.
    pub changes: Vec<String>,
    /// What would be refused, and so not rolled out.
    pub refused: Vec<Refused>,
    /// Each configured machine of the cluster and what the change does to it.
    pub machines: Vec<MachineStep>,
    /// The batches, in order: each starts once the one before is healthy again.
    pub batches: Vec<BatchStep>,
    /// What holds the rollout now.
    pub holds: Vec<HoldNow>,
    /// What the plan cannot know, and other remarks.
    pub notes: Vec<String>,
}

/// A refusal: a rule of the webhook or the manager the change breaks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    /// The reason, as the condition or the admission answer gives it (CamelCase).
    pub reason: String,
    /// What is refused and what to do.
    pub message: String,
}

/// What the change does to one machine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineStep {
    /// The TalosMachine.
    pub name: String,
    /// `controlplane` or `worker`.
    pub role: String,
    /// `none`, `config`, `upgrade` or `restart` (a Kubernetes version: live, restarting its
    /// components).
    pub change: String,
    /// How it reaches the node: `none`, `live`, `node-decides` (live when the node can take
    /// it, else staged and rebooted), `reboot` (an upgrade's), `restart`.
    pub how: String,
    /// Whether `how` is a prediction the node may prove wrong.
    pub predicted: bool,
    /// The installer image of its upgrade, if any.
    pub upgrade_to: Option<String>,
    /// Whether its config changes (an upgrade may come with one, applied first).
    pub config_changes: bool,
    /// `yes` (cordoned and drained first), `no`, or `if-it-reboots`.
    pub drain: String,
    /// Where the rollout policy that governs it is declared.
    pub policy: String,
    /// A sentence on what happens and why.
    pub detail: String,
}

/// One batch of the rollout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchStep {
    /// 1, 2, …
    pub number: usize,
    /// Its machines.
    pub machines: Vec<String>,
    /// Machines it waits for first (in flight, or unhealthy now).
    pub waits_for: Vec<String>,
    /// The machines whose Node is cordoned and drained first (or may be: `how` is
    /// `node-decides`).
    pub drains: Vec<String>,
    /// Whether a maintenance window holds its start.
    pub window: bool,
    /// The health gates checked before it starts.
    pub gates: Vec<String>,
    /// The fresh backup required before it, e.g. `no older than 1h`.
    pub fresh_backup: Option<String>,
}

/// What holds the rollout now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HoldNow {
    /// The reason, as the manager's condition gives it (CamelCase).
    pub reason: String,
    /// What holds it and until when.
    pub message: String,
    /// When it lifts by itself (a window opening), RFC 3339.
    pub until: Option<String>,
}
