//! Day-2 e2e on the sim target: removal under manager kills, the failed leave and the force
//! path, cluster teardown, operations one node at a time, drift that needs a reboot, drift
//! that a node refuses (the rollout stops there) and its fix rolling out one machine at a time, a
//! rollout resumed after a manager kill without a second apply, a lost secrets bundle that is
//! never regenerated, an
//! unhealthy etcd member on a node that still answers, a removal while the workload API is down
//! (it waits; forced, it skips the Node steps and the Node is deleted once the API is back),
//! a seeded random sequence, and what ADR 0052 adds (a TalosCluster deleted past a missing
//! webhook waits for its annotation; a replacement at a tombstoned address is not reset) — real
//! apiserver, the real `ichor-manager` and `ichor-webhook` binaries, simulated Talos nodes. A
//! monitor watches etcd quorum (and how many nodes are down) every few milliseconds
//! throughout.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ichor_api::common::ConditionStatus;
use ichor_api::names::{annotations, conditions, reasons};
use ichor_api::operation::OperationAction;
use ichor_api::operation::OperationPhase;
use ichor_api::{TalosMachine, TalosOperation};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{Fault, SimNode, Stage};
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod support;

use support::cluster::{
    CLUSTER, Monitor, control_planes_in_order, etcd_members, every_machine_applied, force,
    force_removed, gone, ready_target, rolled_out, state_summary, uid_of, wait_rolled_out,
};

async fn removal_reason(target: &SimTarget, address: &str) -> Option<String> {
    specs::machine_condition(target, address, conditions::REMOVAL_APPROVED)
        .await
        .map(|(_, reason, _)| reason)
}

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
    assert!(
        !specs::events_with_reason(&target, "ResetSkipped")
            .await
            .is_empty(),
        "the skipped reset has an Event"
    );
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let stones = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .expect("status")
        .tombstones;
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
            .is_some_and(|s| s.tombstones.is_empty())
    })
    .await
    .expect("tombstone cleared");
    assert!(
        !specs::events_with_reason(&target, "TombstoneReset")
            .await
            .is_empty()
    );
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v));
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cluster_removes_workers_first_then_control_planes_and_keeps_the_bundle() {
    let target = ready_target(SimOptions::new(5, DAY2.net(2), "v1.14.1"), 3, 3, 2).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let bundle = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.secrets_secret)
        .expect("bundle Secret name");
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    // Record when each machine started going: workers must all start before any control plane.
    let order = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let watching = {
        let machines = machines.clone();
        let order = Arc::clone(&order);
        tokio::spawn(async move {
            loop {
                if let Ok(list) = machines.list(&ListParams::default()).await {
                    if list.items.is_empty() {
                        return;
                    }
                    let mut order = order.lock().expect("order");
                    for m in list.items {
                        let host = m.spec.hostname.clone().unwrap_or_default();
                        if m.metadata.deletion_timestamp.is_some() && !order.contains(&host) {
                            order.push(host);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let monitor = Monitor::start(target.nodes().to_vec());
    let teardown_started = std::time::Instant::now();
    specs::delete_cluster(&target, CLUSTER)
        .await
        .expect("delete admitted with the annotation");
    try_eventually(
        "the TalosCluster gone",
        Duration::from_secs(180),
        || async { clusters.get_opt(CLUSTER).await.is_ok_and(|c| c.is_none()) },
    )
    .await
    .unwrap_or_else(|e| {
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        panic!(
            "{e}: removal order so far {order:?}; {}",
            state_summary(&target)
        )
    });
    eprintln!("teardown took {:?}", teardown_started.elapsed());
    tokio::time::timeout(Duration::from_secs(10), watching)
        .await
        .expect("watcher done")
        .expect("watcher");
    let _ = monitor.finish().await;
    let order = order.lock().expect("order").clone();
    assert_eq!(order.len(), 5, "{order:?}");
    assert!(
        order[..2].iter().all(|h| h.starts_with("worker-")),
        "workers first: {order:?}"
    );
    assert!(
        order[2..].iter().all(|h| h.starts_with("cp-")),
        "then control planes: {order:?}"
    );
    assert!(
        machines
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "no machine records"
    );
    for (i, node) in target.nodes().iter().enumerate() {
        try_eventually(
            &format!("node {i} in maintenance"),
            Duration::from_secs(30),
            || async { node.stage().await == Stage::Maintenance },
        )
        .await
        .expect("every node back in maintenance");
    }
    assert!(
        Api::<Secret>::namespaced(target.client(), target.namespace())
            .get_opt(&bundle)
            .await
            .expect("get")
            .is_some(),
        "the bundle Secret is kept"
    );
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_go_one_node_at_a_time_and_a_rolled_back_upgrade_fails() {
    let target = ready_target(SimOptions::new(3, DAY2.net(3), "v1.14.1"), 3, 3, 0).await;
    let endpoints = target.node_endpoints();

    // A reboot of every control plane: never two down at once, etcd quorum throughout.
    let monitor = Monitor::start(target.nodes().to_vec());
    specs::create_operation(
        &target,
        TalosOperation::test("reboot-all", OperationAction::Reboot)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    let done = specs::wait_operation(&target, "reboot-all", Duration::from_secs(180))
        .await
        .expect("finished");
    let seen = monitor.finish().await;
    let status = done.status.expect("status");
    assert_eq!(status.phase, OperationPhase::Succeeded, "{status:?}");
    assert_eq!(status.nodes.len(), 3);
    assert!(
        status.nodes.iter().all(|n| n.progress.down_at().is_some()),
        "{status:?}"
    );
    assert_eq!(
        seen.most_down, 1,
        "exactly one node down at a time: {seen:?}"
    );
    for node in target.nodes() {
        assert_eq!(node.calls("Reboot"), 1);
    }

    // An upgrade that comes back on the old version fails, and is not retried.
    target.nodes()[1]
        .inject(Fault::UpgradeRollback(true))
        .await
        .expect("fault");
    let cp2 = specs::machine_at(&target, &endpoints[1])
        .await
        .expect("cp-2")
        .name_any();
    specs::create_operation(
        &target,
        TalosOperation::test("upgrade-cp-2", OperationAction::Upgrade)
            .cluster(CLUSTER)
            .machine(&cp2)
            .image("ghcr.io/siderolabs/installer:v1.14.2"),
    )
    .await
    .expect("operation");
    let failed = specs::wait_operation(&target, "upgrade-cp-2", Duration::from_secs(120))
        .await
        .expect("finished");
    let status = failed.status.expect("status");
    assert_eq!(status.phase, OperationPhase::Failed, "{status:?}");
    let reason = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::SUCCEEDED)
        .map(|c| c.reason.clone());
    assert_eq!(reason.as_deref(), Some(reasons::UPGRADE_ROLLED_BACK));
    assert_eq!(status.nodes[0].version_after.as_deref(), Some("v1.14.1"));

    // The same upgrade on cp-1 without the fault succeeds and is verified.
    let cp1 = specs::machine_at(&target, &endpoints[0])
        .await
        .expect("cp-1")
        .name_any();
    specs::create_operation(
        &target,
        TalosOperation::test("upgrade-cp-1", OperationAction::Upgrade)
            .cluster(CLUSTER)
            .machine(&cp1)
            .image("ghcr.io/siderolabs/installer:v1.14.2"),
    )
    .await
    .expect("operation");
    let upgraded = specs::wait_operation(&target, "upgrade-cp-1", Duration::from_secs(120))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(upgraded.phase, OperationPhase::Succeeded, "{upgraded:?}");
    // A later operation ran to the end under the cluster lock: the failed one had every chance
    // to be retried, and was not.
    assert_eq!(target.nodes()[1].calls("Upgrade"), 1, "never retried");
    assert_eq!(target.nodes()[0].talos_version(), "v1.14.2");

    // An etcd snapshot backs up to spec.backup, which this cluster does not set: refused
    // with its reason (backups to a real S3 server are tests/backups.rs).
    specs::create_operation(
        &target,
        TalosOperation::test("snap", OperationAction::EtcdSnapshot)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    let snap = specs::wait_operation(&target, "snap", Duration::from_secs(60))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(snap.phase, OperationPhase::Failed, "{snap:?}");
    assert!(
        snap.conditions
            .iter()
            .any(|c| c.type_ == conditions::SUCCEEDED && c.reason == reasons::BACKUP_NOT_CONFIGURED),
        "{snap:?}"
    );

    // Defragmentation, one control plane at a time.
    specs::create_operation(
        &target,
        TalosOperation::test("defrag", OperationAction::EtcdDefrag)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    let defrag = specs::wait_operation(&target, "defrag", Duration::from_secs(60))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(defrag.phase, OperationPhase::Succeeded, "{defrag:?}");
    for node in target.nodes() {
        assert_eq!(node.calls("EtcdDefragment"), 1);
    }

    // A Kubernetes upgrade: the spec takes the version, the nodes follow one at a time.
    specs::create_operation(
        &target,
        TalosOperation::test("kubernetes", OperationAction::UpgradeKubernetes)
            .cluster(CLUSTER)
            .all()
            .kubernetes("1.36.4"),
    )
    .await
    .expect("operation");
    let kubernetes = specs::wait_operation(&target, "kubernetes", Duration::from_secs(90))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(
        kubernetes.phase,
        OperationPhase::Succeeded,
        "{kubernetes:?}"
    );
    assert_eq!(kubernetes.nodes.len(), 3);
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    assert_eq!(
        clusters
            .get(CLUSTER)
            .await
            .expect("cluster")
            .spec
            .kubernetes_version,
        "1.36.4"
    );

    // A reset of one control plane: etcd 3 -> 2, the node back in maintenance. A reset takes
    // the node out of etcd as a delete does: the cluster declares one control plane first (so
    // the reset does not wait for a replacement), and the operation carries the allow-delete
    // annotation.
    let cp3 = specs::machine_at(&target, &endpoints[2])
        .await
        .expect("cp-3")
        .name_any();
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlane": {"count": 1}}})),
        )
        .await
        .expect("declare one control plane");
    let monitor = Monitor::start(target.nodes().to_vec());
    specs::create_operation(
        &target,
        TalosOperation::test("reset-cp-3", OperationAction::Reset)
            .cluster(CLUSTER)
            .machine(&cp3)
            .allow_delete(),
    )
    .await
    .expect("operation");
    let reset = specs::wait_operation(&target, "reset-cp-3", Duration::from_secs(90))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(reset.phase, OperationPhase::Succeeded, "{reset:?}");
    assert_eq!(target.nodes()[2].stage().await, Stage::Maintenance);
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 2);
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_that_needs_a_reboot_is_applied_under_the_lock_one_node_at_a_time() {
    let target = ready_target(SimOptions::new(3, DAY2.net(4), "v1.14.1"), 3, 3, 0).await;
    // Drift that cannot apply live: rebooted under the lock, one node at a time.
    for node in target.nodes() {
        node.inject(Fault::RequireReboot(true))
            .await
            .expect("fault");
    }
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
    target.down().await;
}

/// Whether the cluster has settled after an action: no operation in flight, every machine
/// Ready, pending approval, or being removed and waiting with a reason.
async fn settled(target: &SimTarget) -> bool {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let operations: Api<ichor_api::operation::TalosOperation> =
        Api::namespaced(target.client(), target.namespace());
    let Ok(list) = machines.list(&ListParams::default()).await else {
        return false;
    };
    let Ok(ops) = operations.list(&ListParams::default()).await else {
        return false;
    };
    let ops_done = ops.items.iter().all(|o| {
        matches!(
            o.status.as_ref().map(|s| s.phase),
            Some(OperationPhase::Succeeded | OperationPhase::Failed | OperationPhase::Waiting)
        )
    });
    // A removal waiting for a replacement is settled only while there is none: with more
    // approved control planes than declared (3), it must go on.
    let approved_control_planes = list
        .items
        .iter()
        .filter(|m| {
            m.spec.approval_state == ichor_api::machine::ApprovalState::Approved
                && m.spec.role == Some(ichor_api::common::Role::ControlPlane)
        })
        .count();
    let machines_done = list.items.iter().all(|m| {
        let status = m.status.clone().unwrap_or_default();
        let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t).cloned();
        if m.metadata.deletion_timestamp.is_some() {
            return approved_control_planes <= 3
                && condition(conditions::REMOVAL_APPROVED).is_some_and(|c| {
                    c.reason == reasons::AWAITING_REPLACEMENT || c.reason == reasons::QUORUM_AT_RISK
                });
        }
        match m.spec.approval_state {
            ichor_api::machine::ApprovalState::Approved => {
                condition(conditions::READY).is_some_and(|c| c.status == ConditionStatus::True)
            }
            _ => true,
        }
    });
    ops_done && machines_done
}

/// Five seeds in every e2e run, so CI soaks the sequence a little each time;
/// `ICHOR_TEST_SEED=<n>` replays one, and `cargo xtask e2e --soak N` runs N others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seeded_random_sequence_keeps_quorum_end_to_end() {
    for seed in ichor_testenv::rng::seeds_from(20_261_202, 5) {
        random_sequence(seed).await;
    }
}

/// One seeded random sequence on a target of its own.
async fn random_sequence(seed: u64) {
    eprintln!(
        "seed {seed} (replay: {}={seed})",
        ichor_testenv::rng::SEED_ENV
    );
    let target = ready_target(SimOptions::new(5, DAY2.net(5), "v1.14.1"), 3, 3, 0).await;
    let monitor = Monitor::start(target.nodes().to_vec());
    let mut rng = ichor_testenv::rng::TestRng::new(seed);
    let mut trace = vec![format!(
        "seed {seed} (replay: {}={seed})",
        ichor_testenv::rng::SEED_ENV
    )];
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    for step in 0..5 {
        let list = machines
            .list(&ListParams::default())
            .await
            .expect("machines")
            .items;
        let pending: Vec<&TalosMachine> = list
            .iter()
            .filter(|m| {
                m.spec.approval_state == ichor_api::machine::ApprovalState::Pending
                    && m.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let live: Vec<&TalosMachine> = list
            .iter()
            .filter(|m| {
                m.spec.approval_state == ichor_api::machine::ApprovalState::Approved
                    && m.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let choice = rng.below(3);
        // What shows that the manager has picked the step up, so `settled` is not judged on
        // the state from before it.
        enum PickedUp {
            /// Nothing changed (a refused deletion).
            Nothing,
            /// The machine `name`, approved, has left the Pending phase.
            Approved(String),
            /// The machine `name` (with this uid) is being removed, or gone.
            Removing(String, String),
            /// The operation `name` has a status.
            Operation(String),
        }
        let picked_up = match choice {
            0 if !pending.is_empty() => {
                let m = pending[rng.below(pending.len())];
                let cp = rng.below(3) > 0;
                let address = m.spec.endpoints[0].clone();
                trace.push(format!("step {step}: approve {address} cp={cp}"));
                specs::approve(&target, &address, cp, &format!("r-{step}"))
                    .await
                    .expect("approve");
                PickedUp::Approved(m.name_any())
            }
            1 | 0 if !live.is_empty() => {
                let m = live[rng.below(live.len())];
                let address = m.spec.endpoints[0].clone();
                let outcome = specs::delete_machine(&target, &address).await;
                trace.push(format!(
                    "step {step}: delete {} ({address}): {}",
                    m.spec.hostname.clone().unwrap_or_default(),
                    match &outcome {
                        Ok(_) => "admitted".to_owned(),
                        Err(e) => format!("refused: {e}"),
                    }
                ));
                match outcome {
                    Ok(name) => PickedUp::Removing(name, m.uid().unwrap_or_default()),
                    Err(_) => PickedUp::Nothing,
                }
            }
            _ => {
                trace.push(format!("step {step}: reboot every configured machine"));
                let name = format!("reboot-{step}");
                specs::create_operation(
                    &target,
                    TalosOperation::test(&name, OperationAction::Reboot)
                        .cluster(CLUSTER)
                        .all(),
                )
                .await
                .expect("operation");
                PickedUp::Operation(name)
            }
        };
        let operations: Api<TalosOperation> = Api::namespaced(target.client(), target.namespace());
        let picked = try_eventually(
            "the manager picked the step up",
            Duration::from_secs(60),
            || async {
                match &picked_up {
                    PickedUp::Nothing => Ok(()),
                    PickedUp::Approved(name) => {
                        let phase = machines
                            .get(name)
                            .await
                            .map_err(|e| e.to_string())?
                            .status
                            .unwrap_or_default()
                            .phase;
                        if phase == ichor_api::machine::MachinePhase::Pending {
                            Err(format!("{name} still {phase:?}"))
                        } else {
                            Ok(())
                        }
                    }
                    PickedUp::Removing(name, uid) => {
                        match machines.get_opt(name).await.map_err(|e| e.to_string())? {
                            Some(m) if m.uid().as_ref() == Some(uid) => {
                                let phase = m.status.unwrap_or_default().phase;
                                if phase == ichor_api::machine::MachinePhase::Removing {
                                    Ok(())
                                } else {
                                    Err(format!("{name} still {phase:?}"))
                                }
                            }
                            // Gone (a machine found again since is another object).
                            _ => Ok(()),
                        }
                    }
                    PickedUp::Operation(name) => {
                        let operation = operations.get(name).await.map_err(|e| e.to_string())?;
                        operation
                            .status
                            .map(drop)
                            .ok_or_else(|| format!("{name} has no status yet"))
                    }
                }
            },
        )
        .await;
        if let Err(error) = picked {
            panic!("{error}\n{}\n{}", trace.join("\n"), state_summary(&target));
        }
        if let Err(error) =
            try_eventually("settled", Duration::from_secs(150), || settled(&target)).await
        {
            panic!("{error}\n{}\n{}", trace.join("\n"), state_summary(&target));
        }
    }
    let seen = monitor.finish().await;
    let (alive, voters) = seen.worst.expect("the monitor saw etcd");
    assert!(alive * 2 > voters, "{}", trace.join("\n"));
    // etcd holds exactly the configured control planes (those waiting for removal included).
    let control_planes: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
        .into_iter()
        .filter(|m| {
            m.spec.role == Some(ichor_api::common::Role::ControlPlane)
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.applied_config_hash.is_some())
        })
        .filter_map(|m| m.status.and_then(|s| s.address))
        .collect();
    let members = etcd_members(&target, &control_planes[0]).await;
    assert_eq!(
        members.len(),
        control_planes.len(),
        "{members:?} vs {control_planes:?}\n{}",
        trace.join("\n")
    );
    println!("{}", trace.join("\n"));
    target.down().await;
}

/// Creates `operation`, which the webhook must refuse with `reason`; returns the refusal's
/// message.
async fn refused(target: &SimTarget, operation: impl Into<TalosOperation>, reason: &str) -> String {
    let operation: TalosOperation = operation.into();
    let name = operation.name_any();
    match specs::create_operation(target, operation).await {
        Err(ichor_harness::Error::Kube(kube::Error::Api(status))) => {
            assert_eq!(status.reason, reason, "{name}: {status:?}");
            assert!(
                status.message.contains("denied the request"),
                "{name}: {status:?}"
            );
            let operations: Api<TalosOperation> =
                Api::namespaced(target.client(), target.namespace());
            assert!(
                operations.get_opt(&name).await.expect("get").is_none(),
                "{name} was not created"
            );
            status.message
        }
        other => panic!("{name} should be refused with {reason}, got {other:?}"),
    }
}

/// The operation `name` once its `Succeeded` condition has `reason` or it has ended: its
/// status and that condition's (reason, message).
async fn operation_at(
    target: &SimTarget,
    name: &str,
    reason: &str,
    limit: Duration,
) -> (ichor_api::operation::TalosOperationStatus, String, String) {
    let operations: Api<TalosOperation> = Api::namespaced(target.client(), target.namespace());
    try_eventually(&format!("{name} at {reason}"), limit, || async {
        let status = operations
            .get(name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::SUCCEEDED)
            .map(|c| (c.reason.clone(), c.message.clone()));
        match condition {
            Some((seen, message))
                if seen == reason
                    || matches!(
                        status.phase,
                        OperationPhase::Succeeded | OperationPhase::Failed
                    ) =>
            {
                Ok((status, seen, message))
            }
            other => Err(format!("{:?} {other:?}", status.phase)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)))
}

/// Waits until the manager has recorded the etcd member of the machine at `address` as
/// `holds` says; returns the machine's status.
async fn observed(
    target: &SimTarget,
    address: &str,
    what: &str,
    holds: impl Fn(&ichor_api::machine::TalosMachineStatus) -> bool,
) -> ichor_api::machine::TalosMachineStatus {
    try_eventually(what, Duration::from_secs(120), || async {
        let status = specs::machine_at(target, address)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        if holds(&status) {
            Ok(status)
        } else {
            Err(format!(
                "etcd {:?}, member {:?}, applied {:?}",
                status.etcd, status.etcd_member_id, status.applied_config_hash
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_is_checked_at_the_door_and_stops_at_the_declared_count() {
    // Five control planes in a cluster declaring three.
    let target = ready_target(SimOptions::new(5, DAY2.net(6), "v1.14.1"), 3, 5, 0).await;
    let endpoints = target.node_endpoints();
    let mut names = Vec::new();
    for address in &endpoints {
        names.push(
            specs::machine_at(&target, address)
                .await
                .expect("machine")
                .name_any(),
        );
    }
    // The order an operation runs its targets in: control planes by name.
    let mut ordered = names.clone();
    ordered.sort();

    // At the door a reset is a delete, its targets taken out one after another. The first,
    // cp-1, is reached at the host of the cluster's endpoint: never reset.
    let message = refused(
        &target,
        TalosOperation::test("reset-all", OperationAction::Reset)
            .cluster(CLUSTER)
            .all()
            .allow_delete(),
        reasons::CLUSTER_ENDPOINT_NODE,
    )
    .await;
    assert!(
        message.contains(&format!("talosmachine {} ", ordered[0]))
            && message.contains(&endpoints[0]),
        "{message}"
    );
    // The four others: 5 -> 4 -> 3 -> 2 keep quorum, the fourth step (2 -> 1) does not.
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    for name in &names[1..] {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"e2e.ichor.maesh.dev/most": "yes"}}})),
            )
            .await
            .expect("label");
    }
    let message = refused(
        &target,
        TalosOperation::test("reset-most", OperationAction::Reset)
            .cluster(CLUSTER)
            .selector(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "e2e.ichor.maesh.dev/most".to_owned(),
                    "yes".to_owned(),
                )])),
                match_expressions: None,
            })
            .allow_delete(),
        reasons::QUORUM_AT_RISK,
    )
    .await;
    assert!(
        message.contains(&format!("talosmachine {} ", ordered[4])) && message.contains("2 -> 1"),
        "{message}"
    );
    // The annotation goes on the operation: without it, even one reset is refused.
    let message = refused(
        &target,
        TalosOperation::test("reset-one", OperationAction::Reset)
            .cluster(CLUSTER)
            .machine(&names[4]),
        reasons::ALLOW_DELETE_REQUIRED,
    )
    .await;
    assert!(message.contains("talosoperation reset-one"), "{message}");
    for node in target.nodes() {
        assert_eq!(node.calls("Reset"), 0, "nothing was reset");
    }

    // Three of the five, by label, with the annotation: admitted (5 -> 2 keeps quorum at each
    // step). Two go; the third would leave two voters where three are declared, and waits.
    for name in &names[2..] {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"e2e.ichor.maesh.dev/wipe": "yes"}}})),
            )
            .await
            .expect("label");
    }
    let monitor = Monitor::start(target.nodes().to_vec());
    specs::create_operation(
        &target,
        TalosOperation::test("reset-three", OperationAction::Reset)
            .cluster(CLUSTER)
            .selector(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "e2e.ichor.maesh.dev/wipe".to_owned(),
                    "yes".to_owned(),
                )])),
                match_expressions: None,
            })
            .allow_delete(),
    )
    .await
    .expect("admitted");
    let (status, reason, message) = operation_at(
        &target,
        "reset-three",
        reasons::AWAITING_REPLACEMENT,
        Duration::from_secs(180),
    )
    .await;
    assert_eq!(reason, reasons::AWAITING_REPLACEMENT, "{status:?}");
    assert_eq!(status.phase, OperationPhase::Waiting, "{status:?}");
    let mut selected = names[2..].to_vec();
    selected.sort();
    let steps: Vec<(&str, OperationPhase)> = status
        .nodes
        .iter()
        .map(|n| (n.machine.as_str(), n.phase))
        .collect();
    assert_eq!(
        steps,
        [
            (selected[0].as_str(), OperationPhase::Succeeded),
            (selected[1].as_str(), OperationPhase::Succeeded),
            (selected[2].as_str(), OperationPhase::Waiting),
        ],
        "{message}"
    );
    assert!(message.contains(&selected[2]), "{message}");
    for (i, node) in target.nodes().iter().enumerate() {
        let expected = if i == 2 || i == 3 {
            Stage::Maintenance
        } else {
            Stage::Running
        };
        assert_eq!(node.stage().await, expected, "node {i}");
    }
    assert_eq!(
        target.nodes()[4].calls("Reset"),
        0,
        "the third was not reset"
    );
    let members = etcd_members(&target, &endpoints[0]).await;
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|m| !m.learner), "{members:?}");
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_counts_once_a_voter_and_an_unhealthy_voter_holds_the_healthy_ones() {
    let target = ready_target(SimOptions::new(4, DAY2.net(7), "v1.14.1"), 3, 3, 0).await;
    let endpoints = target.node_endpoints();
    let monitor = Monitor::start(target.nodes().to_vec());

    // A replacement must be a voter. A fourth control plane is approved; it joins etcd as a
    // learner and is held there, as a new member still catching up is.
    let promotion = target.nodes()[3].hold_promotion();
    specs::approve(&target, &endpoints[3], true, "cp-4")
        .await
        .expect("approve cp-4");
    tokio::time::timeout(Duration::from_secs(120), promotion.arrived(1))
        .await
        .unwrap_or_else(|_| panic!("cp-4 never joined etcd: {}", state_summary(&target)));
    // The manager recorded it so: configured, in etcd, not a voter (the door would count a
    // control plane never observed as an unhealthy voter).
    observed(&target, &endpoints[3], "cp-4 observed as a learner", |s| {
        s.applied_config_hash.is_some()
            && s.etcd_member_id.is_some()
            && s.etcd.as_ref().is_some_and(|o| !o.voter && !o.healthy)
    })
    .await;
    let cp2 = target.nodes()[1].clone();
    let name = specs::delete_machine(&target, &endpoints[1])
        .await
        .expect("admitted: voters 3 -> 2 keep quorum");
    let uid = uid_of(&target, &name).await;
    try_eventually("AwaitingReplacement", Duration::from_secs(90), || async {
        match removal_reason(&target, &endpoints[1]).await {
            Some(reason) if reason == reasons::AWAITING_REPLACEMENT => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    assert_eq!(cp2.calls("EtcdLeaveCluster"), 0, "cp-2 still in etcd");
    let members = etcd_members(&target, &endpoints[0]).await;
    assert_eq!(members.len(), 4, "{members:?}");
    assert_eq!(
        members.iter().filter(|m| m.learner).count(),
        1,
        "{members:?}"
    );
    // cp-4 becomes a voter: the removal goes on, leaving three voters.
    promotion.release();
    gone(&target, &name, &uid, Duration::from_secs(120)).await;
    let members = etcd_members(&target, &endpoints[0]).await;
    let mut voters: Vec<String> = members
        .iter()
        .filter(|m| !m.learner)
        .map(|m| m.hostname.clone())
        .collect();
    voters.sort();
    assert_eq!(voters, ["cp-1", "cp-3", "cp-4"], "{members:?}");
    assert_eq!(members.len(), 3, "{members:?}");
    assert_eq!(cp2.calls("EtcdLeaveCluster"), 1, "cp-2 left once");

    // An unhealthy voter holds disruption of the healthy ones. cp-3 drops off the network.
    // The reboot of cp-1 is created at once: the door judges on what the manager recorded,
    // which cannot know yet (a node that does not answer takes ~10 s to time out); the
    // controller looks at every voter again before acting, and waits.
    let cp1 = specs::machine_at(&target, &endpoints[0])
        .await
        .expect("cp-1")
        .name_any();
    let cp3 = specs::machine_at(&target, &endpoints[2])
        .await
        .expect("cp-3")
        .name_any();
    let cp4 = specs::machine_at(&target, &endpoints[3])
        .await
        .expect("cp-4")
        .name_any();
    let reboots = target.nodes()[0].calls("Reboot");
    target.nodes()[2]
        .inject(Fault::Partition)
        .await
        .expect("partition");
    specs::create_operation(
        &target,
        TalosOperation::test("reboot-cp-1", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&cp1),
    )
    .await
    .expect("admitted on the recorded observations");
    let (status, reason, message) = operation_at(
        &target,
        "reboot-cp-1",
        reasons::ETCD_UNHEALTHY,
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(reason, reasons::ETCD_UNHEALTHY, "{status:?}");
    assert!(message.contains(&cp3), "{message}");
    assert_eq!(status.nodes[0].phase, OperationPhase::Waiting, "{status:?}");
    assert_eq!(
        target.nodes()[0].calls("Reboot"),
        reboots,
        "cp-1 was not rebooted"
    );
    // Now the manager has recorded cp-3 unhealthy: the door refuses another reboot.
    let message = refused(
        &target,
        TalosOperation::test("reboot-cp-4", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&cp4),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    assert!(message.contains(&cp3), "{message}");

    // The unhealthy member itself may go, through a healthy peer, once the declared count
    // allows it: cp-2's node, back in maintenance mode and discovered again, replaces it.
    try_eventually(
        "cp-2's node discovered again",
        Duration::from_secs(60),
        || async {
            specs::machine_at(&target, &endpoints[1])
                .await
                .ok()
                .filter(|m| m.metadata.uid != uid)
                .map(|m| m.name_any())
        },
    )
    .await
    .expect("discovered again");
    specs::approve(&target, &endpoints[1], true, "cp-5")
        .await
        .expect("approve cp-5");
    observed(&target, &endpoints[1], "cp-5 a healthy voter", |s| {
        s.etcd.as_ref().is_some_and(|o| o.voter && o.healthy)
    })
    .await;
    force_removed(&target, &cp3, &endpoints[2], Duration::from_secs(180)).await;
    assert!(
        !specs::events_with_reason(&target, "ResetSkipped")
            .await
            .is_empty(),
        "the skipped reset has an Event"
    );
    // Every voter healthy again: the reboot goes ahead.
    let done = specs::wait_operation(&target, "reboot-cp-1", Duration::from_secs(180))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)))
        .status
        .expect("status");
    assert_eq!(done.phase, OperationPhase::Succeeded, "{done:?}");
    assert_eq!(target.nodes()[0].calls("Reboot"), reboots + 1);
    let members = etcd_members(&target, &endpoints[0]).await;
    let mut voters: Vec<String> = members.iter().map(|m| m.hostname.clone()).collect();
    voters.sort();
    assert_eq!(voters, ["cp-1", "cp-4", "cp-5"], "{members:?}");
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    target.down().await;
}

/// Deletes the machine at `address` (with the allow-delete annotation), which the webhook must
/// refuse with `reason`; returns the refusal's message.
async fn delete_refused(target: &SimTarget, address: &str, reason: &str) -> String {
    match specs::delete_machine(target, address).await {
        Err(ichor_harness::Error::Kube(kube::Error::Api(status))) => {
            assert_eq!(status.reason, reason, "{address}: {status:?}");
            status.message
        }
        other => panic!("the delete of {address} should be refused with {reason}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_etcd_member_holds_every_other_control_plane_and_can_be_force_removed_through_a_peer()
 {
    // Five control planes in a cluster declaring five: a delete is admitted and waits for a
    // replacement, so it is under way before any member is unhealthy.
    let target = ready_target(SimOptions::new(5, DAY2.net(10), "v1.14.1"), 5, 5, 0).await;
    let endpoints = target.node_endpoints();
    let mut names = Vec::new();
    for address in &endpoints {
        names.push(
            specs::machine_at(&target, address)
                .await
                .expect("machine")
                .name_any(),
        );
    }
    let monitor = Monitor::start(target.nodes().to_vec());
    let cp2 = specs::delete_machine(&target, &endpoints[1])
        .await
        .expect("admitted: every voter healthy, 5 -> 4 keeps quorum");
    let uid2 = uid_of(&target, &cp2).await;
    try_eventually("AwaitingReplacement", Duration::from_secs(60), || async {
        match removal_reason(&target, &endpoints[1]).await {
            Some(reason) if reason == reasons::AWAITING_REPLACEMENT => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));

    // cp-5's etcd member fails while its node answers. The removal looks at every voter
    // again before it goes on, and now waits for etcd's health, naming cp-5.
    let sick = target.nodes()[4].clone();
    sick.inject(Fault::EtcdUnhealthy(true))
        .await
        .expect("fault");
    let message = try_eventually("EtcdUnhealthy", Duration::from_secs(60), || async {
        match specs::machine_condition(&target, &endpoints[1], conditions::REMOVAL_APPROVED).await {
            Some((_, reason, message)) if reason == reasons::ETCD_UNHEALTHY => Ok(message),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    assert!(message.contains(&names[4]), "{message}");
    observed(&target, &endpoints[4], "cp-5 an unhealthy voter", |s| {
        s.etcd.as_ref().is_some_and(|o| o.voter && !o.healthy)
    })
    .await;
    assert!(sick.is_serving().await, "its node still answers");

    // At the door, nothing disruptive goes to a healthy control plane.
    let message = refused(
        &target,
        TalosOperation::test("reboot-cp-1", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&names[0]),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    assert!(message.contains(&names[4]), "{message}");
    refused(
        &target,
        TalosOperation::test("upgrade-cp-3", OperationAction::Upgrade)
            .cluster(CLUSTER)
            .machine(&names[2])
            .image("ghcr.io/siderolabs/installer:v1.14.2"),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    refused(
        &target,
        TalosOperation::test("reset-cp-4", OperationAction::Reset)
            .cluster(CLUSTER)
            .machine(&names[3])
            .allow_delete(),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    // (cp-1's address is the cluster's endpoint: its delete is refused for that first.)
    let message = delete_refused(&target, &endpoints[2], reasons::ETCD_UNHEALTHY).await;
    assert!(message.contains(&names[4]), "{message}");
    for (i, node) in target.nodes()[..4].iter().enumerate() {
        for method in ["EtcdLeaveCluster", "Reset", "Reboot", "Upgrade"] {
            assert_eq!(node.calls(method), 0, "cp-{}: {method}", i + 1);
        }
    }
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 5);

    // The unhealthy member goes through a healthy peer: with the force annotation, once the
    // declared count (lowered to three) no longer waits for its replacement.
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlane": {"count": 3}}})),
        )
        .await
        .expect("three control planes declared");
    force_removed(&target, &names[4], &endpoints[4], Duration::from_secs(120)).await;
    let through_peers: usize = target.nodes()[..4]
        .iter()
        .map(|n| n.calls("EtcdRemoveMemberByID"))
        .sum();
    assert!(through_peers >= 1, "removed by id through a healthy peer");
    assert_eq!(sick.calls("EtcdRemoveMemberByID"), 0);
    let members = etcd_members(&target, &endpoints[0]).await;
    assert!(
        members.iter().all(|m| m.hostname != "cp-5") && members.len() == 4,
        "{members:?}"
    );

    // Every voter healthy again: cp-2's removal goes on, leaving etcd by itself.
    gone(&target, &cp2, &uid2, Duration::from_secs(120)).await;
    assert_eq!(
        target.nodes()[1].calls("EtcdLeaveCluster"),
        1,
        "cp-2 left once"
    );
    let mut voters: Vec<String> = etcd_members(&target, &endpoints[0])
        .await
        .into_iter()
        .map(|m| m.hostname)
        .collect();
    voters.sort();
    assert_eq!(voters, ["cp-1", "cp-3", "cp-4"]);
    for node in [0, 2, 3].map(|i| &target.nodes()[i]) {
        for method in ["EtcdLeaveCluster", "Reset", "Reboot", "Upgrade"] {
            assert_eq!(node.calls(method), 0, "{method}");
        }
    }
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
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
                    .filter(|m| m.status.as_ref().is_some_and(|s| s.drift_reboot.is_some()))
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
    assert!(
        !specs::events_with_reason(&target, reasons::DRIFT_HALTED)
            .await
            .is_empty(),
        "an Event says the rollout stopped"
    );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bundle_is_never_regenerated_and_restoring_it_resumes_work() {
    let target = ready_target(SimOptions::new(1, DAY2.net(11), "v1.14.1"), 1, 1, 0).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let fingerprint = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.bundle_fingerprint)
        .expect("the cluster recorded its bundle");
    let secrets: Api<Secret> = Api::namespaced(target.client(), target.namespace());
    let name = format!("{CLUSTER}-secrets");
    let saved = secrets.get(&name).await.expect("the bundle Secret");
    let node = target.nodes()[0].clone();
    let applies = node.config_applies();
    secrets
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the bundle");
    let secrets_ready = |reason: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .get(CLUSTER)
                .await
                .ok()
                .and_then(|c| c.status)
                .and_then(|s| {
                    s.conditions
                        .into_iter()
                        .find(|c| c.type_ == conditions::SECRETS_READY)
                })
                .filter(|c| c.reason == reason)
                .map(|c| c.message)
        }
    };
    let lost = try_eventually(
        "the bundle reported lost",
        Duration::from_secs(60),
        || async {
            secrets_ready(reasons::SECRETS_BUNDLE_LOST)
                .await
                .is_some_and(|m| m.contains(&name))
        },
    )
    .await;
    if let Err(e) = lost {
        panic!("{e}: {}", specs::summary(&target).await);
    }
    // The manager had its chances to regenerate: it reconciled the cluster and the machine
    // again, and no Secret appeared, no node received anything.
    let seen = target
        .manager_reconciles("TalosCluster")
        .await
        .expect("metrics");
    try_eventually(
        "the manager reconciling after the loss",
        Duration::from_secs(60),
        || async {
            match target.manager_reconciles("TalosCluster").await {
                Ok(n) if n > seen + 2 => Ok(n),
                Ok(n) => Err(format!("{n} reconciles")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .expect("reconciled");
    assert!(
        secrets.get_opt(&name).await.expect("read").is_none(),
        "no new bundle"
    );
    assert_eq!(node.config_applies(), applies, "no node received anything");
    assert!(
        !specs::events_with_reason(&target, reasons::SECRETS_BUNDLE_LOST)
            .await
            .is_empty(),
        "an Event names the loss"
    );
    // Restored: the cluster comes back with the same CA.
    let mut restored = saved.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: saved.metadata.name.clone(),
        namespace: saved.metadata.namespace.clone(),
        labels: saved.metadata.labels.clone(),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &restored)
        .await
        .expect("restore the bundle");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(120)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    assert!(secrets_ready(reasons::BUNDLE_VALID).await.is_some());
    let after = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.bundle_fingerprint);
    assert_eq!(after.as_deref(), Some(fingerprint.as_str()), "the same CA");
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
        .map(|s| s.pending_node_deletes)
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
        .and_then(|s| s.node_name)
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
    assert!(
        !specs::events_with_reason(&target, reasons::WORKLOAD_API_UNREACHABLE)
            .await
            .is_empty(),
        "the wait has an Event"
    );
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
        .and_then(|s| s.removal)
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
    assert!(
        !specs::events_with_reason(&target, reasons::DEFERRED_NODE_DELETED)
            .await
            .is_empty()
    );
    let others = nodes.list(&ListParams::default()).await.expect("Nodes");
    assert_eq!(others.items.len(), 3, "the other Nodes stay");
    target.down().await;
}

/// The TalosCluster's `Ready` condition: its reason and message.
async fn ready_condition(clusters: &Api<ichor_api::TalosCluster>) -> Option<(String, String)> {
    let cluster = clusters.get_opt(CLUSTER).await.ok()??;
    cluster
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == conditions::READY)
        .map(|c| (c.reason, c.message))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_deleted_past_admission_waits_for_its_annotation_and_touches_no_node() {
    use ichor_testenv::nets::TRUST;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let target = ready_target(SimOptions::new(2, TRUST.net(0), "v1.14.1"), 1, 1, 1).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    // The webhook's registration removed (a failed upgrade, a delete by mistake): nothing
    // checks the delete at the door once the apiserver's informer has seen it go.
    Api::<ValidatingWebhookConfiguration>::all(target.client())
        .delete(
            ichor_api::admission::WEBHOOK_CONFIGURATION,
            &DeleteParams::default(),
        )
        .await
        .expect("webhook registration removed");
    try_eventually(
        "the delete admitted without the annotation",
        Duration::from_secs(30),
        || async {
            clusters
                .delete(CLUSTER, &DeleteParams::default())
                .await
                .is_ok()
        },
    )
    .await
    .expect("admitted");
    try_eventually("the teardown held", Duration::from_secs(60), || async {
        ready_condition(&clusters)
            .await
            .is_some_and(|(reason, _)| reason == reasons::DELETED_WITHOUT_ALLOW_DELETE)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let (_, message) = ready_condition(&clusters).await.expect("Ready");
    assert!(
        message.contains(&format!(
            "kubectl annotate taloscluster {CLUSTER} {}=true",
            annotations::ALLOW_DELETE
        )),
        "{message}"
    );
    assert!(
        !specs::events_with_reason(&target, reasons::DELETED_WITHOUT_ALLOW_DELETE)
            .await
            .is_empty()
    );
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let held = machines.list(&ListParams::default()).await.expect("list");
    assert_eq!(held.items.len(), 2, "no machine deleted");
    assert!(
        held.items
            .iter()
            .all(|m| m.metadata.deletion_timestamp.is_none())
    );
    for node in target.nodes() {
        assert_eq!(node.calls("Reset"), 0, "no node reset");
    }

    // A person adds the annotation: its arrival resumes the teardown.
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {annotations::ALLOW_DELETE: "true"}}}),
            ),
        )
        .await
        .expect("annotate");
    try_eventually(
        "the TalosCluster gone",
        Duration::from_secs(120),
        || async { clusters.get_opt(CLUSTER).await.is_ok_and(|c| c.is_none()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    for node in target.nodes() {
        try_eventually("reset to maintenance", Duration::from_secs(30), || async {
            node.stage().await == Stage::Maintenance
        })
        .await
        .expect("every node reset by the teardown");
    }
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_at_a_tombstoned_address_is_not_reset() {
    use ichor_testenv::nets::TRUST;
    let target = ready_target(SimOptions::new(2, TRUST.net(1), "v1.14.1"), 1, 1, 1).await;
    let endpoints = target.node_endpoints();
    let worker = target.nodes()[1].clone();
    // The worker drops off the network and is force-removed: its reset is skipped, and a
    // tombstone records its address and SMBIOS UUID.
    worker.inject(Fault::Partition).await.expect("partition");
    let name = specs::machine_at(&target, &endpoints[1])
        .await
        .expect("the worker's machine")
        .metadata
        .name
        .expect("name");
    force_removed(&target, &name, &endpoints[1], Duration::from_secs(120)).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let stones = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .expect("status")
        .tombstones;
    assert_eq!(stones.len(), 1, "{stones:?}");
    assert_eq!(
        stones[0].uuid.as_deref(),
        Some(worker.hardware().uuid.as_str())
    );

    // Another machine takes the address, answering the cluster's credentials (the disks moved
    // into a new board): it is not the machine removed, so it is not reset.
    let replacement = "5a1a0000-0000-4000-8000-0000000000ee";
    worker.replace_board(replacement).await.expect("new board");
    worker.inject(Fault::Heal).await.expect("heal");
    let refused = || async {
        let status = clusters.get(CLUSTER).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == conditions::NODE_IDENTITY_VERIFIED)
            .filter(|c| c.status == ConditionStatus::False)
            .map(|c| (c.reason, c.message, status.tombstones.len()))
    };
    try_eventually(
        "the replacement refused",
        Duration::from_secs(60),
        || async { refused().await.is_some() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let (reason, message, stones) = refused().await.expect("condition");
    assert_eq!(reason, reasons::NODE_IDENTITY_MISMATCH);
    assert!(message.contains(replacement), "{message}");
    assert_eq!(stones, 1, "the tombstone stays for the machine removed");
    assert!(
        !specs::events_with_reason(&target, reasons::NODE_IDENTITY_MISMATCH)
            .await
            .is_empty()
    );
    assert_eq!(worker.calls("Reset"), 0, "the replacement was not reset");
    assert_ne!(worker.stage().await, Stage::Maintenance);
    target.down().await;
}
