//! `describe cluster NAME`: the TalosCluster and its machines as a tree, as `clusterctl describe
//! cluster` shows a Cluster API cluster. The cluster comes first (Ready, endpoint, versions,
//! counts, bootstrap record, lock holder, tombstones, pending Node deletes), then its machines
//! grouped control planes, workers, then pending, rejected and unassigned ones. Under each
//! object: the conditions in a bad state (`False` for the good-news conditions, `True` for
//! `Transitioning` and `FingerprintChanged`), and a removal in progress (with the steps it
//! skipped).

use ichor_api::cluster::{CniPreset, KubeProxyMode};
use ichor_api::common::{Condition, ConditionStatus, Role};
use ichor_api::machine::ApprovalState;
use ichor_api::names::conditions;
use ichor_api::{TalosCluster, TalosMachine};
use kube::ResourceExt as _;
use kube::api::Api;

use crate::Error;
use crate::connect::Connection;
use crate::table::columns;
use crate::tree::Tree;

/// Conditions whose `True` status is the bad news.
const TRUE_IS_BAD: [&str; 2] = [conditions::TRANSITIONING, conditions::FINGERPRINT_CHANGED];

fn status_word(status: ConditionStatus) -> &'static str {
    match status {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    }
}

/// `Type=Status Reason: message`.
pub fn condition_text(c: &Condition) -> String {
    let mut text = format!("{}={}", c.type_, status_word(c.status));
    if !c.reason.is_empty() {
        text.push(' ');
        text.push_str(&c.reason);
    }
    if !c.message.is_empty() {
        text.push_str(": ");
        text.push_str(&c.message);
    }
    text
}

/// The conditions to show under an object: every one in a bad state, except `Ready` (shown on
/// the object's own line).
pub fn bad_conditions(list: &[Condition]) -> Vec<Tree> {
    list.iter()
        .filter(|c| c.type_ != conditions::READY)
        .filter(|c| {
            if TRUE_IS_BAD.contains(&c.type_.as_str()) {
                c.status == ConditionStatus::True
            } else {
                c.status == ConditionStatus::False
            }
        })
        .map(|c| Tree::leaf(condition_text(c)))
        .collect()
}

fn ready(list: &[Condition]) -> Option<&Condition> {
    list.iter().find(|c| c.type_ == conditions::READY)
}

/// Which group a machine is listed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Group {
    /// Approved control planes.
    ControlPlanes,
    /// Approved workers.
    Workers,
    /// Pending, rejected, or approved without a role.
    Unassigned,
}

/// The group of `machine`.
pub fn group(machine: &TalosMachine) -> Group {
    match (machine.spec.approval_state, machine.spec.role) {
        (ApprovalState::Approved, Some(Role::ControlPlane)) => Group::ControlPlanes,
        (ApprovalState::Approved, Some(Role::Worker)) => Group::Workers,
        _ => Group::Unassigned,
    }
}

/// The cells of a machine's line: name, node, phase, address, Ready.
fn machine_cells(machine: &TalosMachine) -> Vec<String> {
    let status = machine.status.clone().unwrap_or_default();
    let mut name = format!("TalosMachine/{}", machine.name_any());
    if machine.metadata.deletion_timestamp.is_some() {
        name.push_str(" (deleting)");
    }
    let node = status
        .lifecycle
        .node_name
        .clone()
        .or_else(|| machine.spec.hostname.clone())
        .unwrap_or_else(|| "-".into());
    let phase = match &machine.status {
        Some(s) => format!("{:?}", s.lifecycle.phase),
        None => "-".into(),
    };
    let address = status
        .inventory
        .address
        .clone()
        .or_else(|| machine.spec.endpoints.first().cloned())
        .unwrap_or_else(|| "-".into());
    let readiness = match (machine.spec.approval_state, ready(&status.conditions)) {
        (ApprovalState::Approved, Some(c)) => condition_text(c),
        (ApprovalState::Approved, None) => "Ready=Unknown: not reconciled yet".into(),
        (ApprovalState::Pending, _) => {
            "approval pending: kubectl ichor approve NAME --role controlplane|worker"
                .replace("NAME", &machine.name_any())
        }
        (ApprovalState::Rejected, _) => "rejected: never touched".into(),
    };
    let readiness =
        if machine.spec.approval_state == ApprovalState::Approved && machine.spec.role.is_none() {
            format!("approved without spec.role ({readiness})")
        } else {
            readiness
        };
    vec![name, node, phase, address, readiness]
}

fn machine_children(machine: &TalosMachine) -> Vec<Tree> {
    let status = machine.status.clone().unwrap_or_default();
    let mut children = bad_conditions(&status.conditions);
    if let Some(removal) = &status.removal.progress {
        let mut text = format!("removal: {:?} done", removal.step);
        if removal.reset_skipped {
            text.push_str(", reset skipped");
        }
        if !removal.skipped.is_empty() {
            let steps: Vec<String> = removal
                .skipped
                .iter()
                .map(|s| format!("{:?}", s.step))
                .collect();
            text.push_str(&format!(", skipped {}", steps.join(", ")));
        }
        if let Some(message) = &removal.message {
            text.push_str(": ");
            text.push_str(message);
        }
        children.push(Tree::leaf(text));
    }
    children
}

/// A group's subtree: its machines' lines aligned in columns.
fn group_tree(title: &str, machines: &[&TalosMachine]) -> Tree {
    let rows: Vec<Vec<String>> = machines.iter().map(|m| machine_cells(m)).collect();
    let lines = columns(&rows);
    let children = machines
        .iter()
        .zip(lines)
        .map(|(m, line)| Tree::node(line, machine_children(m)))
        .collect();
    Tree::node(format!("{title} ({})", machines.len()), children)
}

/// The whole tree for `cluster` and every machine of the namespace that names it.
pub fn cluster_tree(cluster: &TalosCluster, machines: &[TalosMachine]) -> Tree {
    let name = cluster.name_any();
    let status = cluster.status.clone().unwrap_or_default();
    let mut label = format!("TalosCluster/{name}");
    if cluster.metadata.deletion_timestamp.is_some() {
        label.push_str(" (deleting)");
    }
    label.push_str("   ");
    label.push_str(&ready(&status.conditions).map_or_else(
        || "Ready=Unknown: not reconciled yet".into(),
        condition_text,
    ));
    let spec = &cluster.spec;
    let cni = match spec.cni.preset {
        CniPreset::Flannel => "flannel",
        CniPreset::Cilium => "cilium",
        CniPreset::None => "none",
    };
    let kube_proxy = match spec.kube_proxy {
        KubeProxyMode::Enabled => "enabled",
        KubeProxyMode::Disabled => "disabled",
    };
    let mut children = vec![Tree::leaf(format!(
        "endpoint {}, Talos {}, Kubernetes {}, CNI {cni}, kube-proxy {kube_proxy}",
        spec.endpoint, spec.talos_version, spec.kubernetes_version,
    ))];
    let counts = |c: &Option<ichor_api::cluster::MachineCounts>| {
        c.as_ref().map_or_else(
            || "-".to_owned(),
            |c| format!("{}/{} ready", c.ready, c.approved),
        )
    };
    children.push(Tree::leaf(format!(
        "control planes {} (declared {}), workers {}",
        counts(&status.core.control_planes),
        spec.control_plane.count,
        counts(&status.core.workers)
    )));
    if let Some(bootstrap) = &status.core.bootstrap {
        let done = bootstrap.completed_at.as_ref().map_or_else(
            || "not confirmed yet".to_owned(),
            |t| format!("done {}", t.0),
        );
        children.push(Tree::leaf(format!(
            "bootstrap: {} ({done})",
            bootstrap.machine_name
        )));
    }
    if let Some(rollout) = &status.core.rollout {
        children.push(Tree::leaf(rollout_line(rollout)));
    }
    if let Some(policy) = rollout_policy(&spec.rollout) {
        children.push(Tree::leaf(policy));
    }
    let lock = match status.lock.mirror.as_ref().and_then(|l| l.holder.as_ref()) {
        Some(holder) => {
            let lock = status.lock.mirror.clone().unwrap_or_default();
            let mut text = format!("lock: held by {holder}");
            if let Some(since) = &lock.since {
                text.push_str(&format!(" since {}", since.0));
            }
            if !lock.waiting.is_empty() {
                let waiting: Vec<String> = lock.waiting.iter().map(ToString::to_string).collect();
                text.push_str(&format!("; waiting: {}", waiting.join(", ")));
            }
            text
        }
        None => "lock: free".to_owned(),
    };
    children.push(Tree::leaf(lock));
    for t in &status.tombstones.list {
        let mut text = format!(
            "tombstone: {} ({}) removed {} without a reset",
            t.machine, t.address, t.removed_at.0
        );
        if let Some(id) = &t.etcd_member_id {
            text.push_str(&format!(", etcd member {id}"));
        }
        text.push_str(": reset before anything else if it answers again");
        children.push(Tree::leaf(text));
    }
    for p in &status.node_deletes.pending {
        children.push(Tree::leaf(format!(
            "pending Node delete: {} of {} (since {}): deleted once the workload API answers",
            p.node, p.machine, p.since.0
        )));
    }
    children.extend(bad_conditions(&status.conditions));

    let mut mine: Vec<&TalosMachine> = machines
        .iter()
        .filter(|m| m.spec.cluster_ref.name == name)
        .collect();
    mine.sort_by_key(|m| {
        (
            group(m),
            m.spec.approval_state != ApprovalState::Pending,
            m.name_any(),
        )
    });
    for (title, which) in [
        ("Control planes", Group::ControlPlanes),
        ("Workers", Group::Workers),
        ("Pending and unassigned", Group::Unassigned),
    ] {
        let members: Vec<&TalosMachine> =
            mine.iter().copied().filter(|m| group(m) == which).collect();
        if members.is_empty() && which == Group::Unassigned {
            continue;
        }
        children.push(group_tree(title, &members));
    }
    Tree::node(label, children)
}

/// Describes the TalosCluster `name` and its machines.
pub async fn describe(conn: &Connection, name: &str) -> Result<String, Error> {
    let cluster = crate::render::get_cluster(conn, name, "").await?;
    let machines = crate::connect::list_all(
        &Api::<TalosMachine>::namespaced(conn.client.clone(), &conn.namespace),
        &format!("TalosMachines in namespace {}", conn.namespace),
    )
    .await?;
    Ok(cluster_tree(&cluster, &machines).render())
}

/// Where the cluster's rollout stands (`status.rollout`) in a line: what rolls out and why,
/// the nodes up to date, in flight and waiting, what holds it and where it halted.
fn rollout_line(rollout: &ichor_api::cluster::RolloutStatus) -> String {
    let mut text = format!(
        "Talos {}: {} of {} nodes up to date",
        rollout.talos_version, rollout.up_to_date, rollout.total
    );
    let in_flight = match (rollout.in_flight_machines.as_slice(), &rollout.in_flight) {
        ([], Some(one)) => vec![one.clone()],
        (many, _) => many.to_vec(),
    };
    if !in_flight.is_empty() {
        text.push_str(&format!(", in flight: {}", in_flight.join(", ")));
    }
    if rollout.waiting > 0 {
        text.push_str(&format!(", {} waiting", rollout.waiting));
    }
    if !rollout.changes.is_empty() {
        text.push_str(&format!("; rolling out: {}", rollout.changes.join(", ")));
    }
    if let Some(waits) = &rollout.waits_on {
        text.push_str(&format!("; waits on {waits}"));
    }
    if let Some(machine) = &rollout.halted_at {
        text.push_str(&format!("; halted at {machine}"));
    }
    text
}

/// The cluster's rollout policy (`spec.rollout`) in a line; `None` when nothing is set.
fn rollout_policy(policy: &ichor_api::rollout::RolloutPolicy) -> Option<String> {
    if policy.is_default() {
        return None;
    }
    let mut parts = Vec::new();
    if policy.suspend {
        parts.push("suspended (spec.rollout.suspend): no node starts its change".to_owned());
    }
    if !policy.maintenance_windows.is_empty() {
        let windows: Vec<String> = policy
            .maintenance_windows
            .iter()
            .map(|w| format!("{} ({}) for {}", w.schedule, w.time_zone, w.duration))
            .collect();
        parts.push(format!(
            "reboots and upgrades start only in a window: {}",
            windows.join("; ")
        ));
    }
    if policy.hold_live_changes {
        parts.push("live config changes wait for a window too".to_owned());
    }
    if !policy.health_gates.is_empty() {
        let gates: Vec<&str> = policy
            .health_gates
            .iter()
            .map(|g| g.name.as_str())
            .collect();
        parts.push(format!("health gates: {}", gates.join(", ")));
    }
    if let Some(fresh) = &policy.fresh_backup {
        parts.push(format!(
            "a control plane is disrupted only after a backup at most {} old",
            fresh.max_age
        ));
    }
    if let Some(most) = &policy.max_unavailable {
        let most = match most {
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
        };
        parts.push(format!("up to {most} workers at once"));
    }
    if let Some(label) = &policy.failure_domain_label {
        parts.push(format!("never two workers of one {label} at once"));
    }
    Some(format!("rollout policy: {}", parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": message,
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn cluster(status: serde_json::Value) -> TalosCluster {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosCluster",
            "metadata": {"name": "lab", "namespace": "ns"},
            "spec": {
                "talosVersion": "v1.14.1",
                "kubernetesVersion": "1.36.3",
                "endpoint": "https://127.0.85.1:6443",
                "controlPlane": {"count": 1}
            },
            "status": status
        }))
        .expect("a TalosCluster")
    }

    fn machine(
        name: &str,
        approval: &str,
        role: Option<&str>,
        status: serde_json::Value,
    ) -> TalosMachine {
        let mut spec = json!({
            "clusterRef": {"name": "lab"},
            "approvalState": approval,
            "endpoints": [format!("127.0.85.{}", name.len())],
        });
        if let Some(role) = role {
            spec["role"] = json!(role);
        }
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosMachine",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
            "status": status
        }))
        .expect("a TalosMachine")
    }

    #[test]
    fn the_tree_shows_the_cluster_then_control_planes_workers_and_pending() {
        let c = cluster(json!({
            "conditions": [
                condition("Ready", "False", "MachinesNotReady", "control planes 1/1 ready, workers 0/1 ready"),
                condition("Bootstrapped", "True", "Bootstrapped", "etcd bootstrapped on cp"),
                condition("Transitioning", "False", "Settled", "control planes as declared")
            ],
            "controlPlanes": {"declared": 1, "approved": 1, "ready": 1, "summary": "1/1"},
            "workers": {"approved": 1, "ready": 0, "summary": "0/1"},
            "bootstrap": {"machineName": "cp", "machineUid": "u1", "chosenAt": "2026-12-03T10:00:00Z", "completedAt": "2026-12-03T10:01:00Z"},
            "rollout": {"talosVersion": "v1.14.2", "upToDate": 1, "total": 2, "summary": "1/2", "inFlight": "worker"},
            "lock": {"holder": "drift/u2", "since": "2026-12-03T10:02:00Z", "waiting": ["operation/up"]},
            "tombstones": [{"machine": "gone", "address": "127.0.85.9", "etcdMemberId": "00000000000000ab", "removedAt": "2026-12-03T10:03:00Z"}],
            "pendingNodeDeletes": [{"node": "worker-9", "machine": "w9", "since": "2026-12-03T10:04:00Z"}]
        }));
        let machines = vec![
            machine(
                "worker",
                "approved",
                Some("worker"),
                json!({
                    "phase": "Joining", "address": "127.0.85.6", "nodeName": "worker-1",
                    "conditions": [
                        condition("Ready", "False", "Joining", "waiting for the node"),
                        condition("ConfigApplied", "False", "NeedsReboot", "config sha256:1 needs a reboot"),
                        condition("Installed", "True", "Installed", "ok")
                    ]
                }),
            ),
            machine(
                "cp",
                "approved",
                Some("controlplane"),
                json!({
                    "phase": "Ready", "address": "127.0.85.2", "nodeName": "cp-1",
                    "conditions": [condition("Ready", "True", "Reconciled", "running, etcd voter")]
                }),
            ),
            machine("new", "pending", None, json!({"phase": "Pending"})),
            machine("no", "rejected", None, json!({"phase": "Rejected"})),
        ];
        let mut other = machine("elsewhere", "approved", Some("worker"), json!({}));
        other.spec.cluster_ref.name = "other".into();
        let mut all = machines.clone();
        all.push(other);
        let out = cluster_tree(&c, &all).render();
        let expected = [
            "TalosCluster/lab   Ready=False MachinesNotReady: control planes 1/1 ready, workers 0/1 ready",
            "├─ endpoint https://127.0.85.1:6443, Talos v1.14.1, Kubernetes 1.36.3, CNI flannel, kube-proxy enabled",
            "├─ control planes 1/1 ready (declared 1), workers 0/1 ready",
            "├─ bootstrap: cp (done 2026-12-03T10:01:00Z)",
            "├─ Talos v1.14.2: 1 of 2 nodes up to date, in flight: worker",
            "├─ lock: held by drift/u2 since 2026-12-03T10:02:00Z; waiting: operation/up",
            "├─ tombstone: gone (127.0.85.9) removed 2026-12-03T10:03:00Z without a reset, etcd member 00000000000000ab: reset before anything else if it answers again",
            "├─ pending Node delete: worker-9 of w9 (since 2026-12-03T10:04:00Z): deleted once the workload API answers",
            "├─ Control planes (1)",
            "│  └─ TalosMachine/cp   cp-1   Ready   127.0.85.2   Ready=True Reconciled: running, etcd voter",
            "├─ Workers (1)",
            "│  └─ TalosMachine/worker   worker-1   Joining   127.0.85.6   Ready=False Joining: waiting for the node",
            "│     └─ ConfigApplied=False NeedsReboot: config sha256:1 needs a reboot",
            "└─ Pending and unassigned (2)",
            "   ├─ TalosMachine/new   -   Pending    127.0.85.3   approval pending: kubectl ichor approve new --role controlplane|worker",
            "   └─ TalosMachine/no    -   Rejected   127.0.85.2   rejected: never touched",
        ];
        assert_eq!(out, expected.join("\n") + "\n", "\n{out}");
    }

    #[test]
    fn a_rollout_line_names_the_batch_what_waits_and_why() {
        let rollout: ichor_api::cluster::RolloutStatus = serde_json::from_value(json!({
            "talosVersion": "v1.14.2", "upToDate": 1, "total": 5, "summary": "1/5",
            "inFlight": "w-1", "inFlightMachines": ["w-1", "w-2"], "waiting": 2,
            "changes": ["Talos v1.14.2 (spec.talosVersion)"],
            "waitsOn": "OutsideMaintenanceWindow at w-3"
        }))
        .expect("a rollout");
        assert_eq!(
            rollout_line(&rollout),
            "Talos v1.14.2: 1 of 5 nodes up to date, in flight: w-1, w-2, 2 waiting; rolling out: Talos v1.14.2 (spec.talosVersion); waits on OutsideMaintenanceWindow at w-3"
        );
    }

    #[test]
    fn the_rollout_policy_shows_when_set() {
        let mut c = cluster(json!(null));
        assert!(!cluster_tree(&c, &[]).render().contains("rollout policy"));
        c.spec.rollout.suspend = true;
        c.spec.rollout.hold_live_changes = true;
        c.spec.rollout.maintenance_windows = vec![ichor_api::rollout::MaintenanceWindow {
            schedule: "0 22 * * 1-5".into(),
            duration: "4h".into(),
            time_zone: "Europe/Berlin".into(),
        }];
        let out = cluster_tree(&c, &[]).render();
        assert!(
            out.contains(
                "rollout policy: suspended (spec.rollout.suspend): no node starts its change, reboots and upgrades start only in a window: 0 22 * * 1-5 (Europe/Berlin) for 4h, live config changes wait for a window too"
            ),
            "{out}"
        );
        c.spec.rollout = ichor_api::rollout::RolloutPolicy {
            health_gates: vec![ichor_api::rollout::HealthGate {
                name: "shop-available".into(),
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: Some("shop".into()),
                label_selector: None,
                expression: "true".into(),
            }],
            fresh_backup: Some(ichor_api::rollout::FreshBackup {
                max_age: "1h".into(),
            }),
            ..Default::default()
        };
        let out = cluster_tree(&c, &[]).render();
        assert!(
            out.contains(
                "rollout policy: health gates: shop-available, a control plane is disrupted only after a backup at most 1h old"
            ),
            "{out}"
        );
    }

    #[test]
    fn a_fresh_cluster_without_status_still_describes() {
        let out = cluster_tree(&cluster(json!(null)), &[]).render();
        assert!(
            out.starts_with("TalosCluster/lab   Ready=Unknown: not reconciled yet\n"),
            "{out}"
        );
        assert!(out.contains("lock: free"), "{out}");
        assert!(out.contains("Control planes (0)"), "{out}");
        assert!(out.contains("Workers (0)"), "{out}");
        assert!(!out.contains("Pending and unassigned"), "{out}");
    }

    #[test]
    fn only_bad_news_conditions_are_listed() {
        let list: Vec<Condition> = serde_json::from_value(json!([
            condition("Ready", "False", "X", "on the object's line"),
            condition("Installed", "True", "Installed", ""),
            condition("Transitioning", "False", "Settled", ""),
            condition(
                "Transitioning",
                "True",
                "EvenControlPlaneCount",
                "2 control planes"
            ),
            condition(
                "FingerprintChanged",
                "True",
                "FingerprintMismatch",
                "new cert"
            ),
            condition(
                "SecretsReady",
                "False",
                "SecretsBundleUnavailable",
                "missing"
            ),
        ]))
        .expect("conditions");
        let shown: Vec<String> = bad_conditions(&list).into_iter().map(|t| t.label).collect();
        assert_eq!(
            shown,
            [
                "Transitioning=True EvenControlPlaneCount: 2 control planes",
                "FingerprintChanged=True FingerprintMismatch: new cert",
                "SecretsReady=False SecretsBundleUnavailable: missing",
            ]
        );
    }

    #[test]
    fn a_removal_in_progress_is_shown_under_its_machine() {
        let mut m = machine(
            "cp",
            "approved",
            Some("controlplane"),
            json!({
                "phase": "Removing",
                "removal": {"step": "Drained", "message": "leaving etcd"}
            }),
        );
        m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().expect("time"),
        ));
        let out = cluster_tree(&cluster(json!(null)), &[m]).render();
        assert!(out.contains("TalosMachine/cp (deleting)"), "{out}");
        assert!(out.contains("removal: Drained done: leaving etcd"), "{out}");
    }
}
