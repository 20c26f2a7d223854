//! Whether the node answering at an address is the machine a destructive step is meant for
//! (ADR 0052). An address is no identity: a replacement machine can take a removed one's static
//! IP, and one that answers the cluster's credentials (its old disks moved into a new board, a
//! reinstall from the same config) would take a reset meant for the old one. The identity is the
//! machine's SMBIOS UUID (talos-facts §8.1): recorded when the machine was discovered, read again
//! over the same mutual-TLS connection right before the step, and compared here.
//!
//! Nothing recorded is no identity either: the step is refused, and the message says what a
//! person can do.

use std::fmt;

use ichor_api::names::labels;

use crate::verdict::reasons;

/// What a destructive step is meant for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Meant {
    /// A TalosMachine, by name.
    Machine(String),
    /// The tombstone of a force-removed TalosMachine, by the machine's name.
    Tombstone(String),
}

/// A destructive step refused because the node answering may not be the machine meant;
/// `Display` gives the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityRefusal {
    /// The node reports another SMBIOS UUID than the one recorded.
    Mismatch {
        /// What the step was meant for.
        meant: Meant,
        /// Where the node answered.
        address: String,
        /// The step, as a noun (`reset`, `reboot`, `config apply`).
        step: &'static str,
        /// The UUID recorded for what is meant.
        recorded: String,
        /// The UUID the node reported.
        reported: String,
    },
    /// No UUID is recorded for what is meant, so no node can be told to be it.
    Unrecorded {
        /// What the step was meant for.
        meant: Meant,
        /// Where the node answered.
        address: String,
        /// The step, as a noun.
        step: &'static str,
    },
}

impl IdentityRefusal {
    /// The condition reason (CamelCase).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Mismatch { .. } => reasons::NODE_IDENTITY_MISMATCH,
            Self::Unrecorded { .. } => reasons::NODE_IDENTITY_UNRECORDED,
        }
    }

    /// What is refused and what a person can do about it.
    pub fn message(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for IdentityRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Mismatch {
                meant: Meant::Machine(name),
                address,
                step,
                recorded,
                reported,
            } => write!(
                f,
                "the node at {address} reports SMBIOS UUID {reported}, not {recorded} as \
                 recorded for talosmachine {name}: it is another machine, so no {step} is sent \
                 to it; it is retried once the node at {address} is {recorded} again (if the \
                 machine was replaced, delete talosmachine {name}: with \
                 ichor.maesh.dev/force-remove=true its removal skips the node)"
            ),
            Self::Mismatch {
                meant: Meant::Tombstone(machine),
                address,
                step,
                recorded,
                reported,
            } => write!(
                f,
                "the node answering the cluster's credentials at {address}, the address of \
                 force-removed talosmachine {machine}, reports SMBIOS UUID {reported}, not \
                 {recorded}: it is another machine, so no {step} is sent to it. The tombstone \
                 stays: {machine} is still reset if it answers there again. Once it is known \
                 gone, remove the tombstone from the TalosCluster's status.tombstones"
            ),
            Self::Unrecorded {
                meant: Meant::Machine(name),
                address,
                step,
            } => write!(
                f,
                "no SMBIOS UUID is recorded for talosmachine {name} (status.hardware.uuid, or \
                 the label {label}), so the node at {address} cannot be told to be it and no \
                 {step} is sent: read the machine's UUID (talosctl get systeminformation -n \
                 {address}) and, if it is that machine, set it as the label {label}",
                label = labels::MACHINE_UUID,
            ),
            Self::Unrecorded {
                meant: Meant::Tombstone(machine),
                address,
                step,
            } => write!(
                f,
                "the tombstone of force-removed talosmachine {machine} records no SMBIOS UUID \
                 (it was written before Ichor recorded one), so the node answering the \
                 cluster's credentials at {address} cannot be told to be {machine} and no \
                 {step} is sent. If it is {machine}, reset it yourself (talosctl reset \
                 --graceful=false --reboot -n {address}): once it answers in maintenance mode \
                 the tombstone clears; if it is another machine, remove the tombstone from the \
                 TalosCluster's status.tombstones"
            ),
        }
    }
}

impl std::error::Error for IdentityRefusal {}

/// Whether `step` may go to the node at `address`, which reported SMBIOS UUID `reported`, when
/// it is meant for `meant`, recorded with UUID `recorded`. UUIDs compare without regard to
/// case or surrounding blanks; an empty one counts as none.
pub fn check_node_identity(
    meant: &Meant,
    address: &str,
    step: &'static str,
    recorded: Option<&str>,
    reported: &str,
) -> Result<(), IdentityRefusal> {
    let Some(recorded) = recorded.map(str::trim).filter(|r| !r.is_empty()) else {
        return Err(IdentityRefusal::Unrecorded {
            meant: meant.clone(),
            address: address.to_owned(),
            step,
        });
    };
    let reported = reported.trim();
    if !reported.is_empty() && reported.eq_ignore_ascii_case(recorded) {
        return Ok(());
    }
    Err(IdentityRefusal::Mismatch {
        meant: meant.clone(),
        address: address.to_owned(),
        step,
        recorded: recorded.to_owned(),
        reported: if reported.is_empty() {
            "<none>".to_owned()
        } else {
            reported.to_owned()
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "5a1a0000-0000-4000-8000-000000000004";
    const NEW: &str = "5a1a0000-0000-4000-8000-0000000000ff";

    fn worker() -> Meant {
        Meant::Machine("w-1".into())
    }

    #[test]
    fn the_recorded_machine_passes_whatever_the_case_of_its_uuid() {
        let upper = OLD.to_ascii_uppercase();
        for reported in [
            OLD,
            upper.as_str(),
            " 5a1a0000-0000-4000-8000-000000000004\n",
        ] {
            assert_eq!(
                check_node_identity(&worker(), "10.0.0.4", "reboot", Some(OLD), reported),
                Ok(())
            );
        }
    }

    #[test]
    fn a_replacement_at_the_same_address_is_refused_with_both_uuids() {
        let refusal =
            check_node_identity(&worker(), "10.0.0.4", "reboot", Some(OLD), NEW).unwrap_err();
        assert_eq!(refusal.reason(), "NodeIdentityMismatch");
        let message = refusal.message();
        assert!(
            message.starts_with(&format!(
                "the node at 10.0.0.4 reports SMBIOS UUID {NEW}, not {OLD} as recorded for \
                 talosmachine w-1: it is another machine, so no reboot is sent to it"
            )),
            "{message}"
        );
    }

    #[test]
    fn a_node_that_reports_no_uuid_is_no_match() {
        let refusal =
            check_node_identity(&worker(), "10.0.0.4", "reset", Some(OLD), "  ").unwrap_err();
        assert!(
            matches!(&refusal, IdentityRefusal::Mismatch { reported, .. } if reported == "<none>"),
            "{refusal:?}"
        );
    }

    #[test]
    fn nothing_recorded_refuses_and_says_what_to_do() {
        let stone = Meant::Tombstone("cp-4".into());
        for recorded in [None, Some(""), Some(" ")] {
            let refusal =
                check_node_identity(&stone, "10.0.0.4", "reset", recorded, OLD).unwrap_err();
            assert_eq!(refusal.reason(), "NodeIdentityUnrecorded");
            assert!(
                refusal.message().contains(
                    "reset it yourself (talosctl reset --graceful=false --reboot -n 10.0.0.4)"
                ),
                "{refusal}"
            );
        }
        let refusal = check_node_identity(&worker(), "10.0.0.4", "reset", None, OLD).unwrap_err();
        assert!(
            refusal
                .message()
                .contains("set it as the label ichor.maesh.dev/machine-uuid"),
            "{refusal}"
        );
    }
}
