//! TalosOperations: reboots one node at a time, each Node drained first within its
//! PodDisruptionBudgets and uncordoned after; a reboot a budget blocks, which waits at the
//! drain's timeout and goes on once forced; a reboot with the drain off; an upgrade operation
//! refused at the door (versions are declared), an etcd snapshot refused without a backup
//! target, defragmentation, a declared Kubernetes version rolled out, a reset; and a reset checked
//! at the door as a delete is (the endpoint's control plane, quorum, the allow-delete
//! annotation) that stops at the declared control-plane count.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::names::{conditions, reasons, secrets as secret_names};
use ichor_api::operation::OperationAction;
use ichor_api::operation::OperationPhase;
use ichor_api::{TalosMachine, TalosOperation};
use ichor_harness::specs;
use ichor_harness::{SimOptions, Target};
use ichor_sim::Stage;
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::cluster::{CLUSTER, Monitor, etcd_members, ready_target, state_summary};
use crate::support::workload::{budget, node_name, pod_on, unschedulable};
use crate::{operation_at, refused, set_drain};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_go_one_node_at_a_time_and_versions_are_declared_not_operated() {
    let mut target = ready_target(SimOptions::new(3, DAY2.net(3), "v1.14.1"), 3, 3, 0).await;
    let endpoints = target.node_endpoints();

    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");
    let nodes: Api<Node> = Api::all(workload.clone());
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");

    // A reboot of every control plane: never two down at once, etcd quorum throughout. Two pods
    // under a budget keeping one: web-1 on cp-1 is evicted before cp-1 reboots; web-2 on cp-2
    // is one `spec.drain.skipPods` leaves, and stays.
    let cp1_node = node_name(&target, &endpoints[0]).await;
    let cp2_node = node_name(&target, &endpoints[1]).await;
    set_drain(
        &target,
        json!({"skipPods": {"matchLabels": {"keep": "true"}}}),
    )
    .await;
    pod_on(&workload, "web-1", &cp1_node, json!({"app": "web"})).await;
    pod_on(
        &workload,
        "web-2",
        &cp2_node,
        json!({"app": "web", "keep": "true"}),
    )
    .await;
    budget(&workload, "web", 1, 2, 1).await;
    let reboot = target.nodes()[0].gate("Reboot");
    let monitor = Monitor::start(target.nodes().to_vec());
    specs::create_operation(
        &target,
        TalosOperation::test("reboot-all", OperationAction::Reboot)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    tokio::time::timeout(Duration::from_secs(120), reboot.arrived(1))
        .await
        .expect("cp-1's reboot was sent");
    // Sent only once its Node was cordoned (recorded as Ichor's) and the pod evicted.
    assert!(
        pods.get_opt("web-1").await.expect("get").is_none(),
        "evicted before the reboot"
    );
    assert!(unschedulable(&nodes, &cp1_node).await, "cordoned");
    let record = drain_record(&target, &endpoints[0])
        .await
        .expect("the drain is recorded");
    assert!(record.cordoned && record.drained_at.is_some(), "{record:?}");
    reboot.release();
    let done = specs::wait_operation(&target, "reboot-all", Duration::from_secs(180))
        .await
        .expect("finished");
    let seen = monitor.finish().await;
    let status = done.status.expect("status");
    assert_eq!(status.run.phase, OperationPhase::Succeeded, "{status:?}");
    assert_eq!(status.run.nodes.len(), 3);
    assert!(
        status
            .run
            .nodes
            .iter()
            .all(|n| n.progress.down_at().is_some()),
        "{status:?}"
    );
    assert_eq!(
        seen.most_down, 1,
        "exactly one node down at a time: {seen:?}"
    );
    for node in target.nodes() {
        assert_eq!(node.calls("Reboot"), 1);
    }
    assert!(
        pods.get_opt("web-2").await.expect("get").is_some(),
        "skipPods leaves web-2"
    );
    // Back and verified: every Node uncordoned, every drain record and `Drained` cleared.
    for address in &endpoints {
        let name = node_name(&target, address).await;
        assert!(!unschedulable(&nodes, &name).await, "{name} uncordoned");
        assert_eq!(drain_record(&target, address).await, None, "{name}");
        assert_eq!(
            specs::machine_condition(&target, address, conditions::DRAINED).await,
            None,
            "{name}"
        );
    }

    drain_timeout_waits_unless_forced(&mut target, &workload).await;
    drain_off_reboots_without_a_cordon(&target, &nodes).await;

    // Versions are declared (ADR 0068): an upgrade operation is refused at the door, naming
    // the field to change instead (the declared rollout, its rollback and its revert are
    // `versions`).
    let cp1 = specs::machine_at(&target, &endpoints[0])
        .await
        .expect("cp-1")
        .name_any();
    match specs::create_operation(
        &target,
        TalosOperation::test("upgrade-cp-1", OperationAction::Upgrade)
            .cluster(CLUSTER)
            .machine(&cp1)
            .image("ghcr.io/siderolabs/installer:v1.14.2"),
    )
    .await
    {
        Err(ichor_harness::Error::Kube(kube::Error::Api(status))) => {
            assert!(status.message.contains("spec.talosVersion"), "{status:?}")
        }
        other => panic!("an upgrade operation must be refused: {other:?}"),
    }

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
    assert_eq!(snap.run.phase, OperationPhase::Failed, "{snap:?}");
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
    assert_eq!(defrag.run.phase, OperationPhase::Succeeded, "{defrag:?}");
    for node in target.nodes() {
        assert_eq!(node.calls("EtcdDefragment"), 1);
    }

    // A Kubernetes version declared: every node gets its config for it, one at a time, and
    // nothing writes the spec but the person who declared it.
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let declared = clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "1.36.4"}})),
        )
        .await
        .expect("Kubernetes declared")
        .metadata
        .generation;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(target.client(), target.namespace());
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    try_eventually(
        "every node's config for 1.36.4",
        Duration::from_secs(90),
        || async {
            let names: Vec<String> = machines
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .iter()
                .map(ResourceExt::name_any)
                .collect();
            for name in &names {
                let secret = secrets
                    .get(&format!("{name}{}", secret_names::APPLIED_CONFIG_SUFFIX))
                    .await
                    .map_err(|e| e.to_string())?;
                let config = secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(secret_names::APPLIED_CONFIG_KEY))
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                    .unwrap_or_default();
                if !config.contains("kubelet:v1.36.4") {
                    return Err(format!("{name} not yet"));
                }
            }
            Ok(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    assert_eq!(
        clusters
            .get(CLUSTER)
            .await
            .expect("cluster")
            .metadata
            .generation,
        declared,
        "no controller wrote the spec"
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
    assert_eq!(reset.run.phase, OperationPhase::Succeeded, "{reset:?}");
    assert_eq!(target.nodes()[2].stage().await, Stage::Maintenance);
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 2);
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    target.down().await;
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
    assert_eq!(status.run.phase, OperationPhase::Waiting, "{status:?}");
    let mut selected = names[2..].to_vec();
    selected.sort();
    let steps: Vec<(&str, OperationPhase)> = status
        .run
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

/// The drain record of the machine at `address`.
async fn drain_record(
    target: &ichor_harness::SimTarget,
    address: &str,
) -> Option<ichor_api::drain::DrainRecord> {
    specs::machine_at(target, address)
        .await
        .expect("machine")
        .status
        .and_then(|s| s.drain.record)
}

/// A reboot of cp-2, whose pod a budget allowing nothing holds: at the drain's timeout it waits
/// (`DrainTimedOut` naming the pod and the budget) and cp-2 does not reboot, across a manager
/// restart (the drain's start as recorded); forced, the pod is deleted and the reboot goes on,
/// the Node uncordoned after.
async fn drain_timeout_waits_unless_forced(
    target: &mut ichor_harness::SimTarget,
    workload: &kube::Client,
) {
    let endpoints = target.node_endpoints();
    set_drain(target, json!({"timeout": "10s"})).await;
    let cp2_node = node_name(target, &endpoints[1]).await;
    pod_on(workload, "pinned", &cp2_node, json!({"app": "pinned"})).await;
    budget(workload, "pinned", 1, 1, 0).await;
    let cp2 = specs::machine_at(target, &endpoints[1])
        .await
        .expect("cp-2")
        .name_any();
    specs::create_operation(
        target,
        TalosOperation::test("reboot-pinned", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&cp2),
    )
    .await
    .expect("operation");
    let (status, reason, message) = operation_at(
        target,
        "reboot-pinned",
        reasons::DRAIN_TIMED_OUT,
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(reason, reasons::DRAIN_TIMED_OUT, "{status:?}");
    assert!(
        message.contains("default/pinned (PodDisruptionBudget pinned)"),
        "{message}"
    );
    let drained = specs::machine_condition(target, &endpoints[1], conditions::DRAINED).await;
    assert!(
        drained
            .as_ref()
            .is_some_and(|(holds, reason, _)| !holds && reason == reasons::DRAIN_TIMED_OUT),
        "{drained:?}"
    );
    let nodes: Api<Node> = Api::all(workload.clone());
    assert!(unschedulable(&nodes, &cp2_node).await, "cordoned");
    assert_eq!(target.nodes()[1].calls("Reboot"), 1, "cp-2 did not reboot");

    // A restarted manager resumes the drain as recorded: the same start, still timed out.
    let started = drain_record(target, &endpoints[1])
        .await
        .expect("recorded")
        .started_at;
    target.kill_manager().await;
    target.start_manager().await.expect("restart");
    try_eventually(
        "the restarted manager at the operation again",
        Duration::from_secs(60),
        || async {
            target
                .manager_reconciles("TalosOperation")
                .await
                .is_ok_and(|n| n > 2)
        },
    )
    .await
    .expect("reconciled after the restart");
    let (_, reason, _) = operation_at(
        target,
        "reboot-pinned",
        reasons::DRAIN_TIMED_OUT,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(reason, reasons::DRAIN_TIMED_OUT);
    let resumed = drain_record(target, &endpoints[1]).await.expect("recorded");
    assert_eq!(resumed.started_at, started, "the drain's start as recorded");
    assert!(resumed.cordoned, "the cordon is still Ichor's: {resumed:?}");
    assert_eq!(target.nodes()[1].calls("Reboot"), 1, "cp-2 did not reboot");

    set_drain(target, json!({"onTimeout": "Force"})).await;
    let done = specs::wait_operation(target, "reboot-pinned", Duration::from_secs(90))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(done.run.phase, OperationPhase::Succeeded, "{done:?}");
    assert_eq!(target.nodes()[1].calls("Reboot"), 2, "rebooted once forced");
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    assert!(
        pods.get_opt("pinned").await.expect("get").is_none(),
        "the pod left was deleted"
    );
    assert!(!unschedulable(&nodes, &cp2_node).await, "uncordoned");
    assert_eq!(drain_record(target, &endpoints[1]).await, None);
}

/// With `spec.drain.enabled: false`, cp-3 reboots without a cordon, its step saying so.
async fn drain_off_reboots_without_a_cordon(target: &ichor_harness::SimTarget, nodes: &Api<Node>) {
    let endpoints = target.node_endpoints();
    set_drain(
        target,
        json!({"enabled": false, "timeout": "10m", "onTimeout": "Wait"}),
    )
    .await;
    let cp3_node = node_name(target, &endpoints[2]).await;
    let cp3 = specs::machine_at(target, &endpoints[2])
        .await
        .expect("cp-3")
        .name_any();
    let reboot = target.nodes()[2].gate("Reboot");
    specs::create_operation(
        target,
        TalosOperation::test("reboot-undrained", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&cp3),
    )
    .await
    .expect("operation");
    tokio::time::timeout(Duration::from_secs(60), reboot.arrived(1))
        .await
        .expect("cp-3's reboot was sent");
    assert!(!unschedulable(nodes, &cp3_node).await, "not cordoned");
    assert_eq!(drain_record(target, &endpoints[2]).await, None);
    let sending = Api::<TalosOperation>::namespaced(target.client(), target.namespace())
        .get("reboot-undrained")
        .await
        .expect("operation")
        .status
        .and_then(|s| s.run.nodes.first().and_then(|n| n.message.clone()))
        .unwrap_or_default();
    assert!(sending.contains("the drain is off"), "{sending}");
    reboot.release();
    let done = specs::wait_operation(target, "reboot-undrained", Duration::from_secs(90))
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(done.run.phase, OperationPhase::Succeeded, "{done:?}");
    assert_eq!(target.nodes()[2].calls("Reboot"), 2);
    set_drain(target, json!({"enabled": true})).await;
}
