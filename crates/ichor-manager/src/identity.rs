//! The check before every destructive step sent over mutual TLS (a reset, a reboot, an
//! upgrade, a config applied to a configured node, an etcd leave): the node's SMBIOS UUID, read
//! over the connection the step goes over, is the one recorded for the machine meant
//! (`ichor_deleteguard::check_node_identity`, ADR 0052). One COSI Get per step, never per look.
//!
//! What is recorded for a TalosMachine is what discovery read from the node in maintenance
//! mode (`status.hardware.uuid`), else the UUID label discovery and adoption write; for a
//! tombstone, what was recorded for its machine when it was force-removed.

use ichor_api::TalosMachine;
use ichor_api::machine::TalosMachineStatus;
use ichor_api::names::{actions, labels, reasons};
use ichor_deleteguard::{IdentityRefusal, Meant, check_node_identity};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;

use crate::{Context, Stop};

/// The SMBIOS UUID recorded for `machine`: `status.hardware.uuid`, else the label
/// [`labels::MACHINE_UUID`]; `None` if neither holds one.
pub fn recorded_uuid(machine: &TalosMachine) -> Option<String> {
    machine
        .status
        .as_ref()
        .and_then(|s| s.inventory.hardware.as_ref())
        .map(|h| h.uuid.trim().to_owned())
        .filter(|uuid| !uuid.is_empty())
        .or_else(|| {
            machine
                .labels()
                .get(labels::MACHINE_UUID)
                .map(|uuid| uuid.trim().to_owned())
                .filter(|uuid| !uuid.is_empty())
        })
}

/// Whether a destructive step may go to the node behind a connection.
#[derive(Debug)]
pub enum Checked {
    /// The node is the machine meant.
    Verified,
    /// It is not, or nothing tells: the step is not sent.
    Refused(IdentityRefusal),
    /// The node did not tell its UUID (a transient failure): the step is not sent now.
    Unread(String),
}

impl Checked {
    /// Why the step was not sent (`None`: verified).
    pub fn hold(&self) -> Option<Stop> {
        match self {
            Self::Verified => None,
            Self::Refused(refusal) => Some(Stop::new(refusal.reason(), refusal.message())),
            Self::Unread(message) => Some(Stop::new(reasons::NODE_UNREACHABLE, message.clone())),
        }
    }
}

/// Reads the SMBIOS UUID of the node behind `client` (at `address`) and checks it against
/// `recorded`, the UUID of what `step` is meant for.
pub async fn check(
    client: &TalosClient,
    meant: &Meant,
    address: &str,
    step: &'static str,
    recorded: Option<&str>,
) -> Checked {
    // Nothing recorded refuses whatever the node says: no call needed.
    if recorded.is_none_or(|r| r.trim().is_empty()) {
        return match check_node_identity(meant, address, step, recorded, "") {
            Ok(()) => Checked::Verified,
            Err(refusal) => Checked::Refused(refusal),
        };
    }
    let reported = match client.system_uuid().await {
        Ok(uuid) => uuid,
        Err(error) => {
            return Checked::Unread(format!(
                "the node at {address} did not tell its SMBIOS UUID, by which it is told to be \
                 the machine meant, so no {step} is sent yet: {error}; it is retried"
            ));
        }
    };
    match check_node_identity(meant, address, step, recorded, &reported) {
        Ok(()) => Checked::Verified,
        Err(refusal) => {
            tracing::warn!(address, step, %refusal, "destructive step refused: another node");
            Checked::Refused(refusal)
        }
    }
}

/// [`check`] for a step meant for the TalosMachine `machine`.
pub async fn check_machine(
    client: &TalosClient,
    machine: &TalosMachine,
    address: &str,
    step: &'static str,
) -> Checked {
    let recorded = recorded_uuid(machine);
    check(
        client,
        &Meant::Machine(machine.name_any()),
        address,
        step,
        recorded.as_deref(),
    )
    .await
}

/// Records a step that `checked` did not let go to `machine`'s node: condition `type_` False
/// with the hold's reason and message, and a Warning Event when the reason changes. Whether it
/// held.
pub async fn held_on(
    ctx: &Context,
    machine: &TalosMachine,
    status: &mut TalosMachineStatus,
    type_: &str,
    checked: &Checked,
) -> bool {
    let Some(stop) = checked.hold() else {
        return false;
    };
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.reason.clone());
    stop.set_condition(
        &mut status.conditions,
        type_,
        machine.metadata.generation,
        &ctx.now(),
    );
    if before.as_deref() != Some(stop.reason) {
        stop.warn(ctx, machine, actions::APPLY).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use ichor_api::TalosMachineSpec;
    use ichor_api::machine::HardwareInventory;

    use super::*;

    fn machine(hardware: Option<&str>, label: Option<&str>) -> TalosMachine {
        let mut machine = TalosMachine::new("m", TalosMachineSpec::pending("c", "10.0.0.1", "f"));
        if let Some(uuid) = label {
            machine.metadata.labels =
                Some([(labels::MACHINE_UUID.to_owned(), uuid.to_owned())].into());
        }
        machine.status = hardware.map(|uuid| TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                hardware: Some(HardwareInventory {
                    uuid: uuid.to_owned(),
                    ..HardwareInventory::default()
                }),
                ..Default::default()
            },
            ..TalosMachineStatus::default()
        });
        machine
    }

    #[test]
    fn the_uuid_discovery_read_comes_before_the_label() {
        assert_eq!(
            recorded_uuid(&machine(Some("read"), Some("label"))).as_deref(),
            Some("read")
        );
        assert_eq!(
            recorded_uuid(&machine(Some(" "), Some("label"))).as_deref(),
            Some("label")
        );
        assert_eq!(
            recorded_uuid(&machine(None, Some("label"))).as_deref(),
            Some("label")
        );
        assert_eq!(recorded_uuid(&machine(None, None)), None);
        assert_eq!(recorded_uuid(&machine(Some(""), Some(""))), None);
    }
}
