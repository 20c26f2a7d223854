//! TalosStorage: the volumes a storage gives its machines are rendered into their configs (the
//! machine reconciler, `ichor_render::MachineLayers`); this reconciler observes what each
//! selected machine reports of them (its `VolumeStatus` resources, read over mutual TLS) and
//! writes that into the storage's status: per machine, each volume's phase, size and location,
//! and `Ready` saying whether all are ready, which failed, or what is still pending.

use std::sync::Arc;
use std::time::Duration;

use ichor_api::machine::ApprovalState;
use ichor_api::names::controllers;
use ichor_api::names::{conditions, reasons};
use ichor_api::storage::{StorageVolumes, TalosStorageStatus};
use ichor_api::{TalosCluster, TalosMachine, TalosStorage};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::error::Error;
use crate::infra::conditions as cond;
use crate::infra::shared::Changes;
use crate::infra::status::Guard;
use crate::{Context, infra::status};

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
    .with_config(crate::infra::drive::limits(&ctx))
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

async fn reconcile_inner(storage: &TalosStorage, ctx: &Context) -> Result<Action, Error> {
    let namespace = storage.namespace().unwrap_or_default();
    let cluster = Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
        .get_opt(&storage.spec.cluster_ref.name)
        .await?;
    let Some(cluster) = cluster else {
        let message = format!(
            "TalosCluster {} (spec.clusterRef) does not exist in namespace {namespace}",
            storage.spec.cluster_ref.name
        );
        write(
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
    let seen = observe(ctx, storage, &cluster).await?;
    let (new, holds, reason, message) = plan::plan(storage, &seen);
    write(ctx, storage, new, holds, reason, message).await?;
    Ok(Action::requeue(if holds {
        ctx.settings.settled_requeue
    } else {
        PENDING_REQUEUE
    }))
}

/// What each approved machine the storage selects reports of its volumes.
async fn observe(
    ctx: &Context,
    storage: &TalosStorage,
    cluster: &TalosCluster,
) -> Result<Vec<(String, Seen)>, Error> {
    let mut machines: Vec<TalosMachine> = crate::cluster_machines(ctx, cluster)
        .await?
        .into_iter()
        .filter(|m| m.spec.approval_state == ApprovalState::Approved && storage.selects(m))
        .collect();
    machines.sort_by_key(|m| m.name_any());
    let sources = ctx.layers.sources().await?;
    let bundle = crate::secrets::bundle(ctx, cluster).await?.ok();
    let mut seen = Vec::new();
    for machine in machines {
        let name = machine.name_any();
        if let Err(conflict) = sources.layers_for(&machine) {
            seen.push((name, Seen::Conflict(conflict.to_string())));
            continue;
        }
        let configured = machine
            .status
            .as_ref()
            .is_some_and(|s| s.applied.config_hash.is_some());
        let (Some(bundle), Some(address), true) = (
            bundle.as_ref(),
            crate::controller::machine::address(&machine),
            configured,
        ) else {
            seen.push((name, Seen::NotConfigured));
            continue;
        };
        let credentials = ctx.node_credentials(cluster, bundle)?;
        let volumes = match TalosClient::connect(&address, &credentials).await {
            Ok(client) => client.user_volumes().await.ok(),
            Err(_) => None,
        };
        seen.push((name, volumes.map_or(Seen::NotConfigured, Seen::Volumes)));
    }
    Ok(seen)
}

/// Writes the storage's status with `Ready`, when it changed.
async fn write(
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
