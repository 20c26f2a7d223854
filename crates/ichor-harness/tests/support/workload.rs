//! The workload cluster as the specs handle it: a machine's Node, a cordon, a pod pinned to a
//! Node and a PodDisruptionBudget over it.

use std::time::Duration;

use ichor_harness::specs;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PostParams};
use serde_json::json;

/// The Node name of the machine at `address`.
pub async fn node_name(target: &ichor_harness::SimTarget, address: &str) -> String {
    specs::machine_at(target, address)
        .await
        .expect("machine")
        .status
        .and_then(|s| s.lifecycle.node_name)
        .expect("node name")
}

/// Whether Node `name` is cordoned.
pub async fn unschedulable(nodes: &Api<Node>, name: &str) -> bool {
    nodes
        .get(name)
        .await
        .expect("Node")
        .spec
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Creates pod `name` in `default` on Node `node`, with `labels`.
pub async fn pod_on(workload: &kube::Client, name: &str, node: &str, labels: serde_json::Value) {
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}
    }))
    .expect("pod");
    Api::<Pod>::namespaced(workload.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
}

/// Creates a budget `name` in `default` over the pods labelled `app: <name>`, keeping
/// `min_available` of them, once it counts `healthy` pods and allows `allowed` disruptions.
pub async fn budget(
    workload: &kube::Client,
    name: &str,
    min_available: i32,
    healthy: i32,
    allowed: i32,
) {
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": name}}},
    }))
    .expect("budget");
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(workload.clone(), "default");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create budget");
    try_eventually(
        "the budget to count the pods healthy",
        Duration::from_secs(60),
        || async {
            budgets
                .get(name)
                .await
                .ok()
                .and_then(|b| b.status)
                .is_some_and(|s| {
                    s.current_healthy == Some(healthy) && s.disruptions_allowed == Some(allowed)
                })
        },
    )
    .await
    .expect("budget in force");
}
