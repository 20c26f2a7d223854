//! What the cluster's identity rests on: a lost secrets bundle is never regenerated (restored,
//! the cluster goes on with the same CA), and another board at a force-removed machine's
//! tombstoned address is not the machine removed, so it is not reset (ADR 0052).

use std::time::Duration;

use ichor_api::common::ConditionStatus;
use ichor_api::names::{conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, Target};
use ichor_sim::{Fault, Stage};
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};

use crate::support::cluster::{CLUSTER, force_removed, ready_target, state_summary};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_bundle_is_never_regenerated_and_restoring_it_resumes_work() {
    let target = ready_target(SimOptions::new(1, DAY2.net(11), "v1.14.1"), 1, 1, 0).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let fingerprint = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.core.bundle_fingerprint)
        .expect("the cluster recorded its bundle");
    let secrets: Api<Secret> = Api::namespaced(target.client(), target.namespace());
    let name = format!("{CLUSTER}-secrets");
    let saved = secrets.get(&name).await.expect("the bundle Secret");
    let node = target.nodes()[0].clone();
    let applies = node.config_applies();
    secrets
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete the bundle");
    let secrets_ready = |reason: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .get(CLUSTER)
                .await
                .ok()
                .and_then(|c| c.status)
                .and_then(|s| {
                    s.conditions
                        .into_iter()
                        .find(|c| c.type_ == conditions::SECRETS_READY)
                })
                .filter(|c| c.reason == reason)
                .map(|c| c.message)
        }
    };
    let lost = try_eventually(
        "the bundle reported lost",
        Duration::from_secs(60),
        || async {
            secrets_ready(reasons::SECRETS_BUNDLE_LOST)
                .await
                .is_some_and(|m| m.contains(&name))
        },
    )
    .await;
    if let Err(e) = lost {
        panic!("{e}: {}", specs::summary(&target).await);
    }
    // The manager had its chances to regenerate: it reconciled the cluster and the machine
    // again, and no Secret appeared, no node received anything.
    let seen = target
        .manager_reconciles("TalosCluster")
        .await
        .expect("metrics");
    try_eventually(
        "the manager reconciling after the loss",
        Duration::from_secs(60),
        || async {
            match target.manager_reconciles("TalosCluster").await {
                Ok(n) if n > seen + 2 => Ok(n),
                Ok(n) => Err(format!("{n} reconciles")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await
    .expect("reconciled");
    assert!(
        secrets.get_opt(&name).await.expect("read").is_none(),
        "no new bundle"
    );
    assert_eq!(node.config_applies(), applies, "no node received anything");
    specs::events_once(
        &target,
        reasons::SECRETS_BUNDLE_LOST,
        Duration::from_secs(30),
    )
    .await
    .expect("an Event names the loss");
    // Restored: the cluster comes back with the same CA.
    let mut restored = saved.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: saved.metadata.name.clone(),
        namespace: saved.metadata.namespace.clone(),
        labels: saved.metadata.labels.clone(),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &restored)
        .await
        .expect("restore the bundle");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(120)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    assert!(secrets_ready(reasons::BUNDLE_VALID).await.is_some());
    let after = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.core.bundle_fingerprint);
    assert_eq!(after.as_deref(), Some(fingerprint.as_str()), "the same CA");
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_at_a_tombstoned_address_is_not_reset() {
    use ichor_testenv::nets::TRUST;
    let target = ready_target(SimOptions::new(2, TRUST.net(1), "v1.14.1"), 1, 1, 1).await;
    let endpoints = target.node_endpoints();
    let worker = target.nodes()[1].clone();
    // The worker drops off the network and is force-removed: its reset is skipped, and a
    // tombstone records its address and SMBIOS UUID.
    worker.inject(Fault::Partition).await.expect("partition");
    let name = specs::machine_at(&target, &endpoints[1])
        .await
        .expect("the worker's machine")
        .metadata
        .name
        .expect("name");
    force_removed(&target, &name, &endpoints[1], Duration::from_secs(120)).await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let stones = crate::tombstones(&target, CLUSTER).await;
    assert_eq!(stones.len(), 1, "{stones:?}");
    assert_eq!(
        stones[0].uuid.as_deref(),
        Some(worker.hardware().uuid.as_str())
    );

    // Another machine takes the address, answering the cluster's credentials (the disks moved
    // into a new board): it is not the machine removed, so it is not reset.
    let replacement = "5a1a0000-0000-4000-8000-0000000000ee";
    worker.replace_board(replacement).await.expect("new board");
    worker.inject(Fault::Heal).await.expect("heal");
    let refused = || async {
        let status = clusters.get(CLUSTER).await.ok()?.status?;
        status
            .conditions
            .into_iter()
            .find(|c| c.type_ == conditions::NODE_IDENTITY_VERIFIED)
            .filter(|c| c.status == ConditionStatus::False)
            .map(|c| (c.reason, c.message, status.tombstones.list.len()))
    };
    try_eventually(
        "the replacement refused",
        Duration::from_secs(60),
        || async { refused().await.is_some() },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let (reason, message, stones) = refused().await.expect("condition");
    assert_eq!(reason, reasons::NODE_IDENTITY_MISMATCH);
    assert!(message.contains(replacement), "{message}");
    assert_eq!(stones, 1, "the tombstone stays for the machine removed");
    specs::events_once(
        &target,
        reasons::NODE_IDENTITY_MISMATCH,
        Duration::from_secs(30),
    )
    .await
    .expect("the Event");
    assert_eq!(worker.calls("Reset"), 0, "the replacement was not reset");
    assert_ne!(worker.stage().await, Stage::Maintenance);
    target.down().await;
}
