//! What a node is brought to (ADRs 0068, 0069): the versions the manager renders and upgrades
//! with, and the upgrade a node needs to run them. The manager decides with these, and
//! `kubectl ichor plan` forecasts with the same functions.

use std::borrow::Cow;

use ichor_api::TalosCluster;
use ichor_api::machine::TalosMachineStatus;
use ichor_api::names::{conditions, reasons};

use crate::Rendered;

/// Where a node is to go: the installer image, the Talos version, and the schematic its node
/// must report after (when Ichor derived the installer from one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The installer image.
    pub image: String,
    /// The declared Talos version.
    pub version: String,
    /// The schematic ID the node must report, when verified.
    pub schematic: Option<String>,
}

/// A version without its leading `v`, for comparing what a node reports with what is
/// declared.
fn bare(version: &str) -> &str {
    version.strip_prefix('v').unwrap_or(version)
}

/// Whether `running` is `declared`, with or without the leading `v`.
#[must_use]
pub fn same_version(running: &str, declared: &str) -> bool {
    bare(running) == bare(declared)
}

/// The upgrade a node needs to run what `cluster` declares (`None`: it runs it, or it has not
/// said what it runs): another Talos version, or another schematic than its installer is
/// derived from. A node that reports no schematic is not upgraded for its schematic alone:
/// unknown is not different.
#[must_use]
pub fn target(
    cluster: &TalosCluster,
    status: &TalosMachineStatus,
    rendered: &Rendered,
) -> Option<Target> {
    let running = status.inventory.talos_version.as_deref()?;
    let declared = &cluster.spec.talos_version;
    let version_differs = !same_version(running, declared);
    let schematic_differs = match (&rendered.installer.schematic, &status.inventory.schematic) {
        (Some(wanted), Some(reported)) => wanted != reported,
        _ => false,
    };
    (version_differs || schematic_differs).then(|| Target {
        image: rendered.installer.image.clone(),
        version: declared.clone(),
        schematic: rendered.installer.schematic.clone(),
    })
}

/// The image a machine is to be upgraded with, for the rollout's order: the one its upgrade in
/// flight was recorded with, else the one it needs.
#[must_use]
pub fn upgrade_image(
    cluster: &TalosCluster,
    status: &TalosMachineStatus,
    rendered: &Rendered,
) -> Option<String> {
    status
        .upgrade
        .record
        .as_ref()
        .map(|r| r.image.clone())
        .or_else(|| target(cluster, status, rendered).map(|t| t.image))
}

/// `cluster` as its nodes are to be brought: the spec's versions replaced by the accepted ones
/// (`status.acceptedVersions`; unchanged while nothing was accepted yet). `Err` with the
/// refusal when nothing was ever accepted and the cluster says the declaration breaks a rule:
/// nothing may render from it.
///
/// # Errors
///
/// The message of the cluster's `VersionChangeRefused` condition, when no version was accepted.
pub fn effective(cluster: &TalosCluster) -> Result<Cow<'_, TalosCluster>, String> {
    let status = cluster.status.as_ref();
    let Some(accepted) = status.and_then(|s| s.core.accepted_versions.as_ref()) else {
        let refused = status.and_then(|s| {
            s.conditions.iter().find(|c| {
                c.type_ == conditions::VERSION_ROLLED_OUT
                    && c.reason == reasons::VERSION_CHANGE_REFUSED
            })
        });
        return match refused {
            Some(condition) => Err(condition.message.clone()),
            None => Ok(Cow::Borrowed(cluster)),
        };
    };
    if accepted.talos_version == cluster.spec.talos_version
        && accepted.kubernetes_version == cluster.spec.kubernetes_version
    {
        return Ok(Cow::Borrowed(cluster));
    }
    let mut effective = cluster.clone();
    effective
        .spec
        .talos_version
        .clone_from(&accepted.talos_version);
    effective
        .spec
        .kubernetes_version
        .clone_from(&accepted.kubernetes_version);
    Ok(Cow::Owned(effective))
}
