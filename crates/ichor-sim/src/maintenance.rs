//! The MachineService of a node in maintenance mode (talos-facts §1.2, §2, §5), and what an
//! apply there sets off: persisting the config, installing, rebooting.

use std::pin::Pin;
use std::sync::{Arc, Weak};

use ichor_talos::api::common::Data;
use ichor_talos::api::machine::apply_configuration_request::Mode;
use ichor_talos::api::machine::machine_service_server::MachineService;
use ichor_talos::api::machine::{
    ApplyConfiguration, ApplyConfigurationRequest, ApplyConfigurationResponse, BootstrapRequest,
    BootstrapResponse, EtcdDefragmentResponse, EtcdForfeitLeadershipRequest,
    EtcdForfeitLeadershipResponse, EtcdLeaveClusterRequest, EtcdLeaveClusterResponse,
    EtcdMemberListRequest, EtcdMemberListResponse, EtcdRemoveMemberByIdRequest,
    EtcdRemoveMemberByIdResponse, EtcdSnapshotRequest, EtcdStatusResponse, EventsRequest, Hostname,
    HostnameResponse, ReadRequest, RebootRequest, RebootResponse, ResetRequest, ResetResponse,
    ServiceListResponse, ShutdownRequest, ShutdownResponse, UpgradeRequest, UpgradeResponse,
    VersionResponse,
};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::config::AppliedConfig;
use crate::network::Shared;
use crate::{InstallPhase, Node, Stage, configured};

/// Maintenance mode: every caller is `os:reader` (talos-facts §2 "Roles").
pub(crate) struct Maintenance {
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: Weak<Mutex<Node>>,
}

/// Refuses a config holding documents the node's version does not know: a 1.13 loader
/// answers `"Kind" "v1alpha1": not registered` for the documents contract 1.14 introduced.
pub(crate) fn check_known_documents(
    talos_version: &str,
    documents: &[serde_json::Value],
) -> Result<(), Status> {
    if !talos_version.starts_with("v1.13.") {
        return Ok(());
    }
    for document in documents {
        if let Some(kind) = document["kind"].as_str()
            && ichor_render::patch::needs_1_14(kind)
        {
            return Err(Status::invalid_argument(format!(
                "error decoding document v1alpha1/{kind}: \"{kind}\" \"v1alpha1\": not registered"
            )));
        }
    }
    Ok(())
}

/// Parses and checks a config as the node's loader would; invalid configs get
/// `InvalidArgument` (talos-facts §5).
pub(crate) fn load(talos_version: &str, data: Vec<u8>) -> Result<AppliedConfig, Status> {
    let text = String::from_utf8(data)
        .map_err(|_| Status::invalid_argument("the config is not UTF-8 YAML"))?;
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).map_err(|e| {
        Status::invalid_argument(format!("the config is not a YAML document stream: {e}"))
    })?;
    check_known_documents(talos_version, &documents)?;
    AppliedConfig::parse(&text).map_err(|e| Status::invalid_argument(e.to_string()))
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
/// §5). With install instructions and no installed system, the node installs — 1.13: the
/// install stage, then a reboot; 1.14: the unattended-install phases, then a reboot only with
/// `reboot: true` or an installer image. Without them it boots on in place.
async fn continue_boot(node: Weak<Mutex<Node>>, config: Arc<AppliedConfig>) {
    let Some(strong) = node.upgrade() else { return };
    let mut guard = strong.lock().await;
    guard.persisted = Some(Arc::clone(&config));
    // The apply stays in progress until the node has booted with the config (talos-facts §5:
    // a concurrent apply gets FailedPrecondition); `boot` clears it.
    let unattended = guard.shared.is_1_14() && !legacy_install(&config);
    // The config is loaded: initialize ends, the install sequence starts (talos-facts §10.3).
    guard.config_loaded(true);
    let installs = config.install && !guard.installed;
    if !installs || unattended {
        guard.install_skipped();
    }
    if !installs {
        if let Err(error) = guard.continue_configured(node.clone()).await {
            tracing::warn!(%error, "simulated node failed to boot with its config");
        }
        return;
    }
    if !unattended {
        guard.install_started();
    }
    guard.stage = Stage::Installing;
    if unattended {
        guard.unattended = Some((config.install_image.clone(), InstallPhase::Installing));
    }
    let install = guard.timings.install;
    drop(guard);
    tokio::time::sleep(install).await;
    let mut guard = strong.lock().await;
    guard.installed = true;
    if unattended {
        let phase = if config.reboot_after_install {
            InstallPhase::WaitingForReboot
        } else {
            InstallPhase::Installed
        };
        guard.unattended = Some((config.install_image.clone(), phase));
    }
    if !unattended && config.reboot_after_install {
        // The legacy install sequence ends in its own reboot.
        guard.install_finished();
        guard.restart(node).await;
    } else if config.reboot_after_install {
        drop(guard);
        Node::reboot_later(node, std::time::Duration::ZERO);
    } else if let Err(error) = guard.continue_configured(node.clone()).await {
        tracing::warn!(%error, "simulated node failed to boot with its config");
    }
}

/// Whether the config installs through `machine.install` (the 1.13 way).
fn legacy_install(config: &AppliedConfig) -> bool {
    config.yaml.contains("\n  install:")
}

#[tonic::async_trait]
impl MachineService for Maintenance {
    /// Accepted from `os:reader` in maintenance only (talos-facts §1.2). The config is parsed
    /// (invalid configs get `InvalidArgument`, §5), `REBOOT` is mapped to `NO_REBOOT` (§5,
    /// 1.13+), and the node moves on: installs if the config says so, then boots configured.
    async fn apply_configuration(
        &self,
        request: Request<ApplyConfigurationRequest>,
    ) -> Reply<ApplyConfigurationResponse> {
        let request = request.into_inner();
        let config = load(&self.shared.talos_version(), request.data)?;
        let mode = match Mode::try_from(request.mode).unwrap_or(Mode::Reboot) {
            Mode::Reboot => Mode::NoReboot,
            other => other,
        };
        if !request.dry_run {
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
            guard.applying = true;
            tokio::spawn(continue_boot(self.node.clone(), Arc::new(config)));
        }
        Ok(Response::new(ApplyConfigurationResponse {
            messages: vec![ApplyConfiguration {
                metadata: None,
                warnings: Vec::new(),
                mode: mode as i32,
                mode_details: "Applied configuration without a reboot".into(),
            }],
        }))
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
