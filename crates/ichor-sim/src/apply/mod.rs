//! Applying a config as Talos's machined applies it (talos-facts §11): the loader, the
//! validation machined runs on `ApplyConfiguration` (per release: 1.13 `Validate` then
//! `RuntimeValidate`, 1.14 `ValidateAtRuntime`; no options, so not strict and not local), the
//! install disk against the simulated disks, and the dry-run summary.
//!
//! What is not modelled is accepted, as Talos accepts a valid value: see `talos-facts §11.6`
//! for the list of Talos checks this module leaves out.

pub(crate) mod cel;
pub(crate) mod decode;
pub(crate) mod disks;
mod documents;
pub(crate) mod dryrun;
pub(crate) mod glob;
pub(crate) mod gofmt;
pub(crate) mod handler;
mod v1alpha1;
pub(crate) mod yaml;

pub(crate) use decode::Container;
pub(crate) use v1alpha1::default_k8s;

use crate::hardware::SimDisk;

/// The Talos minor whose rules apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Minor {
    V13,
    V14,
}

/// The running Talos release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Talos {
    pub(crate) minor: Minor,
    /// The release as semver, e.g. `1.14.1` (Talos's messages print it so).
    pub(crate) version: String,
}

impl Talos {
    /// From a tag such as `v1.13.9`; anything but 1.13 follows the 1.14 rules.
    pub(crate) fn parse(tag: &str) -> Self {
        let version = tag.trim_start_matches('v').to_owned();
        let minor = if version.starts_with("1.13.") || version == "1.13" {
            Minor::V13
        } else {
            Minor::V14
        };
        Self { minor, version }
    }
}

/// What the node is when the config arrives.
#[derive(Debug, Clone)]
pub(crate) struct Runtime<'a> {
    pub(crate) talos: Talos,
    pub(crate) disks: &'a [SimDisk],
    /// Talos is installed to disk: the metal mode then does not require an install.
    pub(crate) installed: bool,
    /// No complete config yet (maintenance mode).
    pub(crate) maintenance: bool,
}

impl Runtime<'_> {
    /// machined's `modeWrapper`: metal requires an install until the machine is installed.
    pub(crate) fn requires_install(&self) -> bool {
        !self.installed
    }
}

/// Why an unattended install waits (the status's `error`, talos-facts §11.7).
pub(crate) const PENDING_REASON: &str = "no disk matched the selector";

/// Loads the config as machined does first (`configloader.NewFromBytes`, then, outside
/// maintenance, the v1alpha1 document is required); the error is the `InvalidArgument`
/// message.
pub(crate) fn load(rt: &Runtime, source: &str) -> Result<Container, String> {
    let container = decode::load(&rt.talos, source)?;
    if !rt.maintenance && container.v1alpha1.is_none() {
        return Err("the applied machine configuration doesn't contain v1alpha1 config, did you mean to patch the machine config instead?".into());
    }
    Ok(container)
}

/// machined's validation of a loaded config: the warnings it returns, or the
/// `InvalidArgument` message.
pub(crate) fn validate(rt: &Runtime, container: &Container) -> Result<Vec<String>, String> {
    let disks = disks::disk_fields(rt.disks);
    let validated = documents::validate(rt, container);
    let mut runtime_errors = Vec::new();
    let mut runtime_warnings = Vec::new();
    if let Some(v1) = &container.v1alpha1 {
        let r = v1alpha1::runtime_validate(rt, v1, &disks);
        runtime_warnings = r.warnings;
        if !r.errors.is_empty() {
            runtime_errors.push(format!("v1alpha1.Config: {}", gofmt::multierror(&r.errors)));
        }
    }
    match rt.talos.minor {
        // machined 1.13: Validate, answered on its own, then RuntimeValidate.
        Minor::V13 => {
            if !validated.errors.is_empty() {
                return Err(gofmt::multierror(&validated.errors));
            }
            if !runtime_errors.is_empty() {
                return Err(gofmt::multierror(&runtime_errors));
            }
        }
        // machined 1.14: ValidateAtRuntime, one multierror of both.
        Minor::V14 => {
            let mut all = validated.errors;
            all.extend(runtime_errors);
            if !all.is_empty() {
                return Err(gofmt::multierror(&all));
            }
        }
    }
    let mut warnings = validated.warnings;
    warnings.extend(runtime_warnings);
    Ok(warnings)
}

/// Where an accepted config installs Talos (talos-facts §11.5, §11.7).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InstallPlan {
    /// Nothing to install: the node boots on from what it booted from.
    None,
    /// The install sequence (`machine.install`, both releases): the disk it resolves to, or
    /// the error the install task fails with.
    Sequence {
        disk: Result<String, String>,
        image: String,
    },
    /// The unattended-install controller (1.14 `UnattendedInstallConfig`): the first disk the
    /// selector matches (none: the install stays pending), the image, and whether a reboot
    /// follows.
    Unattended {
        disk: Option<String>,
        image: String,
        reboot: bool,
    },
}

/// The install an accepted config asks for, against the simulated disks.
pub(crate) fn install_plan(rt: &Runtime, container: &Container) -> InstallPlan {
    let disks = disks::disk_fields(rt.disks);
    if rt.talos.minor == Minor::V14
        && let Some(doc) = container.doc("UnattendedInstallConfig")
    {
        let image = doc.node.str_at(&["installer", "image"]);
        let expression = doc.node.str_at(&["provisioning", "diskSelector", "match"]);
        let disk = cel::parse_bool(&expression).ok().and_then(|selector| {
            disks
                .iter()
                .find(|d| selector.matches(d).unwrap_or(false))
                .map(|d| d.dev_path.clone())
        });
        let reboot = doc.node.bool_at(&["reboot"]).unwrap_or(!image.is_empty());
        return InstallPlan::Unattended {
            disk,
            image,
            reboot,
        };
    }
    let Some(install) = container
        .v1alpha1
        .as_ref()
        .and_then(|d| d.at(&["machine", "install"]))
    else {
        return InstallPlan::None;
    };
    let image = install.str_at(&["image"]);
    let disk = match disks::legacy_selector(install) {
        Ok(Some(selector)) => disks
            .iter()
            .find(|d| selector.matches(d))
            .map(|d| d.dev_path.clone())
            .ok_or_else(|| format!("no disks matched the expression: {}", selector.expression)),
        Ok(None) => {
            let path = install.str_at(&["disk"]);
            if disks.iter().any(|d| d.dev_path == path) {
                Ok(path)
            } else {
                Err(format!("lstat {path}: no such file or directory"))
            }
        }
        Err(e) => Err(format!("failed to get disk match expression: {e}")),
    };
    InstallPlan::Sequence { disk, image }
}
