//! The answers: refusals a person acts on, waits that resolve by themselves, and the
//! controller's verdict on a removal.

use std::fmt;

use ichor_api::names::annotations;

use crate::model::{ControlPlaneCounts, ObjectKind};
use crate::plan::Justification;
use crate::rules::etcd_quorum;

/// Condition reasons of the refusals and waits (CamelCase, stable).
pub mod reasons {
    pub use ichor_api::names::reasons::{
        ALLOW_DELETE_REQUIRED, AWAITING_REPLACEMENT, CLUSTER_ENDPOINT_NODE,
        DELETED_WITHOUT_ALLOW_DELETE, ETCD_UNHEALTHY, IMMUTABLE_ONCE_APPLIED, LAST_CONTROL_PLANE,
        NODE_IDENTITY_MISMATCH, NODE_IDENTITY_UNRECORDED, QUORUM_AT_RISK, TEARDOWN_WORKERS_FIRST,
    };
}

/// Why a delete or an update is refused; `Display` gives the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Deleting an approved (or applied) control plane, or a TalosCluster, without the
    /// allow-delete annotation.
    AllowDeleteRequired {
        /// What is being deleted.
        kind: ObjectKind,
        /// Its name.
        name: String,
        /// Its namespace, if known.
        namespace: Option<String>,
    },
    /// Deleting the cluster's last control plane (`1 -> 0`), annotation notwithstanding.
    LastControlPlane {
        /// The machine.
        name: String,
        /// Its TalosCluster.
        cluster: String,
    },
    /// The control plane is the one the cluster's `spec.endpoint` names by its address: taking
    /// it out leaves every node without the Kubernetes API, and a new worker without its
    /// certificate (talos-facts §5).
    ClusterEndpointNode {
        /// What is done to the machine, as a verb (`deleting`, `resetting`).
        action: &'static str,
        /// The machine.
        name: String,
        /// The host of the cluster's endpoint (the machine's address).
        endpoint: String,
        /// Its TalosCluster.
        cluster: String,
    },
    /// The control planes that would remain fall below etcd quorum of the current members.
    QuorumAtRisk {
        /// What is done to the machine, as a verb (`deleting`, `resetting`).
        action: &'static str,
        /// The machine.
        name: String,
        /// The members before and after.
        counts: ControlPlaneCounts,
    },
    /// An etcd voter is not healthy (or not observed recently), so the action could cost
    /// quorum.
    EtcdUnhealthy(Unhealthy),
    /// A TalosCluster deleted without the allow-delete annotation (its admission bypassed):
    /// the manager does not tear it down until the annotation is added.
    DeletedWithoutAllowDelete {
        /// The cluster.
        name: String,
        /// Its namespace, if known.
        namespace: Option<String>,
    },
    /// `spec.approvalState` or `spec.role` changed after the machine's config was applied.
    ImmutableOnceApplied {
        /// The machine.
        name: String,
        /// What changed, in field order (`approvalState`, then `role`).
        changes: Vec<LockedChange>,
    },
}

impl Refusal {
    /// The condition reason (CamelCase).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::AllowDeleteRequired { .. } => reasons::ALLOW_DELETE_REQUIRED,
            Self::LastControlPlane { .. } => reasons::LAST_CONTROL_PLANE,
            Self::ClusterEndpointNode { .. } => reasons::CLUSTER_ENDPOINT_NODE,
            Self::QuorumAtRisk { .. } => reasons::QUORUM_AT_RISK,
            Self::EtcdUnhealthy(_) => reasons::ETCD_UNHEALTHY,
            Self::DeletedWithoutAllowDelete { .. } => reasons::DELETED_WITHOUT_ALLOW_DELETE,
            Self::ImmutableOnceApplied { .. } => reasons::IMMUTABLE_ONCE_APPLIED,
        }
    }

    /// What is refused and what a person can do about it, in a sentence.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AllowDeleteRequired {
                kind,
                name,
                namespace,
            } => {
                let resource = kind.resource();
                let what = match kind {
                    ObjectKind::TalosMachine => "control plane ",
                    ObjectKind::TalosCluster => "",
                    ObjectKind::TalosOperation => {
                        return write!(
                            f,
                            "talosoperation {name} resets a control plane, which takes it out of \
                             etcd as a delete does: create the operation with the annotation \
                             {key}: \"{value}\"",
                            key = annotations::ALLOW_DELETE,
                            value = annotations::TRUE,
                        );
                    }
                };
                let ns = namespace
                    .as_deref()
                    .map(|ns| format!(" -n {ns}"))
                    .unwrap_or_default();
                write!(
                    f,
                    "deleting {what}{resource} {name} needs the annotation {key}: \"{value}\"; \
                     set it with: kubectl annotate {resource} {name} {key}={value}{ns}",
                    key = annotations::ALLOW_DELETE,
                    value = annotations::TRUE,
                )
            }
            Self::LastControlPlane { name, cluster } => write!(
                f,
                "talosmachine {name} is the last control plane of taloscluster {cluster} \
                 (control planes 1 -> 0): delete the TalosCluster instead"
            ),
            Self::ClusterEndpointNode {
                action,
                name,
                endpoint,
                cluster,
            } => write!(
                f,
                "{action} talosmachine {name} would take down the Kubernetes endpoint of \
                 taloscluster {cluster}: its address {endpoint} is the host of spec.endpoint, \
                 through which every node reaches Kubernetes and a new worker gets its \
                 certificate; a cluster whose endpoint is one node's address keeps that node \
                 (use a shared VIP or a load balancer as the endpoint of a cluster whose control \
                 planes change)"
            ),
            Self::QuorumAtRisk {
                action,
                name,
                counts,
            } => {
                write!(
                    f,
                    "{action} talosmachine {name} would take control planes {} -> {}, below etcd \
                     quorum of {} for {} members",
                    counts.before,
                    counts.after,
                    etcd_quorum(counts.before),
                    counts.before,
                )?;
                write_already_deleting(f, counts.already_deleting)?;
                write!(
                    f,
                    ": approve another control plane and wait until its config is applied \
                     before removing this one"
                )
            }
            Self::EtcdUnhealthy(unhealthy) => write!(f, "{unhealthy}"),
            Self::DeletedWithoutAllowDelete { name, namespace } => {
                let ns = namespace
                    .as_deref()
                    .map(|ns| format!(" -n {ns}"))
                    .unwrap_or_default();
                write!(
                    f,
                    "taloscluster {name} was deleted without the annotation {key}: \"{value}\", \
                     which admission did not check (is the ichor webhook registered?): its \
                     teardown waits and no node is touched; to tear it down, set it with: \
                     kubectl annotate taloscluster {name} {key}={value}{ns}",
                    key = annotations::ALLOW_DELETE,
                    value = annotations::TRUE,
                )
            }
            Self::ImmutableOnceApplied { name, changes } => {
                for (i, change) in changes.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" and ")?;
                    }
                    write!(
                        f,
                        "spec.{} ({} -> {})",
                        change.field.as_str(),
                        change.from,
                        change.to
                    )?;
                }
                write!(
                    f,
                    " of talosmachine {name} cannot change once its config was applied \
                     (status.appliedConfigHash is set): delete the machine to remove it from \
                     the cluster"
                )
            }
        }
    }
}

impl std::error::Error for Refusal {}

/// Notes the members left out because they are already being deleted.
fn write_already_deleting(f: &mut fmt::Formatter<'_>, n: usize) -> fmt::Result {
    match n {
        0 => Ok(()),
        1 => write!(f, " (1 control plane already being deleted is not counted)"),
        n => write!(
            f,
            " ({n} control planes already being deleted are not counted)"
        ),
    }
}

/// Why the health of etcd holds an action: the voters that are not healthy, as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    /// The machine the action is for.
    pub target: String,
    /// What the action does to it, as a verb (`deleting`, `resetting`, `restarting`).
    pub action: &'static str,
    /// The other voters that are not healthy, each with what was observed.
    pub voters: Vec<String>,
    /// When the healthy voters left fall short of quorum: how many are left and the quorum of
    /// the voters left.
    pub short: Option<(usize, usize)>,
}

impl fmt::Display for Unhealthy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.short {
            Some((healthy, quorum)) => write!(
                f,
                "{} talosmachine {} would leave {healthy} healthy etcd voter(s), below the \
                 quorum of {quorum}",
                self.action, self.target
            )?,
            None => write!(
                f,
                "{} talosmachine {}, a healthy control plane, must wait while an etcd voter is \
                 unhealthy",
                self.action, self.target
            )?,
        }
        if !self.voters.is_empty() {
            write!(f, " (not healthy: {})", self.voters.join(", "))?;
        }
        write!(
            f,
            "; it can go ahead once every voter is observed healthy (the manager records each \
             control plane's etcd member in status.etcd), or once the unhealthy member is removed"
        )
    }
}

/// A field locked once a machine's config was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LockedField {
    /// `spec.approvalState`.
    ApprovalState,
    /// `spec.role`.
    Role,
}

impl LockedField {
    /// The field's name under `spec`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ApprovalState => "approvalState",
            Self::Role => "role",
        }
    }
}

/// One refused change of a locked field, values as written in the API (`<unset>` if absent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedChange {
    /// The field.
    pub field: LockedField,
    /// The value before.
    pub from: String,
    /// The value requested.
    pub to: String,
}

/// Why a removal already admitted waits, expecting to resume by itself; `Display` gives the
/// message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Removing the machine would take the members below `spec.controlPlane.count`: it waits
    /// for a replacement (`3 -> 4 -> 3`, never `3 -> 2`).
    AwaitingReplacement {
        /// What is done to the machine, as a verb (`removing`, `resetting`).
        action: &'static str,
        /// The machine.
        name: String,
        /// Its TalosCluster.
        cluster: String,
        /// The members before and after.
        counts: ControlPlaneCounts,
        /// `spec.controlPlane.count`.
        declared: usize,
        /// The healthy voters that would be left.
        healthy: usize,
    },
    /// An etcd voter is not healthy (or not observed recently): the action waits.
    EtcdUnhealthy(Unhealthy),
    /// In a teardown, a control plane's removal waits until the configured workers are gone.
    TeardownWorkersFirst {
        /// The machine.
        name: String,
        /// Configured workers left.
        workers: usize,
    },
}

impl Wait {
    /// The condition reason (CamelCase).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::AwaitingReplacement { .. } => reasons::AWAITING_REPLACEMENT,
            Self::EtcdUnhealthy(_) => reasons::ETCD_UNHEALTHY,
            Self::TeardownWorkersFirst { .. } => reasons::TEARDOWN_WORKERS_FIRST,
        }
    }

    /// What the removal waits for, in a sentence.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AwaitingReplacement {
                action,
                name,
                cluster,
                counts,
                declared,
                healthy,
            } => {
                write!(
                    f,
                    "{action} talosmachine {name} would take control planes {} -> {}",
                    counts.before, counts.after,
                )?;
                if *healthy < counts.after {
                    write!(f, " ({healthy} of them healthy voters)")?;
                }
                write!(
                    f,
                    ", below spec.controlPlane.count {declared} of taloscluster {cluster}"
                )?;
                write_already_deleting(f, counts.already_deleting)?;
                write!(
                    f,
                    ": waiting for a replacement control plane (approve another machine as \
                     controlplane; it resumes once that one is a healthy etcd voter), or lower \
                     spec.controlPlane.count"
                )
            }
            Self::EtcdUnhealthy(unhealthy) => write!(f, "{unhealthy}"),
            Self::TeardownWorkersFirst { name, workers } => write!(
                f,
                "the cluster is being torn down: control plane {name} is removed once the \
                 {workers} configured worker(s) left are gone"
            ),
        }
    }
}

/// The planner's answer on one disruptive action.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead, for the reasons given.
    Proceed(Justification),
    /// Hold; resumes by itself (a replacement, etcd health).
    Wait(Wait),
    /// Hold until a person acts.
    Refuse(Refusal),
}

/// The controller's answer on a removal, rechecked inside the cluster lock.
pub type RemovalVerdict = Verdict;

impl Verdict {
    /// Whether the action may go ahead.
    pub fn is_proceed(&self) -> bool {
        matches!(self, Self::Proceed(_))
    }

    /// The condition reason when held, `None` when it may go ahead.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            Self::Proceed(_) => None,
            Self::Wait(w) => Some(w.reason()),
            Self::Refuse(r) => Some(r.reason()),
        }
    }

    /// The message when held, `None` when it may go ahead.
    pub fn message(&self) -> Option<String> {
        match self {
            Self::Proceed(_) => None,
            Self::Wait(w) => Some(w.message()),
            Self::Refuse(r) => Some(r.message()),
        }
    }
}
