//! The secret scan against a real apiserver: a value planted in an Event, in an Ichor object's
//! status and in a log is found and named; the same cluster without the plants is clean.

use ichor_api::TalosCluster;
use ichor_harness::leaks;
use ichor_testenv::TestEnv;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, ObjectReference, Secret};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

const PLANTED: &str = "AGE-SECRET-KEY-1PLANTEDLEAKVALUE0000";

async fn plant_secret(client: &kube::Client, namespace: &str) {
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("store-credentials".into()),
            ..Default::default()
        },
        data: Some(
            [(
                "age.key".to_owned(),
                ByteString(PLANTED.as_bytes().to_vec()),
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
}

async fn plant_event(client: &kube::Client, namespace: &str) {
    let event = Event {
        metadata: ObjectMeta {
            name: Some("planted".into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            kind: Some("TalosCluster".into()),
            name: Some("lab".into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        message: Some(format!("sealing with {PLANTED}")),
        reason: Some("Planted".into()),
        ..Default::default()
    };
    Api::<Event>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &event)
        .await
        .expect("event");
}

async fn plant_status(client: &kube::Client, namespace: &str) {
    let clusters: Api<TalosCluster> = Api::namespaced(client.clone(), namespace);
    clusters
        .create(&PostParams::default(), &TalosCluster::test("lab").build())
        .await
        .expect("cluster");
    clusters
        .patch_status(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "BackedUp", "status": "False", "reason": "StoreCredentialsRefused",
                "message": format!("the store refused {PLANTED}"),
                "lastTransitionTime": "2026-01-01T00:00:00Z"
            }]}})),
        )
        .await
        .expect("status");
}

#[tokio::test]
async fn planted_values_are_found_in_events_status_and_logs_and_named() {
    let env = TestEnv::private().await.expect("control plane");
    env.install_crds(ichor_api::crds()).await.expect("crds");
    let client = env.client();
    let namespace = env.namespace("leaks").await.expect("namespace");
    let dir = tempfile::tempdir().expect("dir");
    let log = dir.path().join("manager.log");
    std::fs::write(&log, "INFO started\nINFO nothing secret here\n").expect("log");
    plant_secret(&client, &namespace).await;
    leaks::check_cluster(&client, &[("manager", &log)])
        .await
        .expect("nothing leaked yet");

    plant_event(&client, &namespace).await;
    plant_status(&client, &namespace).await;
    std::fs::write(&log, format!("INFO started\nDEBUG key {PLANTED}\n")).expect("log");
    let report = leaks::check_cluster(&client, &[("manager", &log)])
        .await
        .expect_err("the planted values are found")
        .to_string();
    let origin = format!("Secret {namespace}/store-credentials[age.key]");
    for place in [
        format!("Event {namespace}/planted"),
        format!("ichor_api::TalosCluster {namespace}/lab status"),
        "manager log line 2".to_owned(),
    ] {
        assert!(
            report.contains(&format!("{place} holds the value of {origin}")),
            "{place} is named: {report}"
        );
    }
    assert!(
        !report.contains(PLANTED),
        "the report never repeats the value"
    );
    let plugin_output = format!("KEY {PLANTED}\n");
    assert!(
        leaks::check_text(&client, "kubectl ichor describe", &plugin_output)
            .await
            .is_err()
    );
}
