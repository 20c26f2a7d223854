//! Workers rolled out in batches (`spec.rollout.maxUnavailable`, `failureDomainLabel`; ADR
//! 0077): what a worker's step needs to know to start beside others, read from the spec and
//! the machines as stored. The rules are `ichor_deleteguard::rollout`'s ([`rollout::join`],
//! [`rollout::decide_with`] under [`PolicyRules::batch`]); the lock that holds a batch is
//! `crate::lock::join`'s.

use std::collections::BTreeMap;

use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;
use ichor_api::names::conditions;
use ichor_api::rollout::RolloutPolicy;
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass};
use ichor_deleteguard::rollout::{
    self, Backups, Change, Facts, MaxUnavailable, Policy, PolicyRules, RolloutMachine,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;

use crate::infra::conditions as cond;

/// A worker's step that may go in a batch: the cluster's machines as a batch sees them, and
/// the structural rules of the policy governing the worker.
#[derive(Debug, Clone)]
pub struct Batch {
    /// The cluster's approved machines with a role; none pending.
    pub machines: Vec<RolloutMachine>,
    /// Their names by UID, to read a batch's members (`drift/<uid>`, `upgrade/<uid>`).
    pub names: BTreeMap<String, String>,
    /// The worker's name.
    pub me: String,
    /// The policy's batch rules: `maxUnavailable` and the failure domains.
    pub policy: Policy,
}

impl Batch {
    /// The batch `machine` of `cluster` would join, by the `policy` governing it; `None` when
    /// it goes alone under the cluster lock as before: a control plane, or a policy that lets
    /// one worker at a time be down.
    pub fn of(
        machine: &TalosMachine,
        machines: &[TalosMachine],
        policy: &RolloutPolicy,
    ) -> Option<Self> {
        if machine.spec.role != Some(Role::Worker) {
            return None;
        }
        let label = policy.failure_domain_label.as_deref();
        let policy = batch_policy(policy);
        let members: Vec<RolloutMachine> = machines.iter().filter_map(|m| seen(m, label)).collect();
        let workers = members.iter().filter(|m| m.role == Role::Worker).count();
        if policy.max_unavailable.of(workers) <= 1 {
            return None;
        }
        let names = machines
            .iter()
            .filter_map(|m| Some((m.uid()?, m.name_any())))
            .collect();
        Some(Self {
            machines: members,
            names,
            me: machine.name_any(),
            policy,
        })
    }

    /// The names of the machines whose steps `members` (lock holders as written) are; those
    /// of no machine of the cluster are left out.
    pub fn names_of<'a>(&self, members: impl IntoIterator<Item = &'a str>) -> Vec<String> {
        members
            .into_iter()
            .filter_map(|h| h.split_once('/').map(|(_, uid)| uid))
            .filter_map(|uid| self.names.get(uid).cloned())
            .collect()
    }

    /// Whether it is the worker's turn in a batch: it is among the workers that may start now
    /// beside `members` (the names of the steps in flight), in rollout order, given which
    /// machines still have a change (`pending`, by name).
    pub fn turn(&self, members: &[String], pending: &[String]) -> bool {
        if members.contains(&self.me) {
            return true;
        }
        let machines: Vec<RolloutMachine> = self
            .machines
            .iter()
            .map(|m| RolloutMachine {
                change: pending.contains(&m.name).then_some(Change::Disruptive),
                in_flight: members.contains(&m.name),
                ..m.clone()
            })
            .collect();
        let facts = Facts {
            machines: &machines,
            policy: &self.policy,
            halted: None,
            gates: &[],
            backups: Backups::default(),
            now: k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        };
        rollout::decide_with(&facts, &PolicyRules::batch())
            .starts()
            .contains(&self.me)
    }

    /// Whether the worker may join `members` (names) now, where the lock is taken:
    /// [`rollout::join`]. `Err` says why not.
    pub fn join(&self, members: &[String]) -> Result<(), String> {
        match rollout::join(&self.machines, members, &self.me, &self.policy) {
            rollout::Decision::Start { .. } => Ok(()),
            rollout::Decision::InFlight { in_flight } => Err(format!(
                "as many workers are down as maxUnavailable ({}) lets be, or one of its failure domain is: {} in flight",
                self.most(),
                in_flight.join(", ")
            )),
            rollout::Decision::WaitForHealthy { machine } => Err(format!(
                "{machine} is not healthy (Ready, and for a control plane a healthy etcd voter), and no other worker may be down beside it"
            )),
            other => Err(format!("the batch does not take it now ({other:?})")),
        }
    }

    /// How many workers may be down at once.
    pub fn most(&self) -> usize {
        let workers = self
            .machines
            .iter()
            .filter(|m| m.role == Role::Worker)
            .count();
        self.policy.max_unavailable.of(workers)
    }
}

/// `machine` as a batch sees it: `None` unless approved with a role.
fn seen(machine: &TalosMachine, label: Option<&str>) -> Option<RolloutMachine> {
    let role = machine.spec.role?;
    if machine.spec.approval_state != ApprovalState::Approved {
        return None;
    }
    let status = machine.status.clone().unwrap_or_default();
    Some(RolloutMachine {
        name: machine.name_any(),
        role,
        change: None,
        in_flight: false,
        healthy: cond::is_true(&status.conditions, conditions::READY),
        leaving: machine.metadata.deletion_timestamp.is_some() || status.removal.progress.is_some(),
        failure_domain: label.and_then(|l| machine.labels().get(l).cloned()),
    })
}

/// The batch rules of `policy`: its `maxUnavailable` (1 when unset, or when it does not read:
/// the CRD refuses such a value, so only an object stored before the rule has one) and
/// whether it spreads failure domains.
pub fn batch_policy(policy: &RolloutPolicy) -> Policy {
    Policy {
        max_unavailable: max_unavailable(policy.max_unavailable.as_ref()),
        spread_failure_domains: policy.failure_domain_label.is_some(),
        ..Policy::default()
    }
}

/// `maxUnavailable` read: a count of at least one, or a percentage from 1 to 100.
pub fn max_unavailable(value: Option<&IntOrString>) -> MaxUnavailable {
    match value {
        Some(IntOrString::Int(n)) => u32::try_from(*n)
            .ok()
            .filter(|n| *n >= 1)
            .map_or(MaxUnavailable::Count(1), MaxUnavailable::Count),
        Some(IntOrString::String(text)) => text
            .strip_suffix('%')
            .and_then(|p| p.parse::<u32>().ok())
            .filter(|p| (1..=100).contains(p))
            .map_or(MaxUnavailable::Count(1), MaxUnavailable::Percent),
        None => MaxUnavailable::Count(1),
    }
}

/// The most workers that may start at once by any rollout policy of `cluster` (its own, or
/// one of `classes` of it): as many machines queued for their turn are woken when a turn
/// ends.
pub fn widest(
    cluster: &TalosCluster,
    classes: &[std::sync::Arc<TalosMachineClass>],
    machines: &[TalosMachine],
) -> usize {
    let workers = machines
        .iter()
        .filter(|m| m.spec.role == Some(Role::Worker))
        .count();
    let of = |policy: &RolloutPolicy| max_unavailable(policy.max_unavailable.as_ref()).of(workers);
    classes
        .iter()
        .filter(|c| {
            c.namespace() == cluster.namespace() && c.spec.cluster_ref.name == cluster.name_any()
        })
        .filter_map(|c| c.spec.rollout.as_ref())
        .map(of)
        .fold(of(&cluster.spec.rollout), usize::max)
}
