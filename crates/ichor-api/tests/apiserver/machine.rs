//! TalosMachine rules.

use serde_json::json;

use crate::support::{api, create_ok, machine, merge, merge_status, refused, setup};

#[tokio::test]
async fn a_discovered_machine_is_pending_by_default() {
    let (env, ns) = setup("tm-pending").await;
    let machines = api(&env, &ns, "TalosMachine");
    let created = create_ok(&machines, machine("m1", json!({}))).await;
    assert_eq!(created["spec"]["approvalState"], "pending");
}

#[tokio::test]
async fn approval_needs_a_role_a_pin_and_an_address() {
    let (env, ns) = setup("tm-approve").await;
    let machines = api(&env, &ns, "TalosMachine");
    refused(
        &machines,
        machine("m", json!({"approvalState": "approved"})),
        "an approved machine needs spec.role",
    )
    .await;
    refused(
        &machines,
        machine(
            "m",
            json!({"approvalState": "approved", "role": "worker", "fingerprint": null}),
        ),
        "an approved machine needs a pinned spec.fingerprint",
    )
    .await;
    refused(
        &machines,
        machine(
            "m",
            json!({"approvalState": "approved", "role": "worker", "endpoints": null}),
        ),
        "an approved machine needs at least one address",
    )
    .await;
    refused(
        &machines,
        machine("m", json!({"role": "master"})),
        "Unsupported value: \"master\"",
    )
    .await;
    refused(
        &machines,
        machine("m", json!({"approvalState": "yes"})),
        "Unsupported value: \"yes\"",
    )
    .await;
    refused(
        &machines,
        machine("m", json!({"fingerprint": "abc"})),
        "spec.fingerprint",
    )
    .await;
    refused(
        &machines,
        machine("m", json!({"endpoints": ["node-1"]})),
        "must be an IP address",
    )
    .await;
    create_ok(
        &machines,
        machine(
            "m",
            json!({"approvalState": "approved", "role": "controlplane"}),
        ),
    )
    .await;
}

#[tokio::test]
async fn cluster_ref_is_immutable() {
    let (env, ns) = setup("tm-ref").await;
    let machines = api(&env, &ns, "TalosMachine");
    create_ok(&machines, machine("m", json!({}))).await;
    let err = merge(
        &machines,
        "m",
        json!({"spec": {"clusterRef": {"name": "other"}}}),
    )
    .await
    .expect_err("clusterRef cannot change");
    assert!(err.contains("spec.clusterRef is immutable"), "{err}");
}

#[tokio::test]
async fn approval_and_role_lock_once_a_config_was_applied() {
    let (env, ns) = setup("tm-lock").await;
    let machines = api(&env, &ns, "TalosMachine");
    create_ok(
        &machines,
        machine("m", json!({"approvalState": "approved", "role": "worker"})),
    )
    .await;

    // Before anything is applied, a person may still change their mind.
    merge(&machines, "m", json!({"spec": {"role": "controlplane"}}))
        .await
        .expect("role changes before apply");

    merge_status(
        &machines,
        "m",
        json!({"status": {"phase": "Installing", "appliedConfigHash": "sha256:abc"}}),
    )
    .await;

    let err = merge(
        &machines,
        "m",
        json!({"spec": {"approvalState": "rejected"}}),
    )
    .await
    .expect_err("approval locked after apply");
    assert!(
        err.contains("cannot change once the machine's config was applied"),
        "{err}"
    );
    let err = merge(&machines, "m", json!({"spec": {"role": "worker"}}))
        .await
        .expect_err("role locked after apply");
    assert!(
        err.contains("cannot change once the machine's config was applied"),
        "{err}"
    );
    merge(&machines, "m", json!({"spec": {"hostname": "cp-1"}}))
        .await
        .expect("other fields still change");
}

#[tokio::test]
async fn kubectl_get_shows_cluster_role_approval_phase_address_talos_and_age() {
    let (env, ns) = setup("tm-columns").await;
    let machines = api(&env, &ns, "TalosMachine");
    create_ok(
        &machines,
        machine("m", json!({"approvalState": "approved", "role": "worker"})),
    )
    .await;
    merge_status(
        &machines,
        "m",
        json!({"status": {"phase": "Ready", "address": "192.168.10.21", "talosVersion": "v1.14.0"}}),
    )
    .await;
    // The table kubectl prints, as the apiserver renders it from the printer columns.
    let (columns, table) = crate::support::table(
        &env,
        &format!("/apis/ichor.maesh.dev/v1alpha1/namespaces/{ns}/talosmachines"),
    )
    .await;
    assert_eq!(
        columns,
        [
            "Name", "Cluster", "Role", "Approval", "Phase", "Address", "Talos", "Age"
        ]
    );
    let cells = &table["rows"][0]["cells"];
    assert_eq!(cells[1], "lab");
    assert_eq!(cells[2], "worker");
    assert_eq!(cells[3], "approved");
    assert_eq!(cells[4], "Ready");
    assert_eq!(cells[5], "192.168.10.21");
    assert_eq!(cells[6], "v1.14.0");
}

#[tokio::test]
async fn a_bmc_is_an_https_origin_with_exactly_one_trust() {
    let (env, ns) = setup("tm-bmc").await;
    let machines = api(&env, &ns, "TalosMachine");
    let with = |bmc: serde_json::Value| {
        let mut spec = json!({
            "address": "https://10.0.10.11",
            "credentialsSecretRef": {"name": "node-1-bmc"},
            "caSecretRef": {"name": "bmc-ca", "key": "ca.crt"}
        });
        crate::support::merge_json(&mut spec, bmc);
        machine("m", json!({ "bmc": spec }))
    };
    for address in [
        "http://10.0.10.11",
        "https://admin:secret@10.0.10.11",
        "https://10.0.10.11/redfish/v1",
        "10.0.10.11",
    ] {
        refused(
            &machines,
            with(json!({ "address": address })),
            "spec.bmc.address must be an https:// origin",
        )
        .await;
    }
    refused(
        &machines,
        with(json!({"insecureSkipVerify": true})),
        "spec.bmc needs exactly one of caSecretRef",
    )
    .await;
    refused(
        &machines,
        with(json!({"caSecretRef": null})),
        "spec.bmc needs exactly one of caSecretRef",
    )
    .await;
    refused(
        &machines,
        with(json!({"caSecretRef": null, "insecureSkipVerify": false})),
        "spec.bmc needs exactly one of caSecretRef",
    )
    .await;
    refused(
        &machines,
        with(json!({"credentialsSecretRef": null})),
        "credentialsSecretRef",
    )
    .await;
    create_ok(
        &machines,
        with(json!({"address": "https://bmc-1.lab:8443"})),
    )
    .await;
    create_ok(
        &machines,
        machine(
            "m2",
            json!({"bmc": {
                "address": "https://[fd00::11]",
                "credentialsSecretRef": {"name": "node-2-bmc"},
                "insecureSkipVerify": true,
                "systemId": "1"
            }}),
        ),
    )
    .await;
}
