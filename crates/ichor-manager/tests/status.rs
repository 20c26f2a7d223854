//! Status writes against a real apiserver: one field manager per group of fields, conditions
//! as a list-map keyed by type, a writer with a stale copy never clobbers another's fields,
//! and a read-modify-write on a stale version is refused.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use ichor_api::cluster::{PendingNodeDelete, Tombstone};
use ichor_api::common::{Condition, ConditionStatus};
use ichor_api::machine::{MachinePhase, TalosMachineStatus};
use ichor_api::names::{conditions, field_managers as fm};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_manager::infra::status;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

fn condition(type_: &str, holds: bool) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if holds {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        reason: "Because".to_owned(),
        message: String::new(),
        last_transition_time: Time(Timestamp::now()),
        observed_generation: None,
    }
}

/// For each field manager of the status subresource, the status keys it owns (conditions as
/// `conditions/<type>`).
fn owners(object: &impl kube::Resource) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for entry in object.meta().managed_fields.iter().flatten() {
        if entry.subresource.as_deref() != Some("status") {
            continue;
        }
        let manager = entry.manager.clone().unwrap_or_default();
        let fields = entry.fields_v1.as_ref().map(|f| &f.0);
        let Some(status) = fields
            .and_then(|f| f.get("f:status"))
            .and_then(Value::as_object)
        else {
            continue;
        };
        for (key, value) in status {
            let Some(field) = key.strip_prefix("f:") else {
                continue;
            };
            if field == "conditions" {
                for item in value.as_object().into_iter().flatten().map(|(k, _)| k) {
                    let Some(keyed) = item.strip_prefix("k:") else {
                        continue;
                    };
                    let keyed: Value = serde_json::from_str(keyed).expect("list-map key");
                    out.entry(manager.clone())
                        .or_default()
                        .insert(format!("conditions/{}", keyed["type"].as_str().unwrap()));
                }
            } else {
                out.entry(manager.clone())
                    .or_default()
                    .insert(field.to_owned());
            }
        }
    }
    out
}

fn assert_disjoint(owners: &BTreeMap<String, BTreeSet<String>>) {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (manager, fields) in owners {
        for field in fields {
            if let Some(other) = seen.insert(field, manager) {
                panic!("{field} is owned by both {other} and {manager}: {owners:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_status_field_has_one_writer_and_no_writer_clobbers_another() {
    let (env, ns) = support::plane("status").await;
    let machines: Api<TalosMachine> = Api::namespaced(env.client(), &ns);
    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);

    let created = machines
        .create(
            &PostParams::default(),
            &TalosMachine::test("m1")
                .namespace(&ns)
                .cluster("c1")
                .build(),
        )
        .await
        .expect("create machine");

    let first = TalosMachineStatus {
        lifecycle: ichor_api::machine::MachineLifecycle {
            phase: MachinePhase::Approved,
            ..Default::default()
        },
        ..Default::default()
    };
    status::write(&machines, &created, &first)
        .await
        .expect("first write");
    let before = machines.get("m1").await.expect("get");

    // The lifecycle writes its phase, a condition and a drift intent.
    let mut lifecycle = first.clone();
    lifecycle.lifecycle.phase = MachinePhase::Joining;
    lifecycle.conditions = vec![condition(conditions::READY, false)];
    lifecycle.drift.reboot = Some("sha256:aaaa".to_owned());
    status::write(&machines, &before, &lifecycle)
        .await
        .expect("lifecycle write");

    // Discovery, holding the copy from before that write, records the address and a changed
    // fingerprint: only its own group goes out, so the lifecycle's fields stand.
    let mut seen = before.status.clone().unwrap_or_default();
    seen.inventory.address = Some("10.0.0.7".to_owned());
    seen.conditions
        .push(condition(conditions::FINGERPRINT_CHANGED, true));
    status::write(&machines, &before, &seen)
        .await
        .expect("inventory write");

    let now = machines.get("m1").await.expect("get");
    let s = now.status.clone().expect("status");
    assert_eq!(
        s.lifecycle.phase,
        MachinePhase::Joining,
        "the stale copy left the phase"
    );
    assert_eq!(s.drift.reboot.as_deref(), Some("sha256:aaaa"));
    assert_eq!(s.inventory.address.as_deref(), Some("10.0.0.7"));
    let types: BTreeSet<_> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        BTreeSet::from([conditions::READY, conditions::FINGERPRINT_CHANGED]),
        "conditions merge by type"
    );

    // A merge clears one field of one group; the rest of the status is untouched.
    status::merge(&machines, "m1", &json!({"driftReboot": null}))
        .await
        .expect("merge");
    let now = machines.get("m1").await.expect("get");
    let s = now.status.clone().expect("status");
    assert_eq!(s.drift.reboot, None, "the intent is cleared");
    assert_eq!(s.lifecycle.phase, MachinePhase::Joining);
    assert_eq!(s.inventory.address.as_deref(), Some("10.0.0.7"));

    let owned = owners(&now);
    assert_disjoint(&owned);
    assert_eq!(
        owned.get(fm::MACHINE_LIFECYCLE),
        Some(&BTreeSet::from([
            "phase".to_owned(),
            format!("conditions/{}", conditions::READY),
        ])),
        "{owned:?}"
    );
    assert_eq!(
        owned.get(fm::MACHINE_INVENTORY),
        Some(&BTreeSet::from([
            "address".to_owned(),
            format!("conditions/{}", conditions::FINGERPRINT_CHANGED),
        ])),
        "{owned:?}"
    );
    assert!(
        !owned.contains_key(fm::MACHINE_DRIFT),
        "a cleared group owns nothing: {owned:?}"
    );

    // Read-modify-write on a stale version is refused: the tombstones writer retries on a
    // fresh copy instead of dropping another writer's entry.
    let cluster = clusters
        .create(
            &PostParams::default(),
            &TalosCluster::test("c1").namespace(&ns).build(),
        )
        .await
        .expect("create cluster");
    let stone = |address: &str| Tombstone {
        machine: "m".to_owned(),
        address: address.to_owned(),
        etcd_member_id: None,
        uuid: None,
        removed_at: Time(Timestamp::now()),
    };
    let mut first = cluster.status.clone().unwrap_or_default();
    // The machine's SMBIOS UUID rides along (ADR 0052): kept by the schema, not pruned.
    let uuid = "5a1a0000-0000-4000-8000-000000000008";
    first.tombstones.list = vec![Tombstone {
        uuid: Some(uuid.to_owned()),
        ..stone("10.0.0.8")
    }];
    status::write_checked(&clusters, &cluster, &first)
        .await
        .expect("first write");
    let mut second = cluster.status.clone().unwrap_or_default();
    second.tombstones.list = vec![stone("10.0.0.9")];
    let refused = status::write_checked(&clusters, &cluster, &second).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.is_conflict()),
        "a stale read-modify-write is a conflict: {refused:?}"
    );
    let now = clusters.get("c1").await.expect("get cluster");
    let stones: Vec<_> = now
        .status
        .as_ref()
        .map(|s| {
            s.tombstones
                .list
                .iter()
                .map(|t| t.address.clone())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(stones, ["10.0.0.8"]);
    let kept = now.status.as_ref().and_then(|s| s.tombstones.list.first());
    assert_eq!(kept.and_then(|t| t.uuid.as_deref()), Some(uuid));
    assert_eq!(
        owners(&now).get(fm::CLUSTER_TOMBSTONES),
        Some(&BTreeSet::from(["tombstones".to_owned()])),
        "{:?}",
        owners(&now)
    );

    // The Node deletes a forced removal hands over are their own group's (ADR 0021): writing
    // them leaves the tombstones to theirs.
    let mut handed = now.status.clone().unwrap_or_default();
    handed.node_deletes.pending = vec![PendingNodeDelete {
        node: "w-1".to_owned(),
        machine: "m".to_owned(),
        since: Time(Timestamp::now()),
    }];
    status::write_checked(&clusters, &now, &handed)
        .await
        .expect("pending Node delete");
    let now = clusters.get("c1").await.expect("get cluster");
    let owned = owners(&now);
    assert_eq!(
        owned.get(fm::CLUSTER_NODE_DELETES),
        Some(&BTreeSet::from(["pendingNodeDeletes".to_owned()])),
        "{owned:?}"
    );
    assert_eq!(
        owned.get(fm::CLUSTER_TOMBSTONES),
        Some(&BTreeSet::from(["tombstones".to_owned()])),
        "{owned:?}"
    );
    assert_disjoint(&owned);

    // A status an earlier manager wrote by merge patch: the group that now owns the field
    // still clears it, because the update's ownership is dropped first.
    legacy_machine(&machines, &ns, "m2", "sha256:bbbb").await;
    status::merge(&machines, "m2", &json!({"driftReboot": null}))
        .await
        .expect("merge");
    let now = machines.get("m2").await.expect("get");
    let s = now.status.clone().expect("status");
    assert_eq!(
        s.drift.reboot, None,
        "cleared despite the earlier update: {:?}",
        now.metadata.managed_fields
    );
    assert_eq!(s.lifecycle.phase, MachinePhase::Joining, "the rest stands");
    assert_disjoint(&owners(&now));
    let _ = now.name_any();

    // The same from the manager's cache, whose copies keep only their status-update entries
    // (ADR 0039): the write reads the entries that stay from the object as stored, so the
    // other field managers keep what they own.
    let before = legacy_machine(&machines, &ns, "m3", "sha256:cccc").await;
    let mut cached = before.clone();
    status::slim(&mut cached);
    let kept: Vec<_> = cached.metadata.managed_fields.iter().flatten().collect();
    assert!(
        kept.len() < before.metadata.managed_fields.iter().flatten().count(),
        "slimmed: {kept:?}"
    );
    let mut wanted = cached.status.clone().expect("status");
    wanted.drift.reboot = None;
    status::write(&machines, &cached, &wanted)
        .await
        .expect("write from the slim copy");
    let now = machines.get("m3").await.expect("get");
    assert_eq!(now.status.clone().expect("status").drift.reboot, None);
    let managers: BTreeSet<String> = now
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|e| e.manager.clone())
        .collect();
    let creator = before
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|e| e.subresource.is_none())
        .and_then(|e| e.manager.clone())
        .expect("the creator's entry");
    assert!(managers.contains(&creator), "{managers:?}");
    assert_disjoint(&owners(&now));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operations_backup_key_survives_the_writes_of_its_progress() {
    use ichor_api::TalosOperation;
    use ichor_api::operation::{
        OperationAction, OperationPhase, OperationRun, TalosOperationStatus,
    };
    let (env, ns) = support::plane("status-op").await;
    let operations: Api<TalosOperation> = Api::namespaced(env.client(), &ns);
    let created = operations
        .create(
            &PostParams::default(),
            &TalosOperation::test("snap", OperationAction::EtcdSnapshot)
                .namespace(&ns)
                .cluster("c1")
                .all()
                .build(),
        )
        .await
        .expect("create");
    let running = TalosOperationStatus {
        run: ichor_api::operation::OperationRun {
            phase: OperationPhase::Running,
            ..Default::default()
        },
        ..Default::default()
    };
    status::write(&operations, &created, &running)
        .await
        .expect("running");
    status::merge(
        &operations,
        "snap",
        &json!({"backupKey": "ichor/a.snapshot"}),
    )
    .await
    .expect("the key");
    let done = TalosOperationStatus {
        run: OperationRun {
            phase: OperationPhase::Succeeded,
            ..running.run
        },
        ..running
    };
    let stale = operations.get("snap").await.expect("get");
    status::write(&operations, &created, &done)
        .await
        .expect("done, from a copy without the key");
    let after = operations.get("snap").await.expect("get");
    let status = after.status.clone().expect("status");
    assert_eq!(status.run.phase, OperationPhase::Succeeded);
    assert_eq!(
        status.backup.key.as_deref(),
        Some("ichor/a.snapshot"),
        "{:?} / before: {:?}",
        owners(&after),
        owners(&stale)
    );
    assert_disjoint(&owners(&after));
}

/// Creates machine `name` in cluster c1 whose status an earlier manager wrote by merge patch
/// (phase Joining, `driftReboot` = `drift`), and returns it as stored.
async fn legacy_machine(
    machines: &Api<TalosMachine>,
    ns: &str,
    name: &str,
    drift: &str,
) -> TalosMachine {
    machines
        .create(
            &PostParams::default(),
            &TalosMachine::test(name).namespace(ns).cluster("c1").build(),
        )
        .await
        .expect("create machine");
    machines
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Joining", "driftReboot": drift}})),
        )
        .await
        .expect("legacy merge")
}
