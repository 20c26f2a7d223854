//! Randomized, seeded, replayable sequences on a model of one cluster: machines approved,
//! configured and joining etcd, deletes admitted (with or without the allow-delete annotation),
//! removals stepping under the cluster lock, TalosOperations (`reset`, `reboot`, `upgrade`) on
//! one machine, the control planes or every machine, admitted at the door and run one node at a
//! time, config drift that needs a reboot rolled out in the planner's order (taken by each
//! node, or refused by one, which halts the rollout until the patch changes), etcd members
//! falling sick and healing, the manager's observations of them recorded or not (an observer
//! outage lets them go stale), the declared count changed, the manager crashing (between
//! sending an action to a node and recording it, too), and finally the cluster torn down.
//!
//! Every decision is the planner's (`ichor_deleteguard::plan`): `check_machine_delete_with` and
//! `check_targets_with` at admission, `check_with` in the controller (when a removal, an
//! operation's node or a reboot for drift starts, and right before the step that takes a voter
//! out or down of one already started), with `next_removal_step` (a reset walks the removal's
//! steps, the machine staying), `is_once_only`, `lock_decision`, `transitioning`,
//! `removal_completes_transition`, `drift_turn`, `halt_stands` and `teardown_next`. The planner
//! sees only the recorded observations; the model keeps the truth. A restarted actor looks for
//! the effect of what it may have sent (out of etcd, in maintenance, booted again, running the
//! new version or config) before sending it again.
//!
//! After every step the model checks, in closed form over the truth: etcd keeps quorum of its
//! voters and at least one voter; a control plane leaves etcd only while the voters staying keep
//! quorum of the voters before, and with the allow-delete annotation (on the machine, or on the
//! operation for a reset); no healthy control plane is disrupted while another voter is not
//! serving; a removal or a reset of a voter starts only with the declared count of healthy
//! voters staying; every disruptive step is taken by the action holding the cluster lock, and
//! one action at most believes it holds it; no once-only step (etcd leave, reset, an
//! operation's reboot or upgrade of a node, a reboot for drift) runs twice; one voter at most is
//! down; a config a node refused never takes effect there, no machine takes a config while
//! the refusal stands, control planes take theirs before workers, and a halted rollout holds
//! no lock.
//!
//! Each rule of the planner's table is needed: `every_rule_is_caught_when_disabled` runs the
//! seeds with one rule left out at a time and expects a broken invariant for each, and
//! `every_rule_is_caught_by_operations_and_drift_alone` does it again with no deletes by people.
//!
//! A failure prints the seed and the action trace; `ICHOR_TEST_SEED=<n> cargo test -p
//! ichor-deleteguard --test sequences` replays one seed.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ichor_api::common::Role;
use ichor_api::machine::RemovalStep;
use ichor_deleteguard::{
    Cluster, Disruption, DriftHalt, DriftMachine, DriftTurn, LockDecision, LockView, Machine,
    Observation, Rule, RuleSet, Stage, Verdict, approved_control_planes, check_machine_delete_with,
    check_targets_with, check_with, drift_turn, etcd_quorum, halt_stands, is_once_only,
    lock_decision, next_removal_step, reasons, removal_completes_transition, teardown_next,
    transitioning,
};
use ichor_testenv::rng::{self, SEED_ENV, TestRng as Rng};

/// Seeds run by default.
const SEEDS: u64 = 2000;
/// Random actions per seed.
const RANDOM_TICKS: usize = 150;
/// Controller-only ticks after the random phase, before liveness is judged.
const SETTLE_TICKS: usize = 200;
/// Ticks a teardown gets to remove every machine.
const TEARDOWN_TICKS: usize = 300;
/// Machines the random phase grows the cluster to at most.
const MAX_MACHINES: usize = 12;
/// How many ticks an observation counts as healthy.
const MAX_AGE: i64 = 4;
/// Seeds the mutation test tries per rule before it gives up.
const MUTATION_SEEDS: u64 = 2000;

/// Appends to the trace of `$world` when it is tracing; the arguments are not evaluated
/// otherwise (the seeds run untraced, and a failing one is replayed traced).
macro_rules! log {
    ($world:expr, $($arg:tt)*) => {
        if $world.tracing {
            let entry = format!("t{}: {}", $world.tick, format_args!($($arg)*));
            $world.trace.push(entry);
        }
    };
}

/// One TalosMachine and the node behind it.
#[derive(Clone, Debug, PartialEq)]
struct Node {
    name: String,
    role: Role,
    /// A config was applied (`status.appliedConfigHash`).
    applied: bool,
    /// Deletion admitted (`deletionTimestamp`, with the allow-delete annotation).
    deleting: bool,
    /// An etcd voter.
    voter: bool,
    /// Configured as control plane, joining etcd at the next tick it is up.
    joining: bool,
    /// Rebooting: ticks until it is up again (0: up).
    down: usize,
    /// How many times it booted (the truth; a restarted actor compares it with its record).
    boots: u32,
    /// The Talos version it runs.
    version: u32,
    /// The config it runs (0: none, or the one before any patch; patches count from 1).
    config: u32,
    /// The config its objects render now.
    rendered: u32,
    /// The config recorded as applied (`status.appliedConfigHash`).
    applied_config: u32,
    /// A reboot for drift in flight (`status.driftReboot`): the config it reboots into.
    drift_reboot: Option<u32>,
    /// The last reason its drift was held.
    drift_held: Option<String>,
    /// Its etcd member is healthy (the truth; a fault makes it sick).
    healthy: bool,
    /// The manager's last recorded observation of its etcd member.
    record: Option<Observation>,
    /// Deleted with the allow-delete annotation.
    allow_delete: bool,
    /// Reset to maintenance.
    maintenance: bool,
    /// The removal step recorded in status.
    recorded: RemovalStep,
    /// The last reason its removal was held, cleared when it moves.
    held: Option<String>,
}

impl Node {
    fn removal_id(&self) -> String {
        format!("removal/{}", self.name)
    }

    fn is_control_plane(&self) -> bool {
        self.role == Role::ControlPlane
    }

    fn drift_id(&self) -> String {
        format!("drift/{}", self.name)
    }

    /// A voter that is up and healthy, in truth.
    fn serving(&self) -> bool {
        self.voter && self.healthy && self.down == 0
    }

    /// Up, and healthy for its role: what an action waits for after taking it down.
    fn back(&self) -> bool {
        self.down == 0 && (self.serving() || !self.voter)
    }
}

/// What a TalosOperation does to each of its nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpKind {
    /// Out of etcd for good, back to maintenance (the machine stays).
    Reset,
    /// Down and back.
    Reboot,
    /// Down and back on a new version.
    Upgrade,
}

/// How far an operation got on its current node, as recorded in its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpStep {
    /// Nothing done on it.
    Pending,
    /// A restart's intent, recorded before sending: the node's boot count then.
    Intent { boots: u32 },
    /// A restart sent: waiting for the node to be back and healthy.
    Sent,
    /// A reset, through the removal's steps: the last one done.
    Removal(RemovalStep),
}

/// A TalosOperation: one node at a time under the cluster lock, each back and healthy (or, for
/// a reset, in maintenance) before the next.
#[derive(Clone, Debug, PartialEq)]
struct Operation {
    id: String,
    kind: OpKind,
    /// The allow-delete annotation, on the operation.
    allow_delete: bool,
    /// Machines, by name, control planes first.
    targets: Vec<String>,
    /// Recorded: the current target.
    index: usize,
    /// Recorded: how far the current target got.
    step: OpStep,
    /// The version an upgrade installs.
    version: u32,
    /// The last reason it was held.
    held: Option<String>,
}

impl Operation {
    /// What it does to a node, for the planner.
    fn disruption(&self) -> Disruption {
        match self.kind {
            OpKind::Reset => Disruption::Reset {
                operation: self.id.trim_start_matches("operation/").to_owned(),
                allow_delete: self.allow_delete,
            },
            OpKind::Reboot | OpKind::Upgrade => Disruption::Restart,
        }
    }
}

/// An action the controller reconciles.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    /// The removal of a machine being deleted.
    Removal(String),
    /// The operation.
    Operation,
    /// The reboot for drift of a machine.
    Drift(String),
}

/// Totals over all seeds, so the test can show it reached the interesting cases.
#[derive(Clone, Debug, Default)]
struct Coverage {
    removals_completed: usize,
    control_planes_removed: usize,
    operations_completed: usize,
    operations_failed: usize,
    reboots: usize,
    upgrades: usize,
    control_plane_resets: usize,
    drift_reboots: usize,
    drifts_refused: usize,
    /// Restarts sent while another node (a worker: a voter down holds them) was still down
    /// from an action whose lock expired after a crash.
    restarted_while_another_down: usize,
    crashes: usize,
    crashes_before_record: usize,
    once_only_found_done: usize,
    /// Once-only steps a restarted actor found done instead of repeating, by step and actor.
    found_done: BTreeMap<String, usize>,
    held: BTreeMap<String, usize>,
    refused_deletes: BTreeMap<&'static str, usize>,
    refused_operations: BTreeMap<&'static str, usize>,
    declared_changes: usize,
    sickened: usize,
    stale_outages: usize,
}

impl Coverage {
    fn add(&mut self, other: &Self) {
        self.removals_completed += other.removals_completed;
        self.control_planes_removed += other.control_planes_removed;
        self.operations_completed += other.operations_completed;
        self.operations_failed += other.operations_failed;
        self.reboots += other.reboots;
        self.upgrades += other.upgrades;
        self.control_plane_resets += other.control_plane_resets;
        self.drift_reboots += other.drift_reboots;
        self.drifts_refused += other.drifts_refused;
        self.restarted_while_another_down += other.restarted_while_another_down;
        self.crashes += other.crashes;
        self.crashes_before_record += other.crashes_before_record;
        self.once_only_found_done += other.once_only_found_done;
        for (what, n) in &other.found_done {
            *self.found_done.entry(what.clone()).or_default() += n;
        }
        for (reason, n) in &other.held {
            *self.held.entry(reason.clone()).or_default() += n;
        }
        for (reason, n) in &other.refused_deletes {
            *self.refused_deletes.entry(reason).or_default() += n;
        }
        for (reason, n) in &other.refused_operations {
            *self.refused_operations.entry(reason).or_default() += n;
        }
        self.declared_changes += other.declared_changes;
        self.sickened += other.sickened;
        self.stale_outages += other.stale_outages;
    }
}

/// The model of one cluster.
struct World {
    nodes: Vec<Node>,
    declared: usize,
    /// The rules the planner applies (all of them, but in the mutation test).
    rules: RuleSet,
    /// People delete machines in the random phase (off: operations and drift alone disrupt
    /// until the teardown).
    deletes: bool,
    /// The manager observes every configured control plane each tick.
    observer_up: bool,
    /// The TalosCluster is being deleted.
    teardown: bool,
    /// The machine the cluster's endpoint names by its address (a machine's address is its
    /// name here), if one does: `None` is a shared VIP or a load balancer.
    endpoint: Option<String>,
    lock: Option<LockView>,
    /// Actions whose in-memory state says they hold the lock (lost on a crash).
    holders: BTreeSet<String>,
    op: Option<Operation>,
    /// Once-only steps performed, by action, machine and step.
    once_only: BTreeMap<(String, String, &'static str), usize>,
    /// The first once-only step performed twice.
    twice: Option<String>,
    /// Control planes whose etcd leave was skipped as the last member of a teardown.
    leaves_skipped: Vec<String>,
    /// Control planes that performed their etcd leave.
    leaves: Vec<String>,
    next_name: usize,
    next_op: usize,
    next_patch: u32,
    tick: usize,
    /// Configs a node refuses, by machine: the truth, learnt by trying.
    refusals: BTreeSet<(String, u32)>,
    /// The drift halt recorded on the cluster (`status.driftHalt`).
    drift_halt: Option<DriftHalt>,
    /// The last refusal, by machine and config (the truth kept for the invariants).
    halted: Option<(String, u32)>,
    /// Whether `trace` is kept.
    tracing: bool,
    trace: Vec<String>,
    coverage: Coverage,
}

impl World {
    /// `control_planes` configured voters and `workers` configured workers, declaring `declared`.
    fn new(control_planes: usize, workers: usize, declared: usize) -> Self {
        let mut world = Self {
            nodes: Vec::new(),
            declared,
            rules: RuleSet::ALL,
            deletes: true,
            observer_up: true,
            teardown: false,
            endpoint: None,
            lock: None,
            holders: BTreeSet::new(),
            op: None,
            once_only: BTreeMap::new(),
            twice: None,
            leaves_skipped: Vec::new(),
            leaves: Vec::new(),
            next_name: 0,
            next_op: 0,
            next_patch: 0,
            tick: 0,
            refusals: BTreeSet::new(),
            drift_halt: None,
            halted: None,
            tracing: false,
            trace: Vec::new(),
            coverage: Coverage::default(),
        };
        for _ in 0..control_planes {
            let mut n = world.approve(Role::ControlPlane);
            n.applied = true;
            n.voter = true;
            n.record = Some(Observation::healthy_voter(0));
            world.nodes.push(n);
        }
        for _ in 0..workers {
            let mut n = world.approve(Role::Worker);
            n.applied = true;
            world.nodes.push(n);
        }
        world
    }

    /// Where a random scenario starts: one control plane declaring one, or three declaring
    /// three (most seeds), and up to three workers.
    fn start(rng: &mut Rng) -> Self {
        let control_planes = if rng.chance(1, 4) { 1 } else { 3 };
        Self::new(control_planes, rng.below(4), control_planes)
    }

    /// The same world, whose endpoint is its first control plane's address for odd seeds (a VIP
    /// for even ones). Decided by the seed, so the random draws stay those of the seed.
    fn endpoint_for(mut self, seed: u64) -> Self {
        if seed % 2 == 1 {
            self.endpoint = Some("cp-1".to_owned());
        }
        self
    }

    /// A newly approved machine, not configured yet.
    fn approve(&mut self, role: Role) -> Node {
        self.next_name += 1;
        let prefix = match role {
            Role::ControlPlane => "cp",
            Role::Worker => "w",
        };
        Node {
            name: format!("{prefix}-{}", self.next_name),
            role,
            applied: false,
            deleting: false,
            voter: false,
            joining: false,
            down: 0,
            boots: 0,
            version: 0,
            config: 0,
            rendered: 0,
            applied_config: 0,
            drift_reboot: None,
            drift_held: None,
            healthy: true,
            record: None,
            allow_delete: false,
            maintenance: false,
            recorded: RemovalStep::Pending,
            held: None,
        }
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    // ---- What the rules see -------------------------------------------------------------

    fn machine(node: &Node) -> Machine {
        let m = Machine::new(node.name.clone()).approved();
        let mut m = match node.role {
            Role::ControlPlane => m.control_plane(),
            Role::Worker => m.worker(),
        };
        m.applied = node.applied;
        m.deleting = node.deleting;
        m.allow_delete = node.allow_delete;
        m.etcd = node.record;
        m.left_etcd = node.recorded >= RemovalStep::EtcdLeft;
        m.at_address(node.name.clone())
    }

    fn machines(&self) -> Vec<Machine> {
        self.nodes.iter().map(Self::machine).collect()
    }

    fn cluster(&self) -> Cluster {
        let c = Cluster::new("prod", self.declared)
            .in_namespace("infra")
            .at(self.now())
            .observations_valid_for(MAX_AGE);
        let c = match &self.endpoint {
            Some(host) => c.with_endpoint_host(host.clone()),
            None => c,
        };
        if self.teardown {
            c.being_deleted().allowing_delete()
        } else {
            c
        }
    }

    fn now(&self) -> i64 {
        i64::try_from(self.tick).expect("ticks fit")
    }

    /// What the planner says about `disruption` of machine `i` at `stage`, by the world's rules.
    fn plan(&self, i: usize, disruption: &Disruption, stage: Stage) -> Verdict {
        let target = Self::machine(&self.nodes[i]);
        check_with(
            &target,
            &self.machines(),
            &self.cluster(),
            disruption,
            stage,
            self.rules,
        )
    }

    fn transitioning(&self) -> bool {
        transitioning(self.declared, approved_control_planes(&self.machines()))
    }

    fn voters(&self) -> usize {
        self.nodes.iter().filter(|n| n.voter).count()
    }

    fn voters_up(&self) -> usize {
        self.nodes.iter().filter(|n| n.serving()).count()
    }

    // ---- The lock -----------------------------------------------------------------------

    /// Acts on a decision that holds: the Lease names `id`, renewed.
    fn hold(&mut self, id: &str, decision: &LockDecision) -> Result<(), String> {
        if *decision == LockDecision::Take {
            log!(self, "  {id} takes the lock (was {:?})", self.lock);
            if self.transitioning_by_rule() && !self.completes_by_rule(id) {
                return Err(format!(
                    "{id} took the lock while transitioning without completing the transition"
                ));
            }
        }
        self.lock = Some(LockView {
            holder: id.to_owned(),
            expired: false,
        });
        self.holders.insert(id.to_owned());
        self.check()
    }

    /// Releases the lock if `id` holds it.
    fn release(&mut self, id: &str) {
        if self.lock.as_ref().is_some_and(|l| l.holder == id) {
            self.lock = None;
            log!(self, "  {id} releases the lock");
        }
        self.holders.remove(id);
    }

    /// The manager stops: in-memory state is lost, the Lease stays but expires.
    fn crash(&mut self) {
        self.coverage.crashes += 1;
        if let Some(lock) = self.lock.as_mut() {
            lock.expired = true;
        }
        self.holders.clear();
        log!(self, "  manager crash; lock {:?}", self.lock);
    }

    // ---- The physical world -------------------------------------------------------------

    /// What happens between ticks without the manager: rebooted nodes come back, configured
    /// control planes that are up join etcd.
    fn physical(&mut self) -> Result<(), String> {
        self.tick += 1;
        for n in &mut self.nodes {
            n.down = n.down.saturating_sub(1);
            if n.joining && n.down == 0 {
                n.joining = false;
                n.voter = true;
            }
        }
        if self.observer_up {
            for i in 0..self.nodes.len() {
                self.observe(i);
            }
        }
        self.check()
    }

    /// The manager records what it sees of machine `i`'s etcd member now (configured control
    /// planes only).
    fn observe(&mut self, i: usize) {
        let now = self.now();
        let n = &mut self.nodes[i];
        if n.applied && n.is_control_plane() {
            n.record = Some(Observation {
                voter: n.voter,
                healthy: n.serving(),
                at: now,
            });
        }
    }

    /// A fault: a voter's etcd member falls sick. The environment never breaks quorum by itself,
    /// and while the observer is out it only strikes a member whose record is already stale:
    /// a record younger than the limit is trusted, which is what the limit means.
    fn sicken(&mut self, rng: &mut Rng) {
        let now = self.now();
        let candidates: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| {
                let n = &self.nodes[i];
                n.serving()
                    && (self.observer_up
                        || n.record.is_none_or(|r| now.saturating_sub(r.at) > MAX_AGE))
            })
            .collect();
        if candidates.is_empty() {
            return;
        }
        let i = candidates[rng.below(candidates.len())];
        let (voters, up) = (self.voters(), self.voters_up());
        if up - 1 < etcd_quorum(voters) {
            return;
        }
        self.nodes[i].healthy = false;
        self.coverage.sickened += 1;
        if self.observer_up {
            self.observe(i);
        }
        log!(self, "fault: {} falls sick", self.nodes[i].name);
    }

    /// A sick member heals, while the observer is up. (Healed unobserved, it would be removed
    /// as the unhealthy member its record says it is, a healthy control plane disrupted while
    /// another voter is sick; the manager looks at every member right before acting, which the
    /// model's observer outage stands in for.)
    fn heal(&mut self, rng: &mut Rng) {
        let sick: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| !self.nodes[i].healthy)
            .collect();
        if sick.is_empty() || !self.observer_up {
            return;
        }
        let i = sick[rng.below(sick.len())];
        self.nodes[i].healthy = true;
        if self.observer_up {
            self.observe(i);
        }
        log!(self, "{} heals", self.nodes[i].name);
    }

    // ---- Actions --------------------------------------------------------------------------

    /// Applies the config of `node` (the controller's apply; no lock, nothing disrupted).
    fn configure(&mut self, i: usize) {
        // A node that refused a config refuses it as a first apply too (a reset machine found
        // again is the same node): nothing is applied, and the machine waits unconfigured.
        let refused = (self.nodes[i].name.clone(), self.nodes[i].rendered);
        if self.refusals.contains(&refused) {
            log!(
                self,
                "{} refuses config {} at its first apply",
                refused.0,
                refused.1
            );
            return;
        }
        let n = &mut self.nodes[i];
        n.applied = true;
        n.maintenance = false;
        // A first apply is not drift: it takes what its objects render.
        n.config = n.rendered;
        n.applied_config = n.rendered;
        n.joining = n.is_control_plane();
        let name = n.name.clone();
        log!(self, "configure {name}");
    }

    /// A person deletes `i`, with the allow-delete annotation or without; admission decides.
    fn admit_delete(&mut self, i: usize, annotated: bool) -> Result<(), String> {
        let mut target = Self::machine(&self.nodes[i]);
        target.allow_delete = annotated;
        let name = target.name.clone();
        match check_machine_delete_with(&target, &self.machines(), &self.cluster(), self.rules) {
            Ok(()) => {
                // The door never lets the last voter go (closed form, over the truth).
                let others = self
                    .nodes
                    .iter()
                    .filter(|n| n.name != name && n.voter && !n.deleting)
                    .count();
                if self.nodes[i].voter && others == 0 && !self.teardown {
                    return Err(format!(
                        "the delete of {name}, the last voter, was admitted"
                    ));
                }
                self.nodes[i].deleting = true;
                self.nodes[i].allow_delete = annotated;
                log!(self, "delete {name}: admitted");
            }
            Err(refusal) => {
                *self
                    .coverage
                    .refused_deletes
                    .entry(refusal.reason())
                    .or_default() += 1;
                log!(self, "delete {name}: refused {}", refusal.reason());
            }
        }
        Ok(())
    }

    /// One reconcile of the removal of machine `name`.
    fn removal_tick(&mut self, name: &str, crash_before_record: bool) -> Result<(), String> {
        let i = self
            .index(name)
            .ok_or("removal of a machine that is gone")?;
        let node = self.nodes[i].clone();
        let id = node.removal_id();
        if !node.applied {
            // Never configured: nothing to undo on the node, no lock.
            self.nodes.remove(i);
            log!(self, "removal {name}: never configured, gone");
            return self.check();
        }
        let machines = self.machines();
        let target = Self::machine(&node);
        let cluster = self.cluster();
        let moving = transitioning(self.declared, approved_control_planes(&machines));
        let completes = removal_completes_transition(node.recorded, &target, &machines, &cluster);
        let decision = lock_decision(self.lock.as_ref(), &id, moving, completes);
        if !decision.holds() {
            let reason = match &decision {
                LockDecision::Busy { .. } => "LockBusy",
                _ => "RefusedWhileTransitioning",
            };
            self.hold_reason(i, reason);
            return Ok(());
        }
        self.hold(&id, &decision)?;
        if node.recorded == RemovalStep::Pending {
            let verdict = self.plan(i, &Disruption::Delete, Stage::Run);
            if let Verdict::Wait(_) | Verdict::Refuse(_) = &verdict {
                let reason = verdict.reason().unwrap_or_default();
                // Not ours to go yet: others may have the lock meanwhile.
                self.release(&id);
                self.hold_reason(i, reason);
                return self.check();
            }
            self.starting_removal(i)?;
        }
        let next = next_removal_step(node.recorded, node.role);
        if next == RemovalStep::EtcdLeft {
            // Right before the leave: etcd's quorum and health again.
            let verdict = self.plan(i, &Disruption::Delete, Stage::Act);
            if !verdict.is_proceed() {
                self.hold_reason(i, verdict.reason().unwrap_or_default());
                return self.check();
            }
        }
        log!(self, "removal {name}: {:?} -> {next:?}", node.recorded);
        let allow_delete = node.allow_delete;
        self.perform(i, next, &id, allow_delete)?;
        if next == RemovalStep::Complete {
            // The finalizer goes first: a crash before the lock is released leaves a lock
            // whose holder no longer exists, free to take once expired.
            self.nodes.remove(i);
            if crash_before_record {
                self.coverage.crashes_before_record += 1;
                log!(self, "  crash before releasing the lock");
                self.crash();
            } else {
                self.release(&id);
            }
            self.coverage.removals_completed += 1;
            if node.is_control_plane() {
                self.coverage.control_planes_removed += 1;
            }
            log!(self, "removal {name}: complete, gone");
            return self.check();
        }
        if crash_before_record {
            self.coverage.crashes_before_record += 1;
            log!(self, "  crash before recording {next:?}");
            self.crash();
        } else {
            self.nodes[i].recorded = next;
            self.nodes[i].held = None;
        }
        self.check()
    }

    /// A control plane's removal or reset starts (outside a teardown): the healthy voters
    /// staying, not being deleted, are at least the declared count (closed form, over the
    /// truth).
    fn starting_removal(&self, i: usize) -> Result<(), String> {
        let target = &self.nodes[i];
        if self.teardown || !target.is_control_plane() || !target.voter {
            return Ok(());
        }
        let staying = self
            .nodes
            .iter()
            .filter(|n| n.name != target.name && !n.deleting && n.serving())
            .count();
        if staying < self.declared {
            return Err(format!(
                "the removal or reset of {} started with {staying} healthy voters staying, \
                 below the declared {}",
                target.name, self.declared
            ));
        }
        Ok(())
    }

    /// Machine `i` is about to be taken out of etcd (`leaves`) or down by the action `by`: the
    /// invariants that hold the planner to account, in closed form over the truth. The action
    /// holds the cluster lock. Outside a teardown, a control plane leaves only with the
    /// allow-delete annotation (`allow_delete`: the machine's, or a reset operation's) and
    /// while the voters staying keep quorum of the voters before it; and no healthy control
    /// plane is disrupted while another voter is not serving.
    fn disrupting(
        &self,
        i: usize,
        leaves: bool,
        by: &str,
        allow_delete: bool,
    ) -> Result<(), String> {
        let target = &self.nodes[i];
        if self.lock.as_ref().is_none_or(|l| l.holder != by) || !self.holders.contains(by) {
            return Err(format!(
                "{by} disrupts {} without holding the lock ({:?})",
                target.name, self.lock
            ));
        }
        if self.teardown || !target.voter {
            return Ok(());
        }
        if leaves {
            if !allow_delete {
                return Err(format!(
                    "{} leaves etcd without the allow-delete annotation",
                    target.name
                ));
            }
            if self.endpoint.as_deref() == Some(target.name.as_str()) {
                return Err(format!(
                    "{} leaves etcd while the cluster's endpoint names it",
                    target.name
                ));
            }
            let staying = self
                .nodes
                .iter()
                .filter(|n| n.name != target.name && n.voter && !n.deleting)
                .count();
            if staying > 0 && staying < etcd_quorum(staying + 1) {
                return Err(format!(
                    "{} leaves etcd with {staying} voter(s) staying, below quorum of {}",
                    target.name,
                    staying + 1
                ));
            }
        }
        if target.serving()
            && let Some(sick) = self
                .nodes
                .iter()
                .find(|n| n.name != target.name && n.voter && !n.serving())
        {
            return Err(format!(
                "healthy {} disrupted while voter {} is not serving",
                target.name, sick.name
            ));
        }
        Ok(())
    }

    fn hold_reason(&mut self, i: usize, reason: &str) {
        let n = &mut self.nodes[i];
        if n.held.as_deref() != Some(reason) {
            let name = n.name.clone();
            n.held = Some(reason.to_owned());
            *self.coverage.held.entry(reason.to_owned()).or_default() += 1;
            log!(self, "removal {name}: held, {reason}");
        }
    }

    /// Performs `step` of the removal (or reset) of `i` by the action `by` on the node (not
    /// recorded yet).
    fn perform(
        &mut self,
        i: usize,
        step: RemovalStep,
        by: &str,
        allow_delete: bool,
    ) -> Result<(), String> {
        let name = self.nodes[i].name.clone();
        let other_voters = self
            .nodes
            .iter()
            .filter(|n| n.voter && n.name != name)
            .count();
        match step {
            // Idempotent: performing them again changes nothing.
            RemovalStep::Cordoned | RemovalStep::Drained | RemovalStep::NodeDeleted => {}
            RemovalStep::EtcdLeft => {
                if is_once_only(step) && !self.nodes[i].voter {
                    self.found_done("EtcdLeft", by);
                    log!(self, "  {name} is not an etcd member: leave recorded");
                } else if self.teardown && other_voters == 0 {
                    if !self.leaves_skipped.contains(&name) {
                        self.leaves_skipped.push(name.clone());
                    }
                    log!(self, "  {name} is the last member: no etcd leave");
                } else {
                    self.disrupting(i, true, by, allow_delete)?;
                    self.performed_once_only(by, &name, "EtcdLeft");
                    // The next action's fresh look finds its member failing while the node
                    // answers: a voter, unhealthy, until the leave is recorded or observed.
                    let now = self.now();
                    let n = &mut self.nodes[i];
                    n.voter = false;
                    n.record = n.record.map(|_| Observation::unhealthy_voter(now));
                    self.leaves.push(name.clone());
                    log!(self, "  {name} leaves etcd");
                }
            }
            RemovalStep::Reset => {
                if is_once_only(step) && self.nodes[i].maintenance {
                    self.found_done("Reset", by);
                    log!(self, "  {name} is in maintenance: reset recorded");
                } else {
                    self.performed_once_only(by, &name, "Reset");
                    if self.nodes[i].voter {
                        if !(self.teardown && other_voters == 0) {
                            return Err(format!(
                                "{name} was reset while still an etcd member with {other_voters} \
                                 other members"
                            ));
                        }
                        self.nodes[i].voter = false;
                    }
                    // Wiped: no config, no sick etcd member to bring back, nothing it refused.
                    let n = &mut self.nodes[i];
                    n.maintenance = true;
                    n.config = 0;
                    n.healthy = true;
                    self.refusals.retain(|(machine, _)| *machine != name);
                    log!(self, "  {name} reset");
                }
            }
            RemovalStep::Complete => {}
            RemovalStep::Pending => return Err(format!("{name}: performed Pending")),
        }
        self.check()
    }

    /// Counts a once-only step (`what`) that the action `by`, resumed, found done.
    fn found_done(&mut self, what: &str, by: &str) {
        self.coverage.once_only_found_done += 1;
        let actor = by.split('/').next().unwrap_or_default();
        *self
            .coverage
            .found_done
            .entry(format!("{what} by {actor}"))
            .or_default() += 1;
    }

    /// Counts a once-only step (`what`) performed by the action `by` on machine `name`; a
    /// second time is a broken invariant. Callers name only the steps that must never run twice
    /// (stated here, not through `is_once_only`: the invariant must not move with it).
    fn performed_once_only(&mut self, by: &str, name: &str, what: &'static str) {
        let n = self
            .once_only
            .entry((by.to_owned(), name.to_owned(), what))
            .or_default();
        *n += 1;
        if *n > 1 && self.twice.is_none() {
            self.twice = Some(format!("{what} of {name} by {by} performed {n} times"));
        }
    }

    // ---- Operations -----------------------------------------------------------------------

    /// A person creates an operation over `targets` (control planes first); the door admits it
    /// with `check_targets_with`, as the webhook does, or refuses it.
    fn admit_operation(
        &mut self,
        kind: OpKind,
        targets: Vec<String>,
        allow_delete: bool,
    ) -> Result<(), String> {
        if self.op.is_some() || targets.is_empty() {
            return Ok(());
        }
        let op = self.new_operation(kind, targets, allow_delete);
        let names: Vec<&str> = op.targets.iter().map(String::as_str).collect();
        match check_targets_with(
            &names,
            &self.machines(),
            &self.cluster(),
            &op.disruption(),
            self.rules,
        ) {
            Ok(()) => {
                // The door never lets a reset take the last voter (closed form, over the
                // truth).
                let staying = self
                    .nodes
                    .iter()
                    .filter(|n| n.voter && !n.deleting && !op.targets.contains(&n.name))
                    .count();
                let targeted = self
                    .nodes
                    .iter()
                    .any(|n| n.voter && op.targets.contains(&n.name));
                if kind == OpKind::Reset && targeted && staying == 0 {
                    return Err(format!(
                        "{} over {:?}, the last voter(s), was admitted",
                        op.id, op.targets
                    ));
                }
                log!(self, "{}: admitted over {:?}", op.id, op.targets);
                self.op = Some(op);
            }
            Err(refusal) => {
                *self
                    .coverage
                    .refused_operations
                    .entry(refusal.reason())
                    .or_default() += 1;
                log!(self, "{}: refused {}", op.id, refusal.reason());
            }
        }
        Ok(())
    }

    fn new_operation(
        &mut self,
        kind: OpKind,
        targets: Vec<String>,
        allow_delete: bool,
    ) -> Operation {
        self.next_op += 1;
        let verb = match kind {
            OpKind::Reset => "reset",
            OpKind::Reboot => "reboot",
            OpKind::Upgrade => "upgrade",
        };
        Operation {
            id: format!("operation/{verb}-{}", self.next_op),
            kind,
            allow_delete,
            targets,
            index: 0,
            step: OpStep::Pending,
            version: u32::try_from(self.next_op).expect("few operations"),
            held: None,
        }
    }

    /// Starts an operation over `targets` without asking the door (it was admitted before
    /// what the test sets up happened).
    fn start_operation(&mut self, kind: OpKind, targets: &[&str]) {
        let targets = targets.iter().map(|t| (*t).to_owned()).collect();
        let op = self.new_operation(kind, targets, true);
        log!(self, "{}: started over {:?}", op.id, op.targets);
        self.op = Some(op);
    }

    /// A random operation: a reset, a reboot or an upgrade of one configured machine, of every
    /// control plane, or of every configured machine (control planes first), the allow-delete
    /// annotation on it nine times in ten.
    fn random_operation(&mut self, rng: &mut Rng) -> Result<(), String> {
        if self.op.is_some() {
            return Ok(());
        }
        let kind = [OpKind::Reset, OpKind::Reboot, OpKind::Upgrade][rng.below(3)];
        let mut configured: Vec<&Node> = self
            .nodes
            .iter()
            .filter(|n| n.applied && !n.deleting && !n.joining)
            .collect();
        configured.sort_by_key(|n| !n.is_control_plane());
        if configured.is_empty() {
            return Ok(());
        }
        let targets: Vec<String> = match rng.below(4) {
            0 | 1 => vec![configured[rng.below(configured.len())].name.clone()],
            2 => configured
                .iter()
                .filter(|n| n.is_control_plane())
                .map(|n| n.name.clone())
                .collect(),
            _ => configured.iter().map(|n| n.name.clone()).collect(),
        };
        let allow_delete = !rng.chance(1, 10);
        self.admit_operation(kind, targets, allow_delete)
    }

    /// Records why the operation waits (counted once per change).
    fn op_held(&mut self, op: &mut Operation, reason: &str) {
        if op.held.as_deref() != Some(reason) {
            log!(self, "{}: held, {reason}", op.id);
            *self.coverage.held.entry(reason.to_owned()).or_default() += 1;
            op.held = Some(reason.to_owned());
        }
    }

    /// Whether the operation completes the transition, by the library: a reset of a surplus
    /// control plane does, as its removal would, and one that started on a node always may
    /// finish it; restarts complete nothing.
    fn op_completes(&self, op: &Operation) -> bool {
        if op.kind != OpKind::Reset {
            return false;
        }
        let Some(i) = op.targets.get(op.index).and_then(|name| self.index(name)) else {
            return false;
        };
        let done = match op.step {
            OpStep::Removal(step) => step,
            _ => RemovalStep::Pending,
        };
        removal_completes_transition(
            done,
            &Self::machine(&self.nodes[i]),
            &self.machines(),
            &self.cluster(),
        )
    }

    /// One reconcile of the operation.
    fn operation_tick(&mut self, crash: bool) -> Result<(), String> {
        let Some(mut op) = self.op.clone() else {
            return Ok(());
        };
        let id = op.id.clone();
        let decision = lock_decision(
            self.lock.as_ref(),
            &id,
            self.transitioning(),
            self.op_completes(&op),
        );
        if !decision.holds() {
            let reason = match &decision {
                LockDecision::Busy { .. } => "LockBusy",
                _ => "RefusedWhileTransitioning",
            };
            self.op_held(&mut op, reason);
            self.op = Some(op);
            return Ok(());
        }
        self.hold(&id, &decision)?;
        op.held = None;
        // Targets gone (removed), or not started and no longer configured, are passed over.
        while op.index < op.targets.len() {
            let there = self.index(&op.targets[op.index]);
            let passed = match there {
                None => true,
                Some(i) => op.step == OpStep::Pending && !self.nodes[i].applied,
            };
            if !passed {
                break;
            }
            op.index += 1;
            op.step = OpStep::Pending;
        }
        if op.index == op.targets.len() {
            self.release(&id);
            self.op = None;
            self.coverage.operations_completed += 1;
            log!(self, "{id}: done");
            return self.check();
        }
        let i = self
            .index(&op.targets[op.index])
            .ok_or("operation target gone")?;
        let ended = match op.kind {
            OpKind::Reset => self.reset_step(&mut op, i, crash)?,
            OpKind::Reboot | OpKind::Upgrade => {
                self.restart_step(&mut op, i, crash)?;
                false
            }
        };
        self.op = (!ended).then_some(op);
        self.check()
    }

    /// One reconcile of a reboot or an upgrade of node `i`: the planner before it starts,
    /// the intent recorded, sent, recorded as sent; back and healthy before the next node.
    /// Resumed at the intent (a crash lost the record of sending), it looks for the effect
    /// first, then asks the planner again before sending.
    fn restart_step(&mut self, op: &mut Operation, i: usize, crash: bool) -> Result<(), String> {
        let id = op.id.clone();
        let name = self.nodes[i].name.clone();
        match op.step {
            OpStep::Sent => {
                if self.nodes[i].back() {
                    if crash {
                        // Nothing lost: it looks again.
                        log!(self, "{id}: {name} back; crash before recording");
                        self.crash();
                    } else {
                        log!(self, "{id}: {name} back and healthy");
                        op.step = OpStep::Pending;
                        op.index += 1;
                    }
                }
                return Ok(());
            }
            OpStep::Pending => {
                let verdict = self.plan(i, &Disruption::Restart, Stage::Run);
                if !verdict.is_proceed() {
                    // Nothing was sent to this node: the lock goes meanwhile, so the action that
                    // can end the hold is not locked out by it.
                    self.op_held(op, verdict.reason().unwrap_or_default());
                    self.release(&id);
                    return Ok(());
                }
                op.step = OpStep::Intent {
                    boots: self.nodes[i].boots,
                };
            }
            OpStep::Intent { boots } => {
                let n = &self.nodes[i];
                if n.down > 0 {
                    self.op_held(op, "NodeUnreachable");
                    return Ok(());
                }
                let done = match op.kind {
                    OpKind::Upgrade => n.version == op.version,
                    _ => n.boots != boots,
                };
                if done {
                    self.found_done(
                        if op.kind == OpKind::Upgrade {
                            "Upgrade"
                        } else {
                            "Reboot"
                        },
                        &id,
                    );
                    log!(self, "{id}: {name} already restarted: recorded as sent");
                    op.step = OpStep::Sent;
                    return Ok(());
                }
                let verdict = self.plan(i, &Disruption::Restart, Stage::Act);
                if !verdict.is_proceed() {
                    self.op_held(op, verdict.reason().unwrap_or_default());
                    self.release(&id);
                    return Ok(());
                }
            }
            OpStep::Removal(_) => return Err(format!("{id} recorded a removal step")),
        }
        self.disrupting(i, false, &id, false)?;
        self.restarting(i);
        let what = match op.kind {
            OpKind::Upgrade => {
                self.coverage.upgrades += 1;
                "Upgrade"
            }
            _ => {
                self.coverage.reboots += 1;
                "Reboot"
            }
        };
        self.performed_once_only(&id, &name, what);
        let now = self.now();
        let n = &mut self.nodes[i];
        n.down = if op.kind == OpKind::Upgrade { 2 } else { 1 };
        n.boots += 1;
        if op.kind == OpKind::Upgrade {
            n.version = op.version;
        }
        // The operation saw it go down.
        n.record = n.record.map(|_| Observation {
            voter: n.voter,
            healthy: false,
            at: now,
        });
        log!(self, "{id}: {what} {name}");
        if crash {
            self.coverage.crashes_before_record += 1;
            log!(
                self,
                "{id}: crash before recording {what} of {name} as sent"
            );
            self.crash();
        } else {
            op.step = OpStep::Sent;
        }
        Ok(())
    }

    /// One reconcile of a reset of node `i`, through the removal's steps (the planner when it
    /// starts and right before the etcd leave); at the end the machine stays, its config and
    /// etcd record forgotten, back to maintenance. `true` if the operation ends (refused).
    fn reset_step(&mut self, op: &mut Operation, i: usize, crash: bool) -> Result<bool, String> {
        let id = op.id.clone();
        let name = self.nodes[i].name.clone();
        let disruption = op.disruption();
        let done = match op.step {
            OpStep::Pending => RemovalStep::Pending,
            OpStep::Removal(step) => step,
            other => return Err(format!("{id} recorded {other:?}")),
        };
        if done == RemovalStep::Pending {
            match self.plan(i, &disruption, Stage::Run) {
                Verdict::Proceed(_) => {}
                Verdict::Wait(wait) => {
                    self.op_held(op, wait.reason());
                    self.release(&id);
                    return Ok(false);
                }
                Verdict::Refuse(refusal) => {
                    log!(self, "{id}: fails before {name}, {}", refusal.reason());
                    self.coverage.operations_failed += 1;
                    self.release(&id);
                    return Ok(true);
                }
            }
            self.starting_removal(i)?;
        }
        let next = next_removal_step(done, self.nodes[i].role);
        if next == RemovalStep::EtcdLeft {
            // A wait keeps the lock, as a removal's does; a refusal (another control plane
            // deleted since, which the door let through: a reset's target is not counted as
            // leaving there) does not resolve by itself: the operation fails, the lock goes.
            match self.plan(i, &disruption, Stage::Act) {
                Verdict::Proceed(_) => {}
                Verdict::Wait(wait) => {
                    self.op_held(op, wait.reason());
                    return Ok(false);
                }
                Verdict::Refuse(refusal) => {
                    log!(
                        self,
                        "{id}: fails before {name} leaves etcd, {}",
                        refusal.reason()
                    );
                    self.coverage.operations_failed += 1;
                    self.release(&id);
                    return Ok(true);
                }
            }
        }
        log!(self, "{id}: {name} {done:?} -> {next:?}");
        if next == RemovalStep::Complete {
            // The machine stays; its config and etcd record are forgotten once (a node
            // configured again since is not touched).
            let n = &mut self.nodes[i];
            if n.applied && n.maintenance {
                n.applied = false;
                n.record = None;
                n.applied_config = 0;
            }
            if crash {
                self.coverage.crashes_before_record += 1;
                log!(self, "{id}: crash before recording {name} done");
                self.crash();
            } else {
                if self.nodes[i].is_control_plane() {
                    self.coverage.control_plane_resets += 1;
                }
                op.step = OpStep::Pending;
                op.index += 1;
            }
            return Ok(false);
        }
        let allow_delete = op.allow_delete;
        self.perform(i, next, &id, allow_delete)?;
        if crash {
            self.coverage.crashes_before_record += 1;
            log!(self, "{id}: crash before recording {next:?} of {name}");
            self.crash();
        } else {
            op.step = OpStep::Removal(next);
        }
        Ok(false)
    }

    /// Node `i` is about to go down: counts another node still down.
    fn restarting(&mut self, i: usize) {
        if self
            .nodes
            .iter()
            .enumerate()
            .any(|(k, n)| k != i && n.down > 0)
        {
            self.coverage.restarted_while_another_down += 1;
        }
    }

    // ---- Drift ----------------------------------------------------------------------------

    /// Whether machine `n` is leaving (being deleted, or its removal started).
    fn leaving(n: &Node) -> bool {
        n.deleting || n.recorded > RemovalStep::Pending
    }

    /// Whether machine `n` drifted: configured, not leaving, rendering another config than the
    /// one recorded as applied.
    fn drifted(n: &Node) -> bool {
        n.applied && !Self::leaving(n) && n.rendered != n.applied_config
    }

    /// Every machine as the drift rollout sees it: recorded health (a control plane's last
    /// etcd observation; a worker is Ready when up).
    fn drift_views(&self) -> Vec<DriftMachine> {
        self.nodes
            .iter()
            .map(|n| DriftMachine {
                name: n.name.clone(),
                role: n.role,
                rendered: n.rendered.to_string(),
                applied: n.applied.then(|| n.applied_config.to_string()),
                healthy: match n.role {
                    Role::ControlPlane => n.record.is_some_and(|r| r.voter && r.healthy),
                    Role::Worker => n.down == 0,
                },
                leaving: Self::leaving(n),
                upgrade: None,
            })
            .collect()
    }

    /// The halt of the rollout in closed form, over the truth: the machine that refused a
    /// config is there, configured, not leaving, still renders that config and did not take
    /// it.
    fn halt_stands_by_rule(&self) -> Option<&(String, u32)> {
        self.halted.as_ref().filter(|(name, patch)| {
            self.index(name).is_some_and(|i| {
                let n = &self.nodes[i];
                n.applied && !Self::leaving(n) && n.rendered == *patch && n.applied_config != *patch
            })
        })
    }

    /// A config change that needs a reboot: a cluster patch (every machine renders it) or a
    /// machine's own patch. One time in four, one configured machine it reaches refuses it.
    fn random_drift(&mut self, rng: &mut Rng) {
        if self.nodes.is_empty() {
            return;
        }
        self.next_patch += 1;
        let patch = self.next_patch;
        let reached: Vec<usize> = if rng.chance(1, 2) {
            (0..self.nodes.len()).collect()
        } else {
            vec![rng.below(self.nodes.len())]
        };
        for &i in &reached {
            self.nodes[i].rendered = patch;
        }
        let configured: Vec<usize> = reached
            .into_iter()
            .filter(|&i| self.nodes[i].applied)
            .collect();
        let refusing = (!configured.is_empty() && rng.chance(1, 4)).then(|| {
            self.nodes[configured[rng.below(configured.len())]]
                .name
                .clone()
        });
        log!(
            self,
            "config {patch} rendered for {} machine(s); refused by {refusing:?}",
            configured.len()
        );
        if let Some(name) = refusing {
            self.refusals.insert((name, patch));
        }
    }

    fn drift_held(&mut self, i: usize, reason: &str) {
        let n = &mut self.nodes[i];
        if n.drift_held.as_deref() != Some(reason) {
            let name = n.name.clone();
            n.drift_held = Some(reason.to_owned());
            *self.coverage.held.entry(reason.to_owned()).or_default() += 1;
            log!(self, "drift of {name}: held, {reason}");
        }
    }

    /// One reconcile of the drift of machine `name`: its turn by `drift_turn` (the halt
    /// recorded, cleared once it no longer stands), the cluster lock, the planner's `Restart`,
    /// then staged and rebooted (a node that refuses the config records the halt and releases
    /// the lock), recorded, and the lock kept until the node is back. Resumed after a crash
    /// that lost the record, it finds the node running the config instead of rebooting again.
    fn drift_tick(&mut self, name: &str, crash: bool) -> Result<(), String> {
        let i = self.index(name).ok_or("drift of a machine that is gone")?;
        let id = self.nodes[i].drift_id();
        if self.nodes[i].drift_reboot.is_some() {
            // In flight: back, it is recorded and the lock (if still its own) released;
            // until then the lock is kept.
            if self.nodes[i].back() {
                if crash {
                    log!(self, "drift of {name}: back; crash before recording");
                    self.crash();
                } else {
                    log!(self, "drift of {name}: back, done");
                    self.nodes[i].drift_reboot = None;
                    self.nodes[i].drift_held = None;
                    self.release(&id);
                }
                return self.check();
            }
            let decision = lock_decision(self.lock.as_ref(), &id, self.transitioning(), false);
            if decision.holds() {
                self.hold(&id, &decision)?;
            } else {
                self.drift_held(i, "LockBusy");
            }
            return self.check();
        }
        if !Self::drifted(&self.nodes[i]) {
            return Ok(());
        }
        let views = self.drift_views();
        if let Some(halt) = self.drift_halt.take() {
            if halt_stands(&views, &halt) {
                self.drift_halt = Some(halt);
            } else {
                log!(self, "the drift halt at {} is cleared", halt.machine);
            }
        }
        match drift_turn(&views, self.drift_halt.as_ref()) {
            DriftTurn::Next { machine, .. } if machine == name => {}
            DriftTurn::Next { .. } | DriftTurn::WaitForHealthy { .. } => {
                self.drift_held(i, "DriftQueued");
                return Ok(());
            }
            DriftTurn::Halted { .. } => {
                self.drift_held(i, "DriftHalted");
                return Ok(());
            }
            DriftTurn::Settled => return Err(format!("{name} drifted, the rollout is settled")),
        }
        // A reboot for drift completes no transition.
        let decision = lock_decision(self.lock.as_ref(), &id, self.transitioning(), false);
        if !decision.holds() {
            let reason = match &decision {
                LockDecision::Busy { .. } => "LockBusy",
                _ => "RefusedWhileTransitioning",
            };
            self.drift_held(i, reason);
            return Ok(());
        }
        self.hold(&id, &decision)?;
        let verdict = self.plan(i, &Disruption::Restart, Stage::Run);
        if !verdict.is_proceed() {
            self.drift_held(i, verdict.reason().unwrap_or_default());
            self.release(&id);
            return self.check();
        }
        if self.nodes[i].down > 0 {
            self.drift_held(i, "NodeUnreachable");
            self.release(&id);
            return self.check();
        }
        let patch = self.nodes[i].rendered;
        self.nodes[i].drift_held = None;
        if self.nodes[i].config == patch {
            // It rebooted into it before a crash lost the record: recorded now, not again.
            self.found_done("Reboot", &id);
            log!(self, "{name} already runs config {patch}: recorded");
            self.nodes[i].applied_config = patch;
            self.nodes[i].drift_reboot = Some(patch);
            return self.check();
        }
        if self.refusals.contains(&(name.to_owned(), patch)) {
            log!(self, "{name} refuses config {patch}: the rollout halts");
            self.coverage.drifts_refused += 1;
            self.drift_halt = Some(DriftHalt {
                machine: name.to_owned(),
                rendered: patch.to_string(),
            });
            self.halted = Some((name.to_owned(), patch));
            self.release(&id);
            return self.check();
        }
        // The rollout's promises, in closed form: nothing while a refusal stands, and control
        // planes before workers.
        // The rollout's promises, in closed form: nothing while a refusal stands, and control
        // planes before workers.
        if let Some((halted, refused)) = self.halt_stands_by_rule() {
            return Err(format!(
                "{name} takes config {patch} while the rollout is halted at {halted}, which \
                 refused config {refused}"
            ));
        }
        if !self.nodes[i].is_control_plane()
            && let Some(cp) = self
                .nodes
                .iter()
                .find(|n| n.is_control_plane() && Self::drifted(n))
        {
            return Err(format!(
                "worker {name} takes config {patch} before control plane {} took its own",
                cp.name
            ));
        }
        if !self.nodes[i].is_control_plane()
            && let Some(cp) = self
                .nodes
                .iter()
                .find(|n| n.is_control_plane() && Self::drifted(n))
        {
            return Err(format!(
                "worker {name} takes config {patch} before control plane {} took its own",
                cp.name
            ));
        }
        self.disrupting(i, false, &id, false)?;
        self.restarting(i);
        self.performed_once_only(&format!("{id}#{patch}"), name, "Reboot");
        self.coverage.drift_reboots += 1;
        let now = self.now();
        let n = &mut self.nodes[i];
        n.down = 1;
        n.boots += 1;
        n.config = patch;
        n.record = n.record.map(|_| Observation {
            voter: n.voter,
            healthy: false,
            at: now,
        });
        log!(self, "drift of {name}: staged config {patch}, reboots");
        if crash {
            self.coverage.crashes_before_record += 1;
            log!(self, "drift of {name}: crash before recording the reboot");
            self.crash();
        } else {
            self.nodes[i].applied_config = patch;
            self.nodes[i].drift_reboot = Some(patch);
        }
        self.check()
    }

    /// The actions the controller reconciles: every removal, the operation, every reboot for
    /// drift not stopped.
    fn controller_actions(&self) -> Vec<Action> {
        let mut actions: Vec<Action> = self
            .nodes
            .iter()
            .filter(|n| n.deleting)
            .map(|n| Action::Removal(n.name.clone()))
            .collect();
        if self.op.is_some() {
            actions.push(Action::Operation);
        }
        actions.extend(
            self.nodes
                .iter()
                .filter(|n| n.drift_reboot.is_some() || Self::drifted(n))
                .map(|n| Action::Drift(n.name.clone())),
        );
        actions
    }

    /// Whether `action` still has something to reconcile (its machine is there).
    fn exists(&self, action: &Action) -> bool {
        match action {
            Action::Removal(name) | Action::Drift(name) => self.index(name).is_some(),
            Action::Operation => self.op.is_some(),
        }
    }

    fn controller_tick(&mut self, action: &Action, crash: bool) -> Result<(), String> {
        match action {
            Action::Removal(name) => self.removal_tick(name, crash),
            Action::Operation => self.operation_tick(crash),
            Action::Drift(name) => self.drift_tick(name, crash),
        }
    }

    // ---- Invariants ---------------------------------------------------------------------

    fn check(&self) -> Result<(), String> {
        let (voters, up) = (self.voters(), self.voters_up());
        // A single voter restarting is down by necessity: no order avoids it, and it keeps its
        // data.
        let single_restart = voters == 1 && self.nodes.iter().any(|n| n.voter && n.down > 0);
        if voters > 0 && up < etcd_quorum(voters) && !single_restart {
            return Err(format!(
                "etcd lost quorum: {up} of {voters} members up, quorum {}",
                etcd_quorum(voters)
            ));
        }
        if voters == 0 && !self.teardown {
            return Err("no etcd member left while the cluster is not being deleted".into());
        }
        if self.holders.len() > 1 {
            return Err(format!("the lock is held by {:?} at once", self.holders));
        }
        if let Some(holder) = self.holders.first()
            && self.lock.as_ref().is_none_or(|l| &l.holder != holder)
        {
            return Err(format!(
                "{holder} acts as the lock holder but the lock is {:?}",
                self.lock
            ));
        }
        if let Some(twice) = &self.twice {
            return Err(twice.clone());
        }
        // One voter at most down. (Not one node: a crash lets the lock expire while the node
        // its action took down is still down, and only a voter's recorded observation tells
        // the next action; a worker down meanwhile is counted in the coverage.)
        let down: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.down > 0 && n.voter)
            .map(|n| n.name.as_str())
            .collect();
        if down.len() > 1 {
            return Err(format!("{down:?} are down at once"));
        }
        // A config a node refused changed nothing there: neither recorded nor running.
        for (name, patch) in &self.refusals {
            if let Some(n) = self.index(name).map(|i| &self.nodes[i])
                && (n.applied_config == *patch || n.config == *patch)
            {
                return Err(format!("{name} refused config {patch} but it took effect"));
            }
        }
        // A halted rollout holds nothing: the refusing machine released the lock.
        if let Some((name, _)) = self.halt_stands_by_rule() {
            let id = format!("drift/{name}");
            if self.holders.contains(&id) || self.lock.as_ref().is_some_and(|l| l.holder == id) {
                return Err(format!("the drift halted at {name} holds the lock"));
            }
        }
        Ok(())
    }

    // ---- Phases ---------------------------------------------------------------------------

    /// Random actions, one a tick.
    fn random_phase(&mut self, rng: &mut Rng, ticks: usize) -> Result<(), String> {
        for _ in 0..ticks {
            self.physical()?;
            let roll = rng.below(30);
            match roll {
                0..=1 if self.nodes.len() < MAX_MACHINES => {
                    let n = self.approve(Role::ControlPlane);
                    log!(self, "approve control plane {}", n.name);
                    self.nodes.push(n);
                }
                2 if self.nodes.len() < MAX_MACHINES => {
                    let n = self.approve(Role::Worker);
                    log!(self, "approve worker {}", n.name);
                    self.nodes.push(n);
                }
                3..=5 => {
                    let unconfigured: Vec<usize> = (0..self.nodes.len())
                        .filter(|&i| !self.nodes[i].applied && !self.nodes[i].deleting)
                        .collect();
                    if !unconfigured.is_empty() {
                        self.configure(unconfigured[rng.below(unconfigured.len())]);
                    }
                }
                6..=8 if self.deletes => {
                    let live: Vec<usize> = (0..self.nodes.len())
                        .filter(|&i| !self.nodes[i].deleting)
                        .collect();
                    if !live.is_empty() {
                        let i = live[rng.below(live.len())];
                        let annotated = !rng.chance(1, 10);
                        self.admit_delete(i, annotated)?;
                    }
                }
                9 => {
                    let declared = 2 * rng.below(4) + 1;
                    if declared != self.declared {
                        self.coverage.declared_changes += 1;
                        log!(self, "declare {declared} control planes");
                        self.declared = declared;
                    }
                }
                10 | 12 | 14 | 15 => self.random_operation(rng)?,
                13 => self.random_drift(rng),
                11 => {
                    log!(self, "crash");
                    self.crash();
                }
                26 => self.sicken(rng),
                27 => self.heal(rng),
                28 => {
                    self.observer_up = !self.observer_up;
                    if !self.observer_up {
                        self.coverage.stale_outages += 1;
                    }
                    log!(self, "observer up: {}", self.observer_up);
                }
                _ => {
                    let actions = self.controller_actions();
                    if !actions.is_empty() {
                        let action = actions[rng.below(actions.len())].clone();
                        let crash = rng.chance(1, 10);
                        self.controller_tick(&action, crash)?;
                    }
                }
            }
            self.check()?;
        }
        Ok(())
    }

    /// Controller ticks only: every unconfigured machine configured, every action reconciled
    /// once a tick, no deletes, no crashes.
    fn settle(&mut self, ticks: usize) -> Result<(), String> {
        log!(self, "-- settle: controller ticks only --");
        // The faults end: every member heals and the manager observes again.
        self.observer_up = true;
        for n in &mut self.nodes {
            n.healthy = true;
        }
        let mut unchanged = 0;
        for _ in 0..ticks {
            // Deterministic from here: two ticks without a change are a fixed point.
            let before = (self.nodes.clone(), self.lock.clone(), self.op.clone());
            self.physical()?;
            for i in 0..self.nodes.len() {
                if !self.nodes[i].applied && !self.nodes[i].deleting {
                    self.configure(i);
                }
            }
            for action in self.controller_actions() {
                if self.exists(&action) {
                    self.controller_tick(&action, false)?;
                }
            }
            if before == (self.nodes.clone(), self.lock.clone(), self.op.clone()) {
                unchanged += 1;
                if unchanged == 2 {
                    break;
                }
            } else {
                unchanged = 0;
            }
        }
        Ok(())
    }

    /// After settling: nothing holds the lock, and every removal left is held at Pending for a
    /// reason a person can read: a wait or refusal of `check_machine_removal`, or the lock
    /// refused while the cluster is transitioning. Judged on the state reached, not on the last
    /// reason logged.
    fn check_liveness(&mut self) -> Result<(), String> {
        if !self.lock_free_or_orphaned() {
            return Err(format!(
                "the lock is still held after settling: {:?}",
                self.lock
            ));
        }
        let machines = self.machines();
        let cluster = self.cluster();
        let moving = self.transitioning();
        for n in self.nodes.iter().filter(|n| n.deleting) {
            let target = Self::machine(n);
            let completes = removal_completes_transition(n.recorded, &target, &machines, &cluster);
            let decision = lock_decision(self.lock.as_ref(), &n.removal_id(), moving, completes);
            let verdict = check_with(
                &target,
                &machines,
                &cluster,
                &Disruption::Delete,
                Stage::Run,
                self.rules,
            );
            let reason = match decision {
                LockDecision::RefusedWhileTransitioning => {
                    self.refusal_expected(n)?;
                    "RefusedWhileTransitioning"
                }
                LockDecision::Take | LockDecision::Keep
                    if n.recorded == RemovalStep::Pending && !verdict.is_proceed() =>
                {
                    verdict.reason().unwrap_or_default()
                }
                _ => {
                    return Err(format!(
                        "removal of {} stuck at {:?} ({decision:?}, {verdict:?})",
                        n.name, n.recorded
                    ));
                }
            };
            if n.recorded != RemovalStep::Pending {
                // A removal that started always finishes (removal_completes_transition).
                return Err(format!(
                    "removal of {} held at {:?} after it started: {reason}",
                    n.name, n.recorded
                ));
            }
        }
        if let Some(op) = &self.op {
            let decision = lock_decision(self.lock.as_ref(), &op.id, moving, self.op_completes(op));
            let target = op.targets.get(op.index).and_then(|name| self.index(name));
            match (decision, target) {
                (LockDecision::RefusedWhileTransitioning, _)
                    if self.transitioning_by_rule() && !self.completes_by_rule(&op.id) => {}
                // Held by the planner before anything was sent to its node.
                (LockDecision::Take | LockDecision::Keep, Some(i))
                    if op.step == OpStep::Pending
                        && !self.plan(i, &op.disruption(), Stage::Run).is_proceed() => {}
                (decision, _) => {
                    return Err(format!("operation stuck ({decision:?}): {op:?}"));
                }
            }
        }
        // Drift is rolled out, or halted at a refusal (a person fixes the patch), or its next
        // machine is held by the planner or the transition.
        let views = self.drift_views();
        let halted = self.halt_stands_by_rule().is_some();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.drift_reboot.is_some() {
                return Err(format!(
                    "the reboot for drift of {} is still in flight",
                    n.name
                ));
            }
            if !Self::drifted(n) || halted {
                continue;
            }
            match drift_turn(&views, self.drift_halt.as_ref()) {
                DriftTurn::Next { machine, .. } if machine != n.name => {}
                DriftTurn::Next { .. } => {
                    let decision = lock_decision(self.lock.as_ref(), &n.drift_id(), moving, false);
                    match decision {
                        LockDecision::RefusedWhileTransitioning
                            if self.transitioning_by_rule()
                                && !self.completes_by_rule(&n.drift_id()) => {}
                        LockDecision::Take | LockDecision::Keep
                            if !self.plan(i, &Disruption::Restart, Stage::Run).is_proceed() => {}
                        decision => {
                            return Err(format!("drift of {} stuck ({decision:?})", n.name));
                        }
                    }
                }
                turn => return Err(format!("drift of {} stuck: {turn:?}", n.name)),
            }
        }
        Ok(())
    }

    /// Whether nothing holds the lock: free, or expired with a holder that no longer exists.
    fn lock_free_or_orphaned(&self) -> bool {
        let Some(lock) = &self.lock else {
            return true;
        };
        let exists = self.nodes.iter().any(|n| {
            n.removal_id() == lock.holder
                || (n.drift_id() == lock.holder && (n.drift_reboot.is_some() || Self::drifted(n)))
        }) || self.op.as_ref().is_some_and(|op| op.id == lock.holder);
        lock.expired && !exists
    }

    /// The transition rule in closed form, independent of `transitioning`: the declared count
    /// is even, or the approved control planes differ from it.
    fn transitioning_by_rule(&self) -> bool {
        let approved = self.nodes.iter().filter(|n| n.is_control_plane()).count();
        self.declared.is_multiple_of(2) || approved != self.declared
    }

    /// The completion rule in closed form, independent of `completes_transition`: a teardown
    /// completes everything; otherwise only the removal (or a reset operation's reset) of a
    /// control plane while the approved ones outnumber the declared count, or one already
    /// started (restarts complete nothing).
    fn completes_by_rule(&self, id: &str) -> bool {
        let approved = self.nodes.iter().filter(|n| n.is_control_plane()).count();
        let (target, started) = if let Some(name) = id.strip_prefix("removal/") {
            let i = self.index(name);
            (
                i,
                i.is_some_and(|i| self.nodes[i].recorded > RemovalStep::Pending),
            )
        } else if let Some(op) = self
            .op
            .as_ref()
            .filter(|op| op.id == id && op.kind == OpKind::Reset)
        {
            let i = op.targets.get(op.index).and_then(|name| self.index(name));
            (i, i.is_some() && op.step != OpStep::Pending)
        } else {
            (None, false)
        };
        let control_plane = target.is_some_and(|i| self.nodes[i].is_control_plane());
        self.teardown || started || (control_plane && approved > self.declared)
    }

    /// Checks a refusal of the lock while transitioning against the rules in closed form.
    fn refusal_expected(&self, n: &Node) -> Result<(), String> {
        let approved = self.nodes.iter().filter(|n| n.is_control_plane()).count();
        if self.transitioning_by_rule() && !self.completes_by_rule(&n.removal_id()) {
            Ok(())
        } else {
            Err(format!(
                "removal of {} refused the lock while transitioning, though approved {approved} \
                 and declared {} let it go",
                n.name, self.declared
            ))
        }
    }

    /// Deletes the cluster: every machine is deleted (admission passes), workers go first,
    /// then the control planes, the last without an etcd leave. Actions are reconciled in a
    /// random order, the manager crashing with `crash_odds` in 1000 per reconcile.
    fn teardown(&mut self, rng: &mut Rng, crash_odds: u64) -> Result<TeardownLog, String> {
        log!(self, "-- teardown --");
        self.teardown = true;
        // An operation on a cluster being deleted is cancelled, its hold on the lock with it;
        // so are the reboots for drift.
        if let Some(op) = self.op.take() {
            log!(self, "{}: cancelled by the teardown", op.id);
            self.release(&op.id);
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].drift_reboot.take().is_some() {
                let id = self.nodes[i].drift_id();
                log!(self, "{id}: cancelled by the teardown");
                self.release(&id);
            }
        }
        self.observer_up = true;
        let already_started: BTreeSet<String> = self
            .nodes
            .iter()
            .filter(|n| n.recorded != RemovalStep::Pending)
            .map(|n| n.name.clone())
            .collect();
        let mut log = TeardownLog::default();
        for _ in 0..TEARDOWN_TICKS {
            if self.nodes.is_empty() && self.op.is_none() {
                break;
            }
            self.physical()?;
            self.teardown_deletes()?;
            let mut actions = self.controller_actions();
            // Fisher–Yates.
            for k in (1..actions.len()).rev() {
                actions.swap(k, rng.below(k + 1));
            }
            for action in actions {
                if !self.exists(&action) {
                    continue;
                }
                let crash = rng.chance(crash_odds, 1000);
                self.controller_tick(&action, crash)?;
                let workers_left = self.nodes.iter().any(|n| n.role == Role::Worker);
                if !workers_left && log.workers_gone_at.is_none() {
                    log.workers_gone_at = Some(self.tick);
                }
                for n in self.nodes.iter().filter(|n| n.is_control_plane()) {
                    if n.recorded != RemovalStep::Pending && !already_started.contains(&n.name) {
                        if workers_left {
                            return Err(format!(
                                "control plane {} started its removal before the workers were gone",
                                n.name
                            ));
                        }
                        log.first_control_plane_at.get_or_insert(self.tick);
                        let started = self
                            .nodes
                            .iter()
                            .filter(|m| {
                                m.is_control_plane()
                                    && m.recorded != RemovalStep::Pending
                                    && m.recorded != RemovalStep::Complete
                            })
                            .count();
                        log.most_control_planes_at_once =
                            log.most_control_planes_at_once.max(started);
                    }
                }
            }
        }
        if !self.nodes.is_empty() || self.op.is_some() || !self.lock_free_or_orphaned() {
            return Err(format!(
                "teardown did not finish in {TEARDOWN_TICKS} ticks: machines {:?}, operation \
                 {:?}, lock {:?}",
                self.nodes
                    .iter()
                    .map(|n| (&n.name, n.recorded, &n.held))
                    .collect::<Vec<_>>(),
                self.op,
                self.lock
            ));
        }
        Ok(log)
    }

    /// The teardown's own reconcile: it deletes what `teardown_next` names (admission passes
    /// every delete of a cluster being deleted).
    fn teardown_deletes(&mut self) -> Result<(), String> {
        for name in teardown_next(&self.machines()) {
            let i = self
                .index(&name)
                .ok_or("teardown named a machine that is gone")?;
            let target = Self::machine(&self.nodes[i]);
            if let Err(refusal) =
                check_machine_delete_with(&target, &self.machines(), &self.cluster(), self.rules)
            {
                return Err(format!("teardown delete of {name} refused: {refusal}"));
            }
            self.nodes[i].deleting = true;
            log!(self, "teardown deletes {name}");
        }
        Ok(())
    }

    fn failure(&self, seed: u64, error: &str) -> String {
        format!(
            "seed {seed} failed: {error}\nreplay: {SEED_ENV}={seed} cargo test -p \
             ichor-deleteguard --test sequences\ntrace ({} entries):\n{}",
            self.trace.len(),
            self.trace.join("\n")
        )
    }
}

/// What a teardown did, in order.
#[derive(Debug, Default)]
struct TeardownLog {
    workers_gone_at: Option<usize>,
    first_control_plane_at: Option<usize>,
    most_control_planes_at_once: usize,
}

/// Runs a scenario for `seed`: `setup` builds the world from the seed's generator, `body`
/// drives it. A broken invariant or a panic replays the seed with the trace kept (the run is
/// deterministic) and fails with the seed and the trace.
fn run<T>(
    seed: u64,
    setup: impl Fn(&mut Rng) -> World,
    body: impl Fn(&mut World, &mut Rng) -> Result<T, String>,
) -> (World, T) {
    match attempt(seed, false, &setup, &body) {
        (world, Ok(value)) => (world, value),
        (_, Err(_)) => {
            let (world, outcome) = attempt(seed, true, &setup, &body);
            let error = match outcome {
                Err(error) => error,
                Ok(_) => "failed untraced, passed traced: the model is not deterministic".into(),
            };
            panic!("{}", world.failure(seed, &error));
        }
    }
}

/// One run of a scenario, panics caught.
fn attempt<T>(
    seed: u64,
    tracing: bool,
    setup: &impl Fn(&mut Rng) -> World,
    body: &impl Fn(&mut World, &mut Rng) -> Result<T, String>,
) -> (World, Result<T, String>) {
    let mut rng = Rng::new(seed);
    let mut world = setup(&mut rng);
    world.tracing = tracing;
    let outcome = catch_unwind(AssertUnwindSafe(|| body(&mut world, &mut rng)));
    let outcome = outcome.unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_default();
        Err(format!("panic: {message}"))
    });
    (world, outcome)
}

/// The random scenario: 1 or 3 control planes (and up to 3 workers) declaring as many, random
/// actions,
/// controller ticks until settled, liveness judged, then the cluster torn down.
fn random_scenario(seed: u64) -> World {
    let (world, ()) = run(
        seed,
        |rng| World::start(rng).endpoint_for(seed),
        |w, rng| {
            w.random_phase(rng, RANDOM_TICKS)?;
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            w.teardown(rng, 50)?;
            if w.leaves_skipped.len() != 1 {
                return Err(format!(
                    "the teardown skipped the etcd leave of {:?}: expected exactly the last member",
                    w.leaves_skipped
                ));
            }
            Ok(())
        },
    );
    world
}

#[test]
fn random_sequences_keep_quorum_the_lock_and_once_only_steps() {
    let seeds = rng::seeds(SEEDS);
    let mut total = Coverage::default();
    let mut teardowns = 0;
    for &seed in &seeds {
        let world = random_scenario(seed);
        teardowns += 1;
        total.add(&world.coverage);
    }
    if seeds.len() > 1 {
        // The sequences reach the cases that matter, not only quiet ones.
        let held = |reason: &str| total.held.get(reason).copied().unwrap_or(0);
        assert!(total.control_planes_removed > 1000, "{total:?}");
        assert!(total.operations_completed > 100, "{total:?}");
        assert!(total.reboots > 300, "{total:?}");
        assert!(total.upgrades > 300, "{total:?}");
        assert!(total.control_plane_resets > 30, "{total:?}");
        assert!(total.drift_reboots > 500, "{total:?}");
        assert!(total.drifts_refused > 50, "{total:?}");
        assert!(total.crashes_before_record > 100, "{total:?}");
        assert!(total.once_only_found_done > 10, "{total:?}");
        // Restarted actors found what they had sent done, for every kind of once-only step.
        let found = |what: &str| total.found_done.get(what).copied().unwrap_or(0);
        assert!(found("EtcdLeft by removal") > 10, "{total:?}");
        assert!(found("Reset by removal") > 10, "{total:?}");
        assert!(found("Reboot by operation") > 10, "{total:?}");
        assert!(found("Upgrade by operation") > 10, "{total:?}");
        assert!(found("Reboot by drift") > 5, "{total:?}");
        assert!(
            found("EtcdLeft by operation") + found("Reset by operation") > 5,
            "{total:?}"
        );
        let refused_op = |reason: &str| total.refused_operations.get(reason).copied().unwrap_or(0);
        assert!(refused_op(reasons::QUORUM_AT_RISK) > 100, "{total:?}");
        assert!(refused_op(reasons::LAST_CONTROL_PLANE) > 30, "{total:?}");
        assert!(refused_op(reasons::ALLOW_DELETE_REQUIRED) > 30, "{total:?}");
        assert!(refused_op(reasons::ETCD_UNHEALTHY) > 100, "{total:?}");
        assert!(held("DriftQueued") > 1000, "{total:?}");
        assert!(held("DriftHalted") > 50, "{total:?}");
        let refused = |reason: &str| total.refused_deletes.get(reason).copied().unwrap_or(0);
        assert!(refused(reasons::QUORUM_AT_RISK) > 100, "{total:?}");
        assert!(held(reasons::AWAITING_REPLACEMENT) > 100, "{total:?}");
        assert!(held("LockBusy") > 100, "{total:?}");
        assert!(held("RefusedWhileTransitioning") > 100, "{total:?}");
        assert!(held(reasons::TEARDOWN_WORKERS_FIRST) > 10, "{total:?}");
        assert!(held(reasons::ETCD_UNHEALTHY) > 100, "{total:?}");
        assert!(refused(reasons::ALLOW_DELETE_REQUIRED) > 100, "{total:?}");
        assert!(refused(reasons::ETCD_UNHEALTHY) > 100, "{total:?}");
        assert!(total.sickened > 1000, "{total:?}");
        assert!(total.stale_outages > 1000, "{total:?}");
        assert_eq!(teardowns, seeds.len());
    }
}

#[test]
fn teardown_removes_workers_first_then_control_planes_one_by_one() {
    for control_planes in 1..=7 {
        for workers in 0..=3 {
            let seed = u64::try_from(control_planes * 10 + workers).expect("small");
            let (world, log) = run(
                seed,
                |_| World::new(control_planes, workers, control_planes | 1),
                |w, rng| w.teardown(rng, 0),
            );
            let what = format!("{control_planes} control planes, {workers} workers: {log:?}");
            // All workers gone before the first control plane's removal starts.
            let first = log.first_control_plane_at.expect(&what);
            assert!(log.workers_gone_at.expect(&what) <= first, "{what}");
            // One control plane at a time; each left etcd with quorum kept (checked after
            // every action), the last one without a leave.
            assert_eq!(log.most_control_planes_at_once, 1, "{what}");
            assert_eq!(world.leaves_skipped.len(), 1, "{what}");
            assert_eq!(world.leaves.len(), control_planes - 1, "{what}");
            assert!(!world.leaves.contains(&world.leaves_skipped[0]), "{what}");
        }
    }
}

#[test]
fn teardown_with_crashes_keeps_quorum_until_the_last_member() {
    for seed in rng::seeds(300) {
        run(
            seed,
            |rng| {
                let control_planes = 1 + rng.below(7);
                World::new(control_planes, rng.below(4), control_planes | 1)
            },
            |w, rng| {
                let control_planes = w.nodes.iter().filter(|n| n.voter).count();
                w.teardown(rng, 150)?;
                if w.leaves_skipped.len() != 1 || w.leaves.len() != control_planes - 1 {
                    return Err(format!(
                        "leaves {:?}, skipped {:?}",
                        w.leaves, w.leaves_skipped
                    ));
                }
                Ok(())
            },
        );
    }
}

#[test]
fn a_single_seed_replays_identically() {
    let play = |seed| {
        let (world, outcome) = attempt(
            seed,
            true,
            &|rng: &mut Rng| World::new(3, rng.below(4), 3),
            &|w: &mut World, rng: &mut Rng| w.random_phase(rng, RANDOM_TICKS),
        );
        assert_eq!(outcome, Ok(()));
        world.trace
    };
    assert_eq!(play(7), play(7));
    assert_ne!(play(7), play(8));
}

/// Deletes machine `name` through admission; `Err` if it is refused.
fn delete(w: &mut World, name: &str) -> Result<(), String> {
    let i = w.index(name).ok_or(format!("no machine {name}"))?;
    w.admit_delete(i, true)?;
    if w.nodes[i].deleting {
        Ok(())
    } else {
        Err(format!("delete of {name} refused"))
    }
}

/// The reason the removal of `name` is held for, if it is still there.
fn held(w: &World, name: &str) -> Option<String> {
    w.index(name).and_then(|i| w.nodes[i].held.clone())
}

#[test]
fn a_removal_waits_for_a_replacement_then_goes_3_4_3() {
    run(
        0,
        |_| World::new(3, 0, 3),
        |w, _| {
            delete(w, "cp-1")?;
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            let reason = held(w, "cp-1");
            if reason.as_deref() != Some(reasons::AWAITING_REPLACEMENT) || w.lock.is_some() {
                return Err(format!(
                    "cp-1 should wait unlocked: {reason:?}, {:?}",
                    w.lock
                ));
            }
            // 3 approved, 3 declared: not transitioning, so a reboot runs meanwhile.
            w.start_operation(OpKind::Reboot, &["cp-1", "cp-2", "cp-3"]);
            w.settle(SETTLE_TICKS)?;
            if w.op.is_some() || w.coverage.operations_completed != 1 {
                return Err(format!("the reboot did not run: {:?}", w.op));
            }
            // The replacement: 4 approved, 3 declared; the removal completes the transition.
            let cp = w.approve(Role::ControlPlane);
            w.nodes.push(cp);
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            let voters: Vec<&str> = w
                .nodes
                .iter()
                .filter(|n| n.voter)
                .map(|n| n.name.as_str())
                .collect();
            if w.index("cp-1").is_some() || voters != ["cp-2", "cp-3", "cp-4"] {
                return Err(format!("expected cp-1 gone and 3 voters: {voters:?}"));
            }
            if w.transitioning() || w.lock.is_some() {
                return Err("still transitioning or locked".into());
            }
            Ok(())
        },
    );
}

#[test]
fn lowering_the_declared_count_lets_control_planes_go_first() {
    run(
        0,
        |_| World::new(3, 1, 3),
        |w, _| {
            w.declared = 1;
            delete(w, "w-4")?;
            delete(w, "cp-1")?;
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            if w.index("cp-1").is_some() {
                return Err("cp-1 should be gone: its removal completes the transition".into());
            }
            // 2 approved, 1 declared: still transitioning, and 2 -> 1 is refused at admission,
            // so the worker waits for a transition that removals cannot finish.
            if delete(w, "cp-2").is_ok() {
                return Err("2 -> 1 must be refused".into());
            }
            let reason = held(w, "w-4");
            if reason.as_deref() != Some("RefusedWhileTransitioning") {
                return Err(format!("w-4 should be refused the lock: {reason:?}"));
            }
            // Declaring 3 again and approving a third control plane ends the transition.
            w.declared = 3;
            let cp = w.approve(Role::ControlPlane);
            w.nodes.push(cp);
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            if w.index("w-4").is_some() || w.transitioning() {
                return Err("w-4 should be gone once the transition ended".into());
            }
            Ok(())
        },
    );
}

/// Runs the random scenario for `seed` with `rules` (and people's deletes or not), untraced;
/// the error if an invariant broke.
fn scenario_with(seed: u64, rules: RuleSet, deletes: bool) -> Result<(), String> {
    let setup = |rng: &mut Rng| {
        let mut world = World::start(rng).endpoint_for(seed);
        world.rules = rules;
        world.deletes = deletes;
        world
    };
    let body = |w: &mut World, rng: &mut Rng| {
        w.random_phase(rng, RANDOM_TICKS)?;
        w.settle(SETTLE_TICKS)?;
        w.check_liveness()?;
        w.teardown(rng, 50)?;
        Ok(())
    };
    attempt(seed, false, &setup, &body).1
}

#[test]
fn every_rule_is_caught_when_disabled() {
    let mut caught = Vec::new();
    for rule in Rule::ALL {
        let rules = RuleSet::ALL.without(rule);
        let found = (0..MUTATION_SEEDS).find_map(|seed| {
            scenario_with(seed, rules, true)
                .err()
                .map(|error| (seed, error))
        });
        match found {
            Some((seed, error)) => caught.push(format!("{rule:?}: seed {seed}: {error}")),
            None => panic!(
                "with {rule:?} disabled, {MUTATION_SEEDS} seeds broke no invariant: the rule \
                 is not needed, or the model does not reach what it protects"
            ),
        }
    }
    // What caught each rule, for the reader of the test output.
    for line in &caught {
        println!("{line}");
    }
    assert_eq!(caught.len(), Rule::ALL.len());
}

#[test]
fn an_operation_held_by_an_unhealthy_voter_lets_the_way_out_through() {
    run(
        0,
        |_| World::new(3, 0, 3),
        |w, _| {
            // cp-3 falls sick, and the manager sees it.
            let sick = w.index("cp-3").ok_or("cp-3")?;
            w.nodes[sick].healthy = false;
            w.observe(sick);
            // A reboot of every control plane, admitted before: the first, healthy, is held.
            w.start_operation(OpKind::Reboot, &["cp-1", "cp-2", "cp-3"]);
            w.controller_tick(&Action::Operation, false)?;
            let held = w.op.as_ref().and_then(|op| op.held.clone());
            if held.as_deref() != Some(reasons::ETCD_UNHEALTHY) {
                return Err(format!("the reboot should wait for etcd: {held:?}"));
            }
            // The way out: a replacement, then the sick member's removal. Neither may be locked
            // out by the waiting operation. No member heals meanwhile.
            let replacement = w.approve(Role::ControlPlane);
            w.nodes.push(replacement);
            delete(w, "cp-3")?;
            for _ in 0..SETTLE_TICKS {
                w.physical()?;
                for i in 0..w.nodes.len() {
                    if !w.nodes[i].applied && !w.nodes[i].deleting {
                        w.configure(i);
                    }
                }
                for action in w.controller_actions() {
                    if w.exists(&action) {
                        w.controller_tick(&action, false)?;
                    }
                }
                if w.index("cp-3").is_none() && w.op.is_none() {
                    return Ok(());
                }
            }
            Err(format!(
                "stuck: cp-3 {:?}, operation {:?}, lock {:?}",
                w.index("cp-3").map(|i| &w.nodes[i].held),
                w.op,
                w.lock
            ))
        },
    );
}

#[test]
fn every_rule_is_caught_by_operations_and_drift_alone() {
    // No deletes by people: resets, reboots, upgrades and reboots for drift are the only
    // disruptions until the teardown, and each rule is still needed.
    let mut caught = Vec::new();
    for rule in Rule::ALL {
        let rules = RuleSet::ALL.without(rule);
        let found = (0..MUTATION_SEEDS).find_map(|seed| {
            scenario_with(seed, rules, false)
                .err()
                .map(|error| (seed, error))
        });
        match found {
            Some((seed, error)) => caught.push(format!("{rule:?}: seed {seed}: {error}")),
            None => panic!(
                "with {rule:?} disabled and no deletes, {MUTATION_SEEDS} seeds broke no \
                 invariant: operations and drift do not need the rule, or the model does not \
                 reach what it protects"
            ),
        }
    }
    for line in &caught {
        println!("{line}");
    }
    assert_eq!(caught.len(), Rule::ALL.len());
}

/// Reconciles the operation until it is done; `Err` if it is not within `ticks`.
fn run_operation(w: &mut World, ticks: usize) -> Result<(), String> {
    for _ in 0..ticks {
        if w.op.is_none() {
            return Ok(());
        }
        w.physical()?;
        w.controller_tick(&Action::Operation, false)?;
    }
    match &w.op {
        None => Ok(()),
        Some(op) => Err(format!("the operation is not done: {op:?}")),
    }
}

/// The once-only steps `by` performed on `name`, in name order.
fn once_only_steps(w: &World, by: &str, name: &str) -> Vec<&'static str> {
    w.once_only
        .keys()
        .filter(|(action, machine, _)| action == by && machine == name)
        .map(|(_, _, what)| *what)
        .collect()
}

#[test]
fn a_reset_leaves_etcd_through_the_removal_steps_and_the_machine_stays() {
    run(
        0,
        |_| World::new(5, 0, 3),
        |w, _| {
            w.admit_operation(OpKind::Reset, vec!["cp-1".into()], true)?;
            if w.op.is_none() {
                return Err("the reset of one control plane of five was refused".into());
            }
            run_operation(w, 20)?;
            let i = w
                .index("cp-1")
                .ok_or("cp-1 is gone: a reset keeps the machine")?;
            let n = &w.nodes[i];
            if n.voter || n.applied || !n.maintenance || n.record.is_some() {
                return Err(format!(
                    "cp-1 should be out of etcd and in maintenance, its config and etcd record \
                     forgotten: {n:?}"
                ));
            }
            let steps = once_only_steps(w, "operation/reset-1", "cp-1");
            if steps != ["EtcdLeft", "Reset"] || w.voters() != 4 {
                return Err(format!("steps {steps:?}, {} voters", w.voters()));
            }
            // Configured again, it joins etcd as a new member.
            w.configure(i);
            w.physical()?;
            if !w.nodes[i].voter {
                return Err("cp-1 did not join etcd again".into());
            }
            Ok(())
        },
    );
}

#[test]
fn a_reset_down_to_the_declared_count_waits_for_a_replacement() {
    run(
        0,
        |_| World::new(3, 0, 3),
        |w, _| {
            w.admit_operation(OpKind::Reset, vec!["cp-1".into()], true)?;
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            let held = w.op.as_ref().and_then(|op| op.held.clone());
            if held.as_deref() != Some(reasons::AWAITING_REPLACEMENT) || w.lock.is_some() {
                return Err(format!(
                    "the reset should wait unlocked: {held:?}, {:?}",
                    w.lock
                ));
            }
            // The replacement: 4 approved, 3 declared; the reset of a surplus control plane
            // completes the transition.
            let cp = w.approve(Role::ControlPlane);
            w.nodes.push(cp);
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            let steps = once_only_steps(w, "operation/reset-1", "cp-1");
            if w.op.is_some() || steps != ["EtcdLeft", "Reset"] {
                return Err(format!("the reset did not run: {:?}, {steps:?}", w.op));
            }
            Ok(())
        },
    );
}

#[test]
fn a_crash_after_sending_a_restart_finds_it_done_instead_of_sending_it_again() {
    for kind in [OpKind::Reboot, OpKind::Upgrade] {
        run(
            0,
            |_| World::new(3, 0, 3),
            |w, _| {
                w.admit_operation(kind, vec!["cp-1".into(), "cp-2".into()], true)?;
                w.physical()?;
                // Sent to cp-1; the manager crashes before recording it sent.
                w.controller_tick(&Action::Operation, true)?;
                let step = w.op.as_ref().map(|op| op.step);
                if !matches!(step, Some(OpStep::Intent { .. })) {
                    return Err(format!("only the intent should be recorded: {step:?}"));
                }
                run_operation(w, 20)?;
                let boots: Vec<u32> = w.nodes.iter().map(|n| n.boots).collect();
                if boots != [1, 1, 0] || w.coverage.once_only_found_done != 1 {
                    return Err(format!(
                        "{kind:?}: boots {boots:?}, found done {}",
                        w.coverage.once_only_found_done
                    ));
                }
                Ok(())
            },
        );
    }
}

#[test]
fn a_config_a_node_refuses_halts_the_rollout_until_the_patch_is_fixed() {
    run(
        0,
        |_| World::new(3, 1, 3),
        |w, _| {
            // A cluster patch, config 1, which cp-2 refuses.
            for n in &mut w.nodes {
                n.rendered = 1;
            }
            w.refusals.insert(("cp-2".into(), 1));
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            let configs = |w: &World| -> Vec<u32> { w.nodes.iter().map(|n| n.config).collect() };
            let boots = |w: &World| -> Vec<u32> { w.nodes.iter().map(|n| n.boots).collect() };
            // cp-1 took it, cp-2 refused it and the rollout stopped there: cp-3 and the worker
            // did not get it, and nothing holds the lock.
            if configs(w) != [1, 0, 0, 0] || boots(w) != [1, 0, 0, 0] || w.lock.is_some() {
                return Err(format!(
                    "configs {:?}, boots {:?}, lock {:?}",
                    configs(w),
                    boots(w),
                    w.lock
                ));
            }
            let halt = w
                .drift_halt
                .as_ref()
                .map(|h| (h.machine.as_str(), h.rendered.as_str()));
            if halt != Some(("cp-2", "1")) {
                return Err(format!("the halt should name cp-2 and config 1: {halt:?}"));
            }
            // The patch fixed: config 2 for every machine, which they all take, control planes
            // first, the halt cleared.
            for n in &mut w.nodes {
                n.rendered = 2;
            }
            w.settle(SETTLE_TICKS)?;
            w.check_liveness()?;
            if configs(w) != [2, 2, 2, 2] || boots(w) != [2, 1, 1, 1] || w.drift_halt.is_some() {
                return Err(format!(
                    "configs {:?}, boots {:?}, halt {:?}",
                    configs(w),
                    boots(w),
                    w.drift_halt
                ));
            }
            Ok(())
        },
    );
}
