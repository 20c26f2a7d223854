//! Pure deletion-safety rules: etcd quorum, the last control plane, the declared control-plane
//! count, the allow-delete annotation, and the approval/role lock of applied machines.
//!
//! Functions over plain inputs; no Kubernetes client, no network. Used by the admission webhook
//! and rechecked by the controller inside the cluster lock.
#![forbid(unsafe_code)]
