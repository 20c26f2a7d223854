//! The workload cluster's side of taking a node away: cordon, drain (evictions, so
//! PodDisruptionBudgets hold, by `crate::drain`) and delete the Node. Used by removals, and
//! its Node delete by reset operations; every step is idempotent, so a restart runs it again
//! safely. Beside it, [`manifests`]: the bootstrap manifests synced into the workload cluster
//! as a Kubernetes upgrade ends.

pub mod manifests;

use std::time::Duration;

use ichor_api::names::{annotations, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

use crate::drain::plan::{Limit, Verdict, judge};
use crate::{Context, Error, Stop};

/// The workload cluster's client: the manager's own short-lived credentials for it, cached
/// (`Context::workload_client`), never the published kubeconfig.
pub async fn client(ctx: &Context, cluster: &TalosCluster) -> Option<kube::Client> {
    ctx.workload_client(cluster).await
}

/// How long a workload API call may take to connect, or to answer.
pub(crate) const API_TIMEOUT: Duration = Duration::from_secs(10);

/// What one step came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done, with what to record.
    Done(String),
    /// Not yet: why.
    Wait(Stop),
    /// The workload cluster's API did not answer (or cannot be reached at all): what failed.
    /// The caller decides whether to wait or to skip (ADR 0021).
    Unreachable(String),
}

/// The workload side of one machine's node.
pub struct NodeSteps<'a> {
    /// The manager's context.
    pub ctx: &'a Context,
    /// The machine's cluster (its bundle and endpoint reach the workload API).
    pub cluster: &'a TalosCluster,
    /// The machine.
    pub machine: &'a TalosMachine,
}

pub(crate) fn no_workload() -> Outcome {
    Outcome::Unreachable("no client: the cluster's secrets bundle is unavailable".into())
}

/// What a Node step does for a machine that never recorded a node name: nothing to cordon,
/// drain or delete by name, so the step is skipped (it used to fail every reconcile).
pub(crate) fn no_node_name(step: &str) -> Outcome {
    Outcome::Done(format!(
        "{step} skipped: no Node name was ever recorded for this machine"
    ))
}

/// A workload API call that failed: a refusal or a server error is the API's answer and goes
/// up; a call that never reached the API (connection refused, timeout) is `Unreachable`, for
/// the caller to wait or skip, instead of failing every reconcile.
pub(crate) fn unreachable(error: kube::Error) -> Result<Outcome, Error> {
    match error {
        kube::Error::Api(_) => Err(error.into()),
        other => Ok(Outcome::Unreachable(other.to_string())),
    }
}

impl NodeSteps<'_> {
    /// The workload cluster's API endpoint, as the cluster declares it.
    pub fn endpoint(&self) -> &str {
        &self.cluster.spec.endpoint
    }

    /// `outcome`, an unreachable API made a wait naming the endpoint: for callers with no way
    /// to skip a step (operations).
    pub fn waiting_for_api(&self, outcome: Outcome) -> Outcome {
        match outcome {
            Outcome::Unreachable(detail) => Outcome::Wait(Stop::new(
                reasons::WORKLOAD_API_UNREACHABLE,
                format!(
                    "the workload cluster's API at {} does not answer ({detail}); it is retried once the API is restored",
                    self.endpoint()
                ),
            )),
            other => other,
        }
    }

    /// The machine's Node name, if one was ever recorded.
    pub fn node_name(&self) -> Option<String> {
        self.machine
            .status
            .as_ref()
            .and_then(|s| s.lifecycle.node_name.clone())
            .filter(|n| !n.is_empty())
    }

    /// Marks the Node unschedulable.
    pub async fn cordon(&self) -> Result<Outcome, Error> {
        let Some(node_name) = self.node_name() else {
            return Ok(no_node_name("cordon"));
        };
        let Some(workload) = client(self.ctx, self.cluster).await else {
            return Ok(no_workload());
        };
        match self.cordon_node(workload, &node_name).await {
            Ok(()) => Ok(Outcome::Done(format!("cordoned Node {node_name}"))),
            Err(error) => unreachable(error),
        }
    }

    async fn cordon_node(
        &self,
        workload: kube::Client,
        node_name: &str,
    ) -> Result<(), kube::Error> {
        let nodes: Api<Node> = Api::all(workload);
        if nodes.get_opt(node_name).await?.is_some() {
            nodes
                .patch(
                    node_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": true}})),
                )
                .await?;
        }
        Ok(())
    }

    /// A removal's drain: the Node's pods evicted (as before every disruption, `crate::drain`)
    /// and waited for; a PodDisruptionBudget's refusal waits, with no timeout, unless the
    /// machine carries the skip-drain annotation.
    pub async fn drain(&self) -> Result<Outcome, Error> {
        let Some(node_name) = self.node_name() else {
            return Ok(no_node_name("drain"));
        };
        let Some(workload) = client(self.ctx, self.cluster).await else {
            return Ok(no_workload());
        };
        let left = match crate::drain::pass(&workload, &node_name, &self.cluster.spec.drain).await {
            Ok(left) => left,
            Err(error) => return unreachable(error),
        };
        let skip_drain = self
            .machine
            .annotations()
            .get(annotations::SKIP_DRAIN)
            .map(String::as_str)
            == Some(annotations::TRUE);
        if skip_drain {
            return Ok(Outcome::Done(format!(
                "drain of Node {node_name} skipped by {}",
                annotations::SKIP_DRAIN
            )));
        }
        let limit = Limit::Never {
            hint: format!(
                "it retries, or set {}=true to continue without draining",
                annotations::SKIP_DRAIN
            ),
        };
        Ok(match judge(&node_name, &left, &limit) {
            Verdict::Drained => Outcome::Done(format!("drained Node {node_name}")),
            Verdict::Wait(stop) => Outcome::Wait(stop),
            Verdict::Force { message, .. } => Outcome::Done(message),
        })
    }

    /// Deletes the Node object (gone already is done).
    pub async fn delete(&self) -> Result<Outcome, Error> {
        let Some(node_name) = self.node_name() else {
            return Ok(no_node_name("Node deletion"));
        };
        let Some(workload) = client(self.ctx, self.cluster).await else {
            return Ok(no_workload());
        };
        let nodes: Api<Node> = Api::all(workload);
        match nodes.delete(&node_name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return unreachable(e),
        }
        Ok(Outcome::Done(format!("deleted Node {node_name}")))
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    #[tokio::test]
    async fn a_machine_without_a_node_name_skips_its_node_steps_without_calling_anything() {
        // A client to an address nothing listens on: a call would fail.
        let ctx = Context::nowhere(crate::Settings::default());
        let cluster = TalosCluster::test("lab").build();
        let machine = TalosMachine::test("w-1").build();
        let steps = NodeSteps {
            ctx: &ctx,
            cluster: &cluster,
            machine: &machine,
        };
        for outcome in [
            steps.cordon().await.expect("cordon"),
            steps.drain().await.expect("drain"),
            steps.delete().await.expect("delete"),
        ] {
            assert!(
                matches!(&outcome, Outcome::Done(m) if m.contains("no Node name")),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn an_api_that_does_not_answer_is_unreachable_and_an_api_refusal_goes_up() {
        let waited = unreachable(kube::Error::Service("connection refused".into()));
        assert!(
            matches!(&waited, Ok(Outcome::Unreachable(detail)) if detail.contains("connection refused")),
            "{waited:?}"
        );
        let refused = kube::Error::Api(
            kube::core::Status::failure("forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        assert!(unreachable(refused).is_err());
    }
}
