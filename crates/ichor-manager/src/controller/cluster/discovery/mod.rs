//! Discovery: sweeps a cluster's address ranges and keeps one TalosMachine per machine, keyed
//! by its SMBIOS UUID. It only reads from nodes; the first fingerprint seen is pinned in
//! `spec.fingerprint`, later ones go to `status.observedFingerprint` and flag
//! `FingerprintChanged` — the pin is never overwritten. A machine it creates takes the claim
//! on its UUID at once, and with a `TalosNamespacePolicy` only the CIDRs inside the
//! namespace's ranges are swept (ADR 0054).
//!
//! The flow is [`run_once`] (and `sweep_when_due` before it): `observe` reads, `plan` decides
//! (pure, with the unit tests), `act` writes.

mod act;
mod observe;
pub mod plan;

use std::time::Duration;

use ichor_api::names::{actions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::discovery::SweepConfig;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::events::EventType;

pub use plan::sweep_due;
pub(crate) use plan::{hardware, machine_name};

use crate::{Context, Error};
use plan::{Sighting, allowed_cidrs, maintenance_by_uuid, sighting};

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Machines created.
    pub created: Vec<String>,
    /// Machines whose addresses or observations were updated.
    pub updated: Vec<String>,
    /// UUIDs answering at two addresses with two different certificates.
    pub conflicts: Vec<String>,
}

/// Sweeps the cluster's ranges when a sweep is due (a failed sweep is logged); the sweep
/// interval, if the cluster discovers, bounds the next requeue. An interval that does not read
/// is said in a Warning Event, and the default is swept at meanwhile.
pub(super) async fn sweep_when_due(ctx: &Context, cluster: &TalosCluster) -> Option<Duration> {
    let discovery = cluster.spec.discovery.as_ref()?;
    let interval = match super::plan::sweep_interval(&discovery.interval) {
        Ok(interval) => interval,
        Err(invalid) => {
            let note = format!(
                "{invalid}; sweeping every {}s meanwhile",
                super::plan::DEFAULT_SWEEP_INTERVAL.as_secs()
            );
            tracing::warn!(cluster = %cluster.name_any(), %note, "discovery interval does not read");
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::INVALID_DURATION,
                actions::DISCOVER,
                note,
            )
            .await;
            super::plan::DEFAULT_SWEEP_INTERVAL
        }
    };
    if ctx.sweep_due(cluster, interval) {
        match run_once(ctx, cluster, ctx.settings.sweep).await {
            Ok(report) => {
                if !report.created.is_empty() {
                    tracing::info!(cluster = %cluster.name_any(), created = ?report.created, "discovered machines");
                }
            }
            Err(error) => tracing::warn!(%error, "discovery sweep failed"),
        }
    }
    Some(interval)
}

/// Sweeps the cluster's ranges once and records what it found.
pub async fn run_once(
    ctx: &Context,
    cluster: &TalosCluster,
    config: SweepConfig,
) -> Result<SweepReport, Error> {
    let Some(discovery) = &cluster.spec.discovery else {
        return Ok(SweepReport::default());
    };
    let namespace = cluster.namespace().unwrap_or_default();
    let policy = observe::read_policy(ctx, cluster).await?;
    let (cidrs, refused) = allowed_cidrs(&discovery.cidrs, policy.as_ref());
    if !refused.is_empty() {
        act::report_refused(ctx, cluster, &namespace, &refused).await;
    }
    let probes = observe::sweep(ctx, &cidrs, config).await?;
    let by_uuid = maintenance_by_uuid(probes);
    if by_uuid.is_empty() {
        // Nothing in maintenance mode: nothing to record, so nothing to read.
        return Ok(SweepReport::default());
    }
    let machines: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let existing = observe::recorded(&machines, &by_uuid).await?;
    let mut report = SweepReport::default();
    for (uuid, found) in &by_uuid {
        match sighting(uuid, found, &existing) {
            Sighting::Conflict { addresses } => {
                act::report_conflict(ctx, cluster, uuid, &addresses).await;
                report.conflicts.push(uuid.clone());
            }
            Sighting::New { found } => {
                if let Some(name) = act::create(ctx, &machines, cluster, uuid, found).await? {
                    report.created.push(name);
                }
            }
            Sighting::Known {
                machine,
                found,
                endpoint,
            } => {
                act::update(ctx, &machines, machine, found, endpoint).await?;
                report.updated.push(machine.name_any());
            }
        }
    }
    Ok(report)
}
