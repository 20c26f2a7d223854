//! Pure safety rules for Talos clusters: the planner's rules for every disruptive action
//! ([`plan`]: deletes, resets, reboots, upgrades, reboots for drift), etcd quorum over the
//! observed voters and their health, the last control plane, the control plane the cluster's
//! endpoint names, the declared control-plane count,
//! the allow-delete annotation, the approval/role lock of applied machines, the removal
//! sequence, the teardown order and the cluster lock.
//!
//! Functions over plain inputs; no Kubernetes client, no network. Used by the admission webhook
//! ([`check_machine_delete`], [`check_cluster_delete`], [`check_machine_update`]) and rechecked
//! by the controller inside the cluster lock ([`check_machine_removal`]). The controller never
//! relies on admission: it checks a deleted TalosCluster's annotation itself before tearing it
//! down ([`check_cluster_teardown`]), and the identity of the node a destructive step goes to
//! ([`check_node_identity`]).
//!
//! Callers describe each TalosMachine of one cluster as a [`Machine`] (built from the live object
//! with `Machine::from(&talos_machine)`) and the cluster as a [`Cluster`]. The answer is either
//! allow, a [`Refusal`] a person can act on, or (controller only) a [`Wait`] that resolves by
//! itself once a replacement control plane is configured. Each refusal and wait carries a stable
//! CamelCase reason, usable as a condition reason, and a message saying what to do.
//!
//! How machines are counted:
//! - A *control-plane member* (an etcd voter) is a machine with role `controlplane` whose config
//!   was applied (`status.appliedConfigHash` set), whatever its `approvalState` says (a rejected
//!   flag on a live control plane must not make it vanish from the count), that has not left
//!   etcd and was not last observed as a learner or no member. An approved control plane whose
//!   config was not applied yet, or that is still installing, is not a voter.
//! - A voter is *healthy* when the manager's last observation of its member (`status.etcd`)
//!   says so and is no older than the cluster's limit; never observed counts as unhealthy.
//! - Members being deleted (deletion timestamp set) other than the one being checked are not
//!   counted as remaining: they are leaving. Counting them is the bug that lets two deletes at
//!   three control planes both see `3 -> 2`.
//!
//! Which control plane bootstraps etcd is decided here too ([`bootstrap_step`]), as are the
//! removal sequence and the cluster lock: [`next_removal_step`] and
//! [`is_once_only`] for the recorded steps, [`transitioning`], [`completes_transition`] and
//! [`lock_decision`] for who may hold the lock. A removal whose workload steps the workload
//! API does not answer waits or, forced, skips them ([`unanswered_node_step`]); a Node delete
//! handed to the cluster runs only on the removed machine's Node ([`deferred_node_delete`]).
//! A rollout's health gates, CEL expressions over workload objects, are evaluated in [`gates`].
#![forbid(unsafe_code)]

pub mod bootstrap;
pub mod bundle;
pub mod drift;
#[cfg(test)]
mod fixtures;
/// A rollout's forecast (`kubectl ichor plan`): its batches in order and what holds it now.
pub mod forecast;
pub mod gates;
pub mod identity;
mod model;
pub mod plan;
pub mod rollout;
mod rules;
mod sequence;
mod verdict;
pub mod workload;

pub use bootstrap::{BootstrapStep, Candidate, bootstrap_step};
pub use bundle::{BundleStep, Found, bundle_step};
pub use drift::{DriftHalt, DriftMachine, DriftTurn, drift_turn, halt_stands};
pub use identity::{IdentityRefusal, Meant, check_node_identity};
pub use model::{
    Cluster, ControlPlaneCounts, Machine, OBSERVATION_MAX_AGE, ObjectKind, Observation,
    annotation_true, control_plane_counts,
};
pub use plan::{
    Disruption, Justification, Leave, Rule, RuleSet, Stage, check, check_targets,
    check_targets_with, check_with,
};
pub use rules::{
    check_cluster_delete, check_cluster_teardown, check_machine_delete, check_machine_delete_with,
    check_machine_removal, check_machine_update, etcd_quorum,
};
pub use sequence::{
    LockDecision, LockView, approved_control_planes, completes_transition, is_once_only,
    lock_decision, next_removal_step, removal_completes_transition, teardown_next, transitioning,
};
pub use verdict::{
    LockedChange, LockedField, Refusal, RemovalVerdict, Unhealthy, Verdict, Wait, reasons,
};
pub use workload::{DeferredDelete, Kept, Unanswered, deferred_node_delete, unanswered_node_step};
