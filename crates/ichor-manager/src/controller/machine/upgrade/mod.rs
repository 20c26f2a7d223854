//! A machine's Talos upgrade: its node runs another Talos version, or another schematic, than
//! its cluster declares (`spec.talosVersion`, `spec.schematic`). Rolled out like drift, in the
//! planner's order and under the cluster lock (held as `upgrade/<uid>`), one node at a time,
//! every other one healthy, the planner's etcd checks passed (ADR 0068): the upgrade is
//! recorded before anything is sent, the installer pulled and installed, then the node
//! rebooted; it must come back on the declared version and schematic. A node back on its old
//! version (Talos rolled it back), an installer that cannot be pulled, a node that never went
//! down or never came back stops the rollout at that machine until the declaration changes.
//! Ichor never writes the cluster's spec: the declared version is the target, and a revert of
//! it is rolled out like any change.

use ichor_api::cluster::LockHolder;
use ichor_api::common::{ConditionStatus, Role};
use ichor_api::machine::{MachineUpgrade, TalosMachineStatus, UpgradeRecord};
use ichor_api::names::{actions, conditions, reasons};
use ichor_api::operation::NodeProgress;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{Disruption, Stage};
use ichor_render::Rendered;
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::runtime::events::EventType;

use super::act as machine_act;
use crate::{Context, Error, Stop, infra::conditions as cond};

pub(crate) mod plan;

/// The lock holder of a machine's upgrade.
pub fn upgrade_holder(machine: &TalosMachine) -> LockHolder {
    LockHolder::Upgrade(machine.uid().unwrap_or_default())
}

/// One machine's upgrade: the machine, its cluster, its node's client (`None`: it does not
/// answer now), the config rendered for it, and what the turn and the planner need.
pub(super) struct Upgrade<'a> {
    pub(super) machine: &'a TalosMachine,
    pub(super) cluster: &'a TalosCluster,
    pub(super) client: Option<&'a TalosClient>,
    pub(super) rendered: &'a Rendered,
    pub(super) role: Role,
    pub(super) address: &'a str,
    /// Whether the node answered running (and a control plane as a healthy etcd voter).
    pub(super) healthy: bool,
    pub(super) credentials: &'a ichor_talos::Credentials,
    pub(super) bundle: &'a ichor_render::SecretsBundle,
    pub(super) sources: &'a crate::layers::Sources,
}

/// Where a look left the machine's upgrade turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Turn {
    /// Its turn ended now (the node back and verified, or its upgrade failed): the machines
    /// queued behind it are woken.
    Ended,
    /// It waits for another machine's turn (or a halted rollout): the end of that turn wakes
    /// it, so it needs no look of its own before its settled one (ADR 0071).
    Queued,
    /// Anything else: no upgrade, one in flight, or a wait that no other machine ends.
    Other,
}

/// Moves the machine's upgrade on, if it needs one or has one in flight, and says where its
/// turn stands.
pub(super) async fn advance(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
) -> Result<Turn, Error> {
    let Some(record) = status.upgrade.record.clone() else {
        let Some(target) = plan::target(u.cluster, status, u.rendered) else {
            runs_declared(ctx, u, status).await?;
            return Ok(Turn::Other);
        };
        return start(ctx, u, status, target).await;
    };
    if record.progress.is_intended() {
        send(ctx, u, status, &record, Lock::Again).await?;
        return Ok(Turn::Other);
    }
    let ended = follow(ctx, u, status, &record).await?;
    Ok(if ended { Turn::Ended } else { Turn::Other })
}

/// `UpToDate` for a node that runs the declared version (and schematic).
async fn runs_declared(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
) -> Result<(), Error> {
    let Some(version) = status.inventory.talos_version.clone() else {
        return Ok(());
    };
    let schematic = status
        .inventory
        .schematic
        .as_ref()
        .map(|s| format!(", schematic {s}"))
        .unwrap_or_default();
    let stop = Stop::new(
        reasons::RUNS_DECLARED,
        format!("runs Talos {version}{schematic}, as declared"),
    );
    set_up_to_date(ctx, u, status, true, &stop).await
}

/// A node whose changed config rolls out first (or that reboots into it): when an upgrade is
/// due after it and none is in flight, `UpToDate` is false (`UpgradeQueued`, with what the
/// config waits for), so neither the machine nor the cluster's rollout counts the node as
/// running a declaration it does not run.
pub(super) async fn behind_config(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
) -> Result<(), Error> {
    // Its own upgrade's failure (what halted the rollout here) says more than a queue does,
    // and stands until the upgrade is tried again.
    if status.upgrade.record.is_some() || own_upgrade_failed(status) {
        return Ok(());
    }
    let Some(target) = plan::target(u.cluster, status, u.rendered) else {
        return Ok(());
    };
    let config = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::CONFIG_APPLIED && c.status != ConditionStatus::True)
        .map(|c| format!(" ({})", c.message))
        .unwrap_or_default();
    let why = format!("its changed config rolls out first{config}");
    not_up_to_date(ctx, u, status, &queued(&target, why)).await
}

/// Whether `UpToDate` says the machine's own upgrade failed (`UpgradeRolledBack`,
/// `UpgradeFailed`): what halted the rollout here, kept until the upgrade is tried again.
fn own_upgrade_failed(status: &TalosMachineStatus) -> bool {
    status.conditions.iter().any(|c| {
        c.type_ == conditions::UP_TO_DATE
            && (c.reason == reasons::UPGRADE_ROLLED_BACK || c.reason == reasons::UPGRADE_FAILED)
    })
}

/// `UpToDate` false, saying why.
async fn not_up_to_date(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    stop: &Stop,
) -> Result<(), Error> {
    set_up_to_date(ctx, u, status, false, stop).await
}

/// Sets `UpToDate` in `status` and stores it when it changed, on the machine as stored: the
/// upgrade group is only ever written from a fresh read, never from a cached status whose
/// record could be behind this manager's own writes.
async fn set_up_to_date(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    holds: bool,
    stop: &Stop,
) -> Result<(), Error> {
    let generation = u.machine.metadata.generation;
    let now = ctx.now();
    say(&mut status.conditions, holds, stop, generation, &now);
    let stored = u.machine.status.as_ref().map(|s| &s.conditions);
    let current = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::UP_TO_DATE);
    let unchanged = stored
        .and_then(|c| c.iter().find(|c| c.type_ == conditions::UP_TO_DATE))
        .is_some_and(|c| {
            current.is_some_and(|n| {
                n.status == c.status && n.reason == c.reason && n.message == c.message
            })
        });
    if unchanged {
        return Ok(());
    }
    machine_act::patch_status::<MachineUpgrade>(ctx, u.machine, |s| {
        say(&mut s.conditions, holds, stop, generation, &now);
    })
    .await
}

/// `UpToDate` set in `conditions`: `holds`, with `stop`'s reason and message.
fn say(
    conditions: &mut Vec<ichor_api::common::Condition>,
    holds: bool,
    stop: &Stop,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    cond::set(
        conditions,
        conditions::UP_TO_DATE,
        holds,
        stop.reason,
        stop.message.clone(),
        generation,
        now,
    );
}

/// A node that needs an upgrade: its turn, the lock, the planner, its identity, then the
/// upgrade recorded (with the node's boot id) and sent.
async fn start(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    target: plan::Target,
) -> Result<Turn, Error> {
    let Some(client) = u.client else {
        not_up_to_date(ctx, u, status, &queued(&target, "the node does not answer")).await?;
        return Ok(Turn::Other);
    };
    // The installer's schematic is registered with its factory first (ADR 0067).
    if let Some(stop) =
        super::schematic_registered(ctx, u.cluster, u.machine, u.sources, u.rendered).await
    {
        not_up_to_date(ctx, u, status, &stop).await?;
        return Ok(Turn::Other);
    }
    let boot = match cleared(ctx, u, status, &target, client).await? {
        Cleared::Go(boot) => boot,
        Cleared::Queued => return Ok(Turn::Queued),
        Cleared::Waits => return Ok(Turn::Other),
    };
    // The Node is cordoned and drained first, the lock held meanwhile (ADR 0066).
    if let Some(stop) = drain(ctx, u, &target).await? {
        not_up_to_date(ctx, u, status, &stop).await?;
        return Ok(Turn::Other);
    }
    let record = UpgradeRecord {
        image: target.image.clone(),
        version: target.version.clone(),
        from_version: status.inventory.talos_version.clone(),
        boot_id_before: boot,
        progress: NodeProgress::Intended,
    };
    write_record(ctx, u.machine, &record).await?;
    status.upgrade.record = Some(record.clone());
    ctx.event(
        u.machine,
        EventType::Normal,
        reasons::UPGRADING,
        actions::UPGRADE,
        format!(
            "upgrading from Talos {} to {} with {} under the cluster lock",
            record.from_version.as_deref().unwrap_or("unknown"),
            record.version,
            record.image
        ),
    )
    .await;
    send(ctx, u, status, &record, Lock::JustTaken).await?;
    Ok(Turn::Other)
}

/// Whether the node may be upgraded now ([`cleared`]).
enum Cleared {
    /// It may: its boot id from before the upgrade.
    Go(String),
    /// It waits for another machine's turn, or for a halted rollout to be fixed.
    Queued,
    /// It waits for something else (the lock, the planner, its identity, its boot id).
    Waits,
}

/// Whether the node may be upgraded now: its turn, the cluster lock (taken), the planner, its
/// identity. Unless it may, `UpToDate` says why it waits, the lock given back.
async fn cleared(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    target: &plan::Target,
    client: &TalosClient,
) -> Result<Cleared, Error> {
    let machines = crate::cluster_machines_as_stored(ctx, u.cluster).await?;
    if let Some(waits) = not_its_turn(ctx, u, status, target, &machines).await? {
        return Ok(waits);
    }
    let me = upgrade_holder(u.machine);
    let outcome = crate::lock::acquire_step(ctx, u.cluster, u.machine, &machines, &me).await?;
    if !outcome.held() {
        not_up_to_date(ctx, u, status, &queued(target, outcome.message())).await?;
        return Ok(Cleared::Waits);
    }
    if let Some(stop) = planner_holds(ctx, u, &machines, target).await? {
        crate::lock::release(ctx, u.cluster, &me).await?;
        not_up_to_date(ctx, u, status, &stop).await?;
        return Ok(Cleared::Waits);
    }
    // The node behind this connection must be the machine (ADR 0052).
    let checked = crate::identity::check_machine(client, u.machine, u.address, "upgrade").await;
    if crate::identity::held_on(ctx, u.machine, status, conditions::UP_TO_DATE, &checked).await {
        crate::lock::release(ctx, u.cluster, &me).await?;
        return Ok(Cleared::Waits);
    }
    match client.boot_id().await {
        Ok(boot) => Ok(Cleared::Go(boot)),
        Err(error) => {
            crate::lock::release(ctx, u.cluster, &me).await?;
            let stop = queued(
                target,
                format!("the node does not tell its boot id, by which its reboot is seen: {error}"),
            );
            not_up_to_date(ctx, u, status, &stop).await?;
            Ok(Cleared::Waits)
        }
    }
}

/// Why the upgrade does not start in this look, by the rollout's order and its policy:
/// another machine's turn (queued), or its own turn held (a suspend, a maintenance window).
/// `UpToDate` says which.
async fn not_its_turn(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    target: &plan::Target,
    machines: &[TalosMachine],
) -> Result<Option<Cleared>, Error> {
    let turn = super::drift::wait_for_turn(
        ctx,
        (u.machine, u.cluster, machines),
        u.sources,
        u.bundle,
        crate::rollout_policy::Step::Upgrade,
    )
    .await?;
    if let Some(held) = turn
        .as_ref()
        .filter(|w| crate::rollout_policy::is_policy_hold(w.reason))
    {
        // Its turn, held by the rollout policy (a suspend, a maintenance window; ADR 0074):
        // said with the policy's own reason, and looked at again soon.
        let stop = waits(held.reason, target, &held.message);
        not_up_to_date(ctx, u, status, &stop).await?;
        return Ok(Some(Cleared::Waits));
    }
    if let Some(waits) = turn {
        // Another machine's turn: said without naming it, so the message holds until this
        // machine's own turn, and the end of each turn wakes only the next (ADR 0071).
        // A rollout halted at this very machine keeps its own failure's reason: it says more.
        if waits.reason == reasons::DRIFT_HALTED && own_upgrade_failed(status) {
            return Ok(Some(Cleared::Queued));
        }
        let stop = if waits.reason == reasons::DRIFT_QUEUED {
            queued(target, format!("it {}", super::drift::plan::TURN_WAIT))
        } else {
            queued(target, waits.message)
        };
        not_up_to_date(ctx, u, status, &stop).await?;
        return Ok(Some(Cleared::Queued));
    }
    Ok(None)
}

/// The planner's word on the upgrade, a restart: `Some` says why it waits (a voter unhealthy,
/// quorum at risk; ADR 0019).
async fn planner_holds(
    ctx: &Context,
    u: &Upgrade<'_>,
    machines: &[TalosMachine],
    target: &plan::Target,
) -> Result<Option<Stop>, Error> {
    let verdict = crate::safety::check(
        ctx,
        u.machine,
        u.cluster,
        machines,
        u.credentials,
        &Disruption::Restart,
        Stage::Run,
    )
    .await?;
    Ok((!verdict.is_proceed()).then(|| {
        Stop::new(
            verdict.reason().unwrap_or(reasons::ETCD_UNHEALTHY),
            format!(
                "the upgrade to Talos {} waits: {}",
                target.version,
                verdict.message().unwrap_or_default()
            ),
        )
    }))
}

/// Cordons and drains the machine's Node before its upgrade (ADR 0066): `Some` says what the
/// upgrade waits for (pods leaving, a budget, the drain's timeout, the workload API).
async fn drain(
    ctx: &Context,
    u: &Upgrade<'_>,
    target: &plan::Target,
) -> Result<Option<Stop>, Error> {
    let purpose = format!("upgrade to Talos {} ({})", target.version, target.image);
    let disruption =
        crate::drain::Disruption::new(ctx, u.cluster, u.machine, purpose, actions::UPGRADE);
    Ok(disruption.drain_or_wait().await?.err())
}

/// Why the upgrade to `target` waits: `why`, under `UpgradeQueued`.
fn queued(target: &plan::Target, why: impl std::fmt::Display) -> Stop {
    waits(reasons::UPGRADE_QUEUED, target, why)
}

/// Why the upgrade to `target` waits: `why`, under `reason`.
fn waits(reason: &'static str, target: &plan::Target, why: impl std::fmt::Display) -> Stop {
    Stop::new(
        reason,
        format!(
            "to be upgraded to Talos {} with {}: {why}",
            target.version, target.image
        ),
    )
}

/// Writes the machine's upgrade record, as stored.
async fn write_record(
    ctx: &Context,
    machine: &TalosMachine,
    record: &UpgradeRecord,
) -> Result<(), Error> {
    machine_act::patch_status::<MachineUpgrade>(ctx, machine, |s| {
        s.upgrade.record = Some(record.clone());
    })
    .await
}

/// The cluster lock for a recorded upgrade not sent yet: a restart finds it as it left it, or
/// takes it again if it lapsed meanwhile. `Some` says why the upgrade waits for it.
async fn lock_again(
    ctx: &Context,
    u: &Upgrade<'_>,
    record: &UpgradeRecord,
) -> Result<Option<Stop>, Error> {
    let machines = crate::cluster_machines_as_stored(ctx, u.cluster).await?;
    let me = upgrade_holder(u.machine);
    let outcome = crate::lock::acquire_step(ctx, u.cluster, u.machine, &machines, &me).await?;
    Ok((!outcome.held()).then(|| {
        Stop::new(
            reasons::UPGRADE_QUEUED,
            format!(
                "upgrade to Talos {} recorded, not sent yet: {}",
                record.version,
                outcome.message()
            ),
        )
    }))
}

/// Where the cluster lock stands when a recorded upgrade is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lock {
    /// This look took it before recording the upgrade: held, nothing to read again.
    JustTaken,
    /// A later look found the upgrade recorded and not sent (a restart, a lost answer): the
    /// lock is taken again first, or found still held.
    Again,
}

/// Sends the recorded upgrade: a control plane hands its etcd leadership on, the installer is
/// pulled and installed (the lock renewed meanwhile), the upgrade recorded sent, then the
/// reboot (talos-facts §9.6: the lifecycle upgrade neither drains nor reboots). A refusal
/// stops the rollout here.
async fn send(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    record: &UpgradeRecord,
    lock: Lock,
) -> Result<(), Error> {
    let me = upgrade_holder(u.machine);
    let Some(client) = u.client else {
        let stop = Stop::new(
            reasons::UPGRADING,
            format!(
                "upgrade to Talos {} recorded, not sent yet: the node does not answer",
                record.version
            ),
        );
        return not_up_to_date(ctx, u, status, &stop).await;
    };
    if lock == Lock::Again
        && let Some(stop) = lock_again(ctx, u, record).await?
    {
        return not_up_to_date(ctx, u, status, &stop).await;
    }
    if u.role == Role::ControlPlane {
        // Talos's own reboot hands nothing over (talos-facts §9.6): a leader stepping down
        // first saves an election. Best effort: a follower answers with nothing to do.
        let _ = client.etcd_forfeit_leadership().await;
    }
    let installed = crate::lock::renewed_while(ctx, u.cluster, &me, async {
        client.pull_image(&record.image).await?;
        client.upgrade(&record.image).await
    })
    .await;
    if let Err(error) = installed {
        let stop = Stop::new(
            reasons::UPGRADE_FAILED,
            format!(
                "the node could not install {}: {error}; the rollout stops here until spec.talosVersion or the schematic changes",
                record.image
            ),
        );
        return fail(ctx, u, status, record, stop).await;
    }
    let sent = UpgradeRecord {
        progress: NodeProgress::Sent { sent_at: ctx.now() },
        ..record.clone()
    };
    // Recorded sent, and said so, in one write before the reboot: a reboot that fails says
    // so next.
    let rebooting = Stop::new(
        reasons::UPGRADING,
        format!(
            "upgrading to Talos {} with {}: installed, rebooting",
            record.version, record.image
        ),
    );
    write_record_saying(ctx, u, status, sent, &rebooting).await?;
    if let Err(error) = client.reboot().await {
        let stop = Stop::new(
            reasons::UPGRADE_FAILED,
            format!(
                "{} was installed, but the reboot into it failed: {error}; the rollout stops here",
                record.image
            ),
        );
        return fail(ctx, u, status, record, stop).await;
    }
    Ok(())
}

/// Writes the machine's upgrade `record` and `UpToDate` false saying `stop`, in one write, as
/// stored.
async fn write_record_saying(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    record: UpgradeRecord,
    stop: &Stop,
) -> Result<(), Error> {
    let generation = u.machine.metadata.generation;
    let now = ctx.now();
    say(&mut status.conditions, false, stop, generation, &now);
    machine_act::patch_status::<MachineUpgrade>(ctx, u.machine, |s| {
        s.upgrade.record = Some(record.clone());
        say(&mut s.conditions, false, stop, generation, &now);
    })
    .await?;
    status.upgrade.record = Some(record);
    Ok(())
}

/// After the upgrade was sent: the node goes down, comes back healthy on the declared version
/// and schematic (the turn ends, `true`), or the upgrade failed (the rollout stops here, and
/// the turn ends too).
async fn follow(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    record: &UpgradeRecord,
) -> Result<bool, Error> {
    let boot = match u.client {
        Some(client) => client.boot_id().await.ok(),
        None => None,
    };
    let sent_at = record.progress.sent_at().map(|t| t.0);
    let seen = plan::Seen {
        boot: boot.as_deref(),
        healthy: u.healthy,
        version: status.inventory.talos_version.as_deref(),
        schematic: status.inventory.schematic.as_deref(),
        since: plan::elapsed(sent_at.as_ref(), ctx.clock.now()),
    };
    let wanted = u.rendered.installer.schematic.as_deref();
    match plan::after(record, &seen, wanted) {
        plan::After::Wait(message) => {
            let waits = Stop::new(reasons::UPGRADING, message);
            if !record.progress.went_down() && seen.boot.is_some_and(|b| b != record.boot_id_before)
            {
                // Seen down, and where it stands, in one write.
                let down = UpgradeRecord {
                    progress: record.progress.clone().down(ctx.now()),
                    ..record.clone()
                };
                write_record_saying(ctx, u, status, down, &waits).await?;
            } else {
                not_up_to_date(ctx, u, status, &waits).await?;
            }
            Ok(false)
        }
        plan::After::Failed(stop) => fail(ctx, u, status, record, stop).await.map(|()| true),
        plan::After::Verified(message) => {
            // The cordon of its drain is lifted first (ADR 0066); while the workload API does
            // not answer, the record stays and the next look lifts it.
            let lifted = crate::drain::lift(ctx, u.cluster, u.machine, actions::UPGRADE).await?;
            if !matches!(lifted, crate::workload::Outcome::Done(_)) {
                let stop = Stop::new(
                    reasons::UPGRADING,
                    format!("{message}; its Node is uncordoned once the workload API answers"),
                );
                not_up_to_date(ctx, u, status, &stop).await?;
                return Ok(false);
            }
            // Ends the turn: the record cleared and `UpToDate` stored before the lock is
            // released, so the next machine reads this one done (ADR 0043).
            let done = Stop::new(reasons::RUNS_DECLARED, message);
            let note = format!("{}; the next machine may go", done.message);
            end(ctx, u, status, (true, &done), (EventType::Normal, note)).await?;
            Ok(true)
        }
    }
}

/// The upgrade failed on this node: the rollout stops at this machine (recorded on the
/// cluster, as a refused config is, until the declared image changes), the record is cleared,
/// the lock released, and a Warning says why.
async fn fail(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    record: &UpgradeRecord,
    stop: Stop,
) -> Result<(), Error> {
    crate::drift::record_halt(ctx, u.cluster, u.machine, &record.image, &stop.message).await?;
    // The node is not disrupted any more: its cordon goes (best effort; a record left is
    // taken over by its next disruption, ADR 0066).
    crate::drain::lift(ctx, u.cluster, u.machine, actions::UPGRADE).await?;
    let note = stop.message.clone();
    end(ctx, u, status, (false, &stop), (EventType::Warning, note)).await
}

/// Ends the machine's upgrade turn: the record cleared and `UpToDate` (`holds`, `stop`'s reason
/// and message) stored, as stored, then the lock released, then the Event.
async fn end(
    ctx: &Context,
    u: &Upgrade<'_>,
    status: &mut TalosMachineStatus,
    (holds, stop): (bool, &Stop),
    (kind, note): (EventType, String),
) -> Result<(), Error> {
    status.upgrade.record = None;
    let generation = u.machine.metadata.generation;
    say(&mut status.conditions, holds, stop, generation, &ctx.now());
    machine_act::patch_status::<MachineUpgrade>(ctx, u.machine, |s| {
        s.upgrade.record = None;
        s.conditions.clone_from(&status.conditions);
    })
    .await?;
    crate::lock::release(ctx, u.cluster, &upgrade_holder(u.machine)).await?;
    ctx.event(u.machine, kind, stop.reason, actions::UPGRADE, note)
        .await;
    Ok(())
}
