//! The workload cluster's Nodes on the sim target report the version their kubelet runs
//! (`status.nodeInfo.kubeletVersion`), as a real kubelet restarted with a new image does
//! (talos-facts §9.7): registered with the node's version, then following a kubelet image
//! that a config change sets, while kwok keeps the Node Ready.

use std::time::Duration;

use ichor_harness::{SimOptions, SimTarget, Target, specs};
use ichor_testenv::nets::DAY2_KUBELET;
use ichor_testenv::wait::try_eventually;
use ichor_testenv::workload::node_is_ready;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::cluster::{CLUSTER, ready_target, state_summary};

/// The Node of the machine at the target's first address.
async fn first_node(target: &SimTarget) -> (Api<Node>, String) {
    let workload = specs::workload_client(target, CLUSTER)
        .await
        .expect("workload client");
    let name = specs::machine_at(target, &target.node_endpoints()[0])
        .await
        .expect("machine")
        .status
        .and_then(|s| s.lifecycle.node_name)
        .expect("node name");
    (Api::all(workload), name)
}

/// The kubelet version a Node reports.
fn reported(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.kubelet_version.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_kubelet_version_follows_the_kubelet_image_of_its_config() {
    let target = ready_target(SimOptions::new(1, DAY2_KUBELET.net(0), "v1.14.1"), 1, 1, 0).await;
    let sim = &target.nodes()[0];
    let (nodes, name) = first_node(&target).await;
    // Registered with the version the node's kubelet runs: the declared Kubernetes version's.
    assert_eq!(sim.kubelet_version().await.as_deref(), Some("v1.36.3"));
    let node = nodes.get(&name).await.expect("Node");
    assert_eq!(reported(&node).as_deref(), Some("v1.36.3"));

    // A config change of the kubelet image, applied without a reboot as Talos 1.14 does.
    let reboots = sim.calls("Reboot");
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [{
                "name": "kubelet",
                "documents": {"KubeletConfig": {"image": "ghcr.io/siderolabs/kubelet:v1.36.2-fat"}}
            }]}})),
        )
        .await
        .expect("a kubelet image change");
    if let Err(error) = try_eventually(
        "the node's kubelet to run v1.36.2",
        Duration::from_secs(120),
        || async { sim.kubelet_version().await.as_deref() == Some("v1.36.2") },
    )
    .await
    {
        panic!("{error}: {}", state_summary(&target));
    }
    let followed = try_eventually(
        "the Node to report kubelet v1.36.2, Ready",
        Duration::from_secs(30),
        || async {
            nodes.get(&name).await.is_ok_and(|node| {
                reported(&node).as_deref() == Some("v1.36.2") && node_is_ready(&node)
            })
        },
    )
    .await;
    if let Err(error) = followed {
        let node = nodes.get(&name).await.ok();
        panic!("{error}: {:?}", node.and_then(|n| n.status));
    }
    assert_eq!(sim.calls("Reboot"), reboots, "applied without a reboot");
    target.down().await;
}
