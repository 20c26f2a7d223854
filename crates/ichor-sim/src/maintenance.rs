//! The MachineService of a node in maintenance mode (talos-facts §1.2, §2).

use std::pin::Pin;

use ichor_talos::api::common::Data;
use ichor_talos::api::machine::machine_service_server::MachineService;
use ichor_talos::api::machine::{
    ApplyConfigurationRequest, ApplyConfigurationResponse, BootstrapRequest, BootstrapResponse,
    EtcdDefragmentResponse, EtcdForfeitLeadershipRequest, EtcdForfeitLeadershipResponse,
    EtcdLeaveClusterRequest, EtcdLeaveClusterResponse, EtcdMemberListRequest,
    EtcdMemberListResponse, EtcdRemoveMemberByIdRequest, EtcdRemoveMemberByIdResponse,
    EtcdSnapshotRequest, EtcdStatusResponse, FeaturesInfo, HostnameResponse, PlatformInfo,
    RebootRequest, RebootResponse, ResetRequest, ResetResponse, ServiceListResponse,
    UpgradeRequest, UpgradeResponse, Version, VersionInfo, VersionResponse,
};
use std::sync::{Arc, Weak};

use ichor_talos::api::machine::ApplyConfiguration;
use ichor_talos::api::machine::apply_configuration_request::Mode;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::{AppliedConfig, Node, not_simulated};

/// Maintenance mode: every caller is `os:reader` (talos-facts §2 "Roles").
pub(crate) struct Maintenance {
    pub(crate) talos_version: String,
    pub(crate) node: Weak<Mutex<Node>>,
}

impl Maintenance {
    /// A 1.13 node's loader does not know the documents contract 1.14 introduced; it answers
    /// as Talos 1.13 does (`"Kind" "v1alpha1": not registered`).
    fn check_known_documents(&self, documents: &[serde_json::Value]) -> Result<(), Status> {
        if !self.talos_version.starts_with("v1.13.") {
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

/// The Version reply. Answered locally, so with no per-node metadata (talos-facts §2 "Routing
/// to nodes").
pub(crate) fn version_reply(talos_version: &str) -> VersionResponse {
    VersionResponse {
        messages: vec![Version {
            metadata: None,
            version: Some(VersionInfo {
                tag: talos_version.to_owned(),
                os: "Talos".into(),
                arch: "amd64".into(),
                ..Default::default()
            }),
            platform: Some(PlatformInfo {
                name: "metal".into(),
                mode: "metal".into(),
            }),
            features: Some(FeaturesInfo { rbac: true }),
        }],
    }
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
        let text = String::from_utf8(request.data)
            .map_err(|_| Status::invalid_argument("the config is not UTF-8 YAML"))?;
        let documents: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| {
                Status::invalid_argument(format!("the config is not a YAML document stream: {e}"))
            })?;
        self.check_known_documents(&documents)?;
        let config =
            AppliedConfig::parse(&text).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let mode = match Mode::try_from(request.mode).unwrap_or(Mode::Reboot) {
            Mode::Reboot => Mode::NoReboot,
            other => other,
        };
        let node = self.node.clone();
        tokio::spawn(async move {
            if let Some(node) = node.upgrade() {
                let weak = Arc::downgrade(&node);
                node.lock().await.apply(weak, config).await;
            }
        });
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

    async fn version(&self, _: Request<()>) -> Reply<VersionResponse> {
        Ok(Response::new(version_reply(&self.talos_version)))
    }

    async fn hostname(&self, _: Request<()>) -> Reply<HostnameResponse> {
        Err(not_simulated("Hostname"))
    }

    async fn service_list(&self, _: Request<()>) -> Reply<ServiceListResponse> {
        Err(not_simulated("ServiceList"))
    }
}
