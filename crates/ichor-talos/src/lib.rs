//! The Talos API client: pinned maintenance-mode and mTLS connections to port 50000, typed
//! operations returning domain types, COSI resource reads, and the discovery sweep.
//!
//! This crate knows nothing of Kubernetes. [`api`] holds the code generated from `proto/`.
#![forbid(unsafe_code)]

pub mod client;
pub mod discovery;
pub mod ops;
pub mod resources;
pub mod tls;

pub use client::{Applied, ApplyMode, Credentials, TalosClient, TalosError};
pub use ops::{Bootstrapped, EtcdMember, EtcdStatus, ResetOptions, Service};
pub use resources::{Inventory, MachineStatus, Stage, UnattendedInstall};

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
