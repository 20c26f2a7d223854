//! TalosStorage: the volumes a storage gives its machines are rendered into their configs (the
//! machine reconciler, `ichor_render::MachineLayers`); this reconciler observes what each
//! selected machine reports of them (its `VolumeStatus` resources, read over mutual TLS) and
//! writes that into the storage's status: per machine, each volume's phase, size and location,
//! and `Ready` saying whether all are ready, which failed, or what is still pending.
//!
//! What the reconcile reads is `observe`'s, the status it builds [`plan`]'s, its write `act`'s.

use std::sync::Arc;
use std::time::Duration;

use ichor_api::names::{controllers, reasons};
use ichor_api::storage::TalosStorageStatus;
use ichor_api::{TalosMachine, TalosStorage};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::Context;
use crate::error::Error;
use crate::infra::shared::Changes;

mod act;
mod observe;
pub mod plan;

pub use plan::Seen;

/// How often a storage whose volumes are not all ready looks again.
pub(crate) const PENDING_REQUEUE: Duration = Duration::from_secs(10);

/// The TalosStorage controller: a machine's change (configured, ready, relabelled) may change
/// what a storage of its cluster selects and observes.
pub(crate) async fn run_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let cache = Arc::clone(&ctx);
    let controller = Controller::new(
        Api::<ichor_api::TalosStorage>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    // The machines from the manager's one machine watch (`Context::machines`).
    .watches_shared_stream(
        ctx.machines.subscribe(Changes::Touched),
        move |m: Arc<TalosMachine>| {
            cache
                .layers
                .storages()
                .into_iter()
                .filter(|s| {
                    s.namespace() == m.namespace()
                        && s.spec.cluster_ref.name == m.spec.cluster_ref.name
                })
                .map(|s| ObjectRef::from_obj(&*s))
                .collect::<Vec<_>>()
        },
    );
    crate::infra::drive::drive(controllers::STORAGE, controller, reconcile, ctx, stop).await;
}

/// Reconciles one TalosStorage: observe its machines' volumes, plan the status, write it.
pub async fn reconcile(storage: Arc<TalosStorage>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&storage, &ctx).await;
    ctx.metrics.reconciled("TalosStorage", started.elapsed());
    result
}

/// Observes the storage's cluster and its machines' volumes, plans the status, and writes it.
async fn reconcile_inner(storage: &TalosStorage, ctx: &Context) -> Result<Action, Error> {
    let Some(cluster) = observe::read_cluster(ctx, storage).await? else {
        let message = format!(
            "TalosCluster {} (spec.clusterRef) does not exist in namespace {}",
            storage.spec.cluster_ref.name,
            storage.namespace().unwrap_or_default()
        );
        act::write_status(
            ctx,
            storage,
            TalosStorageStatus::default(),
            false,
            reasons::CLUSTER_NOT_FOUND,
            message,
        )
        .await?;
        return Ok(Action::requeue(ctx.settings.settled_requeue));
    };
    let seen = observe::read_volumes(ctx, storage, &cluster).await?;
    let (new, holds, reason, message) = plan::plan(storage, &seen);
    act::write_status(ctx, storage, new, holds, reason, message).await?;
    Ok(Action::requeue(if holds {
        ctx.settings.settled_requeue
    } else {
        PENDING_REQUEUE
    }))
}
