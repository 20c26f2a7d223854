//! The cluster's record of a stopped drift rollout (`status.driftHalt`): written when a machine
//! refuses its changed config, cleared once a change renders that machine's config differently.
//! The machine controller is its one writer; the cluster controller only reads it into the
//! `ConfigRolledOut` condition.

use ichor_api::cluster::{ClusterDrift, DriftHaltStatus};
use ichor_api::names::{actions, conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::events::EventType;

use crate::infra::status::{self, Guard};
use crate::{Context, Error};

/// Records `halt` as the cluster's drift halt (its own group), on the cluster as stored.
async fn set_halt(
    ctx: &Context,
    cluster: &TalosCluster,
    halt: Option<DriftHaltStatus>,
) -> Result<(), Error> {
    let api = api(ctx, cluster);
    let fresh = api.get(&cluster.name_any()).await?;
    let mut status = fresh.status.clone().unwrap_or_default();
    status.drift.halt = halt;
    status::apply::<ClusterDrift, _>(&api, &fresh, &status, Guard::None).await?;
    Ok(())
}

fn api(ctx: &Context, cluster: &TalosCluster) -> Api<TalosCluster> {
    Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
}

/// Records that `machine` refused config `rendered_hash` with `message`: the rollout stops
/// there. An Event on the cluster and the machine says so.
pub async fn record_halt(
    ctx: &Context,
    cluster: &TalosCluster,
    machine: &TalosMachine,
    rendered_hash: &str,
    message: &str,
) -> Result<(), Error> {
    let halt = DriftHaltStatus {
        machine: machine.name_any(),
        rendered_hash: rendered_hash.to_owned(),
        message: message.to_owned(),
        at: ctx.now(),
    };
    set_halt(ctx, cluster, Some(halt)).await?;
    let note = format!(
        "the drift rollout stopped at {}: it refused config {rendered_hash} ({message}); no other machine gets it until the patch is fixed",
        machine.name_any()
    );
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::DRIFT_HALTED,
        actions::APPLY,
        note.clone(),
    )
    .await;
    ctx.event(
        machine,
        EventType::Warning,
        reasons::DRIFT_HALTED,
        actions::APPLY,
        note,
    )
    .await;
    Ok(())
}

/// Clears the halt recorded for `machine`: its config renders differently now.
pub async fn clear_halt(ctx: &Context, cluster: &TalosCluster, machine: &str) -> Result<(), Error> {
    set_halt(ctx, cluster, None).await?;
    tracing::info!(
        cluster = %cluster.name_any(),
        %machine,
        "the drift rollout resumes: the refused config renders differently now"
    );
    Ok(())
}

/// Where the declared Talos version's rollout is: the counts for `status.rollout` and
/// `VersionRolledOut` (holds, reason, message). A configured node is up to date when its
/// `UpToDate` says it runs the declaration (ADR 0068); one whose upgrade failed stops the
/// rollout, named with its reason. The nodes in flight are those whose upgrade is recorded,
/// then those holding the cluster lock (`lock`, as mirrored) for their upgrade, alone or in a
/// batch (ADR 0077), as while their Nodes drain.
pub fn version_rollout(
    declared: &str,
    machines: &[TalosMachine],
    lock: Option<&ichor_api::cluster::LockStatus>,
) -> (
    ichor_api::cluster::RolloutStatus,
    (bool, &'static str, String),
) {
    let configured: Vec<&TalosMachine> = machines
        .iter()
        .filter(|m| {
            m.metadata.deletion_timestamp.is_none()
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.applied.config_hash.is_some())
        })
        .collect();
    let up_to_date = |m: &TalosMachine| {
        m.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == conditions::UP_TO_DATE
                    && c.status == ichor_api::common::ConditionStatus::True
            })
        })
    };
    let done = configured.iter().filter(|m| up_to_date(m)).count();
    let total = configured.len();
    let in_flight = in_flight(&configured, lock);
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let (stopped, held) = where_upgrades_wait(&configured);
    let status = ichor_api::cluster::RolloutStatus {
        talos_version: declared.to_owned(),
        up_to_date: count(done),
        total: count(total),
        summary: format!("{done}/{total}"),
        in_flight: in_flight.first().cloned(),
        waiting: count(total.saturating_sub(done).saturating_sub(in_flight.len())),
        in_flight_machines: in_flight,
        changes: Vec::new(),
        waits_on: held
            .as_ref()
            .map(|(m, reason, _)| format!("{reason} at {m}")),
        halted_at: stopped.as_ref().map(|(m, _)| m.clone()),
        kubernetes_step: None,
    };
    let condition = rollout_condition(&status, stopped, held);
    (status, condition)
}

/// The `configured` machines whose upgrade is in flight: recorded, then holding the cluster
/// `lock` for it, alone or in a batch; each once.
fn in_flight(
    configured: &[&TalosMachine],
    lock: Option<&ichor_api::cluster::LockStatus>,
) -> Vec<String> {
    use ichor_api::cluster::LockHolder;
    let recorded = configured.iter().filter(|m| {
        m.status
            .as_ref()
            .is_some_and(|s| s.upgrade.record.is_some())
    });
    let holders = lock
        .into_iter()
        .flat_map(|l| l.holder.iter().chain(l.batch.iter()))
        .filter_map(|h| match h {
            LockHolder::Upgrade(uid) => Some(uid.as_str()),
            _ => None,
        });
    let locked = holders.filter_map(|uid| {
        configured
            .iter()
            .find(|m| m.metadata.uid.as_deref() == Some(uid))
    });
    let mut names: Vec<String> = Vec::new();
    for m in recorded.chain(locked) {
        let name = kube::ResourceExt::name_any(*m);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// A machine the rollout policy holds (ADR 0074): its name, the policy's reason and what it
/// says.
type Held = (String, &'static str, String);

/// The machine an upgrade stopped at (with what its `UpToDate` says), and the one the rollout
/// policy holds, among the `configured` machines.
fn where_upgrades_wait(configured: &[&TalosMachine]) -> (Option<(String, String)>, Option<Held>) {
    let stopped = configured.iter().find_map(|m| {
        m.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == conditions::UP_TO_DATE
                && (c.reason == reasons::UPGRADE_FAILED
                    || c.reason == reasons::UPGRADE_ROLLED_BACK))
                .then(|| (kube::ResourceExt::name_any(*m), c.message.clone()))
        })
    });
    let held_on = |m: &TalosMachine, condition: &str| {
        m.status.as_ref()?.conditions.iter().find_map(|c| {
            (c.type_ == condition)
                .then(|| crate::rollout_policy::policy_reason(&c.reason))
                .flatten()
                .map(|reason| (kube::ResourceExt::name_any(m), reason, c.message.clone()))
        })
    };
    // Its upgrade held; else the changed config a version brings (its installer), which goes
    // first, held while the node does not run the declaration.
    let behind = |m: &TalosMachine| {
        m.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.type_ == conditions::UP_TO_DATE
                    && c.status != ichor_api::common::ConditionStatus::True
            })
        })
    };
    let held = configured
        .iter()
        .find_map(|m| held_on(m, conditions::UP_TO_DATE))
        .or_else(|| {
            configured
                .iter()
                .filter(|m| behind(m))
                .find_map(|m| held_on(m, conditions::CONFIG_APPLIED))
        });
    (stopped, held)
}

/// `VersionRolledOut` from the rollout's counts and the machine it stopped at, if any (with
/// what its `UpToDate` says), or the machine the rollout policy holds (its reason and message).
fn rollout_condition(
    rollout: &ichor_api::cluster::RolloutStatus,
    stopped: Option<(String, String)>,
    held: Option<Held>,
) -> (bool, &'static str, String) {
    let declared = &rollout.talos_version;
    let (done, total) = (rollout.up_to_date, rollout.total);
    if done == total {
        return (
            true,
            reasons::VERSION_CURRENT,
            format!("every configured node ({total}) runs Talos {declared} as declared"),
        );
    }
    if let Some((machine, message)) = stopped {
        return (
            false,
            reasons::DRIFT_HALTED,
            format!("the rollout of Talos {declared} stopped at {machine}: {message}"),
        );
    }
    if let Some((machine, reason, message)) = held {
        return (
            false,
            reason,
            format!(
                "the rollout of Talos {declared} waits at {machine} ({done} of {total} up to date): {message}"
            ),
        );
    }
    (
        false,
        reasons::VERSION_ROLLING_OUT,
        format!(
            "Talos {declared} rolls out (control planes one at a time, then workers as spec.rollout.maxUnavailable allows): {done} of {total} up to date{}",
            match rollout.in_flight_machines.as_slice() {
                [] => String::new(),
                [one] => format!(", {one} upgrading now"),
                many => format!(", {} upgrading now", many.join(", ")),
            }
        ),
    )
}

/// The machines whose changed config is still to roll out, and the one the rollout policy
/// holds (its reason and message), if any.
pub(crate) fn config_pending(machines: &[TalosMachine]) -> (Vec<String>, Option<Held>) {
    let config_applied = |m: &TalosMachine| {
        m.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == conditions::CONFIG_APPLIED)
                .cloned()
        })
    };
    let pending: Vec<String> = machines
        .iter()
        .filter(|m| {
            m.status.as_ref().is_some_and(|s| s.drift.reboot.is_some())
                || config_applied(m).is_some_and(|c| {
                    [
                        reasons::NEEDS_REBOOT,
                        reasons::DRIFT_QUEUED,
                        reasons::DRIFT_NOT_APPLIED,
                        reasons::DRIFT_HALTED,
                    ]
                    .contains(&c.reason.as_str())
                        || crate::rollout_policy::policy_reason(&c.reason).is_some()
                })
        })
        .map(kube::ResourceExt::name_any)
        .collect();
    // A machine the rollout policy holds (ADR 0074) says why the rollout waits.
    let held = machines.iter().find_map(|m| {
        let c = config_applied(m)?;
        crate::rollout_policy::policy_reason(&c.reason)
            .map(|reason| (kube::ResourceExt::name_any(m), reason, c.message))
    });
    (pending, held)
}

/// The cluster's `ConfigRolledOut` condition: whether it holds, its reason and message, from
/// the halt recorded and the machines' own `ConfigApplied` conditions.
pub fn rolled_out(
    halt: Option<&DriftHaltStatus>,
    machines: &[TalosMachine],
) -> (bool, &'static str, String) {
    // A halt recorded with an installer image (it has a `/`) is an upgrade's: `VersionRolledOut`
    // tells it, not this condition.
    if let Some(halt) = halt.filter(|h| !h.rendered_hash.contains('/')) {
        return (
            false,
            reasons::DRIFT_HALTED,
            format!(
                "the drift rollout stopped at {}, which refused config {} ({}); no other machine gets it until a change renders {}'s config differently: fix the patch",
                halt.machine, halt.rendered_hash, halt.message, halt.machine
            ),
        );
    }
    let (pending, held) = config_pending(machines);
    if let Some((machine, reason, message)) = held {
        return (
            false,
            reason,
            format!(
                "changed config waits at {machine}: {message}; still to take it: {}",
                pending.join(", ")
            ),
        );
    }
    if pending.is_empty() {
        (
            true,
            reasons::CONFIG_CURRENT,
            "every machine runs the config rendered for it".to_owned(),
        )
    } else {
        (
            false,
            reasons::DRIFT_ROLLING_OUT,
            format!(
                "changed config rolls out one machine at a time; still to take it: {}",
                pending.join(", ")
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::common::{Condition, ConditionStatus};
    use ichor_api::machine::TalosMachineStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn at() -> Time {
        Time("2026-12-03T10:00:00Z".parse().unwrap())
    }

    fn machine(name: &str, reason: &str) -> TalosMachine {
        let mut m = TalosMachine::test(name).build();
        m.status = Some(TalosMachineStatus {
            conditions: vec![Condition {
                type_: conditions::CONFIG_APPLIED.into(),
                status: ConditionStatus::False,
                reason: reason.into(),
                message: String::new(),
                last_transition_time: at(),
                observed_generation: None,
            }],
            ..Default::default()
        });
        m
    }

    #[test]
    fn a_rollout_the_policy_holds_is_not_rolled_out_and_says_why() {
        let held = [
            machine("cp-1", reasons::OUTSIDE_MAINTENANCE_WINDOW),
            machine("w-1", reasons::DRIFT_QUEUED),
        ];
        let (holds, reason, message) = rolled_out(None, &held);
        assert!(!holds);
        assert_eq!(reason, reasons::OUTSIDE_MAINTENANCE_WINDOW);
        assert!(
            message.starts_with("changed config waits at cp-1: "),
            "{message}"
        );
        assert!(
            message.ends_with("still to take it: cp-1, w-1"),
            "{message}"
        );
        let rollout = ichor_api::cluster::RolloutStatus {
            talos_version: "v1.14.2".into(),
            up_to_date: 1,
            total: 3,
            summary: "1/3".into(),
            ..Default::default()
        };
        let (holds, reason, message) = rollout_condition(
            &rollout,
            None,
            Some((
                "cp-2".into(),
                reasons::ROLLOUT_SUSPENDED,
                "suspended".into(),
            )),
        );
        assert!(!holds);
        assert_eq!(reason, reasons::ROLLOUT_SUSPENDED);
        assert_eq!(
            message,
            "the rollout of Talos v1.14.2 waits at cp-2 (1 of 3 up to date): suspended"
        );
    }

    #[test]
    fn a_halt_names_the_machine_and_pending_drift_lists_the_rest() {
        let machines = [
            machine("cp-1", reasons::DRIFT_QUEUED),
            machine("w-1", reasons::CONFIG_APPLIED),
        ];
        let (holds, reason, message) = rolled_out(None, &machines);
        assert!(!holds);
        assert_eq!(reason, reasons::DRIFT_ROLLING_OUT);
        assert!(message.ends_with("cp-1"), "{message}");
        let halt = DriftHaltStatus {
            machine: "cp-1".into(),
            rendered_hash: "abc".into(),
            message: "unknown field".into(),
            at: at(),
        };
        let (holds, reason, message) = rolled_out(Some(&halt), &machines);
        assert!(!holds);
        assert_eq!(reason, reasons::DRIFT_HALTED);
        assert!(message.contains("cp-1") && message.contains("unknown field"));
        let (holds, reason, _) = rolled_out(None, &machines[1..]);
        assert!(holds);
        assert_eq!(reason, reasons::CONFIG_CURRENT);
        let upgrade = DriftHaltStatus {
            rendered_hash: "factory.talos.dev/metal-installer/abc:v1.14.2".into(),
            ..halt
        };
        let (holds, reason, _) = rolled_out(Some(&upgrade), &machines[1..]);
        assert!(holds, "an upgrade's halt is VersionRolledOut's to tell");
        assert_eq!(reason, reasons::CONFIG_CURRENT);
    }

    #[test]
    fn a_version_whose_config_step_is_suspended_says_it_is_suspended() {
        let mut w = machine("w-1", reasons::ROLLOUT_SUSPENDED);
        let status = w.status.as_mut().expect("status");
        status.applied.config_hash = Some("sha256:a".into());
        status.conditions.push(Condition {
            type_: conditions::UP_TO_DATE.into(),
            status: ConditionStatus::False,
            reason: reasons::UPGRADE_QUEUED.into(),
            message: "its changed config rolls out first".into(),
            last_transition_time: at(),
            observed_generation: None,
        });
        let (rollout, (holds, reason, _)) = version_rollout("v1.14.2", &[w], None);
        assert!(!holds);
        assert_eq!(reason, reasons::ROLLOUT_SUSPENDED);
        assert_eq!(rollout.waits_on.as_deref(), Some("RolloutSuspended at w-1"));
    }

    #[test]
    fn every_member_of_a_batch_is_in_flight_and_the_rest_wait() {
        use ichor_api::cluster::{LockHolder, LockStatus};

        let configured = |name: &str| {
            let mut m = machine(name, reasons::CONFIG_APPLIED);
            m.metadata.uid = Some(format!("uid-{name}"));
            let status = m.status.as_mut().expect("status");
            status.applied.config_hash = Some("sha256:a".into());
            m
        };
        let machines = ["cp-1", "w-1", "w-2", "w-3"].map(configured);
        let lock = LockStatus {
            holder: Some(LockHolder::Batch("uid-lab".into())),
            batch: vec![
                LockHolder::Upgrade("uid-w-2".into()),
                LockHolder::Drift("uid-w-3".into()),
                LockHolder::Upgrade("uid-w-1".into()),
            ],
            ..Default::default()
        };
        let (rollout, (holds, reason, message)) =
            version_rollout("v1.14.2", &machines, Some(&lock));
        assert_eq!(rollout.in_flight_machines, ["w-2", "w-1"], "upgrades only");
        assert_eq!(rollout.in_flight.as_deref(), Some("w-2"));
        assert_eq!(rollout.waiting, 2, "cp-1 and w-3: none up to date");
        assert!(!holds);
        assert_eq!(reason, reasons::VERSION_ROLLING_OUT);
        assert!(message.ends_with("w-2, w-1 upgrading now"), "{message}");
    }

    #[test]
    fn the_node_in_flight_is_the_one_recorded_else_the_one_holding_the_lock_for_its_upgrade() {
        use ichor_api::cluster::LockHolder;
        use ichor_api::machine::UpgradeRecord;
        use ichor_api::operation::NodeProgress;

        let configured = |name: &str| {
            let mut m = machine(name, reasons::CONFIG_APPLIED);
            m.metadata.uid = Some(format!("uid-{name}"));
            let status = m.status.as_mut().expect("status");
            status.applied.config_hash = Some("sha256:a".into());
            m
        };
        let mut machines = [configured("cp-1"), configured("w-1")];
        let draining = LockHolder::Upgrade("uid-w-1".into());
        let in_flight = |machines: &[TalosMachine], holder: Option<&LockHolder>| {
            let lock = holder.map(|h| ichor_api::cluster::LockStatus {
                holder: Some(h.clone()),
                ..Default::default()
            });
            version_rollout("v1.14.2", machines, lock.as_ref())
                .0
                .in_flight
        };
        assert_eq!(in_flight(&machines, None), None);
        assert_eq!(
            in_flight(&machines, Some(&draining)).as_deref(),
            Some("w-1"),
            "its Node drains under the lock before anything is recorded"
        );
        let drift = LockHolder::Drift("uid-w-1".into());
        assert_eq!(in_flight(&machines, Some(&drift)), None);
        machines[0].status.as_mut().expect("status").upgrade.record = Some(UpgradeRecord {
            image: "factory.talos.dev/metal-installer/abc:v1.14.2".into(),
            version: "v1.14.2".into(),
            from_version: Some("v1.14.1".into()),
            boot_id_before: "b1".into(),
            progress: NodeProgress::Intended,
        });
        assert_eq!(
            in_flight(&machines, Some(&draining)).as_deref(),
            Some("cp-1")
        );
    }
}
