//! The inputs: one machine, one cluster, and the control-plane counts derived from them.

use std::collections::BTreeMap;

use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, RemovalStep};
use ichor_api::names::annotations;
use ichor_api::{TalosCluster, TalosMachine};

/// What the rules need to know about one TalosMachine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Machine {
    /// `metadata.name`; unique within the cluster's namespace.
    pub name: String,
    /// `metadata.namespace`, used in the commands the messages suggest.
    pub namespace: Option<String>,
    /// `spec.role`.
    pub role: Option<Role>,
    /// `spec.approvalState`.
    pub approval: ApprovalState,
    /// Whether `status.appliedConfigHash` is set (a config was applied to the machine).
    pub applied: bool,
    /// Whether `metadata.deletionTimestamp` is set (the machine is being deleted).
    pub deleting: bool,
    /// Whether the annotation `ichor.maesh.dev/allow-delete` is exactly `"true"`.
    pub allow_delete: bool,
    /// Whether the annotation `ichor.maesh.dev/force-remove` is exactly `"true"`.
    pub force_remove: bool,
    /// The etcd member as last observed on the node (`status.etcd`); `None` if never observed.
    pub etcd: Option<Observation>,
    /// Whether its removal recorded leaving etcd (`status.removal.step` at `EtcdLeft` or later).
    pub left_etcd: bool,
    /// Where it is reached: `status.address`, else its first `spec.endpoints` entry.
    pub address: Option<String>,
}

/// A control plane's etcd member as observed on the node at one time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Observation {
    /// A voter (a learner, or no member, is not one).
    pub voter: bool,
    /// The node answered and its member reported its status.
    pub healthy: bool,
    /// When it was observed, in Unix seconds.
    pub at: i64,
}

impl Observation {
    /// A healthy voter observed at `at` (Unix seconds).
    pub fn healthy_voter(at: i64) -> Self {
        Self {
            voter: true,
            healthy: true,
            at,
        }
    }

    /// A voter whose member did not answer, observed at `at` (Unix seconds).
    pub fn unhealthy_voter(at: i64) -> Self {
        Self {
            voter: true,
            healthy: false,
            at,
        }
    }
}

impl Machine {
    /// A pending machine without a role, never applied, not being deleted, not annotated.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: None,
            role: None,
            approval: ApprovalState::Pending,
            applied: false,
            deleting: false,
            allow_delete: false,
            force_remove: false,
            etcd: None,
            left_etcd: false,
            address: None,
        }
    }

    /// Sets the address it is reached at.
    pub fn at_address(mut self, address: impl Into<String>) -> Self {
        self.address = Some(address.into());
        self
    }

    /// Sets the namespace.
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Sets the role to `controlplane`.
    pub fn control_plane(mut self) -> Self {
        self.role = Some(Role::ControlPlane);
        self
    }

    /// Sets the role to `worker`.
    pub fn worker(mut self) -> Self {
        self.role = Some(Role::Worker);
        self
    }

    /// Sets the approval state to `approved`.
    pub fn approved(mut self) -> Self {
        self.approval = ApprovalState::Approved;
        self
    }

    /// Sets the approval state to `rejected`.
    pub fn rejected(mut self) -> Self {
        self.approval = ApprovalState::Rejected;
        self
    }

    /// Marks the machine's config as applied.
    pub fn config_applied(mut self) -> Self {
        self.applied = true;
        self
    }

    /// Marks the machine as being deleted.
    pub fn being_deleted(mut self) -> Self {
        self.deleting = true;
        self
    }

    /// Sets the allow-delete annotation.
    pub fn allowing_delete(mut self) -> Self {
        self.allow_delete = true;
        self
    }

    /// Sets the force-remove annotation.
    pub fn forcing_removal(mut self) -> Self {
        self.force_remove = true;
        self
    }

    /// Records `observation` of its etcd member.
    pub fn observed(mut self, observation: Observation) -> Self {
        self.etcd = Some(observation);
        self
    }

    /// Records a healthy voter observed at time 0: a live control plane in tests whose clock
    /// stands at 0.
    pub fn healthy(self) -> Self {
        self.observed(Observation::healthy_voter(0))
    }

    /// Records a voter whose member did not answer, observed at time 0.
    pub fn unhealthy(self) -> Self {
        self.observed(Observation::unhealthy_voter(0))
    }

    /// Records that its removal left etcd.
    pub fn having_left_etcd(mut self) -> Self {
        self.left_etcd = true;
        self
    }

    /// Whether the role is `controlplane`.
    pub fn is_control_plane(&self) -> bool {
        self.role == Some(Role::ControlPlane)
    }

    /// Whether the machine counts as an etcd voter: a control plane whose config was applied,
    /// whatever its approval state says, that has not left etcd, and that was not last
    /// observed as a learner or no member. A control plane never observed counts (unhealthy):
    /// not knowing is no reason to leave it out of the quorum.
    pub fn is_control_plane_member(&self) -> bool {
        self.is_control_plane()
            && self.applied
            && !self.left_etcd
            && self.etcd.is_none_or(|o| o.voter)
    }

    /// Whether it is a voter whose member was observed healthy no longer than `max_age`
    /// seconds before `now`: an older observation counts as unhealthy, and so does one dated
    /// more than `max_age` after `now` (no two clocks differ by that much; a status written by
    /// hand in the year 9999 must not count as healthy for ever).
    pub fn is_healthy_voter(&self, now: i64, max_age: i64) -> bool {
        let fresh = |at: i64| {
            let age = now.saturating_sub(at);
            age <= max_age && age >= max_age.saturating_neg()
        };
        self.is_control_plane_member()
            && self
                .etcd
                .is_some_and(|o| o.voter && o.healthy && fresh(o.at))
    }

    /// Whether deleting it needs the allow-delete annotation: an approved control plane, or a
    /// control plane whose config was applied.
    pub fn needs_allow_delete(&self) -> bool {
        self.is_control_plane() && (self.approval == ApprovalState::Approved || self.applied)
    }
}

impl From<&TalosMachine> for Machine {
    fn from(machine: &TalosMachine) -> Self {
        let meta = &machine.metadata;
        let status = machine.status.as_ref();
        Self {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone(),
            role: machine.spec.role,
            approval: machine.spec.approval_state,
            // Presence, as the apiserver's CEL lock reads it (`has(status.appliedConfigHash)`).
            applied: status.is_some_and(|s| s.applied.config_hash.is_some()),
            deleting: meta.deletion_timestamp.is_some(),
            allow_delete: annotation_true(meta.annotations.as_ref(), annotations::ALLOW_DELETE),
            force_remove: annotation_true(meta.annotations.as_ref(), annotations::FORCE_REMOVE),
            etcd: status
                .and_then(|s| s.etcd.observed.as_ref())
                .map(|o| Observation {
                    voter: o.voter,
                    healthy: o.healthy,
                    at: o.observed_at.0.as_second(),
                }),
            left_etcd: status
                .and_then(|s| s.removal.progress.as_ref())
                .is_some_and(|r| r.step >= RemovalStep::EtcdLeft),
            address: status
                .and_then(|s| s.inventory.address.clone())
                .or_else(|| machine.spec.endpoints.first().cloned()),
        }
    }
}

/// What the rules need to know about the TalosCluster a machine belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace`, used in the commands the messages suggest.
    pub namespace: Option<String>,
    /// `spec.controlPlane.count`.
    pub declared_control_planes: usize,
    /// Whether `metadata.deletionTimestamp` is set. Only with `allow_delete` too is the cluster
    /// torn down ([`Cluster::tearing_down`]), which lifts the per-machine rules.
    pub deleting: bool,
    /// Whether the annotation `ichor.maesh.dev/allow-delete` is exactly `"true"`.
    pub allow_delete: bool,
    /// The time the rules judge at, in Unix seconds.
    pub now: i64,
    /// How old, in seconds, an etcd observation may be and still count as healthy.
    pub max_age: i64,
    /// The host of `spec.endpoint` (an address, or a name), through which every node reaches
    /// Kubernetes.
    pub endpoint_host: Option<String>,
}

/// How old, in seconds, an etcd observation may be by default and still count as healthy: a
/// healthy machine is observed every minute, so two missed observations make it unhealthy.
pub const OBSERVATION_MAX_AGE: i64 = 180;

impl Cluster {
    /// A cluster declaring `declared_control_planes`, not being deleted, not annotated, judged
    /// at time 0 with the default observation age.
    pub fn new(name: impl Into<String>, declared_control_planes: usize) -> Self {
        Self {
            name: name.into(),
            namespace: None,
            declared_control_planes,
            deleting: false,
            allow_delete: false,
            now: 0,
            max_age: OBSERVATION_MAX_AGE,
            endpoint_host: None,
        }
    }

    /// Sets the host of the cluster's endpoint.
    pub fn with_endpoint_host(mut self, host: impl Into<String>) -> Self {
        self.endpoint_host = Some(host.into());
        self
    }

    /// Judges at `now` (Unix seconds).
    pub fn at(mut self, now: i64) -> Self {
        self.now = now;
        self
    }

    /// Counts etcd observations older than `max_age` seconds as unhealthy.
    pub fn observations_valid_for(mut self, max_age: i64) -> Self {
        self.max_age = max_age;
        self
    }

    /// Sets the namespace.
    pub fn in_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Marks the cluster as being deleted.
    pub fn being_deleted(mut self) -> Self {
        self.deleting = true;
        self
    }

    /// Sets the allow-delete annotation.
    pub fn allowing_delete(mut self) -> Self {
        self.allow_delete = true;
        self
    }

    /// Whether the cluster is torn down: deleted, and carrying the allow-delete annotation its
    /// deletion needs. Only then are the per-machine rules lifted. A cluster deleted without it
    /// (its admission bypassed: the webhook unregistered) keeps every rule, and its teardown
    /// waits for the annotation ([`crate::check_cluster_teardown`], ADR 0052).
    pub fn tearing_down(&self) -> bool {
        self.deleting && self.allow_delete
    }
}

impl From<&TalosCluster> for Cluster {
    fn from(cluster: &TalosCluster) -> Self {
        let meta = &cluster.metadata;
        Self {
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone(),
            declared_control_planes: usize::try_from(cluster.spec.control_plane.count).unwrap_or(0),
            deleting: meta.deletion_timestamp.is_some(),
            allow_delete: annotation_true(meta.annotations.as_ref(), annotations::ALLOW_DELETE),
            now: 0,
            max_age: OBSERVATION_MAX_AGE,
            endpoint_host: url_host(&cluster.spec.endpoint),
        }
    }
}

/// The host of an `https://host:port/path` URL (an IPv6 address without its brackets), if it
/// has one.
pub fn url_host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.split(':').next().unwrap_or_default(),
    };
    (!host.is_empty()).then(|| host.to_owned())
}

/// Whether the annotation `key` is present with the exact value `"true"`.
pub fn annotation_true(annotations: Option<&BTreeMap<String, String>>, key: &str) -> bool {
    annotations
        .and_then(|a| a.get(key))
        .is_some_and(|v| v == annotations::TRUE)
}

/// The kind of object a refusal is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ObjectKind {
    /// A TalosMachine.
    TalosMachine,
    /// A TalosCluster.
    TalosCluster,
    /// A TalosOperation.
    TalosOperation,
}

impl ObjectKind {
    /// The resource name as `kubectl` takes it (`talosmachine`, `taloscluster`).
    pub fn resource(self) -> &'static str {
        match self {
            Self::TalosMachine => "talosmachine",
            Self::TalosCluster => "taloscluster",
            Self::TalosOperation => "talosoperation",
        }
    }
}

/// Control-plane members around the removal of one machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ControlPlaneCounts {
    /// Members now: those not being deleted, plus the machine checked if it is a member.
    pub before: usize,
    /// Members once the machine checked has left.
    pub after: usize,
    /// Other members already being deleted, counted in neither `before` nor `after`.
    pub already_deleting: usize,
}

/// Counts the control-plane members around removing `target`; entries of `machines` named like
/// `target` are ignored, so `machines` may or may not include it.
pub fn control_plane_counts(target: &Machine, machines: &[Machine]) -> ControlPlaneCounts {
    let others = machines
        .iter()
        .filter(|m| m.name != target.name && m.is_control_plane_member());
    let (mut remaining, mut already_deleting) = (0, 0);
    for m in others {
        if m.deleting {
            already_deleting += 1;
        } else {
            remaining += 1;
        }
    }
    let own = usize::from(target.is_control_plane_member());
    ControlPlaneCounts {
        before: remaining + own,
        after: remaining,
        already_deleting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ichor_api::machine::{EtcdObservation, RemovalProgress, TalosMachineStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn deleted_at(text: &str) -> Option<Time> {
        Some(Time(text.parse().expect("a timestamp")))
    }

    #[test]
    fn an_observation_from_the_far_future_is_not_fresh() {
        let voter = |at| {
            Machine::new("cp-1")
                .control_plane()
                .approved()
                .config_applied()
                .observed(Observation::healthy_voter(at))
        };
        let now = 1_767_225_600;
        assert!(voter(now - 180).is_healthy_voter(now, 180));
        assert!(
            voter(now + 30).is_healthy_voter(now, 180),
            "a clock a little ahead"
        );
        assert!(!voter(now - 181).is_healthy_voter(now, 180));
        assert!(!voter(now + 181).is_healthy_voter(now, 180));
        // 9999-12-31T23:59:59Z, and the extremes of the field.
        assert!(!voter(253_402_300_799).is_healthy_voter(now, 180));
        assert!(!voter(i64::MAX).is_healthy_voter(now, 180));
        assert!(!voter(i64::MIN).is_healthy_voter(now, 180));
        assert!(!voter(i64::MAX).is_healthy_voter(i64::MIN, i64::MAX));
    }

    #[test]
    fn reads_a_live_machine() {
        let tm = TalosMachine::test("cp-1")
            .namespace("infra")
            .control_plane()
            .approved()
            .build();
        assert_eq!(
            Machine::from(&tm),
            Machine::new("cp-1")
                .in_namespace("infra")
                .control_plane()
                .approved()
                .at_address("192.168.10.21")
        );

        let mut tm = TalosMachine::test("cp-1")
            .control_plane()
            .rejected()
            .allow_delete()
            .annotation(annotations::FORCE_REMOVE, annotations::TRUE)
            .status(TalosMachineStatus {
                applied: ichor_api::machine::MachineApplied {
                    config_hash: Some("abc".into()),
                },
                etcd: ichor_api::machine::MachineEtcd {
                    observed: Some(EtcdObservation {
                        voter: true,
                        healthy: false,
                        observed_at: Time("2025-01-01T00:01:40Z".parse().expect("a timestamp")),
                    }),
                },
                removal: ichor_api::machine::MachineRemoval {
                    progress: Some(RemovalProgress {
                        step: RemovalStep::EtcdLeft,
                        ..Default::default()
                    }),
                },
                ..Default::default()
            })
            .build();
        tm.metadata.deletion_timestamp = deleted_at("2025-01-01T00:00:00Z");
        assert_eq!(
            Machine::from(&tm),
            Machine::new("cp-1")
                .control_plane()
                .rejected()
                .config_applied()
                .being_deleted()
                .allowing_delete()
                .forcing_removal()
                .observed(Observation::unhealthy_voter(1_735_689_700))
                .having_left_etcd()
                .at_address("192.168.10.21")
        );
    }

    #[test]
    fn allow_delete_needs_exactly_true() {
        for value in ["True", "yes", "1", "", " true"] {
            let map: BTreeMap<String, String> = [(annotations::ALLOW_DELETE.into(), value.into())]
                .into_iter()
                .collect();
            assert!(
                !annotation_true(Some(&map), annotations::ALLOW_DELETE),
                "{value:?}"
            );
        }
        assert!(!annotation_true(None, annotations::ALLOW_DELETE));
    }

    #[test]
    fn reads_a_live_cluster() {
        let mut tc = TalosCluster::test("prod")
            .namespace("infra")
            .control_planes(3)
            .allow_delete()
            .build();
        tc.metadata.deletion_timestamp = deleted_at("2025-01-01T00:00:00Z");
        assert_eq!(
            Cluster::from(&tc),
            Cluster::new("prod", 3)
                .in_namespace("infra")
                .being_deleted()
                .allowing_delete()
                .with_endpoint_host("192.168.10.5")
        );
    }

    #[test]
    fn a_rejected_flag_does_not_hide_an_applied_control_plane() {
        let m = Machine::new("cp-1")
            .control_plane()
            .rejected()
            .config_applied();
        assert!(m.is_control_plane_member());
        assert!(m.needs_allow_delete());
    }

    #[test]
    fn an_approved_control_plane_not_yet_applied_is_not_a_member() {
        let m = Machine::new("cp-4").control_plane().approved();
        assert!(!m.is_control_plane_member());
        assert!(m.needs_allow_delete());
    }

    #[test]
    fn counts_ignore_the_target_in_the_list_and_deleting_members() {
        let mut cps: Vec<Machine> = (1..=3)
            .map(|i| {
                Machine::new(format!("cp-{i}"))
                    .control_plane()
                    .approved()
                    .config_applied()
            })
            .collect();
        let counts = control_plane_counts(&cps[0], &cps);
        assert_eq!(
            counts,
            ControlPlaneCounts {
                before: 3,
                after: 2,
                already_deleting: 0
            }
        );
        cps[0].deleting = true;
        let counts = control_plane_counts(&cps[1], &cps);
        assert_eq!(
            counts,
            ControlPlaneCounts {
                before: 2,
                after: 1,
                already_deleting: 1
            }
        );
        // Without the target in the list: the same answer.
        let without = [cps[0].clone(), cps[2].clone()];
        assert_eq!(control_plane_counts(&cps[1], &without), counts);
    }
}
