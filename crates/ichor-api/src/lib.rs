//! Ichor's Kubernetes API: the custom resource types (`TalosCluster`, `TalosMachine`,
//! `TalosOperation`, `TalosStorage`, `TalosMachineClass`), the one home of every annotation,
//! label, finalizer, condition type and reason, and the CEL rules the apiserver enforces.
//!
//! This crate knows nothing of a Kubernetes client or the network: it only describes the API.
#![forbid(unsafe_code)]

/// The API group of every Ichor resource.
pub const GROUP: &str = "ichor.maesh.dev";

/// The API version served for every Ichor resource.
pub const VERSION: &str = "v1alpha1";
