//! What the teardown does and records: the hold for the allow-delete annotation, the
//! machines deleted, what is left in `Ready`, and the finalizer released once none is left;
//! each with its Event.

use ichor_api::names::{actions, conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams};
use kube::runtime::events::EventType;

use super::super::act::{clusters_api, write_status};
use crate::{Context, Error, infra::conditions as cond, secrets};

/// A teardown held for the allow-delete annotation: `Ready` False with the refusal, and a
/// Warning Event when it is first held.
pub(super) async fn record_held(
    ctx: &Context,
    cluster: &TalosCluster,
    refusal: &ichor_deleteguard::Refusal,
) -> Result<(), Error> {
    let stop = crate::Stop::new(refusal.reason(), refusal.message());
    let mut status = cluster.status.clone().unwrap_or_default();
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)
        .map(|c| c.reason.clone());
    stop.set_condition(
        &mut status.conditions,
        conditions::READY,
        cluster.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, cluster, &status).await?;
    if before.as_deref() != Some(stop.reason) {
        stop.warn(ctx, cluster, actions::DELETE).await;
    }
    Ok(())
}

/// `Ready` False while the teardown removes what is `left` (workers, control planes), written.
pub(super) async fn record_tearing_down(
    ctx: &Context,
    cluster: &TalosCluster,
    (workers, control_planes): (usize, usize),
) -> Result<(), Error> {
    let mut status = cluster.status.clone().unwrap_or_default();
    cond::set(
        &mut status.conditions,
        conditions::READY,
        false,
        reasons::TEARING_DOWN,
        format!(
            "the cluster is being deleted: {workers} worker(s) and {control_planes} control plane(s) left, removed workers first, then control planes one by one"
        ),
        cluster.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, cluster, &status).await
}

/// Deletes the TalosMachines `names` (one already gone is fine), an Event for each.
pub(super) async fn delete_machines(
    ctx: &Context,
    cluster: &TalosCluster,
    names: &[String],
) -> Result<(), Error> {
    let api: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    for name in names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.event(
                    cluster,
                    EventType::Normal,
                    reasons::TEARING_DOWN,
                    actions::DELETE,
                    format!("removing {name} (cluster teardown)"),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Every machine is removed: says the bundle Secret is kept and releases the cluster's finalizer.
pub(super) async fn finish_teardown(ctx: &Context, cluster: &TalosCluster) -> Result<(), Error> {
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::TEARING_DOWN,
        actions::DELETE,
        format!(
            "every machine removed; the secrets bundle Secret {} is kept (delete it yourself once you no longer need the cluster's CA keys)",
            secrets::bundle_secret_name(cluster)
        ),
    )
    .await;
    ctx.forget_credentials(cluster);
    crate::infra::finalizer::remove(
        &clusters_api(ctx, cluster),
        cluster,
        finalizers::CLUSTER_REMOVAL,
    )
    .await
}
