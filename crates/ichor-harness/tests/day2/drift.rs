//! Drift between a machine's config and the cluster's: a change that needs a reboot, applied
//! under the cluster lock one node at a time, each Node drained before its reboot and
//! uncordoned once back; a change a node refuses, which stops the rollout
//! at that node until a fixed change resumes it one machine at a time; a rollout resumed after
//! a manager kill without sending any node its config twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::common::ConditionStatus;
use ichor_api::names::reasons;
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{Fault, SimNode};
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::cluster::{
    CLUSTER, Monitor, control_planes_in_order, every_machine_applied, ready_target, rolled_out,
    state_summary, wait_rolled_out,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_that_needs_a_reboot_is_applied_under_the_lock_one_node_at_a_time() {
    let target = ready_target(SimOptions::new(3, DAY2.net(4), "v1.14.1"), 3, 3, 0).await;
    // Drift that cannot apply live: rebooted under the lock, one node at a time.
    for node in target.nodes() {
        node.inject(Fault::RequireReboot(true))
            .await
            .expect("fault");
    }
    // A pod on the first node's Node: evicted before that node reboots (ADR 0066).
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    let first = specs::machine_at(&target, &target.node_endpoints()[0])
        .await
        .expect("machine")
        .status
        .and_then(|s| s.lifecycle.node_name)
        .expect("node name");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "drifting"},
        "spec": {"nodeName": first, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let before: Vec<usize> = target.nodes().iter().map(|n| n.calls("Reboot")).collect();
    let monitor = Monitor::start(target.nodes().to_vec());
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [{"name": "san", "machine": {"certSANs": ["drift.example.internal"]}}]}})),
        )
        .await
        .expect("a change that needs a reboot");
    try_eventually(
        "every node rebooted into the new config",
        Duration::from_secs(180),
        || async {
            let rebooted = target
                .nodes()
                .iter()
                .zip(&before)
                .all(|(n, b)| n.calls("Reboot") > *b);
            rebooted && every_machine_applied(&target).await
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let seen = monitor.finish().await;
    assert_eq!(seen.most_down, 1, "one node at a time: {seen:?}");
    // Each Node was cordoned and drained before its reboot, and uncordoned once back.
    assert!(
        pods.get_opt("drifting").await.expect("get").is_none(),
        "evicted"
    );
    try_eventually(
        "every Node uncordoned and every drain record cleared",
        Duration::from_secs(60),
        || async {
            let machines = Api::<TalosMachine>::namespaced(target.client(), target.namespace())
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let recorded = machines
                .items
                .iter()
                .filter(|m| m.status.as_ref().is_some_and(|s| s.drain.record.is_some()))
                .count();
            let uncordoned = specs::events_with_reason(&target, reasons::UNCORDONED)
                .await
                .len();
            let cordoned = Api::<Node>::all(workload.clone())
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .filter(|n| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true))
                .count();
            if recorded == 0 && uncordoned == 3 && cordoned == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{recorded} records, {uncordoned} Uncordoned Events, {cordoned} Nodes cordoned"
                ))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    target.down().await;
}

/// Samples how many machines have a drift in flight (`status.driftReboot`) at once, until
/// stopped; returns the most seen.
fn drift_in_flight_monitor(
    target: &SimTarget,
) -> (Arc<AtomicBool>, tokio::task::JoinHandle<usize>) {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let task = tokio::spawn(async move {
        let mut most = 0;
        while !flag.load(Ordering::SeqCst) {
            if let Ok(list) = machines.list(&ListParams::default()).await {
                let in_flight = list
                    .items
                    .iter()
                    .filter(|m| m.status.as_ref().is_some_and(|s| s.drift.reboot.is_some()))
                    .count();
                most = most.max(in_flight);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        most
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_patch_stops_the_drift_rollout_at_one_node_and_a_fixed_patch_resumes_it() {
    let target = ready_target(SimOptions::new(3, DAY2.net(8), "v1.14.1"), 3, 3, 0).await;
    let order = control_planes_in_order(&target).await;
    assert_eq!(order.len(), 3, "three control planes");
    let applies = |nodes: &[(String, SimNode)]| -> Vec<usize> {
        nodes
            .iter()
            .map(|(_, n)| n.calls("ApplyConfiguration"))
            .collect()
    };
    let before = applies(&order);
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    // Talos refuses a taint whose effect is not NoSchedule, PreferNoSchedule or NoExecute.
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [{"name": "taint", "documents": {"KubeNodeConfig": {"taints": {"dedicated": "infra:Sometimes"}}}}]}})),
        )
        .await
        .expect("a patch Talos refuses");
    let first = order[0].0.clone();
    let halted = try_eventually(
        "the rollout stops at the first control plane",
        Duration::from_secs(90),
        || async {
            rolled_out(&target)
                .await
                .filter(|(s, r, m)| {
                    *s == ConditionStatus::False && r == reasons::DRIFT_HALTED && m.contains(&first)
                })
                .is_some()
        },
    )
    .await;
    if let Err(e) = halted {
        panic!(
            "{e}: {:?} {}",
            rolled_out(&target).await,
            state_summary(&target)
        );
    }
    let after = applies(&order);
    assert!(
        after[0] > before[0],
        "the first control plane was asked: {after:?}"
    );
    assert_eq!(
        &after[1..],
        &before[1..],
        "no other node got the refused config"
    );
    specs::events_once(&target, reasons::DRIFT_HALTED, Duration::from_secs(30))
        .await
        .expect("an Event says the rollout stopped");
    // Fixed: the rollout resumes, one machine at a time, etcd healthy between control planes.
    let monitor = Monitor::start(target.nodes().to_vec());
    let (stop, in_flight) = drift_in_flight_monitor(&target);
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [{"name": "taint", "documents": {"KubeNodeConfig": {"taints": {"dedicated": "infra:NoSchedule"}}}}]}})),
        )
        .await
        .expect("the fixed patch");
    wait_rolled_out(&target, "every machine took the fixed config").await;
    stop.store(true, Ordering::SeqCst);
    let most_in_flight = in_flight.await.expect("drift monitor");
    let seen = monitor.finish().await;
    assert!(
        most_in_flight <= 1,
        "one machine at a time: {most_in_flight} in flight at once"
    );
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    let last = applies(&order);
    for (i, (name, _)) in order.iter().enumerate() {
        assert!(last[i] > after[i], "{name} took the fixed config: {last:?}");
    }
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_killed_mid_rollout_resumes_and_no_node_gets_the_config_twice() {
    let mut target = ready_target(SimOptions::new(3, DAY2.net(9), "v1.14.1"), 3, 3, 0).await;
    let order = control_planes_in_order(&target).await;
    assert_eq!(order.len(), 3, "three control planes");
    let before: Vec<usize> = order.iter().map(|(_, n)| n.config_applies()).collect();
    // The first node applies the change; the manager never hears, and is killed.
    let reply = order[0].1.gate_reply("ApplyConfiguration");
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [{"name": "san", "machine": {"certSANs": ["rollout.example.internal"]}}]}})),
        )
        .await
        .expect("a change that applies live");
    tokio::time::timeout(Duration::from_secs(90), reply.arrived(1))
        .await
        .expect("the first node was sent its config");
    target.kill_manager().await;
    reply.release();
    assert_eq!(
        order[0].1.config_applies(),
        before[0] + 1,
        "the node took it before the kill"
    );
    target.start_manager().await.expect("restart");
    wait_rolled_out(&target, "the rollout resumed and finished").await;
    for ((name, node), was) in order.iter().zip(&before) {
        assert_eq!(
            node.config_applies(),
            was + 1,
            "{name} got the changed config exactly once"
        );
    }
    target.down().await;
}
