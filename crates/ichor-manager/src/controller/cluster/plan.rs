//! The cluster reconciler's pure decisions: what to do next, from what was observed. No I/O
//! here; the bootstrap order itself is ichor-deleteguard's (the teardown's plan is
//! `teardown::plan`).

use std::collections::hash_map::DefaultHasher;
use std::fmt::Display;
use std::hash::{Hash as _, Hasher as _};
use std::time::Duration;

use ichor_api::cluster::MachineCounts;
use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, MachinePhase};
use ichor_api::names::{conditions, reasons};
use ichor_api::time::InvalidDuration;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::credentials::Published;
use ichor_talos::Bootstrapped;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use crate::{Error, Settings, infra::conditions as cond};

/// How often a discovering cluster is swept when its `interval` does not read.
pub(super) const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(300);

/// How often a discovering cluster is swept: its `interval`. The apiserver admits any Go
/// duration from 10s to 24h; the few Go spellings Ichor's parser does not read (a fraction
/// before another unit, `1.5h30m`) are refused here, and the caller sweeps at
/// [`DEFAULT_SWEEP_INTERVAL`] and says why.
pub(super) fn sweep_interval(interval: &str) -> Result<Duration, InvalidDuration> {
    ichor_api::time::parse_duration("spec.discovery.interval", interval)
}

/// Approved and Ready machines of each role, against the declared control planes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Tally {
    /// Control planes declared in the spec.
    pub declared: i32,
    /// Approved control planes.
    pub cp_approved: i32,
    /// Approved control planes that are Ready.
    pub cp_ready: i32,
    /// Approved workers.
    pub w_approved: i32,
    /// Approved workers that are Ready.
    pub w_ready: i32,
}

impl Tally {
    /// Counts `machines` against `declared` control planes.
    pub fn of(declared: i32, machines: &[TalosMachine]) -> Self {
        let approved = |role: Role| {
            machines.iter().filter(move |m| {
                m.spec.approval_state == ApprovalState::Approved && m.spec.role == Some(role)
            })
        };
        let ready = |m: &&TalosMachine| {
            m.status
                .as_ref()
                .is_some_and(|s| cond::is_true(&s.conditions, conditions::READY))
        };
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        Self {
            declared,
            cp_approved: count(approved(Role::ControlPlane).count()),
            cp_ready: count(approved(Role::ControlPlane).filter(ready).count()),
            w_approved: count(approved(Role::Worker).count()),
            w_ready: count(approved(Role::Worker).filter(ready).count()),
        }
    }

    /// `status.controlPlanes`: Ready of declared.
    pub fn control_planes(&self) -> MachineCounts {
        MachineCounts {
            declared: Some(self.declared),
            approved: self.cp_approved,
            ready: self.cp_ready,
            summary: format!("{}/{}", self.cp_ready, self.declared),
        }
    }

    /// `status.workers`: Ready of approved.
    pub fn workers(&self) -> MachineCounts {
        MachineCounts {
            declared: None,
            approved: self.w_approved,
            ready: self.w_ready,
            summary: format!("{}/{}", self.w_ready, self.w_approved),
        }
    }

    /// The `Transitioning` condition (holds, reason, message): an even declared count, or
    /// approved control planes other than declared.
    pub fn transitioning(&self) -> (bool, &'static str, String) {
        let (declared, cp_approved) = (self.declared, self.cp_approved);
        if declared % 2 == 0 {
            (
                true,
                reasons::EVEN_CONTROL_PLANE_COUNT,
                format!(
                    "spec.controlPlane.count is {declared}: an even count tolerates no more failures than {}",
                    declared - 1
                ),
            )
        } else if cp_approved != declared {
            (
                true,
                reasons::CONTROL_PLANE_COUNT_MISMATCH,
                format!("{cp_approved} control planes approved, {declared} declared"),
            )
        } else {
            (
                false,
                reasons::RECONCILED,
                "control planes as declared".to_owned(),
            )
        }
    }

    /// Whether the cluster is Ready: a control plane at least, every approved machine Ready, and
    /// etcd `bootstrapped`.
    pub fn all_ready(&self, bootstrapped: bool) -> bool {
        self.cp_approved > 0
            && self.cp_ready == self.cp_approved
            && self.w_ready == self.w_approved
            && bootstrapped
    }

    /// The `Ready` condition's message.
    pub fn ready_message(&self) -> String {
        format!(
            "control planes {}/{} ready, workers {}/{} ready",
            self.cp_ready, self.cp_approved, self.w_ready, self.w_approved
        )
    }
}

/// Whether the cluster waits on something no Kubernetes event announces, and so is looked at
/// again at the progress pace: its bundle not there or not valid (nothing watches Secrets),
/// its bootstrap not done (the bootstrap waits on its first control plane's node, adoption
/// and restore on theirs), or a tombstoned node or a node delete still pending. Everything
/// else a look records comes from its machines, whose every change wakes it (ADR 0042).
pub(super) fn waits_on_nodes(bundle: bool, bootstrapped: bool, tombstoned: bool) -> bool {
    !bundle || !bootstrapped || tombstoned
}

/// When to look again: soon while the cluster waits on its nodes ([`waits_on_nodes`]), else
/// after the settled requeue; no later than `due`, the next sweep of a discovering cluster or
/// the next credential renewal.
pub(super) fn requeue_after(
    settings: &Settings,
    on_nodes: bool,
    due: Option<Duration>,
) -> Duration {
    let requeue = if on_nodes {
        settings.progress_requeue
    } else {
        settings.settled_requeue
    };
    due.map_or(requeue, |s| s.min(requeue))
}

/// The talosconfig's endpoints (approved control planes) and nodes (every approved machine),
/// each by its first endpoint, sorted.
pub(super) fn talosconfig_targets(machines: &[TalosMachine]) -> (Vec<String>, Vec<String>) {
    let mut endpoints: Vec<String> = machines
        .iter()
        .filter(|m| {
            m.spec.approval_state == ApprovalState::Approved
                && m.spec.role == Some(Role::ControlPlane)
        })
        .filter_map(|m| m.spec.endpoints.first().cloned())
        .collect();
    endpoints.sort();
    let mut nodes: Vec<String> = machines
        .iter()
        .filter(|m| m.spec.approval_state == ApprovalState::Approved)
        .filter_map(|m| m.spec.endpoints.first().cloned())
        .collect();
    nodes.sort();
    (endpoints, nodes)
}

/// Whether the published talosconfig `published` names these `endpoints` and `nodes` and
/// trusts `ca_pem` (otherwise it is minted anew).
pub(super) fn talosconfig_current(
    published: &Published,
    endpoints: &[String],
    nodes: &[String],
    ca_pem: &str,
) -> bool {
    published.endpoints == endpoints && published.nodes == nodes && published.ca_pem == ca_pem
}

/// Whether the published kubeconfig `published` talks to `endpoint` and trusts `ca_pem`
/// (otherwise it is minted anew).
pub(super) fn kubeconfig_current(published: &Published, endpoint: &str, ca_pem: &str) -> bool {
    published.endpoints == [endpoint] && published.ca_pem == ca_pem
}

/// Whether `machine` may bootstrap etcd: an approved control plane that was given its config.
pub(super) fn bootstrap_candidate(machine: &TalosMachine) -> bool {
    machine.spec.approval_state == ApprovalState::Approved
        && machine.spec.role == Some(Role::ControlPlane)
        && machine
            .status
            .as_ref()
            .is_some_and(|s| s.applied.config_hash.is_some())
}

/// Where a bootstrap candidate is asked: the address recorded in status, else its first endpoint.
pub(super) fn bootstrap_address(machine: &TalosMachine) -> String {
    machine
        .status
        .as_ref()
        .and_then(|s| s.inventory.address.clone())
        .or_else(|| machine.spec.endpoints.first().cloned())
        .unwrap_or_default()
}

/// The connection kept for `name` while its candidacy was observed; the planner chose it as
/// reachable, so none kept is a broken invariant.
pub(super) fn kept_connection<C>(
    clients: Vec<(String, Option<C>)>,
    name: &str,
) -> Result<C, Error> {
    clients
        .into_iter()
        .find(|(n, _)| *n == name)
        .and_then(|(_, c)| c)
        .ok_or_else(|| {
            Error::Invariant(format!(
                "bootstrap chose {name} as reachable, but no connection to it is kept"
            ))
        })
}

/// The `Bootstrapped` condition (holds, reason, message) once Bootstrap on `name` answered:
/// etcd bootstrapped now or before is done; a failure is pending, with its cause.
pub(super) fn bootstrap_answered<E: Display>(
    name: &str,
    answer: &Result<Bootstrapped, E>,
) -> (bool, &'static str, String) {
    match answer {
        Ok(Bootstrapped::Now) => (
            true,
            reasons::BOOTSTRAPPED,
            format!("etcd bootstrapped on {name}"),
        ),
        Ok(Bootstrapped::Already) => (
            true,
            reasons::BOOTSTRAPPED,
            format!("etcd was already bootstrapped on {name}"),
        ),
        Err(error) => (
            false,
            reasons::BOOTSTRAP_PENDING,
            format!("bootstrap on {name} not done yet: {error}"),
        ),
    }
}

/// Whether `name` is the machine the bootstrap record chose.
pub(super) fn chosen(record: Option<&ichor_api::cluster::BootstrapRecord>, name: &str) -> bool {
    record.is_some_and(|r| r.machine_name == name)
}

/// The name of the Secret the cluster's talosconfig is published in.
pub(super) fn talosconfig_name(cluster: &TalosCluster) -> String {
    format!("{}-talosconfig", cluster.name_any())
}

/// The name of the Secret the cluster's workload kubeconfig is published in.
pub(super) fn kubeconfig_name(cluster: &TalosCluster) -> String {
    format!("{}-kubeconfig", cluster.name_any())
}

/// A file Ichor publishes for the cluster.
#[derive(Debug, Clone, Copy)]
pub(super) enum File {
    /// The talosconfig (`os:admin`).
    Talosconfig,
    /// The workload kubeconfig (admin).
    Kubeconfig,
}

/// A published credentials file after this reconcile: when it expires, when it is due.
#[derive(Debug, Clone, Copy)]
pub(super) struct Held {
    /// When the file's certificate expires.
    pub(super) expires: Timestamp,
    /// When it is due for renewal.
    pub(super) renew_at: Timestamp,
}

/// Whether `machine` was ever configured with its cluster's bundle: a config applied, an etcd
/// member recorded, or a phase past the first apply.
pub(super) fn ever_configured(machine: &TalosMachine) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.applied.config_hash.is_some()
            || s.lifecycle.etcd_member_id.is_some()
            || matches!(
                s.lifecycle.phase,
                MachinePhase::Applying
                    | MachinePhase::Installing
                    | MachinePhase::Booting
                    | MachinePhase::Joining
                    | MachinePhase::Ready
                    | MachinePhase::Removing
            )
    })
}

/// The restore refused because etcd already runs on `name`, which the bootstrap record did not
/// choose.
pub(super) fn restore_into_running_etcd(name: &str) -> crate::Stop {
    crate::Stop {
        reason: reasons::RESTORE_REFUSED_BOOTSTRAPPED,
        message: format!(
            "etcd already runs on {name}: a restore goes only into a cluster whose etcd was never bootstrapped"
        ),
    }
}

/// What rolls out now and the field that asked for it, for `status.rollout.changes`: the
/// Talos version (or a schematic: the nodes run the version, not the declared installer), a
/// Kubernetes version while it steps (`accepted` from another), and a changed config still to reach
/// machines.
pub(crate) fn changes(
    rollout: &ichor_api::cluster::RolloutStatus,
    machines: &[TalosMachine],
    accepted: Option<&ichor_api::cluster::AcceptedVersions>,
) -> Vec<String> {
    let mut changes = Vec::new();
    if rollout.up_to_date < rollout.total {
        let declared = &rollout.talos_version;
        let behind = machines.iter().any(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.inventory.talos_version.as_deref())
                .is_some_and(|v| v != declared)
        });
        changes.push(if behind {
            format!("Talos {declared} (spec.talosVersion)")
        } else {
            "a schematic (spec.schematic, or a class's)".to_owned()
        });
    }
    if let Some(accepted) = accepted
        && let Some(from) = &accepted.kubernetes_from
    {
        changes.push(format!(
            "Kubernetes {} from {from} (spec.kubernetesVersion)",
            accepted.kubernetes_version
        ));
    }
    let (pending, _) = crate::drift::config_pending(machines);
    if !pending.is_empty() {
        changes.push(format!(
            "config of {} machine(s) (patches of the cluster, a class or a machine, or the cluster's spec)",
            pending.len()
        ));
    }
    changes
}

/// What of a cluster its machines act on, as a digest: the object without its running tallies
/// (`status.controlPlanes`, `status.workers`, `status.rollout` but for its Kubernetes step),
/// without the lock's mirror (`status.lock`), without its conditions' wording, times and
/// generations (each condition's type, status and reason stay), and without the apiserver's
/// bookkeeping (`resourceVersion`, `managedFields`). A cluster event whose digest is the one its machines were last woken for
/// wakes none of them (ADR 0029): the cluster rewrites its tallies and mirrors whenever one
/// machine moves, and that must not reconcile its siblings; the end of a machine's turn wakes
/// the machine next instead (ADR 0043, ADR 0071). A Kubernetes rollout's step stays: each step
/// renders the config of the node it reaches anew (ADR 0070), and nothing else wakes that node.
pub(crate) fn machines_see(cluster: &TalosCluster) -> u64 {
    let mut seen = cluster.clone();
    seen.metadata.resource_version = None;
    seen.metadata.managed_fields = None;
    if let Some(status) = seen.status.as_mut() {
        status.core.control_planes = None;
        status.core.workers = None;
        status.core.rollout = status
            .core
            .rollout
            .take()
            .and_then(|r| r.kubernetes_step)
            .map(|step| ichor_api::cluster::RolloutStatus {
                kubernetes_step: Some(step),
                ..Default::default()
            });
        status.lock.mirror = None;
        for condition in &mut status.conditions {
            condition.message.clear();
            condition.last_transition_time = Time(Timestamp::UNIX_EPOCH);
            condition.observed_generation = None;
        }
    }
    let mut hasher = DefaultHasher::new();
    serde_json::to_vec(&seen)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Whether the cluster's reconcile reads its machines as stored rather than from the shared
/// cache: until its bundle is recorded and etcd bootstrapped. Two rules read them so: the
/// bundle is generated only while no machine was ever configured (ADR 0053), and etcd is
/// bootstrapped exactly once; a machine the cache has not seen yet must not escape either.
pub(crate) fn reads_machines_as_stored(cluster: &TalosCluster) -> bool {
    let Some(status) = cluster.status.as_ref() else {
        return true;
    };
    let bootstrapped = status
        .core
        .bootstrap
        .as_ref()
        .is_some_and(|b| b.completed_at.is_some());
    status.core.bundle_fingerprint.is_none() || !bootstrapped
}

#[cfg(test)]
mod tests {
    use ichor_api::cluster::TalosClusterStatus;
    use ichor_api::common::{Condition, ConditionStatus};
    use ichor_api::machine::TalosMachineStatus;

    use super::*;

    #[test]
    fn a_rollout_names_what_changed_and_the_field_that_asked() {
        let running = |name: &str, version: &str| {
            let mut m = TalosMachine::test(name).build();
            let mut status = TalosMachineStatus::default();
            status.inventory.talos_version = Some(version.into());
            m.status = Some(status);
            m
        };
        let rollout = ichor_api::cluster::RolloutStatus {
            talos_version: "v1.14.2".into(),
            up_to_date: 1,
            total: 2,
            ..Default::default()
        };
        let machines = [running("cp-1", "v1.14.2"), running("w-1", "v1.14.1")];
        assert_eq!(
            changes(&rollout, &machines, None),
            ["Talos v1.14.2 (spec.talosVersion)"]
        );
        let on_version = [running("cp-1", "v1.14.2"), running("w-1", "v1.14.2")];
        let stepping = ichor_api::cluster::AcceptedVersions {
            talos_version: "v1.14.2".into(),
            kubernetes_version: "1.36.4".into(),
            kubernetes_from: Some("1.36.3".into()),
        };
        assert_eq!(
            changes(&rollout, &on_version, Some(&stepping)),
            [
                "a schematic (spec.schematic, or a class's)",
                "Kubernetes 1.36.4 from 1.36.3 (spec.kubernetesVersion)"
            ]
        );
        let done = ichor_api::cluster::RolloutStatus {
            up_to_date: 2,
            ..rollout
        };
        assert!(changes(&done, &on_version, None).is_empty());
    }

    /// A machine that was configured with its cluster's bundle.
    fn configured(builder: ichor_api::testing::MachineBuilder) -> TalosMachine {
        builder.applied("abc").build()
    }

    /// A machine whose `Ready` condition holds.
    fn ready(builder: ichor_api::testing::MachineBuilder) -> TalosMachine {
        let mut conditions = Vec::new();
        cond::set(
            &mut conditions,
            conditions::READY,
            true,
            reasons::READY,
            "",
            None,
            &Time("2026-12-03T10:00:00Z".parse().unwrap()),
        );
        builder
            .status(TalosMachineStatus {
                conditions,
                ..Default::default()
            })
            .build()
    }

    #[test]
    fn a_sweep_interval_that_does_not_parse_says_which_field() {
        assert_eq!(sweep_interval("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(sweep_interval("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(sweep_interval("1.5h"), Ok(Duration::from_secs(5400)));
        let error = sweep_interval("soon").expect_err("not a duration");
        assert!(
            error
                .to_string()
                .starts_with("spec.discovery.interval \"soon\""),
            "{error}"
        );
    }

    #[test]
    fn only_approved_machines_count_and_only_ready_ones_are_ready() {
        let machines = [
            ready(TalosMachine::test("cp-1").control_plane().approved()),
            TalosMachine::test("cp-2")
                .control_plane()
                .approved()
                .build(),
            ready(TalosMachine::test("cp-3").control_plane()),
            ready(TalosMachine::test("w-1").worker().approved()),
            ready(TalosMachine::test("w-2").worker().rejected()),
            TalosMachine::test("new").build(),
        ];
        let tally = Tally::of(3, &machines);
        assert_eq!(
            tally,
            Tally {
                declared: 3,
                cp_approved: 2,
                cp_ready: 1,
                w_approved: 1,
                w_ready: 1,
            }
        );
        assert_eq!(
            tally.control_planes(),
            MachineCounts {
                declared: Some(3),
                approved: 2,
                ready: 1,
                summary: "1/3".into(),
            }
        );
        assert_eq!(
            tally.workers(),
            MachineCounts {
                declared: None,
                approved: 1,
                ready: 1,
                summary: "1/1".into(),
            }
        );
        assert_eq!(
            tally.ready_message(),
            "control planes 1/2 ready, workers 1/1 ready"
        );
    }

    #[test]
    fn an_even_count_or_a_count_mismatch_is_transitioning() {
        let tally = |declared, cp_approved| Tally {
            declared,
            cp_approved,
            cp_ready: 0,
            w_approved: 0,
            w_ready: 0,
        };
        let (holds, reason, message) = tally(2, 2).transitioning();
        assert!(holds, "even, though as many as declared are approved");
        assert_eq!(reason, reasons::EVEN_CONTROL_PLANE_COUNT);
        assert!(message.ends_with("failures than 1"), "{message}");
        let (holds, reason, message) = tally(3, 2).transitioning();
        assert!(holds);
        assert_eq!(reason, reasons::CONTROL_PLANE_COUNT_MISMATCH);
        assert_eq!(message, "2 control planes approved, 3 declared");
        let (holds, reason, _) = tally(3, 3).transitioning();
        assert!(!holds);
        assert_eq!(reason, reasons::RECONCILED);
    }

    #[test]
    fn ready_needs_a_control_plane_every_approved_machine_ready_and_bootstrap() {
        let all = Tally {
            declared: 1,
            cp_approved: 1,
            cp_ready: 1,
            w_approved: 2,
            w_ready: 2,
        };
        assert!(all.all_ready(true));
        assert!(!all.all_ready(false), "etcd not bootstrapped");
        assert!(!Tally { w_ready: 1, ..all }.all_ready(true));
        assert!(!Tally { cp_ready: 0, ..all }.all_ready(true));
        let none = Tally {
            cp_approved: 0,
            cp_ready: 0,
            w_approved: 0,
            w_ready: 0,
            ..all
        };
        assert!(!none.all_ready(true), "no control plane at all");
    }

    #[test]
    fn a_cluster_is_looked_at_soon_only_while_it_waits_on_its_nodes() {
        let settings = Settings::default();
        let (settled, progress) = (settings.settled_requeue, settings.progress_requeue);
        assert!(progress < settled);
        // Bootstrapped with its bundle and no tombstone: its machines' changes wake it, Ready
        // or not.
        assert!(!waits_on_nodes(true, true, false));
        assert!(waits_on_nodes(false, true, false), "a bundle not there");
        assert!(waits_on_nodes(true, false, false), "a bootstrap not done");
        assert!(
            waits_on_nodes(true, true, true),
            "a tombstone or node delete pending"
        );
        assert_eq!(requeue_after(&settings, false, None), settled);
        assert_eq!(requeue_after(&settings, true, None), progress);
        let sweep = progress + (settled - progress) / 2;
        assert_eq!(requeue_after(&settings, false, Some(sweep)), sweep);
        assert_eq!(requeue_after(&settings, true, Some(settled)), progress);
    }

    #[test]
    fn the_talosconfig_names_control_planes_as_endpoints_and_every_approved_machine_as_a_node() {
        let machines = [
            TalosMachine::test("w-1")
                .worker()
                .approved()
                .at("10.5.0.9")
                .build(),
            TalosMachine::test("cp-2")
                .control_plane()
                .approved()
                .at("10.5.0.3")
                .build(),
            TalosMachine::test("cp-1")
                .control_plane()
                .approved()
                .at("10.5.0.2")
                .build(),
            TalosMachine::test("cp-9")
                .control_plane()
                .at("10.5.0.4")
                .build(),
        ];
        let (endpoints, nodes) = talosconfig_targets(&machines);
        assert_eq!(endpoints, ["10.5.0.2", "10.5.0.3"]);
        assert_eq!(nodes, ["10.5.0.2", "10.5.0.3", "10.5.0.9"]);
    }

    fn published(endpoints: &[&str], nodes: &[&str]) -> Published {
        Published {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            ca_pem: "CA".into(),
            not_before: std::time::SystemTime::UNIX_EPOCH,
            not_after: std::time::SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_talosconfig_is_current_only_with_the_same_endpoints_nodes_and_ca() {
        let text = published(&["10.5.0.2"], &["10.5.0.2", "10.5.0.9"]);
        let endpoints = ["10.5.0.2".to_owned()];
        let nodes = ["10.5.0.2".to_owned(), "10.5.0.9".to_owned()];
        assert!(talosconfig_current(&text, &endpoints, &nodes, "CA"));
        assert!(!talosconfig_current(&text, &endpoints, &nodes[..1], "CA"));
        assert!(!talosconfig_current(&text, &nodes, &nodes, "CA"));
        assert!(!talosconfig_current(
            &text,
            &endpoints,
            &nodes,
            "another CA"
        ));
    }

    #[test]
    fn a_kubeconfig_is_current_only_with_the_same_endpoint_and_ca() {
        let text = published(&["https://10.5.0.10:6443"], &[]);
        assert!(kubeconfig_current(&text, "https://10.5.0.10:6443", "CA"));
        assert!(!kubeconfig_current(&text, "https://10.5.0.11:6443", "CA"));
        assert!(!kubeconfig_current(
            &text,
            "https://10.5.0.10:6443",
            "another CA"
        ));
    }

    #[test]
    fn only_an_approved_configured_control_plane_may_bootstrap() {
        let cp = || TalosMachine::test("cp-1").control_plane().approved();
        assert!(bootstrap_candidate(&configured(cp())));
        assert!(!bootstrap_candidate(&cp().build()), "never configured");
        assert!(!bootstrap_candidate(&configured(
            TalosMachine::test("w-1").worker().approved()
        )));
        assert!(!bootstrap_candidate(&configured(
            TalosMachine::test("cp-2").control_plane()
        )));
    }

    #[test]
    fn a_candidate_is_asked_at_its_recorded_address_before_its_endpoint() {
        let machine = TalosMachine::test("cp-1").at("10.5.0.2");
        assert_eq!(bootstrap_address(&machine.clone().build()), "10.5.0.2");
        let moved = machine.status(TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                address: Some("10.5.0.9".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        assert_eq!(bootstrap_address(&moved.build()), "10.5.0.9");
    }

    #[test]
    fn the_call_uses_the_connection_kept_for_the_chosen_machine() {
        let clients = || vec![("cp-1".to_owned(), None), ("cp-2".to_owned(), Some(2))];
        assert_eq!(kept_connection(clients(), "cp-2").ok(), Some(2));
        assert!(matches!(
            kept_connection(clients(), "cp-1"),
            Err(Error::Invariant(_))
        ));
        assert!(matches!(
            kept_connection(clients(), "cp-3"),
            Err(Error::Invariant(_))
        ));
    }

    #[test]
    fn bootstrapped_now_or_before_is_done_and_a_failure_is_pending() {
        let now: Result<_, &str> = Ok(Bootstrapped::Now);
        assert_eq!(
            bootstrap_answered("cp-1", &now),
            (
                true,
                reasons::BOOTSTRAPPED,
                "etcd bootstrapped on cp-1".into()
            )
        );
        let (done, reason, message) =
            bootstrap_answered::<&str>("cp-1", &Ok(Bootstrapped::Already));
        assert!(done);
        assert_eq!(reason, reasons::BOOTSTRAPPED);
        assert!(message.contains("already"), "{message}");
        let (done, reason, message) = bootstrap_answered("cp-1", &Err("etcd not ready"));
        assert!(!done);
        assert_eq!(reason, reasons::BOOTSTRAP_PENDING);
        assert!(message.ends_with("etcd not ready"), "{message}");
    }

    fn condition(type_: &str, status: ConditionStatus, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Time(Timestamp::now()),
            observed_generation: Some(1),
        }
    }

    fn with_status(ready: Condition, cp_ready: i32) -> TalosCluster {
        let mut cluster = TalosCluster::test("lab").build();
        cluster.status = Some(TalosClusterStatus {
            conditions: vec![ready],
            core: ichor_api::cluster::ClusterCore {
                control_planes: Some(MachineCounts {
                    declared: Some(3),
                    approved: 3,
                    ready: cp_ready,
                    summary: format!("{cp_ready}/3"),
                }),
                ..Default::default()
            },
            ..Default::default()
        });
        cluster
    }

    #[test]
    fn machines_are_not_woken_by_tallies_or_wording_only() {
        let waiting = |ready, message| {
            with_status(
                condition(
                    conditions::READY,
                    ConditionStatus::False,
                    "Waiting",
                    message,
                ),
                ready,
            )
        };
        let before = waiting(1, "control planes 1/3 ready");
        let mut after = waiting(2, "control planes 2/3 ready");
        after.metadata.resource_version = Some("42".into());
        assert_eq!(machines_see(&before), machines_see(&after));

        let flipped = with_status(
            condition(
                conditions::READY,
                ConditionStatus::True,
                "Ready",
                "all ready",
            ),
            3,
        );
        assert_ne!(machines_see(&before), machines_see(&flipped));
        let reason = with_status(
            condition(conditions::READY, ConditionStatus::False, "Other", "x"),
            1,
        );
        assert_ne!(machines_see(&before), machines_see(&reason));
        let mut secrets = before.clone();
        secrets.status.as_mut().expect("status").core.secrets_secret = Some("lab-secrets".into());
        assert_ne!(machines_see(&before), machines_see(&secrets));
        let mut respecced = before.clone();
        respecced.spec.talos_version = "v1.14.2".into();
        assert_ne!(machines_see(&before), machines_see(&respecced));

        // A rollout's progress and the lock changing hands are tallies too (ADR 0071).
        let mut moving = before.clone();
        let status = moving.status.as_mut().expect("status");
        status.core.rollout = Some(ichor_api::cluster::RolloutStatus {
            in_flight: Some("w-1".into()),
            ..Default::default()
        });
        status.lock.mirror = Some(ichor_api::cluster::LockStatus::default());
        assert_eq!(machines_see(&before), machines_see(&moving));

        // A Kubernetes rollout's step is not: it renders the next node's config anew
        // (ADR 0070), and only this wake tells that node.
        let mut stepped = moving.clone();
        let status = stepped.status.as_mut().expect("status");
        status.core.rollout = Some(ichor_api::cluster::RolloutStatus {
            in_flight: Some("w-2".into()),
            kubernetes_step: Some("kube-scheduler on cp-1".into()),
            ..Default::default()
        });
        assert_ne!(machines_see(&moving), machines_see(&stepped));
    }

    #[test]
    fn a_cluster_reads_its_machines_as_stored_until_its_bundle_is_recorded_and_etcd_bootstrapped() {
        let mut cluster = TalosCluster::test("lab").build();
        assert!(reads_machines_as_stored(&cluster), "no status yet");
        let status = cluster.status.get_or_insert_with(Default::default);
        status.core.bundle_fingerprint = Some("sha256:ab".into());
        assert!(reads_machines_as_stored(&cluster), "not bootstrapped");
        let status = cluster.status.get_or_insert_with(Default::default);
        status.core.bootstrap = Some(ichor_api::cluster::BootstrapRecord {
            machine_name: "cp-1".into(),
            machine_uid: "u1".into(),
            chosen_at: Time(Timestamp::UNIX_EPOCH),
            completed_at: None,
        });
        assert!(
            reads_machines_as_stored(&cluster),
            "chosen, not bootstrapped yet"
        );
        if let Some(record) = cluster
            .status
            .as_mut()
            .and_then(|s| s.core.bootstrap.as_mut())
        {
            record.completed_at = Some(Time(Timestamp::UNIX_EPOCH));
        }
        assert!(
            !reads_machines_as_stored(&cluster),
            "from the cache from now on"
        );
    }
}
