//! The machine reconciler's pure decisions: whether an approved machine can be configured,
//! and whether its first apply may go. No I/O here; the reconciler observes and acts.

use ichor_api::machine::{MachinePhase, TalosMachineStatus};
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::{Rendered, SecretsBundle};

use crate::conditions as cond;
use crate::decide::version_supported;

/// A problem a person must fix: the phase shown meanwhile, and `Ready`'s reason and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Blocked {
    /// The phase the machine shows while blocked.
    pub phase: MachinePhase,
    /// The `Ready` condition's reason (also the Event's).
    pub reason: &'static str,
    /// The `Ready` condition's message (also the Event's note).
    pub message: String,
}

impl Blocked {
    /// Blocked before anything was written to the machine: it stays `Approved`.
    pub fn approved(reason: &'static str, message: String) -> Self {
        Self {
            phase: MachinePhase::Approved,
            reason,
            message,
        }
    }

    /// Blocked on something the machine or its config can never satisfy as it is: `Failed`.
    pub fn failed(reason: &'static str, message: String) -> Self {
        Self {
            phase: MachinePhase::Failed,
            reason,
            message,
        }
    }
}

/// What an approved machine of `cluster` gets and where it is reached: its rendered config
/// and address, or why it cannot be configured (no role, a config that does not render, no
/// address), checked in that order.
pub(super) fn configurable(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    bundle: &SecretsBundle,
) -> Result<(Rendered, String), Blocked> {
    let Some(role) = machine.spec.role else {
        return Err(Blocked::approved(
            reasons::ROLE_REQUIRED,
            "an approved machine needs spec.role: controlplane or worker".into(),
        ));
    };
    let rendered = super::render_for(cluster, machine, role, bundle).map_err(|problem| {
        Blocked::failed(
            reasons::INVALID_PATCH,
            format!("the config cannot be rendered: {problem}"),
        )
    })?;
    let Some(address) = super::address(machine) else {
        return Err(Blocked::approved(
            reasons::NODE_UNREACHABLE,
            "the machine has no address: set spec.endpoints".into(),
        ));
    };
    Ok((rendered, address))
}

/// Whether the first apply may be tried: a pinned fingerprint (returned), no unconfirmed
/// change of the machine's certificate, and hardware that fits the rendered config.
pub(super) fn first_apply_checks(
    machine: &TalosMachine,
    status: &TalosMachineStatus,
    rendered: &Rendered,
) -> Result<String, Blocked> {
    let Some(pinned) = machine.spec.fingerprint.clone() else {
        return Err(Blocked::approved(
            reasons::FINGERPRINT_MISMATCH,
            "no fingerprint is pinned (spec.fingerprint): nothing is applied to an unverified machine".into(),
        ));
    };
    if cond::is_true(&status.conditions, conditions::FINGERPRINT_CHANGED)
        && status.observed_fingerprint.as_deref() != Some(pinned.as_str())
    {
        return Err(Blocked::approved(
            reasons::FINGERPRINT_MISMATCH,
            format!(
                "the machine presented {} but {pinned} is pinned: confirm it is the same machine and update spec.fingerprint",
                status.observed_fingerprint.clone().unwrap_or_default()
            ),
        ));
    }
    if let Some(hardware) = &status.hardware
        && let Err(problems) = ichor_render::hardware::check(rendered, hardware)
    {
        let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
        return Err(Blocked::failed(reasons::HARDWARE_MISMATCH, text.join("; ")));
    }
    Ok(pinned)
}

/// The machine at `address` presented `observed`, not the `pinned` fingerprint: nothing is
/// applied until a person confirms it.
pub(super) fn fingerprint_presented(address: &str, observed: &str, pinned: &str) -> Blocked {
    Blocked::approved(
        reasons::FINGERPRINT_MISMATCH,
        format!(
            "{address} presented certificate fingerprint {observed}, not the pinned {pinned}: nothing was applied; if this is the same machine (it rebooted), update spec.fingerprint"
        ),
    )
}

/// Why a node running Talos `version` cannot get a config for the cluster's `contract`
/// (`None`: it can).
pub(super) fn too_old(version: &str, contract: &str) -> Option<Blocked> {
    (!version_supported(version, contract)).then(|| {
        Blocked::failed(
            reasons::TALOS_VERSION_TOO_OLD,
            format!(
                "the machine runs Talos {version}, older than the cluster's contract {contract}: boot it from a newer image"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use ichor_api::common::Role;
    use ichor_api::machine::{DiskInfo, HardwareInventory};
    use ichor_api::testing::{ADDRESS, FINGERPRINT};
    use ichor_render::Contract;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;

    fn bundle() -> SecretsBundle {
        SecretsBundle::generate(Contract::V1_14).expect("bundle")
    }

    fn time(text: &str) -> Time {
        Time(text.parse().expect("timestamp"))
    }

    /// A status with condition `type_` holding (or not) for `reason`.
    fn with_condition(type_: &str, holds: bool, reason: &str) -> TalosMachineStatus {
        let mut status = TalosMachineStatus::default();
        let now = time("2026-12-03T10:00:00Z");
        cond::set(&mut status.conditions, type_, holds, reason, "", None, &now);
        status
    }

    #[test]
    fn an_approved_machine_needs_a_role_a_config_that_renders_and_an_address() {
        let bundle = bundle();
        let cluster = TalosCluster::test("lab").build();
        let no_role = TalosMachine::test("m1").approved().build();
        let stop = configurable(&no_role, &cluster, &bundle).expect_err("no role");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Approved, reasons::ROLE_REQUIRED)
        );

        let old = TalosCluster::test("lab").talos("v1.9.0").build();
        let worker = TalosMachine::test("m1").approved().worker().build();
        let stop = configurable(&worker, &old, &bundle).expect_err("no contract");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::INVALID_PATCH)
        );
        assert!(stop.message.starts_with("the config cannot be rendered: "));

        let mut nowhere = worker.clone();
        nowhere.spec.endpoints.clear();
        let stop = configurable(&nowhere, &cluster, &bundle).expect_err("no address");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Approved, reasons::NODE_UNREACHABLE)
        );

        let (rendered, address) = configurable(&worker, &cluster, &bundle).expect("configurable");
        let expected =
            super::super::render_for(&cluster, &worker, Role::Worker, &bundle).expect("renders");
        assert_eq!(rendered.hash, expected.hash);
        assert_eq!(address, ADDRESS);
    }

    #[test]
    fn the_recorded_address_is_preferred_to_the_first_endpoint() {
        let bundle = bundle();
        let cluster = TalosCluster::test("lab").build();
        let machine = TalosMachine::test("m1")
            .approved()
            .worker()
            .status(TalosMachineStatus {
                address: Some("10.9.9.9".into()),
                ..Default::default()
            })
            .build();
        let (_, address) = configurable(&machine, &cluster, &bundle).expect("configurable");
        assert_eq!(address, "10.9.9.9");
    }

    #[test]
    fn nothing_is_applied_without_a_pin_or_with_an_unconfirmed_certificate() {
        let bundle = bundle();
        let cluster = TalosCluster::test("lab").build();
        let pinned = TalosMachine::test("m1").approved().worker().build();
        let rendered = render_for_test(&cluster, &pinned, &bundle);

        let mut unpinned = pinned.clone();
        unpinned.spec.fingerprint = None;
        let stop = first_apply_checks(&unpinned, &TalosMachineStatus::default(), &rendered)
            .expect_err("no pin");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Approved, reasons::FINGERPRINT_MISMATCH)
        );
        assert!(stop.message.starts_with("no fingerprint is pinned"));

        let mut changed = with_condition(conditions::FINGERPRINT_CHANGED, true, "Changed");
        changed.observed_fingerprint = Some("other".into());
        let stop = first_apply_checks(&pinned, &changed, &rendered).expect_err("changed");
        assert_eq!(stop.reason, reasons::FINGERPRINT_MISMATCH);
        assert!(stop.message.contains("presented other but"));
        assert!(stop.message.contains(FINGERPRINT));

        // The pin updated to what the machine presents: confirmed.
        changed.observed_fingerprint = Some(FINGERPRINT.into());
        assert_eq!(
            first_apply_checks(&pinned, &changed, &rendered).as_deref(),
            Ok(FINGERPRINT)
        );
        // A change no longer reported (condition false) does not block either.
        let settled = with_condition(conditions::FINGERPRINT_CHANGED, false, "Same");
        assert_eq!(
            first_apply_checks(&pinned, &settled, &rendered).as_deref(),
            Ok(FINGERPRINT)
        );
    }

    #[test]
    fn hardware_that_does_not_fit_the_config_fails_the_machine() {
        let bundle = bundle();
        let cluster = TalosCluster::test("lab").build();
        let machine = TalosMachine::test("m1")
            .approved()
            .worker()
            .install_disk("/dev/nvme0n1")
            .build();
        let rendered = render_for_test(&cluster, &machine, &bundle);
        let only = |path: &str| TalosMachineStatus {
            hardware: Some(HardwareInventory {
                disks: vec![DiskInfo {
                    name: path.trim_start_matches("/dev/").into(),
                    dev_path: path.into(),
                    size: 500_000_000_000,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let stop =
            first_apply_checks(&machine, &only("/dev/sda"), &rendered).expect_err("no such disk");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::HARDWARE_MISMATCH)
        );
        assert!(
            first_apply_checks(&machine, &only("/dev/nvme0n1"), &rendered).is_ok(),
            "the disk is there"
        );
    }

    fn render_for_test(
        cluster: &TalosCluster,
        machine: &TalosMachine,
        bundle: &SecretsBundle,
    ) -> Rendered {
        let role = machine.spec.role.expect("role");
        super::super::render_for(cluster, machine, role, bundle).expect("renders")
    }

    #[test]
    fn a_node_older_than_the_contract_fails_and_a_newer_one_passes() {
        let stop = too_old("v1.13.4", "v1.14.1").expect("older minor");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::TALOS_VERSION_TOO_OLD)
        );
        assert!(stop.message.contains("runs Talos v1.13.4"));
        assert_eq!(too_old("v1.14.0", "v1.14.1"), None, "same minor");
        assert_eq!(too_old("v1.15.0", "v1.14.1"), None);
    }

    #[test]
    fn a_different_certificate_names_both_fingerprints() {
        let stop = fingerprint_presented("10.0.0.1", "seen", "pinned");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Approved, reasons::FINGERPRINT_MISMATCH)
        );
        assert!(
            stop.message.starts_with(
                "10.0.0.1 presented certificate fingerprint seen, not the pinned pinned"
            )
        );
    }
}
