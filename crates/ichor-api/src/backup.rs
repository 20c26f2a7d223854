//! Etcd backups of a `TalosCluster` to an S3-compatible object store (`spec.backup`), a
//! cluster's restore from one (`spec.restoreFrom`), and what the status records of both.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::common::LocalObjectReference;

/// Scheduled etcd backups: when, where to, how many kept, and whether encrypted.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// When backups run, in UTC: `@every <duration>` (e.g. `@every 6h`, at least `1m`), or a
    /// five-field cron expression (e.g. `0 */6 * * *`).
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(
        validation = Rule::new(r"self.matches('^@every [0-9]+(s|m|h)$') || self.matches('^[^ @]+ [^ ]+ [^ ]+ [^ ]+ [^ ]+$')").message("backup.schedule must be `@every <duration>` (e.g. @every 6h) or a five-field cron expression (e.g. 0 */6 * * *)"),
        validation = Rule::new(r"!self.matches('^@every [0-9]+(s|m|h)$') || duration(self.substring(7)) >= duration('1m')").message("backup.schedule: an @every interval must be at least 1m")
    )]
    pub schedule: String,
    /// The bucket the backups go to.
    pub store: ObjectStoreSpec,
    /// How many backups are kept, and for how long. Without it, the newest 7 are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// Encrypts each snapshot with `age` before it leaves the manager, to a recipient (public
    /// key) only: the identity that opens it is never read by a backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<BackupEncryptionSpec>,
    /// Stops scheduled backups (on-demand backups, `etcdSnapshot` operations, still run).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub suspend: bool,
}

/// An S3-compatible bucket and how to reach it.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStoreSpec {
    /// The S3 endpoint, e.g. `https://s3.example.com` or `https://10.0.0.5:9000`. A plain
    /// `http://` endpoint is refused unless the backup is encrypted (or, for a restore,
    /// `restoreFrom.encryption` is set) or `allowPlainHttp` is true.
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() in ['https', 'http'] && url(self).getHostname() != ''").message("store.endpoint must be an https:// (or http://) URL naming the S3 endpoint, e.g. https://s3.example.com"))]
    pub endpoint: String,
    /// Lets a plain `http://` endpoint carry unencrypted snapshots: every Secret of the
    /// workload cluster then crosses the network in the clear, and anyone on the path can read
    /// or change it. Without it, a plain `http://` endpoint is used only for encrypted backups.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_plain_http: bool,
    /// The region requests are signed for.
    #[serde(default = "default_region")]
    #[schemars(length(min = 1, max = 64))]
    pub region: String,
    /// The bucket (it must exist; Ichor never creates one).
    #[schemars(
        length(min = 3, max = 63),
        regex(pattern = r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
    )]
    pub bucket: String,
    /// The key prefix Ichor writes under, e.g. `ichor` (backups go to
    /// `<prefix>/<namespace>/<cluster>/<uid>/`). Nothing outside it is read, written or deleted.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 256), regex(pattern = r"^([A-Za-z0-9!_.*'()-]+/?)*$"))]
    pub prefix: String,
    /// The Secret (same namespace) with the keys `accessKeyId` and `secretAccessKey`, and
    /// optionally `ca.crt`: CA certificates (PEM) to trust for the endpoint beside the system's.
    pub credentials_secret_ref: LocalObjectReference,
}

fn default_region() -> String {
    "us-east-1".into()
}

/// How many backups are kept, and for how long. The newest backup is never deleted, and
/// nothing Ichor did not write is ever deleted.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionSpec {
    /// Keep at most this many, the newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub count: Option<i32>,
    /// Delete backups older than this, e.g. `720h`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("retention.maxAge must be a duration of at least 1m, e.g. 720h"))]
    pub max_age: Option<String>,
}

/// Client-side encryption of backups with `age`: the recipient only.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.recipient)").message("backup.encryption.recipient is required: the age recipient (age1…, as `age-keygen -y` prints it); backups never read the identity, only a restore does"))]
pub struct BackupEncryptionSpec {
    /// The age X25519 recipient (public key, `age1…`, as `age-keygen -y <identity file>` prints
    /// it) snapshots are encrypted to. It is not secret; a restore needs its identity.
    // A default, so that a cluster written before the field existed still loads (the manager
    // then refuses its backups, naming this field).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^age1[02-9ac-hj-np-z]+$')").message("backup.encryption.recipient must be an age X25519 recipient (age1…, as `age-keygen -y` prints it)"))]
    pub recipient: String,
}

/// The identity that opens encrypted backups, for a restore.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EncryptionSpec {
    /// The Secret (same namespace) whose key `age.key` holds the age X25519 identity
    /// (`AGE-SECRET-KEY-1…`, as `age-keygen` writes it) the backups were encrypted to.
    pub key_secret_ref: LocalObjectReference,
}

/// Where a new cluster's etcd is restored from.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpec {
    /// The bucket holding the backup.
    pub store: ObjectStoreSpec,
    /// The backup's object key. Without it, the newest backup under `store.prefix` that was
    /// taken with this cluster's secrets bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub key: Option<String>,
    /// The Secret (same namespace) with the `age.key` identity the backup was encrypted to, for
    /// an encrypted backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<EncryptionSpec>,
}

/// What the backups of a cluster have done.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The last backup that reached the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success: Option<BackupRecord>,
    /// When the last backup failed (its reason is on the `BackedUp` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Time>,
    /// When the next scheduled backup is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<Time>,
    /// The backup running now, if any (one at a time per cluster).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<BackupRun>,
    /// How many of this cluster's backups the store held after the last retention pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<i32>,
}

/// One backup that reached the store.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// The object key.
    #[schemars(length(max = 1024))]
    pub key: String,
    /// When the snapshot was taken.
    pub taken_at: Time,
    /// The object's size in bytes, as stored (after encryption, when encrypted).
    pub size: i64,
    /// The SHA-256 of the object as stored (after encryption, when encrypted), hex: what
    /// `sha256sum` of the downloaded object prints.
    #[schemars(length(max = 64))]
    pub sha256: String,
    /// How long the backup took, in seconds.
    pub duration_seconds: f64,
    /// The control plane the snapshot came from.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// The TalosOperation that asked for it, for an on-demand backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub operation: Option<String>,
}

/// A backup in flight.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupRun {
    /// When it started.
    pub since: Time,
    /// The object key it writes.
    #[schemars(length(max = 1024))]
    pub key: String,
    /// The control plane it streams from.
    #[schemars(length(max = 253))]
    pub machine: String,
    /// The TalosOperation that asked for it, for an on-demand backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub operation: Option<String>,
}

/// What a restore did: recorded once the backup is checked, before any bootstrap, so that it
/// runs once.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The object restored from.
    #[schemars(length(max = 1024))]
    pub key: String,
    /// The object's size in bytes, as stored (for a backup recorded before ADR 0050, the
    /// snapshot's).
    pub size: i64,
    /// The object's SHA-256 as stored, hex (for a backup recorded before ADR 0050, the
    /// snapshot's before encryption): checked again as it is read for the bootstrap.
    #[schemars(length(max = 64))]
    pub sha256: String,
    /// When the backup was checked (present, intact, decryptable, of this bundle).
    pub checked_at: Time,
    /// When the first control plane bootstrapped from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}
