//! Inputs the unit tests of several modules share.

use crate::model::Machine;

/// `n` approved, healthy control planes `cp-1`…`cp-n` with applied configs and the
/// allow-delete annotation, in namespace `infra`.
pub(crate) fn control_planes(n: usize) -> Vec<Machine> {
    (1..=n)
        .map(|i| {
            Machine::new(format!("cp-{i}"))
                .in_namespace("infra")
                .control_plane()
                .approved()
                .config_applied()
                .allowing_delete()
                .healthy()
        })
        .collect()
}
