//! machined's sequences as a node's events tell them (talos-facts §10.3, §10.4): the phases
//! and tasks of initialize, install, boot, reboot, reset, shutdown and upgrade, published as
//! Talos publishes them while the simulated node goes through the matching transition; the
//! stage each event moves the machine to; and the Reboot, Reset, Shutdown and (legacy)
//! Upgrade calls that start them, answered with an actor id the sequence's events carry.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ichor_talos::api::common;
use ichor_talos::api::machine::reboot_request::Mode as RebootMode;
use ichor_talos::api::machine::reset_request::WipeMode;
use ichor_talos::api::machine::upgrade_request::RebootMode as UpgradeRebootMode;
use ichor_talos::api::machine::{
    PhaseEvent, RebootRequest, ResetRequest, RestartEvent, SequenceEvent, ShutdownRequest,
    TaskEvent, UpgradeRequest, phase_event, sequence_event, task_event,
};
use tokio::sync::Mutex;

use crate::events::Payload;
use crate::{Node, Stage};

/// `unix.LINUX_REBOOT_CMD_*`, as the reboot and shutdown tasks publish them in a
/// `RestartEvent` (talos-facts §10.4).
const CMD_RESTART: i64 = 0x0123_4567;
const CMD_KEXEC: i64 = 0x4558_4543;
const CMD_POWER_OFF: i64 = 0x4321_fedc;

/// One phase: its name and its tasks' names.
type Phase = (&'static str, &'static [&'static str]);

/// A sequence to publish: its name and phases, and how it ends.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) sequence: &'static str,
    pub(crate) phases: Vec<Phase>,
    pub(crate) end: End,
}

/// How a published sequence ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum End {
    /// The last phase's task (reboot or shutdown) published a `RestartEvent` with this
    /// command; the sequence then reports the reboot "error" as machined does.
    Restart(i64),
    /// The task of phase `phase` (an index into the phases) failed with this error; later
    /// phases do not run.
    Fail { phase: usize, error: String },
}

fn pre_shutdown() -> Vec<Phase> {
    vec![
        ("preShutdown", &["preShutdownServices"]),
        ("dbus", &["stopDBus"]),
    ]
}

/// `stopAllPhaselist` in metal mode, with the kexec phase when `kexec`.
fn stop_all(kexec: bool) -> Vec<Phase> {
    let mut phases: Vec<Phase> = vec![
        ("denyNewServices", &["denyNewServices"]),
        ("stopContainers", &["teardownContainerLifecycle"]),
        ("stopServices", &["stopServicesForUpgrade"]),
        ("umount", &["unmountPodMounts"]),
        ("unmountBind", &["unmountSystemDiskBindMounts"]),
        ("unmountPromotable", &["unmountPromotableSystemPartitions"]),
        ("unmountSystem", &["unmountEphemeralPartition"]),
        ("volumeFinalize", &["teardownLifecycle"]),
        ("stopEverything", &["stopAllServices"]),
    ];
    if kexec {
        phases.push(("kexec", &["kexecPrepare"]));
    }
    phases
}

/// The initialize sequence up to its config phase (metal mode; the phases whose deferred
/// check fails on a simulated node — bootloader cleanup, disk wipe, halt — do not run).
const INITIALIZE: &[Phase] = &[
    ("systemRequirements", &["enforceKSPPRequirements"]),
    (
        "earlyServices",
        &[
            "startMachined",
            "waitForUdevd",
            "startApid",
            "startAuditd",
            "startSyslogd",
            "startContainerd",
        ],
    ),
    ("meta", &["reloadMeta"]),
    ("dashboard", &["startDashboard"]),
];

/// The boot sequence up to (not including) its last phase, `startEverything`.
const BOOT: &[Phase] = &[
    ("memorySizeCheck", &["memorySizeCheck"]),
    ("diskSizeCheck", &["diskSizeCheck"]),
    ("env", &["setUserEnvVars", "waitForCARoots"]),
    ("dbus", &["startDBus"]),
    ("ephemeral", &["mountEphemeralPartition"]),
    ("promotableVolumes", &["mountPromotableSystemPartitions"]),
    ("userDisks", &["mountUserDisks"]),
    ("userSetup", &["writeUserFiles"]),
];

/// The install sequence's phases up to the install itself, and after it (1.13's
/// `machine.install` path; talos-facts §10.3).
const INSTALL_BEFORE: &[Phase] = &[("env", &["setUserEnvVars"])];
const INSTALL_AFTER: &[Phase] = &[
    ("meta", &["reloadMeta"]),
    ("saveMeta", &["flushMeta"]),
    ("denyNewServices", &["denyNewServices"]),
    ("stopContainers", &["teardownContainerLifecycle"]),
    ("volumeFinalize", &["teardownLifecycle"]),
    ("stopEverything", &["stopAllServices"]),
    ("kexec", &["kexecPrepare"]),
    ("reboot", &["reboot"]),
];

impl Plan {
    /// Whether the sequence ends in a kexec (the next boot skips the firmware).
    pub(crate) fn kexecs(&self) -> bool {
        self.end == End::Restart(CMD_KEXEC)
    }

    /// The reboot sequence for a request's mode: FORCE skips straight to the reboot; kexec is
    /// prepared unless the mode is POWERCYCLE or there is no system disk.
    pub(crate) fn reboot(mode: RebootMode, installed: bool) -> Self {
        let mut phases = Vec::new();
        if mode != RebootMode::Force {
            phases.push(("cleanup", &["stopAllPods"][..]));
            phases.extend(pre_shutdown());
            phases.extend(stop_all(true));
        }
        let kexec = mode == RebootMode::Default && installed;
        phases.push(("reboot", &["reboot"]));
        Self {
            sequence: "reboot",
            phases,
            end: End::Restart(if kexec { CMD_KEXEC } else { CMD_RESTART }),
        }
    }

    /// The reset sequence for a request on a node of the given type (metal mode).
    pub(crate) fn reset(request: &ResetRequest, worker: bool, installed: bool) -> Self {
        let targets: Vec<&str> = request
            .system_partitions_to_wipe
            .iter()
            .filter(|p| p.wipe)
            .map(|p| p.label.as_str())
            .collect();
        let kexec = !targets.is_empty() && !targets.contains(&"BOOT");
        let mode = WipeMode::try_from(request.mode).unwrap_or(WipeMode::All);
        let system = mode != WipeMode::UserDisks;
        let user = mode != WipeMode::SystemDisk;
        let mut phases: Vec<Phase> = Vec::new();
        if request.graceful {
            phases.push(("drain", &["cordonAndDrainNode"]));
            phases.push(("cleanup", &["removeAllPods"]));
        } else {
            phases.push(("cleanup", &["stopAllPods"]));
        }
        phases.extend(pre_shutdown());
        if request.graceful && !worker {
            phases.push(("leave", &["leaveEtcd"]));
        }
        phases.push(("preReset", &["sendResetSignal"]));
        phases.extend(stop_all(kexec));
        phases.push(("forceCleanup", &["forceCleanup"]));
        if request.system_partitions_to_wipe.is_empty() && system {
            phases.push(("reset", &["resetSystemDisk"]));
        }
        if !request.system_partitions_to_wipe.is_empty() && system {
            phases.push(("resetSpec", &["resetSystemDiskSpec"]));
        }
        if !request.user_disks_to_wipe.is_empty() && user {
            phases.push(("resetUserDisks", &["resetUserDisks"]));
        }
        let end = if request.reboot {
            phases.push(("reboot", &["reboot"]));
            End::Restart(if kexec && installed {
                CMD_KEXEC
            } else {
                CMD_RESTART
            })
        } else {
            phases.push(("shutdown", &["shutdown"]));
            End::Restart(CMD_POWER_OFF)
        };
        Self {
            sequence: "reset",
            phases,
            end,
        }
    }

    /// The shutdown sequence; `force` skips the drain.
    pub(crate) fn shutdown(request: &ShutdownRequest) -> Self {
        let mut phases: Vec<Phase> = vec![("storeShutdown", &["storeShutdownEmergency"])];
        if !request.force {
            phases.push(("drain", &["cordonAndDrainNode"]));
        }
        phases.push(("cleanup", &["stopAllPods"]));
        phases.extend(pre_shutdown());
        phases.extend(stop_all(false));
        phases.push(("shutdown", &["shutdown"]));
        Self {
            sequence: "shutdown",
            phases,
            end: End::Restart(CMD_POWER_OFF),
        }
    }

    /// The legacy Upgrade's sequence: `upgrade`, or `stageUpgrade` (reboot first, install on
    /// the way up) when staged.
    pub(crate) fn upgrade(request: &UpgradeRequest) -> Self {
        let kexec = UpgradeRebootMode::try_from(request.reboot_mode).unwrap_or_default()
            == UpgradeRebootMode::Default;
        if request.stage {
            let mut phases: Vec<Phase> = vec![("cleanup", &["stopAllPods"])];
            phases.extend(pre_shutdown());
            phases.extend(stop_all(kexec));
            phases.push(("reboot", &["reboot"]));
            return Self {
                sequence: "stageUpgrade",
                phases,
                end: End::Restart(if kexec { CMD_KEXEC } else { CMD_RESTART }),
            };
        }
        let mut phases: Vec<Phase> = vec![
            ("denyNewServices", &["denyNewServices"]),
            ("drain", &["cordonAndDrainNode"]),
            ("cleanup", &["stopAllPods"]),
        ];
        phases.extend(pre_shutdown());
        phases.extend([
            ("stopContainers", &["teardownContainerLifecycle"][..]),
            ("stopServices", &["stopServicesForUpgrade"]),
            ("unmount", &["unmountPodMounts"]),
            ("unmountBind", &["unmountSystemDiskBindMounts"]),
            ("unmountPromotable", &["unmountPromotableSystemPartitions"]),
            ("unmountSystem", &["unmountEphemeralPartition"]),
            ("volumeFinalize", &["teardownLifecycle"]),
            ("upgrade", &["upgrade"]),
            ("meta", &["reloadMeta"]),
        ]);
        if kexec {
            phases.push(("kexec", &["kexecPrepare"]));
        }
        phases.push(("stopEverything", &["stopAllServices"]));
        phases.push(("reboot", &["reboot"]));
        Self {
            sequence: "upgrade",
            phases,
            end: End::Restart(if kexec { CMD_KEXEC } else { CMD_RESTART }),
        }
    }

    /// This plan, failing at the phase named `phase` with `error` (when it has that phase).
    pub(crate) fn failing_at(mut self, phase: &str, error: String) -> Self {
        if let Some(index) = self.phases.iter().position(|(name, _)| *name == phase) {
            self.end = End::Fail {
                phase: index,
                error,
            };
        }
        self
    }
}

/// A Linux-style random UUID (the API's actor ids, and `boot_id`).
pub(crate) fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

impl Node {
    /// Publishes `payload` by `actor` into this boot's log and moves the stage as machined's
    /// machine-status controller does on that event (talos-facts §10.4), then publishes the
    /// machine status if it changed.
    pub(crate) fn emit(&mut self, actor: &str, payload: Payload) {
        match &payload {
            Payload::Sequence(event) => {
                self.current_sequence.clone_from(&event.sequence);
                match sequence_event::Action::try_from(event.action) {
                    Ok(sequence_event::Action::Start) => {
                        if let Some(stage) = match event.sequence.as_str() {
                            "boot" | "initialize" => Some(Stage::Booting),
                            "shutdown" => Some(Stage::ShuttingDown),
                            "upgrade" | "stageUpgrade" | "maintenanceUpgrade" => {
                                Some(Stage::Upgrading)
                            }
                            "reset" => Some(Stage::Resetting),
                            "reboot" => Some(Stage::Rebooting),
                            _ => None,
                        } {
                            self.stage = stage;
                        }
                    }
                    Ok(sequence_event::Action::Noop) => {
                        let fatal = event
                            .error
                            .as_ref()
                            .is_some_and(|e| e.code == common::Code::Fatal as i32);
                        if fatal && event.sequence != "shutdown" {
                            self.stage = Stage::Rebooting;
                        }
                    }
                    Ok(sequence_event::Action::Stop) => {
                        if event.sequence == "boot" && event.error.is_none() {
                            self.stage = Stage::Running;
                        }
                        self.current_sequence.clear();
                    }
                    Err(_) => {}
                }
            }
            Payload::Phase(event) if event.action == phase_event::Action::Start as i32 => {
                let sequence = self.current_sequence.as_str();
                if sequence == "install" && event.phase == "install" {
                    self.stage = Stage::Installing;
                } else if matches!(
                    sequence,
                    "install" | "upgrade" | "stageUpgrade" | "maintenanceUpgrade"
                ) && event.phase == "kexec"
                {
                    self.stage = Stage::Rebooting;
                }
            }
            Payload::Task(event) if event.task == "runningMaintenance" => {
                self.stage = if event.action == task_event::Action::Start as i32 {
                    Stage::Maintenance
                } else {
                    Stage::Booting
                };
            }
            _ => {}
        }
        self.events.publish(actor, payload);
        self.publish_status();
    }

    fn sequence(&mut self, actor: &str, name: &str, action: sequence_event::Action) {
        self.emit(
            actor,
            Payload::Sequence(SequenceEvent {
                sequence: name.into(),
                action: action as i32,
                error: None,
            }),
        );
    }

    fn phase(&mut self, actor: &str, name: &str, action: phase_event::Action) {
        self.emit(
            actor,
            Payload::Phase(PhaseEvent {
                phase: name.into(),
                action: action as i32,
            }),
        );
    }

    fn task(&mut self, actor: &str, name: &str, action: task_event::Action) {
        self.emit(
            actor,
            Payload::Task(TaskEvent {
                task: name.into(),
                action: action as i32,
            }),
        );
    }

    /// One whole phase: start, each task started and stopped, stop.
    fn whole_phase(&mut self, actor: &str, (name, tasks): Phase) {
        self.phase(actor, name, phase_event::Action::Start);
        for task in tasks {
            self.task(actor, task, task_event::Action::Start);
            self.task(actor, task, task_event::Action::Stop);
        }
        self.phase(actor, name, phase_event::Action::Stop);
    }

    /// Publishes a whole sequence as machined runs it: START, the phases (a task ending in a
    /// reboot publishes its `RestartEvent`), STOP, and for a sequence that ended in a reboot
    /// or a failed task the NOOP event carrying the error (talos-facts §10.3).
    pub(crate) fn run_plan(&mut self, actor: &str, plan: &Plan) {
        self.sequence(actor, plan.sequence, sequence_event::Action::Start);
        let last = plan.phases.len().saturating_sub(1);
        let mut failure = None;
        for (index, &(name, tasks)) in plan.phases.iter().enumerate() {
            self.phase(actor, name, phase_event::Action::Start);
            for task in tasks {
                self.task(actor, task, task_event::Action::Start);
                if let (End::Restart(cmd), true) = (&plan.end, index == last) {
                    self.emit(actor, Payload::Restart(RestartEvent { cmd: *cmd }));
                    failure = Some((index, format!("unix.Reboot({cmd:x})")));
                }
                self.task(actor, task, task_event::Action::Stop);
            }
            self.phase(actor, name, phase_event::Action::Stop);
            if let End::Fail { phase, error } = &plan.end
                && *phase == index
            {
                failure = Some((index, error.clone()));
                break;
            }
        }
        self.sequence(actor, plan.sequence, sequence_event::Action::Stop);
        if let Some((index, error)) = failure {
            self.emit(
                actor,
                Payload::Sequence(SequenceEvent {
                    sequence: plan.sequence.into(),
                    action: sequence_event::Action::Noop as i32,
                    error: Some(common::Error {
                        code: common::Code::Fatal as i32,
                        message: format!(
                            "sequence failed: error running phase {} in {} sequence: task 1/1: failed, {error}",
                            index + 1,
                            plan.sequence
                        ),
                        details: Vec::new(),
                    }),
                }),
            );
        }
    }

    /// A powered-on machine starts: machined's initialize sequence up to loading the config
    /// (the early services start on the way). Without a config the node then waits in
    /// maintenance (`runningMaintenance`); with one, it loads it and goes on.
    pub(crate) fn initialize(&mut self, configured: bool) {
        self.sequence("", "initialize", sequence_event::Action::Start);
        for &phase in INITIALIZE {
            self.whole_phase("", phase);
            match phase.0 {
                "earlyServices" => {
                    for id in [
                        "machined",
                        "udevd",
                        "containerd",
                        "apid",
                        "auditd",
                        "syslogd",
                    ] {
                        self.start_service(id);
                    }
                }
                "dashboard" => self.start_service("dashboard"),
                _ => {}
            }
        }
        self.phase("", "config", phase_event::Action::Start);
        self.task("", "loadConfig", task_event::Action::Start);
        if configured {
            self.config_loaded(false);
        } else {
            self.task("", "runningMaintenance", task_event::Action::Start);
        }
    }

    /// The config is there (loaded at boot, or applied in maintenance): initialize ends and
    /// the install sequence starts (talos-facts §10.3).
    pub(crate) fn config_loaded(&mut self, from_maintenance: bool) {
        if from_maintenance {
            self.task("", "runningMaintenance", task_event::Action::Stop);
        }
        self.task("", "loadConfig", task_event::Action::Stop);
        self.phase("", "config", phase_event::Action::Stop);
        self.sequence("", "initialize", sequence_event::Action::Stop);
        self.sequence("", "install", sequence_event::Action::Start);
    }

    /// The install sequence has nothing to do (installed already, or no install section, or
    /// 1.14's unattended install, which is not a sequence).
    pub(crate) fn install_skipped(&mut self) {
        self.sequence("", "install", sequence_event::Action::Stop);
    }

    /// 1.13's install sequence reaches the install itself.
    pub(crate) fn install_started(&mut self) {
        for &phase in INSTALL_BEFORE {
            self.whole_phase("", phase);
        }
        self.phase("", "install", phase_event::Action::Start);
        self.task("", "install", task_event::Action::Start);
    }

    /// 1.13's install finished: the rest of the sequence, ending in the reboot.
    pub(crate) fn install_finished(&mut self) {
        self.task("", "install", task_event::Action::Stop);
        self.phase("", "install", phase_event::Action::Stop);
        let rest = Plan {
            sequence: "install",
            phases: INSTALL_AFTER.to_vec(),
            end: End::Restart(CMD_KEXEC),
        };
        // The sequence already started: publish its remaining phases and its end.
        let last = rest.phases.len() - 1;
        for (index, &phase) in rest.phases.iter().enumerate() {
            if index == last {
                let (name, tasks) = phase;
                self.phase("", name, phase_event::Action::Start);
                self.task("", tasks[0], task_event::Action::Start);
                self.emit("", Payload::Restart(RestartEvent { cmd: CMD_KEXEC }));
                self.task("", tasks[0], task_event::Action::Stop);
                self.phase("", name, phase_event::Action::Stop);
            } else {
                self.whole_phase("", phase);
            }
        }
        self.sequence("", "install", sequence_event::Action::Stop);
        self.emit(
            "",
            Payload::Sequence(SequenceEvent {
                sequence: "install".into(),
                action: sequence_event::Action::Noop as i32,
                error: Some(common::Error {
                    code: common::Code::Fatal as i32,
                    message: format!(
                        "sequence failed: error running phase {} in install sequence: task 1/1: failed, unix.Reboot({CMD_KEXEC:x})",
                        INSTALL_BEFORE.len() + 1 + INSTALL_AFTER.len()
                    ),
                    details: Vec::new(),
                }),
            }),
        );
    }

    /// 1.13's install task failed with `reason`: the task, the phase and the sequence stop,
    /// and the sequence's NOOP event carries the FATAL error (which moves the stage to
    /// rebooting). Returns that error's message (`v1alpha1_controller.go` `Controller.Run`:
    /// "sequence failed: " and `run`'s "error running phase N in install sequence", wrapping
    /// `runPhase`'s "task 1/1: failed, ").
    pub(crate) fn install_task_failed(&mut self, reason: &str) -> String {
        self.task("", "install", task_event::Action::Stop);
        self.phase("", "install", phase_event::Action::Stop);
        self.sequence("", "install", sequence_event::Action::Stop);
        let message = format!(
            "sequence failed: error running phase {} in install sequence: task 1/1: failed, {reason}",
            INSTALL_BEFORE.len() + 1
        );
        self.emit(
            "",
            Payload::Sequence(SequenceEvent {
                sequence: "install".into(),
                action: sequence_event::Action::Noop as i32,
                error: Some(common::Error {
                    code: common::Code::Fatal as i32,
                    message: message.clone(),
                    details: Vec::new(),
                }),
            }),
        );
        message
    }

    /// The boot sequence runs up to starting every service, which it then waits for.
    pub(crate) fn boot_started(&mut self) {
        self.sequence("", "boot", sequence_event::Action::Start);
        for &phase in BOOT {
            self.whole_phase("", phase);
        }
        self.phase("", "startEverything", phase_event::Action::Start);
        self.task("", "startAllServices", task_event::Action::Start);
        self.start_configured_services();
    }

    /// Every service is up: the boot sequence ends and the machine is running.
    pub(crate) fn boot_finished(&mut self) {
        self.task("", "startAllServices", task_event::Action::Stop);
        self.phase("", "startEverything", phase_event::Action::Stop);
        self.sequence("", "boot", sequence_event::Action::Stop);
    }

    /// The config applied in maintenance mode takes over without a reboot: the API comes
    /// back with mutual TLS, and this boot (its events, boot id, services) goes on.
    pub(crate) async fn continue_configured(
        &mut self,
        this: Weak<Mutex<Node>>,
    ) -> Result<(), crate::SimError> {
        self.shut_down().await;
        self.fresh = false;
        self.events.reopen();
        self.boot(this).await
    }

    /// Runs `plan` by `actor` now, then goes down: reboots after the reboot time, or, for a
    /// sequence ending in a power-off, stays off until powered on from outside.
    pub(crate) async fn go_down(&mut self, this: Weak<Mutex<Node>>, actor: &str, plan: &Plan) {
        self.run_plan(actor, plan);
        self.shut_down().await;
        self.kexec = plan.kexecs();
        if plan.end == End::Restart(CMD_POWER_OFF) {
            self.powered = false;
            return;
        }
        boot_after(this, self.timings.reboot);
    }
}

/// Powers the node on again after `delay` (the down time of a reboot).
pub(crate) fn boot_after(this: Weak<Mutex<Node>>, delay: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let Some(strong) = this.upgrade() else { return };
        let mut node = strong.lock().await;
        if let Err(error) = node.boot(this.clone()).await {
            tracing::warn!(%error, "simulated node failed to boot");
        }
    });
}

/// The node, once the time a sequence takes to start has passed.
async fn after_start(node: &Weak<Mutex<Node>>) -> Option<std::sync::Arc<Mutex<Node>>> {
    let delay = node.upgrade()?.lock().await.timings.sequence;
    tokio::time::sleep(delay).await;
    node.upgrade()
}

/// The Reboot call (talos-facts §10.4): the reboot sequence by a new actor, in the
/// background; the caller gets the actor id at once.
pub(crate) fn reboot(node: Weak<Mutex<Node>>, request: &RebootRequest) -> String {
    let actor = uuid();
    let mode = RebootMode::try_from(request.mode).unwrap_or_default();
    let by = actor.clone();
    tokio::spawn(async move {
        let Some(strong) = after_start(&node).await else {
            return;
        };
        let mut guard = strong.lock().await;
        let plan = Plan::reboot(mode, guard.installed);
        guard.go_down(node.clone(), &by, &plan).await;
    });
    actor
}

/// The Shutdown call: the shutdown sequence, then the machine is off.
pub(crate) fn shutdown(node: Weak<Mutex<Node>>, request: &ShutdownRequest) -> String {
    let actor = uuid();
    let plan = Plan::shutdown(request);
    let by = actor.clone();
    tokio::spawn(async move {
        let Some(strong) = after_start(&node).await else {
            return;
        };
        strong.lock().await.go_down(node.clone(), &by, &plan).await;
    });
    actor
}

/// The ACPI power button (talos-facts §15.3): machined runs the shutdown sequence as for
/// `Shutdown{force: true}`, with no actor, and the machine powers off.
pub(crate) fn power_button(node: Weak<Mutex<Node>>) {
    let plan = Plan::shutdown(&ShutdownRequest { force: true });
    tokio::spawn(async move {
        let Some(strong) = after_start(&node).await else {
            return;
        };
        strong.lock().await.go_down(node.clone(), "", &plan).await;
    });
}

/// What a reset wipes, decided from its request (talos-facts §1.2, §8.4): the user disks it
/// names, and the named system partitions (STATE holds the config, EPHEMERAL the etcd data),
/// or with an empty list every partition, so a disk-booted node has nothing left to boot.
fn wipe(node: &mut Node, request: &ResetRequest) {
    let labels: Vec<&str> = request
        .system_partitions_to_wipe
        .iter()
        .filter(|p| p.wipe)
        .map(|p| p.label.as_str())
        .collect();
    let system = WipeMode::try_from(request.mode).unwrap_or(WipeMode::All) != WipeMode::UserDisks;
    // The user disks go first (the handler refused them with SYSTEM_DISK): what user volumes
    // wrote there is gone.
    for device in &request.user_disks_to_wipe {
        crate::volumes::wipe(node, device.trim_start_matches("/dev/"));
    }
    if system && request.system_partitions_to_wipe.is_empty() {
        node.bricked = true;
        return;
    }
    if system && labels.contains(&"STATE") {
        node.persisted = None;
        node.staged = None;
    }
    if system && labels.contains(&"EPHEMERAL") {
        node.etcd = None;
        node.etcd_dir_written = false;
        // An uploaded recovery snapshot lives in /var/lib, on EPHEMERAL (talos-facts §12.2).
        node.etcd_recovery = None;
        node.images.clear();
    }
}

/// The Reset call (talos-facts §10.4, §10.5): the reset sequence by a new actor, in the
/// background. A graceful reset of a control plane leaves etcd in its `leave` phase; when that
/// fails the sequence fails there, nothing is wiped, and the node reboots as after any fatal
/// sequence error. Otherwise the partitions are wiped and the node reboots or powers off.
pub(crate) fn reset(node: Weak<Mutex<Node>>, request: ResetRequest, leave: LeaveFn) -> String {
    let actor = uuid();
    let by = actor.clone();
    tokio::spawn(async move {
        let Some(strong) = after_start(&node).await else {
            return;
        };
        let mut guard = strong.lock().await;
        let worker = guard
            .running
            .as_ref()
            .is_some_and(|c| !c.is_control_plane());
        let plan = Plan::reset(&request, worker, guard.installed);
        if request.graceful
            && !worker
            && let Err(error) = leave(&mut guard)
        {
            let failed = plan.failing_at("leave", format!("failed to leave cluster: {error}"));
            guard.run_plan(&by, &failed);
            guard.shut_down().await;
            boot_after(node.clone(), guard.timings.reboot);
            return;
        }
        guard.run_plan(&by, &plan);
        guard.shut_down().await;
        guard.kexec = plan.kexecs();
        wipe(&mut guard, &request);
        if request.reboot {
            boot_after(node.clone(), guard.timings.reboot);
        } else {
            guard.powered = false;
        }
    });
    actor
}

/// The Reset handler's own checks of a request, before any sequence runs (talos-facts §10.4):
/// plain errors (code Unknown), as machined returns them.
pub(crate) fn check_reset(node: &Node, request: &ResetRequest) -> Result<(), tonic::Status> {
    let mode = WipeMode::try_from(request.mode).unwrap_or(WipeMode::All);
    if !request.user_disks_to_wipe.is_empty() {
        if mode == WipeMode::SystemDisk {
            return Err(tonic::Status::unknown(
                "reset failed: invalid input, wipe mode SYSTEM_DISK doesn't support UserDisksToWipe parameter",
            ));
        }
        let system = node
            .installed
            .then(|| node.hardware.install_disk())
            .flatten();
        for device in &request.user_disks_to_wipe {
            let found = node
                .hardware
                .disks
                .iter()
                .find(|d| format!("/dev/{}", d.name) == *device);
            match found {
                None => {
                    return Err(tonic::Status::unknown(format!(
                        "reset user disk failed: device {device} wasn't found"
                    )));
                }
                Some(disk) if system.is_some_and(|s| s.name == disk.name) => {
                    return Err(tonic::Status::unknown(format!(
                        "reset user disk failed: device {device} is the system disk"
                    )));
                }
                Some(_) => {}
            }
        }
    }
    if !request.system_partitions_to_wipe.is_empty() && mode == WipeMode::UserDisks {
        return Err(tonic::Status::unknown(
            "reset failed: invalid input, wipe mode USER_DISKS doesn't support SystemPartitionsToWipe parameter",
        ));
    }
    Ok(())
}

/// How a reset leaves etcd (the node's own leave, with its faults): the error's text.
pub(crate) type LeaveFn = Box<dyn FnOnce(&mut Node) -> Result<(), String> + Send>;

/// The legacy Upgrade: the upgrade sequence by a new actor; the node boots into the image's
/// version unless the rollback fault holds it on the old one.
pub(crate) fn upgrade(node: Weak<Mutex<Node>>, request: &UpgradeRequest) -> String {
    let actor = uuid();
    let plan = Plan::upgrade(request);
    let target = crate::configured::image_version(&request.image);
    let image = request.image.clone();
    let by = actor.clone();
    tokio::spawn(async move {
        let Some(strong) = after_start(&node).await else {
            return;
        };
        let mut guard = strong.lock().await;
        guard.pending_version = target;
        guard.pending_installer = Some(image);
        guard.go_down(node.clone(), &by, &plan).await;
    });
    actor
}

/// Applies an installed-but-not-booted version at boot (unless the rollback fault holds the
/// node on the old one).
pub(crate) fn take_pending_version(node: &mut Node) {
    let installer = node.pending_installer.take();
    if let Some(version) = node.pending_version.take()
        && !node.shared.upgrade_rollback.load(Ordering::SeqCst)
    {
        node.talos_version.clone_from(&version);
        node.shared.set_talos_version(&version);
        // The extensions are the new installer's (talos-facts §9.5).
        if let Some(image) = installer.filter(|i| !i.is_empty()) {
            node.installer = Some(image);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(plan: &Plan) -> Vec<&str> {
        plan.phases.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn a_default_reboot_stops_everything_and_kexecs() {
        let plan = Plan::reboot(RebootMode::Default, true);
        assert_eq!(
            names(&plan),
            [
                "cleanup",
                "preShutdown",
                "dbus",
                "denyNewServices",
                "stopContainers",
                "stopServices",
                "umount",
                "unmountBind",
                "unmountPromotable",
                "unmountSystem",
                "volumeFinalize",
                "stopEverything",
                "kexec",
                "reboot"
            ]
        );
        assert_eq!(plan.end, End::Restart(CMD_KEXEC));
        assert_eq!(
            names(&Plan::reboot(RebootMode::Force, true)),
            ["reboot"],
            "FORCE skips straight to the reboot"
        );
        assert_eq!(
            Plan::reboot(RebootMode::Powercycle, true).end,
            End::Restart(CMD_RESTART)
        );
    }

    #[test]
    fn reset_phases_follow_the_request() {
        let graceful = ResetRequest {
            graceful: true,
            reboot: false,
            ..Default::default()
        };
        let plan = Plan::reset(&graceful, false, true);
        let phases = names(&plan);
        assert_eq!(
            &phases[..5],
            ["drain", "cleanup", "preShutdown", "dbus", "leave"]
        );
        assert!(
            phases.contains(&"reset"),
            "an empty list wipes the whole disk"
        );
        assert_eq!(phases.last(), Some(&"shutdown"));
        assert_eq!(plan.end, End::Restart(CMD_POWER_OFF));
        assert!(
            !names(&Plan::reset(&graceful, true, true)).contains(&"leave"),
            "workers have no etcd to leave"
        );
        let labels = ResetRequest {
            graceful: false,
            reboot: true,
            system_partitions_to_wipe: ["STATE", "EPHEMERAL"]
                .map(|l| ichor_talos::api::machine::ResetPartitionSpec {
                    label: l.into(),
                    wipe: true,
                })
                .to_vec(),
            ..Default::default()
        };
        let plan = Plan::reset(&labels, false, true);
        let phases = names(&plan);
        assert_eq!(phases[0], "cleanup");
        assert!(phases.contains(&"kexec") && phases.contains(&"resetSpec"));
        assert_eq!(phases.last(), Some(&"reboot"));
        assert_eq!(plan.end, End::Restart(CMD_KEXEC));
    }
}
