//! The parts of machined's `ApplyConfiguration` handler both simulated API modes share
//! (talos-facts §11.1): the request text, the mode and its details, the replies.

use ichor_talos::api::machine::apply_configuration_request::Mode;
use ichor_talos::api::machine::{ApplyConfiguration, ApplyConfigurationResponse};
use tonic::Status;

use super::{Container, Minor, Runtime, Talos, dryrun};
use crate::Node;

/// What the node is, for the checks.
pub(crate) fn runtime(node: &Node, maintenance: bool) -> Runtime<'_> {
    Runtime {
        talos: Talos::parse(&node.talos_version),
        disks: &node.hardware.disks,
        installed: node.installed,
        maintenance,
    }
}

/// The request's config as text; YAML that is not UTF-8 does not decode (the YAML reader's
/// message; not checked against Talos).
pub(crate) fn text(data: Vec<u8>) -> Result<String, Status> {
    String::from_utf8(data)
        .map_err(|_| Status::invalid_argument("decode error: yaml: invalid leading UTF-8 octet"))
}

pub(crate) const NO_REBOOT_DETAILS: &str = "Applied configuration without a reboot";
pub(crate) const STAGED_DETAILS: &str = "Staged configuration to be applied after the next reboot";
pub(crate) const REBOOT_DETAILS: &str = "Applied configuration with a reboot";

/// The mode in maintenance mode: `REBOOT` and `AUTO` become `NO_REBOOT` (1.13 ignores
/// whether the change could apply immediately there), `TRY` keeps its name with the
/// no-reboot details.
pub(crate) fn maintenance_mode(requested: i32) -> Result<(Mode, &'static str), Status> {
    match Mode::try_from(requested) {
        Ok(Mode::Reboot | Mode::Auto | Mode::NoReboot) => Ok((Mode::NoReboot, NO_REBOOT_DETAILS)),
        Ok(Mode::Try) => Ok((Mode::Try, NO_REBOOT_DETAILS)),
        Ok(Mode::Staged) => Ok((Mode::Staged, STAGED_DETAILS)),
        Err(_) => Err(incorrect_mode(requested)),
    }
}

/// An unknown mode number (1.14's default branch).
pub(crate) fn incorrect_mode(requested: i32) -> Status {
    Status::invalid_argument(format!(
        "incorrect mode '{requested}' specified for the apply config call"
    ))
}

/// 1.14 refuses `REBOOT` outside maintenance, before validating.
pub(crate) fn reboot_refused(talos: &Talos, requested: i32) -> Result<(), Status> {
    if talos.minor == Minor::V14 && requested == Mode::Reboot as i32 {
        return Err(Status::unimplemented(
            "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead",
        ));
    }
    Ok(())
}

/// The reply to an apply.
pub(crate) fn reply(
    mode: Mode,
    details: &str,
    warnings: Vec<String>,
) -> ApplyConfigurationResponse {
    ApplyConfigurationResponse {
        messages: vec![ApplyConfiguration {
            metadata: None,
            warnings,
            mode: mode as i32,
            mode_details: details.to_owned(),
        }],
    }
}

/// The reply to a dry run: the mode and the summary, no warnings (talos-facts §11.1).
pub(crate) fn dry_run(
    mode: Mode,
    details: &str,
    current: Option<&Container>,
    new: &Container,
) -> ApplyConfigurationResponse {
    reply(mode, &dryrun::summary(details, current, new), Vec::new())
}
