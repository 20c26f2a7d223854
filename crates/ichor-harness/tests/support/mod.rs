//! What the specs share: a client of their own for the S3 server's bucket (and `sha256sum` of
//! what it reads), Secrets written as a person would, a process's memory from `/proc`, and
//! ([`cluster`]) a cluster to work on.
// Each spec uses part of it.
#![allow(dead_code)]

pub mod cluster;
pub mod workload;

use std::sync::Arc;

use ichor_api::TalosCluster;
use ichor_api::names::secrets as keys;
use ichor_harness::{SimTarget, Target};
use ichor_testenv::S3Server;
use ichor_testenv::s3::REGION;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use object_store::aws::AmazonS3Builder;
use object_store::{ObjectStore, ObjectStoreExt as _};

/// A client of the test's own for `bucket`, to look at (and tamper with) what Ichor wrote.
pub fn bucket(server: &S3Server, bucket: &str) -> Arc<dyn ObjectStore> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let credentials = server.credentials();
    Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(server.endpoint())
            .with_region(REGION)
            .with_bucket_name(bucket)
            .with_access_key_id(&credentials.access_key)
            .with_secret_access_key(&credentials.secret_key)
            .with_allow_http(true)
            .build()
            .expect("a client"),
    )
}

/// The TalosCluster `name`.
pub async fn talos_cluster(target: &SimTarget, name: &str) -> TalosCluster {
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .get(name)
        .await
        .expect("the cluster")
}

/// The SHA-256 of `bytes`, lowercase hex: what `sha256sum` prints.
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The object `key`, read with the test's own plain S3 client.
pub async fn object(store: &dyn ObjectStore, key: &str) -> Vec<u8> {
    store
        .get(&object_store::path::Path::from(key))
        .await
        .unwrap_or_else(|e| panic!("get {key}: {e}"))
        .bytes()
        .await
        .expect("its bytes")
        .to_vec()
}

/// Creates or replaces the Secret `name` with `data`.
pub async fn put_secret(target: &SimTarget, name: &str, data: &[(&str, &[u8])]) {
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    let secret = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": secret.metadata,
        "data": secret.data,
    });
    Api::<Secret>::namespaced(target.client(), target.namespace())
        .patch(
            name,
            &PatchParams::apply("ichor-specs").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("apply the Secret");
}

/// Writes the Secret `s3` with the S3 server's credentials: the one [`store_spec`] names.
pub async fn put_store_secret(target: &SimTarget, server: &S3Server) {
    let credentials = server.credentials();
    put_secret(
        target,
        "s3",
        &[
            (keys::ACCESS_KEY_ID_KEY, credentials.access_key.as_bytes()),
            (
                keys::SECRET_ACCESS_KEY_KEY,
                credentials.secret_key.as_bytes(),
            ),
        ],
    )
    .await;
}

/// A `spec.backup.store` for `bucket` on the S3 server, under the prefix `ichor`, with the
/// credentials [`put_store_secret`] writes. The test server speaks plain `http://` on
/// loopback, so unencrypted backups are allowed over it explicitly (`allowPlainHttp`).
pub fn store_spec(server: &S3Server, bucket: &str) -> serde_json::Value {
    serde_json::json!({
        "endpoint": server.endpoint(),
        "allowPlainHttp": true,
        "bucket": bucket,
        "prefix": "ichor",
        "credentialsSecretRef": {"name": "s3"}
    })
}

/// A `kB` field (`VmRSS`, `VmHWM`) of `/proc/<pid>/status`, in bytes; none once the process
/// is gone.
pub fn read_status(pid: u32, field: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|kib| kib * 1024)
}

/// [`read_status`] of a process that must be running.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    read_status(pid, field)
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status: has the manager exited?"))
}
