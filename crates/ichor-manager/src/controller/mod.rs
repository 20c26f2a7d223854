//! The five controllers, one folder each: the reconcile handed to `Controller::run` in its
//! `mod.rs`, its pure decisions in `plan.rs`, and a flow with recorded steps (adoption,
//! restore, removal) in a folder of the same shape below it.

pub mod backup;
pub mod cluster;
pub mod machine;
pub mod operation;
pub mod storage;
