//! A rollout under a health gate and a fresh backup first (ADR 0075), with the real
//! `ichor-manager`, the simulated nodes' real workload apiserver and a real S3 server
//! (SeaweedFS): a declared Talos version waits while a gate over a workload Deployment fails,
//! the condition naming the gate and the fields it saw, and nothing is backed up or upgraded
//! meanwhile; once the Deployment is available (scaled to zero, as no simulated node runs a
//! pod), the control plane's upgrade asks for a backup
//! itself (the schedule is suspended, so no other is taken), which reaches the store before
//! the control plane is upgraded; the worker's upgrade asks for none. And workers in batches
//! (ADR 0077): under `maxUnavailable: 2`, two workers go at once, never more. And
//! ([`policy`]) a suspend set mid-rollout, which lets the node in flight finish and starts no
//! other; a class's own window holding its worker (ADR 0076); a closed window holding a drift
//! reboot and a Kubernetes version's step, both going once a window opens (ADR 0074).

use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::common::{ConditionStatus, Role};
use ichor_api::names::{conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::S3Server;
use ichor_testenv::nets::ROLLOUT_GATES;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use object_store::ObjectStoreExt as _;
use object_store::path::Path as ObjectPath;
use serde_json::json;
use support::cluster::{CLUSTER, Monitor, cluster_says, held_by, ready_target, state_summary};
use support::workload::{budget, node_name, pod_on, unschedulable};
use support::{put_store_secret, store_spec, talos_cluster};

mod support;

/// Suspend and maintenance windows (ADRs 0074, 0076): a suspend mid-rollout, a class's own
/// window, a drift reboot and a Kubernetes step held until a window opens.
#[path = "rollout_gates/policy.rs"]
mod policy;

const BUCKET: &str = "etcd";
const GATE: &str = "shop-available";

/// Patches the cluster's spec with `spec`, as a person (or Git) does.
async fn patch_spec(target: &SimTarget, spec: serde_json::Value) {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("spec patched");
}

/// The workload Deployment `shop/web`, one replica, which never becomes available: the
/// workload cluster's controllers run, but no simulated node runs a pod.
async fn deployment(workload: &kube::Client) -> Api<Deployment> {
    let namespace = serde_json::from_value::<Namespace>(json!({"metadata": {"name": "shop"}}))
        .expect("namespace");
    Api::<Namespace>::all(workload.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace shop");
    let web = serde_json::from_value::<Deployment>(json!({
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]}
            }
        }
    }))
    .expect("deployment");
    let api = Api::<Deployment>::namespaced(workload.clone(), "shop");
    api.create(&PostParams::default(), &web)
        .await
        .expect("deployment shop/web");
    api
}

/// Scales the Deployment to `replicas`, as a person (or Git) does.
async fn scale(api: &Api<Deployment>, replicas: i32) {
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"replicas": replicas}})),
    )
    .await
    .expect("scaled");
}

/// Waits until every node runs `version` and every machine says so.
async fn rolled_out(target: &SimTarget, version: &str) {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    try_eventually(
        &format!("every node on {version}"),
        Duration::from_secs(240),
        || async {
            let running: Vec<String> = target.nodes().iter().map(|n| n.talos_version()).collect();
            let list = machines
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let current = list.items.iter().all(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == conditions::UP_TO_DATE
                            && c.status == ConditionStatus::True
                            && c.reason == reasons::RUNS_DECLARED
                    })
                })
            });
            if current && running.iter().all(|v| v == version) {
                Ok(())
            } else {
                Err(format!("{running:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_gate_holds_the_rollout_and_a_control_plane_waits_for_a_fresh_backup() {
    let server = S3Server::start().await.expect("start the S3 server");
    server.create_bucket(BUCKET).await.expect("bucket");
    let bucket = support::bucket(&server, BUCKET);
    let target = ready_target(SimOptions::new(2, ROLLOUT_GATES.net(0), "v1.14.1"), 1, 1, 1).await;
    put_store_secret(&target, &server).await;
    // Backups to the store, the schedule suspended: only the rollout asks for one.
    patch_spec(
        &target,
        json!({"backup": {"schedule": "@every 24h", "store": store_spec(&server, BUCKET), "suspend": true}}),
    )
    .await;
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");
    let web = deployment(&workload).await;
    patch_spec(
        &target,
        json!({"rollout": {
            "freshBackup": {"maxAge": "1h"},
            "healthGates": [{
                "name": GATE,
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "namespace": "shop",
                "expression": "(has(object.status.availableReplicas) ? object.status.availableReplicas : 0) >= object.spec.replicas"
            }]
        }}),
    )
    .await;
    patch_spec(&target, json!({"talosVersion": "v1.14.2"})).await;

    // The gate fails: the first node's upgrade waits, saying which gate and what it saw.
    let (held, message) = held_by(&target, reasons::HEALTH_GATE_FAILING).await;
    for part in [
        format!("health gate {GATE} (Deployment in shop)"),
        "Deployment shop/web: the expression is false".to_owned(),
        // A count of zero is omitted from a Deployment's status by its controller.
        "object.status.availableReplicas=absent".to_owned(),
        "object.spec.replicas=1".to_owned(),
    ] {
        assert!(message.contains(&part), "{held}: {message} lacks {part}");
    }
    // The cluster's own look says so too: still no node upgraded, nothing backed up.
    cluster_says(&target, reasons::HEALTH_GATE_FAILING).await;
    let upgrades: usize = target.nodes().iter().map(|n| n.calls("Upgrade")).sum();
    assert_eq!(upgrades, 0, "no node upgraded while the gate fails");
    let status = talos_cluster(&target, CLUSTER)
        .await
        .status
        .unwrap_or_default();
    assert!(
        status.backup.record.and_then(|r| r.last_success).is_none(),
        "nothing backed up while the gate holds the rollout"
    );

    // The Deployment becomes available (none of none): the gate passes, the rollout goes on.
    // To the second: a backup's record keeps its time as a Kubernetes `Time`, in seconds.
    let released = k8s_openapi::jiff::Timestamp::now()
        .round(
            k8s_openapi::jiff::TimestampRound::new()
                .smallest(k8s_openapi::jiff::Unit::Second)
                .mode(k8s_openapi::jiff::RoundMode::Trunc),
        )
        .expect("rounded");
    scale(&web, 0).await;
    rolled_out(&target, "v1.14.2").await;

    // One backup, asked for by the control plane's upgrade and stored before it began.
    let record = talos_cluster(&target, CLUSTER)
        .await
        .status
        .and_then(|s| s.backup.record)
        .and_then(|r| r.last_success)
        .expect("the fresh backup");
    assert_eq!(record.operation, None, "asked for by the rollout");
    bucket
        .head(&ObjectPath::from(record.key.as_str()))
        .await
        .unwrap_or_else(|e| panic!("the backup {} in the store: {e}", record.key));
    let announced = specs::events_with_reason(&target, reasons::UPGRADING).await;
    assert_eq!(announced.len(), 2, "{announced:?}");
    let first = announced
        .iter()
        .filter_map(|e| e.event_time.as_ref().map(|t| t.0))
        .min()
        .expect("an eventTime");
    assert!(
        record.taken_at.0 <= first,
        "the backup ({}) was taken before the first upgrade was announced ({first})",
        record.taken_at.0
    );
    // Neither before the gate passed.
    assert!(
        released <= record.taken_at.0 && released <= first,
        "backed up at {} and first upgrade announced at {first}, before the gate could pass at {released}",
        record.taken_at.0
    );
    let backups = specs::events_with_reason(&target, reasons::BACKUP_SUCCEEDED).await;
    assert_eq!(
        backups.len(),
        1,
        "one backup, for the control plane only: {backups:?}"
    );
}

/// The UIDs of the steps in the batch holding the cluster lock, as the cluster mirrors it.
async fn batch_members(target: &SimTarget) -> Vec<String> {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .ok()
        .and_then(|c| c.status)
        .and_then(|s| s.lock.mirror)
        .map(|l| l.batch.iter().map(ToString::to_string).collect())
        .unwrap_or_default()
}

/// Workers in batches (ADR 0077): under `maxUnavailable: 2`, a declared version upgrades the
/// control plane alone, then two workers at once. The first two are held at their drains by
/// budgets that allow no disruption, both cordoned and both in the batch holding the cluster
/// lock, while the other two wait for their turn and get nothing; the budgets gone, the rest
/// rolls out, and no more than two workers were ever down at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_go_two_at_a_time_under_max_unavailable_two() {
    let target = ready_target(SimOptions::new(5, ROLLOUT_GATES.net(1), "v1.14.1"), 1, 1, 4).await;
    let endpoints = target.node_endpoints();
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");
    let nodes: Api<Node> = Api::all(workload.clone());
    patch_spec(
        &target,
        json!({"drain": {"timeout": "10s"}, "rollout": {"maxUnavailable": 2}}),
    )
    .await;
    let mut workers = Vec::new();
    for (i, address) in endpoints.iter().enumerate() {
        let machine = specs::machine_at(&target, address).await.expect("machine");
        if machine.spec.role == Some(Role::Worker) {
            workers.push((machine.name_any(), machine.uid().expect("uid"), i));
        }
    }
    workers.sort();
    assert_eq!(workers.len(), 4);
    let (first, rest) = workers.split_at(2);
    for (name, _, i) in first {
        let node = node_name(&target, &endpoints[*i]).await;
        pod_on(&workload, name, &node, json!({"app": name})).await;
        budget(&workload, name, 1, 1, 0).await;
    }
    let worker_nodes: Vec<_> = workers
        .iter()
        .map(|(_, _, i)| target.nodes()[*i].clone())
        .collect();
    let monitor = Monitor::start(worker_nodes);

    patch_spec(&target, json!({"talosVersion": "v1.14.2"})).await;
    // Both first workers in flight at once: in the batch, each cordoned and held at its drain.
    let mut wanted: Vec<String> = first
        .iter()
        .map(|(_, uid, _)| format!("upgrade/{uid}"))
        .collect();
    wanted.sort();
    try_eventually(
        "two workers in the batch",
        Duration::from_secs(180),
        || async {
            let mut members = batch_members(&target).await;
            members.sort();
            let mut held = 0;
            for (_, _, i) in first {
                let drained =
                    specs::machine_condition(&target, &endpoints[*i], conditions::DRAINED).await;
                if drained
                    .is_some_and(|(holds, reason, _)| !holds && reason == reasons::DRAIN_TIMED_OUT)
                {
                    held += 1;
                }
            }
            if members == wanted && held == 2 {
                Ok(())
            } else {
                Err(format!("batch {members:?}, {held} held at the drain"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    for (_, _, i) in first {
        let node = node_name(&target, &endpoints[*i]).await;
        assert!(unschedulable(&nodes, &node).await, "{node} cordoned");
    }
    // The other two wait for their turn, and nothing reached them.
    try_eventually("the others queued", Duration::from_secs(60), || async {
        let mut queued = 0;
        for (_, _, i) in rest {
            let up =
                specs::machine_condition(&target, &endpoints[*i], conditions::UP_TO_DATE).await;
            if up.is_some_and(|(holds, reason, message)| {
                !holds
                    && reason == reasons::UPGRADE_QUEUED
                    && message.contains("waits for its turn")
            }) {
                queued += 1;
            }
        }
        (queued == 2)
            .then_some(())
            .ok_or(format!("{queued} queued"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    for (name, _, i) in rest {
        let node = &target.nodes()[*i];
        assert_eq!(node.calls("Upgrade"), 0, "{name} not upgraded");
        let cordoned = unschedulable(&nodes, &node_name(&target, &endpoints[*i]).await).await;
        assert!(!cordoned, "{name} not cordoned");
    }

    for (name, _, _) in first {
        Api::<PodDisruptionBudget>::namespaced(workload.clone(), "default")
            .delete(name, &Default::default())
            .await
            .expect("budget deleted");
    }
    rolled_out(&target, "v1.14.2").await;
    let seen = monitor.finish().await;
    assert!(
        seen.most_down <= 2,
        "at most two workers down at once: {seen:?}"
    );
    for node in target.nodes() {
        assert_eq!(node.calls("Upgrade"), 1, "each node upgraded once");
    }
    // The last member's turn ends with its status stored, then the lock released (ADR 0043).
    try_eventually("the batch ended", Duration::from_secs(30), || async {
        let members = batch_members(&target).await;
        members
            .is_empty()
            .then_some(())
            .ok_or(format!("{members:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
}
