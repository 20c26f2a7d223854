//! Etcd backups to a real S3 server (SeaweedFS) on the sim target, against the real
//! `ichor-manager`: the first scheduled backup runs once etcd is bootstrapped, `etcdSnapshot`
//! operations back up on demand, retention keeps the newest N of this cluster's backups and
//! touches nothing else in the bucket; each backup's record names the bundle it was made with
//! and the SHA-256 of the object as stored (`sha256sum` of a plain S3 GET), two backups asked
//! for at once keep apart; a plain `http://` store refuses an unencrypted backup unless
//! allowed; an encrypted backup needs only the age recipient and opens with its identity only;
//! and wrong credentials, a missing bucket, an unreachable store and a full one each set
//! `BackedUp` with their reason and emit an Event, losing nothing already stored.

use std::io::Read as _;
use std::time::Duration;

use futures::TryStreamExt as _;
use ichor_api::TalosCluster;
use ichor_api::TalosOperation;
use ichor_api::names::{conditions, reasons, secrets as keys};
use ichor_api::operation::{OperationAction, OperationPhase};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::S3Server;
use ichor_testenv::nets::BACKUPS;
use ichor_testenv::wait::try_eventually;
use kube::api::{Api, Patch, PatchParams};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload};
use support::{put_secret, put_store_secret, store_spec, talos_cluster};

mod support;
use serde_json::json;

const CLUSTER: &str = "lab";
const BUCKET: &str = "etcd";
const WAIT: Duration = Duration::from_secs(120);

async fn keys_under(store: &dyn ObjectStore, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = store
        .list(Some(&ObjectPath::from(prefix)))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .expect("list");
    keys.sort();
    keys
}

async fn patch_backup(target: &SimTarget, backup: serde_json::Value) {
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"backup": backup}})),
        )
        .await
        .expect("patch spec.backup");
}

/// Runs an `etcdSnapshot` operation named `name` to its end.
async fn snapshot(target: &SimTarget, name: &str) -> TalosOperation {
    specs::create_operation(
        target,
        TalosOperation::test(name, OperationAction::EtcdSnapshot)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    specs::wait_operation(target, name, WAIT)
        .await
        .expect("finished")
}

/// How many backups of the cluster the manager has taken (its duration histogram's count).
async fn backups_taken(target: &SimTarget) -> f64 {
    let metrics = target.manager_metrics().await.expect("/metrics");
    let series = format!(
        "ichor_backup_duration_seconds_count{{namespace=\"{}\",cluster=\"{CLUSTER}\"}}",
        target.namespace()
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// The reason of the operation's `Succeeded` condition.
fn outcome(operation: &TalosOperation) -> (OperationPhase, String, String) {
    let status = operation.status.clone().expect("status");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::SUCCEEDED)
        .cloned()
        .expect("Succeeded");
    (status.run.phase, condition.reason, condition.message)
}

/// Runs a backup that must fail with `reason`, and checks the cluster says so too.
async fn fails_with(target: &SimTarget, name: &str, reason: &str) -> String {
    let operation = snapshot(target, name).await;
    let (phase, got, message) = outcome(&operation);
    assert_eq!(phase, OperationPhase::Failed, "{name}: {message}");
    assert_eq!(got, reason, "{name}: {message}");
    let backed_up = talos_cluster(target, CLUSTER)
        .await
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == conditions::BACKED_UP)
        .expect("BackedUp");
    assert_eq!(backed_up.reason, reason, "{name}");
    specs::events_once(target, reason, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("{name}: an Event with reason {reason}: {e}"));
    message
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_reach_the_store_keep_n_and_name_what_stops_them() {
    let version = "v1.14.1";
    let server = S3Server::start().await.expect("start the S3 server");
    server.create_bucket(BUCKET).await.expect("bucket");
    let bucket = support::bucket(&server, BUCKET);
    // What is not Ichor's: under the prefix and beside it.
    for key in ["ichor/README.txt", "other/keep.db"] {
        bucket
            .put(
                &ObjectPath::from(key),
                PutPayload::from_static(b"not ichor's"),
            )
            .await
            .expect("a foreign object");
    }
    let target = SimTarget::up(SimOptions::new(1, BACKUPS.net(0), version))
        .await
        .expect("sim target");
    let credentials = server.credentials();
    put_store_secret(&target, &server).await;
    let shape = Shape {
        control_planes: 1,
        ..Shape::new(version, "flannel")
    };
    specs::create_cluster(&target, &shape)
        .await
        .expect("cluster");
    // An etcdSnapshot without spec.backup is refused with its reason.
    let refused = snapshot(&target, "too-early").await;
    assert_eq!(
        outcome(&refused).1,
        reasons::BACKUP_NOT_CONFIGURED,
        "{:?}",
        outcome(&refused)
    );
    let store_spec = store_spec(&server, BUCKET);
    patch_backup(
        &target,
        json!({"schedule": "@every 24h", "store": store_spec, "retention": {"count": 2}}),
    )
    .await;
    specs::wait_discovered(&target, 1)
        .await
        .expect("discovered");
    specs::approve_shape(&target, 1, 0).await.expect("approve");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, WAIT).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }

    // The first scheduled backup runs once etcd is bootstrapped; the next is a day later.
    let first = try_eventually("the first scheduled backup", WAIT, || async {
        let status = talos_cluster(&target, CLUSTER)
            .await
            .status?
            .backup
            .record?;
        Some((status.last_success?, status.next_run?))
    })
    .await;
    let first = match first {
        Ok(first) => first,
        Err(e) => panic!("{e}: {:?}", talos_cluster(&target, CLUSTER).await.status),
    };
    let (record, next_run) = first;
    assert_eq!(record.operation, None, "scheduled");
    assert!(next_run.0 > record.taken_at.0, "the next run follows");
    let uid = talos_cluster(&target, CLUSTER)
        .await
        .metadata
        .uid
        .expect("uid");
    let folder = format!("ichor/{}/{CLUSTER}/{uid}/", target.namespace());
    assert!(record.key.starts_with(&folder), "{}", record.key);
    let body = bucket
        .get(&ObjectPath::from(record.key.as_str()))
        .await
        .expect("the backup")
        .bytes()
        .await
        .expect("its bytes");
    assert_eq!(body.len() as i64, record.size);
    assert_eq!(body.len() % 512, 32, "an etcd snapshot with its trailer");
    let written: serde_json::Value = serde_json::from_slice(
        &bucket
            .get(&ObjectPath::from(format!("{}.json", record.key)))
            .await
            .expect("the record")
            .bytes()
            .await
            .expect("its bytes"),
    )
    .expect("JSON");
    let status = talos_cluster(&target, CLUSTER)
        .await
        .status
        .expect("status");
    assert_eq!(
        written["bundleFingerprint"].as_str(),
        status.core.bundle_fingerprint.as_deref(),
        "the record names the bundle"
    );
    assert_eq!(written["sha256"].as_str(), Some(record.sha256.as_str()));
    assert_eq!(
        support::sha256_hex(&body),
        record.sha256,
        "sha256sum of the object as stored is the record's"
    );

    // Two on demand, asked for at once (in one second, as a rule): two objects, each its
    // record's; retention keeps the newest two, and nothing that is not Ichor's goes.
    let names = ["snap-1", "snap-2"];
    for name in names {
        specs::create_operation(
            &target,
            TalosOperation::test(name, OperationAction::EtcdSnapshot)
                .cluster(CLUSTER)
                .all(),
        )
        .await
        .expect("operation");
    }
    let mut snaps = Vec::new();
    for name in names {
        let done = specs::wait_operation(&target, name, WAIT)
            .await
            .expect("finished");
        let (phase, _, message) = outcome(&done);
        assert_eq!(phase, OperationPhase::Succeeded, "{name}: {message}");
        let key = match done.status.as_ref().and_then(|s| s.backup.key.clone()) {
            Some(key) => key,
            None => panic!("no key: {:?}\n{}", done.status, target.manager_log_tail()),
        };
        assert!(key.starts_with(&folder), "{key}");
        snaps.push(key);
    }
    assert_ne!(snaps[0], snaps[1], "two backups, two keys");
    // Each taken once: a reconcile from a cached copy a write behind took an operation's
    // backup again, and retention's count then pushed out the other operation's (ADR 0050).
    assert_eq!(
        backups_taken(&target).await,
        3.0,
        "the scheduled backup and one per operation"
    );
    for key in &snaps {
        let written: serde_json::Value =
            serde_json::from_slice(&support::object(bucket.as_ref(), &format!("{key}.json")).await)
                .expect("JSON");
        assert_eq!(
            written["sha256"].as_str(),
            Some(support::sha256_hex(&support::object(bucket.as_ref(), key).await).as_str()),
            "{key}: the record's SHA-256 is the object's as stored"
        );
    }
    let ours = keys_under(bucket.as_ref(), &folder).await;
    let snapshots: Vec<&String> = ours.iter().filter(|k| k.ends_with(".snapshot")).collect();
    assert_eq!(snapshots.len(), 2, "retention keeps 2: {ours:?}");
    assert!(!ours.contains(&record.key), "the oldest went: {ours:?}");
    assert!(
        !ours.contains(&format!("{}.json", record.key)),
        "with its record: {ours:?}"
    );
    assert_eq!(ours.len(), 4, "each kept backup has its record: {ours:?}");
    for key in ["ichor/README.txt", "other/keep.db"] {
        bucket
            .head(&ObjectPath::from(key))
            .await
            .expect("what is not Ichor's stays");
    }
    let backup = talos_cluster(&target, CLUSTER)
        .await
        .status
        .expect("status")
        .backup
        .record
        .expect("backup");
    assert_eq!(backup.kept, Some(2));
    assert_eq!(backup.running, None);

    // A plain http:// store without allowPlainHttp: an unencrypted backup is refused, nothing
    // is sent and nothing stored is touched.
    patch_backup(&target, json!({"store": {"allowPlainHttp": false}})).await;
    let before = keys_under(bucket.as_ref(), "").await;
    let message = fails_with(&target, "plain-http", reasons::STORE_PLAIN_HTTP_REFUSED).await;
    assert!(message.contains("allowPlainHttp"), "{message}");
    assert_eq!(
        keys_under(bucket.as_ref(), "").await,
        before,
        "nothing sent"
    );

    // Encrypted to an age recipient, the public key only (no Secret holds the identity): it
    // goes over plain http, and only the identity opens it.
    let identity = age::x25519::Identity::generate();
    patch_backup(
        &target,
        json!({"encryption": {"recipient": identity.to_public().to_string()}}),
    )
    .await;
    let sealed = snapshot(&target, "snap-sealed").await;
    assert_eq!(
        outcome(&sealed).0,
        OperationPhase::Succeeded,
        "{:?}",
        outcome(&sealed)
    );
    let key = sealed.status.expect("status").backup.key.expect("key");
    assert!(key.ends_with(".snapshot.age"), "{key}");
    let ciphertext = support::object(bucket.as_ref(), &key).await;
    let written: serde_json::Value =
        serde_json::from_slice(&support::object(bucket.as_ref(), &format!("{key}.json")).await)
            .expect("JSON");
    assert_eq!(
        written["sha256"].as_str(),
        Some(support::sha256_hex(&ciphertext).as_str()),
        "the record's SHA-256 is the ciphertext's, as stored"
    );
    let mut plain = Vec::new();
    age::Decryptor::new(&ciphertext[..])
        .expect("an age file")
        .decrypt(std::iter::once(&identity as &dyn age::Identity))
        .expect("opens with its identity")
        .read_to_end(&mut plain)
        .expect("read");
    assert_eq!(plain.len() % 512, 32, "an etcd snapshot inside");
    assert!(
        age::Decryptor::new(&ciphertext[..])
            .expect("an age file")
            .decrypt(std::iter::once(
                &age::x25519::Identity::generate() as &dyn age::Identity
            ))
            .is_err(),
        "another identity does not open it"
    );
    assert_eq!(
        written["snapshot"]["sha256"].as_str(),
        Some(support::sha256_hex(&plain[..plain.len() - 32]).as_str()),
        "and the snapshot's inside is etcd's own (its trailer)"
    );
    patch_backup(
        &target,
        json!({"encryption": null, "store": {"allowPlainHttp": true}}),
    )
    .await;

    // What stops a backup is named, and nothing stored is lost.
    let before = keys_under(bucket.as_ref(), "").await;
    put_secret(
        &target,
        "s3",
        &[
            (keys::ACCESS_KEY_ID_KEY, credentials.access_key.as_bytes()),
            (keys::SECRET_ACCESS_KEY_KEY, b"not-the-secret"),
        ],
    )
    .await;
    fails_with(&target, "wrong-secret", reasons::STORE_CREDENTIALS_REFUSED).await;
    put_store_secret(&target, &server).await;
    patch_backup(&target, json!({"store": {"bucket": "no-such-bucket"}})).await;
    let message = fails_with(&target, "no-bucket", reasons::STORE_BUCKET_MISSING).await;
    assert!(message.contains("no-such-bucket"), "{message}");
    patch_backup(
        &target,
        json!({"store": {"bucket": BUCKET, "endpoint": "http://127.0.0.1:9"}}),
    )
    .await;
    fails_with(&target, "unreachable", reasons::STORE_UNREACHABLE).await;
    patch_backup(
        &target,
        json!({"store": {"credentialsSecretRef": {"name": "missing"}}}),
    )
    .await;
    let message = fails_with(&target, "no-secret", reasons::BACKUP_SETTINGS_INVALID).await;
    assert!(message.contains("missing"), "{message}");
    assert_eq!(
        keys_under(bucket.as_ref(), "").await,
        before,
        "failed backups changed nothing in the bucket"
    );

    // A full store: the write is refused and named; what it held stays.
    let full = S3Server::builder()
        .size_limit(48)
        .start()
        .await
        .expect("a small S3 server");
    full.create_bucket(BUCKET).await.expect("bucket");
    let small = support::bucket(&full, BUCKET);
    let filler = vec![9u8; 4 << 20];
    let mut filled = Vec::new();
    for n in 0..64 {
        let key = format!("filler/{n}");
        if small
            .put(
                &ObjectPath::from(key.as_str()),
                PutPayload::from(filler.clone()),
            )
            .await
            .is_err()
        {
            break;
        }
        filled.push(key);
    }
    assert!(!filled.is_empty(), "the small store took something first");
    let full_credentials = full.credentials();
    put_secret(
        &target,
        "s3-full",
        &[
            (
                keys::ACCESS_KEY_ID_KEY,
                full_credentials.access_key.as_bytes(),
            ),
            (
                keys::SECRET_ACCESS_KEY_KEY,
                full_credentials.secret_key.as_bytes(),
            ),
        ],
    )
    .await;
    patch_backup(
        &target,
        json!({"store": {"endpoint": full.endpoint(), "credentialsSecretRef": {"name": "s3-full"}}}),
    )
    .await;
    let message = fails_with(&target, "full", reasons::STORE_WRITE_REFUSED).await;
    assert!(message.contains("may be full"), "{message}");
    for key in &filled {
        small
            .head(&ObjectPath::from(key.as_str()))
            .await
            .expect("what the full store held stays");
    }
    // The metrics say it too: sizes and durations of the backups that went, failures by reason.
    let metrics = target.manager_metrics().await.expect("/metrics");
    let labels = format!("namespace=\"{}\",cluster=\"{CLUSTER}\"", target.namespace());
    let value = |series: String| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    assert!(
        value(format!("ichor_backup_size_bytes{{{labels}}}")).is_some_and(|v| v > 0.0),
        "{metrics}"
    );
    assert_eq!(
        value(format!("ichor_backup_duration_seconds_count{{{labels}}}")),
        Some(4.0),
        "four backups went, each once: {metrics}"
    );
    for reason in [
        reasons::STORE_CREDENTIALS_REFUSED,
        reasons::STORE_BUCKET_MISSING,
        reasons::STORE_UNREACHABLE,
        reasons::STORE_WRITE_REFUSED,
    ] {
        assert!(
            value(format!(
                "ichor_backup_failures_total{{{labels},reason=\"{reason}\"}}"
            ))
            .is_some_and(|v| v >= 1.0),
            "{reason}: {metrics}"
        );
    }
    let ops = Api::<TalosOperation>::namespaced(target.client(), target.namespace());
    assert!(
        ops.get("full")
            .await
            .expect("op")
            .status
            .expect("status")
            .backup
            .key
            .is_none(),
        "no key for a failed backup"
    );
    target.down().await;
}
