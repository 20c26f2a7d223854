//! A configured node: the Talos API behind mutual TLS with the applied config's OS CA, and
//! roles enforced per method from the client certificate's Organization (talos-facts §2).

use std::pin::Pin;

use ichor_talos::api::common::Data;
use ichor_talos::api::machine::machine_service_server::MachineService;
use ichor_talos::api::machine::{
    ApplyConfigurationRequest, ApplyConfigurationResponse, BootstrapRequest, BootstrapResponse,
    EtcdDefragmentResponse, EtcdForfeitLeadershipRequest, EtcdForfeitLeadershipResponse,
    EtcdLeaveClusterRequest, EtcdLeaveClusterResponse, EtcdMemberListRequest,
    EtcdMemberListResponse, EtcdRemoveMemberByIdRequest, EtcdRemoveMemberByIdResponse,
    EtcdSnapshotRequest, EtcdStatusResponse, HostnameResponse, RebootRequest, RebootResponse,
    ResetRequest, ResetResponse, ServiceListResponse, UpgradeRequest, UpgradeResponse,
    VersionResponse,
};
use tonic::{Request, Response, Status};

use crate::not_simulated;

use crate::maintenance::version_reply;

/// Talos API roles, weakest first (talos-facts §2 "Client certificate").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    Reader,
    Operator,
    Admin,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Reader => "os:reader",
            Self::Operator => "os:operator",
            Self::Admin => "os:admin",
        }
    }
}

/// The strongest known role in the client certificate's Organization; unknown roles are
/// ignored (talos-facts §2 "Role enforcement").
fn caller_role<T>(request: &Request<T>) -> Option<Role> {
    let certs = request.peer_certs()?;
    let leaf = certs.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    cert.subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok())
        .filter_map(|o| match o {
            "os:admin" => Some(Role::Admin),
            "os:operator" => Some(Role::Operator),
            "os:reader" => Some(Role::Reader),
            _ => None,
        })
        .max()
}

/// Refuses a caller below `needed`.
fn authorize<T>(request: &Request<T>, needed: Role) -> Result<(), Status> {
    match caller_role(request) {
        Some(role) if role >= needed => Ok(()),
        Some(role) => Err(Status::permission_denied(format!(
            "not authorized: this method needs {}, the client certificate grants {}",
            needed.name(),
            role.name()
        ))),
        None => Err(Status::permission_denied(
            "not authorized: the client certificate carries no Talos role",
        )),
    }
}

/// The MachineService of a configured node.
pub(crate) struct Configured {
    pub(crate) talos_version: String,
}

type Reply<T> = Result<Response<T>, Status>;

/// Roles per method are those of talos-facts §1.2.
#[tonic::async_trait]
impl MachineService for Configured {
    async fn apply_configuration(
        &self,
        r: Request<ApplyConfigurationRequest>,
    ) -> Reply<ApplyConfigurationResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("ApplyConfiguration on a configured node"))
    }

    async fn bootstrap(&self, r: Request<BootstrapRequest>) -> Reply<BootstrapResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("Bootstrap"))
    }

    async fn etcd_member_list(
        &self,
        r: Request<EtcdMemberListRequest>,
    ) -> Reply<EtcdMemberListResponse> {
        authorize(&r, Role::Reader)?;
        Err(not_simulated("EtcdMemberList"))
    }

    async fn etcd_remove_member_by_id(
        &self,
        r: Request<EtcdRemoveMemberByIdRequest>,
    ) -> Reply<EtcdRemoveMemberByIdResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("EtcdRemoveMemberByID"))
    }

    async fn etcd_leave_cluster(
        &self,
        r: Request<EtcdLeaveClusterRequest>,
    ) -> Reply<EtcdLeaveClusterResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("EtcdLeaveCluster"))
    }

    async fn etcd_forfeit_leadership(
        &self,
        r: Request<EtcdForfeitLeadershipRequest>,
    ) -> Reply<EtcdForfeitLeadershipResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("EtcdForfeitLeadership"))
    }

    async fn etcd_status(&self, r: Request<()>) -> Reply<EtcdStatusResponse> {
        authorize(&r, Role::Reader)?;
        Err(not_simulated("EtcdStatus"))
    }

    type EtcdSnapshotStream =
        Pin<Box<dyn tokio_stream::Stream<Item = Result<Data, Status>> + Send>>;

    async fn etcd_snapshot(
        &self,
        r: Request<EtcdSnapshotRequest>,
    ) -> Reply<Self::EtcdSnapshotStream> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("EtcdSnapshot"))
    }

    async fn etcd_defragment(&self, r: Request<()>) -> Reply<EtcdDefragmentResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("EtcdDefragment"))
    }

    async fn reset(&self, r: Request<ResetRequest>) -> Reply<ResetResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("Reset"))
    }

    async fn reboot(&self, r: Request<RebootRequest>) -> Reply<RebootResponse> {
        authorize(&r, Role::Operator)?;
        Err(not_simulated("Reboot"))
    }

    async fn upgrade(&self, r: Request<UpgradeRequest>) -> Reply<UpgradeResponse> {
        authorize(&r, Role::Admin)?;
        Err(not_simulated("Upgrade"))
    }

    async fn version(&self, r: Request<()>) -> Reply<VersionResponse> {
        authorize(&r, Role::Reader)?;
        Ok(Response::new(version_reply(&self.talos_version)))
    }

    async fn hostname(&self, r: Request<()>) -> Reply<HostnameResponse> {
        authorize(&r, Role::Reader)?;
        Err(not_simulated("Hostname"))
    }

    async fn service_list(&self, r: Request<()>) -> Reply<ServiceListResponse> {
        authorize(&r, Role::Reader)?;
        Err(not_simulated("ServiceList"))
    }
}
