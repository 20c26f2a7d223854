//! The Ichor controller: discovery, approval-gated apply, install, the one bootstrap, readiness,
//! the cluster lock, safe removal and day-2 operations, composed from the other crates.
#![forbid(unsafe_code)]
