//! `TalosOperation`: a day-2 action run one node at a time under the cluster lock.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::TalosMachine;
use crate::common::{Condition, LocalObjectReference, Role};
use crate::machine::ApprovalState;
use crate::names::field_managers as fm;
use crate::status::{Owned, group, grouped};

/// A disruptive action on one machine or a set of machines of a cluster.
#[derive(CustomResource, KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ichor.maesh.dev",
    version = "v1alpha1",
    kind = "TalosOperation",
    plural = "talosoperations",
    shortname = "top",
    category = "ichor",
    namespaced,
    status = "TalosOperationStatus",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.clusterRef.name"}"#,
    printcolumn = r#"{"name":"Action","type":"string","jsonPath":".spec.action"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Progress","type":"string","jsonPath":".status.progress"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("self == oldSelf").message("a TalosOperation's spec is immutable: create a new operation instead"),
    validation = Rule::new("self.action != 'upgrade'").message("action upgrade is no operation any more: declare the Talos version in the TalosCluster's spec.talosVersion (and its extensions in spec.schematic); every node is upgraded to it, one at a time (docs/upgrades.md)"),
    validation = Rule::new("self.action != 'upgradeKubernetes'").message("action upgradeKubernetes is no operation any more: declare the Kubernetes version in the TalosCluster's spec.kubernetesVersion; every node follows it, one at a time (docs/upgrades.md)"),
    validation = Rule::new("has(self.machineName) != has(self.selector)").message("set exactly one of spec.machineName and spec.selector"),
    validation = Rule::new("self.action != 'upgrade' || has(self.upgrade)").message("action upgrade needs spec.upgrade.image"),
    validation = Rule::new("self.action != 'upgradeKubernetes' || has(self.upgradeKubernetes)").message("action upgradeKubernetes needs spec.upgradeKubernetes.version"),
    validation = Rule::new("!has(self.upgrade) || self.action == 'upgrade'").message("spec.upgrade is only for action upgrade"),
    validation = Rule::new("!has(self.upgradeKubernetes) || self.action == 'upgradeKubernetes'").message("spec.upgradeKubernetes is only for action upgradeKubernetes")
)]
pub struct TalosOperationSpec {
    /// The TalosCluster whose machines are acted on (same namespace).
    pub cluster_ref: LocalObjectReference,
    /// What to do.
    pub action: OperationAction,
    /// One TalosMachine, by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub machine_name: Option<String>,
    /// TalosMachines of the cluster selected by label. Control planes are handled one at a
    /// time with etcd health checked between them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    /// Settings for `upgrade`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeSpec>,
    /// Settings for `upgradeKubernetes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade_kubernetes: Option<UpgradeKubernetesSpec>,
}

impl TalosOperationSpec {
    /// `action` on the machines of `cluster`; the target (`machineName` or `selector`) and the
    /// action's settings are still to be set.
    pub fn new(cluster: &str, action: OperationAction) -> Self {
        Self {
            cluster_ref: LocalObjectReference {
                name: cluster.to_owned(),
            },
            action,
            machine_name: None,
            selector: None,
            upgrade: None,
            upgrade_kubernetes: None,
        }
    }
}

/// The day-2 actions.
#[derive(schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OperationAction {
    /// Reboot each node.
    Reboot,
    /// Refused at creation: a Talos upgrade is declared (`spec.talosVersion` and
    /// `spec.schematic` of the TalosCluster, ADR 0068). Kept so an operation created before
    /// still reads.
    Upgrade,
    /// Refused at creation: a Kubernetes upgrade is declared (`spec.kubernetesVersion` of the
    /// TalosCluster, ADR 0068). Kept so an operation created before still reads.
    UpgradeKubernetes,
    /// Reset each node to maintenance (STATE and EPHEMERAL wiped, reboot).
    Reset,
    /// Back etcd up now, from one healthy control plane, to the cluster's `spec.backup` store
    /// (refused when `spec.backup` is not set).
    EtcdSnapshot,
    /// Defragment etcd on each control plane.
    EtcdDefrag,
}

/// Settings for a Talos upgrade.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// The installer image to upgrade to, e.g.
    /// `factory.talos.dev/metal-installer/<schematic ID>:v1.14.1`.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
}

/// Settings for a Kubernetes upgrade.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeKubernetesSpec {
    /// The Kubernetes version to upgrade to, e.g. `1.37.0`.
    #[schemars(
        length(max = 32),
        regex(pattern = r"^v?1\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$")
    )]
    pub version: String,
}

/// Where an operation is.
#[derive(
    schemars::JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize,
)]
pub enum OperationPhase {
    /// Not started.
    #[default]
    Pending,
    /// Waiting for the cluster lock.
    Waiting,
    /// In progress, one node at a time.
    Running,
    /// Done on every node.
    Succeeded,
    /// Stopped on a failure (never retried blindly).
    Failed,
}

/// The observed state of an operation.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TalosOperationStatus {
    /// `Succeeded` and the reason of a failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The run's progress.
    #[serde(flatten)]
    pub run: OperationRun,
    /// The backup an `etcdSnapshot` made.
    #[serde(flatten)]
    pub backup: OperationBackup,
}

/// An operation's run: where it is, node by node, with the conditions no other group names.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationRun {
    /// Where the operation is.
    #[serde(default)]
    pub phase: OperationPhase,
    /// `done/total` nodes, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub progress: Option<String>,
    /// Per-node steps, in the order the nodes are handled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub nodes: Vec<NodeStep>,
    /// When the operation started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When it finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

/// The backup an `etcdSnapshot` operation made (ADR 0026).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationBackup {
    /// For `etcdSnapshot`: the object key of the backup it made.
    #[serde(rename = "backupKey", default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub key: Option<String>,
}

group!(
    OperationRun,
    TalosOperationStatus,
    run,
    fm::OPERATION_STATUS,
    Owned::Rest
);
group!(
    OperationBackup,
    TalosOperationStatus,
    backup,
    fm::OPERATION_BACKUP,
    Owned::None
);
grouped!(TalosOperationStatus, [OperationRun, OperationBackup]);

/// One node's part of an operation.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStep {
    /// The TalosMachine.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// Where this node is.
    pub phase: OperationPhase,
    /// What is happening or went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// The Talos version before the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version_before: Option<String>,
    /// The Talos version after the action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub version_after: Option<String>,
    /// The node's boot id before the action: a node that answers with another one has
    /// rebooted since, however quickly it came back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub boot_id_before: Option<String>,
    /// How far the action went on this node, so a restart knows whether to send it or to look
    /// for its effect.
    #[serde(default)]
    pub progress: NodeProgress,
}

/// How far an operation's action went on one node, each step with when it was seen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "step",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum NodeProgress {
    /// Not sent (at most intended): a restart sends it.
    #[default]
    Intended,
    /// Sent: a restart looks for its effect instead of sending it again.
    Sent {
        /// When it was sent.
        sent_at: Time,
    },
    /// Sent, and the node was seen going down (rebooting) since.
    WentDown {
        /// When it was sent.
        sent_at: Time,
        /// When the node was seen down.
        down_at: Time,
    },
    /// Its effect was verified.
    Verified {
        /// When it was sent (unset for an action found done before it was recorded sent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent_at: Option<Time>,
        /// When the node was seen down, for actions that take it down.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        down_at: Option<Time>,
        /// When it was verified.
        verified_at: Time,
    },
}

/// One flat object, `step` naming the variant beside the times it carries: the structural
/// schema Kubernetes needs for serde's internally tagged form.
impl schemars::JsonSchema for NodeProgress {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "NodeProgress".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let time = |description: &str| serde_json::json!({"type": "string", "format": "date-time", "description": description});
        schemars::json_schema!({
            "description": "How far the action went on this node: `step` is intended, sent, wentDown or verified, with the times seen.",
            "type": "object",
            "required": ["step"],
            "properties": {
                "step": {"type": "string", "enum": ["intended", "sent", "wentDown", "verified"]},
                "sentAt": time("When it was sent."),
                "downAt": time("When the node was seen down."),
                "verifiedAt": time("When it was verified."),
            },
        })
    }
}

impl NodeProgress {
    /// When the action was sent, once it was.
    pub fn sent_at(&self) -> Option<&Time> {
        match self {
            Self::Sent { sent_at } | Self::WentDown { sent_at, .. } => Some(sent_at),
            Self::Verified { sent_at, .. } => sent_at.as_ref(),
            Self::Intended => None,
        }
    }

    /// When the node was seen down, once it was.
    pub fn down_at(&self) -> Option<&Time> {
        match self {
            Self::WentDown { down_at, .. } => Some(down_at),
            Self::Verified { down_at, .. } => down_at.as_ref(),
            Self::Intended | Self::Sent { .. } => None,
        }
    }

    /// Verified at `at`, keeping when it was sent and seen down.
    #[must_use]
    pub fn verified(self, at: Time) -> Self {
        Self::Verified {
            sent_at: self.sent_at().cloned(),
            down_at: self.down_at().cloned(),
            verified_at: at,
        }
    }

    /// Whether the action is still to be sent.
    pub fn is_intended(&self) -> bool {
        matches!(self, Self::Intended)
    }

    /// Whether the node was seen down since the action was sent, or the action was verified.
    pub fn went_down(&self) -> bool {
        matches!(self, Self::WentDown { .. } | Self::Verified { .. })
    }

    /// The node was seen down at `at` (no change unless the action was sent).
    #[must_use]
    pub fn down(self, at: Time) -> Self {
        match self {
            Self::Sent { sent_at } => Self::WentDown {
                sent_at,
                down_at: at,
            },
            other => other,
        }
    }
}

/// Whether `labels` match `selector` (matchLabels and matchExpressions).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        let value = labels.get(&e.key);
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_label && by_expression
}

/// `metadata.name`, empty when unset.
fn name(machine: &TalosMachine) -> String {
    machine.metadata.name.clone().unwrap_or_default()
}

/// Whether `machine` is approved, configured and not being deleted: what an operation acts on.
pub fn configured(machine: &TalosMachine) -> bool {
    machine.spec.approval_state == ApprovalState::Approved
        && machine.metadata.deletion_timestamp.is_none()
        && machine
            .status
            .as_ref()
            .is_some_and(|s| s.applied.config_hash.is_some())
}

fn is_control_plane(machine: &TalosMachine) -> bool {
    machine.spec.role == Some(Role::ControlPlane)
}

/// Why an operation has no machines to act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoTargets {
    /// `spec.machineName` names no machine of the cluster.
    #[error("spec.machineName {name}: no TalosMachine of cluster {cluster} has that name")]
    UnknownMachine {
        /// The name given.
        name: String,
        /// The cluster.
        cluster: String,
    },
    /// A chosen machine is not approved and configured.
    #[error(
        "{0} is not an approved, configured machine (nothing was applied to it, or it is being deleted)"
    )]
    NotConfigured(String),
    /// An etcd action found no configured control plane.
    #[error("the selection holds no configured control plane (etcd runs only there)")]
    NoControlPlane,
    /// The selector matches nothing configured.
    #[error("spec.selector matches no configured machine of the cluster")]
    NoMatch,
}

impl TalosOperationSpec {
    /// The machines the operation acts on, among `machines` (those of its cluster), in the
    /// order it runs them: control planes first, each group by name.
    pub fn targets(&self, machines: &[TalosMachine]) -> Result<Vec<String>, NoTargets> {
        targets(self, machines)
    }
}

/// The machines `spec` acts on (see [`TalosOperationSpec::targets`]).
fn targets(spec: &TalosOperationSpec, machines: &[TalosMachine]) -> Result<Vec<String>, NoTargets> {
    let mut chosen: Vec<&TalosMachine> = machines
        .iter()
        .filter(|m| match (&spec.machine_name, &spec.selector) {
            (Some(wanted), _) => &name(m) == wanted,
            (None, Some(selector)) => selects(
                selector,
                m.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
            ),
            (None, None) => false,
        })
        .collect();
    if let Some(wanted) = &spec.machine_name
        && chosen.is_empty()
    {
        return Err(NoTargets::UnknownMachine {
            name: wanted.clone(),
            cluster: spec.cluster_ref.name.clone(),
        });
    }
    if spec.machine_name.is_none() {
        // A selector acts on the machines it finds configured (not those still installing or
        // being removed).
        chosen.retain(|m| configured(m));
    }
    if let Some(unready) = chosen.iter().find(|m| !configured(m)) {
        return Err(NoTargets::NotConfigured(name(unready)));
    }
    if matches!(
        spec.action,
        OperationAction::EtcdSnapshot | OperationAction::EtcdDefrag
    ) {
        chosen.retain(|m| is_control_plane(m));
    }
    chosen.sort_by_key(|m| (!is_control_plane(m), name(m)));
    if spec.action == OperationAction::EtcdSnapshot {
        chosen.truncate(1);
    }
    if chosen.is_empty() {
        return Err(match spec.action {
            OperationAction::EtcdSnapshot | OperationAction::EtcdDefrag => {
                NoTargets::NoControlPlane
            }
            _ => NoTargets::NoMatch,
        });
    }
    Ok(chosen.iter().map(|m| name(m)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_progress_is_one_flat_object_naming_its_step() {
        let at = |s: &str| Time(s.parse().unwrap());
        let sent = NodeProgress::Sent {
            sent_at: at("2026-12-03T10:00:00Z"),
        };
        assert_eq!(
            serde_json::to_value(&sent).unwrap(),
            serde_json::json!({"step": "sent", "sentAt": "2026-12-03T10:00:00Z"})
        );
        let down = sent.clone().down(at("2026-12-03T10:00:05Z"));
        assert_eq!(
            serde_json::to_value(&down).unwrap(),
            serde_json::json!({"step": "wentDown", "sentAt": "2026-12-03T10:00:00Z", "downAt": "2026-12-03T10:00:05Z"})
        );
        assert_eq!(down.sent_at(), sent.sent_at());
        assert!(down.went_down() && !sent.went_down());
        let verified = down.clone().verified(at("2026-12-03T10:01:00Z"));
        assert_eq!(verified.sent_at(), down.sent_at());
        assert_eq!(verified.down_at(), down.down_at());
        assert_eq!(
            serde_json::to_value(&verified).unwrap(),
            serde_json::json!({"step": "verified", "sentAt": "2026-12-03T10:00:00Z", "downAt": "2026-12-03T10:00:05Z", "verifiedAt": "2026-12-03T10:01:00Z"})
        );
        assert_eq!(
            NodeProgress::Intended.down(at("2026-12-03T10:00:05Z")),
            NodeProgress::Intended
        );
        let step: NodeStep =
            serde_json::from_value(serde_json::json!({"machine": "cp-1", "phase": "Running"}))
                .unwrap();
        assert!(step.progress.is_intended());
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = BTreeMap::from([
            ("pool".to_owned(), "a".to_owned()),
            ("zone".to_owned(), "1".to_owned()),
        ]);
        let mut selector = LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".to_owned(), "a".to_owned())])),
            match_expressions: None,
        };
        assert!(selects(&selector, &labels));
        selector.match_expressions = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                key: "zone".into(),
                operator: "NotIn".into(),
                values: Some(vec!["1".into()]),
            },
        ]);
        assert!(!selects(&selector, &labels));
        assert!(
            selects(&LabelSelector::default(), &labels),
            "empty selects all"
        );
    }
}
