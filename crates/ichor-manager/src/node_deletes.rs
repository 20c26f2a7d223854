//! Node deletes handed over by force removals while the workload cluster's API did not answer
//! (ADR 0021). They live in the TalosCluster's `status.pendingNodeDeletes` (their own field
//! manager), so they outlive the TalosMachine; the cluster reconciler runs them once the API
//! answers again, and only on a Node that is still the removed machine's
//! (`ichor_deleteguard::deferred_node_delete`).

use ichor_api::cluster::{ClusterNodeDeletes, PendingNodeDelete};
use ichor_api::names::{actions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{DeferredDelete, Kept, deferred_node_delete};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::events::EventType;

use crate::infra::status::{self, Guard};
use crate::{Context, Error, workload};

fn clusters_api(ctx: &Context, cluster: &TalosCluster) -> Api<TalosCluster> {
    Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
}

fn pending_of(cluster: &TalosCluster) -> Vec<PendingNodeDelete> {
    cluster
        .status
        .as_ref()
        .map(|s| s.node_deletes.pending.clone())
        .unwrap_or_default()
}

/// Writes `change` applied to the cluster's pending Node deletes, read fresh, checked against
/// the version read (retried on a conflict).
async fn update(
    ctx: &Context,
    cluster: &TalosCluster,
    change: impl Fn(&mut Vec<PendingNodeDelete>),
) -> Result<(), Error> {
    let api = clusters_api(ctx, cluster);
    loop {
        let Some(fresh) = api.get_opt(&cluster.name_any()).await? else {
            return Ok(());
        };
        let mut status = fresh.status.clone().unwrap_or_default();
        change(&mut status.node_deletes.pending);
        if fresh.status.as_ref().map(|s| &s.node_deletes.pending)
            == Some(&status.node_deletes.pending)
        {
            return Ok(());
        }
        // Only this group changed, so only it is written, checked against the version read.
        match status::apply::<ClusterNodeDeletes, _>(&api, &fresh, &status, Guard::Version).await {
            Ok(()) => return Ok(()),
            Err(kube::Error::Api(s)) if s.is_conflict() => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Hands the delete of Node `node` (of `machine`, being removed) to `cluster`: recorded before
/// the removal records its Node step done, so it survives the machine.
pub async fn defer(
    ctx: &Context,
    cluster: &TalosCluster,
    node: &str,
    machine: &TalosMachine,
) -> Result<(), Error> {
    let entry = PendingNodeDelete {
        node: node.to_owned(),
        machine: machine.name_any(),
        since: ctx.now(),
    };
    update(ctx, cluster, |pending| {
        if !pending.iter().any(|p| p.node == entry.node) {
            pending.push(entry.clone());
        }
    })
    .await
}

/// Runs the cluster's pending Node deletes once the workload API answers; returns whether some
/// are still pending (the API still does not answer).
pub async fn retry(ctx: &Context, cluster: &TalosCluster) -> Result<bool, Error> {
    let pending = pending_of(cluster);
    if pending.is_empty() {
        return Ok(false);
    }
    let Some(client) = workload::client(ctx, cluster).await else {
        return Ok(true);
    };
    // As stored: a Node that a machine runs as now is never deleted.
    let machines = crate::cluster_machines_as_stored(ctx, cluster).await?;
    for entry in &pending {
        let Some(settled) = settle(&client, &machines, entry).await? else {
            tracing::debug!(node = %entry.node, "the workload API does not answer yet");
            return Ok(true);
        };
        let (type_, reason, message) = settled;
        ctx.event(cluster, type_, reason, actions::DELETE, message)
            .await;
        update(ctx, cluster, |pending| {
            pending.retain(|p| p.node != entry.node);
        })
        .await?;
    }
    Ok(false)
}

/// What `entry` came to: the Event to publish (`None`: the API did not answer).
async fn settle(
    client: &kube::Client,
    machines: &[TalosMachine],
    entry: &PendingNodeDelete,
) -> Result<Option<(EventType, &'static str, String)>, Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = match nodes.get_opt(&entry.node).await {
        Ok(node) => node,
        Err(kube::Error::Api(s)) => return Err(kube::Error::Api(s).into()),
        Err(_) => return Ok(None),
    };
    let created = node
        .as_ref()
        .and_then(|n| n.metadata.creation_timestamp.as_ref())
        .map(|t| t.0.as_second());
    let claimed_by = machines
        .iter()
        .find(|m| {
            m.metadata.deletion_timestamp.is_none()
                && m.status
                    .as_ref()
                    .and_then(|s| s.lifecycle.node_name.as_deref())
                    == Some(&entry.node)
        })
        .map(|m| m.name_any());
    let since = entry.since.0.as_second();
    // A Node with no creation time is judged as created now: kept, never deleted by mistake.
    let created = node.as_ref().map(|_| created.unwrap_or(i64::MAX));
    let outcome = match deferred_node_delete(created, since, claimed_by.as_deref()) {
        DeferredDelete::Delete => delete(&nodes, node.as_ref(), entry).await?,
        DeferredDelete::Gone => Some(()),
        DeferredDelete::Kept(why) => return Ok(Some(kept(entry, &why))),
    };
    Ok(outcome.map(|()| {
        (
            EventType::Normal,
            reasons::DEFERRED_NODE_DELETED,
            format!(
                "Node {} of force-removed {} deleted: the workload API answers again",
                entry.node, entry.machine
            ),
        )
    }))
}

/// Deletes `node` (the one judged, by uid); `None`: the API did not answer.
async fn delete(
    nodes: &Api<Node>,
    node: Option<&Node>,
    entry: &PendingNodeDelete,
) -> Result<Option<()>, Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.and_then(|n| n.metadata.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match nodes.delete(&entry.node, &params).await {
        Ok(_) => Ok(Some(())),
        // Gone meanwhile, or replaced by another Node of that name (the uid differs): not
        // ours to delete either way.
        Err(kube::Error::Api(s)) if s.is_not_found() || s.is_conflict() => Ok(Some(())),
        Err(kube::Error::Api(s)) => Err(kube::Error::Api(s).into()),
        Err(_) => Ok(None),
    }
}

/// The Event of a deferred delete dropped because the Node is another node's now.
fn kept(entry: &PendingNodeDelete, why: &Kept) -> (EventType, &'static str, String) {
    let because = match why {
        Kept::RegisteredAfter => "it was registered after the removal".to_owned(),
        Kept::Claimed { machine } => format!("{machine} records it as its Node"),
    };
    (
        EventType::Warning,
        reasons::DEFERRED_NODE_KEPT,
        format!(
            "Node {} of force-removed {} is kept and its deferred delete dropped: {because}",
            entry.node, entry.machine
        ),
    )
}
