//! Randomized, seeded, replayable sequences of rollouts under a policy: changes arriving (live
//! or disruptive) on every machine of a cluster of control planes and workers in failure
//! domains, maintenance windows opening and closing on an injected clock (across
//! daylight-saving changes too), suspends set and lifted, health gates flapping, backups ageing
//! and taken when the rollout asks, machines falling sick and healing, and the manager crashing
//! between sending a node its step and recording it. Every start is the policy's
//! (`ichor_deleteguard::rollout::decide_with`); the model keeps the truth.
//!
//! At every start the model checks, in closed form over the truth: a step the policy holds
//! starts only inside a window (computed here minute by minute, not by the schedule parser);
//! nothing starts while suspended or while a gate fails; at most `maxUnavailable` workers are
//! unavailable; a control plane starts alone, with every other machine available, and only
//! once no control plane is left before a worker; no two workers of one failure domain are
//! down together by a start; a control plane is disrupted only with a backup no older than the
//! policy's age, where the cluster backs up. After the random phase the suspends, gates and
//! sickness end and every rollout must settle.
//!
//! `every_policy_rule_is_caught_when_disabled` runs the seeds with one rule left out at a time
//! and expects a broken invariant for each. `workers_racing_to_join_a_batch_never_overfill_it`
//! races workers joining the batch that holds the cluster lock (`rollout::join`, ADR 0077)
//! through a version-guarded write, and its twin shows that without the guard they overfill it. A failure prints the seed and the trace;
//! `ICHOR_TEST_SEED=<n> cargo test -p ichor-deleteguard --test rollout_policy` replays one.

use std::time::Duration;

use ichor_api::common::Role;
use ichor_deleteguard::rollout::{
    Backups, Change, Decision, Facts, Gate, MaxUnavailable, Policy, PolicyRule, PolicyRules,
    RolloutMachine, Window, decide_with,
};
use ichor_testenv::rng::{self, TestRng as Rng};
use jiff::civil::Weekday;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};

/// Seeds run by default.
const SEEDS: u64 = 2000;
/// Random ticks per seed.
const RANDOM_TICKS: usize = 120;
/// Ticks after the random phase for every rollout to settle (an hour each).
const SETTLE_TICKS: usize = 400;
/// How old a backup may be before a control plane is disrupted, when the policy asks.
const BACKUP_AGE: Duration = Duration::from_secs(6 * 3600);

/// A maintenance window as the model knows it: at `hour:minute` local time, every day or on
/// one weekday, for `hours`. The times avoid the hours a daylight-saving change skips or
/// repeats in its zone, so a minute-by-minute scan and the schedule agree on when it opens.
#[derive(Clone, Debug)]
struct ModelWindow {
    zone: &'static str,
    hour: i8,
    minute: i8,
    weekday: Option<Weekday>,
    hours: i64,
}

impl ModelWindow {
    const CHOICES: [ModelWindow; 4] = [
        ModelWindow {
            zone: "Europe/Berlin",
            hour: 22,
            minute: 0,
            weekday: None,
            hours: 4,
        },
        ModelWindow {
            zone: "America/New_York",
            hour: 23,
            minute: 30,
            weekday: None,
            hours: 3,
        },
        ModelWindow {
            zone: "UTC",
            hour: 1,
            minute: 30,
            weekday: Some(Weekday::Saturday),
            hours: 6,
        },
        ModelWindow {
            zone: "Europe/Berlin",
            hour: 4,
            minute: 15,
            weekday: Some(Weekday::Tuesday),
            hours: 2,
        },
    ];

    fn schedule(&self) -> String {
        let day = match self.weekday {
            None => "*".to_owned(),
            Some(day) => day.to_sunday_zero_offset().to_string(),
        };
        format!("{} {} * * {day}", self.minute, self.hour)
    }

    fn window(&self) -> Window {
        let hours = u64::try_from(self.hours).expect("positive");
        Window::parse(
            &self.schedule(),
            Duration::from_secs(hours * 3600),
            self.zone,
        )
        .expect("the model's windows parse")
    }

    /// Whether it is open at `now` (minute-aligned), by scanning the minutes before it.
    fn open(&self, now: Timestamp) -> bool {
        let zone = TimeZone::get(self.zone).expect("zone");
        (0..self.hours * 60).any(|back| {
            let Ok(then) = now.checked_sub(SignedDuration::from_mins(back)) else {
                return false;
            };
            let local = then.to_zoned(zone.clone());
            local.hour() == self.hour
                && local.minute() == self.minute
                && self.weekday.is_none_or(|d| local.weekday() == d)
        })
    }
}

/// One machine, in truth.
#[derive(Clone, Debug)]
struct Node {
    name: String,
    role: Role,
    domain: Option<String>,
    /// The change still to roll out to it.
    change: Option<Change>,
    /// Its step runs: ticks until it ends (0: not in flight).
    busy: usize,
    /// The manager recorded the step it sent (a crash can lose that record).
    recorded: bool,
    /// Healthy (a fault makes it sick).
    healthy: bool,
}

impl Node {
    fn unavailable(&self) -> bool {
        self.busy > 0 || !self.healthy
    }
}

struct World {
    rng: Rng,
    nodes: Vec<Node>,
    windows: Vec<ModelWindow>,
    policy: Policy,
    gates: Vec<Gate>,
    backups: Backups,
    /// Ticks until the backup being taken is done.
    backup_busy: usize,
    now: Timestamp,
    tick: usize,
    rules: PolicyRules,
    trace: Vec<String>,
}

impl World {
    fn new(seed: u64, rules: PolicyRules) -> Self {
        let mut rng = Rng::new(seed);
        let workers = 2 + rng.below(7);
        let mut nodes = Vec::new();
        for i in 1..=3 {
            nodes.push(Node {
                name: format!("cp-{i}"),
                role: Role::ControlPlane,
                domain: None,
                change: None,
                busy: 0,
                recorded: false,
                healthy: true,
            });
        }
        let domains = 1 + rng.below(3);
        for i in 1..=workers {
            nodes.push(Node {
                name: format!("w-{i}"),
                role: Role::Worker,
                domain: Some(format!("zone-{}", rng.below(domains))),
                change: None,
                busy: 0,
                recorded: false,
                healthy: true,
            });
        }
        let mut windows = Vec::new();
        if rng.chance(3, 4) {
            // One daily window at least, so a rollout gets through within days.
            windows.push(ModelWindow::CHOICES[rng.below(2)].clone());
            if rng.chance(1, 2) {
                windows.push(ModelWindow::CHOICES[2 + rng.below(2)].clone());
            }
        }
        let policy = Policy {
            windows: windows.iter().map(ModelWindow::window).collect(),
            hold_live_changes: rng.chance(1, 3),
            suspended: false,
            max_unavailable: if rng.chance(1, 2) {
                MaxUnavailable::Count(1 + u32::try_from(rng.below(3)).unwrap_or(0))
            } else {
                MaxUnavailable::Percent([25, 50][rng.below(2)])
            },
            spread_failure_domains: rng.chance(1, 2),
            fresh_backup: rng.chance(2, 3).then_some(BACKUP_AGE),
        };
        let gates = (0..rng.below(3))
            .map(|i| Gate {
                name: format!("gate-{i}"),
                failing: None,
            })
            .collect();
        // Spring and autumn weeks of 2026 (daylight-saving changes in Europe and America),
        // and a week without, each minute-aligned.
        let starts = [
            "2026-03-06T09:00:00Z",
            "2026-03-26T09:00:00Z",
            "2026-10-22T17:00:00Z",
            "2026-10-30T13:00:00Z",
            "2026-07-01T06:00:00Z",
        ];
        let now: Timestamp = starts[rng.below(starts.len())].parse().expect("a time");
        let backups = Backups {
            configured: rng.chance(3, 4),
            last_success: rng.chance(1, 2).then(|| {
                now.checked_sub(SignedDuration::from_hours(12))
                    .expect("time")
            }),
            running: false,
        };
        Self {
            rng,
            nodes,
            windows,
            policy,
            gates,
            backups,
            backup_busy: 0,
            now,
            tick: 0,
            rules,
            trace: Vec::new(),
        }
    }

    fn log(&mut self, entry: String) {
        self.trace
            .push(format!("t{} {}: {entry}", self.tick, self.now));
    }

    /// The machines as the manager records them.
    fn observed(&self) -> Vec<RolloutMachine> {
        self.nodes
            .iter()
            .map(|n| RolloutMachine {
                name: n.name.clone(),
                role: n.role,
                change: n.change,
                in_flight: n.busy > 0 && n.recorded,
                healthy: n.healthy && n.busy == 0,
                leaving: false,
                failure_domain: n.domain.clone(),
            })
            .collect()
    }

    /// The world moves on: time, steps ending, faults, the team's knobs.
    fn world_tick(&mut self, random: bool) {
        self.tick += 1;
        let minutes = if random {
            [10, 20, 30, 60, 90][self.rng.below(5)]
        } else {
            60
        };
        self.now = self
            .now
            .checked_add(SignedDuration::from_mins(minutes))
            .expect("time");
        for i in 0..self.nodes.len() {
            if self.nodes[i].busy > 0 {
                self.nodes[i].busy -= 1;
                if self.nodes[i].busy == 0 {
                    self.nodes[i].recorded = false;
                    let name = self.nodes[i].name.clone();
                    self.log(format!("{name} done"));
                }
            }
        }
        if self.backup_busy > 0 {
            self.backup_busy -= 1;
            if self.backup_busy == 0 {
                self.backups.running = false;
                self.backups.last_success = Some(self.now);
                self.log("backup taken".into());
            }
        }
        if !random {
            return;
        }
        match self.rng.below(12) {
            0 | 1 => {
                // A change reaches every machine: a version (disruptive) or a patch (either).
                let disruptive = self.rng.chance(1, 2);
                for i in 0..self.nodes.len() {
                    let change = if disruptive || self.rng.chance(1, 3) {
                        Change::Disruptive
                    } else {
                        Change::Live
                    };
                    let node = &mut self.nodes[i];
                    node.change = match (node.change, change) {
                        (Some(Change::Disruptive), _) => Some(Change::Disruptive),
                        (_, c) => Some(c),
                    };
                }
                self.log(format!("a change (disruptive: {disruptive})"));
            }
            2 => {
                self.policy.suspended = !self.policy.suspended;
                let suspended = self.policy.suspended;
                self.log(format!("suspended: {suspended}"));
            }
            3 if !self.gates.is_empty() => {
                let i = self.rng.below(self.gates.len());
                let gate = &mut self.gates[i];
                gate.failing = match gate.failing {
                    Some(_) => None,
                    None => Some("0/3 replicas available".into()),
                };
                let entry = format!("{} failing: {:?}", gate.name, gate.failing);
                self.log(entry);
            }
            4 => {
                let i = self.rng.below(self.nodes.len());
                self.nodes[i].healthy = !self.nodes[i].healthy;
                let entry = format!("{} healthy: {}", self.nodes[i].name, self.nodes[i].healthy);
                self.log(entry);
            }
            _ => {}
        }
    }

    /// The manager decides and starts what the policy lets start; a crash may lose the record
    /// of a step it sent.
    fn manager_tick(&mut self, crashes: bool) -> Result<Decision, String> {
        let observed = self.observed();
        let facts = Facts {
            machines: &observed,
            policy: &self.policy,
            halted: None,
            gates: &self.gates,
            backups: self.backups,
            now: self.now,
        };
        let decision = decide_with(&facts, &self.rules);
        match &decision {
            Decision::NeedsBackup { request: true, .. } if self.backup_busy == 0 => {
                self.backups.running = true;
                self.backup_busy = 1 + self.rng.below(2);
                self.log("backup asked for".into());
            }
            Decision::Start { machines, .. } => {
                self.check_start(machines)?;
                let crash_at =
                    (crashes && self.rng.chance(1, 10)).then(|| self.rng.below(machines.len()));
                for (k, name) in machines.iter().enumerate() {
                    let i = self
                        .nodes
                        .iter()
                        .position(|n| &n.name == name)
                        .ok_or(format!("unknown machine {name}"))?;
                    let node = &mut self.nodes[i];
                    node.change = None;
                    node.busy = 1 + self.rng.below(4);
                    node.recorded = crash_at.is_none_or(|c| k < c);
                }
                let lost = crash_at.map(|c| {
                    format!(
                        " (the manager crashed before recording {})",
                        machines[c..].join(", ")
                    )
                });
                self.log(format!(
                    "start {}{}",
                    machines.join(", "),
                    lost.unwrap_or_default()
                ));
                if crash_at.is_some() {
                    // A crash: those not recorded are seen down (not Ready) with no step.
                    for name in machines {
                        if let Some(node) = self
                            .nodes
                            .iter_mut()
                            .find(|n| &n.name == name && !n.recorded)
                        {
                            node.change = Some(Change::Disruptive);
                        }
                    }
                }
            }
            _ => {}
        }
        Ok(decision)
    }

    /// The invariants, in closed form over the truth, at a start of `batch`.
    fn check_start(&self, batch: &[String]) -> Result<(), String> {
        let started: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| batch.contains(&n.name))
            .collect();
        if self.policy.suspended {
            return Err(format!("{batch:?} started while suspended"));
        }
        if let Some(gate) = self.gates.iter().find(|g| g.failing.is_some()) {
            return Err(format!("{batch:?} started while {} fails", gate.name));
        }
        let open = self.windows.is_empty() || self.windows.iter().any(|w| w.open(self.now));
        if !open
            && let Some(held) = started.iter().find(|n| {
                n.change == Some(Change::Disruptive)
                    || (n.change == Some(Change::Live) && self.policy.hold_live_changes)
            })
        {
            return Err(format!("{} started outside every window", held.name));
        }
        let control_planes = started
            .iter()
            .filter(|n| n.role == Role::ControlPlane)
            .count();
        if control_planes > 0 {
            if batch.len() > 1 {
                return Err(format!("a control plane started with others: {batch:?}"));
            }
            if let Some(other) = self
                .nodes
                .iter()
                .find(|n| n.unavailable() && !batch.contains(&n.name))
            {
                return Err(format!(
                    "{batch:?} started while {} is unavailable",
                    other.name
                ));
            }
            let disruptive = started.iter().any(|n| n.change == Some(Change::Disruptive));
            if disruptive
                && self.backups.configured
                && self.policy.fresh_backup.is_some()
                && !self.backups.last_success.is_some_and(|t| {
                    self.now.duration_since(t) <= SignedDuration::try_from(BACKUP_AGE).expect("age")
                })
            {
                return Err(format!(
                    "{batch:?} disrupted with the last backup at {:?}",
                    self.backups.last_success
                ));
            }
        } else {
            if let Some(cp) = self
                .nodes
                .iter()
                .find(|n| n.role == Role::ControlPlane && (n.change.is_some() || n.unavailable()))
            {
                return Err(format!(
                    "workers {batch:?} started before {} was done and available",
                    cp.name
                ));
            }
            let workers: Vec<&Node> = self
                .nodes
                .iter()
                .filter(|n| n.role == Role::Worker)
                .collect();
            let down: Vec<&Node> = workers
                .iter()
                .copied()
                .filter(|n| n.unavailable() || batch.contains(&n.name))
                .collect();
            let most = self.policy.max_unavailable.of(workers.len());
            if down.len() > most {
                return Err(format!(
                    "{} workers unavailable with {batch:?} started; at most {most}",
                    down.len()
                ));
            }
            if self.policy.spread_failure_domains {
                for n in started.iter().filter(|n| !n.unavailable()) {
                    if let Some(other) = down
                        .iter()
                        .find(|o| o.name != n.name && o.domain.is_some() && o.domain == n.domain)
                    {
                        return Err(format!(
                            "{} started while {} of its domain is down",
                            n.name, other.name
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// One seed: the random phase, then every rollout must settle. `Err` says which invariant
/// broke, with the trace.
fn scenario(seed: u64, rules: PolicyRules) -> Result<(), String> {
    let mut world = World::new(seed, rules);
    let fail = |world: &World, error: String| {
        Err(format!("seed {seed}: {error}\n{}", world.trace.join("\n")))
    };
    for _ in 0..RANDOM_TICKS {
        world.world_tick(true);
        if let Err(error) = world.manager_tick(true) {
            return fail(&world, error);
        }
    }
    world.policy.suspended = false;
    for gate in &mut world.gates {
        gate.failing = None;
    }
    for node in &mut world.nodes {
        node.healthy = true;
    }
    world.log("settling".into());
    for _ in 0..SETTLE_TICKS {
        world.world_tick(false);
        match world.manager_tick(false) {
            Err(error) => return fail(&world, error),
            Ok(Decision::Settled) => return Ok(()),
            Ok(_) => {}
        }
    }
    fail(&world, format!("not settled after {SETTLE_TICKS} hours"))
}

#[test]
fn rollouts_keep_the_policy_and_settle() {
    for seed in rng::seeds(SEEDS) {
        if let Err(error) = scenario(seed, PolicyRules::all()) {
            panic!("{error}\nreplay: {}={seed}", rng::SEED_ENV);
        }
    }
}

#[test]
fn every_policy_rule_is_caught_when_disabled() {
    let mut caught = Vec::new();
    for rule in PolicyRule::ALL {
        let rules = PolicyRules::all().without(rule);
        let found = (0..SEEDS).find_map(|seed| {
            scenario(seed, rules.clone())
                .err()
                .map(|error| (seed, error.lines().next().unwrap_or_default().to_owned()))
        });
        match found {
            Some((_, error)) => caught.push(format!("{rule:?}: {error}")),
            None => panic!(
                "with {rule:?} disabled, {SEEDS} seeds broke no invariant: the rule is not \
                 needed, or the model does not reach what it protects"
            ),
        }
    }
    for line in &caught {
        println!("{line}");
    }
    assert_eq!(caught.len(), PolicyRule::ALL.len());
}

#[test]
fn the_model_windows_agree_with_their_schedules() {
    // Every minute of a week across Berlin's autumn change, and one across New York's spring.
    for (start, days) in [("2026-10-21T00:00:00Z", 7), ("2026-03-05T00:00:00Z", 7)] {
        let mut now: Timestamp = start.parse().expect("time");
        for _ in 0..days * 24 * 60 / 7 {
            for model in &ModelWindow::CHOICES {
                let window = model.window();
                assert_eq!(
                    model.open(now),
                    window.closes_after(now).is_some(),
                    "{} at {now}",
                    model.schedule()
                );
            }
            now = now.checked_add(SignedDuration::from_mins(7)).expect("time");
        }
    }
}

/// Workers racing to join the batch that holds the cluster lock (ADR 0077): each reads the
/// Lease's members, asks `rollout::join` over what it read, and writes the members with itself
/// added; with `guarded`, a write succeeds only over the version it read (the apiserver's
/// `resourceVersion`), else the last write wins over whatever came between. Returns the first
/// moment the batch broke the policy: more workers unavailable than `maxUnavailable` allows
/// where the room was not already taken by sick ones, or two of one failure domain joined.
fn race(seed: u64, guarded: bool) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let workers = 3 + rng.below(8);
    let mut machines = vec![RolloutMachine::new("cp-1", Role::ControlPlane)];
    for i in 0..workers {
        let mut worker = RolloutMachine::new(format!("w-{i:02}"), Role::Worker);
        if rng.chance(2, 3) {
            worker = worker.in_domain(["a", "b", "c"][rng.below(3)]);
        }
        if rng.chance(1, 8) {
            worker = worker.unhealthy();
        }
        machines.push(worker);
    }
    let policy = Policy {
        max_unavailable: MaxUnavailable::Count(1 + u32::try_from(rng.below(4)).unwrap_or(0)),
        spread_failure_domains: rng.chance(1, 2),
        ..Policy::default()
    };
    let most = policy.max_unavailable.of(workers);
    let sick = machines.iter().filter(|m| !m.healthy).count();
    // The Lease: its members and its version.
    let (mut members, mut version) = (Vec::<String>::new(), 0_u64);
    for _round in 0..workers * 2 {
        // Every worker not in the batch reads the Lease, then they write in a random order.
        let mut readers: Vec<(String, Vec<String>, u64)> = machines
            .iter()
            .filter(|m| m.role == Role::Worker && !members.contains(&m.name))
            .map(|m| (m.name.clone(), members.clone(), version))
            .collect();
        while !readers.is_empty() {
            let (me, read, at) = readers.swap_remove(rng.below(readers.len()));
            if !ichor_deleteguard::rollout::join(&machines, &read, &me, &policy)
                .starts()
                .contains(&me)
            {
                continue;
            }
            if guarded && at != version {
                continue;
            }
            let mut written = if guarded { read } else { members.clone() };
            written.push(me.clone());
            members = written;
            version += 1;
            // A sick worker may join (its step may be its fix): it is counted once.
            let down = machines
                .iter()
                .filter(|m| !m.healthy || members.contains(&m.name))
                .count();
            if down > most.max(sick) {
                return Err(format!(
                    "seed {seed}: {me} joined; {down} workers down with {sick} sick, against {most}: {members:?}"
                ));
            }
            // A healthy worker that joins takes a node down: none other of its domain is.
            let joined = machines.iter().find(|m| m.name == me).expect("a worker");
            let shares = machines.iter().any(|m| {
                m.name != me
                    && (!m.healthy || members.contains(&m.name))
                    && m.failure_domain.is_some()
                    && m.failure_domain == joined.failure_domain
            });
            if policy.spread_failure_domains && joined.healthy && shares {
                return Err(format!(
                    "seed {seed}: {me} joined while another of domain {:?} is down: {members:?}",
                    joined.failure_domain
                ));
            }
        }
        // A member ends its step now and then.
        if !members.is_empty() && rng.chance(1, 2) {
            members.remove(rng.below(members.len()));
            version += 1;
        }
    }
    Ok(())
}

#[test]
fn workers_racing_to_join_a_batch_never_overfill_it() {
    for seed in rng::seeds(SEEDS) {
        if let Err(error) = race(seed, true) {
            panic!("{error}\nreplay: {}={seed}", rng::SEED_ENV);
        }
    }
}

#[test]
fn without_the_version_guard_racing_workers_overfill_a_batch() {
    assert!(
        rng::seeds(SEEDS)
            .into_iter()
            .any(|seed| race(seed, false).is_err()),
        "the race test would not notice a join written over another"
    );
}
