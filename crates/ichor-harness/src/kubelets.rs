//! What the sim target's kubelets keep saying about themselves in their Nodes after they
//! registered: the version each runs. A real kubelet restarted with a new image reports its
//! own version in `status.nodeInfo.kubeletVersion` (talos-facts §9.7, §14.2); the simulated
//! node's version is the tag of its running config's kubelet image
//! ([`SimNode::kubelet_version`]), and a follower writes it into the Node that carries the
//! node's address.
//!
//! Not here: the Node's conditions (kwok keeps it Ready; a restarted kubelet's short NotReady
//! is not played), registration (`SimTarget`'s `kubelets_registered`).

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_sim::SimNode;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::task::JoinHandle;

/// How often the follower compares the kubelets' versions with their Nodes'.
const PERIOD: Duration = Duration::from_millis(300);

/// How long one node's version may take to read before the follower leaves that node for the
/// next round (a node busy with a long step holds its state).
const READ_LIMIT: Duration = Duration::from_millis(200);

/// Keeps every Node's `status.nodeInfo.kubeletVersion` at its simulated node's kubelet
/// version; it stops when dropped.
#[derive(Debug)]
pub(crate) struct KubeletVersions {
    task: JoinHandle<()>,
}

impl KubeletVersions {
    /// Starts following `nodes` into the Nodes of the workload cluster `client` reaches. A
    /// round that cannot list the Nodes (the workload apiserver stopped) waits for the next.
    pub(crate) fn follow(client: kube::Client, nodes: Vec<SimNode>) -> Self {
        let task = tokio::spawn(async move {
            let api = Api::<Node>::all(client);
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let _ = round(&api, &nodes).await;
            }
        });
        Self { task }
    }
}

impl Drop for KubeletVersions {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A Node's first `InternalIP`.
fn internal_ip(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.as_str())
}

/// The kubelet version a Node reports.
fn reported(node: &Node) -> Option<&str> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.kubelet_version.as_str())
}

/// One round: each Node whose address is a simulated node's and whose reported version
/// differs from that node's kubelet version gets the node's version.
async fn round(api: &Api<Node>, nodes: &[SimNode]) -> Result<(), kube::Error> {
    let by_address: BTreeMap<String, &SimNode> = nodes
        .iter()
        .map(|n| (n.addr().ip().to_string(), n))
        .collect();
    for listed in api.list(&ListParams::default()).await?.items {
        let (Some(name), Some(node)) = (
            listed.metadata.name.as_deref(),
            internal_ip(&listed).and_then(|ip| by_address.get(ip)),
        ) else {
            continue;
        };
        let Ok(Some(version)) = tokio::time::timeout(READ_LIMIT, node.kubelet_version()).await
        else {
            continue;
        };
        if reported(&listed) == Some(version.as_str()) {
            continue;
        }
        // A Node deleted since the list is no one's to follow any more.
        let patch = json!({"status": {"nodeInfo": {"kubeletVersion": version}}});
        let _ = api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
    Ok(())
}
