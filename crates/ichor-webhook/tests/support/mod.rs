//! AdmissionReview bodies as the apiserver sends them, shared by the webhook's tests.

use serde_json::{Value, json};

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
