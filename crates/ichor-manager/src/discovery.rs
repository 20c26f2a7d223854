//! Discovery: sweeps a cluster's address ranges and keeps one TalosMachine per machine, keyed
//! by its SMBIOS UUID. It only reads from nodes; the first fingerprint seen is pinned in
//! `spec.fingerprint`, later ones go to `status.observedFingerprint` and flag
//! `FingerprintChanged` — the pin is never overwritten.

use std::collections::BTreeMap;

use ichor_api::machine::{DiskInfo, HardwareInventory, LinkInfo, TalosMachineStatus};
use ichor_api::names::{actions, conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine, TalosMachineSpec};
use ichor_talos::discovery::{Found, ProbeOutcome, SweepConfig, sweep};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

use crate::{Context, Error, conditions as cond};

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

fn machine_name(uuid: &str) -> String {
    let clean: String = uuid
        .to_lowercase()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .collect();
    format!("m-{clean}")
}

fn inventory(found: &Found) -> HardwareInventory {
    let text = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    HardwareInventory {
        uuid: found.inventory.uuid.clone(),
        manufacturer: text(&found.inventory.manufacturer),
        product_name: text(&found.inventory.product_name),
        serial_number: text(&found.inventory.serial_number),
        disks: found
            .inventory
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
        links: found
            .inventory
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
    let probes = sweep(&discovery.cidrs, config)
        .await
        .map_err(|e| Error::Spec {
            field: "spec.discovery.cidrs",
            problem: e.to_string(),
        })?;
    // One UUID, two live certificates at once: report, do not guess.
    let mut by_uuid: BTreeMap<String, Vec<Found>> = BTreeMap::new();
    for probe in probes {
        if let ProbeOutcome::Maintenance(found) = probe.outcome {
            by_uuid
                .entry(found.inventory.uuid.clone())
                .or_default()
                .push(*found);
        }
    }
    let machines: Api<TalosMachine> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = machines.list(&ListParams::default()).await?.items;
    let mut report = SweepReport::default();
    for (uuid, found) in by_uuid {
        let mut fingerprints: Vec<&str> = found.iter().map(|f| f.fingerprint.as_str()).collect();
        fingerprints.sort_unstable();
        fingerprints.dedup();
        if fingerprints.len() > 1 {
            let addresses: Vec<String> = found.iter().map(|f| f.address.to_string()).collect();
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
            report.conflicts.push(uuid);
            continue;
        }
        let found = &found[0];
        let record = existing.iter().find(|m| {
            m.labels().get(labels::MACHINE_UUID) == Some(&uuid)
                || m.status
                    .as_ref()
                    .and_then(|s| s.hardware.as_ref())
                    .map(|h| &h.uuid)
                    == Some(&uuid)
        });
        match record {
            None => {
                let name = machine_name(&uuid);
                let machine = TalosMachine::discovered(
                    &namespace,
                    &name,
                    &uuid,
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
                        report.created.push(name);
                    }
                    Err(kube::Error::Api(status)) if status.is_already_exists() => {}
                    Err(error) => return Err(error.into()),
                }
            }
            Some(machine) => {
                let address = found.address.to_string();
                if machine.spec.endpoints.first() != Some(&address) {
                    machines
                        .patch(
                            &machine.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"spec": {"endpoints": [address]}})),
                        )
                        .await?;
                }
                write_observation(ctx, machine, found).await?;
                report.updated.push(machine.name_any());
            }
        }
    }
    Ok(report)
}

/// Records inventory, version and the observed fingerprint; flags a fingerprint different
/// from the pin.
async fn write_observation(
    ctx: &Context,
    machine: &TalosMachine,
    found: &Found,
) -> Result<(), Error> {
    // Only machines still in maintenance mode are seen by discovery; configured ones keep the
    // status their reconciler writes.
    let mut status: TalosMachineStatus = machine.status.clone().unwrap_or_default();
    if status.applied_config_hash.is_some() {
        return Ok(());
    }
    status.address = Some(found.address.to_string());
    status.talos_version = Some(found.version.clone());
    status.hardware = Some(inventory(found));
    status.observed_fingerprint = Some(found.fingerprint.clone());
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
        &ctx.now(),
    );
    if changed && !was_changed {
        ctx.event(
            machine,
            EventType::Warning,
            reasons::FINGERPRINT_MISMATCH,
            actions::DISCOVER,
            format!(
                "fingerprint changed from pinned {} to {}",
                pinned.unwrap_or_default(),
                found.fingerprint
            ),
        )
        .await;
    }
    if machine.status.as_ref() != Some(&status) {
        Api::<TalosMachine>::namespaced(
            ctx.client.clone(),
            &machine.namespace().unwrap_or_default(),
        )
        .patch_status(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await?;
    }
    Ok(())
}
