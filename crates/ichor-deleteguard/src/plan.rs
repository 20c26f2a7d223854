//! The planner's rules for one disruptive action: whether deleting, resetting or restarting a
//! machine may go ahead now. Written once, as the entries of one table ([`RULES`]), and used at
//! the door (the webhook, [`Stage::Admission`]) and in the controller inside the cluster lock
//! ([`Stage::Run`]) by removals, reset, reboot and upgrade operations and reboots for drift.
//!
//! Quorum is computed over every voter the recorded observations report, healthy or not. An
//! observation older than the cluster's limit counts as unhealthy, and a control plane never
//! observed counts as an unhealthy voter: not knowing is never a reason to go ahead.
//!
//! [`check`] applies every rule; [`check_with`] applies a chosen [`RuleSet`], which is how the
//! model tests show that each rule is needed.

use std::fmt;

use crate::model::{Cluster, ControlPlaneCounts, Machine, ObjectKind, control_plane_counts};
use crate::rules::etcd_quorum;
use crate::verdict::{Refusal, Unhealthy, Verdict, Wait};

/// A disruptive action on one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Disruption {
    /// The machine is deleted: its removal takes it out of etcd for good.
    Delete,
    /// A TalosOperation resets it: out of etcd for good, as a delete.
    Reset {
        /// The operation's name.
        operation: String,
        /// Whether the operation carries the allow-delete annotation.
        allow_delete: bool,
    },
    /// The machine goes down and comes back: a reboot, an upgrade, a reboot for drift.
    Restart,
}

impl Disruption {
    /// Whether the machine leaves etcd for good.
    pub fn leaves_etcd(&self) -> bool {
        !matches!(self, Self::Restart)
    }

    /// The action as a verb, for messages.
    pub fn verb(&self) -> &'static str {
        match self {
            Self::Delete => "deleting",
            Self::Reset { .. } => "resetting",
            Self::Restart => "restarting",
        }
    }
}

/// Where the rules are applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// At the door (the webhook): whatever holds the action refuses it.
    Admission,
    /// In the controller, inside the cluster lock, before an action starts: what resolves by
    /// itself (a replacement, etcd health) waits.
    Run,
    /// Right before the step that takes a voter out or down (the etcd leave, the reset, the
    /// reboot) of an action already started: etcd's quorum and health again, which can change
    /// while the action holds the lock. The declared count and the annotation were checked
    /// when it started, and a started removal always finishes.
    Act,
}

/// One rule of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// Never take out the last control plane.
    LastControlPlane,
    /// The voters left keep quorum of the voters now (`3 -> 2` passes, `2 -> 1` does not).
    MembershipQuorum,
    /// Never delete or reset the configured control plane whose address is the host of the
    /// cluster's endpoint: every node reaches Kubernetes through it.
    EndpointNode,
    /// Deleting or resetting a control plane needs the allow-delete annotation.
    AllowDelete,
    /// An observation older than its limit counts as unhealthy.
    FreshObservations,
    /// While a voter is unhealthy, nothing disruptive goes to a healthy control plane.
    UnhealthyPeer,
    /// The healthy voters left are at least a quorum of the voters left.
    HealthyQuorum,
    /// Only healthy voters count toward `spec.controlPlane.count`: a removal or reset waits
    /// for a replacement that is a healthy voter.
    DeclaredCount,
}

impl Rule {
    /// Every rule, in the order the table applies them.
    pub const ALL: [Self; 8] = [
        Self::LastControlPlane,
        Self::MembershipQuorum,
        Self::EndpointNode,
        Self::AllowDelete,
        Self::FreshObservations,
        Self::UnhealthyPeer,
        Self::HealthyQuorum,
        Self::DeclaredCount,
    ];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of rules to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RuleSet(u8);

impl RuleSet {
    /// Every rule: what production applies.
    pub const ALL: Self = Self(0xff);

    /// The same set without `rule`.
    #[must_use]
    pub fn without(self, rule: Rule) -> Self {
        Self(self.0 & !rule.bit())
    }

    /// Whether `rule` is in the set.
    pub fn contains(self, rule: Rule) -> bool {
        self.0 & rule.bit() != 0
    }
}

/// One entry of the table: the rule, what it says, and its check (`None`: it does not hold
/// the action).
pub struct RuleEntry {
    /// The rule.
    pub rule: Rule,
    /// What it says, for people.
    pub says: &'static str,
    check: fn(&Facts<'_>) -> Option<Verdict>,
}

/// The table, most binding first: what an annotation cannot fix is reported before the missing
/// annotation, and refusals before waits.
pub const RULES: [RuleEntry; 8] = [
    RuleEntry {
        rule: Rule::LastControlPlane,
        says: "never the last control plane (delete the TalosCluster instead)",
        check: last_control_plane,
    },
    RuleEntry {
        rule: Rule::MembershipQuorum,
        says: "the voters left keep quorum of the voters now",
        check: membership_quorum,
    },
    RuleEntry {
        rule: Rule::EndpointNode,
        says: "never the control plane whose address is the host of the cluster's endpoint",
        check: endpoint_node,
    },
    RuleEntry {
        rule: Rule::AllowDelete,
        says: "deleting or resetting a control plane needs the allow-delete annotation",
        check: allow_delete,
    },
    RuleEntry {
        rule: Rule::FreshObservations,
        says: "an observation older than its limit counts as unhealthy",
        // Not a check of its own: it decides what `healthy` means for the others.
        check: |_| None,
    },
    RuleEntry {
        rule: Rule::UnhealthyPeer,
        says: "while a voter is unhealthy, nothing disruptive goes to a healthy control plane",
        check: unhealthy_peer,
    },
    RuleEntry {
        rule: Rule::HealthyQuorum,
        says: "the healthy voters left are at least a quorum of the voters left",
        check: healthy_quorum,
    },
    RuleEntry {
        rule: Rule::DeclaredCount,
        says: "only healthy voters count toward spec.controlPlane.count",
        check: declared_count,
    },
];

/// How a machine leaves etcd, when the action takes it out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Leave {
    /// Not an etcd voter: nothing to leave.
    NotMember,
    /// A voter that stays one: it goes down and comes back.
    Stays,
    /// It leaves by itself: its member is healthy.
    Graceful,
    /// Its member is not healthy: it is removed by id through a healthy peer, which needs the
    /// force-remove annotation.
    ThroughPeer,
}

/// Why an action may go ahead: the counts the rules saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Justification {
    /// The machine.
    pub target: String,
    /// What is done to it, as a verb.
    pub action: &'static str,
    /// Voters now, the target included.
    pub voters: usize,
    /// Voters once the action is done (for a restart, while the target is down the voters
    /// stay, so this is `voters`).
    pub voters_after: usize,
    /// Healthy voters left while or after the action runs, the target not counted.
    pub healthy_left: usize,
    /// `spec.controlPlane.count`.
    pub declared: usize,
    /// How it leaves etcd.
    pub leave: Leave,
    /// The cluster is being torn down: the per-machine rules are lifted.
    pub teardown: bool,
}

impl fmt::Display for Justification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} talosmachine {}", self.action, self.target)?;
        if self.teardown {
            return write!(f, ": the cluster is being torn down");
        }
        match self.leave {
            Leave::NotMember => write!(f, ": not an etcd voter"),
            _ => write!(
                f,
                ": etcd voters {} -> {}, {} healthy voter(s) left (quorum {}), \
                 spec.controlPlane.count {}",
                self.voters,
                self.voters_after,
                self.healthy_left,
                etcd_quorum(self.voters_after),
                self.declared
            ),
        }
    }
}

/// What the rules read, computed once per check.
struct Facts<'a> {
    target: &'a Machine,
    cluster: &'a Cluster,
    disruption: &'a Disruption,
    stage: Stage,
    rules: RuleSet,
    /// The target is an etcd voter.
    member: bool,
    /// Voters around the target's leaving, members being deleted left out.
    counts: ControlPlaneCounts,
    /// The other voters, those being deleted included: they are in etcd until they leave.
    others: Vec<&'a Machine>,
}

impl Facts<'_> {
    fn healthy(&self, machine: &Machine) -> bool {
        let max_age = if self.rules.contains(Rule::FreshObservations) {
            self.cluster.max_age
        } else {
            i64::MAX
        };
        machine.is_healthy_voter(self.cluster.now, max_age)
    }

    /// The other voters that are not healthy, each with what was observed.
    fn unhealthy_others(&self) -> Vec<String> {
        self.others
            .iter()
            .filter(|m| !self.healthy(m))
            .map(|m| {
                let seen = match m.etcd {
                    None => "never observed".to_owned(),
                    Some(o) if !o.healthy => format!(
                        "its member did not answer {} s ago",
                        self.cluster.now.saturating_sub(o.at)
                    ),
                    Some(o) => format!(
                        "last observed {} s ago, over the limit of {} s",
                        self.cluster.now.saturating_sub(o.at),
                        self.cluster.max_age
                    ),
                };
                format!("{} ({seen})", m.name)
            })
            .collect()
    }

    /// The voters left while or after the action runs, and how many of them are healthy (the
    /// target never counts as healthy left: it is the one disrupted).
    fn left(&self) -> (usize, usize) {
        let healthy = self.others.iter().filter(|m| self.healthy(m)).count();
        if self.disruption.leaves_etcd() {
            (self.others.len(), healthy)
        } else {
            (self.others.len() + 1, healthy)
        }
    }

    /// What holds the action: a refusal at the door, a wait in the controller.
    fn hold(&self, unhealthy: Unhealthy) -> Verdict {
        match self.stage {
            Stage::Admission => Verdict::Refuse(Refusal::EtcdUnhealthy(unhealthy)),
            Stage::Run | Stage::Act => Verdict::Wait(Wait::EtcdUnhealthy(unhealthy)),
        }
    }

    fn justification(&self) -> Justification {
        let (voters_after, healthy_left) = self.left();
        let voters = if self.member {
            self.others.len() + 1
        } else {
            0
        };
        let leave = match (self.member, self.disruption.leaves_etcd()) {
            (false, _) => Leave::NotMember,
            (true, false) => Leave::Stays,
            (true, true) if self.healthy(self.target) => Leave::Graceful,
            (true, true) => Leave::ThroughPeer,
        };
        Justification {
            target: self.target.name.clone(),
            action: self.disruption.verb(),
            voters,
            voters_after: if self.member { voters_after } else { 0 },
            healthy_left,
            declared: self.cluster.declared_control_planes,
            leave,
            teardown: false,
        }
    }
}

/// Whether `address` and `host` name the same place: equal as IP addresses when both are
/// (so `::1` and `0:0:0:0:0:0:0:1` agree), else equal ignoring ASCII case.
fn same_host(address: &str, host: &str) -> bool {
    match (
        address.parse::<std::net::IpAddr>(),
        host.parse::<std::net::IpAddr>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => address.eq_ignore_ascii_case(host),
    }
}

/// A configured control plane reached at the host of the cluster's endpoint is the endpoint:
/// taking it out of etcd for good (delete, reset) leaves every node without the Kubernetes API
/// and a new worker without its certificate (talos-facts §5). Refused at the door and before
/// an action starts; an action already started (`Stage::Act`) finishes.
fn endpoint_node(f: &Facts<'_>) -> Option<Verdict> {
    let target = f.target;
    let endpoint = f.cluster.endpoint_host.as_deref()?;
    let address = target.address.as_deref()?;
    (f.disruption.leaves_etcd()
        && f.stage != Stage::Act
        && target.is_control_plane()
        && target.applied
        && same_host(address, endpoint))
    .then(|| {
        Verdict::Refuse(Refusal::ClusterEndpointNode {
            action: f.disruption.verb(),
            name: target.name.clone(),
            endpoint: endpoint.to_owned(),
            cluster: f.cluster.name.clone(),
        })
    })
}

fn last_control_plane(f: &Facts<'_>) -> Option<Verdict> {
    (f.disruption.leaves_etcd() && f.member && f.counts.after == 0).then(|| {
        Verdict::Refuse(Refusal::LastControlPlane {
            name: f.target.name.clone(),
            cluster: f.cluster.name.clone(),
        })
    })
}

fn membership_quorum(f: &Facts<'_>) -> Option<Verdict> {
    // The last one is the last control plane's rule.
    let below = f.counts.after > 0 && f.counts.after < etcd_quorum(f.counts.before);
    (f.disruption.leaves_etcd() && f.member && below).then(|| {
        Verdict::Refuse(Refusal::QuorumAtRisk {
            action: f.disruption.verb(),
            name: f.target.name.clone(),
            counts: f.counts,
        })
    })
}

fn allow_delete(f: &Facts<'_>) -> Option<Verdict> {
    if f.stage == Stage::Act {
        return None;
    }
    let (missing, kind, name) = match f.disruption {
        Disruption::Delete => (
            f.target.needs_allow_delete() && !f.target.allow_delete,
            ObjectKind::TalosMachine,
            f.target.name.clone(),
        ),
        Disruption::Reset {
            operation,
            allow_delete,
        } => (
            f.target.needs_allow_delete() && !allow_delete,
            ObjectKind::TalosOperation,
            operation.clone(),
        ),
        Disruption::Restart => return None,
    };
    missing.then(|| {
        Verdict::Refuse(Refusal::AllowDeleteRequired {
            kind,
            name,
            namespace: f
                .target
                .namespace
                .clone()
                .or_else(|| f.cluster.namespace.clone()),
        })
    })
}

fn unhealthy_peer(f: &Facts<'_>) -> Option<Verdict> {
    if !f.member || !f.healthy(f.target) {
        return None;
    }
    let voters = f.unhealthy_others();
    (!voters.is_empty()).then(|| {
        f.hold(Unhealthy {
            target: f.target.name.clone(),
            action: f.disruption.verb(),
            voters,
            short: None,
        })
    })
}

fn healthy_quorum(f: &Facts<'_>) -> Option<Verdict> {
    if !f.member {
        return None;
    }
    let (left, healthy) = f.left();
    // Nothing left is the last control plane's rule; a single voter restarting pauses etcd
    // and keeps its data, which no other order avoids.
    if left == 0 || (!f.disruption.leaves_etcd() && left == 1) {
        return None;
    }
    let quorum = etcd_quorum(left);
    (healthy < quorum).then(|| {
        f.hold(Unhealthy {
            target: f.target.name.clone(),
            action: f.disruption.verb(),
            voters: f.unhealthy_others(),
            short: Some((healthy, quorum)),
        })
    })
}

fn declared_count(f: &Facts<'_>) -> Option<Verdict> {
    if f.stage != Stage::Run || !f.disruption.leaves_etcd() || !f.member {
        return None;
    }
    let healthy = f
        .others
        .iter()
        .filter(|m| !m.deleting && f.healthy(m))
        .count();
    let declared = f.cluster.declared_control_planes;
    (healthy < declared).then(|| {
        Verdict::Wait(Wait::AwaitingReplacement {
            action: match f.disruption {
                Disruption::Delete => "removing",
                _ => f.disruption.verb(),
            },
            name: f.target.name.clone(),
            cluster: f.cluster.name.clone(),
            counts: f.counts,
            declared,
            healthy,
        })
    })
}

/// Whether `disruption` of `target` may go ahead now, by every rule. `machines` is every
/// TalosMachine of `cluster`, with or without the target; `cluster` carries the time judged at
/// and the observation limit.
pub fn check(
    target: &Machine,
    machines: &[Machine],
    cluster: &Cluster,
    disruption: &Disruption,
    stage: Stage,
) -> Verdict {
    check_with(target, machines, cluster, disruption, stage, RuleSet::ALL)
}

/// [`check`] with only the rules in `rules` (the model tests disable one at a time).
pub fn check_with(
    target: &Machine,
    machines: &[Machine],
    cluster: &Cluster,
    disruption: &Disruption,
    stage: Stage,
    rules: RuleSet,
) -> Verdict {
    let facts = Facts {
        target,
        cluster,
        disruption,
        stage,
        rules,
        member: target.is_control_plane_member(),
        counts: control_plane_counts(target, machines),
        others: machines
            .iter()
            .filter(|m| m.name != target.name && m.is_control_plane_member())
            .collect(),
    };
    if cluster.tearing_down() && *disruption == Disruption::Delete {
        // The teardown was admitted with the cluster's annotation; it takes the workers first.
        let workers = machines
            .iter()
            .filter(|m| m.applied && !m.is_control_plane())
            .count();
        if stage == Stage::Run && target.is_control_plane() && target.applied && workers > 0 {
            return Verdict::Wait(Wait::TeardownWorkersFirst {
                name: target.name.clone(),
                workers,
            });
        }
        return Verdict::Proceed(Justification {
            teardown: true,
            ..facts.justification()
        });
    }
    RULES
        .iter()
        .filter(|entry| rules.contains(entry.rule))
        .find_map(|entry| (entry.check)(&facts))
        .unwrap_or_else(|| Verdict::Proceed(facts.justification()))
}

/// Admission of an operation's targets, in the order it runs them: each is checked at the door
/// as `disruption`, and for an action that takes machines out of etcd (a reset), the targets
/// before it count as being deleted, as if they were deleted one after another.
pub fn check_targets(
    targets: &[&str],
    machines: &[Machine],
    cluster: &Cluster,
    disruption: &Disruption,
) -> Result<(), Refusal> {
    check_targets_with(targets, machines, cluster, disruption, RuleSet::ALL)
}

/// [`check_targets`] with only the rules in `rules` (the model tests disable one at a time).
pub fn check_targets_with(
    targets: &[&str],
    machines: &[Machine],
    cluster: &Cluster,
    disruption: &Disruption,
    rules: RuleSet,
) -> Result<(), Refusal> {
    let mut working: Vec<Machine> = machines.to_vec();
    for name in targets {
        let Some(index) = working.iter().position(|m| m.name == *name) else {
            continue;
        };
        let target = working[index].clone();
        if let Verdict::Refuse(refusal) = check_with(
            &target,
            &working,
            cluster,
            disruption,
            Stage::Admission,
            rules,
        ) {
            return Err(refusal);
        }
        if disruption.leaves_etcd() {
            working[index].deleting = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Observation;
    use crate::verdict::reasons;

    use crate::fixtures::control_planes as cps;

    fn reset() -> Disruption {
        Disruption::Reset {
            operation: "wipe".into(),
            allow_delete: true,
        }
    }

    fn reason(verdict: &Verdict) -> Option<&'static str> {
        verdict.reason()
    }

    #[test]
    fn the_table_lists_every_rule_once_in_order() {
        let table: Vec<Rule> = RULES.iter().map(|e| e.rule).collect();
        assert_eq!(table, Rule::ALL);
        for entry in &RULES {
            assert!(!entry.says.is_empty());
        }
        let mut set = RuleSet::ALL;
        for rule in Rule::ALL {
            assert!(set.contains(rule));
            set = set.without(rule);
            assert!(!set.contains(rule));
        }
        assert_eq!(set, RuleSet(0));
    }

    #[test]
    fn a_reset_is_a_delete_for_etcd() {
        let cluster = Cluster::new("prod", 3);
        let machines = cps(3);
        let admitted = check(
            &machines[0],
            &machines,
            &cluster,
            &reset(),
            Stage::Admission,
        );
        assert!(admitted.is_proceed(), "{admitted:?}");
        let run = check(&machines[0], &machines, &cluster, &reset(), Stage::Run);
        assert_eq!(reason(&run), Some(reasons::AWAITING_REPLACEMENT));
        let two = cps(2);
        let refused = check(&two[0], &two, &cluster, &reset(), Stage::Admission);
        assert_eq!(reason(&refused), Some(reasons::QUORUM_AT_RISK));
        let one = cps(1);
        let refused = check(&one[0], &one, &cluster, &reset(), Stage::Admission);
        assert_eq!(reason(&refused), Some(reasons::LAST_CONTROL_PLANE));
    }

    #[test]
    fn a_reset_of_a_control_plane_needs_the_annotation_on_the_operation() {
        let machines = cps(5);
        let unannotated = Disruption::Reset {
            operation: "wipe".into(),
            allow_delete: false,
        };
        let refused = check(
            &machines[0],
            &machines,
            &Cluster::new("prod", 3),
            &unannotated,
            Stage::Admission,
        );
        assert_eq!(reason(&refused), Some(reasons::ALLOW_DELETE_REQUIRED));
        let message = refused.message().unwrap_or_default();
        assert!(message.contains("talosoperation wipe"), "{message}");
        let worker = Machine::new("w-1").worker().approved().config_applied();
        let allowed = check(
            &worker,
            &machines,
            &Cluster::new("prod", 3),
            &unannotated,
            Stage::Run,
        );
        assert!(allowed.is_proceed(), "a worker's reset needs no annotation");
    }

    #[test]
    fn a_replacement_counts_once_it_is_a_healthy_voter() {
        let cluster = Cluster::new("prod", 3);
        let mut machines = cps(3);
        // Configured, still installing: observed, not a voter yet.
        machines.push(
            Machine::new("cp-4")
                .control_plane()
                .approved()
                .config_applied()
                .observed(Observation {
                    voter: false,
                    healthy: false,
                    at: 0,
                }),
        );
        machines[0].deleting = true;
        let verdict = check(
            &machines[0],
            &machines,
            &cluster,
            &Disruption::Delete,
            Stage::Run,
        );
        assert_eq!(reason(&verdict), Some(reasons::AWAITING_REPLACEMENT));
        machines[3] = machines[3].clone().healthy();
        let verdict = check(
            &machines[0],
            &machines,
            &cluster,
            &Disruption::Delete,
            Stage::Run,
        );
        assert!(verdict.is_proceed(), "{verdict:?}");
    }

    #[test]
    fn nothing_disruptive_goes_to_a_healthy_control_plane_while_a_voter_is_unhealthy() {
        let cluster = Cluster::new("prod", 3);
        let mut machines = cps(5);
        machines[4] = machines[4].clone().unhealthy();
        for disruption in [Disruption::Delete, reset(), Disruption::Restart] {
            let verdict = check(&machines[0], &machines, &cluster, &disruption, Stage::Run);
            assert_eq!(
                reason(&verdict),
                Some(reasons::ETCD_UNHEALTHY),
                "{disruption:?}"
            );
            let message = verdict.message().unwrap_or_default();
            assert!(message.contains("cp-5"), "{message}");
            let refused = check(
                &machines[0],
                &machines,
                &cluster,
                &disruption,
                Stage::Admission,
            );
            assert!(matches!(refused, Verdict::Refuse(_)), "{refused:?}");
        }
        // The unhealthy member itself may go, through a peer.
        let verdict = check(
            &machines[4],
            &machines,
            &cluster,
            &Disruption::Delete,
            Stage::Run,
        );
        match verdict {
            Verdict::Proceed(why) => assert_eq!(why.leave, Leave::ThroughPeer),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stale_observation_counts_as_unhealthy() {
        let machines = cps(3);
        let fresh = Cluster::new("prod", 1).at(OBSERVATION_MAX_AGE_FOR_TESTS);
        let verdict = check(
            &machines[0],
            &machines,
            &fresh,
            &Disruption::Restart,
            Stage::Run,
        );
        assert!(verdict.is_proceed(), "{verdict:?}");
        let stale = Cluster::new("prod", 1).at(OBSERVATION_MAX_AGE_FOR_TESTS + 1);
        let verdict = check(
            &machines[0],
            &machines,
            &stale,
            &Disruption::Restart,
            Stage::Run,
        );
        assert_eq!(reason(&verdict), Some(reasons::ETCD_UNHEALTHY));
        let message = verdict.message().unwrap_or_default();
        assert!(message.contains("last observed 181 s ago"), "{message}");
        let lenient = check_with(
            &machines[0],
            &machines,
            &stale,
            &Disruption::Restart,
            Stage::Run,
            RuleSet::ALL.without(Rule::FreshObservations),
        );
        assert!(lenient.is_proceed(), "{lenient:?}");
    }

    const OBSERVATION_MAX_AGE_FOR_TESTS: i64 = crate::model::OBSERVATION_MAX_AGE;

    #[test]
    fn a_control_plane_never_observed_is_an_unhealthy_voter() {
        let mut machines = cps(3);
        machines[2].etcd = None;
        let verdict = check(
            &machines[0],
            &machines,
            &Cluster::new("prod", 1),
            &Disruption::Restart,
            Stage::Admission,
        );
        assert_eq!(reason(&verdict), Some(reasons::ETCD_UNHEALTHY));
        assert!(
            verdict
                .message()
                .unwrap_or_default()
                .contains("cp-3 (never observed)")
        );
    }

    #[test]
    fn restarts_keep_a_healthy_quorum_and_a_single_voter_may_restart() {
        let cluster = Cluster::new("prod", 1);
        let one = cps(1);
        assert!(check(&one[0], &one, &cluster, &Disruption::Restart, Stage::Run).is_proceed());
        // Three voters, two unhealthy: restarting the third would leave none healthy.
        let mut three = cps(3);
        three[1] = three[1].clone().unhealthy();
        three[2] = three[2].clone().unhealthy();
        let verdict = check(
            &three[1],
            &three,
            &cluster,
            &Disruption::Restart,
            Stage::Run,
        );
        assert_eq!(reason(&verdict), Some(reasons::ETCD_UNHEALTHY));
        assert!(
            verdict
                .message()
                .unwrap_or_default()
                .contains("would leave 1 healthy etcd voter(s), below the quorum of 2")
        );
    }

    #[test]
    fn workers_are_never_held_by_etcd() {
        let mut machines = cps(3);
        machines[1] = machines[1].clone().unhealthy();
        machines[2] = machines[2].clone().unhealthy();
        let worker = Machine::new("w-1").worker().approved().config_applied();
        for disruption in [Disruption::Delete, reset(), Disruption::Restart] {
            let verdict = check(
                &worker,
                &machines,
                &Cluster::new("prod", 3),
                &disruption,
                Stage::Run,
            );
            match verdict {
                Verdict::Proceed(why) => assert_eq!(why.leave, Leave::NotMember),
                other => panic!("{disruption:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_reset_of_every_control_plane_is_refused_at_the_door_down_to_quorum() {
        let machines = cps(5);
        let cluster = Cluster::new("prod", 3);
        let all: Vec<&str> = machines.iter().map(|m| m.name.as_str()).collect();
        let refusal = check_targets(&all, &machines, &cluster, &reset()).unwrap_err();
        assert_eq!(refusal.reason(), reasons::QUORUM_AT_RISK);
        assert!(refusal.message().contains("cp-4"), "{refusal}");
        assert_eq!(
            check_targets(&all[..3], &machines, &cluster, &reset()),
            Ok(()),
            "5 -> 2 keeps quorum at each step; the declared count is the controller's"
        );
        assert_eq!(
            check_targets(&all, &machines, &cluster, &Disruption::Restart),
            Ok(()),
            "restarts come back: each is checked against the cluster as it is"
        );
    }

    #[test]
    fn an_operation_admitted_without_a_rule_lets_through_what_the_rule_refuses() {
        let machines = cps(3);
        let cluster = Cluster::new("prod", 3);
        let unannotated = Disruption::Reset {
            operation: "wipe".into(),
            allow_delete: false,
        };
        let refusal = check_targets(&["cp-1"], &machines, &cluster, &unannotated).unwrap_err();
        assert_eq!(refusal.reason(), reasons::ALLOW_DELETE_REQUIRED);
        let lenient = RuleSet::ALL.without(Rule::AllowDelete);
        assert_eq!(
            check_targets_with(&["cp-1"], &machines, &cluster, &unannotated, lenient),
            Ok(())
        );
        assert_eq!(
            check_targets_with(&["cp-1"], &machines, &cluster, &unannotated, RuleSet::ALL),
            Err(refusal)
        );
    }

    #[test]
    fn a_justification_names_the_counts() {
        let machines = cps(3);
        let cluster = Cluster::new("prod", 1);
        let Verdict::Proceed(why) = check(
            &machines[0],
            &machines,
            &cluster,
            &Disruption::Delete,
            Stage::Run,
        ) else {
            panic!("proceeds");
        };
        assert_eq!(why.leave, Leave::Graceful);
        assert_eq!(
            why.to_string(),
            "deleting talosmachine cp-1: etcd voters 3 -> 2, 2 healthy voter(s) left (quorum 2), \
             spec.controlPlane.count 1"
        );
    }

    #[test]
    fn the_control_plane_the_endpoint_names_is_never_deleted_or_reset_but_rebooted() {
        let machines: Vec<Machine> = cps(4)
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.at_address(format!("10.0.0.{}", i + 1)))
            .collect();
        let cluster = Cluster::new("prod", 3).with_endpoint_host("10.0.0.1");
        for disruption in [Disruption::Delete, reset()] {
            for stage in [Stage::Admission, Stage::Run] {
                let verdict = check(&machines[0], &machines, &cluster, &disruption, stage);
                assert_eq!(
                    reason(&verdict),
                    Some(reasons::CLUSTER_ENDPOINT_NODE),
                    "{disruption:?} at {stage:?}"
                );
            }
            // An action that started before finishes; another control plane is not held.
            let act = check(&machines[0], &machines, &cluster, &disruption, Stage::Act);
            assert!(act.is_proceed(), "{act:?}");
            let other = check(&machines[1], &machines, &cluster, &disruption, Stage::Run);
            assert!(other.is_proceed(), "{other:?}");
        }
        let reboot = check(
            &machines[0],
            &machines,
            &cluster,
            &Disruption::Restart,
            Stage::Run,
        );
        assert!(reboot.is_proceed(), "{reboot:?}");
        // A VIP or a load balancer names no machine; a teardown lifts the rule; a control
        // plane never configured has served nothing.
        let vip = Cluster::new("prod", 3).with_endpoint_host("10.0.0.100");
        let admitted = check(
            &machines[0],
            &machines,
            &vip,
            &Disruption::Delete,
            Stage::Run,
        );
        assert!(admitted.is_proceed(), "{admitted:?}");
        let teardown = cluster.clone().being_deleted().allowing_delete();
        assert!(
            check_with(
                &machines[0],
                &machines,
                &teardown,
                &Disruption::Delete,
                Stage::Run,
                RuleSet::ALL
            )
            .is_proceed()
        );
        let mut fresh = machines.clone();
        fresh[0].applied = false;
        fresh[0].etcd = None;
        let admitted = check(
            &fresh[0],
            &fresh,
            &cluster,
            &Disruption::Delete,
            Stage::Admission,
        );
        assert_ne!(reason(&admitted), Some(reasons::CLUSTER_ENDPOINT_NODE));
        // The same address written another way is the same host.
        let v6 = Cluster::new("prod", 3).with_endpoint_host("fd00::1");
        let mut spelled = machines.clone();
        spelled[0].address = Some("fd00:0:0:0:0:0:0:1".into());
        let refused = check(
            &spelled[0],
            &spelled,
            &v6,
            &Disruption::Delete,
            Stage::Admission,
        );
        assert_eq!(reason(&refused), Some(reasons::CLUSTER_ENDPOINT_NODE));
        let Verdict::Refuse(refusal) = refused else {
            panic!("{refused:?}")
        };
        assert!(refusal.message().contains("spec.endpoint"), "{refusal:?}");
    }

    #[test]
    fn an_endpoint_url_gives_its_host() {
        use crate::model::url_host;
        assert_eq!(
            url_host("https://10.0.0.1:6443").as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(
            url_host("https://[fd00::1]:6443/").as_deref(),
            Some("fd00::1")
        );
        assert_eq!(
            url_host("https://api.lab.example").as_deref(),
            Some("api.lab.example")
        );
        assert_eq!(url_host("https://"), None);
    }
}
