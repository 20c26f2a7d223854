//! What the planner decides on: the snapshot of a cluster built from recorded observations.
//! The machine reconciler records each control plane's etcd member every time it looks at the
//! node. Right before a disruptive step (an etcd leave, a reset, a reboot), the acting
//! reconciler looks at every voter again and records what it saw, so the planner decides on
//! observations made just then; nothing else calls every node.

use ichor_api::common::Role;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Disruption, Machine, Stage, Verdict};
use ichor_talos::Credentials;
use kube::ResourceExt as _;
use kube::api::Api;
use serde_json::json;

use crate::decide::{Etcd, etcd_answered, etcd_observation};
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

/// What a control plane's etcd member answers now (`None`: the node does not answer).
pub async fn etcd_answer(address: &str, credentials: &Credentials) -> Option<Etcd> {
    let client = crate::connect(address, credentials).await?;
    Some(etcd_answered(client.etcd_status().await))
}

/// Looks at every configured control plane's etcd member now and records what it saw in each
/// machine's `status.etcd`; returns the machines with their new observations.
pub async fn refresh(
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
        if machine.spec.role != Some(Role::ControlPlane) || status.applied_config_hash.is_none() {
            continue;
        }
        let answer = etcd_answer(&address, credentials).await;
        let observation = etcd_observation(status.etcd.as_ref(), answer, ctx.clock.now());
        if status.etcd.as_ref() == Some(&observation) {
            continue;
        }
        status.etcd = Some(observation.clone());
        let machines: Api<TalosMachine> =
            Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
        match crate::infra::status::merge(
            &machines,
            &machine.name_any(),
            &json!({"etcd": observation}),
        )
        .await
        {
            Ok(_) => {}
            // Removed meanwhile: nothing to record, and the planner reads it as gone next time.
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(observed)
}

/// The planner on `disruption` of `machine` at `stage`. For a control plane, every control
/// plane's etcd member is looked at (and recorded) first; a worker touches no etcd member.
pub async fn plan(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    machines: &[TalosMachine],
    credentials: &Credentials,
    disruption: &Disruption,
    stage: Stage,
) -> Result<Verdict, Error> {
    let observed = if machine.spec.role == Some(Role::ControlPlane) {
        refresh(ctx, machines, credentials).await?
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
