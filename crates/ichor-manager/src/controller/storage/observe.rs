//! What a storage's reconcile reads: its cluster, the machines it selects, the layers and the
//! bundle, and each configured machine's volumes as the node reports them. Nothing here
//! writes.

use ichor_api::machine::ApprovalState;
use ichor_api::{TalosCluster, TalosMachine, TalosStorage};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::api::Api;

use super::Seen;
use crate::Context;
use crate::error::Error;

/// The storage's TalosCluster (`None`: it does not exist).
pub(super) async fn read_cluster(
    ctx: &Context,
    storage: &TalosStorage,
) -> Result<Option<TalosCluster>, Error> {
    let namespace = storage.namespace().unwrap_or_default();
    Ok(
        Api::<TalosCluster>::namespaced(ctx.client.clone(), &namespace)
            .get_opt(&storage.spec.cluster_ref.name)
            .await?,
    )
}

/// What each approved machine the storage selects reports of its volumes.
pub(super) async fn read_volumes(
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
