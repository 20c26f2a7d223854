//! Which pending machines a cluster's TalosMachineClasses approve, and what each class and
//! each waiting machine says ([`plan`], pure, with its unit tests).

use std::collections::BTreeMap;

use ichor_api::class::TalosMachineClassStatus;
use ichor_api::common::Role;
use ichor_api::machine::ApprovalState;
use ichor_api::names::{conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass};
use kube::ResourceExt as _;

use crate::infra::conditions as cond;

/// What the classes make of one pending machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Approve it with this class's role.
    Approve {
        /// The class.
        class: String,
        /// The role it gets.
        role: Role,
    },
    /// It stays pending: the `ClassMatched` reason and message.
    Wait {
        /// The reason (a constant of `reasons`).
        reason: &'static str,
        /// Why, naming the classes.
        message: String,
        /// The classes that match it.
        classes: Vec<String>,
    },
}

impl Verdict {
    /// Whether it approves the machine.
    pub fn approves(&self) -> bool {
        matches!(self, Self::Approve { .. })
    }
}

/// The decisions for one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    /// Pending machines a class matches, by machine name, with what becomes of them.
    pub verdicts: BTreeMap<String, Verdict>,
    /// Each class's status, by class name.
    pub statuses: BTreeMap<String, TalosMachineClassStatus>,
    /// Machines whose `ichor.maesh.dev/role` label is not their `spec.role` (approved by
    /// hand, or labelled by hand), with the role to label them with.
    pub role_labels: BTreeMap<String, Role>,
}

/// Machines with a role whose role label says otherwise (or nothing).
fn role_labels(machines: &[TalosMachine]) -> BTreeMap<String, Role> {
    machines
        .iter()
        .filter_map(|m| {
            let role = m.spec.role?;
            let label = m.metadata.labels.as_ref().and_then(|l| l.get(labels::ROLE));
            (label.map(String::as_str) != Some(role.as_str())).then(|| (m.name_any(), role))
        })
        .collect()
}

/// The class a machine was approved by (its `ichor.maesh.dev/class` label).
fn class_of(machine: &TalosMachine) -> Option<&str> {
    machine
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(labels::CLASS))
        .map(String::as_str)
}

/// Whether the machine shows another certificate than its pin (or has none pinned): no class
/// approves it.
fn certificate_changed(machine: &TalosMachine) -> bool {
    let status = machine.status.clone().unwrap_or_default();
    machine.spec.fingerprint.is_none()
        || cond::is_true(&status.conditions, conditions::FINGERPRINT_CHANGED)
        || status
            .inventory
            .observed_fingerprint
            .as_deref()
            .is_some_and(|seen| Some(seen) != machine.spec.fingerprint.as_deref())
}

/// Whether the machine counts as one of the cluster's control planes: approved as one and not
/// being removed.
fn standing_control_plane(machine: &TalosMachine) -> bool {
    machine.spec.approval_state == ApprovalState::Approved
        && machine.spec.role == Some(Role::ControlPlane)
        && machine.metadata.deletion_timestamp.is_none()
        && machine
            .status
            .as_ref()
            .is_none_or(|s| s.removal.progress.is_none())
}

/// Plans the classes of `cluster` over its `machines`. Pending machines are taken by name, so
/// the same inputs give the same approvals. A machine is approved only when exactly one class
/// matches it, its certificate is the pinned one, that class has room (`maxMachines`, counting
/// the machines it approved before) and, for a control plane, the cluster has fewer standing
/// control planes than `spec.controlPlane.count`. Approved and rejected machines are never
/// touched.
pub fn plan(
    cluster: &TalosCluster,
    classes: &[&TalosMachineClass],
    machines: &[TalosMachine],
) -> Plan {
    let mut mine: Vec<&TalosMachineClass> = classes
        .iter()
        .copied()
        .filter(|c| {
            c.metadata.namespace == cluster.metadata.namespace
                && c.spec.cluster_ref.name == cluster.name_any()
                && c.metadata.deletion_timestamp.is_none()
        })
        .collect();
    // By name: the same classes give the same messages whatever order the cache holds them in.
    mine.sort_by_key(|c| c.name_any());
    let mut statuses: BTreeMap<String, TalosMachineClassStatus> = mine
        .iter()
        .map(|c| (c.name_any(), TalosMachineClassStatus::default()))
        .collect();
    for machine in machines {
        if machine.spec.approval_state == ApprovalState::Approved
            && let Some(status) = class_of(machine).and_then(|c| statuses.get_mut(c))
        {
            status.matches.machines.push(machine.name_any());
        }
    }
    let declared = usize::try_from(cluster.spec.control_plane.count).unwrap_or(0);
    let mut control_planes = machines
        .iter()
        .filter(|m| standing_control_plane(m))
        .count();
    let mut pending: Vec<&TalosMachine> = machines
        .iter()
        .filter(|m| {
            m.spec.approval_state == ApprovalState::Pending
                && m.metadata.deletion_timestamp.is_none()
        })
        .collect();
    pending.sort_by_key(|m| m.name_any());
    let mut verdicts = BTreeMap::new();
    for machine in pending {
        let Some(verdict) = verdict(&mine, machine, &mut statuses, &mut control_planes, declared)
        else {
            continue;
        };
        verdicts.insert(machine.name_any(), verdict);
    }
    for status in statuses.values_mut() {
        status.matches.machines.sort();
        status.matches.matched_machines =
            i32::try_from(status.matches.machines.len()).unwrap_or(i32::MAX);
    }
    Plan {
        verdicts,
        statuses,
        role_labels: role_labels(machines),
    }
}

/// What the classes `mine` make of one pending machine (`None`: none matches it), counted into
/// the classes' statuses and the standing control planes.
fn verdict(
    mine: &[&TalosMachineClass],
    machine: &TalosMachine,
    statuses: &mut BTreeMap<String, TalosMachineClassStatus>,
    control_planes: &mut usize,
    declared: usize,
) -> Option<Verdict> {
    let status = machine.status.clone().unwrap_or_default();
    let matching: Vec<&TalosMachineClass> = mine
        .iter()
        .copied()
        .filter(|c| c.spec.qualifiers.matches(&status))
        .collect();
    let names: Vec<String> = matching.iter().map(|c| c.name_any()).collect();
    let verdict = match matching.as_slice() {
        [] => return None,
        [class] => judge(class, machine, statuses, *control_planes, declared),
        _ => Verdict::Wait {
            reason: reasons::CLASS_AMBIGUOUS,
            message: format!(
                "matches TalosMachineClasses {}: a machine is approved only by the one class that matches it; narrow their qualifiers, or approve it by hand",
                names.join(" and ")
            ),
            classes: names.clone(),
        },
    };
    match &verdict {
        Verdict::Approve { class, role } => {
            if *role == Role::ControlPlane {
                *control_planes += 1;
            }
            if let Some(s) = statuses.get_mut(class) {
                s.matches.machines.push(machine.name_any());
            }
        }
        Verdict::Wait { .. } => {
            for name in &names {
                if let Some(s) = statuses.get_mut(name) {
                    s.matches.waiting.push(machine.name_any());
                }
            }
        }
    }
    Some(verdict)
}

/// The one matching class's verdict on `machine`.
fn judge(
    class: &TalosMachineClass,
    machine: &TalosMachine,
    statuses: &BTreeMap<String, TalosMachineClassStatus>,
    control_planes: usize,
    declared: usize,
) -> Verdict {
    let name = class.name_any();
    let wait = |reason: &'static str, message: String| Verdict::Wait {
        reason,
        message,
        classes: vec![name.clone()],
    };
    if certificate_changed(machine) {
        return wait(
            reasons::FINGERPRINT_MISMATCH,
            format!(
                "matches TalosMachineClass {name}, but its certificate is not the pinned one: confirm the machine and update spec.fingerprint, or approve it by hand"
            ),
        );
    }
    let approved = statuses.get(&name).map_or(0, |s| s.matches.machines.len());
    if let Some(max) = class.spec.max_machines
        && approved >= usize::try_from(max).unwrap_or(0)
    {
        return wait(
            reasons::CLASS_FULL,
            format!(
                "matches TalosMachineClass {name}, which has approved its spec.maxMachines ({max}); raise it to approve more"
            ),
        );
    }
    if class.spec.role == Role::ControlPlane && control_planes >= declared {
        return wait(
            reasons::CONTROL_PLANES_FULL,
            format!(
                "matches TalosMachineClass {name}, but the cluster has its {declared} control planes (spec.controlPlane.count); raise the count to add one"
            ),
        );
    }
    Verdict::Approve {
        class: name,
        role: class.spec.role,
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::class::{Qualifiers, TalosMachineClassSpec};
    use ichor_api::common::LocalObjectReference;
    use ichor_api::machine::{HardwareInventory, TalosMachineSpec, TalosMachineStatus};

    use serde_json::json;

    use super::*;

    fn cluster(control_planes: i32) -> TalosCluster {
        serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosCluster",
            "metadata": {"name": "lab", "namespace": "ns"},
            "spec": {
                "talosVersion": "v1.14.1",
                "kubernetesVersion": "1.36.3",
                "endpoint": "https://10.0.0.10:6443",
                "controlPlane": {"count": control_planes}
            }
        }))
        .expect("cluster")
    }

    fn class(name: &str, role: Role, uuid_prefix: &str, max: Option<i32>) -> TalosMachineClass {
        let mut c = TalosMachineClass::new(
            name,
            TalosMachineClassSpec {
                cluster_ref: LocalObjectReference { name: "lab".into() },
                role,
                qualifiers: Qualifiers {
                    cidrs: vec![format!("{uuid_prefix}/24")],
                    ..Default::default()
                },
                max_machines: max,
                install: None,
                schematic: None,
                config_patches: Vec::new(),
                rollout: None,
            },
        );
        c.metadata.namespace = Some("ns".into());
        c
    }

    fn machine(name: &str, address: &str) -> TalosMachine {
        let mut m = TalosMachine::discovered(
            "ns",
            name,
            name,
            TalosMachineSpec::pending("lab", address, "pin"),
        );
        m.status = Some(TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                address: Some(address.into()),
                observed_fingerprint: Some("pin".into()),
                hardware: Some(HardwareInventory {
                    uuid: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        });
        m
    }

    fn approved(mut m: TalosMachine, role: Role, class: Option<&str>) -> TalosMachine {
        m.spec.approval_state = ApprovalState::Approved;
        m.spec.role = Some(role);
        if let Some(class) = class {
            m.metadata
                .labels
                .get_or_insert_default()
                .insert(labels::CLASS.into(), class.into());
        }
        m
    }

    fn approve(class: &str, role: Role) -> Verdict {
        Verdict::Approve {
            class: class.into(),
            role,
        }
    }

    fn reason(plan: &Plan, machine: &str) -> Option<&'static str> {
        match plan.verdicts.get(machine)? {
            Verdict::Wait { reason, .. } => Some(reason),
            Verdict::Approve { .. } => None,
        }
    }

    #[test]
    fn control_planes_stop_at_the_declared_count_not_counting_those_leaving() {
        let cp = class("cp", Role::ControlPlane, "10.0.0.0", None);
        let mut leaving = approved(machine("a", "10.0.0.1"), Role::ControlPlane, None);
        leaving.status.get_or_insert_default().removal.progress = Some(Default::default());
        let machines = vec![
            leaving,
            machine("b", "10.0.0.2"),
            machine("c", "10.0.0.3"),
            machine("d", "10.0.0.4"),
            machine("e", "10.0.0.5"),
        ];
        let plan = plan(&cluster(3), &[&cp], &machines);
        for name in ["b", "c", "d"] {
            assert_eq!(
                plan.verdicts[name],
                approve("cp", Role::ControlPlane),
                "{name}"
            );
        }
        assert_eq!(reason(&plan, "e"), Some(reasons::CONTROL_PLANES_FULL));
        assert_eq!(plan.statuses["cp"].matches.machines, ["b", "c", "d"]);
        assert_eq!(plan.statuses["cp"].matches.waiting, ["e"]);
        assert_eq!(plan.statuses["cp"].matches.matched_machines, 3);
    }

    #[test]
    fn max_machines_counts_what_the_class_approved_before() {
        let workers = class("w", Role::Worker, "10.0.1.0", Some(2));
        let machines = vec![
            approved(machine("a", "10.0.1.1"), Role::Worker, Some("w")),
            machine("b", "10.0.1.2"),
            machine("c", "10.0.1.3"),
        ];
        let plan = plan(&cluster(1), &[&workers], &machines);
        assert_eq!(plan.verdicts["b"], approve("w", Role::Worker));
        assert_eq!(reason(&plan, "c"), Some(reasons::CLASS_FULL));
        assert!(
            !plan.verdicts.contains_key("a"),
            "approved machines are not touched"
        );
        assert!(
            plan.role_labels.contains_key("a"),
            "an approved machine without its role label gets one"
        );
    }

    #[test]
    fn two_matching_classes_leave_the_machine_pending_naming_both() {
        let a = class("a", Role::Worker, "10.0.2.0", None);
        let b = class("b", Role::Worker, "10.0.2.0", None);
        let plan = plan(&cluster(1), &[&b, &a], &[machine("m", "10.0.2.9")]);
        match &plan.verdicts["m"] {
            Verdict::Wait {
                reason, message, ..
            } => {
                assert_eq!(*reason, reasons::CLASS_AMBIGUOUS);
                assert!(message.contains("a and b"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(plan.statuses["a"].matches.waiting, ["m"]);
        assert_eq!(plan.statuses["b"].matches.waiting, ["m"]);
    }

    #[test]
    fn changed_certificates_rejected_machines_and_other_clusters_are_never_approved() {
        let w = class("w", Role::Worker, "10.0.3.0", None);
        let mut changed = machine("changed", "10.0.3.1");
        changed
            .status
            .get_or_insert_default()
            .inventory
            .observed_fingerprint = Some("other".into());
        let mut rejected = machine("rejected", "10.0.3.2");
        rejected.spec.approval_state = ApprovalState::Rejected;
        let mut elsewhere = machine("elsewhere", "10.0.3.3");
        elsewhere.spec.cluster_ref.name = "other".into();
        let mut other_class = class("x", Role::Worker, "10.0.3.0", None);
        other_class.spec.cluster_ref.name = "other".into();
        let plan = plan(
            &cluster(1),
            &[&w, &other_class],
            &[changed, rejected, machine("fine", "10.0.3.4")],
        );
        assert_eq!(
            reason(&plan, "changed"),
            Some(reasons::FINGERPRINT_MISMATCH)
        );
        assert!(!plan.verdicts.contains_key("rejected"));
        assert_eq!(plan.verdicts["fine"], approve("w", Role::Worker));
        assert!(!plan.statuses.contains_key("x"), "another cluster's class");
        let no_match = plan_for_unmatched();
        assert!(no_match.verdicts.is_empty(), "no class matches: no verdict");
    }

    fn plan_for_unmatched() -> Plan {
        let w = class("w", Role::Worker, "10.0.3.0", None);
        plan(&cluster(1), &[&w], &[machine("far", "192.168.0.1")])
    }
}
