//! What a backup does, one action at a time: the snapshot streamed into the store and its
//! record written beside it, retention's deletes, and the cluster's backup status written
//! (running, next run, kept, the outcome's condition and Event).

use ichor_api::TalosCluster;
use ichor_api::backup::{BackupRecord, BackupRun, BackupSpec};
use ichor_api::cluster::ClusterBackup;
use ichor_api::names::{actions, conditions, reasons};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStoreExt as _, PutPayload, WriteMultipart};
use tokio::sync::mpsc;

use super::plan::{self, Owner, Record};
use super::{Destination, PART, PARTS_IN_FLIGHT, api};
use crate::backup_store::seal::{SealError, Sealer};
use crate::backup_store::{self, StoreError};
use crate::infra::status::{self, Guard};
use crate::{Context, Error, Stop, infra::conditions as cond};

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
pub(super) async fn retain(
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
    let retention = match plan::retention_of(spec) {
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

/// Publishes a Warning Event that retention could not list or delete.
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

/// Records the backup running now (or none).
pub(super) async fn record_running(
    ctx: &Context,
    cluster: &TalosCluster,
    running: Option<BackupRun>,
) -> Result<(), Error> {
    update(ctx, cluster, |s| {
        s.backup.record.get_or_insert_with(Default::default).running = running;
    })
    .await
}

/// Records when the next scheduled backup is due; before the first, the `BackedUp`
/// condition says one is scheduled.
pub(super) async fn record_next_run(
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

/// Records how many backups retention keeps (when it could count them).
pub(super) async fn record_kept(
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

/// Records a backup taken: its record, the `BackedUp` condition and an Event.
pub(super) async fn record_success(
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
pub(super) async fn record_failure(
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

/// A snapshot that could not be encrypted: a fault of ours, not of the spec or the store.
fn encrypt_failed(error: SealError) -> Stop {
    Stop::new(reasons::INTERNAL_ERROR, error.to_string())
}
