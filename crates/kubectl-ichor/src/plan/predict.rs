//! The plan, pure: from the live TalosCluster, the changed one, and the cluster's machines,
//! classes and storages, what the change does to each machine, in which batches, and what
//! holds it or refuses it. No client here; `plan::plan` reads the objects.
//!
//! Every rule is the one the manager and the webhook run, from the crates they share: the
//! config as `ichor_render::render_machine` renders it, the versions and the upgrade a node
//! needs as `ichor_render::upgrade` decides them, the version rules of
//! `ichor_api::versions` as the webhook applies them at the door, and the order, the batches
//! and the holds from `ichor_deleteguard::forecast`, which drives `rollout::decide`.
//!
//! No Secret is read. A config is compared before and after the change with one placeholder
//! secrets bundle on both sides: what the spec changes shows, what only the bundle would
//! change does not (the bundle is not part of a TalosCluster change).

use std::borrow::Cow;

use ichor_api::common::ConditionStatus;
use ichor_api::machine::{ApprovalState, TalosMachineStatus};
use ichor_api::names::{conditions, labels, reasons};
use ichor_api::rollout::RolloutPolicy;
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass, TalosStorage};
use ichor_deleteguard::forecast::Planned;
use ichor_deleteguard::rollout::{Change, Policy};
use ichor_deleteguard::{DriftHalt, DriftMachine};
use ichor_render::{MachineLayers, SecretsBundle};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use super::policy::read_policy;
use crate::Error;

/// What the plan is made from.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The TalosCluster as stored.
    pub live: &'a TalosCluster,
    /// The TalosCluster as the manifest changes it.
    pub changed: &'a TalosCluster,
    /// The TalosMachines of the cluster's namespace.
    pub machines: &'a [TalosMachine],
    /// The TalosMachineClasses of the namespace.
    pub classes: &'a [TalosMachineClass],
    /// The TalosStorages of the namespace.
    pub storages: &'a [TalosStorage],
    /// Now.
    pub now: Timestamp,
}

/// How a changed config reaches a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Live: the node runs Talos 1.14 or newer, which applies every change live.
    Live,
    /// The node decides: live when it can, else staged and rebooted (Talos 1.13 and older,
    /// or a node that did not say its version).
    NodeDecides,
}

/// What the change does to one machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Nothing,
    /// Its config changes.
    Config(How),
    /// Its node is upgraded with `image` (its config, if it changes too, applied first).
    Upgrade {
        /// The installer image.
        image: String,
        /// Whether its config changes too.
        config: bool,
    },
    /// A Kubernetes version: its config goes live and restarts its Kubernetes components.
    Restart,
}

impl Step {
    /// What the step does to the node, for the rollout's rules.
    pub fn change(&self) -> Change {
        match self {
            Self::Nothing | Self::Config(_) => Change::Live,
            Self::Upgrade { .. } | Self::Restart => Change::Disruptive,
        }
    }
}

/// One configured machine: as the drift rollout sees it after the change, and its step.
#[derive(Clone, Debug)]
pub struct Predicted<'a> {
    /// The machine.
    pub machine: &'a TalosMachine,
    /// As the drift rollout sees it, its hashes those of the placeholder renders.
    pub drift: DriftMachine,
    /// Its config hash before the change, with the placeholder bundle.
    pub before: String,
    /// What the change does to it.
    pub step: Step,
    /// Whether a config change of its was already rolling out before this change.
    pub already: bool,
}

/// The bundle both sides of a comparison are rendered with: empty values, never a Secret's.
fn placeholder() -> SecretsBundle {
    SecretsBundle::default()
}

/// `cluster` with the versions the manager renders and upgrades with: those it accepted
/// (`status.acceptedVersions`, ADR 0069), else the declared ones. Where the manager refuses to
/// render a declaration it never accepted, the plan shows it as declared, beside the refusal.
pub fn effective(cluster: &TalosCluster) -> TalosCluster {
    ichor_render::upgrade::effective(cluster).map_or_else(|_| cluster.clone(), Cow::into_owned)
}

/// The cluster after the change, as the manager renders it once the declared versions are
/// accepted: the changed spec, the live object's metadata and status.
pub fn after_change(o: &Observed<'_>) -> TalosCluster {
    let mut after = o.live.clone();
    after.spec = o.changed.spec.clone();
    after
}

/// Whether the machine says it is Ready.
fn ready(status: &TalosMachineStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == conditions::READY && c.status == ConditionStatus::True)
}

/// How a changed config reaches a node that runs `running`. Talos 1.14 applies every change
/// live in normal mode: `AUTO` resolves to `NO_REBOOT` (shared talos-facts §5 "In normal mode
/// 1.14 applies everything live", and `docs/talos-facts.md` §11.1 step 9), which the simulator
/// follows. Talos 1.13 and older decide per change (`CanApplyImmediate`, §11.1 step 9), which
/// the facts do not spell out: the node decides.
pub fn how(running: Option<&str>) -> How {
    let series = running.and_then(ichor_api::versions::Series::parse);
    match series {
        Some(s) if s >= ichor_api::versions::Series::new(1, 14) => How::Live,
        _ => How::NodeDecides,
    }
}

/// Every machine of the cluster with an applied config, and what the change does to each;
/// a config that does not render after the change is a refusal, said in `refused`.
pub fn predict_all<'a>(
    o: &Observed<'a>,
    before: &TalosCluster,
    after: &TalosCluster,
) -> (Vec<Predicted<'a>>, Vec<String>) {
    let name = o.live.name_any();
    let oldest = ichor_api::versions::oldest_running(
        o.machines.iter(),
        &o.live.namespace().unwrap_or_default(),
        &name,
    )
    .map(|(text, _)| text);
    let mut predicted = Vec::new();
    let mut refused = Vec::new();
    for machine in o
        .machines
        .iter()
        .filter(|m| m.spec.cluster_ref.name == name)
    {
        match predict(o, machine, oldest, before, after) {
            Ok(Some(p)) => predicted.push(p),
            Ok(None) => {}
            Err(message) => refused.push(message),
        }
    }
    predicted.sort_by(|a, b| a.drift.name.cmp(&b.drift.name));
    (predicted, refused)
}

/// What the change does to `machine` (`None`: not an approved machine with a role and an
/// applied config, so no rollout reaches it).
fn predict<'a>(
    o: &Observed<'a>,
    machine: &'a TalosMachine,
    oldest: Option<&str>,
    before: &TalosCluster,
    after: &TalosCluster,
) -> Result<Option<Predicted<'a>>, String> {
    let (Some(role), ApprovalState::Approved) = (machine.spec.role, machine.spec.approval_state)
    else {
        return Ok(None);
    };
    let status = machine.status.clone().unwrap_or_default();
    if status.applied.config_hash.is_none() {
        return Ok(None);
    }
    let name = machine.name_any();
    let bundle = placeholder();
    let render = |cluster: &TalosCluster| {
        let mut layers = MachineLayers::of(machine, o.classes, o.storages)?;
        layers.oldest_running = oldest;
        ichor_render::render_machine(cluster, machine, role, &layers, &bundle)
    };
    let old = render(before).map_err(|e| {
        format!(
            "the config of TalosMachine {name} does not render now, before the change either: {e}; the manager holds it already"
        )
    })?;
    let new = render(after).map_err(|e| {
        format!("the config of TalosMachine {name} does not render after the change: {e}")
    })?;
    let image = ichor_render::upgrade::upgrade_image(after, &status, &new);
    // A change already rolling out is not seen in the placeholder renders: the machine says so.
    let already = config_pending(&status);
    let config = old.hash != new.hash || already;
    let step = match (image.clone(), config) {
        (Some(image), config) => Step::Upgrade { image, config },
        (None, true) if before.spec.kubernetes_version != after.spec.kubernetes_version => {
            Step::Restart
        }
        (None, true) => Step::Config(how(status.inventory.talos_version.as_deref())),
        (None, false) => Step::Nothing,
    };
    let drift = DriftMachine {
        name,
        role,
        applied: Some(if old.hash == new.hash && already {
            format!("{} and a change before it", old.hash)
        } else {
            old.hash.clone()
        }),
        rendered: new.hash,
        healthy: ready(&status),
        leaving: machine.metadata.deletion_timestamp.is_some() || status.removal.progress.is_some(),
        upgrade: image,
    };
    Ok(Some(Predicted {
        machine,
        drift,
        before: old.hash,
        step,
        already,
    }))
}

/// Whether the machine says a changed config of its still waits to roll out (its
/// `ConfigApplied` waits for its turn, a reboot, the policy, or a halt).
fn config_pending(status: &TalosMachineStatus) -> bool {
    const PENDING: [&str; 4] = [
        reasons::NEEDS_REBOOT,
        reasons::DRIFT_QUEUED,
        reasons::DRIFT_NOT_APPLIED,
        reasons::DRIFT_HALTED,
    ];
    status.drift.reboot.is_some()
        || status.conditions.iter().any(|c| {
            c.type_ == conditions::CONFIG_APPLIED
                && c.status == ConditionStatus::False
                && (PENDING.contains(&c.reason.as_str())
                    || reasons::POLICY_HOLDS.contains(&c.reason.as_str()))
        })
}

/// The halt recorded on the cluster, as the forecast compares it with the placeholder
/// renders: a refused config stands while the change leaves that machine's config as it
/// renders now; a failed installer is compared as it is.
pub fn halt(o: &Observed<'_>, predicted: &[Predicted<'_>]) -> Option<DriftHalt> {
    let recorded = o.live.status.as_ref()?.drift.halt.as_ref()?;
    let machine = predicted
        .iter()
        .find(|p| p.drift.name == recorded.machine)?;
    let config = recorded.rendered_hash.starts_with("sha256:");
    let rendered = if config && machine.before == machine.drift.rendered {
        machine.drift.rendered.clone()
    } else {
        recorded.rendered_hash.clone()
    };
    Some(DriftHalt {
        machine: recorded.machine.clone(),
        rendered,
    })
}

/// Where the policy governing `machine` is declared, that policy, and its read rules: its
/// class's when the class declares one, else the cluster's (ADR 0076).
pub fn governing<'a>(
    o: &Observed<'a>,
    machine: &TalosMachine,
    cluster: &'a Policy,
) -> Result<(String, &'a RolloutPolicy, Policy), Error> {
    let class = machine.labels().get(labels::CLASS).and_then(|name| {
        o.classes.iter().find(|c| {
            c.name_any() == *name
                && c.namespace() == machine.namespace()
                && c.spec.cluster_ref.name == machine.spec.cluster_ref.name
        })
    });
    match class.and_then(|c| c.spec.rollout.as_ref().map(|p| (c.name_any(), p))) {
        Some((name, policy)) => {
            let field = format!("TalosMachineClass {name} spec.rollout");
            let read = read_policy(policy, &field)?;
            Ok((field, policy, read))
        }
        None => Ok((
            "spec.rollout".to_owned(),
            &o.changed.spec.rollout,
            cluster.clone(),
        )),
    }
}

/// The machine as the forecast takes it: its step, whether it is in flight, its failure
/// domain.
pub fn planned(p: &Predicted<'_>, o: &Observed<'_>) -> Planned {
    let status = p.machine.status.clone().unwrap_or_default();
    let mut planned = Planned::new(p.drift.clone(), p.step.change());
    // As the machine records it: its upgrade sent, its reboot for drift under way, or its Node
    // draining for a disruption (the cluster's `status.lock` is a best-effort mirror of the
    // Lease, which a read-only user may not read: not used).
    planned.in_flight = status.upgrade.record.is_some()
        || status.drift.reboot.is_some()
        || status.drain.record.is_some();
    planned.failure_domain = o
        .changed
        .spec
        .rollout
        .failure_domain_label
        .as_ref()
        .and_then(|label| p.machine.labels().get(label).cloned());
    planned
}
