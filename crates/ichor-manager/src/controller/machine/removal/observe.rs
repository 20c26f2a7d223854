//! What a removal reads: the machine and its cluster as stored now, the other control planes'
//! addresses, and what their etcd says of a member. Nothing here writes.

use ichor_api::common::Role;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use super::Scene;
use crate::{Context, Error};

/// The machine as stored now (not as cached), `None` once it is gone.
pub(super) async fn read_stored(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<Option<TalosMachine>, Error> {
    Ok(super::machines_api(ctx, machine)
        .get_opt(&machine.name_any())
        .await?)
}

/// The machine's cluster as stored now, `None` once it is gone.
pub(super) async fn read_cluster(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<Option<TalosCluster>, Error> {
    let clusters: Api<TalosCluster> =
        Api::namespaced(ctx.client.clone(), &machine.namespace().unwrap_or_default());
    Ok(clusters.get_opt(&machine.spec.cluster_ref.name).await?)
}

/// Addresses of the other configured control planes of the machine's cluster.
pub(super) async fn peer_addresses(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<Vec<String>, Error> {
    Ok(super::machines_api(ctx, machine)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|m| {
            m.spec.cluster_ref.name == machine.spec.cluster_ref.name
                && m.name_any() != machine.name_any()
                && m.spec.role == Some(Role::ControlPlane)
                && m.metadata.deletion_timestamp.is_none()
                && m.status
                    .as_ref()
                    .is_some_and(|s| s.applied.config_hash.is_some())
        })
        .filter_map(|m| m.status.and_then(|s| s.inventory.address))
        .collect())
}

impl Scene<'_> {
    /// Clients of the other configured control planes that answer.
    pub(super) async fn peers(&self) -> Result<Vec<TalosClient>, Error> {
        let mut clients = Vec::new();
        for address in peer_addresses(self.ctx, self.machine).await? {
            if let Some(client) = crate::connect(&address, &self.credentials).await {
                clients.push(client);
            }
        }
        Ok(clients)
    }

    /// Whether a healthy peer confirms `member` is gone (`None`: no peer answered).
    pub(super) async fn gone_from_etcd(&self, member: u64) -> Result<Option<bool>, Error> {
        for peer in self.peers().await? {
            if let Ok(members) = peer.etcd_members(false).await {
                return Ok(Some(!members.iter().any(|m| m.id == member)));
            }
        }
        Ok(None)
    }
}
