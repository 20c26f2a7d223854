//! The rollout policy (`spec.rollout`, ADRs 0074 and 0075) where a rollout's step starts: a
//! machine's turn (its config change or its upgrade), and the reboot a config change that
//! cannot go live needs. The policy governing a machine is its class's when the class declares
//! one, else its cluster's ([`governing`]). The rules are `ichor_deleteguard::rollout`'s and
//! `::gates`'; this reads the spec, the workload cluster's objects and the backups, and says
//! why a step waits: [`holds`] for what the spec and the clock alone decide (a suspend, the
//! windows), [`clears`] for that and then the health gates and a fresh backup.
//!
//! A step under way is never held: a suspend, a window closing or a gate failing stops only
//! the next start.

mod backup;
pub mod batch;
mod gates;

use std::sync::Arc;

use ichor_api::names::{labels, reasons};
use ichor_api::rollout::RolloutPolicy;
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass};
use ichor_deleteguard::rollout::{Window, window_open};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use crate::{Context, Error, Stop};

/// What is about to start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A machine's turn: its changed config, tried live first.
    Change,
    /// A machine's turn for an upgrade (a version or a schematic): a reboot.
    Upgrade,
    /// The reboot a changed config that cannot go live needs.
    Reboot,
    /// A machine's turn while a Kubernetes version rolls out: its changed config, live, yet
    /// restarting a service (a control-plane static pod, the kubelet), so held as a
    /// disruption ([`Step::during`]).
    Restart,
}

/// The reasons a step waits for by the rollout policy.
const HOLDS: [&str; 6] = reasons::POLICY_HOLDS;

/// The rollout policy's reason that `reason` is, if it is one: a machine held by it is looked
/// at again at the progress pace (not queued behind another machine), and its cluster's
/// rollout conditions say it.
pub fn policy_reason(reason: &str) -> Option<&'static str> {
    HOLDS.into_iter().find(|r| *r == reason)
}

/// Whether a wait of `reason` is the rollout policy's ([`policy_reason`]).
pub fn is_policy_hold(reason: &str) -> bool {
    policy_reason(reason).is_some()
}

/// The rollout policy governing a machine, and where it is declared.
#[derive(Debug, Clone)]
pub struct Governing<'a> {
    /// The policy: the machine's class's, when the class declares one, else the cluster's.
    pub policy: &'a RolloutPolicy,
    /// Where it is declared, for messages: `spec.rollout`, or the class's.
    pub field: String,
    /// Which suspend stops the machine's steps, if one does: the cluster's stops every
    /// machine, a class's its own.
    pub suspended_by: Option<String>,
}

/// The policy governing `machine` of `cluster`, its class (as the `ichor.maesh.dev/class`
/// label names it, among `classes`) declaring one or not.
pub fn governing<'a>(
    cluster: &'a TalosCluster,
    machine: &TalosMachine,
    classes: &'a [Arc<TalosMachineClass>],
) -> Governing<'a> {
    let class = machine
        .labels()
        .get(labels::CLASS)
        .and_then(|name| {
            classes.iter().find(|c| {
                c.name_any() == *name
                    && c.namespace() == machine.namespace()
                    && c.spec.cluster_ref.name == machine.spec.cluster_ref.name
            })
        })
        .and_then(|c| c.spec.rollout.as_ref().map(|p| (c.name_any(), p)));
    let cluster_suspend = cluster
        .spec
        .rollout
        .suspend
        .then(|| "spec.rollout.suspend".to_owned());
    match class {
        Some((name, policy)) => {
            let field = format!("TalosMachineClass {name} spec.rollout");
            let suspended_by =
                cluster_suspend.or_else(|| policy.suspend.then(|| format!("{field}.suspend")));
            Governing {
                policy,
                field,
                suspended_by,
            }
        }
        None => Governing {
            policy: &cluster.spec.rollout,
            field: "spec.rollout".to_owned(),
            suspended_by: cluster_suspend,
        },
    }
}

/// Why `machine`'s `step` waits by the rollout policy governing it now; `None` lets it start.
/// First [`holds`] (a suspend, the windows); then, for a step a window would hold, the health
/// gates over the workload cluster; then, for a control plane's upgrade or reboot, a fresh
/// etcd backup, asked of the backup controller when the last is too old.
pub async fn clears(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    step: Step,
) -> Result<Option<Stop>, Error> {
    let step = step.during(cluster);
    let classes = ctx.layers.classes();
    let governing = governing(cluster, machine, &classes);
    if let Some(held) = holds(&governing, step, ctx.now().0) {
        return Ok(Some(held));
    }
    if !disrupts(governing.policy, step) {
        return Ok(None);
    }
    let what = step.what();
    // Boxed: its futures (discovery, a list) would otherwise sit in every machine reconcile's.
    if let Some(failing) = Box::pin(gates::failing(ctx, cluster, &governing, what)).await {
        return Ok(Some(failing));
    }
    if matches!(step, Step::Change | Step::Restart) {
        return Ok(None);
    }
    backup::needed(ctx, cluster, machine, &governing, what)
}

impl Step {
    /// What waits, for a message.
    fn what(self) -> &'static str {
        match self {
            Self::Change => "its changed config (spec.rollout.holdLiveChanges)",
            Self::Upgrade => "its upgrade",
            Self::Reboot => "the reboot its changed config needs",
            Self::Restart => {
                "its changed config, which restarts a Kubernetes component (a Kubernetes version rolls out)"
            }
        }
    }

    /// The step as `cluster` now has it: a change while a Kubernetes version rolls out
    /// (`kubernetesFrom` accepted, ADR 0070) restarts a service, and is held as one.
    pub fn during(self, cluster: &TalosCluster) -> Self {
        let stepping = cluster
            .status
            .as_ref()
            .and_then(|s| s.core.accepted_versions.as_ref())
            .is_some_and(|a| a.kubernetes_from.is_some());
        if self == Self::Change && stepping {
            Self::Restart
        } else {
            self
        }
    }
}

/// Whether `step` is one a window holds: a reboot or an upgrade, and a live change when the
/// policy holds those too.
fn disrupts(policy: &RolloutPolicy, step: Step) -> bool {
    match step {
        Step::Upgrade | Step::Reboot | Step::Restart => true,
        Step::Change => policy.hold_live_changes,
    }
}

/// Why `step` waits by the `governing` policy at `now`; `None` lets it start.
pub fn holds(governing: &Governing<'_>, step: Step, now: Timestamp) -> Option<Stop> {
    let policy = governing.policy;
    if let Some(suspend) = governing.suspended_by.as_deref()
        && step != Step::Reboot
    {
        return Some(Stop::new(
            reasons::ROLLOUT_SUSPENDED,
            format!(
                "{suspend} is true: no node starts its change until it is false (a node in flight finishes)"
            ),
        ));
    }
    if !disrupts(policy, step) || policy.maintenance_windows.is_empty() {
        return None;
    }
    let windows = match read_windows(governing) {
        Ok(windows) => windows,
        Err(stop) => return Some(stop),
    };
    let Err(next) = window_open(&windows, now) else {
        return None;
    };
    let when = match next {
        Some((at, window)) => format!("the next opens at {at} ({window})"),
        None => "no window's schedule names a later time".to_owned(),
    };
    Some(Stop::new(
        reasons::OUTSIDE_MAINTENANCE_WINDOW,
        format!(
            "{} waits: outside every maintenance window of {}; {when}",
            step.what(),
            governing.field
        ),
    ))
}

/// The policy's maintenance windows, read; the first that does not read names its field.
fn read_windows(governing: &Governing<'_>) -> Result<Vec<Window>, Stop> {
    governing
        .policy
        .maintenance_windows
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let duration =
                ichor_api::time::parse_duration("duration", &w.duration).map_err(|e| e.to_string());
            duration
                .and_then(|d| {
                    Window::parse(&w.schedule, d, &w.time_zone).map_err(|e| e.to_string())
                })
                .map_err(|problem| {
                    Stop::new(
                        reasons::ROLLOUT_POLICY_INVALID,
                        format!(
                            "{}.maintenanceWindows[{i}]: {problem}; every step a window holds waits until it reads",
                            governing.field
                        ),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ichor_api::rollout::MaintenanceWindow;

    fn cluster(windows: &[(&str, &str, &str)], suspend: bool, hold_live: bool) -> TalosCluster {
        let mut cluster = TalosCluster::test("c").build();
        cluster.spec.rollout.suspend = suspend;
        cluster.spec.rollout.hold_live_changes = hold_live;
        cluster.spec.rollout.maintenance_windows = windows
            .iter()
            .map(|(schedule, duration, zone)| MaintenanceWindow {
                schedule: (*schedule).into(),
                duration: (*duration).into(),
                time_zone: (*zone).into(),
            })
            .collect();
        cluster
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("time")
    }

    /// The class `gpu` of cluster `cluster`, in the test objects' namespace.
    fn class_of(cluster: &str) -> TalosMachineClass {
        let machine = TalosMachine::test("m").build();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosMachineClass",
            "metadata": {"name": "gpu", "namespace": machine.metadata.namespace},
            "spec": {"clusterRef": {"name": cluster}, "role": "worker", "qualifiers": {"cidrs": ["10.0.0.0/24"]}}
        }))
        .expect("a class")
    }

    /// What holds `step` of a machine without a class.
    fn held_at(cluster: &TalosCluster, step: Step, now: Timestamp) -> Option<Stop> {
        let machine = TalosMachine::test("m").build();
        holds(&governing(cluster, &machine, &[]), step, now)
    }

    #[test]
    fn a_change_while_kubernetes_rolls_out_is_a_restart_a_window_holds() {
        let mut c = cluster(&[("0 22 * * *", "4h", "UTC")], false, false);
        let noon = at("2026-12-07T12:00:00Z");
        assert_eq!(Step::Change.during(&c), Step::Change);
        assert!(
            held_at(&c, Step::Change.during(&c), noon).is_none(),
            "a live change goes"
        );
        c.status = Some(
            serde_json::from_value(serde_json::json!({
                "acceptedVersions": {"talosVersion": "v1.14.1", "kubernetesVersion": "1.36.4", "kubernetesFrom": "1.36.3"}
            }))
            .expect("status"),
        );
        let step = Step::Change.during(&c);
        assert_eq!(step, Step::Restart);
        assert_eq!(Step::Upgrade.during(&c), Step::Upgrade);
        let stop = held_at(&c, step, noon).expect("held outside the window");
        assert_eq!(stop.reason, reasons::OUTSIDE_MAINTENANCE_WINDOW);
        assert!(
            stop.message.contains("restarts a Kubernetes component"),
            "{}",
            stop.message
        );
        assert!(
            held_at(&c, step, at("2026-12-07T22:30:00Z")).is_none(),
            "inside it"
        );
    }

    #[test]
    fn a_class_policy_governs_its_machines_and_either_suspend_stops_them() {
        let c = cluster(&[("0 22 * * *", "4h", "UTC")], false, false);
        let mut class = class_of("c");
        class.spec.rollout = Some(RolloutPolicy::default());
        let mut machine = TalosMachine::test("m").build();
        machine.spec.cluster_ref.name = "c".into();
        let classes = [Arc::new(class.clone())];
        let noon = at("2026-12-07T12:00:00Z");
        // Not the class's: the cluster's window holds it.
        let stop = holds(&governing(&c, &machine, &classes), Step::Upgrade, noon).expect("held");
        assert!(
            stop.message.contains("window of spec.rollout;"),
            "{}",
            stop.message
        );
        // The class's machine: its class declares no window.
        machine
            .labels_mut()
            .insert(labels::CLASS.into(), "gpu".into());
        let g = governing(&c, &machine, &classes);
        assert_eq!(g.field, "TalosMachineClass gpu spec.rollout");
        assert!(holds(&g, Step::Upgrade, noon).is_none());
        // Its class suspended: held, saying which suspend.
        class.spec.rollout = Some(RolloutPolicy {
            suspend: true,
            ..RolloutPolicy::default()
        });
        let classes = [Arc::new(class)];
        let stop = holds(&governing(&c, &machine, &classes), Step::Upgrade, noon).expect("held");
        assert!(
            stop.message
                .starts_with("TalosMachineClass gpu spec.rollout.suspend is true"),
            "{}",
            stop.message
        );
        // The cluster suspended: every machine, its class's or not.
        let suspended = cluster(&[], true, false);
        let mut unsuspended = class_of("c");
        unsuspended.spec.rollout = Some(RolloutPolicy::default());
        let classes = [Arc::new(unsuspended)];
        let stop = holds(
            &governing(&suspended, &machine, &classes),
            Step::Upgrade,
            noon,
        )
        .expect("held");
        assert!(
            stop.message.starts_with("spec.rollout.suspend is true"),
            "{}",
            stop.message
        );
    }

    #[test]
    fn no_policy_holds_nothing() {
        let c = cluster(&[], false, false);
        for step in [Step::Change, Step::Upgrade, Step::Reboot] {
            assert!(held_at(&c, step, at("2026-12-07T12:00:00Z")).is_none());
        }
    }

    #[test]
    fn a_suspend_holds_each_turn_but_not_the_reboot_of_a_node_in_flight() {
        let c = cluster(&[], true, false);
        let stop = held_at(&c, Step::Upgrade, at("2026-12-07T12:00:00Z")).expect("held");
        assert_eq!(stop.reason, reasons::ROLLOUT_SUSPENDED);
        assert!(held_at(&c, Step::Change, at("2026-12-07T12:00:00Z")).is_some());
        assert!(held_at(&c, Step::Reboot, at("2026-12-07T12:00:00Z")).is_none());
    }

    #[test]
    fn outside_every_window_disruptions_wait_and_live_changes_go_unless_held() {
        let c = cluster(&[("0 22 * * *", "4h", "Europe/Berlin")], false, false);
        let noon = at("2026-12-07T12:00:00Z");
        let stop = held_at(&c, Step::Upgrade, noon).expect("held");
        assert_eq!(stop.reason, reasons::OUTSIDE_MAINTENANCE_WINDOW);
        assert!(
            stop.message
                .contains("the next opens at 2026-12-07T21:00:00Z"),
            "{}",
            stop.message
        );
        assert!(held_at(&c, Step::Reboot, noon).is_some());
        assert!(held_at(&c, Step::Change, noon).is_none());
        let held = cluster(&[("0 22 * * *", "4h", "Europe/Berlin")], false, true);
        assert!(held_at(&held, Step::Change, noon).is_some());
        // Inside: 22:30 in Berlin.
        assert!(held_at(&c, Step::Upgrade, at("2026-12-07T21:30:00Z")).is_none());
    }

    #[test]
    fn a_window_that_does_not_read_names_its_field_and_holds() {
        for (window, field) in [
            (("61 * * * *", "4h", "UTC"), "schedule \"61 * * * *\""),
            (
                ("0 1 * * *", "4h", "Mars/Olympus"),
                "timeZone \"Mars/Olympus\"",
            ),
            (("0 1 * * *", "soon", "UTC"), "duration \"soon\""),
        ] {
            let c = cluster(&[("0 22 * * *", "4h", "UTC"), window], false, false);
            let stop = held_at(&c, Step::Upgrade, at("2026-12-07T22:30:00Z")).expect("held");
            assert_eq!(stop.reason, reasons::ROLLOUT_POLICY_INVALID);
            assert!(
                stop.message
                    .starts_with("spec.rollout.maintenanceWindows[1]: ")
                    && stop.message.contains(field),
                "{}",
                stop.message
            );
        }
    }
}
