//! What the day-2 and chaos specs share: a cluster brought to Ready, a monitor of etcd quorum
//! and of the nodes down, its etcd members, and a removed machine record's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::common::ConditionStatus;
use ichor_api::names::{annotations, conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::SimNode;
use ichor_testenv::wait::try_eventually;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams};

/// The TalosCluster the specs build.
pub const CLUSTER: &str = "lab";

/// Brings up `control_planes` + `workers` Ready machines in a cluster declaring `declared`
/// control planes, with their Nodes registered in the workload cluster.
pub async fn cluster_of(
    target: &SimTarget,
    declared: usize,
    control_planes: usize,
    workers: usize,
) {
    let all = target.node_endpoints().len();
    specs::discovered_cluster(target, "v1.14.1", declared, all)
        .await
        .expect("cluster discovered");
    specs::approve_shape(target, control_planes, workers)
        .await
        .expect("approve");
    if let Err(error) = specs::wait_ready(target, CLUSTER, Duration::from_secs(180)).await {
        panic!("{error}: {}", specs::summary(target).await);
    }
    target
        .kubelets_registered(CLUSTER)
        .await
        .expect("Nodes registered");
}

/// A sim target of `options` with a cluster of [`cluster_of`]`(declared, control_planes,
/// workers)` Ready on it.
pub async fn ready_target(
    options: SimOptions,
    declared: usize,
    control_planes: usize,
    workers: usize,
) -> SimTarget {
    let target = SimTarget::up(options).await.expect("sim target");
    cluster_of(&target, declared, control_planes, workers).await;
    target
}

/// What the monitor saw.
#[derive(Debug, Default, Clone, Copy)]
pub struct Seen {
    /// The most nodes down (not serving) at one moment.
    pub most_down: usize,
    /// The fewest etcd voters answering, and of how many, at one moment.
    pub worst: Option<(usize, usize)>,
}

/// Watches etcd quorum and down nodes every 5 ms until stopped.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<Seen, String>>,
}

impl Monitor {
    /// Starts watching `nodes`.
    pub fn start(nodes: Vec<SimNode>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut seen = Seen::default();
            while !flag.load(Ordering::SeqCst) {
                let mut down = 0;
                for node in &nodes {
                    if !node.is_serving().await {
                        down += 1;
                    }
                    if let Some((voters, alive)) = node.etcd_quorum_view().await {
                        if voters > 0 && alive * 2 <= voters {
                            return Err(format!(
                                "etcd below quorum: {alive} of {voters} voters answer"
                            ));
                        }
                        if seen.worst.is_none_or(|(a, _)| alive < a) {
                            seen.worst = Some((alive, voters));
                        }
                    }
                }
                seen.most_down = seen.most_down.max(down);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Ok(seen)
        });
        Self { stop, task }
    }

    /// Stops watching; fails when etcd lost quorum meanwhile.
    pub async fn finish(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.task
            .await
            .expect("monitor task")
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Stops watching; fails when it never saw etcd or its worst moment had no quorum.
    pub async fn finish_with_quorum(self) {
        let seen = self.finish().await;
        let (alive, voters) = seen.worst.expect("the monitor saw etcd");
        assert!(alive * 2 > voters, "quorum held: worst {alive}/{voters}");
    }
}

/// The etcd members as the node at `address` lists them, through Ichor's talosconfig.
pub async fn etcd_members(target: &SimTarget, address: &str) -> Vec<ichor_talos::EtcdMember> {
    let credentials = specs::talosconfig_credentials(target, CLUSTER)
        .await
        .expect("talosconfig");
    ichor_talos::TalosClient::connect(address, &credentials)
        .await
        .expect("connect")
        .etcd_members(false)
        .await
        .expect("members")
}

/// The UID of the record `name`, which its finalizer keeps while it is being removed.
pub async fn uid_of(target: &SimTarget, name: &str) -> Option<String> {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    machines
        .get(name)
        .await
        .expect("the machine being removed")
        .metadata
        .uid
}

/// Waits until the record `name` with `uid` has gone. A node reset to maintenance mode is
/// discovered again under the same name: that new record is another machine record.
pub async fn gone(target: &SimTarget, name: &str, uid: &Option<String>, limit: Duration) {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    if let Err(error) = try_eventually(&format!("{name} gone"), limit, || async {
        machines
            .get_opt(name)
            .await
            .is_ok_and(|m| m.is_none_or(|m| m.metadata.uid != *uid))
    })
    .await
    {
        let status = machines
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|m| m.status);
        panic!(
            "{error}: {:?} {:?}\nmanager log:\n{}",
            status.as_ref().map(|s| s.removal.progress.clone()),
            status.as_ref().map(|s| s.conditions.clone()),
            target.manager_log_tail()
        );
    }
}

/// Annotates the machine `name` with `force-remove`: its removal may go on past a node that
/// does not answer.
pub async fn force(target: &SimTarget, name: &str) {
    Api::<TalosMachine>::namespaced(target.client(), target.namespace())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {annotations::FORCE_REMOVE: "true"}}
            })),
        )
        .await
        .expect("force-remove annotated");
}

/// Force-removes the machine `name` at `endpoint`: annotated, its delete admitted, and its
/// record gone within `limit`.
pub async fn force_removed(target: &SimTarget, name: &str, endpoint: &str, limit: Duration) {
    force(target, name).await;
    let uid = uid_of(target, name).await;
    specs::delete_machine(target, endpoint)
        .await
        .expect("the delete admitted");
    gone(target, name, &uid, limit).await;
}

/// Whether every machine has its config applied (`ConfigApplied` true) and no drift in flight.
pub async fn every_machine_applied(target: &SimTarget) -> bool {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    machines.list(&ListParams::default()).await.is_ok_and(|l| {
        l.items.iter().all(|m| {
            m.status.as_ref().is_some_and(|s| {
                s.drift.reboot.is_none()
                    && s.conditions.iter().any(|c| {
                        c.type_ == conditions::CONFIG_APPLIED && c.status == ConditionStatus::True
                    })
            })
        })
    })
}

/// Waits until the cluster's `ConfigRolledOut` says `ConfigCurrent` and every machine has its
/// config applied; fails with the state if not within two minutes.
pub async fn wait_rolled_out(target: &SimTarget, what: &str) {
    let done = try_eventually(what, Duration::from_secs(120), || async {
        let current = rolled_out(target)
            .await
            .is_some_and(|(s, r, _)| s == ConditionStatus::True && r == reasons::CONFIG_CURRENT);
        current && every_machine_applied(target).await
    })
    .await;
    if let Err(e) = done {
        panic!(
            "{e}: {:?} {}",
            rolled_out(target).await,
            state_summary(target)
        );
    }
}

/// Each machine's drift and removal state and the cluster lock, for failure messages.
pub fn state_summary(target: &SimTarget) -> String {
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        handle.block_on(async {
            let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
            let clusters: Api<ichor_api::TalosCluster> =
                Api::namespaced(target.client(), target.namespace());
            let status = clusters
                .get(CLUSTER)
                .await
                .ok()
                .and_then(|c| c.status)
                .unwrap_or_default();
            let lock = status.lock.mirror.clone();
            // Where a version's or Kubernetes's rollout stands, and the cluster's conditions.
            let rollout = (&status.core.rollout, &status.core.accepted_versions);
            let said: Vec<String> = status
                .conditions
                .iter()
                .map(|c| format!("{} {:?} {} {}", c.type_, c.status, c.reason, c.message))
                .collect();
            let mut out = format!("lock {lock:?}; rollout {rollout:?}; cluster {said:?}; ");
            for m in machines
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
            {
                let status = m.status.clone().unwrap_or_default();
                let name = m.name_any();
                let applied = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == conditions::CONFIG_APPLIED)
                    .map(|c| format!("{:?} {} {}", c.status, c.reason, c.message));
                let removal = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == conditions::REMOVAL_APPROVED)
                    .map(|c| format!("{} {}", c.reason, c.message));
                let ready = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == conditions::READY)
                    .map(|c| format!("{:?} {} {}", c.status, c.reason, c.message));
                out.push_str(&format!(
                    "{} ({}, {:?}): ready {ready:?} drift_reboot {:?} applied {:?} {applied:?} removal {:?} {removal:?}; ",
                    m.spec.hostname.unwrap_or_default(),
                    name,
                    m.spec.approval_state,
                    status.drift.reboot,
                    status.applied.config_hash,
                    status.removal.progress
                ));
            }
            out.push_str("\nmanager log:\n");
            out.push_str(&target.manager_log_tail());
            out
        })
    })
}

/// The control planes' names in drift rollout order (by name) and their sim nodes.
pub async fn control_planes_in_order(target: &SimTarget) -> Vec<(String, SimNode)> {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let mut out: Vec<(String, SimNode)> = machines
        .list(&ListParams::default())
        .await
        .expect("machines")
        .items
        .into_iter()
        .filter(|m| m.spec.role == Some(ichor_api::common::Role::ControlPlane))
        .filter_map(|m| {
            let address = m.status.as_ref()?.inventory.address.clone()?;
            let node = target
                .nodes()
                .iter()
                .find(|n| n.addr().ip().to_string() == address)?
                .clone();
            Some((m.name_any(), node))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The cluster's `ConfigRolledOut` condition: (status, reason, message).
pub async fn rolled_out(target: &SimTarget) -> Option<(ConditionStatus, String, String)> {
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let cluster = clusters.get(CLUSTER).await.ok()?;
    cluster
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == conditions::CONFIG_ROLLED_OUT)
        .map(|c| (c.status, c.reason, c.message))
}

/// Waits until a machine's `UpToDate` or `ConfigApplied` (a version's config change goes
/// first) says `reason`; returns the machine's name and the condition's message.
pub async fn held_by(target: &SimTarget, reason: &str) -> (String, String) {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    try_eventually(
        &format!("a machine held by {reason}"),
        Duration::from_secs(60),
        || async {
            let list = machines
                .list(&Default::default())
                .await
                .map_err(|e| e.to_string())?;
            let seen: Vec<(String, String, String)> = list
                .items
                .iter()
                .flat_map(|m| {
                    let conditions = m
                        .status
                        .as_ref()
                        .map(|s| s.conditions.clone())
                        .unwrap_or_default();
                    conditions
                        .into_iter()
                        .filter(|c| {
                            c.type_ == conditions::UP_TO_DATE
                                || c.type_ == conditions::CONFIG_APPLIED
                        })
                        .map(|c| (m.name_any(), c.reason, c.message))
                        .collect::<Vec<_>>()
                })
                .collect();
            seen.iter()
                .find(|(_, r, _)| r == reason)
                .map(|(name, _, message)| (name.clone(), message.clone()))
                .ok_or_else(|| format!("{seen:?}"))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)))
}

/// Waits until the cluster's `VersionRolledOut` or `ConfigRolledOut` says `reason`.
pub async fn cluster_says(target: &SimTarget, reason: &str) {
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    try_eventually(
        &format!("the cluster saying {reason}"),
        Duration::from_secs(60),
        || async {
            let status = clusters
                .get(CLUSTER)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let seen: Vec<(String, String)> = status
                .conditions
                .iter()
                .filter(|c| {
                    c.type_ == conditions::VERSION_ROLLED_OUT
                        || c.type_ == conditions::CONFIG_ROLLED_OUT
                })
                .map(|c| (c.reason.clone(), c.message.clone()))
                .collect();
            if seen.iter().any(|(r, _)| r == reason) {
                Ok(())
            } else {
                Err(format!("{seen:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

/// Waits up to `limit` until Kubernetes `version` rolled out: accepted with no version before
/// it, no step left, `VersionRolledOut` true; `Err` says what was last seen.
pub async fn kubernetes_rolled_out(
    target: &SimTarget,
    version: &str,
    limit: Duration,
) -> Result<(), ichor_testenv::wait::Timeout> {
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    try_eventually(
        &format!("Kubernetes {version} rolled out"),
        limit,
        || async {
            let status = clusters
                .get(CLUSTER)
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            let accepted = status.core.accepted_versions.clone();
            let step = status.core.rollout.and_then(|r| r.kubernetes_step);
            let rolled = status
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::VERSION_ROLLED_OUT)
                .map(|c| (c.status, c.reason.clone(), c.message.clone()));
            let done = accepted
                .as_ref()
                .is_some_and(|a| a.kubernetes_version == version && a.kubernetes_from.is_none())
                && step.is_none()
                && rolled
                    .as_ref()
                    .is_some_and(|c| c.0 == ConditionStatus::True);
            if done {
                Ok(())
            } else {
                Err(format!("{accepted:?} step {step:?} {rolled:?}"))
            }
        },
    )
    .await
}
