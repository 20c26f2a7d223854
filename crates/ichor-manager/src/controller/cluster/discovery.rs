//! Discovery: sweeps a cluster's address ranges and keeps one TalosMachine per machine, keyed
//! by its SMBIOS UUID. It only reads from nodes; the first fingerprint seen is pinned in
//! `spec.fingerprint`, later ones go to `status.observedFingerprint` and flag
//! `FingerprintChanged` — the pin is never overwritten. A machine it creates takes the claim
//! on its UUID at once, and with a `TalosNamespacePolicy` only the CIDRs inside the
//! namespace's ranges are swept (ADR 0054).

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::machine::{
    DiskInfo, HardwareInventory, LinkInfo, MachineInventory, TalosMachineStatus,
};
use ichor_api::names::{actions, conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineSpec, TalosNamespacePolicy};
use ichor_talos::discovery::{Found, Probe, ProbeOutcome, SweepConfig, sweep_sharing};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::infra::clock::elapsed;
use crate::infra::status::{self, Guard};
use crate::{Context, Error, infra::conditions as cond};

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

pub(crate) fn machine_name(uuid: &str) -> String {
    let clean: String = uuid
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!("m-{clean}")
}

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
    let policy = crate::claims::policy(&ctx.client, &namespace).await?;
    let (cidrs, refused) = allowed_cidrs(&discovery.cidrs, policy.as_ref());
    if !refused.is_empty() {
        report_refused(ctx, cluster, &namespace, &refused).await;
    }
    let probes = sweep_sharing(&cidrs, config, &ctx.probes)
        .await
        .map_err(|e| Error::Spec {
            field: "spec.discovery.cidrs",
            problem: e.to_string(),
        })?;
    let by_uuid = maintenance_by_uuid(probes);
    if by_uuid.is_empty() {
        // Nothing in maintenance mode: nothing to record, so nothing to read.
        return Ok(SweepReport::default());
    }
    let machines: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    let existing = recorded(&machines, &by_uuid).await?;
    let mut report = SweepReport::default();
    for (uuid, found) in &by_uuid {
        match sighting(uuid, found, &existing) {
            Sighting::Conflict { addresses } => {
                report_conflict(ctx, cluster, uuid, &addresses).await;
                report.conflicts.push(uuid.clone());
            }
            Sighting::New { found } => {
                if let Some(name) = create(ctx, &machines, cluster, uuid, found).await? {
                    report.created.push(name);
                }
            }
            Sighting::Known {
                machine,
                found,
                endpoint,
            } => {
                update(ctx, &machines, machine, found, endpoint).await?;
                report.updated.push(machine.name_any());
            }
        }
    }
    Ok(report)
}

/// The discovery CIDRs a sweep may probe, and those it may not: with a TalosNamespacePolicy,
/// only CIDRs wholly inside its ranges (ADR 0054); without one, all.
fn allowed_cidrs(
    cidrs: &[String],
    policy: Option<&TalosNamespacePolicy>,
) -> (Vec<String>, Vec<String>) {
    cidrs
        .iter()
        .cloned()
        .partition(|cidr| policy.is_none_or(|p| p.spec.allows_cidr(cidr)))
}

/// Warns on the cluster that its discovery CIDRs `refused` lie outside its namespace's ranges.
async fn report_refused(
    ctx: &Context,
    cluster: &TalosCluster,
    namespace: &str,
    refused: &[String],
) {
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::ADDRESS_NOT_ALLOWED,
        actions::DISCOVER,
        format!(
            "discovery CIDRs {} are not swept: they are not wholly inside the ranges TalosNamespacePolicy {namespace} allows this namespace",
            refused.join(", ")
        ),
    )
    .await;
}

/// Machines per page when a sweep reads its namespace's machines.
const PAGE: u32 = 100;

/// The machines of the namespace that record one of the `found` UUIDs, read page by page: a
/// sweep never holds every machine of the namespace at once (a fleet's namespace read whole
/// by each of sixteen concurrent sweeps was most of the manager's memory at 1000 machines,
/// `docs/benchmarks/fleet.md`).
async fn recorded(
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

/// Whether `machine` records SMBIOS UUID `uuid` (its label, or its inventory).
fn records(machine: &TalosMachine, uuid: &str) -> bool {
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
fn maintenance_by_uuid(probes: Vec<Probe>) -> BTreeMap<String, Vec<Found>> {
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
enum Sighting<'a> {
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
fn sighting<'a>(uuid: &str, found: &'a [Found], existing: &'a [TalosMachine]) -> Sighting<'a> {
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

/// Warns on the cluster that `uuid` answers at `addresses` with different certificates.
async fn report_conflict(ctx: &Context, cluster: &TalosCluster, uuid: &str, addresses: &[String]) {
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::FINGERPRINT_MISMATCH,
        actions::DISCOVER,
        format!(
            "SMBIOS UUID {uuid} answers at {} with different certificates: not recorded; machines sharing a UUID need it fixed in firmware",
            addresses.join(", ")
        ),
    )
    .await;
}

/// Creates the pending machine for `uuid` and records what was found; its name, or `None` when
/// it already exists.
async fn create(
    ctx: &Context,
    machines: &Api<TalosMachine>,
    cluster: &TalosCluster,
    uuid: &str,
    found: &Found,
) -> Result<Option<String>, Error> {
    let name = machine_name(uuid);
    let machine = TalosMachine::discovered(
        &cluster.namespace().unwrap_or_default(),
        &name,
        uuid,
        TalosMachineSpec::pending(
            &cluster.name_any(),
            &found.address.to_string(),
            &found.fingerprint,
        ),
    );
    match machines.create(&PostParams::default(), &machine).await {
        Ok(created) => {
            write_observation(ctx, &created, found).await?;
            ctx.event(
                &created,
                EventType::Normal,
                reasons::DISCOVERED,
                actions::DISCOVER,
                format!(
                    "found in maintenance mode at {} (Talos {}, fingerprint {}); approve it to use it",
                    found.address, found.version, found.fingerprint
                ),
            )
            .await;
            // The namespace that found it in its own ranges holds it from now on (ADR 0054):
            // a machine written by hand elsewhere for the same node is refused.
            let address = found.address.to_string();
            if let Err(refused) =
                crate::claims::take(&ctx.client, &created, uuid, &found.fingerprint, &address)
                    .await?
            {
                refused.warn(ctx, &created, actions::DISCOVER).await;
            }
            Ok(Some(name))
        }
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(None),
        Err(error) => Err(error.into()),
    }
}

/// Moves a recorded machine's endpoints to `endpoint` (when `Some`) and records what was found.
async fn update(
    ctx: &Context,
    machines: &Api<TalosMachine>,
    machine: &TalosMachine,
    found: &Found,
    endpoint: Option<String>,
) -> Result<(), Error> {
    if let Some(address) = endpoint {
        machines
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"endpoints": [address]}})),
            )
            .await?;
    }
    write_observation(ctx, machine, found).await
}

/// Records inventory, version and the observed fingerprint; flags a fingerprint different
/// from the pin.
async fn write_observation(
    ctx: &Context,
    machine: &TalosMachine,
    found: &Found,
) -> Result<(), Error> {
    let Some(observed) = observation(machine, found, &ctx.now()) else {
        return Ok(());
    };
    if let Some(message) = observed.newly_changed {
        ctx.event(
            machine,
            EventType::Warning,
            reasons::FINGERPRINT_MISMATCH,
            actions::DISCOVER,
            message,
        )
        .await;
    }
    write_status(ctx, machine, &observed.status).await
}

/// A maintenance-mode machine's status with what was found, and the Event owed for it.
#[derive(Debug)]
struct Observed {
    /// The status to record.
    status: TalosMachineStatus,
    /// The Warning's message when the fingerprint differs from the pin and was not flagged yet.
    newly_changed: Option<String>,
}

/// The status `machine` records for `found` at `now`; `None` for a configured machine.
fn observation(machine: &TalosMachine, found: &Found, now: &Time) -> Option<Observed> {
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

/// Writes `status` when it differs from the one stored.
async fn write_status(
    ctx: &Context,
    machine: &TalosMachine,
    status: &TalosMachineStatus,
) -> Result<(), Error> {
    // What discovery sees is the inventory group; its copy of the rest may be stale.
    if machine.status.as_ref() != Some(status) {
        let api = Api::<TalosMachine>::namespaced(
            ctx.client.clone(),
            &machine.namespace().unwrap_or_default(),
        );
        status::apply::<MachineInventory, _>(&api, machine, status, Guard::None).await?;
    }
    Ok(())
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
