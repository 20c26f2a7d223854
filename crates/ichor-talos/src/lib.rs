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
    /// Specs of Talos's COSI resources (`talos.resource.definitions.*`).
    pub mod resource {
        /// `talos.resource.definitions`.
        pub mod definitions {
            /// `talos.resource.definitions.enums`.
            pub mod enums {
                tonic::include_proto!("talos.resource.definitions.enums");
            }
            /// `talos.resource.definitions.hardware`.
            pub mod hardware {
                tonic::include_proto!("talos.resource.definitions.hardware");
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
        }
    }
}

/// The encoded `FileDescriptorSet` of `proto/`, for the conformance check against Talos.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/ichor_talos_descriptor.bin"));
