//! The validating admission webhook: refuses unsafe TalosMachine and TalosCluster deletes and
//! updates at the door by applying `ichor-deleteguard` to live state, and manages its own CA and
//! serving certificates.
#![forbid(unsafe_code)]
