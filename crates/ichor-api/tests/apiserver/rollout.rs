//! `spec.rollout`: what the apiserver refuses of a health gate and a fresh backup.

use serde_json::json;

use crate::support::{api, cluster, create_ok, refused, setup};

fn gate(name: &str, api_version: &str, kind: &str) -> serde_json::Value {
    json!({"name": name, "apiVersion": api_version, "kind": kind, "expression": "true"})
}

#[tokio::test]
async fn a_window_is_five_cron_fields_in_a_zone_named_as_iana_names_them() {
    let (env, ns) = setup("tc-windows").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |schedule: &str, zone: &str| {
        cluster(
            "c",
            json!({"rollout": {"maintenanceWindows": [
                {"schedule": schedule, "duration": "4h", "timeZone": zone}
            ]}}),
        )
    };
    for schedule in ["0 0 22 * * *", "0  22 * * *", "0 22 * *  "] {
        refused(&clusters, with(schedule, "UTC"), "schedule").await;
    }
    for zone in ["Europe Berlin", "/Europe", "Europe/Berlin/x/y"] {
        refused(&clusters, with("0 22 * * *", zone), "timeZone").await;
    }
    let created = create_ok(
        &clusters,
        with("0 22 * * 1-5", "America/Argentina/Buenos_Aires"),
    )
    .await;
    assert_eq!(
        created["spec"]["rollout"]["maintenanceWindows"][0]["schedule"],
        "0 22 * * 1-5"
    );
}

#[tokio::test]
async fn a_health_gate_never_reads_a_secret_and_a_fresh_backup_needs_a_store() {
    let (env, ns) = setup("tc-rollout").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |rollout: serde_json::Value| cluster("c", json!({ "rollout": rollout }));
    refused(
        &clusters,
        with(json!({"healthGates": [gate("keys", "v1", "Secret")]})),
        "a health gate never reads a Secret",
    )
    .await;
    refused(
        &clusters,
        with(json!({"healthGates": [gate("a", "apps/v1", "Deployment"), gate("a", "v1", "Pod")]})),
        "healthGates[].name must be unique",
    )
    .await;
    refused(
        &clusters,
        with(json!({"healthGates": [gate("Not_A_Name", "apps/v1", "Deployment")]})),
        "name",
    )
    .await;
    refused(
        &clusters,
        with(json!({"freshBackup": {"maxAge": "1h"}})),
        "rollout.freshBackup needs spec.backup",
    )
    .await;
    let store = json!({
        "endpoint": "https://s3.example.com",
        "bucket": "etcd-backups",
        "credentialsSecretRef": {"name": "s3"}
    });
    refused(
        &clusters,
        cluster(
            "c",
            json!({"backup": {"schedule": "@every 1h", "store": store},
                   "rollout": {"freshBackup": {"maxAge": "30s"}}}),
        ),
        "freshBackup.maxAge must be a duration from 1m to 720h",
    )
    .await;
    let created = create_ok(
        &clusters,
        cluster(
            "c",
            json!({"backup": {"schedule": "@every 1h", "store": store},
                   "rollout": {"freshBackup": {"maxAge": "1h"},
                               "healthGates": [gate("shop", "apps/v1", "Deployment"),
                                               gate("pods", "v1", "Pod")]}}),
        ),
    )
    .await;
    assert_eq!(created["spec"]["rollout"]["healthGates"][1]["kind"], "Pod");
}

#[tokio::test]
async fn a_class_declares_a_rollout_policy_for_its_machines_under_the_same_rules() {
    let (env, ns) = setup("tmc-rollout").await;
    let classes = api(&env, &ns, "TalosMachineClass");
    let class = |rollout: serde_json::Value| {
        json!({
            "apiVersion": "ichor.maesh.dev/v1alpha1", "kind": "TalosMachineClass",
            "metadata": {"name": "gpu"},
            "spec": {"clusterRef": {"name": "lab"}, "role": "worker",
                     "qualifiers": {"cidrs": ["10.0.0.0/24"]}, "rollout": rollout}
        })
    };
    refused(
        &classes,
        class(json!({"healthGates": [gate("keys", "v1", "Secret")]})),
        "a health gate never reads a Secret",
    )
    .await;
    refused(
        &classes,
        class(json!({"maintenanceWindows": [{"schedule": "0 0 22 * * *", "duration": "4h"}]})),
        "schedule",
    )
    .await;
    let created = create_ok(
        &classes,
        class(
            json!({"maintenanceWindows": [{"schedule": "0 2 * * 6", "duration": "6h"}],
                     "healthGates": [gate("gpu-jobs", "batch/v1", "Job")]}),
        ),
    )
    .await;
    assert_eq!(
        created["spec"]["rollout"]["maintenanceWindows"][0]["timeZone"], "UTC",
        "the zone defaults"
    );
}

#[tokio::test]
async fn kubectl_get_shows_what_a_rollout_waits_on() {
    let (env, ns) = setup("tc-columns").await;
    let clusters = api(&env, &ns, "TalosCluster");
    create_ok(&clusters, cluster("c", json!({}))).await;
    let condition = |type_: &str, reason: &str| {
        json!({"type": type_, "status": "False", "reason": reason, "message": "m",
               "lastTransitionTime": "2026-12-07T12:00:00Z"})
    };
    clusters
        .patch_status(
            "c",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"status": {"conditions": [
                condition("VersionRolledOut", "HealthGateFailing"),
                condition("ConfigRolledOut", "OutsideMaintenanceWindow"),
            ]}})),
        )
        .await
        .expect("status");
    // What `kubectl get tc -o wide` asks for: the server's table of the kind's columns.
    let (columns, table) = crate::support::table(
        &env,
        &format!(
            "/apis/ichor.maesh.dev/v1alpha1/namespaces/{ns}/talosclusters/c?includeObject=None"
        ),
    )
    .await;
    let cells = table["rows"][0]["cells"].as_array().expect("a row");
    let cell = |name: &str| {
        let at = columns.iter().position(|c| *c == name).expect(name);
        cells[at].clone()
    };
    assert_eq!(cell("Rollout"), "HealthGateFailing", "{table}");
    assert_eq!(cell("Config"), "OutsideMaintenanceWindow", "{table}");
}

#[tokio::test]
async fn max_unavailable_is_a_count_or_a_percentage_and_a_failure_domain_a_label_key() {
    let (env, ns) = setup("tc-batch").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |rollout: serde_json::Value| cluster("c", json!({ "rollout": rollout }));
    for bad in [
        json!(0),
        json!(-2),
        json!("0%"),
        json!("101%"),
        json!("2"),
        json!("a%"),
    ] {
        refused(
            &clusters,
            with(json!({ "maxUnavailable": bad })),
            "maxUnavailable must be a count of at least 1 or a percentage from 1% to 100%",
        )
        .await;
    }
    refused(
        &clusters,
        with(json!({"failureDomainLabel": "not a label"})),
        "failureDomainLabel",
    )
    .await;
    let created = create_ok(
        &clusters,
        with(json!({"maxUnavailable": "25%", "failureDomainLabel": "topology.kubernetes.io/zone"})),
    )
    .await;
    assert_eq!(created["spec"]["rollout"]["maxUnavailable"], "25%");
    let clusters2 = api(&env, &ns, "TalosCluster");
    let counted = create_ok(
        &clusters2,
        cluster("d", json!({"rollout": {"maxUnavailable": 2}})),
    )
    .await;
    assert_eq!(counted["spec"]["rollout"]["maxUnavailable"], 2);
}
