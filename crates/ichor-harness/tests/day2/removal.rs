//! Removing a machine: a removal resumed after the manager is killed at each of its kill points
//! (the drain a PodDisruptionBudget blocks, the etcd leave, the reset), each once-only step run
//! once; a failed etcd leave that stops the removal, and the force path that takes a partitioned
//! node out through a healthy peer (tombstoned, reset once it comes back); a removal while the
//! workload API is down (it waits; forced, it skips the Node steps and hands the Node delete to
//! the cluster, done once the API answers again).

use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::names::{annotations, conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{Fault, Stage};
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::removal_reason;
use crate::support::cluster::{
    CLUSTER, Monitor, etcd_members, force, gone, ready_target, state_summary, uid_of,
};

/// A pod `pinned` on the workload Node `node_name` whose PodDisruptionBudget blocks its
/// eviction, once the budget counts it healthy; returns the workload's pods and budgets.
async fn pinned_pod_under_budget(
    workload: &kube::Client,
    node_name: &str,
) -> (Api<Pod>, Api<PodDisruptionBudget>) {
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pinned", "labels": {"app": "pinned"}},
        "spec": {"nodeName": node_name, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(workload.clone(), "default");
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "pinned"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "pinned"}}}
    }))
    .expect("budget");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create budget");
    try_eventually(
        "the budget to count the pod healthy",
        Duration::from_secs(60),
        || async {
            budgets
                .get("pinned")
                .await
                .ok()
                .and_then(|b| b.status)
                .is_some_and(|s| s.current_healthy == Some(1) && s.disruptions_allowed == Some(0))
        },
    )
    .await
    .expect("budget in force");
    (pods, budgets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_resumes_after_manager_kills_and_runs_once_only_steps_once() {
    let mut target = ready_target(SimOptions::new(4, DAY2.net(0), "v1.14.1"), 3, 4, 0).await;
    let endpoints = target.node_endpoints();
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");

    // A pod on cp-3 whose PodDisruptionBudget blocks its eviction.
    let (pods, budgets) = pinned_pod_under_budget(&workload, "cp-3").await;

    let monitor = Monitor::start(target.nodes().to_vec());
    let node = target.nodes()[2].clone();
    let configured_fingerprint = node.fingerprint();
    let leave = node.gate_reply("EtcdLeaveCluster");
    let reset = node.gate_reply("Reset");
    let name = specs::delete_machine(&target, &endpoints[2])
        .await
        .expect("the webhook admits 4 -> 3");
    let uid = uid_of(&target, &name).await;

    // Kill points 1 and 2: after the cordon, in the middle of a drain the budget blocks.
    try_eventually("the drain blocked", Duration::from_secs(90), || async {
        removal_reason(&target, &endpoints[2]).await.as_deref() == Some(reasons::DRAIN_BLOCKED)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let nodes: Api<Node> = Api::all(workload.clone());
    let cordoned = nodes.get("cp-3").await.expect("Node cp-3");
    assert_eq!(
        cordoned.spec.and_then(|s| s.unschedulable),
        Some(true),
        "cordoned"
    );
    target.kill_manager().await;
    target.start_manager().await.expect("restart");
    // The restarted manager had its chances: it reconciled every machine more than once (the
    // waiting removal requeues itself), and the removal is still blocked.
    let machine_count = Api::<TalosMachine>::namespaced(target.client(), target.namespace())
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
        .len() as u64;
    try_eventually(
        "the restarted manager reconciling the machines",
        Duration::from_secs(60),
        || async {
            match target.manager_reconciles("TalosMachine").await {
                Ok(n) if n > 2 * machine_count => Ok(n),
                Ok(n) => Err(format!("{n} reconciles of {machine_count} machines")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .expect("reconciled after the restart");
    assert_eq!(
        removal_reason(&target, &endpoints[2]).await.as_deref(),
        Some(reasons::DRAIN_BLOCKED),
        "still blocked after the restart: the budget is honoured"
    );
    assert_eq!(node.calls("EtcdLeaveCluster"), 0, "etcd untouched");
    // The test relaxes the budget: the drain finishes.
    budgets
        .delete("pinned", &DeleteParams::default())
        .await
        .expect("relax the budget");

    // Kill point 3: the node left etcd, the manager never heard.
    tokio::time::timeout(Duration::from_secs(90), leave.arrived(1))
        .await
        .expect("the etcd leave was sent");
    target.kill_manager().await;
    leave.release();
    target.start_manager().await.expect("restart");

    // Kill point 4: the node was reset, the manager never heard.
    tokio::time::timeout(Duration::from_secs(90), reset.arrived(1))
        .await
        .expect("the reset was sent");
    target.kill_manager().await;
    reset.release();
    target.start_manager().await.expect("restart");

    gone(&target, &name, &uid, Duration::from_secs(120)).await;
    let seen = monitor.finish().await;
    try_eventually("cp-3 in maintenance", Duration::from_secs(30), || async {
        node.stage().await == Stage::Maintenance
    })
    .await
    .expect("back in maintenance");
    assert_ne!(
        node.fingerprint(),
        configured_fingerprint,
        "a new certificate"
    );
    assert_eq!(node.calls("EtcdLeaveCluster"), 1, "the leave ran once");
    assert_eq!(node.calls("Reset"), 1, "the reset ran once");
    let members = etcd_members(&target, &endpoints[0]).await;
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(
        nodes.get_opt("cp-3").await.expect("get").is_none(),
        "Node gone"
    );
    assert!(
        pods.get_opt("pinned").await.expect("get").is_none(),
        "the pod was evicted"
    );
    let (alive, voters) = seen.worst.expect("the monitor saw etcd");
    assert!(
        alive * 2 > voters,
        "quorum held throughout: worst {alive}/{voters}"
    );
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_leave_stops_and_the_force_path_removes_a_partitioned_node() {
    let target = ready_target(SimOptions::new(4, DAY2.net(1), "v1.14.1"), 3, 4, 0).await;
    let endpoints = target.node_endpoints();
    let node = target.nodes()[3].clone();
    let monitor = Monitor::start(target.nodes().to_vec());

    // A leave that fails stops the removal, and etcd keeps the member.
    node.inject(Fault::FailEtcdLeave(true))
        .await
        .expect("fault");
    let name = specs::delete_machine(&target, &endpoints[3])
        .await
        .expect("admitted");
    let uid = uid_of(&target, &name).await;
    try_eventually("EtcdLeaveFailed", Duration::from_secs(90), || async {
        removal_reason(&target, &endpoints[3]).await.as_deref() == Some(reasons::ETCD_LEAVE_FAILED)
    })
    .await
    .expect("stopped on the failed leave");
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 4);
    assert_ne!(node.calls("Reset"), 1, "never reset after a failed leave");
    assert_eq!(node.calls("Reset"), 0);

    // The node drops off the network: without the force annotation the removal waits.
    node.inject(Fault::Partition).await.expect("partition");
    try_eventually("NodeUnreachable", Duration::from_secs(60), || async {
        removal_reason(&target, &endpoints[3]).await.as_deref() == Some(reasons::NODE_UNREACHABLE)
    })
    .await
    .expect("waits for an unreachable node");
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 4);

    // With it, the member goes through a healthy peer and the skipped reset is recorded.
    force(&target, &name).await;
    gone(&target, &name, &uid, Duration::from_secs(120)).await;
    let members = etcd_members(&target, &endpoints[0]).await;
    assert_eq!(members.len(), 3, "{members:?}");
    specs::events_once(&target, "ResetSkipped", Duration::from_secs(30))
        .await
        .expect("the skipped reset has an Event");
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let stones = crate::tombstones(&target, CLUSTER).await;
    assert_eq!(stones.len(), 1, "{stones:?}");
    assert_eq!(stones[0].address, endpoints[3]);
    assert_eq!(node.calls("Reset"), 0, "nothing reached the node");

    // It comes back: reset before anything else, and the tombstone goes.
    node.inject(Fault::Heal).await.expect("heal");
    try_eventually(
        "the healed node reset into maintenance",
        Duration::from_secs(60),
        || async { node.stage().await == Stage::Maintenance },
    )
    .await
    .expect("reset after healing");
    try_eventually("the tombstone cleared", Duration::from_secs(30), || async {
        clusters
            .get(CLUSTER)
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|s| s.tombstones.list.is_empty())
    })
    .await
    .expect("tombstone cleared");
    specs::events_once(&target, "TombstoneReset", Duration::from_secs(30))
        .await
        .expect("the Event");
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v));
    target.down().await;
}

/// The `RemovalApproved` condition of the machine at `address`: (reason, message).
async fn removal_condition(target: &SimTarget, address: &str) -> Option<(String, String)> {
    specs::machine_condition(target, address, conditions::REMOVAL_APPROVED)
        .await
        .map(|(_, reason, message)| (reason, message))
}

/// The cluster's Node deletes handed over by force removals.
async fn pending_node_deletes(target: &SimTarget) -> Vec<ichor_api::cluster::PendingNodeDelete> {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .ok()
        .and_then(|c| c.status)
        .map(|s| s.node_deletes.pending)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_waits_while_the_workload_api_is_down_and_with_force_skips_its_node_steps_and_deletes_the_node_once_it_answers()
 {
    let target = ready_target(SimOptions::new(4, DAY2.net(12), "v1.14.1"), 3, 4, 0).await;
    let endpoints = target.node_endpoints();
    let address = endpoints[3].clone();
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");
    let api_endpoint =
        Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
            .get(CLUSTER)
            .await
            .expect("cluster")
            .spec
            .endpoint;
    let node_name = specs::machine_at(&target, &address)
        .await
        .expect("machine")
        .status
        .and_then(|s| s.lifecycle.node_name)
        .expect("a Node name");

    // A pod the removal cannot evict holds it after the cordon: the workload API goes down in
    // the middle of the removal, at the drain.
    pinned_pod_under_budget(&workload, &node_name).await;

    let node = target.nodes()[3].clone();
    let reset = node.gate_reply("Reset");
    let name = specs::delete_machine(&target, &address)
        .await
        .expect("the webhook admits 4 -> 3");
    let uid = uid_of(&target, &name).await;
    try_eventually("the drain blocked", Duration::from_secs(90), || async {
        removal_reason(&target, &address).await.as_deref() == Some(reasons::DRAIN_BLOCKED)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let nodes: Api<Node> = Api::all(workload.clone());
    let cordoned = nodes.get(&node_name).await.expect("the Node");
    assert_eq!(cordoned.spec.and_then(|s| s.unschedulable), Some(true));

    // The workload API goes down: without force the removal waits, saying where and how on.
    target
        .stop_workload_api()
        .await
        .expect("stop the workload API");
    try_eventually(
        "WorkloadAPIUnreachable",
        Duration::from_secs(60),
        || async {
            removal_reason(&target, &address).await.as_deref()
                == Some(reasons::WORKLOAD_API_UNREACHABLE)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
    let (_, message) = removal_condition(&target, &address)
        .await
        .expect("the condition");
    assert!(message.contains(&api_endpoint), "{message}");
    assert!(message.contains("restore the API"), "{message}");
    assert!(
        message.contains(&format!("{}=true", annotations::FORCE_REMOVE)),
        "{message}"
    );
    specs::events_once(
        &target,
        reasons::WORKLOAD_API_UNREACHABLE,
        Duration::from_secs(30),
    )
    .await
    .expect("the wait has an Event");
    // It had its chances and still waits: nothing went to etcd or the node.
    let before = target
        .manager_reconciles("TalosMachine")
        .await
        .expect("metrics");
    try_eventually(
        "the manager reconciling the waiting removal",
        Duration::from_secs(60),
        || async {
            target
                .manager_reconciles("TalosMachine")
                .await
                .is_ok_and(|n| n > before + 5)
        },
    )
    .await
    .expect("reconciled while waiting");
    assert_eq!(
        removal_reason(&target, &address).await.as_deref(),
        Some(reasons::WORKLOAD_API_UNREACHABLE),
        "still waiting"
    );
    assert_eq!(node.calls("EtcdLeaveCluster"), 0, "etcd untouched");
    assert_eq!(node.calls("Reset"), 0, "never reset");
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 4);

    // With force, the drain is skipped and recorded, etcd is left and the node reset as usual,
    // and the Node delete is handed to the cluster.
    force(&target, &name).await;
    tokio::time::timeout(Duration::from_secs(90), reset.arrived(1))
        .await
        .unwrap_or_else(|_| panic!("the reset was never sent: {}", target.manager_log_tail()));
    let skipped = specs::machine_at(&target, &address)
        .await
        .expect("the machine, held by the gated reset")
        .status
        .and_then(|s| s.removal.progress)
        .expect("removal progress")
        .skipped;
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    assert_eq!(skipped[0].step, ichor_api::machine::RemovalStep::Drained);
    assert_eq!(skipped[0].reason, reasons::WORKLOAD_API_UNREACHABLE);
    assert!(skipped[0].message.contains(&api_endpoint), "{skipped:?}");
    reset.release();
    gone(&target, &name, &uid, Duration::from_secs(120)).await;
    assert_eq!(node.calls("EtcdLeaveCluster"), 1, "left etcd as usual");
    assert_eq!(node.calls("Reset"), 1, "reset as usual");
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 3);
    for reason in [reasons::NODE_STEP_SKIPPED, reasons::NODE_DELETE_DEFERRED] {
        let events = specs::events_with_reason(&target, reason).await;
        assert!(
            events.iter().any(|e| e.type_.as_deref() == Some("Warning")),
            "a Warning Event {reason}: {events:?}"
        );
    }
    let pending = pending_node_deletes(&target).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].node, node_name);
    assert_eq!(pending[0].machine, name);

    // The workload API answers again: the Node goes, and with it the pending delete.
    target
        .start_workload_api()
        .await
        .expect("start the workload API");
    try_eventually("the Node deleted", Duration::from_secs(90), || async {
        nodes.get_opt(&node_name).await.is_ok_and(|n| n.is_none())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
    try_eventually(
        "the pending delete cleared",
        Duration::from_secs(30),
        || async { pending_node_deletes(&target).await.is_empty() },
    )
    .await
    .expect("cleared");
    specs::events_once(
        &target,
        reasons::DEFERRED_NODE_DELETED,
        Duration::from_secs(30),
    )
    .await
    .expect("the Event");
    let others = nodes.list(&ListParams::default()).await.expect("Nodes");
    assert_eq!(others.items.len(), 3, "the other Nodes stay");
    target.down().await;
}
