//! What an operation's reconcile reads: the operation as stored, its cluster and that
//! cluster's machines, and a node's answers (running, etcd healthy, its version, its boot id).
//! Nothing here writes.

use ichor_api::common::Role;
use ichor_api::names::reasons;
use ichor_api::operation::{NodeStep, TalosOperation, TalosOperationStatus};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::{Credentials, Stage, TalosClient, TalosError};
use kube::ResourceExt as _;
use kube::api::Api;

use super::plan;
use super::{Node, api};
use crate::{Context, Error, Stop};

/// The operation as stored (`None`: it is gone). Safety rule (ADR 0055): a disruptive action
/// is sent on the operation's status as stored, never on the controller's cached copy.
pub(super) async fn read_stored(
    ctx: &Context,
    cached: &TalosOperation,
) -> Result<Option<TalosOperation>, Error> {
    Ok(api(ctx, cached).get_opt(&cached.name_any()).await?)
}

/// What a reconcile acts on: the operation's cluster and that cluster's machines.
pub(super) struct Observed {
    /// The TalosCluster of `spec.clusterRef`.
    pub(super) cluster: TalosCluster,
    /// Its machines.
    pub(super) machines: Vec<TalosMachine>,
}

/// Reads the operation's cluster and its machines, and chooses the operation's nodes on its
/// first run. The inner `Err` says why it has nothing to act on.
pub(super) async fn read_cluster(
    ctx: &Context,
    operation: &TalosOperation,
    status: &mut TalosOperationStatus,
) -> Result<Result<Observed, Stop>, Error> {
    let namespace = operation.namespace().unwrap_or_default();
    let cluster_name = operation.spec.cluster_ref.name.clone();
    let Some(cluster) = Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&cluster_name)
        .await?
    else {
        return Ok(Err(Stop::new(
            reasons::NO_TARGETS,
            format!(
                "TalosCluster {cluster_name} (spec.clusterRef) does not exist in namespace {namespace}"
            ),
        )));
    };
    if let Some(refused) = plan::refusal(operation, &cluster) {
        return Ok(Err(refused));
    }
    // As stored, as the cluster is (ADR 0055): the operation's nodes go one at a time under
    // the cluster lock (ADR 0019), which counts the machines moving now.
    let machines = crate::cluster_machines_as_stored(ctx, &cluster).await?;
    if let Err(problem) = plan::choose_targets(status, &operation.spec, &machines) {
        return Ok(Err(Stop::new(reasons::NO_TARGETS, problem.to_string())));
    }
    Ok(Ok(Observed { cluster, machines }))
}

/// The machine's address (empty when it has none).
pub(super) fn address(machine: &TalosMachine) -> String {
    crate::controller::machine::address(machine).unwrap_or_default()
}

/// Whether the node answers with its configured API, running (a rebooting node does not).
pub(super) async fn up(address: &str, credentials: &Credentials) -> Option<TalosClient> {
    let client = crate::connect(address, credentials).await?;
    let status = client.machine_status().await.ok()?;
    (status.stage == Stage::Running).then_some(client)
}

/// Why a node is not back and healthy yet.
#[derive(Debug, thiserror::Error)]
pub enum NotHealthy {
    /// The configured API does not answer in stage running.
    #[error("{0} is not running yet")]
    NotRunning(String),
    /// A control plane came back as a learner.
    #[error("{0} is back as an etcd learner")]
    Learner(String),
    /// A control plane's etcd member answers with errors (an alarm, or no leader).
    #[error("etcd on {address} reports errors: {errors}")]
    EtcdErrors {
        /// The node.
        address: String,
        /// What the member reports.
        errors: String,
    },
    /// A control plane's etcd does not answer.
    #[error("etcd on {address} is not back: {source}")]
    EtcdNotBack {
        /// The node.
        address: String,
        /// The node's error.
        #[source]
        source: TalosError,
    },
    /// The node does not report its version.
    #[error("{address} does not report its version: {source}")]
    NoVersion {
        /// The node.
        address: String,
        /// The node's error.
        #[source]
        source: TalosError,
    },
}

/// Whether the node is back and healthy for its role; its version if so.
pub(super) async fn healthy(
    address: &str,
    credentials: &Credentials,
    role: Role,
) -> Result<String, NotHealthy> {
    let Some(client) = up(address, credentials).await else {
        return Err(NotHealthy::NotRunning(address.to_owned()));
    };
    if role == Role::ControlPlane {
        match client.etcd_status().await {
            Ok(s) if s.learner => return Err(NotHealthy::Learner(address.to_owned())),
            Ok(s) if !s.errors.is_empty() => {
                return Err(NotHealthy::EtcdErrors {
                    address: address.to_owned(),
                    errors: s.errors.join("; "),
                });
            }
            Ok(_) => {}
            Err(source) => {
                return Err(NotHealthy::EtcdNotBack {
                    address: address.to_owned(),
                    source,
                });
            }
        }
    }
    client
        .version()
        .await
        .map_err(|source| NotHealthy::NoVersion {
            address: address.to_owned(),
            source,
        })
}

impl Node<'_> {
    /// Whether the node went down since the action was sent, on one look: it does not answer
    /// running now, or it answers with another boot id than before the action (back already).
    pub(super) async fn rebooted_since(&self, step: &NodeStep) -> bool {
        let Some(client) = up(&self.address, &self.credentials).await else {
            return true;
        };
        let now = client.boot_id().await.ok();
        plan::rebooted(step.boot_id_before.as_deref(), now.as_deref())
    }
}
