//! What the drift rollout reads: the node's boot id while a reboot for drift is in flight, and
//! the halt recorded on the cluster, as stored. Nothing here writes.

use ichor_api::TalosCluster;
use ichor_api::cluster::DriftHaltStatus;
use ichor_api::machine::TalosMachineStatus;
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::api::Api;

use crate::{Context, Error};

/// The node's boot id now, read only while a reboot for drift is in flight (it tells that
/// reboot done from not begun).
pub(in super::super) async fn read_boot_id_while_rebooting(
    client: Option<&TalosClient>,
    status: &TalosMachineStatus,
) -> Option<String> {
    status.drift.boot_id.as_ref()?;
    client?.boot_id().await.ok()
}

/// The halt recorded on `cluster` as stored now (not as cached): the machine that refused its
/// changed config, the config's hash and what the node answered.
pub(super) async fn read_halt(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Option<DriftHaltStatus>, Error> {
    let fresh = Api::<TalosCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    )
    .get_opt(&cluster.name_any())
    .await?;
    Ok(fresh
        .as_ref()
        .and_then(|c| c.status.as_ref())
        .and_then(|s| s.drift.halt.clone()))
}
