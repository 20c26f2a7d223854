//! Status writes against a real apiserver: one field manager per group of fields, conditions
//! as a list-map keyed by type, a writer with a stale copy never clobbers another's fields,
//! and a read-modify-write on a stale version is refused. Beside them, the cache of Ichor's
//! Secrets (ADR 0059): a Secret kept while unchanged, read again once it changed.

mod support;

use std::collections::{BTreeMap, BTreeSet};

use ichor_api::cluster::{ClusterNodeDeletes, ClusterTombstones, PendingNodeDelete, Tombstone};
use ichor_api::common::{Condition, ConditionStatus};
use ichor_api::machine::{
    MachineDrift, MachineInventory, MachineLifecycle, MachinePhase, TalosMachineStatus,
};
use ichor_api::names::{conditions, field_managers as fm};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_manager::infra::status::{self, Guard};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use serde_json::Value;

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
    status::apply::<MachineLifecycle, _>(&machines, &created, &first, Guard::None)
        .await
        .expect("first write");
    let before = machines.get("m1").await.expect("get");

    // The lifecycle writes its phase, a condition and a drift intent.
    let mut lifecycle = first.clone();
    lifecycle.lifecycle.phase = MachinePhase::Joining;
    lifecycle.conditions = vec![condition(conditions::READY, false)];
    lifecycle.drift.reboot = Some("sha256:aaaa".to_owned());
    status::apply::<MachineLifecycle, _>(&machines, &before, &lifecycle, Guard::None)
        .await
        .expect("lifecycle write");
    status::apply::<MachineDrift, _>(&machines, &before, &lifecycle, Guard::None)
        .await
        .expect("drift write");

    // Discovery, holding the copy from before that write, records the address and a changed
    // fingerprint: only its own group goes out, so the lifecycle's fields stand.
    let mut seen = before.status.clone().unwrap_or_default();
    seen.inventory.address = Some("10.0.0.7".to_owned());
    seen.conditions
        .push(condition(conditions::FINGERPRINT_CHANGED, true));
    status::apply::<MachineInventory, _>(&machines, &before, &seen, Guard::None)
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

    // A group clears one field of its own; the rest of the status is untouched.
    let fresh = machines.get("m1").await.expect("get");
    let mut cleared = fresh.status.clone().unwrap_or_default();
    cleared.drift.reboot = None;
    status::apply::<MachineDrift, _>(&machines, &fresh, &cleared, Guard::None)
        .await
        .expect("clear");
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

    // A look's writes one after another go on the copy the last one stored (`status::send`),
    // checked against its version: the next write needs no read, a copy another write has
    // overtaken is refused even when it holds the change already (nothing is skipped on it),
    // and the refusal is a conflict, which the writer retries on a fresh copy.
    let mut next = now.status.clone().unwrap_or_default();
    next.drift.reboot = Some("sha256:bbbb".to_owned());
    let stored = status::send::<MachineDrift, _>(&machines, &now, &next, Guard::Version)
        .await
        .expect("a write on the copy just read");
    assert_eq!(
        stored
            .status
            .as_ref()
            .and_then(|s| s.drift.reboot.as_deref()),
        Some("sha256:bbbb"),
        "the object as stored comes back"
    );
    let mut after = stored.status.clone().unwrap_or_default();
    after.drift.boot_id = Some("boot-2".to_owned());
    let stored = status::send::<MachineDrift, _>(&machines, &stored, &after, Guard::Version)
        .await
        .expect("the next write on the copy the last stored");
    let refused = status::send::<MachineDrift, _>(&machines, &now, &next, Guard::Version).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.is_conflict()),
        "an overtaken copy that holds the change already is refused, not skipped: {refused:?}"
    );
    let unchanged = status::send::<MachineDrift, _>(&machines, &stored, &after, Guard::Version)
        .await
        .expect("the current copy, unchanged, is sent and accepted");
    assert_eq!(
        unchanged.metadata.resource_version, stored.metadata.resource_version,
        "a write that changes nothing stores nothing"
    );
    let now = machines.get("m1").await.expect("get");
    let s = now.status.clone().expect("status");
    assert_eq!(s.drift.reboot.as_deref(), Some("sha256:bbbb"));
    assert_eq!(s.drift.boot_id.as_deref(), Some("boot-2"));
    assert_eq!(s.lifecycle.phase, MachinePhase::Joining);

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
    status::apply::<ClusterTombstones, _>(&clusters, &cluster, &first, Guard::Version)
        .await
        .expect("first write");
    let mut second = cluster.status.clone().unwrap_or_default();
    second.tombstones.list = vec![stone("10.0.0.9")];
    let refused =
        status::apply::<ClusterTombstones, _>(&clusters, &cluster, &second, Guard::Version).await;
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
    status::apply::<ClusterNodeDeletes, _>(&clusters, &now, &handed, Guard::Version)
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operations_backup_key_survives_the_writes_of_its_progress() {
    use ichor_api::TalosOperation;
    use ichor_api::operation::{
        OperationAction, OperationBackup, OperationPhase, OperationRun, TalosOperationStatus,
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
    status::apply::<OperationRun, _>(&operations, &created, &running, Guard::None)
        .await
        .expect("running");
    let fresh = operations.get("snap").await.expect("get");
    let mut keyed = fresh.status.clone().unwrap_or_default();
    keyed.backup.key = Some("ichor/a.snapshot".to_owned());
    status::apply::<OperationBackup, _>(&operations, &fresh, &keyed, Guard::None)
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
    status::apply::<OperationRun, _>(&operations, &created, &done, Guard::None)
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

/// A client whose every request fails: what a read through it returns was kept, not read.
fn nowhere() -> kube::Client {
    kube::Client::try_from(kube::Config::new(
        "http://127.0.0.1:9".parse().expect("url"),
    ))
    .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_secret_is_read_again_once_it_changed_and_a_foreign_one_is_never_kept() {
    use std::time::Duration;

    use ichor_api::names::labels;
    use ichor_manager::secrets::Cache;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;

    let (env, ns) = support::plane("secret-cache").await;
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    let unreachable: Api<Secret> = Api::namespaced(nowhere(), &ns);
    let secret = |name: &str, ours: bool, value: &str| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: ours.then(|| {
                BTreeMap::from([(
                    labels::MANAGED_BY.to_owned(),
                    labels::MANAGED_BY_VALUE.to_owned(),
                )])
            }),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "k".to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Secret::default()
    };
    let value = |found: Option<Secret>| {
        found.and_then(|s| s.data).and_then(|d| {
            d.get("k")
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        })
    };
    let cache = Cache::default();
    tokio::spawn(cache.watch(&env.client()).expect("the watch"));
    secrets
        .create(&PostParams::default(), &secret("ours", true, "one"))
        .await
        .expect("ours");
    secrets
        .create(&PostParams::default(), &secret("theirs", false, "one"))
        .await
        .expect("theirs");

    // Read once the watch has seen it; then kept: a read that reaches nothing still answers.
    let read = ichor_testenv::wait::try_eventually(
        "the watched Secret read and kept",
        Duration::from_secs(30),
        || async {
            cache.get(&secrets, &ns, "ours").await.ok()?;
            cache.get(&unreachable, &ns, "ours").await.ok()
        },
    )
    .await
    .expect("kept");
    assert_eq!(value(read).as_deref(), Some("one"));

    // Changed: read again (the kept copy is not answered once the watch saw the change).
    let mut changed = secrets.get("ours").await.expect("ours");
    changed.data = secret("ours", true, "two").data;
    secrets
        .replace("ours", &PostParams::default(), &changed)
        .await
        .expect("changed");
    let now = ichor_testenv::wait::try_eventually(
        "the changed Secret read again",
        Duration::from_secs(30),
        || async {
            let found = value(cache.get(&secrets, &ns, "ours").await.ok()?);
            (found.as_deref() == Some("two")).then_some(found)
        },
    )
    .await
    .expect("read again");
    assert_eq!(now.as_deref(), Some("two"));
    assert_eq!(
        value(
            cache
                .get(&unreachable, &ns, "ours")
                .await
                .expect("kept again")
        )
        .as_deref(),
        Some("two")
    );

    // A Secret that is not Ichor's is not watched, so never kept: every read goes out.
    assert_eq!(
        value(cache.get(&secrets, &ns, "theirs").await.expect("theirs")).as_deref(),
        Some("one")
    );
    assert!(
        cache.get(&unreachable, &ns, "theirs").await.is_err(),
        "a foreign Secret is read every time"
    );

    // Forgotten (about to be written): read again.
    cache.forget(&ns, "ours");
    assert!(cache.get(&unreachable, &ns, "ours").await.is_err());
}
