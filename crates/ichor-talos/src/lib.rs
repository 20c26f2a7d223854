//! The Talos API client: pinned maintenance-mode and mTLS connections to port 50000, typed
//! operations returning domain types, COSI resource reads, and the discovery sweep.
//!
//! This crate knows nothing of Kubernetes.
#![forbid(unsafe_code)]

/// The TCP port on which every Talos node serves its API (apid, or the maintenance service).
pub const TALOS_API_PORT: u16 = 50000;
