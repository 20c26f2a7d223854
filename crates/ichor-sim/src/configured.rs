//! A configured node: the Talos API behind mutual TLS with the applied config's OS CA, roles
//! enforced per method from the client certificate's Organization (talos-facts §2), etcd on
//! control planes (§1.2, §5), and the node's own background work: joining etcd, and a
//! worker's wait for trustd (§5).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ichor_talos::api::common::Data;
use ichor_talos::api::machine::apply_configuration_request::Mode;
use ichor_talos::api::machine::machine_service_server::MachineService;
use ichor_talos::api::machine::{
    ApplyConfigurationRequest, ApplyConfigurationResponse, Bootstrap, BootstrapRequest,
    BootstrapResponse, EtcdDefragment, EtcdDefragmentResponse, EtcdForfeitLeadership,
    EtcdForfeitLeadershipRequest, EtcdForfeitLeadershipResponse, EtcdLeaveCluster,
    EtcdLeaveClusterRequest, EtcdLeaveClusterResponse, EtcdMember, EtcdMemberListRequest,
    EtcdMemberListResponse, EtcdMemberStatus, EtcdMembers, EtcdRecover, EtcdRecoverResponse,
    EtcdRemoveMemberById, EtcdRemoveMemberByIdRequest, EtcdRemoveMemberByIdResponse,
    EtcdSnapshotRequest, EtcdStatus, EtcdStatusResponse, EventsRequest, Hostname, HostnameResponse,
    ReadRequest, Reboot, RebootRequest, RebootResponse, Reset, ResetRequest, ResetResponse,
    ServiceListResponse, Shutdown, ShutdownRequest, ShutdownResponse, Upgrade, UpgradeRequest,
    UpgradeResponse, VersionResponse,
};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use crate::apply::{self, handler};
use crate::config::AppliedConfig;
use crate::network::{EtcdCluster, EtcdDown, Inner, Member, Shared, network, random_id};
use crate::snapshot::keyspace::Keyspace;
use crate::snapshot::{SnapshotStream, restore};
use crate::{EtcdData, Node, Stage};

/// Roles are checked per method before any handler (`authz`); the handlers here only add
/// ApplyConfiguration's "os:admin once configured".
pub(crate) use crate::authz::{Role, authorize};

/// The MachineService of a configured node.
pub(crate) struct Configured {
    pub(crate) shared: Arc<Shared>,
    pub(crate) node: Weak<Mutex<Node>>,
}

type Reply<T> = Result<Response<T>, Status>;

fn gone() -> Status {
    Status::unavailable("the node is shutting down")
}

/// Etcd calls, Bootstrap included, work only on control planes (talos-facts §1.2).
fn control_plane_only(node: &Node, method: &str) -> Result<Arc<AppliedConfig>, Status> {
    match &node.running {
        Some(config) if config.is_control_plane() => Ok(Arc::clone(config)),
        Some(_) => Err(Status::unimplemented(format!(
            "{method} is only available on control plane nodes"
        ))),
        None => Err(Status::unimplemented("machine type is not set")),
    }
}

/// How an etcd client on the node fails when its member cannot serve.
pub(crate) fn etcd_down(down: &EtcdDown) -> Status {
    match down {
        EtcdDown::NotRunning => Status::unavailable("etcd is not running on this node"),
        EtcdDown::Removed => Status::unavailable(
            "etcdserver: the member has been permanently removed from the cluster",
        ),
        EtcdDown::NoQuorum => Status::unavailable("etcdserver: request timed out"),
        EtcdDown::Unhealthy => Status::deadline_exceeded("context deadline exceeded"),
    }
}

/// The node's running etcd member, or why there is none.
fn local_member(node: &Node) -> Result<EtcdData, Status> {
    match node.etcd {
        Some(data)
            if !node.etcd_stopped
                && node.shared.etcd_running.load(Ordering::SeqCst) == data.cluster =>
        {
            Ok(data)
        }
        _ => Err(etcd_down(&EtcdDown::NotRunning)),
    }
}

/// The node's running etcd member, answering a client on the node itself (Talos's
/// `etcd.NewLocalClient`), or why not: an unhealthy member (`Fault::EtcdUnhealthy`) runs but
/// does not answer.
pub(crate) fn answering_member(node: &Node) -> Result<EtcdData, Status> {
    let data = local_member(node)?;
    if node.shared.etcd_unhealthy.load(Ordering::SeqCst) {
        return Err(etcd_down(&EtcdDown::Unhealthy));
    }
    Ok(data)
}

/// Why a call that needs the local member's id fails on a node whose member is unhealthy:
/// Talos reads the id from the `EtcdMember` resource (`etcd.GetLocalMemberID`, which waits up
/// to three minutes for it), and `etcd.MemberController` destroys that resource while the etcd
/// service is not healthy.
fn no_local_member_id() -> Status {
    Status::deadline_exceeded("failed to get local etcd member ID: context deadline exceeded")
}

/// etcd's strict reconfiguration check: a member may go only if the voters left still have
/// a live majority (etcd refuses otherwise).
fn removal_keeps_quorum(net: &Inner, cluster: &EtcdCluster, member: u64) -> bool {
    let remaining: Vec<&Member> = cluster
        .members
        .iter()
        .filter(|m| m.id != member && !m.learner)
        .collect();
    let alive = remaining
        .iter()
        .filter(|m| net.alive(cluster.id, m))
        .count();
    !remaining.is_empty() && alive * 2 > remaining.len()
}

/// Removes `member` from `cluster`, as `MemberRemove` does.
fn remove_member(net: &mut Inner, cluster: u64, member: u64) -> Result<(), Status> {
    let c = net
        .serving_cluster(cluster, member_or_any(net, cluster, member))
        .map_err(|d| etcd_down(&d))?;
    let c = c.clone();
    if !c.members.iter().any(|m| m.id == member) {
        return Err(Status::not_found(format!(
            "etcdserver: member not found: {member:x}"
        )));
    }
    if !removal_keeps_quorum(net, &c, member) {
        return Err(Status::failed_precondition(
            "etcdserver: re-configuration failed due to not enough started members",
        ));
    }
    if let Some(c) = net.cluster_mut(cluster) {
        c.members.retain(|m| m.id != member);
        c.raft_index += 1;
    }
    net.settle_leader(cluster);
    Ok(())
}

/// Any member id of the cluster (for checks made on behalf of the cluster as a whole).
fn member_or_any(net: &Inner, cluster: u64, preferred: u64) -> u64 {
    net.cluster(cluster)
        .and_then(|c| {
            c.members
                .iter()
                .find(|m| m.id == preferred)
                .or_else(|| c.members.first())
        })
        .map_or(preferred, |m| m.id)
}

fn member_proto(m: &Member) -> EtcdMember {
    EtcdMember {
        id: m.id,
        hostname: m.hostname.clone(),
        peer_urls: vec![m.peer_url()],
        client_urls: vec![m.client_url()],
        is_learner: m.learner,
    }
}

/// The services a node runs, their events and health (talos-facts §1.2, §10.7).
pub(crate) async fn service_list(node: &Weak<Mutex<Node>>) -> Result<ServiceListResponse, Status> {
    crate::services::list(node).await
}

impl Configured {
    fn strong(&self) -> Result<Arc<Mutex<Node>>, Status> {
        self.node.upgrade().ok_or_else(gone)
    }

    fn leave(&self, node: &mut Node) -> Result<(), Status> {
        leave(&self.shared, node)
    }
}

/// Leaves the etcd cluster: the member is removed and etcd stops, its data directory cleared
/// (talos-facts §5 "Removing a node").
fn leave(shared: &Shared, node: &mut Node) -> Result<(), Status> {
    let data = local_member(node)?;
    if shared.etcd_unhealthy.load(Ordering::SeqCst) {
        return Err(no_local_member_id());
    }
    if shared.fail_leave.load(Ordering::SeqCst) {
        return Err(Status::unavailable(
            "failed to leave the etcd cluster: etcdserver: request timed out",
        ));
    }
    remove_member(&mut network(), data.cluster, data.member)?;
    node.etcd = None;
    node.etcd_stopped = true;
    shared.etcd_running.store(0, Ordering::SeqCst);
    Ok(())
}

/// Roles per method are those of talos-facts §1.2.
#[tonic::async_trait]
impl MachineService for Configured {
    /// ApplyConfiguration on a configured node (talos-facts §5, §11.1): os:admin; the config
    /// is checked as machined checks it (a refusal is `InvalidArgument` with Talos's message
    /// and changes nothing); 1.14 refuses `REBOOT` and resolves `AUTO` to `NO_REBOOT`; a dry
    /// run answers the summary and changes nothing.
    async fn apply_configuration(
        &self,
        r: Request<ApplyConfigurationRequest>,
    ) -> Reply<ApplyConfigurationResponse> {
        authorize(&r, Role::Admin)?;
        let request = r.into_inner();
        let strong = self.strong()?;
        let mut node = strong.lock().await;
        if node.applying {
            return Err(Status::failed_precondition(
                "another apply configuration is already in progress",
            ));
        }
        let current = node.running.clone().ok_or_else(gone)?;
        let text = handler::text(request.data)?;
        let rt = handler::runtime(&node, false);
        let container = apply::load(&rt, &text).map_err(Status::invalid_argument)?;
        handler::reboot_refused(&rt.talos, request.mode)?;
        let warnings = apply::validate(&rt, &container).map_err(Status::invalid_argument)?;
        let is_1_14 = self.shared.is_1_14();
        let config =
            Arc::new(AppliedConfig::parse(&text).map_err(|e| {
                crate::not_simulated(&format!("running this accepted config ({e})"))
            })?);
        if current.machine_type != config.machine_type {
            return Err(Status::invalid_argument(
                "machine type can't be changed from the applied configuration",
            ));
        }
        let requested =
            Mode::try_from(request.mode).map_err(|_| handler::incorrect_mode(request.mode))?;
        let needs_reboot = current.os_ca_crt != config.os_ca_crt
            || current.cluster_identity() != config.cluster_identity();
        let mode = match requested {
            Mode::Auto if is_1_14 => Mode::NoReboot,
            Mode::Auto if needs_reboot => Mode::Reboot,
            Mode::Auto => Mode::NoReboot,
            other => other,
        };
        if mode == Mode::NoReboot
            && self.shared.require_reboot.load(Ordering::SeqCst)
            && current.as_ref() != config.as_ref()
        {
            // Talos 1.13's answer when `CanApplyImmediate` refuses (talos-facts §11.1 step 9).
            return Err(Status::invalid_argument(
                "this config change can't be applied in immediate mode\ndiff:\n(not simulated)",
            ));
        }
        let details = match mode {
            Mode::Reboot => handler::REBOOT_DETAILS,
            Mode::Staged => handler::STAGED_DETAILS,
            _ => handler::NO_REBOOT_DETAILS,
        };
        if request.dry_run {
            let running = apply::load(&rt, &current.yaml).ok();
            return Ok(Response::new(handler::dry_run(
                mode,
                details,
                running.as_ref(),
                &container,
            )));
        }
        if mode != Mode::Try {
            self.shared.config_applies.fetch_add(1, Ordering::SeqCst);
        }
        match mode {
            Mode::Try => return Err(crate::not_simulated("apply mode TRY")),
            Mode::Staged => node.staged = Some(config),
            Mode::Reboot => {
                node.persisted = Some(config);
                Node::reboot_later(self.node.clone(), Duration::from_millis(20));
            }
            _ => {
                node.persisted = Some(Arc::clone(&config));
                node.running = Some(Arc::clone(&config));
                if let Some(entry) = network().nodes.get_mut(&self.shared.addr) {
                    entry.config = Some(Arc::clone(&config));
                }
                // A pending unattended install looks again with the new selector (the
                // controller reacts to config changes, talos-facts §11.7).
                crate::maintenance::resume_unattended(&mut node, self.node.clone());
            }
        }
        Ok(Response::new(handler::reply(mode, details, warnings)))
    }

    /// Bootstrap (talos-facts §5): not available while the node still boots, refused without
    /// an etcd CA, `AlreadyExists` once the data directory is not empty; otherwise the etcd
    /// service is loaded afresh in bootstrap mode and the call answered: a new etcd cluster
    /// with this node as its only voter — even when another one exists. With `recover_etcd`
    /// the new cluster holds the uploaded snapshot's keyspace, or the etcd service fails as
    /// Talos's does (`docs/etcd-recovery.md`); the call succeeds either way.
    async fn bootstrap(&self, r: Request<BootstrapRequest>) -> Reply<BootstrapResponse> {
        let request = r.into_inner();
        let strong = self.strong()?;
        let mut node = strong.lock().await;
        let config = control_plane_only(&node, "bootstrap")?;
        // The CRI waits for a pending unattended install (talos-facts §11.7).
        if !node.bootstrap_available() {
            return Err(Status::failed_precondition(
                "bootstrap is not available yet",
            ));
        }
        if !config.has_etcd_ca {
            // v1.14.0-rc.1 `v1alpha1_server.go` `Server.Bootstrap`.
            return Err(Status::invalid_argument(
                "etcd is not configured, bootstrap is not possible",
            ));
        }
        if node.etcd.is_some() || node.etcd_dir_written {
            return Err(Status::already_exists("etcd data directory is not empty"));
        }
        // `BootstrapEtcd` (services/etcd.go): the etcd service is stopped, unloaded, loaded
        // in bootstrap mode and started; the call is answered once it starts.
        node.etcd_stopped = false;
        node.reload_service("etcd");
        let id = random_id();
        let keyspace = if request.recover_etcd {
            // Its pre-start step (`Etcd.argsForControlPlane`) recovers from the upload.
            let upload = node.etcd_recovery.clone();
            let skip = request.recover_skip_hash_check;
            let recovered =
                tokio::task::spawn_blocking(move || restore::recover(upload.as_ref(), skip))
                    .await
                    .map_err(|e| Status::internal(format!("recovery did not finish: {e}")))?;
            match recovered {
                Ok(keyspace) => {
                    // Deleted once restored (`recoverFromSnapshot`).
                    node.etcd_recovery = None;
                    keyspace
                }
                Err(failure) => {
                    node.etcd_dir_written |= failure.data_dir_written;
                    // The service failed: no etcd runs on this boot.
                    node.etcd_stopped = true;
                    node.fail_service(
                        "etcd",
                        &format!("failed to run pre stage: {}", failure.error),
                    );
                    return Ok(Response::new(BootstrapResponse {
                        messages: vec![Bootstrap { metadata: None }],
                    }));
                }
            }
        } else {
            // The cluster's data is its own, the same in every snapshot of it (§12.3).
            Keyspace::new(id, node.etcd_size)
        };
        let member = Member {
            id: random_id(),
            hostname: node.hostname(),
            addr: self.shared.addr,
            learner: false,
        };
        let cluster = EtcdCluster {
            id,
            identity: config.cluster_identity(),
            leader: member.id,
            members: vec![member.clone()],
            raft_term: 2,
            raft_index: 4,
            cni_present: config.deploys_cni,
            created: Instant::now(),
            keyspace: Arc::new(keyspace),
        };
        node.etcd = Some(EtcdData {
            cluster: cluster.id,
            member: member.id,
        });
        self.shared.etcd_running.store(cluster.id, Ordering::SeqCst);
        network().clusters.push(cluster);
        Ok(Response::new(BootstrapResponse {
            messages: vec![Bootstrap { metadata: None }],
        }))
    }

    async fn etcd_member_list(
        &self,
        r: Request<EtcdMemberListRequest>,
    ) -> Reply<EtcdMemberListResponse> {
        let query_local = r.get_ref().query_local;
        let strong = self.strong()?;
        let node = strong.lock().await;
        control_plane_only(&node, "etcd member list")?;
        // A local query asks the node's own member; otherwise Talos asks the control planes'
        // members, peers included.
        let data = if query_local {
            answering_member(&node)?
        } else {
            local_member(&node)?
        };
        let mut net = network();
        // A local query is served by the member itself, without a quorum read.
        let members = if query_local {
            net.cluster(data.cluster)
                .filter(|c| c.members.iter().any(|m| m.id == data.member))
                .map(|c| c.members.clone())
                .ok_or_else(|| etcd_down(&EtcdDown::Removed))?
        } else {
            net.serving_cluster(data.cluster, data.member)
                .map_err(|d| etcd_down(&d))?
                .members
                .clone()
        };
        Ok(Response::new(EtcdMemberListResponse {
            messages: vec![EtcdMembers {
                metadata: None,
                legacy_members: Vec::new(),
                members: members.iter().map(member_proto).collect(),
            }],
        }))
    }

    async fn etcd_remove_member_by_id(
        &self,
        r: Request<EtcdRemoveMemberByIdRequest>,
    ) -> Reply<EtcdRemoveMemberByIdResponse> {
        let id = r.get_ref().member_id;
        let strong = self.strong()?;
        let node = strong.lock().await;
        control_plane_only(&node, "etcd remove member")?;
        let data = local_member(&node)?;
        let mut net = network();
        net.serving_cluster(data.cluster, data.member)
            .map_err(|d| etcd_down(&d))?;
        remove_member(&mut net, data.cluster, id)?;
        Ok(Response::new(EtcdRemoveMemberByIdResponse {
            messages: vec![EtcdRemoveMemberById { metadata: None }],
        }))
    }

    async fn etcd_leave_cluster(
        &self,
        _r: Request<EtcdLeaveClusterRequest>,
    ) -> Reply<EtcdLeaveClusterResponse> {
        let strong = self.strong()?;
        let mut node = strong.lock().await;
        control_plane_only(&node, "etcd leave cluster")?;
        self.leave(&mut node)?;
        Ok(Response::new(EtcdLeaveClusterResponse {
            messages: vec![EtcdLeaveCluster { metadata: None }],
        }))
    }

    /// Hands leadership to another live voter when this member leads; the reply names the
    /// leader afterwards.
    async fn etcd_forfeit_leadership(
        &self,
        _r: Request<EtcdForfeitLeadershipRequest>,
    ) -> Reply<EtcdForfeitLeadershipResponse> {
        let strong = self.strong()?;
        let node = strong.lock().await;
        control_plane_only(&node, "etcd forfeit leadership")?;
        let data = local_member(&node)?;
        if self.shared.etcd_unhealthy.load(Ordering::SeqCst) {
            return Err(no_local_member_id());
        }
        let mut net = network();
        let cluster = net
            .serving_cluster(data.cluster, data.member)
            .map_err(|d| etcd_down(&d))?
            .clone();
        let mut leader = cluster.leader;
        if leader == data.member
            && let Some(next) = cluster
                .members
                .iter()
                .filter(|m| !m.learner && m.id != data.member && net.alive(cluster.id, m))
                .map(|m| m.id)
                .min()
        {
            leader = next;
            if let Some(c) = net.cluster_mut(cluster.id) {
                c.leader = next;
                c.raft_term += 1;
            }
        }
        let member = cluster
            .members
            .iter()
            .find(|m| m.id == leader)
            .map(|m| m.hostname.clone())
            .unwrap_or_default();
        Ok(Response::new(EtcdForfeitLeadershipResponse {
            messages: vec![EtcdForfeitLeadership {
                metadata: None,
                member,
            }],
        }))
    }

    /// The local member's status; without quorum it has no leader (etcd's `Status` lists
    /// "etcdserver: no leader" and any alarm in `errors`). An unhealthy member does not answer:
    /// the call fails as Talos wraps the local client's error.
    async fn etcd_status(&self, _r: Request<()>) -> Reply<EtcdStatusResponse> {
        let strong = self.strong()?;
        let node = strong.lock().await;
        control_plane_only(&node, "etcd status")?;
        let data = answering_member(&node).map_err(|s| {
            Status::new(
                s.code(),
                format!("failed to query etcd status: {}", s.message()),
            )
        })?;
        let mut net = network();
        let leader = net.settle_leader(data.cluster);
        let cluster = net
            .cluster(data.cluster)
            .ok_or_else(|| etcd_down(&EtcdDown::NotRunning))?;
        let me = cluster
            .members
            .iter()
            .find(|m| m.id == data.member)
            .ok_or_else(|| etcd_down(&EtcdDown::Removed))?;
        let errors = if leader == 0 {
            vec!["etcdserver: no leader".to_owned()]
        } else {
            Vec::new()
        };
        // The database a snapshot holds, without free pages (§12.3).
        let db_size = i64::try_from(cluster.snapshot_view().db_size()).unwrap_or(i64::MAX);
        Ok(Response::new(EtcdStatusResponse {
            messages: vec![EtcdStatus {
                metadata: None,
                member_status: Some(EtcdMemberStatus {
                    protocol_version: "3.6.0".into(),
                    db_size,
                    // No free pages: all of it is in use.
                    db_size_in_use: db_size,
                    leader,
                    raft_index: cluster.raft_index,
                    raft_term: cluster.raft_term,
                    raft_applied_index: cluster.raft_index,
                    errors,
                    is_learner: me.learner,
                    member_id: me.id,
                    storage_version: "3.6.0".into(),
                }),
            }],
        }))
    }

    type EtcdSnapshotStream = SnapshotStream;

    /// A snapshot of the local member's database (talos-facts §12.1): the bbolt file with its
    /// SHA-256 trailer, streamed in chunks while it is written (admin, operator or
    /// `os:etcd:backup`, §10.6).
    async fn etcd_snapshot(
        &self,
        _r: Request<EtcdSnapshotRequest>,
    ) -> Reply<Self::EtcdSnapshotStream> {
        let strong = self.strong()?;
        let node = strong.lock().await;
        control_plane_only(&node, "etcd snapshot")?;
        let data = answering_member(&node)?;
        // The member reads its own database: no quorum needed.
        let view = network()
            .cluster(data.cluster)
            .filter(|c| c.members.iter().any(|m| m.id == data.member))
            .map(EtcdCluster::snapshot_view)
            .ok_or_else(|| etcd_down(&EtcdDown::Removed))?;
        Ok(Response::new(view.stream()))
    }

    /// Keeps an uploaded snapshot for a Bootstrap that recovers from it, as Talos writes it to
    /// `/var/lib/etcd.snapshot` (replacing an earlier one; `v1alpha1_server.go`
    /// `Server.EtcdRecover`): admin, control planes only; nothing about the contents is
    /// refused here, the check waits for the recovery.
    async fn etcd_recover(&self, r: Request<tonic::Streaming<Data>>) -> Reply<EtcdRecoverResponse> {
        authorize(&r, Role::Admin)?;
        {
            let strong = self.strong()?;
            control_plane_only(&*strong.lock().await, "etcd recover")?;
        }
        let mut upload = r.into_inner();
        let mut bytes = Vec::new();
        while let Some(chunk) = upload.message().await? {
            bytes.extend_from_slice(&chunk.bytes);
        }
        let strong = self.strong()?;
        strong.lock().await.etcd_recovery = Some(Arc::new(bytes));
        Ok(Response::new(EtcdRecoverResponse {
            messages: vec![EtcdRecover { metadata: None }],
        }))
    }

    async fn etcd_defragment(&self, _r: Request<()>) -> Reply<EtcdDefragmentResponse> {
        let strong = self.strong()?;
        let node = strong.lock().await;
        control_plane_only(&node, "etcd defragment")?;
        answering_member(&node)?;
        Ok(Response::new(EtcdDefragmentResponse {
            messages: vec![EtcdDefragment { metadata: None }],
        }))
    }

    /// Reset (talos-facts §1.2, §8.4, §10.4): answered at once with the actor id; the reset
    /// sequence — with a graceful control plane's etcd leave, the wipe, the reboot or
    /// power-off — follows in the background.
    async fn reset(&self, r: Request<ResetRequest>) -> Reply<ResetResponse> {
        crate::sequences::check_reset(&*self.strong()?.lock().await, r.get_ref())?;
        let shared = Arc::clone(&self.shared);
        let leave_etcd: crate::sequences::LeaveFn = Box::new(move |node: &mut Node| {
            if local_member(node).is_err() {
                return Ok(());
            }
            leave(&shared, node).map_err(|s| s.message().to_owned())
        });
        let actor = crate::sequences::reset(self.node.clone(), r.into_inner(), leave_etcd);
        Ok(Response::new(ResetResponse {
            messages: vec![Reset {
                metadata: None,
                actor_id: actor,
            }],
        }))
    }

    async fn reboot(&self, r: Request<RebootRequest>) -> Reply<RebootResponse> {
        let actor = crate::sequences::reboot(self.node.clone(), r.get_ref());
        Ok(Response::new(RebootResponse {
            messages: vec![Reboot {
                metadata: None,
                actor_id: actor,
            }],
        }))
    }

    async fn shutdown(&self, r: Request<ShutdownRequest>) -> Reply<ShutdownResponse> {
        let actor = crate::sequences::shutdown(self.node.clone(), r.get_ref());
        Ok(Response::new(ShutdownResponse {
            messages: vec![Shutdown {
                metadata: None,
                actor_id: actor,
            }],
        }))
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

    /// The deprecated Upgrade (talos-facts §1.2): refused when Talos is not installed; on a
    /// control plane without `force` or `preserve`, refused when the member's going away would
    /// cost etcd its quorum (the check is unverified in detail). The node reboots into the
    /// image's version.
    async fn upgrade(&self, r: Request<UpgradeRequest>) -> Reply<UpgradeResponse> {
        let request = r.into_inner();
        let strong = self.strong()?;
        let node = strong.lock().await;
        if !node.installed {
            return Err(Status::failed_precondition("Talos is not installed"));
        }
        if !request.force
            && !request.preserve
            && let Ok(data) = local_member(&node)
        {
            let net = network();
            if let Some(cluster) = net.cluster(data.cluster)
                && !removal_keeps_quorum(&net, cluster, data.member)
            {
                return Err(Status::failed_precondition(
                    "etcd quorum would be lost by rebooting this member",
                ));
            }
        }
        drop(node);
        let actor = crate::sequences::upgrade(self.node.clone(), &request);
        Ok(Response::new(UpgradeResponse {
            messages: vec![Upgrade {
                metadata: None,
                ack: "Upgrade request received".into(),
                actor_id: actor,
            }],
        }))
    }

    async fn version(&self, _r: Request<()>) -> Reply<VersionResponse> {
        Ok(Response::new(crate::version::reply(
            &self.shared.talos_version(),
            true,
        )))
    }

    async fn hostname(&self, _r: Request<()>) -> Reply<HostnameResponse> {
        let hostname = self.strong()?.lock().await.hostname();
        Ok(Response::new(HostnameResponse {
            messages: vec![Hostname {
                metadata: None,
                hostname,
            }],
        }))
    }

    async fn service_list(&self, _r: Request<()>) -> Reply<ServiceListResponse> {
        Ok(Response::new(service_list(&self.node).await?))
    }
}

/// The version an installer image carries (`…/installer:v1.14.1` → `v1.14.1`).
pub(crate) fn image_version(image: &str) -> Option<String> {
    let tag = image.rsplit(':').next()?;
    (tag.starts_with('v') && !tag.contains('/')).then(|| tag.to_owned())
}

/// The etcd service of a control plane that has no member yet (talos-facts §5): it finds the
/// cluster of its identity through discovery, removes a stale member with its hostname, joins
/// as a learner, and promotes itself to voter.
pub(crate) async fn etcd_service(node: Weak<Mutex<Node>>, timings: crate::Timings) {
    let mut learner_since: Option<Instant> = None;
    loop {
        tokio::time::sleep(timings.tick).await;
        let Some(strong) = node.upgrade() else { return };
        let mut guard = strong.lock().await;
        guard.shared.etcd_rounds.fetch_add(1, Ordering::SeqCst);
        let Some(config) = guard.running.clone() else {
            continue;
        };
        // A stopped or failed service joins nothing; nor does one whose data directory is not
        // empty (Talos builds the join arguments only for an empty one).
        if guard.etcd_stopped || guard.etcd_dir_written {
            continue;
        }
        let shared = Arc::clone(&guard.shared);
        if let Some(data) = guard.etcd {
            let Some(since) = learner_since else { continue };
            if since.elapsed() < timings.promotion || shared.controls.holds(crate::PROMOTION) {
                continue;
            }
            let mut net = network();
            let quorum = net.cluster(data.cluster).is_some_and(|c| net.has_quorum(c));
            if quorum && let Some(c) = net.cluster_mut(data.cluster) {
                for m in c.members.iter_mut().filter(|m| m.id == data.member) {
                    m.learner = false;
                }
                c.raft_index += 1;
                learner_since = None;
            }
            continue;
        }
        if shared.controls.holds(crate::DISCOVERY) {
            continue;
        }
        let hostname = guard.hostname();
        let mut net = network();
        let Some(cluster) = net.joinable(&config.cluster_identity(), timings.discovery) else {
            continue;
        };
        let stale: Vec<u64> = net
            .cluster(cluster)
            .map(|c| {
                c.members
                    .iter()
                    .filter(|m| m.hostname == hostname)
                    .map(|m| m.id)
                    .collect()
            })
            .unwrap_or_default();
        for id in stale {
            if remove_member(&mut net, cluster, id).is_err() {
                continue;
            }
        }
        let member = Member {
            id: random_id(),
            hostname,
            addr: shared.addr,
            learner: true,
        };
        let id = member.id;
        if let Some(c) = net.cluster_mut(cluster) {
            c.members.push(member);
            c.raft_index += 1;
        }
        drop(net);
        guard.etcd = Some(EtcdData {
            cluster,
            member: id,
        });
        shared.etcd_running.store(cluster, Ordering::SeqCst);
        learner_since = Some(Instant::now());
    }
}

/// A worker's wait for its API certificate (talos-facts §5): it needs trustd on a control
/// plane of its cluster, found through the configured endpoint, in a bootstrapped cluster,
/// accepting its `machine.token` (§1.5). Until then its API does not answer.
pub(crate) async fn await_trustd(node: Weak<Mutex<Node>>, timings: crate::Timings) {
    loop {
        tokio::time::sleep(timings.tick).await;
        let Some(strong) = node.upgrade() else { return };
        let mut guard = strong.lock().await;
        let Some(config) = guard.persisted.clone() else {
            return;
        };
        guard.shared.trustd_attempts.fetch_add(1, Ordering::SeqCst);
        let ready = {
            let net = network();
            net.control_plane_at(&config.endpoint_host, &config.cluster_identity())
                .filter(|cp| {
                    cp.config
                        .as_ref()
                        .is_some_and(|c| c.machine_token == config.machine_token)
                })
                .map(|cp| cp.shared.etcd_running.load(Ordering::SeqCst))
                .and_then(|cluster| net.cluster(cluster))
                .is_some_and(|c| net.has_quorum(c))
        };
        if !ready {
            continue;
        }
        match guard.serve(node.clone(), Some(config)).await {
            Ok(()) => {
                if !guard.install_pending() {
                    guard.stage = Stage::Running;
                    guard.boot_finished();
                }
                return;
            }
            Err(error) => tracing::warn!(%error, "simulated worker failed to start its API"),
        }
    }
}
