//! The object-store client against a real S3 server (SeaweedFS): objects go in and come out,
//! over HTTPS with the server's own CA too, and each failure a person must act on is named:
//! credentials refused, a missing bucket, a store that is unreachable, a store that is full.

use ichor_manager::objstore::{StoreError, StoreSettings, check_bucket, s3_store};
use ichor_testenv::S3Server;
use ichor_testenv::s3::{Credentials, REGION};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt as _, PutPayload, WriteMultipart};

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
