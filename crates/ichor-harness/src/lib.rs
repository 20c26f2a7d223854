//! The end-to-end harness: a target abstraction (simulated, real cluster, QEMU) and one spec set
//! that every target runs.
#![forbid(unsafe_code)]
