//! Backup, disaster, restore on the sim target, with the real `ichor-manager` and a real S3
//! server (SeaweedFS): a cluster's etcd holds keys and is backed up (plain and sealed with age);
//! the cluster, its management plane and its machines are all lost; a new cluster on fresh
//! machines, created with the original bundle and `restoreFrom`, bootstraps its first control
//! plane from the newest backup of that bundle and comes up with the keys and three healthy
//! voters. The restore runs once, a manager restart included; each bad `restoreFrom` (a missing
//! object, a changed one, the wrong age identity, another bundle, an unencrypted backup over
//! plain http not allowed) is refused before any bootstrap, naming its reason; a backup
//! written before ADR 0050 (a key to the second, a record of the snapshot's checksum) still
//! checks out.

use std::time::Duration;

use ichor_api::names::{conditions, reasons, secrets as keys};
use ichor_api::operation::{OperationAction, OperationPhase};
use ichor_api::{TalosCluster, TalosOperation};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::S3Server;
use ichor_testenv::nets::RESTORE;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt as _, PutPayload};
use support::{put_secret, put_store_secret, store_spec, talos_cluster};

mod support;
use serde_json::json;

const CLUSTER: &str = "lab";
const BUCKET: &str = "etcd";
const VERSION: &str = "v1.14.1";
const WAIT: Duration = Duration::from_secs(180);
const KEYS: [(&str, &str); 2] = [
    ("/registry/configmaps/default/before-the-disaster", "kept"),
    ("/registry/secrets/default/also-kept", "here"),
];

async fn backup_now(target: &SimTarget, name: &str) -> String {
    specs::create_operation(
        target,
        TalosOperation::test(name, OperationAction::EtcdSnapshot)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    let done = match specs::wait_operation(target, name, WAIT).await {
        Ok(done) => done,
        Err(e) => panic!(
            "{e}: {:?}\n{}",
            talos_cluster(target, CLUSTER)
                .await
                .status
                .and_then(|s| s.backup.record),
            target.manager_log_tail()
        ),
    };
    let status = done.status.expect("status");
    assert_eq!(status.run.phase, OperationPhase::Succeeded, "{status:?}");
    status.backup.key.expect("its key")
}

/// Waits until the cluster's `Restored` condition has `reason`; its message.
async fn restored(target: &SimTarget, name: &str, reason: &str) -> String {
    let found = try_eventually(&format!("{name}: Restored {reason}"), WAIT, || async {
        let status = talos_cluster(target, name).await.status?;
        status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::RESTORED && c.reason == reason)
            .map(|c| c.message.clone())
    })
    .await;
    match found {
        Ok(message) => message,
        Err(e) => panic!(
            "{e}: {:?}\n{}",
            talos_cluster(target, name).await.status,
            target.manager_log_tail()
        ),
    }
}

/// Creates cluster `name` (no discovery, no machines) restoring from `restore`.
async fn create_restoring(
    target: &SimTarget,
    name: &str,
    bundle: &str,
    restore: serde_json::Value,
) {
    let mut cluster = TalosCluster::test(name)
        .namespace(target.namespace())
        .talos(VERSION)
        .endpoint("https://127.0.0.1:6443")
        .control_planes(3)
        .build();
    cluster.spec.secrets_ref = Some(ichor_api::common::LocalObjectReference {
        name: bundle.into(),
    });
    cluster.spec.restore_from = Some(serde_json::from_value(restore).expect("restoreFrom"));
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create the cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_cluster_comes_back_from_its_latest_backup_once_and_bad_restores_are_refused() {
    let server = S3Server::start().await.expect("start the S3 server");
    server.create_bucket(BUCKET).await.expect("bucket");
    let objects = support::bucket(&server, BUCKET);
    let identity = age::x25519::Identity::generate();
    let identity_text = {
        use age::secrecy::ExposeSecret as _;
        identity.to_string().expose_secret().to_owned()
    };

    // The original cluster: keys in etcd, backed up plain and then sealed, to the recipient
    // only (its management plane never holds the identity).
    let original = SimTarget::up(SimOptions::new(3, RESTORE.net(0), VERSION))
        .await
        .expect("sim target");
    put_store_secret(&original, &server).await;
    let shape = Shape::new(VERSION, "flannel");
    specs::create_cluster_with(&original, &shape, |spec| {
        spec.backup = Some(
            serde_json::from_value(json!({"schedule": "@every 24h", "store": store_spec(&server, BUCKET), "retention": {"count": 5}}))
                .expect("backup"),
        );
    })
    .await
    .expect("cluster");
    specs::wait_discovered(&original, 3)
        .await
        .expect("discovered");
    specs::approve_shape(&original, 3, 0)
        .await
        .expect("approve");
    if let Err(error) = specs::wait_ready(&original, CLUSTER, WAIT).await {
        panic!("{error}: {}", specs::summary(&original).await);
    }
    for (key, value) in KEYS {
        original.nodes()[0]
            .etcd_put(key, value)
            .await
            .expect("put a key");
    }
    let plain = backup_now(&original, "plain").await;
    Api::<TalosCluster>::namespaced(original.client(), original.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"backup": {"encryption": {"recipient": identity.to_public().to_string()}}}}),
            ),
        )
        .await
        .expect("seal the next backups");
    let sealed = backup_now(&original, "sealed").await;
    assert!(sealed.ends_with(".age"), "{sealed}");
    let bundle_yaml = Api::<Secret>::namespaced(original.client(), original.namespace())
        .get(&format!("{CLUSTER}-secrets"))
        .await
        .expect("the bundle Secret")
        .data
        .expect("data")[keys::BUNDLE_KEY]
        .0
        .clone();

    // The disaster: the management plane, the cluster and its machines are gone.
    original.down().await;

    // A new management plane and fresh machines; the bundle was kept, as the runbook says.
    let target = SimTarget::up(SimOptions::new(3, RESTORE.net(1), VERSION))
        .await
        .expect("sim target");
    put_store_secret(&target, &server).await;
    put_secret(&target, "age", &[(keys::AGE_KEY, identity_text.as_bytes())]).await;
    let other = age::x25519::Identity::generate();
    let other_text = {
        use age::secrecy::ExposeSecret as _;
        other.to_string().expose_secret().to_owned()
    };
    put_secret(
        &target,
        "other-age",
        &[(keys::AGE_KEY, other_text.as_bytes())],
    )
    .await;
    put_secret(
        &target,
        "original-bundle",
        &[(keys::BUNDLE_KEY, &bundle_yaml)],
    )
    .await;

    // Bad restores, each refused before any bootstrap.
    let store = store_spec(&server, BUCKET);
    create_restoring(
        &target,
        "missing",
        "original-bundle",
        json!({"store": store, "key": "ichor/no/such.snapshot"}),
    )
    .await;
    let message = restored(&target, "missing", reasons::RESTORE_OBJECT_MISSING).await;
    assert!(message.contains("ichor/no/such.snapshot"), "{message}");
    // A changed object: one byte of the plain backup flipped, its record copied beside it.
    let mut body = objects
        .get(&ObjectPath::from(plain.as_str()))
        .await
        .expect("the plain backup")
        .bytes()
        .await
        .expect("bytes")
        .to_vec();
    body[4096] ^= 0xff;
    let changed = "tampered/20261204T000000Z.snapshot";
    objects
        .put(&ObjectPath::from(changed), PutPayload::from(body))
        .await
        .expect("the changed copy");
    let record = objects
        .get(&ObjectPath::from(format!("{plain}.json")))
        .await
        .expect("the record")
        .bytes()
        .await
        .expect("bytes");
    objects
        .put(
            &ObjectPath::from(format!("{changed}.json")),
            PutPayload::from(record),
        )
        .await
        .expect("its record");
    create_restoring(
        &target,
        "changed",
        "original-bundle",
        json!({"store": store, "key": changed}),
    )
    .await;
    let message = restored(&target, "changed", reasons::RESTORE_CHECKSUM_MISMATCH).await;
    assert!(message.contains("the object reads as"), "{message}");
    // Written before ADR 0050: a key to the second, and a record whose size and SHA-256 are
    // the snapshot's (no `snapshot` field). Still checked, and taken.
    let mut legacy: serde_json::Value =
        serde_json::from_slice(&support::object(objects.as_ref(), &format!("{plain}.json")).await)
            .expect("the record");
    let inside = legacy["snapshot"].take();
    legacy["size"] = inside["size"].clone();
    legacy["sha256"] = inside["sha256"].clone();
    legacy.as_object_mut().expect("a record").remove("snapshot");
    let old_key = "legacy/20261204T000000Z.snapshot";
    objects
        .put(
            &ObjectPath::from(old_key),
            PutPayload::from(support::object(objects.as_ref(), &plain).await),
        )
        .await
        .expect("the old-format copy");
    objects
        .put(
            &ObjectPath::from(format!("{old_key}.json")),
            PutPayload::from(serde_json::to_vec(&legacy).expect("JSON")),
        )
        .await
        .expect("its old-format record");
    create_restoring(
        &target,
        "legacy",
        "original-bundle",
        json!({"store": store, "key": old_key}),
    )
    .await;
    let message = restored(&target, "legacy", reasons::RESTORING).await;
    assert!(message.contains(old_key), "{message}");
    // Over plain http without allowPlainHttp, an unencrypted backup is not read.
    let mut plain_http = store.clone();
    plain_http["allowPlainHttp"] = json!(false);
    create_restoring(
        &target,
        "plain-http",
        "original-bundle",
        json!({"store": plain_http, "key": plain}),
    )
    .await;
    restored(&target, "plain-http", reasons::STORE_PLAIN_HTTP_REFUSED).await;
    create_restoring(
        &target,
        "wrong-key",
        "original-bundle",
        json!({"store": store, "key": sealed, "encryption": {"keySecretRef": {"name": "other-age"}}}),
    )
    .await;
    restored(&target, "wrong-key", reasons::RESTORE_KEY_WRONG).await;
    create_restoring(
        &target,
        "no-key",
        "original-bundle",
        json!({"store": store, "key": sealed}),
    )
    .await;
    restored(&target, "no-key", reasons::RESTORE_KEY_WRONG).await;
    // Another bundle: a cluster of this plane generates one.
    let donor = TalosCluster::test("donor")
        .namespace(target.namespace())
        .talos(VERSION)
        .endpoint("https://127.0.0.1:6443")
        .build();
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .create(&PostParams::default(), &donor)
        .await
        .expect("a donor cluster");
    try_eventually("the donor's bundle", WAIT, || async {
        Api::<Secret>::namespaced(target.client(), target.namespace())
            .get("donor-secrets")
            .await
            .ok()
    })
    .await
    .expect("a generated bundle");
    create_restoring(
        &target,
        "other-bundle",
        "donor-secrets",
        json!({"store": store, "key": plain}),
    )
    .await;
    let message = restored(&target, "other-bundle", reasons::RESTORE_BUNDLE_MISMATCH).await;
    let fingerprints = message.matches("sha256:").count();
    assert_eq!(fingerprints, 2, "both fingerprints are shown: {message}");
    for node in target.nodes() {
        assert_eq!(node.calls("Bootstrap"), 0, "nothing was bootstrapped");
        assert_eq!(node.calls("EtcdRecover"), 0, "nothing was uploaded");
    }

    // The restore: the newest backup taken with the original bundle (the sealed one).
    specs::create_cluster_with(&target, &shape, |spec| {
        spec.secrets_ref = Some(ichor_api::common::LocalObjectReference {
            name: "original-bundle".into(),
        });
        spec.restore_from = Some(
            serde_json::from_value(
                json!({"store": store, "encryption": {"keySecretRef": {"name": "age"}}}),
            )
            .expect("restoreFrom"),
        );
    })
    .await
    .expect("the restoring cluster");
    specs::wait_discovered(&target, 3)
        .await
        .expect("discovered");
    specs::approve_shape(&target, 3, 0).await.expect("approve");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, WAIT).await {
        panic!(
            "{error}: {}\n{}",
            specs::summary(&target).await,
            target.manager_log_tail()
        );
    }
    let message = restored(&target, CLUSTER, reasons::RESTORE_COMPLETED).await;
    assert!(
        message.contains(&sealed),
        "the newest backup of the bundle: {message}"
    );
    let voters = specs::check_cluster(&target, &shape)
        .await
        .expect("one etcd cluster");
    assert_eq!(voters.len(), 3, "three voters");
    for node in target.nodes() {
        for (key, value) in KEYS {
            assert_eq!(
                node.etcd_get(key).await.expect("read").as_deref(),
                Some(value.as_bytes()),
                "{key} is back"
            );
        }
    }
    // The upload is sent again if the node was not ready to bootstrap yet (Talos keeps the
    // last one); the recovery itself ran once: one etcd cluster, the keys back, recorded.
    let recovers: usize = target.nodes().iter().map(|n| n.calls("EtcdRecover")).sum();
    assert!(recovers >= 1, "uploaded");

    // Recorded, it runs once: a manager restart changes nothing.
    let mut target = target;
    target.kill_manager().await;
    target.start_manager().await.expect("restart the manager");
    let before = target.manager_reconciles("TalosCluster").await.unwrap_or(0);
    try_eventually("the cluster reconciled after the restart", WAIT, || async {
        (target.manager_reconciles("TalosCluster").await.ok()? > before + 2).then_some(())
    })
    .await
    .expect("reconciled");
    let after: usize = target.nodes().iter().map(|n| n.calls("EtcdRecover")).sum();
    assert_eq!(
        after, recovers,
        "nothing uploaded after the restore was recorded"
    );
    let status = talos_cluster(&target, CLUSTER)
        .await
        .status
        .expect("status");
    assert!(
        status
            .restore
            .record
            .expect("recorded")
            .completed_at
            .is_some()
    );
    target.down().await;
}
