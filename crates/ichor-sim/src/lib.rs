//! A Talos node simulator speaking the same gRPC API as real nodes, for tests and the local
//! demo: maintenance mode, install, reboot, mTLS, etcd membership derived from applied configs,
//! fault injection and gates. Every behaviour follows `talos-facts.md`.
#![forbid(unsafe_code)]
