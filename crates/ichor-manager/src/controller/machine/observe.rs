//! What the machine reconcile reads: its cluster and the secrets bundle, the machine as stored
//! now, and what its node answers (version, machine status, etcd, install, live config). Nothing
//! here writes: no status, no Event, no call that changes a node.

use ichor_api::common::Role;
use ichor_api::machine::MachinePhase;
use ichor_api::names::reasons;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;

use super::plan::{Answers, Blocked, InstallSeen, NodeView};
use super::{Reach, api};
use crate::etcd::Etcd;
use crate::{Context, Error, secrets};

/// The machine as stored now (not as cached), `None` once it is gone.
pub(super) async fn read_stored(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<Option<TalosMachine>, Error> {
    Ok(api(ctx, machine).get_opt(&machine.name_any()).await?)
}

/// What kept an adopted node's live config from being read.
#[derive(Debug, thiserror::Error)]
pub(super) enum LiveConfigUnread {
    /// No mutual-TLS connection was made.
    #[error("the adopted node does not answer")]
    Silent,
    /// The node answered and the read failed.
    #[error(transparent)]
    Refused(#[from] ichor_talos::TalosError),
}

/// An adopted node's live config, read over mutual TLS, or what kept it from being read.
pub(super) async fn read_live_config(reach: &Reach<'_>) -> Result<String, LiveConfigUnread> {
    let Some(client) = crate::connect(reach.address, reach.credentials).await else {
        return Err(LiveConfigUnread::Silent);
    };
    Ok(client.live_config().await?)
}

/// The machine's cluster and the secrets bundle its configs render from, or why there are
/// none yet (a missing cluster, a bundle not there or not valid).
pub(super) async fn read_cluster_and_bundle(
    ctx: &Context,
    machine: &TalosMachine,
) -> Result<Result<(TalosCluster, ichor_render::SecretsBundle), Blocked>, Error> {
    let namespace = machine.namespace().unwrap_or_default();
    // From the shared cluster cache: a change of the cluster reaches the cache before it wakes
    // its machines.
    let Some(cluster) =
        crate::context::cached_cluster(ctx, &namespace, &machine.spec.cluster_ref.name).await?
    else {
        return Ok(Err(Blocked::approved(
            reasons::CLUSTER_NOT_FOUND,
            format!(
                "TalosCluster {} (spec.clusterRef) does not exist in namespace {namespace}",
                machine.spec.cluster_ref.name
            ),
        )));
    };
    // Rendered and upgraded with the versions accepted, not the spec's own (ADR 0069).
    let cluster = match crate::accepted::effective(&cluster) {
        Ok(effective) => effective.into_owned(),
        Err(refusal) => {
            return Ok(Err(Blocked::approved(
                reasons::VERSION_CHANGE_REFUSED,
                format!("the cluster's declared versions are refused: {refusal}"),
            )));
        }
    };
    Ok(match secrets::bundle(ctx, &cluster).await? {
        Ok(bundle) => Ok((cluster, bundle)),
        Err(problem) => Err(Blocked {
            phase: MachinePhase::Approved,
            stop: problem.into(),
        }),
    })
}

/// Whether the machine as stored now (not as cached) already records an applied config.
pub(super) async fn applied_since(ctx: &Context, machine: &TalosMachine) -> Result<bool, Error> {
    Ok(read_stored(ctx, machine).await?.is_some_and(|fresh| {
        fresh
            .status
            .as_ref()
            .is_some_and(|s| s.applied.config_hash.is_some())
    }))
}

/// Whether the node already answers mutual TLS with this cluster's CA: an earlier apply that
/// was interrupted before it was recorded.
pub(super) async fn already_ours(address: &str, credentials: &ichor_talos::Credentials) -> bool {
    match crate::connect(address, credentials).await {
        Some(client) => client.version().await.is_ok(),
        None => false,
    }
}

/// What the configured node answers over mutual TLS: its machine status (`None` if it does
/// not answer that), its etcd membership for a control plane, its version and hostname.
pub(super) async fn ask_node(
    client: &TalosClient,
    role: Role,
    status: &ichor_api::machine::TalosMachineStatus,
) -> Option<Answers> {
    let machine_status = client.machine_status().await.ok()?;
    let etcd = match role {
        Role::Worker => Etcd::NotMember,
        Role::ControlPlane => crate::etcd::etcd_answered(client.etcd_status().await),
    };
    let version = client.version().await.ok();
    let hostname = client.hostname().await.ok();
    // The extensions change only with the installer, that is with an upgrade (talos-facts
    // §9.5): read when none were recorded, the version moved, or an upgrade is in flight.
    let extensions = if super::plan::extensions_due(status, version.as_deref()) {
        client.extensions().await.ok()
    } else {
        None
    };
    Some(Answers {
        view: NodeView {
            stage: machine_status.stage,
            etcd,
        },
        version,
        hostname,
        extensions,
    })
}

/// What the install of a machine not yet `Installed` shows: read over mutual TLS when the node
/// answers there (`client` and its `view`), else over the maintenance connection.
pub(super) async fn read_install_seen(
    ctx: &Context,
    address: &str,
    pinned: &str,
    client: Option<&TalosClient>,
    view: Option<NodeView>,
) -> InstallSeen {
    match (client, view) {
        (Some(client), Some(view)) => read_install(client, Some(view.stage), true).await,
        _ => install_in_maintenance(ctx, address, pinned).await,
    }
}

/// How long the event log may stay quiet before its backlog counts as read, when looking for
/// the install sequence's FATAL error.
const EVENTS_QUIET: std::time::Duration = std::time::Duration::from_millis(200);

/// What `client` shows of the install: the 1.14 unattended install status and, while the
/// stage is `installing` or `rebooting` without one, the install sequence's FATAL error.
async fn read_install(
    client: &TalosClient,
    stage: Option<ichor_talos::Stage>,
    configured: bool,
) -> InstallSeen {
    let unattended = client
        .unattended_install()
        .await
        .ok()
        .flatten()
        .map(|u| (u.phase, u.error));
    let fatal = if unattended.is_none()
        && matches!(
            stage,
            Some(ichor_talos::Stage::Installing | ichor_talos::Stage::Rebooting)
        ) {
        client.install_failure(EVENTS_QUIET).await.ok().flatten()
    } else {
        None
    };
    InstallSeen {
        stage,
        configured,
        unattended,
        fatal,
        new_certificate: None,
    }
}

/// The install seen when the node does not answer over mutual TLS: back in maintenance mode
/// on another certificate, or still there on the pinned one (read over that connection).
async fn install_in_maintenance(ctx: &Context, address: &str, pinned: &str) -> InstallSeen {
    match crate::in_maintenance(address, ctx.settings.sweep).await {
        Some(fingerprint) if fingerprint != pinned => InstallSeen {
            new_certificate: Some(fingerprint),
            ..InstallSeen::default()
        },
        Some(_) => match TalosClient::connect_maintenance(address, pinned).await {
            Ok(client) => {
                let stage = client.machine_status().await.ok().map(|s| s.stage);
                read_install(&client, stage, false).await
            }
            Err(_) => InstallSeen::default(),
        },
        None => InstallSeen::default(),
    }
}
