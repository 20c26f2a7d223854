//! Property tests: a cluster driven by random sequences of machines added, configs applied,
//! annotations set, updates tried, deletes tried (kept only when allowed) and removals
//! completing, never loses etcd quorum or its last control plane.

use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;
use ichor_deleteguard::{
    Cluster, Machine, Observation, check_machine_delete, check_machine_removal,
    check_machine_update, etcd_quorum,
};
use proptest::prelude::*;

/// One thing that happens to the cluster.
#[derive(Clone, Debug)]
enum Op {
    /// A control plane is approved (config not applied yet).
    AddControlPlane { annotated: bool },
    /// A worker is approved.
    AddWorker,
    /// A machine is discovered.
    AddPending,
    /// The controller applies the config of an approved machine.
    Apply(usize),
    /// A person sets the allow-delete annotation.
    Annotate(usize),
    /// A person tries to change approval and role.
    Update {
        index: usize,
        approval: ApprovalState,
        role: Option<Role>,
    },
    /// A person tries to delete a machine.
    Delete(usize),
    /// A removal in progress finishes: the machine leaves etcd and disappears.
    Complete(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let approval = prop_oneof![
        Just(ApprovalState::Pending),
        Just(ApprovalState::Approved),
        Just(ApprovalState::Rejected),
    ];
    let role = prop_oneof![
        Just(None),
        Just(Some(Role::ControlPlane)),
        Just(Some(Role::Worker)),
    ];
    prop_oneof![
        1 => any::<bool>().prop_map(|annotated| Op::AddControlPlane { annotated }),
        1 => Just(Op::AddWorker),
        1 => Just(Op::AddPending),
        2 => any::<usize>().prop_map(Op::Apply),
        2 => any::<usize>().prop_map(Op::Annotate),
        2 => (any::<usize>(), approval, role)
            .prop_map(|(index, approval, role)| Op::Update { index, approval, role }),
        6 => any::<usize>().prop_map(Op::Delete),
        4 => any::<usize>().prop_map(Op::Complete),
    ]
}

/// The admission guard under test, replaceable to show the model catches a wrong one.
type Guard = fn(&Machine, &[Machine], &Cluster) -> bool;

fn real_guard(target: &Machine, machines: &[Machine], cluster: &Cluster) -> bool {
    check_machine_delete(target, machines, cluster).is_ok()
}

/// A model cluster.
struct World {
    machines: Vec<Machine>,
    cluster: Cluster,
    /// Whether removals complete only when the controller's recheck says proceed.
    controller: bool,
    guard: Guard,
    /// Live members at the start.
    initial: usize,
    next: usize,
}

/// Whether a machine is in etcd: a control plane whose config was applied (being deleted or
/// not, until its removal completes).
fn in_etcd(m: &Machine) -> bool {
    m.role == Some(Role::ControlPlane) && m.applied
}

impl World {
    fn new(
        members: usize,
        workers: usize,
        declared: usize,
        controller: bool,
        guard: Guard,
    ) -> Self {
        let mut world = Self {
            machines: Vec::new(),
            cluster: Cluster::new("prod", declared),
            controller,
            guard,
            initial: members,
            next: 0,
        };
        for _ in 0..members {
            let m = world
                .named()
                .control_plane()
                .approved()
                .config_applied()
                .healthy();
            world.machines.push(m.allowing_delete());
        }
        for _ in 0..workers {
            let m = world.named().worker().approved().config_applied();
            world.machines.push(m);
        }
        world
    }

    fn named(&mut self) -> Machine {
        self.next += 1;
        Machine::new(format!("m-{}", self.next))
    }

    fn etcd_members(&self) -> usize {
        self.machines.iter().filter(|m| in_etcd(m)).count()
    }

    fn live_members(&self) -> usize {
        self.machines
            .iter()
            .filter(|m| in_etcd(m) && !m.deleting)
            .count()
    }

    fn pick(&self, i: usize) -> Option<usize> {
        (!self.machines.is_empty()).then(|| i % self.machines.len())
    }

    /// Applies one step; `Err` names a broken invariant.
    fn step(&mut self, op: &Op) -> Result<(), String> {
        match *op {
            Op::AddControlPlane { annotated } => {
                let mut m = self.named().control_plane().approved();
                m.allow_delete = annotated;
                self.machines.push(m);
            }
            Op::AddWorker => {
                let m = self.named().worker().approved();
                self.machines.push(m);
            }
            Op::AddPending => {
                let m = self.named();
                self.machines.push(m);
            }
            Op::Apply(i) => {
                if let Some(i) = self.pick(i) {
                    let m = &mut self.machines[i];
                    if m.approval == ApprovalState::Approved && m.role.is_some() && !m.deleting {
                        m.applied = true;
                        // It joins etcd and the manager observes it healthy.
                        m.etcd = Some(Observation::healthy_voter(0));
                    }
                }
            }
            Op::Annotate(i) => {
                if let Some(i) = self.pick(i) {
                    self.machines[i].allow_delete = true;
                }
            }
            Op::Update {
                index,
                approval,
                role,
            } => {
                if let Some(i) = self.pick(index) {
                    let old = self.machines[i].clone();
                    let mut new = old.clone();
                    new.approval = approval;
                    new.role = role;
                    match check_machine_update(&old, &new) {
                        Ok(()) => self.machines[i] = new,
                        Err(_) if old.applied => {}
                        Err(r) => return Err(format!("refused an update before apply: {r}")),
                    }
                }
            }
            Op::Delete(i) => {
                if let Some(i) = self.pick(i) {
                    let target = self.machines[i].clone();
                    if (self.guard)(&target, &self.machines, &self.cluster) {
                        self.machines[i].deleting = true;
                    }
                }
            }
            Op::Complete(i) => {
                let deleting: Vec<usize> = (0..self.machines.len())
                    .filter(|&j| self.machines[j].deleting)
                    .collect();
                if deleting.is_empty() {
                    return Ok(());
                }
                let j = deleting[i % deleting.len()];
                let target = self.machines[j].clone();
                if self.controller
                    && !check_machine_removal(&target, &self.machines, &self.cluster).is_proceed()
                {
                    return Ok(());
                }
                if in_etcd(&target) {
                    let k = self.etcd_members();
                    if k - 1 < etcd_quorum(k) {
                        return Err(format!("{} left etcd at {k} -> {}", target.name, k - 1));
                    }
                    if self.controller && k - 1 < self.cluster.declared_control_planes {
                        return Err(format!(
                            "{} left etcd at {k} -> {}, below the declared {}",
                            target.name,
                            k - 1,
                            self.cluster.declared_control_planes
                        ));
                    }
                }
                self.machines.remove(j);
            }
        }
        self.check()
    }

    /// The invariants after every step.
    fn check(&self) -> Result<(), String> {
        if self.initial > 0 && self.etcd_members() == 0 {
            return Err("no control plane left".into());
        }
        let floor = self.initial.min(2);
        if self.live_members() < floor {
            return Err(format!(
                "{} control planes not being deleted, started at {}",
                self.live_members(),
                self.initial
            ));
        }
        Ok(())
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), String> {
        for (n, op) in ops.iter().enumerate() {
            self.step(op).map_err(|e| format!("step {n} {op:?}: {e}"))?;
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Admission alone (removals complete whatever the controller would say) keeps quorum and
    /// at least one control plane.
    #[test]
    fn admitted_deletes_never_break_quorum(
        members in 0usize..=7,
        workers in 0usize..=3,
        ops in prop::collection::vec(op(), 0..60),
    ) {
        let mut world = World::new(members, workers, 1, false, real_guard);
        if let Err(e) = world.run(&ops) {
            prop_assert!(false, "{}", e);
        }
    }

    /// With the controller's recheck, removals also never go below the declared count.
    #[test]
    fn removals_never_break_quorum_or_the_declared_count(
        members in 0usize..=7,
        workers in 0usize..=3,
        declared in 1usize..=7,
        ops in prop::collection::vec(op(), 0..60),
    ) {
        let mut world = World::new(members, workers, declared, true, real_guard);
        if let Err(e) = world.run(&ops) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// Counting members already being deleted as remaining lets two deletes at three both through.
fn naive_guard(target: &Machine, machines: &[Machine], _: &Cluster) -> bool {
    if !in_etcd(target) {
        return true;
    }
    let members = machines.iter().filter(|m| in_etcd(m)).count();
    // Remaining `members - 1` at or above quorum.
    members > etcd_quorum(members)
}

#[test]
fn the_model_catches_counting_deleting_machines_as_members() {
    let ops = [
        Op::Delete(0),
        Op::Delete(1),
        Op::Complete(0),
        Op::Complete(0),
    ];
    let mut naive = World::new(3, 0, 1, false, naive_guard);
    let broken = naive
        .run(&ops)
        .expect_err("the naive guard must break an invariant");
    assert!(
        broken.contains("not being deleted, started at 3"),
        "{broken}"
    );
    let mut real = World::new(3, 0, 1, false, real_guard);
    real.run(&ops).expect("the real guard keeps quorum");
    assert_eq!(real.etcd_members(), 2);
}
