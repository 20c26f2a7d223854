//! Conditions on status: set one, keeping its transition time when its status did not change.

use ichor_api::common::{Condition, ConditionStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Sets condition `type_` in `conditions`; `now` (from the context's clock) becomes
/// its transition time if its status changes.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    holds: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: &Time,
) {
    let status = if holds {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status {
                now.clone_into(&mut existing.last_transition_time);
            }
            existing.status = status;
            reason.clone_into(&mut existing.reason);
            existing.message = message;
            existing.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message,
            last_transition_time: now.clone(),
            observed_generation: generation,
        }),
    }
}

/// Whether condition `type_` is true.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
}
