//! What the webhook's tests share: AdmissionReview bodies as the apiserver sends them, and
//! Ichor's objects created in a test namespace as the manager would leave them.
// Each test uses part of it.
#![allow(dead_code)]

use ichor_api::common::Role;
use ichor_api::testing::MachineBuilder;
use ichor_testenv::TestEnv;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Ichor's objects of `kind` in the namespace `ns`, untyped (as the apiserver stores them).
pub fn api(env: &TestEnv, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(ichor_api::GROUP, ichor_api::VERSION, kind);
    Api::namespaced_with(env.client(), ns, &ApiResource::from_gvk(&gvk))
}

/// Creates `machine` with the removal finalizer the manager would add; `applied` records, as
/// the manager does after an apply, a config hash and (for a control plane) a healthy etcd
/// voter observed now (the webhook counts a voter never observed, or observed too long ago, as
/// unhealthy). Returns the stored object.
pub async fn create_machine(
    env: &TestEnv,
    ns: &str,
    machine: MachineBuilder,
    applied: bool,
) -> DynamicObject {
    let machines = api(env, ns, "TalosMachine");
    let machine = machine.removal_finalizer().build();
    let name = machine.metadata.name.clone().expect("a name");
    let object: DynamicObject =
        serde_json::from_value(serde_json::to_value(&machine).expect("json")).expect("machine");
    let created = machines
        .create(&PostParams::default(), &object)
        .await
        .expect("create machine");
    if !applied {
        return created;
    }
    let etcd = (machine.spec.role == Some(Role::ControlPlane)).then(
        || json!({"voter": true, "healthy": true, "observedAt": Timestamp::now().to_string()}),
    );
    machines
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"appliedConfigHash": "sha256:0123", "etcd": etcd}})),
        )
        .await
        .expect("status")
}

/// An `admission.k8s.io/v1` AdmissionReview of `operation` on the TalosMachine `name` in
/// `namespace`, with `old` as `oldObject` (deletes and updates carry one).
pub fn machine_review(
    uid: &str,
    operation: &str,
    name: &str,
    namespace: &str,
    old: Option<Value>,
) -> Value {
    let mut request = json!({
        "uid": uid,
        "kind": {"group": "ichor.maesh.dev", "version": "v1alpha1", "kind": "TalosMachine"},
        "resource": {"group": "ichor.maesh.dev", "version": "v1alpha1", "resource": "talosmachines"},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "someone"},
        "dryRun": false
    });
    if let Some(old) = old {
        request["oldObject"] = old;
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    })
}
