//! Typed operations on a node beyond apply and reads: bootstrap, etcd, reset, reboot,
//! upgrade, wipe, services (talos-facts §1.2–§1.4, §5, §8.4). Every per-node error inside a
//! wrapped reply surfaces as an error.

use std::time::Duration;

use tokio::time::Instant;
use tokio_stream::StreamExt as _;

use crate::api::common::ContainerdInstance;
use crate::api::machine::image_service_client::ImageServiceClient;
use crate::api::machine::image_service_pull_response::Response as PullReply;
use crate::api::machine::lifecycle_service_client::LifecycleServiceClient;
use crate::api::machine::lifecycle_service_install_progress::Response as Installer;
use crate::api::machine::machine_service_client::MachineServiceClient;
use crate::api::machine::reset_request::WipeMode;
use crate::api::machine::{
    BootstrapRequest, EtcdForfeitLeadershipRequest, EtcdLeaveClusterRequest, EtcdMemberListRequest,
    EtcdRemoveMemberByIdRequest, EventsRequest, ImageServicePullRequest, InstallArtifactsSource,
    LifecycleServiceUpgradeRequest, ReadRequest, RebootRequest, ResetPartitionSpec, ResetRequest,
    SequenceEvent,
};
use crate::api::storage::storage_service_client::StorageServiceClient;
use crate::api::storage::{BlockDeviceWipeDescriptor, BlockDeviceWipeRequest};
use crate::client::{TalosClient, TalosError};
use crate::progress::{LayerProgress, Progress, Reporter};

/// Where Linux keeps the id of the current boot, a random UUID drawn at every boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The longest boot id file accepted (a UUID and a newline are 37 bytes).
const BOOT_ID_MAX: usize = 64;

/// How a Bootstrap ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bootstrapped {
    /// This call bootstrapped etcd.
    Now,
    /// The node's etcd data directory was not empty: bootstrapped before (talos-facts §5
    /// `AlreadyExists`), which counts as done.
    Already,
}

/// One etcd member (`EtcdMember`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    /// The member id.
    pub id: u64,
    /// The member's hostname.
    pub hostname: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs.
    pub client_urls: Vec<String>,
    /// Whether it is a learner (not yet a voter).
    pub learner: bool,
}

/// The local member's status (`EtcdMemberStatus`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdStatus {
    /// The member id.
    pub member_id: u64,
    /// The leader's member id (0: no leader).
    pub leader: u64,
    /// Whether the member is a learner.
    pub learner: bool,
    /// Raft index.
    pub raft_index: u64,
    /// Raft term.
    pub raft_term: u64,
    /// Database size in bytes.
    pub db_size: i64,
    /// Errors the member reports (e.g. alarms, no leader).
    pub errors: Vec<String>,
}

/// One service on the node (`ServiceInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// Service id, e.g. `etcd`.
    pub id: String,
    /// State, e.g. `Running`.
    pub state: String,
    /// Whether its health check passes.
    pub healthy: bool,
    /// The message of its latest event: what it is doing, or why it failed (empty without
    /// events).
    pub message: String,
}

/// How a node is reset. The system partitions are always named — `STATE` and `EPHEMERAL` —
/// because an empty list wipes every partition and leaves a disk-booted node nothing to boot
/// (talos-facts §8.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResetOptions {
    /// Leave etcd first (with Talos's safety checks).
    pub graceful: bool,
    /// Reboot afterwards (back to maintenance mode); power off otherwise.
    pub reboot: bool,
}

impl TalosClient {
    /// The MachineService client over this connection.
    pub(crate) fn machine(&self) -> MachineServiceClient<crate::client::Observed> {
        MachineServiceClient::new(self.transport())
    }

    /// Bootstraps etcd on this control plane, retrying while the node answers
    /// `FailedPrecondition` (still booting, or time not in sync: talos-facts §5) until
    /// `patience` runs out. `AlreadyExists` is [`Bootstrapped::Already`].
    pub async fn bootstrap(&self, patience: Duration) -> Result<Bootstrapped, TalosError> {
        self.bootstrap_with(
            patience,
            BootstrapRequest {
                recover_etcd: false,
                recover_skip_hash_check: false,
            },
        )
        .await
    }

    /// Bootstraps etcd on this control plane from the snapshot uploaded before
    /// ([`etcd_recover_from`](Self::etcd_recover_from)), as
    /// [`bootstrap`](Self::bootstrap) does otherwise (the same retries, `AlreadyExists` is
    /// [`Bootstrapped::Already`]). `skip_hash_check` restores a file whose SHA-256 trailer is
    /// missing or does not match (`talosctl bootstrap --recover-skip-hash-check`).
    ///
    /// What Talos does (siderolabs/talos v1.14.0-rc.1,
    /// `internal/app/machined/pkg/system/services/etcd.go` `BootstrapEtcd` and
    /// `Etcd.recoverFromSnapshot`): the call is answered once the etcd service is restarted in
    /// bootstrap mode; the snapshot is checked and restored afterwards, in that service's
    /// pre-start step. So `Ok(Bootstrapped::Now)` does not mean etcd was restored: a missing
    /// or unreadable upload, or a hash that does not match, fails the etcd service instead
    /// (state `Failed`, its last event `Failed to run pre stage: error verifying snapshot: …`
    /// or `… error recovering from the snapshot: …`, see [`services`](Self::services)), and no
    /// member comes up. A hash that does not match leaves the data directory half-written:
    /// every later Bootstrap answers `AlreadyExists` ([`Bootstrapped::Already`]) until
    /// EPHEMERAL is wiped. Restored, etcd has one voter (this node) in a new cluster holding
    /// the snapshot's keys, and the upload is deleted.
    pub async fn bootstrap_recover(
        &self,
        patience: Duration,
        skip_hash_check: bool,
    ) -> Result<Bootstrapped, TalosError> {
        self.bootstrap_with(
            patience,
            BootstrapRequest {
                recover_etcd: true,
                recover_skip_hash_check: skip_hash_check,
            },
        )
        .await
    }

    async fn bootstrap_with(
        &self,
        patience: Duration,
        request: BootstrapRequest,
    ) -> Result<Bootstrapped, TalosError> {
        const METHOD: &str = "Bootstrap";
        let deadline = Instant::now() + patience;
        let mut delay = Duration::from_millis(50);
        loop {
            let result = self.machine().bootstrap(self.request(request)).await;
            match result {
                Ok(reply) => {
                    self.single(METHOD, reply.into_inner().messages, |m| m.metadata.as_ref())?;
                    return Ok(Bootstrapped::Now);
                }
                Err(status) if status.code() == tonic::Code::AlreadyExists => {
                    return Ok(Bootstrapped::Already);
                }
                Err(status)
                    if status.code() == tonic::Code::FailedPrecondition
                        && Instant::now() + delay < deadline =>
                {
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(2));
                }
                Err(status) => return Err(self.rpc_error(METHOD)(status)),
            }
        }
    }

    /// The etcd members, as the cluster knows them (a quorum read), or as the local member
    /// knows them (`local`, which works without quorum).
    pub async fn etcd_members(&self, local: bool) -> Result<Vec<EtcdMember>, TalosError> {
        const METHOD: &str = "EtcdMemberList";
        let reply = self
            .machine()
            .etcd_member_list(self.request(EtcdMemberListRequest { query_local: local }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        crate::decode::etcd_members(reply).map_err(|e| self.node_error(METHOD, e))
    }

    /// Removes a member by id; send it to a healthy member (talos-facts §5).
    pub async fn etcd_remove_member(&self, id: u64) -> Result<(), TalosError> {
        const METHOD: &str = "EtcdRemoveMemberByID";
        let reply = self
            .machine()
            .etcd_remove_member_by_id(self.request(EtcdRemoveMemberByIdRequest { member_id: id }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(drop)
    }

    /// Makes this node's member leave its etcd cluster.
    pub async fn etcd_leave(&self) -> Result<(), TalosError> {
        const METHOD: &str = "EtcdLeaveCluster";
        let reply = self
            .machine()
            .etcd_leave_cluster(self.request(EtcdLeaveClusterRequest {}))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(drop)
    }

    /// Hands leadership away if this member leads; returns the member the reply names.
    pub async fn etcd_forfeit_leadership(&self) -> Result<String, TalosError> {
        const METHOD: &str = "EtcdForfeitLeadership";
        let reply = self
            .machine()
            .etcd_forfeit_leadership(self.request(EtcdForfeitLeadershipRequest {}))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(|m| m.member)
    }

    /// The local member's status.
    pub async fn etcd_status(&self) -> Result<EtcdStatus, TalosError> {
        const METHOD: &str = "EtcdStatus";
        let reply = self
            .machine()
            .etcd_status(self.request(()))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let first = self.single(METHOD, reply.messages, |m| m.metadata.as_ref())?;
        let status = first
            .member_status
            .ok_or_else(|| self.node_error(METHOD, "no member status in the reply".into()))?;
        Ok(EtcdStatus {
            member_id: status.member_id,
            leader: status.leader,
            learner: status.is_learner,
            raft_index: status.raft_index,
            raft_term: status.raft_term,
            db_size: status.db_size,
            errors: status.errors,
        })
    }

    /// A snapshot of the local member's database, however long it takes while bytes keep
    /// coming ([`Limits::snapshot_idle`](crate::Limits::snapshot_idle)).
    pub async fn etcd_snapshot(&self) -> Result<Vec<u8>, TalosError> {
        self.etcd_snapshot_with_progress(|_| {}).await
    }

    /// [`etcd_snapshot`](Self::etcd_snapshot), telling `progress` the bytes received so far
    /// ([`Progress::Received`]) after every message.
    pub async fn etcd_snapshot_with_progress(
        &self,
        mut progress: impl FnMut(&Progress) + Send,
    ) -> Result<Vec<u8>, TalosError> {
        const METHOD: &str = "EtcdSnapshot";
        let mut reporter = Reporter::new(&mut progress);
        self.traced(METHOD, async {
            let mut stream = self.snapshot_chunks().await?;
            let mut out = Vec::new();
            while let Some(bytes) = stream.next().await? {
                out.extend_from_slice(&bytes);
                reporter.report(&Progress::Received(out.len() as u64));
            }
            tracing::info!(bytes = out.len(), "snapshot received");
            Ok(out)
        })
        .await
    }

    /// Uploads an etcd snapshot that a later recovering Bootstrap
    /// ([`bootstrap_recover`](Self::bootstrap_recover)) restores from:
    /// [`etcd_recover_from`](Self::etcd_recover_from) with the bytes at hand, in 4 KiB chunks
    /// as talosctl sends them.
    pub async fn etcd_recover(&self, snapshot: &[u8]) -> Result<(), TalosError> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let feed = async move {
            for chunk in snapshot.chunks(crate::snapshot::UPLOAD_CHUNK) {
                if tx.send(chunk.to_vec()).await.is_err() {
                    return;
                }
            }
        };
        let upload = self.etcd_recover_from(rx);
        tokio::pin!(upload);
        tokio::select! {
            // The call ended before everything was fed (refused): nothing more to feed.
            result = &mut upload => return result,
            () = feed => {}
        }
        upload.await
    }

    /// Defragments the local member's database, within
    /// [`Limits::long`](crate::Limits::long). Talos answers once, when it is done, and
    /// reports nothing meanwhile: the `talos_call` span's start and end are all the progress
    /// there is.
    pub async fn etcd_defragment(&self) -> Result<(), TalosError> {
        const METHOD: &str = "EtcdDefragment";
        self.traced(METHOD, async {
            let reply = self
                .machine()
                .etcd_defragment(self.request(()))
                .await
                .map_err(self.rpc_error(METHOD))?
                .into_inner();
            self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
                .map(drop)
        })
        .await
    }

    /// Resets the node, wiping `STATE` and `EPHEMERAL` (never an empty list, talos-facts
    /// §8.4).
    pub async fn reset(&self, options: ResetOptions) -> Result<(), TalosError> {
        const METHOD: &str = "Reset";
        let partition = |label: &str| ResetPartitionSpec {
            label: label.into(),
            wipe: true,
        };
        let reply = self
            .machine()
            .reset(self.request(ResetRequest {
                graceful: options.graceful,
                reboot: options.reboot,
                system_partitions_to_wipe: vec![partition("STATE"), partition("EPHEMERAL")],
                user_disks_to_wipe: Vec::new(),
                mode: WipeMode::SystemDisk as i32,
            }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(drop)
    }

    /// Reboots the node.
    pub async fn reboot(&self) -> Result<(), TalosError> {
        const METHOD: &str = "Reboot";
        let reply = self
            .machine()
            .reboot(self.request(RebootRequest { mode: 0 }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(drop)
    }

    /// The id of the node's current boot: the kernel's `boot_id` file ([`BOOT_ID_PATH`]), read
    /// with `MachineService/Read`. Linux draws a new random UUID at every boot, so a different
    /// id than before an action means the node rebooted since, however quickly it came back.
    /// talosctl tells a reboot the same way: its action tracker reads this file before the
    /// action and waits for it to change (`cmd/talosctl/pkg/talos/action/tracker.go`,
    /// `getBootID` and `BootIDChangedPostCheckFn`).
    pub async fn boot_id(&self) -> Result<String, TalosError> {
        const METHOD: &str = "Read";
        let mut stream = self
            .machine()
            .read(self.request(ReadRequest {
                path: BOOT_ID_PATH.into(),
            }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let mut bytes = Vec::new();
        while let Some(data) = stream.message().await.map_err(self.rpc_error(METHOD))? {
            if let Some(error) = data.metadata.map(|m| m.error).filter(|e| !e.is_empty()) {
                return Err(self.node_error(METHOD, error));
            }
            bytes.extend_from_slice(&data.bytes);
            if bytes.len() > BOOT_ID_MAX {
                return Err(self.node_error(
                    METHOD,
                    format!("{BOOT_ID_PATH} is longer than {BOOT_ID_MAX} bytes"),
                ));
            }
        }
        let id = String::from_utf8_lossy(&bytes).trim().to_owned();
        if id.is_empty() {
            return Err(self.node_error(METHOD, format!("{BOOT_ID_PATH} is empty")));
        }
        Ok(id)
    }

    /// Pulls an image into the system containerd (for an upgrade); returns its resolved name.
    pub async fn pull_image(&self, image: &str) -> Result<String, TalosError> {
        self.pull_image_with_progress(image, |_| {}).await
    }

    /// [`pull_image`](Self::pull_image), telling `progress` each layer's state as the node
    /// reports it ([`Progress::Layer`]; Talos sends one for every active layer every 100 ms,
    /// and none for an image it has already).
    pub async fn pull_image_with_progress(
        &self,
        image: &str,
        mut progress: impl FnMut(&Progress) + Send,
    ) -> Result<String, TalosError> {
        const METHOD: &str = "ImageService.Pull";
        let mut reporter = Reporter::new(&mut progress);
        self.traced(METHOD, async {
            let mut stream = ImageServiceClient::new(self.transport())
                .pull(self.request(ImageServicePullRequest {
                    containerd: Some(system_containerd()),
                    image_ref: image.into(),
                }))
                .await
                .map_err(self.rpc_error(METHOD))?
                .into_inner();
            let mut name = None;
            while let Some(item) = stream.next().await {
                match item.map_err(self.rpc_error(METHOD))?.response {
                    Some(PullReply::Name(n)) => name = Some(n),
                    Some(PullReply::PullProgress(layer)) => {
                        reporter.report(&Progress::Layer(LayerProgress::from_proto(layer)));
                    }
                    None => {}
                }
            }
            name.ok_or_else(|| self.node_error(METHOD, format!("no image name for {image}")))
        })
        .await
    }

    /// Upgrades to a pulled image with `LifecycleService.Upgrade` (talos-facts §1.3): a
    /// non-zero exit code in the stream is a failure carrying the node's last messages.
    pub async fn upgrade(&self, image: &str) -> Result<(), TalosError> {
        self.upgrade_with_progress(image, |_| {}).await
    }

    /// [`upgrade`](Self::upgrade), telling `progress` each line of the installer's output
    /// ([`Progress::Message`]).
    pub async fn upgrade_with_progress(
        &self,
        image: &str,
        mut progress: impl FnMut(&Progress) + Send,
    ) -> Result<(), TalosError> {
        const METHOD: &str = "LifecycleService.Upgrade";
        let mut reporter = Reporter::new(&mut progress);
        self.traced(METHOD, async {
            let mut stream = LifecycleServiceClient::new(self.transport())
                .upgrade(self.request(LifecycleServiceUpgradeRequest {
                    containerd: Some(system_containerd()),
                    source: Some(InstallArtifactsSource {
                        image_name: image.into(),
                    }),
                }))
                .await
                .map_err(self.rpc_error(METHOD))?
                .into_inner();
            let mut messages = Vec::new();
            while let Some(item) = stream.next().await {
                match item
                    .map_err(self.rpc_error(METHOD))?
                    .progress
                    .and_then(|p| p.response)
                {
                    Some(Installer::Message(m)) => {
                        reporter.report(&Progress::Message(m.clone()));
                        messages.push(m);
                    }
                    Some(Installer::ExitCode(0)) => return Ok(()),
                    Some(Installer::ExitCode(code)) => {
                        return Err(self.node_error(
                            METHOD,
                            format!("exit code {code}: {}", messages.join("; ")),
                        ));
                    }
                    None => {}
                }
            }
            Err(self.node_error(
                METHOD,
                format!(
                    "the stream ended without an exit code: {}",
                    messages.join("; ")
                ),
            ))
        })
        .await
    }

    /// Wipes block devices (names without `/dev/`), quickly.
    pub async fn wipe(&self, devices: &[&str]) -> Result<(), TalosError> {
        const METHOD: &str = "BlockDeviceWipe";
        let reply = StorageServiceClient::new(self.transport())
            .block_device_wipe(
                self.request(BlockDeviceWipeRequest {
                    devices: devices
                        .iter()
                        .map(|d| BlockDeviceWipeDescriptor {
                            device: (*d).to_owned(),
                            method: 0,
                            skip_volume_check: false,
                            drop_partition: false,
                            skip_secondary_check: false,
                        })
                        .collect(),
                }),
            )
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(drop)
    }

    /// The node's services.
    pub async fn services(&self) -> Result<Vec<Service>, TalosError> {
        const METHOD: &str = "ServiceList";
        let reply = self
            .machine()
            .service_list(self.request(()))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let first = self.single(METHOD, reply.messages, |m| m.metadata.as_ref())?;
        Ok(first
            .services
            .into_iter()
            .map(|s| Service {
                id: s.id,
                state: s.state,
                healthy: s.health.is_some_and(|h| h.healthy),
                message: s
                    .events
                    .and_then(|e| e.events.into_iter().last())
                    .map(|e| e.msg)
                    .unwrap_or_default(),
            })
            .collect())
    }

    /// The node's hostname.
    pub async fn hostname(&self) -> Result<String, TalosError> {
        const METHOD: &str = "Hostname";
        let reply = self
            .machine()
            .hostname(self.request(()))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
            .map(|m| m.hostname)
    }
}

/// A sequence that failed on the node's current boot: the `SequenceEvent` NOOP carrying an
/// error that machined publishes when a sequence fails (`v1alpha1_controller.go`
/// `Controller.Run`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFailure {
    /// The sequence, e.g. `install`, `boot`, `upgrade`.
    pub sequence: String,
    /// Whether the error is FATAL (machined then reboots by itself), not a lock or a cancel.
    pub fatal: bool,
    /// The error, e.g. "sequence failed: error running phase 2 in install sequence: task 1/1:
    /// failed, task \"upgrade\" failed: exit code 1".
    pub message: String,
}

/// The type URL of a `SequenceEvent` in the event stream.
const SEQUENCE_EVENT: &str = "talos/runtime/machine.SequenceEvent";

impl TalosClient {
    /// The sequences that failed on the node's current boot, read from its event log
    /// (`MachineService.Events`, every past event, os:reader: answered in maintenance mode
    /// too). The stream never ends by itself: it is read until no event arrives for `quiet`
    /// (the backlog comes at once) or the node goes away. The log is per boot: after the
    /// reboot a fatal error causes, it is gone.
    pub async fn sequence_failures(
        &self,
        quiet: Duration,
    ) -> Result<Vec<SequenceFailure>, TalosError> {
        const METHOD: &str = "Events";
        let mut stream = self
            .machine()
            .events(self.request(EventsRequest {
                tail_events: -1,
                ..Default::default()
            }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let mut out = Vec::new();
        while let Ok(next) = tokio::time::timeout(quiet, stream.next()).await {
            let Some(event) = next else { break };
            let Ok(event) = event else { break };
            let Some(data) = event.data.filter(|d| d.type_url == SEQUENCE_EVENT) else {
                continue;
            };
            let sequence = <SequenceEvent as prost::Message>::decode(data.value.as_slice())
                .map_err(|e| self.node_error(METHOD, format!("a SequenceEvent: {e}")))?;
            if let Some(error) = sequence.error {
                out.push(SequenceFailure {
                    sequence: sequence.sequence,
                    fatal: error.code == crate::api::common::Code::Fatal as i32,
                    message: error.message,
                });
            }
        }
        Ok(out)
    }

    /// Why the install sequence failed on the node's current boot, if it did (1.13's
    /// `machine.install`, and 1.14's with `machine.install`): its FATAL error message. The node
    /// reboots by itself seconds later and comes back in maintenance mode, where this reads
    /// `None` again (see [`TalosClient::sequence_failures`]).
    pub async fn install_failure(&self, quiet: Duration) -> Result<Option<String>, TalosError> {
        Ok(self
            .sequence_failures(quiet)
            .await?
            .into_iter()
            .find(|f| f.sequence == "install" && f.fatal)
            .map(|f| f.message))
    }
}

/// The system containerd, where installer images go (talos-facts §1.1 `ContainerdInstance`).
fn system_containerd() -> ContainerdInstance {
    ContainerdInstance {
        driver: 0,
        namespace: 1,
    }
}
