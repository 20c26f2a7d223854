//! Etcd backups to a cluster's `spec.backup` store: the scheduled controller, and the runner
//! it shares with `etcdSnapshot` operations. The decisions (when, from which node, what
//! retention deletes) are [`plan`]'s; this module observes and acts.
//!
//! A backup streams the snapshot from a Ready control plane that is not being removed, through
//! a bounded channel, into a multipart upload (optionally through `age`, to a recipient only),
//! checking the size and SHA-256 trailer as it passes and hashing the object as stored:
//! nothing is held whole, and a snapshot that does not check out is aborted, never completed.
//! A record beside the object (`<key>.json`) says whose it is, the bundle it was made with and
//! what the object (its `sha256sum`) and the snapshot inside must check out as; a backup
//! without one is incomplete. Then retention deletes this cluster's oldest backups, and
//! nothing else. A plain `http://` store carries only encrypted backups unless the spec says
//! otherwise, and a backup asked for once is taken once, whatever cached copy the reconcile
//! that asks started from (ADR 0050).

pub mod plan;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ichor_api::backup::{BackupRecord, BackupRun, BackupSpec, ObjectStoreSpec};
use ichor_api::cluster::ClusterBackup;
use ichor_api::common::Role;
use ichor_api::names::controllers;
use ichor_api::names::{actions, conditions, reasons, secrets as keys};
use ichor_api::{TalosCluster, TalosOperation};
use ichor_talos::TalosClient;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _, PutPayload, WriteMultipart};
use tokio::sync::mpsc;

use crate::backup_store::seal::{SealError, Sealer};
use crate::backup_store::{self, StoreError, StoreSettings};
use crate::infra::shared::Changes;
use crate::infra::status::{self, Guard};
use crate::{Context, Error, Stop, infra::conditions as cond};
use plan::{BackupId, Owner, Plan, Record, Schedule, Source};

/// The size of each uploaded part (S3's smallest but the last is 5 MiB).
pub(crate) const PART: usize = 5 * 1024 * 1024;
/// Parts in flight at once: with the part being filled, what a backup holds in memory.
pub(crate) const PARTS_IN_FLIGHT: usize = 2;
/// Snapshot chunks queued between the node and the upload.
pub(crate) const CHUNKS_QUEUED: usize = 64;
/// When a scheduled backup finds another running, it looks again after this.
pub(crate) const BUSY_RETRY: Duration = Duration::from_secs(10);

/// Who asked for a backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The schedule.
    Scheduled,
    /// A TalosOperation (`etcdSnapshot`), from this machine.
    Operation {
        /// The operation's name.
        operation: String,
        /// The control plane it targets.
        machine: String,
    },
}

impl Trigger {
    /// The operation that asked, if one did.
    fn operation(&self) -> Option<String> {
        match self {
            Self::Operation { operation, .. } => Some(operation.clone()),
            Self::Scheduled => None,
        }
    }
}

/// The clusters with a backup running in this process: one at a time per cluster.
#[derive(Debug, Default)]
pub struct InFlight(Mutex<BTreeSet<String>>);

/// Held while a backup of one cluster runs; released on drop.
struct Slot<'a> {
    set: &'a InFlight,
    key: String,
}

impl InFlight {
    fn take(&self, key: String) -> Option<Slot<'_>> {
        // The guard goes before a slot exists: a slot's drop takes the lock.
        let taken = self.0.lock().ok()?.insert(key.clone());
        taken.then(|| Slot { set: self, key })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.0.lock() {
            set.remove(&self.key);
        }
    }
}

/// A cluster's store, opened from its spec and credentials Secret.
pub struct Destination {
    /// The S3 client, for the bucket.
    pub store: Arc<dyn ObjectStore>,
    /// The settings it was built from.
    pub settings: StoreSettings,
    /// The key prefix.
    pub prefix: String,
}

/// Reads the credentials Secret `spec` names (in `namespace`) and opens the bucket. A missing
/// Secret or key is named.
pub async fn destination(
    client: &kube::Client,
    namespace: &str,
    spec: &ObjectStoreSpec,
) -> Result<Destination, Stop> {
    let secret_name = &spec.credentials_secret_ref.name;
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(secret_name)
        .await
        .map_err(|err| {
            Stop::new(
                reasons::STORE_UNREACHABLE,
                format!("cannot read Secret {secret_name}: {err}"),
            )
        })?
        .ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!("store.credentialsSecretRef: Secret {secret_name} does not exist in namespace {namespace}"),
            )
        })?;
    let value = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let required = |key: &str| {
        value(key).ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!(
                    "store.credentialsSecretRef: Secret {secret_name} has no key {key} (it needs {} and {})",
                    keys::ACCESS_KEY_ID_KEY,
                    keys::SECRET_ACCESS_KEY_KEY
                ),
            )
        })
    };
    let settings = StoreSettings {
        endpoint: spec.endpoint.clone(),
        region: spec.region.clone(),
        bucket: spec.bucket.clone(),
        access_key: required(keys::ACCESS_KEY_ID_KEY)?,
        secret_key: required(keys::SECRET_ACCESS_KEY_KEY)?,
        ca_pem: value(keys::STORE_CA_KEY),
    };
    let store = backup_store::s3_store(&settings).map_err(Stop::from)?;
    Ok(Destination {
        store,
        settings,
        prefix: spec.prefix.clone(),
    })
}

/// Reads the age identity of a restore's `encryption` Secret: only a restore reads one.
pub async fn age_identity(
    client: &kube::Client,
    namespace: &str,
    secret_name: &str,
) -> Result<String, Stop> {
    let secret = Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(secret_name)
        .await
        .map_err(|err| {
            Stop::new(
                reasons::KUBERNETES_API,
                format!("cannot read Secret {secret_name}: {err}"),
            )
        })?
        .ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!("encryption.keySecretRef: Secret {secret_name} does not exist in namespace {namespace}"),
            )
        })?;
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(keys::AGE_KEY))
        .map(|v| String::from_utf8_lossy(&v.0).trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!(
                    "encryption.keySecretRef: Secret {secret_name} has no key {} (an age identity, AGE-SECRET-KEY-1…)",
                    keys::AGE_KEY
                ),
            )
        })
}

/// The cluster's key in [`InFlight`].
fn cluster_key(cluster: &TalosCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// The backup controller: each TalosCluster with `spec.backup`, reconciled when it changes and
/// when its next backup is due.
pub(crate) async fn run_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    // The clusters from the manager's one cluster watch (`Context::clusters`).
    let controller = Controller::for_shared_stream(
        ctx.clusters.subscribe(Changes::Applied),
        ctx.clusters.store(),
    )
    .with_config(crate::infra::drive::limits(&ctx));
    crate::infra::drive::drive(controllers::BACKUP, controller, reconcile, ctx, stop).await;
}

/// Reconciles the backups of one TalosCluster: runs a scheduled backup when one is due, and
/// comes back when the next is.
pub async fn reconcile(cluster: Arc<TalosCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(Action::await_change());
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let schedule = match Schedule::parse(&spec.schedule) {
        Ok(schedule) => schedule,
        Err(problem) => {
            let failure = Stop::new(reasons::BACKUP_SETTINGS_INVALID, problem.to_string());
            record_failure(&ctx, &cluster, &failure, false).await?;
            return Ok(Action::await_change());
        }
    };
    let facts = facts(ctx.clock.now(), &cluster, spec);
    match plan::plan(&schedule, &facts) {
        Plan::Idle => Ok(Action::await_change()),
        Plan::Wait { due } => {
            record_next_run(&ctx, &cluster, Some(due)).await?;
            Ok(Action::requeue(until(facts.now, due)))
        }
        Plan::Run => match run(&ctx, &cluster, Trigger::Scheduled).await? {
            None => Ok(Action::requeue(BUSY_RETRY)),
            // The write of its outcome reconciles again, and plans the next.
            Some(_) => Ok(Action::await_change()),
        },
    }
}

/// What the schedule of `cluster` (whose `spec.backup` is `spec`) is judged on at `now`: its
/// status as `cluster` carries it.
fn facts(now: Timestamp, cluster: &TalosCluster, spec: &BackupSpec) -> plan::Facts {
    let status = cluster.status.clone().unwrap_or_default();
    let backups = status.backup.record.unwrap_or_default();
    plan::Facts {
        now,
        created: cluster
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0),
        last_success: backups.last_success.as_ref().map(|s| s.taken_at.0),
        last_failure: backups.last_failure.as_ref().map(|t| t.0),
        suspended: spec.suspend,
        ready: status
            .core
            .control_planes
            .as_ref()
            .is_some_and(|c| c.ready > 0),
    }
}

fn until(now: Timestamp, due: Timestamp) -> Duration {
    due.duration_since(now)
        .try_into()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

/// Runs one backup of `cluster` now and records its outcome (status, condition, Event,
/// metrics), if the cluster and the operation as stored still ask for it: `cluster` may be a
/// cached copy that has not yet seen the last backup's status (ADR 0050). An operation whose
/// status already names its backup gets that backup's record back and nothing is taken again.
/// `None`: no backup now, as another backup of the cluster is running or, for the schedule,
/// none is due.
pub async fn run(
    ctx: &Context,
    cluster: &TalosCluster,
    trigger: Trigger,
) -> Result<Option<Result<BackupRecord, Stop>>, Error> {
    let Some(_slot) = ctx.backups.take(cluster_key(cluster)) else {
        return Ok(None);
    };
    // Read under the slot: a backup of this cluster that ended before has written its status.
    let Some(fresh) = api(ctx, cluster).get_opt(&cluster.name_any()).await? else {
        return Ok(None);
    };
    let cluster = &fresh;
    // The backup's futures (a streamed upload, its digests and encryption) are large: each is
    // boxed so that the reconciles awaiting a backup keep theirs small. Inline, a debug build's
    // worker thread overflowed its stack under an operation's reconcile.
    match Box::pin(asked(ctx, cluster, &trigger)).await? {
        Asked::Take => {}
        Asked::NotDue => return Ok(None),
        Asked::Taken(outcome) => return Ok(Some(outcome)),
    }
    let started = Instant::now();
    let outcome = Box::pin(attempt(ctx, cluster, &trigger, started)).await?;
    let seconds = started.elapsed().as_secs_f64();
    match &outcome {
        Ok(record) => {
            ctx.metrics.backup_succeeded(cluster, seconds, record.size);
            record_success(ctx, cluster, record).await?;
        }
        Err(failure) => {
            ctx.metrics.backup_failed(cluster, failure.reason);
            record_failure(ctx, cluster, failure, true).await?;
        }
    }
    Ok(Some(outcome))
}

/// Whether a backup is still asked for, judged on the objects as stored.
enum Asked {
    /// Take it.
    Take,
    /// The schedule: none is due (the last backup's status had not reached the copy the
    /// reconcile started from).
    NotDue,
    /// The operation: its backup was taken (its status names the key); this is its record, or
    /// why it cannot be read back.
    Taken(Result<BackupRecord, Stop>),
}

/// Whether `trigger` still asks for a backup of `cluster` (as stored). A reconcile may start
/// from a cached copy one write behind its own last one: a scheduled backup whose success is
/// not in that copy looks due again, and an operation whose step is not yet recorded done
/// looks as if it had not asked yet. Each would take a second backup, and with retention's
/// count the second can push out a backup whose key another operation reported.
async fn asked(ctx: &Context, cluster: &TalosCluster, trigger: &Trigger) -> Result<Asked, Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        // prepare() names it.
        return Ok(Asked::Take);
    };
    let operation = match trigger {
        Trigger::Scheduled => {
            let due = Schedule::parse(&spec.schedule).is_ok_and(|schedule| {
                plan::plan(&schedule, &facts(ctx.clock.now(), cluster, spec)) == Plan::Run
            });
            return Ok(if due { Asked::Take } else { Asked::NotDue });
        }
        Trigger::Operation { operation, .. } => operation,
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let stored = Api::<TalosOperation>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(operation)
        .await?;
    let Some(key) = stored.and_then(|o| o.status).and_then(|s| s.backup.key) else {
        return Ok(Asked::Take);
    };
    let last = cluster
        .status
        .as_ref()
        .and_then(|s| s.backup.record.as_ref())
        .and_then(|b| b.last_success.clone())
        .filter(|r| r.key == key);
    Ok(Asked::Taken(match last {
        Some(record) => Ok(record),
        // A later backup is the cluster's last: the record beside the object says the rest.
        None => recorded(ctx, &namespace, spec, &key, operation).await,
    }))
}

/// The record of the backup at `key`, which `operation` asked for, as the store holds it.
async fn recorded(
    ctx: &Context,
    namespace: &str,
    spec: &BackupSpec,
    key: &str,
    operation: &str,
) -> Result<BackupRecord, Stop> {
    let dest = destination(&ctx.client, namespace, &spec.store).await?;
    let record_key = plan::record_key(key);
    let read = match dest.store.get(&ObjectPath::from(record_key.as_str())).await {
        Ok(got) => got.bytes().await,
        Err(err) => Err(err),
    };
    let body = read.map_err(|err| Stop::from(StoreError::classify(&dest.settings.bucket, &err)))?;
    let unreadable = |why: String| {
        Stop::new(
            reasons::STORE_WRITE_REFUSED,
            format!(
                "{key} was taken for this operation, but its record {record_key} does not read as one: {why}"
            ),
        )
    };
    let record: Record = serde_json::from_slice(&body)
        .map_err(|err| unreadable(backup_store::printable(&err.to_string())))?;
    record
        .check_shape()
        .map_err(|problem| unreadable(problem.to_string()))?;
    let taken_at = record
        .taken_at
        .parse::<Timestamp>()
        .map_err(|err| unreadable(err.to_string()))?;
    Ok(BackupRecord {
        key: key.to_owned(),
        taken_at: Time(taken_at),
        size: i64::try_from(record.size).unwrap_or(i64::MAX),
        sha256: record.sha256,
        duration_seconds: 0.0,
        machine: record.machine,
        operation: Some(operation.to_owned()),
    })
}

/// What a backup needs before it streams: the store, the sealer, the bundle's fingerprint, and
/// a client to a healthy source.
struct Prepared<'a> {
    spec: &'a BackupSpec,
    dest: Destination,
    sealer: Option<Sealer>,
    bundle_fingerprint: String,
    source: Source,
    client: TalosClient,
}

/// Opens the store (checking the bucket), the sealer and the bundle, and picks the source.
async fn prepare<'a>(
    ctx: &Context,
    cluster: &'a TalosCluster,
    trigger: &Trigger,
) -> Result<Result<Prepared<'a>, Stop>, Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(Err(Stop::new(
            reasons::BACKUP_NOT_CONFIGURED,
            "the cluster does not set spec.backup",
        )));
    };
    if let Some(message) = plan::plain_http_refusal(
        &spec.store.endpoint,
        spec.encryption.is_some(),
        spec.store.allow_plain_http,
    ) {
        return Ok(Err(Stop::new(reasons::STORE_PLAIN_HTTP_REFUSED, message)));
    }
    let namespace = cluster.namespace().unwrap_or_default();
    let dest = match destination(&ctx.client, &namespace, &spec.store).await {
        Ok(dest) => dest,
        Err(failure) => return Ok(Err(failure)),
    };
    if let Err(error) =
        backup_store::check_bucket(dest.store.as_ref(), &dest.settings.bucket, &dest.prefix).await
    {
        return Ok(Err(Stop::from(error)));
    }
    let sealer = match sealer(spec) {
        Ok(sealer) => sealer,
        Err(failure) => return Ok(Err(failure)),
    };
    let bundle = match crate::secrets::bundle(ctx, cluster).await? {
        Ok(bundle) => bundle,
        Err(unavailable) => {
            return Ok(Err(Stop::new(
                unavailable.reason(),
                unavailable.to_string(),
            )));
        }
    };
    let credentials = ctx.node_credentials(cluster, &bundle)?;
    let machines = crate::cluster_machines(ctx, cluster).await?;
    let candidates = candidates(&machines, trigger);
    let Some((source, client)) = first_healthy(&plan::sources(&candidates), &credentials).await
    else {
        return Ok(Err(Stop::new(
            reasons::NO_SNAPSHOT_SOURCE,
            "no Ready control plane that is not being removed answers with a healthy etcd member",
        )));
    };
    Ok(Ok(Prepared {
        spec,
        dest,
        sealer,
        bundle_fingerprint: crate::secrets::fingerprint(&bundle),
        source: source.clone(),
        client,
    }))
}

/// Everything a backup does but record its outcome.
async fn attempt(
    ctx: &Context,
    cluster: &TalosCluster,
    trigger: &Trigger,
    started: Instant,
) -> Result<Result<BackupRecord, Stop>, Error> {
    let prepared = match prepare(ctx, cluster, trigger).await? {
        Ok(prepared) => prepared,
        Err(failure) => return Ok(Err(failure)),
    };
    let Prepared {
        spec,
        dest,
        sealer,
        bundle_fingerprint,
        source,
        client,
    } = prepared;
    let (namespace, name) = (cluster.namespace().unwrap_or_default(), cluster.name_any());
    let uid = cluster.uid().unwrap_or_default();
    let owner = Owner {
        prefix: &dest.prefix,
        namespace: &namespace,
        name: &name,
        uid: &uid,
    };
    let taken_at = ctx.clock.now();
    let key = owner.key(taken_at, &BackupId::random(), sealer.is_some());
    let operation = trigger.operation();
    let run = BackupRun {
        since: Time(taken_at),
        key: key.clone(),
        machine: source.machine.clone(),
        operation: operation.clone(),
    };
    record_running(ctx, cluster, Some(run)).await?;
    let base = Record {
        bundle_fingerprint,
        taken_at: taken_at.to_string(),
        machine: source.machine.clone(),
        ..record_of(cluster)
    };
    let (tx, rx) = mpsc::channel::<Vec<u8>>(CHUNKS_QUEUED);
    let snapshot = client.etcd_snapshot_to(tx, |_| {});
    let record = match store(&dest, &key, sealer, base, rx, snapshot).await {
        Ok(record) => record,
        Err(failure) => return Ok(Err(failure)),
    };
    let kept = retain(ctx, cluster, &dest, &owner, spec).await;
    record_kept(ctx, cluster, kept).await?;
    Ok(Ok(BackupRecord {
        key,
        taken_at: Time(taken_at),
        size: i64::try_from(record.size).unwrap_or(i64::MAX),
        sha256: record.sha256,
        duration_seconds: started.elapsed().as_secs_f64(),
        machine: source.machine,
        operation,
    }))
}

/// The record of a backup of `cluster`, with what only the backup knows left empty.
fn record_of(cluster: &TalosCluster) -> Record {
    Record {
        namespace: cluster.namespace().unwrap_or_default(),
        cluster: cluster.name_any(),
        uid: cluster.uid().unwrap_or_default(),
        bundle_fingerprint: String::new(),
        taken_at: String::new(),
        size: 0,
        sha256: String::new(),
        snapshot: None,
        encrypted: false,
        machine: String::new(),
        talos_version: cluster.spec.talos_version.clone(),
    }
}

/// The age sealer of `spec.encryption`, if any: to its recipient, the public key only (the
/// identity is never read by a backup).
fn sealer(spec: &BackupSpec) -> Result<Option<Sealer>, Stop> {
    let Some(encryption) = spec.encryption.as_ref() else {
        return Ok(None);
    };
    if encryption.recipient.is_empty() {
        return Err(Stop::new(
            reasons::BACKUP_SETTINGS_INVALID,
            "spec.backup.encryption.recipient is not set: backups are encrypted to an age recipient (age1…, as `age-keygen -y <identity file>` prints it) and never read the identity; keySecretRef is only for restoreFrom",
        ));
    }
    Sealer::for_recipient(&encryption.recipient)
        .map(Some)
        .map_err(|message| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!("spec.backup.encryption.recipient: {message}"),
            )
        })
}

/// A snapshot that could not be encrypted: a fault of ours, not of the spec or the store.
fn encrypt_failed(error: SealError) -> Stop {
    Stop::new(reasons::INTERNAL_ERROR, error.to_string())
}

/// The cluster's machines as snapshot sources (for an operation, only its machine).
fn candidates(machines: &[ichor_api::TalosMachine], trigger: &Trigger) -> Vec<Source> {
    machines
        .iter()
        .filter(|m| match trigger {
            Trigger::Operation { machine, .. } => &m.name_any() == machine,
            Trigger::Scheduled => true,
        })
        .filter_map(|m| {
            let status = m.status.as_ref();
            Some(Source {
                machine: m.name_any(),
                address: crate::controller::machine::address(m)?,
                ready_control_plane: m.spec.role == Some(Role::ControlPlane)
                    && status.is_some_and(|s| {
                        s.applied.config_hash.is_some()
                            && cond::is_true(&s.conditions, conditions::READY)
                    }),
                being_removed: m.metadata.deletion_timestamp.is_some()
                    || status.is_some_and(|s| s.removal.progress.is_some()),
            })
        })
        .collect()
}

/// The first source, in order, whose etcd member answers healthy, and a client to it.
async fn first_healthy<'a>(
    sources: &[&'a Source],
    credentials: &ichor_talos::Credentials,
) -> Option<(&'a Source, TalosClient)> {
    for source in sources {
        let Some(client) = crate::connect(&source.address, credentials).await else {
            continue;
        };
        match client.etcd_status().await {
            Ok(status) if !status.learner && status.errors.is_empty() => {
                return Some((source, client));
            }
            _ => {}
        }
    }
    None
}

/// Stores one backup at `key`: the snapshot `snapshot` sends into `chunks` (checked as it
/// passes, sealed when asked) as a multipart upload, then its record (`base` with the object's
/// and the snapshot's digests filled in) beside it. Anything short of a whole, checked
/// snapshot aborts the upload; an object whose record cannot be written is deleted. Returns
/// the record written.
pub async fn store<E: std::fmt::Display>(
    dest: &Destination,
    key: &str,
    sealer: Option<Sealer>,
    base: Record,
    chunks: mpsc::Receiver<Vec<u8>>,
    snapshot: impl Future<Output = Result<ichor_talos::snapshot::SnapshotSummary, E>>,
) -> Result<Record, Stop> {
    let encrypted = sealer.is_some();
    let digests = upload(dest, key, sealer, chunks, snapshot).await?;
    let record = Record {
        size: digests.object.size,
        sha256: digests.object.sha256,
        snapshot: Some(digests.snapshot),
        encrypted,
        ..base
    };
    if let Err(failure) = write_record(dest, key, &record).await {
        let _ = backup_store::delete(dest.store.as_ref(), &dest.settings.bucket, key).await;
        return Err(failure);
    }
    Ok(record)
}

/// Streams the snapshot from `chunks` into a multipart upload of `key`, sealed when asked,
/// checking it as it passes and hashing the object as stored.
async fn upload<E: std::fmt::Display>(
    dest: &Destination,
    key: &str,
    mut sealer: Option<Sealer>,
    chunks: mpsc::Receiver<Vec<u8>>,
    snapshot: impl Future<Output = Result<ichor_talos::snapshot::SnapshotSummary, E>>,
) -> Result<plan::Digests, Stop> {
    let bucket = dest.settings.bucket.as_str();
    let multipart = dest
        .store
        .put_multipart(&ObjectPath::from(key))
        .await
        .map_err(|err| Stop::from(StoreError::classify_write(bucket, &err)))?;
    let mut writer = WriteMultipart::new_with_chunk_size(multipart, PART);
    let mut object = plan::Hasher::default();
    // The pump owns the receiver: if it stops early, the snapshot's sender sees it closed and
    // stops too, rather than waiting on a full channel.
    let pump = pump(chunks, &mut writer, &mut object, sealer.as_mut(), bucket);
    let summary = match tokio::join!(snapshot, pump) {
        (Ok(summary), Ok(())) => summary,
        (_, Err(failure)) => {
            let _ = writer.abort().await;
            return Err(failure);
        }
        (Err(error), Ok(())) => {
            let _ = writer.abort().await;
            return Err(Stop::new(
                reasons::SNAPSHOT_FAILED,
                format!(
                    "the snapshot did not arrive whole and checked, so nothing was stored: {error}"
                ),
            ));
        }
    };
    if let Some(sealer) = sealer {
        match sealer.finish() {
            Ok(tail) => {
                object.update(&tail);
                writer.write(&tail);
            }
            Err(error) => {
                let _ = writer.abort().await;
                return Err(encrypt_failed(error));
            }
        }
    }
    writer
        .finish()
        .await
        .map_err(|err| Stop::from(StoreError::classify_write(bucket, &err)))?;
    Ok(plan::Digests {
        object: object.finish(),
        snapshot: plan::Digest {
            size: summary.size,
            sha256: summary.sha256,
        },
    })
}

/// Moves snapshot chunks from `rx` into the upload, sealed when asked, hashing what is
/// stored. It owns the receiver: if it stops early, the snapshot's sender sees the channel
/// closed and stops too, rather than waiting on a full channel.
async fn pump(
    mut rx: mpsc::Receiver<Vec<u8>>,
    parts: &mut WriteMultipart,
    object: &mut plan::Hasher,
    mut sealing: Option<&mut Sealer>,
    bucket: &str,
) -> Result<(), Stop> {
    while let Some(chunk) = rx.recv().await {
        let bytes = match sealing.as_mut() {
            Some(sealer) => sealer.seal(&chunk).map_err(encrypt_failed)?,
            None => chunk,
        };
        if bytes.is_empty() {
            continue;
        }
        parts
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(|err| Stop::from(StoreError::classify_write(bucket, &err)))?;
        object.update(&bytes);
        parts.write(&bytes);
    }
    Ok(())
}

/// Writes the record beside the backup.
async fn write_record(dest: &Destination, key: &str, record: &Record) -> Result<(), Stop> {
    let body = serde_json::to_vec_pretty(record).unwrap_or_default();
    dest.store
        .put(
            &ObjectPath::from(plan::record_key(key)),
            PutPayload::from(body),
        )
        .await
        .map(drop)
        .map_err(|err| Stop::from(StoreError::classify_write(&dest.settings.bucket, &err)))
}

/// Deletes what retention lets go of this cluster's backups (and their records); returns how
/// many are kept. A failure to list or delete is reported in an Event and left for next time.
async fn retain(
    ctx: &Context,
    cluster: &TalosCluster,
    dest: &Destination,
    owner: &Owner<'_>,
    spec: &BackupSpec,
) -> Option<i32> {
    use futures::TryStreamExt as _;
    let folder = ObjectPath::from(owner.folder().trim_end_matches('/'));
    let listed: Result<Vec<String>, _> = dest
        .store
        .list(Some(&folder))
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await;
    let keys = match listed {
        Ok(keys) => keys,
        Err(err) => {
            let failure = StoreError::classify(&dest.settings.bucket, &err);
            retention_event(
                ctx,
                cluster,
                format!("cannot list backups for retention: {failure}"),
            )
            .await;
            return None;
        }
    };
    let retention = match retention_of(spec) {
        Ok(retention) => retention,
        Err((retention, invalid)) => {
            let note = format!("{invalid}; no backup is deleted for its age until it reads");
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::INVALID_DURATION,
                actions::BACKUP,
                note,
            )
            .await;
            retention
        }
    };
    let expired = plan::expired(owner, &keys, retention, ctx.clock.now());
    let ours = keys.iter().filter(|k| owner.taken_at(k).is_some()).count();
    let mut deleted = 0;
    for key in &expired {
        let bucket = &dest.settings.bucket;
        match backup_store::delete(dest.store.as_ref(), bucket, key).await {
            Ok(()) => {
                deleted += 1;
                let _ =
                    backup_store::delete(dest.store.as_ref(), bucket, &plan::record_key(key)).await;
            }
            Err(error) => {
                retention_event(ctx, cluster, format!("cannot delete {key}: {error}")).await;
            }
        }
    }
    i32::try_from(ours - deleted).ok()
}

/// `spec.backup.retention`, with its default (the newest 7). A `maxAge` that does not read
/// deletes nothing for its age: the retention without it, and why.
fn retention_of(
    spec: &BackupSpec,
) -> Result<plan::Retention, (plan::Retention, ichor_api::time::InvalidDuration)> {
    let Some(r) = spec.retention.as_ref() else {
        return Ok(plan::Retention {
            count: Some(7),
            max_age: None,
        });
    };
    let count = r.count.and_then(|c| usize::try_from(c).ok());
    let max_age = r
        .max_age
        .as_deref()
        .map(|age| ichor_api::time::parse_duration("spec.backup.retention.maxAge", age))
        .transpose();
    match max_age {
        Ok(max_age) => Ok(plan::Retention { count, max_age }),
        Err(invalid) => Err((
            plan::Retention {
                count,
                max_age: None,
            },
            invalid,
        )),
    }
}

async fn retention_event(ctx: &Context, cluster: &TalosCluster, note: String) {
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::STORE_WRITE_REFUSED,
        actions::BACKUP,
        note,
    )
    .await;
}

fn api(ctx: &Context, cluster: &TalosCluster) -> Api<TalosCluster> {
    Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
}

/// Reads the cluster fresh, lets `change` edit its status, and writes the backup group (the
/// `backup` field and the `BackedUp` condition) if it changed.
async fn update(
    ctx: &Context,
    cluster: &TalosCluster,
    change: impl FnOnce(&mut ichor_api::cluster::TalosClusterStatus),
) -> Result<(), Error> {
    let api = api(ctx, cluster);
    let Some(fresh) = api.get_opt(&cluster.name_any()).await? else {
        return Ok(());
    };
    let mut status = fresh.status.clone().unwrap_or_default();
    let before = serde_json::to_value(&status).ok();
    change(&mut status);
    if serde_json::to_value(&status).ok() == before {
        return Ok(());
    }
    status::apply::<ClusterBackup, _>(&api, &fresh, &status, Guard::None).await?;
    Ok(())
}

async fn record_running(
    ctx: &Context,
    cluster: &TalosCluster,
    running: Option<BackupRun>,
) -> Result<(), Error> {
    update(ctx, cluster, |s| {
        s.backup.record.get_or_insert_with(Default::default).running = running;
    })
    .await
}

async fn record_next_run(
    ctx: &Context,
    cluster: &TalosCluster,
    next: Option<Timestamp>,
) -> Result<(), Error> {
    let now = ctx.now();
    let generation = cluster.metadata.generation;
    update(ctx, cluster, |s| {
        let never_ran = s
            .backup
            .record
            .as_ref()
            .is_none_or(|b| b.last_success.is_none() && b.last_failure.is_none());
        s.backup
            .record
            .get_or_insert_with(Default::default)
            .next_run = next.map(Time);
        if never_ran {
            cond::set(
                &mut s.conditions,
                conditions::BACKED_UP,
                false,
                reasons::BACKUP_SCHEDULED,
                "no backup has run yet; the first is due at status.backup.nextRun",
                generation,
                &now,
            );
        }
    })
    .await
}

async fn record_kept(
    ctx: &Context,
    cluster: &TalosCluster,
    kept: Option<i32>,
) -> Result<(), Error> {
    if kept.is_none() {
        return Ok(());
    }
    update(ctx, cluster, |s| {
        s.backup.record.get_or_insert_with(Default::default).kept = kept;
    })
    .await
}

async fn record_success(
    ctx: &Context,
    cluster: &TalosCluster,
    record: &BackupRecord,
) -> Result<(), Error> {
    let now = ctx.now();
    let generation = cluster.metadata.generation;
    let message = format!(
        "{} bytes (sha256 {}) from {} in {:.1}s to {}",
        record.size, record.sha256, record.machine, record.duration_seconds, record.key
    );
    update(ctx, cluster, |s| {
        let backup = s.backup.record.get_or_insert_with(Default::default);
        backup.running = None;
        backup.last_success = Some(record.clone());
        cond::set(
            &mut s.conditions,
            conditions::BACKED_UP,
            true,
            reasons::BACKUP_SUCCEEDED,
            message.clone(),
            generation,
            &now,
        );
    })
    .await?;
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::BACKUP_SUCCEEDED,
        actions::BACKUP,
        message,
    )
    .await;
    Ok(())
}

/// Records a failure: the condition, and with `attempted` the attempt's time (so the schedule
/// waits) and an Event. Nothing in the store is touched.
async fn record_failure(
    ctx: &Context,
    cluster: &TalosCluster,
    failure: &Stop,
    attempted: bool,
) -> Result<(), Error> {
    let now = ctx.now();
    let generation = cluster.metadata.generation;
    update(ctx, cluster, |s| {
        let backup = s.backup.record.get_or_insert_with(Default::default);
        backup.running = None;
        if attempted {
            backup.last_failure = Some(now.clone());
        }
        failure.set_condition(&mut s.conditions, conditions::BACKED_UP, generation, &now);
    })
    .await?;
    if attempted {
        failure.warn(ctx, cluster, actions::BACKUP).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_backup_at_a_time_per_cluster_and_the_slot_frees_on_drop() {
        let running = InFlight::default();
        let first = running.take("ns/lab".into()).expect("free");
        assert!(running.take("ns/lab".into()).is_none(), "taken");
        assert!(running.take("ns/other".into()).is_some(), "per cluster");
        drop(first);
        assert!(running.take("ns/lab".into()).is_some(), "freed");
    }
}
