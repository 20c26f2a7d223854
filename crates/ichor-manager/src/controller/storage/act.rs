//! What a storage's reconcile writes: its status, with `Ready`, when it changed.

use ichor_api::TalosStorage;
use ichor_api::names::conditions;
use ichor_api::storage::{StorageVolumes, TalosStorageStatus};
use kube::ResourceExt as _;
use kube::api::Api;

use crate::error::Error;
use crate::infra::conditions as cond;
use crate::infra::status::Guard;
use crate::{Context, infra::status};

/// Writes the storage's status with `Ready`, when it changed.
pub(super) async fn write_status(
    ctx: &Context,
    storage: &TalosStorage,
    mut new: TalosStorageStatus,
    holds: bool,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let old = storage.status.clone().unwrap_or_default();
    new.conditions = old.conditions.clone();
    cond::set(
        &mut new.conditions,
        conditions::READY,
        holds,
        reason,
        message,
        storage.metadata.generation,
        &ctx.now(),
    );
    if old == new {
        return Ok(());
    }
    let api: Api<TalosStorage> =
        Api::namespaced(ctx.client.clone(), &storage.namespace().unwrap_or_default());
    status::apply::<StorageVolumes, _>(&api, storage, &new, Guard::None).await?;
    Ok(())
}
