//! Randomized, seeded, replayable sequences on a model of one cluster: machines approved,
//! configured and joining etcd, deletes admitted (with or without the allow-delete annotation),
//! removals stepping under the cluster lock, a reboot operation across the control planes, etcd
//! members falling sick and healing, the manager's observations of them recorded or not (an
//! observer outage lets them go stale), the declared count changed, the manager crashing
//! (between performing a step and recording it, too), and finally the cluster torn down.
//!
//! Every decision is the planner's (`ichor_deleteguard::plan`, through `check_machine_delete_with`
//! at admission and `check_with` in the controller: at step Pending, right before the etcd leave
//! and before each reboot), with `next_removal_step`, `is_once_only`, `lock_decision`,
//! `transitioning`, `removal_completes_transition` and `teardown_next`. The planner sees only the
//! recorded observations; the model keeps the truth. It performs what the planner decides and
//! checks, in closed form over the truth, that etcd keeps quorum, the cluster keeps a voter, a
//! control plane leaves etcd only while the voters staying keep quorum of the voters before and
//! with its allow-delete annotation, no healthy control plane is disrupted while another voter
//! is unhealthy, a removal starts only with the declared count of healthy voters staying, one
//! action at most holds the lock, no once-only step runs twice and one node at most is down.
//!
//! Each rule of the planner's table is needed: `every_rule_is_caught_when_disabled` runs the
//! seeds with one rule left out at a time and expects a broken invariant for each.
//!
//! A failure prints the seed and the action trace; `ICHOR_TEST_SEED=<n> cargo test -p
//! ichor-deleteguard --test sequences` replays one seed.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use ichor_api::common::Role;
use ichor_api::machine::RemovalStep;
use ichor_deleteguard::{
    Cluster, Disruption, LockDecision, LockView, Machine, Observation, Rule, RuleSet, Stage,
    Verdict, approved_control_planes, check_machine_delete_with, check_with, etcd_quorum,
    is_once_only, lock_decision, next_removal_step, reasons, removal_completes_transition,
    teardown_next, transitioning,
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
    /// Configured as control plane, joining etcd at the next tick.
    joining: bool,
    /// Rebooting; up again at the next tick.
    down: bool,
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

    /// A voter that is up and healthy, in truth.
    fn serving(&self) -> bool {
        self.voter && self.healthy && !self.down
    }
}

/// The reboot operation: one control plane at a time, etcd healthy before the next.
#[derive(Clone, Debug, PartialEq)]
struct Operation {
    id: String,
    /// Control planes to reboot, by name.
    targets: Vec<String>,
    /// Recorded: the next target.
    index: usize,
    /// Recorded: the current target was rebooted, waiting for etcd health.
    rebooted: bool,
    /// The last reason it was held.
    held: Option<String>,
}

/// Totals over all seeds, so the test can show it reached the interesting cases.
#[derive(Clone, Debug, Default)]
struct Coverage {
    removals_completed: usize,
    control_planes_removed: usize,
    operations_completed: usize,
    reboots: usize,
    crashes: usize,
    crashes_before_record: usize,
    once_only_found_done: usize,
    held: BTreeMap<String, usize>,
    refused_deletes: BTreeMap<&'static str, usize>,
    declared_changes: usize,
    sickened: usize,
    stale_outages: usize,
}

/// The model of one cluster.
struct World {
    nodes: Vec<Node>,
    declared: usize,
    /// The rules the planner applies (all of them, but in the mutation test).
    rules: RuleSet,
    /// The manager observes every configured control plane each tick.
    observer_up: bool,
    /// The TalosCluster is being deleted.
    teardown: bool,
    lock: Option<LockView>,
    /// Actions whose in-memory state says they hold the lock (lost on a crash).
    holders: BTreeSet<String>,
    op: Option<Operation>,
    /// Once-only steps performed, by machine and step.
    once_only: BTreeMap<(String, RemovalStep), usize>,
    /// The first once-only step performed twice.
    twice: Option<String>,
    /// Control planes whose etcd leave was skipped as the last member of a teardown.
    leaves_skipped: Vec<String>,
    /// Control planes that performed their etcd leave.
    leaves: Vec<String>,
    next_name: usize,
    next_op: usize,
    tick: usize,
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
            observer_up: true,
            teardown: false,
            lock: None,
            holders: BTreeSet::new(),
            op: None,
            once_only: BTreeMap::new(),
            twice: None,
            leaves_skipped: Vec::new(),
            leaves: Vec::new(),
            next_name: 0,
            next_op: 0,
            tick: 0,
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
            down: false,
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
        m
    }

    fn machines(&self) -> Vec<Machine> {
        self.nodes.iter().map(Self::machine).collect()
    }

    fn cluster(&self) -> Cluster {
        let c = Cluster::new("prod", self.declared)
            .in_namespace("infra")
            .at(self.now())
            .observations_valid_for(MAX_AGE);
        if self.teardown { c.being_deleted() } else { c }
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
    /// control planes join etcd.
    fn physical(&mut self) -> Result<(), String> {
        self.tick += 1;
        for n in &mut self.nodes {
            n.down = false;
            if n.joining {
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

    /// A sick member heals.
    fn heal(&mut self, rng: &mut Rng) {
        let sick: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| !self.nodes[i].healthy)
            .collect();
        if sick.is_empty() {
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
        let n = &mut self.nodes[i];
        n.applied = true;
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
        self.perform(i, next)?;
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

    /// A control plane's removal starts (outside a teardown): the healthy voters staying, not
    /// being deleted, are at least the declared count (closed form, over the truth).
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
                "the removal of {} started with {staying} healthy voters staying, below the \
                 declared {}",
                target.name, self.declared
            ));
        }
        Ok(())
    }

    /// Machine `i` is about to be taken out of etcd (`leaves`) or down: the invariants that
    /// hold the planner to account, in closed form over the truth. Outside a teardown, a
    /// control plane leaves only with its allow-delete annotation and while the voters staying
    /// keep quorum of the voters before it; and no healthy control plane is disrupted while
    /// another voter is not serving.
    fn disrupting(&self, i: usize, leaves: bool) -> Result<(), String> {
        let target = &self.nodes[i];
        if self.teardown || !target.voter {
            return Ok(());
        }
        if leaves {
            if !target.allow_delete {
                return Err(format!(
                    "{} leaves etcd without the allow-delete annotation",
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

    /// Performs `step` of the removal of `i` on the node (not recorded yet).
    fn perform(&mut self, i: usize, step: RemovalStep) -> Result<(), String> {
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
                    self.coverage.once_only_found_done += 1;
                    log!(self, "  {name} is not an etcd member: leave recorded");
                } else if self.teardown && other_voters == 0 {
                    if !self.leaves_skipped.contains(&name) {
                        self.leaves_skipped.push(name.clone());
                    }
                    log!(self, "  {name} is the last member: no etcd leave");
                } else {
                    self.disrupting(i, true)?;
                    self.performed_once_only(&name, step);
                    self.nodes[i].voter = false;
                    self.leaves.push(name.clone());
                    log!(self, "  {name} leaves etcd");
                }
            }
            RemovalStep::Reset => {
                if is_once_only(step) && self.nodes[i].maintenance {
                    self.coverage.once_only_found_done += 1;
                    log!(self, "  {name} is in maintenance: reset recorded");
                } else {
                    self.performed_once_only(&name, step);
                    if self.nodes[i].voter {
                        if !(self.teardown && other_voters == 0) {
                            return Err(format!(
                                "{name} was reset while still an etcd member with {other_voters} \
                                 other members"
                            ));
                        }
                        self.nodes[i].voter = false;
                    }
                    self.nodes[i].maintenance = true;
                    log!(self, "  {name} reset");
                }
            }
            RemovalStep::Complete => {}
            RemovalStep::Pending => return Err(format!("{name}: performed Pending")),
        }
        self.check()
    }

    /// Counts a performed once-only step; a second time is a broken invariant.
    fn performed_once_only(&mut self, name: &str, step: RemovalStep) {
        let n = self.once_only.entry((name.to_owned(), step)).or_default();
        *n += 1;
        // Stated here, not through `is_once_only`: the invariant must not move with it.
        if matches!(step, RemovalStep::EtcdLeft | RemovalStep::Reset)
            && *n > 1
            && self.twice.is_none()
        {
            self.twice = Some(format!("{step:?} of {name} performed {n} times"));
        }
    }

    /// Starts a reboot of every control plane, one at a time.
    fn start_operation(&mut self) {
        if self.op.is_some() {
            return;
        }
        let targets: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| n.voter)
            .map(|n| n.name.clone())
            .collect();
        if targets.is_empty() {
            return;
        }
        self.next_op += 1;
        let id = format!("operation/reboot-{}", self.next_op);
        log!(self, "start {id} over {targets:?}");
        self.op = Some(Operation {
            id,
            targets,
            index: 0,
            rebooted: false,
            held: None,
        });
    }

    /// One reconcile of the operation.
    fn operation_tick(&mut self, crash_before_record: bool) -> Result<(), String> {
        let Some(mut op) = self.op.clone() else {
            return Ok(());
        };
        let id = op.id.clone();
        // An operation completes no transition (a teardown cancels it).
        let decision = lock_decision(self.lock.as_ref(), &id, self.transitioning(), false);
        if !decision.holds() {
            let reason = match &decision {
                LockDecision::Busy { .. } => "LockBusy",
                _ => "RefusedWhileTransitioning",
            };
            if op.held.as_deref() != Some(reason) {
                log!(self, "{id}: held, {reason}");
                op.held = Some(reason.to_owned());
            }
            self.op = Some(op);
            return Ok(());
        }
        self.hold(&id, &decision)?;
        op.held = None;
        if op.rebooted {
            // The node rebooted: go on once it is back and healthy (the operation looks at it).
            let back = self
                .index(&op.targets[op.index])
                .is_none_or(|i| self.nodes[i].serving() || !self.nodes[i].voter);
            if back {
                if crash_before_record {
                    log!(self, "{id}: healthy; crash before recording");
                    self.crash();
                } else {
                    op.rebooted = false;
                    op.index += 1;
                    log!(
                        self,
                        "{id}: etcd healthy after {}",
                        op.targets[op.index - 1]
                    );
                }
            }
            self.op = Some(op);
            return self.check();
        }
        while op.index < op.targets.len()
            && !self
                .index(&op.targets[op.index])
                .is_some_and(|i| self.nodes[i].voter)
        {
            op.index += 1;
        }
        if op.index == op.targets.len() {
            self.release(&id);
            self.op = None;
            self.coverage.operations_completed += 1;
            log!(self, "{id}: done");
            return self.check();
        }
        // The planner: etcd healthy enough to take this node down (a cluster declaring 3 with 3
        // approved control planes is not transitioning while the third is still being
        // configured, with 2 etcd members: seed 115 loses quorum without a check here).
        let i = self.index(&op.targets[op.index]).ok_or("target gone")?;
        let verdict = self.plan(i, &Disruption::Restart, Stage::Run);
        if !verdict.is_proceed() {
            let reason = verdict.reason().unwrap_or_default().to_owned();
            if op.held.as_deref() != Some(reason.as_str()) {
                log!(self, "{id}: held before {}, {reason}", self.nodes[i].name);
                *self.coverage.held.entry(reason.clone()).or_default() += 1;
                op.held = Some(reason);
            }
            // Nothing was sent to this node: the lock goes meanwhile, so the action that can end
            // the hold is not locked out by it.
            self.release(&id);
            self.op = Some(op);
            return self.check();
        }
        self.disrupting(i, false)?;
        self.nodes[i].down = true;
        // The operation saw it go down.
        self.nodes[i].record = Some(Observation {
            voter: self.nodes[i].voter,
            healthy: false,
            at: self.now(),
        });
        self.coverage.reboots += 1;
        log!(self, "{id}: reboots {}", self.nodes[i].name);
        if crash_before_record {
            log!(self, "{id}: crash before recording the reboot");
            self.crash();
        } else {
            op.rebooted = true;
        }
        self.op = Some(op);
        self.check()
    }

    /// The actions the controller reconciles: every removal, then the operation.
    fn controller_actions(&self) -> Vec<Option<String>> {
        let mut actions: Vec<Option<String>> = self
            .nodes
            .iter()
            .filter(|n| n.deleting)
            .map(|n| Some(n.name.clone()))
            .collect();
        if self.op.is_some() {
            actions.push(None);
        }
        actions
    }

    fn controller_tick(&mut self, action: Option<&str>, crash: bool) -> Result<(), String> {
        match action {
            Some(name) => self.removal_tick(name, crash),
            None => self.operation_tick(crash),
        }
    }

    // ---- Invariants ---------------------------------------------------------------------

    fn check(&self) -> Result<(), String> {
        let (voters, up) = (self.voters(), self.voters_up());
        // A single voter restarting is down by necessity: no order avoids it, and it keeps its
        // data.
        let single_restart = voters == 1 && self.nodes.iter().any(|n| n.voter && n.down);
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
        let down: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.down)
            .map(|n| n.name.as_str())
            .collect();
        if down.len() > 1 {
            return Err(format!("{down:?} are down at once"));
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
                6..=8 => {
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
                10 => self.start_operation(),
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
                        self.controller_tick(action.as_deref(), crash)?;
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
                self.controller_tick(action.as_deref(), false)?;
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
            let decision = lock_decision(self.lock.as_ref(), &op.id, moving, false);
            if decision != LockDecision::RefusedWhileTransitioning || !self.transitioning_by_rule()
            {
                return Err(format!("operation stuck ({decision:?}): {op:?}"));
            }
        }
        Ok(())
    }

    /// Whether nothing holds the lock: free, or expired with a holder that no longer exists.
    fn lock_free_or_orphaned(&self) -> bool {
        let Some(lock) = &self.lock else {
            return true;
        };
        let exists = self.nodes.iter().any(|n| n.removal_id() == lock.holder)
            || self.op.as_ref().is_some_and(|op| op.id == lock.holder);
        lock.expired && !exists
    }

    /// The transition rule in closed form, independent of `transitioning`: the declared count
    /// is even, or the approved control planes differ from it.
    fn transitioning_by_rule(&self) -> bool {
        let approved = self.nodes.iter().filter(|n| n.is_control_plane()).count();
        self.declared.is_multiple_of(2) || approved != self.declared
    }

    /// The completion rule in closed form, independent of `completes_transition`: a teardown
    /// completes everything; otherwise only the removal of a control plane while the approved
    /// ones outnumber the declared count (an operation completes nothing).
    fn completes_by_rule(&self, id: &str) -> bool {
        let approved = self.nodes.iter().filter(|n| n.is_control_plane()).count();
        let removal = id
            .strip_prefix("removal/")
            .and_then(|name| self.index(name));
        let started = removal.is_some_and(|i| self.nodes[i].recorded > RemovalStep::Pending);
        let control_plane_removal = removal.is_some_and(|i| self.nodes[i].is_control_plane());
        self.teardown || started || (control_plane_removal && approved > self.declared)
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
        // An operation on a cluster being deleted is cancelled, its hold on the lock with it.
        if let Some(op) = self.op.take() {
            log!(self, "{}: cancelled by the teardown", op.id);
            self.release(&op.id);
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
                if action
                    .as_deref()
                    .is_some_and(|name| self.index(name).is_none())
                {
                    continue;
                }
                let crash = rng.chance(crash_odds, 1000);
                self.controller_tick(action.as_deref(), crash)?;
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
    let (world, ()) = run(seed, World::start, |w, rng| {
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
    });
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
        let c = &world.coverage;
        total.removals_completed += c.removals_completed;
        total.control_planes_removed += c.control_planes_removed;
        total.operations_completed += c.operations_completed;
        total.reboots += c.reboots;
        total.crashes += c.crashes;
        total.crashes_before_record += c.crashes_before_record;
        total.once_only_found_done += c.once_only_found_done;
        for (reason, n) in &c.refused_deletes {
            *total.refused_deletes.entry(reason).or_default() += n;
        }
        total.declared_changes += c.declared_changes;
        total.sickened += c.sickened;
        total.stale_outages += c.stale_outages;
        for (reason, n) in &c.held {
            *total.held.entry(reason.clone()).or_default() += n;
        }
    }
    if seeds.len() > 1 {
        // The sequences reach the cases that matter, not only quiet ones.
        let held = |reason: &str| total.held.get(reason).copied().unwrap_or(0);
        assert!(total.control_planes_removed > 1000, "{total:?}");
        assert!(total.operations_completed > 100, "{total:?}");
        assert!(total.reboots > 1000, "{total:?}");
        assert!(total.crashes_before_record > 100, "{total:?}");
        assert!(total.once_only_found_done > 10, "{total:?}");
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
            w.start_operation();
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

/// Runs the random scenario for `seed` with `rules`, untraced; the error if an invariant broke.
fn scenario_with(seed: u64, rules: RuleSet) -> Result<(), String> {
    let setup = |rng: &mut Rng| {
        let mut world = World::start(rng);
        world.rules = rules;
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
        let found = (0..MUTATION_SEEDS)
            .find_map(|seed| scenario_with(seed, rules).err().map(|error| (seed, error)));
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
            // A reboot of every control plane: the first, healthy, is held.
            w.start_operation();
            w.controller_tick(None, false)?;
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
                    if action.as_deref().is_none_or(|name| w.index(name).is_some()) {
                        w.controller_tick(action.as_deref(), false)?;
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
