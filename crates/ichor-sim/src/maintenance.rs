//! The MachineService of a node in maintenance mode (talos-facts §1.2, §2, §5), and what an
//! apply there sets off: persisting the config, installing, rebooting.

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use ichor_talos::api::common::Data;
use ichor_talos::api::machine::machine_service_server::MachineService;
use ichor_talos::api::machine::{
    ApplyConfigurationRequest, ApplyConfigurationResponse, BootstrapRequest, BootstrapResponse,
    EtcdDefragmentResponse, EtcdForfeitLeadershipRequest, EtcdForfeitLeadershipResponse,
    EtcdLeaveClusterRequest, EtcdLeaveClusterResponse, EtcdMemberListRequest,
    EtcdMemberListResponse, EtcdRemoveMemberByIdRequest, EtcdRemoveMemberByIdResponse,
    EtcdSnapshotRequest, EtcdStatusResponse, EventsRequest, Hostname, HostnameResponse,
    ReadRequest, RebootRequest, RebootResponse, ResetRequest, ResetResponse, ServiceListResponse,
    ShutdownRequest, ShutdownResponse, UpgradeRequest, UpgradeResponse, VersionResponse,
};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::apply::{self, InstallPlan, handler};
use crate::config::AppliedConfig;
use crate::network::Shared;
use crate::{InstallPhase, Node, Stage, configured};

/// Maintenance mode: every caller is `os:reader` (talos-facts §2 "Roles").
pub(crate) struct Maintenance {
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: Weak<Mutex<Node>>,
}

/// Methods above `os:reader` are refused: maintenance mode grants only reader (talos-facts §2;
/// the minimum roles are in §1.2).
fn needs_role(role: &str) -> Status {
    Status::permission_denied(format!(
        "not authorized: this method needs {role}, and maintenance mode grants every caller os:reader"
    ))
}

/// Etcd and bootstrap work only on control planes; before a config sets the machine type they
/// answer "machine type is not set" (talos-facts §1.2).
fn machine_type_not_set() -> Status {
    Status::unimplemented("machine type is not set")
}

type Reply<T> = Result<Response<T>, Status>;

/// After an apply in maintenance: the config is persisted and booting continues (talos-facts
/// §5), installing as the plan says (§11.7):
/// - no install section, or already installed: boots with the config in place;
/// - the install sequence (`machine.install`): the install stage, then a reboot into the
///   installed system; when the disk does not resolve, the install task fails, the sequence
///   fails fatally, the node reboots after its countdown and, having no STATE partition to
///   keep the config in, comes back in maintenance mode (a new certificate);
/// - the unattended install (1.14): its phases, then a reboot as `reboot` says; when no disk
///   matches the selector, the install stays pending and the node boots with the config,
///   waiting (stage booting, no etcd, Bootstrap not available yet).
async fn continue_boot(node: Weak<Mutex<Node>>, config: Arc<AppliedConfig>, plan: InstallPlan) {
    let Some(strong) = node.upgrade() else { return };
    let mut guard = strong.lock().await;
    guard.persisted = Some(Arc::clone(&config));
    guard.install_failure = None;
    // The apply stays in progress until the node has booted with the config (talos-facts §5:
    // a concurrent apply gets FailedPrecondition); `boot` clears it.
    // The config is loaded: initialize ends, the install sequence starts (talos-facts §10.3).
    guard.config_loaded(true);
    let (unattended, image, reboot) = match plan {
        InstallPlan::None => {
            guard.install_skipped();
            return boot_in_place(guard, node).await;
        }
        _ if guard.installed => {
            guard.install_skipped();
            return boot_in_place(guard, node).await;
        }
        InstallPlan::Unattended {
            disk: None, image, ..
        } => {
            guard.install_skipped();
            guard.unattended = Some((image, InstallPhase::Pending));
            // Nothing installed: the config lives in memory only.
            guard.config_in_memory = true;
            return boot_in_place(guard, node).await;
        }
        InstallPlan::Sequence {
            disk: Err(reason), ..
        } => {
            guard.install_started();
            let down = guard.timings.reboot;
            drop(guard);
            tokio::time::sleep(down).await;
            let guard = strong.lock().await;
            guard.shared.installs_run.fetch_add(1, Ordering::SeqCst);
            return install_sequence_failed(guard, node, reason).await;
        }
        InstallPlan::Sequence { disk: Ok(_), image } => {
            guard.install_started();
            (false, image, true)
        }
        InstallPlan::Unattended {
            disk: Some(_),
            image,
            reboot,
        } => {
            guard.install_skipped();
            (true, image, reboot)
        }
    };
    if unattended {
        guard.unattended = Some((image.clone(), InstallPhase::Installing));
    } else {
        guard.installing = true;
    }
    // Until the install completes the config lives in memory only (no STATE partition yet).
    guard.config_in_memory = true;
    // The config is complete: the maintenance service is gone and apid serves the configured
    // mutual-TLS API while the installer runs (1.13 stage `installing`, 1.14 `booting`;
    // `crates/ichor-sim/docs/install-failures.md`).
    boot_in_place_held(&mut guard, node.clone()).await;
    let boot = guard.boot_id.clone();
    let install = guard.timings.install;
    drop(guard);
    tokio::time::sleep(install).await;
    let mut guard = strong.lock().await;
    // A power cycle meanwhile ended the install and took the in-memory config with it.
    if guard.boot_id != boot || !guard.install_pending() {
        return;
    }
    guard.shared.installs_run.fetch_add(1, Ordering::SeqCst);
    if guard.shared.install_hangs.load(Ordering::SeqCst) {
        // The installer never returns: the install stays in progress, the config in memory.
        return;
    }
    if let Some(error) = guard.installer_failure(&image) {
        if unattended {
            return unattended_failed(guard, node, image, error);
        }
        guard.installing = false;
        return install_sequence_failed(guard, node, error).await;
    }
    guard.installed = true;
    guard.record_installer(&image);
    guard.installing = false;
    guard.config_in_memory = false;
    if unattended {
        let phase = if reboot {
            InstallPhase::WaitingForReboot
        } else {
            InstallPhase::Installed
        };
        guard.unattended = Some((image, phase));
    }
    if !unattended && reboot {
        // The legacy install sequence ends in its own reboot.
        guard.install_finished();
        guard.restart(node).await;
    } else if reboot {
        drop(guard);
        Node::reboot_later(node, std::time::Duration::ZERO);
    } else {
        guard.boot_on(node);
    }
}

/// Moves from maintenance to the configured API without a reboot, the boot held by the install.
async fn boot_in_place_held(guard: &mut Node, node: Weak<Mutex<Node>>) {
    if let Err(error) = guard.continue_configured(node).await {
        tracing::warn!(%error, "simulated node failed to serve its config while installing");
    }
}

/// The install task failed (1.13's install sequence, and 1.14's with `machine.install`): the
/// task, phase and sequence stop, the sequence's NOOP event carries the FATAL error and moves
/// the stage to rebooting (`v1alpha1_controller.go` `Controller.run`/`Run`, `machine_status.go`);
/// machined then stops its services and reboots by itself after its countdown, without a reboot
/// sequence (`main.go` `runEntrypoint`, `handle`). Having no STATE partition to keep the
/// config in, the node comes back in maintenance mode (a new certificate).
async fn install_sequence_failed(
    mut guard: tokio::sync::MutexGuard<'_, Node>,
    node: Weak<Mutex<Node>>,
    reason: String,
) {
    let message = guard.install_task_failed(&reason);
    guard.install_failure = Some(message);
    // The config lived in memory only: an uninstalled machine has no STATE partition.
    guard.persisted = None;
    guard.config_in_memory = false;
    let countdown = guard.timings.reboot;
    drop(guard);
    tokio::time::sleep(countdown).await;
    let Some(strong) = node.upgrade() else { return };
    let mut guard = strong.lock().await;
    if guard.stage == Stage::Rebooting {
        guard.restart(node.clone()).await;
    }
}

/// 1.14's unattended installer failed (`UnattendedInstallController.reconcile`): phase
/// `failed` with the installer's error; the node stays up with the config (mutual TLS, services
/// waiting for phase `installed`), and the controller, restarted after its backoff, tries again.
fn unattended_failed(
    mut guard: tokio::sync::MutexGuard<'_, Node>,
    node: Weak<Mutex<Node>>,
    image: String,
    error: String,
) {
    guard.install_failure = Some(error);
    guard.unattended = Some((image, InstallPhase::Failed));
    guard.config_in_memory = true;
    let boot = guard.boot_id.clone();
    retry_unattended(node, boot);
}

/// The unattended-install controller after a failed install: the controller runtime restarts
/// it after a backoff (cosi-project/runtime `rruntime/run.go` `Adapter.Run`: exponential from
/// 0.5 s up to 60 s; here [`crate::Timings::install`]), and it installs again with the config
/// it then finds (phase `installing`, the error cleared): failing again while the fault holds,
/// otherwise installed, then a reboot or booting on as `reboot` says.
/// The task ends once the phase is no longer `failed`, or with the boot `boot` (a power-on
/// drops the in-memory config and the status with it).
fn retry_unattended(this: Weak<Mutex<Node>>, boot: String) {
    tokio::spawn(async move {
        loop {
            let Some(strong) = this.upgrade() else { return };
            let install = strong.lock().await.timings.install;
            drop(strong);
            tokio::time::sleep(install).await;
            let Some(strong) = this.upgrade() else { return };
            let mut guard = strong.lock().await;
            if guard.boot_id != boot || !matches!(guard.unattended, Some((_, InstallPhase::Failed)))
            {
                return;
            }
            let Some((disk, image, reboot)) = unattended_plan(&guard) else {
                return;
            };
            if !disk {
                // The new config's selector matches no disk: pending, waiting for one.
                guard.install_failure = None;
                guard.unattended = Some((image, InstallPhase::Pending));
                return;
            }
            guard.unattended = Some((image.clone(), InstallPhase::Installing));
            drop(guard);
            tokio::time::sleep(install).await;
            let mut guard = strong.lock().await;
            // A power cycle meanwhile took the config, and the attempt, with it.
            if guard.boot_id != boot
                || !matches!(guard.unattended, Some((_, InstallPhase::Installing)))
            {
                return;
            }
            guard.shared.installs_run.fetch_add(1, Ordering::SeqCst);
            if guard.shared.install_hangs.load(Ordering::SeqCst) {
                return;
            }
            if let Some(error) = guard.installer_failure(&image) {
                guard.install_failure = Some(error);
                guard.unattended = Some((image, InstallPhase::Failed));
                continue;
            }
            guard.install_failure = None;
            guard.installed = true;
            guard.record_installer(&image);
            guard.config_in_memory = false;
            let phase = if reboot {
                InstallPhase::WaitingForReboot
            } else {
                InstallPhase::Installed
            };
            guard.unattended = Some((image, phase));
            drop(guard);
            if reboot {
                Node::reboot_later(this, std::time::Duration::ZERO);
            } else if let Some(strong) = this.upgrade() {
                strong.lock().await.boot_on(this.clone());
            }
            return;
        }
    });
}

/// The unattended install the running config asks for: whether a disk matches, the image and
/// whether a reboot follows.
fn unattended_plan(node: &Node) -> Option<(bool, String, bool)> {
    let running = node.running.clone()?;
    let rt = handler::runtime(node, false);
    let container = apply::load(&rt, &running.yaml).ok()?;
    match apply::install_plan(&rt, &container) {
        InstallPlan::Unattended {
            disk,
            image,
            reboot,
        } => Some((disk.is_some(), image, reboot)),
        _ => None,
    }
}

/// Boots again with what is on disk, without a reboot (the boot sequence goes on).
async fn boot_in_place(mut guard: tokio::sync::MutexGuard<'_, Node>, node: Weak<Mutex<Node>>) {
    if let Err(error) = guard.continue_configured(node).await {
        tracing::warn!(%error, "simulated node failed to boot with its config");
    }
}

/// A pending unattended install looks again after a config change (the controller reacts to
/// config changes, talos-facts §11.7): when the new selector matches a disk, it installs, then
/// reboots or boots on as `reboot` says.
pub(crate) fn resume_unattended(node: &mut Node, this: Weak<Mutex<Node>>) {
    // A failed install is retried by its own loop (`retry_unattended`), with the config it
    // then finds.
    if !matches!(node.unattended, Some((_, InstallPhase::Pending))) {
        return;
    }
    let Some(running) = node.running.clone() else {
        return;
    };
    let rt = handler::runtime(node, false);
    let Ok(container) = apply::load(&rt, &running.yaml) else {
        return;
    };
    let InstallPlan::Unattended {
        disk: Some(_),
        image,
        reboot,
    } = apply::install_plan(&rt, &container)
    else {
        return;
    };
    node.unattended = Some((image.clone(), InstallPhase::Installing));
    let install = node.timings.install;
    let boot = node.boot_id.clone();
    tokio::spawn(async move {
        tokio::time::sleep(install).await;
        let Some(strong) = this.upgrade() else { return };
        let mut guard = strong.lock().await;
        // A power cycle meanwhile took the config, and the attempt, with it.
        if guard.boot_id != boot || !matches!(guard.unattended, Some((_, InstallPhase::Installing)))
        {
            return;
        }
        guard.shared.installs_run.fetch_add(1, Ordering::SeqCst);
        if guard.shared.install_hangs.load(Ordering::SeqCst) {
            guard.config_in_memory = true;
            return;
        }
        if let Some(error) = guard.installer_failure(&image) {
            guard.install_failure = Some(error);
            guard.unattended = Some((image, InstallPhase::Failed));
            guard.config_in_memory = true;
            let boot = guard.boot_id.clone();
            drop(guard);
            retry_unattended(this, boot);
            return;
        }
        guard.installed = true;
        guard.record_installer(&image);
        let phase = if reboot {
            InstallPhase::WaitingForReboot
        } else {
            InstallPhase::Installed
        };
        guard.unattended = Some((image, phase));
        guard.config_in_memory = false;
        if reboot {
            drop(guard);
            Node::reboot_later(this, std::time::Duration::ZERO);
        } else {
            guard.boot_on(this);
        }
    });
}

#[tonic::async_trait]
impl MachineService for Maintenance {
    /// Accepted from `os:reader` in maintenance only (talos-facts §1.2), checked as machined
    /// checks it (§11.1, §11.4): a refusal is `InvalidArgument` with Talos's message and
    /// changes nothing. `REBOOT` and `AUTO` resolve to `NO_REBOOT`; a dry run answers Talos's
    /// summary; otherwise the node moves on: installs as the plan says, then boots configured.
    async fn apply_configuration(
        &self,
        request: Request<ApplyConfigurationRequest>,
    ) -> Reply<ApplyConfigurationResponse> {
        let request = request.into_inner();
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let mut guard = strong.lock().await;
        if guard.applying {
            return Err(Status::failed_precondition(
                "another apply configuration is already in progress",
            ));
        }
        let text = handler::text(request.data)?;
        let rt = handler::runtime(&guard, true);
        let container = apply::load(&rt, &text).map_err(Status::invalid_argument)?;
        let warnings = apply::validate(&rt, &container).map_err(Status::invalid_argument)?;
        let (mode, details) = handler::maintenance_mode(request.mode)?;
        if request.dry_run {
            return Ok(Response::new(handler::dry_run(
                mode, details, None, &container,
            )));
        }
        // Without a v1alpha1 document the config is not complete for boot: the node stays in
        // maintenance (talos-facts §11.1).
        if container.v1alpha1.is_some() {
            let config = AppliedConfig::parse(&text).map_err(|e| {
                crate::not_simulated(&format!("running this accepted config ({e})"))
            })?;
            let plan = apply::install_plan(&rt, &container);
            guard.applying = true;
            self.shared.config_applies.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(continue_boot(self.node.clone(), Arc::new(config), plan));
        }
        Ok(Response::new(handler::reply(mode, details, warnings)))
    }

    async fn bootstrap(&self, _: Request<BootstrapRequest>) -> Reply<BootstrapResponse> {
        Err(needs_role("os:admin"))
    }

    async fn etcd_member_list(
        &self,
        _: Request<EtcdMemberListRequest>,
    ) -> Reply<EtcdMemberListResponse> {
        Err(machine_type_not_set())
    }

    async fn etcd_remove_member_by_id(
        &self,
        _: Request<EtcdRemoveMemberByIdRequest>,
    ) -> Reply<EtcdRemoveMemberByIdResponse> {
        Err(needs_role("os:admin"))
    }

    async fn etcd_leave_cluster(
        &self,
        _: Request<EtcdLeaveClusterRequest>,
    ) -> Reply<EtcdLeaveClusterResponse> {
        Err(needs_role("os:admin"))
    }

    async fn etcd_forfeit_leadership(
        &self,
        _: Request<EtcdForfeitLeadershipRequest>,
    ) -> Reply<EtcdForfeitLeadershipResponse> {
        Err(needs_role("os:admin"))
    }

    async fn etcd_status(&self, _: Request<()>) -> Reply<EtcdStatusResponse> {
        Err(machine_type_not_set())
    }

    type EtcdSnapshotStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<Data, Status>> + Send>>;

    async fn etcd_snapshot(
        &self,
        _: Request<EtcdSnapshotRequest>,
    ) -> Reply<Self::EtcdSnapshotStream> {
        Err(needs_role("os:etcd:backup"))
    }

    async fn etcd_recover(
        &self,
        _: Request<tonic::Streaming<Data>>,
    ) -> Reply<ichor_talos::api::machine::EtcdRecoverResponse> {
        Err(needs_role("os:admin"))
    }

    async fn etcd_defragment(&self, _: Request<()>) -> Reply<EtcdDefragmentResponse> {
        Err(needs_role("os:admin"))
    }

    async fn reset(&self, _: Request<ResetRequest>) -> Reply<ResetResponse> {
        Err(needs_role("os:admin"))
    }

    async fn reboot(&self, _: Request<RebootRequest>) -> Reply<RebootResponse> {
        Err(needs_role("os:operator"))
    }

    async fn upgrade(&self, _: Request<UpgradeRequest>) -> Reply<UpgradeResponse> {
        Err(needs_role("os:admin"))
    }

    async fn shutdown(&self, _: Request<ShutdownRequest>) -> Reply<ShutdownResponse> {
        Err(needs_role("os:operator"))
    }

    type EventsStream = crate::events::EventStream;

    async fn events(&self, r: Request<EventsRequest>) -> Reply<Self::EventsStream> {
        Ok(Response::new(crate::machined::events(
            &self.shared,
            r.get_ref(),
        )))
    }

    type ReadStream = crate::machined::ReadStream;

    async fn read(&self, r: Request<ReadRequest>) -> Reply<Self::ReadStream> {
        Ok(Response::new(crate::machined::read(
            &self.shared,
            r.get_ref(),
        )?))
    }

    async fn version(&self, _: Request<()>) -> Reply<VersionResponse> {
        Ok(Response::new(crate::version::reply(
            &self.shared.talos_version(),
            false,
        )))
    }

    async fn hostname(&self, _: Request<()>) -> Reply<HostnameResponse> {
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let hostname = strong.lock().await.hostname();
        Ok(Response::new(HostnameResponse {
            messages: vec![Hostname {
                metadata: None,
                hostname,
            }],
        }))
    }

    async fn service_list(&self, _: Request<()>) -> Reply<ServiceListResponse> {
        Ok(Response::new(configured::service_list(&self.node).await?))
    }
}
