//! Pure rendering: Talos secrets bundles, PKI helpers, machine-config documents per role and
//! version contract, patches, and client credentials (talosconfig, workload kubeconfig).
//!
//! Same inputs, same bytes. This crate does no I/O and knows nothing of Kubernetes or the network.
#![forbid(unsafe_code)]
