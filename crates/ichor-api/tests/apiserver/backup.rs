//! `spec.backup` and `spec.restoreFrom`: what the apiserver fills in and refuses.

use serde_json::json;

use crate::support::{api, cluster, create_ok, merge, refused, setup};

fn store() -> serde_json::Value {
    json!({
        "endpoint": "https://s3.example.com",
        "bucket": "etcd-backups",
        "credentialsSecretRef": {"name": "s3"}
    })
}

#[tokio::test]
async fn a_backup_schedule_is_an_interval_or_a_cron_expression() {
    let (env, ns) = setup("tc-backup").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |schedule: &str| {
        cluster(
            "c",
            json!({"backup": {"schedule": schedule, "store": store()}}),
        )
    };
    for bad in ["6h", "every 6h", "@every soon", "* * * *", "@daily"] {
        refused(
            &clusters,
            with(bad),
            "backup.schedule must be `@every <duration>`",
        )
        .await;
    }
    refused(
        &clusters,
        with("@every 10s"),
        "an @every interval must be at least 1m",
    )
    .await;
    let created = create_ok(&clusters, with("0 */6 * * *")).await;
    let backup = &created["spec"]["backup"];
    assert_eq!(backup["store"]["region"], "us-east-1", "region defaults");
    assert!(backup.get("retention").is_none());
    merge(
        &clusters,
        "c",
        json!({"spec": {"backup": {"schedule": "@every 90m"}}}),
    )
    .await
    .expect("an interval");
}

#[tokio::test]
async fn a_store_names_an_https_endpoint_a_bucket_and_a_safe_prefix() {
    let (env, ns) = setup("tc-store").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |store_patch: serde_json::Value| {
        let mut store = store();
        crate::support::merge_json(&mut store, store_patch);
        cluster(
            "c",
            json!({"backup": {"schedule": "@every 1h", "store": store}}),
        )
    };
    refused(
        &clusters,
        with(json!({"endpoint": "s3.example.com"})),
        "store.endpoint must be an https:// (or http://) URL",
    )
    .await;
    refused(&clusters, with(json!({"bucket": "Bad_Bucket"})), "bucket").await;
    refused(&clusters, with(json!({"prefix": "/abs"})), "prefix").await;
    refused(
        &clusters,
        with(json!({"credentialsSecretRef": null})),
        "credentialsSecretRef",
    )
    .await;
    let retention = |r: serde_json::Value| {
        cluster(
            "c",
            json!({"backup": {"schedule": "@every 1h", "store": store(), "retention": r}}),
        )
    };
    refused(&clusters, retention(json!({"count": 0})), "count").await;
    refused(
        &clusters,
        retention(json!({"maxAge": "10s"})),
        "retention.maxAge must be a duration of at least 1m",
    )
    .await;
    create_ok(&clusters, retention(json!({"count": 3, "maxAge": "720h"}))).await;
}

#[tokio::test]
async fn backup_encryption_names_a_recipient_and_plain_http_is_a_choice() {
    let (env, ns) = setup("tc-seal").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let with = |encryption: serde_json::Value| {
        cluster(
            "c",
            json!({"backup": {"schedule": "@every 1h", "store": store(), "encryption": encryption}}),
        )
    };
    refused(
        &clusters,
        with(json!({})),
        "backup.encryption.recipient is required",
    )
    .await;
    // The identity's Secret is no way to name it: pruned, and then there is no recipient.
    refused(
        &clusters,
        with(json!({"keySecretRef": {"name": "age"}})),
        "backup.encryption.recipient is required",
    )
    .await;
    for bad in ["AGE-SECRET-KEY-1QQQQ", "age1BADCASE", "ssh-ed25519 AAAA"] {
        refused(
            &clusters,
            with(json!({"recipient": bad})),
            "backup.encryption.recipient must be an age X25519 recipient",
        )
        .await;
    }
    let recipient = "age1ql3z7hjy54pw3hyww5ayyfg7zqgvc7w3j2elw8zmrj2kg5sfn9aqmcac8p";
    let created = create_ok(&clusters, with(json!({"recipient": recipient}))).await;
    assert_eq!(
        created["spec"]["backup"]["encryption"],
        json!({"recipient": recipient})
    );
    let mut plain = store();
    plain["endpoint"] = json!("http://10.0.0.5:9000");
    plain["allowPlainHttp"] = json!(true);
    let created = create_ok(
        &clusters,
        cluster(
            "d",
            json!({"backup": {"schedule": "@every 1h", "store": plain}}),
        ),
    )
    .await;
    assert_eq!(
        created["spec"]["backup"]["store"]["allowPlainHttp"],
        json!(true),
        "kept"
    );
}

#[tokio::test]
async fn restore_from_is_set_at_creation_with_a_bundle_and_kept() {
    let (env, ns) = setup("tc-restore").await;
    let clusters = api(&env, &ns, "TalosCluster");
    refused(
        &clusters,
        cluster("a", json!({"restoreFrom": {"store": store()}})),
        "restoreFrom needs secretsRef",
    )
    .await;
    create_ok(
        &clusters,
        cluster(
            "b",
            json!({"secretsRef": {"name": "bundle"}, "restoreFrom": {"store": store(), "key": "ichor/x.snapshot"}}),
        ),
    )
    .await;
    let changed = merge(
        &clusters,
        "b",
        json!({"spec": {"restoreFrom": {"key": "ichor/y.snapshot"}}}),
    )
    .await
    .expect_err("the key is kept");
    assert!(
        changed.contains("restoreFrom cannot change once set"),
        "{changed}"
    );
    let dropped = merge(&clusters, "b", json!({"spec": {"restoreFrom": null}}))
        .await
        .expect_err("restoreFrom is kept");
    assert!(
        dropped.contains("restoreFrom is set only when the cluster is created"),
        "{dropped}"
    );
    create_ok(
        &clusters,
        cluster("c", json!({"secretsRef": {"name": "bundle"}})),
    )
    .await;
    let added = merge(
        &clusters,
        "c",
        json!({"spec": {"restoreFrom": {"store": store()}}}),
    )
    .await
    .expect_err("not added later");
    assert!(
        added.contains("restoreFrom is set only when the cluster is created"),
        "{added}"
    );
}

#[tokio::test]
async fn adopt_names_ip_endpoints_needs_a_bundle_and_is_set_at_creation() {
    let (env, ns) = setup("tc-adopt").await;
    let clusters = api(&env, &ns, "TalosCluster");
    let adopt = json!({"endpoints": ["10.0.0.1", "10.0.0.2"]});
    refused(
        &clusters,
        cluster("a", json!({"adopt": adopt})),
        "adopt needs secretsRef",
    )
    .await;
    refused(
        &clusters,
        cluster(
            "b",
            json!({"secretsRef": {"name": "x"}, "adopt": {"endpoints": ["node-1"]}}),
        ),
        "each entry of adopt.endpoints must be an IP address",
    )
    .await;
    refused(
        &clusters,
        cluster(
            "c",
            json!({"secretsRef": {"name": "x"}, "adopt": adopt, "restoreFrom": {"store": store()}}),
        ),
        "adopt and restoreFrom exclude each other",
    )
    .await;
    create_ok(
        &clusters,
        cluster("d", json!({"secretsRef": {"name": "x"}, "adopt": adopt})),
    )
    .await;
    let changed = merge(
        &clusters,
        "d",
        json!({"spec": {"adopt": {"endpoints": ["10.0.0.9"]}}}),
    )
    .await
    .expect_err("kept");
    assert!(
        changed.contains("adopt cannot change once set"),
        "{changed}"
    );
    create_ok(
        &clusters,
        cluster("e", json!({"secretsRef": {"name": "x"}})),
    )
    .await;
    let added = merge(&clusters, "e", json!({"spec": {"adopt": adopt}}))
        .await
        .expect_err("not added later");
    assert!(
        added.contains("adopt is set only when the cluster is created"),
        "{added}"
    );
}
