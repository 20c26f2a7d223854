//! Restoring a new cluster's etcd from a backup (`spec.restoreFrom`): before any bootstrap, the
//! backup is found (its key, or the newest taken with this cluster's bundle), its record read,
//! its bundle compared with `spec.secretsRef`'s, and the object read through (its SHA-256 as
//! stored, then decrypted when sealed) and checked against the record (the object and the
//! snapshot in it; a record of before ADR 0050 vouches for the snapshot only); only then is it
//! recorded (`status.restore`), and the
//! first control plane gets it (`EtcdRecover`, streamed, checked again as it passes) and
//! bootstraps from it (`recover_etcd`). The others join as new members. The record makes it run
//! once. Every refusal names its reason on the `Restored` condition, before any bootstrap.
//!
//! The flow is [`gate`], top to bottom: the step is [`plan::step`]'s decision (pure), the backup
//! is read and checked in `observe`, and what is found is recorded (and uploaded) in `act`.

mod act;
mod observe;
pub mod plan;

use ichor_api::TalosCluster;
use ichor_api::cluster::TalosClusterStatus;

pub use act::{completed, failed, upload};
pub use plan::{Gate, Step, step};

use crate::{Context, Error};

/// Runs the restore's step before the bootstrap: checks the backup when it was not yet, and
/// records the outcome in `status` (written by the cluster reconciler with the rest).
pub async fn gate(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    bundle_fingerprint: &str,
) -> Result<Gate, Error> {
    let spec = cluster.spec.restore_from.as_ref();
    match step(
        spec.is_some(),
        status.restore.record.as_ref(),
        status.core.bootstrap.as_ref(),
    ) {
        Step::NotRequested | Step::Done => Ok(Gate::Plain),
        Step::Refuse(stop) => {
            act::refuse(ctx, cluster, status, &stop).await;
            Ok(Gate::Hold)
        }
        Step::Recover => Ok(status
            .restore
            .record
            .clone()
            .map_or(Gate::Hold, Gate::Restore)),
        Step::Check => {
            let Some(spec) = spec else {
                return Ok(Gate::Plain);
            };
            match observe::check(ctx, cluster, spec, bundle_fingerprint).await {
                Ok(checked) => {
                    act::record_checked(ctx, cluster, status, &checked);
                    Ok(Gate::Restore(checked))
                }
                Err(failure) => {
                    act::refuse(ctx, cluster, status, &failure).await;
                    Ok(Gate::Hold)
                }
            }
        }
    }
}
