//! Removing a machine: the finalizer's work. A never-configured machine has nothing to undo.
//! A configured one is removed inside the cluster lock, step by recorded step, so a restart
//! resumes at the step reached: recheck (ichor-deleteguard), cordon and drain its Node in the
//! workload cluster, leave etcd (a failed leave stops the removal), verify through a peer,
//! reset naming STATE and EPHEMERAL with a reboot, delete the Node, release the finalizer.

use std::time::Duration;

use ichor_api::common::Role;
use ichor_api::machine::{MachinePhase, RemovalProgress, RemovalStep, TalosMachineStatus};
use ichor_api::names::{annotations, conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Cluster, Machine, RemovalVerdict, check_machine_removal};
use ichor_talos::{ResetOptions, TalosClient};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;

use crate::leader::{LeaseSettings, try_acquire};
use crate::{Context, Error, conditions as cond, secrets};

/// How long a removal's hold on the cluster lock lasts without renewal.
const LOCK_SECONDS: u64 = 60;

/// The cluster lock's Lease name.
pub fn lock_name(cluster: &str) -> String {
    format!("ichor-cluster-lock-{cluster}")
}

fn lock(namespace: &str, cluster: &str, holder: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: namespace.to_owned(),
        name: lock_name(cluster),
        identity: holder.to_owned(),
        duration: Duration::from_secs(LOCK_SECONDS),
        retry: Duration::from_secs(2),
    }
}

/// The next step after `done`, for `role`: workers skip etcd.
pub fn next_step(done: RemovalStep, role: Role) -> RemovalStep {
    match (done, role) {
        (RemovalStep::Pending, _) => RemovalStep::Cordoned,
        (RemovalStep::Cordoned, _) => RemovalStep::Drained,
        (RemovalStep::Drained, Role::ControlPlane) => RemovalStep::EtcdLeft,
        (RemovalStep::Drained | RemovalStep::EtcdLeft, _) => RemovalStep::Reset,
        (RemovalStep::Reset, _) => RemovalStep::NodeDeleted,
        (RemovalStep::NodeDeleted | RemovalStep::Complete, _) => RemovalStep::Complete,
    }
}

fn machines_api(ctx: &Context, machine: &TalosMachine) -> Api<TalosMachine> {
    Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default())
}

async fn release_finalizer(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    // Read the latest version: the status writes of this removal moved it on.
    let api = machines_api(ctx, machine);
    let Some(fresh) = api.get_opt(&machine.name_any()).await? else {
        return Ok(());
    };
    let remaining: Vec<String> = fresh
        .finalizers()
        .iter()
        .filter(|f| f.as_str() != finalizers::MACHINE_REMOVAL)
        .cloned()
        .collect();
    api.patch(
        &fresh.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": remaining, "resourceVersion": fresh.resource_version()}})),
    )
    .await?;
    Ok(())
}

/// Adds the removal finalizer to an approved machine (before anything is applied to it).
pub async fn ensure_finalizer(ctx: &Context, machine: &TalosMachine) -> Result<(), Error> {
    if machine
        .finalizers()
        .iter()
        .any(|f| f == finalizers::MACHINE_REMOVAL)
    {
        return Ok(());
    }
    let api = machines_api(ctx, machine);
    let Some(fresh) = api.get_opt(&machine.name_any()).await? else {
        return Ok(());
    };
    if fresh
        .finalizers()
        .iter()
        .any(|f| f == finalizers::MACHINE_REMOVAL)
    {
        return Ok(());
    }
    let mut all = fresh.finalizers().to_vec();
    all.push(finalizers::MACHINE_REMOVAL.to_owned());
    api.patch(
        &fresh.name_any(),
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"finalizers": all, "resourceVersion": fresh.resource_version()}}),
        ),
    )
    .await?;
    Ok(())
}

async fn record(
    ctx: &Context,
    machine: &TalosMachine,
    mut status: TalosMachineStatus,
    step: RemovalStep,
    message: String,
) -> Result<TalosMachineStatus, Error> {
    let progress = status.removal.get_or_insert_with(|| RemovalProgress {
        started_at: Some(cond::now()),
        ..Default::default()
    });
    progress.step = step;
    progress.message = Some(message);
    status.phase = MachinePhase::Removing;
    machines_api(ctx, machine)
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    Ok(status)
}

async fn waiting(
    ctx: &Context,
    machine: &TalosMachine,
    status: TalosMachineStatus,
    reason: &str,
    message: String,
) -> Result<Action, Error> {
    let mut status = status;
    let step = status.removal.as_ref().map(|r| r.step).unwrap_or_default();
    let first =
        status.removal.as_ref().and_then(|r| r.message.as_deref()) != Some(message.as_str());
    cond::set(
        &mut status.conditions,
        conditions::REMOVAL_APPROVED,
        false,
        reason,
        message.clone(),
        machine.metadata.generation,
    );
    record(ctx, machine, status, step, message.clone()).await?;
    if first {
        ctx.event(machine, EventType::Warning, reason, "Remove", message)
            .await;
    }
    Ok(Action::requeue(ctx.settings.progress_requeue))
}

/// The workload cluster's client, from the published kubeconfig Secret.
pub async fn workload_client(ctx: &Context, cluster: &TalosCluster) -> Option<kube::Client> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.status.as_ref()?.kubeconfig_secret.clone()?;
    let text = secrets::read(&ctx.client, &namespace, &name, secrets::KUBECONFIG_KEY)
        .await
        .ok()??;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text).ok()?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .ok()?;
    kube::Client::try_from(config).ok()
}

/// Drives a deleted machine's removal one step per reconcile.
pub async fn reconcile(ctx: &Context, machine: &TalosMachine) -> Result<Action, Error> {
    if !machine
        .finalizers()
        .iter()
        .any(|f| f == finalizers::MACHINE_REMOVAL)
    {
        return Ok(Action::await_change());
    }
    let status = machine.status.clone().unwrap_or_default();
    let namespace = machine.namespace().unwrap_or_default();
    let cluster_name = machine.spec.cluster_ref.name.clone();
    let holder = format!("removal/{}", machine.uid().unwrap_or_default());
    // Never configured: nothing to undo on the node.
    if status.applied_config_hash.is_none() {
        release_finalizer(ctx, machine).await?;
        return Ok(Action::await_change());
    }
    let clusters: Api<TalosCluster> = Api::namespaced(ctx.client.clone(), &namespace);
    let Some(cluster) = clusters.get_opt(&cluster_name).await? else {
        release_finalizer(ctx, machine).await?;
        return Ok(Action::await_change());
    };
    // One disruptive action per cluster: the lock's holder is this removal.
    if !try_acquire(&ctx.client, &lock(&namespace, &cluster_name, &holder)).await? {
        return waiting(
            ctx,
            machine,
            status,
            reasons::WAITING_FOR_LOCK,
            "waiting for the cluster lock held by another action".into(),
        )
        .await;
    }
    let role = machine.spec.role.unwrap_or(Role::Worker);
    let done = status.removal.as_ref().map(|r| r.step).unwrap_or_default();
    if done == RemovalStep::Pending {
        let all: Vec<TalosMachine> = machines_api(ctx, machine)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|m| m.spec.cluster_ref.name == cluster_name)
            .collect();
        let inputs: Vec<Machine> = all.iter().map(Machine::from).collect();
        match check_machine_removal(&Machine::from(machine), &inputs, &Cluster::from(&cluster)) {
            RemovalVerdict::Proceed => {}
            verdict => {
                let reason = verdict
                    .reason()
                    .unwrap_or(reasons::QUORUM_AT_RISK)
                    .to_owned();
                let message = verdict.message().unwrap_or_default();
                return waiting(ctx, machine, status, &reason, message).await;
            }
        }
    }
    let next = next_step(done, role);
    let bundle = match secrets::bundle(&ctx.client, &cluster).await? {
        Ok(b) => b,
        Err(problem) => {
            return waiting(
                ctx,
                machine,
                status,
                reasons::SECRETS_BUNDLE_UNAVAILABLE,
                problem.to_string(),
            )
            .await;
        }
    };
    let credentials = crate::credentials(&bundle)?;
    let address = status
        .address
        .clone()
        .or_else(|| machine.spec.endpoints.first().cloned())
        .unwrap_or_default();
    let node_name = status.node_name.clone().unwrap_or_default();
    let skip_drain = machine
        .annotations()
        .get(annotations::SKIP_DRAIN)
        .map(String::as_str)
        == Some(annotations::TRUE);
    let message = match next {
        RemovalStep::Cordoned | RemovalStep::Drained | RemovalStep::NodeDeleted => {
            let Some(workload) = workload_client(ctx, &cluster).await else {
                return waiting(ctx, machine, status, reasons::NODE_UNREACHABLE, "the workload cluster's API cannot be reached (kubeconfig Secret missing or API down)".into()).await;
            };
            let nodes: Api<Node> = Api::all(workload.clone());
            match next {
                RemovalStep::Cordoned => {
                    if nodes
                        .get_opt(&node_name)
                        .await
                        .map_err(Error::Kube)?
                        .is_some()
                    {
                        nodes
                            .patch(
                                &node_name,
                                &PatchParams::default(),
                                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
                            )
                            .await?;
                    }
                    format!("cordoned Node {node_name}")
                }
                RemovalStep::Drained => {
                    let pods: Api<Pod> = Api::all(workload);
                    let on_node = pods
                        .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
                        .await?
                        .items;
                    let evictable: Vec<&Pod> = on_node
                        .iter()
                        .filter(|p| {
                            let owners = p.metadata.owner_references.clone().unwrap_or_default();
                            let daemon = owners.iter().any(|o| o.kind == "DaemonSet");
                            let mirror =
                                p.annotations().contains_key("kubernetes.io/config.mirror");
                            !daemon && !mirror && p.metadata.deletion_timestamp.is_none()
                        })
                        .collect();
                    let mut blocked = Vec::new();
                    for pod in &evictable {
                        let api: Api<Pod> = Api::namespaced(
                            pods.clone().into_client(),
                            &pod.namespace().unwrap_or_default(),
                        );
                        match api.evict(&pod.name_any(), &EvictParams::default()).await {
                            Ok(_) => {}
                            Err(kube::Error::Api(s)) if s.code == 429 => {
                                blocked.push(pod.name_any())
                            }
                            Err(kube::Error::Api(s)) if s.code == 404 => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    if !blocked.is_empty() && !skip_drain {
                        return waiting(ctx, machine, status, "DrainBlocked", format!("evicting {} is refused by a PodDisruptionBudget; it retries, or set {}=true to continue without draining", blocked.join(", "), annotations::SKIP_DRAIN)).await;
                    }
                    let left = evictable.len() - blocked.len();
                    if left > 0 && !skip_drain {
                        // Evicted pods are still terminating: look again.
                        let still = pods
                            .list(
                                &ListParams::default()
                                    .fields(&format!("spec.nodeName={node_name}")),
                            )
                            .await?
                            .items;
                        if still.iter().any(|p| {
                            p.metadata.deletion_timestamp.is_none()
                                && !p
                                    .metadata
                                    .owner_references
                                    .clone()
                                    .unwrap_or_default()
                                    .iter()
                                    .any(|o| o.kind == "DaemonSet")
                        }) {
                            return waiting(
                                ctx,
                                machine,
                                status,
                                "Draining",
                                format!("waiting for pods to leave Node {node_name}"),
                            )
                            .await;
                        }
                    }
                    format!("drained Node {node_name}")
                }
                _ => {
                    match nodes.delete(&node_name, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e.into()),
                    }
                    format!("deleted Node {node_name}")
                }
            }
        }
        RemovalStep::EtcdLeft => {
            let Some(client) = crate::connect(&address, &credentials).await else {
                return waiting(ctx, machine, status, reasons::NODE_UNREACHABLE, format!("{address} does not answer: the etcd leave cannot run (removing an unreachable member needs {})", annotations::FORCE_REMOVE)).await;
            };
            let member = client.etcd_status().await.ok();
            if let Some(member) = &member {
                if member.leader == member.member_id {
                    let _ = client.etcd_forfeit_leadership().await;
                }
                if let Err(error) = client.etcd_leave().await {
                    return waiting(
                        ctx,
                        machine,
                        status,
                        "EtcdLeaveFailed",
                        format!("the etcd leave failed, so the removal stopped: {error}"),
                    )
                    .await;
                }
            }
            // Verify through a peer that the member is gone.
            if let Some(member) = member {
                let peers = peer_addresses(ctx, machine).await?;
                let mut verified = false;
                for peer in peers {
                    if let Some(peer) = crate::connect(&peer, &credentials).await
                        && let Ok(members) = peer.etcd_members(false).await
                    {
                        verified = !members.iter().any(|m| m.id == member.member_id);
                        break;
                    }
                }
                if !verified {
                    return waiting(
                        ctx,
                        machine,
                        status,
                        "EtcdLeaveUnverified",
                        "no healthy peer confirms the member left etcd yet".into(),
                    )
                    .await;
                }
            }
            "left etcd, verified through a peer".to_owned()
        }
        RemovalStep::Reset => {
            match TalosClient::connect(&address, &credentials).await {
                Ok(client) => {
                    if let Err(error) = client
                        .reset(ResetOptions {
                            graceful: false,
                            reboot: true,
                        })
                        .await
                    {
                        return waiting(
                            ctx,
                            machine,
                            status,
                            "ResetFailed",
                            format!("the reset failed: {error}"),
                        )
                        .await;
                    }
                }
                Err(error) => {
                    return waiting(
                        ctx,
                        machine,
                        status,
                        reasons::NODE_UNREACHABLE,
                        format!("{address} does not answer for its reset: {error}"),
                    )
                    .await;
                }
            }
            "reset (STATE and EPHEMERAL wiped); the node reboots into maintenance mode".to_owned()
        }
        RemovalStep::Pending | RemovalStep::Complete => "done".to_owned(),
    };
    ctx.event(
        machine,
        EventType::Normal,
        "Removal",
        "Remove",
        message.clone(),
    )
    .await;
    record(ctx, machine, status, next, message).await?;
    if matches!(next, RemovalStep::NodeDeleted | RemovalStep::Complete) {
        finish(ctx, machine, &cluster, &holder).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(Duration::from_millis(50)))
}

/// The last step: the reservation and the lock go, then the finalizer.
async fn finish(
    ctx: &Context,
    machine: &TalosMachine,
    cluster: &TalosCluster,
    holder: &str,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let uid = machine.uid().unwrap_or_default();
    let reservations = ichor_webhook_reservations(cluster)
        .into_iter()
        .filter(|r| r["uid"] != uid.as_str())
        .collect::<Vec<_>>();
    Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .patch(
            &cluster.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {annotations::REMOVAL_RESERVATIONS: serde_json::to_string(&reservations).unwrap_or_else(|_| "[]".into())}}})),
        )
        .await?;
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(ctx.client.clone(), &namespace);
    if let Some(lease) = leases.get_opt(&lock_name(&cluster.name_any())).await?
        && lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(holder)
    {
        let _ = leases
            .delete(&lock_name(&cluster.name_any()), &DeleteParams::default())
            .await;
    }
    release_finalizer(ctx, machine).await
}

fn ichor_webhook_reservations(cluster: &TalosCluster) -> Vec<serde_json::Value> {
    cluster
        .annotations()
        .get(annotations::REMOVAL_RESERVATIONS)
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// Addresses of the other configured control planes of the machine's cluster.
async fn peer_addresses(ctx: &Context, machine: &TalosMachine) -> Result<Vec<String>, Error> {
    Ok(machines_api(ctx, machine)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|m| {
            m.spec.cluster_ref.name == machine.spec.cluster_ref.name
                && m.name_any() != machine.name_any()
                && m.spec.role == Some(Role::ControlPlane)
                && m.metadata.deletion_timestamp.is_none()
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.applied_config_hash.is_some())
        })
        .filter_map(|m| m.status.and_then(|s| s.address))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_skip_etcd_and_every_removal_ends() {
        let mut step = RemovalStep::Pending;
        let mut seen = vec![];
        while step != RemovalStep::Complete {
            step = next_step(step, Role::Worker);
            seen.push(step);
        }
        assert!(!seen.contains(&RemovalStep::EtcdLeft));
        let mut step = RemovalStep::Pending;
        let mut cp = vec![];
        while step != RemovalStep::Complete {
            step = next_step(step, Role::ControlPlane);
            cp.push(step);
        }
        assert_eq!(
            cp,
            [
                RemovalStep::Cordoned,
                RemovalStep::Drained,
                RemovalStep::EtcdLeft,
                RemovalStep::Reset,
                RemovalStep::NodeDeleted,
                RemovalStep::Complete
            ]
        );
    }
}
