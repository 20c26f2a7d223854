//! The safety check before a disruptive step (an etcd leave, a reset, a reboot): the acting
//! reconciler looks at every voter again ([`refresh_voters`], which records what it saw), and
//! `ichor-deleteguard`'s planner decides on that snapshot ([`check`]). The machine reconciler
//! records each control plane's etcd member every time it looks at the node; only this check
//! calls every node.

use ichor_api::common::Role;
use ichor_api::machine::MachineEtcd;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Disruption, Machine, Stage, Verdict};
use ichor_talos::Credentials;
use kube::ResourceExt as _;
use kube::api::Api;

use crate::etcd::{etcd_answer, etcd_observation};
use crate::infra::status::{self, Guard};
use crate::{Context, Error};

/// The planner's view of `cluster` and its `machines`, as recorded, judged now.
pub fn snapshot(
    ctx: &Context,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
) -> (Cluster, Vec<Machine>) {
    let view = Cluster::from(cluster).at(ctx.clock.now().as_second());
    (view, machines.iter().map(Machine::from).collect())
}

/// Looks at every configured control plane's etcd member now and records what it saw in each
/// machine's `status.etcd`; returns the machines with their new observations.
pub async fn refresh_voters(
    ctx: &Context,
    machines: &[TalosMachine],
    credentials: &Credentials,
) -> Result<Vec<TalosMachine>, Error> {
    let mut observed = machines.to_vec();
    for machine in &mut observed {
        let address = crate::controller::machine::address(machine).unwrap_or_default();
        let Some(status) = machine.status.as_mut() else {
            continue;
        };
        if machine.spec.role != Some(Role::ControlPlane) || status.applied.config_hash.is_none() {
            continue;
        }
        let answer = etcd_answer(&address, credentials).await;
        let observation = etcd_observation(status.etcd.observed.as_ref(), answer, ctx.clock.now());
        if status.etcd.observed.as_ref() == Some(&observation) {
            continue;
        }
        let mut next = status.clone();
        next.etcd.observed = Some(observation);
        let machines: Api<TalosMachine> =
            Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
        let written = status::apply::<MachineEtcd, _>(&machines, machine, &next, Guard::None).await;
        machine.status = Some(next);
        match written {
            Ok(_) => {}
            // Removed meanwhile: nothing to record, and the planner reads it as gone next time.
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(observed)
}

/// Asks the planner about `disruption` of `machine` at `stage`. For a control plane, every
/// control plane's etcd member is looked at (and recorded) first; a worker touches no etcd
/// member.
pub async fn check(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    credentials: &Credentials,
    disruption: &Disruption,
    stage: Stage,
) -> Result<Verdict, Error> {
    let observed = if machine.spec.role == Some(Role::ControlPlane) {
        refresh_voters(ctx, machines, credentials).await?
    } else {
        machines.to_vec()
    };
    let (view, inputs) = snapshot(ctx, cluster, &observed);
    let target = inputs
        .iter()
        .find(|m| Some(m.name.as_str()) == machine.metadata.name.as_deref())
        .cloned()
        .unwrap_or_else(|| Machine::from(machine));
    Ok(ichor_deleteguard::check(
        &target, &inputs, &view, disruption, stage,
    ))
}
