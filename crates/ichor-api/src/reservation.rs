//! Control-plane removals the webhook admitted and the controller has not finished, kept in the
//! TalosCluster annotation `ichor.maesh.dev/removal-reservations` (ADR 0007). The webhook writes
//! them; the manager drops one when its removal completes.

use serde::{Deserialize, Serialize};

use crate::TalosCluster;
use crate::names::annotations;

/// One admitted removal not finished yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    /// The TalosMachine's name.
    pub machine: String,
    /// Its uid (a recreated machine of the same name is another machine).
    pub uid: String,
    /// When it was admitted (Unix seconds).
    pub at: u64,
}

/// Reads the reservations on a TalosCluster; an unreadable value counts as none (and is
/// replaced on the next write).
pub fn reservations(cluster: &TalosCluster) -> Vec<Reservation> {
    cluster
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::REMOVAL_RESERVATIONS))
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or_default()
}

/// The annotation value for `reservations`.
pub fn annotation_value(reservations: &[Reservation]) -> String {
    serde_json::to_string(reservations).unwrap_or_else(|_| "[]".into())
}
