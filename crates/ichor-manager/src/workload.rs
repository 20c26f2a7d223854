//! The workload cluster's side of taking a node away: cordon, drain (evictions, so
//! PodDisruptionBudgets hold) and delete the Node. Used by removals and by reset operations;
//! every step is idempotent, so a restart runs it again safely.

use ichor_api::names::{annotations, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::{Context, Error, secrets};

/// The workload cluster's client, from the published kubeconfig Secret.
pub async fn client(ctx: &Context, cluster: &TalosCluster) -> Option<kube::Client> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.status.as_ref()?.kubeconfig_secret.clone()?;
    let text = secrets::read(&ctx.client, &namespace, &name, secrets::KUBECONFIG_KEY)
        .await
        .ok()??;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).ok()?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .ok()?;
    // An eviction a PodDisruptionBudget refuses answers 429: the drain must see it at once
    // (and report it), not have the client retry it with backoff.
    config.default_retry = false;
    kube::Client::try_from(config).ok()
}

/// What one step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done, with what to record.
    Done(String),
    /// Not yet: why, as a condition reason and a message.
    Wait {
        /// The condition reason.
        reason: &'static str,
        /// What it waits for.
        message: String,
    },
}

/// The workload side of one machine's node.
pub struct NodeSteps<'a> {
    /// The manager's context.
    pub ctx: &'a Context,
    /// The machine's cluster (its published kubeconfig reaches the workload API).
    pub cluster: &'a TalosCluster,
    /// The machine.
    pub machine: &'a TalosMachine,
}

fn no_workload() -> Outcome {
    Outcome::Wait {
        reason: reasons::NODE_UNREACHABLE,
        message:
            "the workload cluster's API cannot be reached (kubeconfig Secret missing or API down)"
                .into(),
    }
}

impl NodeSteps<'_> {
    fn node_name(&self) -> String {
        self.machine
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default()
    }

    /// Marks the Node unschedulable.
    pub async fn cordon(&self) -> Result<Outcome, Error> {
        let Some(workload) = client(self.ctx, self.cluster).await else {
            return Ok(no_workload());
        };
        let node_name = self.node_name();
        let nodes: Api<Node> = Api::all(workload);
        if nodes.get_opt(&node_name).await?.is_some() {
            nodes
                .patch(
                    &node_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": true}})),
                )
                .await?;
        }
        Ok(Outcome::Done(format!("cordoned Node {node_name}")))
    }

    /// Evicts the Node's pods (not DaemonSet or mirror pods) and waits for them to leave; a
    /// PodDisruptionBudget's refusal waits, unless the machine carries the skip-drain
    /// annotation.
    pub async fn drain(&self) -> Result<Outcome, Error> {
        let Some(workload) = client(self.ctx, self.cluster).await else {
            return Ok(no_workload());
        };
        let skip_drain = self
            .machine
            .annotations()
            .get(annotations::SKIP_DRAIN)
            .map(String::as_str)
            == Some(annotations::TRUE);
        let node_name = self.node_name();
        let pods: Api<Pod> = Api::all(workload.clone());
        let on_node = |pods: Vec<Pod>| -> Vec<Pod> {
            pods.into_iter()
                .filter(|p| {
                    let owners = p.metadata.owner_references.clone().unwrap_or_default();
                    let daemon = owners.iter().any(|o| o.kind == "DaemonSet");
                    let mirror = p.annotations().contains_key("kubernetes.io/config.mirror");
                    !daemon && !mirror && p.metadata.deletion_timestamp.is_none()
                })
                .collect()
        };
        let fields = ListParams::default().fields(&format!("spec.nodeName={node_name}"));
        let evictable = on_node(pods.list(&fields).await?.items);
        let mut blocked = Vec::new();
        for pod in &evictable {
            let api: Api<Pod> =
                Api::namespaced(workload.clone(), &pod.namespace().unwrap_or_default());
            match api.evict(&pod.name_any(), &EvictParams::default()).await {
                Ok(_) => {}
                // A PodDisruptionBudget refuses the eviction with TooManyRequests (429).
                Err(kube::Error::Api(s))
                    if s.reason == kube::core::response::reason::TOO_MANY_REQUESTS =>
                {
                    blocked.push(pod.name_any());
                }
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        if skip_drain {
            return Ok(Outcome::Done(format!(
                "drain of Node {node_name} skipped by {}",
                annotations::SKIP_DRAIN
            )));
        }
        if !blocked.is_empty() {
            return Ok(Outcome::Wait {
                reason: reasons::DRAIN_BLOCKED,
                message: format!(
                    "evicting {} is refused by a PodDisruptionBudget; it retries, or set {}=true to continue without draining",
                    blocked.join(", "),
                    annotations::SKIP_DRAIN
                ),
            });
        }
        if !evictable.is_empty() && !on_node(pods.list(&fields).await?.items).is_empty() {
            return Ok(Outcome::Wait {
                reason: reasons::DRAINING,
                message: format!("waiting for pods to leave Node {node_name}"),
            });
        }
        Ok(Outcome::Done(format!("drained Node {node_name}")))
    }

    /// Deletes the Node object (gone already is done).
    pub async fn delete(&self) -> Result<Outcome, Error> {
        let Some(workload) = client(self.ctx, self.cluster).await else {
            return Ok(no_workload());
        };
        let node_name = self.node_name();
        let nodes: Api<Node> = Api::all(workload);
        match nodes.delete(&node_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        Ok(Outcome::Done(format!("deleted Node {node_name}")))
    }
}
