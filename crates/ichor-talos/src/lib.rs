//! A client for the Talos Linux API (port 50000), for tools that drive Talos nodes: a
//! certificate-pinned connection to nodes in maintenance mode, mutual-TLS connections to
//! configured nodes, typed operations that return domain types, COSI resource reads, and a
//! discovery sweep that finds maintenance-mode nodes.
//!
//! # What it offers
//!
//! - [`TalosClient::connect_maintenance`]: a node in maintenance mode presents a self-signed
//!   certificate regenerated on every boot, so the only trust is its pinned fingerprint
//!   ([`fingerprint_der`], the value `talosctl --cert-fingerprint` takes). Another certificate
//!   is refused with [`TalosError::FingerprintMismatch`], which carries the one it showed.
//! - [`TalosClient::connect`]: mutual TLS with [`Credentials`] (the OS CA, and a client
//!   certificate whose Organization carries the role), and [`TalosClient::for_node`] to have
//!   an endpoint forward calls to another node.
//! - Typed operations: [`version`](TalosClient::version),
//!   [`apply_configuration`](TalosClient::apply_configuration) with an explicit [`ApplyMode`],
//!   [`inventory`](TalosClient::inventory) (SMBIOS, disks, links),
//!   [`machine_status`](TalosClient::machine_status),
//!   [`unattended_install`](TalosClient::unattended_install),
//!   [`user_volumes`](TalosClient::user_volumes),
//!   [`bootstrap`](TalosClient::bootstrap), etcd membership, status, snapshot and defragment,
//!   etcd recovery ([`etcd_recover_from`](TalosClient::etcd_recover_from) streams a snapshot up,
//!   [`bootstrap_recover`](TalosClient::bootstrap_recover) restores from it),
//!   [`reset`](TalosClient::reset), [`reboot`](TalosClient::reboot),
//!   [`upgrade`](TalosClient::upgrade), [`wipe`](TalosClient::wipe),
//!   [`services`](TalosClient::services), [`hostname`](TalosClient::hostname),
//!   [`sequence_failures`](TalosClient::sequence_failures) and
//!   [`install_failure`](TalosClient::install_failure) (this boot's failed sequences, from the
//!   event log).
//! - [`discovery`]: sweep IPv4 ranges for maintenance-mode nodes and read each one's
//!   fingerprint, version and hardware without writing anything.
//! - [`Limits`]: how long each method may take, overridable per client
//!   ([`TalosClient::with_limits`]); [`progress`]: what long calls report while they run, to
//!   `tracing` and to a caller's callback (`*_with_progress`).
//! - [`TalosError`]: one error type naming the endpoint and the RPC; [`TalosError::code`] gives
//!   the gRPC code to decide on, never the message text.
//! - [`api`]: the tonic clients and messages generated from this repository's `proto/` (the
//!   subset of Talos's API Ichor uses), for calls with no typed wrapper
//!   ([`TalosClient::channel`]).
//!
//! # Quick start
//!
//! Against a simulated node (`ichor-sim`, the test double this crate's own tests use), read a
//! maintenance-mode node and apply a config rendered by `ichor-render`:
//!
//! ```
//!
//! use ichor_talos::{ApplyMode, Stage, TalosClient};
//!
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A node booted into maintenance mode, on a free loopback port.
//! let node = ichor_sim::SimNode::start("127.0.0.1:0".parse()?, "v1.14.1").await?;
//! // The fingerprint comes from the node's console, `talosctl`, or `discovery::probe`.
//! let fingerprint = node.fingerprint();
//!
//! let client = TalosClient::connect_maintenance(&node.addr().to_string(), &fingerprint).await?;
//! assert_eq!(client.version().await?, "v1.14.1");
//! let inventory = client.inventory().await?;
//! let disk = inventory.disks.iter().find(|d| !d.cdrom).expect("an install disk");
//! assert_eq!(disk.dev_path, "/dev/vda");
//! assert_eq!(client.machine_status().await?.stage, Stage::Maintenance);
//!
//! // Render a control plane's config for that disk and apply it.
//! let cluster = serde_json::from_value(serde_json::json!({
//!     "talosVersion": "v1.14.1",
//!     "kubernetesVersion": "1.36.3",
//!     "endpoint": "https://127.0.0.1:6443",
//!     "controlPlane": {"count": 1},
//! }))?;
//! let bundle = ichor_render::SecretsBundle::generate(ichor_render::Contract::V1_14)?;
//! let install = ichor_api::common::InstallSpec {
//!     disk: Some(disk.dev_path.clone()),
//!     ..Default::default()
//! };
//! let config = ichor_render::render(&ichor_render::RenderInput {
//!     hostname: Some("cp-1"),
//!     install: Some(&install),
//!     ..ichor_render::RenderInput::plain(
//!         "lab",
//!         &cluster,
//!         ichor_api::common::Role::ControlPlane,
//!         &bundle,
//!     )
//! })?;
//! let applied = client
//!     .apply_configuration(config.yaml.as_bytes(), ApplyMode::NoReboot)
//!     .await?;
//! assert_eq!(applied.mode, "NO_REBOOT");
//! // The node now installs and reboots into configured mode: from there on it is reached
//! // with `TalosClient::connect` and credentials minted from the bundle's OS CA.
//! node.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! # What it does not do
//!
//! - **Nothing of Kubernetes.** No Kubernetes client or types; it talks to Talos only.
//! - **No rendering and no secrets.** It sends the config bytes it is given; rendering a
//!   config, generating a bundle and minting client certificates are `ichor-render`'s. It does
//!   not read talosconfig files: build [`Credentials`] from PEM.
//! - **No retries or backoff**, except [`TalosClient::bootstrap`] waiting out the documented
//!   not-ready window: the caller decides what is transient. Each connect is limited to 10 s
//!   in all (TCP, TLS, HTTP/2); each call to its method's [`Limits`] (10 s for reads, minutes
//!   for a defragment, a pull or an upgrade, an idle limit only for a snapshot stream).
//! - **One node per call.** Replies that Talos wraps per node are read for exactly one node
//!   (the endpoint, or the [`for_node`](TalosClient::for_node) target), and a per-node error
//!   in the reply is an error, never a silent success; there is no fan-out to many nodes.
//! - **A subset of the API.** Only the services and messages in `proto/` (machine, lifecycle,
//!   image, storage, COSI state reads); no log or event streams, no file access, no
//!   interactive dashboards. Talos v1.13 and v1.14 are what it is tested against.
//! - **No trust on first use of its own.** [`TalosClient::connect_maintenance`] needs the
//!   pin; only [`discovery`] connects without one, to read and report what it saw.
#![forbid(unsafe_code)]

pub mod client;
pub mod decode;
pub mod discovery;
pub mod error;
pub mod kubernetes;
pub mod limits;
pub mod ops;
pub mod progress;
pub mod resources;
pub mod snapshot;
pub mod tls;

pub use client::{Applied, ApplyMode, Credentials, TalosClient, TalosError};
pub use error::{ApplyRefusal, Category};
pub use kubernetes::{ContainerState, ControlPlaneComponent, Manifest, StaticPodStatus};
pub use limits::{Limit, LimitKind, Limits};
pub use ops::{Bootstrapped, EtcdMember, EtcdStatus, ResetOptions, SequenceFailure, Service};
pub use progress::{LayerProgress, LayerStatus, Progress};
pub use resources::{
    Extension, Inventory, MachineStatus, SCHEMATIC_EXTENSION, Stage, UnattendedInstall,
    UserVolumeStatus,
};
pub use snapshot::{SnapshotCheck, SnapshotProblem, SnapshotSummary};
pub use tls::{NotACertificate, fingerprint_der, fingerprint_pem};

/// The TCP port on which every Talos node serves its API (apid, or the maintenance service).
pub const TALOS_API_PORT: u16 = 50000;

/// Code generated from `proto/`: messages, tonic clients and servers.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod api {
    /// Talos common types.
    pub mod common {
        tonic::include_proto!("common");
    }
    /// `machine.MachineService`, `LifecycleService` and `ImageService`.
    pub mod machine {
        tonic::include_proto!("machine");
    }
    /// `storage.StorageService`.
    pub mod storage {
        tonic::include_proto!("storage");
    }
    /// `google.rpc.Status`.
    pub mod google {
        /// `google.rpc`.
        pub mod rpc {
            tonic::include_proto!("google.rpc");
        }
    }
    /// Specs of Talos's COSI resources (`talos.resource.definitions.*`, `resource.config`).
    pub mod resource {
        /// `resource.config`: the machine config and machine type specs.
        pub mod config {
            tonic::include_proto!("resource.config");
        }
        /// `talos.resource.definitions`.
        pub mod definitions {
            /// `talos.resource.definitions.block`.
            pub mod block {
                tonic::include_proto!("talos.resource.definitions.block");
            }
            /// `talos.resource.definitions.cluster`.
            pub mod cluster {
                tonic::include_proto!("talos.resource.definitions.cluster");
            }
            /// `talos.resource.definitions.enums`.
            pub mod enums {
                tonic::include_proto!("talos.resource.definitions.enums");
            }
            /// `talos.resource.definitions.etcd`.
            pub mod etcd {
                tonic::include_proto!("talos.resource.definitions.etcd");
            }
            /// `talos.resource.definitions.extensions`.
            pub mod extensions {
                tonic::include_proto!("talos.resource.definitions.extensions");
            }
            /// `talos.resource.definitions.hardware`.
            pub mod hardware {
                tonic::include_proto!("talos.resource.definitions.hardware");
            }
            /// `talos.resource.definitions.k8s`.
            pub mod k8s {
                tonic::include_proto!("talos.resource.definitions.k8s");
            }
            /// `talos.resource.definitions.network`.
            pub mod network {
                tonic::include_proto!("talos.resource.definitions.network");
            }
            /// `talos.resource.definitions.runtime`.
            pub mod runtime {
                tonic::include_proto!("talos.resource.definitions.runtime");
            }
        }
    }
    /// COSI (`cosi.resource.State`).
    pub mod cosi {
        /// `cosi.resource`.
        pub mod resource {
            tonic::include_proto!("cosi.resource");
            /// `cosi.resource.meta`: namespaces and resource definitions.
            pub mod meta {
                tonic::include_proto!("cosi.resource.meta");
            }
        }
    }
}

// The resource specs sit one module level above their package path (`api::resource` for
// `talos.resource`), so the generated code of `talos.resource.definitions.*` finds the
// `common` package at the crate root.
use api::common;

/// The encoded `FileDescriptorSet` of `proto/`, for the conformance check against Talos.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ichor_talos_descriptor.bin"));
