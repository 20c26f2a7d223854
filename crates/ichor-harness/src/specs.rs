//! The lifecycle specs, written once against [`Target`]: every target runs them.

use std::time::Duration;

use base64::Engine as _;
use ichor_api::cluster::{CniPreset, UnknownCniPreset};
use ichor_api::common::ConditionStatus;
use ichor_api::names::conditions;
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use ichor_talos::{Credentials, TalosClient};
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::{Error, Target};

/// How a spec's cluster is shaped.
#[derive(Debug, Clone)]
pub struct Shape {
    /// The TalosCluster's name.
    pub name: String,
    /// The Talos version contract.
    pub talos_version: String,
    /// The CNI preset.
    pub cni: String,
    /// How many of the nodes (the first ones) become control planes.
    pub control_planes: usize,
}

impl Shape {
    /// Three control planes on `talos_version` with `cni`.
    pub fn new(talos_version: &str, cni: &str) -> Self {
        Self {
            name: "lab".into(),
            talos_version: talos_version.into(),
            cni: cni.into(),
            control_planes: 3,
        }
    }
}

fn machines(target: &impl Target) -> Api<TalosMachine> {
    Api::namespaced(target.client(), target.namespace())
}

fn clusters(target: &impl Target) -> Api<TalosCluster> {
    Api::namespaced(target.client(), target.namespace())
}

/// Creates the TalosCluster: discovery over the /24 of the first node, the first node's
/// address as the endpoint.
pub async fn create_cluster(target: &impl Target, shape: &Shape) -> Result<(), Error> {
    create_cluster_with(target, shape, |_| {}).await
}

/// As [`create_cluster`], with `edit` applied to the spec before it is created (for fields set
/// only at creation, such as `restoreFrom`).
pub async fn create_cluster_with(
    target: &impl Target,
    shape: &Shape,
    edit: impl FnOnce(&mut ichor_api::TalosClusterSpec),
) -> Result<(), Error> {
    let endpoints = target.node_endpoints();
    let first = endpoints
        .first()
        .ok_or_else(|| Error::Spec("the target has no nodes".into()))?;
    // Every /24 holding a node (a real pod network spreads VMs over per-node subnets).
    let mut cidrs: Vec<String> = endpoints
        .iter()
        .filter_map(|e| e.rsplit_once('.').map(|(p, _)| format!("{p}.0/24")))
        .collect();
    cidrs.sort();
    cidrs.dedup();
    let preset: CniPreset = shape
        .cni
        .parse()
        .map_err(|e: UnknownCniPreset| Error::Spec(e.to_string()))?;
    let control_planes = i32::try_from(shape.control_planes)
        .map_err(|_| Error::Spec("too many control planes".into()))?;
    let mut cluster = TalosCluster::test(&shape.name)
        .namespace(target.namespace())
        .talos(&shape.talos_version)
        .endpoint(&format!("https://{first}:6443"))
        .control_planes(control_planes)
        .cni(preset)
        .discovery(&cidrs, "10s")
        .install_disk("/dev/vda");
    if let Some(image) = target.installer_image() {
        cluster = cluster.installer(&image);
    }
    let mut cluster = cluster.build();
    edit(&mut cluster.spec);
    clusters(target)
        .create(&PostParams::default(), &cluster)
        .await?;
    Ok(())
}

/// Creates the cluster `lab` declaring `control_planes` (`talos_version`, flannel) and waits
/// until `n` machines were discovered, all pending; returns its shape and the machines.
pub async fn discovered_cluster(
    target: &impl Target,
    talos_version: &str,
    control_planes: usize,
    n: usize,
) -> Result<(Shape, Vec<TalosMachine>), Error> {
    let shape = Shape {
        control_planes,
        ..Shape::new(talos_version, "flannel")
    };
    create_cluster(target, &shape).await?;
    let found = wait_discovered(target, n).await?;
    Ok((shape, found))
}

/// Waits until `n` machines were discovered, all pending.
pub async fn wait_discovered(target: &impl Target, n: usize) -> Result<Vec<TalosMachine>, Error> {
    let api = machines(target);
    try_eventually(
        &format!("{n} discovered machines"),
        Duration::from_secs(60),
        || async {
            api.list(&ListParams::default())
                .await
                .map(|l| l.items.len())
                .unwrap_or(0)
                >= n
        },
    )
    .await?;
    let found = api.list(&ListParams::default()).await?.items;
    for m in &found {
        if m.status
            .as_ref()
            .is_some_and(|s| s.applied.config_hash.is_some())
        {
            return Err(Error::Spec(format!(
                "{} has a config applied before approval",
                m.name_any()
            )));
        }
    }
    Ok(found)
}

/// The Events in the target's namespace with `reason` (none when the list fails).
pub async fn events_with_reason(target: &impl Target, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(target.client(), target.namespace())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// The Events with `reason`, once there is one within `limit`. The manager publishes an
/// Event after the status write it explains, so a spec that saw the status waits for it.
pub async fn events_once(
    target: &impl Target,
    reason: &str,
    limit: Duration,
) -> Result<Vec<Event>, Error> {
    try_eventually(&format!("an Event {reason}"), limit, || async {
        let events = events_with_reason(target, reason).await;
        (!events.is_empty()).then_some(events)
    })
    .await
    .map_err(|timeout| Error::Spec(timeout.to_string()))
}

/// The machine whose endpoint is `address`.
pub async fn machine_at(target: &impl Target, address: &str) -> Result<TalosMachine, Error> {
    machines(target)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .find(|m| m.spec.endpoints.first().map(String::as_str) == Some(address))
        .ok_or_else(|| Error::Spec(format!("no machine at {address}")))
}

/// Condition `type_` of the machine at `address`: (holds, reason, message).
pub async fn machine_condition(
    target: &impl Target,
    address: &str,
    type_: &str,
) -> Option<(bool, String, String)> {
    let m = machine_at(target, address).await.ok()?;
    m.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status == ConditionStatus::True, c.reason, c.message))
}

/// Approves the machine at `address` as a person would: one patch with role and hostname.
pub async fn approve(
    target: &impl Target,
    address: &str,
    control_plane: bool,
    hostname: &str,
) -> Result<(), Error> {
    let machine = machine_at(target, address).await?;
    machines(target)
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "approvalState": "approved",
                "role": if control_plane { "controlplane" } else { "worker" },
                "hostname": hostname
            }})),
        )
        .await?;
    Ok(())
}

/// Deletes the machine at `address` as a person would: the allow-delete annotation, then the
/// delete (which the webhook admits or refuses). Returns its name.
pub async fn delete_machine(target: &impl Target, address: &str) -> Result<String, Error> {
    let machine = machine_at(target, address).await?;
    let name = machine.name_any();
    let api = machines(target);
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ichor_api::names::annotations::ALLOW_DELETE: "true"}}})),
    )
    .await?;
    api.delete(&name, &Default::default()).await?;
    Ok(name)
}

/// Approves every node: the first `shape.control_planes` as control planes.
pub async fn approve_all(target: &impl Target, shape: &Shape) -> Result<(), Error> {
    let nodes = target.node_endpoints().len();
    approve_shape(
        target,
        shape.control_planes,
        nodes.saturating_sub(shape.control_planes),
    )
    .await
}

/// Whether a condition holds on the cluster.
pub async fn cluster_condition(target: &impl Target, name: &str, type_: &str) -> bool {
    clusters(target)
        .get(name)
        .await
        .ok()
        .and_then(|c| c.status)
        .is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
        })
}

/// Waits until the cluster is Ready: a watch, not a poll.
pub async fn wait_ready(target: &impl Target, name: &str, limit: Duration) -> Result<(), Error> {
    let ready = |c: Option<&TalosCluster>| {
        c.and_then(|c| c.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == conditions::READY && c.status == ConditionStatus::True)
        })
    };
    tokio::time::timeout(
        limit,
        kube::runtime::wait::await_condition(clusters(target), name, ready),
    )
    .await
    .map_err(|_| {
        Error::Spec(format!(
            "timed out after {limit:?} waiting for the cluster Ready"
        ))
    })?
    .map_err(|e| Error::Spec(format!("watching the cluster: {e}")))?;
    Ok(())
}

/// One line per machine — address, phase, Ready reason and message — for failure reports.
pub async fn summary(target: &impl Target) -> String {
    let Ok(list) = machines(target).list(&ListParams::default()).await else {
        return "(cannot list machines)".into();
    };
    list.items
        .iter()
        .map(|m| {
            let status = m.status.clone().unwrap_or_default();
            let ready = status
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::READY)
                .map(|c| format!("{}: {}", c.reason, c.message))
                .unwrap_or_default();
            format!(
                "{} {:?} [{ready}]",
                m.spec.endpoints.first().cloned().unwrap_or_default(),
                status.lifecycle.phase
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Node credentials from the published talosconfig Secret.
pub async fn talosconfig_credentials(
    target: &impl Target,
    name: &str,
) -> Result<Credentials, Error> {
    let status = clusters(target).get(name).await?.status.unwrap_or_default();
    let secret_name = status
        .core
        .talosconfig_secret
        .ok_or_else(|| Error::Spec("no talosconfig Secret is published".into()))?;
    let secret = Api::<Secret>::namespaced(target.client(), target.namespace())
        .get(&secret_name)
        .await?;
    let bytes = secret
        .data
        .and_then(|d| d.get("talosconfig").cloned())
        .ok_or_else(|| Error::Spec("the talosconfig Secret has no talosconfig".into()))?;
    let value: serde_json::Value = serde_saphyr::from_str(&String::from_utf8_lossy(&bytes.0))
        .map_err(|e| Error::Spec(e.to_string()))?;
    let context = &value["contexts"][name];
    let field = |k: &str| -> Result<String, Error> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(context[k].as_str().unwrap_or_default())
            .map_err(|e| Error::Spec(format!("talosconfig {k}: {e}")))?;
        String::from_utf8(raw).map_err(|e| Error::Spec(e.to_string()))
    };
    Ok(Credentials {
        ca_pem: field("ca")?,
        cert_pem: field("crt")?,
        key_pem: field("key")?,
    })
}

/// Checks that the talosconfig reaches every node, and that the control planes form exactly
/// one etcd cluster with `voters` voters. Returns the member ids.
pub async fn check_cluster(target: &impl Target, shape: &Shape) -> Result<Vec<u64>, Error> {
    let credentials = talosconfig_credentials(target, &shape.name).await?;
    let mut ids: Option<Vec<u64>> = None;
    for (i, address) in target.node_endpoints().iter().enumerate() {
        let client = TalosClient::connect(address, &credentials)
            .await
            .map_err(|e| Error::Spec(format!("the talosconfig does not reach {address}: {e}")))?;
        client
            .version()
            .await
            .map_err(|e| Error::Spec(e.to_string()))?;
        if i >= shape.control_planes {
            continue;
        }
        let members = client
            .etcd_members(false)
            .await
            .map_err(|e| Error::Spec(e.to_string()))?;
        if members.iter().any(|m| m.learner) || members.len() != shape.control_planes {
            return Err(Error::Spec(format!(
                "{address} reports members {members:?}"
            )));
        }
        let mut these: Vec<u64> = members.iter().map(|m| m.id).collect();
        these.sort_unstable();
        match &ids {
            None => ids = Some(these),
            Some(first) if *first != these => {
                return Err(Error::Spec(format!(
                    "{address} is in another etcd cluster: {these:?} vs {first:?}"
                )));
            }
            Some(_) => {}
        }
    }
    ids.ok_or_else(|| Error::Spec("no control planes".into()))
}

/// The main job: discovery finds every node, nothing is applied before approval, approved
/// machines reach Ready, one etcd cluster, the talosconfig reaches every node.
pub async fn lifecycle(target: &impl Target, shape: &Shape) -> Result<(), Error> {
    create_cluster(target, shape).await?;
    wait_discovered(target, target.node_endpoints().len()).await?;
    approve_all(target, shape).await?;
    if let Err(error) = wait_ready(target, &shape.name, Duration::from_secs(180)).await {
        return Err(Error::Spec(format!(
            "{error}; machines: {}",
            summary(target).await
        )));
    }
    check_cluster(target, shape).await?;
    if !cluster_condition(target, &shape.name, conditions::BOOTSTRAPPED).await {
        return Err(Error::Spec("Ready without Bootstrapped".into()));
    }
    target.kubelets_registered(&shape.name).await?;
    let nodes = target.node_endpoints().len();
    let workload = workload_client(target, &shape.name).await?;
    let listed = Api::<k8s_openapi::api::core::v1::Node>::all(workload);
    try_eventually(
        &format!("{nodes} Ready Nodes in the workload cluster"),
        Duration::from_secs(60),
        || async {
            listed.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.len() == nodes && l.items.iter().all(ichor_testenv::workload::node_is_ready)
            })
        },
    )
    .await?;
    Ok(())
}

/// A client for the workload cluster from the published kubeconfig Secret.
pub async fn workload_client(target: &impl Target, name: &str) -> Result<kube::Client, Error> {
    let status = clusters(target).get(name).await?.status.unwrap_or_default();
    let secret_name = status
        .core
        .kubeconfig_secret
        .ok_or_else(|| Error::Spec("no kubeconfig Secret is published".into()))?;
    let secret = Api::<Secret>::namespaced(target.client(), target.namespace())
        .get(&secret_name)
        .await?;
    let text = secret
        .data
        .and_then(|d| {
            d.get("kubeconfig")
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        })
        .ok_or_else(|| Error::Spec("the kubeconfig Secret has no kubeconfig".into()))?;
    let text = target.reachable(&text).await?;
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&text)
        .map_err(|e| Error::Spec(format!("kubeconfig: {e}")))?;
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .map_err(|e| Error::Spec(format!("kubeconfig: {e}")))?;
    kube::Client::try_from(config).map_err(Error::Kube)
}

/// Approves the first `control_planes` nodes as control planes (`cp-N`) and the rest as
/// workers (`worker-N`), whatever the cluster declares.
pub async fn approve_shape(
    target: &impl Target,
    control_planes: usize,
    workers: usize,
) -> Result<(), Error> {
    for (i, address) in target
        .node_endpoints()
        .iter()
        .take(control_planes + workers)
        .enumerate()
    {
        let cp = i < control_planes;
        let hostname = if cp {
            format!("cp-{}", i + 1)
        } else {
            format!("worker-{}", i + 1)
        };
        approve(target, address, cp, &hostname).await?;
    }
    Ok(())
}

/// Deletes the TalosCluster as a person would: the allow-delete annotation, then the delete.
pub async fn delete_cluster(target: &impl Target, name: &str) -> Result<(), Error> {
    let api = clusters(target);
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {ichor_api::names::annotations::ALLOW_DELETE: "true"}}})),
    )
    .await?;
    api.delete(name, &Default::default()).await?;
    Ok(())
}

/// Creates `operation` (e.g. built with [`TalosOperation::test`]) in the target's namespace.
pub async fn create_operation(
    target: &impl Target,
    operation: impl Into<TalosOperation>,
) -> Result<(), Error> {
    let mut operation = operation.into();
    operation.metadata.namespace = Some(target.namespace().to_owned());
    Api::<TalosOperation>::namespaced(target.client(), target.namespace())
        .create(&PostParams::default(), &operation)
        .await?;
    Ok(())
}

/// Waits until the operation `name` succeeded or failed; returns it.
pub async fn wait_operation(
    target: &impl Target,
    name: &str,
    limit: Duration,
) -> Result<ichor_api::operation::TalosOperation, Error> {
    use ichor_api::operation::OperationPhase;
    let api = Api::<ichor_api::operation::TalosOperation>::namespaced(
        target.client(),
        target.namespace(),
    );
    let mut last = None;
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Ok(operation) = api.get(name).await {
            let phase = operation.status.as_ref().map(|s| s.run.phase);
            if matches!(
                phase,
                Some(OperationPhase::Succeeded | OperationPhase::Failed)
            ) {
                return Ok(operation);
            }
            last = operation.status;
        }
        if std::time::Instant::now() > deadline {
            return Err(Error::Spec(format!(
                "operation {name} did not finish within {limit:?}: {last:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
