//! What the restore does and records: the `Restored` condition (a refusal with its Event, the
//! backup checked, the restore done with its Event), and the upload of the recorded backup to
//! the bootstrap node.

use ichor_api::TalosCluster;
use ichor_api::backup::RestoreStatus;
use ichor_api::cluster::TalosClusterStatus;
use ichor_api::names::{actions, conditions, reasons};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;
use tokio::sync::mpsc;

use super::observe::{CHUNKS_QUEUED, identity_for, read_record, read_through};
use super::plan::{checked, uploaded_as_checked};
use crate::controller::backup;
use crate::{Context, Stop, infra::conditions as cond};

/// Records a refusal on `Restored`, with an Event when the reason is new.
pub(super) async fn refuse(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    failure: &Stop,
) {
    let known = status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::RESTORED && c.reason == failure.reason);
    failure.set_condition(
        &mut status.conditions,
        conditions::RESTORED,
        cluster.metadata.generation,
        &ctx.now(),
    );
    if !known {
        failure.warn(ctx, cluster, actions::RESTORE).await;
    }
}

/// Sets the cluster's `Restored` condition.
fn set_restored(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    holds: bool,
    reason: &str,
    message: String,
) {
    cond::set(
        &mut status.conditions,
        conditions::RESTORED,
        holds,
        reason,
        message,
        cluster.metadata.generation,
        &ctx.now(),
    );
}

/// Records the restore done (with the bootstrap that used it), with an Event.
pub async fn completed(ctx: &Context, cluster: &TalosCluster, status: &mut TalosClusterStatus) {
    let Some(restore) = status.restore.record.as_mut() else {
        return;
    };
    restore.completed_at = Some(ctx.now());
    let message = format!("etcd restored from {}", restore.key);
    set_restored(
        ctx,
        cluster,
        status,
        true,
        reasons::RESTORE_COMPLETED,
        message.clone(),
    );
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::RESTORE_COMPLETED,
        actions::RESTORE,
        message,
    )
    .await;
}

/// A failed upload before the recovering bootstrap: recorded, and no bootstrap.
pub async fn failed(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    failure: &Stop,
) {
    refuse(ctx, cluster, status, failure).await;
}

/// Records the backup checked (`status.restore`, `Restored` False while the first control plane
/// bootstraps from it).
pub(super) fn record_checked(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    checked: &RestoreStatus,
) {
    let message = format!(
        "backup {} checked ({} bytes, sha256 {}): the first control plane bootstraps from it",
        checked.key, checked.size, checked.sha256
    );
    set_restored(ctx, cluster, status, false, reasons::RESTORING, message);
    status.restore.record = Some(checked.clone());
}

/// Uploads the recorded backup to the bootstrap node (`EtcdRecover`), checked again as it
/// streams; an upload that does not check out is an error, and the caller does not bootstrap.
pub async fn upload(
    ctx: &Context,
    cluster: &TalosCluster,
    recorded: &RestoreStatus,
    client: &TalosClient,
) -> Result<(), Stop> {
    let Some(spec) = cluster.spec.restore_from.as_ref() else {
        return Ok(());
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let dest = backup::destination(&ctx.client, &namespace, &spec.store).await?;
    let record = read_record(dest.store.as_ref(), &dest.settings.bucket, &recorded.key).await?;
    let identity = identity_for(ctx, cluster, spec, &recorded.key, &record).await?;
    let (tx, rx) = mpsc::channel(CHUNKS_QUEUED);
    let (read, sent) = tokio::join!(
        read_through(&dest, &recorded.key, identity, Some(tx)),
        client.etcd_recover_from(rx)
    );
    let (object, snapshot) = read?;
    let digests = checked(&recorded.key, &record, object, snapshot)?;
    sent.map_err(|err| Stop {
        reason: reasons::TALOS_API,
        message: format!(
            "uploading {} to the bootstrap node failed: {err}",
            recorded.key
        ),
    })?;
    uploaded_as_checked(recorded, &record.vouched(&digests).sha256)
}
