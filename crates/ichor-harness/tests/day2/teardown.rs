//! Deleting a TalosCluster: workers removed before control planes, every node back in
//! maintenance, the secrets bundle kept; and a delete that got past a missing webhook (ADR 0052),
//! which waits for its allow-delete annotation, touching no node, then tears down.

use std::sync::Arc;
use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::names::{annotations, conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, Target};
use ichor_sim::Stage;
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::support::cluster::{CLUSTER, Monitor, ready_target, state_summary};

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
        .and_then(|s| s.core.secrets_secret)
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
    let target = ready_target(SimOptions::new(2, TRUST.net(0), "v1.14.1"), 1, 1, 1).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    // The webhook's registration removed (a failed upgrade, a delete by mistake): nothing
    // checks the delete at the door once the apiserver's informer has seen it go.
    crate::unregister_webhook(&target).await;
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
    specs::events_once(
        &target,
        reasons::DELETED_WITHOUT_ALLOW_DELETE,
        Duration::from_secs(30),
    )
    .await
    .expect("the Event");
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
