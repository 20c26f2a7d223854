//! `spec.rollout`: what the apiserver refuses of a health gate and a fresh backup.

use serde_json::json;

use crate::support::{api, cluster, create_ok, refused, setup};

fn gate(name: &str, api_version: &str, kind: &str) -> serde_json::Value {
    json!({"name": name, "apiVersion": api_version, "kind": kind, "expression": "true"})
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
