//! A Talos node simulator speaking the same gRPC API as real nodes, for tests and the local
//! demo. Every behaviour follows `talos-facts.md`; each cites the fact it models.
//!
//! - **Maintenance mode** (talos-facts §2): a self-signed Ed25519 certificate regenerated on
//!   every boot, no client certificates, every caller `os:reader`; reader-level calls, COSI
//!   reads of non-sensitive types, `ApplyConfiguration` and `BlockDeviceWipe`; admin methods
//!   and forwarding refused.
//! - **COSI** (§1.6, §13): Get, List and Watch of the resources the node models, with Talos's
//!   resource definitions, metadata, both spec encodings and access policy.
//! - **Apply and install** (§5, §8.2, §11): configs loaded and validated as machined does at
//!   apply time, per release (refusals are `InvalidArgument` with Talos's message and change
//!   nothing), dry runs answer Talos's summary; the install disk is matched against the
//!   simulated disks: 1.13 installs through the install stage and reboots (a missing disk or
//!   a failing installer fails the install sequence fatally and the node returns to
//!   maintenance), 1.14 through the
//!   unattended-install phases (no matching disk: pending); no install section boots on in
//!   place.
//! - **User volumes** (`docs/user-volumes.md`): the `UserVolumeConfig` documents of the running
//!   config become `VolumeStatuses` `u-<name>` (partitions made on the disks their selector
//!   picks, whole disks, directories, or Talos's failure), following config changes applied
//!   without a reboot; apply refuses invalid ones with Talos's messages.
//! - **Configured nodes** (§2): mutual TLS with the config's OS CA, roles per method, `node`
//!   metadata forwarding between nodes that trust each other.
//! - **Etcd** (§1.2, §5): membership derived only from applied configs — Bootstrap with its
//!   not-ready window, joins as learners and promotion, member list/remove/leave/forfeit,
//!   status, snapshots (bbolt files in etcd's layout, §12) and recovery uploads, defragment,
//!   quorum loss; a second Bootstrap makes a second cluster. A Bootstrap with `recover_etcd`
//!   restores the uploaded snapshot's keyspace into a new one-voter cluster, or fails the etcd
//!   service as Talos's fails (`docs/etcd-recovery.md`); tests write and read keys through a
//!   member (`SimNode::etcd_put`, `etcd_get`, `etcd_delete`), which later snapshots hold.
//! - **Workers** (§5): their API comes up only once trustd on a bootstrapped control plane of
//!   the same cluster, reached through the configured endpoint, accepts their token.
//! - **Reset, reboot, upgrade, shutdown** (§1.2, §1.3, §8.4, §10.3–§10.5, §10.9), readiness by
//!   CNI (§8.3).
//! - **Machine events** (§10.1–§10.4): each boot's event log with machined's sequences, phases,
//!   tasks, service and machine-status events, served by `MachineService.Events` with actor ids
//!   and tail options, and the boot id talosctl's `--wait` reads.
//! - **Roles per method** (§10.6), `Version` and services as machined fills them (§10.7, §10.8),
//!   and `Unimplemented` naming every method the simulator does not model (§10.10).
//! - **Image Factory** (§9.3–§9.5, `docs/install-failures.md`): [`SimFactory`], the factory's
//!   schematic API (`POST`/`GET /schematics`), its ISOs (§15.1) and the schematics it knows,
//!   shared by a process's nodes ([`NodeSpec::factory`]); a pull or an install of one of its
//!   installers whose schematic it does not know fails as containerd's not-found pull; each
//!   node lists the extensions of the installer it was installed or upgraded with
//!   (`ExtensionStatuses`; 1.14 also `ImageFactorySchematics`).
//! - **BMC** (§15, `bmc` module): opt-in per node ([`NodeSpec::bmc`], [`SimNode::bmc`]), a
//!   Redfish service over HTTPS on loopback (basic auth or sessions, accounts under the
//!   predefined roles, a CA for tests) with one system, one manager and its virtual CD. Power actions reach the node: off, it answers
//!   nothing; on, it boots through its firmware, from its disk as after a restart, or from an
//!   inserted Image Factory ISO (§15.1: maintenance mode with the ISO's version and schematic;
//!   halted on a disk with Talos installed, §15.2) when the boot override says `Cd` (a `Once`
//!   override is consumed by that boot); `GracefulShutdown` is machined's power-button
//!   shutdown (§15.3); a reset is a power cycle. The system reports the node's SMBIOS UUID
//!   (§8.1), optionally byte-swapped (§8.6); faults: unresponsive, password changed
//!   ([`BmcFault`]).
//! - **Kubernetes components** (§14): the kubelet version the running config's kubelet image
//!   gives ([`SimNode::kubelet_version`]), a control plane's kubelet status of each control-plane
//!   static pod (`StaticPodStatuses`), which follows the running config's images once etcd is
//!   healthy, replacing a pod as [`Timings::static_pod`] says, and the bootstrap manifests
//!   `10-kube-proxy`, `11-core-dns` and `11-core-dns-svc` (`Manifests`) rendered from the config.
//! - **Faults and gates**: crash/restart, partition, slow, certificate faults, failing etcd
//!   leave, an unhealthy etcd member on a node that still answers, upgrade rollback, an
//!   installer that fails or never finishes (`docs/install-failures.md`); gates that hold a
//!   named RPC until released, and one that keeps a joined etcd learner from promoting itself.
#![forbid(unsafe_code)]

mod apply;
mod authz;
mod bmc;
mod config;
mod configured;
mod control;
mod cosi;
mod cut;
mod events;
mod factory;
pub mod hardware;
mod kubelet;
mod lifecycle;
mod machined;
mod maintenance;
mod network;
mod sequences;
mod services;
mod snapshot;
mod storage;
mod tls;
mod version;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ichor_talos::api::cosi::resource::state_server::StateServer;
use ichor_talos::api::machine::image_service_server::ImageServiceServer;
use ichor_talos::api::machine::lifecycle_service_server::LifecycleServiceServer;
use ichor_talos::api::machine::machine_service_server::MachineServiceServer;
use ichor_talos::api::storage::storage_service_server::StorageServiceServer;
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::service::Routes;
use tonic::transport::Server;

pub use bmc::{BmcFault, BmcSpec, SimBmc};
pub use config::MachineType;
pub use control::Gate;
pub use factory::SimFactory;
pub use hardware::{Hardware, SimDisk, SimLink};

use config::AppliedConfig;
use control::{Controlled, Controls};
use network::{Entry, Shared, network};

/// The answer to a call whose behaviour the simulator does not model: `Unimplemented`,
/// saying so, never a made-up success.
pub(crate) fn not_simulated(what: &str) -> tonic::Status {
    tonic::Status::unimplemented(format!("{what} is not simulated"))
}

/// The answer to a gRPC method the simulator does not serve at all (a path outside `proto/`,
/// or one Talos has and the simulator does not model: diagnostics, Kubernetes-backed flows).
pub(crate) fn not_simulated_method(path: &str) -> tonic::Status {
    tonic::Status::unimplemented(format!(
        "{path} is not simulated: ichor-sim does not model this method"
    ))
}

/// What can go wrong running a simulated node.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The boot certificate could not be made.
    #[error("cannot generate a certificate")]
    Certificate(#[from] rcgen::Error),
    /// The listener could not be bound or served.
    #[error("cannot serve on {addr}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// TLS could not be configured.
    #[error("cannot configure TLS: {0}")]
    TlsSetup(String),
    /// The config given to boot with is not one this simulator can run.
    #[error("invalid machine config: {0}")]
    InvalidConfig(String),
    /// The node cannot do that in its current state.
    #[error("{0}")]
    State(String),
}

/// How long a simulated node takes for what real nodes take time for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// Installing to disk after an apply in maintenance mode.
    pub install: Duration,
    /// Down time of a reboot.
    pub reboot: Duration,
    /// How long after a Reboot, Reset, Shutdown or Upgrade call its sequence runs (a real
    /// node spends seconds stopping pods and services; talosctl's event stream, opened while
    /// the call is made, must be there to see it).
    pub sequence: Duration,
    /// After boot, how long Bootstrap answers `FailedPrecondition "bootstrap is not available
    /// yet"` (the CRI is not running yet, talos-facts §5).
    pub bootstrap_window: Duration,
    /// How long after a bootstrap other control planes discover the etcd cluster.
    pub discovery: Duration,
    /// How long a joined learner takes to promote itself to voter (talos-facts §5).
    pub promotion: Duration,
    /// How often background work (joining, trustd) looks again.
    pub tick: Duration,
    /// How long a control-plane static pod takes to be replaced after its image changes, and
    /// then to become ready (talos-facts §14.3): the kubelet's status of the old pod stays for
    /// this long, the new pod then runs unready for as long again.
    pub static_pod: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            install: Duration::from_millis(300),
            reboot: Duration::from_millis(100),
            sequence: Duration::from_millis(100),
            bootstrap_window: Duration::from_millis(300),
            discovery: Duration::from_millis(300),
            promotion: Duration::from_millis(200),
            tick: Duration::from_millis(25),
            static_pod: Duration::from_millis(100),
        }
    }
}

/// Everything a simulated node starts from.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// The address to serve on (port 0 picks a free port; real nodes use 50000).
    pub addr: SocketAddr,
    /// The Talos version it runs, e.g. `v1.14.1` (selects per-version behaviour, §8.2).
    pub talos_version: String,
    /// Its hardware.
    pub hardware: Hardware,
    /// How long things take.
    pub timings: Timings,
    /// A config it already runs (rendered multi-document YAML, as if applied and installed
    /// before), or none: maintenance mode.
    pub config: Option<String>,
    /// About how large, in bytes, the etcd database of a cluster this node bootstraps is: its
    /// simulated Kubernetes keyspace, and so the size of its snapshots (talos-facts §12.3).
    pub etcd_size: u64,
    /// The Image Factory its containerd pulls factory installers from and whose schematics
    /// its extensions name (talos-facts §9.4, §9.5): the nodes of one process share one.
    pub factory: SimFactory,
    /// Its BMC, if it has one: a Redfish service whose power and boot actions reach the node
    /// (the `bmc` module); none by default.
    pub bmc: Option<BmcSpec>,
}

/// The default [`NodeSpec::etcd_size`]: a few MiB, as a small cluster's etcd holds.
pub const DEFAULT_ETCD_SIZE: u64 = 4 << 20;

impl NodeSpec {
    /// A small VM ([`Hardware::vm`]) in maintenance mode on `addr`.
    pub fn new(addr: SocketAddr, talos_version: &str) -> Self {
        Self {
            addr,
            talos_version: talos_version.to_owned(),
            hardware: Hardware::vm(0),
            timings: Timings::default(),
            config: None,
            etcd_size: DEFAULT_ETCD_SIZE,
            factory: SimFactory::default(),
            bmc: None,
        }
    }
}

pub use ichor_talos::Stage;

/// What [`SimNode::hold_promotion`] holds: the promotion of a learner to voter, which the node
/// does by itself (not an RPC, so no call can be named like it).
pub(crate) const PROMOTION: &str = "etcd learner promotion";

/// What [`SimNode::hold_discovery`] holds: an etcd service without a member looking for a
/// cluster of its identity to join, which the node does by itself.
pub(crate) const DISCOVERY: &str = "etcd discovery";

/// The proto enum value and YAML string Talos uses for a stage (talos-facts §3).
pub(crate) fn stage_wire(stage: Stage) -> (i32, &'static str) {
    match stage {
        Stage::Unknown => (0, "unknown"),
        Stage::Booting => (1, "booting"),
        Stage::Installing => (2, "installing"),
        Stage::Maintenance => (3, "maintenance"),
        Stage::Running => (4, "running"),
        Stage::Rebooting => (5, "rebooting"),
        Stage::ShuttingDown => (6, "shutting down"),
        Stage::Resetting => (7, "resetting"),
        Stage::Upgrading => (8, "upgrading"),
    }
}

/// The unattended-install phase (1.14, talos-facts §3 `RuntimeUnattendedInstallPhase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InstallPhase {
    /// No disk matches the selector: the install waits (talos-facts §11.7).
    Pending,
    Installing,
    Installed,
    WaitingForReboot,
    /// The installer failed; the controller retries after its restart backoff (see
    /// `docs/install-failures.md`).
    Failed,
}

impl InstallPhase {
    /// The proto value and the YAML string (machinery's enumer names).
    pub(crate) fn wire(self) -> (i32, &'static str) {
        match self {
            Self::Pending => (0, "pending"),
            Self::Installing => (1, "installing"),
            Self::Installed => (2, "installed"),
            Self::WaitingForReboot => (3, "waiting-for-reboot"),
            Self::Failed => (4, "failed"),
        }
    }
}

/// The error the installer container's failure carries in Talos: a non-zero exit of the
/// `upgrade` task (`internal/pkg/install/install.go` `RunInstallerContainer`, v1.13.9 and main
/// alike). It is what [`Fault::InstallFails`] makes the installer return.
pub const INSTALLER_FAILED: &str = "task \"upgrade\" failed: exit code 1";

/// The installer image an install uses: the one the config names, or, when it names none,
/// Talos's default: `ghcr.io/siderolabs/installer:<version>` on 1.13, the factory's
/// empty-schematic `factory.talos.dev/metal-installer/<empty ID>:<version>` from 1.14
/// (talos-facts §9.4).
pub(crate) fn default_installer(image: &str, talos_version: &str) -> String {
    if !image.is_empty() {
        image.to_owned()
    } else if talos_version.starts_with("v1.13.") {
        format!("ghcr.io/siderolabs/installer:{talos_version}")
    } else {
        format!(
            "factory.talos.dev/metal-installer/{}:{talos_version}",
            ichor_render::schematic::EMPTY_ID
        )
    }
}

/// A fault a test injects into a running node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The node presents a different certificate from now on (as after an unnoticed reboot).
    DifferentCertificate,
    /// The node presents its certificate but does not hold its key: every handshake fails.
    MismatchedKey,
    /// The node stops answering (connections hang) and peers cannot reach it, until healed.
    Partition,
    /// The network between the node and every client outside the simulated network (the
    /// manager, `talosctl`, a test) is cut, until healed: on its connections, open or new,
    /// nothing arrives and nothing is refused, both ways (a new connection's TLS handshake
    /// never completes); once healed, what was held flows on. The node itself runs on, and its
    /// peers still reach it (etcd, forwarding through a peer), as when one link fails rather
    /// than the node (docs/adr/0033).
    PartitionFromClients,
    /// Ends a partition, of either kind.
    Heal,
    /// Every call waits this long before it is handled (zero ends it).
    Slow(Duration),
    /// Calls to one method (its gRPC name, e.g. `"EtcdDefragment"`, `"EtcdSnapshot"`) wait
    /// `before` before they are handled, and their reply waits `between` before each piece of
    /// its body after the first (an HTTP/2 data frame, which may hold several messages of a
    /// stream; then the trailers): a slow call, or a stream that stalls. Zero for both ends it.
    SlowMethod {
        /// The method.
        method: &'static str,
        /// The wait before the call is handled.
        before: Duration,
        /// The wait before each later piece of the reply.
        between: Duration,
    },
    /// Etcd leave fails (`EtcdLeaveCluster` and graceful resets) until cleared.
    FailEtcdLeave(bool),
    /// This control plane's etcd member is unhealthy, until cleared, while the node's Talos API
    /// keeps answering (version, services, COSI resources): its etcd runs but answers neither
    /// clients nor peers, as a hung member does. It stays in the member list peers report (a
    /// voter still), and counts as down for quorum and leadership. What Talos does then, from
    /// its source (siderolabs/talos):
    ///
    /// - `EtcdStatus` (`v1alpha1_server.go` `Server.EtcdStatus`) asks the local member through
    ///   `etcd.NewLocalClient`; clientv3 waits for a ready connection, so the call fails when the
    ///   caller's deadline passes, wrapped as "failed to query etcd status: …". The simulator
    ///   fails it at once with `DeadlineExceeded`. (`EtcdMemberStatus.errors`, field 8, is for a
    ///   member that does answer: etcd's `maintenanceServer.Status` lists "etcdserver: no
    ///   leader" and each alarm there, e.g. `NOSPACE`; it is not this fault.)
    /// - The etcd service's health check (`services/etcd.go` `Etcd.HealthFunc`) is a read
    ///   through the local client (`Client.ValidateQuorum`): it fails, so the service is
    ///   Running but not healthy, and the `services` readiness condition is unmet.
    /// - `etcd.MemberController` (`controllers/etcd/member.go`) destroys the local `EtcdMember`
    ///   resource while the service is not healthy.
    /// - `EtcdLeaveCluster` and a graceful reset's `leaveEtcd` task (`Client.LeaveCluster` in
    ///   `internal/pkg/etcd/etcd.go`) read the member id from that resource first
    ///   (`etcd.GetLocalMemberID`, waiting up to three minutes): they fail, "failed to get local
    ///   etcd member ID: context deadline exceeded" (at once here), and a graceful reset fails in
    ///   its leave phase.
    /// - `EtcdMemberList`, `EtcdRemoveMemberByID` and `EtcdForfeitLeadership` go through every
    ///   control plane's member (`etcd.NewClientFromControlPlaneIPs`), so peers serve them; a
    ///   healthy peer's `EtcdRemoveMemberByID` removes the unhealthy member.
    EtcdUnhealthy(bool),
    /// Upgrades come back on the old version until cleared.
    UpgradeRollback(bool),
    /// Config changes cannot be applied live until cleared: `NO_REBOOT` (and an `AUTO` that
    /// resolves to it) is refused, as Talos ≤1.13 does for a change it cannot apply immediately
    /// (talos-facts §5, §8.2 "handle needs reboot explicitly"); `STAGED` still works.
    RequireReboot(bool),
    /// The installer fails, until cleared: the apply was accepted (its checks passed), then the
    /// installer container exits with 1 ([`INSTALLER_FAILED`]). What Talos does then, from its
    /// source (siderolabs/talos; details and paths in `crates/ichor-sim/docs/install-failures.md`):
    ///
    /// - **1.13** (`machine.install`; also 1.14 with `machine.install`): the `install` task fails
    ///   (`v1alpha1_sequencer_tasks.go` `Install`), so the install sequence fails
    ///   (`v1alpha1_controller.go` `Controller.run`/`Run`): the task, phase and sequence STOP
    ///   events, then a `SequenceEvent` NOOP for `install` with a FATAL error "sequence failed:
    ///   error running phase 2 in install sequence: task 1/1: failed, task \"upgrade\" failed:
    ///   exit code 1"; the machine-status controller moves the stage to `rebooting`
    ///   (`machine_status.go`). machined's entrypoint returns the error (`main.go`
    ///   `runEntrypoint`), services stop, and `handle` reboots after a 10 s countdown (no reboot
    ///   sequence; `panic=0` on the kernel command line would halt instead). The config was only
    ///   in memory (no STATE before an install): the node comes back in maintenance mode with a
    ///   new certificate, where the config can be applied again (insecure API, `os:reader`).
    /// - **1.14** (`UnattendedInstallConfig`): the config is applied at once (mutual-TLS API with
    ///   the config's CA, stage `booting`, the CRI and trustd wait for phase `installed`, so
    ///   Bootstrap is not available). `UnattendedInstallController` (`controllers/runtime/
    ///   unattended_install.go`) sets phase `failed` with `error` = the installer's error and
    ///   returns an error; the controller runtime restarts it after a backoff (cosi-project/
    ///   runtime `rruntime/run.go`), and it installs again: phase `installing` (error cleared),
    ///   then `failed` again while the fault holds. Cleared, the next attempt completes
    ///   (`waiting-for-reboot` and a reboot, or `installed`). A new config applied over mutual
    ///   TLS (`os:admin`, `AUTO`/`NO_REBOOT`) is taken at the next attempt. Here the restart
    ///   backoff is [`Timings::install`].
    InstallFails(bool),
    /// The installer never finishes, until cleared: the install stays in progress (1.13 stage
    /// `installing`, the `install` task started and never stopped; 1.14 phase `installing`).
    /// Talos puts no deadline on the installer (`RunInstallerContainer` waits on the container
    /// with a background context). Clearing the fault does not unstick an installer already
    /// hung: recovery is a power cycle ([`SimNode::reboot`]): the config was only in memory, so
    /// the node comes back in maintenance mode and the config is applied again. (On 1.14 real
    /// nodes also reboot by themselves once the boot sequence's 70 min `BootTimeout` passes;
    /// not simulated.)
    InstallHangs(bool),
    /// The machine's disks (all but CD-ROMs) are detached, until cleared: a disk pulled, or a
    /// controller not up yet. The `Disks` resources are gone and no install selector matches
    /// them: a 1.14 unattended install applied meanwhile stays `pending` ("no disk matched the
    /// selector"). Attaching them again is a disk change, which Talos's
    /// `UnattendedInstallController` watches (`block.DiskType` is among its inputs): a pending
    /// install looks again and installs.
    DisksDetached(bool),
}

/// The etcd data directory of a control plane: which cluster's member it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EtcdData {
    pub(crate) cluster: u64,
    pub(crate) member: u64,
}

/// What a node keeps of a snapshot uploaded with `EtcdRecover`, and what recovering from it
/// would find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecoverySnapshot {
    /// Its size in bytes.
    pub size: u64,
    /// Whether a recovering Bootstrap restores it (the hash checked), or the error the etcd
    /// service fails with (`docs/etcd-recovery.md`), e.g. `error recovering from the snapshot:
    /// expected sha256 […], got […]`.
    pub restorable: Result<(), String>,
    /// The same with the hash check skipped (`recover_skip_hash_check`).
    pub restorable_skipping_hash: Result<(), String>,
}

/// A running server: how to stop it, its task, and the task accepting its connections.
type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), tonic::transport::Error>>,
    JoinHandle<()>,
);

/// The node's state: what survives a reboot (on disk) and what this boot holds.
#[derive(Debug)]
pub(crate) struct Node {
    pub(crate) shared: Arc<Shared>,
    pub(crate) hardware: Hardware,
    pub(crate) timings: Timings,
    // On disk.
    pub(crate) talos_version: String,
    /// The config in the STATE partition.
    pub(crate) persisted: Option<Arc<AppliedConfig>>,
    /// A config staged for the next boot.
    pub(crate) staged: Option<Arc<AppliedConfig>>,
    /// Whether Talos is installed to disk.
    pub(crate) installed: bool,
    /// Whether the unattended installer ran (1.14).
    pub(crate) unattended: Option<(String, InstallPhase)>,
    /// Why the last install failed (the install sequence's fatal error, talos-facts §11.7;
    /// on 1.14 the unattended installer's error).
    pub(crate) install_failure: Option<String>,
    /// The config was applied in maintenance and no install completed since: it lives in
    /// memory only (no STATE partition), so a power-on finds none (used by the install faults).
    pub(crate) config_in_memory: bool,
    /// 1.13's install task is running: the node serves the configured mutual-TLS API (the
    /// maintenance service is gone once the config is complete) in stage `installing`.
    pub(crate) installing: bool,
    /// The disks [`Fault::DisksDetached`] took away, until attached again.
    pub(crate) detached: Vec<SimDisk>,
    /// Etcd data (in EPHEMERAL).
    pub(crate) etcd: Option<EtcdData>,
    /// The etcd data directory holds what a recovery that failed its hash check left there
    /// (etcdutl's copy of the database, no member): not empty, so Bootstrap answers
    /// `AlreadyExists`, and the etcd service does not join a cluster (Talos builds the
    /// join arguments only for an empty directory); until EPHEMERAL is wiped.
    pub(crate) etcd_dir_written: bool,
    /// A snapshot uploaded for recovery (in EPHEMERAL, as `/var/lib/etcd.snapshot`), kept until
    /// a recovery restores it.
    pub(crate) etcd_recovery: Option<Arc<Vec<u8>>>,
    /// How large the etcd database of a cluster this node bootstraps is.
    pub(crate) etcd_size: u64,
    /// Images pulled into the system containerd.
    pub(crate) images: BTreeSet<String>,
    /// The Image Factory its containerd pulls factory installers from.
    pub(crate) factory: SimFactory,
    /// The installer image Talos was last installed or upgraded with (on disk, with the
    /// install): its extensions are the node's (talos-facts §9.5). Read only while
    /// [`Node::installed`]: a node not installed booted from the factory's default ISO.
    pub(crate) installer: Option<String>,
    /// The installer of an upgrade installed to disk that the next power-on boots (with
    /// `pending_version`).
    pub(crate) pending_installer: Option<String>,
    /// What user volumes wrote on the disks (partitions, filesystems), by disk name.
    pub(crate) disk_content: BTreeMap<String, volumes::DiskContent>,
    /// Every partition was wiped: nothing left to boot.
    pub(crate) bricked: bool,
    /// Powered on.
    pub(crate) powered: bool,
    /// The firmware settings its BMC keeps (boot override, virtual CD), if it has a BMC: what
    /// a boot through the firmware starts from (`bmc::boot_device`).
    pub(crate) firmware: Option<Arc<bmc::Firmware>>,
    /// The next boot follows a kexec: the firmware plays no part in it (talos-facts §9.6).
    pub(crate) kexec: bool,
    /// The ISO the node last booted from its BMC's virtual CD, if any: its version runs, and its
    /// schematic gives the extensions while nothing is installed.
    pub(crate) iso: Option<factory::FactoryIso>,
    /// This boot halted: booted from an ISO with Talos installed on the disk
    /// (`talos.halt_if_installed`, talos-facts §15.2), nothing runs and nothing answers.
    pub(crate) halted: bool,
    // This boot.
    pub(crate) stage: Stage,
    pub(crate) booted_at: Instant,
    /// The config this boot runs with mutual TLS (control planes at once, workers after
    /// trustd).
    pub(crate) running: Option<Arc<AppliedConfig>>,
    /// This boot's etcd member left its cluster: etcd stays stopped until the next boot.
    pub(crate) etcd_stopped: bool,
    /// An apply is in progress.
    pub(crate) applying: bool,
    /// The next boot is a power-on: machined starts afresh (new event log, boot id,
    /// services).
    pub(crate) fresh: bool,
    /// A version installed to disk (an upgrade) that the next power-on boots.
    pub(crate) pending_version: Option<String>,
    /// This boot's machine events.
    pub(crate) events: Arc<events::EventLog>,
    /// This boot's id (`/proc/sys/kernel/random/boot_id`).
    pub(crate) boot_id: String,
    /// This boot's services.
    pub(crate) services: services::Services,
    /// The sequence running, as the machine-status controller tracks it.
    pub(crate) current_sequence: String,
    /// The machine status last published as an event.
    pub(crate) last_status: Option<ichor_talos::api::machine::MachineStatusEvent>,
    /// This boot's user volume statuses, by id (`u-<name>`).
    pub(crate) user_volumes: BTreeMap<String, volumes::Status>,
    /// The control-plane static pods the kubelet of this boot runs.
    pub(crate) static_pods: kubelet::StaticPods,
    certificate: Option<rustls::pki_types::CertificateDer<'static>>,
    resolver: Option<Arc<tls::Resolver>>,
    server: Option<Running>,
    tasks: Vec<JoinHandle<()>>,
    /// This boot's COSI state, ended (with its last changes) at shutdown.
    cosi: Option<cosi::Boot>,
}

/// A simulated node, serving on its address until stopped. The node's state lives behind a
/// lock so that the node itself can move on (apply, install, reboot) while a test holds this
/// handle; a clone is another handle to the same node (a test's monitor task).
#[derive(Debug, Clone)]
pub struct SimNode {
    shared: Arc<Shared>,
    hardware: Hardware,
    node: Arc<Mutex<Node>>,
    bmc: Option<SimBmc>,
}

impl SimNode {
    /// Boots a small VM ([`Hardware::vm`]) in maintenance mode on `addr` (port 0 picks one).
    pub async fn start(addr: SocketAddr, talos_version: &str) -> Result<Self, SimError> {
        Self::spawn(NodeSpec::new(addr, talos_version)).await
    }

    /// Boots a node with the given hardware in maintenance mode on `addr`.
    pub async fn start_with(
        addr: SocketAddr,
        talos_version: &str,
        hardware: Hardware,
    ) -> Result<Self, SimError> {
        Self::spawn(NodeSpec {
            hardware,
            ..NodeSpec::new(addr, talos_version)
        })
        .await
    }

    /// Boots a node that already runs `config` (a rendered multi-document machine config, as
    /// if applied and installed before).
    pub async fn start_configured(
        addr: SocketAddr,
        talos_version: &str,
        hardware: Hardware,
        config: &str,
    ) -> Result<Self, SimError> {
        Self::spawn(NodeSpec {
            hardware,
            config: Some(config.to_owned()),
            ..NodeSpec::new(addr, talos_version)
        })
        .await
    }

    /// Boots a node from `spec`.
    pub async fn spawn(spec: NodeSpec) -> Result<Self, SimError> {
        let persisted = spec
            .config
            .as_deref()
            .map(AppliedConfig::parse)
            .transpose()?
            .map(Arc::new);
        let mut addr = spec.addr;
        if addr.port() == 0 {
            // Keep the port across reboots, as a real node keeps 50000.
            let probe = std::net::TcpListener::bind(addr)
                .map_err(|source| SimError::Serve { addr, source })?;
            addr = probe
                .local_addr()
                .map_err(|source| SimError::Serve { addr, source })?;
        }
        let shared = Arc::new(Shared::new(addr, &spec.talos_version));
        let firmware = spec
            .bmc
            .as_ref()
            .map(|_| Arc::new(bmc::Firmware::default()));
        let powered = !spec.bmc.as_ref().is_some_and(|b| b.powered_off);
        // A node started with a config was installed before, from the config's installer.
        let installer = persisted
            .as_ref()
            .filter(|c| c.install)
            .map(|c| default_installer(&c.install_image, &spec.talos_version));
        let node = Arc::new(Mutex::new(Node {
            shared: Arc::clone(&shared),
            hardware: spec.hardware.clone(),
            timings: spec.timings,
            talos_version: spec.talos_version.clone(),
            installed: persisted.as_ref().is_some_and(|c| c.install),
            persisted,
            staged: None,
            unattended: None,
            install_failure: None,
            config_in_memory: false,
            installing: false,
            detached: Vec::new(),
            etcd: None,
            etcd_dir_written: false,
            etcd_recovery: None,
            etcd_size: spec.etcd_size,
            images: BTreeSet::new(),
            factory: spec.factory.clone(),
            installer,
            pending_installer: None,
            disk_content: BTreeMap::new(),
            bricked: false,
            powered,
            firmware: firmware.clone(),
            kexec: false,
            iso: None,
            halted: false,
            stage: Stage::Booting,
            booted_at: Instant::now(),
            running: None,
            etcd_stopped: false,
            applying: false,
            fresh: true,
            pending_version: None,
            events: Arc::new(events::EventLog::default()),
            boot_id: String::new(),
            services: services::Services::default(),
            current_sequence: String::new(),
            last_status: None,
            user_volumes: BTreeMap::new(),
            static_pods: kubelet::StaticPods::default(),
            certificate: None,
            resolver: None,
            server: None,
            tasks: Vec::new(),
            cosi: None,
        }));
        network().nodes.insert(
            addr,
            Entry {
                shared: Arc::clone(&shared),
                config: None,
                hostname: String::new(),
                forward: None,
            },
        );
        node.lock().await.boot(Arc::downgrade(&node)).await?;
        let bmc = match (&spec.bmc, firmware) {
            (Some(bmc), Some(firmware)) => Some(
                bmc::start(
                    bmc,
                    Arc::downgrade(&node),
                    firmware,
                    spec.factory.clone(),
                    &spec.hardware.uuid,
                )
                .await?,
            ),
            _ => None,
        };
        Ok(Self {
            shared,
            hardware: spec.hardware,
            node,
            bmc,
        })
    }

    /// Its BMC, if its spec gave it one ([`NodeSpec::bmc`]).
    pub fn bmc(&self) -> Option<&SimBmc> {
        self.bmc.as_ref()
    }

    /// Whether this boot halted: the machine booted an ISO with Talos installed on its disk
    /// (`talos.halt_if_installed`, talos-facts §15.2), powered on and answering nothing.
    pub async fn halted(&self) -> bool {
        self.node.lock().await.halted
    }

    /// Reboots the node: it goes away and comes back on the same address; in maintenance mode
    /// with a new certificate, so its fingerprint changes (talos-facts §8.2).
    pub async fn reboot(&self) -> Result<(), SimError> {
        let mut node = self.node.lock().await;
        node.shut_down().await;
        node.powered = true;
        node.boot(Arc::downgrade(&self.node)).await
    }

    /// Moves the node's disks into another machine, whose SMBIOS UUID is `uuid`, at the same
    /// address: powered off, its board replaced, powered on again, keeping what is on disk (a
    /// configured node keeps its config, so it answers the cluster's credentials as before).
    /// The SMBIOS UUID is the board's (talos-facts §8.1): this is how a replacement machine
    /// comes to answer a removed one's credentials at its static IP. Identifiers the simulator
    /// derives from the UUID (GPT and filesystem UUIDs) change with it.
    /// [`SimNode::hardware`] keeps answering the hardware it was started with.
    pub async fn replace_board(&self, uuid: &str) -> Result<(), SimError> {
        let mut node = self.node.lock().await;
        node.shut_down().await;
        uuid.clone_into(&mut node.hardware.uuid);
        node.powered = true;
        node.boot(Arc::downgrade(&self.node)).await
    }

    /// Crashes the node: it stops answering at once, keeping what is on disk, until
    /// [`SimNode::restart`].
    pub async fn crash(&self) {
        let mut node = self.node.lock().await;
        node.shut_down().await;
        node.powered = false;
    }

    /// Powers the node on again after a crash or a power-off (a bricked node stays silent).
    pub async fn restart(&self) -> Result<(), SimError> {
        self.reboot().await
    }

    /// Injects a fault. Returns the fingerprint the node presents afterwards.
    pub async fn inject(&self, fault: Fault) -> Result<String, SimError> {
        let controls: &Controls = &self.shared.controls;
        match fault {
            Fault::Partition => controls.set_partitioned(true),
            Fault::PartitionFromClients => controls.set_cut_off(true),
            Fault::Heal => {
                controls.set_partitioned(false);
                controls.set_cut_off(false);
            }
            Fault::Slow(delay) => controls.set_slow(delay),
            Fault::SlowMethod {
                method,
                before,
                between,
            } => controls.set_slow_method(method, before, between),
            Fault::FailEtcdLeave(on) => self.shared.fail_leave.store(on, Ordering::SeqCst),
            Fault::EtcdUnhealthy(on) => self.shared.etcd_unhealthy.store(on, Ordering::SeqCst),
            Fault::UpgradeRollback(on) => self.shared.upgrade_rollback.store(on, Ordering::SeqCst),
            Fault::RequireReboot(on) => self.shared.require_reboot.store(on, Ordering::SeqCst),
            Fault::InstallFails(on) => self.shared.install_fails.store(on, Ordering::SeqCst),
            Fault::InstallHangs(on) => self.shared.install_hangs.store(on, Ordering::SeqCst),
            Fault::DisksDetached(on) => {
                let mut node = self.node.lock().await;
                node.detach_disks(on, Arc::downgrade(&self.node));
            }
            Fault::DifferentCertificate | Fault::MismatchedKey => {
                return self.node.lock().await.inject_certificate(fault);
            }
        }
        Ok(self.shared.fingerprint())
    }

    /// Holds every call to `method` (e.g. `"Bootstrap"`, `"EtcdLeaveCluster"`, `"Get"`)
    /// until the returned gate is released.
    pub fn gate(&self, method: &str) -> Gate {
        Controls::gate(&self.shared, method)
    }

    /// Keeps this control plane's etcd member a learner (joined, not promoted to voter) until
    /// the returned gate is released, as a new member still catching up is (talos-facts §5).
    /// The gate counts one arrival once the member is held where it would have promoted.
    pub fn hold_promotion(&self) -> Gate {
        Controls::gate(&self.shared, PROMOTION)
    }

    /// Keeps this control plane's etcd service from finding a cluster to join until the
    /// returned gate is released, as when discovery has not caught up yet: for a test whose
    /// point needs the node unjoined, whatever the machine's pace. The gate counts one arrival
    /// once the service looked while held.
    pub fn hold_discovery(&self) -> Gate {
        Controls::gate(&self.shared, DISCOVERY)
    }

    /// Lets every call to `method` run, then holds its reply until the returned gate is
    /// released: the node acted, the caller has not heard (for kill points "after the call,
    /// before the caller recorded it").
    pub fn gate_reply(&self, method: &str) -> Gate {
        Controls::gate_reply(&self.shared, method)
    }

    /// How many calls to `method` (e.g. `EtcdLeaveCluster`, `Reset`) this node's handlers ran
    /// since it was spawned, whatever their outcome: a test's proof that a once-only step ran
    /// once.
    pub fn calls(&self, method: &str) -> usize {
        self.shared.controls.handled(method)
    }

    /// How many Talos API calls arrived at this node since it was spawned, whatever their
    /// method or outcome (refused, forwarded to another node, failed): what its callers cost it.
    pub fn rpcs(&self) -> usize {
        self.shared.controls.received()
    }

    /// How many configs the node took (`ApplyConfiguration` that, in maintenance mode, set
    /// off the boot with the config or, once configured, changed its running, persisted or
    /// staged config; dry runs and refusals not counted): a test's proof that a config was
    /// sent once, or that a refused one set nothing off. Counted before the reply leaves.
    pub fn config_applies(&self) -> usize {
        self.shared.config_applies.load(Ordering::SeqCst)
    }

    /// Marks a CNI as present (or not) in the Kubernetes cluster this node belongs to:
    /// `nodeReady` stays unmet without one (talos-facts §8.3).
    pub async fn set_cni(&self, present: bool) -> Result<(), SimError> {
        let node = self.node.lock().await;
        let data = node
            .etcd
            .ok_or_else(|| SimError::State("the node belongs to no bootstrapped cluster".into()))?;
        let mut net = network();
        let cluster = net
            .cluster_mut(data.cluster)
            .ok_or_else(|| SimError::State("the node's etcd cluster is gone".into()))?;
        cluster.cni_present = present;
        Ok(())
    }

    /// Stops the node (and its BMC) and takes it off the network.
    pub async fn stop(self) {
        if let Some(bmc) = &self.bmc {
            bmc.stop();
        }
        self.node.lock().await.shut_down().await;
        network().nodes.remove(&self.shared.addr);
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The machine's hardware.
    pub fn hardware(&self) -> &Hardware {
        &self.hardware
    }

    /// The fingerprint of the certificate of the current boot, as `talosctl` pins it.
    pub fn fingerprint(&self) -> String {
        self.shared.fingerprint()
    }

    /// Whether Talos is installed to disk (`machine.install` on 1.13, an
    /// `UnattendedInstallConfig` on 1.14; talos-facts §8.2).
    pub async fn installed(&self) -> bool {
        self.node.lock().await.installed
    }

    /// How many install attempts have reached their outcome since the node was spawned: the
    /// installer finished, failed, or (with [`Fault::InstallHangs`]) is still running when
    /// its time ([`Timings::install`]) is up: a test's proof that an install had its chance.
    pub fn installs_run(&self) -> usize {
        self.shared.installs_run.load(Ordering::SeqCst)
    }

    /// Why the last install failed, if it did: the install sequence's fatal error (1.13, and
    /// 1.14 with `machine.install`; talos-facts §11.7).
    pub async fn install_failure(&self) -> Option<String> {
        self.node.lock().await.install_failure.clone()
    }

    /// The unattended install's phase and its `error` (1.14; talos-facts §11.7): e.g.
    /// `("pending", "no disk matched the selector")`, `("failed", INSTALLER_FAILED)`.
    pub async fn unattended_install(&self) -> Option<(&'static str, String)> {
        let node = self.node.lock().await;
        node.unattended
            .as_ref()
            .map(|(_, phase)| (phase.wire().1, node.unattended_error(*phase)))
    }

    /// Whether the node answers on its address (a worker waiting for trustd does not).
    pub async fn is_serving(&self) -> bool {
        self.shared.serving.load(Ordering::SeqCst)
    }

    /// The current stage.
    pub async fn stage(&self) -> Stage {
        self.node.lock().await.stage
    }

    /// Whether the node is powered on. A crash or a power-off (a shutdown, a reset without
    /// reboot, its BMC) turns it off until [`SimNode::restart`], [`SimNode::reboot`] or its BMC
    /// powers it on; nothing else does, and an unpowered node does not boot.
    pub async fn is_powered(&self) -> bool {
        self.node.lock().await.powered
    }

    /// Whether Bootstrap is available on this boot: its not-ready window has passed and no
    /// unattended install holds it (talos-facts §5, §11.7).
    pub async fn bootstrap_available(&self) -> bool {
        self.node.lock().await.bootstrap_available()
    }

    /// How many rounds this control plane's etcd service has begun since the node was spawned
    /// (each looks for a cluster to join, or promotes a learner): a test's proof that the
    /// service looked again.
    pub fn etcd_rounds(&self) -> usize {
        self.shared.etcd_rounds.load(Ordering::SeqCst)
    }

    /// How many times this worker has begun asking trustd for its certificate since the node
    /// was spawned: a test's proof that it tried again.
    pub fn trustd_attempts(&self) -> usize {
        self.shared.trustd_attempts.load(Ordering::SeqCst)
    }

    /// The Talos version it runs.
    pub fn talos_version(&self) -> String {
        self.shared.talos_version()
    }

    /// The hostname it runs with.
    pub async fn hostname(&self) -> String {
        self.node.lock().await.hostname()
    }

    /// The version its kubelet runs now (`v1.36.3`), as the kubelet reports it in its Node's
    /// `status.nodeInfo.kubeletVersion`: the tag of the running config's kubelet image
    /// (talos-facts §14.2); none before the node runs a config.
    pub async fn kubelet_version(&self) -> Option<String> {
        self.node.lock().await.kubelet_version()
    }

    /// The id of the etcd member in its data directory, if any.
    pub async fn etcd_member_id(&self) -> Option<u64> {
        self.node.lock().await.etcd.map(|d| d.member)
    }

    /// How many keys the etcd keyspace of this node's cluster holds (what `talosctl etcd
    /// snapshot` reports as total keys), if the node has a member.
    pub async fn etcd_keys(&self) -> Option<usize> {
        let cluster = self.node.lock().await.etcd?.cluster;
        let keyspace = Arc::clone(&network().cluster(cluster)?.keyspace);
        Some(keyspace.summary().keys)
    }

    /// Makes the etcd keyspace of this node's cluster about `bytes` large (the same cluster's
    /// objects, more or fewer applications; keys written with [`SimNode::etcd_put`] stay on
    /// top): a test's Kubernetes cluster growing. A keyspace restored from a snapshot keeps
    /// the snapshot's size: an error.
    pub async fn set_etcd_size(&self, bytes: u64) -> Result<(), SimError> {
        let cluster = self
            .node
            .lock()
            .await
            .etcd
            .ok_or_else(|| SimError::State("the node belongs to no bootstrapped cluster".into()))?
            .cluster;
        let mut net = network();
        let found = net
            .cluster_mut(cluster)
            .ok_or_else(|| SimError::State("the node's etcd cluster is gone".into()))?;
        let resized = found.keyspace.resized(bytes).ok_or_else(|| {
            SimError::State(
                "the etcd keyspace was restored from a snapshot: its size is the snapshot's".into(),
            )
        })?;
        found.keyspace = Arc::new(resized);
        Ok(())
    }

    /// Puts `key` = `value` into the etcd keyspace of this node's cluster through its member,
    /// as an etcd client (the Kubernetes API server) does: the next revision, which every
    /// member serves and every snapshot taken afterwards holds (the `key` bucket, in etcd's
    /// layout), and which a cluster recovered from such a snapshot has again. Returns the
    /// revision. Fails without a running, answering member, or without quorum.
    pub async fn etcd_put(
        &self,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
    ) -> Result<i64, SimError> {
        let revision = self
            .etcd_write(key.as_ref(), Some(value.as_ref().to_vec()))
            .await?;
        revision.ok_or_else(|| SimError::State("the put wrote no revision".into()))
    }

    /// Deletes `key` from the etcd keyspace of this node's cluster through its member: a
    /// tombstone at the next revision. Returns whether the key was there (deleting nothing
    /// writes no revision, as in etcd). Fails as [`SimNode::etcd_put`] does.
    pub async fn etcd_delete(&self, key: impl AsRef<[u8]>) -> Result<bool, SimError> {
        Ok(self.etcd_write(key.as_ref(), None).await?.is_some())
    }

    /// The value of `key` in the etcd keyspace of this node's cluster, read through its member
    /// (a linearizable read: quorum needed), or `None` when the key is not there. The
    /// simulated Kubernetes objects are there too, e.g. `/registry/namespaces/default`.
    pub async fn etcd_get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>, SimError> {
        let data = self.etcd_member().await?;
        let keyspace = serving_keyspace(data)?;
        let key = key.as_ref().to_vec();
        tokio::task::spawn_blocking(move || keyspace.get(&key))
            .await
            .map_err(|e| SimError::State(format!("the read did not finish: {e}")))
    }

    /// The node's member, when it runs and answers.
    async fn etcd_member(&self) -> Result<EtcdData, SimError> {
        let node = self.node.lock().await;
        configured::answering_member(&node).map_err(|s| SimError::State(s.message().to_owned()))
    }

    /// A put (`Some`) or a delete (`None`) through the node's member; the revision written, if
    /// any.
    async fn etcd_write(
        &self,
        key: &[u8],
        value: Option<Vec<u8>>,
    ) -> Result<Option<i64>, SimError> {
        let data = self.etcd_member().await?;
        loop {
            let before = serving_keyspace(data)?;
            let (key, value, from) = (key.to_vec(), value.clone(), Arc::clone(&before));
            let changed = tokio::task::spawn_blocking(move || from.with_change(&key, value))
                .await
                .map_err(|e| SimError::State(format!("the write did not finish: {e}")))?;
            let Some((after, revision)) = changed else {
                return Ok(None);
            };
            let mut net = network();
            let cluster = net
                .serving_cluster(data.cluster, data.member)
                .map_err(|down| {
                    SimError::State(configured::etcd_down(&down).message().to_owned())
                })?;
            // Another write went first: write on top of it.
            if Arc::ptr_eq(&cluster.keyspace, &before) {
                cluster.keyspace = Arc::new(after);
                return Ok(Some(revision));
            }
        }
    }

    /// The snapshot uploaded with `EtcdRecover` that the node keeps, if any.
    pub async fn etcd_recovery_snapshot(&self) -> Option<RecoverySnapshot> {
        let kept = Arc::clone(self.node.lock().await.etcd_recovery.as_ref()?);
        let verdict =
            |skip| snapshot::restore::verdict(&kept, skip).map_err(|failure| failure.error);
        Some(RecoverySnapshot {
            size: kept.len() as u64,
            restorable: verdict(false),
            restorable_skipping_hash: verdict(true),
        })
    }

    /// The etcd cluster this node's member belongs to, as the network sees it right now:
    /// `(voters, voters answering)` — a test's quorum monitor. `None` without a member.
    pub async fn etcd_quorum_view(&self) -> Option<(usize, usize)> {
        let cluster = self.node.lock().await.etcd?.cluster;
        let net = network();
        let found = net.cluster(cluster)?;
        let voters: Vec<_> = found.members.iter().filter(|m| !m.learner).collect();
        let alive = voters.iter().filter(|m| net.alive(cluster, m)).count();
        Some((voters.len(), alive))
    }
}

/// The keyspace `data`'s cluster serves, when the member is in it and it has quorum.
fn serving_keyspace(data: EtcdData) -> Result<Arc<snapshot::keyspace::Keyspace>, SimError> {
    let mut net = network();
    let cluster = net
        .serving_cluster(data.cluster, data.member)
        .map_err(|down| SimError::State(configured::etcd_down(&down).message().to_owned()))?;
    Ok(Arc::clone(&cluster.keyspace))
}

impl Node {
    /// Why this install attempt's installer fails, if it does: its image cannot be pulled (an
    /// installer of the factory's whose schematic it does not know: Talos's install pulls with
    /// go-retry and five not-found retries, then fails with the pull's error in go-retry's
    /// error set, talos-facts §9.10; here at once), or [`Fault::InstallFails`].
    pub(crate) fn installer_failure(&self, image: &str) -> Option<String> {
        let image = default_installer(image, &self.talos_version);
        if let Some(error) = self.factory.pull_error(&image) {
            return Some(format!("1 error(s) occurred:\n\t{error}"));
        }
        self.shared
            .install_fails
            .load(Ordering::SeqCst)
            .then(|| INSTALLER_FAILED.to_owned())
    }

    /// Records the installer an install completed with (its extensions are the node's).
    pub(crate) fn record_installer(&mut self, image: &str) {
        self.installer = Some(default_installer(image, &self.talos_version));
    }

    /// Detaches the machine's disks (all but CD-ROMs), or attaches them again; attaching is a
    /// disk change a pending unattended install looks at again (`this`: the node, for it).
    pub(crate) fn detach_disks(&mut self, detach: bool, this: Weak<Mutex<Node>>) {
        if detach {
            let (cdroms, disks) = std::mem::take(&mut self.hardware.disks)
                .into_iter()
                .partition(|d| d.cdrom);
            self.hardware.disks = cdroms;
            let disks: Vec<SimDisk> = disks;
            self.detached.extend(disks);
        } else if !self.detached.is_empty() {
            let mut disks = std::mem::take(&mut self.detached);
            disks.append(&mut self.hardware.disks);
            self.hardware.disks = disks;
            maintenance::resume_unattended(self, this);
        }
    }

    /// Whether an install holds the boot: 1.13's install task runs, or 1.14's unattended
    /// install runs, waits for a disk (talos-facts §11.7) or, failed, waits for its next
    /// attempt (the CRI waits for phase `installed`: `system/services/cri.go`
    /// `CRI.Condition`, `resources/runtime/condition.go` `UnattendedInstallCondition`).
    pub(crate) fn install_pending(&self) -> bool {
        self.installing
            || matches!(
                self.unattended,
                Some((
                    _,
                    InstallPhase::Pending | InstallPhase::Failed | InstallPhase::Installing
                ))
            )
    }

    /// The unattended-install status's `error`: why a pending install waits, or the
    /// installer's error when failed (`controllers/runtime/unattended_install.go` `setStatus`
    /// writes `err.Error()`, and clears it in every other phase).
    pub(crate) fn unattended_error(&self, phase: InstallPhase) -> String {
        match phase {
            InstallPhase::Pending => apply::PENDING_REASON.to_owned(),
            InstallPhase::Failed => self.install_failure.clone().unwrap_or_default(),
            _ => String::new(),
        }
    }

    /// Whether Bootstrap is available as far as this boot goes: the CRI is up (the not-ready
    /// window after boot has passed) and no unattended install holds it (talos-facts §5,
    /// §11.7).
    pub(crate) fn bootstrap_available(&self) -> bool {
        self.booted_at.elapsed() >= self.timings.bootstrap_window && !self.install_pending()
    }

    /// The hostname: configured, or derived from the hardware as Talos derives a stable
    /// default one.
    pub(crate) fn hostname(&self) -> String {
        self.running
            .as_ref()
            .or(self.persisted.as_ref())
            .and_then(|c| c.hostname.clone())
            .unwrap_or_else(|| {
                let tail: String = self
                    .hardware
                    .uuid
                    .chars()
                    .filter(char::is_ascii_alphanumeric)
                    .skip(25)
                    .collect();
                format!("talos-{tail}")
            })
    }

    /// Boots from what is on disk. A power-on starts machined afresh: a new event log, boot
    /// id and services, and the initialize sequence (talos-facts §10.3); a config applied in
    /// maintenance continues the same boot.
    pub(crate) async fn boot(&mut self, this: Weak<Mutex<Node>>) -> Result<(), SimError> {
        // A boot that lost a race with another (a power-on during a reboot's down time) finds
        // the machine running: nothing to do.
        if !self.powered || self.server.is_some() {
            return Ok(());
        }
        self.halted = false;
        // A boot through the firmware (a power-on, a reboot that is no kexec) may start from
        // the BMC's virtual CD (the `bmc` module).
        let through_firmware = !std::mem::take(&mut self.kexec) && self.fresh;
        let cd = if through_firmware {
            bmc::boot_device(self)
        } else {
            None
        };
        match &cd {
            Some(iso) if !bmc::boot_from(self, iso) => return Ok(()),
            None if self.bricked => return Ok(()),
            _ => {}
        }
        let fresh = std::mem::take(&mut self.fresh);
        // A config that lived in memory only is gone after a power-on (no STATE partition):
        // the machine is in maintenance mode again.
        if fresh && std::mem::take(&mut self.config_in_memory) && !self.installed {
            self.persisted = None;
            self.unattended = None;
        }
        if fresh {
            // A power-on ends an install in progress with the boot it ran in.
            self.installing = false;
            self.events = Arc::new(events::EventLog::default());
            self.boot_id = sequences::uuid();
            self.shared
                .set_boot(Arc::clone(&self.events), self.boot_id.clone());
            self.services = services::Services::default();
            self.current_sequence.clear();
            self.last_status = None;
            if cd.is_none() {
                sequences::take_pending_version(self);
            }
        }
        self.booted_at = Instant::now();
        // The volume manager starts over: every volume is located again.
        self.user_volumes.clear();
        // The kubelet starts its static pods afresh.
        self.static_pods = kubelet::StaticPods::default();
        self.etcd_stopped = false;
        self.applying = false;
        self.stage = Stage::Booting;
        if let Some(staged) = self.staged.take() {
            self.persisted = Some(staged);
        }
        // The reboot the unattended install waited for has happened (talos-facts §8.2).
        if let Some((_, phase)) = &mut self.unattended
            && *phase == InstallPhase::WaitingForReboot
        {
            *phase = InstallPhase::Installed;
        }
        if fresh {
            self.initialize(self.persisted.is_some());
            if self.persisted.is_some() {
                self.install_skipped();
            }
        }
        self.tasks
            .push(tokio::spawn(services::observe(this.clone(), self.timings)));
        match self.persisted.clone() {
            None => {
                self.stage = Stage::Maintenance;
                self.serve(this, None).await
            }
            // 1.13's install sequence runs before the boot sequence: the configured API is up
            // (a worker's once trustd signs its certificate), stage `installing`
            // (`crates/ichor-sim/docs/install-failures.md`).
            Some(config) if self.installing => {
                self.stage = Stage::Installing;
                if config.is_control_plane() {
                    self.serve(this, Some(config)).await
                } else {
                    self.tasks
                        .push(tokio::spawn(configured::await_trustd(this, self.timings)));
                    Ok(())
                }
            }
            // A pending unattended install holds the boot: the API is up, services wait
            // (talos-facts §11.7).
            Some(config) if config.is_control_plane() && self.install_pending() => {
                self.serve(this, Some(config)).await
            }
            Some(config) if config.is_control_plane() => {
                self.boot_started();
                self.stage = Stage::Running;
                self.serve(this.clone(), Some(config)).await?;
                self.boot_finished();
                self.tasks
                    .push(tokio::spawn(configured::etcd_service(this, self.timings)));
                Ok(())
            }
            Some(_) => {
                // A worker's API needs a certificate from trustd first (talos-facts §5).
                self.boot_started();
                self.stage = Stage::Booting;
                self.tasks
                    .push(tokio::spawn(configured::await_trustd(this, self.timings)));
                Ok(())
            }
        }
    }

    /// The install that held the boot is done and no reboot follows: the boot sequence goes on
    /// where it waited, on the API already up (a control plane starts etcd; a worker still
    /// waiting for trustd goes on when it is signed).
    pub(crate) fn boot_on(&mut self, this: Weak<Mutex<Node>>) {
        let Some(config) = self.persisted.clone() else {
            return;
        };
        if config.is_control_plane() {
            self.boot_started();
            self.stage = Stage::Running;
            self.boot_finished();
            self.tasks
                .push(tokio::spawn(configured::etcd_service(this, self.timings)));
        } else if self.running.is_some() {
            self.stage = Stage::Running;
            self.boot_finished();
        }
    }

    /// Starts the API: maintenance mode without a config, mutual TLS with one. `issuer` is
    /// the OS CA certificate and key that sign the serving certificate (a worker's comes
    /// from trustd on a control plane).
    pub(crate) async fn serve(
        &mut self,
        this: Weak<Mutex<Node>>,
        config: Option<Arc<AppliedConfig>>,
    ) -> Result<(), SimError> {
        let issuer_key = match &config {
            Some(c) if c.os_ca_key.is_empty() => {
                let net = network();
                net.control_plane_at(&c.endpoint_host, &c.cluster_identity())
                    .and_then(|e| e.config.as_ref())
                    .map(|cp| cp.os_ca_key.clone())
                    .ok_or_else(|| SimError::State("no trustd reachable".into()))?
            }
            Some(c) => c.os_ca_key.clone(),
            None => String::new(),
        };
        self.serve_with(this, config, &issuer_key).await
    }

    async fn serve_with(
        &mut self,
        this: Weak<Mutex<Node>>,
        config: Option<Arc<AppliedConfig>>,
        issuer_key: &str,
    ) -> Result<(), SimError> {
        let addr = self.shared.addr;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Serve { addr, source })?;
        let (boot, client_auth) = match &config {
            None => (tls::boot_certificate()?, tls::ClientAuth::None),
            Some(c) => {
                let mut cas = vec![c.os_ca_crt.clone()];
                cas.extend(c.accepted_cas.iter().cloned());
                (
                    tls::node_certificate(&c.os_ca_crt, issuer_key, addr.ip())?,
                    tls::ClientAuth::Required(cas),
                )
            }
        };
        if let Ok(mut fingerprint) = self.shared.fingerprint.lock() {
            fingerprint.clone_from(&boot.fingerprint);
        }
        self.certificate = Some(boot.der);
        let resolver = Arc::new(tls::Resolver::new(boot.certified));
        self.resolver = Some(Arc::clone(&resolver));

        let (incoming, accept) = tls::incoming(
            listener,
            resolver,
            client_auth,
            self.shared.controls.cut_off(),
        )?;
        let shared = Arc::clone(&self.shared);
        let (cosi, boot) = cosi::Cosi::new(this.clone(), Arc::clone(&shared), config.is_none());
        self.cosi = Some(boot);
        let cosi = StateServer::new(cosi);
        let storage = StorageServiceServer::new(storage::Storage {
            node: this.clone(),
            maintenance: config.is_none(),
        });
        let routes = match &config {
            None => Routes::new(MachineServiceServer::new(maintenance::Maintenance {
                shared: Arc::clone(&shared),
                node: this.clone(),
            })),
            Some(_) => Routes::new(MachineServiceServer::new(configured::Configured {
                shared: Arc::clone(&shared),
                node: this.clone(),
            })),
        }
        .add_service(cosi)
        .add_service(storage)
        .add_service(LifecycleServiceServer::new(lifecycle::Lifecycle {
            node: this.clone(),
        }))
        .add_service(ImageServiceServer::new(lifecycle::Images {
            node: this.clone(),
        }));
        self.running.clone_from(&config);
        let hostname = self.hostname();
        let controlled = Controlled {
            routes,
            shared: Arc::clone(&shared),
            forwarding: config.is_some(),
            names: Arc::new(vec![addr.ip().to_string(), hostname.clone()]),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let handle = tokio::spawn(Server::builder().serve_with_incoming_shutdown(
            controlled.clone(),
            incoming,
            async {
                let _ = stop_rx.await;
            },
        ));
        self.server = Some((stop_tx, handle, accept));
        if let Some(data) = self
            .etcd
            .filter(|_| config.as_ref().is_some_and(|c| c.is_control_plane()))
        {
            self.shared
                .etcd_running
                .store(data.cluster, Ordering::SeqCst);
        }
        self.shared.serving.store(true, Ordering::SeqCst);
        if let Some(entry) = network().nodes.get_mut(&addr) {
            entry.hostname = hostname;
            entry.forward = config.as_ref().map(|_| controlled);
            entry.config = config;
        }
        Ok(())
    }

    /// Stops everything of this boot; what is on disk stays. The event streams end, and the
    /// next boot is a power-on unless it continues this one.
    pub(crate) async fn shut_down(&mut self) {
        // Watches see the stage the node goes down in, then end: the server could not stop
        // gracefully while they stream.
        if let Some(boot) = self.cosi.take() {
            boot.end(self);
        }
        self.events.disconnect();
        self.fresh = true;
        for task in self.tasks.drain(..) {
            task.abort();
        }
        self.shared.serving.store(false, Ordering::SeqCst);
        self.shared.etcd_running.store(0, Ordering::SeqCst);
        if let Some(entry) = network().nodes.get_mut(&self.shared.addr) {
            entry.config = None;
            entry.forward = None;
        }
        self.running = None;
        if let Some((stop, mut handle, accept)) = self.server.take() {
            accept.abort();
            let _ = accept.await;
            let _ = stop.send(());
            // A call still waiting for this node's lock (held here) would hold the graceful
            // stop forever: after a while the server is dropped, its clients told to go away.
            if tokio::time::timeout(Duration::from_secs(5), &mut handle)
                .await
                .is_err()
            {
                tracing::warn!(addr = %self.shared.addr, "calls still in flight at shutdown were dropped");
                handle.abort();
            }
        }
    }

    /// Reboots by itself after `delay` (an apply in REBOOT mode, the reboot after 1.14's
    /// unattended install): the reboot sequence with no actor, down, and back after the
    /// reboot time (talos-facts §10.3).
    pub(crate) fn reboot_later(node: Weak<Mutex<Node>>, delay: Duration) {
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let Some(strong) = node.upgrade() else { return };
            let mut guard = strong.lock().await;
            let plan = sequences::Plan::reboot(
                ichor_talos::api::machine::reboot_request::Mode::Default,
                guard.installed,
            );
            guard.go_down(node.clone(), "", &plan).await;
        });
    }

    /// Goes down at once and comes back after the reboot time, its sequence already
    /// published (1.13's install sequence ends in its own reboot).
    pub(crate) async fn restart(&mut self, node: Weak<Mutex<Node>>) {
        self.stage = Stage::Rebooting;
        self.shut_down().await;
        // The install sequence reboots by kexec (talos-facts §5).
        self.kexec = true;
        sequences::boot_after(node, self.timings.reboot);
    }

    fn inject_certificate(&mut self, fault: Fault) -> Result<String, SimError> {
        let resolver = self
            .resolver
            .as_ref()
            .ok_or_else(|| SimError::TlsSetup("the node is not running".into()))?;
        match fault {
            Fault::MismatchedKey => {
                let der = self
                    .certificate
                    .as_ref()
                    .ok_or_else(|| SimError::TlsSetup("no boot certificate".into()))?;
                resolver.set(tls::Resolver::mismatched(der)?);
                Ok(self.shared.fingerprint())
            }
            _ => {
                let other = tls::boot_certificate()?;
                resolver.set(other.certified);
                Ok(other.fingerprint)
            }
        }
    }
}
