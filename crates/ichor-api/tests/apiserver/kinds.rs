//! TalosOperation, TalosStorage and TalosMachineClass rules.

use serde_json::{Value, json};

use crate::support::{api, create_ok, merge, refused, setup};

fn operation(spec: Value) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosOperation",
        "metadata": {"name": "op"}, "spec": spec
    })
}

#[tokio::test]
async fn operations_name_one_target_and_the_settings_of_their_action() {
    let (env, ns) = setup("top").await;
    let ops = api(&env, &ns, "TalosOperation");
    let cluster = json!({"name": "lab"});
    refused(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "reboot"})),
        "set exactly one of spec.machineName and spec.selector",
    )
    .await;
    refused(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "reboot", "machineName": "m", "selector": {"matchLabels": {"a": "b"}}})),
        "set exactly one of spec.machineName and spec.selector",
    )
    .await;
    // Versions are declared on the TalosCluster (ADR 0068): the operations that changed them
    // are refused, naming the field to change instead.
    refused(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "upgrade", "machineName": "m", "upgrade": {"image": "x"}})),
        "declare the Talos version in the TalosCluster's spec.talosVersion",
    )
    .await;
    refused(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "upgradeKubernetes", "machineName": "m", "upgradeKubernetes": {"version": "1.36.4"}})),
        "declare the Kubernetes version in the TalosCluster's spec.kubernetesVersion",
    )
    .await;
    refused(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "reboot", "machineName": "m", "upgrade": {"image": "x"}})),
        "spec.upgrade is only for action upgrade",
    )
    .await;
    refused(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "shutdown", "machineName": "m"})),
        "Unsupported value: \"shutdown\"",
    )
    .await;
    create_ok(
        &ops,
        operation(json!({"clusterRef": cluster, "action": "reboot", "machineName": "m"})),
    )
    .await;
    let err = merge(&ops, "op", json!({"spec": {"action": "reset"}}))
        .await
        .expect_err("an operation's spec is immutable");
    assert!(err.contains("spec is immutable"), "{err}");
}

fn storage(volumes: Value) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosStorage",
        "metadata": {"name": "s"},
        "spec": {"clusterRef": {"name": "lab"}, "volumes": volumes}
    })
}

#[tokio::test]
async fn storage_volumes_have_unique_names_and_ordered_sizes() {
    let (env, ns) = setup("tst").await;
    let storages = api(&env, &ns, "TalosStorage");
    let vol = |name: &str, min: &str, max: &str| json!({"name": name, "diskSelector": "!system_disk", "minSize": min, "maxSize": max});
    refused(
        &storages,
        storage(json!([
            vol("data", "10Gi", "20Gi"),
            vol("data", "1Gi", "2Gi")
        ])),
        // Volumes are a list-map keyed by name: the apiserver refuses a duplicate key.
        "Duplicate value",
    )
    .await;
    refused(
        &storages,
        storage(json!([{"name": "data", "diskSelector": "!system_disk"}])),
        "set minSize or maxSize",
    )
    .await;
    refused(
        &storages,
        storage(json!([vol("data", "20Gi", "10Gi")])),
        "minSize must not exceed maxSize",
    )
    .await;
    refused(
        &storages,
        storage(json!([vol("data", "lots", "20Gi")])),
        "minSize must be a quantity",
    )
    .await;
    refused(
        &storages,
        storage(json!([vol("Data_1", "1Gi", "2Gi")])),
        "spec.volumes[0].name",
    )
    .await;
    refused(
        &storages,
        storage(json!([])),
        "should have at least 1 items",
    )
    .await;
    create_ok(
        &storages,
        storage(json!([
            vol("data", "10Gi", "20Gi"),
            vol("logs", "1Gi", "2Gi")
        ])),
    )
    .await;
    // A volume may grow, never shrink (Talos never shrinks a partition).
    let shrink = merge(
        &storages,
        "s",
        json!({"spec": {"volumes": [vol("data", "10Gi", "15Gi"), vol("logs", "1Gi", "2Gi")]}}),
    )
    .await
    .expect_err("a shrink");
    assert!(shrink.contains("a volume cannot shrink"), "{shrink}");
    merge(
        &storages,
        "s",
        json!({"spec": {"volumes": [vol("data", "10Gi", "40Gi"), vol("logs", "1Gi", "2Gi"), vol("new", "1Gi", "2Gi")]}}),
    )
    .await
    .expect("growth and a new volume");
}

fn class(qualifiers: Value) -> Value {
    json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachineClass",
        "metadata": {"name": "k"},
        "spec": {"clusterRef": {"name": "lab"}, "role": "worker", "qualifiers": qualifiers}
    })
}

#[tokio::test]
async fn machine_classes_need_a_valid_qualifier() {
    let (env, ns) = setup("tmc").await;
    let classes = api(&env, &ns, "TalosMachineClass");
    refused(&classes, class(json!({})), "set at least one qualifier").await;
    refused(
        &classes,
        class(json!({"macAddresses": ["52-54-00-12-34-56"]})),
        "macAddresses must be lowercase colon-separated",
    )
    .await;
    refused(
        &classes,
        class(json!({"cidrs": ["10.0.0.0/33"]})),
        "each qualifier CIDR must be in CIDR notation",
    )
    .await;
    refused(
        &classes,
        class(json!({"minDiskSize": "big"})),
        "minDiskSize must be a quantity",
    )
    .await;
    refused(
        &classes,
        class(json!({"talosVersions": ["1.14"]})),
        "talosVersions entries must look like v1, v1.14 or v1.14.1",
    )
    .await;
    refused(
        &classes,
        class(json!({"diskTypes": ["floppy"]})),
        "spec.qualifiers.diskTypes[0]",
    )
    .await;
    create_ok(
        &classes,
        class(json!({"macAddresses": ["52:54:00:12:34:56"], "minDiskSize": "100Gi"})),
    )
    .await;
    let mut other = class(
        json!({"diskModels": ["Samsung*"], "diskTypes": ["nvme"], "talosVersions": ["v1.14"]}),
    );
    other["metadata"]["name"] = json!("k2");
    other["spec"]["maxMachines"] = json!(3);
    create_ok(&classes, other).await;
}
