//! Rollout policy: whether the next node(s) of a rollout may start now, and which.
//!
//! Every change that reaches nodes one batch at a time (a Talos or Kubernetes version, a
//! schematic, a config change, live or with a reboot) is a rollout, and one policy a team
//! declares governs them all ([`Policy`]): maintenance windows, a suspend, health gates on the
//! team's own workloads, a fresh etcd backup before a control plane is disrupted, and how many
//! workers may be down at once, never two sharing a failure domain.
//!
//! [`decide`] is a pure function of the machines as observed, the policy, the clock and the
//! gates' results, so the manager and `kubectl ichor plan` answer alike, and the model tests
//! drive it with an injected clock. It decides only when a batch may *start*; each machine of
//! a batch still goes through the planner ([`crate::check`]) and its own steps, and a node in
//! flight finishes whatever the policy says meanwhile (a window closing, a suspend).
//!
//! The order is the drift rollout's ([`crate::drift_turn`], ADR 0019): control planes first,
//! one at a time with every other machine available; then workers, up to `maxUnavailable` of
//! them unavailable at once (the ones down for any reason count), each group by name.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use ichor_api::common::Role;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

/// The longest maintenance window: a week (a weekly schedule can then cover all of it).
pub const MAX_WINDOW: Duration = Duration::from_secs(7 * 24 * 3600);

/// The shortest maintenance window: a minute, the schedule's own resolution.
pub const MIN_WINDOW: Duration = Duration::from_secs(60);

/// A maintenance window: opens at each time its cron schedule names, in its time zone, and
/// stays open for its duration (elapsed time, so a window across a daylight-saving change
/// lasts as long as any other).
#[derive(Clone, Debug)]
pub struct Window {
    schedule: croner::Cron,
    duration: SignedDuration,
    zone: TimeZone,
    text: String,
}

/// Why a maintenance window cannot be read: the field, and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum WindowError {
    /// The schedule is no cron expression.
    #[error(
        "schedule {text:?} is not a five-field cron expression (minute hour day-of-month month day-of-week): {problem}"
    )]
    Schedule {
        /// The schedule as written.
        text: String,
        /// What the cron parser says.
        problem: croner::errors::CronError,
    },
    /// The duration is out of range.
    #[error("duration {0:?} is not between 1m and 168h (a week)")]
    Duration(Duration),
    /// The time zone is not in the IANA database.
    #[error("timeZone {0:?} is not an IANA time zone name (e.g. Europe/Berlin, UTC)")]
    Zone(String),
}

impl Window {
    /// Reads a window: a five-field cron `schedule`, its `duration`, and an IANA `zone` name.
    pub fn parse(schedule: &str, duration: Duration, zone: &str) -> Result<Self, WindowError> {
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&duration) {
            return Err(WindowError::Duration(duration));
        }
        let zone_found = TimeZone::get(zone).map_err(|_| WindowError::Zone(zone.to_owned()))?;
        // Five fields, as documented: no seconds, no year (croner's default takes either).
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .year(croner::parser::Year::Disallowed)
            .build()
            .parse(schedule)
            .map_err(|problem| WindowError::Schedule {
                text: schedule.to_owned(),
                problem,
            })?;
        let duration =
            SignedDuration::try_from(duration).map_err(|_| WindowError::Duration(duration))?;
        Ok(Self {
            schedule: cron,
            duration,
            zone: zone_found,
            text: format!("{schedule} ({zone}) for {duration:#}"),
        })
    }

    /// When the window open at `now` closes; `None` if it is closed at `now`.
    pub fn closes_after(&self, now: Timestamp) -> Option<Timestamp> {
        let here = now.to_zoned(self.zone.clone());
        let opened = self.schedule.find_previous_occurrence(&here, true).ok()?;
        let closes = opened.timestamp().checked_add(self.duration).ok()?;
        (now < closes).then_some(closes)
    }

    /// When the window opens next after `now`; `None` if its schedule names no later time.
    pub fn opens_after(&self, now: Timestamp) -> Option<Timestamp> {
        let here = now.to_zoned(self.zone.clone());
        self.schedule
            .find_next_occurrence(&here, false)
            .ok()
            .map(|z| z.timestamp())
    }
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether a step held for a window may start at `now`: `Ok` when one of `windows` is open (or
/// none is declared), else `Err` with the next opening and its window, if any schedule names
/// a later time.
pub fn window_open(windows: &[Window], now: Timestamp) -> Result<(), Option<(Timestamp, &Window)>> {
    if windows.is_empty() || windows.iter().any(|w| w.closes_after(now).is_some()) {
        return Ok(());
    }
    Err(windows
        .iter()
        .filter_map(|w| w.opens_after(now).map(|at| (at, w)))
        .min_by_key(|(at, _)| *at))
}

/// How many workers may be unavailable at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxUnavailable {
    /// A count, at least 1.
    Count(u32),
    /// A percentage of the cluster's workers (1 to 100), rounded down, at least 1.
    Percent(u32),
}

impl Default for MaxUnavailable {
    fn default() -> Self {
        Self::Count(1)
    }
}

impl MaxUnavailable {
    /// How many of `workers` workers may be unavailable at once: at least one, so a rollout
    /// always moves.
    pub fn of(self, workers: usize) -> usize {
        let n = match self {
            Self::Count(n) => usize::try_from(n).unwrap_or(usize::MAX),
            Self::Percent(p) => workers.saturating_mul(p.min(100) as usize) / 100,
        };
        n.max(1)
    }
}

/// The rollout policy of a cluster (or of a class's machines), read and checked.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Maintenance windows; none lets a rollout run at any time.
    pub windows: Vec<Window>,
    /// Whether a live change (applied without a restart) waits for a window too.
    pub hold_live_changes: bool,
    /// Suspended: the node in flight finishes, no other starts.
    pub suspended: bool,
    /// How many workers may be unavailable at once.
    pub max_unavailable: MaxUnavailable,
    /// Whether two workers sharing a failure domain are never disrupted together (the
    /// machines' [`RolloutMachine::failure_domain`]).
    pub spread_failure_domains: bool,
    /// How old the last successful etcd backup may be when a control plane is disrupted;
    /// `None` asks for none.
    pub fresh_backup: Option<Duration>,
}

/// What a machine's change does to its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Applied live, nothing restarted.
    Live,
    /// Reboots, upgrades, drains or restarts a service.
    Disruptive,
}

/// One machine of the cluster as the rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutMachine {
    /// `metadata.name`.
    pub name: String,
    /// `spec.role`.
    pub role: Role,
    /// What is still to roll out to it, if anything (not started).
    pub change: Option<Change>,
    /// Whether its step started and has not ended (its node may be down meanwhile).
    pub in_flight: bool,
    /// Whether it is healthy as last recorded: Ready, and for a control plane a healthy
    /// etcd voter.
    pub healthy: bool,
    /// Leaving (being deleted or removed): never rolled out to, never waited for.
    pub leaving: bool,
    /// The value of the cluster's failure-domain label on it, if any.
    pub failure_domain: Option<String>,
}

impl RolloutMachine {
    /// A healthy machine of `role` with nothing to roll out.
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Self {
            name: name.into(),
            role,
            change: None,
            in_flight: false,
            healthy: true,
            leaving: false,
            failure_domain: None,
        }
    }

    /// The same machine, `change` still to roll out to it.
    #[must_use]
    pub fn with_change(mut self, change: Change) -> Self {
        self.change = Some(change);
        self
    }

    /// The same machine, its step in flight.
    #[must_use]
    pub fn in_flight(mut self) -> Self {
        self.in_flight = true;
        self.healthy = false;
        self
    }

    /// The same machine, recorded unhealthy.
    #[must_use]
    pub fn unhealthy(mut self) -> Self {
        self.healthy = false;
        self
    }

    /// The same machine, leaving the cluster.
    #[must_use]
    pub fn leaving(mut self) -> Self {
        self.leaving = true;
        self
    }

    /// The same machine, in failure domain `domain`.
    #[must_use]
    pub fn in_domain(mut self, domain: &str) -> Self {
        self.failure_domain = Some(domain.to_owned());
        self
    }

    /// Whether it is unavailable: in flight, or not healthy.
    fn unavailable(&self) -> bool {
        self.in_flight || !self.healthy
    }

    fn pending(&self) -> bool {
        !self.leaving && !self.in_flight && self.change.is_some()
    }
}

/// A health gate's result, evaluated by the caller against the workload cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gate {
    /// The gate's name.
    pub name: String,
    /// `None` when it holds (lets the rollout go on); otherwise what it saw.
    pub failing: Option<String>,
}

/// The cluster's etcd backups, for the fresh-backup rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backups {
    /// Whether the cluster backs up at all (`spec.backup`): the rule applies only then.
    pub configured: bool,
    /// When the last successful backup was taken.
    pub last_success: Option<Timestamp>,
    /// Whether a backup is being taken now.
    pub running: bool,
}

/// What the rollout is judged on.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// Every machine of the cluster.
    pub machines: &'a [RolloutMachine],
    /// The policy.
    pub policy: &'a Policy,
    /// The machine whose refusal halted the rollout, while the halt stands.
    pub halted: Option<&'a str>,
    /// The health gates' results, evaluated now.
    pub gates: &'a [Gate],
    /// The backups.
    pub backups: Backups,
    /// Now.
    pub now: Timestamp,
}

/// One rule of the policy, each of which the model tests disable in turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PolicyRule {
    /// A held step starts only inside a maintenance window.
    Window,
    /// A suspended rollout starts nothing.
    Suspend,
    /// At most `maxUnavailable` workers unavailable at once.
    MaxUnavailable,
    /// One control plane at a time, with every other machine available.
    OneControlPlane,
    /// Never two workers of one failure domain together.
    FailureDomain,
    /// Every health gate holds before a batch starts.
    Gates,
    /// A control plane is disrupted only after a fresh backup.
    FreshBackup,
}

impl PolicyRule {
    /// Every rule.
    pub const ALL: [Self; 7] = [
        Self::Window,
        Self::Suspend,
        Self::MaxUnavailable,
        Self::OneControlPlane,
        Self::FailureDomain,
        Self::Gates,
        Self::FreshBackup,
    ];
}

/// A set of [`PolicyRule`]s: production applies them all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRules(BTreeSet<PolicyRule>);

impl PolicyRules {
    /// Every rule.
    pub fn all() -> Self {
        Self(PolicyRule::ALL.into_iter().collect())
    }

    /// The same set without `rule`.
    #[must_use]
    pub fn without(mut self, rule: PolicyRule) -> Self {
        self.0.remove(&rule);
        self
    }

    /// The rules a batch is made by ([`join`]): one control plane at a time, at most
    /// `maxUnavailable` workers, never two of one failure domain.
    pub fn batch() -> Self {
        Self(
            [
                PolicyRule::OneControlPlane,
                PolicyRule::MaxUnavailable,
                PolicyRule::FailureDomain,
            ]
            .into_iter()
            .collect(),
        )
    }

    fn has(&self, rule: PolicyRule) -> bool {
        self.0.contains(&rule)
    }
}

/// Whether the next batch may start, and which machines it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to roll out, nothing in flight.
    Settled,
    /// The rollout stopped at `machine`, which refused its change.
    Halted {
        /// The machine that refused.
        machine: String,
    },
    /// Suspended: the machines in flight finish, no other starts.
    Suspended {
        /// The machines still in flight.
        in_flight: Vec<String>,
    },
    /// As many machines are in flight as may be: the next starts once one ends.
    InFlight {
        /// The machines in flight.
        in_flight: Vec<String>,
    },
    /// The next start waits until `machine`, recorded unhealthy, is healthy again.
    WaitForHealthy {
        /// The machine waited for.
        machine: String,
    },
    /// The next step is held outside every maintenance window.
    OutsideWindow {
        /// When the next window opens, if any does.
        opens: Option<Timestamp>,
    },
    /// A health gate does not hold.
    GateFailing {
        /// The gate.
        gate: String,
        /// What it saw.
        saw: String,
    },
    /// A control plane is to be disrupted and the last backup is missing or too old.
    NeedsBackup {
        /// When the last successful backup was taken.
        last_success: Option<Timestamp>,
        /// Whether to ask for one (none is being taken).
        request: bool,
    },
    /// These machines start now, in this order.
    Start {
        /// The batch.
        machines: Vec<String>,
        /// Why these, why now.
        justification: String,
    },
}

impl Decision {
    /// The machines that start now (none unless [`Decision::Start`]).
    pub fn starts(&self) -> &[String] {
        match self {
            Self::Start { machines, .. } => machines,
            _ => &[],
        }
    }
}

/// The rollout order: control planes, then workers, each by name.
fn order(machine: &RolloutMachine) -> (u8, &str) {
    let group = match machine.role {
        Role::ControlPlane => 0,
        Role::Worker => 1,
    };
    (group, machine.name.as_str())
}

/// Whether the policy holds `change` for a window.
fn held(policy: &Policy, change: Option<Change>) -> bool {
    match change {
        Some(Change::Disruptive) => true,
        Some(Change::Live) => policy.hold_live_changes,
        None => false,
    }
}

/// Whether the next batch may start now, and which: every rule of the policy applies.
pub fn decide(facts: &Facts<'_>) -> Decision {
    decide_with(facts, &PolicyRules::all())
}

/// [`decide`] with only the rules in `rules` (the model tests disable one at a time).
pub fn decide_with(facts: &Facts<'_>, rules: &PolicyRules) -> Decision {
    let members: Vec<&RolloutMachine> = facts.machines.iter().filter(|m| !m.leaving).collect();
    let mut pending: Vec<&RolloutMachine> =
        members.iter().copied().filter(|m| m.pending()).collect();
    pending.sort_by(|a, b| order(a).cmp(&order(b)));
    let in_flight: Vec<String> = members
        .iter()
        .filter(|m| m.in_flight)
        .map(|m| m.name.clone())
        .collect();
    let Some(first) = pending.first().copied() else {
        return if in_flight.is_empty() {
            Decision::Settled
        } else {
            Decision::InFlight { in_flight }
        };
    };
    if let Some(machine) = facts.halted {
        return Decision::Halted {
            machine: machine.to_owned(),
        };
    }
    if rules.has(PolicyRule::Suspend) && facts.policy.suspended {
        return Decision::Suspended { in_flight };
    }
    let unavailable: Vec<&RolloutMachine> = members
        .iter()
        .copied()
        .filter(|m| m.unavailable())
        .collect();
    // Why the next start waits for `blocking`: it is in flight, or unhealthy.
    let wait_for = |blocking: &RolloutMachine| {
        if in_flight.is_empty() {
            Decision::WaitForHealthy {
                machine: blocking.name.clone(),
            }
        } else {
            Decision::InFlight {
                in_flight: in_flight.clone(),
            }
        }
    };
    let mut batch: Vec<&RolloutMachine> = Vec::new();
    if first.role == Role::ControlPlane {
        // One control plane at a time, and only while every other machine is available; the
        // control plane itself may be unhealthy (its change may be the fix).
        if rules.has(PolicyRule::OneControlPlane)
            && let Some(blocking) = unavailable.iter().find(|m| m.name != first.name)
        {
            return wait_for(blocking);
        }
        batch.push(first);
    } else {
        // Workers go once every control plane is available.
        if let Some(blocking) = unavailable
            .iter()
            .find(|m| m.role == Role::ControlPlane && rules.has(PolicyRule::OneControlPlane))
        {
            return wait_for(blocking);
        }
        let workers = members.iter().filter(|m| m.role == Role::Worker).count();
        let most = if rules.has(PolicyRule::MaxUnavailable) {
            facts.policy.max_unavailable.of(workers)
        } else {
            usize::MAX
        };
        let spread = rules.has(PolicyRule::FailureDomain) && facts.policy.spread_failure_domains;
        let mut down: BTreeSet<&str> = unavailable
            .iter()
            .filter(|m| m.role == Role::Worker)
            .map(|m| m.name.as_str())
            .collect();
        let mut domains: BTreeSet<&str> = unavailable
            .iter()
            .filter(|m| m.role == Role::Worker)
            .filter_map(|m| m.failure_domain.as_deref())
            .collect();
        for worker in pending.iter().copied().filter(|m| m.role == Role::Worker) {
            let adds = !down.contains(worker.name.as_str());
            if adds && down.len() >= most {
                break;
            }
            if spread
                && let Some(domain) = worker.failure_domain.as_deref()
                && domains.contains(domain)
                && adds
            {
                // Its domain has a worker down: it waits, a later one of another domain may go.
                continue;
            }
            down.insert(worker.name.as_str());
            if let Some(domain) = worker.failure_domain.as_deref() {
                domains.insert(domain);
            }
            batch.push(worker);
        }
        if batch.is_empty() {
            let blocking = unavailable
                .iter()
                .find(|m| m.role == Role::Worker)
                .copied()
                .unwrap_or(first);
            return wait_for(blocking);
        }
    }
    if rules.has(PolicyRule::Window)
        && let Err(next) = window_open(&facts.policy.windows, facts.now)
    {
        // Outside every window, only the leading live changes the policy does not hold go.
        let live = batch
            .iter()
            .take_while(|m| !held(facts.policy, m.change))
            .count();
        batch.truncate(live);
        if batch.is_empty() {
            return Decision::OutsideWindow {
                opens: next.map(|(at, _)| at),
            };
        }
    }
    if rules.has(PolicyRule::Gates)
        && let Some(gate) = facts.gates.iter().find(|g| g.failing.is_some())
    {
        return Decision::GateFailing {
            gate: gate.name.clone(),
            saw: gate.failing.clone().unwrap_or_default(),
        };
    }
    if rules.has(PolicyRule::FreshBackup)
        && let Some(max_age) = facts.policy.fresh_backup
        && facts.backups.configured
        && batch
            .iter()
            .any(|m| m.role == Role::ControlPlane && m.change == Some(Change::Disruptive))
        && !fresh(facts.backups.last_success, max_age, facts.now)
    {
        return Decision::NeedsBackup {
            last_success: facts.backups.last_success,
            request: !facts.backups.running,
        };
    }
    let names: Vec<String> = batch.iter().map(|m| m.name.clone()).collect();
    let justification = format!(
        "{} of {} machine(s) still to roll out, in rollout order (control planes one at a time, then workers, by name); {} unavailable before",
        names.len(),
        pending.len(),
        unavailable.len()
    );
    Decision::Start {
        machines: names,
        justification,
    }
}

/// Whether `me` may start now beside `members`, the steps already holding the cluster lock
/// together, by the rules of a batch alone ([`PolicyRules::batch`]): `me` the only machine
/// pending, every member in flight, the others as recorded. The order, the windows, the gates
/// and the backup are judged before (its turn); this is judged where the lock is taken, on
/// the members as the lock stores them, so two machines joining at once cannot both fit in
/// the room for one. [`Decision::Start`] lets it join.
pub fn join(
    machines: &[RolloutMachine],
    members: &[String],
    me: &str,
    policy: &Policy,
) -> Decision {
    let view: Vec<RolloutMachine> = machines
        .iter()
        .map(|m| {
            let mine = m.name == me;
            RolloutMachine {
                change: mine.then_some(Change::Disruptive),
                in_flight: !mine && members.contains(&m.name),
                ..m.clone()
            }
        })
        .collect();
    let facts = Facts {
        machines: &view,
        policy,
        halted: None,
        gates: &[],
        backups: Backups::default(),
        now: Timestamp::UNIX_EPOCH,
    };
    decide_with(&facts, &PolicyRules::batch())
}

/// Whether a backup taken at `last` is no older than `max_age` at `now`.
pub fn fresh(last: Option<Timestamp>, max_age: Duration, now: Timestamp) -> bool {
    let Some(last) = last else { return false };
    let Ok(max_age) = SignedDuration::try_from(max_age) else {
        return true;
    };
    now.duration_since(last) <= max_age
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    fn cp(name: &str) -> RolloutMachine {
        RolloutMachine::new(name, Role::ControlPlane)
    }

    fn worker(name: &str) -> RolloutMachine {
        RolloutMachine::new(name, Role::Worker)
    }

    fn facts<'a>(machines: &'a [RolloutMachine], policy: &'a Policy) -> Facts<'a> {
        Facts {
            machines,
            policy,
            halted: None,
            gates: &[],
            backups: Backups::default(),
            now: at("2026-12-07T12:00:00Z"),
        }
    }

    #[test]
    fn control_planes_go_one_at_a_time_before_any_worker() {
        let machines = [
            worker("w-1").with_change(Change::Disruptive),
            cp("cp-2").with_change(Change::Disruptive),
            cp("cp-1").with_change(Change::Disruptive),
        ];
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(5),
            ..Policy::default()
        };
        assert_eq!(decide(&facts(&machines, &policy)).starts(), ["cp-1"]);
        let machines = [
            worker("w-1").with_change(Change::Disruptive),
            cp("cp-2").with_change(Change::Disruptive),
            cp("cp-1").in_flight(),
        ];
        assert_eq!(
            decide(&facts(&machines, &policy)),
            Decision::InFlight {
                in_flight: vec!["cp-1".into()]
            }
        );
    }

    #[test]
    fn workers_go_up_to_max_unavailable_counting_those_down_for_any_reason() {
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(2),
            ..Policy::default()
        };
        let machines = [
            cp("cp-1"),
            worker("w-1").with_change(Change::Disruptive),
            worker("w-2").with_change(Change::Disruptive),
            worker("w-3").with_change(Change::Disruptive),
        ];
        assert_eq!(decide(&facts(&machines, &policy)).starts(), ["w-1", "w-2"]);
        let machines = [
            cp("cp-1"),
            worker("w-0").unhealthy(),
            worker("w-1").with_change(Change::Disruptive),
            worker("w-2").with_change(Change::Disruptive),
        ];
        assert_eq!(decide(&facts(&machines, &policy)).starts(), ["w-1"]);
        // An unhealthy machine may take its own change (it may be the fix) without counting
        // twice.
        let one = Policy::default();
        let machines = [
            cp("cp-1"),
            worker("w-1").with_change(Change::Disruptive).unhealthy(),
            worker("w-2").with_change(Change::Disruptive),
        ];
        assert_eq!(decide(&facts(&machines, &one)).starts(), ["w-1"]);
    }

    #[test]
    fn a_percentage_is_of_the_workers_rounded_down_and_at_least_one() {
        assert_eq!(MaxUnavailable::Percent(25).of(8), 2);
        assert_eq!(MaxUnavailable::Percent(25).of(3), 1);
        assert_eq!(MaxUnavailable::Percent(100).of(4), 4);
        assert_eq!(MaxUnavailable::Count(0).of(4), 1);
    }

    #[test]
    fn two_workers_of_one_failure_domain_never_go_together() {
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(3),
            spread_failure_domains: true,
            ..Policy::default()
        };
        let machines = [
            cp("cp-1"),
            worker("w-1").with_change(Change::Disruptive).in_domain("a"),
            worker("w-2").with_change(Change::Disruptive).in_domain("a"),
            worker("w-3").with_change(Change::Disruptive).in_domain("b"),
            worker("w-4").in_domain("c").in_flight(),
            worker("w-5").with_change(Change::Disruptive).in_domain("c"),
        ];
        assert_eq!(decide(&facts(&machines, &policy)).starts(), ["w-1", "w-3"]);
    }

    #[test]
    fn a_worker_joins_a_batch_only_while_there_is_room_and_its_domain_is_free() {
        let policy = Policy {
            max_unavailable: MaxUnavailable::Count(2),
            spread_failure_domains: true,
            ..Policy::default()
        };
        let machines = [
            cp("cp-1"),
            worker("w-1").in_domain("a"),
            worker("w-2").in_domain("b"),
            worker("w-3").in_domain("a"),
            worker("w-4"),
        ];
        let members = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        assert_eq!(join(&machines, &[], "w-3", &policy).starts(), ["w-3"]);
        assert_eq!(
            join(&machines, &members(&["w-2"]), "w-1", &policy).starts(),
            ["w-1"]
        );
        // Full: two members, whatever their statuses say.
        let full = join(&machines, &members(&["w-1", "w-2"]), "w-4", &policy);
        assert_eq!(full.starts(), [] as [String; 0], "{full:?}");
        // Its domain has a member.
        let shared = join(&machines, &members(&["w-1"]), "w-3", &policy);
        assert!(shared.starts().is_empty(), "{shared:?}");
        // A worker down for another reason takes room too.
        let mut sick = machines.clone();
        sick[4] = worker("w-4").unhealthy();
        assert!(
            join(&sick, &members(&["w-2"]), "w-1", &policy)
                .starts()
                .is_empty()
        );
        // No worker beside a control plane down.
        let mut cp_down = machines.clone();
        cp_down[0] = cp("cp-1").unhealthy();
        assert!(join(&cp_down, &[], "w-1", &policy).starts().is_empty());
    }

    #[test]
    fn suspended_starts_nothing_and_names_what_is_in_flight() {
        let policy = Policy {
            suspended: true,
            ..Policy::default()
        };
        let machines = [
            cp("cp-1"),
            worker("w-1").in_flight(),
            worker("w-2").with_change(Change::Disruptive),
        ];
        assert_eq!(
            decide(&facts(&machines, &policy)),
            Decision::Suspended {
                in_flight: vec!["w-1".into()]
            }
        );
    }

    #[test]
    fn a_failing_gate_holds_and_says_what_it_saw() {
        let policy = Policy::default();
        let machines = [cp("cp-1"), worker("w-1").with_change(Change::Live)];
        let gates = [
            Gate {
                name: "ok".into(),
                failing: None,
            },
            Gate {
                name: "ceph".into(),
                failing: Some("HEALTH_WARN".into()),
            },
        ];
        let mut f = facts(&machines, &policy);
        f.gates = &gates;
        assert_eq!(
            decide(&f),
            Decision::GateFailing {
                gate: "ceph".into(),
                saw: "HEALTH_WARN".into()
            }
        );
    }

    #[test]
    fn a_control_plane_disruption_waits_for_a_fresh_backup_and_asks_for_one() {
        let policy = Policy {
            fresh_backup: Some(Duration::from_secs(3600)),
            ..Policy::default()
        };
        let machines = [cp("cp-1").with_change(Change::Disruptive), cp("cp-2")];
        let mut f = facts(&machines, &policy);
        f.backups = Backups {
            configured: true,
            last_success: Some(at("2026-12-07T10:00:00Z")),
            running: false,
        };
        assert_eq!(
            decide(&f),
            Decision::NeedsBackup {
                last_success: Some(at("2026-12-07T10:00:00Z")),
                request: true
            }
        );
        f.backups.running = true;
        assert!(matches!(
            decide(&f),
            Decision::NeedsBackup { request: false, .. }
        ));
        f.backups.last_success = Some(at("2026-12-07T11:30:00Z"));
        assert_eq!(decide(&f).starts(), ["cp-1"]);
        // A live change to a control plane, or a cluster without backups, needs none.
        let live = [cp("cp-1").with_change(Change::Live), cp("cp-2")];
        let mut f = facts(&live, &policy);
        f.backups.configured = true;
        assert_eq!(decide(&f).starts(), ["cp-1"]);
        let mut f = facts(&machines, &policy);
        f.backups.configured = false;
        assert_eq!(decide(&f).starts(), ["cp-1"]);
    }

    #[test]
    fn outside_every_window_only_live_changes_go_and_the_next_opening_is_told() {
        let nightly = Window::parse("0 22 * * *", Duration::from_secs(4 * 3600), "UTC").unwrap();
        let policy = Policy {
            windows: vec![nightly],
            max_unavailable: MaxUnavailable::Count(3),
            ..Policy::default()
        };
        let machines = [
            cp("cp-1"),
            worker("w-1").with_change(Change::Live),
            worker("w-2").with_change(Change::Disruptive),
            worker("w-3").with_change(Change::Live),
        ];
        let mut f = facts(&machines, &policy);
        assert_eq!(decide(&f).starts(), ["w-1"]);
        let reboots = [cp("cp-1"), worker("w-2").with_change(Change::Disruptive)];
        f.machines = &reboots;
        assert_eq!(
            decide(&f),
            Decision::OutsideWindow {
                opens: Some(at("2026-12-07T22:00:00Z"))
            }
        );
        f.now = at("2026-12-08T01:59:59Z");
        assert_eq!(decide(&f).starts(), ["w-2"]);
        f.now = at("2026-12-08T02:00:00Z");
        assert!(matches!(decide(&f), Decision::OutsideWindow { .. }));
    }

    #[test]
    fn a_window_across_a_daylight_saving_change_lasts_its_elapsed_duration() {
        // Europe/Berlin springs forward on 2026-03-29 at 02:00 CET to 03:00 CEST: a window
        // opening at 01:00 local (00:00 UTC) for three hours closes at 03:00 UTC, 05:00 local.
        let window =
            Window::parse("0 1 * * *", Duration::from_secs(3 * 3600), "Europe/Berlin").unwrap();
        assert_eq!(
            window.opens_after(at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-29T00:00:00Z"))
        );
        assert_eq!(
            window.closes_after(at("2026-03-29T02:59:00Z")),
            Some(at("2026-03-29T03:00:00Z"))
        );
        assert_eq!(window.closes_after(at("2026-03-29T03:00:00Z")), None);
        // The day after, 01:00 local is 23:00 UTC the day before.
        assert_eq!(
            window.opens_after(at("2026-03-29T12:00:00Z")),
            Some(at("2026-03-29T23:00:00Z"))
        );
        // And it falls back on 2026-10-25 at 03:00 CEST to 02:00 CET: 01:00 local is 23:00 UTC.
        assert_eq!(
            window.opens_after(at("2026-10-24T12:00:00Z")),
            Some(at("2026-10-24T23:00:00Z"))
        );
        assert_eq!(
            window.closes_after(at("2026-10-25T01:59:00Z")),
            Some(at("2026-10-25T02:00:00Z"))
        );
    }

    #[test]
    fn a_bad_window_names_its_field_and_what_is_allowed() {
        let bad = |s: &str, d: u64, z: &str| {
            Window::parse(s, Duration::from_secs(d), z)
                .unwrap_err()
                .to_string()
        };
        assert!(bad("61 * * * *", 3600, "UTC").starts_with("schedule \"61 * * * *\""));
        assert!(bad("0 1 * * *", 10, "UTC").starts_with("duration"));
        assert!(bad("0 1 * * *", 3600, "Mars/Olympus").starts_with("timeZone \"Mars/Olympus\""));
        // Five fields: a seconds or a year field is refused, not read as another schedule.
        for six in ["0 0 22 * * *", "0 22 * * * 2027"] {
            assert!(bad(six, 3600, "UTC").starts_with("schedule"), "{six}");
        }
        assert!(Window::parse("0 22 * * 1-5", Duration::from_secs(3600), "UTC").is_ok());
    }

    #[test]
    fn a_halt_stops_and_nothing_pending_is_settled() {
        let policy = Policy::default();
        let machines = [cp("cp-1").with_change(Change::Disruptive)];
        let mut f = facts(&machines, &policy);
        f.halted = Some("cp-1");
        assert_eq!(
            decide(&f),
            Decision::Halted {
                machine: "cp-1".into()
            }
        );
        let settled = [
            cp("cp-1"),
            worker("w-1").with_change(Change::Live).leaving(),
        ];
        assert_eq!(decide(&facts(&settled, &policy)), Decision::Settled);
    }
}
