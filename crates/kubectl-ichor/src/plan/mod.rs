//! `plan -f FILE`: what a changed TalosCluster manifest would do once applied, before it is
//! merged: which machines get which change (their config live or with a reboot, an upgrade,
//! nothing), in which batches and order, what stands in the way (drains, maintenance windows,
//! a suspend, health gates, a fresh backup, a halt) and what would be refused.
//!
//! It reads the live TalosCluster of the manifest's name and namespace, and the namespace's
//! TalosMachines, TalosMachineClasses and TalosStorages (get and list, no Secret, no write),
//! then answers from the pure code the manager and the webhook run: `predict` renders and
//! compares, `ichor_deleteguard::forecast` orders. The manifest is read in `manifest`, the
//! policy in `policy`; the report's parts are made in `steps` and printed in `print`.

pub mod manifest;
pub mod policy;
pub mod predict;
pub mod print;
pub mod report;
pub mod steps;

use std::path::Path;

use ichor_api::names::reasons;
use ichor_api::versions::{self, Declared, Version};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass, TalosStorage};
use ichor_deleteguard::forecast::{Inputs, forecast};
use ichor_deleteguard::rollout::Backups;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;
use serde_json::Value;

use crate::Error;
use crate::connect::{Connection, list_all};
use predict::Observed;
use report::{Refused, Report};

/// How the plan is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Tables and sentences, for a person.
    Table,
    /// JSON, in the shape of [`report::Report`].
    Json,
}

/// What a reason names when a config does not render after the change.
pub const CONFIG_DOES_NOT_RENDER: &str = "ConfigDoesNotRender";

/// The plan of the manifest `file`, read against the live cluster; `namespace` is `-n` when
/// given, `at` the time windows are judged at (now when `None`).
pub async fn plan(
    conn: &Connection,
    file: &Path,
    namespace: Option<&str>,
    output: Output,
    at: Option<Timestamp>,
) -> Result<String, Error> {
    let source = file.display().to_string();
    let text = std::fs::read_to_string(file)
        .map_err(|e| Error::Manifest(format!("cannot read {source}: {e}")))?;
    let changed = manifest::read_manifest(&text, &source)?;
    let ns = match (changed.namespace(), namespace) {
        (Some(own), Some(flag)) if own != flag => {
            return Err(Error::Usage(format!(
                "{source} is for namespace {own}, and -n says {flag}: leave -n out, or make them agree"
            )));
        }
        (Some(own), _) => own,
        (None, _) => conn.namespace.clone(),
    };
    let conn = Connection {
        client: conn.client.clone(),
        namespace: ns,
    };
    let name = changed.name_any();
    let live =
        crate::render::get_cluster(&conn, &name, &format!(" (the live copy of {source})")).await?;
    let machines: Vec<TalosMachine> = list_all(
        &Api::namespaced(conn.client.clone(), &conn.namespace),
        &format!("TalosMachines in namespace {}", conn.namespace),
    )
    .await?;
    let classes: Vec<TalosMachineClass> = list_all(
        &Api::namespaced(conn.client.clone(), &conn.namespace),
        &format!("TalosMachineClasses in namespace {}", conn.namespace),
    )
    .await?;
    let storages: Vec<TalosStorage> = list_all(
        &Api::namespaced(conn.client.clone(), &conn.namespace),
        &format!("TalosStorages in namespace {}", conn.namespace),
    )
    .await?;
    let observed = Observed {
        live: &live,
        changed: &changed,
        machines: &machines,
        classes: &classes,
        storages: &storages,
        now: at.unwrap_or_else(Timestamp::now),
    };
    let report = report(&observed)?;
    match output {
        Output::Table => Ok(print::table(&report)),
        Output::Json => print::json(&report),
    }
}

/// The plan, pure: what the change does, in which batches, what holds or refuses it.
pub fn report(o: &Observed<'_>) -> Result<Report, Error> {
    let policy = policy::read_policy(&o.changed.spec.rollout, "spec.rollout")?;
    let mut report = Report {
        shape: report::SHAPE.to_owned(),
        cluster: o.live.name_any(),
        namespace: o.live.namespace().unwrap_or_default(),
        at: o.now.to_string(),
        changes: changes(o.live, o.changed),
        ..Report::default()
    };
    if let Some(refused) = version_refusal(o) {
        report.refused.push(refused);
        report.notes.push(
            "the webhook refuses this update at the door: nothing rolls out, and the cluster keeps what it declares now"
                .to_owned(),
        );
        return Ok(report);
    }
    let before = predict::effective(o.live);
    let after = predict::after_change(o);
    let (predicted, unrendered) = predict::predict_all(o, &before, &after);
    report
        .refused
        .extend(unrendered.into_iter().map(|message| Refused {
            reason: CONFIG_DOES_NOT_RENDER.to_owned(),
            message,
        }));
    let governing = predicted
        .iter()
        .map(|p| predict::governing(o, p.machine, &policy))
        .collect::<Result<Vec<_>, _>>()?;
    let planned: Vec<_> = predicted.iter().map(|p| predict::planned(p, o)).collect();
    let halt = predict::halt(o, &predicted);
    let f = forecast(&Inputs {
        machines: &planned,
        policy: &policy,
        halt: halt.as_ref(),
        backups: backups(o),
        now: o.now,
    });
    report.machines = predicted
        .iter()
        .zip(&governing)
        .map(|(p, g)| steps::machine_step(p, &g.0, o))
        .collect();
    report.batches = steps::batches(&f, &report.machines, &governing, &policy);
    report.holds = steps::holds(&f, &predicted, &governing, o);
    let gates = report.batches.iter().any(|b| !b.gates.is_empty());
    report.notes = steps::notes(&predicted, &f, gates, o);
    Ok(report)
}

/// The cluster's backups, for the fresh-backup rule: whether it backs up after the change,
/// and its last success and run in flight as recorded.
fn backups(o: &Observed<'_>) -> Backups {
    let record = o
        .live
        .status
        .as_ref()
        .and_then(|s| s.backup.record.as_ref());
    Backups {
        configured: o.changed.spec.backup.is_some(),
        last_success: record
            .and_then(|r| r.last_success.as_ref())
            .map(|s| s.taken_at.0),
        running: record.is_some_and(|r| r.running.is_some()),
    }
}

/// The webhook's version rules on the change (`ichor-webhook`'s TalosCluster update): the
/// declared versions against the config contract in force and the oldest Talos a configured
/// node runs, as the machines record it.
fn version_refusal(o: &Observed<'_>) -> Option<Refused> {
    fn declared(c: &TalosCluster) -> Declared<'_> {
        Declared {
            talos: &c.spec.talos_version,
            kubernetes: &c.spec.kubernetes_version,
        }
    }
    if declared(o.live) == declared(o.changed) {
        return None;
    }
    let namespace = o.live.namespace().unwrap_or_default();
    let oldest =
        versions::oldest_running(o.machines.iter(), &namespace, &o.live.name_any()).map(|(_, v)| v);
    let checked = match versions::contract_in_force(&o.live.spec.talos_version, oldest) {
        Some(contract) => versions::check_change(
            declared(o.live),
            declared(o.changed),
            contract,
            oldest.map(Version::series),
        )
        .map(|_| ()),
        None => versions::check_declared(declared(o.changed)),
    };
    checked.err().map(|refusal| Refused {
        reason: reasons::VERSION_CHANGE_REFUSED.to_owned(),
        message: refusal.to_string(),
    })
}

/// The spec fields that differ between `live` and `changed`: `field: before -> after` for a
/// value written on one line, `field changed` for the others.
pub fn changes(live: &TalosCluster, changed: &TalosCluster) -> Vec<String> {
    let (Ok(Value::Object(before)), Ok(Value::Object(after))) = (
        serde_json::to_value(&live.spec),
        serde_json::to_value(&changed.spec),
    ) else {
        return Vec::new();
    };
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| match (before.get(k), after.get(k)) {
            (Some(a), Some(b)) if is_scalar(a) && is_scalar(b) => {
                format!("spec.{k}: {} -> {}", shown(a), shown(b))
            }
            (None, Some(_)) => format!("spec.{k} added"),
            (Some(_), None) => format!("spec.{k} removed"),
            _ => format!("spec.{k} changed"),
        })
        .collect()
}

fn is_scalar(value: &Value) -> bool {
    !value.is_object() && !value.is_array()
}

fn shown(value: &Value) -> String {
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_owned)
}

#[cfg(test)]
mod tests {
    use ichor_api::common::Role;
    use ichor_api::rollout::MaintenanceWindow;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use serde_json::json;

    use super::*;

    /// A configured, Ready machine of cluster `lab` running `talos`.
    fn machine(name: &str, role: Role, talos: &str) -> TalosMachine {
        let mut m = TalosMachine::test(name).role(role).approved().build();
        m.status = Some(
            serde_json::from_value(json!({
                "appliedConfigHash": "sha256:applied",
                "talosVersion": talos,
                "conditions": [{"type": "Ready", "status": "True", "reason": "Ready",
                    "lastTransitionTime": "2026-12-07T10:00:00Z"}]
            }))
            .expect("status"),
        );
        m
    }

    fn fleet(talos: &str) -> Vec<TalosMachine> {
        vec![
            machine("w-2", Role::Worker, talos),
            machine("cp-1", Role::ControlPlane, talos),
            machine("w-1", Role::Worker, talos),
            machine("w-3", Role::Worker, talos),
        ]
    }

    fn live() -> TalosCluster {
        TalosCluster::test("lab").install_disk("/dev/vda").build()
    }

    fn plan_of(changed: &TalosCluster, machines: &[TalosMachine]) -> Report {
        plan_from(&live(), changed, machines)
    }

    fn plan_from(live: &TalosCluster, changed: &TalosCluster, machines: &[TalosMachine]) -> Report {
        report(&Observed {
            live,
            changed,
            machines,
            classes: &[],
            storages: &[],
            now: "2026-12-07T12:00:00Z".parse().expect("time"),
        })
        .expect("a plan")
    }

    fn order(report: &Report) -> Vec<Vec<&str>> {
        report
            .batches
            .iter()
            .map(|b| b.machines.iter().map(String::as_str).collect())
            .collect()
    }

    #[test]
    fn a_talos_version_bump_upgrades_each_machine_after_a_drain_control_planes_first() {
        let mut changed = live();
        changed.spec.talos_version = "v1.14.2".into();
        let report = plan_of(&changed, &fleet("v1.14.1"));
        assert_eq!(report.changes, ["spec.talosVersion: v1.14.1 -> v1.14.2"]);
        assert!(report.refused.is_empty(), "{report:?}");
        assert!(report.machines.iter().all(|m| {
            m.change == "upgrade"
                && m.how == "reboot"
                && m.drain == "yes"
                && m.upgrade_to
                    .as_deref()
                    .is_some_and(|i| i.ends_with(":v1.14.2"))
        }));
        assert_eq!(
            order(&report),
            [vec!["cp-1"], vec!["w-1"], vec!["w-2"], vec!["w-3"]]
        );
        assert!(report.batches.iter().all(|b| b.drains == b.machines));
        assert!(report.holds.is_empty(), "{:?}", report.holds);
    }

    #[test]
    fn a_config_patch_goes_live_on_talos_1_14_and_the_node_decides_on_1_13() {
        let mut changed = live();
        changed.spec.config_patches = serde_json::from_value(json!([
            {"name": "sans", "machine": {"certSANs": ["plan.example.internal"]}}
        ]))
        .expect("patches");
        let report = plan_of(&changed, &fleet("v1.14.1"));
        assert_eq!(report.changes, ["spec.configPatches added"]);
        assert!(
            report
                .machines
                .iter()
                .all(|m| m.change == "config" && m.how == "live" && m.predicted && m.drain == "no"),
            "{:?}",
            report.machines
        );
        assert!(
            report.notes[0].starts_with("live is a prediction"),
            "{:?}",
            report.notes
        );
        assert_eq!(order(&report).len(), 4);
        let older = TalosCluster::test("lab")
            .talos("v1.13.9")
            .install_disk("/dev/vda")
            .build();
        let mut changed_older = older.clone();
        changed_older.spec.config_patches = changed.spec.config_patches.clone();
        let report = plan_from(&older, &changed_older, &fleet("v1.13.9"));
        assert!(
            report
                .machines
                .iter()
                .all(|m| m.how == "node-decides" && m.drain == "if-it-reboots")
        );
        let text = print::table(&report);
        assert!(text.contains("node-decides (predicted)"), "{text}");
    }

    #[test]
    fn max_unavailable_and_a_closed_window_show_in_the_batches_and_the_holds() {
        let mut changed = live();
        changed.spec.talos_version = "v1.14.2".into();
        changed.spec.rollout.max_unavailable = Some(IntOrString::Int(2));
        changed.spec.rollout.maintenance_windows = vec![MaintenanceWindow {
            schedule: "0 22 * * *".into(),
            duration: "4h".into(),
            time_zone: "UTC".into(),
        }];
        let report = plan_of(&changed, &fleet("v1.14.1"));
        assert_eq!(
            order(&report),
            [vec!["cp-1"], vec!["w-1", "w-2"], vec!["w-3"]]
        );
        assert!(report.batches.iter().all(|b| b.window));
        assert_eq!(report.holds.len(), 1, "{:?}", report.holds);
        assert_eq!(report.holds[0].reason, "OutsideMaintenanceWindow");
        assert_eq!(
            report.holds[0].until.as_deref(),
            Some("2026-12-07T22:00:00Z")
        );
        assert!(
            report.holds[0].message.contains(
                "of spec.rollout; the next opens at 2026-12-07T22:00:00Z (0 22 * * * (UTC) for 4h)"
            ),
            "{:?}",
            report.holds
        );
    }

    #[test]
    fn a_version_the_webhook_refuses_rolls_out_nothing() {
        let mut changed = live();
        changed.spec.talos_version = "v1.13.9".into();
        let report = plan_of(&changed, &fleet("v1.14.1"));
        assert_eq!(report.refused.len(), 1);
        assert_eq!(report.refused[0].reason, "VersionChangeRefused");
        assert!(
            report.refused[0].message.contains(
                "spec.talosVersion v1.13.9 is older than the config contract in force, 1.14"
            ),
            "{:?}",
            report.refused
        );
        assert!(report.batches.is_empty() && report.machines.is_empty());
        let text = print::table(&report);
        assert!(
            text.contains("Refused:\n  VersionChangeRefused: spec.talosVersion v1.13.9"),
            "{text}"
        );
    }

    #[test]
    fn a_bad_window_is_an_error_naming_the_field() {
        let mut changed = live();
        changed.spec.rollout.maintenance_windows = vec![MaintenanceWindow {
            schedule: "0 25 * * *".into(),
            duration: "4h".into(),
            time_zone: "UTC".into(),
        }];
        let error = report(&Observed {
            live: &live(),
            changed: &changed,
            machines: &fleet("v1.14.1"),
            classes: &[],
            storages: &[],
            now: Timestamp::UNIX_EPOCH,
        })
        .expect_err("refused");
        assert!(
            error
                .to_string()
                .starts_with("spec.rollout.maintenanceWindows[0]: schedule \"0 25 * * *\" is not a five-field cron expression"),
            "{error}"
        );
    }

    #[test]
    fn the_json_shape_names_every_part() {
        let mut changed = live();
        changed.spec.talos_version = "v1.14.2".into();
        let text = print::json(&plan_of(&changed, &fleet("v1.14.1"))).expect("json");
        let value: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(value["shape"], "ichor.maesh.dev/plan/v1");
        assert_eq!(value["cluster"], "lab");
        for key in [
            "at", "changes", "refused", "machines", "batches", "holds", "notes",
        ] {
            assert!(value.get(key).is_some(), "{key}: {value}");
        }
        let first = &value["machines"][0];
        for key in [
            "name",
            "role",
            "change",
            "how",
            "predicted",
            "upgradeTo",
            "configChanges",
            "drain",
            "policy",
            "detail",
        ] {
            assert!(first.get(key).is_some(), "{key}: {first}");
        }
        let batch = &value["batches"][0];
        for key in [
            "number",
            "machines",
            "waitsFor",
            "drains",
            "window",
            "gates",
            "freshBackup",
        ] {
            assert!(batch.get(key).is_some(), "{key}: {batch}");
        }
    }

    #[test]
    fn a_kubernetes_version_restarts_components_live_without_a_drain() {
        let mut changed = live();
        changed.spec.kubernetes_version = "1.36.4".into();
        let report = plan_of(&changed, &fleet("v1.14.1"));
        assert!(report.refused.is_empty(), "{:?}", report.refused);
        assert!(
            report
                .machines
                .iter()
                .all(|m| m.change == "restart" && m.drain == "no" && !m.predicted),
            "{:?}",
            report.machines
        );
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.contains("component by component"))
        );
    }

    #[test]
    fn a_class_policy_governs_its_machines_and_says_so() {
        let mut changed = live();
        changed.spec.talos_version = "v1.14.2".into();
        let class: TalosMachineClass = serde_json::from_value(json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1",
            "kind": "TalosMachineClass",
            "metadata": {"name": "gpu", "namespace": live().metadata.namespace},
            "spec": {"clusterRef": {"name": "lab"}, "role": "worker",
                "qualifiers": {"cidrs": ["10.0.0.0/24"]},
                "rollout": {"suspend": true}}
        }))
        .expect("class");
        let mut machines = fleet("v1.14.1");
        machines[0]
            .metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(ichor_api::names::labels::CLASS.into(), "gpu".into());
        let report = report(&Observed {
            live: &live(),
            changed: &changed,
            machines: &machines,
            classes: &[class],
            storages: &[],
            now: Timestamp::UNIX_EPOCH,
        })
        .expect("a plan");
        let w2 = report
            .machines
            .iter()
            .find(|m| m.name == "w-2")
            .expect("w-2");
        assert_eq!(w2.policy, "TalosMachineClass gpu spec.rollout");
        assert!(
            report.holds.iter().any(|h| h.reason == "RolloutSuspended"
                && h.message
                    .starts_with("TalosMachineClass gpu spec.rollout.suspend is true")),
            "{:?}",
            report.holds
        );
    }

    #[test]
    fn nothing_changed_plans_nothing() {
        let report = plan_of(&live(), &fleet("v1.14.1"));
        assert!(report.changes.is_empty() && report.batches.is_empty());
        assert!(report.machines.iter().all(|m| m.change == "none"));
        let text = print::table(&report);
        assert!(text.contains("Changes:\n  none"), "{text}");
        assert!(text.contains("nothing rolls out"), "{text}");
    }
}
