//! The object of an admission review decodes into Ichor's kinds as the webhook's guard reads it.

use ichor_api::TalosMachine;
use ichor_api::decode::decode;
use kube::core::DynamicObject;
use serde_json::json;

fn object(spec: serde_json::Value, status: Option<serde_json::Value>) -> DynamicObject {
    let mut value = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosMachine",
        "metadata": {
            "name": "cp-1",
            "namespace": "lab",
            "uid": "u1",
            "managedFields": [{"manager": "ichor-manager", "operation": "Update"}],
        },
        "spec": spec,
    });
    if let Some(status) = status {
        value["status"] = status;
    }
    serde_json::from_value(value).expect("a DynamicObject")
}

#[test]
fn metadata_without_managed_fields_spec_and_status_come_through() {
    let raw = object(
        json!({"clusterRef": {"name": "lab"}, "endpoints": ["10.0.0.1"]}),
        Some(json!({"address": "10.0.0.1"})),
    );
    assert!(raw.metadata.managed_fields.is_some());
    let machine: TalosMachine = decode(raw).expect("decodes");
    assert_eq!(machine.metadata.name.as_deref(), Some("cp-1"));
    assert_eq!(machine.metadata.uid.as_deref(), Some("u1"));
    assert_eq!(machine.metadata.managed_fields, None);
    assert_eq!(machine.spec.cluster_ref.name, "lab");
    assert_eq!(machine.spec.endpoints, ["10.0.0.1"]);
    let status = machine.status.expect("a status");
    assert_eq!(status.inventory.address.as_deref(), Some("10.0.0.1"));
}

#[test]
fn no_status_decodes_as_none() {
    let machine: TalosMachine =
        decode(object(json!({"clusterRef": {"name": "lab"}}), None)).expect("decodes");
    assert_eq!(machine.status, None);
}

#[test]
fn a_malformed_spec_is_an_error() {
    let raw = object(json!({"clusterRef": {"name": "lab"}, "endpoints": 7}), None);
    assert!(decode::<TalosMachine>(raw).is_err());
    let raw = object(json!({"endpoints": []}), None);
    assert!(
        decode::<TalosMachine>(raw).is_err(),
        "a spec without its clusterRef"
    );
}
