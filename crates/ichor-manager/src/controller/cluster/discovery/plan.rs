//! Discovery's decisions: what one sweep's answers mean (grouped by SMBIOS UUID, each a
//! conflict, a new machine or a known one), what a machine records of what was found, which
//! CIDRs a namespace may sweep and when a sweep is due. Pure, with the unit tests.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::machine::{DiskInfo, HardwareInventory, LinkInfo, TalosMachineStatus};
use ichor_api::names::{conditions, labels, reasons};
use ichor_api::{TalosMachine, TalosNamespacePolicy};
use ichor_talos::discovery::{Found, Probe, ProbeOutcome};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use crate::infra::clock::elapsed;
use crate::infra::conditions as cond;

/// The name of the machine discovered with SMBIOS UUID `uuid`.
pub(crate) fn machine_name(uuid: &str) -> String {
    let clean: String = uuid
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!("m-{clean}")
}

/// The hardware record of what `found` reported.
fn inventory(found: &Found) -> HardwareInventory {
    hardware(&found.inventory)
}

/// The hardware record of what a node reported in maintenance mode.
pub(crate) fn hardware(inventory: &ichor_talos::Inventory) -> HardwareInventory {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    HardwareInventory {
        uuid: inventory.uuid.clone(),
        manufacturer: text(&inventory.manufacturer),
        product_name: text(&inventory.product_name),
        serial_number: text(&inventory.serial_number),
        disks: inventory
            .disks
            .iter()
            .map(|d| DiskInfo {
                name: d.name.clone(),
                dev_path: d.dev_path.clone(),
                size: d.size,
                model: text(&d.model),
                serial: text(&d.serial),
                wwid: text(&d.wwid),
                transport: text(&d.transport),
                rotational: d.rotational,
                readonly: d.readonly,
                cdrom: d.cdrom,
            })
            .collect(),
        links: inventory
            .links
            .iter()
            .map(|l| LinkInfo {
                name: l.name.clone(),
                hardware_addr: text(&l.hardware_addr),
                operational_state: text(&l.operational_state),
                kind: text(&l.kind),
                driver: text(&l.driver),
                speed_mbit: None,
            })
            .collect(),
    }
}

/// The discovery CIDRs a sweep may probe, and those it may not: with a TalosNamespacePolicy,
/// only CIDRs wholly inside its ranges (ADR 0054); without one, all.
pub(super) fn allowed_cidrs(
    cidrs: &[String],
    policy: Option<&TalosNamespacePolicy>,
) -> (Vec<String>, Vec<String>) {
    cidrs
        .iter()
        .cloned()
        .partition(|cidr| policy.is_none_or(|p| p.spec.allows_cidr(cidr)))
}

/// Whether `machine` records SMBIOS UUID `uuid` (its label, or its inventory).
pub(super) fn records(machine: &TalosMachine, uuid: &str) -> bool {
    machine
        .labels()
        .get(labels::MACHINE_UUID)
        .map(String::as_str)
        == Some(uuid)
        || machine
            .status
            .as_ref()
            .and_then(|s| s.inventory.hardware.as_ref())
            .map(|h| h.uuid.as_str())
            == Some(uuid)
}

/// The machines answering in maintenance mode, by SMBIOS UUID (in UUID order).
pub(super) fn maintenance_by_uuid(probes: Vec<Probe>) -> BTreeMap<String, Vec<Found>> {
    let mut by_uuid: BTreeMap<String, Vec<Found>> = BTreeMap::new();
    for probe in probes {
        if let ProbeOutcome::Maintenance(found) = probe.outcome {
            by_uuid
                .entry(found.inventory.uuid.clone())
                .or_default()
                .push(*found);
        }
    }
    by_uuid
}

/// What a sweep does about one SMBIOS UUID it found.
#[derive(Debug)]
pub(super) enum Sighting<'a> {
    /// It answers at these addresses with different certificates: reported, not recorded.
    Conflict {
        /// Where it answered.
        addresses: Vec<String>,
    },
    /// No machine records it yet: one is created.
    New {
        /// What answered.
        found: &'a Found,
    },
    /// `machine` records it: its observation is written.
    Known {
        /// The machine recording the UUID.
        machine: &'a TalosMachine,
        /// What answered.
        found: &'a Found,
        /// The address its endpoints move to, when it answers elsewhere than its first one.
        endpoint: Option<String>,
    },
}

/// Decides what to do about `uuid`, found as `found` (never empty), given the machines recorded.
pub(super) fn sighting<'a>(
    uuid: &str,
    found: &'a [Found],
    existing: &'a [TalosMachine],
) -> Sighting<'a> {
    // One UUID, two live certificates at once: report, do not guess.
    let mut fingerprints: Vec<&str> = found.iter().map(|f| f.fingerprint.as_str()).collect();
    fingerprints.sort_unstable();
    fingerprints.dedup();
    if fingerprints.len() > 1 {
        return Sighting::Conflict {
            addresses: found.iter().map(|f| f.address.to_string()).collect(),
        };
    }
    let found = &found[0];
    let record = existing.iter().find(|m| records(m, uuid));
    match record {
        None => Sighting::New { found },
        Some(machine) => {
            let address = found.address.to_string();
            Sighting::Known {
                machine,
                found,
                endpoint: (machine.spec.endpoints.first() != Some(&address)).then_some(address),
            }
        }
    }
}

/// A maintenance-mode machine's status with what was found, and the Event owed for it.
#[derive(Debug)]
pub(super) struct Observed {
    /// The status to record.
    pub(super) status: TalosMachineStatus,
    /// The Warning's message when the fingerprint differs from the pin and was not flagged yet.
    pub(super) newly_changed: Option<String>,
}

/// The status `machine` records for `found` at `now`; `None` for a configured machine.
pub(super) fn observation(machine: &TalosMachine, found: &Found, now: &Time) -> Option<Observed> {
    // Only machines still in maintenance mode are seen by discovery; configured ones keep the
    // status their reconciler writes.
    let mut status: TalosMachineStatus = machine.status.clone().unwrap_or_default();
    if status.applied.config_hash.is_some() {
        return None;
    }
    status.inventory.address = Some(found.address.to_string());
    status.inventory.talos_version = Some(found.version.clone());
    status.inventory.hardware = Some(inventory(found));
    status.inventory.observed_fingerprint = Some(found.fingerprint.clone());
    let pinned = machine.spec.fingerprint.as_deref();
    let changed = pinned.is_some_and(|p| p != found.fingerprint);
    let was_changed = cond::is_true(&status.conditions, conditions::FINGERPRINT_CHANGED);
    cond::set(
        &mut status.conditions,
        conditions::FINGERPRINT_CHANGED,
        changed,
        if changed {
            reasons::FINGERPRINT_MISMATCH
        } else {
            reasons::FINGERPRINT_MATCHES
        },
        if changed {
            format!(
                "the machine now presents fingerprint {} but {} is pinned (it rebooted, or another machine answers at {}): nothing is applied until spec.fingerprint is updated",
                found.fingerprint,
                pinned.unwrap_or_default(),
                found.address
            )
        } else {
            "the machine presents the pinned certificate".to_owned()
        },
        machine.metadata.generation,
        now,
    );
    let newly_changed = (changed && !was_changed).then(|| {
        format!(
            "fingerprint changed from pinned {} to {}",
            pinned.unwrap_or_default(),
            found.fingerprint
        )
    });
    Some(Observed {
        status,
        newly_changed,
    })
}

/// Whether a cluster last swept at `last` (with its generation then) is due for a sweep at
/// `now`: never swept, its interval passed, or its spec changed since.
pub fn sweep_due(
    last: Option<(Timestamp, Option<i64>)>,
    generation: Option<i64>,
    interval: Duration,
    now: Timestamp,
) -> bool {
    match last {
        None => true,
        Some((at, swept_generation)) => {
            swept_generation != generation || elapsed(at, now) >= interval
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use ichor_talos::Inventory;

    use super::*;
    use crate::etcd::tests::at;
    use ichor_api::TalosMachineSpec;

    /// What answers in maintenance mode for `uuid` at 10.0.0.`last_octet`.
    fn found(uuid: &str, last_octet: u8, fingerprint: &str) -> Found {
        Found {
            address: Ipv4Addr::new(10, 0, 0, last_octet),
            fingerprint: fingerprint.into(),
            version: "v1.11.0".into(),
            inventory: Inventory {
                uuid: uuid.into(),
                ..Inventory::default()
            },
        }
    }

    /// One answer of a sweep.
    fn probe(outcome: ProbeOutcome) -> Probe {
        Probe {
            address: Ipv4Addr::new(10, 0, 0, 9),
            outcome,
        }
    }

    /// A machine discovered for `uuid` at 10.0.0.`last_octet`, pinned to `pin`.
    fn recorded(uuid: &str, last_octet: u8, pin: &str) -> TalosMachine {
        TalosMachine::discovered(
            "ns",
            &machine_name(uuid),
            uuid,
            TalosMachineSpec::pending("c", &format!("10.0.0.{last_octet}"), pin),
        )
    }

    /// A fixed time for the conditions.
    fn now() -> Time {
        Time(Timestamp::UNIX_EPOCH)
    }

    /// Whether `status` flags `FingerprintChanged`.
    fn flagged(status: &TalosMachineStatus) -> bool {
        cond::is_true(&status.conditions, conditions::FINGERPRINT_CHANGED)
    }

    #[test]
    fn with_a_namespace_policy_only_cidrs_inside_its_ranges_are_swept() {
        let cidrs = vec!["10.0.1.0/24".to_owned(), "10.0.9.0/24".to_owned()];
        assert_eq!(allowed_cidrs(&cidrs, None), (cidrs.clone(), Vec::new()));
        let policy = TalosNamespacePolicy::new(
            "ns",
            ichor_api::claim::TalosNamespacePolicySpec {
                address_ranges: vec!["10.0.0.0/23".into()],
            },
        );
        assert_eq!(
            allowed_cidrs(&cidrs, Some(&policy)),
            (
                vec!["10.0.1.0/24".to_owned()],
                vec!["10.0.9.0/24".to_owned()]
            )
        );
    }

    #[test]
    fn only_maintenance_answers_are_grouped_by_uuid() {
        let probes = vec![
            probe(ProbeOutcome::Maintenance(Box::new(found("b", 2, "fb")))),
            probe(ProbeOutcome::NoTls),
            probe(ProbeOutcome::Maintenance(Box::new(found("a", 1, "fa")))),
            probe(ProbeOutcome::Configured {
                fingerprint: "fc".into(),
            }),
            probe(ProbeOutcome::Maintenance(Box::new(found("b", 3, "fb")))),
        ];
        let by_uuid = maintenance_by_uuid(probes);
        assert_eq!(by_uuid.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(by_uuid["a"], [found("a", 1, "fa")]);
        assert_eq!(by_uuid["b"], [found("b", 2, "fb"), found("b", 3, "fb")]);
    }

    #[test]
    fn one_uuid_with_two_certificates_is_a_conflict_even_when_recorded() {
        let answers = [found("u", 1, "f1"), found("u", 2, "f2")];
        let existing = [recorded("u", 1, "f1")];
        let Sighting::Conflict { addresses } = sighting("u", &answers, &existing) else {
            panic!("two certificates for one UUID must not be recorded");
        };
        assert_eq!(addresses, ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn one_certificate_at_two_addresses_is_one_machine_at_the_first() {
        let answers = [found("u", 1, "f"), found("u", 2, "f")];
        let Sighting::New { found } = sighting("u", &answers, &[]) else {
            panic!("an unrecorded UUID is created");
        };
        assert_eq!(found.address, Ipv4Addr::new(10, 0, 0, 1));
    }

    #[test]
    fn a_machine_labelled_with_the_uuid_keeps_its_endpoint_when_it_answers_there() {
        let answers = [found("u", 1, "f")];
        let existing = [recorded("other", 1, "f"), recorded("u", 1, "f")];
        let Sighting::Known {
            machine, endpoint, ..
        } = sighting("u", &answers, &existing)
        else {
            panic!("the labelled machine records it");
        };
        assert_eq!(machine.name_any(), machine_name("u"));
        assert_eq!(endpoint, None);
    }

    #[test]
    fn a_machine_with_the_uuid_in_its_hardware_moves_to_the_new_address() {
        let answers = [found("u", 7, "f")];
        let mut machine = recorded("u", 1, "f");
        machine.metadata.labels = None;
        machine.status = Some(TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                hardware: Some(inventory(&answers[0])),
                ..Default::default()
            },
            ..TalosMachineStatus::default()
        });
        let existing = [machine];
        let Sighting::Known { endpoint, .. } = sighting("u", &answers, &existing) else {
            panic!("the machine whose hardware has the UUID records it");
        };
        assert_eq!(endpoint.as_deref(), Some("10.0.0.7"));
    }

    #[test]
    fn a_configured_machine_keeps_the_status_its_reconciler_writes() {
        let mut machine = recorded("u", 1, "f");
        machine.status = Some(TalosMachineStatus {
            applied: ichor_api::machine::MachineApplied {
                config_hash: Some("h".into()),
            },
            ..TalosMachineStatus::default()
        });
        assert!(observation(&machine, &found("u", 1, "other"), &now()).is_none());
    }

    #[test]
    fn the_pinned_certificate_is_recorded_and_not_flagged() {
        let machine = recorded("u", 1, "f");
        let observed = observation(&machine, &found("u", 2, "f"), &now()).expect("observed");
        assert_eq!(
            observed.status.inventory.address.as_deref(),
            Some("10.0.0.2")
        );
        assert_eq!(
            observed.status.inventory.talos_version.as_deref(),
            Some("v1.11.0")
        );
        assert_eq!(
            observed.status.inventory.observed_fingerprint.as_deref(),
            Some("f")
        );
        assert_eq!(
            observed
                .status
                .inventory
                .hardware
                .as_ref()
                .map(|h| h.uuid.as_str()),
            Some("u")
        );
        assert!(!flagged(&observed.status));
        assert_eq!(observed.newly_changed, None);
    }

    #[test]
    fn a_new_certificate_is_flagged_and_warned_about_once() {
        let mut machine = recorded("u", 1, "pinned");
        let observed = observation(&machine, &found("u", 1, "new"), &now()).expect("observed");
        assert!(flagged(&observed.status));
        assert_eq!(machine.spec.fingerprint.as_deref(), Some("pinned"));
        assert_eq!(
            observed.status.inventory.observed_fingerprint.as_deref(),
            Some("new")
        );
        assert_eq!(
            observed.newly_changed.as_deref(),
            Some("fingerprint changed from pinned pinned to new")
        );
        machine.status = Some(observed.status);
        let again = observation(&machine, &found("u", 1, "new"), &now()).expect("observed");
        assert!(flagged(&again.status));
        assert_eq!(
            again.newly_changed, None,
            "already flagged: no second Warning"
        );
    }

    #[test]
    fn without_a_pin_no_certificate_is_flagged() {
        let mut machine = recorded("u", 1, "f");
        machine.spec.fingerprint = None;
        let observed = observation(&machine, &found("u", 1, "any"), &now()).expect("observed");
        assert!(!flagged(&observed.status));
        assert_eq!(observed.newly_changed, None);
    }

    #[test]
    fn a_sweep_is_due_after_its_interval_or_a_spec_change() {
        let interval = Duration::from_secs(300);
        let swept = Some((at("2026-12-03T10:00:00Z"), Some(4)));
        assert!(sweep_due(
            None,
            Some(4),
            interval,
            at("2026-12-03T10:00:00Z")
        ));
        assert!(!sweep_due(
            swept,
            Some(4),
            interval,
            at("2026-12-03T10:04:59Z")
        ));
        assert!(sweep_due(
            swept,
            Some(4),
            interval,
            at("2026-12-03T10:05:00Z")
        ));
        assert!(
            sweep_due(swept, Some(5), interval, at("2026-12-03T10:00:01Z")),
            "a spec change sweeps at once"
        );
        assert!(
            !sweep_due(swept, Some(4), interval, at("2026-12-03T09:00:00Z")),
            "a clock that went back is no reason to sweep"
        );
    }
}
