//! The machine reconciler's pure decisions: whether an approved machine can be configured,
//! whether its first apply may go, what a configured node's answers mean for its status, and
//! what to do about drift. No I/O here; the reconciler observes and acts.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash as _, Hasher as _};
use std::time::{Duration, Instant};

use ichor_api::cluster::LockHolder;
use ichor_api::common::{Condition, ConditionStatus, Role};
use ichor_api::machine::{MachinePhase, TalosMachineStatus};
use ichor_api::names::{conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::{Rendered, SecretsBundle};
use ichor_talos::{ApplyRefusal, Stage, TalosError};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;

use crate::Stop;
use crate::etcd::{Etcd, etcd_observation};
use crate::infra::conditions as cond;

/// A machine's stop: the [`Stop`] `Ready` and the Event say, and the phase the machine shows
/// meanwhile. It reads as its stop (`blocked.reason`, `blocked.message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Blocked {
    /// The phase the machine shows while blocked.
    pub phase: MachinePhase,
    /// Why: `Ready`'s reason and message, and the Event's.
    pub stop: Stop,
}

impl Blocked {
    /// Blocked in `phase`, for `reason`, saying `message`.
    pub fn new(phase: MachinePhase, reason: &'static str, message: String) -> Self {
        Self {
            phase,
            stop: Stop::new(reason, message),
        }
    }

    /// Blocked before anything was written to the machine: it stays `Approved`.
    pub fn approved(reason: &'static str, message: String) -> Self {
        Self::new(MachinePhase::Approved, reason, message)
    }

    /// Blocked on something the machine or its config can never satisfy as it is: `Failed`.
    pub fn failed(reason: &'static str, message: String) -> Self {
        Self::new(MachinePhase::Failed, reason, message)
    }
}

impl std::ops::Deref for Blocked {
    type Target = Stop;

    fn deref(&self) -> &Stop {
        &self.stop
    }
}

/// What an approved machine of `cluster` gets and where it is reached: its rendered config
/// and address, or why it cannot be configured (no role, a config that does not render, no
/// address), checked in that order.
pub(super) fn configurable(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    sources: &crate::layers::Sources,
    bundle: &SecretsBundle,
) -> Result<(Rendered, String), Blocked> {
    let Some(role) = machine.spec.role else {
        return Err(Blocked::approved(
            reasons::ROLE_REQUIRED,
            "an approved machine needs spec.role: controlplane or worker".into(),
        ));
    };
    let rendered =
        super::render_for(cluster, machine, role, sources, bundle).map_err(|problem| {
            let reason = match problem {
                ichor_render::RenderError::VolumeConflict { .. } => reasons::VOLUME_CONFLICT,
                _ => reasons::INVALID_PATCH,
            };
            Blocked::failed(reason, format!("the config cannot be rendered: {problem}"))
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
        && status.inventory.observed_fingerprint.as_deref() != Some(pinned.as_str())
    {
        return Err(Blocked::approved(
            reasons::FINGERPRINT_MISMATCH,
            format!(
                "the machine presented {} but {pinned} is pinned: confirm it is the same machine and update spec.fingerprint",
                status
                    .inventory
                    .observed_fingerprint
                    .clone()
                    .unwrap_or_default()
            ),
        ));
    }
    if let Some(hardware) = &status.inventory.hardware
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

/// What a configured node answered over mutual TLS (it answered its machine status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Answers {
    /// Its stage and etcd membership.
    pub view: NodeView,
    /// Its Talos version, if it answered that too.
    pub version: Option<String>,
    /// Its hostname, if it answered that too.
    pub hostname: Option<String>,
    /// Its extensions, when they were asked for ([`extensions_due`]) and it answered.
    pub extensions: Option<Vec<ichor_talos::Extension>>,
}

/// Whether a look asks the node for its extensions: none were recorded yet (nor its
/// schematic), its version is not the one recorded, or an upgrade is in flight. They change
/// only with the installer, that is with an upgrade (talos-facts §9.5).
pub(super) fn extensions_due(status: &TalosMachineStatus, version: Option<&str>) -> bool {
    (status.inventory.extensions.is_empty() && status.inventory.schematic.is_none())
        || status.inventory.talos_version.as_deref() != version
        || status.upgrade.record.is_some()
}

/// Records the extensions a node reports: its `schematic` extension's version as the
/// schematic ID, the others as its extensions (talos-facts §9.5).
fn record_extensions(status: &mut TalosMachineStatus, extensions: &[ichor_talos::Extension]) {
    let (schematic, official): (Vec<_>, Vec<_>) = extensions
        .iter()
        .partition(|e| e.name == ichor_talos::SCHEMATIC_EXTENSION);
    status.inventory.schematic = schematic
        .first()
        .map(|e| e.version.clone())
        .filter(|v| !v.is_empty());
    status.inventory.extensions = official
        .into_iter()
        .take(64)
        .map(|e| ichor_api::machine::ExtensionInfo {
            name: e.name.clone(),
            version: e.version.clone(),
        })
        .collect();
}

/// Records what the node answered (`None`: it did not) in `status`: its version and hostname,
/// its etcd member id, and for a control plane the etcd observation the planner reads, with the
/// time it was seen (`at`). `Installed` is the install verdict's ([`install_verdict`]).
pub(super) fn record_answers(
    status: &mut TalosMachineStatus,
    role: Role,
    answers: Option<&Answers>,
    at: Timestamp,
) {
    let view = answers.map(|a| a.view);
    if let Some(answers) = answers {
        if let Some(version) = &answers.version {
            status.inventory.talos_version = Some(version.clone());
        }
        if let Some(hostname) = &answers.hostname {
            status.lifecycle.node_name = Some(hostname.clone());
        }
        if let Some(extensions) = &answers.extensions {
            record_extensions(status, extensions);
        }
    }
    if let Some(NodeView {
        etcd: Etcd::Voter(id) | Etcd::Learner(id) | Etcd::Failing(id),
        ..
    }) = view
    {
        status.lifecycle.etcd_member_id = Some(format!("{id:016x}"));
    }
    if role == Role::ControlPlane {
        // What the planner's snapshot reads, with the time it was seen.
        status.etcd.observed = Some(etcd_observation(
            status.etcd.observed.as_ref(),
            view.map(|v| v.etcd),
            at,
        ));
    }
}

/// What was seen of the install of a machine not yet `Installed` (docs/troubleshooting.md,
/// crates/ichor-sim/docs/install-failures.md for what Talos reports).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct InstallSeen {
    /// The stage the node reported, if it answered.
    pub stage: Option<Stage>,
    /// Whether it answered over mutual TLS (its configured API), not in maintenance mode.
    pub configured: bool,
    /// Talos 1.14's unattended install status: its phase and error (`None`: none, or 1.13).
    pub unattended: Option<(String, String)>,
    /// The install sequence's FATAL error on this boot, caught before the node's reboot.
    pub fatal: Option<String>,
    /// The node answers in maintenance mode with this certificate, not the pinned one.
    pub new_certificate: Option<String>,
}

/// What the install of a machine not yet `Installed` means for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum InstallVerdict {
    /// Talos reports the install done: `Installed` true with this message.
    Installed(String),
    /// Underway, or nothing seen: the machine is judged as usual.
    Underway,
    /// Pending, failed or stalled: `Ready` false says why.
    Stopped(Blocked),
    /// The node is back in maintenance mode, not installed, on a new certificate: nothing of
    /// the config is on it (the applied hash is forgotten) and the certificate is recorded,
    /// never trusted until spec.fingerprint says so.
    Uninstalled {
        /// Why, for `Ready`.
        stop: Blocked,
        /// The certificate it now presents.
        fingerprint: String,
    },
}

/// Judges the install of a machine not yet `Installed` from what was `seen`, its `status` (its
/// version, `Ready` and when `Installed` became false: the apply), the `pinned` fingerprint,
/// the time and the stall `limit`. A `failed` seen once stays failed (Talos's retries cycle
/// the phase through `installing`) until the install completes or the config is applied again.
pub(super) fn install_verdict(
    status: &TalosMachineStatus,
    seen: &InstallSeen,
    pinned: &str,
    now: Timestamp,
    limit: Duration,
) -> InstallVerdict {
    if let Some(fingerprint) = &seen.new_certificate {
        return InstallVerdict::Uninstalled {
            stop: back_in_maintenance(fingerprint, pinned),
            fingerprint: fingerprint.clone(),
        };
    }
    if let Some(done) = install_done(status, seen) {
        return InstallVerdict::Installed(done);
    }
    if let Some(fatal) = &seen.fatal {
        return InstallVerdict::Stopped(Blocked::failed(
            reasons::INSTALL_FAILED,
            format!(
                "the install failed: {fatal}; Talos reboots the node into maintenance mode, not installed, with a new certificate"
            ),
        ));
    }
    let phase = seen
        .unattended
        .as_ref()
        .map(|(p, e)| (p.as_str(), e.as_str()));
    match phase {
        Some(("failed", error)) => return InstallVerdict::Stopped(unattended_failed(error)),
        Some(("pending", why)) => return InstallVerdict::Stopped(install_pending(why)),
        Some(("waiting-for-reboot", _)) => return InstallVerdict::Underway,
        _ => {}
    }
    if let Some(failed) = ready_condition(status).filter(|c| c.reason == reasons::INSTALL_FAILED) {
        return InstallVerdict::Stopped(Blocked::failed(
            reasons::INSTALL_FAILED,
            failed.message.clone(),
        ));
    }
    let running = seen.stage == Some(Stage::Installing) || matches!(phase, Some(("installing", _)));
    match install_started(status).map(|t| elapsed(t, now)) {
        Some(took) if running && took > limit => InstallVerdict::Stopped(stalled(took, limit)),
        _ => InstallVerdict::Underway,
    }
}

/// Whether `seen` proves the install done (its message): 1.14's phase `installed`; without an
/// unattended install status, the node answering over mutual TLS in stage `running`, or before
/// 1.14 in stage `booting` (past `installing`: only the boot after the install's reboot is).
/// On 1.14 an unattended install runs while the node is `booting`: that stage proves nothing.
fn install_done(status: &TalosMachineStatus, seen: &InstallSeen) -> Option<String> {
    if let Some((phase, _)) = &seen.unattended {
        return (phase == "installed")
            .then(|| "Talos reports the unattended install installed".to_owned());
    }
    let before_1_14 = !status
        .inventory
        .talos_version
        .as_deref()
        .is_some_and(|v| version_supported(v, "v1.14.0"));
    match seen.stage {
        _ if !seen.configured => None,
        Some(Stage::Running) => Some("the node runs from its installed system".to_owned()),
        Some(Stage::Booting) if before_1_14 => {
            Some("the node boots from its installed system".to_owned())
        }
        _ => None,
    }
}

/// The node back in maintenance mode on `fingerprint`: its install failed (or was cut short by
/// a power cycle) and nothing of the config stayed.
fn back_in_maintenance(fingerprint: &str, pinned: &str) -> Blocked {
    Blocked::failed(
        reasons::INSTALL_FAILED,
        format!(
            "the install failed: the node is back in maintenance mode, not installed, presenting a new certificate {fingerprint} (pinned: {pinned}); nothing is applied to a changed certificate: fix the cause (the install disk, the installer image's registry), check that {fingerprint} is this machine's, then update spec.fingerprint to it and the config is applied again"
        ),
    )
}

/// 1.14's unattended install reported `failed` with `error`.
fn unattended_failed(error: &str) -> Blocked {
    Blocked::failed(
        reasons::INSTALL_FAILED,
        format!(
            "the install failed: {error}; Talos retries it by itself while the node stays up: fix the cause (the install disk, the installer image's registry) and the next attempt installs"
        ),
    )
}

/// 1.14's unattended install is `pending` because `why` (e.g. no disk matched).
fn install_pending(why: &str) -> Blocked {
    Blocked::new(
        MachinePhase::Installing,
        reasons::INSTALL_PENDING,
        format!(
            "the install waits: {why}; attach a disk the install selector matches, or change the machine's install disk: Talos installs as soon as one matches"
        ),
    )
}

/// The install has run `took`, past the stall `limit`.
fn stalled(took: Duration, limit: Duration) -> Blocked {
    Blocked::new(
        MachinePhase::Installing,
        reasons::INSTALL_STALLED,
        format!(
            "the install has run for {}s, past the limit of {}s (--install-stall-seconds); Talos puts no deadline on its installer: check that the installer image can be pulled and the disk written (talosctl dmesg), or power-cycle the machine: it comes back in maintenance mode, not installed",
            took.as_secs(),
            limit.as_secs()
        ),
    )
}

/// The `Ready` condition, if any.
fn ready_condition(status: &TalosMachineStatus) -> Option<&Condition> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)
}

/// When the install began: when `Installed` last became false (the apply sets it).
fn install_started(status: &TalosMachineStatus) -> Option<Timestamp> {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::INSTALLED && c.status != ConditionStatus::True)
        .map(|c| c.last_transition_time.0)
}

/// How long from `from` to `to` (zero if `to` is earlier).
fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or(Duration::ZERO)
}

/// Records a config applied now: phase `Installing`, `ConfigApplied` true with `message`,
/// `Installed` false from now (the install's start, which the stall limit counts from) and
/// `Ready` false, installing (a failure seen before is over: this is a new attempt).
pub(super) fn installing(
    status: &mut TalosMachineStatus,
    message: String,
    generation: Option<i64>,
    now: &Time,
) {
    status.lifecycle.phase = MachinePhase::Installing;
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_APPLIED,
        true,
        reasons::APPLIED,
        message,
        generation,
        now,
    );
    status
        .conditions
        .retain(|c| c.type_ != conditions::INSTALLED);
    let installing = "the config was applied; Talos installs to disk, then boots from it";
    for type_ in [conditions::INSTALLED, conditions::READY] {
        cond::set(
            &mut status.conditions,
            type_,
            false,
            reasons::INSTALLING,
            installing,
            generation,
            now,
        );
    }
}

/// `Installed` true, with `message` (what Talos reported).
pub(super) fn installed(
    status: &mut TalosMachineStatus,
    message: String,
    generation: Option<i64>,
    now: &Time,
) {
    cond::set(
        &mut status.conditions,
        conditions::INSTALLED,
        true,
        reasons::INSTALLED,
        message,
        generation,
        now,
    );
}

/// A stop while the machine's first config waits (for a confirmed fingerprint) after its
/// install failed: the install failure stays what `Ready` says, its message telling what to
/// do, until the config is applied again.
pub(super) fn keep_install_failure(status: &TalosMachineStatus, stop: Blocked) -> Blocked {
    match ready_condition(status) {
        Some(failed)
            if failed.reason == reasons::INSTALL_FAILED
                && stop.reason == reasons::FINGERPRINT_MISMATCH =>
        {
            Blocked::failed(reasons::INSTALL_FAILED, failed.message.clone())
        }
        _ => stop,
    }
}

/// What a configured machine does about drift this time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DriftStep {
    /// Nothing: no drift, none in flight, nothing to settle.
    Idle,
    /// What the objects now render differs from what was applied (`applied`), and the node
    /// answers: roll it out (wait for its turn and the lock, then apply live, or staged with a
    /// reboot).
    RollOut {
        /// The hash of the config the node runs now.
        applied: String,
    },
    /// The reboot for drift is done: the node is back, running (and a voter, for a control
    /// plane); its intent is forgotten and the lock released.
    Back,
    /// Drift applied earlier is settled (no reboot in flight) while `ConfigApplied` still says
    /// it needs a reboot or was not applied: the condition says applied again.
    Settled,
}

/// Whether the machine was recorded by an adoption.
pub(super) fn adopted(machine: &TalosMachine) -> bool {
    machine
        .annotations()
        .get(ichor_api::names::annotations::ADOPTED)
        .is_some_and(|v| v == ichor_api::names::annotations::TRUE)
}

/// Why an adopted machine's drift is held, if it is: its live config differs from what Ichor
/// renders, and the cluster has not opted in to rolling it out (ADR 0028). A person reads the
/// difference with `kubectl ichor render --diff`.
pub(super) fn held_adopted(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    step: &DriftStep,
) -> Option<String> {
    use ichor_api::names::annotations;
    let opted_in = cluster
        .annotations()
        .get(annotations::ROLL_OUT_RENDERED)
        .is_some_and(|v| v == annotations::TRUE);
    (adopted(machine) && !opted_in && matches!(step, DriftStep::RollOut { .. })).then(|| {
        format!(
            "the live config this machine was adopted with differs from what Ichor renders; it is left alone until TalosCluster {} has the annotation {}: \"true\"",
            cluster.name_any(),
            annotations::ROLL_OUT_RENDERED
        )
    })
}

/// `ConfigApplied` true, with `message`.
pub(super) fn config_applied(
    status: &mut TalosMachineStatus,
    machine: &TalosMachine,
    message: String,
    now: &Time,
) {
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_APPLIED,
        true,
        reasons::APPLIED,
        message,
        machine.metadata.generation,
        now,
    );
}

/// An adopted machine's drift, held until its cluster opts in: reported on `ConfigApplied`,
/// and nothing rolled out.
pub(super) fn hold_adopted(
    machine: &TalosMachine,
    cluster: &TalosCluster,
    status: &mut TalosMachineStatus,
    step: DriftStep,
    now: &Time,
) -> DriftStep {
    let Some(message) = held_adopted(machine, cluster, &step) else {
        return step;
    };
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_APPLIED,
        false,
        reasons::DRIFT_HELD_ADOPTED,
        message,
        machine.metadata.generation,
        now,
    );
    DriftStep::Idle
}

/// Decides the drift step from the machine's status (as stored now), what its node shows
/// (`None`: it did not answer), its boot id now (read while a reboot for drift is in flight),
/// the hash of the config it should run, and its role.
pub(super) fn drift_step(
    status: &TalosMachineStatus,
    view: Option<NodeView>,
    boot: Option<&str>,
    rendered: &str,
    role: Role,
) -> DriftStep {
    if view.is_some()
        && let Some(applied) = &status.applied.config_hash
        && applied != rendered
    {
        return DriftStep::RollOut {
            applied: applied.clone(),
        };
    }
    // After a reboot for drift, back means booted again: another boot id than before it.
    let rebooted = status
        .drift
        .boot_id
        .as_deref()
        .is_none_or(|before| boot.is_some_and(|now| now != before));
    if status.drift.reboot.is_some()
        && rebooted
        && view.is_some_and(|v| {
            v.stage == ichor_talos::Stage::Running
                && (role == Role::Worker || matches!(v.etcd, Etcd::Voter(_)))
        })
    {
        return DriftStep::Back;
    }
    // Drift settled (applied live, or by a reboot seen through): the condition says so.
    if status.applied.config_hash.as_deref() == Some(rendered)
        && status.drift.reboot.is_none()
        && status.conditions.iter().any(|c| {
            c.type_ == conditions::CONFIG_APPLIED
                && (c.reason == reasons::NEEDS_REBOOT || c.reason == reasons::DRIFT_NOT_APPLIED)
        })
        && view.is_some()
    {
        return DriftStep::Settled;
    }
    DriftStep::Idle
}

/// Whether a machine is settled, so that its next look may wait for the settled requeue:
/// Ready, no drift in flight (`driftReboot`), and no drift waiting for its turn (it runs
/// `rendered`, or its drift waits for a person: halted, or held on an adopted machine). A
/// node's return from a reboot for drift, its health after a live apply, and a sibling's
/// turn ending raise no event this machine's watches see for sure: while any is awaited the
/// machine is looked at at the progress pace, so the rollout moves on seconds after the node
/// before it is back, not a settled requeue later (ADR 0043).
pub(super) fn settled(ready: bool, status: &TalosMachineStatus, rendered: &str) -> bool {
    settled_but_for_its_turn(ready, status)
        && !drift_queued(status, rendered)
        && !upgrade_queued(status)
}

/// Whether the machine is settled but for a drift or an upgrade that waits for another
/// machine's turn: Ready, with no reboot or upgrade of its own in flight. The end of that turn
/// wakes it (ADR 0043), so such a machine is looked at at the settled pace too (ADR 0071).
pub(super) fn settled_but_for_its_turn(ready: bool, status: &TalosMachineStatus) -> bool {
    ready && status.drift.reboot.is_none() && status.upgrade.record.is_none()
}

/// Whether the machine's upgrade waits on the rollout (its turn, a sibling's health, the
/// cluster lock, the rollout policy: a window, a suspend, a gate, a fresh backup): `UpToDate`
/// says it is queued, held or underway. A failed upgrade waits for a person (a change of the
/// declaration wakes it through its cluster's watch). A turn the policy holds is looked at at
/// the progress pace: no other machine's end wakes it (ADR 0074).
fn upgrade_queued(status: &TalosMachineStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == conditions::UP_TO_DATE
            && c.status == ConditionStatus::False
            && (c.reason == reasons::UPGRADE_QUEUED
                || c.reason == reasons::UPGRADING
                || crate::rollout_policy::is_policy_hold(&c.reason))
    })
}

/// Whether the machine's drift waits on the rollout (its turn, a sibling's health, the
/// cluster lock): it runs another config than `rendered`, and no person is awaited (a halt
/// waits for the patch to be fixed, an adopted machine for its cluster's opt-in; either
/// change wakes it through its cluster's watch).
fn drift_queued(status: &TalosMachineStatus, rendered: &str) -> bool {
    status
        .applied
        .config_hash
        .as_deref()
        .is_some_and(|applied| applied != rendered)
        && !status.conditions.iter().any(|c| {
            c.type_ == conditions::CONFIG_APPLIED
                && (c.reason == reasons::DRIFT_HALTED || c.reason == reasons::DRIFT_HELD_ADOPTED)
        })
}

/// The machines to look at now that `me`'s drift or upgrade turn ended or `me` became Ready:
/// of the other machines of the cluster whose drift or upgrade waits on the rollout
/// (`ConfigApplied` says `DriftQueued` or `NeedsReboot`, or `UpToDate` says `UpgradeQueued`),
/// the first in rollout order (control planes, then workers, by name), whose turn is next; the
/// others wait for theirs at the settled pace and are woken one by one (ADR 0071), or `next`
/// at a time where workers go in batches (ADR 0077). And every
/// machine that waits for the cluster lock (`waiting`, the lock's mirror). Nothing else tells
/// them: the lock's mirror is best effort, and a sibling's status wakes no other machine.
pub(crate) fn queued_behind(
    machines: &[TalosMachine],
    waiting: &[LockHolder],
    me: &str,
    next: usize,
) -> Vec<ObjectRef<TalosMachine>> {
    let others = || machines.iter().filter(|m| m.name_any() != me);
    let mut queued: Vec<(u8, String)> = others()
        .filter(|m| {
            m.metadata.deletion_timestamp.is_none()
                && m.status.as_ref().is_some_and(|s| {
                    s.removal.progress.is_none() && (upgrade_queued(s) || rollout_queued(s))
                })
        })
        .map(|m| {
            let group = u8::from(m.spec.role != Some(Role::ControlPlane));
            (group, m.name_any())
        })
        .collect();
    queued.sort();
    queued.truncate(next.max(1));
    others()
        .filter(|m| {
            let held = m.uid().is_some_and(|uid| {
                waiting.contains(&LockHolder::Drift(uid.clone()))
                    || waiting.contains(&LockHolder::Upgrade(uid))
            });
            queued.iter().any(|(_, name)| *name == m.name_any()) || held
        })
        .map(ObjectRef::from_obj)
        .collect()
}

/// Whether the machine's drift waits on the rollout: `ConfigApplied` says `DriftQueued` or
/// `NeedsReboot`.
fn rollout_queued(status: &TalosMachineStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == conditions::CONFIG_APPLIED
            && c.status == ConditionStatus::False
            && (c.reason == reasons::DRIFT_QUEUED || c.reason == reasons::NEEDS_REBOOT)
    })
}

/// How long a settled machine waits for its next look: the settled requeue, or, in a fleet of
/// `machines` too big to look at every machine that often, as long as it takes to look at
/// them all at `looks_per_second` (at least one a second). The manager's settled looks stay at
/// most `looks_per_second` whatever the fleet's size (ADR 0041): a look is a TLS handshake and
/// four Talos RPCs, 2 to 3 ms of the manager's CPU, so an idle 1000-machine fleet looked at
/// every minute held 3.8% of a core (`docs/benchmarks/fleet.md`).
pub(crate) fn settled_wait(settled: Duration, machines: usize, looks_per_second: u32) -> Duration {
    let rate = u64::from(looks_per_second.max(1));
    let machines = u64::try_from(machines).unwrap_or(u64::MAX);
    settled.max(Duration::from_millis(machines.saturating_mul(1000) / rate))
}

/// Records where the machine stands (`judged`): its phase, its `address` and `Ready`.
/// Returns whether it became Ready just now.
pub(super) fn record_standing(
    status: &mut TalosMachineStatus,
    judged: &Standing,
    address: &str,
    generation: Option<i64>,
    now: &Time,
) -> bool {
    let became_ready = judged.ready && !cond::is_true(&status.conditions, conditions::READY);
    status.lifecycle.phase = judged.phase;
    status.inventory.address = Some(address.to_owned());
    cond::set(
        &mut status.conditions,
        conditions::READY,
        judged.ready,
        judged.reason,
        judged.message.clone(),
        generation,
        now,
    );
    became_ready
}

/// What a look at a machine (one reconcile) saw of what others change: its spec and its
/// metadata (labels, annotations, finalizers, deletion, generation), as a digest. Its status
/// is left out: while a machine is in progress its status is written by its own reconciler
/// (and, rarely, by discovery's inventory, a class's condition or an operation's record,
/// which its next look reads). So is the removal finalizer, which only the machine's own
/// look adds: the echo of that patch is no reason to look again (a look woken by it read a
/// cache that had not yet caught up with the same look's status writes, and did nothing).
pub(crate) fn looked_at(machine: &TalosMachine) -> u64 {
    let meta = &machine.metadata;
    let mut hasher = DefaultHasher::new();
    let others: Vec<&String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| f.as_str() != finalizers::MACHINE_REMOVAL)
        .collect();
    let seen = serde_json::json!({
        "spec": &machine.spec,
        "labels": &meta.labels,
        "annotations": &meta.annotations,
        "finalizers": others,
        "deletion": &meta.deletion_timestamp,
        "generation": meta.generation,
        "uid": &meta.uid,
    });
    serde_json::to_vec(&seen)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// Where a machine stands as its status says: its phase and each condition's type, status,
/// reason and message (not the times a look records). Looks that find it the same have seen
/// it stand still.
pub(crate) fn standing_at(machine: &TalosMachine) -> u64 {
    let mut hasher = DefaultHasher::new();
    if let Some(status) = &machine.status {
        format!("{:?}", status.lifecycle.phase).hash(&mut hasher);
        for c in &status.conditions {
            (&c.type_, &c.reason, &c.message).hash(&mut hasher);
            format!("{:?}", c.status).hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// The last look at a machine in progress: what it saw ([`looked_at`]), when it said to look
/// again, whether a related object woke the machine since, and where the machine stood
/// ([`standing_at`]) and since when, look after look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LastLook {
    /// What it saw.
    pub seen: u64,
    /// When the next look is due.
    pub due: Instant,
    /// Whether a related object (its cluster, a class or a storage of its cluster) woke the
    /// machine since.
    pub woken: bool,
    /// Where the machine stood.
    pub standing: u64,
    /// Since when it has stood there.
    pub since: Instant,
}

/// Whether a reconcile of a machine in progress is only the echo of its last look's own
/// writes, and so waits until that look's due time: nothing it acts on changed since (`seen`
/// is what the last look saw), no related object woke it, and the next look is not yet due.
/// `Some` is how long to wait. A machine not in progress (settled, or waiting for a change)
/// never has a last look, so a status written by another writer wakes it at once.
pub(crate) fn echo_wait(last: Option<LastLook>, seen: u64, now: Instant) -> Option<Duration> {
    let last = last?;
    (!last.woken && last.seen == seen && now < last.due).then(|| last.due - now)
}

/// How many progress requeues a machine in progress waits at most between looks.
pub(crate) const PROGRESS_BACKOFF_MAX: u32 = 5;

/// How long a machine in progress waits for its next look, given the last look at it
/// (`last`), where it stands now (`standing`) and the progress requeue: the progress requeue
/// while it moves, then half as long as it has stood still, at most
/// [`PROGRESS_BACKOFF_MAX`] progress requeues (what it waits for, an install, a reboot, an
/// etcd join, happens on the node, where no event announces it). Returns the next look.
pub(crate) fn next_look(
    last: Option<LastLook>,
    seen: u64,
    standing: u64,
    progress: Duration,
    now: Instant,
) -> LastLook {
    let since = last
        .filter(|l| l.standing == standing)
        .map_or(now, |l| l.since);
    let delay =
        (now.saturating_duration_since(since) / 2).clamp(progress, progress * PROGRESS_BACKOFF_MAX);
    LastLook {
        seen,
        due: now + delay,
        woken: last.is_some_and(|l| l.woken),
        standing,
        since,
    }
}

/// What a configured node shows over mutual TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeView {
    /// Its stage.
    pub stage: Stage,
    /// Its etcd membership (control planes).
    pub etcd: Etcd,
}

/// Where an applied machine stands, with the reason and message for its `Ready` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Standing {
    /// The phase.
    pub phase: MachinePhase,
    /// Whether it counts as Ready.
    pub ready: bool,
    /// Condition reason.
    pub reason: &'static str,
    /// Condition message.
    pub message: String,
}

/// Judges an applied machine. Control-plane join progress is judged by stage `running` and
/// etcd voter membership, not by `ready`: with CNI `none` or Cilium not installed yet,
/// `nodeReady` stays unmet (talos-facts §8.3). A worker's API arriving late is a normal wait:
/// it needs trustd on a bootstrapped control plane (§5).
pub(super) fn standing(role: Role, api: Option<NodeView>) -> Standing {
    let Some(view) = api else {
        return Standing {
            phase: MachinePhase::Booting,
            ready: false,
            reason: reasons::WAITING_FOR_NODE_API,
            message: match role {
                Role::Worker => "installed; the worker's API comes up once it gets its certificate from trustd on a bootstrapped control plane".into(),
                Role::ControlPlane => "installing or rebooting; waiting for the node's API with mutual TLS".into(),
            },
        };
    };
    if view.stage != Stage::Running {
        return Standing {
            phase: MachinePhase::Booting,
            ready: false,
            reason: reasons::BOOTING,
            message: format!("the node is in stage {:?}", view.stage),
        };
    }
    match (role, view.etcd) {
        (Role::Worker, _) => Standing {
            phase: MachinePhase::Ready,
            ready: true,
            reason: reasons::RUNNING,
            message: "the worker is running".into(),
        },
        (Role::ControlPlane, Etcd::Voter(id)) => Standing {
            phase: MachinePhase::Ready,
            ready: true,
            reason: reasons::ETCD_VOTER,
            message: format!("running; etcd voter {id:016x}"),
        },
        (Role::ControlPlane, Etcd::Failing(id)) => Standing {
            phase: MachinePhase::Ready,
            ready: false,
            reason: reasons::ETCD_UNHEALTHY,
            message: format!(
                "running; etcd voter {id:016x} reports errors (an alarm, or no leader): see `talosctl etcd status` and `talosctl etcd alarm list`"
            ),
        },
        (Role::ControlPlane, Etcd::Learner(id)) => Standing {
            phase: MachinePhase::Joining,
            ready: false,
            reason: reasons::ETCD_LEARNER,
            message: format!("joined etcd as learner {id:016x}; waiting for promotion"),
        },
        (Role::ControlPlane, Etcd::NotMember) => Standing {
            phase: MachinePhase::Joining,
            ready: false,
            reason: reasons::WAITING_FOR_ETCD,
            message: "running; etcd waits for the cluster's bootstrap or for joining".into(),
        },
    }
}

/// `vMAJOR.MINOR.PATCH` as numbers (pre-release suffixes ignored).
fn numbers(version: &str) -> Option<(u64, u64, u64)> {
    let core = version.trim_start_matches('v').split(['-', '+']).next()?;
    let mut parts = core.split('.').map(|p| p.parse::<u64>().ok());
    Some((
        parts.next()??,
        parts.next()??,
        parts.next().flatten().unwrap_or(0),
    ))
}

/// Whether a node running `node` may get a config rendered for contract `contract`: its
/// minor must be at least the contract's (an older Talos cannot load newer documents).
pub(super) fn version_supported(node: &str, contract: &str) -> bool {
    match (numbers(node), numbers(contract)) {
        (Some((a, b, _)), Some((c, d, _))) => (a, b) >= (c, d),
        _ => false,
    }
}

/// What to do about drift a node refused to apply live with `NO_REBOOT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DriftRefused {
    /// The change may need a reboot: stage it and reboot under the cluster lock. The staged
    /// apply is validated like the live one, so a config that is invalid (rather than not
    /// applicable live) is refused there, before any reboot.
    StageAndReboot,
    /// The node refused it for a passing reason (busy, or it does not serve the call): it did
    /// not take the config. Report it and retry; a transient error never reboots a node.
    Retry,
    /// No answer came (no connection, a timeout, another code): the node may have taken the
    /// config all the same. Report it and retry, keeping the intent, so the next attempt looks
    /// for the config on the node before it sends it again (a config is applied once).
    Unanswered,
}

/// Decides on a refused `NO_REBOOT` apply by its gRPC code, never its text. Talos ≤ 1.13
/// refuses a change it cannot apply immediately with `InvalidArgument`, the code it also
/// gives an invalid config (talos-facts §11.1 step 9, and steps 5 and 8); `FailedPrecondition`
/// means another apply is in progress or the node is rebooting (§11.1 steps 2 and 3, §5).
pub(super) fn drift_refused(error: &TalosError) -> DriftRefused {
    match error.apply_refusal() {
        ApplyRefusal::NotLive => DriftRefused::StageAndReboot,
        ApplyRefusal::Busy | ApplyRefusal::Unsupported => DriftRefused::Retry,
        ApplyRefusal::NotAnswered => DriftRefused::Unanswered,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::etcd::etcd_answered;
    use crate::etcd::tests::{at, etcd_status};
    use ichor_api::machine::{DiskInfo, EtcdObservation, HardwareInventory};
    use ichor_api::testing::{ADDRESS, FINGERPRINT};
    use ichor_render::Contract;

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

    fn reason_of<'a>(status: &'a TalosMachineStatus, type_: &str) -> Option<&'a str> {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.reason.as_str())
    }

    #[test]
    fn an_approved_machine_needs_a_role_a_config_that_renders_and_an_address() {
        let bundle = bundle();
        let cluster = TalosCluster::test("lab").build();
        let no_role = TalosMachine::test("m1").approved().build();
        let stop =
            configurable(&no_role, &cluster, &Default::default(), &bundle).expect_err("no role");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Approved, reasons::ROLE_REQUIRED)
        );

        let old = TalosCluster::test("lab").talos("v1.9.0").build();
        let worker = TalosMachine::test("m1").approved().worker().build();
        let stop =
            configurable(&worker, &old, &Default::default(), &bundle).expect_err("no contract");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::INVALID_PATCH)
        );
        assert!(stop.message.starts_with("the config cannot be rendered: "));

        let mut nowhere = worker.clone();
        nowhere.spec.endpoints.clear();
        let stop =
            configurable(&nowhere, &cluster, &Default::default(), &bundle).expect_err("no address");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Approved, reasons::NODE_UNREACHABLE)
        );

        let (rendered, address) =
            configurable(&worker, &cluster, &Default::default(), &bundle).expect("configurable");
        let expected = super::super::render_for(
            &cluster,
            &worker,
            Role::Worker,
            &Default::default(),
            &bundle,
        )
        .expect("renders");
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
                inventory: ichor_api::machine::MachineInventory {
                    address: Some("10.9.9.9".into()),
                    ..Default::default()
                },
                ..Default::default()
            })
            .build();
        let (_, address) =
            configurable(&machine, &cluster, &Default::default(), &bundle).expect("configurable");
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
        changed.inventory.observed_fingerprint = Some("other".into());
        let stop = first_apply_checks(&pinned, &changed, &rendered).expect_err("changed");
        assert_eq!(stop.reason, reasons::FINGERPRINT_MISMATCH);
        assert!(stop.message.contains("presented other but"));
        assert!(stop.message.contains(FINGERPRINT));

        // The pin updated to what the machine presents: confirmed.
        changed.inventory.observed_fingerprint = Some(FINGERPRINT.into());
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
            inventory: ichor_api::machine::MachineInventory {
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
            },
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
        super::super::render_for(cluster, machine, role, &Default::default(), bundle)
            .expect("renders")
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

    fn answered(stage: Stage, etcd: Etcd) -> Answers {
        Answers {
            view: NodeView { stage, etcd },
            version: Some("v1.14.1".into()),
            hostname: Some("cp-1".into()),
            extensions: Some(vec![
                ichor_talos::Extension {
                    name: "intel-ucode".into(),
                    version: "20260512".into(),
                },
                ichor_talos::Extension {
                    name: ichor_talos::SCHEMATIC_EXTENSION.into(),
                    version: ichor_render::schematic::EMPTY_ID.into(),
                },
            ]),
        }
    }

    #[test]
    fn extensions_are_recorded_with_the_schematic_apart_and_read_again_only_when_due() {
        let mut status = TalosMachineStatus::default();
        assert!(extensions_due(&status, Some("v1.14.1")), "none recorded");
        let answers = answered(Stage::Running, Etcd::NotMember);
        record_answers(
            &mut status,
            Role::Worker,
            Some(&answers),
            time("2026-12-03T10:00:00Z").0,
        );
        assert_eq!(
            status.inventory.schematic.as_deref(),
            Some(ichor_render::schematic::EMPTY_ID)
        );
        assert_eq!(status.inventory.extensions.len(), 1);
        assert_eq!(status.inventory.extensions[0].name, "intel-ucode");
        assert!(
            !extensions_due(&status, Some("v1.14.1")),
            "recorded, same version"
        );
        assert!(
            extensions_due(&status, Some("v1.14.2")),
            "the version moved"
        );
    }

    #[test]
    fn a_control_plane_answering_as_a_voter_records_its_member_id() {
        let mut status = TalosMachineStatus::default();
        let now = time("2026-12-03T10:00:00Z");
        let answers = answered(Stage::Running, Etcd::Voter(0xab));
        record_answers(&mut status, Role::ControlPlane, Some(&answers), now.0);
        assert_eq!(status.inventory.talos_version.as_deref(), Some("v1.14.1"));
        assert_eq!(status.lifecycle.node_name.as_deref(), Some("cp-1"));
        assert_eq!(
            status.lifecycle.etcd_member_id.as_deref(),
            Some("00000000000000ab")
        );
        assert_eq!(
            status.etcd.observed,
            Some(EtcdObservation {
                voter: true,
                healthy: true,
                observed_at: now,
            })
        );
    }

    #[test]
    fn a_silent_node_keeps_what_was_recorded_and_a_voter_stays_a_voter_unhealthy() {
        let before = time("2026-12-03T10:00:00Z");
        let mut status = TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                talos_version: Some("v1.13.0".into()),
                ..Default::default()
            },
            lifecycle: ichor_api::machine::MachineLifecycle {
                etcd_member_id: Some("00000000000000ab".into()),
                ..Default::default()
            },
            etcd: ichor_api::machine::MachineEtcd {
                observed: Some(EtcdObservation {
                    voter: true,
                    healthy: true,
                    observed_at: before.clone(),
                }),
            },
            ..Default::default()
        };
        let now = time("2026-12-03T10:05:00Z");
        record_answers(&mut status, Role::ControlPlane, None, now.0);
        assert_eq!(status.inventory.talos_version.as_deref(), Some("v1.13.0"));
        assert_eq!(
            status.lifecycle.etcd_member_id.as_deref(),
            Some("00000000000000ab")
        );
        assert_eq!(reason_of(&status, conditions::INSTALLED), None);
        let etcd = status.etcd.observed.expect("observed");
        assert!(etcd.voter && !etcd.healthy);

        let mut worker = TalosMachineStatus::default();
        let answers = answered(Stage::Running, Etcd::NotMember);
        record_answers(&mut worker, Role::Worker, Some(&answers), now.0);
        assert_eq!(
            (worker.lifecycle.etcd_member_id, worker.etcd.observed),
            (None, None)
        );
    }

    fn applied(hash: &str) -> TalosMachineStatus {
        TalosMachineStatus {
            applied: ichor_api::machine::MachineApplied {
                config_hash: Some(hash.into()),
            },
            ..Default::default()
        }
    }

    const RUNNING_VOTER: NodeView = NodeView {
        stage: Stage::Running,
        etcd: Etcd::Voter(1),
    };

    #[test]
    fn drift_rolls_out_only_while_the_node_answers() {
        let status = applied("sha256:old");
        assert_eq!(
            drift_step(
                &status,
                Some(RUNNING_VOTER),
                None,
                "sha256:new",
                Role::ControlPlane
            ),
            DriftStep::RollOut {
                applied: "sha256:old".into()
            }
        );
        assert_eq!(
            drift_step(&status, None, None, "sha256:new", Role::ControlPlane),
            DriftStep::Idle,
            "a node that does not answer is not rolled out"
        );
        assert_eq!(
            drift_step(
                &applied("sha256:new"),
                Some(RUNNING_VOTER),
                None,
                "sha256:new",
                Role::Worker
            ),
            DriftStep::Idle
        );
        // Still rolling out while a reboot is in flight for an older config.
        let mut rebooting = applied("sha256:old");
        rebooting.drift.reboot = Some("sha256:old".into());
        assert!(matches!(
            drift_step(
                &rebooting,
                Some(RUNNING_VOTER),
                None,
                "sha256:new",
                Role::Worker
            ),
            DriftStep::RollOut { .. }
        ));
    }

    #[test]
    fn a_reboot_for_drift_is_back_once_running_and_for_a_control_plane_a_voter() {
        let mut status = applied("sha256:new");
        status.drift.reboot = Some("sha256:new".into());
        let learner = NodeView {
            stage: Stage::Running,
            etcd: Etcd::Learner(1),
        };
        let booting = NodeView {
            stage: Stage::Booting,
            etcd: Etcd::NotMember,
        };
        let cp = Role::ControlPlane;
        assert_eq!(
            drift_step(&status, Some(RUNNING_VOTER), None, "sha256:new", cp),
            DriftStep::Back
        );
        assert_eq!(
            drift_step(&status, Some(learner), None, "sha256:new", cp),
            DriftStep::Idle
        );
        assert_eq!(
            drift_step(&status, Some(learner), None, "sha256:new", Role::Worker),
            DriftStep::Back,
            "a worker is back once running"
        );
        assert_eq!(
            drift_step(&status, Some(booting), None, "sha256:new", Role::Worker),
            DriftStep::Idle
        );
        assert_eq!(
            drift_step(&status, None, None, "sha256:new", Role::Worker),
            DriftStep::Idle
        );
    }

    #[test]
    fn a_reboot_for_drift_with_a_boot_id_is_back_only_on_another_boot() {
        let mut status = applied("sha256:new");
        status.drift.reboot = Some("sha256:new".into());
        status.drift.boot_id = Some("boot-1".into());
        let step = |boot| {
            drift_step(
                &status,
                Some(RUNNING_VOTER),
                boot,
                "sha256:new",
                Role::Worker,
            )
        };
        assert_eq!(step(Some("boot-1")), DriftStep::Idle, "not gone down yet");
        assert_eq!(
            step(None),
            DriftStep::Idle,
            "a boot id not read says nothing"
        );
        assert_eq!(step(Some("boot-2")), DriftStep::Back);
    }

    #[test]
    fn a_ready_machine_with_drift_in_flight_is_not_settled() {
        let mut status = applied("sha256:new");
        assert!(settled(true, &status, "sha256:new"));
        assert!(!settled(false, &status, "sha256:new"));
        // Staged and rebooted (or applied live) under the lock: Ready from before the reboot,
        // yet its return is awaited at the progress pace.
        status.drift.reboot = Some("sha256:new".into());
        status.drift.boot_id = Some("boot-1".into());
        assert!(!settled(true, &status, "sha256:new"));
    }

    #[test]
    fn a_ready_machine_queued_for_its_drift_is_not_settled() {
        // Ready, its changed config waiting for a sibling's turn or the lock: what ends the
        // wait (the sibling Ready again, the lock released) is no change of this machine, so
        // it is looked at at the progress pace, never a settled requeue later.
        for reason in [reasons::DRIFT_QUEUED, reasons::NEEDS_REBOOT] {
            let mut status = with_condition(conditions::CONFIG_APPLIED, false, reason);
            status.applied.config_hash = Some("sha256:old".into());
            assert!(!settled(true, &status, "sha256:new"), "{reason}");
            assert!(
                settled(true, &status, "sha256:old"),
                "{reason}: nothing to roll"
            );
        }
        // A halt or a held adoption waits for a person, whose change wakes the machine.
        for reason in [reasons::DRIFT_HALTED, reasons::DRIFT_HELD_ADOPTED] {
            let mut status = with_condition(conditions::CONFIG_APPLIED, false, reason);
            status.applied.config_hash = Some("sha256:old".into());
            assert!(settled(true, &status, "sha256:new"), "{reason}");
        }
        // Never configured: no drift.
        assert!(settled(true, &TalosMachineStatus::default(), "sha256:new"));
    }

    #[test]
    fn an_upgrade_the_rollout_policy_holds_is_looked_at_at_the_progress_pace() {
        // A gate passing, a backup taken, a window opening: none is a change of this machine
        // nor the end of another's turn, so nothing would wake it from a settled requeue.
        for reason in [
            reasons::HEALTH_GATE_FAILING,
            reasons::OUTSIDE_MAINTENANCE_WINDOW,
            reasons::ROLLOUT_SUSPENDED,
            reasons::WAITING_FOR_FRESH_BACKUP,
            reasons::FRESH_BACKUP_FAILED,
        ] {
            let status = with_condition(conditions::UP_TO_DATE, false, reason);
            assert!(!settled(true, &status, "sha256:any"), "{reason}");
        }
        let failed = with_condition(conditions::UP_TO_DATE, false, reasons::UPGRADE_FAILED);
        assert!(
            settled(true, &failed, "sha256:any"),
            "a failure waits for a person"
        );
    }

    #[test]
    fn the_end_of_a_turn_wakes_the_machine_queued_next() {
        let machine = |name: &str, uid: &str, applied: bool, reason: &str| {
            let mut m = TalosMachine::test(name).build();
            m.metadata.uid = Some(uid.into());
            m.status = Some(with_condition(conditions::CONFIG_APPLIED, applied, reason));
            m
        };
        let machines = [
            machine("cp-1", "u1", false, reasons::DRIFT_QUEUED),
            machine("cp-2", "u2", false, reasons::DRIFT_QUEUED),
            machine("cp-3", "u3", false, reasons::NEEDS_REBOOT),
            machine("w-1", "u4", false, reasons::DRIFT_HALTED),
            machine("w-2", "u5", true, reasons::CONFIG_APPLIED),
            machine("w-3", "u6", false, reasons::ETCD_UNHEALTHY),
        ];
        let names = |refs: Vec<ObjectRef<TalosMachine>>| {
            refs.into_iter().map(|r| r.name).collect::<Vec<_>>()
        };
        assert_eq!(
            names(queued_behind(&machines, &[], "cp-1", 1)),
            ["cp-2"],
            "the next queued: itself, a halted and a settled machine are left alone"
        );
        assert_eq!(names(queued_behind(&machines, &[], "cp-2", 1)), ["cp-1"]);
        assert_eq!(
            names(queued_behind(&machines[2..], &[], "cp-1", 1)),
            ["cp-3"],
            "one whose reboot waits counts as queued"
        );
        assert_eq!(
            names(queued_behind(
                &machines,
                &[LockHolder::Drift("u6".into())],
                "cp-1",
                1
            )),
            ["cp-2", "w-3"],
            "a machine that waits for the lock is woken, whatever its condition says"
        );
    }

    #[test]
    fn the_end_of_an_upgrade_turn_wakes_only_the_next_machine_queued_for_one() {
        let machine = |name: &str, role: Role, reason: &str| {
            let mut m = TalosMachine::test(name).build();
            m.spec.role = Some(role);
            m.metadata.uid = Some(format!("uid-{name}"));
            m.status = Some(with_condition(conditions::UP_TO_DATE, false, reason));
            m
        };
        let mut leaving = machine("cp-0", Role::ControlPlane, reasons::UPGRADE_QUEUED);
        leaving.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let machines = [
            leaving,
            machine("w-1", Role::Worker, reasons::UPGRADE_QUEUED),
            machine("cp-1", Role::ControlPlane, reasons::RUNS_DECLARED),
            machine("w-0", Role::Worker, reasons::UPGRADE_QUEUED),
            machine("cp-3", Role::ControlPlane, reasons::UPGRADE_QUEUED),
            machine("cp-2", Role::ControlPlane, reasons::UPGRADE_FAILED),
        ];
        let names = |refs: Vec<ObjectRef<TalosMachine>>| {
            refs.into_iter().map(|r| r.name).collect::<Vec<_>>()
        };
        assert_eq!(
            names(queued_behind(&machines, &[], "cp-1", 1)),
            ["cp-3"],
            "control planes first; a leaving, an upgraded and a failed machine are left alone"
        );
        assert_eq!(names(queued_behind(&machines, &[], "cp-3", 1)), ["w-0"]);
        assert_eq!(
            names(queued_behind(
                &machines,
                &[LockHolder::Upgrade("uid-w-1".into())],
                "cp-3",
                1
            )),
            ["w-1", "w-0"],
            "a machine that waits for the lock is woken too"
        );
        assert_eq!(
            names(queued_behind(&machines, &[], "cp-1", 3)),
            ["w-1", "w-0", "cp-3"],
            "a batch's worth of the next queued (in the order the machines are listed)"
        );
    }

    #[test]
    fn settled_looks_keep_to_their_rate_whatever_the_fleet() {
        let minute = Duration::from_secs(60);
        // A fleet looked at within the settled requeue at the rate waits the settled requeue.
        assert_eq!(settled_wait(minute, 0, 4), minute);
        assert_eq!(settled_wait(minute, 240, 4), minute);
        // A bigger one is looked at at the rate: 1000 machines at 4 a second, every 250 s.
        assert_eq!(settled_wait(minute, 241, 4), Duration::from_millis(60_250));
        assert_eq!(settled_wait(minute, 1000, 4), Duration::from_secs(250));
        assert_eq!(settled_wait(minute, 1000, 20), minute);
        // A rate of zero is taken as one a second; no fleet overflows it.
        assert_eq!(settled_wait(minute, 100, 0), Duration::from_secs(100));
        assert!(settled_wait(minute, usize::MAX, 1) > Duration::from_secs(1 << 40));
    }

    #[test]
    fn a_settled_drift_clears_a_needs_reboot_or_not_applied_condition() {
        for reason in [reasons::NEEDS_REBOOT, reasons::DRIFT_NOT_APPLIED] {
            let mut status = with_condition(conditions::CONFIG_APPLIED, false, reason);
            status.applied.config_hash = Some("sha256:new".into());
            assert_eq!(
                drift_step(
                    &status,
                    Some(RUNNING_VOTER),
                    None,
                    "sha256:new",
                    Role::Worker
                ),
                DriftStep::Settled,
                "{reason}"
            );
            assert_eq!(
                drift_step(&status, None, None, "sha256:new", Role::Worker),
                DriftStep::Idle,
                "{reason}: only once the node answers"
            );
            status.drift.reboot = Some("sha256:new".into());
            let booting = NodeView {
                stage: Stage::Rebooting,
                etcd: Etcd::NotMember,
            };
            assert_eq!(
                drift_step(&status, Some(booting), None, "sha256:new", Role::Worker),
                DriftStep::Idle,
                "{reason}: not while its reboot is in flight"
            );
        }
        let mut queued = with_condition(conditions::CONFIG_APPLIED, false, reasons::DRIFT_QUEUED);
        queued.applied.config_hash = Some("sha256:new".into());
        assert_eq!(
            drift_step(
                &queued,
                Some(RUNNING_VOTER),
                None,
                "sha256:new",
                Role::Worker
            ),
            DriftStep::Idle
        );
    }

    fn judged(ready: bool) -> Standing {
        Standing {
            phase: if ready {
                MachinePhase::Ready
            } else {
                MachinePhase::Booting
            },
            ready,
            reason: if ready {
                reasons::READY
            } else {
                reasons::WAITING_FOR_NODE_API
            },
            message: "judged".into(),
        }
    }

    #[test]
    fn becoming_ready_is_reported_once() {
        let mut status = TalosMachineStatus::default();
        let now = time("2026-12-03T10:00:00Z");
        assert!(!record_standing(
            &mut status,
            &judged(false),
            ADDRESS,
            Some(1),
            &now
        ));
        assert_eq!(status.lifecycle.phase, MachinePhase::Booting);
        assert_eq!(status.inventory.address.as_deref(), Some(ADDRESS));
        assert_eq!(
            reason_of(&status, conditions::READY),
            Some(reasons::WAITING_FOR_NODE_API)
        );
        assert!(record_standing(
            &mut status,
            &judged(true),
            ADDRESS,
            Some(1),
            &now
        ));
        assert_eq!(status.lifecycle.phase, MachinePhase::Ready);
        assert!(
            !record_standing(&mut status, &judged(true), ADDRESS, Some(1), &now),
            "already Ready"
        );
    }

    const LIMIT: Duration = Duration::from_secs(60);

    /// A machine whose config was applied at 10:00 (`Installed` false since), on `version`.
    fn applied_at_ten(version: &str) -> TalosMachineStatus {
        let mut status = TalosMachineStatus {
            inventory: ichor_api::machine::MachineInventory {
                talos_version: Some(version.into()),
                ..Default::default()
            },
            applied: ichor_api::machine::MachineApplied {
                config_hash: Some("sha256:a".into()),
            },
            ..Default::default()
        };
        installing(
            &mut status,
            "config sha256:a applied".into(),
            Some(1),
            &time("2026-12-03T10:00:00Z"),
        );
        status
    }

    fn seen_over_mtls(stage: Stage, unattended: Option<(&str, &str)>) -> InstallSeen {
        InstallSeen {
            stage: Some(stage),
            configured: true,
            unattended: unattended.map(|(p, e)| (p.to_owned(), e.to_owned())),
            ..Default::default()
        }
    }

    fn verdict_at(status: &TalosMachineStatus, seen: &InstallSeen, at: &str) -> InstallVerdict {
        install_verdict(status, seen, FINGERPRINT, time(at).0, LIMIT)
    }

    fn stop_of(verdict: InstallVerdict) -> Blocked {
        match verdict {
            InstallVerdict::Stopped(stop) => stop,
            other => panic!("not stopped: {other:?}"),
        }
    }

    #[test]
    fn an_applied_config_starts_the_install_and_a_new_apply_restarts_its_clock() {
        let mut status = applied_at_ten("v1.14.1");
        assert_eq!(status.lifecycle.phase, MachinePhase::Installing);
        assert!(cond::is_true(
            &status.conditions,
            conditions::CONFIG_APPLIED
        ));
        assert_eq!(
            reason_of(&status, conditions::INSTALLED),
            Some(reasons::INSTALLING)
        );
        assert_eq!(
            reason_of(&status, conditions::READY),
            Some(reasons::INSTALLING)
        );
        let eleven = time("2026-12-03T11:00:00Z");
        installing(&mut status, "again".into(), Some(1), &eleven);
        assert_eq!(install_started(&status), Some(eleven.0));
    }

    #[test]
    fn a_pending_1_14_install_shows_at_once_with_talos_reason() {
        let status = applied_at_ten("v1.14.1");
        let seen = seen_over_mtls(
            Stage::Booting,
            Some(("pending", "no disk matched the selector")),
        );
        let stop = stop_of(verdict_at(&status, &seen, "2026-12-03T10:00:01Z"));
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Installing, reasons::INSTALL_PENDING)
        );
        assert!(
            stop.message.contains("no disk matched the selector"),
            "{}",
            stop.message
        );
    }

    #[test]
    fn a_failed_1_14_install_stays_failed_while_talos_retries_and_clears_once_installed() {
        let mut status = applied_at_ten("v1.14.1");
        let failed = seen_over_mtls(
            Stage::Booting,
            Some(("failed", "task \"upgrade\" failed: exit code 1")),
        );
        let stop = stop_of(verdict_at(&status, &failed, "2026-12-03T10:00:05Z"));
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::INSTALL_FAILED)
        );
        assert!(stop.message.contains("exit code 1"));
        assert!(stop.message.contains("retries it by itself"));
        // Recorded as Ready's reason; Talos's next attempt shows `installing`: still failed,
        // and never stalled meanwhile.
        let now = time("2026-12-03T10:00:05Z");
        cond::set(
            &mut status.conditions,
            conditions::READY,
            false,
            stop.reason,
            stop.message.clone(),
            None,
            &now,
        );
        let retrying = seen_over_mtls(Stage::Booting, Some(("installing", "")));
        assert_eq!(
            stop_of(verdict_at(&status, &retrying, "2026-12-03T11:00:00Z")),
            stop
        );
        // The fix: the attempt succeeds.
        let waiting = seen_over_mtls(Stage::Booting, Some(("waiting-for-reboot", "")));
        assert_eq!(
            verdict_at(&status, &waiting, "2026-12-03T11:00:00Z"),
            InstallVerdict::Underway
        );
        let done = seen_over_mtls(Stage::Running, Some(("installed", "")));
        assert!(matches!(
            verdict_at(&status, &done, "2026-12-03T11:00:00Z"),
            InstallVerdict::Installed(_)
        ));
    }

    #[test]
    fn a_failed_1_13_install_is_its_fatal_event_then_the_node_back_on_a_new_certificate() {
        let status = applied_at_ten("v1.13.9");
        let caught = InstallSeen {
            stage: Some(Stage::Rebooting),
            fatal: Some("sequence failed: error running phase 2 in install sequence".into()),
            ..Default::default()
        };
        let stop = stop_of(verdict_at(&status, &caught, "2026-12-03T10:00:05Z"));
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::INSTALL_FAILED)
        );
        assert!(stop.message.contains("error running phase 2"));

        let back = InstallSeen {
            new_certificate: Some("new-fp".into()),
            ..Default::default()
        };
        let InstallVerdict::Uninstalled { stop, fingerprint } =
            verdict_at(&status, &back, "2026-12-03T10:00:20Z")
        else {
            panic!("not uninstalled");
        };
        assert_eq!(fingerprint, "new-fp");
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Failed, reasons::INSTALL_FAILED)
        );
        assert!(stop.message.contains("new certificate new-fp"));
        assert!(stop.message.contains(FINGERPRINT));
        assert!(stop.message.contains("update spec.fingerprint to it"));

        // While the first apply waits for the certificate to be confirmed, the failure stays.
        let mut recorded = status.clone();
        let now = time("2026-12-03T10:00:20Z");
        cond::set(
            &mut recorded.conditions,
            conditions::READY,
            false,
            stop.reason,
            stop.message.clone(),
            None,
            &now,
        );
        let mismatch = fingerprint_presented(ADDRESS, "new-fp", FINGERPRINT);
        assert_eq!(keep_install_failure(&recorded, mismatch.clone()), stop);
        assert_eq!(
            keep_install_failure(&applied_at_ten("v1.13.9"), mismatch.clone()),
            mismatch,
            "no failure recorded"
        );
        let other = Blocked::approved(reasons::NODE_UNREACHABLE, "x".into());
        assert_eq!(keep_install_failure(&recorded, other.clone()), other);
    }

    #[test]
    fn installed_is_what_talos_reports_of_the_install_not_an_answer_over_mutual_tls() {
        let v13 = applied_at_ten("v1.13.9");
        let v14 = applied_at_ten("v1.14.1");
        let at = "2026-12-03T10:00:30Z";
        let installed = |status: &TalosMachineStatus, seen: &InstallSeen| {
            matches!(verdict_at(status, seen, at), InstallVerdict::Installed(_))
        };
        // 1.13: past `installing`, after the reboot.
        assert!(!installed(&v13, &seen_over_mtls(Stage::Installing, None)));
        assert!(installed(&v13, &seen_over_mtls(Stage::Booting, None)));
        assert!(installed(&v13, &seen_over_mtls(Stage::Running, None)));
        // 1.14: booting while the unattended install runs proves nothing; its phase does.
        assert!(!installed(&v14, &seen_over_mtls(Stage::Booting, None)));
        assert!(!installed(
            &v14,
            &seen_over_mtls(Stage::Booting, Some(("installing", "")))
        ));
        assert!(installed(
            &v14,
            &seen_over_mtls(Stage::Booting, Some(("installed", "")))
        ));
        // Seen in maintenance mode (not configured): never installed by its stage.
        let maintenance = InstallSeen {
            stage: Some(Stage::Running),
            ..Default::default()
        };
        assert!(!installed(&v13, &maintenance));
        assert_eq!(
            verdict_at(&v13, &InstallSeen::default(), at),
            InstallVerdict::Underway
        );
        let mut status = v13;
        installed_mark(&mut status);
        assert!(cond::is_true(&status.conditions, conditions::INSTALLED));
    }

    fn installed_mark(status: &mut TalosMachineStatus) {
        installed(status, "done".into(), None, &time("2026-12-03T10:01:00Z"));
    }

    #[test]
    fn an_install_seen_running_past_the_limit_is_stalled() {
        let status = applied_at_ten("v1.13.9");
        let installing_stage = InstallSeen {
            stage: Some(Stage::Installing),
            ..Default::default()
        };
        assert_eq!(
            verdict_at(&status, &installing_stage, "2026-12-03T10:00:59Z"),
            InstallVerdict::Underway
        );
        let stop = stop_of(verdict_at(
            &status,
            &installing_stage,
            "2026-12-03T10:02:00Z",
        ));
        assert_eq!(
            (stop.phase, stop.reason),
            (MachinePhase::Installing, reasons::INSTALL_STALLED)
        );
        assert!(stop.message.contains("run for 120s, past the limit of 60s"));
        let v14 = applied_at_ten("v1.14.1");
        let phase = seen_over_mtls(Stage::Booting, Some(("installing", "")));
        assert_eq!(
            stop_of(verdict_at(&v14, &phase, "2026-12-03T10:02:00Z")).reason,
            reasons::INSTALL_STALLED
        );
        // Nothing seen installing (a silent node, a worker waiting for trustd): not stalled.
        assert_eq!(
            verdict_at(&status, &InstallSeen::default(), "2026-12-03T11:00:00Z"),
            InstallVerdict::Underway
        );
    }

    #[test]
    fn only_an_unchanged_machine_not_woken_before_its_due_look_is_an_echo() {
        let now = Instant::now();
        let machine = TalosMachine::test("m").build();
        let seen = looked_at(&machine);
        let look = LastLook {
            seen,
            due: now + Duration::from_secs(2),
            woken: false,
            standing: 0,
            since: now,
        };
        let last = Some(look);
        assert_eq!(echo_wait(last, seen, now), Some(Duration::from_secs(2)));
        // Its own status changes are not what a look saw.
        let mut written = machine.clone();
        written.status = Some(TalosMachineStatus::default());
        written.metadata.resource_version = Some("7".into());
        assert_eq!(looked_at(&written), seen);
        // Due, woken by a relation, changed, or never looked at while in progress: a look.
        assert_eq!(echo_wait(last, seen, now + Duration::from_secs(2)), None);
        let woken = LastLook {
            woken: true,
            ..look
        };
        assert_eq!(echo_wait(Some(woken), seen, now), None);
        assert_eq!(echo_wait(None, seen, now), None);
        let mut labelled = machine.clone();
        labelled
            .metadata
            .labels
            .get_or_insert_default()
            .insert("a".into(), "b".into());
        assert_ne!(looked_at(&labelled), seen);
        let mut approved = machine.clone();
        approved.spec.hostname = Some("other".into());
        assert_ne!(looked_at(&approved), seen);
        // The removal finalizer its own look adds is not something it saw; another one is.
        let mut held = machine.clone();
        held.metadata.finalizers = Some(vec![finalizers::MACHINE_REMOVAL.into()]);
        assert_eq!(looked_at(&held), seen);
        let mut foreign = machine;
        foreign.metadata.finalizers = Some(vec!["example.com/keep".into()]);
        assert_ne!(looked_at(&foreign), seen);
    }

    #[test]
    fn a_machine_that_stands_still_is_looked_at_less_often_up_to_a_bound() {
        let progress = Duration::from_secs(2);
        let start = Instant::now();
        let first = next_look(None, 1, 7, progress, start);
        assert_eq!((first.due - start, first.since), (progress, start));
        // Standing still for 10 s: half of it; for a minute: at most five progress requeues.
        let later = start + Duration::from_secs(10);
        let still = next_look(Some(first), 1, 7, progress, later);
        assert_eq!(
            (still.due - later, still.since),
            (Duration::from_secs(5), start)
        );
        let much_later = start + Duration::from_secs(60);
        let bounded = next_look(Some(still), 1, 7, progress, much_later);
        assert_eq!(bounded.due - much_later, progress * 5);
        // It moved: the progress requeue again, standing still from now.
        let moved = next_look(Some(bounded), 1, 8, progress, much_later);
        assert_eq!(
            (moved.due - much_later, moved.since),
            (progress, much_later)
        );
        // A wake recorded during the look is kept for the next reconcile.
        let woken = LastLook {
            woken: true,
            ..bounded
        };
        assert!(next_look(Some(woken), 1, 8, progress, much_later).woken);
    }

    #[test]
    fn where_a_machine_stands_is_its_phase_and_conditions_not_their_times() {
        let mut machine = TalosMachine::test("m").build();
        let bare = standing_at(&machine);
        let mut status = TalosMachineStatus {
            lifecycle: ichor_api::machine::MachineLifecycle {
                phase: MachinePhase::Installing,
                ..Default::default()
            },
            ..Default::default()
        };
        machine.status = Some(status.clone());
        let installing = standing_at(&machine);
        assert_ne!(installing, bare);
        status.inventory.address = Some("10.0.0.9".into());
        machine.status = Some(status.clone());
        assert_eq!(standing_at(&machine), installing, "not other fields");
        status.lifecycle.phase = MachinePhase::Ready;
        machine.status = Some(status);
        assert_ne!(standing_at(&machine), installing);
    }

    fn refused(code: tonic::Code) -> TalosError {
        TalosError::Rpc {
            method: "ApplyConfiguration",
            endpoint: "10.0.0.1".into(),
            status: tonic::Status::new(code, "the text is never read"),
        }
    }

    #[test]
    fn only_a_not_live_refusal_leads_to_a_staged_reboot() {
        assert_eq!(
            drift_refused(&refused(tonic::Code::InvalidArgument)),
            DriftRefused::StageAndReboot
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::FailedPrecondition)),
            DriftRefused::Retry,
            "another apply in progress"
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::Unimplemented)),
            DriftRefused::Retry,
            "not served"
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::Unavailable)),
            DriftRefused::Unanswered
        );
        assert_eq!(
            drift_refused(&refused(tonic::Code::DeadlineExceeded)),
            DriftRefused::Unanswered,
            "the call's limit passed: the node may have applied it"
        );
        let timeout = TalosError::ConnectTimeout {
            endpoint: "10.0.0.1".into(),
            seconds: 10,
        };
        assert_eq!(drift_refused(&timeout), DriftRefused::Unanswered);
    }

    #[test]
    fn join_progress_is_judged_by_voting_not_readiness() {
        let running = |etcd| {
            Some(NodeView {
                stage: Stage::Running,
                etcd,
            })
        };
        assert!(standing(Role::ControlPlane, running(Etcd::Voter(1))).ready);
        assert_eq!(
            standing(Role::ControlPlane, running(Etcd::Learner(1))).phase,
            MachinePhase::Joining
        );
        assert!(!standing(Role::ControlPlane, running(Etcd::NotMember)).ready);
        assert!(standing(Role::Worker, running(Etcd::NotMember)).ready);
        assert_eq!(
            standing(Role::Worker, None).reason,
            reasons::WAITING_FOR_NODE_API
        );
    }

    #[test]
    fn a_member_answering_with_an_alarm_is_a_failing_voter_not_ready() {
        let now = at("2026-12-03T10:00:00Z");
        let mut alarmed = etcd_status(7, false);
        alarmed.errors = vec!["memberID:7 alarm:NOSPACE".into()];
        let answer = etcd_answered(Ok::<_, TalosError>(alarmed));
        assert_eq!(answer, Etcd::Failing(7));
        let seen = etcd_observation(None, Some(answer), now);
        assert!(seen.voter && !seen.healthy, "{seen:?}");
        let judged = standing(
            Role::ControlPlane,
            Some(NodeView {
                stage: Stage::Running,
                etcd: answer,
            }),
        );
        assert!(!judged.ready);
        assert_eq!(judged.reason, reasons::ETCD_UNHEALTHY);
    }

    #[test]
    fn older_talos_than_the_contract_is_refused() {
        assert!(version_supported("v1.14.1", "v1.14.0"));
        assert!(version_supported("v1.15.0", "v1.14.0"));
        assert!(!version_supported("v1.13.9", "v1.14.0"));
        assert!(version_supported("v1.13.9", "v1.13.0"));
        assert!(!version_supported("garbage", "v1.13.0"));
    }
}
