//! What the cluster reconciler reads: its machines (as stored, or from the shared cache), its
//! published credentials files, its bootstrap candidates and whether etcd runs, and what
//! answers at a tombstoned address. Nothing here writes: no status, no Event, no call that
//! changes a node.

use std::time::Duration;

use ichor_api::cluster::Tombstone;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Candidate, IdentityRefusal, Meant};
use ichor_render::credentials::Published;
use ichor_talos::TalosClient;
use kube::ResourceExt as _;

use super::plan;
use crate::identity::Checked;
use crate::{Context, Error, secrets};

/// The cluster's machines: as stored until the bundle is recorded and etcd bootstrapped (the
/// never-regenerate and bootstrap-exactly-once rules, [`plan::reads_machines_as_stored`]);
/// from the shared cache after.
pub(super) async fn read_machines(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Vec<TalosMachine>, Error> {
    if plan::reads_machines_as_stored(cluster) {
        crate::cluster_machines_as_stored(ctx, cluster).await
    } else {
        crate::cluster_machines(ctx, cluster).await
    }
}

/// The file published under `key` of Secret `name`, as `read` reads it (`None`: none yet, or
/// one that does not read); [`secrets::NameTaken`] when another Secret holds the name.
pub(super) async fn read_published(
    ctx: &Context,
    cluster: &TalosCluster,
    (name, key, what): (&str, &str, &'static str),
    read: impl FnOnce(&str) -> Option<Published>,
) -> Result<Result<Option<Published>, secrets::NameTaken>, Error> {
    let text = match secrets::read_published(ctx, cluster, (name, what), key).await? {
        Ok(text) => text,
        Err(taken) => return Ok(Err(taken)),
    };
    Ok(Ok(text.as_deref().and_then(read)))
}

/// Each configured control plane as a bootstrap candidate: whether it answers and how many etcd
/// members it reports; the connections are kept for the call.
pub(super) async fn bootstrap_candidates(
    machines: &[TalosMachine],
    credentials: &ichor_talos::Credentials,
) -> (Vec<Candidate>, Vec<(String, Option<TalosClient>)>) {
    let mut candidates = Vec::new();
    let mut clients = Vec::new();
    for m in machines.iter().filter(|m| plan::bootstrap_candidate(m)) {
        let client = crate::connect(&plan::bootstrap_address(m), credentials).await;
        let members = match &client {
            Some(c) => c.etcd_members(true).await.map(|m| m.len()).unwrap_or(0),
            None => 0,
        };
        candidates.push(Candidate {
            name: m.name_any(),
            uid: m.uid().unwrap_or_default(),
            reachable: client.is_some(),
            members,
        });
        clients.push((m.name_any(), client));
    }
    (candidates, clients)
}

/// Whether etcd runs on the node behind `client` (it reports members).
pub(super) async fn etcd_runs(client: &TalosClient) -> bool {
    client
        .etcd_members(true)
        .await
        .is_ok_and(|members| !members.is_empty())
}

/// What answers at a tombstoned address.
pub(super) enum TombstoneLook {
    /// Nothing answers the cluster's credentials, and no node in maintenance mode.
    Silent,
    /// A node in maintenance mode: it was reset, nothing more is needed.
    InMaintenance,
    /// A node answers the cluster's credentials, and its identity could not be read.
    Unread,
    /// A node answers the cluster's credentials and is not told to be the machine removed.
    Refused(IdentityRefusal),
    /// The machine removed answers the cluster's credentials again: `client` reaches it.
    Verified(TalosClient),
}

/// What answers at `stone`'s address: the cluster's credentials tried first (for two seconds),
/// then maintenance mode; a node that answers is told to be the machine removed (its SMBIOS
/// UUID, ADR 0052) before it could be reset.
pub(super) async fn look_at_tombstone(
    ctx: &Context,
    credentials: &ichor_talos::Credentials,
    stone: &Tombstone,
) -> TombstoneLook {
    let answered = tokio::time::timeout(Duration::from_secs(2), async {
        let client = crate::connect(&stone.address, credentials).await?;
        client.version().await.ok().map(|_| client)
    })
    .await
    .ok()
    .flatten();
    let Some(client) = answered else {
        let maintenance = crate::in_maintenance(&stone.address, ctx.settings.sweep)
            .await
            .is_some();
        return if maintenance {
            TombstoneLook::InMaintenance
        } else {
            TombstoneLook::Silent
        };
    };
    let meant = Meant::Tombstone(stone.machine.clone());
    let recorded = stone.uuid.as_deref();
    match crate::identity::check(&client, &meant, &stone.address, "reset", recorded).await {
        Checked::Verified => TombstoneLook::Verified(client),
        Checked::Refused(refusal) => TombstoneLook::Refused(refusal),
        Checked::Unread(_) => TombstoneLook::Unread,
    }
}
