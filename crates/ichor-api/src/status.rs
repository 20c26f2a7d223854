//! Status groups (ADR 0020): each field manager's part of a kind's status is a struct with the
//! manager's name beside it ([`Group::MANAGER`]), flattened into the status, so the JSON reads
//! as if its fields were the status's own. A writer applies one group whole; the conditions are
//! one list-map keyed by type that the groups share, each group owning its condition types
//! ([`Group::CONDITIONS`]).
//!
//! This module only describes the groups; writing them is the manager's.

use serde::Serialize;
use serde_json::Value;

use crate::common::Condition;
use crate::names::{conditions, field_managers as fm};

/// The condition types a group owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// None.
    None,
    /// Only these types.
    Only(&'static [&'static str]),
    /// Every type no other group of the kind names.
    Rest,
}

/// A field manager's part of status `S`: a struct flattened into `S` (or one with no fields,
/// owning conditions only), applied whole by that manager.
pub trait Group<S>: Serialize + schemars::JsonSchema {
    /// The field manager that applies it.
    const MANAGER: &'static str;
    /// The condition types it owns.
    const CONDITIONS: Owned;
    /// Its part of `status`.
    fn of(status: &S) -> &Self;
}

/// One group of status `S`, its type erased: its manager, its conditions, and its fields.
#[derive(Debug)]
pub struct Part<S> {
    /// The field manager.
    pub manager: &'static str,
    /// The condition types it owns.
    pub conditions: Owned,
    /// Its fields as JSON (an object; `{}` for a group with none set).
    pub fields: fn(&S) -> Value,
    /// The names of its fields (JSON), as its schema lists them.
    pub names: fn() -> Vec<String>,
}

impl<S> Clone for Part<S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Part<S> {}

impl<S> Part<S> {
    /// Group `G` of `S`.
    pub const fn of<G: Group<S>>() -> Self {
        Self {
            manager: G::MANAGER,
            conditions: G::CONDITIONS,
            fields: fields_of::<S, G>,
            names: names_of::<S, G>,
        }
    }

    /// Whether a condition of `type_` is this group's, among `parts` (its kind's groups).
    pub fn owns(&self, parts: &[Part<S>], type_: &str) -> bool {
        match self.conditions {
            Owned::None => false,
            Owned::Only(types) => types.contains(&type_),
            Owned::Rest => !parts.iter().any(|p| match p.conditions {
                Owned::Only(types) => types.contains(&type_),
                _ => false,
            }),
        }
    }
}

fn fields_of<S, G: Group<S>>(status: &S) -> Value {
    serde_json::to_value(G::of(status)).unwrap_or_else(|_| Value::Object(Default::default()))
}

fn names_of<S, G: Group<S>>() -> Vec<String> {
    let schema = schemars::schema_for!(G);
    schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// A status written in groups.
pub trait Grouped: Sized + 'static {
    /// Its groups: every field in exactly one, and one taking the conditions no other names.
    const GROUPS: &'static [Part<Self>];
    /// Its conditions, which its groups share by type.
    fn conditions(&self) -> &[Condition];
}

/// `ReconcilePanicked`, in every kind's status: written where a panicking reconcile is caught,
/// so no other group sends or clears it. No fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Panicked {}

impl<S> Group<S> for Panicked {
    const MANAGER: &'static str = fm::RECONCILE_PANIC;
    const CONDITIONS: Owned = Owned::Only(&[conditions::RECONCILE_PANICKED]);
    fn of(_: &S) -> &Self {
        &Panicked {}
    }
}

/// Declares the [`Group`] of `$status` that struct `$group` (its field `$field`) is.
macro_rules! group {
    ($group:ty, $status:ty, $field:ident, $manager:expr, $conditions:expr) => {
        impl $crate::status::Group<$status> for $group {
            const MANAGER: &'static str = $manager;
            const CONDITIONS: $crate::status::Owned = $conditions;
            fn of(status: &$status) -> &Self {
                &status.$field
            }
        }
    };
}
pub(crate) use group;

/// Declares `$status` [`Grouped`] in `$groups` (plus [`Panicked`]).
macro_rules! grouped {
    ($status:ty, [$($group:ty),* $(,)?]) => {
        impl $crate::status::Grouped for $status {
            const GROUPS: &'static [$crate::status::Part<Self>] = &[
                $($crate::status::Part::of::<$group>(),)*
                $crate::status::Part::of::<$crate::status::Panicked>(),
            ];
            fn conditions(&self) -> &[$crate::common::Condition] {
                &self.conditions
            }
        }
    };
}
pub(crate) use grouped;

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;
    use crate::class::TalosMachineClassStatus;
    use crate::cluster::TalosClusterStatus;
    use crate::machine::TalosMachineStatus;
    use crate::operation::TalosOperationStatus;
    use crate::storage::TalosStorageStatus;

    const AT: &str = "2026-01-01T00:00:00Z";

    fn condition(type_: &str) -> Value {
        json!({"type": type_, "status": "True", "reason": "R", "message": "m", "lastTransitionTime": AT})
    }

    /// `wire`, read into `S` and written back: every field kept, under its own name.
    fn round_trip<S: DeserializeOwned + Serialize>(wire: &Value) -> S {
        let status: S = serde_json::from_value(wire.clone()).expect("reads");
        assert_eq!(&serde_json::to_value(&status).expect("writes"), wire);
        status
    }

    #[test]
    fn a_machine_status_in_groups_reads_and_writes_the_json_it_did_before() {
        let wire = json!({
            "phase": "Ready",
            "conditions": [condition("Ready"), condition("FingerprintChanged")],
            "observedGeneration": 3,
            "address": "10.0.0.1",
            "observedFingerprint": "fp",
            "talosVersion": "v1.14.1",
            "hardware": {"uuid": "u-1"},
            "nodeName": "n-1",
            "etcdMemberId": "0123456789abcdef",
            "etcd": {"voter": true, "healthy": false, "observedAt": AT},
            "appliedConfigHash": "sha256:a",
            "removal": {"step": "Cordoned", "startedAt": AT, "resetSkipped": false, "message": "m"},
            "driftReboot": "sha256:b",
            "driftBootId": "boot-1",
        });
        let status: TalosMachineStatus = round_trip(&wire);
        assert_eq!(status.lifecycle.node_name.as_deref(), Some("n-1"));
        assert_eq!(status.inventory.address.as_deref(), Some("10.0.0.1"));
        assert_eq!(status.applied.config_hash.as_deref(), Some("sha256:a"));
        assert_eq!(status.drift.reboot.as_deref(), Some("sha256:b"));
        assert_eq!(status.drift.boot_id.as_deref(), Some("boot-1"));
        assert!(status.etcd.observed.is_some() && status.removal.progress.is_some());
        assert_eq!(
            round_trip::<TalosMachineStatus>(&json!({"phase": "Pending"})),
            TalosMachineStatus::default()
        );
    }

    #[test]
    fn a_cluster_status_in_groups_reads_and_writes_the_json_it_did_before() {
        let counts = json!({"declared": 3, "approved": 3, "ready": 2, "summary": "2/3"});
        let wire = json!({
            "conditions": [condition("Ready"), condition("BackedUp")],
            "observedGeneration": 2,
            "controlPlanes": counts,
            "workers": counts,
            "bootstrap": {"machineName": "m", "machineUid": "u", "chosenAt": AT, "completedAt": AT},
            "lock": {"holder": "operation/up", "since": AT, "waiting": ["removal/u1"]},
            "bundleFingerprint": "sha256:c",
            "secretsSecret": "s",
            "talosconfigSecret": "t",
            "kubeconfigSecret": "k",
            "credentials": {"kubeconfigExpiresAt": AT, "talosconfigExpiresAt": AT},
            "tombstones": [{"machine": "m", "address": "10.0.0.2", "etcdMemberId": "1", "uuid": "u", "removedAt": AT}],
            "pendingNodeDeletes": [{"node": "n", "machine": "m", "since": AT}],
            "driftHalt": {"machine": "m", "renderedHash": "h", "message": "no", "at": AT},
            "backup": {"nextRun": AT, "kept": 2},
            "restore": {"key": "k", "size": 1, "sha256": "ab", "checkedAt": AT},
            "adoption": {"adoptedAt": AT, "machines": ["m"]},
        });
        let status: TalosClusterStatus = round_trip(&wire);
        assert_eq!(status.core.secrets_secret.as_deref(), Some("s"));
        assert!(status.lock.mirror.is_some() && status.drift.halt.is_some());
        assert_eq!(status.tombstones.list.len(), 1);
        assert_eq!(status.node_deletes.pending.len(), 1);
        assert_eq!(status.backup.record.as_ref().and_then(|b| b.kept), Some(2));
        assert!(status.restore.record.is_some() && status.core.adoption.is_some());
        assert_eq!(
            round_trip::<TalosClusterStatus>(&json!({})),
            TalosClusterStatus::default()
        );
    }

    #[test]
    fn the_other_statuses_in_groups_read_and_write_the_json_they_did_before() {
        let operation: TalosOperationStatus = round_trip(&json!({
            "phase": "Running",
            "progress": "1/2",
            "conditions": [condition("Succeeded")],
            "nodes": [{"machine": "m", "phase": "Running", "progress": {"step": "intended"}}],
            "startedAt": AT,
            "completedAt": AT,
            "backupKey": "ichor/a.snapshot",
        }));
        assert_eq!(operation.run.progress.as_deref(), Some("1/2"));
        assert_eq!(operation.backup.key.as_deref(), Some("ichor/a.snapshot"));
        let class: TalosMachineClassStatus = round_trip(&json!({
            "matchedMachines": 2,
            "machines": ["a", "b"],
            "waiting": ["c"],
            "conditions": [condition("Ready")],
        }));
        assert_eq!(class.matches.waiting, ["c"]);
        let storage: TalosStorageStatus = round_trip(&json!({
            "conditions": [condition("Ready")],
            "volumeCount": 1,
            "machines": [{"machine": "m", "volumes": [{"name": "v", "phase": "ready", "size": "1Gi", "location": "/var/mnt/v"}]}],
        }));
        assert_eq!(storage.volumes.volume_count, Some(1));
    }

    /// `S`'s groups have distinct managers, one taking the conditions no other names.
    fn one_rest<S: Grouped>() {
        let rest = S::GROUPS
            .iter()
            .filter(|g| g.conditions == Owned::Rest)
            .count();
        assert_eq!(rest, 1, "one group takes the conditions no other names");
        let mut managers: Vec<_> = S::GROUPS.iter().map(|g| g.manager).collect();
        managers.sort_unstable();
        managers.dedup();
        assert_eq!(managers.len(), S::GROUPS.len(), "one manager per group");
    }

    #[test]
    fn every_kind_has_one_group_for_the_conditions_no_other_names() {
        one_rest::<TalosMachineStatus>();
        one_rest::<TalosClusterStatus>();
        one_rest::<TalosOperationStatus>();
        one_rest::<TalosMachineClassStatus>();
        one_rest::<TalosStorageStatus>();
    }
}
