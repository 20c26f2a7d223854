//! The object-store client against a real S3 server (SeaweedFS): objects go in and come out,
//! over HTTPS with the server's own CA too, and each failure a person must act on is named:
//! credentials refused, a missing bucket, a store that is unreachable, a store that is full,
//! and a store's error body reaches a person short and printable. Backups stored in one
//! second keep apart, and each record's SHA-256 is the object's as stored. Against a private
//! control plane: a backup asked for once is taken once, whatever copy the reconcile read.

mod support;

use std::io::Read as _;
use std::sync::Arc;

use ichor_api::backup::BackupRecord;
use ichor_api::names::reasons;
use ichor_api::operation::OperationAction;
use ichor_api::{TalosCluster, TalosOperation};
use ichor_manager::backup_store::seal::Sealer;
use ichor_manager::backup_store::{
    STORE_TEXT_LIMIT, StoreError, StoreSettings, check_bucket, s3_store,
};
use ichor_manager::controller::backup::plan::{BackupId, Owner, Record};
use ichor_manager::controller::backup::{self, Destination, Trigger};
use ichor_manager::{Context, Metrics, Settings};
use ichor_talos::snapshot::{SnapshotCheck, SnapshotSummary};
use ichor_testenv::S3Server;
use ichor_testenv::s3::{Credentials, REGION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams, PostParams};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload, WriteMultipart};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

fn settings(server: &S3Server, bucket: &str, credentials: &Credentials) -> StoreSettings {
    StoreSettings {
        endpoint: server.endpoint().to_owned(),
        region: REGION.to_owned(),
        bucket: bucket.to_owned(),
        access_key: credentials.access_key.clone(),
        secret_key: credentials.secret_key.clone(),
        ca_pem: server.ca_pem().map(str::to_owned),
    }
}

#[tokio::test]
async fn objects_go_in_in_parts_and_come_out_over_https() {
    let server = S3Server::builder().tls().start().await.expect("start weed");
    server.create_bucket("backups").await.expect("bucket");
    let store = s3_store(&settings(&server, "backups", server.credentials())).expect("client");
    check_bucket(store.as_ref(), "backups", "ichor")
        .await
        .expect("the bucket is there");
    let path = ObjectPath::from("ichor/a/b.snapshot");
    let upload = store.put_multipart(&path).await.expect("start an upload");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, 5 * 1024 * 1024);
    let part: Vec<u8> = (0..=255u8).cycle().take(3 * 1024 * 1024).collect();
    for _ in 0..4 {
        writer.wait_for_capacity(2).await.expect("room for a part");
        writer.write(&part);
    }
    writer.finish().await.expect("complete the upload");
    let meta = store.head(&path).await.expect("head");
    assert_eq!(meta.size, 12 * 1024 * 1024);
    let body = store
        .get(&path)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("body");
    assert_eq!(&body[..part.len()], part.as_slice());
}

#[tokio::test]
async fn refused_credentials_and_a_missing_bucket_are_named() {
    let server = S3Server::start().await.expect("start weed");
    server.create_bucket("backups").await.expect("bucket");
    let wrong = Credentials {
        access_key: server.credentials().access_key.clone(),
        secret_key: "not-the-secret".to_owned(),
    };
    let store = s3_store(&settings(&server, "backups", &wrong)).expect("client");
    let err = check_bucket(store.as_ref(), "backups", "ichor")
        .await
        .expect_err("refused");
    assert!(
        matches!(err, StoreError::Denied(_)),
        "wrong secret: {err:?}"
    );

    let reader = s3_store(&settings(
        &server,
        "backups",
        server.read_only_credentials(),
    ))
    .expect("client");
    check_bucket(reader.as_ref(), "backups", "ichor")
        .await
        .expect("a reader may list");
    let err = reader
        .put(&ObjectPath::from("ichor/x"), PutPayload::from_static(b"x"))
        .await
        .map_err(|err| StoreError::classify("backups", &err))
        .expect_err("a reader may not write");
    assert!(
        matches!(err, StoreError::Denied(_)),
        "read-only write: {err:?}"
    );

    let store = s3_store(&settings(&server, "nowhere", server.credentials())).expect("client");
    let err = check_bucket(store.as_ref(), "nowhere", "ichor")
        .await
        .expect_err("no bucket");
    assert!(
        matches!(&err, StoreError::NoSuchBucket { bucket } if bucket == "nowhere"),
        "missing bucket: {err:?}"
    );
}

#[tokio::test]
async fn an_unreachable_store_and_bad_settings_are_named() {
    let mut server = S3Server::start().await.expect("start weed");
    let settings = settings(&server, "backups", server.credentials());
    server.stop();
    let store = s3_store(&settings).expect("client");
    let err = check_bucket(store.as_ref(), "backups", "ichor")
        .await
        .expect_err("unreachable");
    assert!(
        matches!(err, StoreError::Unreachable(_)),
        "stopped server: {err:?}"
    );

    let mut bad = settings.clone();
    bad.endpoint = "s3.example.com".to_owned();
    assert!(matches!(s3_store(&bad), Err(StoreError::Settings(_))));
    bad.endpoint = "https://s3.example.com".to_owned();
    bad.ca_pem = Some("not a certificate".to_owned());
    assert!(matches!(s3_store(&bad), Err(StoreError::Settings(_))));
}

#[tokio::test]
async fn a_full_store_is_named_and_keeps_what_it_held() {
    let server = S3Server::builder()
        .size_limit(96)
        .start()
        .await
        .expect("start weed");
    server.create_bucket("backups").await.expect("bucket");
    let store = s3_store(&settings(&server, "backups", server.credentials())).expect("client");
    let kept = ObjectPath::from("someone-else/kept");
    store
        .put(&kept, PutPayload::from_static(b"not ichor's"))
        .await
        .expect("a first object");
    let chunk = vec![7u8; 4 * 1024 * 1024];
    let mut failure = None;
    for n in 0..64 {
        let path = ObjectPath::from(format!("ichor/big-{n}"));
        let upload = match store.put_multipart(&path).await {
            Ok(upload) => upload,
            Err(err) => {
                failure = Some(StoreError::classify_write("backups", &err));
                break;
            }
        };
        let mut writer = WriteMultipart::new_with_chunk_size(upload, 5 * 1024 * 1024);
        for _ in 0..4 {
            writer.write(&chunk);
        }
        if let Err(err) = writer.finish().await {
            failure = Some(StoreError::classify_write("backups", &err));
            break;
        }
    }
    let failure = failure.expect("a 96 MiB store fills before 1 GiB is written");
    // SeaweedFS answers a full store with `500 InternalError`; Ichor says the write was refused
    // and that the store may be full.
    assert!(
        matches!(failure, StoreError::WriteRefused(_) | StoreError::Full(_)),
        "full store: {failure:?}"
    );
    assert!(failure.to_string().contains("may be full"), "{failure}");
    let body = store
        .get(&kept)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("body");
    assert_eq!(
        &body[..],
        b"not ichor's",
        "what the store held is still there"
    );
}

/// An etcd-snapshot-shaped body: `pages` pages of `fill`, then the SHA-256 of them.
fn snapshot_of(pages: usize, fill: u8) -> Vec<u8> {
    let mut body = vec![fill; pages * 512];
    let trailer = ring::digest::digest(&ring::digest::SHA256, &body);
    body.extend_from_slice(trailer.as_ref());
    body
}

/// Streams `body` into `tx` as a node would, checked as it passes.
async fn stream(tx: mpsc::Sender<Vec<u8>>, body: Vec<u8>) -> Result<SnapshotSummary, String> {
    let mut check = SnapshotCheck::default();
    for chunk in body.chunks(256 * 1024) {
        check.update(chunk);
        tx.send(chunk.to_vec())
            .await
            .map_err(|_| "the upload stopped taking chunks".to_owned())?;
    }
    drop(tx);
    check.finish().map_err(|problem| problem.to_string())
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn object(store: &dyn ObjectStore, key: &str) -> Vec<u8> {
    store
        .get(&ObjectPath::from(key))
        .await
        .expect("get")
        .bytes()
        .await
        .expect("body")
        .to_vec()
}

#[tokio::test]
async fn backups_in_one_second_keep_apart_and_each_record_is_the_sha256_of_its_object() {
    let server = S3Server::start().await.expect("start weed");
    server.create_bucket("backups").await.expect("bucket");
    let settings = settings(&server, "backups", server.credentials());
    let dest = Destination {
        store: s3_store(&settings).expect("client"),
        settings,
        prefix: "ichor".to_owned(),
    };
    let owner = Owner {
        prefix: "ichor",
        namespace: "ns",
        name: "lab",
        uid: "0b5e7a1c",
    };
    let base = Record {
        namespace: "ns".into(),
        cluster: "lab".into(),
        uid: "0b5e7a1c".into(),
        bundle_fingerprint: "sha256:bundle".into(),
        taken_at: "2026-12-04T03:15:00Z".into(),
        size: 0,
        sha256: String::new(),
        snapshot: None,
        encrypted: false,
        machine: "cp-1".into(),
        talos_version: "v1.14.1".into(),
    };
    // One instant for all: two backups started together (a scheduled one and an operation's,
    // or two managers across a failover), and a sealed one.
    let at: k8s_openapi::jiff::Timestamp = "2026-12-04T03:15:00Z".parse().expect("time");
    let identity = age::x25519::Identity::generate();
    let back_up = |pages: usize, fill: u8, sealed: bool| {
        let (dest, base, owner) = (&dest, base.clone(), &owner);
        let recipient = identity.to_public().to_string();
        async move {
            let key = owner.key(at, &BackupId::random(), sealed);
            let sealer = sealed.then(|| Sealer::for_recipient(&recipient).expect("sealer"));
            let (tx, rx) = mpsc::channel(4);
            let body = snapshot_of(pages, fill);
            let stored = backup::store(dest, &key, sealer, base, rx, stream(tx, body)).await;
            (key, stored.expect("stored"))
        }
    };
    let (first, second, sealed) = tokio::join!(
        back_up(3000, 1, false),
        back_up(2000, 2, false),
        back_up(1000, 3, true)
    );
    for (key, record) in [&first, &second, &sealed] {
        let body = object(dest.store.as_ref(), key).await;
        assert_eq!(
            (body.len() as u64, sha256_hex(&body)),
            (record.size, record.sha256.clone()),
            "{key}: sha256sum of the object as stored is its record's"
        );
        let written: Record =
            serde_json::from_slice(&object(dest.store.as_ref(), &format!("{key}.json")).await)
                .expect("the record beside it");
        assert_eq!(&written, record, "{key}");
    }
    assert_ne!(first.0, second.0, "two keys in one second");
    let inside = snapshot_of(1000, 3);
    let snapshot = sealed.1.snapshot.clone().expect("the snapshot's digest");
    assert_eq!(
        (snapshot.size, snapshot.sha256.as_str()),
        (
            inside.len() as u64,
            sha256_hex(&inside[..inside.len() - 32]).as_str()
        ),
        "the snapshot inside: etcd's own hash, its trailer"
    );
    let mut plain = Vec::new();
    ichor_manager::backup_store::seal::open(
        &object(dest.store.as_ref(), &sealed.0).await[..],
        &identity,
    )
    .expect("opens with the identity")
    .read_to_end(&mut plain)
    .expect("read");
    assert_eq!(
        plain, inside,
        "sealed to the recipient, opened by the identity"
    );
}

/// A store that answers every request with `400` and `body`, on a port of its own choosing.
async fn answering(body: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 400 Bad Request\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(body.as_bytes()).await;
            });
        }
    });
    endpoint
}

#[tokio::test]
async fn a_store_error_body_reaches_a_person_short_and_printable() {
    let body = format!(
        "<Error><Code>Hostile</Code><Message>\u{1b}[2J\u{1b}]0;owned\u{7}{}\r\nforged: line\u{202e}</Message></Error>",
        "A".repeat(100_000)
    );
    let endpoint = answering(body).await;
    let settings = StoreSettings {
        endpoint,
        region: REGION.to_owned(),
        bucket: "backups".to_owned(),
        access_key: "key".to_owned(),
        secret_key: "secret".to_owned(),
        ca_pem: None,
    };
    let store = s3_store(&settings).expect("client");
    let err = check_bucket(store.as_ref(), "backups", "ichor")
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("Hostile"),
        "the store's words, the start of them: {text}"
    );
    assert!(text.ends_with(" [truncated]"), "{text}");
    assert!(
        text.len() <= STORE_TEXT_LIMIT + 64,
        "bounded: {} characters",
        text.len()
    );
    assert!(
        text.bytes().all(|b| b.is_ascii_graphic() || b == b' '),
        "printable only: {text:?}"
    );
}

/// A reconcile may start from a cached copy a write or two behind its own: the cluster before
/// its last backup's status, an operation before its step was recorded done. A backup is taken
/// once all the same: the operation whose status names its backup gets that backup back, a
/// scheduled backup the stored status says is not due is not taken, and nothing is attempted
/// (ADR 0050). Taken twice, with retention's count, the second pushed out the backup another
/// operation had just reported.
#[tokio::test]
async fn a_backup_asked_for_once_is_taken_once_whatever_copy_the_reconcile_read() {
    let (env, ns) = support::plane("backup-once").await;
    let clusters = Api::<TalosCluster>::namespaced(env.client(), &ns);
    let operations = Api::<TalosOperation>::namespaced(env.client(), &ns);
    let mut cluster = TalosCluster::test("lab").build();
    cluster.spec.backup = Some(
        serde_json::from_value(json!({
            "schedule": "@every 24h",
            "store": {"endpoint": "https://s3.invalid", "bucket": "etcd", "credentialsSecretRef": {"name": "s3"}},
            "retention": {"count": 2}
        }))
        .expect("a backup spec"),
    );
    // What a cache may still hold: the cluster before its backup's status.
    let stale = clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("cluster");
    let taken = BackupRecord {
        key: format!("ichor/{ns}/lab/uid/20261206T072947.226Z-c009e961.snapshot"),
        // Just now, in whole seconds as the API keeps a time.
        taken_at: Time(
            k8s_openapi::jiff::Timestamp::from_second(
                k8s_openapi::jiff::Timestamp::now().as_second(),
            )
            .expect("now"),
        ),
        size: 4096,
        sha256: "ab".repeat(32),
        duration_seconds: 0.4,
        machine: "cp-1".into(),
        operation: Some("snap-1".into()),
    };
    clusters
        .patch_status(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "controlPlanes": {"approved": 1, "ready": 1, "summary": "1/1"},
                "backup": {"lastSuccess": taken}
            }})),
        )
        .await
        .expect("the backup's status");
    let snapshot = |name: &str| {
        TalosOperation::test(name, OperationAction::EtcdSnapshot)
            .cluster("lab")
            .all()
            .build()
    };
    operations
        .create(&PostParams::default(), &snapshot("snap-1"))
        .await
        .expect("operation");
    operations
        .patch_status(
            "snap-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"backupKey": taken.key}})),
        )
        .await
        .expect("the operation names its backup");
    let metrics = Arc::new(Metrics::default());
    let ctx = Context::new(env.client(), Settings::default(), Arc::clone(&metrics));
    let asked_by = |operation: &str| Trigger::Operation {
        operation: operation.to_owned(),
        machine: "cp-1".to_owned(),
    };

    let again = backup::run(&ctx, &stale, asked_by("snap-1"))
        .await
        .expect("run");
    assert_eq!(again, Some(Ok(taken.clone())), "its backup, not a second");
    let scheduled = backup::run(&ctx, &stale, Trigger::Scheduled)
        .await
        .expect("run");
    assert_eq!(
        scheduled, None,
        "the stored status says the next is a day off"
    );
    let backup = clusters
        .get("lab")
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.backup.record)
        .expect("backup status");
    assert_eq!(backup.last_success, Some(taken), "unchanged");
    assert_eq!(backup.last_failure, None, "nothing was attempted");

    // Another operation is another backup: attempted (and refused here, without the Secret).
    operations
        .create(&PostParams::default(), &snapshot("snap-2"))
        .await
        .expect("operation");
    match backup::run(&ctx, &stale, asked_by("snap-2"))
        .await
        .expect("run")
    {
        Some(Err(failure)) => assert_eq!(
            failure.reason,
            reasons::BACKUP_SETTINGS_INVALID,
            "{}",
            failure.message
        ),
        other => panic!("attempted and refused: {other:?}"),
    }
}
