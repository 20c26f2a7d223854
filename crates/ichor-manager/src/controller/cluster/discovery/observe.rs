//! What a sweep reads: the namespace's policy, the answers of its address ranges, and the
//! machines of the namespace that record a UUID found. Nothing here writes.

use std::collections::BTreeMap;

use ichor_api::{TalosCluster, TalosMachine, TalosNamespacePolicy};
use ichor_talos::discovery::{Found, Probe, SweepConfig, sweep_sharing};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams};

use super::plan::records;
use crate::{Context, Error};

/// The TalosNamespacePolicy of the cluster's namespace, if it has one.
pub(super) async fn read_policy(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Option<TalosNamespacePolicy>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    Ok(crate::claims::policy(&ctx.client, &namespace).await?)
}

/// What answers in `cidrs`, probed once (a probe another sweep is making is shared).
pub(super) async fn sweep(
    ctx: &Context,
    cidrs: &[String],
    config: SweepConfig,
) -> Result<Vec<Probe>, Error> {
    sweep_sharing(cidrs, config, &ctx.probes)
        .await
        .map_err(|e| Error::Spec {
            field: "spec.discovery.cidrs",
            problem: e.to_string(),
        })
}

/// Machines per page when a sweep reads its namespace's machines.
const PAGE: u32 = 100;

/// The machines of the namespace that record one of the `found` UUIDs, read page by page: a
/// sweep never holds every machine of the namespace at once (a fleet's namespace read whole
/// by each of sixteen concurrent sweeps was most of the manager's memory at 1000 machines,
/// `docs/benchmarks/fleet.md`).
pub(super) async fn recorded(
    machines: &Api<TalosMachine>,
    found: &BTreeMap<String, Vec<Found>>,
) -> Result<Vec<TalosMachine>, Error> {
    let mut kept = Vec::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = machines.list(&params).await?;
        kept.extend(
            page.items
                .into_iter()
                .filter(|m| found.keys().any(|uuid| records(m, uuid))),
        );
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(kept),
        }
    }
}
