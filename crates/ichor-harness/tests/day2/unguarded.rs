//! Declared versions past a missing webhook (ADR 0069): the manager holds the version rules
//! itself. A Kubernetes minor downgrade that reached the store is refused on the cluster,
//! naming the field, with a Warning Event; no node is touched, and the machines keep rendering
//! with the versions accepted before. Declaring an allowed version again clears it.

use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::common::ConditionStatus;
use ichor_api::names::{conditions, reasons};
use ichor_harness::{SimOptions, SimTarget, Target, specs};
use ichor_testenv::nets::DAY2_UNGUARDED;
use ichor_testenv::wait::try_eventually;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::cluster::{CLUSTER, ready_target, state_summary};

/// The cluster's `VersionRolledOut` condition: status, reason, message.
async fn version_condition(target: &SimTarget) -> Option<(ConditionStatus, String, String)> {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .ok()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == conditions::VERSION_ROLLED_OUT)
        .map(|c| (c.status, c.reason, c.message))
}

/// Every machine's applied config hash, by name.
async fn hashes(target: &SimTarget) -> Vec<(String, Option<String>)> {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    let mut all: Vec<_> = machines
        .list(&Default::default())
        .await
        .expect("machines")
        .items
        .into_iter()
        .map(|m| {
            let hash = m
                .status
                .as_ref()
                .and_then(|s| s.applied.config_hash.clone());
            (m.name_any(), hash)
        })
        .collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_change_past_a_missing_webhook_is_refused_by_the_manager_and_touches_no_node() {
    let target = ready_target(
        SimOptions::new(2, DAY2_UNGUARDED.net(0), "v1.14.1"),
        2,
        1,
        1,
    )
    .await;
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    // The cluster reached what it declares: those versions are accepted.
    try_eventually("the versions accepted", Duration::from_secs(60), || async {
        let status = clusters.get(CLUSTER).await.ok()?.status?;
        let accepted = status.core.accepted_versions?;
        (accepted.talos_version == "v1.14.1" && accepted.kubernetes_version == "1.36.3")
            .then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let before = hashes(&target).await;
    let applies: Vec<usize> = target
        .nodes()
        .iter()
        .map(|n| n.calls("ApplyConfiguration"))
        .collect();

    let looks: Vec<usize> = target.nodes().iter().map(|n| n.calls("Version")).collect();
    // The webhook's registration removed: nothing checks the change at the door once the
    // apiserver has seen it go, so a minor downgrade reaches the store.
    crate::unregister_webhook(&target).await;
    try_eventually(
        "the downgrade admitted past the door",
        Duration::from_secs(30),
        || async {
            clusters
                .patch(
                    CLUSTER,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"kubernetesVersion": "1.35.2"}})),
                )
                .await
                .is_ok()
        },
    )
    .await
    .expect("admitted");

    // Refused on the cluster, naming the field and what the nodes stay at.
    try_eventually("the manager's refusal", Duration::from_secs(60), || async {
        version_condition(&target)
            .await
            .filter(|(_, reason, _)| reason == reasons::VERSION_CHANGE_REFUSED)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    let (status, _, message) = version_condition(&target).await.expect("condition");
    assert_eq!(status, ConditionStatus::False, "{}", state_summary(&target));
    assert!(
        message.starts_with("spec.kubernetesVersion 1.35.2 is a minor downgrade from 1.36.3")
            && message.ends_with("the nodes stay at Talos v1.14.1 and Kubernetes 1.36.3"),
        "{message}: {}",
        state_summary(&target)
    );
    specs::events_once(
        &target,
        reasons::VERSION_CHANGE_REFUSED,
        Duration::from_secs(30),
    )
    .await
    .unwrap_or_else(|e| panic!("the Warning Event: {e}: {}", state_summary(&target)));
    let accepted = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.core.accepted_versions)
        .expect("accepted versions");
    assert_eq!(accepted.kubernetes_version, "1.36.3", "kept");

    // Every machine looked twice since the change (the change woke them, and so did the
    // refusal; a look in flight when the change arrived counts once at most): each still
    // renders the config it runs, so nothing was applied.
    try_eventually(
        "every machine looked again",
        Duration::from_secs(90),
        || async {
            let now: Vec<usize> = target.nodes().iter().map(|n| n.calls("Version")).collect();
            if now
                .iter()
                .zip(&looks)
                .all(|(now, before)| *now >= before + 2)
            {
                Ok(())
            } else {
                Err(format!("Version calls {looks:?} then {now:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    assert_eq!(
        hashes(&target).await,
        before,
        "no config changed: {}",
        state_summary(&target)
    );
    let now: Vec<usize> = target
        .nodes()
        .iter()
        .map(|n| n.calls("ApplyConfiguration"))
        .collect();
    assert_eq!(
        now,
        applies,
        "no node received a config: {}",
        state_summary(&target)
    );

    // Declared back, as a revert does: the refusal clears.
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubernetesVersion": "1.36.3"}})),
        )
        .await
        .expect("reverted");
    try_eventually("the refusal cleared", Duration::from_secs(60), || async {
        version_condition(&target)
            .await
            .filter(|(status, reason, _)| {
                *status == ConditionStatus::True && reason == reasons::VERSION_CURRENT
            })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    assert_eq!(
        hashes(&target).await,
        before,
        "still no config changed: {}",
        state_summary(&target)
    );
}
