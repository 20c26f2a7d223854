//! Day-2 e2e on the sim target: real apiserver, the real `ichor-manager` and `ichor-webhook`
//! binaries, simulated Talos nodes. One test binary, a module per feature (a spec is named
//! `<module>::<spec>`):
//!
//! - `removal`: removal under manager kills, the failed leave and the force path, a removal
//!   while the workload API is down (it waits; forced, it skips the Node steps and the Node is
//!   deleted once the API is back);
//! - `teardown`: cluster teardown, and a TalosCluster deleted past a missing webhook that waits
//!   for its annotation (ADR 0052);
//! - `operations`: operations one node at a time, and a reset checked at the door that stops at
//!   the declared count;
//! - `drift`: drift that needs a reboot, drift that a node refuses (the rollout stops there) and
//!   its fix rolling out one machine at a time, a rollout resumed after a manager kill without a
//!   second apply;
//! - `etcd_health`: a replacement that counts once a voter, an unhealthy etcd member on a node
//!   that still answers;
//! - `identity`: a lost secrets bundle that is never regenerated, a replacement at a tombstoned
//!   address that is not reset (ADR 0052);
//! - `random`: a seeded random sequence;
//! - `versions`: a declared Talos version rolled out one node at a time, a rollback that stops
//!   it, a GitOps revert (ADR 0068); a class's schematic that reaches only the class's machines
//!   (ADR 0067); a declared upgrade that a PodDisruptionBudget stops at its drain until the
//!   budget allows it (ADR 0066);
//! - `unguarded`: a version change past a missing webhook, refused by the manager (ADR 0069);
//! - `kubelet`: a Node's reported kubelet version follows its node's kubelet image, as a real
//!   kubelet restarted with a new image reports;
//! - `kubernetes`: a declared Kubernetes version and its revert roll out in `talosctl
//!   upgrade-k8s`'s order (ADR 0070).
//!
//! A monitor watches etcd quorum (and how many nodes are down) every few milliseconds
//! throughout. The helpers more than one module uses are here; the others live with their specs.

use std::time::Duration;

use ichor_api::TalosOperation;
use ichor_api::names::conditions;
use ichor_api::operation::OperationPhase;
use ichor_harness::specs;
use ichor_harness::{SimTarget, Target};
use ichor_testenv::wait::try_eventually;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[path = "../support/mod.rs"]
mod support;

mod drift;
mod etcd_health;
mod identity;
mod kubelet;
mod kubernetes;
mod operations;
mod random;
mod removal;
mod teardown;
mod unguarded;
mod versions;

use support::cluster::{CLUSTER, state_summary};

/// Deletes the webhook's registration (a failed upgrade, a delete by mistake): once the
/// apiserver has seen it go, nothing checks a change at the door.
async fn unregister_webhook(target: &SimTarget) {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    Api::<ValidatingWebhookConfiguration>::all(target.client())
        .delete(
            ichor_api::admission::WEBHOOK_CONFIGURATION,
            &kube::api::DeleteParams::default(),
        )
        .await
        .expect("webhook registration removed");
}

/// The reason of the `RemovalApproved` condition of the machine at `address`.
async fn removal_reason(target: &SimTarget, address: &str) -> Option<String> {
    specs::machine_condition(target, address, conditions::REMOVAL_APPROVED)
        .await
        .map(|(_, reason, _)| reason)
}

/// The tombstones the cluster `cluster` records now.
async fn tombstones(target: &SimTarget, cluster: &str) -> Vec<ichor_api::cluster::Tombstone> {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get(cluster)
        .await
        .expect("cluster")
        .status
        .expect("status")
        .tombstones
        .list
}

/// Creates `operation`, which the webhook must refuse with `reason`; returns the refusal's
/// message.
async fn refused(target: &SimTarget, operation: impl Into<TalosOperation>, reason: &str) -> String {
    let operation: TalosOperation = operation.into();
    let name = operation.name_any();
    match specs::create_operation(target, operation).await {
        Err(ichor_harness::Error::Kube(kube::Error::Api(status))) => {
            assert_eq!(status.reason, reason, "{name}: {status:?}");
            assert!(
                status.message.contains("denied the request"),
                "{name}: {status:?}"
            );
            let operations: Api<TalosOperation> =
                Api::namespaced(target.client(), target.namespace());
            assert!(
                operations.get_opt(&name).await.expect("get").is_none(),
                "{name} was not created"
            );
            status.message
        }
        other => panic!("{name} should be refused with {reason}, got {other:?}"),
    }
}

/// The operation `name` once its `Succeeded` condition has `reason` or it has ended: its
/// status and that condition's (reason, message).
async fn operation_at(
    target: &SimTarget,
    name: &str,
    reason: &str,
    limit: Duration,
) -> (ichor_api::operation::TalosOperationStatus, String, String) {
    let operations: Api<TalosOperation> = Api::namespaced(target.client(), target.namespace());
    try_eventually(&format!("{name} at {reason}"), limit, || async {
        let status = operations
            .get(name)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::SUCCEEDED)
            .map(|c| (c.reason.clone(), c.message.clone()));
        match condition {
            Some((seen, message))
                if seen == reason
                    || matches!(
                        status.run.phase,
                        OperationPhase::Succeeded | OperationPhase::Failed
                    ) =>
            {
                Ok((status, seen, message))
            }
            other => Err(format!("{:?} {other:?}", status.run.phase)),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)))
}

/// Patches the cluster's `spec.drain` with `drain`.
async fn set_drain(target: &ichor_harness::SimTarget, drain: serde_json::Value) {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"drain": drain}})),
        )
        .await
        .expect("spec.drain");
}
