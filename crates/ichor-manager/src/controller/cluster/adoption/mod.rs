//! Adopting a running Talos cluster (`spec.adopt`): each endpoint is probed
//! for its configured-mode certificate, reached with the bundle's credentials, and its live
//! config, version and hardware UUID read; [`plan::judge`] decides; only then are the
//! machines recorded (approved, pinned by that certificate, annotated as adopted), with the
//! cluster's bootstrap recorded done. Nothing is ever written to a node. The machine
//! reconciler records each adopted machine's live config as its applied baseline.
//!
//! The flow is [`adopt`], top to bottom: `observe` reads the nodes, [`plan::judge`] decides,
//! `act` records.

mod act;
mod observe;
pub mod plan;

use ichor_api::TalosCluster;
use ichor_api::cluster::TalosClusterStatus;
use ichor_api::common::Role;

use crate::{Context, Error};
use plan::{Observed, judge};

/// Adopts the cluster's nodes when it asks and has not yet: all of them, or none (a refusal on
/// `Adopted`, with an Event).
pub async fn adopt(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    bundle: &ichor_render::SecretsBundle,
) -> Result<(), Error> {
    let Some(spec) = cluster.spec.adopt.as_ref() else {
        return Ok(());
    };
    if status.core.adoption.is_some() {
        return Ok(());
    }
    if let Some(refusal) = observe::refused_address(ctx, cluster, spec).await? {
        return act::record_refusal(ctx, cluster, status, &refusal).await;
    }
    let credentials = ctx.node_credentials(cluster, bundle)?;
    let seen = observe::see_all(ctx, spec, &credentials).await;
    let observed: Vec<Observed> = seen.iter().map(|s| s.observed.clone()).collect();
    let fingerprint = crate::secrets::fingerprint(bundle);
    let adoptable = match judge(&cluster.spec, &fingerprint, &observed) {
        Ok(adoptable) => adoptable,
        Err(refusal) => return act::record_refusal(ctx, cluster, status, &refusal).await,
    };
    let mut names = Vec::new();
    for (s, (address, control_plane)) in seen.iter().zip(&adoptable.nodes) {
        let role = if *control_plane {
            Role::ControlPlane
        } else {
            Role::Worker
        };
        let name = act::record_machine(ctx, cluster, address, role, &s.fingerprint, &s.uuid);
        names.push(name.await?);
    }
    let first = adoptable
        .nodes
        .iter()
        .position(|(_, cp)| *cp)
        .and_then(|i| names.get(i))
        .cloned()
        .unwrap_or_default();
    act::record_adoption(ctx, cluster, status, names, first, &spec.endpoints).await;
    Ok(())
}
